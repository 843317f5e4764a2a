//! The writer's upkeep runs: retention and packing, each a loop of bounded steps sent as
//! commands, so that queued writes take their turn between steps.

use chrono::{DateTime, Utc};

use super::{Command, Writer};
use crate::store::jobs::{RetentionReport, Target};
use crate::store::outcome_hours;
use crate::store::rollups::Granularity;
use crate::store::{to_ms, StoreError};

/// Rows deleted per retention step at most (raw rows: also at most 100 ms of deleting). Each
/// step is one command, so queued inserts get their turn between steps and the write lock is
/// never held for a long delete.
pub const RETENTION_BATCH: usize = 1000;

/// Route-hours one packing step packs at most (about 120 raw rows each at a 30 s interval).
const PACK_BATCH: usize = 32;

/// 5-minute rollups serve 24 h charts; two days is plenty.
const FIVE_MINUTE_RETENTION: chrono::Duration = chrono::Duration::hours(48);

impl Writer {
    /// Deletes raw outcomes and skips older than `retention_days`, 5-minute rollups older than
    /// 48 h, hourly and daily rollups older than `rollup_retention_days` — in steps of at most
    /// [`RETENTION_BATCH`] rows, other writes interleaving between steps, until a step finds
    /// nothing left.
    pub async fn retention(
        &self,
        now: DateTime<Utc>,
        retention_days: u32,
        rollup_retention_days: u32,
    ) -> Result<RetentionReport, StoreError> {
        self.retention_batched(now, retention_days, rollup_retention_days, RETENTION_BATCH)
            .await
    }

    /// [`Writer::retention`] with a chosen step size (tests use tiny steps).
    #[doc(hidden)]
    pub async fn retention_batched(
        &self,
        now: DateTime<Utc>,
        retention_days: u32,
        rollup_retention_days: u32,
        batch: usize,
    ) -> Result<RetentionReport, StoreError> {
        let batch = batch.max(1);
        let raw_cutoff = to_ms(now - chrono::Duration::days(retention_days.into()));
        let rollup_cutoff = to_ms(now - chrono::Duration::days(rollup_retention_days.into()));
        let mut report = RetentionReport::default();
        for target in Target::ALL {
            let cutoff_ms = match target {
                Target::Outcomes | Target::Skips | Target::DriftRuns | Target::ProxyRequests => {
                    raw_cutoff
                }
                Target::Rollups(Granularity::FiveMinutes) => to_ms(now - FIVE_MINUTE_RETENTION),
                Target::Rollups(_) => rollup_cutoff,
            };
            loop {
                let n = self
                    .request(|ack| Command::Retention {
                        target,
                        cutoff_ms,
                        limit: batch,
                        ack,
                    })
                    .await?;
                report.add(target, n);
                // A step may stop short of `batch` for time: only an empty one says "done".
                if n == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        Ok(report)
    }

    /// Packs every route's raw outcomes of the hours over for [`outcome_hours::PACK_AFTER_MS`]
    /// into one row per route and hour, in steps of at most
    /// [`PACK_BATCH`] route-hours with other writes between them. Answers the rows packed.
    pub async fn pack(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let before_ms = outcome_hours::pack_before(to_ms(now));
        let mut packed = 0;
        for first in std::iter::once(true).chain(std::iter::repeat(false)) {
            let n = self
                .request(|ack| Command::Pack {
                    before_ms,
                    limit: PACK_BATCH,
                    first,
                    ack,
                })
                .await?;
            if n == 0 {
                break;
            }
            packed += n;
            tokio::task::yield_now().await;
        }
        Ok(packed)
    }
}
