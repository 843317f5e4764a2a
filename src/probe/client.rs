//! The probe client: sends one fixed tiny prompt (or the longer throughput prompt) to a route,
//! OpenAI-compatible or Anthropic, streaming or not, and measures it honestly.
//!
//! Timing rules (all from the moment the request is sent, on `tokio::time::Instant`):
//! - no response headers within `first_byte_timeout` → `TimeoutBeforeFirstByte`;
//! - after the headers, a stream may wait for its first answer token up to `timeout`: a
//!   provider that queues the request is slow (a slow success with its TTFT), not down;
//! - after the first answer token, no byte for longer than `stall_timeout` → `Stalled`;
//! - the whole call is bounded by `timeout`; past it while bytes still flow → `Timeout`;
//! - a non-streamed body is awaited up to the rest of `timeout`.
//!
//! A slow but complete answer inside `timeout` is a slow *success* with its latency recorded:
//! slowness is the detector's call, made against a baseline, not the client's.
//!
//! Every outcome guarantees `ttfb_ms <= ttft_ms <= first_answer_ms <= total_ms` where present. The API key is
//! read once at construction, sent as a sensitive header, and never appears in an outcome or a
//! log line (upstream messages go through [`scrub`](super::outcome::scrub)).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use tokio::time::Instant;

use super::measure::{tokens_per_second, verify_count, verify_exact};
use super::outcome::{truncate_chars, OutcomeKind, ProbeError, ProbeOutcome, MAX_ANSWER_CHARS};
use super::sse::{self, BodyFault, ReadFault};
use super::upstream::classify_status;
use super::wire::{Collected, Step, StreamDecoder};
use super::{anthropic, openai};
use crate::clock::Clock;
use crate::route::{ProviderKind, Route, RouteId};
use crate::secret::{Env, Secret};

/// A successful non-streamed body larger than this is not a probe answer.
const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Error bodies are read only for their message; the rest is dropped.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;
/// Idle pooled connections are kept this long: longer than the usual 30 s probe interval, so
/// consecutive probes reuse the connection as a real client would.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// After a stream's end marker, how long we keep reading for the end of the body. A body
/// dropped unread cannot go back to the pool, and every streamed probe would then pay a new
/// TCP+TLS handshake in its ttfb. Not counted in `total_ms`; upstreams end the body right
/// after `[DONE]`/`message_stop`, so this is normally a few microseconds.
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// Why a [`ProbeClient`] could not be built. A bad setup never starts half a prober.
#[derive(Debug, thiserror::Error)]
pub enum ProbeSetupError {
    /// The route names a key variable that is unset or empty in this process.
    #[error("provider {provider}: environment variable {var} (api_key_env) is unset or empty")]
    MissingApiKey { provider: String, var: String },
    /// Two routes of one provider name different key variables; one client per provider
    /// cannot serve both.
    #[error("provider {provider}: routes name different api_key_env variables")]
    InconsistentApiKeyEnv { provider: String },
    #[error("provider {provider}: cannot build the HTTP client: {message}")]
    Client { provider: String, message: String },
}

/// Who says a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One message of a conversation sent with [`ProbeClient::chat`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
        }
    }

    /// `[system, user]`, the system message left out when empty (the probe's shape).
    pub fn pair(system: &str, user: &str) -> Vec<ChatMessage> {
        let mut out = Vec::with_capacity(2);
        if !system.is_empty() {
            out.push(ChatMessage::new(Role::System, system));
        }
        out.push(ChatMessage::new(Role::User, user));
        out
    }
}

/// An arbitrary request for [`ProbeClient::chat`]: messages and sampling parameters, with the
/// same two clocks as a probe (no headers by `first_byte_timeout`, or a stream silent that
/// long, fails; the whole call is bounded by `timeout`).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub max_tokens: u32,
    pub temperature: f64,
    pub stream: bool,
    pub timeout: Duration,
    pub first_byte_timeout: Duration,
}

/// What one [`ProbeClient::chat`] call returned.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatOutcome {
    pub route: RouteId,
    pub started_at: DateTime<Utc>,
    pub total_ms: f64,
    pub ttft_ms: Option<f64>,
    pub http_status: Option<u16>,
    /// The API's usage when reported, else our estimate.
    pub output_tokens: Option<u32>,
    pub model_reported: Option<String>,
    pub system_fingerprint: Option<String>,
    /// `None`: a complete answer (transport and protocol succeeded).
    pub error: Option<ProbeError>,
    /// The visible answer, untrimmed (what arrived, even on failure).
    pub text: String,
}

/// What [`ProbeClient::call`] sends: a probe and a chat request alike.
struct Call {
    messages: Vec<ChatMessage>,
    max_tokens: u32,
    temperature: f64,
    stream: bool,
    timeout: Duration,
    first_byte_timeout: Duration,
    stall_timeout: Duration,
}

/// One provider's connection pool and key.
#[derive(Debug, Clone)]
struct Provider {
    http: reqwest::Client,
    key_env: Option<String>,
    key: Option<Secret>,
}

/// Probes routes. Holds one keep-alive `reqwest::Client` per provider and each provider's key.
/// Cheap to clone (the pools are shared).
#[derive(Clone)]
pub struct ProbeClient {
    providers: HashMap<String, Provider>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for ProbeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeClient")
            .field("providers", &self.providers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ProbeClient {
    /// Builds one HTTP client per provider among `routes` and reads each provider's key from
    /// the variable named by `api_key_env` (no variable named: requests go without a key,
    /// e.g. to the simulator). `clock` stamps `started_at` and resolves `Retry-After` dates.
    pub fn new(routes: &[Route], clock: Arc<dyn Clock>) -> Result<Self, ProbeSetupError> {
        Self::with_env(routes, clock, &Env::process())
    }

    /// [`Self::new`] with the keys' variables read from `env`.
    pub fn with_env(
        routes: &[Route],
        clock: Arc<dyn Clock>,
        env: &Env,
    ) -> Result<Self, ProbeSetupError> {
        let mut providers: HashMap<String, Provider> = HashMap::new();
        for route in routes {
            if let Some(p) = providers.get(&route.provider) {
                if p.key_env != route.api_key_env {
                    return Err(ProbeSetupError::InconsistentApiKeyEnv {
                        provider: route.provider.clone(),
                    });
                }
                continue;
            }
            let key = route
                .api_key_env
                .as_ref()
                .map(|var| {
                    env.secret(var)
                        .ok_or_else(|| ProbeSetupError::MissingApiKey {
                            provider: route.provider.clone(),
                            var: var.clone(),
                        })
                })
                .transpose()?;
            let http = reqwest::Client::builder()
                .user_agent(concat!("probeok/", env!("CARGO_PKG_VERSION")))
                // An LLM API that redirects a POST is misconfigured; report the 3xx instead
                // of following it (and carrying our key elsewhere).
                .redirect(reqwest::redirect::Policy::none())
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .tcp_keepalive(Duration::from_secs(30))
                .tcp_nodelay(true)
                .build()
                .map_err(|e| ProbeSetupError::Client {
                    provider: route.provider.clone(),
                    message: sse::describe_reqwest(e),
                })?;
            providers.insert(
                route.provider.clone(),
                Provider {
                    http,
                    key_env: route.api_key_env.clone(),
                    key,
                },
            );
        }
        Ok(Self { providers, clock })
    }

    /// Probes `route` once. `kind` is `Probe` (the `PROBE_OK` prompt) or `Throughput` (count
    /// 1..40); `Passive` is not something a prober sends and is treated as `Probe`.
    /// Never fails: every failure is a classified [`ProbeOutcome`].
    pub async fn probe(&self, route: &Route, kind: OutcomeKind) -> ProbeOutcome {
        let kind = match kind {
            OutcomeKind::Throughput => OutcomeKind::Throughput,
            OutcomeKind::Probe | OutcomeKind::Passive => OutcomeKind::Probe,
        };
        let started_at = self.clock.now();
        let mut run = Run::new(Instant::now());
        let s = &route.probe;
        let (system, user, max_tokens) = match kind {
            OutcomeKind::Throughput => ("", s.throughput_prompt.as_str(), s.throughput_max_tokens),
            _ => (s.system.as_str(), s.user.as_str(), s.max_tokens),
        };
        let call = Call {
            messages: ChatMessage::pair(system, user),
            max_tokens,
            temperature: 0.0,
            stream: s.stream,
            timeout: s.timeout,
            first_byte_timeout: s.first_byte_timeout,
            stall_timeout: s.stall_timeout,
        };
        let (collected, result) = self.dispatch(route, &call, &mut run).await;
        let total_ms = run.end.unwrap_or_else(|| run.now_ms());
        let outcome = assemble(route, kind, started_at, &run, total_ms, &collected, result);
        tracing::debug!(
            route = %route.id,
            kind = kind.as_str(),
            success = outcome.success,
            error = outcome.error.as_ref().map(ProbeError::kind),
            total_ms = outcome.total_ms,
            "probe finished"
        );
        outcome
    }

    /// Sends any conversation to `route` with the route's key and connection pool, under the
    /// same timing rules and classification as a probe (regression sets use it). The answer is
    /// kept whole (up to 64 KiB), not bounded like a probe's evidence. Never fails: every
    /// failure is a classified [`ChatOutcome::error`].
    pub async fn chat(&self, route: &Route, request: &ChatRequest) -> ChatOutcome {
        let started_at = self.clock.now();
        let mut run = Run::new(Instant::now());
        let call = Call {
            messages: request.messages.clone(),
            max_tokens: request.max_tokens,
            temperature: request.temperature,
            stream: request.stream,
            timeout: request.timeout,
            first_byte_timeout: request.first_byte_timeout.min(request.timeout),
            stall_timeout: route.probe.stall_timeout,
        };
        let (collected, result) = self.dispatch(route, &call, &mut run).await;
        let total_ms = run.end.unwrap_or_else(|| run.now_ms());
        ChatOutcome {
            route: route.id.clone(),
            started_at,
            total_ms,
            ttft_ms: run.ttft.map(|t| t.min(total_ms)),
            http_status: run.status,
            output_tokens: collected.output_tokens().map(|(n, _)| n),
            model_reported: collected.model.clone(),
            system_fingerprint: collected.system_fingerprint.clone(),
            error: result.err(),
            text: collected.text,
        }
    }

    /// The provider's pooled HTTP client and key (the embeddings probe shares both), and the
    /// clock that stamps outcomes.
    pub(super) fn provider_http(
        &self,
        provider: &str,
    ) -> Option<(&reqwest::Client, Option<&Secret>, &Arc<dyn Clock>)> {
        let p = self.providers.get(provider)?;
        Some((&p.http, p.key.as_ref(), &self.clock))
    }

    async fn dispatch(
        &self,
        route: &Route,
        call: &Call,
        run: &mut Run,
    ) -> (Collected, Result<(), ProbeError>) {
        match self.providers.get(&route.provider) {
            Some(p) => self.call(p, route, call, run).await,
            None => (
                Collected::default(),
                Err(ProbeError::Connect {
                    message: format!(
                        "no HTTP client for provider {}: the route was not given to ProbeClient::new",
                        route.provider
                    ),
                }),
            ),
        }
    }

    async fn call(
        &self,
        provider: &Provider,
        route: &Route,
        s: &Call,
        run: &mut Run,
    ) -> (Collected, Result<(), ProbeError>) {
        let base = route.base_url.trim_end_matches('/');
        let mut request = match route.kind {
            ProviderKind::Openai => {
                let body = openai::chat_body(
                    &route.model,
                    &s.messages,
                    s.max_tokens,
                    s.temperature,
                    s.stream,
                );
                let mut req = provider
                    .http
                    .post(format!("{base}/chat/completions"))
                    .json(&body);
                if let Some(key) = &provider.key {
                    req = req.header(
                        AUTHORIZATION,
                        secret_header(&format!("Bearer {}", key.expose())),
                    );
                }
                req
            }
            ProviderKind::Anthropic => {
                let body = anthropic::chat_body(
                    &route.model,
                    &s.messages,
                    s.max_tokens,
                    s.temperature,
                    s.stream,
                );
                let mut req = provider
                    .http
                    .post(format!("{base}/v1/messages"))
                    .header("anthropic-version", anthropic::ANTHROPIC_VERSION)
                    .json(&body);
                if let Some(key) = &provider.key {
                    req = req.header("x-api-key", secret_header(key.expose()));
                }
                req
            }
        };
        request = request.header(
            ACCEPT,
            if s.stream {
                "text/event-stream"
            } else {
                "application/json"
            },
        );

        let deadline = run.start + s.timeout;
        let first_byte_deadline = (run.start + s.first_byte_timeout).min(deadline);
        let response = match tokio::time::timeout_at(first_byte_deadline, request.send()).await {
            Err(_) => {
                return (
                    Collected::default(),
                    Err(ProbeError::TimeoutBeforeFirstByte),
                )
            }
            // No HTTP exchange completed: refused, DNS, TLS, or closed before a response.
            Ok(Err(e)) => {
                return (
                    Collected::default(),
                    Err(ProbeError::Connect {
                        message: sse::describe_reqwest(e),
                    }),
                )
            }
            Ok(Ok(r)) => r,
        };
        let headers_at = Instant::now();
        run.ttfb = Some(run.ms(headers_at));
        let status = response.status();
        run.status = Some(status.as_u16());
        // Every answer, a 429 included, tells the account's headroom.
        run.ratelimit = crate::ratelimit::RateLimits::from_headers(response.headers());

        if !status.is_success() {
            let headers = response.headers().clone();
            let bytes =
                sse::guarded_bytes(response.bytes_stream(), headers_at, s.timeout, deadline);
            // A slow or cut error body still leaves the status to classify by.
            let (body, _, _) = sse::read_body(bytes, MAX_ERROR_BODY_BYTES).await;
            let error = classify_status(status.as_u16(), &headers, &body, self.clock.now());
            return (Collected::default(), Err(error));
        }

        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.to_ascii_lowercase().contains("json"));
        // Asked to stream but answered with one JSON document (some gateways do, and error
        // envelopes often come so): read it as a body.
        if s.stream && !is_json {
            let armed = Arc::new(AtomicBool::new(false));
            let silence = sse::Silence::AfterArmed {
                max: s.stall_timeout,
                armed: armed.clone(),
            };
            let bytes =
                sse::guarded_bytes_with(response.bytes_stream(), headers_at, silence, deadline);
            match route.kind {
                ProviderKind::Openai => {
                    read_stream(openai::OpenAiStream::default(), bytes, run, &armed).await
                }
                ProviderKind::Anthropic => {
                    read_stream(anthropic::AnthropicStream::default(), bytes, run, &armed).await
                }
            }
        } else {
            // Non-streamed: the body may take the rest of `timeout`, silences included.
            let bytes =
                sse::guarded_bytes(response.bytes_stream(), headers_at, s.timeout, deadline);
            let (body, fault, too_large) = sse::read_body(bytes, MAX_BODY_BYTES).await;
            let read_at = run.now_ms();
            run.end = Some(read_at);
            match fault {
                Some(BodyFault::Timeout | BodyFault::Stalled) => {
                    return (Collected::default(), Err(ProbeError::Timeout))
                }
                Some(BodyFault::Cut(_)) => {
                    return (Collected::default(), Err(ProbeError::Truncated))
                }
                None if too_large => {
                    return (
                        Collected::default(),
                        Err(ProbeError::Malformed {
                            message: format!("body larger than {MAX_BODY_BYTES} bytes"),
                        }),
                    )
                }
                None => {}
            }
            let parsed = match route.kind {
                ProviderKind::Openai => openai::parse_body(&body),
                ProviderKind::Anthropic => anthropic::parse_body(&body),
            };
            match parsed {
                Ok(c) => {
                    if c.has_content() {
                        run.ttft = Some(read_at);
                    }
                    if !c.text.is_empty() {
                        run.first_answer = Some(read_at);
                    }
                    (c, Ok(()))
                }
                Err(e) => (Collected::default(), Err(e)),
            }
        }
    }
}

/// Reads SSE events into `decoder` until its end marker, the end of the body, or a fault.
/// `stall_armed` is set at the first answer token: from then on a silence is a stall.
async fn read_stream<D: StreamDecoder>(
    mut decoder: D,
    bytes: impl futures_util::Stream<Item = Result<bytes::Bytes, BodyFault>> + Send,
    run: &mut Run,
    stall_armed: &AtomicBool,
) -> (Collected, Result<(), ProbeError>) {
    let mut events = std::pin::pin!(sse::events(bytes));
    let error = loop {
        match events.next().await {
            Some(Ok(event)) => {
                let step = decoder.feed(&event);
                if run.ttft.is_none() && decoder.collected().has_content() {
                    run.ttft = Some(run.now_ms());
                }
                if run.first_answer.is_none() && !decoder.collected().text.is_empty() {
                    run.first_answer = Some(run.now_ms());
                    stall_armed.store(true, Ordering::Relaxed);
                }
                match step {
                    Ok(Step::Continue) => {}
                    Ok(Step::Done) => {
                        run.end = Some(run.now_ms());
                        // Whatever follows the end marker cannot change the verdict.
                        let drain = async { while events.next().await.is_some() {} };
                        let _ = tokio::time::timeout(DRAIN_GRACE, drain).await;
                        break None;
                    }
                    Err(e) => break Some(e),
                }
            }
            // A clean end of body or a cut connection: the decoder's end rules decide whether
            // what arrived was complete (`Truncated` otherwise).
            None => break None,
            Some(Err(ReadFault::Body(BodyFault::Cut(reason)))) => {
                tracing::debug!(%reason, "stream cut");
                break None;
            }
            Some(Err(ReadFault::Body(BodyFault::Stalled))) => break Some(ProbeError::Stalled),
            Some(Err(ReadFault::Body(BodyFault::Timeout))) => break Some(ProbeError::Timeout),
            Some(Err(ReadFault::Framing(message))) => {
                break Some(ProbeError::Malformed {
                    message: super::outcome::scrub(&message),
                })
            }
        }
    };
    let result = match error {
        Some(e) => Err(e),
        None => decoder.finish(),
    };
    (decoder.into_collected(), result)
}

/// A header value that hyper never logs or prints (`set_sensitive`). A key with characters a
/// header cannot carry is sent as an empty value: the upstream answers 401, which names the
/// problem without echoing the key.
pub(super) fn secret_header(value: &str) -> HeaderValue {
    let mut v = HeaderValue::from_str(value).unwrap_or_else(|_| HeaderValue::from_static(""));
    v.set_sensitive(true);
    v
}

/// Timestamps of one call, in ms since the request was sent.
#[derive(Debug)]
struct Run {
    start: Instant,
    ttfb: Option<f64>,
    ttft: Option<f64>,
    /// The first answer token (`ttft` counts reasoning tokens too).
    first_answer: Option<f64>,
    status: Option<u16>,
    /// When the answer was complete, if that is earlier than the call's return: a body once
    /// read (parsing it is our time, not the upstream's), a stream at its end marker (the
    /// drain after it is ours too).
    end: Option<f64>,
    /// The account's rate-limit headroom the answer's headers announced.
    ratelimit: Option<crate::ratelimit::RateLimits>,
}

impl Run {
    fn new(start: Instant) -> Self {
        Self {
            start,
            ttfb: None,
            ttft: None,
            first_answer: None,
            status: None,
            end: None,
            ratelimit: None,
        }
    }

    fn ms(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64() * 1000.0
    }

    fn now_ms(&self) -> f64 {
        self.ms(Instant::now())
    }
}

/// Turns what a call measured into the outcome, enforcing `ttfb <= ttft <= total`.
fn assemble(
    route: &Route,
    kind: OutcomeKind,
    started_at: DateTime<Utc>,
    run: &Run,
    total_ms: f64,
    collected: &Collected,
    result: Result<(), ProbeError>,
) -> ProbeOutcome {
    let success = result.is_ok();
    let ttfb_ms = run.ttfb.map(|t| t.min(total_ms));
    let ttft_ms = run
        .ttft
        .map(|t| t.max(ttfb_ms.unwrap_or(0.0)).min(total_ms));
    // The first answer token is a generated token too: never before `ttft`.
    let first_answer_ms = run
        .first_answer
        .map(|t| t.max(ttft_ms.unwrap_or(0.0)).min(total_ms));
    let tokens = collected.output_tokens();
    let tokens_per_second = match (success, tokens, ttft_ms) {
        (true, Some((n, _)), Some(ttft)) => tokens_per_second(n, ttft, total_ms),
        _ => None,
    };
    let answer = collected.text.trim();
    let verified = success.then(|| match kind {
        OutcomeKind::Throughput => verify_count(answer),
        _ => verify_exact(answer, &route.probe.expect),
    });
    ProbeOutcome {
        route: route.id.clone(),
        kind,
        started_at,
        success,
        attributed_to: None,
        verified,
        ttfb_ms,
        ttft_ms,
        total_ms,
        output_tokens: tokens.map(|(n, _)| n),
        tokens_estimated: tokens.is_some_and(|(_, estimated)| estimated),
        tokens_per_second,
        model_reported: collected.model.clone(),
        system_fingerprint: collected.system_fingerprint.clone(),
        http_status: run.status,
        error: result.err(),
        answer: (!answer.is_empty()).then(|| truncate_chars(answer, MAX_ANSWER_CHARS)),
        first_answer_ms,
        max_tokens_exhausted: success && collected.length_cut && answer.is_empty(),
        ratelimit: run.ratelimit.clone(),
    }
}

/// One line of `probeok probe --json` (docs/http-api.md): `{"route","provider","region","model","success",
/// "verified","ttfb_ms","ttft_ms","first_answer_ms","total_ms","output_tokens",
/// "tokens_per_second","model_reported","max_tokens_exhausted",
/// "error":null|{"kind","status","message","retry_after_ms"}}`.
pub fn probe_json(outcome: &ProbeOutcome) -> serde_json::Value {
    let (provider, region, model) = outcome.route.split();
    serde_json::json!({
        "route": outcome.route.as_str(),
        "provider": provider,
        "region": region,
        "model": model,
        "success": outcome.success,
        "verified": outcome.verified,
        "ttfb_ms": outcome.ttfb_ms,
        "ttft_ms": outcome.ttft_ms,
        "first_answer_ms": outcome.first_answer_ms,
        "total_ms": outcome.total_ms,
        "output_tokens": outcome.output_tokens,
        "tokens_per_second": outcome.tokens_per_second,
        "model_reported": outcome.model_reported,
        "max_tokens_exhausted": outcome.max_tokens_exhausted,
        "error": outcome.error.as_ref().map(ProbeError::to_json),
    })
}
