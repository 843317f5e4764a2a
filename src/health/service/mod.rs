//! The health service: the I/O shell around the pure detection core.
//!
//! It owns one [`RouteHealth`] and one [`Baseline`] per configured route and is the only
//! place they change:
//!
//! - **Start** ([`HealthService::restore`]): each baseline is restored from its saved state
//!   and the outcomes stored after it (`warm`), each route's state is restored from
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
//!   transaction; changed states every [`HealthOptions::save_every`], baselines' changed parts
//!   every [`HealthOptions::baseline_save_every`]; everything at shutdown.
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
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::cause::{Causes, Class};
use super::confirm;
use super::control::{self, ControlProbe};
use super::findings::{findings, Finding, FindingKind, RouteSummary};
use super::vantages::{Board, VantageLink, VantageView};

// The multi-vantage part of the shell: agents' outcomes, the quorum, the published view.
mod vantages;
// The persister task: transitions, incidents and states written in order.
mod persist;
// A cluster follower: the stored states published through the same path.
mod follow;
use persist::{persist_loop, send};
// What a route shows and what of it is worth saving or publishing.
mod view;
// Cross-route findings and publishing by change (bursts held to a window).
mod publish;
// Baselines loaded (saved state or history) in the background at start.
mod warm;
// Routes judged on their shared cause's evidence.
mod causes;
// The service's cadences.
mod options;
use super::{
    Baseline, Detector, HealthEvent, HealthRx, HealthSnapshot, Incident, RouteHealth, RouteStatus,
    State, Suppression, Transition,
};
use crate::clock::Clock;
use crate::config::Config;
use crate::probe::{OutcomeKind, ProbeOutcome};
use crate::route::RouteId;
use crate::scheduler::{Confirm, CONFIRM_QUEUE};
use crate::store::baselines::SavedBaseline;
use crate::store::{Store, StoreError, Writer};
use crate::vantage::VantageOutcome;
pub use options::HealthOptions;
use vantages::next_remote;
use view::{fingerprint, same_finding, same_view, status};
pub use warm::WarmProgress;

/// The job name of the service's heartbeat (`/readyz`).
pub const HEARTBEAT_JOB: &str = "health";

/// Writes waiting for the persister; the service waits when it is full (nothing is dropped).
const PERSIST_QUEUE: usize = 1024;
/// Route states per save message (and per commit).
const SAVE_CHUNK: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("restoring detection state: {0}")]
    Task(#[from] tokio::task::JoinError),
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
    /// Baselines' changed parts; a failed save sets the flag, so the next one saves them whole.
    Baselines(Vec<SavedBaseline>, Arc<AtomicBool>),
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
    /// Which routes the next ticks evaluate ([`super::due`]).
    wheel: super::due::Wheel,
    /// Baselines still being rebuilt from the history (`warm`); `None` once all are.
    warming: Option<warm::Warming>,
    /// Set by the persister when a baselines save failed: the next one saves them whole.
    baselines_failed: Arc<AtomicBool>,
    warm_progress: WarmProgress,
    /// Which routes fail together ([`super::cause`]).
    causes: Causes,
    /// Routes a confirmed group asks to judge, once findings are current (an egress finding
    /// must get to suppress them first).
    cause_pending: Vec<usize>,
}

/// What publishing has cost so far: how many snapshots went out and how many route statuses
/// they carried (each published snapshot copies every route's status once).
#[derive(Debug, Default)]
pub struct PublishCounts {
    pub snapshots: std::sync::atomic::AtomicU64,
    pub route_statuses: std::sync::atomic::AtomicU64,
    /// Route evaluations the 1-second ticks made (a settled route is not evaluated).
    pub route_ticks: std::sync::atomic::AtomicU64,
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
        // Baselines from the history: waited for a short while, then warmed in the background.
        let warm_progress = opts.warm.clone();
        let warm_rx = warm::spawn(
            store.clone(),
            wanted.clone(),
            cfg.clone(),
            since,
            &warm_progress,
        );
        let (warm_rx, first) = warm::wait(warm_rx, opts.warm_wait).await?;
        let mut warmed: Vec<Option<Baseline>> = (0..wanted.len()).map(|_| None).collect();
        for w in first {
            warm_progress.one_done();
            if let Some(slot) = warmed.get_mut(w.index) {
                *slot = Some(w.baseline);
            }
        }
        let (stored, remote) = tokio::task::spawn_blocking(move || {
            let reader = reading.reader()?;
            let stored = reader.route_health_all::<RouteHealth>()?;
            let mut remote = HashMap::with_capacity(seats.len());
            for (id, vantage) in seats {
                let (b, _) = warm::load_at(&reader, &id, &vantage, &cfg, since, |from| {
                    reader.vantage_outcomes_since(&id, &vantage, from)
                })?;
                remote.insert((id, vantage), b);
            }
            Ok::<_, StoreError>((stored, remote))
        })
        .await??;
        let warm: Vec<bool> = warmed.iter().map(Option::is_some).collect();
        let baselines: Vec<Baseline> = warmed
            .into_iter()
            .zip(&ids)
            .map(|(b, id)| b.unwrap_or_else(|| Baseline::new(id.clone(), &config.detection)))
            .collect();
        let (done, total) = warm_progress.get();
        if done < total {
            tracing::info!(
                warm = done,
                routes = total,
                "baselines: the rest warm in the background while probing runs"
            );
        }
        let warming =
            (done < total).then(|| warm::Warming::new(warm_rx, warm, warm_progress.clone()));

        let detector = Detector::new(&config.detection);
        let mut board = Board::new(config, &detector, remote, now);
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
                    // A restart resumes: the route keeps this state until its vantages'
                    // reports move it.
                    board.resume(id, h.state());
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
        let routes_len = routes.len();
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
            wheel: super::due::Wheel::new(routes_len),
            board,
            vantage_view: watch::channel(Arc::new(VantageView::default())).0,
            vantage_inputs: None,
            warming,
            baselines_failed: Arc::default(),
            warm_progress,
            causes: Causes::new(&config.routes()),
            cause_pending: Vec::new(),
        })
    }

    /// How far the baselines' rebuild from the history has come (`/readyz`).
    pub fn warm_progress(&self) -> WarmProgress {
        self.warm_progress.clone()
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
        self.save_baselines(&persist).await;
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
        let mut save_baselines = every(o.baseline_save_every, o.baseline_save_every);
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
                ok = next(control_rx) => {
                    self.control_ok = Some(ok);
                    self.evaluate_findings();
                }
                _ = save.tick() => self.save_changed(persist).await,
                _ = baselines.tick() => self.refresh_baselines(),
                _ = save_baselines.tick() => self.save_baselines(persist).await,
                cmd = next(&mut commands) => self.command(cmd),
                _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {}
                v = next_remote(&mut remote) => self.ingest_remote(v, persist).await,
                w = warm::next(&mut self.warming) => self.install(w),
                outcome = inputs.recv() => match outcome {
                    Some(outcome) => self.ingest(outcome, persist).await,
                    None => break,
                },
            }
            self.judge_causes(persist).await;
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
                        self.wheel.touch(i);
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
        if let Some(w) = &mut self.warming {
            w.observe(i, &o);
        }
        self.observe_headroom(&o);
        if o.kind != OutcomeKind::Passive && self.board.covers(&o.route) {
            self.ingest_local_vantage(i, o, persist).await;
            return;
        }
        self.wheel.touch(i);
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
        let confirmation = confirm::confirmation(&r.health, &o, self.detector.config());
        if o.kind != OutcomeKind::Passive && r.health.last_probe().2 != was_failing {
            // A route starting or stopping to fail may make (or end) an egress finding: do
            // not leave it escalating for up to `findings_every`. Evaluated once for every
            // route that flipped together, before the snapshot that shows them.
            self.findings_pending = true;
        }
        if let Some(t) = t {
            self.on_transition(i, t, persist).await;
        }
        if o.kind != OutcomeKind::Passive {
            self.observe_cause(i, Class::of(&o), now);
        }
        if let (Some(tx), Some(kind)) = (&self.confirms, confirmation) {
            // A group's confirmations are spent on a few of its routes.
            if self.causes.wants_confirmation(i) {
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
        self.refresh(i, now);
    }

    /// Keeps the headroom `o`'s answer announced and sends `ratelimit_low` when a limit's
    /// judgement changes ([`super::headroom`]). The reading is dated when the answer's headers
    /// arrived, so a proxy's late batch is judged at the time it was seen.
    fn observe_headroom(&self, o: &ProbeOutcome) {
        let Some(limits) = &o.ratelimit else {
            return;
        };
        let after = chrono::TimeDelta::milliseconds(o.ttfb_ms.unwrap_or(0.0) as i64);
        let at = o.started_at + after;
        let source = super::headroom::Source::of(o.kind);
        for j in self.opts.headroom.observe(&o.route, limits, source, at) {
            let firing = j.change == super::headroom::Change::Low;
            if firing {
                tracing::warn!(route = %o.route, limit = j.limit.as_str(), ratio = j.reading.ratio, "rate limit under 10 % for 5 minutes of real traffic");
            }
            let _ = self.events.send(HealthEvent::RateLimitLow {
                route: o.route.clone(),
                limit: j.limit.as_str().to_owned(),
                quota: crate::ratelimit::Quota {
                    remaining: j.reading.remaining,
                    limit: j.reading.limit,
                },
                firing,
                at,
            });
        }
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
        for j in self.causes.expire(now) {
            self.refresh(j, now);
        }
        // Only the routes touched since their last evaluation, or whose state can change by
        // time alone now: any other evaluation would change nothing.
        let due = self.wheel.take(now.timestamp());
        self.counts
            .route_ticks
            .fetch_add(due.len() as u64, std::sync::atomic::Ordering::Relaxed);
        for i in due {
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
            let r = &self.routes[i];
            // Routes agents probe too follow their vantages' quorum every tick.
            let next = if self.board.covers(r.health.route()) {
                super::due::Due::EveryTick
            } else {
                super::due::due(&r.health)
            };
            self.wheel.schedule(i, next);
        }
        if !self.board.is_empty() {
            let went_stale = self.board.tick(&self.detector, now);
            if went_stale {
                tracing::warn!("a vantage went stale; it leaves the quorum");
            }
            for i in 0..self.routes.len() {
                if self.board.covers(self.routes[i].health.route()) {
                    self.follow_quorum(i, false, persist).await;
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
        let next = RouteStatus {
            cause: self.causes.cause_of(i),
            ..next
        };
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
}

/// The next message of an optional channel; once it closes (or without one), never.
async fn next<T>(rx: &mut Option<mpsc::Receiver<T>>) -> T {
    match rx {
        Some(r) => match r.recv().await {
            Some(v) => v,
            None => {
                *rx = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}
