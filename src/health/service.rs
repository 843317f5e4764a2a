//! The health service: the I/O shell around the pure detection core.
//!
//! It owns one [`RouteHealth`] and one [`Baseline`] per configured route and is the only
//! place they change:
//!
//! - **Start** ([`HealthService::restore`]): each baseline is rebuilt from the raw outcomes
//!   still in the store (the retention is the lookback), each route's state is restored from
//!   its stored JSON — state, counters, error window, open incident. Routes new to the config
//!   start fresh; stored routes gone from it are ignored. The downtime does not count as
//!   observed time ([`RouteHealth::resume_after`]): a stale incident is neither escalated nor
//!   resolved by it, and a route that recovered while we were down resolves on its next
//!   probes through the normal recovery rules.
//! - **Every outcome** (probes from the recorder, passive ones from the passive queue) goes
//!   through [`Detector::ingest`]; **every second** [`Detector::tick`] runs per route, so
//!   passive error rates and time-based rules fire without waiting for the next probe.
//! - **Persistence** goes through a small persister task in order, so the detection loop
//!   never waits on SQLite: each [`Transition`] with its incident and the route's state in one
//!   transaction; changed states every [`HealthOptions::save_every`]; everything at shutdown.
//! - **Findings** (egress, request-side) are recomputed every
//!   [`HealthOptions::findings_every`], when a route's latest probe flips between failing and
//!   not, and when the control probe ([`super::control`]) reports; their suppressions are
//!   applied to the routes and their openings and closings sent as [`HealthEvent`]s.
//! - **Publishing**: a new [`HealthSnapshot`] only when something consumers act on changed —
//!   a route's display or judged state, `since`, reason code, failure mode, incident,
//!   `behavior_changed`, rounded success ratio, the split's verdicts while in trouble, or
//!   the set of findings — never merely because a probe arrived (weights versions, ETags and SSE depend on it). Baselines in the
//!   snapshot are refreshed at most every [`HealthOptions::baselines_every`]. A transition's
//!   snapshot is published before its event is sent, so whoever reacts to the event reads
//!   the new state from the watch. Snapshots go out at most every
//!   [`HealthOptions::publish_every`] (the first change after a quiet spell at once): when a
//!   provider-wide outage moves thousands of routes in one tick, they share one snapshot, its
//!   transition events follow it, findings are evaluated once for all the routes that
//!   flipped, and their transitions are stored in a few transactions — work that grows with
//!   the changes, not with routes × changes.
//!
//! Shutdown: on the token the service saves every changed state, keeps judging what is still
//! queued until every sender is gone (the recorder and the passive drain end after the
//! scheduler and the web server), saves again and waits for the persister.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::confirm;
use super::control::{self, ControlProbe};
use super::findings::{findings, Finding, FindingKind, RouteSummary};
use super::vantages::{Board, VantageLink, VantageView};

// The multi-vantage part of the shell: agents' outcomes, the quorum, the published view.
#[path = "service_vantages.rs"]
mod multi;
use super::{
    Baseline, BaselineSnapshot, Detector, HealthEvent, HealthRx, HealthSnapshot, Incident,
    IncidentSummary, RouteHealth, RouteStatus, State, Suppression, Transition,
};
use crate::clock::Clock;
use crate::config::Config;
use crate::probe::{OutcomeKind, ProbeOutcome};
use crate::route::RouteId;
use crate::scheduler::{Confirm, CONFIRM_QUEUE};
use crate::store::{Store, StoreError, Writer, ALL_KINDS};
use crate::vantage::VantageOutcome;
use multi::next_remote;

/// The job name of the service's heartbeat (`/readyz`).
pub const HEARTBEAT_JOB: &str = "health";

/// Writes waiting for the persister; the service waits when it is full (nothing is dropped).
const PERSIST_QUEUE: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("restoring detection state: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// The service's cadences. Production uses [`Default`]; tests shorten or stretch them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthOptions {
    /// [`Detector::tick`] for every route (the 1-second evaluation).
    pub tick_every: Duration,
    /// Cross-route findings, besides the event-driven recomputations.
    pub findings_every: Duration,
    /// Routes whose state changed since their last save are saved this often, so windows and
    /// counters survive a crash, not only a clean shutdown.
    pub save_every: Duration,
    /// Baselines in the published snapshot are refreshed at most this often.
    pub baselines_every: Duration,
    /// The `health` heartbeat.
    pub heartbeat_every: Duration,
    /// Snapshots are published at most a couple of times in this period: changes beyond
    /// (a provider-wide outage moves thousands of routes in one tick) go out together in one
    /// snapshot at its end, and their transition events right after it.
    pub publish_every: Duration,
}

impl Default for HealthOptions {
    fn default() -> Self {
        Self {
            tick_every: Duration::from_secs(1),
            findings_every: Duration::from_secs(5),
            save_every: Duration::from_secs(30),
            baselines_every: Duration::from_secs(30),
            heartbeat_every: Duration::from_secs(10),
            publish_every: Duration::from_millis(250),
        }
    }
}

/// What other parts of the service may ask of detection's shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthCommand {
    /// The switch controller moved traffic off (`on`) or back to (`!on`) these routes: set
    /// or clear their `SWITCHED` overlay ([`RouteHealth::set_switched`]). Saved with the
    /// route's state; published in the next snapshot.
    SetSwitched { routes: Vec<RouteId>, on: bool },
}

/// Snapshots that go out at once within one `publish_every`; changes after them wait for the
/// window's end (a lone change is never delayed, a burst shares one snapshot).
const PUBLISH_BURST: u32 = 2;

/// Commands waiting for the service.
const COMMAND_QUEUE: usize = 64;

/// One route as the service keeps it.
struct Tracked {
    health: RouteHealth,
    baseline: Baseline,
    /// What the latest snapshot shows of the route.
    shown: RouteStatus,
    /// Changed since it was last saved.
    unsaved: bool,
    /// A 401/403/404 seen and not yet answered normally ([`super::fault`]).
    fault: super::fault::Fault,
}

/// What the persister writes, in the order the service decided it.
enum Persist {
    Transition {
        transition: Box<Transition>,
        incident: Option<Box<Incident>>,
        health: Box<RouteHealth>,
    },
    Save {
        states: Vec<RouteHealth>,
        at: DateTime<Utc>,
    },
    Heartbeat(DateTime<Utc>),
}

/// Detection's I/O shell; see the module docs. Build it with [`HealthService::restore`],
/// hand out [`HealthService::subscribe`] receivers, then [`HealthService::run`] it.
pub struct HealthService {
    detector: Detector,
    routes: Vec<Tracked>,
    index: HashMap<RouteId, usize>,
    clock: Arc<dyn Clock>,
    writer: Writer,
    opts: HealthOptions,
    control: Option<ControlProbe>,
    /// The latest control-URL result (`None`: not configured or not probed yet).
    control_ok: Option<bool>,
    findings: Vec<Finding>,
    snapshot: watch::Sender<Arc<HealthSnapshot>>,
    events: broadcast::Sender<HealthEvent>,
    /// Something shown changed since the last published snapshot.
    dirty: bool,
    last_tick: Option<DateTime<Utc>>,
    /// The command channel's receiving end, once [`HealthService::commands`] made one.
    commands: Option<mpsc::Receiver<HealthCommand>>,
    /// Where confirmation probes are asked for, once [`HealthService::confirmations`] made it.
    confirms: Option<mpsc::Sender<Confirm>>,
    /// Detection per route × vantage for the routes agents probe too ([`super::vantages`]).
    board: Board,
    vantage_view: watch::Sender<Arc<VantageView>>,
    /// Agents' outcomes, once [`HealthService::vantages`] made the channel.
    vantage_inputs: Option<mpsc::Receiver<VantageOutcome>>,
    /// The current publishing window (`publish_every` long) and how many snapshots went out
    /// in it.
    window: Option<(Instant, u32)>,
    /// Transition events waiting for the snapshot that shows them.
    held: Vec<HealthEvent>,
    /// A route started or stopped failing: findings are evaluated before the next snapshot.
    findings_pending: bool,
    /// Snapshots published since the start, and the route statuses they carried.
    counts: Arc<PublishCounts>,
}

/// What publishing has cost so far: how many snapshots went out and how many route statuses
/// they carried (each published snapshot copies every route's status once).
#[derive(Debug, Default)]
pub struct PublishCounts {
    pub snapshots: std::sync::atomic::AtomicU64,
    pub route_statuses: std::sync::atomic::AtomicU64,
}

/// Agents' outcomes waiting for detection; ingest waits when it is full.
const VANTAGE_QUEUE: usize = 4096;

impl HealthService {
    /// Rebuilds baselines and restores route states from `store` for the routes of `config`
    /// (in config order); `events` carries transitions and findings to whoever subscribes.
    pub async fn restore(
        config: &Config,
        opts: HealthOptions,
        store: &Store,
        clock: Arc<dyn Clock>,
        events: broadcast::Sender<HealthEvent>,
    ) -> Result<HealthService, HealthError> {
        let ids: Vec<RouteId> = config.routes().into_iter().map(|r| r.id).collect();
        let now = clock.now();
        let since = now - chrono::Duration::days(config.storage.retention_days.into());
        let cfg = config.detection.clone();
        let reading = store.clone();
        let wanted = ids.clone();
        let seats: Vec<(RouteId, String)> = ids
            .iter()
            .flat_map(|id| config.vantages_of(id).map(|v| (id.clone(), v.id.clone())))
            .collect();
        let (stored, baselines, remote) = tokio::task::spawn_blocking(move || {
            let reader = reading.reader()?;
            let stored = reader.route_health_all::<RouteHealth>()?;
            let mut baselines = Vec::with_capacity(wanted.len());
            for id in &wanted {
                let outcomes = reader.outcomes_since(id, since, ALL_KINDS)?;
                baselines.push(Baseline::rebuild(id.clone(), &cfg, &outcomes));
            }
            let mut remote = HashMap::with_capacity(seats.len());
            for (id, vantage) in seats {
                let outcomes = reader.vantage_outcomes_since(&id, &vantage, since)?;
                let b = Baseline::rebuild(id.clone(), &cfg, &outcomes);
                remote.insert((id, vantage), b);
            }
            Ok::<_, StoreError>((stored, baselines, remote))
        })
        .await??;

        let detector = Detector::new(&config.detection);
        let board = Board::new(config, &detector, remote, now);
        let mut stored: HashMap<RouteId, RouteHealth> = stored
            .into_iter()
            .map(|s| {
                let mut h = s.health;
                // Saved at shutdown (or by the last periodic save): the time since is time
                // nobody watched the route.
                h.resume_after(now - s.updated_at);
                (s.route, h)
            })
            .collect();
        let mut routes = Vec::with_capacity(ids.len());
        let mut restored = 0usize;
        for (id, baseline) in ids.iter().zip(baselines) {
            let health = match stored.remove(id) {
                Some(h) => {
                    restored += 1;
                    h
                }
                None => detector.route(id.clone(), now),
            };
            let shown = status(&health, &baseline, &detector, now, None);
            routes.push(Tracked {
                health,
                baseline,
                shown,
                unsaved: false,
                fault: super::fault::Fault::Unknown,
            });
        }
        tracing::info!(
            routes = routes.len(),
            restored,
            ignored = stored.len(),
            "detection state restored"
        );
        let index = ids
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, id)| (id, i))
            .collect();
        let snap = HealthSnapshot {
            generated_at: now,
            routes: routes.iter().map(|r| r.shown.clone()).collect(),
            findings: Vec::new(),
        };
        let (snapshot, _) = watch::channel(Arc::new(snap));
        Ok(HealthService {
            detector,
            routes,
            index,
            clock,
            writer: store.writer(),
            opts,
            control: ControlProbe::from_config(config),
            control_ok: None,
            findings: Vec::new(),
            snapshot,
            events,
            dirty: false,
            last_tick: None,
            commands: None,
            confirms: None,
            window: None,
            held: Vec::new(),
            findings_pending: false,
            counts: Arc::default(),
            board,
            vantage_view: watch::channel(Arc::new(VantageView::default())).0,
            vantage_inputs: None,
        })
    }

    /// A sender of agents' outcomes to this service and a receiver of every multi-vantage
    /// route's vantages (call before [`HealthService::run`]; a second call replaces the
    /// first channel).
    pub fn vantages(&mut self) -> VantageLink {
        let (tx, rx) = mpsc::channel(VANTAGE_QUEUE);
        self.vantage_inputs = Some(rx);
        VantageLink {
            inputs: tx,
            view: self.vantage_view.subscribe(),
        }
    }

    /// A receiver of the published snapshots (the current one first). It keeps the last
    /// snapshot after the service has stopped.
    pub fn subscribe(&self) -> HealthRx {
        self.snapshot.subscribe()
    }

    /// The counts of what publishing has cost, kept while the service runs.
    pub fn publish_counts(&self) -> Arc<PublishCounts> {
        self.counts.clone()
    }

    /// Publishes into `tx` from now on, its receivers seeing this service's snapshot at once:
    /// a cluster member's successive services (one per leader or follower term) share one
    /// watch, so the pages, the weights and the proxy never notice the change of term.
    pub fn publish_into(&mut self, tx: watch::Sender<Arc<HealthSnapshot>>) {
        // Read before sending: `tx` may be this service's own channel already.
        let current = self.snapshot.borrow().clone();
        tx.send_replace(current);
        self.snapshot = tx;
    }

    /// A follower's service (another member of the cluster leads and judges): every
    /// `every` it reads the stored route states and publishes them through the same path as
    /// its own judgements, with the findings recomputed from them, until `shutdown`. It
    /// judges nothing and stores nothing; the leader's transitions (stored at once) and
    /// periodic saves are what it shows.
    pub async fn follow(mut self, store: Store, every: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let reading = store.clone();
            let stored = tokio::task::spawn_blocking(move || {
                reading.reader()?.route_health_all::<RouteHealth>()
            })
            .await;
            match stored {
                Ok(Ok(rows)) => {
                    failing = false;
                    let now = self.clock.now();
                    for row in rows {
                        if let Some(&i) = self.index.get(&row.route) {
                            self.routes[i].health = row.health;
                            self.refresh(i, now);
                        }
                    }
                    self.refresh_baselines();
                    self.evaluate_findings();
                    self.publish();
                }
                Ok(Err(e)) => {
                    if !failing {
                        tracing::error!(error = %e, "follower: cannot read the stored route states; showing the last ones");
                    }
                    failing = true;
                }
                Err(e) => tracing::error!(error = %e, "follower: reading route states panicked"),
            }
        }
        tracing::debug!("follower's health view stopped");
    }

    /// A sender of [`HealthCommand`]s to this service (call before [`HealthService::run`];
    /// a second call replaces the first channel).
    pub fn commands(&mut self) -> mpsc::Sender<HealthCommand> {
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        self.commands = Some(rx);
        tx
    }

    /// The confirmation requests this service makes after abnormal probes (see
    /// [`super::confirm`]), for the scheduler's [`crate::scheduler::run_with_confirmations`].
    /// Call before [`HealthService::run`]; without it no confirmation is asked for.
    pub fn confirmations(&mut self) -> mpsc::Receiver<Confirm> {
        let (tx, rx) = mpsc::channel(CONFIRM_QUEUE);
        self.confirms = Some(tx);
        rx
    }

    /// Judges every outcome from `inputs` and ticks every route until `shutdown`; then drains
    /// `inputs` until every sender is gone and saves (see the module docs).
    pub async fn run(
        mut self,
        mut inputs: mpsc::Receiver<ProbeOutcome>,
        shutdown: CancellationToken,
    ) {
        let (persist, persist_rx) = mpsc::channel(PERSIST_QUEUE);
        let persister = tokio::spawn(persist_loop(self.writer.clone(), persist_rx));
        let (mut control_rx, control_task) = match self.control.take() {
            Some(probe) => {
                let (tx, rx) = mpsc::channel(4);
                let task = tokio::spawn(control::run(probe, tx, shutdown.clone()));
                (Some(rx), Some(task))
            }
            None => (None, None),
        };
        self.serve(&mut inputs, &mut control_rx, &persist, &shutdown)
            .await;

        // A checkpoint first: the drain below is bounded by the app's, and may be cut short.
        self.save_changed(&persist).await;
        while let Some(outcome) = inputs.recv().await {
            self.ingest(outcome, &persist).await;
        }
        self.save_changed(&persist).await;
        self.publish_now();
        drop(persist);
        if persister.await.is_err() {
            tracing::error!("the health persister panicked; the last states may be unsaved");
        }
        if let Some(task) = control_task {
            task.abort();
        }
        tracing::info!("health service stopped");
    }

    /// The main loop, until `shutdown` or until every input sender is gone. Its timers end
    /// with it, so nothing ticks during the shutdown drain.
    async fn serve(
        &mut self,
        inputs: &mut mpsc::Receiver<ProbeOutcome>,
        control_rx: &mut Option<mpsc::Receiver<bool>>,
        persist: &mpsc::Sender<Persist>,
        shutdown: &CancellationToken,
    ) {
        let every = |d: Duration, first: Duration| {
            let d = d.max(Duration::from_millis(1));
            let mut i = tokio::time::interval_at(Instant::now() + first, d);
            i.set_missed_tick_behavior(MissedTickBehavior::Skip);
            i
        };
        let o = self.opts.clone();
        let mut tick = every(o.tick_every, o.tick_every);
        let mut heartbeat = every(o.heartbeat_every, Duration::ZERO);
        let mut findings_timer = every(o.findings_every, o.findings_every);
        let mut save = every(o.save_every, o.save_every);
        let mut baselines = every(o.baselines_every, o.baselines_every);
        let mut commands = self.commands.take();
        let mut remote = self.vantage_inputs.take();

        loop {
            let due = self.publish_due();
            tokio::select! {
                // Timers first: each is ready at most once per period, so outcomes cannot
                // starve them, and a busy queue cannot delay the 1-second evaluation.
                biased;
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => self.tick_all(persist).await,
                _ = heartbeat.tick() => send(persist, Persist::Heartbeat(self.clock.now())).await,
                _ = findings_timer.tick() => {
                    self.evaluate_findings();
                    self.publish_vantages();
                }
                ok = next_control(control_rx) => {
                    self.control_ok = Some(ok);
                    self.evaluate_findings();
                }
                _ = save.tick() => self.save_changed(persist).await,
                _ = baselines.tick() => self.refresh_baselines(),
                cmd = next_command(&mut commands) => self.command(cmd),
                _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {}
                v = next_remote(&mut remote) => self.ingest_remote(v, persist).await,
                outcome = inputs.recv() => match outcome {
                    Some(outcome) => self.ingest(outcome, persist).await,
                    None => break,
                },
            }
            self.publish();
        }
        // Whatever is held goes out before the shutdown drain.
        self.publish_now();
    }

    fn command(&mut self, cmd: HealthCommand) {
        match cmd {
            HealthCommand::SetSwitched { routes, on } => {
                let now = self.clock.now();
                for id in &routes {
                    let Some(&i) = self.index.get(id) else {
                        tracing::warn!(route = %id, "SWITCHED asked for a route not in the config");
                        continue;
                    };
                    if self.routes[i].health.switched() != on {
                        self.routes[i].health.set_switched(on);
                        self.routes[i].unsaved = true;
                        tracing::info!(route = %id, switched = on, "switch overlay changed");
                    }
                    self.refresh(i, now);
                }
            }
        }
    }

    /// One outcome through the detector.
    async fn ingest(&mut self, o: ProbeOutcome, persist: &mpsc::Sender<Persist>) {
        let Some(&i) = self.index.get(&o.route) else {
            tracing::debug!(route = %o.route, "outcome for a route not in the config; not judged");
            return;
        };
        let now = self.clock.now();
        if o.kind != OutcomeKind::Passive && self.board.covers(&o.route) {
            self.ingest_local_vantage(i, o, persist).await;
            return;
        }
        let r = &mut self.routes[i];
        let was_failing = r.health.last_probe().2;
        let t = self
            .detector
            .ingest(&mut r.health, &mut r.baseline, &o, now);
        r.unsaved = true;
        if let Some(change) = super::fault::observe(&mut r.fault, &o) {
            let status = match change {
                super::fault::FaultChange::Opened(s) => {
                    tracing::warn!(route = %o.route, status = s, "route fault: our key, account or model name is wrong at this route");
                    Some(s)
                }
                super::fault::FaultChange::Cleared => None,
            };
            let _ = self.events.send(HealthEvent::RouteFault {
                route: o.route.clone(),
                status,
                at: now,
            });
        }
        if let Some(tx) = &self.confirms {
            if let Some(kind) = confirm::confirmation(&r.health, &o, self.detector.config()) {
                let asked = Confirm {
                    route: o.route.clone(),
                    kind,
                };
                // Full or gone: the route's grid goes on; never wait on the scheduler here.
                if tx.try_send(asked).is_err() {
                    tracing::debug!(route = %o.route, "confirmation not queued");
                }
            }
        }
        if o.kind != OutcomeKind::Passive && r.health.last_probe().2 != was_failing {
            // A route starting or stopping to fail may make (or end) an egress finding: do
            // not leave it escalating for up to `findings_every`. Evaluated once for every
            // route that flipped together, before the snapshot that shows them.
            self.findings_pending = true;
        }
        if let Some(t) = t {
            self.on_transition(i, t, persist).await;
        }
        self.refresh(i, now);
    }

    /// The 1-second evaluation of every route.
    async fn tick_all(&mut self, persist: &mpsc::Sender<Persist>) {
        let now = self.clock.now();
        // At most one evaluation per tick period of *our* clock: a clock that did not move
        // (or stepped back) must not turn a burst of timer ticks into abnormal observations.
        if let Some(last) = self.last_tick {
            let min_gap = chrono::Duration::from_std(self.opts.tick_every / 2)
                .unwrap_or(chrono::Duration::zero());
            if now - last < min_gap {
                return;
            }
        }
        self.last_tick = Some(now);
        for i in 0..self.routes.len() {
            let r = &mut self.routes[i];
            let before = fingerprint(&r.health);
            let t = self.detector.tick(&mut r.health, now);
            if fingerprint(&r.health) != before {
                r.unsaved = true;
            }
            if let Some(t) = t {
                self.on_transition(i, t, persist).await;
            }
            self.refresh(i, now);
        }
        if !self.board.is_empty() {
            let went_stale = self.board.tick(&self.detector, now);
            if went_stale {
                tracing::warn!("a vantage went stale; it leaves the quorum");
            }
            for i in 0..self.routes.len() {
                if self.board.covers(self.routes[i].health.route()) {
                    self.follow_quorum(i, persist).await;
                }
            }
            if went_stale {
                self.evaluate_findings();
            }
        }
    }

    /// Stores a transition (with its incident and the state after it), logs it, announces it.
    async fn on_transition(&mut self, i: usize, t: Transition, persist: &mpsc::Sender<Persist>) {
        let r = &mut self.routes[i];
        let incident = t.incident_id.as_deref().and_then(|id| {
            r.health
                .incident()
                .filter(|x| x.id == id)
                .or_else(|| r.health.last_closed().filter(|x| x.id == id))
                .cloned()
        });
        tracing::info!(
            route = %t.route,
            from = %t.from,
            to = %t.to,
            reason = %t.reason.code,
            failure_mode = t.failure_mode.map(|m| m.as_str()),
            "{}",
            t.reason.text
        );
        r.unsaved = false;
        send(
            persist,
            Persist::Transition {
                transition: Box::new(t.clone()),
                incident: incident.clone().map(Box::new),
                health: Box::new(r.health.clone()),
            },
        )
        .await;
        // The snapshot first: a consumer woken by the event already sees the new state. The
        // event waits for that snapshot, which may be coalesced with the next changes.
        self.refresh(i, t.at);
        self.held.push(HealthEvent::Transition {
            transition: Box::new(t),
            incident: incident.map(Box::new),
        });
        self.publish();
    }

    /// Re-reads route `i` into its shown status; marks the snapshot dirty when something
    /// consumers act on changed (the reason's text alone does not count).
    fn refresh(&mut self, i: usize, now: DateTime<Utc>) {
        let r = &mut self.routes[i];
        let next = status(
            &r.health,
            &r.baseline,
            &self.detector,
            now,
            Some(r.shown.baseline.clone()),
        );
        if !same_view(&r.shown, &next) {
            r.shown = next;
            self.dirty = true;
        }
    }

    fn refresh_baselines(&mut self) {
        let now = self.clock.now();
        for r in &mut self.routes {
            let b = r.baseline.snapshot(now);
            if b != r.shown.baseline {
                r.shown.baseline = b;
                self.dirty = true;
            }
        }
    }

    /// Cross-route findings: suppressions, opened/closed events, and the snapshot when the
    /// set of findings (not merely their numbers) changed.
    fn evaluate_findings(&mut self) {
        self.findings_pending = false;
        let now = self.clock.now();
        let summaries: Vec<RouteSummary> = self
            .routes
            .iter()
            .map(|r| RouteSummary::of(&r.health, &self.detector, now))
            .collect();
        let mut found = findings(&summaries, self.control_ok);
        found.extend(self.board.findings(now));
        for r in &mut self.routes {
            let s = found
                .iter()
                .find(|f| f.routes.contains(r.health.route()))
                .map_or(Suppression::None, |f| f.kind.suppression());
            if r.health.suppression() != s {
                r.health.set_suppression(s);
                r.unsaved = true;
            }
        }
        for f in &found {
            if !self.findings.iter().any(|g| same_finding(f, g)) {
                tracing::warn!(code = %f.code, routes = f.routes.len(), "{}", f.text);
                let _ = self.events.send(HealthEvent::FindingOpened {
                    finding: f.clone(),
                    at: now,
                });
            }
        }
        for g in &self.findings {
            if !found.iter().any(|f| same_finding(f, g)) {
                tracing::info!(code = %g.code, "finding closed");
                let _ = self.events.send(HealthEvent::FindingClosed {
                    finding: g.clone(),
                    at: now,
                });
            }
        }
        let key = |v: &[Finding]| -> Vec<(FindingKind, Vec<RouteId>, Vec<String>)> {
            v.iter()
                .map(|f| (f.kind, f.routes.clone(), f.providers.clone()))
                .collect()
        };
        if key(&found) != key(&self.findings) {
            self.dirty = true;
        }
        self.findings = found;
    }

    /// Sends the states changed since their last save to the persister.
    async fn save_changed(&mut self, persist: &mpsc::Sender<Persist>) {
        let states: Vec<RouteHealth> = self
            .routes
            .iter_mut()
            .filter(|r| r.unsaved)
            .map(|r| {
                r.unsaved = false;
                r.health.clone()
            })
            .collect();
        if !states.is_empty() {
            let at = self.clock.now();
            send(persist, Persist::Save { states, at }).await;
        }
    }

    /// When a held change must go out (`None`: nothing is held).
    fn publish_due(&self) -> Option<Instant> {
        if !self.dirty && self.held.is_empty() && !self.findings_pending {
            return None;
        }
        Some(match self.window {
            Some((start, n)) if n >= PUBLISH_BURST => start + self.opts.publish_every,
            _ => Instant::now(),
        })
    }

    /// Publishes what changed, unless [`PUBLISH_BURST`] snapshots went out in the last
    /// [`HealthOptions::publish_every`] (then the loop's timer publishes it when due).
    fn publish(&mut self) {
        if self.publish_due().is_some_and(|due| due <= Instant::now()) {
            self.publish_now();
        }
    }

    /// Publishes a snapshot when something shown changed, then the events held for it.
    fn publish_now(&mut self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.findings_pending {
            self.evaluate_findings();
        }
        if self.dirty {
            self.dirty = false;
            let snap = HealthSnapshot {
                generated_at: self.clock.now(),
                routes: self.routes.iter().map(|r| r.shown.clone()).collect(),
                findings: self.findings.clone(),
            };
            self.counts.snapshots.fetch_add(1, Relaxed);
            self.counts
                .route_statuses
                .fetch_add(snap.routes.len() as u64, Relaxed);
            // `send_replace` also stores it when nobody is subscribed right now.
            self.snapshot.send_replace(Arc::new(snap));
            let now = Instant::now();
            self.window = match self.window {
                Some((start, n)) if now < start + self.opts.publish_every => Some((start, n + 1)),
                _ => Some((now, 1)),
            };
        }
        for e in self.held.drain(..) {
            // No receiver (nobody subscribed yet) is not an error.
            let _ = self.events.send(e);
        }
    }
}

/// What a tick may change that is worth saving.
fn fingerprint(
    h: &RouteHealth,
) -> (
    State,
    u32,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Suppression,
) {
    (
        h.state(),
        h.streak(),
        h.normal_since(),
        h.error_rate_high_since(),
        h.suppression(),
    )
}

/// Successful share of counted outcomes over the error window, to 0.01, and whether the
/// window is over the detector's floors (`min_error_samples` outcomes, `min_failures`
/// failures) so the weights may follow it.
fn success_ratio(h: &RouteHealth, detector: &Detector, now: DateTime<Utc>) -> (Option<f64>, bool) {
    let cfg = detector.config();
    let c = h.window().counts(now, cfg.error_window.as_secs());
    let ratio = (c.total > 0).then(|| ((1.0 - c.rate()) * 100.0).round() / 100.0);
    let judged = c.total >= cfg.min_error_samples && c.failures >= cfg.min_failures;
    (ratio, judged)
}

/// The route as published. `baseline`: the one already shown (refreshed on its own timer),
/// or `None` to compute it now.
fn status(
    h: &RouteHealth,
    b: &Baseline,
    detector: &Detector,
    now: DateTime<Utc>,
    baseline: Option<Option<BaselineSnapshot>>,
) -> RouteStatus {
    let (success_ratio, success_judged) = success_ratio(h, detector, now);
    RouteStatus {
        route: h.route().clone(),
        state: h.display_state(),
        judged: h.state(),
        since: h.since(),
        reason: h.reason().cloned(),
        failure_mode: h.failure_mode(),
        baseline: baseline.unwrap_or_else(|| b.snapshot(now)),
        success_ratio,
        success_judged,
        behavior_changed: h.behavior_changed(),
        incident: h.incident().map(IncidentSummary::from),
        split: h.split().clone(),
    }
}

/// Equal for consumers: everything but the reason's text, the baseline and the split's
/// figures. The split's verdicts count while the route is in trouble (which signal moved is
/// news then); on a healthy route a lone late first token is not worth a new snapshot.
fn same_view(a: &RouteStatus, b: &RouteStatus) -> bool {
    let verdicts = |s: &RouteStatus| {
        (!matches!(s.judged, State::Normal | State::Unknown)).then(|| {
            (
                s.split.ttft.as_ref().map(|t| t.late),
                s.split.tps.as_ref().map(|t| t.low),
            )
        })
    };
    a.state == b.state
        && a.judged == b.judged
        && a.since == b.since
        && a.reason.as_ref().map(|r| &r.code) == b.reason.as_ref().map(|r| &r.code)
        && a.failure_mode == b.failure_mode
        && a.success_ratio == b.success_ratio
        && a.success_judged == b.success_judged
        && a.behavior_changed == b.behavior_changed
        && a.incident == b.incident
        && verdicts(a) == verdicts(b)
}

/// The same finding over time: one egress finding, one request-side finding per route.
fn same_finding(a: &Finding, b: &Finding) -> bool {
    a.kind == b.kind
        && (a.kind == FindingKind::Egress || a.routes == b.routes)
        && (a.kind != FindingKind::VantageStale || a.providers == b.providers)
}

async fn next_command(rx: &mut Option<mpsc::Receiver<HealthCommand>>) -> HealthCommand {
    match rx {
        Some(r) => match r.recv().await {
            Some(c) => c,
            None => {
                *rx = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

async fn next_control(rx: &mut Option<mpsc::Receiver<bool>>) -> bool {
    match rx {
        Some(r) => match r.recv().await {
            Some(ok) => ok,
            None => {
                *rx = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

async fn send(persist: &mpsc::Sender<Persist>, p: Persist) {
    if persist.send(p).await.is_err() {
        tracing::error!("the health persister has stopped; a state change is not saved");
    }
}

/// Writes in order; a failed write is logged with what it was, and the next one is tried.
/// Transitions already queued together go in one transaction (retried one by one if it
/// fails), so a mass event costs a few commits, not one per route.
async fn persist_loop(writer: Writer, mut rx: mpsc::Receiver<Persist>) {
    let mut next = None;
    loop {
        let p = match next.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        match p {
            Persist::Transition {
                transition,
                incident,
                health,
            } => {
                let mut batch = vec![(transition, incident, health)];
                while batch.len() < TRANSITION_BATCH {
                    match rx.try_recv() {
                        Ok(Persist::Transition {
                            transition,
                            incident,
                            health,
                        }) => batch.push((transition, incident, health)),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                store_transitions(&writer, &batch).await;
            }
            Persist::Save { states, at } => {
                if let Err(e) = writer.save_health(&states, at).await {
                    tracing::error!(routes = states.len(), error = %e, "cannot save route states");
                }
            }
            Persist::Heartbeat(at) => {
                if let Err(e) = writer.heartbeat(HEARTBEAT_JOB, at).await {
                    tracing::error!(error = %e, "cannot write the health heartbeat");
                }
            }
        }
    }
}

/// Transitions stored together at most.
const TRANSITION_BATCH: usize = 512;

type TransitionWrite = (Box<Transition>, Option<Box<Incident>>, Box<RouteHealth>);

async fn store_transitions(writer: &Writer, batch: &[TransitionWrite]) {
    let items: Vec<(&Transition, Option<&Incident>, &RouteHealth)> = batch
        .iter()
        .map(|(t, i, h)| (&**t, i.as_deref(), &**h))
        .collect();
    if items.len() > 1 && writer.record_transitions(&items).await.is_ok() {
        return;
    }
    for (t, i, h) in items {
        if let Err(e) = writer.record_transition(t, i, h).await {
            tracing::error!(route = %t.route, from = %t.from, to = %t.to, error = %e, "cannot store a transition");
        }
    }
}
