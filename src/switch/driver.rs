//! The switch controller's I/O shell: on every health snapshot and every tick it steps each
//! model's [`Machine`] and carries out its [`Effect`]s — runs the pre-probe with the real
//! probe client, sets `SWITCHED` through the health service's command channel, publishes the
//! weights [`Overrides`], stores the records (`switch_events`) and announces them as
//! [`HealthEvent::Switch`]. It also publishes the [`SwitchStatus`] that
//! `GET /api/v1/switches`, the status page and `/metrics` read.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{input_for, machines, pre_probe_passed, status_of, Effect, Machine, SwitchRx};
use crate::clock::Clock;
use crate::config::SwitchConfig;
use crate::extra_cost::ExtraCost;
use crate::health::service::HealthCommand;
use crate::health::{HealthEvent, HealthRx, HealthSnapshot};
use crate::probe::OutcomeKind;
use crate::route::{Route, RouteId};
use crate::scheduler::Prober;
use crate::store::Store;
use crate::weights::Overrides;

/// A machine is stepped at most this often in one round: a pre-probe's answer is acted on in
/// the same round (probe, switch, and a failed probe's next candidate), but a round never
/// loops on its own.
const STEPS_PER_ROUND: usize = 4;

/// What the driver needs.
pub struct Driver {
    pub routes: Arc<Vec<Route>>,
    pub cfg: SwitchConfig,
    pub health: HealthRx,
    pub commands: mpsc::Sender<HealthCommand>,
    pub budget: Arc<ExtraCost>,
    pub prober: Arc<dyn Prober>,
    pub store: Store,
    pub events: broadcast::Sender<HealthEvent>,
    pub clock: Arc<dyn Clock>,
    /// How often the machines are stepped besides every health change.
    pub tick: Duration,
    /// The controller's heartbeat (`switch`), beaten every round.
    pub pulse: Option<crate::heartbeat::Pulse>,
}

/// The running controller's outputs.
pub struct Spawned {
    /// The weights publisher follows it (`weights::Feeds::overrides`).
    pub overrides: watch::Receiver<Arc<Overrides>>,
    pub status: SwitchRx,
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts the driver (see the module docs); it ends on `shutdown`.
pub fn spawn(d: Driver, shutdown: CancellationToken) -> Spawned {
    let mut machines = machines(&d.routes, &d.cfg);
    let (ov_tx, ov_rx) = watch::channel(Arc::new(Overrides::new()));
    let (st_tx, st_rx) = watch::channel(Arc::new(status_of(&machines, &d.budget, d.clock.now())));
    let task = tokio::spawn(async move {
        let mut health = d.health.clone();
        let mut tick = tokio::time::interval(d.tick.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut overrides = Overrides::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
                changed = health.changed() => if changed.is_err() {
                    shutdown.cancelled().await;
                    break;
                },
            }
            let snap = health.borrow_and_update().clone();
            let mut changed = false;
            for m in &mut machines {
                changed |= d.round(m, &snap, &mut overrides, &ov_tx).await;
            }
            if let Some(p) = &d.pulse {
                p.beat();
            }
            let next = status_of(&machines, &d.budget, d.clock.now());
            let same = {
                let cur = st_tx.borrow();
                cur.models == next.models && cur.budget == next.budget
            };
            if changed || !same {
                st_tx.send_replace(Arc::new(next));
            }
        }
    });
    Spawned {
        overrides: ov_rx,
        status: st_rx,
        task,
    }
}

impl Driver {
    /// Steps one machine until it has nothing more to do this round; whether it did anything.
    async fn round(
        &self,
        m: &mut Machine,
        snap: &HealthSnapshot,
        overrides: &mut Overrides,
        ov_tx: &watch::Sender<Arc<Overrides>>,
    ) -> bool {
        let mut changed = false;
        for _ in 0..STEPS_PER_ROUND {
            let input = input_for(m, &self.routes, snap, &self.budget, self.clock.now());
            let effects = m.step(&input);
            if effects.is_empty() {
                break;
            }
            changed = true;
            let mut probed = false;
            for e in effects {
                match e {
                    Effect::PreProbe(id) => {
                        probed = true;
                        let (ok, detail) = self.pre_probe(&id).await;
                        m.pre_probed(&id, ok, detail);
                    }
                    Effect::SetSwitched { routes, on } => {
                        let cmd = HealthCommand::SetSwitched { routes, on };
                        if self.commands.send(cmd).await.is_err() {
                            tracing::error!("the health service has stopped; SWITCHED not set");
                        }
                    }
                    Effect::Override(o) => {
                        match o {
                            Some(o) => overrides.insert(m.serves().to_owned(), o),
                            None => overrides.remove(m.serves()),
                        };
                        ov_tx.send_replace(Arc::new(overrides.clone()));
                    }
                    Effect::Record(r) => {
                        if let Err(e) = self.store.writer().record_switch(r.clone()).await {
                            tracing::error!(error = %e, "cannot store a switch record");
                        }
                        let _ = self.events.send(HealthEvent::Switch {
                            record: Box::new(r),
                        });
                    }
                }
            }
            if !probed {
                break;
            }
        }
        changed
    }

    /// Probes a backup before traffic moves to it: whether it passed, and the latency or the
    /// reason it failed (for the record's text).
    async fn pre_probe(&self, id: &RouteId) -> (bool, String) {
        let Some(route) = self.routes.iter().find(|r| &r.id == id) else {
            return (false, "not configured".to_owned());
        };
        let o = self.prober.probe(route, OutcomeKind::Probe).await;
        if pre_probe_passed(&o) {
            return (true, format!("{:.0} ms", o.total_ms));
        }
        let why = o
            .error
            .as_ref()
            .map_or_else(|| "answer changed".to_owned(), ToString::to_string);
        (false, why)
    }
}
