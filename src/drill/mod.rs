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
pub(crate) mod plan;
pub(crate) mod report;
pub mod service;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use crate::records::drill::{Drill, EndedBy};
pub use plan::{OffPeak, Stage};
pub use service::{DrillRx, DrillService};

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
