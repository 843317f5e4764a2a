//! `contrib/grafana/probeok.json` names only metrics the service exposes: every PromQL
//! expression of the dashboard (panel targets and template variables) is tokenized, its metric
//! names kept (identifiers that are not functions, keywords, labels, numbers or Grafana
//! variables), and each is looked up in a real `/metrics` scrape of a running service on
//! 127.0.0.1:0 after it probed a simulated provider and proxied one request. A real
//! Prometheus then parses and evaluates every expression, so a typo in PromQL fails too.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::upstream::{self, openai, Reply, Script};
use probeok::sim::{self, Scenario, SimConfig, SimRoute};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const DASHBOARD: &str = "contrib/grafana/probeok.json";
const PROMETHEUS: &str = "/usr/bin/prometheus";

fn dashboard() -> Value {
    let text = std::fs::read_to_string(DASHBOARD).expect("the dashboard is in contrib/grafana");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every PromQL expression of the dashboard, with where it is: panel targets (rows' nested
/// panels too) and query variables.
fn expressions(d: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?").to_owned();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((format!("panel {title:?} {}", t["refId"]), e.to_owned()));
                }
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&d["panels"], &mut out);
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        let q = v["query"]["query"].as_str().or_else(|| v["query"].as_str());
        if let Some(q) = q {
            out.push((format!("variable {}", v["name"]), q.to_owned()));
        }
    }
    out
}

/// PromQL words that are never metric names where they appear as bare identifiers.
const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
];

/// Words after which a parenthesised list holds label names, not expressions.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    Open,
    Close,
    Comma,
}

/// Identifiers, parentheses and commas of one expression; strings, label matchers
/// (`{…}`), ranges and subqueries (`[…]`), numbers, operators and Grafana variables
/// (`$x`, `${x}`) are dropped.
fn tokens(expr: &str) -> Vec<Token> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let ident_start = |c: u8| c.is_ascii_alphabetic() || c == b'_' || c == b':';
    let ident_char = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' | b'\'' | b'`' => {
                i += 1;
                while i < b.len() && b[i] != c {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'{' | b'[' => {
                let close = if c == b'{' { b'}' } else { b']' };
                while i < b.len() && b[i] != close {
                    if matches!(b[i], b'"' | b'\'' | b'`') {
                        let q = b[i];
                        i += 1;
                        while i < b.len() && b[i] != q {
                            i += if b[i] == b'\\' { 2 } else { 1 };
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            b'$' => {
                i += 1;
                if i < b.len() && b[i] == b'{' {
                    while i < b.len() && b[i] != b'}' {
                        i += 1;
                    }
                    i += 1;
                } else {
                    while i < b.len() && ident_char(b[i]) {
                        i += 1;
                    }
                }
            }
            b'(' => {
                out.push(Token::Open);
                i += 1;
            }
            b')' => {
                out.push(Token::Close);
                i += 1;
            }
            b',' => {
                out.push(Token::Comma);
                i += 1;
            }
            c if c.is_ascii_digit() || c == b'.' => {
                // 0.95, 2592000, 1e3, 0x1f: never a name.
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
            }
            c if ident_start(c) => {
                let start = i;
                while i < b.len() && ident_char(b[i]) {
                    i += 1;
                }
                out.push(Token::Ident(expr[start..i].to_owned()));
            }
            _ => i += 1,
        }
    }
    out
}

/// The metric names an expression reads. An identifier followed by `(` is a function or an
/// aggregation; a list after `by`/`without`/`on`/… holds labels; in Grafana's
/// `label_values(metric, label)` the last argument is a label.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let t = tokens(expr);
    let mut names = BTreeSet::new();
    let mut i = 0;
    // Depth of each open `label_values(` call, to drop its last argument.
    let mut label_values_depth: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    while i < t.len() {
        match &t[i] {
            Token::Ident(w) => {
                // `sum by (…) (…)`: an aggregation with its grouping before its argument.
                let next_open = matches!(t.get(i + 1), Some(Token::Open))
                    || (!LABEL_LISTS.contains(&w.as_str())
                        && matches!(t.get(i + 1), Some(Token::Ident(g)) if g == "by" || g == "without"));
                if LABEL_LISTS.contains(&w.as_str()) && next_open {
                    // Skip to the list's closing parenthesis.
                    while i < t.len() && t[i] != Token::Close {
                        i += 1;
                    }
                } else if next_open {
                    if w == "label_values" {
                        label_values_depth.push(depth + 1);
                    }
                } else if !KEYWORDS.contains(&w.as_str()) {
                    let last_label_arg = label_values_depth.last() == Some(&depth)
                        && matches!(t.get(i.wrapping_sub(1)), Some(Token::Comma));
                    if !last_label_arg {
                        names.insert(w.clone());
                    }
                }
            }
            Token::Open => depth += 1,
            Token::Close => {
                if label_values_depth.last() == Some(&depth) {
                    label_values_depth.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Token::Comma => {}
        }
        i += 1;
    }
    names
}

#[test]
fn the_tokenizer_keeps_metric_names_only() {
    let e = r#"histogram_quantile(0.95, sum by (le, provider) (rate(probeok_probe_duration_seconds_bucket{provider=~"$provider", x="a{b}"}[$__rate_interval])))"#;
    assert_eq!(
        metric_names(e),
        BTreeSet::from(["probeok_probe_duration_seconds_bucket".to_owned()])
    );
    let e = r#"sum(rate(a_total{result="success"}[5m])) / on (job) group_left (instance) b offset 1h > bool 0.5 and c unless d"#;
    assert_eq!(
        metric_names(e).into_iter().collect::<Vec<_>>(),
        ["a_total", "b", "c", "d"]
    );
    assert_eq!(
        metric_names("label_values(probeok_route_state, provider)"),
        BTreeSet::from(["probeok_route_state".to_owned()])
    );
    assert_eq!(
        metric_names("clamp_min(-deriv(x[1h]) * 2592000, 0) + 1e3 + ${var}"),
        BTreeSet::from(["x".to_owned()])
    );
}

/// The sample names each `# TYPE` family of an OpenMetrics text stands for, and the sample
/// names that carry values.
fn exposed(text: &str) -> (BTreeMap<String, String>, BTreeSet<String>) {
    let mut families = BTreeMap::new();
    let mut samples = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "summary" => &["", "_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[""],
            };
            for s in suffixes {
                families.insert(format!("{name}{s}"), name.to_owned());
            }
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            samples.insert(line[..end].to_owned());
        }
    }
    (families, samples)
}

async fn start_sim(shutdown: CancellationToken) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = SimConfig {
        routes: vec![SimRoute {
            provider: "sim".into(),
            region: "r1".into(),
            model: "m1".into(),
            scenario: Scenario::Healthy,
        }],
        time_scale: 1.0,
        seed: 11,
    };
    tokio::spawn(sim::serve(listener, config, shutdown));
    addr
}

/// An upstream that refuses our key (401, OpenAI's error body) on every call: a route fault,
/// which raises an alert and makes the proxy fail over.
async fn start_refusing_upstream() -> std::net::SocketAddr {
    use axum::http::StatusCode;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(|| async {
        (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({"error": {
                "message": "Incorrect API key provided",
                "type": "invalid_request_error",
                "code": "invalid_api_key"
            }})),
        )
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// What the test writes in its proxied requests so that the flaky upstream fails them.
const FAIL_OVER_MARK: &str = "fail over, please";

/// An upstream that answers every probe but fails (503, OpenAI's overload body) the requests
/// that carry [`FAIL_OVER_MARK`]: its route stays NORMAL under probing, so the proxy keeps
/// choosing it and fails over — the counter does not depend on which comes first, probe or
/// request.
async fn start_flaky_upstream() -> upstream::Server {
    use axum::http::StatusCode;
    let (server, _) = upstream::fake("/v1/chat/completions", |req| {
        if String::from_utf8_lossy(&req.body).contains(FAIL_OVER_MARK) {
            return Reply::now(upstream::json(
                StatusCode::SERVICE_UNAVAILABLE,
                openai::error("The server is overloaded", "server_error", None),
            ));
        }
        let streamed = req.json()["stream"].as_bool().unwrap_or(false);
        if streamed {
            Reply::now(
                Script::new()
                    .send_all(openai::stream(&["PROBE", "_OK"], "stop", Some(2)))
                    .sse(),
            )
        } else {
            Reply::now(upstream::json(
                StatusCode::OK,
                openai::body("PROBE_OK", "stop", Some(2)),
            ))
        }
    })
    .await;
    server
}

/// A webhook receiver that takes every alert.
async fn start_webhook() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(|| async { "ok" });
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

use common::free_port;

fn config_text(
    sim: std::net::SocketAddr,
    refusing: std::net::SocketAddr,
    flaky: &str,
    db: &Path,
    port: u16,
    proxy_port: u16,
) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
ingest_token_env = "GRAFANA_TEST_INGEST_TOKEN"

[storage]
path = "{db}"

[probe]
interval = "2s"
timeout = "1900ms"
first_byte_timeout = "1s"
throughput_every = "2s"

[alerting]
group_wait = "0s"

[[alert.webhook]]
url_env = "GRAFANA_TEST_WEBHOOK_URL"
lang = "en"

[proxy]
enabled = true
listen = "127.0.0.1:{proxy_port}"

[[provider]]
id = "sim"
kind = "openai"
  [[provider.region]]
  id = "r1"
  base_url = "{base}"

[[provider]]
id = "refusing"
kind = "openai"
  [[provider.region]]
  id = "r1"
  base_url = "http://{refusing}/v1"

[[provider]]
id = "flaky"
kind = "openai"
  [[provider.region]]
  id = "r1"
  base_url = "{flaky}/v1"

[[route]]
provider = "sim"
region = "r1"
model = "m1"
serves = "chat"
tier = "primary"
weight = 50

[[route]]
provider = "refusing"
region = "r1"
model = "m1"
serves = "chat"
tier = "primary"
weight = 50

[[route]]
provider = "flaky"
region = "r1"
model = "m1"
serves = "chat"
tier = "primary"
weight = 50
"#,
        db = db.display(),
        base = sim::base_url(sim, "sim", "r1"),
    )
}

/// One passive outcome, so the ingest counter has a series.
fn ingest_body() -> Value {
    serde_json::json!([{
        "route": "sim/r1/m1",
        "started_at": probeok::clock::rfc3339(chrono::Utc::now()),
        "success": true,
        "ttfb_ms": 100.0,
        "ttft_ms": 200.0,
        "total_ms": 400.0,
        "http_status": 200
    }])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_names_is_on_metrics() {
    let d = dashboard();
    let exprs = expressions(&d);
    assert!(
        exprs.len() >= 20,
        "the dashboard has its queries: {exprs:?}"
    );
    let mut wanted: BTreeMap<String, String> = BTreeMap::new();
    for (at, e) in &exprs {
        let names = metric_names(e);
        assert!(!names.is_empty(), "{at}: no metric in {e:?}");
        for n in names {
            wanted.entry(n).or_insert_with(|| at.clone());
        }
    }
    // What the issue asks the dashboard to show.
    for family in [
        "probeok_route_state",
        "probeok_route_weight",
        "probeok_provider_probe_duration_seconds_bucket",
        "probeok_probe_ttfb_seconds_bucket",
        "probeok_probe_output_tokens_per_second",
        "probeok_proxy_requests_total",
        "probeok_proxy_failovers_total",
        "probeok_alerts_total",
        "probeok_slo_error_budget_remaining",
    ] {
        assert!(wanted.contains_key(family), "the dashboard shows {family}");
    }

    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();
    let sim_addr = start_sim(shutdown.child_token()).await;
    let refusing = start_refusing_upstream().await;
    let flaky = start_flaky_upstream().await;
    let webhook = start_webhook().await;
    let (port, proxy_port) = (free_port(), free_port());
    let config = dir.path().join("probeok.toml");
    std::fs::write(
        &config,
        config_text(
            sim_addr,
            refusing,
            &flaky.base_url(),
            &dir.path().join("grafana.db"),
            port,
            proxy_port,
        ),
    )
    .unwrap();
    // The service as operators run it: the binary, its secrets in its own environment.
    let _service = Killed(
        Command::new(env!("CARGO_BIN_EXE_probeok"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("GRAFANA_TEST_WEBHOOK_URL", format!("http://{webhook}/hook"))
            .env("GRAFANA_TEST_INGEST_TOKEN", "grafana-test-token")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start probeok serve"),
    );
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");

    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = String::new();
    let mut ingested = false;
    loop {
        assert!(
            Instant::now() < deadline,
            "after 120 s the dashboard still names metrics without a series on /metrics: {last}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Real requests through the proxy; those that go to the flaky route first fail over.
        let _ = http
            .post(format!("http://127.0.0.1:{proxy_port}/v1/chat/completions"))
            .json(&serde_json::json!({
                "model": "chat",
                "messages": [{"role": "user", "content": FAIL_OVER_MARK}],
            }))
            .send()
            .await;
        if !ingested {
            ingested = http
                .post(format!("{base}/api/v1/ingest"))
                .bearer_auth("grafana-test-token")
                .json(&ingest_body())
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
        }
        let Ok(r) = http.get(format!("{base}/metrics")).send().await else {
            last = "not listening yet".into();
            continue;
        };
        let text = r.text().await.unwrap();
        let (families, samples) = exposed(&text);
        let missing: Vec<_> = wanted
            .iter()
            .filter(|(n, _)| !families.contains_key(*n) || !samples.contains(*n))
            .collect();
        if missing.is_empty() {
            break;
        }
        last = format!("{missing:?}\n{text}");
    }
    shutdown.cancel();
}

/// Kills (and reaps) Prometheus when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The expression as Grafana sends it: its variables replaced by what "All" and the default
/// interval stand for.
fn as_sent(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$provider", ".*")
        .replace("$serves", ".*")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_accepts_every_dashboard_query() {
    assert!(
        Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} is missing: install Debian's `prometheus` package (scripts/test does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(&config, "global:\n  scrape_interval: 1m\n").unwrap();
    let port = free_port();
    let _prometheus = Killed(
        Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start prometheus"),
    );
    let http = reqwest::Client::new();
    let api = format!("http://127.0.0.1:{port}/api/v1");
    let deadline = Instant::now() + Duration::from_secs(30);
    // Ready, not only listening: until its storage is open Prometheus answers its API with a
    // plain-text 503.
    let ready = format!("http://127.0.0.1:{port}/-/ready");
    while !http
        .get(&ready)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            Instant::now() < deadline,
            "Prometheus did not start in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (at, expr) in expressions(&dashboard()) {
        // Grafana's `label_values(metric, label)` is not PromQL: Prometheus gets its series
        // selector through the series API, as Grafana sends it.
        let answer: Value = if let Some(inner) = expr.strip_prefix("label_values(") {
            let metric = inner.split(',').next().unwrap().trim().to_owned();
            http.get(format!("{api}/series"))
                .query(&[("match[]", metric)])
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        } else {
            http.get(format!("{api}/query"))
                .query(&[("query", as_sent(&expr))])
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        };
        assert_eq!(answer["status"], "success", "{at}: {expr}\n{answer}");
    }
}
