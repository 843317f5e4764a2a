//! What the switch controller publishes: the current phase of every model with the budget
//! ([`SwitchStatus`], on a `watch` channel for the status page and `/metrics`), and the body of
//! `GET /api/v1/switches` ([`list`]: that status plus the stored records, newest first).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::watch;

use super::{Machine, Phase, SwitchRecord};
use crate::budget::{Budget, BudgetSnapshot};
use crate::route::RouteId;
use crate::store::{Store, StoreError};

/// Records listed when the caller names no `limit`.
pub const DEFAULT_LIMIT: usize = 100;
/// The most records one list returns, whatever `limit` says.
pub const MAX_LIMIT: usize = 1000;

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
    pub budget: BudgetSnapshot,
}

pub type SwitchRx = watch::Receiver<Arc<SwitchStatus>>;

pub(super) fn status_of(machines: &[Machine], budget: &Budget, now: DateTime<Utc>) -> SwitchStatus {
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

/// The body of `GET /api/v1/switches`: `{generated_at, models:[{serves, primaries, phase,
/// backup?, since?, stage?, ratio?, dwell_until, switches_last_hour}], budget:{…},
/// records:[…newest first]}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwitchList {
    #[serde(flatten)]
    pub status: SwitchStatus,
    /// Newest first.
    pub records: Vec<SwitchRecord>,
}

/// The list for `GET /api/v1/switches?limit=N`: the current status and the last `limit`
/// records ([`DEFAULT_LIMIT`] when `None`, clamped to `1..=`[`MAX_LIMIT`]). Reads the store on
/// its own connection and blocks: call it from `spawn_blocking`.
pub fn list(
    status: &SwitchRx,
    store: &Store,
    limit: Option<usize>,
) -> Result<SwitchList, StoreError> {
    let limit = limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let records = store.reader()?.switch_records(limit)?;
    let status = (**status.borrow()).clone();
    Ok(SwitchList { status, records })
}
