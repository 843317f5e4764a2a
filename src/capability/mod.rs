//! Capability probes: `PROBE_OK` proves a route answers chat, but applications also depend on
//! function calling and structured output, each of which breaks on its own while chat keeps
//! working. Every route's declared `tools` and `json_schema` capabilities
//! (`route.capabilities`) are probed every `[capability] every`:
//!
//! - [`wire`]: the fixed requests (a forced `probe_echo(token)` call; a two-field JSON schema)
//!   and the checks of their answers, per provider dialect (pure);
//! - [`client`]: sending one, bounded;
//! - [`judge`]: two failures in a row (the second a quick re-probe) while chat answers open a
//!   `capability_lost` finding, one success closes it (pure);
//! - [`cadence`]: the loop the capability and long-prompt probes share (a spread first round,
//!   a bound on probes in flight, a quick re-check when the judge asks for one);
//! - [`run`]: the leader's task — spread over the interval, a bounded few probes at a time
//!   ([`in_flight`]), every
//!   result stored (`store::capabilities`), the open findings published on a `watch` channel.
//!
//! The findings are drift findings of kind `capability_lost` (`behavior_changed`, severity
//! `warning`), merged into the drift snapshot, so they reach the alert engine, the status API
//! and the pages exactly as regression-set findings do. They never change a route's state or
//! its weight: chat still works there.
//!
//! [`long_prompt`] (`[capability] long_prompt`, off by default) sends every chat route a long
//! prompt on its own cadence and judges its time to first token against the route's own
//! baseline: `long_prompt_slow` (a warning, never a failure mode) or, for a wrong answer,
//! `capability_lost: long_prompt`.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod cadence;
pub mod client;
pub mod judge;
pub mod long_prompt;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::CapabilityConfig;
use crate::drift::DriftFinding;
use crate::health::HealthRx;
use crate::route::{Capability, Route};
use crate::secret::Env;
use crate::store::capabilities::{CapabilityOp, CapabilityRow};
use crate::store::Store;

/// The fewest capability probes in flight at once: a slow provider must not hold the others
/// back.
pub const MIN_IN_FLIGHT: usize = 4;
/// The most: they are low priority next to the chat probes.
pub const MAX_IN_FLIGHT: usize = 64;
/// What one probe is assumed to take when sizing the bound: a slow forced tool call.
const PROBE_TIME: Duration = Duration::from_secs(10);

/// How many of `items` probes may be in flight at once so that each is probed every `every`
/// even when each takes [`PROBE_TIME`]: between [`MIN_IN_FLIGHT`] and [`MAX_IN_FLIGHT`] (past
/// that a round takes longer than `every`, and probes come later, never more often).
pub fn in_flight(items: usize, every: Duration) -> usize {
    cadence::bound(items, every, PROBE_TIME, MIN_IN_FLIGHT, MAX_IN_FLIGHT)
}

/// A capability that is probed (`stream` is the chat probe itself; `vision` is not probed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Probed {
    Tools,
    JsonSchema,
}

impl Probed {
    pub fn as_str(self) -> &'static str {
        match self {
            Probed::Tools => "tools",
            Probed::JsonSchema => "json_schema",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tools" => Some(Probed::Tools),
            "json_schema" => Some(Probed::JsonSchema),
            _ => None,
        }
    }
}

/// The route's declared capabilities that are probed, in a fixed order.
pub fn probed(route: &Route) -> Vec<Probed> {
    let mut out = Vec::new();
    // An embeddings route answers no conversation: nothing of chat's to probe.
    if route.embedding.is_some() {
        return out;
    }
    if route.capabilities.contains(&Capability::Tools) {
        out.push(Probed::Tools);
    }
    if route.capabilities.contains(&Capability::JsonSchema) {
        out.push(Probed::JsonSchema);
    }
    out
}

/// The open `capability_lost` findings.
pub type LostRx = watch::Receiver<Arc<Vec<DriftFinding>>>;

/// What the task needs.
pub struct CapabilityDriver {
    pub routes: Arc<Vec<Route>>,
    pub config: CapabilityConfig,
    /// Where the key variables are read (at every probe: a rotated key takes effect).
    pub env: Env,
    /// Where results are kept; `None` keeps none (the findings still work).
    pub store: Option<Store>,
    /// How long results are kept (`[storage] retention_days`, as raw outcomes).
    pub retention: Duration,
    pub clock: Arc<dyn Clock>,
    /// Detection's snapshot: failures while chat fails are the outage's, not the capability's.
    pub health: HealthRx,
}

/// Starts the task; the receiver carries the open findings, empty at first.
pub fn spawn(
    d: CapabilityDriver,
    shutdown: CancellationToken,
) -> (tokio::task::JoinHandle<()>, LostRx) {
    let (tx, rx) = watch::channel(Arc::new(Vec::new()));
    let task = tokio::spawn(run(d, tx, shutdown));
    (task, rx)
}

/// One probe's result.
pub struct Done {
    item: usize,
    started: Instant,
    at: chrono::DateTime<chrono::Utc>,
    latency_ms: u64,
    result: Result<(), String>,
}

/// The probes of one leader term: what is probed, the judge, where findings go. [`run`] drives
/// it on the cadence; tests drive it probe by probe ([`Prober::probe`], [`Prober::pass`]).
pub struct Prober {
    d: CapabilityDriver,
    items: Vec<(Arc<Route>, Probed)>,
    http: reqwest::Client,
    judge: judge::Judge,
    findings: watch::Sender<Arc<Vec<DriftFinding>>>,
}

impl Prober {
    pub fn new(
        d: CapabilityDriver,
        findings: watch::Sender<Arc<Vec<DriftFinding>>>,
    ) -> Result<Self, client::ClientError> {
        let items = d
            .routes
            .iter()
            .flat_map(|r| {
                let r = Arc::new(r.clone());
                probed(&r).into_iter().map(move |c| (r.clone(), c))
            })
            .collect();
        Ok(Self {
            d,
            items,
            http: client::http_client()?,
            judge: judge::Judge::default(),
            findings,
        })
    }

    /// Every declared, probed capability of every route: `(route, capability)`.
    pub fn items(&self) -> Vec<(crate::route::RouteId, Probed)> {
        self.items.iter().map(|(r, c)| (r.id.clone(), *c)).collect()
    }

    /// Sends item `i`'s probe (without judging it): owns what it needs, so many can run at once.
    fn send(&self, i: usize) -> impl std::future::Future<Output = Done> + Send + 'static {
        let (route, cap) = self.items[i].clone();
        let key = route
            .api_key_env
            .as_ref()
            .and_then(|v| self.d.env.secret(v));
        let http = self.http.clone();
        let clock = self.d.clock.clone();
        async move {
            let at = clock.now();
            let started = Instant::now();
            let result = client::probe(&http, &route, key.as_ref(), cap, route.probe.timeout).await;
            let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            Done {
                item: i,
                started,
                at,
                latency_ms,
                result,
            }
        }
    }

    /// Judges, stores and publishes one result; answers when to probe the item again.
    async fn take(&mut self, done: &Done) -> judge::Verdict {
        let (route, cap) = self.items[done.item].clone();
        let chat_ok = judge::chat_answers(self.d.health.borrow().route(&route.id));
        let verdict = self.judge.observe(
            &route.id,
            cap,
            done.result.as_ref().map(|_| ()).map_err(String::as_str),
            chat_ok,
            done.at,
        );
        if let Err(e) = &done.result {
            tracing::info!(route = %route.id, capability = cap.as_str(), error = %e,
                chat_ok, "capability probe failed");
        }
        self.record(&route, cap, done).await;
        let open = self.judge.findings();
        self.findings.send_if_modified(|cur| {
            let changed = cur.as_slice() != open.as_slice();
            if changed {
                *cur = Arc::new(open);
            }
            changed
        });
        verdict
    }

    /// Probes item `i` once and judges it.
    pub async fn probe(&mut self, i: usize) -> judge::Verdict {
        let done = self.send(i).await;
        self.take(&done).await
    }

    /// Probes every item once, in order.
    pub async fn pass(&mut self) -> Vec<judge::Verdict> {
        let mut out = Vec::with_capacity(self.items.len());
        for i in 0..self.items.len() {
            out.push(self.probe(i).await);
        }
        out
    }

    /// Queues the result in the store (in order with every later write), without waiting for
    /// its commit: the findings never wait for the store.
    async fn record(&self, route: &Route, cap: Probed, done: &Done) {
        let Some(store) = &self.d.store else { return };
        let keep_since = chrono::Duration::from_std(self.d.retention)
            .ok()
            .and_then(|r| done.at.checked_sub_signed(r))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let op = CapabilityOp {
            row: CapabilityRow {
                route: route.id.to_string(),
                capability: cap.as_str().to_owned(),
                at: done.at,
                ok: done.result.is_ok(),
                latency_ms: done.latency_ms,
                error: done.result.as_ref().err().cloned(),
            },
            keep_since,
        };
        match store.writer().queue_capability(op).await {
            Ok(queued) => {
                tokio::spawn(async move {
                    if let Err(e) = queued.committed().await {
                        tracing::warn!(error = %e, "capability probes: result not stored");
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "capability probes: result not stored"),
        }
    }
}

impl cadence::Cadenced for Prober {
    type Done = Done;

    fn send(&self, i: usize) -> impl std::future::Future<Output = Done> + Send + 'static {
        Prober::send(self, i)
    }

    fn take(&mut self, done: &Done) -> impl std::future::Future<Output = judge::Verdict> + Send {
        Prober::take(self, done)
    }

    fn slot(done: &Done) -> (usize, Instant) {
        (done.item, done.started)
    }
}

/// Probes every declared capability of every route at `[capability] every`, the first round
/// spread evenly over one interval, never more than [`in_flight`] at a time and never one item
/// twice at once; a first failure is probed again after [`judge::RECHECK`]. Runs until
/// `shutdown`.
pub async fn run(
    d: CapabilityDriver,
    findings: watch::Sender<Arc<Vec<DriftFinding>>>,
    shutdown: CancellationToken,
) {
    let every = d.config.every;
    let p = match Prober::new(d, findings) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "capability probes: not run");
            shutdown.cancelled().await;
            return;
        }
    };
    let n = p.items.len();
    if n == 0 {
        shutdown.cancelled().await;
        return;
    }
    cadence::run(p, n, every, in_flight(n, every), shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_grows_with_the_fleet_within_its_limits() {
        let q = Duration::from_secs(900);
        assert_eq!(in_flight(4, q), MIN_IN_FLIGHT);
        // 2,000 routes × 2 capabilities every 15 min at 10 s each: 45 at once.
        assert_eq!(in_flight(4_000, q), 45);
        assert_eq!(in_flight(20_000, q), MAX_IN_FLIGHT);
    }
}
