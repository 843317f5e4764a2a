//! Route observables from real traffic, end to end: requests through the real proxy to a fake
//! upstream speaking OpenAI's wire format, the proxy's rollups in the store, and what the
//! monitor's `/api/v1/status`, route page, `/metrics` and drift findings make of them.
//! Time is a `ManualClock`: the observables' buckets follow it, so a day of traffic takes
//! a moment.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::app::{at, Harness};
use common::pg::TestDb;
use common::{fake, json, openai, Reply, Script, Server};
use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig};
use probeok::drift::traffic::{self, TrafficOptions};
use probeok::drift::{DriftKind, DriftSnapshot};
use probeok::proxy::{self, Proxy, ProxyOptions, WeightsView};
use probeok::route::{Capability, Price};
use serde_json::{json as j, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const ROUTE: &str = "fake/r1/up-model";
const SPEC: &[common::app::Spec<'static>] =
    &[common::app::Spec::new("fake", "r1", "up-model").serves("chat")];

/// Answers by the user message: `valid` → a JSON object, `broken` → cut JSON, `schema-bad` →
/// JSON with a string where the schema wants an integer, `refuse` → a content-filter stop;
/// streams send 11 tokens 20 ms apart.
async fn upstream() -> Server {
    let (server, _reqs) = fake("/chat/completions", |req| {
        let body = req.json();
        let word = body["messages"][0]["content"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        if body["stream"] == true {
            let pieces = [
                "{", "\"a\"", ":", " 1", ",", " \"b\"", ":", " 2", ",", " \"c\":3", "}",
            ];
            return Reply::now(
                Script::new()
                    .every(
                        Duration::from_millis(20),
                        openai::stream(&pieces, "stop", Some(11)),
                    )
                    .sse(),
            );
        }
        let answer = match word.as_str() {
            "broken" => openai::body("{\"ok\": tru", "stop", Some(3)),
            "schema-bad" => {
                openai::body("{\"name\": \"Ann\", \"age\": \"three\"}", "stop", Some(3))
            }
            "schema-good" => openai::body("{\"name\": \"Ann\", \"age\": 3}", "stop", Some(3)),
            "refuse" => j!({"id": "c1", "object": "chat.completion", "model": "up-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": null},
                "finish_reason": "content_filter"}]}),
            _ => openai::body("{\"ok\": true}", "stop", Some(3)),
        };
        Reply::now(json(StatusCode::OK, answer))
    })
    .await;
    server
}

struct Rig {
    h: Harness,
    proxy: Proxy,
    base: String,
    http: reqwest::Client,
    _stop: CancellationToken,
    _up: Server,
    _passive: mpsc::Receiver<probeok::probe::ProbeOutcome>,
}

async fn rig(now: &str) -> Rig {
    let h = Harness::new(SPEC, at(now)).await;
    let up = upstream().await;
    let mut config = Config::default();
    config.providers.push(ProviderConfig {
        id: "fake".into(),
        regions: vec![RegionConfig {
            id: "r1".into(),
            base_url: up.base_url(),
        }],
        ..ProviderConfig::default()
    });
    config.routes.push(RouteConfig {
        provider: "fake".into(),
        region: "r1".into(),
        model: "up-model".into(),
        serves: "chat".into(),
        capabilities: vec![
            Capability::Stream,
            Capability::JsonSchema,
            Capability::Tools,
        ],
        // 12 prompt and 3 completion tokens cost 12 + 6 = 18.
        price: Some(Price {
            input_per_mtok: 1_000_000.0,
            output_per_mtok: 2_000_000.0,
            currency: "CNY".into(),
        }),
        ..RouteConfig::default()
    });
    config.proxy.enabled = true;
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, prx) = mpsc::channel(4096);
    let opts = ProxyOptions {
        store: Some(h.store.clone()),
        clock: h.clock.clone(),
        ..ProxyOptions::default()
    };
    let p = Proxy::with_options(&config, wrx, ptx, opts).expect("proxy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p.clone(), stop.clone()));
    Rig {
        h,
        proxy: p,
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        _stop: stop,
        _up: up,
        _passive: prx,
    }
}

fn json_object(word: &str) -> Value {
    j!({"model": "chat", "messages": [{"role": "user", "content": word}],
        "response_format": {"type": "json_object"}})
}

fn json_schema(word: &str) -> Value {
    j!({"model": "chat", "messages": [{"role": "user", "content": word}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"]}}}})
}

impl Rig {
    async fn send(&self, body: Value) -> String {
        let r = self
            .http
            .post(format!("{}/v1/chat/completions", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "{text}");
        text
    }

    async fn status_route(&self) -> Value {
        let served = self.h.serve().await;
        let v: Value = self
            .http
            .get(served.url("/api/v1/status"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == ROUTE)
            .cloned()
            .unwrap()
    }
}

#[tokio::test]
async fn real_traffic_shows_validity_refusals_pace_and_cost() {
    let rig = rig("2026-03-04T10:00:30Z").await;
    for _ in 0..6 {
        rig.send(json_object("valid")).await;
    }
    for _ in 0..2 {
        rig.send(json_object("broken")).await;
    }
    rig.send(json_schema("schema-bad")).await;
    rig.send(json_schema("schema-good")).await;
    rig.send(j!({"model": "chat", "messages": [{"role": "user", "content": "refuse"}]}))
        .await;
    let mut stream = json_object("valid");
    stream["stream"] = Value::Bool(true);
    let text = rig.send(stream).await;
    assert!(text.contains("[DONE]"), "{text}");
    rig.proxy.flush_observed().await;

    let route = rig.status_route().await;
    let h1 = &route["observed"]["1h"];
    assert_eq!(h1["requests"], 12, "{h1}");
    assert_eq!(h1["success_ratio"], 1.0);
    assert_eq!(h1["rate_limited_ratio"], 0.0);
    assert_eq!(h1["server_error_ratio"], 0.0);
    let refusals = h1["refusal_ratio"].as_f64().unwrap();
    assert!((refusals - 1.0 / 12.0).abs() < 1e-6, "{h1}");
    // 6 valid + 2 broken + 1 schema violation + 1 schema match + the valid stream.
    let s = &h1["structured"];
    assert_eq!(
        (s["checked"].as_u64(), s["valid"].as_u64()),
        (Some(11), Some(8))
    );
    let errors: Vec<&str> = s["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        errors.iter().any(|e| e.starts_with("content is not JSON")),
        "{errors:?}"
    );
    assert!(
        errors.contains(&"content does not match the schema at /age (keyword type)"),
        "{errors:?}"
    );
    assert!(
        !errors
            .iter()
            .any(|e| e.contains("tru") || e.contains("three")),
        "no answer text in the evidence: {errors:?}"
    );
    // TPOT: 11 tokens 20 ms apart → (last − first) / 10 = 20 ms.
    let tpot = h1["tpot_ms"]["p50"].as_f64().unwrap();
    assert!((tpot - 20.0).abs() / 20.0 <= 0.10, "tpot {tpot} ms");
    assert!(h1["ttft_ms"]["p50"].as_f64().unwrap() > 0.0);
    // Every answer with usage: 12 + 2 × 3 = 18 (the stream: 12 + 2 × 11 = 34; the
    // refusal reported none): (10 × 18 + 34) / 11.
    let cost = h1["cost_per_success"].as_f64().unwrap();
    assert!(
        (cost - (10.0 * 18.0 + 34.0) / 11.0).abs() < 1e-6,
        "cost {cost}"
    );
    // The currency is the monitor's price of the route; this monitor's config names none.
    assert_eq!(route["observed"]["currency"], Value::Null);
    assert_eq!(route["observed"]["24h"]["requests"], 12);

    let served = rig.h.serve().await;
    let metrics = rig
        .http
        .get(served.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("probeok_route_observed_validity_ratio{"))
        .expect("validity gauge");
    let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((value - 8.0 / 11.0).abs() < 1e-5, "{line}");
    let page = rig
        .http
        .get(served.url(&format!("/routes/{ROUTE}?lang=en")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Real traffic"), "route page has the table");
    assert!(page.contains("72.7% (8/11)"), "validity on the page");
}

#[tokio::test]
async fn a_sustained_validity_drop_becomes_a_behavior_changed_finding() {
    let rig = rig("2026-03-04T06:00:30Z").await;
    // The route's own past: three hours of valid structured answers.
    for hour in ["06", "07", "08"] {
        rig.h.clock.set(at(&format!("2026-03-04T{hour}:10:00Z")));
        for _ in 0..20 {
            rig.send(json_object("valid")).await;
        }
        rig.proxy.flush_observed().await;
    }
    let opts = TrafficOptions::default();
    // The first window after the change: half the answers are cut JSON.
    rig.h.clock.set(at("2026-03-04T12:15:00Z"));
    for i in 0..24 {
        rig.send(json_object(if i % 2 == 0 { "valid" } else { "broken" }))
            .await;
    }
    rig.proxy.flush_observed().await;
    let one = traffic::load(&rig.h.store, at("2026-03-04T12:25:30Z"), &opts).unwrap();
    assert!(one.is_empty(), "one window is not enough: {one:?}");
    // The second window: the drop holds.
    rig.h.clock.set(at("2026-03-04T12:30:00Z"));
    for i in 0..24 {
        rig.send(json_object(if i % 2 == 0 { "valid" } else { "broken" }))
            .await;
    }
    rig.proxy.flush_observed().await;
    let now = at("2026-03-04T12:40:30Z");
    let found = traffic::load(&rig.h.store, now, &opts).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let f = &found[0];
    assert_eq!(f.kind, DriftKind::ValidityDrop);
    assert_eq!(f.route.as_str(), ROUTE);
    assert_eq!(
        (f.evidence.before.passed, f.evidence.before.total),
        (60, 60)
    );
    assert_eq!((f.evidence.after.passed, f.evidence.after.total), (24, 48));
    assert!(f.evidence.p_value.unwrap() < opts.alpha);
    assert_eq!(f.evidence.runs.len(), 2);

    // Where drift findings show: `/api/v1/drift` and the route's `behavior_changed`.
    let mut h = rig.h;
    let snapshot = DriftSnapshot::empty(now).with_traffic(&found);
    let (_dtx, drx) = watch::channel(Arc::new(snapshot));
    h.state.drift = Some(drx);
    h.clock.set(now);
    let served = h.serve().await;
    let http = reqwest::Client::new();
    let drift: Value = http
        .get(served.url("/api/v1/drift"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = drift.to_string();
    assert!(text.contains("validity_drop"), "{text}");
    assert!(text.contains("content is not JSON"), "{text}");
    assert!(!text.contains("tru\\\""), "no answer text: {text}");
    let status: Value = http
        .get(served.url("/api/v1/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let route = &status["routes"][0];
    assert_eq!(route["behavior_changed"], true, "{route}");
    assert_eq!(route["failure_mode"], "behavior_changed");
    let v = route["observed"]["1h"]["structured"]["validity_ratio"]
        .as_f64()
        .unwrap();
    assert!((v - 0.5).abs() < 1e-9, "{v}");
}

fn python() -> PathBuf {
    let venv = std::env::var_os("PROBEOK_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv"));
    venv.join("bin").join("python")
}

#[tokio::test]
async fn the_openai_sdks_structured_requests_are_judged() {
    let py = python();
    assert!(
        py.exists(),
        "{} is missing: run scripts/test (it creates the venv and installs openai), or set PROBEOK_VENV",
        py.display()
    );
    let rig = rig("2026-03-04T10:00:30Z").await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/openai_structured.py");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&py)
            .arg(&script)
            .arg(format!("{}/v1", rig.base))
            .arg("chat")
            .arg("10")
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .output(),
    )
    .await
    .expect("the SDK script finishes")
    .expect("python runs");
    assert!(
        out.status.success(),
        "sdk script failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON from the script");
    assert_eq!(v["plain"].as_array().unwrap().len(), 10);
    assert_eq!(
        v["plain"][1], "{\"ok\": tru",
        "the client got the answer as it was"
    );
    assert_eq!(v["stream"], "{\"a\": 1, \"b\": 2, \"c\":3}");
    rig.proxy.flush_observed().await;
    let route = rig.status_route().await;
    let s = &route["observed"]["1h"]["structured"];
    // 5 valid + 5 cut non-streamed answers, and the valid stream.
    assert_eq!(
        (s["checked"].as_u64(), s["valid"].as_u64()),
        (Some(11), Some(6)),
        "{s}"
    );
    let tpot = route["observed"]["1h"]["tpot_ms"]["p50"].as_f64().unwrap();
    assert!((tpot - 20.0).abs() / 20.0 <= 0.10, "tpot {tpot} ms");
}

on_both_engines! {
#[tokio::test]
async fn observed_rows_are_per_source_replaced_summed_and_pruned(db: &TestDb) {
    use probeok::store::{ObservedBucket, ObservedRow, Span};
    let store = db.open(probeok::store::StoreOptions::default());
    let now = at("2026-03-04T10:00:30Z");
    let minute = Span::Minute.start(now);
    let row = |source: &str, requests: u64, valid: u64, error: &str| {
        let mut bucket = ObservedBucket {
            requests,
            ok: requests,
            checked: requests,
            valid,
            cost_sum: 1.5,
            cost_n: 1,
            ..ObservedBucket::default()
        };
        bucket.ttft.record(250.0);
        bucket.tpot.record(200.0);
        bucket.note_error(error);
        ObservedRow {
            span: Span::Minute,
            bucket_ms: minute,
            route: ROUTE.into(),
            source: source.into(),
            bucket,
        }
    };
    let w = store.writer();
    w.record_observed(vec![row("a", 1, 1, "e1")], now).await.unwrap();
    // The same source rewrites its row whole; another source adds its own.
    w.record_observed(vec![row("a", 4, 3, "e1"), row("b", 2, 1, "e2")], now)
        .await
        .unwrap();
    // A row older than the minutes' retention is pruned by the next write.
    let mut old = row("a", 9, 9, "old");
    old.bucket_ms = Span::Minute.start(now - chrono::Duration::days(3));
    w.record_observed(vec![old], now - chrono::Duration::days(3)).await.unwrap();
    w.record_observed(vec![row("b", 2, 1, "e2")], now).await.unwrap();
    let reader = store.reader().unwrap();
    let all = reader
        .observed(Span::Minute, minute - 10 * 86_400_000, minute + 60_000)
        .unwrap();
    let b = &all[ROUTE];
    assert_eq!((b.requests, b.checked, b.valid), (6, 6, 4));
    assert_eq!(b.cost_n, 2);
    assert_eq!(b.ttft.count(), 2);
    assert_eq!(b.errors, ["e1", "e2"]);
    let buckets = reader
        .observed_buckets(Span::Minute, minute - 10 * 86_400_000, minute + 60_000)
        .unwrap();
    assert_eq!(buckets[ROUTE].len(), 1, "the 3-day-old minute is gone");
    store.close().await.unwrap();
}
}
