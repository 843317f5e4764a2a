//! Traces through the proxy against a local OTLP/HTTP receiver (a real axum server decoding
//! `/v1/traces` protobuf with the `opentelemetry-proto` types) and fake upstreams: the
//! caller's trace continued through a failover, the attempts' `traceparent` upstream, the
//! trace id in metering, a dead collector, tracing off, probes as spans.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing;
use axum::Router;
use common::{fake, json, openai, Reply, Requests, Script, Server};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig, TracingConfig};
use probeok::probe::{OutcomeKind, ProbeOutcome};
use probeok::proxy::{self, Proxy, ProxyOptions, WeightsView};
use probeok::route::{RouteId, Tier};
use probeok::store::{Store, StoreOptions};
use probeok::trace::Tracer;
use prost::Message;
use serde_json::{json as j, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const PROMPT: &str = "zebra-prompt-text-never-in-a-span";
const ANSWER: &str = "okapi-answer-text-never-in-a-span";

/// A local OTLP/HTTP collector: every export request's raw body and its decoded spans.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<(Bytes, ExportTraceServiceRequest)>>>);

impl Received {
    fn spans(&self) -> Vec<Span> {
        let all = self.0.lock().unwrap();
        all.iter()
            .flat_map(|(_, r)| r.resource_spans.iter())
            .flat_map(|rs| rs.scope_spans.iter())
            .flat_map(|ss| ss.spans.iter().cloned())
            .collect()
    }

    fn service_names(&self) -> Vec<String> {
        let all = self.0.lock().unwrap();
        all.iter()
            .flat_map(|(_, r)| r.resource_spans.iter())
            .filter_map(|rs| rs.resource.as_ref())
            .flat_map(|r| r.attributes.iter())
            .filter(|kv| kv.key == "service.name")
            .filter_map(|kv| string(kv.value.as_ref()?.value.as_ref()?))
            .collect()
    }

    fn raw(&self) -> Vec<u8> {
        let all = self.0.lock().unwrap();
        all.iter().flat_map(|(b, _)| b.to_vec()).collect()
    }

    /// The spans of `trace`, once `n` of them arrived (or the deadline passed).
    async fn wait_for(&self, trace: &str, n: usize) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let spans: Vec<Span> = (self.spans().into_iter())
                .filter(|s| hex::encode(&s.trace_id) == trace)
                .collect();
            if spans.len() >= n || Instant::now() > deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Lower-case hex without another dependency.
mod hex {
    pub fn encode(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn string(v: &Any) -> Option<String> {
    match v {
        Any::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

async fn collector() -> (Server, Received) {
    let received = Received::default();
    let seen = received.clone();
    let handler = move |body: Bytes| {
        let seen = seen.clone();
        async move {
            let Ok(decoded) = ExportTraceServiceRequest::decode(body.clone()) else {
                return (StatusCode::BAD_REQUEST, Vec::new());
            };
            seen.0.lock().unwrap().push((body, decoded));
            let answer = ExportTraceServiceResponse::default().encode_to_vec();
            (StatusCode::OK, answer)
        }
    };
    let server = common::spawn(Router::new().route("/v1/traces", routing::post(handler))).await;
    (server, received)
}

fn attr(s: &Span, key: &str) -> Option<String> {
    let v = s.attributes.iter().find(|kv| kv.key == key)?;
    match v.value.as_ref()?.value.as_ref()? {
        Any::StringValue(s) => Some(s.clone()),
        Any::IntValue(i) => Some(i.to_string()),
        Any::BoolValue(b) => Some(b.to_string()),
        Any::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

struct Px {
    base: String,
    store: Store,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
    _passive: mpsc::Receiver<ProbeOutcome>,
}

impl Drop for Px {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A proxy over `ups` (the first the primary, the others backups), metering into a store.
async fn start(ups: &[&Server], tracer: Tracer) -> Px {
    let mut config = Config::default();
    for (i, u) in ups.iter().enumerate() {
        config.providers.push(ProviderConfig {
            id: format!("p{i}"),
            regions: vec![RegionConfig {
                id: "r".into(),
                base_url: u.base_url(),
            }],
            ..ProviderConfig::default()
        });
        config.routes.push(RouteConfig {
            provider: format!("p{i}"),
            region: "r".into(),
            model: format!("up-{i}"),
            serves: "chat".into(),
            tier: if i == 0 { Tier::Primary } else { Tier::Backup },
            weight: 100,
            capabilities: vec![probeok::route::Capability::Stream],
            ..RouteConfig::default()
        });
    }
    config.proxy.enabled = true;
    config.proxy.total_timeout = Duration::from_secs(10);
    config.proxy.max_retry_wait = Duration::ZERO;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("t.db"), StoreOptions::default()).expect("store");
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, prx) = mpsc::channel(4096);
    let p = Proxy::with_options(
        &config,
        wrx,
        ptx,
        ProxyOptions {
            store: Some(store.clone()),
            tracer,
            ..ProxyOptions::default()
        },
    )
    .expect("proxy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p, shutdown.clone()));
    Px {
        base: format!("http://{addr}"),
        store,
        shutdown,
        _dir: dir,
        _passive: prx,
    }
}

async fn failing() -> (Server, Requests) {
    fake("/chat/completions", |_| {
        Reply::now(json(
            StatusCode::SERVICE_UNAVAILABLE,
            openai::error("overloaded", "server_error", None),
        ))
    })
    .await
}

async fn answering() -> (Server, Requests) {
    fake("/chat/completions", |c| {
        if c.json()["stream"] == true {
            Reply::now(
                Script::new()
                    .send_all(openai::stream(&[ANSWER], "stop", Some(3)))
                    .sse(),
            )
        } else {
            Reply::now(json(StatusCode::OK, openai::body(ANSWER, "stop", Some(3))))
        }
    })
    .await
}

fn chat(stream: bool) -> Value {
    j!({"model": "chat", "stream": stream, "messages": [{"role": "user", "content": PROMPT}]})
}

async fn post(px: &Px, body: Value, traceparent: Option<&str>) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", px.base))
        .json(&body);
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp).header("tracestate", "acme=1");
    }
    req.send().await.expect("proxy answers")
}

fn caller() -> String {
    format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
}

/// The trace ids `/api/v1/requests` shows, newest first (metering is asynchronous: polled).
async fn metered_trace_ids(px: &Px, n: usize) -> Vec<Value> {
    let server = common::spawn(probeok::web::requests::router(
        px.store.clone(),
        probeok::secret::Secret::new("adm"),
    ))
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v: Value = reqwest::Client::new()
            .get(format!("{}/api/v1/requests", server.base_url()))
            .bearer_auth("adm")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ids: Vec<Value> = (v["requests"].as_array().unwrap().iter())
            .map(|r| r["trace_id"].clone())
            .collect();
        if ids.len() >= n || Instant::now() > deadline {
            return ids;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_failover_joins_the_callers_trace_with_one_span_per_attempt() {
    let (otlp, received) = collector().await;
    let (a, a_reqs) = failing().await;
    let (b, b_reqs) = answering().await;
    let config = TracingConfig {
        service_name: "probeok-test".into(),
        ..TracingConfig::default()
    };
    let tracer = Tracer::to_collector(&otlp.base_url(), &config).unwrap();
    let px = start(&[&a, &b], tracer).await;

    let r = post(&px, chat(false), Some(&caller())).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-probeok-fallback-reason"], "http_503");
    let traceresponse = r.headers()["traceresponse"].to_str().unwrap().to_owned();
    assert!(traceresponse.starts_with(&format!("00-{CALLER_TRACE}-")));
    assert!(traceresponse.ends_with("-01"));
    assert!(r.text().await.unwrap().contains(ANSWER));

    // Each upstream got its own attempt's traceparent in the caller's trace, and its state.
    let upstream_parent = |reqs: &Requests| {
        let c = reqs.last();
        assert_eq!(c.header("tracestate"), Some("acme=1"));
        let tp = c
            .header("traceparent")
            .expect("traceparent upstream")
            .to_owned();
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!((parts[0], parts[1], parts[3]), ("00", CALLER_TRACE, "01"));
        parts[2].to_owned()
    };
    let (span_a, span_b) = (upstream_parent(&a_reqs), upstream_parent(&b_reqs));
    assert_ne!(span_a, span_b);
    assert_ne!(span_a, CALLER_SPAN);

    let spans = received.wait_for(CALLER_TRACE, 3).await;
    assert_eq!(spans.len(), 3, "{spans:#?}");
    let request: Vec<&Span> = spans
        .iter()
        .filter(|s| attr(s, "probeok.kind").as_deref() == Some("request"))
        .collect();
    assert_eq!(request.len(), 1);
    let request = request[0];
    assert_eq!(request.kind, SpanKind::Server as i32);
    assert_eq!(hex::encode(&request.parent_span_id), CALLER_SPAN);
    assert_eq!(
        traceresponse.split('-').nth(2).unwrap(),
        hex::encode(&request.span_id)
    );
    assert_eq!(attr(request, "probeok.mode").as_deref(), Some("fallback"));
    assert_eq!(
        attr(request, "probeok.failover_reason").as_deref(),
        Some("http_503")
    );
    assert_eq!(attr(request, "probeok.outcome").as_deref(), Some("ok"));
    assert_eq!(attr(request, "probeok.route").as_deref(), Some("p1/r/up-1"));
    assert_eq!(attr(request, "probeok.attempt").as_deref(), Some("2"));
    assert_eq!(
        attr(request, "gen_ai.request.model").as_deref(),
        Some("chat")
    );
    assert_eq!(
        attr(request, "gen_ai.usage.output_tokens").as_deref(),
        Some("3")
    );

    let mut attempts: Vec<&Span> = spans
        .iter()
        .filter(|s| attr(s, "probeok.kind").as_deref() == Some("attempt"))
        .collect();
    attempts.sort_by_key(|s| attr(s, "probeok.attempt"));
    assert_eq!(attempts.len(), 2);
    for s in &attempts {
        assert_eq!(s.kind, SpanKind::Client as i32);
        assert_eq!(s.parent_span_id, request.span_id);
        assert!(s.start_time_unix_nano >= request.start_time_unix_nano);
        assert!(s.end_time_unix_nano <= request.end_time_unix_nano);
    }
    let (first, second) = (attempts[0], attempts[1]);
    assert_eq!(hex::encode(&first.span_id), span_a);
    assert_eq!(hex::encode(&second.span_id), span_b);
    assert_eq!(attr(first, "probeok.route").as_deref(), Some("p0/r/up-0"));
    assert_eq!(attr(first, "probeok.outcome").as_deref(), Some("failed"));
    assert_eq!(
        attr(first, "probeok.failover_reason").as_deref(),
        Some("http_503")
    );
    assert_eq!(
        attr(first, "http.response.status_code").as_deref(),
        Some("503")
    );
    assert_eq!(attr(first, "gen_ai.system").as_deref(), Some("p0"));
    assert_eq!(attr(first, "gen_ai.request.model").as_deref(), Some("up-0"));
    assert_eq!(
        first.status.as_ref().map(|s| s.code),
        Some(2),
        "error status"
    );
    assert_eq!(attr(second, "probeok.outcome").as_deref(), Some("ok"));
    assert_eq!(attr(second, "probeok.failover_reason"), None);
    assert_eq!(
        attr(second, "gen_ai.request.model").as_deref(),
        Some("up-1")
    );
    assert_eq!(
        attr(second, "gen_ai.usage.output_tokens").as_deref(),
        Some("3")
    );
    assert_eq!(received.service_names()[0], "probeok-test");

    // No prompt or answer text anywhere in what was exported.
    let raw = String::from_utf8_lossy(&received.raw()).into_owned();
    assert!(!raw.contains(PROMPT) && !raw.contains(ANSWER));

    assert_eq!(
        metered_trace_ids(&px, 1).await,
        vec![Value::from(CALLER_TRACE)]
    );
}

#[tokio::test]
async fn a_stream_without_a_caller_trace_starts_one_with_a_first_token_event() {
    let (otlp, received) = collector().await;
    let (a, _) = failing().await;
    let (b, b_reqs) = answering().await;
    let tracer = Tracer::to_collector(&otlp.base_url(), &TracingConfig::default()).unwrap();
    let px = start(&[&a, &b], tracer).await;

    let r = post(&px, chat(true), None).await;
    assert_eq!(r.status(), 200);
    let traceresponse = r.headers()["traceresponse"].to_str().unwrap().to_owned();
    let trace = traceresponse.split('-').nth(1).unwrap().to_owned();
    assert_ne!(trace, CALLER_TRACE);
    assert!(r.text().await.unwrap().contains(ANSWER));
    let tp = b_reqs.last().header("traceparent").unwrap().to_owned();
    assert!(tp.contains(&trace));
    assert_eq!(b_reqs.last().header("tracestate"), None);

    let spans = received.wait_for(&trace, 3).await;
    assert_eq!(spans.len(), 3);
    let request = spans
        .iter()
        .find(|s| attr(s, "probeok.kind").as_deref() == Some("request"))
        .unwrap();
    assert!(request.parent_span_id.is_empty(), "a root span");
    assert_eq!(attr(request, "probeok.stream").as_deref(), Some("true"));
    let answered = spans
        .iter()
        .find(|s| {
            attr(s, "probeok.kind").as_deref() == Some("attempt")
                && attr(s, "probeok.attempt").as_deref() == Some("2")
        })
        .unwrap();
    assert_eq!(answered.events.len(), 1, "{answered:#?}");
    assert_eq!(answered.events[0].name, probeok::trace::span::TTFT_EVENT);
    assert!(answered.events[0].time_unix_nano >= answered.start_time_unix_nano);
    let raw = String::from_utf8_lossy(&received.raw()).into_owned();
    assert!(!raw.contains(PROMPT) && !raw.contains(ANSWER));
    assert_eq!(metered_trace_ids(&px, 1).await, vec![Value::from(trace)]);
}

#[tokio::test]
async fn a_dead_collector_costs_requests_nothing_and_drops_are_counted() {
    // A port nothing listens on any more.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let tracer =
        Tracer::to_collector(&format!("http://{dead}"), &TracingConfig::default()).unwrap();
    let (b, _) = answering().await;
    let px = start(&[&b], tracer.clone()).await;
    for _ in 0..5 {
        let t = Instant::now();
        let r = post(&px, chat(false), Some(&caller())).await;
        assert_eq!(r.status(), 200);
        assert!(r.headers().contains_key("traceresponse"));
        assert!(r.text().await.unwrap().contains(ANSWER));
        // The export is never on the request's path (a generous bound for a busy machine).
        assert!(t.elapsed() < Duration::from_secs(2));
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while tracer.dropped() < 10 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Five requests of two spans each, none of them taken.
    assert_eq!(tracer.dropped(), 10);
}

#[tokio::test]
async fn with_tracing_off_nothing_is_exported_and_no_trace_header_is_added() {
    let (otlp, received) = collector().await;
    let (b, b_reqs) = answering().await;
    let px = start(&[&b], Tracer::off()).await;
    let r = post(&px, chat(false), Some(&caller())).await;
    assert_eq!(r.status(), 200);
    assert!(!r.headers().contains_key("traceresponse"));
    assert_eq!(b_reqs.last().header("traceparent"), None);
    assert_eq!(metered_trace_ids(&px, 1).await, vec![Value::Null]);
    // Longer than the export queue's flush period: had anything been queued, it was sent.
    tokio::time::sleep(probeok::trace::export::FLUSH_EVERY * 3).await;
    assert!(received.spans().is_empty());
    drop(otlp);
}

#[tokio::test]
async fn an_unsampled_caller_is_continued_but_not_exported() {
    let (otlp, received) = collector().await;
    let (b, b_reqs) = answering().await;
    let tracer = Tracer::to_collector(&otlp.base_url(), &TracingConfig::default()).unwrap();
    let px = start(&[&b], tracer.clone()).await;
    let unsampled = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-00");
    let r = post(&px, chat(false), Some(&unsampled)).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["traceresponse"]
        .to_str()
        .unwrap()
        .ends_with("-00"));
    let tp = b_reqs.last().header("traceparent").unwrap().to_owned();
    assert!(tp.starts_with(&format!("00-{CALLER_TRACE}-")) && tp.ends_with("-00"));
    // A probe is exported meanwhile: once it arrived, the request's spans would have too.
    tracer.probe(&probe_outcome());
    let deadline = Instant::now() + Duration::from_secs(15);
    while received.spans().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(probeok::trace::export::FLUSH_EVERY * 2).await;
    let spans = received.spans();
    assert_eq!(spans.len(), 1, "only the probe: {spans:#?}");
    assert_eq!(attr(&spans[0], "probeok.kind").as_deref(), Some("probe"));
    assert_eq!(
        metered_trace_ids(&px, 1).await,
        vec![Value::from(CALLER_TRACE)]
    );
}

fn probe_outcome() -> ProbeOutcome {
    ProbeOutcome {
        route: RouteId::new("acme", "us", "m-1"),
        kind: OutcomeKind::Probe,
        started_at: chrono::Utc::now(),
        success: true,
        attributed_to: None,
        verified: Some(true),
        ttfb_ms: Some(40.0),
        ttft_ms: Some(60.0),
        first_answer_ms: Some(60.0),
        total_ms: 90.0,
        output_tokens: Some(4),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: Some("m-1-2025".into()),
        system_fingerprint: None,
        http_status: Some(200),
        error: None,
        answer: Some(ANSWER.into()),
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

#[tokio::test]
async fn probes_are_spans_of_their_own() {
    let (otlp, received) = collector().await;
    let tracer = Tracer::to_collector(&otlp.base_url(), &TracingConfig::default()).unwrap();
    tracer.probe(&probe_outcome());
    let deadline = Instant::now() + Duration::from_secs(15);
    while received.spans().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spans = received.spans();
    assert_eq!(spans.len(), 1);
    let s = &spans[0];
    assert_eq!(attr(s, "probeok.kind").as_deref(), Some("probe"));
    assert_eq!(attr(s, "probeok.route").as_deref(), Some("acme/us/m-1"));
    assert_eq!(attr(s, "probeok.outcome").as_deref(), Some("ok"));
    assert_eq!(
        attr(s, "gen_ai.response.model").as_deref(),
        Some("m-1-2025")
    );
    assert_eq!(s.events[0].name, probeok::trace::span::TTFT_EVENT);
    assert!(s.parent_span_id.is_empty());
    let raw = String::from_utf8_lossy(&received.raw()).into_owned();
    assert!(!raw.contains(ANSWER));
}

/// One metered request with one attempt at `route`.
fn metered(
    route: &str,
    at: chrono::DateTime<chrono::Utc>,
    attempt: &str,
    trace: Option<String>,
) -> probeok::store::RequestRecord {
    probeok::store::RequestRecord {
        request_id: format!("req-{}", rand_suffix()),
        serves: "chat".into(),
        started_at: at,
        route: Some(route.into()),
        outcome: if attempt == "ok" { "ok" } else { "failed" }.into(),
        status: if attempt == "ok" { 200 } else { 503 },
        stream: false,
        fallback_reason: None,
        prompt_tokens: None,
        completion_tokens: None,
        cost: None,
        currency: None,
        latency_ms: 12.0,
        attempts: vec![probeok::store::AttemptRecord {
            n: 1,
            route: route.into(),
            reason: (attempt != "ok").then(|| "http_503".into()),
            status_class: if attempt == "ok" { "2xx" } else { "5xx" }.into(),
            status: Some(if attempt == "ok" { 200 } else { 503 }),
            ttfb_ms: Some(5.0),
            latency_ms: 12.0,
            prompt_tokens: None,
            completion_tokens: None,
            cost: None,
            outcome: attempt.into(),
        }],
        contract: None,
        trace_id: trace,
        client: None,
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// An outage of `route` through the detector, stored the way the health service stores it.
async fn record_outage(store: &Store, route: &str, start: chrono::DateTime<chrono::Utc>) {
    use probeok::config::DetectionConfig;
    use probeok::health::{Baseline, Detector};
    let cfg = DetectionConfig::default();
    let det = Detector::new(&cfg);
    let r = common::app::id(route);
    let mut h = det.route(r.clone(), start);
    let mut b = Baseline::new(r.clone(), &cfg);
    let w = store.writer();
    for s in (0..=1200).step_by(30) {
        let t = start + chrono::Duration::seconds(s);
        let o = common::app::outcome(route, OutcomeKind::Probe, t, s > 60, 1100.0);
        if let Some(tr) = det.ingest(&mut h, &mut b, &o, t) {
            let incident = tr.incident_id.as_deref().and_then(|iid| {
                h.incident()
                    .filter(|i| i.id == iid)
                    .or(h.last_closed().filter(|i| i.id == iid))
            });
            w.record_transition(&tr, incident, &h).await.unwrap();
        }
    }
}

#[tokio::test]
async fn incidents_list_their_failed_requests_trace_ids_in_the_admin_view_only() {
    const QWEN: &str = "qwen/cn/qwen-max";
    const OTHER: &str = "ds/cn/v3";
    let routes: &[common::app::Spec<'static>] = &[
        common::app::Spec::new("qwen", "cn", "qwen-max").serves("chat"),
        common::app::Spec::new("ds", "cn", "v3")
            .serves("chat")
            .backup(),
    ];
    let now = common::app::at("2026-03-04T12:00:00Z");
    let mut h = common::app::Harness::new(routes, now).await;
    h.state.incidents = Arc::new(probeok::web::StoreIncidents);
    // An admin token the test process already has, so no variable is set here.
    let mut config = (*h.state.config.current()).clone();
    config.server.admin_token_env = "CARGO_PKG_NAME".into();
    h.state.config = Arc::new(config).into();
    record_outage(&h.store, QWEN, now - chrono::Duration::hours(3)).await;
    let s = h.serve().await;
    let http = reqwest::Client::new();
    let get = |token: Option<&str>| {
        let mut req = http.get(s.url("/api/v1/incidents"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let r = req.send().await.unwrap();
            (r.status(), r.json::<Value>().await.unwrap())
        }
    };
    let (_, v) = get(None).await;
    let incident = v["incidents"][0].clone();
    let opened = common::app::at(incident["opened_at"].as_str().unwrap());
    let inside = opened + chrono::Duration::seconds(1);

    let w = h.store.writer();
    let mut want = Vec::new();
    for i in 0..22 {
        let trace = format!("{:032x}", 0xabc000 + i);
        let at = inside + chrono::Duration::milliseconds(i64::from(i));
        w.record_request(metered(QWEN, at, "failed", Some(trace.clone())))
            .await
            .unwrap();
        want.push(trace);
    }
    // Not listed: a request that succeeded there, one that failed elsewhere, one before the
    // incident, one without a trace.
    for r in [
        metered(QWEN, inside, "ok", Some(format!("{:032x}", 1))),
        metered(OTHER, inside, "failed", Some(format!("{:032x}", 2))),
        metered(
            QWEN,
            opened - chrono::Duration::hours(1),
            "failed",
            Some(format!("{:032x}", 3)),
        ),
        metered(QWEN, inside, "failed", None),
    ] {
        w.record_request(r).await.unwrap();
    }

    let (code, v) = get(None).await;
    assert_eq!(code, 200);
    assert!(
        v["incidents"][0].get("trace_ids").is_none(),
        "public view: {v}"
    );
    let (code, _) = get(Some("wrong-token")).await;
    assert_eq!(code, 401);
    let (code, v) = get(Some(env!("CARGO_PKG_NAME"))).await;
    assert_eq!(code, 200, "{v}");
    let ids: Vec<String> = (v["incidents"][0]["trace_ids"].as_array().unwrap().iter())
        .map(|t| t.as_str().unwrap().to_owned())
        .collect();
    want.reverse();
    want.truncate(probeok::web::api::INCIDENT_TRACES);
    assert_eq!(
        ids, want,
        "the 20 newest failed requests inside the incident"
    );
}
