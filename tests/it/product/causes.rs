//! A provider that stops accepting connections, through `serve` on real sockets: the
//! refusal is read from the HTTP client's own error, the routes are judged on one shared cause
//! (shown per route, counted in the metrics) and a webhook channel hears of it in one message
//! that names the cause first.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::Json;
use common::upstream::{self, openai, Reply};
use probeok::app;
use probeok::clock::SystemClock;
use probeok::config::Config;
use probeok::secret::Env;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const ROUTES: usize = 30;
const CAUSE: &str = "acme/r0:connection_refused";

fn config(base: &str, db: &std::path::Path, hook: &str) -> Config {
    let mut src = format!(
        "[storage]\npath = \"{}\"\n\n[probe]\ninterval = \"3s\"\ntimeout = \"2s\"\n\
         first_byte_timeout = \"1s\"\nstream = false\nthroughput_every = \"24h\"\n\n\
         [detection]\nmin_samples = 3\n\n[alerting]\ngroup_wait = \"2s\"\n\n\
         [[alert.webhook]]\nurl_env = \"CAUSE_HOOK\"\nlang = \"en\"\n\n\
         [[provider]]\nid = \"acme\"\nkind = \"openai\"\n  [[provider.region]]\n  id = \"r0\"\n  \
         base_url = \"{base}/v1\"\n",
        db.display()
    );
    for i in 0..ROUTES {
        src += &format!(
            "\n[[route]]\nprovider = \"acme\"\nregion = \"r0\"\nmodel = \"m{i}\"\nserves = \"model-{}\"\n",
            i % 5
        );
    }
    let mut c = Config::parse(&src, "causes.toml").unwrap().config;
    c.env = Env::given().with("CAUSE_HOOK", hook);
    c
}

async fn status(http: &reqwest::Client, base: &str) -> Value {
    http.get(format!("{base}/api/v1/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Polls `/api/v1/status` until `done` holds for every route, within `secs`.
async fn until(
    http: &reqwest::Client,
    base: &str,
    secs: u64,
    what: &str,
    done: fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = status(http, base).await;
        if v["routes"].as_array().unwrap().iter().all(done) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what} within {secs} s: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_refusing_connections_is_one_cause_in_the_status_the_metrics_and_one_message() {
    // Every answer closes its connection, so nothing pooled outlives the server. The
    // throughput probe ("count from 1 to 40") gets its count.
    let (up, _) = upstream::fake("/v1/chat/completions", |c| {
        let counting = String::from_utf8_lossy(&c.body).contains("Count from 1 to 40");
        let text = if counting {
            (1..=40)
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            "PROBE_OK".to_owned()
        };
        Reply::now((
            [(header::CONNECTION, "close")],
            Json(openai::body(&text, "stop", Some(3))),
        ))
    })
    .await;
    let (hook, hooks) = upstream::fake("/hook", |_| Reply::now(StatusCode::OK)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &up.base_url(),
        &dir.path().join("c.db"),
        &format!("{}/hook", hook.base_url()),
    );
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::start(cfg, listener, Arc::new(SystemClock), shutdown.clone())
        .await
        .unwrap();
    let base = format!("http://{}", running.addr);
    let http = reqwest::Client::new();

    until(&http, &base, 60, "every route NORMAL", |r| {
        r["state"] == "NORMAL"
    })
    .await;
    // The provider goes away: its port refuses connections.
    drop(up);
    let v = until(
        &http,
        &base,
        30,
        "every route DEGRADED with its cause",
        |r| matches!(r["state"].as_str(), Some("DEGRADED" | "CRITICAL")) && r["cause"] == CAUSE,
    )
    .await;
    let shared = v["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["reason"]["code"] == "shared_cause")
        .count();
    assert!(shared >= ROUTES / 2, "{shared} judged on the cause: {v}");
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!(
            "probeok_cause_routes{{cause=\"{CAUSE}\"}} {ROUTES}"
        )),
        "{metrics}"
    );

    // The incident history shows the outage as one line (its figures are refreshed in the
    // background, so it may take a moment).
    let line = format!("{ROUTES} routes with one cause: {CAUSE}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let history = loop {
        let page = http
            .get(format!("{base}/incidents?lang=en"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let history = page[page.find("id=\"history\"").unwrap()..].to_owned();
        if history.contains(&line) {
            break history;
        }
        assert!(Instant::now() < deadline, "{history}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        !history.contains(">acme/r0/m7<"),
        "no line of its own: {history}"
    );

    // The webhook: the outage in very few messages (routes that join the cause later add to
    // it without a message of their own).
    let deadline = Instant::now() + Duration::from_secs(20);
    let firing = loop {
        let firing: Vec<Value> = hooks
            .all()
            .iter()
            .map(|c| c.json())
            .filter(|m| m["status"] == "firing")
            .collect();
        if !firing.is_empty() {
            break firing;
        }
        assert!(Instant::now() < deadline, "no firing message within 20 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        firing.len() <= 2,
        "{} firing messages: {firing:?}",
        firing.len()
    );
    // The message names the cause first.
    let titles: Vec<&str> = firing.iter().filter_map(|m| m["title"].as_str()).collect();
    assert!(
        titles
            .iter()
            .any(|t| t.contains("] acme: connection refused at 127.0.0.1:")),
        "{titles:?}"
    );
    shutdown.cancel();
    running.done.await.unwrap().unwrap();
}
