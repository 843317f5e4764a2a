//! Wires the running service together: store, probe client, scheduler, recorder, retention and
//! the web server, all under one `CancellationToken` with a bounded drain at shutdown.

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
use crate::health::HealthSnapshot;
use crate::probe::client::ProbeClient;
use crate::probe::{OutcomeKind, ProbeOutcome};
use crate::route::{Route, RouteId};
use crate::scheduler::{self, Prober, SchedulerEvent, SchedulerOptions};
use crate::secret::Secret;
use crate::store::{Store, StoreOptions, Writer};
use crate::web::{self, AppState};

/// How long shutdown waits for in-flight work before giving up on it.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Passive outcomes waiting for detection and the store; senders wait when it is full.
pub const PASSIVE_QUEUE: usize = 4096;

/// How often old raw rows and rollups are pruned.
const RETENTION_EVERY: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("probe client: {0}")]
    Probe(String),
    #[error("web server: {0}")]
    Io(#[from] std::io::Error),
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
    pub done: JoinHandle<Result<(), AppError>>,
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
    let routes: Vec<Route> = config.routes();
    let store_path = config.storage.path.clone();
    let opts = StoreOptions {
        latency_threshold: config.slo.latency_threshold,
    };
    let store = tokio::task::spawn_blocking(move || Store::open(&store_path, opts)).await??;
    let client =
        ProbeClient::new(&routes, clock.clone()).map_err(|e| AppError::Probe(e.to_string()))?;

    let metrics = Arc::new(web::Metrics::new(&routes));
    let (events_tx, events_rx) = mpsc::channel(1024);
    let scheduler_task = tokio::spawn(scheduler::run(
        routes.iter().cloned().map(Arc::new).collect(),
        Arc::new(client),
        clock.clone(),
        events_tx,
        SchedulerOptions::default(),
        shutdown.clone(),
    ));
    // The recorder ends when the scheduler drops its sender, so every outcome is written.
    let recorder_task = tokio::spawn(record(events_rx, store.writer(), metrics.clone()));
    let retention_task = tokio::spawn(retention(
        store.writer(),
        clock.clone(),
        config.storage.retention_days,
        config.storage.rollup_retention_days,
        shutdown.clone(),
    ));

    let ids: Vec<RouteId> = routes.iter().map(|r| r.id.clone()).collect();
    let (_health_tx, health_rx) =
        watch::channel(Arc::new(HealthSnapshot::initial(&ids, clock.now())));
    let (events_tx, _) = broadcast::channel(1024);
    let (passive_tx, passive_rx) = mpsc::channel(PASSIVE_QUEUE);
    let passive_task = tokio::spawn(record_passive(passive_rx, store.writer()));

    // Publishing (issue 5): weights follow health; metrics see every outcome; the ingest
    // token is read once here.
    let weights_rx = crate::weights::spawn_publisher(
        Arc::new(routes.clone()),
        health_rx.clone(),
        shutdown.clone(),
    );
    let ingest_token = Secret::from_env(&config.server.ingest_token_env);
    if ingest_token.is_none() {
        tracing::info!(var = %config.server.ingest_token_env, "ingest disabled: token variable unset");
    }

    let state = AppState {
        config: Arc::new(config.clone()),
        routes: Arc::new(routes.clone()),
        store: store.clone(),
        clock: clock.clone(),
        jobs: Arc::new(vec!["scheduler", "retention"]),
        health: health_rx,
        events: events_tx,
        passive: passive_tx,
        weights: weights_rx,
        metrics: metrics.clone(),
        ingest_token,
        incidents: Arc::new(web::SnapshotIncidents),
        figures: Default::default(),
        shutdown: shutdown.clone(),
    };
    let addr = listener.local_addr()?;
    let web_shutdown = shutdown.clone();
    let web_task = tokio::spawn(async move {
        axum::serve(listener, web::router(state))
            .with_graceful_shutdown(web_shutdown.cancelled_owned())
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
            let web = web_task.await;
            // The web server (and with it every passive sender) is gone: the queue drains.
            let _ = passive_task.await;
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
    Ok(Running { addr, store, done })
}

/// Writes every scheduler event to the store; one failed write is logged, not fatal.
async fn record(
    mut events: mpsc::Receiver<SchedulerEvent>,
    writer: Writer,
    metrics: Arc<web::Metrics>,
) {
    while let Some(event) = events.recv().await {
        let result = match event {
            SchedulerEvent::Outcome(outcome) => {
                metrics.observe_outcome(&outcome);
                writer.record(outcome).await
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

/// Stores passive outcomes as they arrive.
async fn record_passive(mut passive: mpsc::Receiver<ProbeOutcome>, writer: Writer) {
    while let Some(outcome) = passive.recv().await {
        if let Err(e) = writer.record(outcome).await {
            tracing::error!(error = %e, "cannot record a passive outcome");
        }
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
