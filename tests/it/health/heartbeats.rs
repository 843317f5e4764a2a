//! Job heartbeats: the service in-process on 127.0.0.1:0 with a `ManualClock`; a dead-man's
//! switch and a webhook receiver that are real HTTP servers.
//!
//! - at boot nothing is stale: `/readyz` answers 200, no alert is written, the switch gets
//!   `GET`s;
//! - jobs that stop reaching the store (here: the monitor persists pulses only once an hour,
//!   and the clock moves past `[heartbeat] stale_after`) fail `/readyz` by name, show on the
//!   status page (en, zh) and turn the pings into `POST …/fail` naming them;
//! - the alert engine raises a `critical` alert from `stale_after` as configured, delivered
//!   to a webhook, and resolves it when the job beats again — on SQLite and on PostgreSQL.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::Router;
use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use probeok::alert::webhook::Webhook;
use probeok::alert::{AlertService, Lang, Notifier, Severity};
use probeok::app::{self, StartOptions};
use probeok::clock::{ManualClock, SystemClock};
use probeok::config::{ChannelOptions, Config};
use probeok::heartbeat::{self, Jobs};
use probeok::store::{Store, StoreOptions};

use crate::common::pg;
use crate::on_both_engines;
use pg::TestDb;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 5, 1, 4, 0, 0).unwrap()
}

/// What a fake receiver got: method, path, body.
type Got = Arc<Mutex<Vec<(Method, String, String)>>>;

/// Answers 200 to anything and keeps it.
async fn receiver() -> (SocketAddr, Got) {
    async fn keep(State(got): State<Got>, method: Method, uri: Uri, body: Bytes) -> &'static str {
        let body = String::from_utf8_lossy(&body).into_owned();
        got.lock()
            .unwrap()
            .push((method, uri.path().to_owned(), body));
        "OK"
    }
    let got: Got = Arc::default();
    let app = Router::new().fallback(keep).with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, got)
}

/// One route to nowhere (probes fail; heartbeats do not care), stale after a minute.
fn config(db: &std::path::Path, extra: &str) -> Config {
    let src = format!(
        r#"
[storage]
path = "{db}"

[heartbeat]
stale_after = "1m"
{extra}

[[provider]]
id = "sim"
kind = "openai"
  [[provider.region]]
  id = "r1"
  base_url = "http://127.0.0.1:9/v1"

[[route]]
provider = "sim"
region = "r1"
model = "m1"
serves = "chat"
tier = "primary"
weight = 100
"#,
        db = db.display(),
    );
    Config::parse(&src, "test.toml").unwrap().config
}

async fn wait_for<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_jobs_fail_readyz_show_on_the_page_and_fail_the_dead_mans_switch() {
    let (ping_addr, pings) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(
        &dir.path().join("hb.db"),
        r#"ping_url_env = "T_HB_PING_URL""#,
    );
    config
        .env
        .set("T_HB_PING_URL", format!("http://{ping_addr}/ping/abc"));
    let clock = Arc::new(ManualClock::new(t0()));
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let options = StartOptions {
        // Pulses reach the store once, at start: every job they carry goes silent there.
        heartbeat: heartbeat::Options {
            flush_every: Duration::from_secs(3600),
            ping_every: Duration::from_millis(200),
        },
        ..StartOptions::default()
    };
    let running = app::start_with(config, listener, clock.clone(), shutdown.clone(), options)
        .await
        .unwrap();
    let base = format!("http://{}", running.addr);
    let http = reqwest::Client::new();

    // Boot: nothing has beaten long enough to be stale.
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap());
    let page = http
        .get(format!("{base}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!page.contains("stale-jobs"), "no banner at boot");
    let ok = wait_for("a GET ping", async || {
        pings
            .lock()
            .unwrap()
            .iter()
            .find(|p| p.0 == Method::GET)
            .cloned()
    })
    .await;
    assert_eq!(ok.1, "/ping/abc");
    assert!(
        !pings.lock().unwrap().iter().any(|p| p.1.ends_with("/fail")),
        "no /fail at boot"
    );

    // Past stale_after (1 min) on the service's clock.
    clock.advance(Duration::from_secs(150));
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(body["status"], "not_ready");
    assert_eq!(body["stale_after_s"], 60);
    let stale = body["stale_jobs"].as_array().unwrap();
    for job in [
        "weights",
        "switch",
        "budget",
        "alert_eval",
        "alert_outbox",
        "store",
    ] {
        let j = stale
            .iter()
            .find(|j| j["job"] == job)
            .unwrap_or_else(|| panic!("{job} not named: {body}"));
        assert!(j["silent_s"].as_u64().unwrap() >= 150, "{j}");
    }
    assert!(
        body["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().starts_with("job weights silent for ")),
        "{body}"
    );

    let en = http
        .get(format!("{base}/?lang=en"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        en.contains(
            "Monitoring job weights (weights publisher) silent for 2 min — figures may be stale"
        ),
        "{en}"
    );
    let zh = http
        .get(format!("{base}/?lang=zh"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        zh.contains("监控任务 weights（权重发布） 已 2 分钟无心跳 —— 数据可能已过时"),
        "{zh}"
    );

    let fail = wait_for("a /fail ping", async || {
        pings
            .lock()
            .unwrap()
            .iter()
            .find(|p| p.1.ends_with("/fail"))
            .cloned()
    })
    .await;
    assert_eq!(fail.0, Method::POST);
    assert_eq!(fail.1, "/ping/abc/fail");
    assert!(fail.2.contains("job weights silent for "), "{}", fail.2);
    assert!(fail.2.contains("job store silent for "), "{}", fail.2);

    shutdown.cancel();
    running.done.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_raises_no_alert_and_every_job_beats() {
    let (hook, got) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&dir.path().join("boot.db"), "");
    config
        .env
        .set("T_HB_BOOT_HOOK", format!("http://{hook}/hook"));
    config.alert.webhook.push(probeok::config::WebhookConfig {
        url_env: "T_HB_BOOT_HOOK".into(),
        secret_env: None,
        max_per_minute: None,
        options: ChannelOptions {
            min_severity: Severity::Info,
            ..ChannelOptions::default()
        },
    });
    // Beats from an earlier run, long ago, must not count as silence at this start.
    let db = dir.path().join("boot.db");
    let old = Store::open(&db, StoreOptions::default()).unwrap();
    old.writer()
        .heartbeat("weights", Utc::now() - chrono::Duration::hours(5))
        .await
        .unwrap();
    old.close().await.unwrap();

    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let options = StartOptions {
        heartbeat: heartbeat::Options {
            flush_every: Duration::from_millis(100),
            ping_every: Duration::from_secs(3600),
        },
        ..StartOptions::default()
    };
    let running = app::start_with(
        config,
        listener,
        Arc::new(SystemClock),
        shutdown.clone(),
        options,
    )
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let ready = http
        .get(format!("http://{}/readyz", running.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap());

    // Every expected job reaches the store (the alert loop beats after its first evaluation).
    let start = Utc::now() - chrono::Duration::seconds(30);
    let expected = [
        "scheduler",
        "health",
        "retention",
        "store",
        "weights",
        "switch",
        "budget",
        "alert_eval",
        "alert_outbox",
    ];
    wait_for("every job's heartbeat", async || {
        let beats = running.store.reader().unwrap().heartbeats().unwrap();
        expected
            .iter()
            .all(|j| beats.iter().any(|(n, at)| n == j && *at > start))
            .then_some(())
    })
    .await;
    let outbox = running.store.reader().unwrap().outbox_all().unwrap();
    assert!(
        outbox
            .iter()
            .all(|r| !r.dedup_key.starts_with("heartbeat:")),
        "no heartbeat alert at boot: {outbox:?}"
    );
    assert!(got.lock().unwrap().is_empty(), "nothing sent at boot");
    shutdown.cancel();
    running.done.await.unwrap().unwrap();
}

fn webhook(addr: SocketAddr) -> Arc<dyn Notifier> {
    let vars: std::collections::HashMap<String, String> =
        [("HOOK_URL".to_owned(), format!("http://{addr}/hook"))].into();
    let c = probeok::config::WebhookConfig {
        url_env: "HOOK_URL".into(),
        secret_env: None,
        max_per_minute: None,
        options: ChannelOptions {
            min_severity: Severity::Critical,
            lang: Lang::En,
            ..ChannelOptions::default()
        },
    };
    let env = probeok::alert::ChannelEnv {
        name: "webhook[0]".into(),
        vars: &vars,
        http: reqwest::Client::new(),
    };
    Arc::new(Webhook::from_config(&c, &env).unwrap())
}

#[test]
fn the_async_job_worker_beats_under_the_expected_name() {
    assert_eq!(heartbeat::ASYNC_JOBS, probeok::proxy::jobs::HEARTBEAT_JOB);
}

on_both_engines! {
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_job_raises_a_critical_alert_per_stale_after_and_resolves(db: &TestDb) {
    let (hook, got) = receiver().await;
    let clock = Arc::new(ManualClock::new(t0()));
    let mut c = config(&db.path(), "");
    c.heartbeat.stale_after = Duration::from_secs(180);
    let store = db.open(StoreOptions::default());
    let jobs = Jobs::new(vec!["scheduler", "weights"], t0());
    let service = AlertService::new(
        Arc::new(c.clone()),
        store.clone(),
        clock.clone(),
        vec![webhook(hook)],
    )
    .with_jobs(&jobs);
    let w = store.writer();

    // The scheduler beats; weights never does. Within stale_after of the start: nothing.
    w.heartbeat("scheduler", t0() + chrono::Duration::seconds(170))
        .await
        .unwrap();
    assert_eq!(
        service
            .evaluate(t0() + chrono::Duration::seconds(175))
            .await
            .unwrap(),
        0
    );

    // Four minutes in: weights is silent since the start.
    let now = t0() + chrono::Duration::minutes(4);
    clock.set(now);
    w.heartbeat("scheduler", now).await.unwrap();
    assert_eq!(service.evaluate(now).await.unwrap(), 1);
    service.deliver().await.unwrap();
    let sent = got.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let body: Value = serde_json::from_str(&sent[0].2).unwrap();
    assert_eq!(body["severity"], "critical");
    assert_eq!(body["status"], "firing");
    let title = body["title"].as_str().unwrap();
    assert!(
        title.contains("monitoring job weights (weights publisher) silent for 4m"),
        "{title}"
    );
    assert!(title.contains("figures may be stale"), "{title}");
    let text = body["text"].as_str().unwrap();
    assert!(text.contains("Silent since"), "{text}");
    assert!(text.contains("GET /readyz"), "{text}");
    // Still firing: not repeated.
    assert_eq!(
        service
            .evaluate(now + chrono::Duration::seconds(60))
            .await
            .unwrap(),
        0
    );

    // It beats again: resolved.
    let later = now + chrono::Duration::minutes(2);
    clock.set(later);
    w.heartbeat("weights", later).await.unwrap();
    w.heartbeat("scheduler", later).await.unwrap();
    assert_eq!(service.evaluate(later).await.unwrap(), 1);
    service.deliver().await.unwrap();
    let sent = got.lock().unwrap().clone();
    assert_eq!(sent.len(), 2);
    let body: Value = serde_json::from_str(&sent[1].2).unwrap();
    assert_eq!(body["status"], "resolved");
    assert!(
        body["title"]
            .as_str()
            .unwrap()
            .contains("monitoring job weights (weights publisher) beating again"),
        "{body}"
    );

    // `stale_after` comes from the config: at 10 min the same silence is not stale.
    let db2 = TestDb::new(db.engine);
    let mut c2 = config(&db2.path(), "");
    c2.heartbeat.stale_after = Duration::from_secs(600);
    let store2 = db2.open(StoreOptions::default());
    let relaxed = AlertService::new(Arc::new(c2), store2, clock.clone(), vec![webhook(hook)])
        .with_jobs(&jobs);
    assert_eq!(relaxed.evaluate(now).await.unwrap(), 0);
    let eleven = t0() + chrono::Duration::minutes(11);
    relaxed
        .store
        .writer()
        .heartbeat("scheduler", eleven)
        .await
        .unwrap();
    assert_eq!(relaxed.evaluate(eleven).await.unwrap(), 1);
}
}
