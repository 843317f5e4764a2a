//! The service's subsystems, each started by one function that returns its named handles:
//! the member's role, detection, the recorders, the money (extra-cost budget, spend ledger,
//! switch controller's watches), publishing (drills and weights), the proxy, alerts; and
//! [`Tasks`], what shutdown drains in order. [`super::start_with`] calls them in the order
//! the data flows.

use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{
    follow_breakers, follow_weights, record, record_passive, terms, AppError, Recorded,
    StartOptions, DETECTION_QUEUE, DRAIN_TIMEOUT, PASSIVE_QUEUE,
};
use crate::clock::Clock;
use crate::config::Config;
use crate::health::service::{HealthOptions, HealthService};
use crate::health::{HealthEvent, HealthRx};
use crate::probe::ProbeOutcome;
use crate::route::Route;
use crate::scheduler::SchedulerEvent;
use crate::store::Store;
use crate::web;

/// This member's place in its cluster.
pub(super) struct Membership {
    pub role: crate::cluster::RoleRx,
    /// The lease's task on PostgreSQL (`None`: always the leader, or a role given by a test).
    pub lease_task: Option<JoinHandle<()>>,
    /// Stops the lease, once everything else has drained.
    pub lease_stop: CancellationToken,
    /// Keeps an always-leader role's sender alive.
    pub _lone: Option<watch::Sender<crate::cluster::Role>>,
    /// Whether another member may lead (followers read what the leader stores).
    pub clustered: bool,
}

/// The member's role: a lease on the PostgreSQL database `[storage] url_env` names, or (SQLite,
/// one box) always the leader.
pub(super) fn membership(config: &Config, options: &StartOptions) -> Result<Membership, AppError> {
    let lease_stop = CancellationToken::new();
    let (lone, role, lease_task) = match options.role.clone() {
        Some(role) => (None, role, None),
        None => match crate::cluster::database_url(config.storage.url_env.as_deref()) {
            Some((var, url)) => {
                let target = crate::cluster::Target::parse(&var, &url)?;
                let lease = crate::cluster::spawn(
                    target,
                    crate::cluster::LeaseOptions::new(config.cluster.lease),
                    lease_stop.clone(),
                );
                (None, lease.role, Some(lease.task))
            }
            None => {
                let (tx, rx) = crate::cluster::always_leader();
                (Some(tx), rx, None)
            }
        },
    };
    let clustered = options.role.is_some() || lease_task.is_some();
    Ok(Membership {
        role,
        lease_task,
        lease_stop,
        _lone: lone,
        clustered,
    })
}

/// Detection: the first term's health service (restored from the store), the member's health
/// watch, and the queues that carry stored outcomes and agents' outcomes to whichever term
/// judges them.
pub(super) struct Detection {
    pub first: HealthService,
    pub options: HealthOptions,
    pub events: broadcast::Sender<HealthEvent>,
    pub health_tx: watch::Sender<Arc<crate::health::HealthSnapshot>>,
    pub health_rx: HealthRx,
    pub detect_tx: mpsc::Sender<ProbeOutcome>,
    pub detect_slot: terms::DetectSlot,
    pub dispatch_task: JoinHandle<()>,
    pub vantage_slot: terms::VantageSlot,
    pub vantage_dispatch: JoinHandle<()>,
    pub vantage_view: watch::Sender<Arc<crate::health::VantageView>>,
    pub vantages: crate::health::VantageLink,
}

/// Health events the channel holds for a receiver that is behind.
fn event_capacity(routes: usize) -> usize {
    (2 * routes).clamp(1024, 1 << 17)
}

pub(super) async fn detection(
    config: &Config,
    store: &Store,
    clock: &Arc<dyn Clock>,
    clustered: bool,
) -> Result<Detection, AppError> {
    let options = HealthOptions {
        // Followers show what the leader stored: save often enough for them to keep up.
        save_every: if clustered {
            terms::CLUSTER_SAVE_EVERY
        } else {
            HealthOptions::default().save_every
        },
        ..HealthOptions::default()
    };
    // A provider-wide outage moves every route at once, twice (DEGRADED, then CRITICAL), and a
    // receiver that falls behind by more than the channel holds loses transitions: room for
    // two waves of every route, so the alert engine's own work never costs an alert.
    let (events, _) = broadcast::channel(event_capacity(config.routes.len()));
    // Restored once now (a store that cannot be read fails the start); it serves the first
    // term, later terms restore their own from what the leader stored.
    let mut first = HealthService::restore(
        config,
        options.clone(),
        store,
        clock.clone(),
        events.clone(),
    )
    .await?;
    // The member's health watch: every term's detection publishes into it.
    let (health_tx, health_rx) = watch::channel(first.subscribe().borrow().clone());
    first.publish_into(health_tx.clone());
    // Stored outcomes (probe and passive) go to the leader term's detection.
    let (detect_tx, detect_rx) = mpsc::channel(DETECTION_QUEUE);
    let detect_slot: terms::DetectSlot = Default::default();
    let dispatch_task = tokio::spawn(terms::dispatch(detect_rx, detect_slot.clone()));
    // Agents' outcomes go to the leader term's per-vantage detection; its view is the member's.
    let (vantage_tx, vantage_rx) = mpsc::channel(DETECTION_QUEUE);
    let vantage_slot: terms::VantageSlot = Default::default();
    let vantage_dispatch = tokio::spawn(terms::dispatch(vantage_rx, vantage_slot.clone()));
    let (vantage_view, _) = watch::channel(Arc::new(crate::health::VantageView::default()));
    let vantages = crate::health::VantageLink {
        inputs: vantage_tx,
        view: vantage_view.subscribe(),
    };
    Ok(Detection {
        first,
        options,
        events,
        health_tx,
        health_rx,
        detect_tx,
        detect_slot,
        dispatch_task,
        vantage_slot,
        vantage_dispatch,
        vantage_view,
        vantages,
    })
}

/// The two recorders: the scheduler's events and the passive queue (proxy, ingest) into the
/// store, then to detection; and the burn-rate windows they keep current.
pub(super) struct Recorders {
    pub sched_tx: mpsc::Sender<SchedulerEvent>,
    pub recorder_task: JoinHandle<()>,
    pub passive_tx: mpsc::Sender<ProbeOutcome>,
    pub passive_task: JoinHandle<()>,
    pub tally: Arc<crate::alert::tally::Tally>,
}

pub(super) async fn recorders(
    config: &Config,
    routes: &[Route],
    store: &Store,
    clock: &Arc<dyn Clock>,
    metrics: &Arc<web::Metrics>,
    tracer: &crate::trace::Tracer,
    detect_tx: mpsc::Sender<ProbeOutcome>,
) -> Result<Recorders, AppError> {
    // The burn-rate windows as running sums: the rollups read once now, before the first
    // outcome of this run is written; every stored outcome is added from then on.
    let tally = Arc::new(crate::alert::tally::Tally::new(
        routes.iter().map(|r| &r.id),
        config.slo.latency_threshold,
    ));
    {
        let (tally, store, now) = (tally.clone(), store.clone(), clock.now());
        tokio::task::spawn_blocking(move || tally.seed(&store.reader()?, now)).await??;
    }
    let lag = Arc::new(crate::lag::StoreLag::default());
    metrics.attach_store_lag(lag.clone());
    let recorded = Recorded {
        tally: tally.clone(),
        lag: Some(lag),
    };
    // The scheduler runs in leader terms; the recorder ends once the last term's scheduler
    // and the terms' own sender are gone, so every outcome is written.
    let (sched_tx, sched_rx) = mpsc::channel(1024);
    let recorder_task = tokio::spawn(record(
        sched_rx,
        store.writer(),
        detect_tx.clone(),
        metrics.clone(),
        recorded.clone(),
        tracer.clone(),
    ));
    let (passive_tx, passive_rx) = mpsc::channel(PASSIVE_QUEUE);
    let passive_task = tokio::spawn(record_passive(
        passive_rx,
        store.writer(),
        detect_tx,
        Recorded {
            lag: None,
            ..recorded
        },
    ));
    Ok(Recorders {
        sched_tx,
        recorder_task,
        passive_tx,
        passive_task,
        tally,
    })
}

/// Money: the hourly extra-cost budget (the proxy reserves against it), the spend ledger it
/// and client spend limits book in, and the switch controller's watches (it runs in leader
/// terms and publishes into them: SWITCHED through detection, its overrides into the
/// weights, its status on `/metrics`, the status page and `GET /api/v1/switches`).
pub(super) struct Money {
    pub budget: Arc<crate::extra_cost::ExtraCost>,
    pub spend: crate::spend::Spend,
    pub budget_task: JoinHandle<()>,
    pub overrides_tx: watch::Sender<Arc<crate::weights::Overrides>>,
    pub overrides_rx: watch::Receiver<Arc<crate::weights::Overrides>>,
    pub switch_tx: watch::Sender<Arc<crate::switch::SwitchStatus>>,
}

pub(super) struct MoneyInputs<'a> {
    pub config: &'a Config,
    pub routes: &'a [Route],
    pub store: &'a Store,
    pub clock: &'a Arc<dyn Clock>,
    pub events: &'a broadcast::Sender<HealthEvent>,
    pub metrics: &'a Arc<web::Metrics>,
    pub pulses: &'a crate::heartbeat::Pulses,
    pub shutdown: &'a CancellationToken,
}

pub(super) fn money(i: MoneyInputs<'_>) -> Money {
    let budget = crate::extra_cost::ExtraCost::new(
        i.config.budget.clone(),
        i.routes,
        i.clock.clone(),
        Some(i.events.clone()),
    );
    // One budget for every process on this store: booked in the store's spend ledger (client
    // spend limits book there too).
    let spend = crate::proxy::spend_on(i.store, i.clock.clone(), &i.config.proxy);
    budget.share(spend.clone());
    i.metrics.attach_budget(budget.clone());
    let (overrides_tx, overrides_rx) = watch::channel(Arc::new(crate::weights::Overrides::new()));
    let (switch_tx, switch_rx) = watch::channel(Arc::new(crate::switch::idle_status(
        i.routes,
        &i.config.switch,
        &budget,
        i.clock.now(),
    )));
    let budget_task = tokio::spawn(budget.clone().keep_hours(
        Some(i.pulses.pulse(crate::heartbeat::BUDGET)),
        i.shutdown.clone(),
    ));
    i.metrics.attach_switch(switch_rx);
    Money {
        budget,
        spend,
        budget_task,
        overrides_tx,
        overrides_rx,
        switch_tx,
    }
}

/// The routing proxy, when enabled: its own listener, the shared shutdown, every attempt into
/// the passive queue, and the monitor's weights, in-process, through the same JSON a remote
/// router reads. Its open breakers go to `breakers_tx` (disclosed in the weights' reasons).
pub(super) struct ProxyInputs<'a> {
    pub config: &'a Config,
    pub routes: &'a [Route],
    pub store: &'a Store,
    pub clock: &'a Arc<dyn Clock>,
    pub live: &'a crate::reload::LiveConfig,
    pub tracer: &'a crate::trace::Tracer,
    pub options: &'a StartOptions,
    pub money: &'a Money,
    pub metrics: &'a Arc<web::Metrics>,
    pub weights: &'a crate::weights::WeightsRx,
    pub passive_tx: &'a mpsc::Sender<ProbeOutcome>,
    pub breakers_tx: watch::Sender<Arc<crate::weights::OpenBreakers>>,
    pub shutdown: &'a CancellationToken,
}

pub(super) async fn proxy(
    i: ProxyInputs<'_>,
) -> Result<Option<JoinHandle<std::io::Result<()>>>, AppError> {
    if !i.config.proxy.enabled {
        return Ok(None);
    }
    let workers = usize::try_from(i.config.proxy.workers).unwrap_or(1);
    let listener = crate::proxy::bind(i.config.proxy.listen, workers)?;
    let weights = follow_weights(i.weights.clone(), i.routes);
    let opts = crate::proxy::ProxyOptions {
        store: Some(i.store.clone()),
        clock: i.clock.clone(),
        live: Some(i.live.receiver()),
        tracer: i.tracer.clone(),
        client_keys: i.options.proxy_client_keys.clone(),
        spend: Some(i.money.spend.clone()),
        ..crate::proxy::ProxyOptions::default()
    };
    let proxy = crate::proxy::Proxy::with_options(i.config, weights, i.passive_tx.clone(), opts)?;
    proxy.set_budget(i.money.budget.clone());
    // Degradation contracts' async jobs: run on recovery, expire, purged (heartbeat
    // `async_jobs`); the worker ends with the shutdown.
    let _jobs = proxy.spawn_jobs(Default::default(), i.shutdown.clone());
    // Breakers and counters on `/metrics` and `/api/v1/status`, open breakers in the weights.
    i.metrics.attach_proxy(proxy.stats());
    tokio::spawn(follow_breakers(
        proxy.stats(),
        i.breakers_tx,
        i.shutdown.clone(),
    ));
    tracing::info!(addr = %i.config.proxy.listen, workers, "proxy serving");
    Ok(Some(tokio::spawn(crate::proxy::serve(
        listener,
        proxy,
        i.shutdown.clone(),
    ))))
}

/// The alert engine over the configured channels (a channel that cannot be built is logged
/// and left out: alerts are still queued for the others).
pub(super) fn alerts(
    store: &Store,
    clock: &Arc<dyn Clock>,
    live: &crate::reload::LiveConfig,
    jobs: &Arc<crate::heartbeat::Jobs>,
    pulses: &crate::heartbeat::Pulses,
    metrics: &Arc<web::Metrics>,
    tally: Arc<crate::alert::tally::Tally>,
) -> Arc<crate::alert::AlertService> {
    let config = live.current();
    let channels = crate::alert::channels(&config).unwrap_or_else(|e| {
        tracing::error!(error = %e, "alert channels unusable; alerts are queued for none");
        Vec::new()
    });
    let service = crate::alert::AlertService::new(config, store.clone(), clock.clone(), channels)
        .with_jobs(jobs)
        .with_pulses(pulses)
        .with_live(live.clone())
        .with_tally(tally);
    metrics.follow_alerts(service.metrics().clone());
    Arc::new(service)
}

/// The terms: leader-only work while this member leads, the follower's view while not.
pub(super) fn terms(
    member: Arc<terms::Member>,
    first: HealthService,
    role: crate::cluster::RoleRx,
    sched_tx: mpsc::Sender<SchedulerEvent>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let mut first = Some(first);
    tokio::spawn(crate::cluster::terms(role, shutdown, move |role, token| {
        let first = first.take();
        let m = member.clone();
        match role {
            crate::cluster::Role::Leader => terms::lead(m, first, sched_tx.clone(), token).boxed(),
            crate::cluster::Role::Follower => terms::follow(m, first, token).boxed(),
        }
    }))
}

/// Every long-lived task of a running service, drained at shutdown in the order that loses
/// nothing: producers first, then the queues they fed, then what judges and saves.
pub(super) struct Tasks {
    pub budget: JoinHandle<()>,
    pub web: JoinHandle<std::io::Result<()>>,
    pub proxy: Option<JoinHandle<std::io::Result<()>>>,
    /// HAProxy's agent-check responder (`[haproxy] agent_listen`).
    pub agent: Option<JoinHandle<()>>,
    pub passive: JoinHandle<()>,
    pub vantage_dispatch: JoinHandle<()>,
    pub recorder: JoinHandle<()>,
    pub dispatch: JoinHandle<()>,
    pub terms: JoinHandle<()>,
    pub heartbeat: JoinHandle<()>,
}

impl Tasks {
    /// Waits for `shutdown` (or a supervised task's failure, which starts it), drains within
    /// [`DRAIN_TIMEOUT`], then lets the lease go and closes the store. A failed task makes the
    /// whole run a failure, so the process leaves with a non-zero code.
    pub async fn drain(
        self,
        shutdown: CancellationToken,
        supervisor: crate::supervise::Supervisor,
        membership: Membership,
        store: Store,
    ) -> Result<(), AppError> {
        let fatal = supervisor.fatal();
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = fatal.cancelled() => shutdown.cancel(),
        }
        let drain = async {
            let _ = self.budget.await;
            let web = self.web.await;
            if let Some(proxy) = self.proxy {
                if let Ok(Err(e)) = proxy.await {
                    tracing::error!(error = %e, "proxy server failed");
                }
            }
            if let Some(agent) = self.agent {
                let _ = agent.await;
            }
            // The web server (and with it every passive sender) is gone: the queue drains.
            let _ = self.passive.await;
            let _ = self.vantage_dispatch.await;
            // The last term's scheduler has stopped and the terms' sender is dropped.
            let _ = self.recorder.await;
            // Both of detection's senders are gone: the leader term's detection judges what
            // is left, then saves, and the term ends.
            let _ = self.dispatch.await;
            let _ = self.terms.await;
            // Its last flush saves the pulses' final beats.
            let _ = self.heartbeat.await;
            web
        };
        match tokio::time::timeout(DRAIN_TIMEOUT, drain).await {
            Ok(web) => web??,
            Err(_) => tracing::warn!("shutdown drain timed out; stopping anyway"),
        }
        // Leadership is released only now: a successor never overlaps this member's drain.
        membership.lease_stop.cancel();
        if let Some(lease) = membership.lease_task {
            let _ = lease.await;
        }
        store.close().await?;
        if let Some(failure) = supervisor.failure() {
            tracing::error!(%failure, "stopped after a task failed");
            return Err(AppError::Task(failure));
        }
        tracing::info!("stopped");
        Ok(())
    }
}
