//! Detection: per-route baselines by time of day, the per-route state machine
//! (`UNKNOWN NORMAL WARNING DEGRADED CRITICAL`, + the `SWITCHED` overlay), failure modes,
//! incidents and cross-route findings (our egress, the requests themselves).
//!
//! Everything here but [`service`] and [`control`] is pure: plain data, functions of (state,
//! observation, baseline, config, `now`). No I/O, no tasks, no global clock — so a test can
//! replay an incident second by second.
//!
//! The shell's part ([`service`], the only I/O here): keep one [`RouteHealth`] and one [`Baseline`] per
//! route; on start rebuild each `Baseline` from the store ([`Baseline::rebuild`]) and restore
//! each `RouteHealth` from its persisted JSON; feed every outcome through
//! [`Detector::ingest`]; call [`Detector::tick`] every second per route; persist the returned
//! [`Transition`]s, [`RouteHealth::incident`] / [`RouteHealth::last_closed`] and the
//! `RouteHealth` itself; every few seconds build [`findings::RouteSummary`]s and call
//! [`findings::findings`], then [`RouteHealth::set_suppression`] on the routes it names.
//!
//! - [`baseline`]: time-of-day buckets, ring buffers, mean/σ/percentiles via `statrs`.
//! - [`classify`]: is one outcome abnormal, on which dimension, and is it the client's fault.
//! - [`window`]: the bounded error-rate window (per-second counters).
//! - [`detector`]: the state machine; [`route_health`]: the per-route state it moves;
//!   [`evidence`]: transitions, their evidence and incidents; [`reasons`]: reason codes,
//!   sentences and failure modes; [`split`]: queueing vs. throttling (first token vs.
//!   tokens/s); [`confirm`]: which confirmation probe an observation calls for.
//! - [`findings`]: egress and request-side findings over all routes.
//! - [`status`]: the published view (`HealthSnapshot`, `HealthEvent`) other modules consume.
//! - [`service`]: the shell — owns every route's state, feeds it outcomes and ticks, persists
//!   transitions, incidents and states, publishes snapshots and events.
//! - [`control`]: the egress control probe (a plain GET of `[egress] control_url`).

pub mod baseline;
pub mod classify;
pub mod confirm;
pub mod control;
pub mod detector;
pub mod evidence;
pub mod findings;
pub mod reasons;
pub mod route_health;
pub mod service;
pub mod split;
pub mod status;
pub mod window;

use serde::{Deserialize, Serialize};

pub use baseline::{Baseline, BaselineSnapshot, LatencyRef, TpsRef};
pub use classify::{Dims, Judgement, Signal};
pub use detector::Detector;
pub use evidence::{ErrorRateEvidence, Evidence, Incident, Observed, Threshold, Transition};
pub use findings::{Finding, FindingKind, RouteSummary};
pub use route_health::{RouteHealth, Suppression};
pub use split::{Split, TpsCheck, TtftCheck};
pub use status::{HealthEvent, HealthRx, HealthSnapshot, IncidentSummary, RouteStatus};

/// A route's state. `SWITCHED` is an overlay set by the switch controller; the detector keeps
/// judging the route underneath (see [`RouteHealth::display_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    Unknown,
    Normal,
    Warning,
    Degraded,
    Critical,
    Switched,
}

impl State {
    /// The SPEC string, also the `probeok_route_state` label order (0 UNKNOWN … 5 SWITCHED).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Unknown => "UNKNOWN",
            State::Normal => "NORMAL",
            State::Warning => "WARNING",
            State::Degraded => "DEGRADED",
            State::Critical => "CRITICAL",
            State::Switched => "SWITCHED",
        }
    }

    /// DEGRADED or worse: an incident is open.
    pub fn is_incident(self) -> bool {
        matches!(self, State::Degraded | State::Critical)
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of trouble a route is in (seed 004's three failure modes); each calls for a
/// different first action, so they are never folded into one "upstream error".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Connect errors, 5xx, timeouts, stalls dominate: move traffic now.
    Unavailable,
    /// Answers arrive, but slow or at low tokens/s: deweight, prepare to switch.
    Degraded,
    /// Transport healthy, answers are not `PROBE_OK`: a drift signal, not an outage.
    BehaviorChanged,
}

impl FailureMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Unavailable => "unavailable",
            FailureMode::Degraded => "degraded",
            FailureMode::BehaviorChanged => "behavior_changed",
        }
    }
}

/// Why a route is where it is: a stable snake_case code (alerts, weights and dashboards match
/// on it) and a human sentence with the numbers (which may change on every observation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reason {
    /// `latency_above_baseline`, `ttft_above_baseline` (queueing), `tps_below_baseline`
    /// (throttling), `ttft_and_tps_off_baseline` (both), `probe_failed`, `error_rate_high`,
    /// `answer_changed`, `degraded_too_long`, `recovered`, `baseline_ready`.
    pub code: String,
    pub text: String,
}

impl Reason {
    pub fn new(code: &str, text: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            text: text.into(),
        }
    }
}

/// `mean ± stddev` in one unit: `"1.1 s ± 0.3 s"`, `"850 ms ± 40 ms"`.
pub fn fmt_spread(mean_ms: f64, stddev_ms: f64) -> String {
    if mean_ms.abs() >= 1000.0 {
        format!("{:.1} s ± {:.1} s", mean_ms / 1000.0, stddev_ms / 1000.0)
    } else {
        format!("{:.0} ms ± {:.0} ms", mean_ms, stddev_ms)
    }
}

/// `1234.0` → `"1.2 s"`, `850.0` → `"850 ms"`: how people read latencies.
pub fn fmt_ms(ms: f64) -> String {
    if ms.abs() >= 1000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{:.0} ms", ms)
    }
}
