//! One request on its way through the proxy ([`RequestCtx`]): what its `x-probeok-*` headers
//! disclose ([`Disclosure`]), what metering records of it, the idempotency key it holds, and
//! [`finish`], which turns what the request produced ([`Answer`]) into the client's response.
//!
//! Every answer carries `x-probeok-route`, `x-probeok-attempts`, `x-probeok-mode`
//! (`normal` | `degraded` | `fallback`), `x-probeok-fallback-reason` when another candidate
//! than the first choice answered (or a non-primary was chosen), `x-probeok-degraded-since`
//! when degraded, and `x-request-id` (the client's, or a generated one). A committed stream is
//! metered, counted and kept for its idempotency key by its [`Tail`] once it ends.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::time::Instant;

use super::attempt::{class_of, Class};
use super::breaker::Verdict;
use super::record::{self, AttemptOutcome, Outcome, Tried, Usage};
use super::reject::Reject;
use super::{cache, idempotency, notice, shadow, trace, Proxy};
use crate::probe::ProbeOutcome;
use crate::route::{Price, Route, RouteId};
use crate::store::RequestRecord;

/// `x-probeok-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Normal,
    /// Served although every route of the model is unhealthy, or by a degradation contract.
    Degraded,
    /// Served by another candidate than the first choice (or a contract's fallback model).
    Fallback,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Degraded => "degraded",
            Self::Fallback => "fallback",
        }
    }
}

/// What the answer's `x-probeok-*` headers say.
pub(crate) struct Disclosure {
    pub request_id: String,
    pub route: Option<RouteId>,
    pub attempts: usize,
    pub degraded_since: Option<DateTime<Utc>>,
    pub fallback_reason: Option<String>,
    /// Set by a contract answer: its `x-probeok-mode`, whatever the rest says.
    pub mode: Option<Mode>,
    /// More headers a contract answer carries (`x-probeok-user-message`, …).
    pub extra: Vec<(&'static str, String)>,
    /// The answering route's profile changed the request (`x-probeok-profile`).
    pub profile: Option<RouteId>,
    /// Since when, and why, the model is served degraded (`all_routes_unhealthy`,
    /// `weights_feed_stale`), for the answer's `"probeok"` object.
    pub degraded_reason: Option<&'static str>,
    /// Served by a `fallback`-tier route or a contract's fallback model: `quality_hint`
    /// `reduced`.
    pub reduced: bool,
}

impl Disclosure {
    fn new(request_id: String) -> Self {
        Self {
            request_id,
            route: None,
            attempts: 0,
            degraded_since: None,
            fallback_reason: None,
            mode: None,
            extra: Vec::new(),
            profile: None,
            degraded_reason: None,
            reduced: false,
        }
    }

    /// The first reason the request left its first choice is the one disclosed.
    pub fn fallback(&mut self, reason: &str) {
        self.fallback_reason
            .get_or_insert_with(|| reason.to_owned());
    }

    pub fn mode(&self) -> Mode {
        if let Some(m) = self.mode {
            m
        } else if self.degraded_since.is_some() {
            Mode::Degraded
        } else if self.fallback_reason.is_some() {
            Mode::Fallback
        } else {
            Mode::Normal
        }
    }

    fn apply(&self, mut response: Response) -> Response {
        // Names made at compile time, and the fixed values (`none`, the mode) neither copied
        // nor checked: these headers are on every answer.
        const ROUTE: HeaderName = HeaderName::from_static("x-probeok-route");
        const ATTEMPTS: HeaderName = HeaderName::from_static("x-probeok-attempts");
        const MODE: HeaderName = HeaderName::from_static("x-probeok-mode");
        const FALLBACK_REASON: HeaderName = HeaderName::from_static("x-probeok-fallback-reason");
        const DEGRADED_SINCE: HeaderName = HeaderName::from_static("x-probeok-degraded-since");
        const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
        const PROFILE: HeaderName = HeaderName::from_static("x-probeok-profile");
        let h = response.headers_mut();
        match &self.route {
            Some(route) => put(h, ROUTE, route.as_str()),
            None => {
                h.insert(ROUTE, HeaderValue::from_static("none"));
            }
        }
        h.insert(ATTEMPTS, HeaderValue::from(self.attempts));
        h.insert(MODE, HeaderValue::from_static(self.mode().as_str()));
        if let Some(r) = &self.fallback_reason {
            put(h, FALLBACK_REASON, r);
        }
        if let Some(since) = self.degraded_since {
            let since = since.to_rfc3339_opts(SecondsFormat::Secs, true);
            put(h, DEGRADED_SINCE, &since);
        }
        put(h, REQUEST_ID, &self.request_id);
        if let Some(route) = &self.profile {
            put(h, PROFILE, route.as_str());
        }
        for (name, value) in &self.extra {
            put(h, HeaderName::from_static(name), value);
        }
        response
    }
}

/// Sets `name` to `value` unless `value` cannot be a header's (then the header is left out).
fn put(h: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(name, v);
    }
}

/// The client's `x-request-id` when it is usable (1-128 visible ASCII characters), else a new
/// one.
pub(crate) fn request_id(headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.chars().all(|c| c.is_ascii_graphic()))
        .map_or_else(generated_request_id, str::to_owned)
}

/// `req_` and 32 random hex digits, written straight into the string: through `format!`
/// `request_id` cost 1.7k instructions a request, this way 1.1k (callgrind).
fn generated_request_id() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let n = rand::random::<u128>();
    let mut id = String::with_capacity(36);
    id.push_str("req_");
    id.extend(
        (0..32)
            .rev()
            .map(|i| HEX[(n >> (i * 4)) as usize & 0xf] as char),
    );
    id
}

/// Everything one request gathers on its way: what the headers disclose, what metering
/// records, the idempotency key it holds.
pub(crate) struct RequestCtx {
    pub d: Disclosure,
    /// The logical model it is metered under (empty: not metered).
    pub serves: String,
    pub stream: bool,
    started_at: DateTime<Utc>,
    start: Instant,
    pub attempts: Vec<Tried>,
    /// Streams decide theirs at their end.
    pub outcome: Outcome,
    /// The upstream's answer (non-streamed), kept for the idempotency key.
    pub answer: Option<Bytes>,
    /// The answering route's price.
    pub price: Option<Price>,
    pub guard: Option<idempotency::Guard>,
    /// Answered from an idempotency key: returned exactly as stored.
    pub replay: bool,
    /// The contract behaviour that answered (metered in `proxy_requests.contract`).
    pub contract: Option<&'static str>,
    /// A contract's own keys of the `"probeok"` object, for answers the contract did not
    /// build itself (a fallback model's, a replayed cached stream).
    pub probeok: Option<Value>,
    /// Where a successful answer is remembered for `cached_response`.
    pub cache: Option<cache::Slot>,
    /// The request's trace (`None`: tracing is off).
    pub trace: Option<Box<crate::trace::RequestTrace>>,
    /// The client's tag ([`super::attribution::client_tag`]; empty without client auth).
    pub client: String,
    /// Sampled for `[[shadow]]` copies, sent once the answer is complete.
    pub shadow: Option<Box<shadow::Pending>>,
    /// What the request asked of its answer's structure (judged by the observables).
    pub expect: super::structured::Expect,
    /// The named client (`[[proxy.client]]` id), metered with the request.
    pub client_id: Option<String>,
    /// The named client's booking and the request's estimated prompt tokens: settled when
    /// the request ends.
    pub spend: Option<(super::clients::ClientHold, u64)>,
}

impl RequestCtx {
    pub fn new(request_id: String, started_at: DateTime<Utc>) -> Self {
        Self {
            d: Disclosure::new(request_id),
            serves: String::new(),
            stream: false,
            started_at,
            start: Instant::now(),
            attempts: Vec::new(),
            outcome: Outcome::Rejected,
            answer: None,
            price: None,
            guard: None,
            replay: false,
            contract: None,
            probeok: None,
            cache: None,
            trace: None,
            client: String::new(),
            shadow: None,
            expect: super::structured::Expect::Nothing,
            client_id: None,
            spend: None,
        }
    }

    /// Metered under `model` from now on, unless a model was already set (a contract's
    /// fallback keeps the original's name).
    pub fn serves(&mut self, model: &str) {
        if self.serves.is_empty() {
            self.serves = model.to_owned();
        }
    }

    /// The metered row of this request, answered with `status`.
    fn record(&self, status: u16, outcome: Outcome) -> RequestRecord {
        let (usage, cost) = record::answered_usage(&self.attempts);
        RequestRecord {
            request_id: self.d.request_id.clone(),
            serves: self.serves.clone(),
            started_at: self.started_at,
            route: self.d.route.as_ref().map(|r| r.as_str().to_owned()),
            outcome: outcome.as_str().to_owned(),
            status,
            stream: self.stream,
            fallback_reason: self.d.fallback_reason.clone(),
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            cost,
            currency: cost.and(self.price.as_ref().map(|p| p.currency.clone())),
            latency_ms: self.start.elapsed().as_secs_f64() * 1000.0,
            attempts: (self.attempts.iter().enumerate())
                .map(|(i, a)| a.record(i + 1))
                .collect(),
            contract: self.contract.map(str::to_owned),
            trace_id: self.trace.as_ref().map(|t| t.trace_id_hex()),
            client: self.client_id.clone(),
        }
    }

    /// Settles the client's booking to what every attempt used.
    fn settle_spend(&mut self, proxy: &Proxy) {
        if let Some((hold, prompt)) = self.spend.take() {
            let routes = &proxy.inner.routes;
            let price = |id: &RouteId| {
                (routes.iter())
                    .find(|r| &r.id == id)
                    .and_then(|r| r.price.clone())
            };
            hold.settle(super::clients::attempts_micros(
                &self.attempts,
                price,
                prompt,
            ));
        }
    }
}

/// The body of a committed stream as the client receives it.
pub(crate) type StreamBody = BoxStream<'static, Result<Bytes, Infallible>>;

/// Where a committed stream's passive outcome (and what the observables take of it) lands
/// when it ends.
pub(crate) type OutcomeSlot = Arc<Mutex<Option<(ProbeOutcome, super::stream::Streamed)>>>;

/// What a request produced, before [`finish`].
pub(crate) enum Answer {
    Plain(Response),
    /// A committed stream; `slot` receives its outcome when it ends.
    Stream {
        body: StreamBody,
        slot: OutcomeSlot,
        route: Arc<Route>,
    },
}

impl From<Reject> for Answer {
    fn from(r: Reject) -> Self {
        Self::Plain(r.into_response())
    }
}

/// Discloses, meters, counts, and keeps the answer for its idempotency key.
pub(crate) async fn finish(proxy: &Proxy, ctx: RequestCtx, answer: Answer) -> Response {
    match answer {
        Answer::Plain(r) if ctx.replay => r,
        Answer::Plain(r) => finish_plain(proxy, ctx, r).await,
        Answer::Stream { body, slot, route } => finish_stream(proxy, ctx, body, slot, route),
    }
}

async fn finish_plain(proxy: &Proxy, mut ctx: RequestCtx, r: Response) -> Response {
    let p = &proxy.inner;
    let mut r = ctx.d.apply(r);
    trace::respond(&ctx, &mut r);
    let status = r.status().as_u16();
    ctx.settle_spend(proxy);
    let route = ctx.d.route.as_ref().map_or("none", RouteId::as_str);
    p.counters.request(&ctx.serves, route, ctx.outcome.as_str());
    if let Some(observer) = &p.observer {
        let answer = (ctx.outcome == Outcome::Ok)
            .then(|| ctx.answer.clone())
            .flatten();
        observer.request(&ctx, answer.map(super::observe::Content::Body));
    }
    if !ctx.serves.is_empty() {
        if let Some(meter) = &p.meter {
            meter.send(ctx.record(status, ctx.outcome));
        }
    }
    trace::finish(&p.tracer, &ctx, status, ctx.outcome);
    // `cached_response`: the model's own successful answers are remembered.
    if let (Some(slot), Some(cache), Some(body)) = (ctx.cache.take(), &p.cache, &ctx.answer) {
        if ctx.outcome == Outcome::Ok && ctx.contract.is_none() && status == 200 {
            cache.remember(slot, status, body.to_vec(), p.clock.now());
        }
    }
    // The copies leave once the client's answer is complete (a contract's own answer is not
    // the model's: nothing to compare).
    if let (Some(pending), Some(shadows)) = (ctx.shadow.take(), &p.shadows) {
        if ctx.contract.is_none() || ctx.contract == Some(notice::FALLBACK_MODEL) {
            let last = ctx.attempts.last();
            let primary = shadow::plain_side(
                ctx.outcome == Outcome::Ok && status == 200,
                ctx.start.elapsed(),
                last.and_then(|a| a.ttft_ms),
                last.and_then(|a| a.usage.completion_tokens),
                &pending.expect,
                ctx.answer.as_deref(),
            );
            shadows.offer(*pending, Some(primary));
        }
    }
    // A degraded answer says so in its body; a replay of its idempotency key says the same.
    if let Some(block) = notice::block(&ctx) {
        r = notice::add(r, &block).await;
        if let Some(body) = &ctx.answer {
            if let Some(with) = notice::json_body(body, &block) {
                ctx.answer = Some(Bytes::from(with));
            }
        }
    }
    if let (Some(guard), Some(body)) = (ctx.guard.take(), ctx.answer.take()) {
        guard
            .store(status, r.headers(), false, body.to_vec(), p.clock.now())
            .await;
    }
    r
}

fn finish_stream(
    proxy: &Proxy,
    mut ctx: RequestCtx,
    body: StreamBody,
    slot: OutcomeSlot,
    route: Arc<Route>,
) -> Response {
    let mut r = ctx.d.apply(Response::new(Body::empty()));
    trace::respond(&ctx, &mut r);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    // The notice rides in the first chunk (before the tee: a replay says the same).
    let body = match notice::block(&ctx) {
        None => body,
        Some(block) => body
            .enumerate()
            .map(move |(i, chunk)| match chunk {
                Ok(c) if i == 0 => Ok(notice::first_event(&c, &block).unwrap_or(c)),
                other => other,
            })
            .boxed(),
    };
    let tail = Tail {
        proxy: proxy.clone(),
        headers: r.headers().clone(),
        guard: ctx.guard.take(),
        ctx,
        slot,
        route,
        tee: Some(Vec::new()),
        prompt_tokens: None,
        done: false,
    };
    let tailed = futures_util::stream::unfold((body, tail), |(mut body, mut tail)| async move {
        match body.next().await {
            Some(Ok(chunk)) => {
                tail.observe(&chunk);
                Some((Ok(chunk), (body, tail)))
            }
            Some(Err(e)) => Some((Err(e), (body, tail))),
            None => {
                tail.end(true);
                None
            }
        }
    });
    *r.body_mut() = Body::from_stream(tailed);
    r
}

/// The end of a committed stream: metering, breaker, counters and the idempotency key, once
/// the stream ended or the client hung up (then nothing is stored for the key).
struct Tail {
    proxy: Proxy,
    ctx: RequestCtx,
    headers: HeaderMap,
    guard: Option<idempotency::Guard>,
    slot: OutcomeSlot,
    route: Arc<Route>,
    /// The events sent, for the idempotency key (`None` once over `max_body`).
    tee: Option<Vec<u8>>,
    prompt_tokens: Option<u64>,
    done: bool,
}

impl Tail {
    fn observe(&mut self, chunk: &Bytes) {
        let limit = usize::try_from(self.proxy.inner.config.max_body).unwrap_or(usize::MAX);
        if self.guard.is_some() || self.ctx.cache.is_some() {
            if let Some(tee) = &mut self.tee {
                if tee.len() + chunk.len() > limit {
                    self.tee = None;
                } else {
                    tee.extend_from_slice(chunk);
                }
            }
        }
        if let Some(u) = Usage::in_stream_chunk(chunk) {
            self.prompt_tokens = u.prompt_tokens;
        }
        if let Some(pending) = self
            .ctx
            .shadow
            .as_mut()
            .filter(|p| shadow::compare::judges_content(&p.expect))
        {
            shadow::compare::add_stream_content(chunk, &mut pending.content);
        }
    }

    /// How the stream ended, for the breaker, the attempt and the request.
    fn judge(outcome: Option<&ProbeOutcome>) -> (Verdict, AttemptOutcome, Outcome) {
        match outcome {
            Some(o) if o.success => (Verdict::Success, AttemptOutcome::Ok, Outcome::Ok),
            Some(o) if o.attributed_to.is_some() => (
                Verdict::Neutral,
                AttemptOutcome::Interrupted,
                Outcome::Interrupted,
            ),
            Some(o)
                if o.error
                    .as_ref()
                    .is_some_and(|e| class_of(e) == Class::ClientFault) =>
            {
                (
                    Verdict::Neutral,
                    AttemptOutcome::ClientError,
                    Outcome::ClientError,
                )
            }
            Some(_) => (
                Verdict::Failure,
                AttemptOutcome::Interrupted,
                Outcome::Interrupted,
            ),
            None => (
                Verdict::Neutral,
                AttemptOutcome::ClientGone,
                Outcome::ClientGone,
            ),
        }
    }

    fn end(&mut self, complete: bool) {
        if self.done {
            return;
        }
        self.done = true;
        let p = &self.proxy.inner;
        let ended = self.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (outcome, streamed) = ended.map_or((None, None), |(o, s)| (Some(o), Some(s)));
        let (verdict, tried, result) = Self::judge(outcome.as_ref());
        p.breakers.record(&self.route.id, Instant::now(), verdict);
        if let Some(last) = self.ctx.attempts.last_mut() {
            last.outcome = tried;
            last.usage.prompt_tokens = self.prompt_tokens;
            if let Some(o) = &outcome {
                last.latency_ms = o.total_ms;
                last.ttfb_ms = o.ttfb_ms;
                last.ttft_ms = o.ttft_ms;
                last.model.clone_from(&o.model_reported);
                last.usage.completion_tokens = o.output_tokens.map(u64::from);
                last.refused = record::is_refusal(o);
                last.tpot_ms = streamed.as_ref().and_then(|s| s.tpot_ms);
            }
            last.price(self.route.price.as_ref());
        }
        if let Some(observer) = &p.observer {
            let answer = streamed
                .filter(|_| result == Outcome::Ok)
                .map(super::observe::Content::Streamed);
            observer.request(&self.ctx, answer);
        }
        let proxy = self.proxy.clone();
        self.ctx.settle_spend(&proxy);
        p.counters
            .request(&self.ctx.serves, self.route.id.as_str(), result.as_str());
        if let Some(meter) = &p.meter {
            meter.send(self.ctx.record(200, result));
        }
        trace::finish(&p.tracer, &self.ctx, 200, result);
        if let (Some(pending), Some(shadows)) = (self.ctx.shadow.take(), &p.shadows) {
            // A client that hung up leaves nothing to compare with.
            let primary = (result != Outcome::ClientGone).then(|| shadow::compare::Side {
                success: result == Outcome::Ok,
                latency_ms: outcome.as_ref().map_or(0.0, |o| o.total_ms),
                ttft_ms: outcome.as_ref().and_then(|o| o.ttft_ms),
                output_tokens: outcome
                    .as_ref()
                    .and_then(|o| o.output_tokens.map(u64::from)),
                valid: shadow::compare::validity(&pending.expect, Some(&pending.content)),
            });
            shadows.offer(*pending, primary);
        }
        let keep = complete && matches!(result, Outcome::Ok | Outcome::ClientError);
        let tee = if keep { self.tee.take() } else { None };
        if let (Some(tee), true) = (&tee, result == Outcome::Ok && self.ctx.contract.is_none()) {
            if let (Some(slot), Some(cache)) = (self.ctx.cache.take(), &p.cache) {
                cache.remember(slot, 200, tee.clone(), p.clock.now());
            }
        }
        if let (Some(guard), Some(tee)) = (self.guard.take(), tee) {
            let headers = self.headers.clone();
            let now = p.clock.now();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { guard.store(200, &headers, true, tee, now).await });
            }
        }
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        self.end(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_kept_only_when_usable() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&h), "abc-123");
        h.insert("x-request-id", HeaderValue::from_static("has space"));
        let generated = request_id(&h);
        assert!(generated.starts_with("req_") && generated.len() == 36);
        assert!(request_id(&HeaderMap::new()).starts_with("req_"));
    }

    #[test]
    fn a_generated_request_id_is_32_hex_digits_that_differ() {
        let (a, b) = (generated_request_id(), generated_request_id());
        for id in [&a, &b] {
            let digits = id.strip_prefix("req_").expect(id);
            assert_eq!(digits.len(), 32, "{id}");
            assert!(digits
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        }
        assert_ne!(a, b);
    }

    #[test]
    fn the_mode_follows_contract_then_degradation_then_fallback() {
        let mut d = Disclosure::new("r".into());
        assert_eq!(d.mode(), Mode::Normal);
        d.fallback("http_503");
        d.fallback("rate_limited");
        assert_eq!(d.fallback_reason.as_deref(), Some("http_503"));
        assert_eq!(d.mode(), Mode::Fallback);
        d.degraded_since = Some(Utc::now());
        assert_eq!(d.mode(), Mode::Degraded);
        d.mode = Some(Mode::Fallback);
        let r = d.apply(Response::new(Body::empty()));
        assert_eq!(r.headers()["x-probeok-mode"], "fallback");
        assert_eq!(r.headers()["x-probeok-route"], "none");
        assert_eq!(r.headers()["x-probeok-fallback-reason"], "http_503");
        assert!(r.headers().contains_key("x-probeok-degraded-since"));
    }
}
