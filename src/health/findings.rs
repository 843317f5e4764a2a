//! Findings across routes: is it the provider, our own egress, or the requests themselves?
//! (a minimal control request that bypasses business logic tells our
//! network from theirs; probes fine while real traffic fails points at the requests.)
//!
//! Pure: the shell builds one [`RouteSummary`] per route ([`RouteSummary::of`]) and passes the
//! latest result of the `[egress] control_url` probe (a plain HTTPS GET, probed alongside the
//! routes); [`findings`] returns what to report. The shell then calls
//! [`RouteHealth::set_suppression`] with [`Suppression::Egress`] on the routes of an egress
//! finding (their failures escalate nothing while it holds), with
//! [`Suppression::RequestSide`] on a request-side route (its passive failures leave its error
//! rate), and back to [`Suppression::None`] when the finding is gone.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::detector::Detector;
use super::route_health::{RouteHealth, Suppression};
use crate::route::RouteId;

/// What one route looks like right now, for cross-route findings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteSummary {
    pub route: RouteId,
    /// The latest probe (or throughput probe) failed against the route.
    pub probe_failing: bool,
    /// A probe succeeded after the passive failures began (so "probes fine" is current).
    pub probe_ok_during_passive_failures: bool,
    /// Passive outcomes and failures in the error window.
    pub passive_total: u32,
    pub passive_failures: u32,
    /// The passive-only error rate is judged above `critical_error_rate` (with the minimum
    /// samples and failures).
    pub passive_failing: bool,
}

impl RouteSummary {
    pub fn of(h: &RouteHealth, detector: &Detector, now: DateTime<Utc>) -> Self {
        let (_, last_ok, failed) = h.last_probe();
        let since = h.passive_high_since();
        let c = h
            .window()
            .counts(now, detector.config().error_window.as_secs());
        Self {
            route: h.route().clone(),
            probe_failing: failed,
            probe_ok_during_passive_failures: matches!((last_ok, since), (Some(ok), Some(s)) if ok >= s),
            passive_total: c.passive_total,
            passive_failures: c.passive_failures,
            passive_failing: since.is_some(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// Routes of at least two providers fail together and the control URL fails too: our own
    /// network, not the providers. Routes are marked, not escalated one by one.
    Egress,
    /// Probes are fine while real traffic on the route fails: look at the requests.
    RequestSide,
    /// Vantages see the route failing that the quorum does not: their network, not the
    /// provider (`providers` names those vantages). No incident, no alert, no weight change.
    VantageLocal,
    /// An agent stopped pushing and left the quorum (`providers` names the vantage, `routes`
    /// its routes). Alerted once as a warning.
    VantageStale,
}

impl FindingKind {
    /// The suppression the shell applies to the finding's routes.
    pub fn suppression(self) -> Suppression {
        match self {
            FindingKind::Egress => Suppression::Egress,
            FindingKind::RequestSide => Suppression::RequestSide,
            FindingKind::VantageLocal | FindingKind::VantageStale => Suppression::None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub routes: Vec<RouteId>,
    pub providers: Vec<String>,
    /// Stable: `egress` or `request_side`.
    pub code: String,
    pub text: String,
}

/// Cross-route findings. `control_ok` is the latest control-URL probe (`None` when no
/// `control_url` is configured or it was not probed yet: no egress finding then, the failures
/// are judged route by route).
pub fn findings(routes: &[RouteSummary], control_ok: Option<bool>) -> Vec<Finding> {
    let mut out = Vec::new();
    let failing: Vec<&RouteSummary> = routes.iter().filter(|r| r.probe_failing).collect();
    let mut providers: Vec<String> = failing
        .iter()
        .map(|r| r.route.split().0.to_owned())
        .collect();
    providers.sort();
    providers.dedup();
    let egress = control_ok == Some(false) && providers.len() >= 2;
    if egress {
        out.push(Finding {
            kind: FindingKind::Egress,
            routes: failing.iter().map(|r| r.route.clone()).collect(),
            text: format!(
                "{} routes of {} providers ({}) fail together and the control URL fails too: \
                 our own network or egress, not the providers",
                failing.len(),
                providers.len(),
                providers.join(", ")
            ),
            providers,
            code: "egress".into(),
        });
    }
    for r in routes {
        if egress && r.probe_failing {
            continue;
        }
        if r.passive_failing && !r.probe_failing && r.probe_ok_during_passive_failures {
            out.push(Finding {
                kind: FindingKind::RequestSide,
                routes: vec![r.route.clone()],
                providers: vec![r.route.split().0.to_owned()],
                code: "request_side".into(),
                text: format!(
                    "probes succeed while {} of {} real requests failed: the requests, not the \
                     provider, look at fault",
                    r.passive_failures, r.passive_total
                ),
            });
        }
    }
    out
}
