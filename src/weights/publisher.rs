//! The weights publisher: the thin task that follows health and every other feed with a say
//! ([`Feeds`]), recomputes on each change and sends only new versions.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{DrillCaps, OpenBreakers, Overrides, Policy, Weights, WeightsRx};
use crate::drift::DriftRx;
use crate::health::HealthRx;
use crate::route::Route;

/// What the weights publisher follows. [`Feeds::new`] is health alone under the default
/// policy; name the rest with struct update syntax
/// (`Feeds { drift: Some(rx), ..Feeds::new(routes, health) }`).
#[derive(Debug)]
pub struct Feeds {
    pub routes: Arc<Vec<Route>>,
    pub health: HealthRx,
    /// `[drift] on_drift` ([`Policy::from_config`]).
    pub policy: Policy,
    /// Drift's findings and the quality gate.
    pub drift: Option<DriftRx>,
    /// The switch controller's overrides.
    pub overrides: Option<watch::Receiver<Arc<Overrides>>>,
    /// The in-process proxy's open breakers.
    pub breakers: Option<watch::Receiver<Arc<OpenBreakers>>>,
    /// The running drills' caps (`crate::drill`).
    pub drills: Option<watch::Receiver<Arc<DrillCaps>>>,
    /// The publisher's heartbeat (`weights`), beaten by its loop.
    pub pulse: Option<crate::heartbeat::Pulse>,
}

impl Feeds {
    /// Health alone: the default policy, no drift, override, breaker or drill feed.
    pub fn new(routes: Arc<Vec<Route>>, health: HealthRx) -> Self {
        Self {
            routes,
            health,
            policy: Policy::default(),
            drift: None,
            overrides: None,
            breakers: None,
            drills: None,
            pulse: None,
        }
    }
}

/// Publishes the weights: computes them from the current values of every feed at once, then
/// again on every change of any of them, sending only new versions. Ends on `shutdown`. A
/// feed whose sender goes away keeps its last value; if health goes away first, the last
/// weights stay published until shutdown (overrides and drills may still change them).
pub fn spawn_publisher(feeds: Feeds, shutdown: CancellationToken) -> WeightsRx {
    let Feeds {
        routes,
        mut health,
        policy,
        mut drift,
        mut overrides,
        mut breakers,
        mut drills,
        pulse,
    } = feeds;
    let first = health.borrow_and_update().clone();
    let first_drift = drift.as_mut().map(|d| d.borrow_and_update().clone());
    let mut weights = Weights::with_drift(routes, policy, first_drift, &first);
    if let Some(o) = &mut overrides {
        weights.set_overrides((**o.borrow_and_update()).clone());
    }
    if let Some(b) = &mut breakers {
        weights.set_breakers((**b.borrow_and_update()).clone());
    }
    if let Some(d) = &mut drills {
        weights.set_drills((**d.borrow_and_update()).clone());
    }
    // Applies them to the first version (a new version only if they change anything).
    let _ = weights.update(&first);
    let (tx, rx) = watch::channel(weights.current());
    tokio::spawn(async move {
        let mut health_open = true;
        let mut beat = tokio::time::interval(crate::heartbeat::PULSE_EVERY);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let drift_changed = async {
                match drift.as_mut() {
                    Some(d) => d.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = beat.tick(), if pulse.is_some() => {
                    if let Some(p) = &pulse {
                        p.beat();
                    }
                    continue;
                }
                changed = health.changed(), if health_open => {
                    if changed.is_err() {
                        // No more health updates: keep the last weights (overrides may
                        // still change them) until shutdown.
                        health_open = false;
                        if overrides.is_none() && drills.is_none() {
                            shutdown.cancelled().await;
                            break;
                        }
                        continue;
                    }
                }
                changed = next_value(&mut overrides) => {
                    match changed {
                        Some(o) => weights.set_overrides(o),
                        None => overrides = None,
                    }
                }
                changed = next_value(&mut breakers) => {
                    match changed {
                        Some(b) => weights.set_breakers(b),
                        None => breakers = None,
                    }
                }
                changed = next_value(&mut drills) => {
                    match changed {
                        Some(d) => weights.set_drills(d),
                        None => drills = None,
                    }
                }
                changed = drift_changed => {
                    match changed {
                        Ok(()) => {
                            let d = drift.as_mut().map(|d| d.borrow_and_update().clone());
                            weights.set_drift(d);
                        }
                        // The drift runner is gone: keep its last view, follow health only.
                        Err(_) => drift = None,
                    }
                }
            }
            let snapshot = health.borrow_and_update().clone();
            if let Some(next) = weights.update_shared(&snapshot) {
                tracing::debug!(version = next.version, "weights changed");
                tx.send_replace(next);
            }
        }
    });
    rx
}

/// The next value of an optional feed (`None`: its sender is gone); pending forever without a
/// receiver.
async fn next_value<T: Clone>(rx: &mut Option<watch::Receiver<Arc<T>>>) -> Option<T> {
    match rx {
        Some(r) => match r.changed().await {
            Ok(()) => Some((**r.borrow_and_update()).clone()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}
