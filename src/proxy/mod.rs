//! The bundled OpenAI-compatible routing proxy (see `docs/http-api.md`):
//! `POST /v1/chat/completions` (streaming and not), `POST /v1/embeddings` ([`embeddings`]: the
//! same candidates, failover, breakers, metering and passive outcomes, among the routes of one
//! embedding model), `GET /v1/models` and `GET /v1/jobs/{id}`,
//! following the weights feed through a watch channel and reporting every attempt as a
//! passive outcome.
//!
//! A request flows through, in order:
//!
//! 1. `server`: the router and its workers, `[proxy] workers` threads each with a
//!    single-threaded runtime, its own socket (`SO_REUSEPORT`) and its own upstream pool,
//!    so a request stays on one thread; the connection loop (header read timeout,
//!    connections bounded across workers, graceful shutdown: committed streams run to their
//!    end, bounded by the service's drain timeout).
//! 2. `intake`: the client's key (`client_keys_env`; never forwarded), the body within
//!    `max_body` and the body read timeout, JSON that OpenAI would accept, the
//!    `Idempotency-Key` ([`idempotency`]: answers kept in SQLite until `idempotency_ttl`).
//! 3. `degrade`: the degradation contract of the request's feature, when its model is
//!    DEGRADED or CRITICAL ([`contract`], pure): a fallback model, a rejection, a cached
//!    answer ([`cache`]) or an async job ([`jobs`], with its worker).
//! 4. `failover`: the candidates ([`select`], pure, over the proxy's view of the weights,
//!    [`weights`]), tried in order under the user's in-flight limits per route and provider
//!    ([`inflight`]; none unless configured), circuit breakers and
//!    backoff ([`breaker`]; a client's own failures are neutral there, [`attribution`]) and the
//!    extra-cost budget; one attempt ([`attempt`]: per-candidate
//!    budget, stream watchdog, failover classes, 429 rests; sent by `transport`, the upstream
//!    HTTP client) at a time; a committed stream is forwarded by [`stream`].
//! 5. `request`: the request's context, its `x-probeok-*` disclosure headers, and `finish`:
//!    metering ([`meter`], `record`), counters, the route observables ([`observe`], with the
//!    structured-output check of [`structured`]), the idempotency key and the cache; the
//!    `"probeok"` object of a non-normal answer (`notice`); a sampled request's copies to its
//!    `[[shadow]]` routes, once the answer is complete ([`shadow`]).
//!
//! Each attempt sends the request as the route's profile shapes it ([`profile`],
//! `[[route]] request`); routes named by a `[[shadow]]` are never candidates.
//!
//! Traced requests ([`crate::trace`], `[tracing]`) are one span each with a child span per
//! attempt (`trace`).
//!
//! Every error the proxy gives of its own is a `reject::Reject` in OpenAI's envelope
//! `{"error":{"message","type","code"}}`. Upstream keys come from each provider's
//! `api_key_env`, are added by the proxy and never returned. [`export`] puts the proxy's
//! families on the monitor's `/metrics`; [`remote`] links a standalone proxy to its monitor.

pub(crate) mod attempt;
pub mod attribution;
pub(crate) mod breaker;
pub(crate) mod cache;
pub(crate) mod clients;
pub mod contract;
mod degrade;
mod embeddings;
pub mod export;
mod failover;
pub mod idempotency;
pub(crate) mod inflight;
mod intake;
pub mod jobs;
pub(crate) mod meter;
mod notice;
pub(crate) mod observe;
pub(crate) mod profile;
pub(crate) mod readonly;
mod record;
mod reject;
pub mod remote;
mod request;
pub mod select;
mod server;
pub mod shadow;
pub(crate) mod stream;
pub(crate) mod structured;
mod trace;
mod transport;
pub(crate) mod weights;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::clock::{Clock, SystemClock};
use crate::config::{Config, ProxyConfig};
use crate::extra_cost::ExtraCost;
use crate::probe::ProbeOutcome;
use crate::route::{Route, RouteId, RouteMap};
use crate::store::Store;

use attempt::{PassiveSink, Rests, Upstream};
use breaker::Breakers;
pub use breaker::{BreakerSnapshot, BreakerState};
pub use clients::ClientReport;
pub use export::ProxyStats;
pub use failover::DEFAULT_MAX_TOKENS;
use intake::ClientKeys;
pub use meter::{CountersSnapshot, Meter, ProxyCounters};
pub use server::{bind, router, serve, Listeners, HEADER_READ_TIMEOUT};
pub use weights::{FeedStatus, WeightsRx, WeightsView};

/// The whole request body must arrive within this (slow clients get 408).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// What the proxy uses besides the config.
#[derive(Clone)]
pub struct ProxyOptions {
    /// Metering and idempotency keys need a store; without one both are off.
    pub store: Option<Store>,
    pub body_read_timeout: Duration,
    /// HTTP/1 request heads must arrive within this (see [`HEADER_READ_TIMEOUT`]).
    pub header_read_timeout: Duration,
    /// A remote weights feed's health: answers say `degraded` while it is stale.
    pub feed: Option<Arc<FeedStatus>>,
    pub clock: Arc<dyn Clock>,
    /// The live config (hot reload): contracts are read from here per request. `None`: the
    /// config the proxy was built with, for good.
    pub live: Option<tokio::sync::watch::Receiver<Arc<Config>>>,
    /// Where request and attempt spans go (off by default).
    pub tracer: crate::trace::Tracer,
    /// The client keys themselves, instead of reading `client_keys_env` (an embedder or a
    /// test hands the values over rather than setting the environment).
    pub client_keys: Option<Vec<crate::secret::Secret>>,
    /// The shadow copies' queue and concurrency.
    pub shadow: shadow::ShadowLimits,
    /// Count the route observables (with a store; on by default; a benchmark turns it off to
    /// measure what they add).
    pub observe: bool,
    /// The shared spend ledger client limits book in. `None`: one on `store`, when there is
    /// a store.
    pub spend: Option<crate::spend::Spend>,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        Self {
            store: None,
            body_read_timeout: BODY_READ_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            feed: None,
            clock: Arc::new(SystemClock),
            live: None,
            tracer: crate::trace::Tracer::off(),
            client_keys: None,
            shadow: shadow::ShadowLimits::default(),
            observe: true,
            spend: None,
        }
    }
}

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] crate::proxy::transport::TransportError),
}

/// Since when a condition has held per logical model, as this proxy saw it.
#[derive(Default)]
struct Since(Mutex<FxHashMap<String, DateTime<Utc>>>);

impl Since {
    /// While `holds`, the time `model` was first seen so (`now` the first time); otherwise
    /// forgets it and answers `None`.
    fn track(&self, model: &str, holds: bool, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if holds {
            Some(*map.entry(model.to_owned()).or_insert(now))
        } else {
            map.remove(model);
            None
        }
    }
}

/// The proxy's state: cheap to clone (two `Arc`s).
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
    /// What is the serving worker's own (see [`server`]); the home runtime's outside workers.
    local: Arc<Local>,
}

/// A worker's own part of the proxy: nothing in it is touched by another worker.
struct Local {
    /// Its upstream connection pool, whose connections run on the worker's runtime.
    upstream: Arc<Upstream>,
    /// Which worker (`None`: not a worker; the async-job runner, an embedder's router).
    worker: Option<usize>,
}

/// Requests each worker has taken, each counter on its own cache line (written by one
/// worker only).
#[derive(Default)]
struct Served(Vec<Padded>);

#[repr(align(64))]
#[derive(Default)]
struct Padded(std::sync::atomic::AtomicU64);

struct Inner {
    config: ProxyConfig,
    routes: Vec<Arc<Route>>,
    weights: WeightsRx,
    /// The home runtime's upstream (async jobs, shadow copies, an embedder's router).
    upstream: Arc<Upstream>,
    served: Served,
    rests: Rests,
    passive: PassiveSink,
    /// Off when the variable is unset.
    client_keys: ClientKeys,
    /// The logical models of embeddings routes (served at `POST /v1/embeddings` only).
    embedding_models: std::collections::BTreeSet<String>,
    /// Route profiles (`request = {…}`), by route.
    profiles: RouteMap<crate::config::RequestProfile>,
    /// `[[proxy.client]]`: named clients and their spend limits.
    clients: Arc<clients::Clients>,
    /// Routes whose own `first_byte_timeout` overrides the proxy's stream watchdog.
    first_byte_overrides: RouteMap<Duration>,
    /// Logical model → since when it has been served degraded (all weights 0).
    degraded_since: Since,
    /// Logical model → since when its contract has applied (its primaries DEGRADED or
    /// CRITICAL), as this proxy saw it: the `degraded_since` of the contract's own answers.
    contract_since: Since,
    clock: Arc<dyn Clock>,
    breakers: Breakers,
    /// Recent outcomes per route and client: whose fault a failure is.
    ledger: Arc<attribution::Ledger>,
    counters: ProxyCounters,
    meter: Option<Meter>,
    /// Route observables from this proxy's traffic (needs the store).
    observer: Option<observe::Observer>,
    idempotency: Option<Arc<idempotency::Idempotency>>,
    /// Requests in flight per route and provider, and the configured caps.
    in_flight: inflight::InFlight,
    body_read_timeout: Duration,
    header_read_timeout: Duration,
    feed: Option<Arc<FeedStatus>>,
    /// The hourly extra-cost budget, once the app sets it: requests to non-primary
    /// routes reserve their estimated maximum extra cost first.
    budget: std::sync::OnceLock<Arc<ExtraCost>>,
    /// The current config, for what reloads without a restart (contracts).
    live: tokio::sync::watch::Receiver<Arc<Config>>,
    /// `async_queue` jobs (needs the store).
    jobs: Option<Arc<jobs::Jobs>>,
    /// `cached_response` answers (needs the store).
    cache: Option<cache::Cache>,
    /// The store itself: its health is read-only mode's switch.
    store: Option<Store>,
    /// `[[shadow]]` copies and their comparisons (`None`: no shadow configured).
    shadows: Option<shadow::Shadows>,
    tracer: crate::trace::Tracer,
    /// Where `GET /api/v1/admin/clients` reads the admin token (`server.admin_token_env`).
    admin_token: (crate::secret::Env, String),
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
        let all: Vec<Arc<Route>> = full.routes().into_iter().map(Arc::new).collect();
        // A shadow route gets copies only: never a candidate for real traffic.
        let shadowed = full.shadow_routes();
        let routes: Vec<Arc<Route>> = (all.iter())
            .filter(|r| !shadowed.contains(&r.id))
            .cloned()
            .collect();
        let profiles = full
            .routes
            .iter()
            .filter_map(|r| {
                let p = r.request.clone()?;
                Some((RouteId::new(&r.provider, &r.region, &r.model), p))
            })
            .collect();
        let first_byte_overrides = full
            .routes
            .iter()
            .filter_map(|r| {
                let fbt = r.first_byte_timeout?;
                Some((RouteId::new(&r.provider, &r.region, &r.model), fbt))
            })
            .collect();
        let upstream = Upstream::new(&all, &full.env)
            .map(Arc::new)
            .map_err(ProxyError::Client)?;
        let shadows =
            shadow::Shadows::start(full, &all, upstream.clone(), clock.clone(), opts.shadow);
        let client_keys = match opts.client_keys.clone() {
            Some(keys) => ClientKeys::given(keys),
            None => ClientKeys::from_env(&full.env, &config.client_keys_env),
        };
        let max_body = usize::try_from(config.max_body).unwrap_or(usize::MAX);
        let store = opts.store.as_ref();
        let spend =
            (opts.spend.clone()).or_else(|| store.map(|s| spend_on(s, clock.clone(), config)));
        let clients = Arc::new(clients::Clients::new(&config.clients, &full.env, spend));
        let breakers = Breakers::new(routes.iter().map(|r| &r.id), &config.breaker);
        let in_flight = inflight::InFlight::new(full, &routes);
        let served = Served(
            (0..config.workers.max(1))
                .map(|_| Padded::default())
                .collect(),
        );
        Ok(Self::from_inner(Arc::new(Inner {
            config: config.clone(),
            routes,
            weights,
            upstream,
            served,
            rests: Rests::default(),
            passive: PassiveSink::new(passive),
            client_keys,
            embedding_models: full.embedding_models(),
            clients,
            first_byte_overrides,
            profiles,
            degraded_since: Since::default(),
            contract_since: Since::default(),
            clock,
            breakers,
            ledger: Arc::default(),
            counters: ProxyCounters::default(),
            meter: store
                .map(|s| Meter::spawn(s.writer(), s.health().clone(), opts.clock.clone()).0),
            observer: (store.filter(|_| opts.observe))
                .map(|s| observe::Observer::spawn(s.writer(), opts.clock.clone())),
            jobs: store.map(|s| Arc::new(jobs::Jobs::new(s.clone(), max_body))),
            cache: store.map(|s| {
                cache::Cache::new(s.clone(), max_body, config.cached_answers_per_client.into())
            }),
            idempotency: store.map(|s| {
                idempotency::Idempotency::new(
                    s.clone(),
                    opts.clock.clone(),
                    config.idempotency_ttl,
                    config.idempotency_wait,
                    max_body,
                    config.idempotency_keys_per_client.into(),
                )
            }),
            store: store.cloned(),
            in_flight,
            shadows,
            body_read_timeout: opts.body_read_timeout,
            header_read_timeout: opts.header_read_timeout,
            feed: opts.feed,
            tracer: opts.tracer,
            admin_token: (full.env.clone(), full.server.admin_token_env.clone()),
            budget: std::sync::OnceLock::new(),
            live: opts
                .live
                .unwrap_or_else(|| tokio::sync::watch::channel(Arc::new(full.clone())).1),
        }))
        .watch_store())
    }

    /// The proxy as the home runtime uses it (its upstream pool).
    fn from_inner(inner: Arc<Inner>) -> Self {
        let local = Arc::new(Local {
            upstream: inner.upstream.clone(),
            worker: None,
        });
        Self { inner, local }
    }

    /// The handle worker `worker` serves with: the shared state, and an upstream pool of its
    /// own (made here, its connections on the runtime that first uses it).
    fn for_worker(&self, worker: usize) -> Result<Self, ProxyError> {
        let upstream = (self.inner.upstream.for_worker())
            .map(Arc::new)
            .map_err(ProxyError::Client)?;
        Ok(Self {
            inner: self.inner.clone(),
            local: Arc::new(Local {
                upstream,
                worker: Some(worker),
            }),
        })
    }

    /// Counts a request taken by this handle's worker.
    fn note_served(&self) {
        if let Some(slot) = (self.local.worker).and_then(|w| self.inner.served.0.get(w)) {
            slot.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Requests each proxy worker has taken so far, by worker (`[proxy] workers` of them):
    /// how evenly the kernel spreads connections over the workers' sockets.
    pub fn served_by_worker(&self) -> Vec<u64> {
        (self.inner.served.0.iter())
            .map(|s| s.0.load(std::sync::atomic::Ordering::Relaxed))
            .collect()
    }

    /// Starts the store check of read-only mode ([`readonly`]); it ends with the proxy.
    fn watch_store(self) -> Self {
        if let Some(store) = &self.inner.store {
            readonly::watch(
                Arc::downgrade(&self.inner),
                store.clone(),
                self.inner.clock.clone(),
            );
        }
        self
    }

    /// Accounts non-primary serving against `budget` from now on (once; a second call is
    /// ignored).
    pub fn set_budget(&self, budget: Arc<ExtraCost>) {
        let _ = self.inner.budget.set(budget);
    }

    /// Writes the route observables counted so far (they are written every
    /// [`observe::FLUSH_EVERY`] anyway) and waits for the commit.
    pub async fn flush_observed(&self) {
        if let Some(o) = &self.inner.observer {
            o.flush().await;
        }
    }

    /// Every named client's spend this period (blocking: reads the ledger).
    pub fn client_report_blocking(&self) -> Vec<ClientReport> {
        self.inner
            .clients
            .report_blocking(&self.inner.config.clients)
    }

    /// Spent this period per client with a limit, as last seen (`probeok_client_spend`).
    pub fn client_spend(&self) -> Vec<(String, f64)> {
        self.inner.clients.spent()
    }

    /// Passive outcomes dropped because the queue was full.
    pub fn passive_dropped(&self) -> u64 {
        self.inner.passive.dropped()
    }

    /// Whether the proxy's store answers (`None` without one): what read-only mode goes by,
    /// and what other rules of the request path (a client's spend limit) may read.
    pub fn store_health(&self) -> Option<Arc<crate::store::StoreHealth>> {
        self.inner.store.as_ref().map(|s| s.health().clone())
    }

    /// Requests in flight per route now (`probeok_proxy_in_flight`), sorted by route.
    pub fn in_flight(&self) -> Vec<(RouteId, u32)> {
        self.inner.in_flight.routes()
    }

    /// Requests in flight per provider now, all its routes together, sorted by provider.
    pub fn provider_in_flight(&self) -> Vec<(String, u32)> {
        self.inner.in_flight.providers()
    }

    /// Every route's circuit breaker, now.
    pub fn breakers(&self) -> Vec<BreakerSnapshot> {
        self.inner.breakers.snapshot(Instant::now())
    }

    /// Per `[[shadow]]`, the comparison with the real answers over the last hour and day.
    pub fn shadow_report(&self) -> Vec<serde_json::Value> {
        self.inner
            .shadows
            .as_ref()
            .map(shadow::Shadows::report)
            .unwrap_or_default()
    }

    /// `probeok_proxy_requests_total` and `probeok_proxy_failovers_total`, with drop counts.
    pub fn counters(&self) -> CountersSnapshot {
        let mut s = self.inner.counters.snapshot();
        s.meter_dropped = self.inner.meter.as_ref().map_or(0, Meter::dropped);
        s.passive_dropped = self.inner.passive.dropped();
        s.observed_dropped = (self.inner.observer.as_ref()).map_or(0, observe::Observer::dropped);
        s
    }
}

/// A reservation outlives the longest a request can run (its total timeout and a committed
/// stream's longest life) plus a margin: a live request's booking is never released under it.
pub fn hold_for(config: &ProxyConfig) -> Duration {
    config.total_timeout + config.max_stream_duration + Duration::from_secs(60)
}

/// The spend ledger on `store`, holding reservations for [`hold_for`].
pub fn spend_on(store: &Store, clock: Arc<dyn Clock>, config: &ProxyConfig) -> crate::spend::Spend {
    crate::spend::Spend::new(store.spend_ledger(), clock, hold_for(config))
}
