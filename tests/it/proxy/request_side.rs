//! No client can poison a route's health: two clients through the real proxy of a running
//! service, one whose own requests time out (an enormous `max_tokens`), one normal, while the
//! probes succeed. The route stays NORMAL, its breaker closed, the weights unchanged, and a
//! `request_side` finding names the client and what failed.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use common::{fake, json, openai, Captured, Reply, Script};
use probeok::app::{self, StartOptions};
use probeok::clock::SystemClock;
use probeok::config::Config;
use probeok::health::{FindingKind, State};
use probeok::proxy::attribution::client_tag;
use probeok::route::RouteId;
use probeok::secret::Secret;
use serde_json::{json as j, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const KEY_POISON: &str = "sk-client-poison-0001";
const KEY_NORMAL: &str = "sk-client-normal-0002";
/// Requests asking for this many output tokens keep the fake provider silent past the
/// proxy's first-byte timeout.
const HUGE: u64 = 1_000_000;

use common::free_port;

/// A provider that answers probes (`PROBE_OK`, the throughput count) and ordinary requests at
/// once, and a request with an enormous `max_tokens` only after 3 s.
async fn provider() -> common::Server {
    let (server, _requests) = fake("/v1/chat/completions", |c: &Captured| {
        let body = c.json();
        let count = (body.to_string()).contains("Count from 1 to 40");
        let text = if count {
            (1..=40)
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            "PROBE_OK".to_owned()
        };
        let delay = if body["max_tokens"].as_u64() == Some(HUGE) {
            Duration::from_secs(3)
        } else {
            Duration::ZERO
        };
        if body["stream"] == true {
            let script = Script::new().send_all(openai::stream(&[&text], "stop", Some(40)));
            Reply::after(delay, script.sse())
        } else {
            let answer = openai::body(&text, "stop", Some(3));
            Reply::after(delay, json(StatusCode::OK, answer))
        }
    })
    .await;
    server
}

fn config(db: &std::path::Path, main: &str, backup: &str, proxy: u16) -> Config {
    let src = format!(
        r#"
[storage]
path = "{db}"

[probe]
interval = "300ms"
timeout = "2s"
first_byte_timeout = "1s"
jitter = 0.0

[detection]
min_samples = 3

[proxy]
enabled = true
listen = "127.0.0.1:{proxy}"
first_byte_timeout = "300ms"
max_attempts = 1
max_retry_wait = "0s"

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
    );
    Config::parse(&src, "request_side.toml").unwrap().config
}

async fn chat(http: &reqwest::Client, proxy: &str, key: &str, max_tokens: u64) -> StatusCode {
    let body = j!({"model": "chat", "stream": max_tokens == HUGE, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hello"}]});
    let r = http
        .post(format!("{proxy}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let _ = r.bytes().await;
    status
}

/// `(route, weight)` of every route of `chat`.
fn shares(weights: &Value) -> Vec<(String, u64)> {
    (weights["models"]["chat"].as_array().unwrap().iter())
        .map(|r| {
            (
                r["route"].as_str().unwrap().to_owned(),
                r["weight"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_own_timeouts_do_not_poison_the_route() {
    let dir = tempfile::tempdir().unwrap();
    let main = provider().await;
    let backup = provider().await;
    let port = free_port();
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let options = StartOptions {
        proxy_client_keys: Some(vec![Secret::new(KEY_POISON), Secret::new(KEY_NORMAL)]),
        ..StartOptions::default()
    };
    let cfg = config(
        &dir.path().join("rs.db"),
        &main.base_url(),
        &backup.base_url(),
        port,
    );
    let running = app::start_with(
        cfg,
        listener,
        Arc::new(SystemClock),
        shutdown.clone(),
        options,
    )
    .await
    .unwrap();
    let monitor = format!("http://{}", running.addr);
    let proxy = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let route = RouteId::new("main", "cn", "m");

    // The probes make both routes NORMAL.
    let mut health = running.health.clone();
    tokio::time::timeout(
        Duration::from_secs(20),
        health.wait_for(|s| {
            !s.routes.is_empty() && s.routes.iter().all(|r| r.state == State::Normal)
        }),
    )
    .await
    .expect("both routes are NORMAL within 20 s")
    .unwrap();
    let before: Value = (http.get(format!("{monitor}/api/v1/weights")).send().await)
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        before["models"]["chat"][0]["route"], "main/cn/m",
        "{before}"
    );
    assert_eq!(before["models"]["chat"][0]["weight"], 100, "{before}");

    // Every state the primary shows from now on.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (seen, watching) = (seen.clone(), watching.clone());
        let mut rx = running.health.clone();
        let route = route.clone();
        tokio::spawn(async move {
            while watching.load(Ordering::SeqCst) {
                if tokio::time::timeout(Duration::from_millis(200), rx.changed())
                    .await
                    .is_ok_and(|r| r.is_err())
                {
                    break;
                }
                let state = rx.borrow().route(&route).map(|r| r.state);
                seen.lock().unwrap().extend(state);
            }
        })
    };

    // The normal client's successes vouch for the route; then both send together, the
    // poisoning client more often than the normal one.
    for _ in 0..5 {
        assert_eq!(chat(&http, &proxy, KEY_NORMAL, 16).await, StatusCode::OK);
    }
    for _ in 0..6 {
        let (a, b, c, d, e) = tokio::join!(
            chat(&http, &proxy, KEY_POISON, HUGE),
            chat(&http, &proxy, KEY_POISON, HUGE),
            chat(&http, &proxy, KEY_POISON, HUGE),
            chat(&http, &proxy, KEY_NORMAL, 16),
            chat(&http, &proxy, KEY_NORMAL, 16),
        );
        assert_eq!((d, e), (StatusCode::OK, StatusCode::OK));
        for s in [a, b, c] {
            assert_eq!(
                s,
                StatusCode::GATEWAY_TIMEOUT,
                "the poisoning client's own timeout"
            );
        }
    }

    // The finding names the client and what failed; the route was never anything but NORMAL.
    let tag = client_tag(KEY_POISON);
    let deadline = Instant::now() + Duration::from_secs(15);
    let finding = loop {
        let snap = running.health.borrow().clone();
        let found = (snap.findings.iter())
            .find(|f| f.kind == FindingKind::RequestSide && f.routes.contains(&route))
            .cloned();
        if let Some(f) = found {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "no request_side finding: {snap:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(finding.code, "request_side");
    assert!(finding.text.contains(&tag), "{}", finding.text);
    assert!(
        finding
            .text
            .contains("18 requests failed (timeout_before_first_byte)"),
        "{}",
        finding.text
    );
    assert!(!finding.text.contains(KEY_POISON), "the key never shows");
    // Detection keeps judging for a few more ticks after the traffic.
    tokio::time::sleep(Duration::from_secs(2)).await;
    watching.store(false, Ordering::SeqCst);
    watcher.await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|s| *s == State::Normal),
        "the primary left NORMAL: {seen:?}"
    );

    let status: Value = (http.get(format!("{monitor}/api/v1/status")).send().await)
        .unwrap()
        .json()
        .await
        .unwrap();
    let primary = (status["routes"].as_array().unwrap().iter())
        .find(|r| r["id"] == "main/cn/m")
        .unwrap()
        .clone();
    assert_eq!(primary["state"], "NORMAL", "{primary}");
    assert_eq!(primary["breaker"], "closed", "{primary}");
    let after: Value = (http.get(format!("{monitor}/api/v1/weights")).send().await)
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shares(&after), shares(&before), "the weights did not move");
    let incidents = running
        .store
        .reader()
        .unwrap()
        .incidents(
            Some(&route),
            chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
            10,
        )
        .unwrap();
    assert!(incidents.is_empty(), "{incidents:?}");

    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), running.done).await;
}
