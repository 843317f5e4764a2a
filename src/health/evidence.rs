//! What a transition was decided on, and the incidents transitions belong to: plain,
//! serializable records (stored with every transition, shown on the route page).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::baseline::{LatencyRef, TpsRef};
use super::classify::Signal;
use super::{FailureMode, Reason, State};
use crate::probe::outcome::{OutcomeKind, ProbeOutcome};
use crate::route::RouteId;

/// The outcome an observation came from, as evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    pub kind: OutcomeKind,
    pub started_at: DateTime<Utc>,
    pub success: bool,
    pub verified: Option<bool>,
    pub total_ms: f64,
    pub ttft_ms: Option<f64>,
    pub tokens_per_second: Option<f64>,
    pub http_status: Option<u16>,
    /// `ProbeError::kind`.
    pub error: Option<String>,
}

impl Observed {
    pub(crate) fn of(o: &ProbeOutcome) -> Self {
        Self {
            kind: o.kind,
            started_at: o.started_at,
            success: o.success,
            verified: o.verified,
            total_ms: o.total_ms,
            ttft_ms: o.ttft_ms,
            tokens_per_second: o.tokens_per_second,
            http_status: o.http_status,
            error: o.error.as_ref().map(|e| e.kind().to_owned()),
        }
    }
}

/// One threshold a rule compared against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    /// `latency_ms`, `tokens_per_second`, `error_rate`, `consecutive_abnormal`,
    /// `error_rate_high_for_s`, `degraded_for_s`, `normal_for_s`, `recover_error_rate`.
    pub name: String,
    pub observed: f64,
    pub limit: f64,
}

/// The error-rate window at the time of a transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRateEvidence {
    pub window_s: u64,
    pub total: u32,
    pub failures: u32,
    pub rate: f64,
    pub fast_window_s: u64,
    pub fast_total: u32,
    pub fast_failures: u32,
    pub above_since: Option<DateTime<Utc>>,
}

/// Everything a transition was decided on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// The outcome that triggered it (`None` for a tick).
    pub observed: Option<Observed>,
    pub signals: Vec<Signal>,
    /// The latency baseline used (bucket, mean, stddev, samples, threshold).
    pub baseline: Option<LatencyRef>,
    pub tps_baseline: Option<TpsRef>,
    pub thresholds: Vec<Threshold>,
    pub error_rate: ErrorRateEvidence,
    pub consecutive_abnormal: u32,
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
    /// The first [`super::detector::MAX_INCIDENT_TRANSITIONS`] transitions, then the closing one.
    pub transitions: Vec<Transition>,
}
