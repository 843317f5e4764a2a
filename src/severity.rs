//! How urgent an alert is. The config's `min_severity` filters on it and every channel
//! renders it, so it sits below both.

use serde::{Deserialize, Serialize};

use crate::state::State;

/// How urgent a message is: `info` WARNING; `warning` DEGRADED, drift,
/// burn-rate tickets; `critical` CRITICAL, SWITCHED, egress, stale heartbeats, burn-rate pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "info" => Some(Self::Info),
            "warning" => Some(Self::Warning),
            "critical" => Some(Self::Critical),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }

    /// The severity a route reaching `state` carries (`None`: nothing to alert).
    pub fn of_state(state: State) -> Option<Self> {
        match state {
            State::Warning => Some(Severity::Info),
            State::Degraded => Some(Severity::Warning),
            State::Critical | State::Switched => Some(Severity::Critical),
            State::Unknown | State::Normal => None,
        }
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
