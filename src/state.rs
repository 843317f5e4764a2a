//! A route's judged state and its history: the state names, why a route is where it is,
//! each change of state and the incidents they open and close. Detection decides them; the
//! store, alerts, weights, pages and the API read them.

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::evidence::Evidence;
use crate::route::RouteId;

/// A route's state. `SWITCHED` is an overlay set by the switch controller; the detector keeps
/// judging the route underneath (see `health::RouteHealth::display_state`).
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
    /// The documented state name, also the `probeok_route_state` label order (0 UNKNOWN …
    /// 5 SWITCHED).
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

/// What kind of trouble a route is in (one of three failure modes); each calls for a
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
    /// `latency_above_baseline`, `tps_below_baseline`, `probe_failed`, `error_rate_high`,
    /// `answer_changed`, `max_tokens_exhausted`, `degraded_too_long`, `shared_cause`, `recovered`,
    /// `baseline_ready`.
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

/// A change of state, with its reason and evidence; the shell stores every one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub route: RouteId,
    pub from: State,
    pub to: State,
    pub at: DateTime<Utc>,
    pub reason: Reason,
    pub failure_mode: Option<FailureMode>,
    pub evidence: Evidence,
    /// The incident this transition opened, changed or closed.
    pub incident_id: Option<String>,
}

/// DEGRADED or worse, until back to NORMAL (or UNKNOWN, for a route that never had a baseline).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Incident {
    /// `route@opened_at` (RFC 3339): stable and unique per route.
    pub id: String,
    pub route: RouteId,
    pub opened_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    pub peak: State,
    pub failure_mode: Option<FailureMode>,
    /// The first `health::detector::MAX_INCIDENT_TRANSITIONS` transitions, then the closing one.
    pub transitions: Vec<Transition>,
    /// The shared cause the route was judged with (`provider/region:class`), when it was: the
    /// routes of one cause are one outage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

/// A route's whole judged state as the store keeps it (detection's `RouteHealth`): the store
/// indexes the route and its state and keeps the rest as opaque JSON it gives back whole, so
/// it never depends on how detection judges.
pub trait PersistedHealth: Serialize + DeserializeOwned {
    fn route(&self) -> &RouteId;
    /// The judged state (never `SWITCHED`).
    fn state(&self) -> State;
    /// The open incident, which the store also keeps in its own table.
    fn incident(&self) -> Option<&Incident>;
}

impl<T: PersistedHealth> PersistedHealth for Box<T> {
    fn route(&self) -> &RouteId {
        (**self).route()
    }
    fn state(&self) -> State {
        (**self).state()
    }
    fn incident(&self) -> Option<&Incident> {
        (**self).incident()
    }
}
