//! Fires each route's probes on a jittered schedule and sends every outcome downstream.
//!
//! - **Spread**: route `i` of `n` first fires at `i/n` of its interval, so a thousand routes
//!   never fire together (no thundering herd on providers or on our own egress).
//! - **No drift, bounded jitter**: ticks are planned against a fixed grid
//!   (`first + k·interval`), never `now + interval`. Each planned tick is within `± jitter` of
//!   its grid point *and* within `interval ± jitter` of the previous planned tick, so jitter
//!   neither accumulates nor makes neighbouring gaps wild. A loop that woke up late does not
//!   shift the grid.
//! - **No stacking**: a route has at most one probe running (waiting for a concurrency
//!   permit counts as running). A tick that finds it busy is skipped and reported as
//!   [`SchedulerEvent::Skipped`] (and a `warn` log with `route=`): an overrun is evidence of
//!   a slow route, and stacking would only pile more load on it.
//! - **Throughput probes** ([`OutcomeKind::Throughput`]) have their own grid every
//!   `throughput_every`, placed half an interval after the route's probe grid so the two
//!   rarely meet; when they do, the later one is skipped like any overrun.
//!   `throughput_every = 0` disables them.
//! - **Back-pressure, not loss**: outcomes are sent with `send().await` on the bounded
//!   channel. A probe's task stays "running" until its outcome is accepted.
//! - **Shutdown**: no new probe starts (one still waiting for a permit is abandoned). A probe
//!   already running finishes within the deadline it already has (its route's `timeout`,
//!   which the scheduler enforces with [`OVERRUN_GRACE`] on top) and its outcome is delivered,
//!   because a measured result is evidence; `run` then returns. If the channel stays full
//!   that long after shutdown, the outcome is dropped with a `warn` log.
//!
//! - **Confirmation probes** ([`run_with_confirmations`]): detection asks, through a
//!   [`Confirm`], for a route to be probed again after an abnormal outcome; the route is
//!   probed `confirm_after` later (its own setting; `None` disables), off its grid, which
//!   does not move. Never more than one probe in flight per route (a confirmation that finds
//!   the route busy is dropped: the running probe is fresher evidence; a grid tick that finds a
//!   confirmation running is absorbed by it, not reported as an overrun), at most
//!   [`SchedulerOptions::max_confirmations`] between two grid probes, none when the grid
//!   probe comes first anyway. Across routes, confirmation starts are paced at least
//!   [`SchedulerOptions::confirm_spacing`] apart, so a provider-wide outage spreads its
//!   confirmations instead of firing hundreds at once.
//!
//! All timers are `tokio::time`, so tests drive the schedule with a paused clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use rand::Rng;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::probe::{OutcomeKind, ProbeError, ProbeOutcome};
use crate::route::{Route, RouteId};

/// Runs one probe of one route. The probe client implements it; tests use a double.
/// Implementations should honour `route.probe.timeout` themselves; the scheduler only
/// stops waiting [`OVERRUN_GRACE`] after it.
pub trait Prober: Send + Sync + 'static {
    fn probe<'a>(&'a self, route: &'a Route, kind: OutcomeKind) -> BoxFuture<'a, ProbeOutcome>;
}

/// What the scheduler reports, in the order it happens per route. Outcomes are nearly every
/// event, so boxing them would allocate on the common path to shrink the rare one.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum SchedulerEvent {
    Outcome(ProbeOutcome),
    /// A tick found the route's previous probe still running (or waiting for a permit).
    Skipped {
        route: RouteId,
        kind: OutcomeKind,
        at: DateTime<Utc>,
    },
    /// The loop is alive (readiness, `[heartbeat] stale_after`). Sent at start, then every
    /// `heartbeat_every`.
    Heartbeat {
        at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerOptions {
    /// Probes in flight at once, across all routes (egress sockets, provider fairness).
    pub max_concurrency: usize,
    pub heartbeat_every: Duration,
    /// Confirmation probes of one route between two of its grid probes (the app sets it to
    /// `[detection] degraded_after`).
    pub max_confirmations: u32,
    /// The least time between two confirmation starts across all routes (50 ms: at most 20
    /// a second, so 100 routes failing at once confirm over 5 s, not in one burst).
    pub confirm_spacing: Duration,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            max_concurrency: 64,
            heartbeat_every: Duration::from_secs(10),
            max_confirmations: 3,
            confirm_spacing: Duration::from_millis(50),
        }
    }
}

/// Detection asks for `route` to be probed again soon with a probe of `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirm {
    pub route: RouteId,
    pub kind: OutcomeKind,
}

/// Confirmation requests waiting for the scheduler; beyond this they are dropped (the
/// route's grid goes on, so a dropped confirmation only delays a verdict).
pub const CONFIRM_QUEUE: usize = 1024;

/// A route's waiting confirmation request: one at most (a second one while the first waits
/// adds nothing). A lock and a notification instead of a channel per route: 10,000 routes
/// would hold 10,000 channels (512 bytes each) for a request that is rare.
#[derive(Default)]
struct Asked {
    kind: Mutex<Option<OutcomeKind>>,
    ready: tokio::sync::Notify,
}

impl Asked {
    fn ask(&self, kind: OutcomeKind) {
        let mut k = self
            .kind
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if k.is_none() {
            *k = Some(kind);
            self.ready.notify_one();
        }
    }

    async fn next(&self) -> OutcomeKind {
        loop {
            self.ready.notified().await;
            let taken = self
                .kind
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(kind) = taken {
                return kind;
            }
        }
    }
}

/// Confirmation start slots shared by every route: each at least `spacing` after the last.
struct Pacer {
    next_free: Mutex<Option<Instant>>,
    spacing: Duration,
}

impl Pacer {
    /// The earliest slot at or after `due`, reserved — if it comes before `until` (the
    /// route's next grid probe, which would make the confirmation moot). A slot that would
    /// be dropped is not booked: in an outage of thousands of routes, booking them all would
    /// push every later confirmation, of any route, minutes into the future.
    fn reserve(&self, due: Instant, until: Instant) -> Option<Instant> {
        let mut next = self
            .next_free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let slot = match *next {
            Some(free) if free > due => free,
            _ => due,
        };
        if slot >= until {
            return None;
        }
        *next = Some(slot + self.spacing);
        Some(slot)
    }
}

/// How long past its own `timeout` a probe may run before the scheduler records a
/// [`ProbeError::Timeout`] for it and frees the route. A safety net against a prober that
/// ignores its deadline; a well-behaved prober never reaches it.
pub const OVERRUN_GRACE: Duration = Duration::from_secs(5);

/// After shutdown, how long a finished probe may wait for room in a full channel.
const SHUTDOWN_SEND_GRACE: Duration = Duration::from_secs(5);

/// No interval is shorter than this (a zero interval would spin).
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// Probes `routes` until `shutdown` is cancelled (or the `events` receiver is dropped), then
/// waits for running probes as described in the module docs and returns.
pub async fn run(
    routes: Vec<Arc<Route>>,
    prober: Arc<dyn Prober>,
    clock: Arc<dyn Clock>,
    events: mpsc::Sender<SchedulerEvent>,
    opts: SchedulerOptions,
    shutdown: CancellationToken,
) {
    let (_none, confirms) = mpsc::channel(1);
    run_with_confirmations(routes, prober, clock, events, opts, confirms, shutdown).await
}

/// [`run`], also probing routes again when `confirms` asks (see the module docs).
pub async fn run_with_confirmations(
    routes: Vec<Arc<Route>>,
    prober: Arc<dyn Prober>,
    clock: Arc<dyn Clock>,
    events: mpsc::Sender<SchedulerEvent>,
    opts: SchedulerOptions,
    mut confirms: mpsc::Receiver<Confirm>,
    shutdown: CancellationToken,
) {
    // Also cancelled when nobody listens any more: probing into the void is pointless.
    let stop = shutdown.child_token();
    let shared = Arc::new(Shared {
        prober,
        clock,
        events,
        permits: Arc::new(Semaphore::new(opts.max_concurrency.max(1))),
        stop: stop.clone(),
        pacer: Pacer {
            next_free: Mutex::new(None),
            spacing: opts.confirm_spacing,
        },
        max_confirmations: opts.max_confirmations,
    });
    let start = Instant::now();
    let n = routes.len();
    let mut tasks = JoinSet::new();
    let mut confirm_to: HashMap<RouteId, Arc<Asked>> = HashMap::new();
    for (i, route) in routes.into_iter().enumerate() {
        let asked = route.probe.confirm_after.map(|_| {
            let asked = Arc::new(Asked::default());
            confirm_to.insert(route.id.clone(), asked.clone());
            asked
        });
        tasks.spawn(route_loop(shared.clone(), route, i, n, start, asked));
    }
    let mut confirms_open = true;
    tracing::info!(
        routes = n,
        max_concurrency = opts.max_concurrency,
        "scheduler started"
    );

    let mut heartbeat = tokio::time::interval(opts.heartbeat_every.max(MIN_INTERVAL));
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = heartbeat.tick() => {
                let at = shared.clock.now();
                if !shared.send(SchedulerEvent::Heartbeat { at }).await {
                    break;
                }
            }
            c = confirms.recv(), if confirms_open => match c {
                Some(c) => {
                    if let Some(asked) = confirm_to.get(&c.route) {
                        asked.ask(c.kind);
                    }
                }
                None => confirms_open = false,
            },
        }
    }
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done {
            tracing::error!(error = %e, "scheduler route loop failed");
        }
    }
    tracing::info!("scheduler stopped");
}

struct Shared {
    prober: Arc<dyn Prober>,
    clock: Arc<dyn Clock>,
    events: mpsc::Sender<SchedulerEvent>,
    permits: Arc<Semaphore>,
    stop: CancellationToken,
    pacer: Pacer,
    max_confirmations: u32,
}

impl Shared {
    /// Sends unless stopping; false (and stops everything) when the receiver is gone.
    async fn send(&self, event: SchedulerEvent) -> bool {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => false,
            sent = self.events.send(event) => {
                if sent.is_err() {
                    tracing::warn!("scheduler events receiver dropped; stopping");
                    self.stop.cancel();
                }
                sent.is_ok()
            }
        }
    }
}

/// One route's ticks. Probes run in their own task so they are polled (and timed) even
/// while this loop waits to report a skip.
async fn route_loop(
    shared: Arc<Shared>,
    route: Arc<Route>,
    i: usize,
    n: usize,
    start: Instant,
    asked: Option<Arc<Asked>>,
) {
    let interval = route.probe.interval.max(MIN_INTERVAL);
    let jitter = interval.mul_f64(route.probe.jitter.clamp(0.0, 0.5));
    let first = start + interval.mul_f64(i as f64 / n.max(1) as f64);
    let mut probe = Grid::new(first, interval, jitter);
    let mut throughput = (!route.probe.throughput_every.is_zero()).then(|| {
        let every = route.probe.throughput_every.max(MIN_INTERVAL);
        // Half an interval after a probe tick, on one of the probe ticks within `every`
        // (spread by route index), so routes' throughput probes do not bunch either.
        let slots = (every.as_secs_f64() / interval.as_secs_f64())
            .floor()
            .max(1.0) as usize;
        let at = first + interval / 2 + interval * (i % slots) as u32;
        Grid::new(at, every, jitter.min(every / 2))
    });
    let mut running: Option<JoinHandle<()>> = None;
    // The running probe is a confirmation (a grid tick meeting it is absorbed, not skipped).
    let mut running_confirm = false;
    let confirm_after = route.probe.confirm_after;
    // A confirmation waiting for its slot, and how many ran since the last grid probe.
    let mut pending: Option<(OutcomeKind, Instant)> = None;
    let mut confirmed = 0u32;

    loop {
        let (grid_kind, grid_at) = match &throughput {
            Some(t) if t.next < probe.next => (OutcomeKind::Throughput, t.next),
            _ => (OutcomeKind::Probe, probe.next),
        };
        let (kind, at, confirming) = match pending {
            Some((k, t)) if t < grid_at => (k, t, true),
            _ => (grid_kind, grid_at, false),
        };
        tokio::select! {
            biased;
            _ = shared.stop.cancelled() => break,
            k = next_asked(asked.as_deref()) => {
                let busy = running.as_ref().is_some_and(|h| !h.is_finished());
                if let Some(after) = confirm_after {
                    let due = Instant::now() + after;
                    // The grid probe coming first is the confirmation already.
                    if pending.is_none() && !busy && confirmed < shared.max_confirmations {
                        pending = shared.pacer.reserve(due, probe.next).map(|slot| (k, slot));
                    }
                }
                continue;
            }
            _ = tokio::time::sleep_until(at) => {}
        }

        if confirming {
            pending = None;
            if running.as_ref().is_some_and(|h| !h.is_finished()) {
                tracing::debug!(route = %route.id, "confirmation dropped: a probe is running");
                continue;
            }
            if let Some(done) = running.take() {
                log_panic(&route.id, done.await);
            }
            confirmed += 1;
            running_confirm = true;
            running = Some(spawn_probe(&shared, &route, kind));
            continue;
        }
        if kind == OutcomeKind::Probe {
            confirmed = 0;
            pending = None;
        } else if pending.is_some_and(|(k, _)| k == kind) {
            pending = None;
        }

        if running_confirm && running.as_ref().is_some_and(|h| !h.is_finished()) {
            tracing::debug!(route = %route.id, kind = kind.as_str(), "a confirmation probe is running; tick absorbed");
        } else if running.as_ref().is_some_and(|h| !h.is_finished()) {
            tracing::warn!(route = %route.id, kind = kind.as_str(), "previous probe still running; tick skipped");
            let at = shared.clock.now();
            let skipped = SchedulerEvent::Skipped {
                route: route.id.clone(),
                kind,
                at,
            };
            // Boxed: a rare path whose future would otherwise swell every route's task.
            if !Box::pin(shared.send(skipped)).await {
                break;
            }
        } else {
            if let Some(done) = running.take() {
                log_panic(&route.id, done.await);
            }
            running_confirm = false;
            running = Some(spawn_probe(&shared, &route, kind));
        }

        let now = Instant::now();
        let grid = match (kind, throughput.as_mut()) {
            (OutcomeKind::Throughput, Some(t)) => t,
            _ => &mut probe,
        };
        grid.advance(&mut rand::thread_rng());
        // Woke up more than a whole step late (an overloaded runtime): let the missed
        // ticks go rather than firing a burst; the grid itself does not move.
        while grid.next + grid.step < now {
            grid.advance(&mut rand::thread_rng());
        }
    }

    if let Some(last) = running {
        log_panic(&route.id, last.await);
    }
}

/// Starts one probe. Its future is boxed so that the task's own memory is small: the route
/// keeps the finished task's handle until its next tick, and at 10,000 routes unboxed probe
/// futures kept that way were 10 MB.
fn spawn_probe(shared: &Arc<Shared>, route: &Arc<Route>, kind: OutcomeKind) -> JoinHandle<()> {
    tokio::spawn(Box::pin(probe_once(shared.clone(), route.clone(), kind)))
}

/// The route's next confirmation request; never, for a route without confirmations.
async fn next_asked(asked: Option<&Asked>) -> OutcomeKind {
    match asked {
        Some(a) => a.next().await,
        None => std::future::pending().await,
    }
}

fn log_panic(route: &RouteId, done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done {
        tracing::error!(route = %route, error = %e, "probe task failed");
    }
}

async fn probe_once(shared: Arc<Shared>, route: Arc<Route>, kind: OutcomeKind) {
    let permit = tokio::select! {
        biased;
        _ = shared.stop.cancelled() => return,
        permit = shared.permits.clone().acquire_owned() => match permit {
            Ok(p) => p,
            // Closed semaphore: never happens (nobody closes it), and nothing to do if it did.
            Err(_) => return,
        },
    };
    let started_at = shared.clock.now();
    let started = Instant::now();
    let limit = route.probe.timeout + OVERRUN_GRACE;
    let outcome = match tokio::time::timeout(limit, shared.prober.probe(&route, kind)).await {
        Ok(outcome) => outcome,
        Err(_) => {
            tracing::warn!(route = %route.id, kind = kind.as_str(), "prober overran its timeout; recording a timeout");
            overrun(&route, kind, started_at, started.elapsed())
        }
    };
    drop(permit);

    let event = SchedulerEvent::Outcome(outcome);
    if shared.stop.is_cancelled() {
        // Shutting down: deliver if the receiver makes room soon, else say what was lost.
        match tokio::time::timeout(SHUTDOWN_SEND_GRACE, shared.events.send(event)).await {
            Ok(_) => {}
            Err(_) => {
                tracing::warn!(route = %route.id, "probe outcome dropped at shutdown: events channel full")
            }
        }
        return;
    }
    if shared.events.send(event).await.is_err() {
        shared.stop.cancel();
    }
}

/// The outcome recorded for a prober that did not return within its deadline.
fn overrun(
    route: &Route,
    kind: OutcomeKind,
    started_at: DateTime<Utc>,
    took: Duration,
) -> ProbeOutcome {
    ProbeOutcome {
        route: route.id.clone(),
        kind,
        started_at,
        success: false,
        attributed_to: None,
        verified: None,
        ttfb_ms: None,
        ttft_ms: None,
        total_ms: took.as_secs_f64() * 1000.0,
        output_tokens: None,
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: None,
        error: Some(ProbeError::Timeout),
        answer: None,
        first_answer_ms: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

/// Planned ticks on a fixed grid `origin + k·step`, each jittered by at most `± jitter`
/// from its grid point and by at most `± jitter` from `step` after the previous tick.
#[derive(Debug, Clone)]
struct Grid {
    /// The grid point of `next`.
    point: Instant,
    /// The planned tick.
    next: Instant,
    step: Duration,
    jitter: Duration,
}

impl Grid {
    fn new(first: Instant, step: Duration, jitter: Duration) -> Self {
        Self {
            point: first,
            next: first,
            step,
            jitter,
        }
    }

    fn advance<R: Rng + ?Sized>(&mut self, rng: &mut R) {
        let j = self.jitter.as_secs_f64();
        // Signed offset of the current tick from its grid point, in [-j, j].
        let d = if self.next >= self.point {
            (self.next - self.point).as_secs_f64()
        } else {
            -(self.point - self.next).as_secs_f64()
        };
        // The next offset d' = d + u must satisfy |d'| <= j and |u| <= j.
        let lo = (-j).max(-j - d);
        let hi = j.min(j - d);
        let u = if hi > lo { rng.gen_range(lo..=hi) } else { 0.0 };
        let offset = (d + u).clamp(-j, j);
        self.point += self.step;
        self.next = if offset >= 0.0 {
            self.point + Duration::from_secs_f64(offset)
        } else {
            self.point
                .checked_sub(Duration::from_secs_f64(-offset))
                .unwrap_or(self.point)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn grid_ticks_stay_near_their_points_and_their_gaps_near_the_step() {
        let start = Instant::now();
        let step = Duration::from_secs(30);
        let jitter = Duration::from_secs(3);
        let mut g = Grid::new(start, step, jitter);
        let mut rng = StdRng::seed_from_u64(9);
        let mut prev = g.next;
        let mut offsets = Vec::new();
        for k in 1..=10_000u32 {
            g.advance(&mut rng);
            let gap = (g.next - prev).as_secs_f64();
            assert!((27.0 - 1e-6..=33.0 + 1e-6).contains(&gap), "gap {gap}");
            let point = start + step * k;
            let off = if g.next >= point {
                (g.next - point).as_secs_f64()
            } else {
                -(point - g.next).as_secs_f64()
            };
            assert!(off.abs() <= 3.0 + 1e-6, "offset {off} at {k}");
            offsets.push(off);
            prev = g.next;
        }
        // Jitter is real, not a constant shift.
        let spread = offsets.iter().cloned().fold(f64::MIN, f64::max)
            - offsets.iter().cloned().fold(f64::MAX, f64::min);
        assert!(spread > 5.0, "{spread}");
    }

    struct NeverProbes;

    impl Prober for NeverProbes {
        fn probe<'a>(&'a self, _: &'a Route, _: OutcomeKind) -> BoxFuture<'a, ProbeOutcome> {
            Box::pin(std::future::pending())
        }
    }

    /// A route's loop is one task per route for as long as the monitor runs: at 10,000 routes
    /// every 100 bytes of its future are 1 MB. Rare paths are boxed and the jitter's random
    /// numbers come from the thread's generator so that it stays small.
    #[tokio::test]
    async fn a_route_loop_stays_small() {
        let (events, _keep) = mpsc::channel(1);
        let shared = Arc::new(Shared {
            prober: Arc::new(NeverProbes),
            clock: Arc::new(crate::clock::SystemClock),
            events,
            permits: Arc::new(Semaphore::new(1)),
            stop: CancellationToken::new(),
            pacer: Pacer {
                next_free: Mutex::new(None),
                spacing: Duration::ZERO,
            },
            max_confirmations: 0,
        });
        let src = "[[provider]]\nid = \"a\"\nkind = \"openai\"\n[[provider.region]]\nid = \"r\"\n\
                   base_url = \"http://127.0.0.1:9/v1\"\n[[route]]\nprovider = \"a\"\nregion = \"r\"\n\
                   model = \"m\"\nserves = \"m\"\n";
        let route = Arc::new(
            crate::config::Config::parse(src, "t.toml")
                .unwrap()
                .config
                .routes()
                .remove(0),
        );
        let asked = Some(Arc::new(Asked::default()));
        let task = route_loop(shared, route, 0, 1, Instant::now(), asked);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 768, "a route's loop future is {size} bytes");
    }
}
