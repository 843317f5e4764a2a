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
//!
//! **Attribution per client.** The proxy marks a passive failure as the request's own
//! (`ProbeOutcome::attributed_to`) when that client's requests fail on the route while other
//! clients' requests there succeed (a huge prompt, an enormous `max_tokens` timing out). The
//! detector never counts such a failure against the route; it keeps a bounded tally per
//! client ([`Attributed`]), and while the route's probes are not failing that tally is a
//! `request_side` finding naming the client and what failed.

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
    /// Clients whose failures on the route the proxy attributed to their own requests, within
    /// the error window.
    pub attributed: Vec<Attributed>,
}

/// Passive failures of one client that were attributed to its requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attributed {
    /// The client's tag (never its key).
    pub client: String,
    pub failures: u32,
    /// The stable code of the latest failure (`timeout`, `stalled`, …).
    pub error: String,
    pub first_at: DateTime<Utc>,
    pub last_at: DateTime<Utc>,
}

/// Clients tallied per route, at most (the oldest tally is forgotten first).
pub const MAX_ATTRIBUTED_CLIENTS: usize = 8;

/// Adds one attributed failure to `list` at `now`, forgetting tallies whose latest failure
/// is `window_s` old.
pub(super) fn note_attributed(
    list: &mut Vec<Attributed>,
    client: &str,
    error: &str,
    now: DateTime<Utc>,
    window_s: u64,
) {
    prune_attributed(list, now, window_s);
    if let Some(a) = list.iter_mut().find(|a| a.client == client) {
        a.failures = a.failures.saturating_add(1);
        a.error = error.to_owned();
        a.last_at = a.last_at.max(now);
        return;
    }
    if list.len() >= MAX_ATTRIBUTED_CLIENTS {
        if let Some(oldest) = (0..list.len()).min_by_key(|&i| list[i].last_at) {
            list.remove(oldest);
        }
    }
    list.push(Attributed {
        client: client.to_owned(),
        failures: 1,
        error: error.to_owned(),
        first_at: now,
        last_at: now,
    });
}

/// Forgets the tallies whose latest failure left the window.
pub(super) fn prune_attributed(list: &mut Vec<Attributed>, now: DateTime<Utc>, window_s: u64) {
    let span = chrono::Duration::seconds(i64::try_from(window_s).unwrap_or(i64::MAX / 1000));
    list.retain(|a| now.signed_duration_since(a.last_at) < span);
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
            attributed: {
                let mut a = h.attributed().to_vec();
                prune_attributed(&mut a, now, detector.config().error_window.as_secs());
                a
            },
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
        let route_wide =
            r.passive_failing && !r.probe_failing && r.probe_ok_during_passive_failures;
        let per_client = !r.probe_failing && !r.attributed.is_empty();
        if !route_wide && !per_client {
            continue;
        }
        let mut parts = Vec::new();
        if route_wide {
            parts.push(format!(
                "probes succeed while {} of {} real requests failed: the requests, not the \
                 provider, look at fault",
                r.passive_failures, r.passive_total
            ));
        }
        for a in &r.attributed {
            parts.push(format!(
                "client {}: {} requests failed ({}) while probes and other clients' requests \
                 on the route succeed: its own requests, not the route, look at fault",
                a.client, a.failures, a.error
            ));
        }
        out.push(Finding {
            kind: FindingKind::RequestSide,
            routes: vec![r.route.clone()],
            providers: vec![r.route.split().0.to_owned()],
            code: "request_side".into(),
            text: parts.join("; "),
        });
    }
    out
}
