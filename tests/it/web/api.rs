//! The JSON API over real sockets: status figures against scripted outcomes in a real store
//! and a hand-built health snapshot; probes (ids with slashes, raw and percent-encoded);
//! incidents; ingest auth, bounds, validation and delivery; metrics; the OpenAPI document.

use crate::common;

use std::time::Duration;

use chrono::Duration as D;
use common::app::*;
use probeok::health::{BaselineSnapshot, FailureMode, IncidentSummary, State};
use probeok::probe::OutcomeKind;
use reqwest::StatusCode;
use serde_json::{json, Value};

const QWEN: &str = "qwen/cn-beijing/qwen-max";
const DS: &str = "deepseek/cn/deepseek-ai/DeepSeek-V3";
const LOCAL: &str = "local/lab/small";

const ROUTES: &[Spec<'static>] = &[
    Spec::new("qwen", "cn-beijing", "qwen-max")
        .serves("chat-main")
        .weight(80),
    Spec::new("deepseek", "cn", "deepseek-ai/DeepSeek-V3")
        .serves("chat-main")
        .backup()
        .weight(20),
    Spec::new("local", "lab", "small").serves("chat-lite"),
];

fn now() -> chrono::DateTime<chrono::Utc> {
    at("2026-03-04T12:00:00Z")
}

/// The scripted history of QWEN (see the expectations in the status test).
fn history() -> Vec<probeok::probe::ProbeOutcome> {
    let now = now();
    let mut v = Vec::new();
    // Last hour: 10 successful probes of 100..1000 ms (TTFB a quarter), 2 failed probes.
    for i in 1..=10 {
        v.push(outcome(
            QWEN,
            OutcomeKind::Probe,
            now - D::minutes(50) + D::minutes(i),
            true,
            100.0 * i as f64,
        ));
    }
    for i in 0..2 {
        v.push(outcome(
            QWEN,
            OutcomeKind::Probe,
            now - D::minutes(30) + D::seconds(i),
            false,
            5000.0,
        ));
    }
    // Throughput probes at 20, 30, 40 tokens/s; passive at 50 tokens/s, and a passive failure
    // that must not count against uptime.
    for (i, tps) in [20.0, 30.0, 40.0].into_iter().enumerate() {
        let mut o = outcome(
            QWEN,
            OutcomeKind::Throughput,
            now - D::minutes(40) + D::minutes(i as i64),
            true,
            3000.0,
        );
        o.tokens_per_second = Some(tps);
        v.push(o);
    }
    let mut p = outcome(
        QWEN,
        OutcomeKind::Passive,
        now - D::minutes(20),
        true,
        8000.0,
    );
    p.tokens_per_second = Some(50.0);
    v.push(p);
    v.push(outcome(
        QWEN,
        OutcomeKind::Passive,
        now - D::minutes(19),
        false,
        100.0,
    ));
    // Three days ago: 4 successes, 4 failures.
    for i in 0..8 {
        v.push(outcome(
            QWEN,
            OutcomeKind::Probe,
            now - D::days(3) + D::minutes(i),
            i % 2 == 0,
            400.0,
        ));
    }
    // Twenty days ago: 10 successes, one of them slower than the 10 s SLO threshold.
    for i in 0..10 {
        let ms = if i == 0 { 12_000.0 } else { 400.0 };
        v.push(outcome(
            QWEN,
            OutcomeKind::Probe,
            now - D::days(20) + D::minutes(i),
            true,
            ms,
        ));
    }
    // The backup: three probes in the last hour.
    for i in 0..3 {
        v.push(outcome(
            DS,
            OutcomeKind::Probe,
            now - D::minutes(10) + D::minutes(i),
            i != 1,
            900.0,
        ));
    }
    v
}

fn baseline() -> BaselineSnapshot {
    BaselineSnapshot {
        bucket: "11:00".into(),
        samples: 80,
        mean_ms: 512.34,
        stddev_ms: 40.06,
        p50_ms: 500.0,
        p95_ms: 590.0,
        p99_ms: 640.0,
        ttft_samples: 0,
        ttft_mean_ms: None,
        ttft_p50_ms: None,
        ttft_p95_ms: None,
        ttft_p99_ms: None,
        tps_samples: 0,
        tps_mean: None,
    }
}

fn health(ds_state: State, local_state: State) -> probeok::health::HealthSnapshot {
    let since = now() - D::hours(2);
    let mut q = normal(QWEN, since);
    q.baseline = Some(baseline());
    let mut ds = with_state(normal(DS, since), ds_state, "error_rate_high");
    if ds_state.is_incident() {
        ds.failure_mode = Some(FailureMode::Unavailable);
        ds.incident = Some(IncidentSummary {
            id: format!("{DS}@2026-03-04T10:00:00Z"),
            opened_at: since,
            peak: ds_state,
            failure_mode: Some(FailureMode::Unavailable),
        });
    }
    let local = if local_state == State::Normal {
        normal(LOCAL, since)
    } else {
        with_state(normal(LOCAL, since), local_state, "probe_failed")
    };
    snapshot(now(), vec![q, ds, local])
}

async fn get(url: &str) -> (StatusCode, Value) {
    let r = reqwest::get(url).await.unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn close(a: &Value, b: f64) -> bool {
    (a.as_f64().unwrap() - b).abs() < 1e-6
}

#[tokio::test]
async fn status_reports_state_latency_uptime_and_slo_from_the_store() {
    let h = Harness::new(ROUTES, now()).await;
    h.record(history()).await;
    h.publish(health(State::Critical, State::Normal));
    let s = h.serve().await;

    let (code, v) = get(&s.url("/api/v1/status")).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["generated_at"], "2026-03-04T12:00:00.000Z");
    // A CRITICAL route (the backup) makes it degraded; chat-main still has its primary.
    assert_eq!(v["overall"], "degraded");
    let routes = v["routes"].as_array().unwrap();
    assert_eq!(routes.len(), 3);
    let q = &routes[0];
    assert_eq!(q["id"], QWEN);
    assert_eq!(q["provider"], "qwen");
    assert_eq!(q["region"], "cn-beijing");
    assert_eq!(q["model"], "qwen-max");
    assert_eq!(q["serves"], "chat-main");
    assert_eq!(q["tier"], "primary");
    assert_eq!(q["state"], "NORMAL");
    assert_eq!(q["since"], "2026-03-04T10:00:00.000Z");
    assert_eq!(q["reason"], Value::Null);
    assert_eq!(
        q["baseline"],
        json!({"bucket": "11:00", "samples": 80, "mean_ms": 512.3, "stddev_ms": 40.1, "p95_ms": 590.0})
    );
    // Latency: histogram estimates of 100..1000 ms (within one bucket, ~±19%).
    let p50 = q["latency_ms"]["p50"].as_f64().unwrap();
    let p99 = q["latency_ms"]["p99"].as_f64().unwrap();
    assert!((400.0..=600.0).contains(&p50), "p50 {p50}");
    assert!((800.0..=1200.0).contains(&p99), "p99 {p99}");
    // TTFB: exact nearest-rank over probes only (25..250 ms).
    assert_eq!(
        q["ttfb_ms"],
        json!({"p50": 125.0, "p95": 250.0, "p99": 250.0})
    );
    // Tokens/s: throughput (20, 30, 40) and passive (50).
    assert_eq!(
        q["tokens_per_second"],
        json!({"p50": 30.0, "p95": 50.0, "p99": 50.0})
    );
    // Uptime over synthetic outcomes: 24h 13/15, 7d 17/23, 30d 27/33.
    assert!(
        close(&q["uptime"]["24h"], (13.0f64 / 15.0 * 1e6).round() / 1e6),
        "{}",
        q["uptime"]
    );
    assert!(close(
        &q["uptime"]["7d"],
        (17.0f64 / 23.0 * 1e6).round() / 1e6
    ));
    assert!(close(
        &q["uptime"]["30d"],
        (27.0f64 / 33.0 * 1e6).round() / 1e6
    ));
    // SLO: the budget is time over probe outcomes only. 7 bad probes (failed, or the 12 s
    // success over the latency threshold) × the 30 s interval = 210 s of bad time against
    // (1 − 0.999) × 30 days = 2,592 s.
    assert_eq!(q["slo"]["target"], 0.999);
    assert_eq!(q["slo"]["bad_seconds"], 210.0, "{}", q["slo"]);
    assert_eq!(q["slo"]["budget_seconds"], 2592.0, "{}", q["slo"]);
    let expected = ((1.0 - 210.0 / 2592.0) * 1e4f64).round() / 1e4;
    assert!(
        close(&q["slo"]["error_budget_remaining"], expected),
        "{}",
        q["slo"]
    );
    // Probe cost of the default probe settings (hand computation in `probe::cost`); no price.
    assert_eq!(
        q["probe_cost"],
        json!({"tokens_per_month": 4_224_096, "cost_per_month": null, "currency": null})
    );

    let d = &routes[1];
    assert_eq!(d["id"], DS);
    assert_eq!(d["tier"], "backup");
    assert_eq!(d["state"], "CRITICAL");
    assert_eq!(d["reason"]["code"], "error_rate_high");
    assert!(d["reason"]["text"].is_string());
    assert_eq!(d["failure_mode"], "unavailable");
    assert!(close(
        &d["uptime"]["24h"],
        (2.0f64 / 3.0 * 1e6).round() / 1e6
    ));
    assert_eq!(d["incident"]["peak"], "CRITICAL");

    let l = &routes[2];
    assert_eq!(
        l["latency_ms"],
        json!({"p50": null, "p95": null, "p99": null})
    );
    assert_eq!(l["uptime"], json!({"24h": null, "7d": null, "30d": null}));
    assert_eq!(l["slo"]["error_budget_remaining"], Value::Null);
    assert_eq!(l["slo"]["bad_seconds"], 0.0, "no history is no bad time");
    assert_eq!(l["slo"]["budget_seconds"], 2592.0);
    assert_eq!(l["baseline"], Value::Null);
}

#[tokio::test]
async fn overall_follows_the_spec_rules() {
    let h = Harness::new(ROUTES, now()).await;
    let s = h.serve().await;
    let overall = |h: &Harness, ds, local| {
        h.publish(health(ds, local));
        let url = s.url("/api/v1/status");
        async move { get(&url).await.1["overall"].clone() }
    };
    assert_eq!(
        overall(&h, State::Normal, State::Normal).await,
        "operational"
    );
    // A WARNING is not yet degraded.
    assert_eq!(
        overall(&h, State::Warning, State::Normal).await,
        "operational"
    );
    assert_eq!(
        overall(&h, State::Degraded, State::Normal).await,
        "degraded"
    );
    // chat-lite has nothing usable.
    assert_eq!(overall(&h, State::Normal, State::Critical).await, "outage");
    // chat-main served off its primary (success ratio 0 → not usable): degraded even though
    // no route is DEGRADED.
    let mut snap = health(State::Normal, State::Normal);
    snap.routes[0].success_ratio = Some(0.0);
    h.publish(snap);
    assert_eq!(get(&s.url("/api/v1/status")).await.1["overall"], "degraded");
}

/// A store more than a minute behind the probes: `/readyz` says so (503) and
/// `probeok_store_lag_seconds` shows by how much; once the batch commits, ready again.
#[tokio::test]
async fn store_lag_fails_readiness_past_a_minute() {
    let h = Harness::new(ROUTES, now()).await;
    let lag = std::sync::Arc::new(probeok::lag::StoreLag::default());
    h.state.metrics.attach_store_lag(lag.clone());
    let s = h.serve().await;
    let (code, _) = get(&s.url("/readyz")).await;
    assert_eq!(code, StatusCode::OK);
    // `/readyz` reuses its answer for a second of the service's clock.
    lag.begin(now() - D::seconds(75));
    h.clock.advance(std::time::Duration::from_secs(2));
    let (code, v) = get(&s.url("/readyz")).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    let problems = v["problems"].to_string();
    assert!(problems.contains("store behind the probes"), "{v}");
    let text = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("probeok_store_lag_seconds 77.0"), "{text}");
    lag.done();
    h.clock.advance(std::time::Duration::from_secs(2));
    let (code, _) = get(&s.url("/readyz")).await;
    assert_eq!(code, StatusCode::OK);
}

/// `?serves=`, `?provider=`, `?state=` keep the matching routes (all filters together);
/// `overall` still judges every route; a bad filter is 400 `bad_query`.
#[tokio::test]
async fn status_filters_by_model_provider_and_state() {
    let h = Harness::new(ROUTES, now()).await;
    let s = h.serve().await;
    h.publish(health(State::Degraded, State::Normal));
    let ids = |v: &Value| -> Vec<String> {
        v["routes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (code, v) = get(&s.url("/api/v1/status?serves=chat-main")).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(ids(&v), [QWEN, DS]);
    let (_, v) = get(&s.url("/api/v1/status?provider=local,qwen")).await;
    assert_eq!(ids(&v), [QWEN, LOCAL]);
    let (_, v) = get(&s.url("/api/v1/status?state=degraded,CRITICAL")).await;
    assert_eq!(ids(&v), [DS]);
    assert_eq!(v["overall"], "degraded", "overall judges every route");
    let (_, v) = get(&s.url("/api/v1/status?serves=chat-main&state=NORMAL")).await;
    assert_eq!(ids(&v), [QWEN]);
    let (_, v) = get(&s.url("/api/v1/status?provider=nobody")).await;
    assert!(ids(&v).is_empty());
    for bad in ["state=BROKEN", "serves=", "provider=,,"] {
        let (code, v) = get(&s.url(&format!("/api/v1/status?{bad}"))).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(v["error"]["code"], "bad_query", "{bad}");
    }
    let many = vec!["m"; 101].join(",");
    let (code, _) = get(&s.url(&format!("/api/v1/status?serves={many}"))).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn probes_lists_newest_first_with_slashes_raw_or_encoded_and_404s_unknown_routes() {
    let h = Harness::new(ROUTES, now()).await;
    h.record(history()).await;
    let s = h.serve().await;

    let (code, v) = get(&s.url(&format!("/api/v1/routes/{DS}/probes?limit=2"))).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["route"], DS);
    let probes = v["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 2);
    assert_eq!(probes[0]["started_at"], "2026-03-04T11:52:00.000Z");
    assert_eq!(probes[0]["success"], true);
    assert_eq!(probes[1]["success"], false);
    assert_eq!(probes[1]["error"]["kind"], "http");
    assert_eq!(probes[1]["error"]["status"], 503);

    let encoded = DS.replace('/', "%2F");
    let (code, v2) = get(&s.url(&format!("/api/v1/routes/{encoded}/probes?limit=2"))).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(v2, v);

    // Default limit 50; passive outcomes are never listed.
    let (_, v) = get(&s.url(&format!("/api/v1/routes/{QWEN}/probes"))).await;
    let probes = v["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 33);
    assert!(probes.iter().all(|p| p["kind"] != "passive"));
    // Bounded: a huge limit is cut to 1000, not refused.
    let (code, _) = get(&s.url(&format!("/api/v1/routes/{QWEN}/probes?limit=999999"))).await;
    assert_eq!(code, StatusCode::OK);

    let (code, v) = get(&s.url("/api/v1/routes/nope/x/y/probes")).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["code"], "not_found");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown route"));
    let (code, v) = get(&s.url(&format!("/api/v1/routes/{QWEN}/probes?limit=many"))).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["code"], "bad_query");
    let (code, _) = get(&s.url(&format!("/api/v1/routes/{QWEN}/other"))).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn incidents_lists_the_open_incidents_of_the_snapshot() {
    let h = Harness::new(ROUTES, now()).await;
    h.publish(health(State::Critical, State::Normal));
    let s = h.serve().await;
    let (code, v) = get(&s.url("/api/v1/incidents")).await;
    assert_eq!(code, StatusCode::OK);
    let list = v["incidents"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["route"], DS);
    assert_eq!(list[0]["peak"], "CRITICAL");
    assert_eq!(list[0]["closed_at"], Value::Null);
    assert_eq!(list[0]["failure_mode"], "unavailable");
}

fn item(route: &str) -> Value {
    json!({
        "route": route, "started_at": "2026-03-04T11:59:00Z", "success": true, "kind": "probe",
        "total_ms": 2300.0, "ttfb_ms": 180.0, "output_tokens": 120, "tokens_per_second": 61.5,
        "http_status": 200
    })
}

async fn ingest(
    url: &str,
    token: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> (StatusCode, Value) {
    let mut req = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let code = r.status();
    (code, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn ingest_requires_the_token_and_is_off_without_one() {
    let h = Harness::new(ROUTES, now()).await;
    let s = h.serve().await;
    let url = s.url("/api/v1/ingest");
    let body = json!([item(QWEN)]).to_string();
    let (code, v) = ingest(&url, None, body.clone()).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert_eq!(v["error"]["code"], "unauthorized");
    let (code, _) = ingest(&url, Some("test-ingest-tokeN"), body.clone()).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let (code, _) = ingest(&url, Some("test-ingest-token-longer"), body.clone()).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let (code, v) = ingest(&url, Some("test-ingest-token"), body.clone()).await;
    assert_eq!(code, StatusCode::OK, "{v}");

    let off = Harness::with(
        ROUTES,
        now(),
        HarnessOptions {
            ingest_token: None,
            ..Default::default()
        },
    )
    .await;
    let s = off.serve().await;
    let (code, v) = ingest(&s.url("/api/v1/ingest"), Some("anything"), body).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["code"], "ingest_disabled");
}

#[tokio::test]
async fn ingest_bounds_body_size_and_item_count() {
    let h = Harness::new(ROUTES, now()).await;
    let s = h.serve().await;
    let url = s.url("/api/v1/ingest");
    let token = Some("test-ingest-token");
    // Over 1 MiB (declared length).
    let big = format!("[{}]", vec![item(QWEN).to_string(); 6000].join(","));
    assert!(big.len() > 1024 * 1024);
    let (code, v) = ingest(&url, token, big.clone()).await;
    assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(v["error"]["code"], "payload_too_large");
    // Over 1 MiB, chunked (no declared length).
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .into_bytes()
        .chunks(64 * 1024)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let (code, _) = ingest(
        &url,
        token,
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)),
    )
    .await;
    assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE);
    // Too many (small) items.
    let many = serde_json::to_string(&vec![json!({}); 1001]).unwrap();
    let (code, v) = ingest(&url, token, many).await;
    assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(v["error"]["code"], "too_many_items");
    // Not an array.
    let (code, v) = ingest(&url, token, "{\"route\":1}").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["code"], "bad_json");
}

#[tokio::test]
async fn ingest_validates_each_item_and_delivers_the_accepted_ones_as_passive() {
    let mut h = Harness::new(ROUTES, now()).await;
    let s = h.serve().await;
    let mut negative = item(QWEN);
    negative["total_ms"] = json!(-1.0);
    let mut future = item(QWEN);
    future["started_at"] = json!("2026-03-04T13:00:00Z");
    let mut failed = item(DS);
    failed["success"] = json!(false);
    failed["http_status"] = json!(429);
    let mut bad_kind = item(QWEN);
    bad_kind["success"] = json!(false);
    bad_kind["error"] = json!({"kind": "gremlins"});
    let body = json!([
        item(QWEN),
        item("nope/x/y"),
        negative,
        {"route": QWEN},
        future,
        failed,
        bad_kind,
    ]);
    let (code, v) = ingest(
        &s.url("/api/v1/ingest"),
        Some("test-ingest-token"),
        body.to_string(),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["accepted"], 2);
    let rejected = v["rejected"].as_array().unwrap();
    let indexes: Vec<u64> = rejected
        .iter()
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, vec![1, 2, 3, 4, 6]);
    assert!(rejected[0]["error"]
        .as_str()
        .unwrap()
        .contains("unknown route"));

    let a = h.passive_rx.recv().await.unwrap();
    assert_eq!(a.route.as_str(), QWEN);
    assert_eq!(a.kind, OutcomeKind::Passive, "kind is forced to passive");
    assert_eq!(a.tokens_per_second, Some(61.5));
    assert_eq!(a.verified, None);
    let b = h.passive_rx.recv().await.unwrap();
    assert_eq!(b.route.as_str(), DS);
    assert!(!b.success);
    assert_eq!(b.error.as_ref().unwrap().kind(), "rate_limited");
    assert!(h.passive_rx.try_recv().is_err());

    // Rejections are counted in the metrics.
    let text = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("probeok_ingest_items_total{result=\"rejected\"} 5"),
        "{text}"
    );
    assert!(text.contains("probeok_ingest_items_total{result=\"accepted\"} 2"));
}

#[tokio::test]
async fn ingest_holds_rate_limit_figures_to_the_header_rules() {
    let mut h = Harness::new(ROUTES, now()).await;
    let s = h.serve().await;
    let mut clamped = item(QWEN);
    clamped["ratelimit"] = json!({"requests": {"remaining": 900, "limit": 500},
        "tokens": {"remaining": 3, "limit": 0}, "input_tokens": {"remaining": 40, "limit": 400}});
    let mut negative = item(QWEN);
    negative["ratelimit"] = json!({"requests": {"remaining": -1, "limit": 500}});
    let mut text = item(QWEN);
    text["ratelimit"] = json!({"requests": {"remaining": "many", "limit": 500}});
    let mut nothing = item(DS);
    nothing["ratelimit"] = json!({"tokens": {"remaining": 0, "limit": 0}});
    let body = json!([clamped, negative, text, nothing]);
    let (code, v) = ingest(
        &s.url("/api/v1/ingest"),
        Some("test-ingest-token"),
        body.to_string(),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["accepted"], 2, "{v}");
    let indexes: Vec<u64> = (v["rejected"].as_array().unwrap().iter())
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, vec![1, 2], "not counts: {v}");
    let a = h.passive_rx.recv().await.unwrap();
    let limits = a.ratelimit.unwrap();
    assert_eq!(limits.requests, probeok::ratelimit::Quota::new(500, 500));
    assert_eq!(limits.tokens, None);
    assert_eq!(limits.input_tokens.unwrap().ratio(), 0.1);
    let b = h.passive_rx.recv().await.unwrap();
    assert_eq!(b.ratelimit, None, "nothing left of it");
}

#[tokio::test]
async fn ingest_waits_for_room_in_the_passive_queue() {
    let mut h = Harness::with(
        ROUTES,
        now(),
        HarnessOptions {
            passive_capacity: 1,
            ..Default::default()
        },
    )
    .await;
    let s = h.serve().await;
    let body = json!([item(QWEN), item(QWEN), item(QWEN)]).to_string();
    let url = s.url("/api/v1/ingest");
    let req = tokio::spawn(async move { ingest(&url, Some("test-ingest-token"), body).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !req.is_finished(),
        "the request waits while the queue is full"
    );
    for _ in 0..3 {
        h.passive_rx.recv().await.unwrap();
    }
    let (code, v) = req.await.unwrap();
    assert_eq!(code, StatusCode::OK);
    assert_eq!(v["accepted"], 3);
}

#[tokio::test]
async fn metrics_are_openmetrics_with_config_bounded_labels() {
    let h = Harness::new(ROUTES, now()).await;
    h.publish(health(State::Critical, State::Normal));
    let mut ok = outcome(QWEN, OutcomeKind::Probe, now(), true, 800.0);
    ok.tokens_per_second = Some(42.0);
    h.state.metrics.observe_outcome(&ok);
    h.state
        .metrics
        .observe_outcome(&outcome(DS, OutcomeKind::Probe, now(), false, 100.0));
    // Unconfigured routes never create series.
    h.state
        .metrics
        .observe_outcome(&outcome("evil/x/y", OutcomeKind::Probe, now(), true, 1.0));
    let s = h.serve().await;
    // The weights publisher follows the published health on its own task: poll until the
    // weights it derives are served, within a deadline.
    let qwen_weight = r#"probeok_route_weight{serves="chat-main",provider="qwen",region="cn-beijing",model="qwen-max"} 100"#;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let r = reqwest::get(s.url("/metrics")).await.unwrap();
        assert_eq!(
            r.headers()["content-type"],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        let text = r.text().await.unwrap();
        if text.contains(qwen_weight) || tokio::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(text.ends_with("# EOF\n"), "{text}");
    let has = |needle: &str| assert!(text.contains(needle), "missing {needle} in\n{text}");
    has(
        r#"probeok_probe_success{provider="qwen",region="cn-beijing",model="qwen-max",vantage="local"} 1"#,
    );
    has(
        r#"probeok_probe_success{provider="deepseek",region="cn",model="deepseek-ai/DeepSeek-V3",vantage="local"} 0"#,
    );
    has(
        r#"probeok_probes_total{provider="deepseek",region="cn",model="deepseek-ai/DeepSeek-V3",vantage="local",result="http"} 1"#,
    );
    // Per route the count and sum; the buckets per provider.
    has(
        r#"probeok_probe_duration_seconds_count{provider="qwen",region="cn-beijing",model="qwen-max",vantage="local"} 1"#,
    );
    has(
        r#"probeok_provider_probe_duration_seconds_bucket{le="1.0",provider="qwen",vantage="local"} 1"#,
    );
    has(r#"probeok_probe_ttfb_seconds_count{provider="qwen",vantage="local"} 1"#);
    assert!(
        !text.contains(r#"probeok_probe_duration_seconds_bucket{le="1.0""#),
        "no per-route buckets"
    );
    has(
        r#"probeok_probe_output_tokens_per_second{provider="qwen",region="cn-beijing",model="qwen-max",vantage="local"} 42.0"#,
    );
    has(
        r#"probeok_route_state{provider="deepseek",region="cn",model="deepseek-ai/DeepSeek-V3"} 4"#,
    );
    has(r#"probeok_route_state{provider="qwen",region="cn-beijing",model="qwen-max"} 1"#);
    has(qwen_weight);
    has(
        r#"probeok_route_weight{serves="chat-lite",provider="local",region="lab",model="small"} 100"#,
    );
    has(r#"probeok_build_info{version="0.1.0"} 1"#);
    assert!(!text.contains("evil"));
}

/// Every `$ref` in `v` points at an existing component schema.
fn refs_resolve(doc: &Value, v: &Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                let name = r
                    .strip_prefix("#/components/schemas/")
                    .expect("local schema ref");
                assert!(
                    doc["components"]["schemas"].get(name).is_some(),
                    "dangling {r}"
                );
            }
            m.values().for_each(|x| refs_resolve(doc, x));
        }
        Value::Array(a) => a.iter().for_each(|x| refs_resolve(doc, x)),
        _ => {}
    }
}

#[tokio::test]
async fn openapi_parses_and_describes_every_endpoint() {
    let mut h = Harness::new(ROUTES, now()).await;
    // With a drift runner the router also serves the drift fragment.
    let (_drift_tx, drift_rx) =
        tokio::sync::watch::channel(std::sync::Arc::new(drift_snapshot(Vec::new(), &[])));
    h.state.drift = Some(drift_rx);
    let s = h.serve().await;
    let (code, doc) = get(&s.url("/api/openapi.json")).await;
    assert_eq!(code, StatusCode::OK);
    let parsed: openapiv3::OpenAPI = serde_json::from_value(doc.clone()).expect("valid OpenAPI 3");
    assert!(parsed.openapi.starts_with("3."));
    refs_resolve(&doc, &doc);
    let endpoints = probeok::web::endpoints();
    assert!(endpoints.len() >= 14);
    // The merged fragments are listed too, and admin endpoints name the bearer scheme.
    for path in [
        "/api/v1/drift",
        "/api/v1/admin/silences",
        "/api/v1/admin/silences/{id}",
    ] {
        assert!(
            endpoints.iter().any(|e| e.doc_path == path),
            "{path} not listed"
        );
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["adminToken"]["scheme"],
        "bearer"
    );
    assert_eq!(
        doc["paths"]["/api/v1/admin/silences"]["post"]["security"][0]["adminToken"],
        json!([])
    );
    for e in endpoints {
        let item = parsed
            .paths
            .paths
            .get(e.doc_path)
            .and_then(|p| p.as_item())
            .unwrap_or_else(|| panic!("{} is not described", e.doc_path));
        let op = match e.method.as_str() {
            "GET" => item.get.as_ref(),
            "POST" => item.post.as_ref(),
            "DELETE" => item.delete.as_ref(),
            m => panic!("unexpected method {m}"),
        };
        assert!(op.is_some(), "{} {} has no operation", e.method, e.doc_path);
        // And the router really serves it (no fallback 404 for the path itself).
        let path = if e.doc_path.starts_with("/api/v1/routes/") {
            e.doc_path.replace("{id}", QWEN)
        } else {
            e.doc_path.replace("{id}", "some-id")
        };
        let r = reqwest::Client::new()
            .request(e.method.clone(), s.url(&path))
            .send()
            .await
            .unwrap();
        if e.path.ends_with("/stream") {
            assert_eq!(r.status(), StatusCode::OK);
            continue;
        }
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_ne!(
            body["error"]["message"], "no such path",
            "{} {path}",
            e.method
        );
    }
}

/// Drives the pure detector through an outage of `route` and its recovery, storing every
/// transition with its incident and state the way the health service does.
async fn record_outage(
    store: &probeok::store::Store,
    route: &str,
    start: chrono::DateTime<chrono::Utc>,
) {
    use probeok::config::DetectionConfig;
    use probeok::health::{Baseline, Detector};
    let cfg = DetectionConfig::default();
    let det = Detector::new(&cfg);
    let r = id(route);
    let mut h = det.route(r.clone(), start);
    let mut b = Baseline::new(r.clone(), &cfg);
    let w = store.writer();
    let mut seen = 0;
    for s in (0..=1200).step_by(30) {
        let t = start + D::seconds(s);
        let o = outcome(route, OutcomeKind::Probe, t, s > 60, 1100.0);
        if let Some(tr) = det.ingest(&mut h, &mut b, &o, t) {
            let incident = tr.incident_id.as_deref().and_then(|iid| {
                h.incident()
                    .filter(|i| i.id == iid)
                    .or(h.last_closed().filter(|i| i.id == iid))
            });
            w.record_transition(&tr, incident, &h).await.unwrap();
            seen += 1;
        }
    }
    assert!(seen >= 3, "the outage made transitions");
}

#[tokio::test]
async fn incidents_come_from_the_store_with_transitions_and_evidence() {
    let mut h = Harness::new(ROUTES, now()).await;
    h.state.incidents = std::sync::Arc::new(probeok::web::StoreIncidents);
    record_outage(&h.store, QWEN, now() - D::hours(3)).await;
    record_outage(&h.store, LOCAL, now() - D::hours(1)).await;
    // The snapshot knows of no open incident: the list comes from the store.
    h.publish(health(State::Normal, State::Normal));
    let s = h.serve().await;

    let (code, v) = get(&s.url("/api/v1/incidents")).await;
    assert_eq!(code, StatusCode::OK, "{v}");
    let list = v["incidents"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{v}");
    // Newest first; closed, with every transition and its evidence.
    assert_eq!(list[0]["route"], LOCAL);
    assert_eq!(list[1]["route"], QWEN);
    let i = &list[1];
    assert_eq!(i["peak"], "DEGRADED");
    assert!(i["closed_at"].is_string(), "{i}");
    let ts = i["transitions"].as_array().unwrap();
    assert!(ts.len() >= 2, "{i}");
    assert_eq!(ts[0]["to"], "DEGRADED");
    assert!(ts[0]["reason"]["code"].is_string());
    assert!(ts[0]["evidence"]["error_rate"].is_object(), "{}", ts[0]);
    assert!(ts.iter().all(|t| t["incident_id"] == i["id"]));

    // Bounded and filtered.
    let (_, v) = get(&s.url("/api/v1/incidents?limit=1")).await;
    assert_eq!(v["incidents"].as_array().unwrap().len(), 1);
    assert_eq!(v["incidents"][0]["route"], LOCAL);
    let (_, v) = get(&s.url(&format!("/api/v1/incidents?route={QWEN}"))).await;
    let list = v["incidents"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["route"], QWEN);
    let since = probeok::web::rfc3339(now() - D::minutes(90));
    let (_, v) = get(&s.url(&format!("/api/v1/incidents?since={since}"))).await;
    let list = v["incidents"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{v}");
    assert_eq!(list[0]["route"], LOCAL);
    let (code, v) = get(&s.url("/api/v1/incidents?since=yesterday")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["code"], "bad_query");
    let (code, _) = get(&s.url("/api/v1/incidents?route=nope/x/y")).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn status_shows_behavior_changed_while_a_drift_finding_is_open() {
    let mut h = Harness::new(ROUTES, now()).await;
    let (drift_tx, drift_rx) =
        tokio::sync::watch::channel(std::sync::Arc::new(drift_snapshot(Vec::new(), &[])));
    h.state.drift = Some(drift_rx);
    h.publish(health(State::Critical, State::Normal));
    let s = h.serve().await;
    let route = |v: &Value, r: &str| {
        v["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["id"] == r)
            .unwrap()
            .clone()
    };
    let (_, v) = get(&s.url("/api/v1/status")).await;
    assert_eq!(route(&v, QWEN)["failure_mode"], Value::Null);

    drift_tx.send_replace(std::sync::Arc::new(drift_snapshot(
        vec![
            drift_finding(QWEN, probeok::drift::DriftKind::PassRateDrop),
            drift_finding(DS, probeok::drift::DriftKind::PassRateDrop),
            drift_finding(LOCAL, probeok::drift::DriftKind::ModelChanged),
        ],
        &[],
    )));
    let (code, v) = get(&s.url("/api/v1/status")).await;
    assert_eq!(code, StatusCode::OK);
    let q = route(&v, QWEN);
    assert_eq!(q["failure_mode"], "behavior_changed", "{q}");
    assert_eq!(q["behavior_changed"], true);
    assert_eq!(
        q["state"], "NORMAL",
        "drift does not change the judged state"
    );
    // Detection's own failure mode stays (an outage says more than drift).
    let d = route(&v, DS);
    assert_eq!(d["failure_mode"], "unavailable", "{d}");
    assert_eq!(d["behavior_changed"], true);
    // A model change alone is informational.
    assert_eq!(route(&v, LOCAL)["failure_mode"], Value::Null);

    drift_tx.send_replace(std::sync::Arc::new(drift_snapshot(Vec::new(), &[])));
    let (_, v) = get(&s.url("/api/v1/status")).await;
    assert_eq!(route(&v, QWEN)["failure_mode"], Value::Null);
}

#[tokio::test]
async fn metrics_export_the_alert_engines_counters() {
    let h = Harness::new(ROUTES, now()).await;
    let alerts = std::sync::Arc::new(probeok::alert::AlertMetrics::default());
    h.state.metrics.follow_alerts(alerts.clone());
    alerts.add("dingtalk-oncall", "delivered");
    alerts.add("dingtalk-oncall", "delivered");
    alerts.add("webhook-0", "failed");
    let s = h.serve().await;
    let scrape = || async {
        reqwest::get(s.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let text = scrape().await;
    assert!(text.contains("# TYPE probeok_alerts counter"), "{text}");
    assert!(
        text.contains(r#"probeok_alerts_total{channel="dingtalk-oncall",result="delivered"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"probeok_alerts_total{channel="webhook-0",result="failed"} 1"#),
        "{text}"
    );
    // Counts move between scrapes and never go back.
    alerts.add("dingtalk-oncall", "delivered");
    let text = scrape().await;
    assert!(
        text.contains(r#"probeok_alerts_total{channel="dingtalk-oncall",result="delivered"} 3"#),
        "{text}"
    );
    assert!(text.trim_end().ends_with("# EOF"));
}

#[tokio::test]
async fn a_fresh_monitor_exports_every_ingest_result_and_task_failure_counter_at_zero() {
    let h = Harness::new(ROUTES, now()).await;
    let s = h.serve().await;
    let text = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for result in ["accepted", "rejected"] {
        let line = format!(r#"probeok_ingest_items_total{{result="{result}"}} 0"#);
        assert!(text.contains(&line), "{line}");
    }
    for task in probeok::supervise::MONITOR_TASKS {
        let line = format!(r#"probeok_task_failures_total{{task="{task}"}} 0"#);
        assert!(text.contains(&line), "{line}");
    }
}

#[tokio::test]
async fn the_extra_cost_budget_shows_in_status_and_metrics() {
    let h = Harness::new(ROUTES, now()).await;
    let budget = probeok::extra_cost::ExtraCost::new(
        probeok::config::ExtraCostConfig {
            max_extra_cost_per_hour: 300.0,
            degrade_at: 0.8,
        },
        &h.state.routes,
        h.state.clock.clone(),
        None,
    );
    h.state.metrics.attach_budget(budget);
    let s = h.serve().await;
    let status: serde_json::Value = reqwest::get(s.url("/api/v1/status"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        status["budget"]["max_extra_cost_per_hour"], 300.0,
        "{status}"
    );
    assert_eq!(status["budget"]["used_ratio"], 0.0, "{status}");
    assert_eq!(status["budget"]["switching_allowed"], true, "{status}");
    let text = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"probeok_budget_extra_cost{kind="limit"} 300.0"#),
        "{text}"
    );
    assert!(text.contains("probeok_budget_used_ratio 0.0"), "{text}");
}

#[tokio::test]
async fn without_a_budget_status_has_no_budget_field() {
    let h = Harness::new(ROUTES, now()).await;
    let s = h.serve().await;
    let status: serde_json::Value = reqwest::get(s.url("/api/v1/status"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(status.get("budget").is_none(), "{status}");
}

/// Records `route` judged DEGRADED on shared cause `cause` (after one refused probe).
async fn record_cause(store: &probeok::store::Store, route: &str, cause: &str) {
    use probeok::config::DetectionConfig;
    use probeok::health::cause::{Class, Verdict};
    use probeok::health::{Baseline, Detector};
    let cfg = DetectionConfig::default();
    let det = Detector::new(&cfg);
    let start = now() - D::minutes(10);
    let mut h = det.route(id(route), start);
    let mut b = Baseline::new(id(route), &cfg);
    let w = store.writer();
    let o = outcome(route, OutcomeKind::Probe, start, false, 5.0);
    if let Some(t) = det.ingest(&mut h, &mut b, &o, start) {
        w.record_transition(&t, None, &h).await.unwrap();
    }
    let v = Verdict {
        id: cause.into(),
        class: Class::ConnectionRefused,
        host: "api.example.com".into(),
        routes: 2,
        confirmed_on: 2,
    };
    let t = det.judge_by_cause(&mut h, &v, start).expect("judged");
    assert_eq!(t.reason.code, "shared_cause");
    w.record_transition(&t, h.incident(), &h).await.unwrap();
}

#[tokio::test]
async fn a_shared_cause_shows_per_route_in_metrics_and_as_one_outage_in_incidents() {
    const CAUSE: &str = "acme/r0:connection_refused";
    let mut h = Harness::new(ROUTES, now()).await;
    h.state.incidents = std::sync::Arc::new(probeok::web::StoreIncidents);
    record_cause(&h.store, QWEN, CAUSE).await;
    record_cause(&h.store, LOCAL, CAUSE).await;
    record_outage(&h.store, DS, now() - D::hours(3)).await;
    let mut snap = health(State::Degraded, State::Degraded);
    for s in &mut snap.routes {
        if s.route.as_str() != DS {
            s.cause = Some(CAUSE.into());
        }
    }
    h.publish(snap);
    let s = h.serve().await;

    let (code, v) = get(&s.url("/api/v1/status")).await;
    assert_eq!(code, StatusCode::OK);
    for r in v["routes"].as_array().unwrap() {
        let want = if r["id"] == DS {
            Value::Null
        } else {
            json!(CAUSE)
        };
        assert_eq!(r["cause"], want, "{r}");
    }
    let metrics = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!("probeok_cause_routes{{cause=\"{CAUSE}\"}} 2")),
        "{metrics}"
    );

    let (_, v) = get(&s.url("/api/v1/incidents")).await;
    let causes = v["causes"].as_array().unwrap();
    assert_eq!(causes.len(), 1, "{v}");
    assert_eq!(causes[0]["cause"], CAUSE);
    assert_eq!(causes[0]["failure_mode"], "unavailable");
    assert!(causes[0]["closed_at"].is_null(), "still open");
    let mut routes: Vec<&str> = causes[0]["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    routes.sort();
    assert_eq!(routes, vec![LOCAL, QWEN]);
    let with_cause = v["incidents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["cause"] == CAUSE)
        .count();
    assert_eq!(with_cause, 2, "{v}");
}
