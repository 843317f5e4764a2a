//! The drills' I/O shell: starts (checked by [`super::plan`]) and stops through the admin API,
//! every change written to SQLite before it is answered, the active drills' caps published
//! for the weights ([`DrillCaps`]), the automatic end at the end time, and the routes that
//! took each drill's traffic noted from the published weights (the report's "backup").
//!
//! The task ticks on `tokio::time` (at the next stage boundary or end, at most a second
//! apart) and reads wall time from the [`Clock`], so tests drive it with a `ManualClock` or a
//! paused runtime. After a restart [`DrillService::restore`] picks the active drills up again
//! and ends those whose end passed while the service was down (`auto`, at their end time).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{watch, Mutex, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::plan::{self, OffPeak, Refusal, StartRequest};
use super::{Drill, EndedBy};
use crate::clock::Clock;
use crate::config::Config;
use crate::route::{Route, RouteId};
use crate::store::drills::DrillOp;
use crate::store::{Store, StoreError};
use crate::weights::{DrillCap, DrillCaps, WeightsRx};

/// The active drills as last published (for the status page), oldest first.
pub type DrillRx = watch::Receiver<Arc<Vec<Drill>>>;

/// Longest the task sleeps between two looks at the clock.
const TICK: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum DrillError {
    #[error("{}", .0.message)]
    Refused(Refusal),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("blocking task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

impl From<Refusal> for DrillError {
    fn from(r: Refusal) -> Self {
        DrillError::Refused(r)
    }
}

/// Starts, stops and ends drills; cheap to clone.
#[derive(Clone)]
pub struct DrillService {
    inner: Arc<Inner>,
}

struct Inner {
    /// The live config: `[drill]` and the admin token follow a reload.
    config: crate::reload::LiveConfig,
    routes: Arc<Vec<Route>>,
    store: Store,
    clock: Arc<dyn Clock>,
    /// The active drills; held across a start's checks and its insert, so two starts for one
    /// route cannot both pass.
    active: Mutex<Vec<Drill>>,
    caps: watch::Sender<Arc<DrillCaps>>,
    view: watch::Sender<Arc<Vec<Drill>>>,
    /// A start or a stop: the task recomputes at once.
    wake: Notify,
}

impl DrillService {
    /// Loads the active drills from the store; those whose end passed (or whose route is no
    /// longer configured) are ended `auto` now.
    pub async fn restore(
        config: crate::reload::LiveConfig,
        routes: Arc<Vec<Route>>,
        store: Store,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, DrillError> {
        let reader_store = store.clone();
        let stored =
            tokio::task::spawn_blocking(move || reader_store.reader()?.active_drills()).await??;
        let now = clock.now();
        let mut active = Vec::new();
        for mut d in stored {
            let configured = routes.iter().any(|r| r.id == d.route);
            if d.ends_at <= now || !configured {
                let at = if configured { d.ends_at } else { now };
                end(&store, &mut d, at, EndedBy::Auto, None).await?;
                tracing::info!(drill = d.id, route = %d.route, "drill ended while the service was down");
            } else {
                tracing::info!(drill = d.id, route = %d.route, ends_at = %d.ends_at, "drill continues after a restart");
                active.push(d);
            }
        }
        let caps = caps_at(&active, now);
        let service = Self {
            inner: Arc::new(Inner {
                config,
                routes,
                store,
                clock,
                view: watch::channel(Arc::new(active.clone())).0,
                active: Mutex::new(active),
                caps: watch::channel(Arc::new(caps)).0,
                wake: Notify::new(),
            }),
        };
        Ok(service)
    }

    /// The caps for `weights::Feeds::drills`.
    pub fn caps(&self) -> watch::Receiver<Arc<DrillCaps>> {
        self.inner.caps.subscribe()
    }

    /// The active drills, for the pages.
    pub fn subscribe(&self) -> DrillRx {
        self.inner.view.subscribe()
    }

    /// When drills may start, from the current config.
    pub fn off_peak(&self) -> OffPeak {
        OffPeak::from_config(&self.inner.config.current())
    }

    pub fn config(&self) -> Arc<Config> {
        self.inner.config.current()
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    /// Checks and records a new drill; it takes effect at once.
    pub async fn start(&self, req: &StartRequest) -> Result<Drill, DrillError> {
        let config = self.inner.config.current();
        let planned = plan::validate(req, &config, &self.inner.routes)?;
        let now = self.inner.clock.now();
        OffPeak::from_config(&config).check(now, planned.forced)?;
        let mut active = self.inner.active.lock().await;
        if let Some(d) = active.iter().find(|d| d.route == planned.route) {
            return Err(Refusal {
                status: 409,
                code: "drill_active",
                message: format!(
                    "drill {} is already running on {} until {}; stop it first",
                    d.id,
                    d.route,
                    crate::clock::rfc3339(d.ends_at)
                ),
            }
            .into());
        }
        let mut drill = Drill {
            id: 0,
            route: planned.route,
            serves: planned.serves,
            weight: planned.weight,
            ramp: planned.ramp,
            reason: planned.reason,
            started_by: planned.started_by,
            forced: planned.forced,
            started_at: now,
            ends_at: now + planned.duration,
            ended_at: None,
            ended_by: None,
            stopped_by: None,
            receivers: Vec::new(),
        };
        let id = self
            .inner
            .store
            .writer()
            .drill(DrillOp::Start(Box::new(drill.clone())))
            .await?;
        drill.id = i64::try_from(id).unwrap_or(i64::MAX);
        tracing::info!(drill = drill.id, route = %drill.route, reason = %drill.reason, ends_at = %drill.ends_at, forced = drill.forced, "drill started");
        active.push(drill.clone());
        self.publish(&active, now);
        drop(active);
        self.inner.wake.notify_one();
        Ok(drill)
    }

    /// Stops the active drills on `route` (every active drill when `None`); answers those it
    /// ended.
    pub async fn stop(
        &self,
        route: Option<&RouteId>,
        who: Option<String>,
    ) -> Result<Vec<Drill>, DrillError> {
        let mut active = self.inner.active.lock().await;
        let now = self.inner.clock.now();
        let mut ended = Vec::new();
        let mut kept = Vec::new();
        let mut failed = None;
        for mut d in std::mem::take(&mut *active) {
            if failed.is_none() && route.is_none_or(|r| *r == d.route) {
                match end(&self.inner.store, &mut d, now, EndedBy::Stop, who.clone()).await {
                    Ok(()) => {
                        ended.push(d);
                        continue;
                    }
                    Err(e) => failed = Some(e),
                }
            }
            kept.push(d);
        }
        *active = kept;
        self.publish(&active, now);
        drop(active);
        self.inner.wake.notify_one();
        match failed {
            Some(e) => Err(e),
            None => Ok(ended),
        }
    }

    /// Stops one drill by id: `Ok(None)` when there is no such drill, 409 `already_ended`.
    pub async fn stop_id(&self, id: i64, who: Option<String>) -> Result<Option<Drill>, DrillError> {
        let mut active = self.inner.active.lock().await;
        let now = self.inner.clock.now();
        let Some(i) = active.iter().position(|d| d.id == id) else {
            drop(active);
            let store = self.inner.store.clone();
            let stored = tokio::task::spawn_blocking(move || store.reader()?.drill(id)).await??;
            return match stored {
                None => Ok(None),
                Some(d) => Err(Refusal {
                    status: 409,
                    code: "already_ended",
                    message: format!(
                        "drill {id} already ended ({}) at {}",
                        d.ended_by.map_or("?", EndedBy::as_str),
                        d.ended_at.map(crate::clock::rfc3339).unwrap_or_default()
                    ),
                }
                .into()),
            };
        };
        let mut d = active[i].clone();
        end(&self.inner.store, &mut d, now, EndedBy::Stop, who).await?;
        active.remove(i);
        self.publish(&active, now);
        drop(active);
        self.inner.wake.notify_one();
        Ok(Some(d))
    }

    /// Ends what is due and republishes the caps (a new stage may have begun).
    async fn tick(&self) {
        let mut active = self.inner.active.lock().await;
        let now = self.inner.clock.now();
        let mut i = 0;
        while i < active.len() {
            if active[i].ends_at <= now {
                let at = active[i].ends_at;
                match end(&self.inner.store, &mut active[i], at, EndedBy::Auto, None).await {
                    Ok(()) => {
                        let d = active.remove(i);
                        tracing::info!(drill = d.id, route = %d.route, "drill ended at its end time");
                        continue;
                    }
                    // Its caps are gone already (no stage past the end); retried next tick.
                    Err(e) => {
                        tracing::error!(error = %e, drill = active[i].id, "cannot end a drill")
                    }
                }
            }
            i += 1;
        }
        self.publish(&active, now);
    }

    /// Notes the routes of each drilled model that carry traffic in `weights` besides the
    /// drilled route (the report's "backup").
    async fn note_receivers(&self, weights: &crate::weights::WeightsSnapshot) {
        let mut active = self.inner.active.lock().await;
        for d in active.iter_mut() {
            let Some(m) = weights.models.get(&d.serves) else {
                continue;
            };
            let mut grew = false;
            for e in &m.entries {
                if e.route != d.route && e.weight > 0 && !d.receivers.contains(&e.route) {
                    d.receivers.push(e.route.clone());
                    grew = true;
                }
            }
            if grew {
                let op = DrillOp::Receivers {
                    id: d.id,
                    routes: d.receivers.clone(),
                };
                if let Err(e) = self.inner.store.writer().drill(op).await {
                    tracing::error!(error = %e, drill = d.id, "cannot record a drill's receiving routes");
                }
            }
        }
    }

    fn publish(&self, active: &[Drill], now: DateTime<Utc>) {
        let caps = caps_at(active, now);
        self.inner.caps.send_if_modified(|cur| {
            if **cur == caps {
                false
            } else {
                *cur = Arc::new(caps);
                true
            }
        });
        self.inner.view.send_if_modified(|cur| {
            if cur.as_slice() == active {
                false
            } else {
                *cur = Arc::new(active.to_vec());
                true
            }
        });
    }

    /// How long until the next stage boundary or end (at most [`TICK`]).
    async fn next_wait(&self) -> Duration {
        let active = self.inner.active.lock().await;
        let now = self.inner.clock.now();
        active
            .iter()
            .map(|d| {
                let at = d.stage(now).map_or(d.ends_at, |s| s.until);
                (at - now).to_std().unwrap_or_default()
            })
            .min()
            .unwrap_or(TICK)
            .clamp(Duration::from_millis(5), TICK)
    }

    /// Runs the ticks until `shutdown`; follows `weights` for the receiving routes; beats
    /// `pulse` (heartbeat job `drills`) every tick (at most [`TICK`] apart).
    pub fn spawn(
        &self,
        weights: Option<WeightsRx>,
        pulse: Option<crate::heartbeat::Pulse>,
        shutdown: CancellationToken,
    ) -> JoinHandle<()> {
        let service = self.clone();
        tokio::spawn(async move {
            let mut weights = weights;
            loop {
                if let Some(p) = &pulse {
                    p.beat();
                }
                let wait = service.next_wait().await;
                let changed = async {
                    match weights.as_mut() {
                        Some(w) => w.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                    _ = service.inner.wake.notified() => {}
                    open = changed => {
                        if open {
                            let snapshot = weights.as_mut().map(|w| w.borrow_and_update().clone());
                            if let Some(s) = snapshot {
                                service.note_receivers(&s).await;
                            }
                        } else {
                            weights = None;
                        }
                    }
                }
                service.tick().await;
            }
        })
    }
}

/// Records the end of `d` and sets its fields.
async fn end(
    store: &Store,
    d: &mut Drill,
    at: DateTime<Utc>,
    by: EndedBy,
    who: Option<String>,
) -> Result<(), DrillError> {
    store
        .writer()
        .drill(DrillOp::End {
            id: d.id,
            at,
            by,
            who: who.clone(),
        })
        .await?;
    d.ended_at = Some(at);
    d.ended_by = Some(by);
    d.stopped_by = who;
    Ok(())
}

/// The caps of the drills in a stage at `now`.
pub fn caps_at(active: &[Drill], now: DateTime<Utc>) -> DrillCaps {
    active
        .iter()
        .filter_map(|d| {
            let s = d.stage(now)?;
            Some((
                d.route.clone(),
                DrillCap {
                    drill: d.id,
                    target: d.weight,
                    percent: s.percent,
                    text: format!(
                        "drill {} stage {}/{} ({}% of the move to weight {}) until {}: {}",
                        d.id,
                        s.index,
                        s.of,
                        s.percent,
                        d.weight,
                        crate::clock::rfc3339(d.ends_at),
                        d.reason
                    ),
                },
            ))
        })
        .collect()
}
