//! What the switch controller publishes: the current phase of every model with the budget
//! ([`SwitchStatus`], on a `watch` channel for the status page, `/metrics` and
//! `GET /api/v1/switches`).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::watch;

use super::{Machine, Phase};
use crate::extra_cost::{ExtraCost, ExtraCostSnapshot};
use crate::route::RouteId;

/// One model's phase as published.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSwitch {
    pub serves: String,
    pub primaries: Vec<RouteId>,
    #[serde(flatten)]
    pub phase: Phase,
    pub dwell_until: Option<DateTime<Utc>>,
    pub switches_last_hour: usize,
}

/// What `GET /api/v1/switches` and the status page show now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwitchStatus {
    pub generated_at: DateTime<Utc>,
    pub models: Vec<ModelSwitch>,
    pub budget: ExtraCostSnapshot,
}

pub type SwitchRx = watch::Receiver<Arc<SwitchStatus>>;

pub(super) fn status_of(
    machines: &[Machine],
    budget: &ExtraCost,
    now: DateTime<Utc>,
) -> SwitchStatus {
    SwitchStatus {
        generated_at: now,
        models: machines
            .iter()
            .map(|m| ModelSwitch {
                serves: m.serves.clone(),
                primaries: m.primaries.clone(),
                phase: m.phase.clone(),
                dwell_until: m.dwell_until,
                switches_last_hour: m.switches_last_hour(now),
            })
            .collect(),
        budget: budget.snapshot(),
    }
}
