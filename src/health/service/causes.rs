//! The shell's part of shared causes ([`super::super::cause`]): each probe result updates the
//! groups, and the routes a confirmed group names are judged once findings are current.

use super::*;

impl HealthService {
    /// Route `i`'s probe ended with `class` (`None`: a success, or a failure no group shares).
    pub(super) fn observe_cause(&mut self, i: usize, class: Option<Class>, now: DateTime<Utc>) {
        let h = &self.routes[i].health;
        let incident = h.state().is_incident();
        if !incident {
            self.causes.recovered(i);
        }
        // Confirming takes a route that is down by its own failures (not slow, say), and one
        // judged on a group's evidence counts only once its own probes would have got it
        // there.
        let own = incident
            && h.failure_mode() == Some(super::super::FailureMode::Unavailable)
            && (!self.causes.is_escalated(i)
                || h.streak() >= self.detector.config().degraded_after);
        let changes = self.causes.observe(i, class, own, now);
        let r = &mut self.routes[i];
        if r.health.incident().is_some_and(|x| x.cause.is_none()) {
            if let Some(v) = self.causes.verdict(i) {
                r.unsaved |= super::super::cause::note_cause(&mut r.health, &v.id);
            }
        }
        for j in changes.shown {
            if j != i {
                self.refresh(j, now);
            }
        }
        if !changes.judge.is_empty() {
            self.cause_pending.extend(changes.judge);
            self.findings_pending = true;
        }
    }

    /// With the next snapshot, judges DEGRADED the routes confirmed groups named, unless a
    /// finding blames our egress for their failures, agents judge them, or they got there
    /// already.
    pub(super) async fn judge_causes(&mut self, persist: &mpsc::Sender<Persist>) {
        // With the next snapshot: a burst of joiners shares one evaluation of findings.
        let due = self.publish_due().is_some_and(|d| d <= Instant::now());
        if self.cause_pending.is_empty() || !due {
            return;
        }
        if self.findings_pending {
            self.evaluate_findings();
        }
        let now = self.clock.now();
        for i in std::mem::take(&mut self.cause_pending) {
            let Some(v) = self.causes.verdict(i) else {
                continue;
            };
            let r = &mut self.routes[i];
            if r.health.suppression() != Suppression::None || self.board.covers(r.health.route()) {
                continue;
            }
            let Some(t) = self.detector.judge_by_cause(&mut r.health, &v, now) else {
                continue;
            };
            r.unsaved = true;
            self.causes.escalated(i);
            self.wheel.touch(i);
            self.on_transition(i, t, persist).await;
            self.refresh(i, now);
        }
    }
}
