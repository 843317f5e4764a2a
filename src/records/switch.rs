//! The switch controller's records: every switch, canary stage, abort, return and refusal.
//! The controller writes them, the store keeps them, alerts and the API show them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::route::RouteId;

/// What a record says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Traffic moved from the primaries to the backup.
    Switch,
    /// A canary stage began: the primaries get `ratio` of the share.
    CanaryStage,
    /// A canary stage failed: all traffic back on the backup, the wait restarts.
    Abort,
    /// The return is complete: the primaries carry the traffic again.
    Returned,
    /// A switch was wanted but refused (`trigger` says why).
    Blocked,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Switch => "switch",
            Action::CanaryStage => "canary_stage",
            Action::Abort => "abort",
            Action::Returned => "returned",
            Action::Blocked => "blocked",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Action::Switch,
            Action::CanaryStage,
            Action::Abort,
            Action::Returned,
            Action::Blocked,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// The whole incident as the controller saw it, on the `returned` record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Episode {
    /// The first switch of the episode.
    pub started_at: DateTime<Utc>,
    pub duration_s: i64,
    /// Switches (traffic moves to the backup), aborts included.
    pub switches: u32,
    /// Extra cost of non-primary serving for this model during the episode.
    pub extra_cost: f64,
}

/// One switch, canary stage, abort, return or refusal (its `switch_context`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwitchRecord {
    /// The logical model.
    pub serves: String,
    pub action: Action,
    pub at: DateTime<Utc>,
    /// Why: the primaries' reason code for a switch (`error_rate_high`, …), `canary`,
    /// `canary_failed`, `primary_healthy`, or the refusal (`no_healthy_backup`,
    /// `backup_probe_failed`, `budget`, `min_dwell`, `max_switches_per_hour`).
    pub trigger: String,
    pub from: Vec<RouteId>,
    pub to: Vec<RouteId>,
    /// `false` for an operator's move (none yet: every move is the controller's).
    pub automatic: bool,
    /// No further switch before this.
    pub dwell_until: Option<DateTime<Utc>>,
    /// The primaries' share during a canary stage.
    pub ratio: Option<f64>,
    pub episode: Option<Episode>,
    /// A sentence with the numbers, for people.
    pub text: String,
}

impl SwitchRecord {
    /// Alert severity: a switch or a refusal is `critical` (as SWITCHED is), an abort
    /// `warning`, canary stages and the return `info`.
    pub fn severity(&self) -> &'static str {
        match self.action {
            Action::Switch | Action::Blocked => "critical",
            Action::Abort => "warning",
            Action::CanaryStage | Action::Returned => "info",
        }
    }
}
