//! Fake alert receivers for the alert tests: real HTTP servers on 127.0.0.1:0 that verify
//! signatures the way DingTalk and Feishu do and answer their real bodies, a webhook receiver
//! that checks the HMAC header, a tiny SMTP server speaking a real SMTP dialogue; and the
//! config, events and service rig the tests share.

// Each test binary compiles this module and uses a different subset of it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::any;
use axum::Router;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::Mac;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;

use probeok::alert::dingtalk::DingTalk;
use probeok::alert::feishu::Feishu;
use probeok::alert::webhook::Webhook;
use probeok::alert::{AlertService, ChannelEnv, Lang, Notifier, Severity};
use probeok::clock::{Clock, ManualClock};
use probeok::config::{
    ChannelOptions, Config, ProviderConfig, RegionConfig, RobotConfig, RouteConfig, WebhookConfig,
};
use probeok::health::{
    ErrorRateEvidence, Evidence, FailureMode, HealthEvent, Incident, LatencyRef, Reason,
    State as S, Transition,
};
use probeok::route::RouteId;
use probeok::store::{Store, StoreOptions};

// ---------------------------------------------------------------------------------------------
// Fake receivers

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    DingTalk,
    Feishu,
    Webhook,
    /// The WeCom group robot: `?key=` in the URL, `errcode` in every answer.
    Wecom,
}

/// One received, verified message.
#[derive(Debug, Clone)]
pub struct Got {
    pub ts: Option<i64>,
    pub body: Value,
    pub delivery: Option<String>,
}

pub struct Fake {
    pub kind: Kind,
    pub secret: Option<String>,
    pub clock: Arc<ManualClock>,
    /// Answer the platform's error body to this many more valid requests.
    pub reject: AtomicU32,
    /// Requests refused for a bad or stale signature.
    pub bad_signatures: AtomicU32,
    pub got: Mutex<Vec<Got>>,
}

impl Fake {
    pub fn new(kind: Kind, secret: Option<&str>, clock: Arc<ManualClock>) -> Arc<Self> {
        Arc::new(Self {
            kind,
            secret: secret.map(str::to_owned),
            clock,
            reject: AtomicU32::new(0),
            bad_signatures: AtomicU32::new(0),
            got: Mutex::new(Vec::new()),
        })
    }

    pub fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

pub fn hmac(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    m.update(msg);
    m.finalize().into_bytes().to_vec()
}

pub fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

pub async fn receive(
    State(f): State<Arc<Fake>>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let now_ms = f.clock.now().timestamp_millis();
    match f.kind {
        Kind::DingTalk => {
            let mut ts = None;
            if let Some(secret) = &f.secret {
                let (Some(t), Some(sign)) = (q.get("timestamp"), q.get("sign")) else {
                    f.bad_signatures.fetch_add(1, Ordering::SeqCst);
                    return axum::Json(json!({"errcode": 310000, "errmsg": "sign not match, more: [https://ding-doc.dingtalk.com/doc#/serverapi2/qf2nxq]"})).into_response();
                };
                let expected = b64(&hmac(
                    secret.as_bytes(),
                    format!("{t}\n{secret}").as_bytes(),
                ));
                let t: i64 = t.parse().unwrap_or(0);
                // DingTalk refuses timestamps more than an hour off.
                if &expected != sign || (now_ms - t).abs() > 3_600_000 {
                    f.bad_signatures.fetch_add(1, Ordering::SeqCst);
                    return axum::Json(json!({"errcode": 310000, "errmsg": "sign not match, more: [https://ding-doc.dingtalk.com/doc#/serverapi2/qf2nxq]"})).into_response();
                }
                ts = Some(t);
            }
            if json["msgtype"] != "markdown" || !json["markdown"]["text"].is_string() {
                return axum::Json(json!({"errcode": 40035, "errmsg": "缺少参数 json"}))
                    .into_response();
            }
            if f.reject.load(Ordering::SeqCst) > 0 {
                f.reject.fetch_sub(1, Ordering::SeqCst);
                return axum::Json(json!({"errcode": 310000, "errmsg": "keywords not in content, more: [https://ding-doc.dingtalk.com/doc#/serverapi2/qf2nxq]"})).into_response();
            }
            f.got.lock().unwrap().push(Got {
                ts,
                body: json,
                delivery: None,
            });
            axum::Json(json!({"errcode": 0, "errmsg": "ok"})).into_response()
        }
        Kind::Feishu => {
            let mut ts = None;
            if let Some(secret) = &f.secret {
                let t = json["timestamp"].as_str().unwrap_or("");
                let sign = json["sign"].as_str().unwrap_or("");
                let expected = b64(&hmac(format!("{t}\n{secret}").as_bytes(), b""));
                let t: i64 = t.parse().unwrap_or(0);
                if expected != sign || (now_ms / 1000 - t).abs() > 3600 {
                    f.bad_signatures.fetch_add(1, Ordering::SeqCst);
                    return axum::Json(json!({"code": 19021, "data": {}, "msg": "sign match fail or timestamp is not within one hour from current time"})).into_response();
                }
                ts = Some(t);
            }
            if body.len() > 20 * 1024 || json["msg_type"] != "interactive" {
                return axum::Json(json!({"code": 9499, "data": {}, "msg": "Bad Request"}))
                    .into_response();
            }
            if f.reject.load(Ordering::SeqCst) > 0 {
                f.reject.fetch_sub(1, Ordering::SeqCst);
                return axum::Json(json!({"code": 11232, "data": {}, "msg": "frequency limited psm[lark.oapi.app_platform_runtime]appID[1]"})).into_response();
            }
            f.got.lock().unwrap().push(Got {
                ts,
                body: json,
                delivery: None,
            });
            axum::Json(json!({"code": 0, "data": {}, "msg": "success"})).into_response()
        }
        Kind::Wecom => {
            if q.get("key").map(String::as_str) != Some("wecom-key") {
                return axum::Json(json!({"errcode": 93000, "errmsg": "invalid webhook url, hint: [1700000000_1_abc], from ip: 127.0.0.1, more info at https://open.work.weixin.qq.com/devtool/query?e=93000"})).into_response();
            }
            let ok_shape = match json["msgtype"].as_str() {
                Some("markdown") => json["markdown"]["content"].is_string(),
                Some("text") => json["text"]["content"].is_string(),
                _ => false,
            };
            if !ok_shape {
                return axum::Json(json!({"errcode": 40008, "errmsg": "invalid message type, hint: [1700000000_1_abc]"})).into_response();
            }
            if json["markdown"]["content"]
                .as_str()
                .is_some_and(|c| c.len() > 4096)
            {
                return axum::Json(json!({"errcode": 40058, "errmsg": "markdown.content exceed max length 4096. invalid Request Parameter, hint: [1700000000_1_abc]"})).into_response();
            }
            if f.reject.load(Ordering::SeqCst) > 0 {
                f.reject.fetch_sub(1, Ordering::SeqCst);
                return axum::Json(json!({"errcode": 45009, "errmsg": "api freq out of limit"}))
                    .into_response();
            }
            f.got.lock().unwrap().push(Got {
                ts: None,
                body: json,
                delivery: None,
            });
            axum::Json(json!({"errcode": 0, "errmsg": "ok"})).into_response()
        }
        Kind::Webhook => {
            if let Some(secret) = &f.secret {
                let given = headers
                    .get("x-probeok-signature")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let hex: String = hmac(secret.as_bytes(), &body)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                if given != format!("sha256={hex}") {
                    f.bad_signatures.fetch_add(1, Ordering::SeqCst);
                    return (StatusCode::UNAUTHORIZED, "bad signature").into_response();
                }
            }
            if f.reject.load(Ordering::SeqCst) > 0 {
                f.reject.fetch_sub(1, Ordering::SeqCst);
                return (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response();
            }
            let delivery = headers
                .get("x-probeok-delivery")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            f.got.lock().unwrap().push(Got {
                ts: None,
                body: json,
                delivery,
            });
            (StatusCode::OK, "ok").into_response()
        }
    }
}

/// A fake receiver served on `addr` (or a fresh port); abort the handle to take it down.
pub async fn serve(f: Arc<Fake>, addr: Option<SocketAddr>) -> (SocketAddr, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind(addr.unwrap_or(([127, 0, 0, 1], 0).into()))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/{*path}", any(receive)).with_state(f);
    let h = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, h)
}

/// No pooled connections: a receiver taken down refuses the next request at once.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

pub fn opts(min: Severity, lang: Lang) -> ChannelOptions {
    ChannelOptions {
        min_severity: min,
        lang,
        ..ChannelOptions::default()
    }
}

/// Builds a channel from its config table the way the service does, with its variables from
/// a map instead of the process environment.
pub fn env_vars(pairs: &[(&str, Option<String>)]) -> HashMap<String, String> {
    pairs
        .iter()
        .filter_map(|(k, v)| v.clone().map(|v| ((*k).to_owned(), v)))
        .collect()
}

pub fn channel_env<'a>(name: &str, vars: &'a HashMap<String, String>) -> ChannelEnv<'a> {
    ChannelEnv {
        name: name.into(),
        vars,
        http: http(),
    }
}

pub fn robot(secret: Option<&str>, options: ChannelOptions) -> RobotConfig {
    RobotConfig {
        webhook_env: "URL".into(),
        secret_env: secret.map(|_| "SECRET".into()),
        options,
        mention: None,
    }
}

pub fn dingtalk(
    name: &str,
    addr: SocketAddr,
    secret: Option<&str>,
    min: Severity,
) -> Arc<dyn Notifier> {
    let vars = env_vars(&[
        (
            "URL",
            Some(format!("http://{addr}/robot/send?access_token=tok")),
        ),
        ("SECRET", secret.map(str::to_owned)),
    ]);
    let c = robot(secret, opts(min, Lang::Zh));
    Arc::new(DingTalk::from_config(&c, &channel_env(name, &vars)).unwrap())
}

pub fn feishu(name: &str, addr: SocketAddr, secret: Option<&str>) -> Arc<dyn Notifier> {
    let vars = env_vars(&[
        (
            "URL",
            Some(format!("http://{addr}/open-apis/bot/v2/hook/abc")),
        ),
        ("SECRET", secret.map(str::to_owned)),
    ]);
    let c = robot(secret, opts(Severity::Warning, Lang::En));
    Arc::new(Feishu::from_config(&c, &channel_env(name, &vars)).unwrap())
}

pub fn webhook(
    name: &str,
    addr: SocketAddr,
    secret: Option<&str>,
    min: Severity,
) -> Arc<dyn Notifier> {
    let vars = env_vars(&[
        ("URL", Some(format!("http://{addr}/hook"))),
        ("SECRET", secret.map(str::to_owned)),
    ]);
    let c = WebhookConfig {
        url_env: "URL".into(),
        secret_env: secret.map(|_| "SECRET".into()),
        max_per_minute: None,
        options: opts(min, Lang::En),
    };
    Arc::new(Webhook::from_config(&c, &channel_env(name, &vars)).unwrap())
}

// ---------------------------------------------------------------------------------------------
// A tiny SMTP server: a real dialogue over a socket, messages kept.

pub async fn smtp_server() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mails = Arc::new(Mutex::new(Vec::new()));
    let store = mails.clone();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let store = store.clone();
            tokio::spawn(async move {
                let (r, mut w) = sock.into_split();
                let mut r = BufReader::new(r);
                w.write_all(b"220 localhost ESMTP fake\r\n").await.unwrap();
                let mut line = String::new();
                loop {
                    line.clear();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let cmd = line.trim_end().to_ascii_uppercase();
                    if cmd.starts_with("EHLO") || cmd.starts_with("HELO") {
                        w.write_all(b"250-localhost\r\n250 8BITMIME\r\n")
                            .await
                            .unwrap();
                    } else if cmd.starts_with("DATA") {
                        w.write_all(b"354 go ahead\r\n").await.unwrap();
                        let mut data = String::new();
                        loop {
                            line.clear();
                            if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            if line == ".\r\n" {
                                break;
                            }
                            data.push_str(&line);
                        }
                        store.lock().unwrap().push(data);
                        w.write_all(b"250 2.0.0 queued as 42\r\n").await.unwrap();
                    } else if cmd.starts_with("QUIT") {
                        w.write_all(b"221 bye\r\n").await.unwrap();
                        return;
                    } else {
                        w.write_all(b"250 ok\r\n").await.unwrap();
                    }
                }
            });
        }
    });
    (addr, mails)
}

// ---------------------------------------------------------------------------------------------
// Config, events

pub fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-29T02:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

pub fn config(db: &std::path::Path) -> Config {
    let mut c = Config::default();
    c.storage.path = db.to_owned();
    c.server.public_url = "http://status.example.com".into();
    c.alerting.group_wait = Duration::ZERO;
    c.alerting.runbook_url = Some("https://wiki.example.com/llm-runbook#{failure_mode}".into());
    for p in ["qwen", "deepseek"] {
        c.providers.push(ProviderConfig {
            id: p.into(),
            regions: vec![RegionConfig {
                id: "cn-beijing".into(),
                base_url: "http://127.0.0.1:9/v1".into(),
            }],
            ..ProviderConfig::default()
        });
    }
    for i in 0..20 {
        c.routes.push(RouteConfig {
            provider: "qwen".into(),
            region: "cn-beijing".into(),
            model: format!("qwen-max-{i:02}"),
            serves: "chat-main".into(),
            ..RouteConfig::default()
        });
    }
    c.routes.push(RouteConfig {
        provider: "deepseek".into(),
        region: "cn-beijing".into(),
        model: "deepseek-ai/DeepSeek-V3".into(),
        serves: "chat-main".into(),
        tier: probeok::route::Tier::Backup,
        ..RouteConfig::default()
    });
    c
}

pub fn qwen(i: usize) -> RouteId {
    RouteId::new("qwen", "cn-beijing", &format!("qwen-max-{i:02}"))
}

pub fn incident(
    route: &RouteId,
    opened: DateTime<Utc>,
    closed: Option<DateTime<Utc>>,
    peak: S,
) -> Incident {
    Incident {
        id: format!("{route}@{}", opened.to_rfc3339()),
        route: route.clone(),
        opened_at: opened,
        closed_at: closed,
        peak,
        failure_mode: Some(FailureMode::Unavailable),
        transitions: Vec::new(),
        cause: None,
    }
}

pub fn transition(
    route: &RouteId,
    from: S,
    to: S,
    at: DateTime<Utc>,
    inc: Option<&Incident>,
) -> HealthEvent {
    HealthEvent::Transition {
        transition: Box::new(Transition {
            route: route.clone(),
            from,
            to,
            at,
            reason: Reason::new(
                "error_rate_high",
                "error rate 45% (9 of 20) above 5% for 60 s",
            ),
            failure_mode: (to != S::Normal && to != S::Warning).then_some(FailureMode::Unavailable),
            evidence: Evidence {
                observed: None,
                signals: Vec::new(),
                baseline: Some(LatencyRef {
                    bucket: "10:00-11:00".into(),
                    samples: 100,
                    mean_ms: 1100.0,
                    stddev_ms: 300.0,
                    threshold_ms: 1700.0,
                }),
                tps_baseline: None,
                thresholds: Vec::new(),
                error_rate: ErrorRateEvidence {
                    window_s: 300,
                    total: 20,
                    failures: 9,
                    rate: 0.45,
                    fast_window_s: 10,
                    fast_total: 0,
                    fast_failures: 0,
                    above_since: None,
                },
                consecutive_abnormal: 3,
            },
            incident_id: inc.map(|i| i.id.clone()),
        }),
        incident: inc.map(|i| Box::new(i.clone())),
    }
}

/// DEGRADED → CRITICAL of route `i` at `t`, in an incident opened a minute earlier.
pub fn critical(i: usize, t: DateTime<Utc>) -> HealthEvent {
    let r = qwen(i);
    let inc = incident(&r, t - chrono::Duration::minutes(1), None, S::Critical);
    transition(&r, S::Degraded, S::Critical, t, Some(&inc))
}

pub struct Rig {
    pub _dir: tempfile::TempDir,
    pub db: std::path::PathBuf,
    pub clock: Arc<ManualClock>,
    pub service: Arc<AlertService>,
}

pub async fn rig(
    channels: Vec<Arc<dyn Notifier>>,
    clock: Arc<ManualClock>,
    tweak: impl FnOnce(&mut Config),
) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("alerts.db");
    let mut c = config(&db);
    tweak(&mut c);
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let service = Arc::new(AlertService::new(
        Arc::new(c),
        store,
        clock.clone(),
        channels,
    ));
    Rig {
        _dir: dir,
        db,
        clock,
        service,
    }
}

/// [`rig`] on `db`'s engine (SQLite or PostgreSQL); `Rig::db` is then unused.
pub async fn rig_on(
    db: &super::pg::TestDb,
    channels: Vec<Arc<dyn Notifier>>,
    clock: Arc<ManualClock>,
    tweak: impl FnOnce(&mut Config),
) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&db.path());
    tweak(&mut c);
    let store = db.open(StoreOptions::default());
    let service = Arc::new(AlertService::new(
        Arc::new(c),
        store,
        clock.clone(),
        channels,
    ));
    Rig {
        _dir: dir,
        db: db.path(),
        clock,
        service,
    }
}

impl Rig {
    /// Groups `events` as the engine does and writes the outbox.
    pub async fn push(&self, events: Vec<HealthEvent>) -> u64 {
        let now = self.clock.now();
        let mut g = self.service.grouper();
        for e in events {
            g.push(e, now);
        }
        let drafts = g.flush(now);
        self.service.enqueue(drafts, now).await.unwrap()
    }

    pub fn outbox(&self) -> Vec<probeok::store::alerts::OutboxRow> {
        self.service.store.reader().unwrap().outbox_all().unwrap()
    }
}
