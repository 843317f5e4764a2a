//! The health service's publishing: cross-route findings evaluated once per burst, and a
//! snapshot sent when something shown changed — at most [`PUBLISH_BURST`] per
//! [`HealthOptions::publish_every`], with the events held for the snapshot that shows them.

use super::*;

impl HealthService {
    /// Cross-route findings: suppressions, opened/closed events, and the snapshot when the
    /// set of findings (not merely their numbers) changed.
    pub(super) fn evaluate_findings(&mut self) {
        self.findings_pending = false;
        let now = self.clock.now();
        let summaries: Vec<RouteSummary> = self
            .routes
            .iter()
            .map(|r| RouteSummary::of(&r.health, &self.detector, now))
            .collect();
        let mut found = findings(&summaries, self.control_ok);
        found.extend(self.board.findings(now));
        // Each route's suppression from the first finding naming it, looked up by id: a
        // provider-wide finding names every route, and a search of it per route would cost
        // routes² on the burst that raised it.
        let mut suppressed: HashMap<&RouteId, Suppression> = HashMap::new();
        for f in &found {
            for route in &f.routes {
                suppressed
                    .entry(route)
                    .or_insert_with(|| f.kind.suppression());
            }
        }
        for (i, r) in self.routes.iter_mut().enumerate() {
            let s = suppressed
                .get(r.health.route())
                .copied()
                .unwrap_or(Suppression::None);
            if r.health.suppression() != s {
                r.health.set_suppression(s);
                r.unsaved = true;
                self.wheel.touch(i);
            }
        }
        for f in &found {
            if !self.findings.iter().any(|g| same_finding(f, g)) {
                tracing::warn!(code = %f.code, routes = f.routes.len(), "{}", f.text);
                let _ = self.events.send(HealthEvent::FindingOpened {
                    finding: f.clone(),
                    at: now,
                });
            }
        }
        for g in &self.findings {
            if !found.iter().any(|f| same_finding(f, g)) {
                tracing::info!(code = %g.code, "finding closed");
                let _ = self.events.send(HealthEvent::FindingClosed {
                    finding: g.clone(),
                    at: now,
                });
            }
        }
        let key = |v: &[Finding]| -> Vec<(FindingKind, Vec<RouteId>, Vec<String>)> {
            v.iter()
                .map(|f| (f.kind, f.routes.clone(), f.providers.clone()))
                .collect()
        };
        if key(&found) != key(&self.findings) {
            self.dirty = true;
        }
        self.findings = found;
    }

    /// When a held change must go out (`None`: nothing is held).
    pub(super) fn publish_due(&self) -> Option<Instant> {
        if !self.dirty && self.held.is_empty() && !self.findings_pending {
            return None;
        }
        Some(match self.window {
            Some((start, n)) if n >= PUBLISH_BURST => start + self.opts.publish_every,
            _ => Instant::now(),
        })
    }

    /// Publishes what changed, unless [`PUBLISH_BURST`] snapshots went out in the last
    /// [`HealthOptions::publish_every`] (then the loop's timer publishes it when due).
    pub(super) fn publish(&mut self) {
        if self.publish_due().is_some_and(|due| due <= Instant::now()) {
            self.publish_now();
        }
    }

    /// Publishes a snapshot when something shown changed, then the events held for it.
    pub(super) fn publish_now(&mut self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.findings_pending {
            self.evaluate_findings();
        }
        if self.dirty {
            self.dirty = false;
            let snap = HealthSnapshot {
                generated_at: self.clock.now(),
                routes: self.routes.iter().map(|r| r.shown.clone()).collect(),
                findings: self.findings.clone(),
            };
            self.counts.snapshots.fetch_add(1, Relaxed);
            self.counts
                .route_statuses
                .fetch_add(snap.routes.len() as u64, Relaxed);
            // `send_replace` also stores it when nobody is subscribed right now.
            self.snapshot.send_replace(Arc::new(snap));
            let now = Instant::now();
            self.window = match self.window {
                Some((start, n)) if now < start + self.opts.publish_every => Some((start, n + 1)),
                _ => Some((now, 1)),
            };
        }
        for e in self.held.drain(..) {
            // No receiver (nobody subscribed yet) is not an error.
            let _ = self.events.send(e);
        }
    }
}
