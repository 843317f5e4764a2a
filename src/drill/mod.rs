//! Drills: planned, time-limited, recorded moves of traffic off one route — to
//! prove that the routes behind it (its "backup") carry the load before an incident makes
//! them. A drill is started by an operator through the admin API (or `probeok drill start`),
//! refused outside the off-peak windows unless forced, ramps the route's weight towards its
//! target in equal stages, ends by itself at its end time, and leaves a report comparing what
//! happened during it with the backup's own history.
//!
//! - [`plan`]: pure — the request's validation, stages and the weight at time t, off-peak
//!   windows.
//! - [`service`]: the I/O shell — start/stop/auto-end, persisted in SQLite (`drills`), the
//!   drill caps fed to the weights publisher ([`crate::weights::DrillCaps`]), restored after
//!   a restart.
//! - [`report`]: pure summaries of the drill's window (proxy requests, probes, latency against
//!   the baseline, regression sets) and the verdict line; its queries are in `store/drills.rs`.
//! - [`DrillView`]: a drill as the admin API (`/api/v1/admin/drills`, `/api/v1/drills`) and
//!   the CLI show it.
//! - [`client`]: `probeok drill start|stop|report` against a running monitor.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod client;
pub mod plan;
pub mod report;
pub mod service;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::route::RouteId;

pub use plan::{OffPeak, Stage};
pub use service::{DrillRx, DrillService};

/// How a drill ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndedBy {
    /// At its end time (or found past it after a restart).
    Auto,
    /// An operator stopped it.
    Stop,
}

impl EndedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            EndedBy::Auto => "auto",
            EndedBy::Stop => "stop",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(EndedBy::Auto),
            "stop" => Some(EndedBy::Stop),
            _ => None,
        }
    }
}

/// One drill as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drill {
    pub id: i64,
    /// The route whose traffic moves.
    pub route: RouteId,
    /// Its logical model.
    pub serves: String,
    /// The route's weight at 100 % of the ramp (0: all its traffic moves away).
    pub weight: u8,
    /// Percentages of the move, one per stage of equal length; `[100]` moves at once.
    pub ramp: Vec<u8>,
    pub reason: String,
    pub started_by: Option<String>,
    /// Started outside the off-peak windows on purpose.
    pub forced: bool,
    pub started_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub ended_by: Option<EndedBy>,
    /// Who asked for the stop, when they said.
    pub stopped_by: Option<String>,
    /// The routes of the model that carried traffic while it ran (the report's "backup").
    pub receivers: Vec<RouteId>,
}

impl Drill {
    pub fn active(&self) -> bool {
        self.ended_at.is_none()
    }

    /// The window the report covers: start → end (or `now` while it runs).
    pub fn window(&self, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        let end = self.ended_at.unwrap_or_else(|| now.min(self.ends_at));
        (self.started_at, end.max(self.started_at))
    }

    /// The stage in force at `now` (`None` once the drill's time is up or it ended).
    pub fn stage(&self, now: DateTime<Utc>) -> Option<Stage> {
        if !self.active() {
            return None;
        }
        plan::stage_at(&self.ramp, self.started_at, self.ends_at, now)
    }
}

/// A drill as the API shows it: the record, whether it runs, and its stage now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrillView {
    #[serde(flatten)]
    pub drill: Drill,
    /// `active` or `ended`.
    pub status: String,
    pub stage: Option<Stage>,
}

impl DrillView {
    pub fn new(drill: Drill, now: DateTime<Utc>) -> Self {
        Self {
            status: if drill.active() { "active" } else { "ended" }.to_owned(),
            stage: drill.stage(now),
            drill,
        }
    }
}
