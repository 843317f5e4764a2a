//! Reasoning models against a fake OpenAI-compatible upstream (a real HTTP server on
//! loopback streaming `reasoning_content` deltas before `content`): the first answer token is
//! recorded apart from the first generated token, a `max_tokens` spent on reasoning is its own
//! reason (`max_tokens_exhausted`, not `answer_changed`), and both fields survive the store.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use common::{fake, frame, openai, Reply, Script, Server};
use probeok::clock::SystemClock;
use probeok::config::DetectionConfig;
use probeok::health::{Baseline, Detector, State};
use probeok::probe::{probe_json, OutcomeKind, ProbeClient, ProbeOutcome};
use probeok::route::{ProbeSettings, ProviderKind, Route, RouteId, Tier};
use probeok::store::{Store, StoreOptions, ALL_KINDS};

const MS: Duration = Duration::from_millis(1);

fn reasoning(text: &str) -> String {
    frame(
        None,
        &serde_json::json!({"id":"c1","object":"chat.completion.chunk","model":openai::MODEL,
            "choices":[{"index":0,"delta":{"reasoning_content":text},"finish_reason":null}]})
        .to_string(),
    )
}

/// A reasoning model: 6 reasoning deltas 40 ms apart, then the answer — unless the request's
/// `max_tokens` is below 32, when the budget runs out while reasoning (`finish_reason:
/// "length"`, no content at all).
async fn reasoning_fake() -> Server {
    let (server, _) = fake("/v1/chat/completions", |req| {
        let max_tokens = req.json()["max_tokens"].as_u64().unwrap_or(0);
        let thinking = (0..6).map(|i| reasoning(&format!("step {i} ")));
        let script = Script::new().every(40 * MS, thinking);
        let script = if max_tokens < 32 {
            script.send_all([openai::finish("length"), openai::usage(16), openai::done()])
        } else {
            script
                .after(40 * MS, openai::content("PROBE_OK"))
                .send_all([openai::finish("stop"), openai::usage(40), openai::done()])
        };
        Reply::now(script.sse())
    })
    .await;
    server
}

fn route(server: &Server, max_tokens: u32) -> Route {
    Route {
        id: RouteId::new("thinker", "local", "r1"),
        provider: "thinker".into(),
        region: "local".into(),
        model: "r1".into(),
        kind: ProviderKind::Openai,
        base_url: format!("{}/v1", server.base_url()),
        api_key_env: None,
        serves: "chat-main".into(),
        tier: Tier::Primary,
        weight: 100,
        price: None,
        capabilities: vec![],
        context_window: None,
        embedding: None,
        residency: None,
        slo: 0.999,
        probe: ProbeSettings {
            interval: Duration::from_secs(30),
            first_byte_timeout: Duration::from_secs(2),
            stall_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
            jitter: 0.0,
            stream: true,
            max_tokens,
            throughput_every: Duration::from_secs(300),
            throughput_prompt: "Count from 1 to 40.".into(),
            throughput_max_tokens: 128,
            system: "Reply with exactly: PROBE_OK".into(),
            user: "health check".into(),
            expect: "PROBE_OK".into(),
            confirm_after: None,
        },
    }
}

async fn probe(route: &Route) -> ProbeOutcome {
    let client = ProbeClient::new(std::slice::from_ref(route), Arc::new(SystemClock)).unwrap();
    client.probe(route, OutcomeKind::Probe).await
}

#[tokio::test]
async fn the_first_answer_token_comes_after_the_reasoning() {
    let server = reasoning_fake().await;
    let o = probe(&route(&server, 256)).await;
    assert!(o.success && o.verified == Some(true), "{o:?}");
    assert!(!o.max_tokens_exhausted, "{o:?}");
    let (ttft, answer) = (o.ttft_ms.unwrap(), o.first_answer_ms.unwrap());
    // Six reasoning deltas 40 ms apart stand between the first token and the answer.
    assert!(
        answer - ttft >= 180.0,
        "ttft {ttft} ms, first answer {answer} ms"
    );
    assert!(answer <= o.total_ms, "{o:?}");
    let v = probe_json(&o);
    assert_eq!(v["first_answer_ms"].as_f64(), Some(answer), "{v}");
    assert_eq!(v["ttft_ms"].as_f64(), Some(ttft), "{v}");
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 10, 0, 0).unwrap()
}

/// A detector whose baseline learned from the fake's own healthy answers.
fn seeded(healthy: &ProbeOutcome) -> (Detector, probeok::health::RouteHealth, Baseline) {
    let cfg = DetectionConfig::default();
    let det = Detector::new(&cfg);
    let mut h = det.route(healthy.route.clone(), t0());
    let mut b = Baseline::new(healthy.route.clone(), &cfg);
    for i in 0..40 {
        let when = t0() + chrono::Duration::seconds(30 * i);
        let mut o = healthy.clone();
        o.started_at = when;
        o.total_ms = healthy.total_ms + if i % 2 == 0 { -20.0 } else { 20.0 };
        det.ingest(&mut h, &mut b, &o, when);
    }
    assert_eq!(h.state(), State::Normal);
    (det, h, b)
}

#[tokio::test]
async fn max_tokens_spent_reasoning_is_its_own_reason_not_a_changed_answer() {
    let server = reasoning_fake().await;
    let healthy = probe(&route(&server, 256)).await;
    let o = probe(&route(&server, 16)).await;
    assert!(o.success, "{o:?}");
    assert!(o.max_tokens_exhausted, "{o:?}");
    assert_eq!(o.answer, None);
    assert_eq!(o.first_answer_ms, None, "no answer token arrived: {o:?}");
    assert!(o.ttft_ms.is_some(), "reasoning tokens did: {o:?}");
    assert_eq!(probe_json(&o)["max_tokens_exhausted"], true);

    let (det, mut h, mut b) = seeded(&healthy);
    let mut transitions = Vec::new();
    for i in 40..80 {
        let when = t0() + chrono::Duration::seconds(30 * i);
        let mut x = o.clone();
        x.started_at = when;
        x.total_ms = healthy.total_ms;
        transitions.extend(det.ingest(&mut h, &mut b, &x, when));
        transitions.extend(det.tick(&mut h, when + chrono::Duration::seconds(1)));
        assert_eq!(h.state(), State::Warning, "WARNING at most, i={i}");
    }
    assert_eq!(transitions.len(), 1, "{transitions:?}");
    let t = &transitions[0];
    assert_eq!(t.reason.code, "max_tokens_exhausted");
    assert!(
        t.reason.text.contains("raise max_tokens"),
        "{}",
        t.reason.text
    );
    assert_eq!(t.failure_mode, None, "our config is not a behaviour change");
    assert!(!h.behavior_changed());

    // Raised max_tokens: the next right answer ends it.
    let when = t0() + chrono::Duration::seconds(30 * 80);
    let mut ok = healthy.clone();
    ok.started_at = when;
    let t = det.ingest(&mut h, &mut b, &ok, when).expect("recovers");
    assert_eq!(t.to, State::Normal);
}

#[tokio::test]
async fn first_answer_and_exhaustion_round_trip_through_the_store() {
    let server = reasoning_fake().await;
    let answered = probe(&route(&server, 256)).await;
    let exhausted = probe(&route(&server, 16)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probeok.db");
    let opts = || StoreOptions {
        latency_threshold: Duration::from_secs(2),
    };
    let store = Store::open(&path, opts()).unwrap();
    let writer = store.writer();
    // Stored at millisecond precision: keep the comparison exact.
    let trim = |mut o: ProbeOutcome, s: i64| {
        o.started_at = t0() + chrono::Duration::seconds(s);
        o
    };
    writer.record(trim(answered.clone(), 0)).await.unwrap();
    writer.record(trim(exhausted.clone(), 30)).await.unwrap();
    store.close().await.unwrap();

    let store = Store::open(&path, opts()).unwrap();
    let back = store
        .reader()
        .unwrap()
        .recent_outcomes_of(&answered.route, ALL_KINDS, 10)
        .unwrap();
    assert_eq!(back.len(), 2);
    let (newest, oldest) = (&back[0], &back[1]);
    assert_eq!(oldest.first_answer_ms, answered.first_answer_ms);
    assert!(oldest.first_answer_ms.is_some());
    assert!(!oldest.max_tokens_exhausted);
    assert_eq!(newest.first_answer_ms, None);
    assert!(newest.max_tokens_exhausted);
    store.close().await.unwrap();
}
