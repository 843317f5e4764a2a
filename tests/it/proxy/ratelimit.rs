//! Rate-limit headroom end to end: a running service probes two fake providers that are real
//! HTTP servers sending their documented rate-limit headers on streamed answers — an
//! OpenAI-compatible one (`x-ratelimit-*`) and an Anthropic one (`anthropic-ratelimit-*`) —
//! and proxies a real request to the OpenAI-compatible one. Each route's `ratelimit` in
//! `/api/v1/status` and `probeok_route_ratelimit_remaining_ratio` on `/metrics` show the
//! latest reading with its source; malformed figures are ignored or clamped.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use common::{anthropic, fake, free_port, openai, Captured, Reply, Script};
use probeok::app::{self, StartOptions};
use probeok::clock::SystemClock;
use probeok::config::Config;
use probeok::secret::Secret;
use serde_json::{json as j, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const CLIENT_KEY: &str = "sk-client-ratelimit-0001";
/// Client requests ask for this many tokens: the fake tells them from probes by it.
const CLIENT_MAX_TOKENS: u64 = 77;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(
            HeaderName::from_static(k),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

/// The text a probe expects, or the count a throughput probe asks for.
fn answer(c: &Captured) -> String {
    if c.json().to_string().contains("Count from 1 to 40") {
        (1..=40)
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        "PROBE_OK".to_owned()
    }
}

/// OpenAI-compatible: plenty left for probes; for client requests 12 of 500 requests left and
/// a tokens limit too large to be a count.
async fn openai_provider() -> common::Server {
    let (server, _) = fake("/v1/chat/completions", |c: &Captured| {
        let client = c.json()["max_tokens"].as_u64() == Some(CLIENT_MAX_TOKENS);
        let h = if client {
            headers(&[
                ("x-ratelimit-limit-requests", "500"),
                ("x-ratelimit-remaining-requests", "12"),
                ("x-ratelimit-limit-tokens", "99999999999999999999999"),
                ("x-ratelimit-remaining-tokens", "5"),
                ("x-ratelimit-reset-requests", "6m0s"),
            ])
        } else {
            headers(&[
                ("x-ratelimit-limit-requests", "500"),
                ("x-ratelimit-remaining-requests", "400"),
                ("x-ratelimit-limit-tokens", "150000"),
                ("x-ratelimit-remaining-tokens", "90000"),
                ("x-ratelimit-reset-tokens", "20ms"),
            ])
        };
        let text = answer(c);
        let script = Script::new().send_all(openai::stream(&[&text], "stop", Some(40)));
        Reply::now((h, script.sse()))
    })
    .await;
    server
}

/// Anthropic: all four limits, one clamped (remaining above its limit), one malformed.
async fn anthropic_provider() -> common::Server {
    let (server, _) = fake("/v1/messages", |c: &Captured| {
        let h = headers(&[
            ("anthropic-ratelimit-requests-limit", "1000"),
            ("anthropic-ratelimit-requests-remaining", "999"),
            ("anthropic-ratelimit-requests-reset", "2026-12-06T08:00:59Z"),
            ("anthropic-ratelimit-tokens-limit", "96000"),
            ("anthropic-ratelimit-tokens-remaining", "200000"),
            ("anthropic-ratelimit-input-tokens-limit", "80000"),
            ("anthropic-ratelimit-input-tokens-remaining", "4000"),
            ("anthropic-ratelimit-output-tokens-limit", "lots"),
            ("anthropic-ratelimit-output-tokens-remaining", "-1"),
        ]);
        let text = answer(c);
        let script = Script::new().send_all(anthropic::stream(&[&text], "end_turn", Some(40)));
        Reply::now((h, script.sse()))
    })
    .await;
    server
}

/// The OpenAI-compatible route probes once, at the start (an hour's interval, first in the
/// config); the Anthropic one every 400 ms.
fn config(db: &std::path::Path, oa: &str, an: &str, proxy: u16) -> Config {
    let src = format!(
        r#"
[storage]
path = "{db}"

[probe]
interval = "400ms"
timeout = "2s"
first_byte_timeout = "1s"
jitter = 0.0

[proxy]
enabled = true
listen = "127.0.0.1:{proxy}"
max_attempts = 1
max_retry_wait = "0s"

[[provider]]
id = "oa"
kind = "openai"
  [[provider.region]]
  id = "us"
  base_url = "{oa}/v1"

[[provider]]
id = "an"
kind = "anthropic"
  [[provider.region]]
  id = "us"
  base_url = "{an}"

[[route]]
provider = "oa"
region = "us"
model = "gpt"
serves = "chat"
interval = "1h"

[[route]]
provider = "an"
region = "us"
model = "claude"
serves = "claude"
"#,
        db = db.display(),
    );
    Config::parse(&src, "ratelimit.toml").unwrap().config
}

async fn get(http: &reqwest::Client, url: &str) -> String {
    http.get(url).send().await.unwrap().text().await.unwrap()
}

/// The `ratelimit` object of `route` in the monitor's status.
async fn ratelimit(http: &reqwest::Client, monitor: &str, route: &str) -> Value {
    let status: Value =
        serde_json::from_str(&get(http, &format!("{monitor}/api/v1/status")).await).unwrap();
    (status["routes"].as_array().unwrap().iter())
        .find(|r| r["id"] == route)
        .map(|r| r["ratelimit"].clone())
        .unwrap_or(Value::Null)
}

/// Polls `route`'s `ratelimit` until `done` holds, within 15 s.
async fn until(
    http: &reqwest::Client,
    monitor: &str,
    route: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = ratelimit(http, monitor, route).await;
        if done(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "{route}: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn gauge(metrics: &str, route: &str, limit: &str) -> Option<f64> {
    let prefix =
        format!("probeok_route_ratelimit_remaining_ratio{{route=\"{route}\",limit=\"{limit}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_proxied_requests_show_each_routes_headroom() {
    let dir = tempfile::tempdir().unwrap();
    let oa = openai_provider().await;
    let an = anthropic_provider().await;
    let port = free_port();
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let options = StartOptions {
        proxy_client_keys: Some(vec![Secret::new(CLIENT_KEY)]),
        ..StartOptions::default()
    };
    let cfg = config(
        &dir.path().join("rl.db"),
        &oa.base_url(),
        &an.base_url(),
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
    let http = reqwest::Client::new();

    // Probes: the Anthropic route's four limits, malformed ones ignored or clamped.
    let an_rl = until(&http, &monitor, "an/us/claude", |r| r.is_object()).await;
    assert_eq!(an_rl["requests"]["remaining"], 999, "{an_rl}");
    assert_eq!(an_rl["requests"]["limit"], 1000, "{an_rl}");
    assert_eq!(an_rl["requests"]["ratio"], 0.999, "{an_rl}");
    assert_eq!(an_rl["requests"]["source"], "probe", "{an_rl}");
    assert!(an_rl["requests"]["at"].is_string(), "{an_rl}");
    assert_eq!(an_rl["tokens"]["remaining"], 96000, "clamped: {an_rl}");
    assert_eq!(an_rl["tokens"]["ratio"], 1.0, "{an_rl}");
    assert_eq!(an_rl["input_tokens"]["ratio"], 0.05, "{an_rl}");
    assert!(an_rl.get("output_tokens").is_none(), "ignored: {an_rl}");

    // The OpenAI-compatible route's one probe.
    let oa_rl = until(&http, &monitor, "oa/us/gpt", |r| r.is_object()).await;
    assert_eq!(oa_rl["requests"]["ratio"], 0.8, "{oa_rl}");
    assert_eq!(oa_rl["requests"]["source"], "probe", "{oa_rl}");
    assert_eq!(oa_rl["tokens"]["ratio"], 0.6, "{oa_rl}");
    assert!(oa_rl.get("input_tokens").is_none(), "{oa_rl}");

    // A real request through the proxy: 12 of 500 requests left, seen from traffic.
    let r = http
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .json(
            &j!({"model": "chat", "stream": true, "max_tokens": CLIENT_MAX_TOKENS,
            "messages": [{"role": "user", "content": "hello"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let _ = r.bytes().await.unwrap();
    let oa_rl = until(&http, &monitor, "oa/us/gpt", |r| {
        r["requests"]["source"] == "traffic"
    })
    .await;
    assert_eq!(oa_rl["requests"]["remaining"], 12, "{oa_rl}");
    assert_eq!(oa_rl["requests"]["limit"], 500, "{oa_rl}");
    assert_eq!(oa_rl["requests"]["ratio"], 0.024, "{oa_rl}");
    // The huge tokens limit was no figure: the probe's reading stays.
    assert_eq!(oa_rl["tokens"]["ratio"], 0.6, "{oa_rl}");
    assert_eq!(oa_rl["tokens"]["source"], "probe", "{oa_rl}");

    let metrics = get(&http, &format!("{monitor}/metrics")).await;
    assert!(
        metrics.contains("# TYPE probeok_route_ratelimit_remaining_ratio gauge"),
        "{metrics}"
    );
    assert_eq!(gauge(&metrics, "oa/us/gpt", "requests"), Some(0.024));
    assert_eq!(gauge(&metrics, "oa/us/gpt", "tokens"), Some(0.6));
    assert_eq!(gauge(&metrics, "oa/us/gpt", "input_tokens"), None);
    assert_eq!(gauge(&metrics, "an/us/claude", "requests"), Some(0.999));
    assert_eq!(gauge(&metrics, "an/us/claude", "tokens"), Some(1.0));
    assert_eq!(gauge(&metrics, "an/us/claude", "input_tokens"), Some(0.05));
    assert_eq!(gauge(&metrics, "an/us/claude", "output_tokens"), None);

    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(15), running.done).await;
}
