//! `probeok agent`: probing from another place. The agent probes the routes `[[vantage]]`
//! assigns to its vantage with the same probe client and scheduler as the monitor, keeps
//! every outcome in its own SQLite outbox ([`outbox`]) and pushes them in batches to the
//! monitor's `POST /api/v1/ingest` ([`push`]). It needs the provider keys of its routes (the
//! same `*_env` names) and the ingest token, nothing else of the monitor.
//!
//! Tasks, under one shutdown token: the scheduler → the recorder (outcome → ingest item with
//! a unique id → outbox, in small transactions) → the pusher (oldest first, backoff with
//! jitter while the monitor is unreachable); and `/healthz`, `/metrics` on `--listen`.

pub(crate) mod metrics;
pub mod outbox;
pub(crate) mod push;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::Config;
use crate::probe::ProbeClient;
use crate::route::Route;
use crate::scheduler::{SchedulerEvent, SchedulerOptions};
use crate::secret::Secret;
use crate::vantage::VantageOutcome;
use metrics::AgentMetrics;
use outbox::{Outbox, OutboxError};

/// Default `--listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9402";

/// Outcomes written to the outbox in one transaction at most.
const RECORD_BATCH: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error("cannot listen on {addr}: {error}")]
    Listen {
        addr: SocketAddr,
        #[source]
        error: std::io::Error,
    },
    #[error("probe client: {0}")]
    Probe(#[from] crate::probe::client::ProbeSetupError),
    #[error("a task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("{0}")]
    Task(crate::supervise::Failure),
}

/// What `probeok agent` was given.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub vantage: String,
    /// The monitor's base URL (`http://monitor:9400`).
    pub server: String,
    /// The outbox file; default `./probeok-agent-<ID>.db`.
    pub data: Option<PathBuf>,
    pub listen: SocketAddr,
    /// The pusher's pacing (tests shorten it).
    pub push: push::PushOptions,
}

/// The routes `vantage` probes, or why the agent cannot run.
pub fn routes_of(config: &Config, vantage: &str) -> Result<Vec<Route>, AgentError> {
    let v = config
        .vantage(vantage)
        .map_err(|e| AgentError::Invalid(e.to_string()))?;
    let routes: Vec<Route> = config
        .routes()
        .into_iter()
        .filter(|r| v.assigned(&r.id))
        .collect();
    if routes.is_empty() {
        return Err(AgentError::Invalid(format!(
            "vantage {vantage:?} is assigned no configured route"
        )));
    }
    Ok(routes)
}

/// A running agent: where `/healthz` and `/metrics` listen, and the task that ends after
/// shutdown.
pub struct RunningAgent {
    pub addr: SocketAddr,
    pub metrics: Arc<AgentMetrics>,
    pub done: tokio::task::JoinHandle<Result<(), AgentError>>,
}

/// Starts the agent's tasks; they run until `shutdown`.
pub async fn start(
    config: Config,
    opts: AgentOptions,
    token: Secret,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) -> Result<RunningAgent, AgentError> {
    if !crate::vantage::valid_id(&opts.vantage) {
        return Err(AgentError::Invalid(format!(
            "--vantage {:?}: must be 1-64 characters of a-z, 0-9, \"_\", \"-\"",
            opts.vantage
        )));
    }
    let routes = routes_of(&config, &opts.vantage)?;
    let url = push::ingest_url(&opts.server).map_err(AgentError::Invalid)?;
    let path = opts
        .data
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("probeok-agent-{}.db", opts.vantage)));
    let max_backlog = config.agent.max_backlog;
    let outbox = tokio::task::spawn_blocking(move || Outbox::open(&path, max_backlog)).await??;
    let metrics = Arc::new(AgentMetrics::new());
    metrics.set_backlog(outbox.len()?, outbox.dropped()?);
    let outbox = Arc::new(Mutex::new(outbox));
    let client = ProbeClient::new(&routes, clock.clone())?;

    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|error| AgentError::Listen {
            addr: opts.listen,
            error,
        })?;
    let addr = listener.local_addr().map_err(|error| AgentError::Listen {
        addr: opts.listen,
        error,
    })?;
    tracing::info!(vantage = %opts.vantage, routes = routes.len(), %addr, server = %opts.server, "agent started");

    let wake = Arc::new(Notify::new());
    let (events_tx, events_rx) = mpsc::channel(1024);
    // Every task is watched: one that panics or ends early stops the agent, non-zero.
    let sv = crate::supervise::Supervisor::new(crate::supervise::AGENT_TASKS);
    metrics.follow_tasks(sv.clone());
    let until = || shutdown.clone();
    let scheduler = sv.spawn(
        "agent_scheduler",
        until(),
        crate::scheduler::run(
            routes.into_iter().map(Arc::new).collect(),
            Arc::new(client),
            clock.clone(),
            events_tx,
            SchedulerOptions::default(),
            shutdown.clone(),
        ),
    );
    let recorder = sv.spawn(
        "agent_recorder",
        until(),
        record(
            events_rx,
            opts.vantage.clone(),
            outbox.clone(),
            metrics.clone(),
            wake.clone(),
        ),
    );
    let pusher = sv.spawn(
        "agent_pusher",
        until(),
        push::run(
            push::Pusher {
                url,
                token,
                outbox: outbox.clone(),
                metrics: metrics.clone(),
                wake,
                clock,
                opts: opts.push.clone(),
            },
            shutdown.clone(),
        ),
    );
    let web = sv.spawn(
        "agent_web",
        until(),
        crate::listen::serve(
            listener,
            metrics::router(metrics.clone()),
            crate::listen::Limits::default(),
            shutdown.clone(),
            "agent",
        ),
    );
    let done = tokio::spawn(async move {
        let fatal = sv.fatal();
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = fatal.cancelled() => shutdown.cancel(),
        }
        let scheduled = scheduler.await;
        // The recorder ends when the scheduler's sender is gone: every outcome is in the file.
        let recorded = recorder.await;
        let pushed = pusher.await;
        let served = web.await;
        if let Some(failure) = sv.failure() {
            return Err(AgentError::Task(failure));
        }
        scheduled?;
        recorded??;
        pushed?;
        if let Ok(Err(e)) = served {
            tracing::warn!(error = %e, "agent endpoint stopped with an error");
        }
        Ok(())
    });
    Ok(RunningAgent {
        addr,
        metrics,
        done,
    })
}

/// A process-unique prefix for outcome ids: the vantage, the start time and a random part,
/// so two runs of one agent (or two agents given the same id) never collide.
fn id_prefix(vantage: &str) -> String {
    format!(
        "{vantage}-{:x}-{:08x}",
        chrono::Utc::now().timestamp_millis(),
        rand::random::<u32>()
    )
}

/// Scheduler events → outbox rows. Outcomes already queued are written together.
async fn record(
    mut events: mpsc::Receiver<SchedulerEvent>,
    vantage: String,
    outbox: Arc<Mutex<Outbox>>,
    metrics: Arc<AgentMetrics>,
    wake: Arc<Notify>,
) -> Result<(), AgentError> {
    let prefix = id_prefix(&vantage);
    let mut n: u64 = 0;
    while let Some(first) = events.recv().await {
        let mut bodies = Vec::new();
        let mut next = Some(first);
        while let Some(event) = next.take() {
            if let SchedulerEvent::Outcome(outcome) = event {
                metrics.observe_outcome(&outcome);
                n += 1;
                let item = VantageOutcome {
                    vantage: vantage.clone(),
                    id: format!("{prefix}-{n}"),
                    outcome,
                };
                bodies.push(serde_json::to_string(&item).map_err(OutboxError::from)?);
            }
            if bodies.len() < RECORD_BATCH {
                next = events.try_recv().ok();
            }
        }
        if bodies.is_empty() {
            continue;
        }
        let ob = outbox.clone();
        let written = tokio::task::spawn_blocking(move || {
            let mut o = ob.lock().unwrap_or_else(|p| p.into_inner());
            let dropped = o.push(&bodies)?;
            Ok::<_, OutboxError>((dropped, o.len()?, o.dropped()?))
        })
        .await?;
        match written {
            Ok((dropped, len, total_dropped)) => {
                if dropped > 0 {
                    tracing::warn!(
                        dropped,
                        "agent backlog full: the oldest outcomes were dropped"
                    );
                }
                metrics.set_backlog(len, total_dropped);
                wake.notify_one();
            }
            Err(e) => tracing::error!(error = %e, "cannot write outcomes to the agent outbox"),
        }
    }
    Ok(())
}
