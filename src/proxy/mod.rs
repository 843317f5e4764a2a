//! The bundled OpenAI-compatible routing proxy (SPEC.md, "HTTP API of the proxy"):
//! `POST /v1/chat/completions` (streaming and not) and `GET /v1/models`, following the weights
//! feed through a watch channel and reporting every attempt as a passive outcome.
//!
//! - [`weights`]: the proxy's own view of the weights feed (`WeightsView`), independent of the
//!   monitor's types.
//! - [`select`]: the pure candidate choice (needs filter, weighted order, tiers, degraded mode).
//! - [`attempt`]: one attempt — per-candidate budget, stream watchdog, failover classes,
//!   429 rests, passive outcomes.
//! - [`stream`]: forwarding a committed stream; `provider_interrupted` after the commit point.
//! - [`breaker`]: per-route circuit breakers (pure) and the full-jitter retry backoff. Routes
//!   with an open breaker go last in the candidate list (tried only when everything else
//!   failed) and the answer says `x-probeok-fallback-reason: breaker_open`. After every
//!   candidate was tried once, routes that failed transiently are retried with backoff, within
//!   `max_attempts` and `max_retry_wait` of total waiting.
//! - [`meter`]: one metered record per request (through the store's writer, never blocking),
//!   `GET /api/v1/requests`, and the request/failover counters.
//! - [`idempotency`]: `Idempotency-Key` answers kept in SQLite until `idempotency_ttl`.
//! - [`remote`]: the standalone proxy's SSE weights subscription and batched ingest.
//! - [`contract`]: degradation contracts (pure): which behaviour applies to a request, cache
//!   keys, the `user_message` block; `degrade` applies it (fallback model, reject, cached
//!   answer, async job); [`cache`] keeps `cached_response` answers and [`jobs`] the
//!   `async_queue` jobs with their worker and `GET /v1/jobs/{id}`.
//!
//! Bad input (invalid JSON, missing/empty `messages`, wrong field types) is refused with 400
//! before any upstream call; bodies over `max_body` get 413; a body that does not arrive
//! within [`BODY_READ_TIMEOUT`] gets 408. Each route takes at most `route_concurrency`
//! requests at once; a full route is skipped (`overloaded`), and 503 when all are full.
//!
//! Every answer carries `x-probeok-route`, `x-probeok-attempts`, `x-probeok-mode`
//! (`normal` | `degraded` | `fallback`), `x-probeok-fallback-reason` when another candidate
//! than the first choice answered (or a non-primary was chosen), `x-probeok-degraded-since`
//! when degraded, and `x-request-id` (the client's, or a generated one). Errors use OpenAI's
//! envelope `{"error":{"message","type","code"}}`. Upstream keys come from each provider's
//! `api_key_env`, are added by the proxy and never returned; the client's `Authorization` is
//! checked against `client_keys_env` (when set) and never forwarded.
//!
//! Graceful shutdown stops accepting and waits for in-flight requests; committed streams run to
//! their end, bounded by the service's drain timeout.

pub mod attempt;
pub mod breaker;
pub mod cache;
pub mod contract;
mod degrade;
pub mod export;
pub mod idempotency;
pub mod jobs;
pub mod meter;
pub mod remote;
pub mod select;
pub mod stream;
pub mod weights;

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::Semaphore;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::{Budget, Reservation};
use crate::clock::{Clock, SystemClock};
use crate::config::{Config, ProxyConfig};
use crate::probe::{ProbeError, ProbeOutcome};
use crate::route::{Price, Route, RouteId, Tier};
use crate::secret::Secret;
use crate::store::{AttemptRecord, RequestRecord, Store};

use attempt::{
    class_of, reason_code, Attempt, Class, Limits, Outgoing, PassiveSink, Rests, Upstream,
};
pub use breaker::{BreakerSnapshot, BreakerState};
use breaker::{Breakers, Verdict};
pub use meter::{requests_router, CountersSnapshot, Meter, ProxyCounters};
use select::{Needs, Rejection};
pub use weights::{FeedStatus, WeightsRx, WeightsView};

/// Requests in flight to one route, at most (more: the next candidate, or 503).
pub const ROUTE_CONCURRENCY: usize = 256;
/// The whole request body must arrive within this (slow clients get 408).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A request's head (request line and headers) must arrive within this, or the connection is
/// closed: a slow-loris client cannot hold a connection open by trickling its headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// After an accept error other than a peer's reset (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What the proxy uses besides the config.
#[derive(Clone)]
pub struct ProxyOptions {
    /// Metering and idempotency keys need a store; without one both are off.
    pub store: Option<Store>,
    /// Requests in flight per route.
    pub route_concurrency: usize,
    pub body_read_timeout: Duration,
    /// HTTP/1 request heads must arrive within this (see [`HEADER_READ_TIMEOUT`]).
    pub header_read_timeout: Duration,
    /// A remote weights feed's health: answers say `degraded` while it is stale.
    pub feed: Option<Arc<FeedStatus>>,
    pub clock: Arc<dyn Clock>,
    /// The live config (hot reload): contracts are read from here per request. `None`: the
    /// config the proxy was built with, for good.
    pub live: Option<tokio::sync::watch::Receiver<Arc<Config>>>,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        Self {
            store: None,
            route_concurrency: ROUTE_CONCURRENCY,
            body_read_timeout: BODY_READ_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            feed: None,
            clock: Arc::new(SystemClock),
            live: None,
        }
    }
}

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// The proxy's state: cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

struct Inner {
    config: ProxyConfig,
    routes: Vec<Arc<Route>>,
    weights: WeightsRx,
    upstream: Upstream,
    rests: Rests,
    passive: PassiveSink,
    /// `None`: no client auth (the variable is unset).
    client_keys: Option<Vec<Secret>>,
    /// Routes whose own `first_byte_timeout` overrides the proxy's stream watchdog.
    first_byte_overrides: HashMap<RouteId, Duration>,
    /// Logical model → since when it has been served degraded (all weights 0).
    degraded_since: Mutex<HashMap<String, DateTime<Utc>>>,
    clock: Arc<dyn Clock>,
    breakers: Breakers,
    counters: ProxyCounters,
    meter: Option<Meter>,
    idempotency: Option<Arc<idempotency::Idempotency>>,
    /// Route → its in-flight slots.
    limits: HashMap<RouteId, Arc<Semaphore>>,
    body_read_timeout: Duration,
    header_read_timeout: Duration,
    feed: Option<Arc<FeedStatus>>,
    /// The hourly extra-cost budget (layer 5), once the app sets it: requests to non-primary
    /// routes reserve their estimated maximum extra cost first.
    budget: std::sync::OnceLock<Arc<Budget>>,
    /// The current config, for what reloads without a restart (contracts).
    live: tokio::sync::watch::Receiver<Arc<Config>>,
    /// `async_queue` jobs (needs the store).
    jobs: Option<Arc<jobs::Jobs>>,
    /// `cached_response` answers (needs the store).
    cache: Option<cache::Cache>,
}

impl Proxy {
    /// Builds the proxy from a validated config: `[proxy]` and the resolved routes (only
    /// `openai` ones will carry traffic). Provider keys and client keys are read from the
    /// environment now.
    pub fn new(
        config: &Config,
        weights: WeightsRx,
        passive: mpsc::Sender<ProbeOutcome>,
    ) -> Result<Self, ProxyError> {
        Self::with_clock(config, weights, passive, Arc::new(SystemClock))
    }

    pub fn with_clock(
        full: &Config,
        weights: WeightsRx,
        passive: mpsc::Sender<ProbeOutcome>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ProxyError> {
        let opts = ProxyOptions {
            clock,
            ..ProxyOptions::default()
        };
        Self::with_options(full, weights, passive, opts)
    }

    /// The proxy with a store (metering, idempotency keys), a feed status, limits. Starts the
    /// metering task: call it inside a Tokio runtime.
    pub fn with_options(
        full: &Config,
        weights: WeightsRx,
        passive: mpsc::Sender<ProbeOutcome>,
        opts: ProxyOptions,
    ) -> Result<Self, ProxyError> {
        let clock = opts.clock.clone();
        let config = &full.proxy;
        let routes: Vec<Arc<Route>> = full.routes().into_iter().map(Arc::new).collect();
        let first_byte_overrides = full
            .routes
            .iter()
            .filter_map(|r| {
                let fbt = r.first_byte_timeout?;
                Some((RouteId::new(&r.provider, &r.region, &r.model), fbt))
            })
            .collect();
        let upstream = Upstream::new(&routes).map_err(|e| ProxyError::Client(e.to_string()))?;
        let client_keys = Secret::from_env(&config.client_keys_env).map(|all| {
            all.expose()
                .split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(Secret::new)
                .collect()
        });
        let breakers = Breakers::new(routes.iter().map(|r| &r.id), &config.breaker);
        let limits = routes
            .iter()
            .map(|r| {
                let n = opts.route_concurrency.max(1);
                (r.id.clone(), Arc::new(Semaphore::new(n)))
            })
            .collect();
        Ok(Self {
            inner: Arc::new(Inner {
                config: config.clone(),
                routes,
                weights,
                upstream,
                rests: Rests::default(),
                passive: PassiveSink::new(passive),
                client_keys,
                first_byte_overrides,
                degraded_since: Mutex::new(HashMap::new()),
                clock,
                breakers,
                counters: ProxyCounters::default(),
                meter: opts.store.as_ref().map(|s| Meter::spawn(s.writer()).0),
                jobs: opts.store.as_ref().map(|s| {
                    let max = usize::try_from(config.max_body).unwrap_or(usize::MAX);
                    Arc::new(jobs::Jobs::new(s.clone(), max))
                }),
                cache: opts.store.as_ref().map(|s| {
                    let max = usize::try_from(config.max_body).unwrap_or(usize::MAX);
                    cache::Cache::new(s.clone(), max)
                }),
                idempotency: opts.store.map(|s| {
                    let max = usize::try_from(config.max_body).unwrap_or(usize::MAX);
                    idempotency::Idempotency::new(s, config.idempotency_ttl, max)
                }),
                limits,
                body_read_timeout: opts.body_read_timeout,
                header_read_timeout: opts.header_read_timeout,
                feed: opts.feed,
                budget: std::sync::OnceLock::new(),
                live: opts
                    .live
                    .unwrap_or_else(|| tokio::sync::watch::channel(Arc::new(full.clone())).1),
            }),
        })
    }

    /// Accounts non-primary serving against `budget` from now on (once; a second call is
    /// ignored).
    pub fn set_budget(&self, budget: Arc<Budget>) {
        let _ = self.inner.budget.set(budget);
    }

    /// Passive outcomes dropped because the queue was full.
    pub fn passive_dropped(&self) -> u64 {
        self.inner.passive.dropped()
    }

    /// Every route's circuit breaker, now.
    pub fn breakers(&self) -> Vec<BreakerSnapshot> {
        self.inner.breakers.snapshot(Instant::now())
    }

    /// `probeok_proxy_requests_total` and `probeok_proxy_failovers_total`, with drop counts.
    pub fn counters(&self) -> CountersSnapshot {
        let mut s = self.inner.counters.snapshot();
        s.meter_dropped = self.inner.meter.as_ref().map_or(0, Meter::dropped);
        s.passive_dropped = self.inner.passive.dropped();
        s
    }
}

/// A read-only view of a running proxy, for the monitor's `/metrics` and `/api/v1/status`. It
/// holds the proxy weakly: it never keeps the proxy (nor its metering queue) alive, and reads
/// as empty once the proxy is gone.
#[derive(Clone)]
pub struct ProxyStats {
    inner: Weak<Inner>,
}

impl std::fmt::Debug for ProxyStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyStats")
            .field("alive", &(self.inner.strong_count() > 0))
            .finish()
    }
}

impl ProxyStats {
    fn proxy(&self) -> Option<Proxy> {
        self.inner.upgrade().map(|inner| Proxy { inner })
    }

    /// Every route's breaker (empty once the proxy is gone).
    pub fn breakers(&self) -> Vec<BreakerSnapshot> {
        self.proxy().map(|p| p.breakers()).unwrap_or_default()
    }

    /// The proxy's counters (empty once the proxy is gone).
    pub fn counters(&self) -> CountersSnapshot {
        self.proxy().map(|p| p.counters()).unwrap_or_default()
    }
}

impl Proxy {
    /// A weak, read-only handle on this proxy's breakers and counters.
    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            inner: Arc::downgrade(&self.inner),
        }
    }
}

/// The proxy's HTTP surface.
pub fn router(proxy: Proxy) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/jobs/{id}", get(jobs::get_job))
        .fallback(not_found)
        .with_state(proxy)
}

/// Serves the proxy on `listener` until `shutdown`: HTTP/1.1 (keep-alive) and HTTP/2, with a
/// header read timeout on HTTP/1 connections (axum's own `serve` sets none). At shutdown it
/// stops accepting, closes idle connections and waits for in-flight requests.
pub async fn serve(
    listener: TcpListener,
    proxy: Proxy,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto;
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let header_read_timeout = proxy.inner.header_read_timeout;
    let service = TowerToHyperService::new(router(proxy));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::ConnectionReset
                ) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "proxy cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service.clone())
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "proxy connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// OpenAI's error envelope.
fn error_body(status: StatusCode, kind: &str, code: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"message": message, "type": kind, "code": code}})),
    )
        .into_response()
}

async fn not_found() -> Response {
    error_body(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        "no such path: the proxy serves POST /v1/chat/completions and GET /v1/models",
    )
}

async fn models(State(proxy): State<Proxy>) -> Response {
    let data: Vec<Value> = select::logical_models(&proxy.inner.routes)
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "probeok"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// What the answer's `x-probeok-*` headers say.
struct Disclosure {
    request_id: String,
    route: Option<RouteId>,
    attempts: usize,
    degraded_since: Option<DateTime<Utc>>,
    fallback_reason: Option<String>,
    /// Set by a contract answer: its `x-probeok-mode`, whatever the rest says.
    mode: Option<&'static str>,
    /// More headers a contract answer carries (`x-probeok-user-message`, …).
    extra: Vec<(&'static str, String)>,
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
        }
    }

    fn apply(&self, mut response: Response) -> Response {
        let h = response.headers_mut();
        let mut set = |name: &'static str, value: &str| {
            if let Ok(v) = HeaderValue::from_str(value) {
                h.insert(HeaderName::from_static(name), v);
            }
        };
        set(
            "x-probeok-route",
            self.route.as_ref().map_or("none", RouteId::as_str),
        );
        set("x-probeok-attempts", &self.attempts.to_string());
        let mode = if let Some(m) = self.mode {
            m
        } else if self.degraded_since.is_some() {
            "degraded"
        } else if self.fallback_reason.is_some() {
            "fallback"
        } else {
            "normal"
        };
        set("x-probeok-mode", mode);
        if let Some(r) = &self.fallback_reason {
            set("x-probeok-fallback-reason", r);
        }
        if let Some(since) = self.degraded_since {
            set(
                "x-probeok-degraded-since",
                &since.to_rfc3339_opts(SecondsFormat::Secs, true),
            );
        }
        set("x-request-id", &self.request_id);
        for (name, value) in &self.extra {
            set(name, value);
        }
        response
    }
}

fn request_id(headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.chars().all(|c| c.is_ascii_graphic()))
        .map_or_else(
            || format!("req_{:032x}", rand::random::<u128>()),
            str::to_owned,
        )
}

/// The client's key when it is one of `keys`. Digests are compared in constant time (so
/// neither the content nor the length of a key leaks through timing), and every key is
/// compared, matched or not.
fn authorized(keys: &[Secret], headers: &HeaderMap) -> Option<String> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)?;
    crate::secret::matches_any(given, keys).then(|| given.to_owned())
}

/// Everything one request gathers on its way: what the headers disclose, what metering
/// records, the idempotency key it holds.
struct Ctx {
    d: Disclosure,
    serves: String,
    stream: bool,
    started_at: DateTime<Utc>,
    start: Instant,
    attempts: Vec<AttemptRecord>,
    /// `ok`, `client_error`, `failed`, `rejected` (streams decide at their end).
    outcome: &'static str,
    /// The upstream's answer (non-streamed), kept for the idempotency key.
    answer: Option<Bytes>,
    /// The answering route's price.
    price: Option<Price>,
    guard: Option<idempotency::Guard>,
    /// Answered from an idempotency key: returned exactly as stored.
    replay: bool,
    /// The contract behaviour that answered (metered in `proxy_requests.contract`).
    contract: Option<&'static str>,
    /// The `"probeok"` object added to the upstream's JSON answer (a contract's fallback).
    probeok: Option<Value>,
    /// Where a successful answer is remembered for `cached_response`.
    cache: Option<cache::Slot>,
}

impl Ctx {
    fn new(request_id: String, started_at: DateTime<Utc>) -> Self {
        Self {
            d: Disclosure::new(request_id),
            serves: String::new(),
            stream: false,
            started_at,
            start: Instant::now(),
            attempts: Vec::new(),
            outcome: "rejected",
            answer: None,
            price: None,
            guard: None,
            replay: false,
            contract: None,
            probeok: None,
            cache: None,
        }
    }
}

/// What [`handle`] produced.
enum Answer {
    Plain(Response),
    /// A committed stream; `slot` receives its outcome when it ends.
    Stream {
        body: futures_util::stream::BoxStream<'static, Result<Bytes, Infallible>>,
        slot: Arc<Mutex<Option<ProbeOutcome>>>,
        route: Arc<Route>,
    },
}

fn plain(r: Response) -> Answer {
    Answer::Plain(r)
}

async fn chat_completions(State(proxy): State<Proxy>, headers: HeaderMap, body: Body) -> Response {
    let mut ctx = Ctx::new(request_id(&headers), proxy.inner.clock.now());
    let answer = handle(&proxy, &headers, body, &mut ctx).await;
    finish(&proxy, ctx, answer).await
}

/// `usage` of an answer body or a stream chunk.
fn usage_of(v: &Value) -> (Option<u64>, Option<u64>) {
    let u = &v["usage"];
    (u["prompt_tokens"].as_u64(), u["completion_tokens"].as_u64())
}

/// The attempt record of one upstream outcome.
fn attempt_record(
    n: usize,
    outcome: &ProbeOutcome,
    reason: Option<String>,
    result: &str,
) -> AttemptRecord {
    let status_class = match outcome.http_status {
        Some(s) => format!("{}xx", s / 100),
        None => "none".to_owned(),
    };
    AttemptRecord {
        n: u32::try_from(n).unwrap_or(u32::MAX),
        route: outcome.route.as_str().to_owned(),
        reason,
        status_class,
        status: outcome.http_status,
        ttfb_ms: outcome.ttfb_ms,
        latency_ms: outcome.total_ms,
        prompt_tokens: None,
        completion_tokens: outcome.output_tokens.map(u64::from),
        cost: None,
        outcome: result.to_owned(),
    }
}

fn skipped(n: usize, route: &RouteId, reason: &str) -> AttemptRecord {
    AttemptRecord {
        n: u32::try_from(n).unwrap_or(u32::MAX),
        route: route.as_str().to_owned(),
        reason: Some(reason.to_owned()),
        status_class: "none".to_owned(),
        status: None,
        ttfb_ms: None,
        latency_ms: 0.0,
        prompt_tokens: None,
        completion_tokens: None,
        cost: None,
        outcome: "skipped".to_owned(),
    }
}

fn record_of(ctx: &Ctx, status: u16, outcome: &str) -> RequestRecord {
    let last = ctx.attempts.iter().rev().find(|a| a.outcome != "skipped");
    let (prompt, completion, cost) = last
        .filter(|a| a.outcome == "ok" || a.outcome == "interrupted")
        .map_or((None, None, None), |a| {
            (a.prompt_tokens, a.completion_tokens, a.cost)
        });
    RequestRecord {
        request_id: ctx.d.request_id.clone(),
        serves: ctx.serves.clone(),
        started_at: ctx.started_at,
        route: ctx.d.route.as_ref().map(|r| r.as_str().to_owned()),
        outcome: outcome.to_owned(),
        status,
        stream: ctx.stream,
        fallback_reason: ctx.d.fallback_reason.clone(),
        prompt_tokens: prompt,
        completion_tokens: completion,
        cost,
        currency: cost.and(ctx.price.as_ref().map(|p| p.currency.clone())),
        latency_ms: ctx.start.elapsed().as_secs_f64() * 1000.0,
        attempts: ctx.attempts.clone(),
        contract: ctx.contract.map(str::to_owned),
    }
}

/// Discloses, meters, counts, and keeps the answer for its idempotency key.
async fn finish(proxy: &Proxy, mut ctx: Ctx, answer: Answer) -> Response {
    let p = &proxy.inner;
    match answer {
        Answer::Plain(r) if ctx.replay => r,
        Answer::Plain(r) => {
            let mut r = ctx.d.apply(r);
            let status = r.status().as_u16();
            let route = ctx.d.route.as_ref().map_or("none", RouteId::as_str);
            p.counters.request(&ctx.serves, route, ctx.outcome);
            if !ctx.serves.is_empty() {
                if let Some(meter) = &p.meter {
                    meter.send(record_of(&ctx, status, ctx.outcome));
                }
            }
            // `cached_response`: the model's own successful answers are remembered.
            if let (Some(slot), Some(cache), Some(body)) = (ctx.cache.take(), &p.cache, &ctx.answer)
            {
                if ctx.outcome == "ok" && ctx.contract.is_none() && status == 200 {
                    cache.remember(slot, status, body.to_vec(), p.clock.now());
                }
            }
            if let (Some(guard), Some(body)) = (ctx.guard.take(), ctx.answer.take()) {
                guard
                    .store(status, r.headers(), false, body.to_vec(), p.clock.now())
                    .await;
            }
            if let Some(block) = &ctx.probeok {
                r = degrade::add_block(r, block).await;
            }
            r
        }
        Answer::Stream { body, slot, route } => {
            let mut r = ctx.d.apply(Response::new(Body::empty()));
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            h.insert("x-accel-buffering", HeaderValue::from_static("no"));
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
            let tailed =
                futures_util::stream::unfold((body, tail), |(mut body, mut tail)| async move {
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
    }
}

/// The end of a committed stream: metering, breaker, counters and the idempotency key, once
/// the stream ended or the client hung up (then nothing is stored for the key).
struct Tail {
    proxy: Proxy,
    ctx: Ctx,
    headers: HeaderMap,
    guard: Option<idempotency::Guard>,
    slot: Arc<Mutex<Option<ProbeOutcome>>>,
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
        if memchr_usage(chunk) {
            for line in chunk.split(|b| *b == b'\n') {
                if let Some(data) = line.strip_prefix(b"data: ") {
                    if let Ok(v) = serde_json::from_slice::<Value>(data) {
                        if let (Some(pt), _) = usage_of(&v) {
                            self.prompt_tokens = Some(pt);
                        }
                    }
                }
            }
        }
    }

    fn end(&mut self, complete: bool) {
        if self.done {
            return;
        }
        self.done = true;
        let p = &self.proxy.inner;
        let outcome = self.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (verdict, result) = match (&outcome, complete) {
            (Some(o), _) if o.success => (Verdict::Success, "ok"),
            (Some(o), _)
                if o.error
                    .as_ref()
                    .is_some_and(|e| class_of(e) == Class::ClientFault) =>
            {
                (Verdict::Neutral, "client_error")
            }
            (Some(_), _) => (Verdict::Failure, "interrupted"),
            (None, _) => (Verdict::Neutral, "client_gone"),
        };
        p.breakers.record(&self.route.id, Instant::now(), verdict);
        if let Some(last) = self.ctx.attempts.last_mut() {
            last.outcome = result.to_owned();
            last.prompt_tokens = self.prompt_tokens;
            if let Some(o) = &outcome {
                last.latency_ms = o.total_ms;
                last.ttfb_ms = o.ttfb_ms;
                last.completion_tokens = o.output_tokens.map(u64::from);
            }
            last.cost = meter::cost(
                self.route.price.as_ref(),
                last.prompt_tokens,
                last.completion_tokens,
            );
        }
        p.counters
            .request(&self.ctx.serves, self.route.id.as_str(), result);
        if let Some(meter) = &p.meter {
            meter.send(record_of(&self.ctx, 200, result));
        }
        let keep = complete && (result == "ok" || result == "client_error");
        let tee = if keep { self.tee.take() } else { None };
        if let (Some(tee), true) = (&tee, result == "ok" && self.ctx.contract.is_none()) {
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

fn memchr_usage(chunk: &[u8]) -> bool {
    chunk.windows(15).any(|w| w == b"\"prompt_tokens\"")
}

/// A bad request: 400 in OpenAI's envelope.
fn bad(code: &str, message: &str) -> Response {
    error_body(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        code,
        message,
    )
}

/// Field types OpenAI would reject, checked before any upstream call.
fn validate(request: &Value) -> Result<(), (&'static str, String)> {
    match request.get("model") {
        Some(Value::String(m)) if !m.is_empty() => {}
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err((
                "missing_model",
                "`model` (a logical model name) is required".to_owned(),
            ))
        }
        Some(_) => return Err(("invalid_type", "`model` must be a string".to_owned())),
    }
    let Some(messages) = request
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
    else {
        return Err((
            "missing_messages",
            "`messages` must be a non-empty array".to_owned(),
        ));
    };
    for (i, m) in messages.iter().enumerate() {
        if !m.get("role").is_some_and(Value::is_string) {
            return Err((
                "invalid_type",
                format!("`messages[{i}]` must be an object with a string `role`"),
            ));
        }
    }
    let check =
        |key: &str, ok: fn(&Value) -> bool, what: &str| -> Result<(), (&'static str, String)> {
            match request.get(key) {
                None | Some(Value::Null) => Ok(()),
                Some(v) if ok(v) => Ok(()),
                Some(_) => Err(("invalid_type", format!("`{key}` must be {what}"))),
            }
        };
    check("stream", Value::is_boolean, "a boolean")?;
    for k in ["max_tokens", "max_completion_tokens", "n"] {
        check(k, Value::is_u64, "a non-negative integer")?;
    }
    for k in [
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
    ] {
        check(k, Value::is_number, "a number")?;
    }
    check("tools", Value::is_array, "an array")?;
    check("response_format", Value::is_object, "an object")?;
    check("stream_options", Value::is_object, "an object")?;
    Ok(())
}

async fn handle(proxy: &Proxy, headers: &HeaderMap, body: Body, ctx: &mut Ctx) -> Answer {
    let p = &proxy.inner;
    let client_key = match &p.client_keys {
        Some(keys) => match authorized(keys, headers) {
            Some(k) => k,
            None => {
                return plain(error_body(
                    StatusCode::UNAUTHORIZED,
                    "invalid_request_error",
                    "invalid_api_key",
                    "missing or unknown API key for this proxy (Authorization: Bearer <key>)",
                ))
            }
        },
        None => String::new(),
    };
    let limit = usize::try_from(p.config.max_body).unwrap_or(usize::MAX);
    // A declared length over the limit is refused unread.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        plain(error_body(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            &format!(
                "the request body is larger than {} bytes",
                p.config.max_body
            ),
        ))
    };
    if declared.is_some_and(|n| n > p.config.max_body) {
        return too_large();
    }
    // Slow clients: the whole body within `body_read_timeout`.
    let raw =
        match tokio::time::timeout(p.body_read_timeout, axum::body::to_bytes(body, limit)).await {
            Err(_) => {
                return plain(error_body(
                    StatusCode::REQUEST_TIMEOUT,
                    "invalid_request_error",
                    "request_timeout",
                    "the request body did not arrive in time",
                ))
            }
            Ok(Err(_)) => return too_large(),
            Ok(Ok(raw)) => raw,
        };
    let request: Value = match serde_json::from_slice(&raw) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return plain(bad(
                "invalid_request",
                "the request body must be a JSON object",
            ))
        }
        Err(e) => {
            return plain(bad(
                "invalid_json",
                &format!("the request body is not valid JSON: {e}"),
            ))
        }
    };
    if let Err((code, message)) = validate(&request) {
        return plain(bad(code, &message));
    }
    let Ok(feature) = contract::feature_of(headers) else {
        return plain(bad(
            "invalid_feature",
            "x-probeok-feature must be 1-64 characters of A-Z a-z 0-9 _ . -",
        ));
    };
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let residency = headers
        .get("x-probeok-residency")
        .and_then(|v| v.to_str().ok());
    let needs = Needs::from_request(&request, residency);
    ctx.stream = needs.stream;

    if let Some(idem) = &p.idempotency {
        let key = match idempotency::key_of(headers) {
            Ok(k) => k,
            Err(idempotency::BadKey) => {
                return plain(bad(
                    "invalid_idempotency_key",
                    "Idempotency-Key must be 1-255 visible ASCII characters",
                ))
            }
        };
        if let Some(key) = key {
            match idem.lookup(&client_key, &key, &raw, p.clock.now()).await {
                idempotency::Lookup::Proceed(guard) => ctx.guard = Some(guard),
                idempotency::Lookup::Replay(a) => {
                    ctx.replay = true;
                    let mut r = Response::new(Body::from(a.body));
                    *r.status_mut() = StatusCode::from_u16(a.status).unwrap_or(StatusCode::OK);
                    for (k, v) in &a.headers {
                        if let (Ok(k), Ok(v)) =
                            (HeaderName::try_from(k.as_str()), HeaderValue::from_str(v))
                        {
                            r.headers_mut().insert(k, v);
                        }
                    }
                    r.headers_mut().insert(
                        "x-probeok-idempotent-replay",
                        HeaderValue::from_static("true"),
                    );
                    return plain(r);
                }
                idempotency::Lookup::InProgress => {
                    return plain(error_body(
                        StatusCode::CONFLICT,
                        "invalid_request_error",
                        "idempotency_in_progress",
                        "a request with this Idempotency-Key is still running; retry later",
                    ))
                }
                idempotency::Lookup::Mismatch => {
                    return plain(error_body(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "invalid_request_error",
                        "idempotency_key_reused",
                        "this Idempotency-Key was used with a different request body",
                    ))
                }
                idempotency::Lookup::Unavailable => {
                    return plain(error_body(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "server_error",
                        "idempotency_unavailable",
                        "idempotency keys cannot be checked right now; retry later",
                    ))
                }
            }
        }
    }

    let view = p.weights.borrow().clone();
    // Degradation contracts (layer 3): the live config's contract for this feature, if the
    // model is DEGRADED or CRITICAL now.
    let req = degrade::Req {
        request: &request,
        model: &model,
        needs: &needs,
        view: &view,
        feature: feature.as_deref(),
        owner: contract::owner_of(&client_key),
        residency: residency.map(str::to_owned),
        raw: &raw,
    };
    if let Some(answer) = degrade::apply(proxy, ctx, &req).await {
        return answer;
    }
    route(proxy, ctx, &request, &model, &needs, &view).await
}

/// The proxy's normal path for `model`: plan the candidates, then attempt them in order with
/// failover, retries, breakers and the budget. Contracts are decided before this; the job
/// worker calls it directly (no contract applies to a job's run).
async fn route(
    proxy: &Proxy,
    ctx: &mut Ctx,
    request: &Value,
    model: &str,
    needs: &Needs,
    view: &WeightsView,
) -> Answer {
    let p = &proxy.inner;
    let model = model.to_owned();
    let now = Instant::now();
    let planned = {
        let mut rng = rand::thread_rng();
        select::plan(
            &model,
            needs,
            &p.routes,
            view,
            |id| p.rests.is_resting(id, now),
            &mut rng,
        )
    };
    // Metered under the model asked for (a contract's fallback keeps the original's name);
    // unknown models and incapable requests are not metered.
    let serves = |ctx: &mut Ctx| {
        if ctx.serves.is_empty() {
            ctx.serves = model.clone();
        }
    };
    let plan = match planned {
        Ok(plan) => plan,
        Err(Rejection::UnknownModel) => {
            return plain(error_body(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                &format!(
                "the model `{model}` does not exist: GET /v1/models lists the models served here"
            ),
            ))
        }
        Err(Rejection::NoCapableRoute { missing }) => {
            let code = if missing == ["context_window"] {
                "context_length_exceeded"
            } else {
                "no_capable_route"
            };
            return plain(bad(
                code,
                &format!(
                    "no route of `{model}` can serve this request (lacking: {})",
                    missing.join(", ")
                ),
            ));
        }
        Err(Rejection::AllResting) => {
            serves(ctx);
            let ids: Vec<RouteId> = p
                .routes
                .iter()
                .filter(|r| r.serves == model)
                .map(|r| r.id.clone())
                .collect();
            let wait = p
                .rests
                .soonest_end(&ids, now)
                .unwrap_or(Duration::from_secs(1));
            let mut r = error_body(
                StatusCode::SERVICE_UNAVAILABLE,
                "upstream_error",
                "all_routes_rate_limited",
                &format!("every route of `{model}` is rate limited; retry later"),
            );
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return plain(r);
        }
    };
    serves(ctx);
    let feed_stale = p
        .feed
        .as_ref()
        .and_then(|f| f.stale_since(Instant::now(), p.clock.now()));
    ctx.d.degraded_since = {
        let mut map = p.degraded_since.lock().unwrap_or_else(|e| e.into_inner());
        if plan.degraded {
            Some(*map.entry(model.clone()).or_insert_with(|| p.clock.now()))
        } else {
            map.remove(&model);
            None
        }
    }
    .or(feed_stale);
    if !plan.resting.is_empty() {
        ctx.d.fallback_reason = Some("rate_limited".to_owned());
    }

    // Open breakers: their routes go last, tried only when everything else failed.
    let first_open = plan
        .candidates
        .first()
        .is_some_and(|r| p.breakers.refuses(&r.id, now));
    let (mut candidates, open): (Vec<Arc<Route>>, Vec<Arc<Route>>) = plan
        .candidates
        .into_iter()
        .partition(|r| !p.breakers.refuses(&r.id, now));
    for r in &open {
        let n = ctx.attempts.len() + 1;
        ctx.attempts.push(skipped(n, &r.id, "breaker_open"));
        p.counters.failover("breaker_open");
    }
    // Disclosed when a breaker moved the request off its first choice.
    if first_open {
        ctx.d
            .fallback_reason
            .get_or_insert_with(|| "breaker_open".to_owned());
    }
    candidates.extend(open);

    let outgoing = Outgoing {
        body: request,
        stream: needs.stream,
        request_id: &ctx.d.request_id,
    };
    let total_deadline = now + p.config.total_timeout;
    let max = usize::try_from(p.config.max_attempts).unwrap_or(usize::MAX);
    candidates.truncate(max);
    let mut queue: VecDeque<Arc<Route>> = candidates.into();
    // Routes that failed transiently, for same-route retries once every candidate was tried.
    let mut retry_pool: Vec<Arc<Route>> = Vec::new();
    let mut waited = Duration::ZERO;
    let mut retries = 0u32;
    let mut overloaded = false;
    let mut failures: Vec<ProbeError> = Vec::new();
    // Layer 5: what a non-primary attempt may cost extra, estimated at its maximum.
    let prompt_tokens = select::estimate_prompt_tokens(request);
    let max_tokens = request
        .get("max_tokens")
        .or_else(|| request.get("max_completion_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_MAX_TOKENS);
    let mut budget_refused = false;
    while ctx.d.attempts < max {
        let route = if let Some(r) = queue.pop_front() {
            r
        } else {
            // Never eagerly: full-jitter backoff, within `max_retry_wait` in total.
            let t = Instant::now();
            retry_pool.retain(|r| !p.breakers.refuses(&r.id, t) && !p.rests.is_resting(&r.id, t));
            if retry_pool.is_empty() {
                break;
            }
            let r = retry_pool[retries as usize % retry_pool.len()].clone();
            let wait = {
                let mut rng = rand::thread_rng();
                breaker::backoff(
                    retries,
                    breaker::BACKOFF_BASE,
                    p.config.max_retry_wait,
                    &mut rng,
                )
            };
            if p.config.max_retry_wait.is_zero()
                || waited + wait > p.config.max_retry_wait
                || t + wait >= total_deadline
            {
                break;
            }
            tokio::time::sleep(wait).await;
            waited += wait;
            retries += 1;
            r
        };
        let remaining = total_deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            break;
        }
        // Bounded concurrency per upstream: a full route is skipped, not waited for.
        let permit = match p.limits.get(&route.id) {
            Some(sem) => match sem.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    overloaded = true;
                    let n = ctx.attempts.len() + 1;
                    ctx.attempts.push(skipped(n, &route.id, "overloaded"));
                    p.counters.failover("overloaded");
                    ctx.d
                        .fallback_reason
                        .get_or_insert_with(|| "overloaded".to_owned());
                    continue;
                }
            },
            None => None,
        };
        let left = u32::try_from(queue.len() + 1).unwrap_or(u32::MAX);
        let limits = Limits {
            budget: remaining / left,
            first_byte_timeout: p
                .first_byte_overrides
                .get(&route.id)
                .copied()
                .unwrap_or(p.config.first_byte_timeout),
            stream_idle_timeout: p.config.stream_idle_timeout,
        };
        let reservation: Option<Reservation> = match p.budget.get() {
            Some(b) if route.tier != Tier::Primary => {
                match b.reserve(&route.id, prompt_tokens, max_tokens) {
                    Ok(r) => r,
                    Err(refused) => {
                        tracing::warn!(route = %route.id, %refused, "not sent to a non-primary route: the extra-cost budget cannot cover it");
                        budget_refused = true;
                        ctx.d
                            .fallback_reason
                            .get_or_insert_with(|| "extra_cost_budget".to_owned());
                        continue;
                    }
                }
            }
            _ => None,
        };
        // An open route here is a last resort; a half-open one takes a trial slot.
        let _ = p.breakers.admit(&route.id, Instant::now());
        ctx.d.attempts += 1;
        ctx.d.route = Some(route.id.clone());
        ctx.price = route.price.clone();
        if ctx.d.fallback_reason.is_none() && route.tier != Tier::Primary && !plan.degraded {
            ctx.d.fallback_reason = Some("no_primary_usable".to_owned());
        }
        let n = ctx.attempts.len() + 1;
        let started_at = p.clock.now();
        match p
            .upstream
            .attempt(&route, &outgoing, limits, started_at)
            .await
        {
            Attempt::Answer { body, outcome } => {
                if let Some(r) = reservation {
                    let (input, output) = usage(&body)
                        .unwrap_or((prompt_tokens, u64::from(outcome.output_tokens.unwrap_or(0))));
                    r.settle(input, output);
                }
                let verdict = if outcome.success {
                    Verdict::Success
                } else {
                    Verdict::Neutral // a refusal: the request's answer, not the route's fault
                };
                p.breakers.record(&route.id, Instant::now(), verdict);
                let mut rec = attempt_record(n, &outcome, None, "ok");
                if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                    let (pt, ct) = usage_of(&v);
                    rec.prompt_tokens = pt;
                    rec.completion_tokens = ct.or(rec.completion_tokens);
                }
                rec.cost = meter::cost(
                    route.price.as_ref(),
                    rec.prompt_tokens,
                    rec.completion_tokens,
                );
                ctx.attempts.push(rec);
                p.passive.send(outcome);
                ctx.outcome = "ok";
                ctx.answer = Some(body.clone());
                let mut r = Response::new(Body::from(body));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                return plain(r);
            }
            Attempt::ClientError {
                status,
                content_type,
                body,
                outcome,
            } => {
                if let Some(r) = reservation {
                    r.release();
                }
                p.breakers
                    .record(&route.id, Instant::now(), Verdict::Neutral);
                ctx.attempts
                    .push(attempt_record(n, &outcome, None, "client_error"));
                p.passive.send(outcome);
                ctx.outcome = "client_error";
                ctx.answer = Some(body.clone());
                let mut r = Response::new(Body::from(body));
                *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
                r.headers_mut().insert(header::CONTENT_TYPE, content_type);
                return plain(r);
            }
            Attempt::Committed(c) => {
                ctx.attempts.push(AttemptRecord {
                    n: u32::try_from(n).unwrap_or(u32::MAX),
                    route: route.id.as_str().to_owned(),
                    reason: None,
                    status_class: "2xx".to_owned(),
                    status: Some(200),
                    ttfb_ms: None,
                    latency_ms: 0.0,
                    prompt_tokens: None,
                    completion_tokens: None,
                    cost: None,
                    outcome: "ok".to_owned(),
                });
                let slot: Arc<Mutex<Option<ProbeOutcome>>> = Arc::new(Mutex::new(None));
                let on_end = {
                    let slot = slot.clone();
                    Box::new(move |o: &ProbeOutcome| {
                        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(o.clone());
                    })
                };
                let inner = stream::body(
                    *c,
                    p.passive.clone(),
                    on_end,
                    reservation.map(|r| (r, prompt_tokens)),
                );
                // The route's concurrency slot is held until the stream ends.
                let body = inner
                    .map(move |chunk| {
                        let _held = &permit;
                        chunk
                    })
                    .boxed();
                return Answer::Stream { body, slot, route };
            }
            Attempt::Failed { error, outcome } => {
                if let Some(r) = reservation {
                    r.release();
                }
                let class = class_of(&error);
                let rate_limited = matches!(error, ProbeError::RateLimited { .. });
                // 429s rest the route until Retry-After; they do not also count as failures.
                let verdict = if rate_limited {
                    Verdict::Neutral
                } else {
                    Verdict::Failure
                };
                p.breakers.record(&route.id, Instant::now(), verdict);
                let reason = reason_code(&error);
                ctx.attempts
                    .push(attempt_record(n, &outcome, Some(reason.clone()), "failed"));
                p.counters.failover(&reason);
                p.passive.send(outcome);
                if let ProbeError::RateLimited { retry_after_ms, .. } = &error {
                    let rest = retry_after_ms.map_or(attempt::DEFAULT_REST, Duration::from_millis);
                    p.rests.rest(&route.id, rest, Instant::now());
                }
                if class == Class::RouteFault {
                    tracing::warn!(route = %route.id, error = %error, "route fault (key, account or model name): trying the next candidate");
                } else {
                    tracing::info!(route = %route.id, error = %error, attempt = ctx.d.attempts, "attempt failed: trying the next candidate");
                }
                if class == Class::Transient
                    && !rate_limited
                    && !retry_pool.iter().any(|r| r.id == route.id)
                {
                    retry_pool.push(route.clone());
                }
                // The first reason the request left its first choice is the one disclosed.
                ctx.d.fallback_reason.get_or_insert(reason);
                failures.push(error);
            }
        }
    }
    ctx.outcome = "failed";
    if failures.is_empty() && overloaded {
        return plain(error_body(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream_error",
            "proxy_overloaded",
            &format!("every route of `{model}` is at its concurrency limit; retry later"),
        ));
    }
    if failures.is_empty() && budget_refused {
        return plain(error_body(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream_error",
            "extra_cost_budget_exhausted",
            &format!("no primary route of `{model}` is usable and this hour's extra-cost budget for backups is spent; retry later"),
        ));
    }
    plain(exhausted(&model, &failures))
}

/// `max_tokens` assumed for the budget estimate when a request sets none.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// `usage.{prompt_tokens, completion_tokens}` of a non-streamed answer.
fn usage(body: &[u8]) -> Option<(u64, u64)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let u = v.get("usage")?;
    Some((
        u.get("prompt_tokens")?.as_u64()?,
        u.get("completion_tokens")?.as_u64()?,
    ))
}

/// Every candidate failed (or the time ran out).
fn exhausted(model: &str, failures: &[ProbeError]) -> Response {
    let all = |f: fn(&ProbeError) -> bool| !failures.is_empty() && failures.iter().all(f);
    if all(|e| matches!(e.status(), Some(401 | 403))) {
        return error_body(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "upstream_auth_error",
            &format!("every route of `{model}` refused the proxy's credentials; the operator has been told"),
        );
    }
    if all(|e| {
        matches!(
            e,
            ProbeError::TimeoutBeforeFirstByte | ProbeError::Timeout | ProbeError::Stalled
        )
    }) || failures.is_empty()
    {
        return error_body(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_error",
            "upstream_timeout",
            &format!("no route of `{model}` answered in time"),
        );
    }
    let last = failures.last().map(reason_code).unwrap_or_default();
    error_body(
        StatusCode::SERVICE_UNAVAILABLE,
        "upstream_error",
        "upstream_unavailable",
        &format!(
            "no route of `{model}` could answer ({} attempts, last: {last}); retry later",
            failures.len()
        ),
    )
}
