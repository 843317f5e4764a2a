//! Reasons and failure modes: which code and sentence a transition carries, from the signals
//! of the observation and what the route has shown since it was last NORMAL.

use super::classify::{Dims, Signal};
use super::evidence::Threshold;
use super::route_health::{RouteHealth, Suppression};
use super::split::Split;
use super::FailureMode;

/// The failure mode from what the route has shown since it was last NORMAL: failures (and a
/// high error rate) dominating → unavailable; slow answers → degraded; only wrong answers →
/// behavior_changed.
pub(super) fn failure_mode(h: &RouteHealth) -> Option<FailureMode> {
    let m = &h.modes;
    let rate_high = h.rate_high_since.is_some() && h.suppression != Suppression::Egress;
    if rate_high || (m.failures > 0 && m.failures >= m.slow) {
        Some(FailureMode::Unavailable)
    } else if m.slow > 0 {
        Some(FailureMode::Degraded)
    } else if h.behavior {
        Some(FailureMode::BehaviorChanged)
    } else {
        None
    }
}

/// The code of the first signal on one of `dims` (signals are pushed failure, latency, tps,
/// answer, so the most serious comes first) — for a latency or tokens/s trouble, the code of
/// [`Split::code`] once the evidence tells queueing from throttling.
pub(super) fn lead_code(signals: &[Signal], dims: Dims, split: &Split) -> &'static str {
    let code = signals
        .iter()
        .find(|s| dims.intersects(s.dim()))
        .map_or("abnormal", Signal::code);
    if is_latency_family(code) {
        split.code().unwrap_or(code)
    } else {
        code
    }
}

fn is_latency_family(code: &str) -> bool {
    matches!(
        code,
        "latency_above_baseline" | "ttft_above_baseline" | "tps_below_baseline"
    )
}

/// [`signals_text`], plus which signal moved when [`lead_code`] took the split's code.
pub(super) fn reason_text(signals: &[Signal], dims: Dims, split: &Split) -> String {
    let text = signals_text(signals, dims);
    let lead = signals
        .iter()
        .find(|s| dims.intersects(s.dim()))
        .map_or("abnormal", Signal::code);
    match split.text() {
        Some(t) if is_latency_family(lead) => format!("{text}; {t}"),
        _ => text,
    }
}

pub(super) fn signals_text(signals: &[Signal], dims: Dims) -> String {
    let parts: Vec<String> = signals
        .iter()
        .filter(|s| dims.intersects(s.dim()))
        .map(Signal::text)
        .collect();
    if parts.is_empty() {
        "abnormal observation".to_owned()
    } else {
        parts.join("; ")
    }
}

pub(super) fn streak_threshold(streak: u32, limit: u32) -> Threshold {
    Threshold {
        name: "consecutive_abnormal".into(),
        observed: f64::from(streak),
        limit: f64::from(limit),
    }
}
