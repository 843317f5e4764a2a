//! A monitor's terms in its cluster ([`crate::cluster::terms`] runs them one at a time).
//!
//! - **Leader**: detection judges and stores (restored from the store at the start of the
//!   term, so it continues from what the previous leader stored), and the scheduler, alerts
//!   (engine and deliveries), the switch controller, drills, retention and regression runs
//!   run. All of it stops, drained, when the term ends.
//! - **Follower**: a detection service restored from the store re-reads the stored route
//!   states every [`FOLLOW_EVERY`] and publishes them; nothing is probed, judged or sent.
//!
//! What every member serves — pages, API, weights, `/metrics`, ingest, its proxy — reads the
//! member's stable watches (health, drift, switch overrides and status), which each term
//! publishes into.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::Config;
use crate::health::service::{HealthOptions, HealthService};
use crate::health::{HealthEvent, HealthSnapshot};
use crate::probe::client::ProbeClient;
use crate::probe::ProbeOutcome;
use crate::route::Route;
use crate::scheduler::{self, SchedulerEvent, SchedulerOptions};
use crate::store::Store;

/// How often a follower re-reads the stored route states (it is at most this plus the
/// leader's save period behind the leader).
pub const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// How often the leader saves changed route states when other members follow them (alone,
/// detection's own default applies: states are saved for restarts only).
pub const CLUSTER_SAVE_EVERY: Duration = Duration::from_secs(1);

/// Where stored outcomes go to be judged: the current leader term's detection, or nowhere
/// while this member follows.
pub(super) type DetectSlot = Slot<ProbeOutcome>;

/// The current leader term's input of one kind, or none while this member follows.
pub(super) type Slot<T> = Arc<Mutex<Option<mpsc::Sender<T>>>>;

/// Where agents' outcomes (accepted by ingest) go to be judged: the leader term's detection.
pub(super) type VantageSlot = Slot<crate::vantage::VantageOutcome>;

/// What every term needs of the member; shared by the terms, outliving each.
pub(super) struct Member {
    pub config: Arc<Config>,
    pub routes: Arc<Vec<Route>>,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub client: ProbeClient,
    pub health_options: HealthOptions,
    pub events: broadcast::Sender<HealthEvent>,
    pub health: watch::Sender<Arc<HealthSnapshot>>,
    pub detect: DetectSlot,
    /// Agents' outcomes for the leader term's per-vantage detection, and what it judged.
    pub vantage_inputs: VantageSlot,
    pub vantage_view: watch::Sender<Arc<crate::health::VantageView>>,
    pub alerts: Arc<crate::alert::AlertService>,
    /// Status page subscribers' notices (`[subscriptions] enabled`), sent by the leader.
    pub subscribers: Option<Arc<crate::alert::subscribers::deliver::Subscribers>>,
    pub drift: watch::Sender<Arc<crate::drift::DriftSnapshot>>,
    pub overrides: watch::Sender<Arc<crate::weights::Overrides>>,
    pub switch: watch::Sender<Arc<crate::switch::SwitchStatus>>,
    pub budget: Arc<crate::extra_cost::ExtraCost>,
    pub drills: crate::drill::DrillService,
    pub weights: crate::weights::WeightsRx,
    pub pulses: crate::heartbeat::Pulses,
    pub shutdown: CancellationToken,
    /// Watches the term's long-lived tasks ([`crate::supervise`]).
    pub supervisor: crate::supervise::Supervisor,
    /// `[[sync]]` gateways' state, written by the leader's sync task.
    pub sync: crate::sync::SyncBoard,
    /// What providers declare on their status pages, written by the leader's task.
    pub declared: crate::declared::DeclaredBoard,
}

/// Forwards every stored outcome to the current leader term's detection; at the end (every
/// sender gone, at shutdown) it closes the slot so that term's detection drains and stops.
pub(super) async fn dispatch<T: Send + 'static>(mut outcomes: mpsc::Receiver<T>, slot: Slot<T>) {
    while let Some(outcome) = outcomes.recv().await {
        let tx = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match tx {
            Some(tx) => {
                if tx.send(outcome).await.is_err() {
                    tracing::debug!("detection's term has ended; outcome stored, not judged");
                }
            }
            None => {
                tracing::debug!(
                    "this member follows: outcome stored, judged only by a leader that receives it"
                )
            }
        }
    }
    slot.lock().unwrap_or_else(|e| e.into_inner()).take();
}

/// The member's detection for a new term: `first` (restored at the start) or a fresh
/// restore from the store, retried every second until `token` ends the term.
async fn detection(
    m: &Member,
    first: Option<HealthService>,
    token: &CancellationToken,
) -> Option<HealthService> {
    if let Some(h) = first {
        return Some(h);
    }
    loop {
        match HealthService::restore(
            &m.config,
            m.health_options.clone(),
            &m.store,
            m.clock.clone(),
            m.events.clone(),
        )
        .await
        {
            Ok(h) => return Some(h),
            Err(e) => {
                tracing::error!(error = %e, "cannot restore detection from the store; retrying")
            }
        }
        tokio::select! {
            _ = token.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// A follower's term: the stored judgements published until the term ends.
pub(super) async fn follow(m: Arc<Member>, first: Option<HealthService>, token: CancellationToken) {
    let Some(mut health) = detection(&m, first, &token).await else {
        return;
    };
    health.publish_into(m.health.clone());
    tracing::info!(
        "follower: serving the leader's stored judgements; not probing, judging or alerting"
    );
    if m.config
        .providers
        .iter()
        .any(|p| !p.status_pages.is_empty())
    {
        tokio::spawn(crate::declared::follow(
            m.declared.clone(),
            m.store.clone(),
            m.clock.clone(),
            crate::config::status_page::MIN_EVERY,
            token.clone(),
        ));
    }
    health.follow(m.store.clone(), FOLLOW_EVERY, token).await;
}

/// A leader's term: everything only one member may do, started now and stopped (each task
/// drained) when `token` ends the term.
pub(super) async fn lead(
    m: Arc<Member>,
    first: Option<HealthService>,
    scheduled: mpsc::Sender<SchedulerEvent>,
    token: CancellationToken,
) {
    let Some(mut health) = detection(&m, first, &token).await else {
        return;
    };
    health.publish_into(m.health.clone());
    let commands = health.commands();
    // Confirmation probes: detection asks the scheduler to probe an abnormal route again soon.
    let confirms = health.confirmations();
    let vantages = health.vantages();
    *m.vantage_inputs.lock().unwrap_or_else(|e| e.into_inner()) = Some(vantages.inputs);
    let (inputs_tx, inputs) = mpsc::channel(super::DETECTION_QUEUE);
    *m.detect.lock().unwrap_or_else(|e| e.into_inner()) = Some(inputs_tx);
    // Alerts subscribe before detection can publish anything, so no event is missed.
    let alert_events = m.events.subscribe();
    let subscriber_events = m.subscribers.as_ref().map(|_| m.events.subscribe());
    let sv = &m.supervisor;
    let health_task = sv.spawn(
        "detection",
        token.clone(),
        health.run(inputs, token.clone()),
    );
    let mut tasks: Vec<JoinHandle<()>> = vec![sv.spawn(
        "alerts",
        token.clone(),
        crate::alert::run(m.alerts.clone(), alert_events, token.clone()),
    )];
    if let (Some(subs), Some(events)) = (&m.subscribers, subscriber_events) {
        tasks.push(sv.spawn(
            "subscribers",
            token.clone(),
            crate::alert::subscribers::deliver::run(subs.clone(), events, token.clone()),
        ));
    }
    tasks.push(relay(vantages.view, m.vantage_view.clone(), token.clone()));
    // Embeddings routes get the embeddings probe, their vectors judged against the stored
    // reference; every other route the chat probe.
    let (prober, embedded) = crate::embed::EmbedProber::new(
        m.client.clone(),
        m.config.embedding_routes(),
        m.store.clone(),
        m.clock.clone(),
    );
    tasks.push(sv.spawn(
        "scheduler",
        token.clone(),
        scheduler::run_with_confirmations(
            m.routes.iter().cloned().map(Arc::new).collect(),
            Arc::new(prober.clone()),
            m.clock.clone(),
            scheduled,
            SchedulerOptions {
                max_confirmations: m.config.detection.degraded_after,
                ..SchedulerOptions::default()
            },
            confirms,
            token.clone(),
        ),
    ));
    tasks.push(sv.spawn(
        "retention",
        token.clone(),
        super::retention(
            m.store.writer(),
            m.clock.clone(),
            m.config.storage.retention_days,
            m.config.storage.rollup_retention_days,
            token.clone(),
        ),
    ));
    // Drift: regression sets on their own schedule (heartbeat job "drift"), its findings
    // into the member's watch and, opened and closed, to the alert engine.
    let mut runs = None;
    // Regression sets are conversations: embeddings routes have none to run.
    let chat_routes: Vec<Route> = (m.routes.iter())
        .filter(|r| !prober.embeds(&r.id))
        .cloned()
        .collect();
    match crate::drift::spawn(
        &m.config,
        &chat_routes,
        m.client.clone(),
        m.store.clone(),
        m.clock.clone(),
        crate::drift::RunnerOptions::default(),
        token.clone(),
    )
    .await
    {
        Ok(drift) => {
            runs = Some(drift.rx);
            tasks.push(drift.task);
        }
        Err(e) => {
            tracing::error!(error = %e, "drift: the regression sets are unusable; no regression runs this term")
        }
    }
    // Real traffic's structured-output validity is drift evidence too: its findings join the
    // regression sets' in the member's watch, and reach the alert engine the same way.
    let (traffic, traffic_task) = crate::drift::traffic::spawn(
        m.store.clone(),
        m.clock.clone(),
        crate::drift::traffic::TrafficOptions::default(),
        token.clone(),
    );
    tasks.push(traffic_task);
    // Declared `tools` / `json_schema` capabilities are probed from the leader; their
    // `capability_lost` findings join the drift findings the same way.
    let (lost_tx, lost) = watch::channel(Arc::new(Vec::new()));
    tasks.push(sv.spawn(
        "capabilities",
        token.clone(),
        crate::capability::run(
            crate::capability::CapabilityDriver {
                routes: m.routes.clone(),
                config: m.config.capability.clone(),
                env: m.config.env.clone(),
                store: Some(m.store.clone()),
                retention: Duration::from_secs(u64::from(m.config.storage.retention_days) * 86_400),
                clock: m.clock.clone(),
                health: m.health.subscribe(),
            },
            lost_tx,
            token.clone(),
        ),
    ));
    // The long prompt (`[capability] long_prompt`, when set) from the leader too; its
    // findings join the capability probes'.
    let (long_tx, long) = watch::channel(Arc::new(Vec::new()));
    let long_driver = m.config.capability.long_prompt.map(|config| {
        crate::capability::long_prompt::LongPromptDriver {
            routes: m.routes.clone(),
            config,
            env: m.config.env.clone(),
            store: Some(m.store.clone()),
            retention: Duration::from_secs(u64::from(m.config.storage.retention_days) * 86_400),
            clock: m.clock.clone(),
            health: m.health.subscribe(),
        }
    });
    tasks.push(sv.spawn(
        "long_prompt",
        token.clone(),
        crate::capability::long_prompt::run(long_driver, long_tx, token.clone()),
    ));
    let (lost, lost_joined) = join_findings(lost, long, token.clone());
    tasks.push(lost_joined);
    let (merged_tx, merged) =
        watch::channel(Arc::new(crate::drift::DriftSnapshot::empty(m.clock.now())));
    // Embeddings routes' changed models join real traffic's findings the same way.
    let (outside, joined) = join_findings(traffic, embedded, token.clone());
    tasks.push(joined);
    tasks.push(merge_drift(runs, outside, lost, merged_tx, token.clone()));
    tasks.push(relay(merged.clone(), m.drift.clone(), token.clone()));
    tasks.push(crate::drift::events::spawn(
        merged,
        m.events.clone(),
        m.clock.clone(),
        token.clone(),
    ));
    // The switch controller: SWITCHED through this term's detection, its overrides into the
    // weights, its status on `/metrics`, the status page and `GET /api/v1/switches`.
    let switch = crate::switch::spawn(
        crate::switch::Driver {
            routes: m.routes.clone(),
            cfg: m.config.switch.clone(),
            health: m.health.subscribe(),
            commands,
            budget: m.budget.clone(),
            prober: Arc::new(prober),
            store: m.store.clone(),
            events: m.events.clone(),
            clock: m.clock.clone(),
            tick: Duration::from_secs(1),
            pulse: Some(m.pulses.pulse(crate::heartbeat::SWITCH)),
        },
        token.clone(),
    );
    tasks.push(relay(switch.overrides, m.overrides.clone(), token.clone()));
    tasks.push(relay(switch.status, m.switch.clone(), token.clone()));
    tasks.push(switch.task);
    tasks.push(m.drills.spawn(
        Some(m.weights.clone()),
        Some(m.pulses.pulse(crate::heartbeat::DRILLS)),
        token.clone(),
    ));
    // new-api / one-api channels follow the weights from the leader only: two members writing
    // one gateway would fight over its channels.
    if !m.config.sync.is_empty() {
        tasks.push(sv.spawn(
            "sync",
            token.clone(),
            crate::sync::run(
                crate::sync::SyncDriver {
                    gateways: m.config.sync.clone(),
                    env: m.config.env.clone(),
                    weights: m.weights.clone(),
                    store: m.store.clone(),
                    clock: m.clock.clone(),
                    events: m.events.clone(),
                    board: m.sync.clone(),
                    tick: Duration::from_secs(1),
                },
                token.clone(),
            ),
        ));
    }
    // Providers' status pages: read from the leader only (one reader per fleet is enough
    // for a public page, and one writer keeps the declared tables and alerts single).
    if m.config
        .providers
        .iter()
        .any(|p| !p.status_pages.is_empty())
    {
        tasks.push(sv.spawn(
            "status_pages",
            token.clone(),
            crate::declared::run(
                crate::declared::DeclaredDriver {
                    config: m.config.clone(),
                    routes: m.routes.iter().map(|r| r.id.clone()).collect(),
                    store: m.store.clone(),
                    clock: m.clock.clone(),
                    events: m.events.clone(),
                    health: m.health.subscribe(),
                    board: m.declared.clone(),
                    tick: Duration::from_secs(1),
                    timeout: crate::declared::fetch::TIMEOUT,
                },
                token.clone(),
            ),
        ));
    }
    // The providers' model lists are read from the leader only: one reader per region is
    // enough, and two would count one answer twice.
    if !m.routes.is_empty() {
        tasks.push(sv.spawn(
            "catalog",
            token.clone(),
            crate::catalog::run(
                crate::catalog::CatalogDriver {
                    routes: m.routes.clone(),
                    config: m.config.catalog.clone(),
                    env: m.config.env.clone(),
                    store: m.store.clone(),
                    clock: m.clock.clone(),
                    events: m.events.clone(),
                },
                token.clone(),
            ),
        ));
    }
    tracing::info!("leader: probing, judging, alerting, switching, drills, retention and regression runs started");

    token.cancelled().await;
    if !m.shutdown.is_cancelled() {
        // Outcomes arriving from now on are stored, and judged by a leader that gets them; at
        // shutdown the slot stays until the queues have drained into this detection.
        m.detect.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
    for t in tasks {
        if let Err(e) = t.await {
            tracing::error!(error = %e, "a leader-only task panicked");
        }
    }
    if let Err(e) = health_task.await {
        tracing::error!(error = %e, "detection panicked");
    }
    if !m.shutdown.is_cancelled() {
        tracing::info!("leader-only work stopped");
    }
}

/// Copies a term's watch into the member's until the term ends (or the source is gone).
/// The regression runner's snapshot (when it runs) with real traffic's findings and the
/// capability probes' merged in, republished whenever one changes; a side that ends keeps its
/// last value.
fn merge_drift(
    mut runs: Option<watch::Receiver<Arc<crate::drift::DriftSnapshot>>>,
    mut traffic: watch::Receiver<Arc<Vec<crate::drift::DriftFinding>>>,
    mut lost: crate::capability::LostRx,
    to: watch::Sender<Arc<crate::drift::DriftSnapshot>>,
    token: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut base = to.borrow().clone();
        let mut traffic_open = true;
        let mut lost_open = true;
        loop {
            if let Some(r) = runs.as_mut() {
                base = r.borrow_and_update().clone();
            }
            let found = traffic.borrow_and_update().clone();
            let lost_now = lost.borrow_and_update().clone();
            to.send_replace(Arc::new(
                base.with_traffic(&found).with_capabilities(&lost_now),
            ));
            let runs_changed = async {
                match runs.as_mut() {
                    Some(r) => r.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let traffic_changed = async {
                if traffic_open {
                    traffic.changed().await.is_ok()
                } else {
                    std::future::pending().await
                }
            };
            let lost_changed = async {
                if lost_open {
                    lost.changed().await.is_ok()
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                _ = token.cancelled() => return,
                ok = runs_changed => if !ok { runs = None },
                ok = traffic_changed => if !ok { traffic_open = false },
                ok = lost_changed => if !ok { lost_open = false },
            }
            if runs.is_none() && !traffic_open && !lost_open {
                return;
            }
        }
    })
}

/// Two lists of findings judged outside the regression runs, published as one whenever
/// either changes; a side that ends keeps its last value.
fn join_findings(
    mut a: watch::Receiver<Arc<Vec<crate::drift::DriftFinding>>>,
    mut b: watch::Receiver<Arc<Vec<crate::drift::DriftFinding>>>,
    token: CancellationToken,
) -> (
    watch::Receiver<Arc<Vec<crate::drift::DriftFinding>>>,
    JoinHandle<()>,
) {
    let (tx, rx) = watch::channel(Arc::new(Vec::new()));
    let task = tokio::spawn(async move {
        let (mut a_open, mut b_open) = (true, true);
        loop {
            let both: Vec<_> = (a.borrow_and_update().iter())
                .chain(b.borrow_and_update().iter())
                .cloned()
                .collect();
            tx.send_replace(Arc::new(both));
            let a_changed = async {
                if a_open {
                    a.changed().await.is_ok()
                } else {
                    std::future::pending().await
                }
            };
            let b_changed = async {
                if b_open {
                    b.changed().await.is_ok()
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                _ = token.cancelled() => return,
                ok = a_changed => a_open = ok,
                ok = b_changed => b_open = ok,
            }
            if !a_open && !b_open {
                return;
            }
        }
    });
    (rx, task)
}

fn relay<T: Clone + Send + Sync + 'static>(
    mut from: watch::Receiver<T>,
    to: watch::Sender<T>,
    token: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            to.send_replace(from.borrow_and_update().clone());
            tokio::select! {
                _ = token.cancelled() => return,
                changed = from.changed() => if changed.is_err() { return },
            }
        }
    })
}
