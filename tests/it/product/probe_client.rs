//! The probe client against fake upstreams (real HTTP servers on loopback): OpenAI-compatible
//! and Anthropic, streaming and not. The fakes' delays are the scenario; the assertions are on
//! the classification and on bounds the scenario guarantees (a body scripted to take 750 ms
//! cannot be read in less). Every test runs in paused time: the fakes and the client share
//! the runtime, loopback bytes are there when it looks, and the 400 ms timeouts are measured
//! exactly however loaded the machine is.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use common::{anthropic, fake, json, openai, Reply, Script, Server};
use futures_util::future::join_all;
use probeok::clock::{ManualClock, SystemClock};
use probeok::probe::{
    probe_json, OutcomeKind, ProbeClient, ProbeError, ProbeOutcome, ProbeSetupError,
};
use probeok::route::{ProbeSettings, ProviderKind, Route, RouteId, Tier};
use probeok::secret::Env;

const MS: Duration = Duration::from_millis(1);

/// One wire dialect × streaming or not.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Wire {
    kind: ProviderKind,
    stream: bool,
}

const OPENAI_STREAM: Wire = Wire {
    kind: ProviderKind::Openai,
    stream: true,
};
const OPENAI_PLAIN: Wire = Wire {
    kind: ProviderKind::Openai,
    stream: false,
};
const ANTHROPIC_STREAM: Wire = Wire {
    kind: ProviderKind::Anthropic,
    stream: true,
};
const ANTHROPIC_PLAIN: Wire = Wire {
    kind: ProviderKind::Anthropic,
    stream: false,
};
const ALL: [Wire; 4] = [
    OPENAI_STREAM,
    OPENAI_PLAIN,
    ANTHROPIC_STREAM,
    ANTHROPIC_PLAIN,
];
const STREAMS: [Wire; 2] = [OPENAI_STREAM, ANTHROPIC_STREAM];

impl Wire {
    /// The path the client will call, given the base URLs built by [`route`].
    fn path(self) -> &'static str {
        match self.kind {
            ProviderKind::Openai => "/v1/chat/completions",
            ProviderKind::Anthropic => "/v1/messages",
        }
    }

    /// The frames of a complete streamed answer.
    fn frames(self, pieces: &[&str], usage: Option<u32>) -> Vec<String> {
        match self.kind {
            ProviderKind::Openai => openai::stream(pieces, "stop", usage),
            ProviderKind::Anthropic => anthropic::stream(pieces, "end_turn", usage),
        }
    }

    /// The non-streamed body of a complete answer.
    fn body(self, text: &str, usage: Option<u32>) -> serde_json::Value {
        match self.kind {
            ProviderKind::Openai => openai::body(text, "stop", usage),
            ProviderKind::Anthropic => anthropic::body(text, "end_turn", usage),
        }
    }

    /// A complete answer, sent at once.
    fn answer(self, pieces: &[&str], usage: Option<u32>) -> Response {
        if self.stream {
            Script::new().send_all(self.frames(pieces, usage)).sse()
        } else {
            json(StatusCode::OK, self.body(&pieces.concat(), usage))
        }
    }

    /// The provider's error envelope.
    fn error(self, message: &str, kind: &str, code: Option<&str>) -> serde_json::Value {
        match self.kind {
            ProviderKind::Openai => openai::error(message, kind, code),
            ProviderKind::Anthropic => anthropic::error(kind, message),
        }
    }
}

fn settings(stream: bool) -> ProbeSettings {
    ProbeSettings {
        interval: Duration::from_secs(30),
        first_byte_timeout: 400 * MS,
        stall_timeout: 400 * MS,
        timeout: Duration::from_secs(3),
        jitter: 0.0,
        stream,
        max_tokens: 16,
        throughput_every: Duration::from_secs(300),
        throughput_prompt:
            "Count from 1 to 40, separated by single spaces. Reply with the numbers only.".into(),
        throughput_max_tokens: 128,
        system: "Reply with exactly: PROBE_OK".into(),
        user: "health check".into(),
        expect: "PROBE_OK".into(),
        confirm_after: None,
    }
}

fn route(server: &Server, wire: Wire) -> Route {
    let (provider, base_url) = match wire.kind {
        ProviderKind::Openai => ("fakeai", format!("{}/v1", server.base_url())),
        ProviderKind::Anthropic => ("fakeclaude", server.base_url()),
    };
    Route {
        id: RouteId::new(provider, "local", "fake-model"),
        provider: provider.into(),
        region: "local".into(),
        model: "fake-model".into(),
        kind: wire.kind,
        base_url,
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
        probe: settings(wire.stream),
    }
}

fn route_with(server: &Server, wire: Wire, tweak: impl FnOnce(&mut ProbeSettings)) -> Route {
    let mut r = route(server, wire);
    tweak(&mut r.probe);
    r
}

async fn probe_kind(route: &Route, kind: OutcomeKind) -> ProbeOutcome {
    probe_in(route, kind, &Env::given()).await
}

/// A probe whose client reads the key variables from `env`: the test gives the key to the
/// client, never to the whole process.
async fn probe_in(route: &Route, kind: OutcomeKind, env: &Env) -> ProbeOutcome {
    let client = ProbeClient::with_env(std::slice::from_ref(route), Arc::new(SystemClock), env)
        .expect("client builds");
    let outcome = client.probe(route, kind).await;
    assert_ordered(&outcome);
    outcome
}

async fn probe(route: &Route) -> ProbeOutcome {
    probe_kind(route, OutcomeKind::Probe).await
}

/// [`probe`] with the route's key variable holding `key`.
async fn probe_keyed(route: &Route, key: &str) -> ProbeOutcome {
    let var = route
        .api_key_env
        .clone()
        .expect("the route names its key variable");
    probe_in(route, OutcomeKind::Probe, &Env::given().with(var, key)).await
}

/// `ttfb <= ttft <= total` wherever present, on every outcome.
fn assert_ordered(o: &ProbeOutcome) {
    let total = o.total_ms;
    assert!(total >= 0.0, "{o:?}");
    if let Some(ttfb) = o.ttfb_ms {
        assert!(ttfb <= total, "ttfb > total: {o:?}");
        if let Some(ttft) = o.ttft_ms {
            assert!(ttfb <= ttft, "ttfb > ttft: {o:?}");
        }
    }
    if let Some(ttft) = o.ttft_ms {
        assert!(ttft <= total, "ttft > total: {o:?}");
    }
    assert_eq!(o.success, o.error.is_none(), "{o:?}");
    if !o.success {
        assert_eq!(o.verified, None, "a failure is never verified: {o:?}");
        assert_eq!(o.tokens_per_second, None, "{o:?}");
    }
}

fn error_kind(o: &ProbeOutcome) -> &'static str {
    o.error.as_ref().map_or("none", ProbeError::kind)
}

/// Runs one scenario for several wires concurrently.
async fn each<F, Fut>(wires: &[Wire], scenario: F)
where
    F: Fn(Wire) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    join_all(wires.iter().map(|w| scenario(*w))).await;
}

// ---------------------------------------------------------------------------------------------
// Answers

#[tokio::test(start_paused = true)]
async fn exact_probe_ok_is_a_verified_success() {
    each(&ALL, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(wire.answer(&["PROBE", "_OK"], Some(3)))
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert!(o.success, "{wire:?}: {o:?}");
        assert_eq!(o.verified, Some(true), "{wire:?}");
        assert_eq!(o.answer.as_deref(), Some("PROBE_OK"));
        assert_eq!(o.http_status, Some(200));
        assert_eq!((o.output_tokens, o.tokens_estimated), (Some(3), false));
        assert_eq!(o.tokens_per_second, None, "3 tokens give no tokens/s");
        assert!(o.ttfb_ms.is_some() && o.ttft_ms.is_some(), "{o:?}");
        assert_eq!(o.kind, OutcomeKind::Probe);
        let expected_model = match wire.kind {
            ProviderKind::Openai => openai::MODEL,
            ProviderKind::Anthropic => anthropic::MODEL,
        };
        assert_eq!(o.model_reported.as_deref(), Some(expected_model));
        if wire.kind == ProviderKind::Openai {
            assert_eq!(o.system_fingerprint.as_deref(), Some("fp_fake"));
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_different_answer_is_a_success_but_unverified() {
    each(&ALL, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(wire.answer(&["Hello", ", PROBE_OK"], Some(5)))
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert!(o.success, "{wire:?}: {o:?}");
        assert_eq!(o.verified, Some(false), "{wire:?}");
        assert_eq!(o.answer.as_deref(), Some("Hello, PROBE_OK"));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn whitespace_around_the_answer_is_trimmed() {
    each(&ALL, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(wire.answer(&["\n", "PROBE_OK", " \n"], None))
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(o.verified, Some(true), "{wire:?}: {o:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn usage_is_reported_or_estimated() {
    each(&ALL, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(wire.answer(&["PROBE", "_OK"], None))
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert!(o.success, "{wire:?}: {o:?}");
        // PROBE, _, OK: three pieces (and two content events when streamed).
        assert_eq!(
            (o.output_tokens, o.tokens_estimated),
            (Some(3), true),
            "{wire:?}"
        );

        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(wire.answer(&["PROBE", "_OK"], Some(7)))
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(
            (o.output_tokens, o.tokens_estimated),
            (Some(7), false),
            "{wire:?}"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Status codes

#[tokio::test(start_paused = true)]
async fn rate_limited_with_retry_after_seconds() {
    each(&ALL, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            let mut r = json(
                StatusCode::TOO_MANY_REQUESTS,
                wire.error(
                    "Rate limit reached for requests",
                    "rate_limit_error",
                    Some("rate_limit_exceeded"),
                ),
            );
            r.headers_mut().insert("retry-after", "2".parse().unwrap());
            Reply::now(r)
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(
            o.error,
            Some(ProbeError::RateLimited {
                retry_after_ms: Some(2000),
                message: "Rate limit reached for requests".into()
            }),
            "{wire:?}"
        );
        assert_eq!(o.http_status, Some(429));
        assert!(o.ttfb_ms.is_some() && o.ttft_ms.is_none(), "{o:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn rate_limited_with_retry_after_http_date() {
    let now: DateTime<Utc> = DateTime::parse_from_rfc3339("2026-11-29T08:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    each(&ALL, |wire| async move {
        let at = httpdate::fmt_http_date(std::time::SystemTime::from(
            now + chrono::Duration::seconds(7),
        ));
        let (server, _) = fake(wire.path(), move |_| {
            let mut r = json(
                StatusCode::TOO_MANY_REQUESTS,
                wire.error("slow down", "rate_limit_error", None),
            );
            r.headers_mut().insert("retry-after", at.parse().unwrap());
            Reply::now(r)
        })
        .await;
        let r = route(&server, wire);
        let client =
            ProbeClient::new(std::slice::from_ref(&r), Arc::new(ManualClock::new(now))).unwrap();
        let o = client.probe(&r, OutcomeKind::Probe).await;
        assert_ordered(&o);
        assert_eq!(o.started_at, now, "started_at comes from the clock");
        assert_eq!(
            o.error.as_ref().and_then(ProbeError::retry_after_ms),
            Some(7000),
            "{wire:?}: {o:?}"
        );
        assert_eq!(error_kind(&o), "rate_limited");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn server_error_500_is_http_with_the_upstream_message() {
    each(&ALL, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(json(
                StatusCode::INTERNAL_SERVER_ERROR,
                wire.error(
                    "  The server had an error while processing your request.  ",
                    "api_error",
                    None,
                ),
            ))
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(
            o.error,
            Some(ProbeError::Http {
                status: 500,
                message: "The server had an error while processing your request.".into()
            }),
            "{wire:?}"
        );
        assert_eq!(o.http_status, Some(500));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn bad_request_400_is_http() {
    each(&ALL, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(json(
                StatusCode::BAD_REQUEST,
                wire.error(
                    "max_tokens: must be at least 1",
                    "invalid_request_error",
                    Some("invalid_value"),
                ),
            ))
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(
            o.error.as_ref().and_then(ProbeError::status),
            Some(400),
            "{wire:?}: {o:?}"
        );
        assert_eq!(error_kind(&o), "http");
        assert_eq!(
            o.error.as_ref().and_then(ProbeError::message),
            Some("max_tokens: must be at least 1")
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn content_policy_400_is_refused() {
    // DashScope's compatible mode answers a flagged prompt with 400 data_inspection_failed.
    each(&[OPENAI_STREAM, OPENAI_PLAIN], |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(json(
                StatusCode::BAD_REQUEST,
                openai::error(
                    "Input data may contain inappropriate content.",
                    "data_inspection_failed",
                    Some("data_inspection_failed"),
                ),
            ))
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(error_kind(&o), "refused", "{wire:?}: {o:?}");
        assert_eq!(o.http_status, Some(400));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn upstream_messages_are_scrubbed_and_the_key_never_leaks() {
    let key = "sk-live-0123456789abcdefABCDEF0123456789";
    each(&[OPENAI_STREAM, ANTHROPIC_PLAIN], |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(json(
                StatusCode::UNAUTHORIZED,
                wire.error(
                    &format!("Incorrect API key provided: {key}."),
                    "authentication_error",
                    None,
                ),
            ))
        })
        .await;
        let mut r = route(&server, wire);
        r.api_key_env = Some("PROBEOK_TEST_KEY_SCRUB".into());
        let o = probe_keyed(&r, key).await;
        assert_eq!(
            o.error.as_ref().and_then(ProbeError::status),
            Some(401),
            "{o:?}"
        );
        let message = o
            .error
            .as_ref()
            .and_then(ProbeError::message)
            .unwrap_or_default();
        assert!(
            message.starts_with("Incorrect API key provided:"),
            "{message}"
        );
        for text in [format!("{o:?}"), probe_json(&o).to_string()] {
            assert!(!text.contains("0123456789abcdef"), "key leaked: {text}");
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Timing

#[tokio::test(start_paused = true)]
async fn no_byte_before_first_byte_timeout() {
    each(&ALL, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            Reply::after(Duration::from_secs(2), wire.answer(&["PROBE_OK"], Some(3)))
        })
        .await;
        let o = probe(&route_with(&server, wire, |s| {
            s.first_byte_timeout = 200 * MS
        }))
        .await;
        assert_eq!(
            o.error,
            Some(ProbeError::TimeoutBeforeFirstByte),
            "{wire:?}: {o:?}"
        );
        assert_eq!((o.ttfb_ms, o.ttft_ms, o.http_status), (None, None, None));
        assert!(o.total_ms >= 200.0 && o.total_ms < 250.0, "{o:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn headers_then_a_slow_body_is_a_slow_success() {
    // Streams: a frame every 150 ms, under the 400 ms silence limit.
    each(&STREAMS, |wire| async move {
        let frames = wire.frames(&["PROBE", "_OK"], Some(3));
        let n = frames.len() as f64;
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(Script::new().every(150 * MS, frames.clone()).sse())
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert!(o.success, "{wire:?}: {o:?}");
        assert_eq!(o.verified, Some(true));
        assert!(o.total_ms >= 150.0 * n, "{wire:?}: {o:?}");
        let (ttfb, ttft) = (o.ttfb_ms.unwrap_or(f64::MAX), o.ttft_ms.unwrap_or(0.0));
        assert!(ttfb < 150.0, "headers came before the slow body: {o:?}");
        assert!(ttft >= 150.0, "{o:?}");
    })
    .await;
    // Bodies: the JSON arrives in three parts, 300 ms apart — longer than the 200 ms
    // first-byte timeout, but a non-streamed body may take the rest of `timeout`.
    each(&[OPENAI_PLAIN, ANTHROPIC_PLAIN], |wire| async move {
        let body = wire.body("PROBE_OK", Some(3)).to_string();
        let (server, _) = fake(wire.path(), move |_| {
            let (a, rest) = body.split_at(10);
            let (b, c) = rest.split_at(10);
            Reply::now(
                Script::new()
                    .send(a.to_owned())
                    .after(300 * MS, b.to_owned())
                    .after(300 * MS, c.to_owned())
                    .json(),
            )
        })
        .await;
        let o = probe(&route_with(&server, wire, |s| {
            s.first_byte_timeout = 200 * MS
        }))
        .await;
        assert!(o.success, "{wire:?}: {o:?}");
        assert_eq!(o.verified, Some(true));
        assert!(o.total_ms >= 600.0, "{o:?}");
        assert_eq!(
            o.ttft_ms,
            Some(o.total_ms),
            "non-streamed: ttft is the total"
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_stalls_after_one_chunk_is_stalled() {
    each(&STREAMS, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            let first: Vec<String> = match wire.kind {
                ProviderKind::Openai => vec![openai::content("PROBE")],
                ProviderKind::Anthropic => {
                    let mut v = anthropic::head();
                    v.push(anthropic::text("PROBE"));
                    v
                }
            };
            Reply::now(Script::new().send_all(first).hang().sse())
        })
        .await;
        let o = probe(&route_with(&server, wire, |s| {
            s.first_byte_timeout = 200 * MS;
            s.stall_timeout = 200 * MS;
        }))
        .await;
        assert_eq!(o.error, Some(ProbeError::Stalled), "{wire:?}: {o:?}");
        assert!(o.ttft_ms.is_some(), "the first chunk was measured: {o:?}");
        assert!(
            o.total_ms >= 200.0 && o.total_ms < 3000.0,
            "a stall, not the deadline: {o:?}"
        );
        assert_eq!(
            o.answer.as_deref(),
            Some("PROBE"),
            "what arrived is kept as evidence"
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_provider_that_queues_after_its_headers_is_slow_not_down() {
    // Headers at once, then silence (no keep-alive comments) until the first token 2.5 s
    // later, as vLLM-style servers queue a request: a slow success, not a stall, even with a
    // 1 s first_byte_timeout and a 1 s stall_timeout.
    each(&STREAMS, |wire| async move {
        let frames = wire.frames(&["PROBE", "_OK"], Some(3));
        let (server, _) = fake(wire.path(), move |_| {
            let mut s = Script::new().after(2500 * MS, frames[0].clone());
            for f in &frames[1..] {
                s = s.send(f.clone());
            }
            Reply::now(s.sse())
        })
        .await;
        let o = probe(&route_with(&server, wire, |s| {
            s.first_byte_timeout = 1000 * MS;
            s.stall_timeout = 1000 * MS;
            s.timeout = Duration::from_secs(20);
        }))
        .await;
        assert!(o.success, "{wire:?}: {o:?}");
        assert_eq!(o.verified, Some(true), "{o:?}");
        let ttft = o.ttft_ms.expect("ttft measured");
        assert!(ttft >= 2500.0, "the first token came at 2.5 s: {o:?}");
        assert!(
            o.ttfb_ms.is_some_and(|t| t < 2500.0),
            "headers came first: {o:?}"
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn no_answer_token_before_the_deadline_is_a_timeout_not_a_stall() {
    // Headers, then nothing: only `timeout` bounds the wait for the first answer token.
    each(&STREAMS, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            let head: Vec<String> = match wire.kind {
                ProviderKind::Openai => vec![],
                ProviderKind::Anthropic => anthropic::head(),
            };
            Reply::now(Script::new().send_all(head).hang().sse())
        })
        .await;
        let o = probe(&route_with(&server, wire, |s| {
            s.first_byte_timeout = 200 * MS;
            s.stall_timeout = 200 * MS;
            s.timeout = 900 * MS;
        }))
        .await;
        assert_eq!(o.error, Some(ProbeError::Timeout), "{wire:?}: {o:?}");
        assert!(o.total_ms >= 900.0, "waited for the whole timeout: {o:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn openrouter_and_anthropic_in_stream_errors_are_classified_by_what_they_declare() {
    // OpenRouter: a 200 stream that ends in a chunk with an error object and
    // finish_reason "error".
    for (error, want) in [
        (
            r#"{"code":502,"message":"Provider returned error"}"#,
            ProbeError::Http {
                status: 502,
                message: "Provider returned error".into(),
            },
        ),
        (
            r#"{"code":"server_error","message":"Provider disconnected unexpectedly"}"#,
            ProbeError::Http {
                status: 500,
                message: "Provider disconnected unexpectedly".into(),
            },
        ),
    ] {
        let chunk = format!(
            r#"{{"id":"gen-1","object":"chat.completion.chunk","created":1,"model":"m","provider":"p","error":{error},"choices":[{{"index":0,"delta":{{"content":""}},"finish_reason":"error"}}]}}"#
        );
        let (server, _) = fake(OPENAI_STREAM.path(), move |_| {
            Reply::now(
                Script::new()
                    .send_all([openai::content("PRO"), common::frame(None, &chunk)])
                    .sse(),
            )
        })
        .await;
        let o = probe(&route(&server, OPENAI_STREAM)).await;
        assert_eq!(o.error, Some(want), "{o:?}");
        assert_eq!(o.http_status, Some(200));
    }
    // Anthropic: `event: error` with rate_limit_error is a rate limit, not malformed.
    let (server, _) = fake(ANTHROPIC_STREAM.path(), |_| {
        let mut frames = anthropic::head();
        frames.push(anthropic::error_event(
            "rate_limit_error",
            "Number of requests exceeded",
        ));
        Reply::now(Script::new().send_all(frames).sse())
    })
    .await;
    let o = probe(&route(&server, ANTHROPIC_STREAM)).await;
    assert!(
        matches!(o.error, Some(ProbeError::RateLimited { .. })),
        "{o:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_429_with_only_ratelimit_reset_headers_rests_that_long() {
    let (server, _) = fake(OPENAI_PLAIN.path(), |_| {
        let mut r = Response::new(axum::body::Body::from(
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
        ));
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let h = r.headers_mut();
        h.insert("x-ratelimit-reset-requests", "6m0s".parse().unwrap());
        h.insert("x-ratelimit-remaining-requests", "0".parse().unwrap());
        h.insert("x-ratelimit-reset-tokens", "20ms".parse().unwrap());
        Reply::now(r)
    })
    .await;
    let o = probe(&route(&server, OPENAI_PLAIN)).await;
    assert_eq!(
        o.error.as_ref().and_then(ProbeError::retry_after_ms),
        Some(360_000),
        "{o:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn past_the_deadline_while_data_flows_is_timeout() {
    each(&ALL, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            let drip = (0..100).map(|_| match wire.kind {
                ProviderKind::Openai => openai::content("x"),
                ProviderKind::Anthropic => anthropic::ping(),
            });
            let s = Script::new().every(100 * MS, drip);
            Reply::now(if wire.stream { s.sse() } else { s.json() })
        })
        .await;
        let o = probe(&route_with(&server, wire, |s| {
            s.first_byte_timeout = 300 * MS;
            s.timeout = 700 * MS;
        }))
        .await;
        assert_eq!(o.error, Some(ProbeError::Timeout), "{wire:?}: {o:?}");
        assert!(o.total_ms >= 700.0, "{o:?}");
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Broken streams and bodies

#[tokio::test(start_paused = true)]
async fn a_stream_cut_without_its_end_marker_is_truncated() {
    each(&STREAMS, |wire| async move {
        // Everything but the end marker, then a clean end of body.
        let mut frames = wire.frames(&["PROBE", "_OK"], None);
        frames.pop();
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(Script::new().send_all(frames.clone()).sse())
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(o.error, Some(ProbeError::Truncated), "{wire:?}: {o:?}");

        // The connection aborted mid-stream.
        let (server, _) = fake(wire.path(), move |_| {
            let first = match wire.kind {
                ProviderKind::Openai => vec![openai::content("PRO")],
                ProviderKind::Anthropic => vec![anthropic::message_start(), anthropic::text("PRO")],
            };
            Reply::now(Script::new().send_all(first).after(50 * MS, "").cut().sse())
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(o.error, Some(ProbeError::Truncated), "{wire:?}: {o:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_cut_body_is_truncated() {
    each(&[OPENAI_PLAIN, ANTHROPIC_PLAIN], |wire| async move {
        let body = wire.body("PROBE_OK", Some(3)).to_string();
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(
                Script::new()
                    .send(body[..20].to_owned())
                    .after(50 * MS, "")
                    .cut()
                    .json(),
            )
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(o.error, Some(ProbeError::Truncated), "{wire:?}: {o:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn openai_end_rules_without_done() {
    // finish_reason + usage chunk, body ends without [DONE]: complete.
    let (server, _) = fake(OPENAI_STREAM.path(), |_| {
        Reply::now(
            Script::new()
                .send_all([
                    openai::content("PROBE_OK"),
                    openai::finish("stop"),
                    openai::usage(3),
                ])
                .sse(),
        )
    })
    .await;
    let o = probe(&route(&server, OPENAI_STREAM)).await;
    assert!(o.success, "{o:?}");
    // [DONE] without any finish_reason: truncated.
    let (server, _) = fake(OPENAI_STREAM.path(), |_| {
        Reply::now(
            Script::new()
                .send_all([openai::content("PROBE_OK"), openai::done()])
                .sse(),
        )
    })
    .await;
    let o = probe(&route(&server, OPENAI_STREAM)).await;
    assert_eq!(o.error, Some(ProbeError::Truncated), "{o:?}");
    // [DONE], then the upstream keeps the body open: complete, and the end is the [DONE]
    // (the client's bounded wait for the end of the body is not the upstream's latency).
    let (server, _) = fake(OPENAI_STREAM.path(), |_| {
        Reply::now(
            Script::new()
                .send_all(openai::stream(&["PROBE_OK"], "stop", Some(3)))
                .hang()
                .sse(),
        )
    })
    .await;
    let o = probe(&route(&server, OPENAI_STREAM)).await;
    assert!(o.success, "{o:?}");
    assert!(o.total_ms < 190.0, "{o:?}");
}

#[tokio::test(start_paused = true)]
async fn a_malformed_chunk_or_body_is_malformed() {
    each(&ALL, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(if wire.stream {
                let mut frames = wire.frames(&["PROBE"], Some(3));
                frames.insert(frames.len() - 2, "data: {\"choices\": [oops\n\n".into());
                Script::new().send_all(frames).sse()
            } else {
                Script::new().send("{\"choices\": [oops").json()
            })
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(error_kind(&o), "malformed", "{wire:?}: {o:?}");
        // Valid JSON without the fields the protocol requires.
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(if wire.stream {
                Script::new()
                    .send(common::frame(None, r#"{"id":"x"}"#))
                    .sse()
            } else {
                json(StatusCode::OK, serde_json::json!({"id": "x"}))
            })
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(error_kind(&o), "malformed", "{wire:?}: {o:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_content_filter_finish_is_refused() {
    each(&ALL, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            Reply::now(match (wire.kind, wire.stream) {
                (ProviderKind::Openai, true) => Script::new()
                    .send_all(openai::stream(&["I can"], "content_filter", Some(2)))
                    .sse(),
                (ProviderKind::Openai, false) => {
                    json(StatusCode::OK, openai::body("", "content_filter", Some(0)))
                }
                (ProviderKind::Anthropic, true) => Script::new()
                    .send_all(anthropic::stream(&["I can"], "refusal", Some(2)))
                    .sse(),
                (ProviderKind::Anthropic, false) => {
                    json(StatusCode::OK, anthropic::body("", "refusal", Some(0)))
                }
            })
        })
        .await;
        let o = probe(&route(&server, wire)).await;
        assert_eq!(error_kind(&o), "refused", "{wire:?}: {o:?}");
        assert_eq!(o.http_status, Some(200));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_error_event_inside_a_200_stream_is_never_a_success() {
    // Anthropic: overloaded_error mid-stream stands for 529.
    let (server, _) = fake(ANTHROPIC_STREAM.path(), |_| {
        let mut frames = anthropic::head();
        frames.push(anthropic::error_event("overloaded_error", "Overloaded"));
        Reply::now(Script::new().send_all(frames).sse())
    })
    .await;
    let o = probe(&route(&server, ANTHROPIC_STREAM)).await;
    assert_eq!(
        o.error,
        Some(ProbeError::Http {
            status: 529,
            message: "Overloaded".into()
        }),
        "{o:?}"
    );
    assert_eq!(o.http_status, Some(200));

    // OpenAI-compatible: an error chunk with a status, and one without.
    for (data, kind) in [
        (
            r#"{"error":{"message":"upstream overloaded","code":503}}"#,
            "http",
        ),
        // Declared without a status: still the upstream failing, not unparseable bytes.
        (r#"{"error":{"message":"something broke"}}"#, "http"),
    ] {
        let (server, _) = fake(OPENAI_STREAM.path(), move |_| {
            Reply::now(
                Script::new()
                    .send_all([openai::content("PRO"), common::frame(Some("error"), data)])
                    .sse(),
            )
        })
        .await;
        let o = probe(&route(&server, OPENAI_STREAM)).await;
        assert_eq!(error_kind(&o), kind, "{o:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn connection_refused_is_connect() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut r = {
        let (server, _) = fake("/", |_| Reply::now("")).await;
        route(&server, OPENAI_STREAM)
    };
    r.base_url = format!("http://{addr}/v1");
    let o = probe(&r).await;
    assert_eq!(error_kind(&o), "connect", "{o:?}");
    assert_eq!((o.ttfb_ms, o.http_status), (None, None));
}

// ---------------------------------------------------------------------------------------------
// Requests

#[tokio::test(start_paused = true)]
async fn openai_request_shape_and_bearer_key() {
    let (server, requests) = fake(OPENAI_STREAM.path(), |_| {
        Reply::now(OPENAI_STREAM.answer(&["PROBE_OK"], Some(3)))
    })
    .await;
    let mut r = route(&server, OPENAI_STREAM);
    r.api_key_env = Some("PROBEOK_TEST_KEY_OPENAI_SHAPE".into());
    let o = probe_keyed(&r, "sk-test-openai-shape").await;
    assert!(o.success, "{o:?}");

    let req = requests.last();
    assert_eq!(req.method, "POST");
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(
        req.header("authorization"),
        Some("Bearer sk-test-openai-shape")
    );
    assert_eq!(req.header("accept"), Some("text/event-stream"));
    assert!(req
        .header("content-type")
        .unwrap_or_default()
        .starts_with("application/json"));
    assert_eq!(
        req.json(),
        serde_json::json!({
            "model": "fake-model",
            "messages": [
                {"role": "system", "content": "Reply with exactly: PROBE_OK"},
                {"role": "user", "content": "health check"}
            ],
            "max_tokens": 16,
            "temperature": 0,
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );

    // Not streaming: no stream_options.
    let (server, requests) = fake(OPENAI_PLAIN.path(), |_| {
        Reply::now(OPENAI_PLAIN.answer(&["PROBE_OK"], Some(3)))
    })
    .await;
    let o = probe(&route(&server, OPENAI_PLAIN)).await;
    assert!(o.success, "{o:?}");
    let body = requests.last().json();
    assert_eq!(body["stream"], false);
    assert!(body.get("stream_options").is_none(), "{body}");
    assert!(
        requests.last().header("authorization").is_none(),
        "no key configured, none sent"
    );
}

#[tokio::test(start_paused = true)]
async fn anthropic_request_shape_and_headers() {
    let (server, requests) = fake(ANTHROPIC_STREAM.path(), |_| {
        Reply::now(ANTHROPIC_STREAM.answer(&["PROBE_OK"], Some(3)))
    })
    .await;
    let mut r = route(&server, ANTHROPIC_STREAM);
    r.api_key_env = Some("PROBEOK_TEST_KEY_ANTHROPIC_SHAPE".into());
    let o = probe_keyed(&r, "sk-ant-test-shape").await;
    assert!(o.success, "{o:?}");

    let req = requests.last();
    assert_eq!(req.path, "/v1/messages");
    assert_eq!(req.header("x-api-key"), Some("sk-ant-test-shape"));
    assert_eq!(req.header("anthropic-version"), Some("2023-06-01"));
    assert!(req.header("authorization").is_none());
    assert_eq!(
        req.json(),
        serde_json::json!({
            "model": "fake-model",
            "system": "Reply with exactly: PROBE_OK",
            "messages": [{"role": "user", "content": "health check"}],
            "max_tokens": 16,
            "temperature": 0,
            "stream": true
        })
    );
}

#[tokio::test(start_paused = true)]
async fn throughput_request_uses_its_prompt_and_budget() {
    each(&[OPENAI_PLAIN, ANTHROPIC_PLAIN], |wire| async move {
        let (server, requests) = fake(wire.path(), move |_| {
            Reply::now(wire.answer(&["1 2 3"], Some(5)))
        })
        .await;
        let o = probe_kind(&route(&server, wire), OutcomeKind::Throughput).await;
        assert!(o.success, "{o:?}");
        assert_eq!(o.verified, Some(false), "1 2 3 is not 1..40");
        let body = requests.last().json();
        assert_eq!(body["max_tokens"], 128);
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(messages.len(), 1, "{body}");
        assert_eq!(messages[0]["role"], "user");
        assert!(messages[0]["content"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Count from 1 to 40"));
        assert!(body.get("system").is_none(), "{body}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn one_connection_is_kept_alive_per_provider() {
    // Streams included: the client reads past the end marker to the end of the body, so the
    // connection goes back to the pool instead of being torn down after every probe.
    each(&ALL, |wire| async move {
        let (server, requests) = fake(wire.path(), move |_| {
            Reply::now(wire.answer(&["PROBE_OK"], Some(3)))
        })
        .await;
        let r = route(&server, wire);
        let client = ProbeClient::new(std::slice::from_ref(&r), Arc::new(SystemClock)).unwrap();
        for _ in 0..3 {
            let o = client.probe(&r, OutcomeKind::Probe).await;
            assert!(o.success, "{wire:?}: {o:?}");
        }
        let peers: Vec<_> = requests.all().iter().map(|c| c.peer).collect();
        assert_eq!(peers.len(), 3);
        assert!(
            peers.windows(2).all(|w| w[0] == w[1]),
            "{wire:?}: connection reused: {peers:?}"
        );
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_missing_key_variable_is_a_setup_error() {
    let (server, _) = fake("/", |_| Reply::now("")).await;
    let mut r = route(&server, OPENAI_STREAM);
    r.api_key_env = Some("PROBEOK_TEST_KEY_NEVER_SET_6f1c".into());
    let err = ProbeClient::new(&[r], Arc::new(SystemClock)).unwrap_err();
    assert!(
        matches!(err, ProbeSetupError::MissingApiKey { ref var, .. } if var == "PROBEOK_TEST_KEY_NEVER_SET_6f1c")
    );
}

#[tokio::test(start_paused = true)]
async fn probe_json_has_the_cli_shape() {
    let (server, _) = fake(OPENAI_STREAM.path(), |_| {
        Reply::now(json(
            StatusCode::SERVICE_UNAVAILABLE,
            openai::error("busy", "server_error", None),
        ))
    })
    .await;
    let o = probe(&route(&server, OPENAI_STREAM)).await;
    let v = probe_json(&o);
    assert_eq!(v["route"], "fakeai/local/fake-model");
    assert_eq!(
        (
            v["provider"].as_str(),
            v["region"].as_str(),
            v["model"].as_str()
        ),
        (Some("fakeai"), Some("local"), Some("fake-model"))
    );
    assert_eq!(v["success"], false);
    assert_eq!(
        v["error"],
        serde_json::json!({"kind": "http", "status": 503, "message": "busy", "retry_after_ms": null})
    );
    for key in [
        "verified",
        "ttfb_ms",
        "ttft_ms",
        "total_ms",
        "output_tokens",
        "tokens_per_second",
        "model_reported",
    ] {
        assert!(v.get(key).is_some(), "{key} missing: {v}");
    }
}

// ---------------------------------------------------------------------------------------------
// Throughput

#[tokio::test(start_paused = true)]
async fn throughput_tokens_per_second_matches_a_known_rate() {
    // One number every 20 ms = 50 tokens/s: the 40th arrives 39 × 20 ms after the first.
    const EVERY: Duration = Duration::from_millis(20);
    const RATE: f64 = 50.0;
    each(&STREAMS, |wire| async move {
        let (server, _) = fake(wire.path(), move |_| {
            let numbers: Vec<String> = (1..=40)
                .map(|i| {
                    if i == 1 {
                        "1".to_owned()
                    } else {
                        format!(" {i}")
                    }
                })
                .collect();
            let (head, tail): (Vec<String>, Vec<String>) = match wire.kind {
                ProviderKind::Openai => (
                    vec![],
                    vec![openai::finish("stop"), openai::usage(40), openai::done()],
                ),
                ProviderKind::Anthropic => {
                    (anthropic::head(), anthropic::tail("end_turn", Some(40)))
                }
            };
            let deltas = numbers.iter().map(|n| match wire.kind {
                ProviderKind::Openai => openai::content(n),
                ProviderKind::Anthropic => anthropic::text(n),
            });
            Reply::now(
                Script::new()
                    .send_all(head)
                    .every(EVERY, deltas.collect::<Vec<_>>())
                    .send_all(tail)
                    .sse(),
            )
        })
        .await;
        let o = probe_kind(&route(&server, wire), OutcomeKind::Throughput).await;
        assert!(o.success, "{wire:?}: {o:?}");
        assert_eq!(o.kind, OutcomeKind::Throughput);
        assert_eq!(o.verified, Some(true), "{o:?}");
        assert_eq!((o.output_tokens, o.tokens_estimated), (Some(40), false));
        let tps = o.tokens_per_second.unwrap_or_default();
        assert!(
            (tps - RATE).abs() / RATE < 0.10,
            "{wire:?}: {tps} tokens/s, expected ~{RATE}: {o:?}"
        );
    })
    .await;
}
