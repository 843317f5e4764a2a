//! Wires the running service together: store, probe client, scheduler, recorder, retention,
//! detection (the health service) and the web server, all under one `CancellationToken` with
//! a bounded drain at shutdown.
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
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::health::service::{HealthOptions, HealthService};
use crate::health::HealthRx;
use crate::probe::client::ProbeClient;
use crate::probe::{OutcomeKind, ProbeOutcome};
use crate::route::Route;
use crate::scheduler::{self, Prober, SchedulerEvent, SchedulerOptions};
use crate::secret::Secret;
use crate::store::{Store, StoreOptions, Writer};
use crate::web::{self, AppState};

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
    Probe(String),
    #[error("web server: {0}")]
    Io(#[from] std::io::Error),
    #[error("drift: {0}")]
    Drift(String),
    #[error("drills: {0}")]
    Drill(String),
    #[error("proxy: {0}")]
    Proxy(#[from] crate::proxy::ProxyError),
    #[error("a task panicked: {0}")]
    Join(#[from] tokio::task::JoinError),
}

impl Prober for ProbeClient {
    fn probe<'a>(&'a self, route: &'a Route, kind: OutcomeKind) -> BoxFuture<'a, ProbeOutcome> {
        ProbeClient::probe(self, route, kind).boxed()
    }
}

/// A started service: where it listens, and the task that ends when it has shut down.
pub struct Running {
    pub addr: SocketAddr,
    pub store: Store,
    /// Detection's latest judgement of every route.
    pub health: HealthRx,
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

/// [`start`] with a config file to reload and the heartbeat monitor's periods.
pub async fn start_with(
    config: Config,
    listener: TcpListener,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
    options: StartOptions,
) -> Result<Running, AppError> {
    let started_at = clock.now();
    // Hot reload: the config in effect; consumers of live sections follow it.
    let (live_tx, live_rx) = watch::channel(Arc::new(config.clone()));
    let live = crate::reload::LiveConfig::new(live_rx);
    // Loops that must not wait on the store beat in memory; the monitor persists them.
    let pulses = crate::heartbeat::Pulses::new(clock.clone());
    let routes: Vec<Route> = config.routes();
    let store_path = config.storage.path.clone();
    let opts = StoreOptions {
        latency_threshold: config.slo.latency_threshold,
    };
    let store = tokio::task::spawn_blocking(move || Store::open(&store_path, opts)).await??;
    let client =
        ProbeClient::new(&routes, clock.clone()).map_err(|e| AppError::Probe(e.to_string()))?;

    let (health_events, _) = broadcast::channel(1024);
    // Alerts subscribe before detection can publish anything, so no event is missed.
    let alert_events = health_events.subscribe();
    let mut health = HealthService::restore(
        &config,
        HealthOptions::default(),
        &store,
        clock.clone(),
        health_events.clone(),
    )
    .await?;
    let health_rx = health.subscribe();
    let health_commands = health.commands();
    // Confirmation probes: detection asks the scheduler to probe an abnormal route again soon.
    let confirms = health.confirmations();
    // Detection ends once the recorder and the passive drain have dropped their senders.
    let (detect_tx, detect_rx) = mpsc::channel(DETECTION_QUEUE);
    let health_task = tokio::spawn(health.run(detect_rx, shutdown.clone()));

    // Drift: regression sets on their own schedule, findings on a watch channel (read by
    // `GET /api/v1/drift` and the weights), heartbeat job "drift".
    let drift = crate::drift::spawn(
        &config,
        &routes,
        client.clone(),
        store.clone(),
        clock.clone(),
        crate::drift::RunnerOptions::default(),
        shutdown.clone(),
    )
    .await
    .map_err(AppError::Drift)?;
    // Drift findings opened and closed go to the alert engine as health events.
    let drift_events = crate::drift::events::spawn(
        drift.rx.clone(),
        health_events.clone(),
        clock.clone(),
        shutdown.clone(),
    );

    let metrics = Arc::new(web::Metrics::new(&routes));
    let (sched_tx, sched_rx) = mpsc::channel(1024);
    let scheduler_task = tokio::spawn(scheduler::run_with_confirmations(
        routes.iter().cloned().map(Arc::new).collect(),
        Arc::new(client.clone()),
        clock.clone(),
        sched_tx,
        SchedulerOptions {
            max_confirmations: config.detection.degraded_after,
            ..SchedulerOptions::default()
        },
        confirms,
        shutdown.clone(),
    ));
    // The recorder ends when the scheduler drops its sender, so every outcome is written.
    let recorder_task = tokio::spawn(record(
        sched_rx,
        store.writer(),
        detect_tx.clone(),
        metrics.clone(),
    ));
    let retention_task = tokio::spawn(retention(
        store.writer(),
        clock.clone(),
        config.storage.retention_days,
        config.storage.rollup_retention_days,
        shutdown.clone(),
    ));

    let (passive_tx, passive_rx) = mpsc::channel(PASSIVE_QUEUE);
    let passive_task = tokio::spawn(record_passive(passive_rx, store.writer(), detect_tx));

    // Publishing: weights follow health; metrics see every outcome; the ingest token is read
    // once here.
    // The hourly extra-cost budget (the proxy reserves against it) and the switch controller
    // (SWITCHED through detection's command channel, its overrides into the weights, its
    // status on `/metrics`, the status page and `GET /api/v1/switches`).
    let budget = crate::budget::Budget::new(
        config.budget.clone(),
        &routes,
        clock.clone(),
        Some(health_events.clone()),
    );
    metrics.attach_budget(budget.clone());
    let switch = crate::switch::spawn(
        crate::switch::Driver {
            routes: Arc::new(routes.clone()),
            cfg: config.switch.clone(),
            health: health_rx.clone(),
            commands: health_commands,
            budget: budget.clone(),
            prober: Arc::new(client.clone()),
            store: store.clone(),
            events: health_events.clone(),
            clock: clock.clone(),
            tick: Duration::from_secs(1),
            pulse: Some(pulses.pulse(crate::heartbeat::SWITCH)),
        },
        shutdown.clone(),
    );
    let budget_task = tokio::spawn(budget.clone().keep_hours(
        Some(pulses.pulse(crate::heartbeat::BUDGET)),
        shutdown.clone(),
    ));
    metrics.attach_switch(switch.status.clone());
    // Weights follow drift too (open findings with `on_drift = "deweight"`, the quality gate for
    // backup and fallback routes) and the switch controller's overrides.
    // The in-process proxy's open breakers, disclosed in the weights' reasons (the proxy starts
    // below; without it the sender is dropped and the feed ends).
    let (breakers_tx, breakers_rx) = watch::channel(Arc::new(crate::weights::OpenBreakers::new()));
    // Drills: active drills restored from the store, their caps into the weights, served by
    // the admin API and `GET /api/v1/drills`.
    let drills = crate::drill::DrillService::restore(
        live.clone(),
        Arc::new(routes.clone()),
        store.clone(),
        clock.clone(),
    )
    .await
    .map_err(|e| AppError::Drill(e.to_string()))?;
    let weights_rx = crate::weights::spawn_publisher(
        crate::weights::Feeds {
            policy: crate::weights::Policy::from_config(&config),
            drift: Some(drift.rx.clone()),
            overrides: Some(switch.overrides.clone()),
            breakers: Some(breakers_rx),
            drills: Some(drills.caps()),
            pulse: Some(pulses.pulse(crate::heartbeat::WEIGHTS)),
            ..crate::weights::Feeds::new(Arc::new(routes.clone()), health_rx.clone())
        },
        shutdown.clone(),
    );

    let drill_task = drills.spawn(
        Some(weights_rx.clone()),
        Some(pulses.pulse(crate::heartbeat::DRILLS)),
        shutdown.clone(),
    );
    metrics.attach_drills(drills.subscribe());

    // The routing proxy, when enabled: its own listener, the shared shutdown, every attempt into
    // the passive queue, and the monitor's weights, in-process, through the same JSON a remote
    // router reads.
    let proxy_task = if config.proxy.enabled {
        let proxy_listener = TcpListener::bind(config.proxy.listen).await?;
        let proxy_weights = follow_weights(weights_rx.clone(), &routes);
        let opts = crate::proxy::ProxyOptions {
            store: Some(store.clone()),
            clock: clock.clone(),
            live: Some(live.receiver()),
            client_keys: options.proxy_client_keys.clone(),
            ..crate::proxy::ProxyOptions::default()
        };
        let proxy =
            crate::proxy::Proxy::with_options(&config, proxy_weights, passive_tx.clone(), opts)?;
        proxy.set_budget(budget.clone());
        // Degradation contracts' async jobs: run on recovery, expire, purged (heartbeat
        // `async_jobs`); the worker ends with the shutdown.
        let _jobs = proxy.spawn_jobs(Default::default(), shutdown.clone());
        // Breakers and counters on `/metrics` and `/api/v1/status`, open breakers in the weights.
        metrics.attach_proxy(proxy.stats());
        tokio::spawn(follow_breakers(
            proxy.stats(),
            breakers_tx,
            shutdown.clone(),
        ));
        tracing::info!(addr = %config.proxy.listen, "proxy serving");
        Some(tokio::spawn(crate::proxy::serve(
            proxy_listener,
            proxy,
            shutdown.clone(),
        )))
    } else {
        None
    };

    let ingest_token = Secret::from_env(&config.server.ingest_token_env);
    if ingest_token.is_none() {
        tracing::info!(var = %config.server.ingest_token_env, "ingest disabled: token variable unset");
    }

    // Every scheduled job's heartbeat (`async_jobs` when the proxy runs: its worker beats it).
    let jobs = Arc::new(crate::heartbeat::Jobs::new(
        crate::heartbeat::expected(&config, &drift.jobs),
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
        routes: Arc::new(routes.clone()),
        store: store.clone(),
        clock: clock.clone(),
        jobs: jobs.clone(),
        health: health_rx.clone(),
        events: health_events,
        passive: passive_tx,
        weights: weights_rx,
        metrics: metrics.clone(),
        ingest_token,
        incidents: Arc::new(web::StoreIncidents),
        drift: Some(drift.rx.clone()),
        drills: Some(drills),
        figures: Default::default(),
        guards: Default::default(),
        shutdown: shutdown.clone(),
    };
    let alert_task = {
        let channels = crate::alert::channels(&config).unwrap_or_else(|e| {
            tracing::error!(error = %e, "alert channels unusable; alerts are queued for none");
            Vec::new()
        });
        let service =
            crate::alert::AlertService::new(live.current(), store.clone(), clock.clone(), channels)
                .with_jobs(&jobs)
                .with_pulses(&pulses)
                .with_live(live.clone());
        metrics.follow_alerts(service.metrics().clone());
        tokio::spawn(crate::alert::run(
            Arc::new(service),
            alert_events,
            shutdown.clone(),
        ))
    };
    let addr = listener.local_addr()?;
    let web_shutdown = shutdown.clone();
    let web_task = tokio::spawn(async move {
        let app = web::router(state);
        crate::listen::serve(
            listener,
            app,
            crate::listen::Limits::default(),
            web_shutdown,
            "monitor",
        )
        .await
    });
    tracing::info!(%addr, routes = routes.len(), store = %config.storage.path.display(), "probeok serving");

    let done_store = store.clone();
    let done = tokio::spawn(async move {
        shutdown.cancelled().await;
        let drain = async {
            let _ = scheduler_task.await;
            let _ = recorder_task.await;
            let _ = retention_task.await;
            let _ = alert_task.await;
            let _ = drift.task.await;
            let _ = drift_events.await;
            let _ = switch.task.await;
            let _ = budget_task.await;
            let _ = drill_task.await;
            let web = web_task.await;
            if let Some(proxy) = proxy_task {
                if let Ok(Err(e)) = proxy.await {
                    tracing::error!(error = %e, "proxy server failed");
                }
            }
            // The web server (and with it every passive sender) is gone: the queue drains.
            let _ = passive_task.await;
            // Both of detection's senders are gone: it judges what is left, then saves.
            let _ = health_task.await;
            // Its last flush saves the pulses' final beats.
            let _ = heartbeat_task.await;
            web
        };
        match tokio::time::timeout(DRAIN_TIMEOUT, drain).await {
            Ok(web) => web??,
            Err(_) => tracing::warn!("shutdown drain timed out; stopping anyway"),
        }
        done_store.close().await?;
        tracing::info!("stopped");
        Ok(())
    });
    Ok(Running {
        addr,
        store,
        health: health_rx,
        config: reloader.live(),
        done,
    })
}

/// Writes every scheduler event to the store, then hands outcomes to detection; one failed
/// write is logged, not fatal (the outcome is still judged).
async fn record(
    mut events: mpsc::Receiver<SchedulerEvent>,
    writer: Writer,
    detect: mpsc::Sender<ProbeOutcome>,
    metrics: Arc<web::Metrics>,
) {
    while let Some(event) = events.recv().await {
        let result = match event {
            SchedulerEvent::Outcome(outcome) => {
                metrics.observe_outcome(&outcome);
                let stored = writer.record(outcome.clone()).await;
                to_detection(&detect, outcome).await;
                stored
            }
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

/// Stores passive outcomes as they arrive, then hands them to detection.
async fn record_passive(
    mut passive: mpsc::Receiver<ProbeOutcome>,
    writer: Writer,
    detect: mpsc::Sender<ProbeOutcome>,
) {
    while let Some(outcome) = passive.recv().await {
        if let Err(e) = writer.record(outcome.clone()).await {
            tracing::error!(error = %e, "cannot record a passive outcome");
        }
        to_detection(&detect, outcome).await;
    }
}

/// Waits for room in detection's queue. Detection only stops after its senders are gone, so a
/// refusal means it died: say so rather than drop the outcome silently.
async fn to_detection(detect: &mpsc::Sender<ProbeOutcome>, outcome: ProbeOutcome) {
    if let Err(e) = detect.send(outcome).await {
        tracing::error!(route = %e.0.route, "detection has stopped; outcome stored but not judged");
    }
}

/// Prunes old rows now and then, beating its own heartbeat.
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
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let now = clock.now();
        if last_prune.is_none_or(|t| t.elapsed() >= RETENTION_EVERY) {
            last_prune = Some(tokio::time::Instant::now());
            match writer
                .retention(now, retention_days, rollup_retention_days)
                .await
            {
                Ok(report) => tracing::debug!(?report, "retention done"),
                Err(e) => tracing::error!(error = %e, "retention failed"),
            }
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
