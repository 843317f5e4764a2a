//! The health service's view of a route: its published status, and the fingerprints that
//! decide whether a change is worth saving or publishing.

use chrono::{DateTime, Utc};

use crate::health::{
    Baseline, BaselineSnapshot, Detector, Finding, FindingKind, IncidentSummary, RouteHealth,
    RouteStatus, State, Suppression,
};

/// What a tick may change that is worth saving.
pub(super) fn fingerprint(
    h: &RouteHealth,
) -> (
    State,
    u32,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Suppression,
) {
    (
        h.state(),
        h.streak(),
        h.normal_since(),
        h.error_rate_high_since(),
        h.suppression(),
    )
}

/// Successful share of counted outcomes over the error window, to 0.01, and whether the
/// window is over the detector's floors (`min_error_samples` outcomes, `min_failures`
/// failures) so the weights may follow it. Once the detector has judged the error rate high,
/// the ratio stays judged while the failures last, even when the sliding window briefly
/// holds one outcome fewer than the floor: a route failing every probe would otherwise swing
/// between no traffic and its full health share on every probe.
pub(super) fn success_ratio(
    h: &RouteHealth,
    detector: &Detector,
    now: DateTime<Utc>,
) -> (Option<f64>, bool) {
    let cfg = detector.config();
    let c = h.window().counts(now, cfg.error_window.as_secs());
    let ratio = (c.total > 0).then(|| ((1.0 - c.rate()) * 100.0).round() / 100.0);
    let enough = c.total >= cfg.min_error_samples || h.error_rate_high_since().is_some();
    let judged = enough && c.failures >= cfg.min_failures;
    (ratio, judged)
}

/// The route as published. `baseline`: the one already shown (refreshed on its own timer),
/// or `None` to compute it now.
pub(super) fn status(
    h: &RouteHealth,
    b: &Baseline,
    detector: &Detector,
    now: DateTime<Utc>,
    baseline: Option<Option<BaselineSnapshot>>,
) -> RouteStatus {
    let (success_ratio, success_judged) = success_ratio(h, detector, now);
    RouteStatus {
        route: h.route().clone(),
        state: h.display_state(),
        judged: h.state(),
        since: h.since(),
        reason: h.reason().cloned(),
        failure_mode: h.failure_mode(),
        baseline: baseline.unwrap_or_else(|| b.snapshot(now)),
        success_ratio,
        success_judged,
        behavior_changed: h.behavior_changed(),
        incident: h.incident().map(IncidentSummary::from),
        split: h.split().clone(),
        // The leader replaces it with the live groups; a follower has the stored incident's.
        cause: h.incident().and_then(|i| i.cause.clone()),
    }
}

/// Equal for consumers: everything but the reason's text, the baseline and the split's
/// figures. The split's verdicts count while the route is in trouble (which signal moved is
/// news then); on a healthy route a lone late first token is not worth a new snapshot.
pub(super) fn same_view(a: &RouteStatus, b: &RouteStatus) -> bool {
    let verdicts = |s: &RouteStatus| {
        (!matches!(s.judged, State::Normal | State::Unknown)).then(|| {
            (
                s.split.ttft.as_ref().map(|t| t.late),
                s.split.tps.as_ref().map(|t| t.low),
            )
        })
    };
    a.state == b.state
        && a.judged == b.judged
        && a.since == b.since
        && a.reason.as_ref().map(|r| &r.code) == b.reason.as_ref().map(|r| &r.code)
        && a.failure_mode == b.failure_mode
        && a.success_ratio == b.success_ratio
        && a.success_judged == b.success_judged
        && a.behavior_changed == b.behavior_changed
        && a.incident == b.incident
        && a.cause == b.cause
        && verdicts(a) == verdicts(b)
}

/// The same finding over time: one egress finding, one request-side finding per route.
pub(super) fn same_finding(a: &Finding, b: &Finding) -> bool {
    a.kind == b.kind
        && (a.kind == FindingKind::Egress || a.routes == b.routes)
        && (a.kind != FindingKind::VantageStale || a.providers == b.providers)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::TimeZone;

    use super::*;
    use crate::config::DetectionConfig;
    use crate::health::detector::tests::failed_probe as failed;
    use crate::route::RouteId;

    /// Two probes a second into a 10 s window of whole-second slots: the window holds 19
    /// outcomes at a second's first probe and 20 at its second. Once judged, the ratio stays
    /// judged (the weights feed does not swing between 0 and the route's health share).
    #[test]
    fn a_route_failing_every_probe_stays_judged() {
        let cfg = DetectionConfig {
            error_window: Duration::from_secs(10),
            ..DetectionConfig::default()
        };
        let det = Detector::new(&cfg);
        let r = RouteId::new("p", "r", "m");
        let t0 = Utc.with_ymd_and_hms(2026, 11, 30, 6, 30, 0).unwrap();
        let mut h = det.route(r.clone(), t0);
        let mut b = Baseline::new(r.clone(), &cfg);
        let mut seen = Vec::new();
        for i in 0..60 {
            let at = t0 + chrono::Duration::milliseconds(500 * i);
            det.ingest(&mut h, &mut b, &failed(&r, at), at);
            seen.push(success_ratio(&h, &det, at).1);
        }
        let first = seen.iter().position(|j| *j).expect("judged at 20 outcomes");
        assert!(seen[first..].iter().all(|j| *j), "{seen:?}");
    }
}
