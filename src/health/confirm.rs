//! Which confirmation probe an observation calls for. After an abnormal probe the scheduler
//! probes the route again soon (`[probe] confirm_after`) instead of waiting a whole interval,
//! so the state machine's consecutive-observation rule is met in seconds; the rule itself is
//! unchanged, only the observations come sooner.
//!
//! - Only an abnormal observation on a dimension that can escalate the route (failures,
//!   latency, tokens/s) asks for one: a changed answer never raises the state above WARNING,
//!   and failures blamed on our own egress escalate nothing.
//! - A route already DEGRADED or worse asks for none: the time-based rules take it from
//!   there, and a failing provider is not loaded with extra probes.
//! - Never more than `degraded_after` in a row: the streak that reaches DEGRADED ends them.
//! - After an abnormal latency the confirmation is a throughput probe, whose first token and
//!   tokens/s tell queueing from throttling ([`super::split`]); low tokens/s are confirmed by
//!   a throughput probe too (nothing else measures them); failures by a plain probe.

use super::classify::Dims;
use super::route_health::RouteHealth;
use crate::config::DetectionConfig;
use crate::probe::outcome::{OutcomeKind, ProbeOutcome};

/// The confirmation `o` (just ingested into `h`) calls for, if any.
pub fn confirmation(
    h: &RouteHealth,
    o: &ProbeOutcome,
    cfg: &DetectionConfig,
) -> Option<OutcomeKind> {
    if o.kind == OutcomeKind::Passive || o.route != *h.route() {
        return None;
    }
    if h.last_core.is_empty() || h.state().is_incident() || h.streak() >= cfg.degraded_after {
        return None;
    }
    // Only a throughput probe measures tokens/s: it confirms low tokens/s, and it splits an
    // abnormal latency into first token vs. tokens/s.
    let core = h.last_core;
    let latency_from_probe =
        o.kind == OutcomeKind::Probe && o.success && core.contains(Dims::LATENCY);
    if core.contains(Dims::THROUGHPUT) || latency_from_probe {
        Some(OutcomeKind::Throughput)
    } else {
        Some(OutcomeKind::Probe)
    }
}
