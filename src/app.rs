//! Wires the running service together: store, probe client, scheduler, recorder, retention,
//! detection (the health service) and the web server, all under one `CancellationToken` with
//! a bounded drain at shutdown. Routers follow the weights through the web server's feed
//! and Envoy's endpoint discovery, and through HAProxy's agent-check on a listener of its own.
//!
//! What only one monitor of a cluster may do — the scheduler, detection's judging, alerts, the
//! switch controller, drills, retention, regression runs — runs in leader terms, and a
//! follower's view of the stored health in follower terms (`app::terms`); with SQLite the
//! monitor always leads.
//!
//! Outcomes flow scheduler → recorder → store, then detection; passive outcomes flow passive
//! queue → store, then detection. Every queue is bounded and every send waits (back-pressure,
//! never a silent drop). At shutdown the producers stop first, so detection judges and saves
//! everything that reached it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::health::HealthRx;
use crate::probe::client::ProbeClient;
use crate::probe::{OutcomeKind, ProbeOutcome};
use crate::route::Route;
use crate::scheduler::{Prober, SchedulerEvent};
use crate::store::{Store, StoreOptions, Writer};
use crate::web::{self, AppState};

mod subsystems;
mod terms;

/// How long shutdown waits for in-flight work before giving up on it.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Passive outcomes waiting for detection and the store; senders wait when it is full.
pub const PASSIVE_QUEUE: usize = 4096;

/// Stored outcomes (probe and passive) waiting for detection; senders wait when it is full.
pub const DETECTION_QUEUE: usize = 4096;

/// How often old raw rows and rollups are pruned.
const RETENTION_EVERY: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("detection: {0}")]
    Health(#[from] crate::health::service::HealthError),
    #[error("probe client: {0}")]
    Probe(#[from] crate::probe::client::ProbeSetupError),
    #[error("web server: {0}")]
    Io(#[from] std::io::Error),
    #[error("drift: {0}")]
    Drift(String),
    #[error("drills: {0}")]
    Drill(#[from] crate::drill::service::DrillError),
    #[error("proxy: {0}")]
    Proxy(#[from] crate::proxy::ProxyError),
    #[error("cluster: {0}")]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error("tracing: {0}")]
    Trace(#[from] crate::trace::TraceError),
    #[error("a task panicked: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("{0}")]
    Task(crate::supervise::Failure),
}

/// Where the store lives: PostgreSQL when `[storage] url_env` names a variable holding a
/// `postgres://` URL, else the SQLite file at `[storage] path`.
pub fn store_location(config: &Config) -> Result<crate::store::StoreLocation, AppError> {
    Ok(crate::store::StoreLocation::resolve(
        &config.storage.path,
        config.storage.url_env.as_deref(),
        |name| std::env::var(name).ok(),
    )?)
}

/// The probe client alone (an agent, `probeok probe`): an embeddings route gets the
/// embeddings probe, its vector judged only where the store is (`crate::embed::EmbedProber`).
impl Prober for ProbeClient {
    fn probe<'a>(&'a self, route: &'a Route, kind: OutcomeKind) -> BoxFuture<'a, ProbeOutcome> {
        match route.embedding {
            Some(dimensions) => async move { self.embed(route, dimensions).await.outcome }.boxed(),
            None => ProbeClient::probe(self, route, kind).boxed(),
        }
    }
}

/// A started service: where it listens, and the task that ends when it has shut down.
pub struct Running {
    pub addr: SocketAddr,
    pub store: Store,
    /// Detection's latest judgement of every route.
    pub health: HealthRx,
    /// This member's role in its cluster (always the leader with SQLite).
    pub role: crate::cluster::RoleRx,
    /// The config in effect, following reloads; [`crate::reload::LiveConfig::reload`]
    /// re-reads the file (SIGHUP, `POST /api/v1/admin/reload`).
    pub config: crate::reload::LiveConfig,
    pub done: JoinHandle<Result<(), AppError>>,
}

/// How [`start_with`] runs the service beyond its config.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// The file the config was loaded from, re-read on reload; `None` (the built-in demo, a
    /// config built in code): reload answers 409 `no_config_file`.
    pub config_file: Option<std::path::PathBuf>,
    /// The heartbeat monitor's periods.
    pub heartbeat: crate::heartbeat::Options,
    /// The member's role, driven by the caller (tests); `None`: from the config — a lease on
    /// the PostgreSQL database `[storage] url_env` names, else always the leader.
    pub role: Option<crate::cluster::RoleRx>,
    /// The in-process proxy's client keys, instead of reading `[proxy] client_keys_env`.
    pub proxy_client_keys: Option<Vec<crate::secret::Secret>>,
}

/// Runs until `shutdown` is cancelled and everything has drained.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), AppError> {
    let running = start(config, listener, Arc::new(SystemClock), shutdown).await?;
    running.done.await?
}

/// Starts every task and returns once the web server is accepting connections.
pub async fn start(
    config: Config,
    listener: TcpListener,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) -> Result<Running, AppError> {
    start_with(config, listener, clock, shutdown, StartOptions::default()).await
}

/// [`start`] with a config file to reload and the heartbeat monitor's periods. Starts the
/// subsystems in the order the data flows (`app::subsystems`, one function each).
pub async fn start_with(
    config: Config,
    listener: TcpListener,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
    options: StartOptions,
) -> Result<Running, AppError> {
    let started_at = clock.now();
    // Hot reload: the config in effect; consumers of live sections follow it.
    // One copy of the config and of the routes, shared: at 10,000 routes each copy is MBs.
    let config = Arc::new(config);
    let (live_tx, live_rx) = watch::channel(config.clone());
    let live = crate::reload::LiveConfig::new(live_rx);
    // Loops that must not wait on the store beat in memory; the monitor persists them.
    let pulses = crate::heartbeat::Pulses::new(clock.clone());
    let routes: Arc<Vec<Route>> = Arc::new(config.routes());
    let location = store_location(&config)?;
    tracing::info!(engine = location.engine().as_str(), database = %location.describe(), "opening the store");
    let opts = StoreOptions {
        latency_threshold: config.slo.latency_threshold,
    };
    let store = tokio::task::spawn_blocking(move || Store::open_at(&location, opts)).await??;
    let client = ProbeClient::with_env(&routes, clock.clone(), &config.env)?;

    let membership = subsystems::membership(&config, &options)?;
    let detection = subsystems::detection(&config, &store, &clock, membership.clustered).await?;

    // Drift findings (read by `GET /api/v1/drift` and the weights) from the leader's runner.
    let drift_jobs = crate::drift::runner::jobs(&config, &routes).map_err(AppError::Drift)?;
    let (drift_tx, drift_rx) =
        watch::channel(Arc::new(crate::drift::DriftSnapshot::empty(clock.now())));

    let metrics = Arc::new(web::Metrics::for_vantage(&routes, &config.server.vantage));
    let supervisor = crate::supervise::Supervisor::new(crate::supervise::MONITOR_TASKS);
    metrics.follow_tasks(supervisor.clone());
    // Spans of probes and proxied requests, when `[tracing] otlp_endpoint_env` is set.
    let tracer = crate::trace::Tracer::from_env(&config.tracing)?;
    metrics.attach_tracer(tracer.clone());
    metrics.attach_role(membership.role.clone());
    let sync_board = crate::sync::SyncBoard::new(&config.sync);
    metrics.attach_sync(sync_board.clone());
    // What providers declare on their status pages: every member shows the last known state
    // from the store; the leader reads the pages.
    let declared = crate::declared::DeclaredBoard::new(&config, Some(metrics.incident_lead()));
    if config.providers.iter().any(|p| !p.status_pages.is_empty()) {
        declared.load(&store, clock.now()).await;
    }
    metrics.attach_declared(declared.clone());
    metrics.attach_headroom(detection.options.headroom.clone());
    metrics.attach_warm(detection.options.warm.clone());
    let recorders = subsystems::recorders(
        &config,
        &routes,
        &store,
        &clock,
        &metrics,
        &tracer,
        detection.detect_tx.clone(),
    )
    .await?;
    let money = subsystems::money(subsystems::MoneyInputs {
        config: &config,
        routes: &routes,
        store: &store,
        clock: &clock,
        events: &detection.events,
        metrics: &metrics,
        pulses: &pulses,
        shutdown: &shutdown,
    });

    // Weights follow health, drift (open findings with `on_drift = "deweight"`, the quality
    // gate for backup and fallback routes), the switch controller's overrides, the
    // in-process proxy's open breakers (disclosed in the weights' reasons; without a proxy
    // the sender is dropped and that feed ends) and the drills' caps. Drills are restored
    // from the store, served by the admin API and `GET /api/v1/drills`, and step and end
    // themselves in leader terms.
    let (breakers_tx, breakers_rx) = watch::channel(Arc::new(crate::weights::OpenBreakers::new()));
    let drills = crate::drill::DrillService::restore(
        live.clone(),
        routes.clone(),
        store.clone(),
        clock.clone(),
    )
    .await?;
    let weights_rx = crate::weights::spawn_publisher(
        crate::weights::Feeds {
            policy: crate::weights::Policy::from_config(&config),
            drift: Some(drift_rx.clone()),
            overrides: Some(money.overrides_rx.clone()),
            breakers: Some(breakers_rx),
            drills: Some(drills.caps()),
            pulse: Some(pulses.pulse(crate::heartbeat::WEIGHTS)),
            ..crate::weights::Feeds::new(routes.clone(), detection.health_rx.clone())
        },
        shutdown.clone(),
    );
    metrics.attach_drills(drills.subscribe());

    let proxy_task = subsystems::proxy(subsystems::ProxyInputs {
        config: &config,
        routes: &routes,
        store: &store,
        clock: &clock,
        live: &live,
        tracer: &tracer,
        options: &options,
        money: &money,
        metrics: &metrics,
        weights: &weights_rx,
        passive_tx: &recorders.passive_tx,
        breakers_tx,
        shutdown: &shutdown,
    })
    .await?;

    // HAProxy's agent checks, answered from the same weights.
    let agent_task = match config.haproxy.agent_listen {
        Some(addr) => {
            let agent_listener = TcpListener::bind(addr).await?;
            tracing::info!(%addr, "haproxy agent-check serving");
            Some(supervisor.spawn(
                "haproxy_agent",
                shutdown.clone(),
                crate::haproxy::serve(agent_listener, weights_rx.clone(), shutdown.clone()),
            ))
        }
        None => None,
    };

    let ingest_token = config.env.secret(&config.server.ingest_token_env);
    if ingest_token.is_none() {
        tracing::info!(var = %config.server.ingest_token_env, "ingest disabled: token variable unset");
    }

    // Every scheduled job's heartbeat (`async_jobs` when the proxy runs: its worker beats it).
    let jobs = Arc::new(crate::heartbeat::Jobs::new(
        crate::heartbeat::expected(&config, &drift_jobs),
        started_at,
    ));
    let heartbeat_task = crate::heartbeat::spawn(
        crate::heartbeat::Monitor {
            pulses: pulses.clone(),
            store: store.clone(),
            clock: clock.clone(),
            jobs: jobs.clone(),
            config: live.clone(),
            options: options.heartbeat.clone(),
        },
        shutdown.clone(),
    );
    let reloader = Arc::new(crate::reload::Reloader::new(
        options.config_file.clone(),
        live_tx,
        Arc::new(check_channels),
        Some(metrics.clone() as Arc<dyn crate::reload::ReloadObserver>),
        clock.clone(),
    ));
    let state = AppState {
        config: reloader.live(),
        routes: routes.clone(),
        store: store.clone(),
        clock: clock.clone(),
        jobs: jobs.clone(),
        health: detection.health_rx.clone(),
        events: detection.events.clone(),
        passive: recorders.passive_tx.clone(),
        weights: weights_rx,
        metrics: metrics.clone(),
        ingest_token,
        incidents: Arc::new(web::StoreIncidents),
        drift: Some(drift_rx),
        drills: Some(drills.clone()),
        figures: Default::default(),
        guards: Default::default(),
        shutdown: shutdown.clone(),
        vantages: Some(detection.vantages.clone()),
        xds: Default::default(),
    };
    let alerts = subsystems::alerts(
        &store,
        &clock,
        &live,
        &jobs,
        &pulses,
        &metrics,
        recorders.tally.clone(),
    );
    let member = Arc::new(terms::Member {
        config: config.clone(),
        routes: routes.clone(),
        store: store.clone(),
        clock: clock.clone(),
        client: client.clone(),
        health_options: detection.options.clone(),
        events: detection.events.clone(),
        health: detection.health_tx.clone(),
        detect: detection.detect_slot.clone(),
        vantage_inputs: detection.vantage_slot.clone(),
        vantage_view: detection.vantage_view,
        alerts,
        subscribers: config.subscriptions.enabled.then(|| {
            Arc::new(crate::alert::subscribers::deliver::Subscribers::new(
                &config,
                store.clone(),
                clock.clone(),
            ))
        }),
        drift: drift_tx,
        overrides: money.overrides_tx,
        switch: money.switch_tx,
        budget: money.budget.clone(),
        drills,
        weights: state.weights.clone(),
        pulses: pulses.clone(),
        shutdown: shutdown.clone(),
        supervisor: supervisor.clone(),
        sync: sync_board,
        declared,
    });
    let terms_task = subsystems::terms(
        member,
        detection.first,
        membership.role.clone(),
        recorders.sched_tx,
        shutdown.clone(),
    );
    let addr = listener.local_addr()?;
    let web_task = supervisor.spawn(
        "web",
        shutdown.clone(),
        crate::listen::serve(
            listener,
            web::router(state),
            crate::listen::Limits {
                max_connections: config.server.max_connections as usize,
                ..Default::default()
            },
            shutdown.clone(),
            "monitor",
        ),
    );
    tracing::info!(%addr, routes = routes.len(), store = %store.location().describe(), "probeok serving");

    // Every long-lived task is watched: one that panics or ends early stops the process.
    let sv = &supervisor;
    let until = || shutdown.clone();
    let tasks = subsystems::Tasks {
        budget: sv.watch("budget", until(), money.budget_task),
        web: web_task,
        proxy: proxy_task.map(|t| sv.watch("proxy", until(), t)),
        passive: sv.watch("passive_recorder", until(), recorders.passive_task),
        vantage_dispatch: sv.watch("vantage_dispatch", until(), detection.vantage_dispatch),
        recorder: sv.watch("recorder", until(), recorders.recorder_task),
        dispatch: sv.watch("dispatch", until(), detection.dispatch_task),
        terms: sv.watch("terms", until(), terms_task),
        heartbeat: sv.watch("heartbeat", until(), heartbeat_task),
        agent: agent_task,
    };
    let role = membership.role.clone();
    let done = tokio::spawn(tasks.drain(shutdown, supervisor, membership, store.clone()));
    Ok(Running {
        addr,
        store,
        health: detection.health_rx,
        role,
        config: reloader.live(),
        done,
    })
}

/// What the recorders tell about each outcome the store took.
#[derive(Clone)]
struct Recorded {
    /// The burn-rate windows' running sums.
    tally: Arc<crate::alert::tally::Tally>,
    /// Kept by the probe recorder only: the schedule is what the store must keep up with.
    lag: Option<Arc<crate::lag::StoreLag>>,
}

/// Writes every scheduler event to the store, then hands outcomes to detection; one failed
/// write is logged, not fatal (the outcome is still judged). Whatever is queued when it looks
/// goes to the store in one transaction: a writer that falls behind gets bigger batches, so
/// it catches up instead of the queue filling and the scheduler skipping probes.
async fn record(
    mut events: mpsc::Receiver<SchedulerEvent>,
    writer: Writer,
    detect: mpsc::Sender<ProbeOutcome>,
    metrics: Arc<web::Metrics>,
    recorded: Recorded,
    tracer: crate::trace::Tracer,
) {
    while let Some(first) = events.recv().await {
        let mut outcomes = Vec::new();
        let mut others = Vec::new();
        let mut next = Some(first);
        while let Some(event) = next.take() {
            match event {
                SchedulerEvent::Outcome(o) => outcomes.push(o),
                other => others.push(other),
            }
            if outcomes.len() + others.len() < crate::store::BATCH_CAP {
                next = events.try_recv().ok();
            }
        }
        for o in &outcomes {
            metrics.observe_outcome(o);
            tracer.probe(o);
        }
        store_batch(&writer, &outcomes, &recorded).await;
        for o in outcomes {
            to_detection(&detect, o).await;
        }
        for event in others {
            let result = match event {
                SchedulerEvent::Outcome(_) => Ok(()),
                SchedulerEvent::Skipped { route, kind, at } => {
                    writer.record_skip(&route, kind, at).await
                }
                SchedulerEvent::Heartbeat { at } => writer.heartbeat("scheduler", at).await,
            };
            if let Err(e) = result {
                tracing::error!(error = %e, "cannot record a scheduler event");
            }
        }
    }
}

/// Stores `outcomes` in one transaction; if that fails, one by one, so one bad outcome does
/// not lose its neighbours. Each stored outcome is counted into the burn-rate sums.
async fn store_batch(writer: &Writer, outcomes: &[ProbeOutcome], recorded: &Recorded) {
    let Some(oldest) = outcomes
        .iter()
        .map(|o| o.started_at + chrono::Duration::milliseconds(o.total_ms as i64))
        .min()
    else {
        return;
    };
    if let Some(lag) = &recorded.lag {
        lag.begin(oldest);
    }
    if writer.record_many(outcomes.to_vec()).await.is_ok() {
        for o in outcomes {
            recorded.tally.record(o);
        }
    } else {
        for o in outcomes {
            match writer.record(o.clone()).await {
                Ok(()) => recorded.tally.record(o),
                Err(e) => {
                    tracing::error!(route = %o.route, error = %e, "cannot record an outcome")
                }
            }
        }
    }
    if let Some(lag) = &recorded.lag {
        lag.done();
    }
}

/// The proxy's view of the monitor's weights, kept current by a task that ends with the
/// publisher. Both speak the feed's JSON (see `docs/http-api.md`), so the in-process proxy reads what a remote one would.
fn follow_weights(
    mut monitor: watch::Receiver<Arc<crate::weights::WeightsSnapshot>>,
    routes: &[Route],
) -> crate::proxy::WeightsRx {
    let view = |json: &[u8]| match crate::proxy::WeightsView::from_json(json) {
        Ok(v) => Some(Arc::new(v)),
        Err(e) => {
            tracing::error!(error = %e, "the proxy cannot read the weights; keeping the last ones");
            None
        }
    };
    let first = view(&monitor.borrow_and_update().json)
        .unwrap_or_else(|| Arc::new(crate::proxy::WeightsView::from_config(routes)));
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        while monitor.changed().await.is_ok() {
            let json = monitor.borrow_and_update().json.clone();
            if let Some(v) = view(&json) {
                if tx.send(v).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Sends the proxy's open (or half-open) breakers whenever that set changes; polled once a
/// second, the breakers' own granularity being seconds.
async fn follow_breakers(
    stats: crate::proxy::ProxyStats,
    tx: watch::Sender<Arc<crate::weights::OpenBreakers>>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let open: crate::weights::OpenBreakers = stats
            .breakers()
            .into_iter()
            .filter(|b| b.state != crate::proxy::breaker::BreakerState::Closed)
            .map(|b| b.route)
            .collect();
        tx.send_if_modified(|cur| {
            if **cur == open {
                false
            } else {
                *cur = Arc::new(open);
                true
            }
        });
    }
}

/// Stores passive outcomes as they arrive (what is queued together in one transaction, taken
/// in gatherings), then hands them to detection.
async fn record_passive(
    mut passive: mpsc::Receiver<ProbeOutcome>,
    writer: Writer,
    detect: mpsc::Sender<ProbeOutcome>,
    recorded: Recorded,
) {
    // One wake-up per gathering: the proxy sends one outcome per request.
    let mut gather = crate::gather::Gather::new(crate::gather::PAUSE);
    let mut batch = Vec::new();
    while gather
        .take(&mut passive, &mut batch, crate::store::BATCH_CAP)
        .await
        > 0
    {
        store_batch(&writer, &batch, &recorded).await;
        for o in batch.drain(..) {
            to_detection(&detect, o).await;
        }
    }
}

/// Waits for room in detection's queue. Detection only stops after its senders are gone, so a
/// refusal means it died: say so rather than drop the outcome silently.
async fn to_detection(detect: &mpsc::Sender<ProbeOutcome>, outcome: ProbeOutcome) {
    if let Err(e) = detect.send(outcome).await {
        tracing::error!(route = %e.0.route, "detection has stopped; outcome stored but not judged");
    }
}

/// Prunes old rows and packs closed hours now and then, beating its own heartbeat. A prune runs as a task of its own
/// and the job beats while it runs: expiring a day of 10,000 routes is tens of millions of rows
/// (minutes of small steps, between which outcomes commit as ever), and a job that is working
/// is not silent.
async fn retention(
    writer: Writer,
    clock: Arc<dyn Clock>,
    retention_days: u32,
    rollup_retention_days: u32,
    shutdown: CancellationToken,
) {
    // Beat often enough for /readyz, prune once an hour.
    let mut ticker = tokio::time::interval(Duration::from_secs(30));
    let mut last_prune: Option<tokio::time::Instant> = None;
    let mut pruning: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                if let Some(p) = pruning.take() {
                    p.abort();
                }
                return;
            }
            _ = ticker.tick() => {}
        }
        let now = clock.now();
        if pruning.as_ref().is_some_and(|p| p.is_finished()) {
            pruning = None;
        }
        if pruning.is_none() && last_prune.is_none_or(|t| t.elapsed() >= RETENTION_EVERY) {
            last_prune = Some(tokio::time::Instant::now());
            let writer = writer.clone();
            pruning = Some(tokio::spawn(async move {
                match writer
                    .retention(now, retention_days, rollup_retention_days)
                    .await
                {
                    Ok(report) => tracing::debug!(?report, "retention done"),
                    Err(e) => tracing::error!(error = %e, "retention failed"),
                }
                // After retention, so rows about to expire are not packed first.
                match writer.pack(now).await {
                    Ok(rows) => tracing::debug!(rows, "closed hours packed"),
                    Err(e) => tracing::error!(error = %e, "packing closed hours failed"),
                }
            }));
        }
        if let Err(e) = writer.heartbeat("retention", now).await {
            tracing::error!(error = %e, "cannot write the retention heartbeat");
        }
    }
}

/// `serve`'s last start check on every config file: every alert channel builds (a bad SMTP
/// URL and the like is refused rather than alerting into the void).
pub fn check_channels(config: &Config) -> Result<(), String> {
    crate::alert::channels(config)
        .map(drop)
        .map_err(|e| e.to_string())
}
