//! The health service's part for routes agents probe too ([`crate::health::vantages`]): the
//! monitor's own probes of such a route move its own vantage's machine, agents' outcomes
//! move theirs, and the route follows their quorum ([`crate::health::quorum`]) through
//! [`crate::health::Detector::follow`], its transitions stored and announced like any other.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::{HealthEvent, HealthService, Persist, State};
use crate::health::confirm;
use crate::health::quorum::Verdict;
use crate::probe::ProbeOutcome;
use crate::scheduler::Confirm;
use crate::vantage::VantageOutcome;

impl HealthService {
    /// A probe of a route agents probe too: it moves the monitor's own vantage's machine,
    /// and the route follows the quorum.
    pub(super) async fn ingest_local_vantage(
        &mut self,
        i: usize,
        o: ProbeOutcome,
        persist: &mpsc::Sender<Persist>,
    ) {
        let now = self.clock.now();
        let r = &mut self.routes[i];
        if let Some(change) = crate::health::fault::observe(&mut r.fault, &o) {
            let status = match change {
                crate::health::fault::FaultChange::Opened(s) => Some(s),
                crate::health::fault::FaultChange::Cleared => None,
            };
            let _ = self.events.send(HealthEvent::RouteFault {
                route: o.route.clone(),
                status,
                at: now,
            });
        }
        let Some(local) = self.board.local_mut(&o.route) else {
            return;
        };
        let _ = self.detector.ingest(local, &mut r.baseline, &o, now);
        let local = &*local;
        if let Some(tx) = &self.confirms {
            if let Some(kind) = confirm::confirmation(local, &o, self.detector.config()) {
                let asked = Confirm {
                    route: o.route.clone(),
                    kind,
                };
                if tx.try_send(asked).is_err() {
                    tracing::debug!(route = %o.route, "confirmation not queued");
                }
            }
        }
        self.board.local_judged(&o.route);
        self.follow_quorum(i, true, persist).await;
    }

    /// An outcome from an agent.
    pub(super) async fn ingest_remote(
        &mut self,
        v: VantageOutcome,
        persist: &mpsc::Sender<Persist>,
    ) {
        let now = self.clock.now();
        let (taken, was_stale) =
            self.board
                .ingest_remote(&self.detector, &v.vantage, &v.outcome, now);
        if was_stale {
            tracing::info!(vantage = %v.vantage, "vantage pushes again; back in the quorum");
            self.evaluate_findings();
        }
        if !taken {
            tracing::debug!(vantage = %v.vantage, route = %v.outcome.route, "outcome from a vantage not probing that route; not judged");
            return;
        }
        if let Some(&i) = self.index.get(&v.outcome.route) {
            // An agent's answer tells the account's headroom as well as ours does.
            self.observe_headroom(&v.outcome);
            self.follow_quorum(i, true, persist).await;
        }
    }

    /// Moves route `i` where its vantages' quorum, with its memory, says (see
    /// [`crate::health::quorum`]); `report` says whether a vantage's outcome brought this
    /// evaluation (a tick's does not complete a run).
    pub(super) async fn follow_quorum(
        &mut self,
        i: usize,
        report: bool,
        persist: &mpsc::Sender<Persist>,
    ) {
        let id = self.routes[i].health.route().clone();
        let Some(verdict) = self.board.verdict(&id) else {
            return;
        };
        let now = self.clock.now();
        let (mut to, alone_changed) = self.board.note(&id, &verdict, report, now);
        // Real traffic (passive outcomes) may make the route worse than its vantages see, and
        // never better: a route the quorum holds bad is not healed by its own passive rules.
        let applied = self.board.applied(&id).unwrap_or(State::Unknown);
        if to.is_none() && applied != State::Unknown && self.routes[i].health.state() < applied {
            to = Some(Verdict {
                state: applied,
                ..verdict
            });
        }
        if let Some(v) = &to {
            let r = &mut self.routes[i];
            let t = (self.detector).follow(&mut r.health, v, self.board.min_vantages(), now);
            r.unsaved = true;
            if let Some(t) = t {
                self.on_transition(i, t, persist).await;
            }
        }
        if to.is_some() || alone_changed {
            self.refresh(i, now);
            self.evaluate_findings();
            self.publish_vantages();
        }
    }

    /// Publishes every multi-vantage route's vantages.
    pub(super) fn publish_vantages(&mut self) {
        if self.board.is_empty() {
            return;
        }
        let now = self.clock.now();
        let (routes, index) = (&self.routes, &self.index);
        let view = self
            .board
            .view(now, |id| index.get(id).map(|&i| &routes[i].baseline));
        self.vantage_view.send_if_modified(|old| {
            if **old == view {
                false
            } else {
                *old = Arc::new(view);
                true
            }
        });
    }
}

pub(super) async fn next_remote(rx: &mut Option<mpsc::Receiver<VantageOutcome>>) -> VantageOutcome {
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
