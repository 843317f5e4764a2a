//! Drills end to end: the whole service in-process (`app::start` on 127.0.0.1:0 with the
//! in-process proxy) against two fake OpenAI-compatible upstreams (real axum servers), the
//! wall clock a `ManualClock` so the drill's stages and end are driven exactly, and the
//! binary's `probeok drill …` against the running server.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::{DateTime, TimeDelta, Utc};
use common::{fake, json, openai, Captured, Reply, Script};
use probeok::app;
use probeok::clock::{Clock, ManualClock};
use probeok::config::Config;
use serde_json::{json as j, Value};
use tokio_util::sync::CancellationToken;

const MAIN: &str = "main/cn/m";
const BACKUP: &str = "bk/cn/m";

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

/// 02:30 in Asia/Shanghai: inside the off-peak window 02:00–06:00.
fn off_peak() -> DateTime<Utc> {
    t("2026-11-30T18:30:00Z")
}

/// 14:30 in Asia/Shanghai: peak time.
fn peak() -> DateTime<Utc> {
    t("2026-11-30T06:30:00Z")
}

/// An upstream answering chat completions (streamed for probes, plain for the proxy's
/// requests) after `delay`; the first `wrong` probe answers after `arm` is set are not
/// `PROBE_OK` (validation failures).
struct Upstream {
    server: common::Server,
    wrong_left: Arc<AtomicUsize>,
}

async fn upstream(delay: Duration) -> Upstream {
    let wrong_left = Arc::new(AtomicUsize::new(0));
    let left = wrong_left.clone();
    let (server, _requests) = fake("/v1/chat/completions", move |c: &Captured| {
        let body = c.json();
        let probe = body["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["content"] == "health check"));
        let wrong = probe
            && left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        let text = if wrong { "NOPE" } else { "PROBE_OK" };
        if body["stream"] == true {
            Reply::after(
                delay,
                Script::new()
                    .send_all(openai::stream(&[text], "stop", Some(3)))
                    .sse(),
            )
        } else {
            Reply::after(
                delay,
                json(StatusCode::OK, openai::body(text, "stop", Some(3))),
            )
        }
    })
    .await;
    Upstream { server, wrong_left }
}

use common::free_port;

fn config(db: &Path, main: &Upstream, backup: &Upstream, token_env: &str, proxy: u16) -> Config {
    let src = format!(
        r#"
[server]
admin_token_env = "{token_env}"

[storage]
path = "{db}"

[probe]
interval = "300ms"
timeout = "2s"
first_byte_timeout = "1s"
jitter = 0.0

[proxy]
enabled = true
listen = "127.0.0.1:{proxy}"

[drill]
off_peak = [["02:00", "06:00"]]
max_duration = "1h"

[[provider]]
id = "main"
kind = "openai"
  [[provider.region]]
  id = "cn"
  base_url = "{main}/v1"

[[provider]]
id = "bk"
kind = "openai"
  [[provider.region]]
  id = "cn"
  base_url = "{backup}/v1"

[[route]]
provider = "main"
region = "cn"
model = "m"
serves = "chat"
tier = "primary"
weight = 100

[[route]]
provider = "bk"
region = "cn"
model = "m"
serves = "chat"
tier = "backup"
weight = 100
"#,
        db = db.display(),
        main = main.server.base_url(),
        backup = backup.server.base_url(),
    );
    let mut config = Config::parse(&src, "drills.toml").unwrap().config;
    config.env.set(token_env, "drill-secret");
    config
}

struct App {
    base: String,
    proxy: String,
    shutdown: CancellationToken,
    running: app::Running,
    http: reqwest::Client,
    token: &'static str,
}

impl App {
    async fn start(config: Config, clock: Arc<ManualClock>, token: &'static str) -> App {
        let proxy = format!("http://{}", config.proxy.listen);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let shutdown = CancellationToken::new();
        let running = app::start(config, listener, clock, shutdown.clone())
            .await
            .unwrap();
        App {
            base: format!("http://{}", running.addr),
            proxy,
            shutdown,
            running,
            http: reqwest::Client::new(),
            token,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.running.done)
            .await
            .expect("shutdown in time")
            .unwrap()
            .unwrap();
    }

    async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.unwrap()
    }

    /// (weight, reason, detail) of `route` in the published weights.
    async fn weight(&self, route: &str) -> (u64, String, Option<String>) {
        let w = self.get("/api/v1/weights").await;
        let e = w["models"]["chat"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["route"] == route)
            .cloned()
            .unwrap();
        (
            e["weight"].as_u64().unwrap(),
            e["reason"].as_str().unwrap().to_owned(),
            e["detail"].as_str().map(str::to_owned),
        )
    }

    /// Polls until `route`'s weight is `want` (bounded).
    async fn wait_weight(&self, route: &str, want: u64) -> (u64, String, Option<String>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let w = self.weight(route).await;
            if w.0 == want {
                return w;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{route} weight stayed {w:?}, wanted {want}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls `/api/v1/routes/{route}/probes` until `n` probes are stamped `at` (bounded);
    /// answers the probes stamped in `[from, to)`.
    async fn probes_in(&self, route: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<Value> {
        let all = self
            .get(&format!("/api/v1/routes/{route}/probes?limit=1000"))
            .await;
        let list = all
            .as_array()
            .cloned()
            .or_else(|| all["probes"].as_array().cloned())
            .unwrap_or_default();
        list.into_iter()
            .filter(|p| {
                p["kind"] == "probe"
                    && p["started_at"]
                        .as_str()
                        .map(t)
                        .is_some_and(|at| from <= at && at < to)
            })
            .collect()
    }

    async fn wait_probes(&self, route: &str, at: DateTime<Utc>, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let got = self
                .probes_in(route, at, at + TimeDelta::milliseconds(1))
                .await
                .len();
            if got >= n {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{route}: {got} probes at {at}, wanted {n}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One plain chat completion through the proxy; answers the route that served it.
    async fn chat(&self) -> String {
        let r = self
            .http
            .post(format!("{}/v1/chat/completions", self.proxy))
            .json(&j!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.headers()["x-probeok-route"].to_str().unwrap().to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drill_ramps_ends_by_itself_restores_the_weights_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let main = upstream(Duration::from_millis(5)).await;
    let backup = upstream(Duration::from_millis(40)).await;
    let var = "PROBEOK_TEST_DRILL_TOKEN_LIFE";
    let clock = Arc::new(ManualClock::new(off_peak() - TimeDelta::minutes(5)));
    let cfg = config(&dir.path().join("d.db"), &main, &backup, var, free_port());
    let app = App::start(cfg, clock.clone(), "drill-secret").await;
    app.wait_probes(BACKUP, clock.now(), 1).await;
    assert_ne!(app.wait_weight(MAIN, 100).await.1, "drill");
    assert_eq!(app.weight(BACKUP).await.1, "standby");

    // Admin calls need the token.
    let r = app
        .http
        .post(format!("{}/api/v1/admin/drills", app.base))
        .json(&j!({"route": MAIN, "duration": "10m", "reason": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");

    // Start: 10 minutes, half the move for 5 minutes, then all of it.
    let start = off_peak();
    clock.set(start);
    let (status, d) = app
        .admin(
            reqwest::Method::POST,
            "/api/v1/admin/drills",
            Some(j!({"route": MAIN, "duration": "10m", "ramp": [50, 100],
                "reason": "quarterly failover drill", "started_by": "ops"})),
        )
        .await;
    assert_eq!(status, 201, "{d}");
    let id = d["id"].as_i64().unwrap();
    assert_eq!(d["status"], "active");
    assert_eq!(d["stage"]["index"], 1);
    assert_eq!(d["stage"]["percent"], 50);
    assert_eq!(d["ends_at"], "2026-11-30T18:40:00Z");
    assert_eq!(d["forced"], false);

    // Stage 1: the route keeps half its weight, the standby backup takes the rest.
    let (w, reason, detail) = app.wait_weight(MAIN, 50).await;
    assert_eq!((w, reason.as_str()), (50, "drill"));
    let detail = detail.unwrap();
    assert!(
        detail.contains(&format!("drill {id} stage 1/2")),
        "{detail}"
    );
    assert!(detail.contains("quarterly failover drill"), "{detail}");
    assert_eq!(app.weight(BACKUP).await, (50, "drill".into(), None));
    let mut served = Vec::new();
    for _ in 0..10 {
        served.push(app.chat().await);
    }
    // Shown on the status page in both languages, and on the route's page.
    let page = app
        .http
        .get(format!("{}/?lang=en", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&format!("Drill {id} on {MAIN}: traffic moving off, stage 1/2 (50% of the move to weight 0); reason: quarterly failover drill; ends at 2026-11-30 18:40 UTC")), "{page}");
    let page = app
        .http
        .get(format!("{}/?lang=zh", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains(&format!(
            "演练 {id}：线路 {MAIN} 的流量正在迁出，第 1/2 阶段"
        )),
        "{page}"
    );
    let page = app
        .http
        .get(format!("{}/routes/{MAIN}?lang=en", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(r#"id="drills""#), "{page}");
    let page = app
        .http
        .get(format!("{}/routes/{BACKUP}?lang=en", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!page.contains(r#"id="drills""#));

    // Stage 2: all of the move; the backup answers wrong twice.
    backup.wrong_left.store(2, Ordering::SeqCst);
    let stage2 = start + TimeDelta::minutes(5);
    clock.set(stage2);
    app.wait_weight(MAIN, 0).await;
    assert_eq!(app.weight(BACKUP).await.0, 100);
    for _ in 0..10 {
        let route = app.chat().await;
        assert_eq!(route, BACKUP);
        served.push(route);
    }
    app.wait_probes(BACKUP, stage2, 4).await;
    assert_eq!(backup.wrong_left.load(Ordering::SeqCst), 0);

    // The report while it runs: figures so far.
    let running = app.get(&format!("/api/v1/drills/{id}")).await;
    assert_eq!(running["report"]["window"]["running"], true, "{running}");
    assert_eq!(running["drill"]["stage"]["index"], 2);

    // The end: at 18:40 the drill ends by itself and the weights come back.
    let end = start + TimeDelta::minutes(10);
    clock.set(end);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let listed = loop {
        let l = app.get("/api/v1/drills").await;
        if l["active"].as_array().unwrap().is_empty() {
            break l;
        }
        assert!(tokio::time::Instant::now() < deadline, "not ended: {l}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ended = &listed["drills"][0];
    assert_eq!(ended["id"], id);
    assert_eq!(ended["status"], "ended");
    assert_eq!(ended["ended_by"], "auto");
    assert_eq!(ended["ended_at"], "2026-11-30T18:40:00Z");
    assert_eq!(ended["receivers"], j!([BACKUP]));
    assert_ne!(app.wait_weight(MAIN, 100).await.1, "drill");
    assert_eq!(app.weight(BACKUP).await, (0, "standby".into(), None));
    let page = app
        .http
        .get(format!("{}/?lang=en", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!page.contains(r#"id="drills""#));

    // The report matches what the upstreams did: the 20 requests and who answered them, the
    // probes stamped inside the window, the two wrong answers.
    let body = app.get(&format!("/api/v1/drills/{id}")).await;
    let r = &body["report"];
    assert_eq!(r["window"]["running"], false);
    assert_eq!(r["window"]["to"], "2026-11-30T18:40:00Z");
    assert_eq!(r["requests"]["total"], 20, "{r}");
    assert_eq!(r["requests"]["ok"], 20);
    assert_eq!(r["requests"]["success_rate"], 1.0);
    let on_backup = served.iter().filter(|s| *s == BACKUP).count() as u64;
    // The proxy says so openly when the backup tier answers (`no_primary_usable`).
    assert_eq!(r["requests"]["fallbacks"], on_backup);
    assert_eq!(r["requests"]["by_route"][BACKUP], on_backup);
    assert_eq!(
        r["requests"]["by_route"][MAIN].as_u64().unwrap_or(0),
        20 - on_backup
    );
    let backup_probes = app.probes_in(BACKUP, start, end).await;
    let main_probes = app.probes_in(MAIN, start, end).await;
    let b = &r["backups"][0];
    assert_eq!(b["route"], BACKUP);
    assert_eq!(b["probes"], backup_probes.len() as u64);
    assert_eq!(r["drilled"]["probes"], main_probes.len() as u64);
    assert_eq!(b["validation_failures"], 2, "{b}");
    let wrong = backup_probes
        .iter()
        .filter(|p| p["verified"] == false)
        .count();
    assert_eq!(wrong, 2);
    assert_eq!(
        b["successes"],
        backup_probes
            .iter()
            .filter(|p| p["success"] == true)
            .count() as u64
    );
    // The backup's 40 ms shows in its latency; it has no history in these hours (new store).
    assert!(b["latency_ms"]["p50"].as_f64().unwrap() >= 40.0, "{b}");
    assert_eq!(b["baseline"]["source"], "same_hour_of_day_7d");
    assert_eq!(b["baseline"]["hours"], j!([2]));
    assert_eq!(b["baseline"]["samples"], 0, "{b}");
    // Two wrong answers out of a handful of probes fail the drill.
    assert_eq!(r["verdict"]["level"], "fail", "{r}");
    assert!(
        r["verdict"]["line"]
            .as_str()
            .unwrap()
            .contains("2 wrong answer(s)"),
        "{r}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_peak_force_validation_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let main = upstream(Duration::ZERO).await;
    let backup = upstream(Duration::ZERO).await;
    let var = "PROBEOK_TEST_DRILL_TOKEN_RULES";
    let clock = Arc::new(ManualClock::new(peak()));
    let cfg = config(&dir.path().join("d.db"), &main, &backup, var, free_port());
    let mut env = cfg.env.clone();
    let app = App::start(cfg, clock.clone(), "drill-secret").await;
    let path = "/api/v1/admin/drills";
    let good = j!({"route": MAIN, "duration": "10m", "reason": "peak-time drill"});

    // Peak time: refused, naming the windows and the time zone; force starts it anyway.
    let (status, e) = app
        .admin(reqwest::Method::POST, path, Some(good.clone()))
        .await;
    assert_eq!(status, 409);
    assert_eq!(e["error"]["code"], "outside_off_peak");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("02:00–06:00 (Asia/Shanghai)") && msg.contains("14:30"),
        "{msg}"
    );
    let mut forced = good.clone();
    forced["force"] = j!(true);
    let (status, d) = app
        .admin(reqwest::Method::POST, path, Some(forced.clone()))
        .await;
    assert_eq!(status, 201, "{d}");
    assert_eq!(d["forced"], true);
    let first = d["id"].as_i64().unwrap();
    app.wait_weight(MAIN, 0).await;
    assert_eq!(app.weight(BACKUP).await.0, 100);
    let (status, e) = app
        .admin(reqwest::Method::POST, path, Some(forced.clone()))
        .await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (409, Some("drill_active"))
    );

    // Every bad field: a clear JSON error, nothing started.
    let cases = [
        (
            j!({"route": "x/y/z", "duration": "1m", "reason": "r", "force": true}),
            404,
            "unknown_route",
        ),
        (
            j!({"route": MAIN, "duration": "1m", "reason": "r", "force": true, "weight": 101}),
            422,
            "invalid_weight",
        ),
        (
            j!({"route": MAIN, "duration": "2h", "reason": "r", "force": true}),
            422,
            "duration_too_long",
        ),
        (
            j!({"route": MAIN, "duration": "0s", "reason": "r", "force": true}),
            422,
            "invalid_duration",
        ),
        (
            j!({"route": MAIN, "duration": "1m", "reason": "r", "force": true, "ramp": [5, 25]}),
            422,
            "invalid_ramp",
        ),
        (
            j!({"route": MAIN, "duration": "1m", "reason": " ", "force": true}),
            422,
            "invalid_reason",
        ),
        (
            j!({"route": MAIN, "duration": "1m", "reason": "r", "colour": "red"}),
            400,
            "bad_json",
        ),
    ];
    for (body, want, code) in cases {
        let (status, e) = app
            .admin(reqwest::Method::POST, path, Some(body.clone()))
            .await;
        assert_eq!(
            (status, e["error"]["code"].as_str()),
            (want, Some(code)),
            "{body}"
        );
    }
    let big = "x".repeat(20_000);
    let r = app
        .http
        .post(format!("{}{path}", app.base))
        .bearer_auth("drill-secret")
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"route":"{MAIN}","duration":"1m","reason":"{big}"}}"#
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "payload_too_large");

    // Stop by route: recorded as stopped, by whom; the weights come back.
    let (status, s) = app
        .admin(
            reqwest::Method::POST,
            "/api/v1/admin/drills/stop",
            Some(j!({"route": MAIN, "by": "tester"})),
        )
        .await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["drills"][0]["id"], first);
    assert_eq!(s["drills"][0]["ended_by"], "stop");
    assert_eq!(s["drills"][0]["stopped_by"], "tester");
    app.wait_weight(MAIN, 100).await;
    let (status, e) = app
        .admin(
            reqwest::Method::POST,
            "/api/v1/admin/drills/stop",
            Some(j!({"route": MAIN})),
        )
        .await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (404, Some("no_active_drill"))
    );
    let (status, e) = app
        .admin(reqwest::Method::DELETE, &format!("{path}/{first}"), None)
        .await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (409, Some("already_ended"))
    );
    let (status, _) = app
        .admin(reqwest::Method::DELETE, &format!("{path}/999"), None)
        .await;
    assert_eq!(status, 404);

    // Stop by id.
    let (_, d) = app.admin(reqwest::Method::POST, path, Some(forced)).await;
    let second = d["id"].as_i64().unwrap();
    let (status, d) = app
        .admin(
            reqwest::Method::DELETE,
            &format!("{path}/{second}?by=oncall"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(
        (d["ended_by"].as_str(), d["stopped_by"].as_str()),
        (Some("stop"), Some("oncall"))
    );

    // The token variable unset: admin endpoints are off.
    env.remove(var);
    let (status, e) = app.admin(reqwest::Method::POST, path, Some(good)).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (403, Some("admin_disabled"))
    );
    env.set(var, "drill-secret");
    let listed = app.get("/api/v1/drills").await;
    assert_eq!(listed["drills"].as_array().unwrap().len(), 2);

    // Every drill endpoint is in the OpenAPI document, and served.
    let doc = app.get("/api/openapi.json").await;
    let drill_endpoints: Vec<_> = probeok::web::endpoints()
        .into_iter()
        .filter(|e| e.doc_path.contains("/drills"))
        .collect();
    assert_eq!(drill_endpoints.len(), 5);
    for e in drill_endpoints {
        let (method, path) = (e.method.as_str(), e.doc_path);
        let op = &doc["paths"][path][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {path} is not described");
        let (_, body) = app
            .admin(e.method.clone(), &path.replace("{id}", "1"), None)
            .await;
        assert_ne!(body["error"]["code"], "not_found_path", "{method} {path}");
        assert_ne!(body["error"]["message"], "no such path", "{method} {path}");
    }
    assert_eq!(
        doc["paths"]["/api/v1/admin/drills"]["post"]["security"][0]["adminToken"],
        j!([])
    );
    assert_eq!(listed["off_peak"]["timezone"], "Asia/Shanghai");
    assert_eq!(listed["off_peak"]["now_allowed"], false);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_drill_survives_a_restart_and_ends_if_its_end_passed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("d.db");
    let main = upstream(Duration::ZERO).await;
    let backup = upstream(Duration::ZERO).await;
    let var = "PROBEOK_TEST_DRILL_TOKEN_RESTART";
    let clock = Arc::new(ManualClock::new(off_peak()));
    let app = App::start(
        config(&db, &main, &backup, var, free_port()),
        clock.clone(),
        "drill-secret",
    )
    .await;
    let (status, d) = app
        .admin(
            reqwest::Method::POST,
            "/api/v1/admin/drills",
            Some(j!({"route": MAIN, "duration": "10m", "ramp": [50, 100], "reason": "restart drill"})),
        )
        .await;
    assert_eq!(status, 201);
    let id = d["id"].as_i64().unwrap();
    app.wait_weight(MAIN, 50).await;
    app.stop().await;

    // Back 6 minutes later: the drill continues, in its second stage.
    clock.advance(Duration::from_secs(360));
    let app = App::start(
        config(&db, &main, &backup, var, free_port()),
        clock.clone(),
        "drill-secret",
    )
    .await;
    let listed = app.get("/api/v1/drills").await;
    assert_eq!(listed["active"][0]["id"], id, "{listed}");
    assert_eq!(listed["active"][0]["stage"]["index"], 2);
    let (_, reason, _) = app.wait_weight(MAIN, 0).await;
    assert_eq!(reason, "drill");
    app.stop().await;

    // Back after its end: ended automatically, at its end time.
    clock.advance(Duration::from_secs(600));
    let app = App::start(
        config(&db, &main, &backup, var, free_port()),
        clock.clone(),
        "drill-secret",
    )
    .await;
    let one = app.get(&format!("/api/v1/drills/{id}")).await;
    assert_eq!(one["drill"]["status"], "ended");
    assert_eq!(one["drill"]["ended_by"], "auto");
    assert_eq!(one["drill"]["ended_at"], "2026-11-30T18:40:00Z");
    app.wait_weight(MAIN, 100).await;
    app.stop().await;
}

async fn cli(args: &[&str], token: Option<&str>) -> (i32, String, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_probeok"));
    cmd.args(args)
        .env_remove("PROBEOK_CONFIG")
        .env_remove("PROBEOK_ADMIN_TOKEN")
        .env("RUST_LOG", "warn");
    if let Some(t) = token {
        cmd.env("PROBEOK_ADMIN_TOKEN", t);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the CLI finishes")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_starts_reports_and_stops_a_drill() {
    let dir = tempfile::tempdir().unwrap();
    let main = upstream(Duration::ZERO).await;
    let backup = upstream(Duration::ZERO).await;
    let var = "PROBEOK_TEST_DRILL_TOKEN_CLI";
    let clock = Arc::new(ManualClock::new(peak()));
    let app = App::start(
        config(&dir.path().join("d.db"), &main, &backup, var, free_port()),
        clock,
        "drill-secret",
    )
    .await;
    let server = app.base.clone();
    let start = [
        "drill",
        "start",
        "--server",
        &server,
        "--route",
        MAIN,
        "--duration",
        "10m",
        "--reason",
        "cli drill",
        "--ramp",
        "50,100",
    ];

    // Peak time without --force: refused, exit 1, one line naming the windows.
    let (code, _, err) = cli(&start, Some("drill-secret")).await;
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("409 outside_off_peak") && err.contains("02:00–06:00"),
        "{err}"
    );
    // No token: exit 1; a wrong one: refused, exit 1.
    let forced: Vec<&str> = start.iter().copied().chain(["--force"]).collect();
    let (code, _, err) = cli(&forced, None).await;
    assert_eq!(code, 1);
    assert!(err.contains("PROBEOK_ADMIN_TOKEN is not set"), "{err}");
    let (code, _, err) = cli(&forced, Some("wrong")).await;
    assert_eq!(code, 1);
    assert!(err.contains("401 unauthorized"), "{err}");
    // A bad ramp never reaches the server.
    let (code, _, err) = cli(
        &[
            "drill",
            "start",
            "--server",
            &server,
            "--route",
            MAIN,
            "--duration",
            "1m",
            "--reason",
            "r",
            "--ramp",
            "a,b",
        ],
        Some("drill-secret"),
    )
    .await;
    assert_eq!(code, 1, "{err}");

    let (code, out, err) = cli(&forced, Some("drill-secret")).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!(
            "drill 1 started on {MAIN} (chat): weight → 0 in 2 stage(s) (50%, 100%)"
        )),
        "{out}"
    );
    assert!(out.contains("(forced)"), "{out}");
    app.wait_weight(MAIN, 50).await;

    let (code, out, err) = cli(&["drill", "report", "--server", &server, "1"], None).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("drill 1 on {MAIN} (chat): cli drill")),
        "{out}"
    );
    assert!(out.contains("verdict: "), "{out}");
    assert!(out.contains("proxy requests for chat:"), "{out}");
    let (code, out, _) = cli(
        &["drill", "report", "--server", &server, "1", "--json"],
        None,
    )
    .await;
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["drill"]["id"], 1);
    assert_eq!(v["report"]["window"]["running"], true);
    let (code, _, err) = cli(&["drill", "report", "--server", &server, "42"], None).await;
    assert_eq!(code, 1);
    assert!(err.contains("404 not_found"), "{err}");

    let (code, out, err) = cli(
        &["drill", "stop", "--server", &server],
        Some("drill-secret"),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("drill 1 on {MAIN} stopped at")),
        "{out}"
    );
    app.wait_weight(MAIN, 100).await;

    // Nothing listening: a runtime failure, exit 2.
    let dead: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (code, _, err) = cli(
        &["drill", "stop", "--server", &format!("http://{dead}")],
        Some("drill-secret"),
    )
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot reach the server"), "{err}");
    app.stop().await;
}
