//! One attempt at one candidate, and what its failure means for the request.
//!
//! - [`class_of`] (pure): the failover classes. Transient faults (connect/DNS/TLS, no first
//!   event in time, 408, 429, 5xx, 529, a broken 200 answer) and the route's own faults
//!   (401/402/403/404: our key, account or model name) move on; the client's faults (400, 413,
//!   422, other 4xx, content-policy refusals) are returned as they are.
//! - [`Upstream::attempt`]: sends the request with the route's own model name and our key,
//!   under the per-candidate budget. A non-streamed answer is read whole (it can still fail
//!   over); a stream is read up to its first SSE `data:` event — the commit point — within
//!   `min(first_byte_timeout, budget)`, and then handed to [`super::stream`] unread.
//! - [`Rests`]: routes resting after a 429 until their `Retry-After`.
//! - [`PassiveSink`]: every attempt's outcome, to detection, never blocking the client path.
//!
//! Upstream error bodies and errors are classified with `probe::upstream`, answers and streams
//! read with `probe::openai`/`probe::sse`: the proxy and the probes judge upstreams alike.

use rustc_hash::FxBuildHasher;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures_util::{Stream, StreamExt};
use http::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use sse_parse::Event;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::probe::answer::read_answer;
use crate::probe::measure::tokens_per_second;
use crate::probe::openai::OpenAiStream;
use crate::probe::sse::{self, BodyFault, ReadFault};
use crate::probe::upstream::classify_status;
use crate::probe::wire::{Collected, Step, StreamDecoder};
use crate::probe::{OutcomeKind, ProbeError, ProbeOutcome};
use crate::route::{Route, RouteId, RouteMap};
use crate::secret::{Env, Secret};

use super::record::Usage;
use super::transport::{Reply, Target, Transport, TransportError};

/// A successful non-streamed answer larger than this is refused (and the next candidate tried).
pub const MAX_ANSWER_BYTES: usize = 32 * 1024 * 1024;
/// Error bodies are read for their message and returned to the client when they are its fault.
const MAX_ERROR_BODY_BYTES: usize = 256 * 1024;
/// A 429 without `Retry-After` rests the route this long.
pub const DEFAULT_REST: Duration = Duration::from_secs(1);
/// A `Retry-After` longer than this is capped: a bogus header must not bench a route for days.
pub const MAX_REST: Duration = Duration::from_secs(600);

/// What a failure means for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Try the next candidate.
    Transient,
    /// Our key, account or model name is wrong at this route: next candidate, alert-worthy.
    RouteFault,
    /// The request itself is at fault: returned as it is, never tried elsewhere.
    ClientFault,
}

impl Class {
    /// The class as logs show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::RouteFault => "route_fault",
            Self::ClientFault => "client_fault",
        }
    }
}

/// The failover classes over the probe's error classification (the table in
/// `docs/http-api.md`).
pub fn class_of(e: &ProbeError) -> Class {
    match e {
        ProbeError::Refused { .. } => Class::ClientFault,
        ProbeError::Http { status, .. } => match *status {
            401..=404 => Class::RouteFault,
            408 | 429 => Class::Transient,
            s if (400..500).contains(&s) => Class::ClientFault,
            _ => Class::Transient, // 5xx, 529, anything unexpected
        },
        ProbeError::Connect { .. }
        | ProbeError::TimeoutBeforeFirstByte
        | ProbeError::Stalled
        | ProbeError::Timeout
        | ProbeError::RateLimited { .. }
        | ProbeError::Malformed { .. }
        | ProbeError::Truncated => Class::Transient,
    }
}

/// The stable code of a failover reason (`x-probeok-fallback-reason`): `http_503`,
/// `rate_limited`, `timeout_before_first_byte`, `connect`, …
pub fn reason_code(e: &ProbeError) -> String {
    match e {
        ProbeError::Http { status, .. } => format!("http_{status}"),
        other => other.kind().to_owned(),
    }
}

/// Routes resting after a 429. Keys are configured route ids only, so the map is bounded by
/// the number of routes; expired entries are pruned on every insert.
#[derive(Debug, Default)]
pub struct Rests(Mutex<RouteMap<Instant>>);

impl Rests {
    /// Rests `route` for `for_` (capped at [`MAX_REST`]); a later end never shortens.
    pub fn rest(&self, route: &RouteId, for_: Duration, now: Instant) {
        let until = now + for_.min(MAX_REST);
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, t| *t > now);
        let e = map.entry(route.clone()).or_insert(until);
        if *e < until {
            *e = until;
        }
    }

    pub fn is_resting(&self, route: &RouteId, now: Instant) -> bool {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(route).is_some_and(|t| *t > now)
    }

    /// The soonest end of a rest among `routes`, from `now`.
    pub fn soonest_end(&self, routes: &[RouteId], now: Instant) -> Option<Duration> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        routes
            .iter()
            .filter_map(|r| map.get(r))
            .filter(|t| **t > now)
            .map(|t| *t - now)
            .min()
    }
}

/// Where passive outcomes go. `try_send`: the client's request never waits for detection. A
/// full queue (4096 outcomes behind) means the store is already far behind; dropping passive
/// evidence then costs less than adding latency to live traffic. Drops are counted and logged.
#[derive(Debug, Clone)]
pub struct PassiveSink {
    tx: mpsc::Sender<ProbeOutcome>,
    dropped: Arc<AtomicU64>,
}

impl PassiveSink {
    pub fn new(tx: mpsc::Sender<ProbeOutcome>) -> Self {
        Self {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn send(&self, outcome: ProbeOutcome) {
        if let Err(e) = self.tx.try_send(outcome) {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                let why = match e {
                    mpsc::error::TrySendError::Full(_) => "queue full",
                    mpsc::error::TrySendError::Closed(_) => "queue closed",
                };
                tracing::warn!(dropped = n, why, "passive outcomes dropped");
            }
        }
    }

    /// Outcomes dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Times of one attempt.
#[derive(Debug, Clone)]
pub struct Timing {
    pub start: Instant,
    pub started_at: DateTime<Utc>,
    /// Response headers.
    pub ttfb: Option<Instant>,
    /// First generated content.
    pub ttft: Option<Instant>,
    /// The account's rate-limit headroom the upstream's answer announced.
    pub ratelimit: Option<crate::ratelimit::RateLimits>,
}

impl Timing {
    fn ms(&self, t: Instant) -> f64 {
        (t - self.start).as_secs_f64() * 1000.0
    }

    /// The passive outcome of this attempt, ended at `end`.
    pub(crate) fn outcome(
        &self,
        route: &RouteId,
        end: Instant,
        http_status: Option<u16>,
        error: Option<ProbeError>,
        collected: Option<&Collected>,
    ) -> ProbeOutcome {
        let total_ms = self.ms(end);
        let ttfb_ms = self.ttfb.map(|t| self.ms(t));
        let ttft_ms = self.ttft.map(|t| self.ms(t));
        let tokens = collected.and_then(Collected::output_tokens);
        ProbeOutcome {
            route: route.clone(),
            kind: OutcomeKind::Passive,
            started_at: self.started_at,
            success: error.is_none(),
            attributed_to: None,
            verified: None,
            ttfb_ms,
            ttft_ms,
            total_ms,
            output_tokens: tokens.map(|(n, _)| n),
            tokens_estimated: tokens.is_some_and(|(_, est)| est),
            tokens_per_second: tokens
                .zip(ttft_ms)
                .and_then(|((n, _), ttft)| tokens_per_second(n, ttft, total_ms)),
            model_reported: collected.and_then(|c| c.model.clone()),
            system_fingerprint: collected.and_then(|c| c.system_fingerprint.clone()),
            http_status,
            error,
            // Real answers are the client's data: never kept.
            answer: None,
            first_answer_ms: None,
            max_tokens_exhausted: false,
            ratelimit: self.ratelimit.clone(),
        }
    }
}

/// SSE events of a committed upstream stream.
pub(crate) type Events = Pin<Box<dyn Stream<Item = Result<Event, ReadFault>> + Send>>;

/// A stream past its commit point: the first event arrived and was accepted.
pub struct Committed {
    pub(crate) route: Arc<Route>,
    pub(crate) timing: Timing,
    pub(crate) first: Event,
    pub(crate) first_step: Step,
    /// The first event was the client's fault (a content-policy refusal, an embedded 400):
    /// forwarded as is, then the stream ends.
    pub(crate) client_fault: Option<ProbeError>,
    pub(crate) decoder: OpenAiStream,
    pub(crate) events: Events,
}

/// How one attempt ended.
pub enum Attempt {
    /// A complete non-streamed answer (possibly a refusal, which is the client's answer too)
    /// and the usage it reports.
    Answer {
        body: Bytes,
        usage: Usage,
        outcome: ProbeOutcome,
    },
    /// The client's fault, returned as it is.
    ClientError {
        status: u16,
        content_type: HeaderValue,
        body: Bytes,
        outcome: ProbeOutcome,
    },
    /// A stream past its commit point.
    Committed(Box<Committed>),
    /// Move on to the next candidate.
    Failed {
        error: ProbeError,
        outcome: ProbeOutcome,
    },
}

/// The HTTP side of attempts: the upstream transport, the providers' keys.
pub struct Upstream {
    /// Its own connection pool: a proxy worker's connections live on its own runtime.
    http: Transport,
    /// What every worker's `Upstream` shares.
    known: Arc<Known>,
}

/// The keys and targets, read once at start.
struct Known {
    /// Provider id → key, read from `api_key_env` once at start.
    keys: HashMap<String, Secret, FxBuildHasher>,
    /// Provider id → its `Authorization` value (marked sensitive), built once.
    auth: HashMap<String, HeaderValue, FxBuildHasher>,
    /// Route → where its chat completions go, decided once.
    targets: RouteMap<Target>,
}

/// The client's body with the route's own model name, serialised without copying the body
/// first (the keys keep their order).
struct WithModel<'a> {
    body: &'a serde_json::Value,
    model: &'a str,
}

impl serde::Serialize for WithModel<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Some(map) = self.body.as_object() else {
            return self.body.serialize(s);
        };
        let mut out = s.serialize_map(Some(map.len() + usize::from(!map.contains_key("model"))))?;
        let mut seen = false;
        for (k, v) in map {
            if k == "model" {
                seen = true;
                out.serialize_entry(k, self.model)?;
            } else {
                out.serialize_entry(k, v)?;
            }
        }
        if !seen {
            out.serialize_entry("model", self.model)?;
        }
        out.end()
    }
}

/// The request as the proxy will send it: the client's body, parsed once.
pub struct Outgoing<'a> {
    pub body: &'a serde_json::Value,
    pub stream: bool,
    pub request_id: &'a str,
    /// The attempt's `traceparent` and the caller's `tracestate`, when traced.
    pub trace: Option<&'a (HeaderValue, Option<HeaderValue>)>,
}

/// Limits of one attempt.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// This candidate's share of the remaining total time.
    pub budget: Duration,
    /// Streams: the first `data:` event within this (the route's override already applied).
    pub first_byte_timeout: Duration,
    /// Streams after the commit point: the longest silence tolerated.
    pub stream_idle_timeout: Duration,
    /// Streams: the longest they may last, from the response headers.
    pub max_stream_duration: Duration,
}

impl Upstream {
    /// One HTTP client for every upstream; each provider's key read from `env` now.
    pub fn new(routes: &[Arc<Route>], env: &Env) -> Result<Self, TransportError> {
        let http = Transport::new()?;
        let mut keys = HashMap::default();
        let mut targets = RouteMap::default();
        for r in routes {
            if let Some(var) = &r.api_key_env {
                if let Some(key) = env.secret(var) {
                    keys.insert(r.provider.clone(), key);
                }
            }
            if let Some(target) = http.target(&upstream_url(r)) {
                targets.insert(r.id.clone(), target);
            }
        }
        let auth = (keys.iter())
            .filter_map(|(provider, key)| {
                let mut v = HeaderValue::from_str(&format!("Bearer {}", key.expose())).ok()?;
                v.set_sensitive(true);
                Some((provider.clone(), v))
            })
            .collect();
        Ok(Self {
            http,
            known: Arc::new(Known {
                keys,
                auth,
                targets,
            }),
        })
    }

    /// The same keys and targets with a pool of its own, for a proxy worker: connections
    /// are made on (and stay with) the runtime of the worker that sends through them.
    pub fn for_worker(&self) -> Result<Self, TransportError> {
        Ok(Self {
            http: Transport::new()?,
            known: self.known.clone(),
        })
    }

    /// One attempt at `route` (see the module docs).
    pub async fn attempt(
        &self,
        route: &Arc<Route>,
        req: &Outgoing<'_>,
        limits: Limits,
        started_at: DateTime<Utc>,
    ) -> Attempt {
        let start = Instant::now();
        let mut call = Call {
            route,
            key: self.known.keys.get(&route.provider),
            timing: Timing {
                start,
                started_at,
                ttfb: None,
                ttft: None,
                ratelimit: None,
            },
            budget: limits.budget,
            deadline: start + limits.budget,
        };
        // Streams: the watchdog's target is the first event, within the budget too.
        let first_deadline = if req.stream {
            start + limits.budget.min(limits.first_byte_timeout)
        } else {
            call.deadline
        };
        let (request, via_proxy) = match self.request(route, req) {
            Ok(r) => r,
            Err(error) => return call.fail(None, error),
        };
        let sent = self.http.send(request, via_proxy);
        let response = match tokio::time::timeout_at(first_deadline, sent).await {
            Err(_) => return call.fail(None, ProbeError::TimeoutBeforeFirstByte),
            Ok(Err(message)) => return call.fail(None, ProbeError::Connect { message }),
            Ok(Ok(r)) => r,
        };
        let headers_at = Instant::now();
        call.timing.ttfb = Some(headers_at);
        // Every answer, a 429 included, tells the account's headroom.
        call.timing.ratelimit = crate::ratelimit::RateLimits::from_headers(&response.headers);
        if !response.status.is_success() {
            call.refused(response, headers_at).await
        } else if !req.stream {
            call.answer(response, headers_at).await
        } else {
            let idle = limits.stream_idle_timeout;
            let end = headers_at + limits.max_stream_duration;
            call.commit(response, headers_at, first_deadline, idle, end)
                .await
        }
    }

    /// The upstream request (the route's own model name, our key, the client's request id),
    /// and whether it goes through a proxy.
    fn request(
        &self,
        route: &Route,
        req: &Outgoing<'_>,
    ) -> Result<(http::Request<Bytes>, bool), ProbeError> {
        // A route only ever receives its own upstream model name.
        let with_model = WithModel {
            body: req.body,
            model: &route.model,
        };
        let body = serde_json::to_vec(&with_model).map_err(|e| ProbeError::Malformed {
            message: format!("cannot encode the request: {e}"),
        })?;
        let accept = if req.stream {
            HeaderValue::from_static("text/event-stream")
        } else {
            HeaderValue::from_static("application/json")
        };
        let Some(target) = self.known.targets.get(&route.id) else {
            return Err(ProbeError::Connect {
                message: "the route's base_url is not a valid URL".into(),
            });
        };
        let request_id =
            HeaderValue::from_str(req.request_id).map_err(|_| ProbeError::Malformed {
                message: "cannot encode the request id as a header".into(),
            })?;
        let mut request = http::Request::post(target.uri.clone())
            .body(Bytes::from(body))
            .map_err(|e| ProbeError::Malformed {
                message: format!("cannot encode the request: {e}"),
            })?;
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, accept);
        headers.insert("x-request-id", request_id);
        if let Some((parent, state)) = req.trace {
            headers.insert("traceparent", parent.clone());
            if let Some(state) = state {
                headers.insert("tracestate", state.clone());
            }
        }
        if let Some(v) = self.known.auth.get(&route.provider) {
            headers.insert(AUTHORIZATION, v.clone());
        }
        Ok((request, target.via_proxy))
    }
}

/// Where a route's chat completions are sent.
/// Where a route's requests go: chat completions, or embeddings for an embeddings route.
fn upstream_url(route: &Route) -> String {
    match route.embedding {
        None => format!("{}/chat/completions", route.base_url),
        Some(_) => format!("{}/embeddings", route.base_url),
    }
}

/// One attempt under way: its route, our key there, its times and its budget.
struct Call<'a> {
    route: &'a Arc<Route>,
    key: Option<&'a Secret>,
    timing: Timing,
    budget: Duration,
    deadline: Instant,
}

impl Call<'_> {
    fn fail(&self, status: Option<u16>, error: ProbeError) -> Attempt {
        let outcome = (self.timing).outcome(
            &self.route.id,
            Instant::now(),
            status,
            Some(error.clone()),
            None,
        );
        Attempt::Failed { error, outcome }
    }

    /// A non-2xx answer: the client's fault is returned as it is (without our key), anything
    /// else fails over.
    async fn refused(&self, response: Reply, headers_at: Instant) -> Attempt {
        let status = response.status.as_u16();
        let headers = response.headers;
        let content_type = headers
            .get(CONTENT_TYPE)
            .cloned()
            .unwrap_or(HeaderValue::from_static("application/json"));
        let bytes = sse::guarded_bytes(response.body, headers_at, self.budget, self.deadline);
        let (raw, _, _) = sse::read_body(bytes, MAX_ERROR_BODY_BYTES).await;
        let error = classify_status(status, &headers, &raw, Utc::now());
        if class_of(&error) != Class::ClientFault {
            return self.fail(Some(status), error);
        }
        let outcome = (self.timing).outcome(
            &self.route.id,
            Instant::now(),
            Some(status),
            Some(error),
            None,
        );
        Attempt::ClientError {
            status,
            content_type,
            body: redact(raw, self.key),
            outcome,
        }
    }

    /// A non-streamed 2xx answer, read whole within the budget (it can still fail over).
    async fn answer(&mut self, response: Reply, headers_at: Instant) -> Attempt {
        let status = response.status.as_u16();
        let bytes = sse::guarded_bytes(response.body, headers_at, self.budget, self.deadline);
        let (raw, fault, too_large) = sse::read_body(bytes, MAX_ANSWER_BYTES).await;
        let error = match fault {
            Some(BodyFault::Timeout | BodyFault::Stalled) => Some(ProbeError::Timeout),
            Some(BodyFault::Cut(_)) => Some(ProbeError::Truncated),
            None if too_large => Some(ProbeError::Malformed {
                message: format!("answer larger than {MAX_ANSWER_BYTES} bytes"),
            }),
            None => None,
        };
        if let Some(error) = error {
            return self.fail(Some(status), error);
        }
        let end = Instant::now();
        let id = &self.route.id;
        if self.route.embedding.is_some() {
            // Vectors have no first token: the outcome has a first byte and a total.
            return match super::embeddings::read_answer(&raw) {
                Ok(usage) => Attempt::Answer {
                    body: Bytes::from(raw),
                    usage,
                    outcome: self.timing.outcome(id, end, Some(status), None, None),
                },
                Err(e) => self.fail(Some(status), e),
            };
        }
        self.timing.ttft = Some(end);
        // Read once, as the probes read answers, and for its usage.
        let (read, tokens) = read_answer(&raw);
        let usage = Usage::from(tokens);
        match read {
            Ok(c) => Attempt::Answer {
                body: Bytes::from(raw),
                usage,
                outcome: self.timing.outcome(id, end, Some(status), None, Some(&c)),
            },
            // A refusal is the model's answer to this request: the client gets it as is.
            Err(e @ ProbeError::Refused { .. }) => Attempt::Answer {
                body: Bytes::from(raw),
                usage,
                outcome: self.timing.outcome(id, end, Some(status), Some(e), None),
            },
            Err(e) if class_of(&e) == Class::ClientFault => Attempt::ClientError {
                status: e.status().unwrap_or(400),
                content_type: HeaderValue::from_static("application/json"),
                body: redact(raw, self.key),
                outcome: self.timing.outcome(id, end, Some(status), Some(e), None),
            },
            Err(e) => self.fail(Some(status), e),
        }
    }

    /// A 2xx stream, read up to its first `data:` event (comments and keep-alives do not
    /// count) by `first_deadline`: the commit point.
    async fn commit(
        mut self,
        response: Reply,
        headers_at: Instant,
        first_deadline: Instant,
        idle: Duration,
        end: Instant,
    ) -> Attempt {
        let status = Some(response.status.as_u16());
        // After the commit point the idle timeout and the stream's longest life end it.
        let bytes = sse::guarded_bytes(response.body, headers_at, idle, end);
        let mut events: Events = Box::pin(sse::events(bytes));
        let mut decoder = OpenAiStream::default();
        let first = match tokio::time::timeout_at(first_deadline, events.next()).await {
            Err(_) => return self.fail(status, ProbeError::TimeoutBeforeFirstByte),
            Ok(None) => return self.fail(status, ProbeError::Truncated),
            Ok(Some(Err(ReadFault::Body(BodyFault::Stalled | BodyFault::Timeout)))) => {
                return self.fail(status, ProbeError::TimeoutBeforeFirstByte)
            }
            Ok(Some(Err(ReadFault::Body(BodyFault::Cut(_))))) => {
                return self.fail(status, ProbeError::Truncated)
            }
            Ok(Some(Err(ReadFault::Framing(message)))) => {
                return self.fail(status, ProbeError::Malformed { message })
            }
            Ok(Some(Ok(ev))) => ev,
        };
        let (first_step, client_fault) = match decoder.feed(&first) {
            Ok(step) => (step, None),
            Err(e) if class_of(&e) == Class::ClientFault => (Step::Done, Some(e)),
            // An error as the very first event: nothing was sent yet, so it may fail over.
            Err(e) => return self.fail(status, e),
        };
        if decoder.collected().has_content() {
            self.timing.ttft = Some(Instant::now());
        }
        Attempt::Committed(Box::new(Committed {
            route: self.route.clone(),
            timing: self.timing,
            first,
            first_step,
            client_fault,
            decoder,
            events,
        }))
    }
}

/// An error body returned to the client must not carry our key, should the upstream echo it.
fn redact(raw: Vec<u8>, key: Option<&Secret>) -> Bytes {
    let Some(key) = key.map(Secret::expose).filter(|k| k.len() >= 8) else {
        return Bytes::from(raw);
    };
    let text = String::from_utf8_lossy(&raw);
    if text.contains(key) {
        Bytes::from(text.replace(key, "[redacted]"))
    } else {
        Bytes::from(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16) -> ProbeError {
        ProbeError::Http {
            status,
            message: String::new(),
        }
    }

    #[test]
    fn failover_classes_by_status_and_error() {
        for s in [400, 413, 422, 409] {
            assert_eq!(class_of(&http(s)), Class::ClientFault, "{s}");
        }
        for s in [401, 403, 404] {
            assert_eq!(class_of(&http(s)), Class::RouteFault, "{s}");
        }
        for s in [408, 500, 502, 503, 504, 529] {
            assert_eq!(class_of(&http(s)), Class::Transient, "{s}");
        }
        assert_eq!(
            class_of(&ProbeError::Refused {
                message: String::new()
            }),
            Class::ClientFault
        );
        for e in [
            ProbeError::TimeoutBeforeFirstByte,
            ProbeError::Connect {
                message: String::new(),
            },
            ProbeError::RateLimited {
                retry_after_ms: Some(1),
                message: String::new(),
            },
        ] {
            assert_eq!(class_of(&e), Class::Transient);
        }
        assert_eq!(reason_code(&http(503)), "http_503");
        assert_eq!(
            reason_code(&ProbeError::TimeoutBeforeFirstByte),
            "timeout_before_first_byte"
        );
    }

    #[test]
    fn rests_extend_and_expire() {
        let rests = Rests::default();
        let id = RouteId::new("a", "b", "c");
        let now = Instant::now();
        rests.rest(&id, Duration::from_secs(2), now);
        rests.rest(&id, Duration::from_secs(1), now);
        assert!(rests.is_resting(&id, now + Duration::from_millis(1500)));
        assert!(!rests.is_resting(&id, now + Duration::from_secs(3)));
        rests.rest(&id, Duration::from_secs(100_000), now);
        assert_eq!(rests.soonest_end(&[id], now), Some(MAX_REST));
    }

    #[test]
    fn the_route_model_replaces_the_asked_one_in_place() {
        let body = serde_json::json!({"messages": [], "model": "chat", "stream": true});
        let out = serde_json::to_string(&WithModel {
            body: &body,
            model: "up/model",
        })
        .unwrap();
        let mut expected = body.clone();
        expected["model"] = "up/model".into();
        assert_eq!(out, serde_json::to_string(&expected).unwrap());
        let bare = serde_json::json!({"messages": []});
        let out = serde_json::to_value(WithModel {
            body: &bare,
            model: "m",
        })
        .unwrap();
        assert_eq!(out, serde_json::json!({"messages": [], "model": "m"}));
    }

    #[test]
    fn echoed_keys_are_redacted() {
        let key = Secret::new("sk-test-1234567890");
        let out = redact(b"bad key sk-test-1234567890 here".to_vec(), Some(&key));
        assert_eq!(&out[..], b"bad key [redacted] here");
    }
}
