//! The `vantage_outcomes` table: outcomes measured at remote vantages, each stored once by
//! its agent-made `uid` (a resend is a duplicate, not a second row). Kept apart from
//! `outcomes` so the monitor's own charts, rollups and baselines stay its own vantage's.

use super::sql::{params, Connection};
use chrono::{DateTime, Utc};

use super::outcomes::{from_row, validate, COLUMNS};
use super::writer::Command;
use super::{to_ms, Reader, StoreError, Writer};
use crate::outcome::ProbeError;
use crate::route::RouteId;
use crate::vantage::VantageOutcome;

/// Old rows deleted per write at most: retention keeps pace with ingest without ever holding
/// the write lock for a long delete.
const RETENTION_STEP: usize = 500;

/// What one [`Writer::record_vantage`] did: per item, in order, whether it was new (false:
/// the store already had its id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VantageWrite {
    pub new: Vec<bool>,
}

impl VantageWrite {
    pub fn inserted(&self) -> usize {
        self.new.iter().filter(|n| **n).count()
    }
    pub fn duplicates(&self) -> usize {
        self.new.len() - self.inserted()
    }
}

/// Inserts one outcome unless its uid is stored; answers whether it was new.
pub(super) fn insert(
    conn: &Connection,
    route_id: i64,
    v: &VantageOutcome,
    received_at: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let o = &v.outcome;
    let err = o.error.as_ref();
    let n = conn
        .prepare_cached(
            "INSERT INTO vantage_outcomes (uid, vantage, route_id, received_at_ms, kind,
                 started_at_ms, success, verified, ttfb_ms, ttft_ms, total_ms, output_tokens,
                 tokens_estimated, tokens_per_second, model_reported, system_fingerprint,
                 http_status, error_kind, error_status, error_message, retry_after_ms, answer,
                 first_answer_ms, max_tokens_exhausted)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                     ?18, ?19, ?20, ?21, ?22, ?23, ?24)
             ON CONFLICT (uid) DO NOTHING",
        )?
        .execute(params![
            v.id,
            v.vantage,
            route_id,
            to_ms(received_at),
            o.kind.as_str(),
            to_ms(o.started_at),
            o.success,
            o.verified,
            o.ttfb_ms,
            o.ttft_ms,
            o.total_ms,
            o.output_tokens,
            o.tokens_estimated,
            o.tokens_per_second,
            o.model_reported,
            o.system_fingerprint,
            o.http_status,
            err.map(ProbeError::kind),
            err.and_then(ProbeError::status),
            err.and_then(ProbeError::message),
            err.and_then(ProbeError::retry_after_ms)
                .map(|v| i64::try_from(v).unwrap_or(i64::MAX)),
            o.answer,
            o.first_answer_ms,
            o.max_tokens_exhausted,
        ])?;
    Ok(n == 1)
}

/// Deletes at most [`RETENTION_STEP`] rows that started before `cutoff_ms`.
pub(super) fn delete_old(conn: &Connection, cutoff_ms: i64) -> Result<u64, StoreError> {
    super::jobs::delete_oldest(
        conn,
        "vantage_outcomes",
        "started_at_ms",
        cutoff_ms,
        RETENTION_STEP,
    )
}

impl Writer {
    /// Stores remote outcomes in one transaction, each uid once, and trims rows that started
    /// before `keep_since` by one bounded step. Resolves after COMMIT.
    pub async fn record_vantage(
        &self,
        items: Vec<VantageOutcome>,
        now: DateTime<Utc>,
        keep_since: DateTime<Utc>,
    ) -> Result<VantageWrite, StoreError> {
        for v in &items {
            validate(&v.outcome)?;
        }
        if items.is_empty() {
            return Ok(VantageWrite::default());
        }
        let new = self
            .request(|ack| Command::Vantage {
                items,
                now,
                cutoff_ms: to_ms(keep_since),
                ack,
            })
            .await?;
        Ok(VantageWrite { new })
    }
}

impl Reader {
    /// `vantage`'s outcomes of `route` that started at or after `since`, oldest first (its
    /// baselines at start).
    pub fn vantage_outcomes_since(
        &self,
        route: &RouteId,
        vantage: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<crate::outcome::ProbeOutcome>, StoreError> {
        let Some(id) = self.route_id(route)? else {
            return Ok(Vec::new());
        };
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM vantage_outcomes
             WHERE route_id = ?1 AND vantage = ?2 AND started_at_ms >= ?3
             ORDER BY started_at_ms, id"
        ))?;
        let rows = stmt.query_map(params![id, vantage, to_ms(since)], |r| from_row(route, r))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row??);
        }
        Ok(out)
    }

    /// The route's remote outcomes since `since`, newest first, at most `limit`, each with its
    /// vantage (the route page's per-vantage figures).
    pub fn recent_vantage_outcomes(
        &self,
        route: &RouteId,
        since: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<(String, crate::outcome::ProbeOutcome)>, StoreError> {
        let Some(id) = self.route_id(route)? else {
            return Ok(Vec::new());
        };
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS}, vantage FROM vantage_outcomes
             WHERE route_id = ?1 AND started_at_ms >= ?2
             ORDER BY started_at_ms DESC, id DESC LIMIT ?3"
        ))?;
        let rows = stmt.query_map(
            params![id, to_ms(since), i64::try_from(limit).unwrap_or(i64::MAX)],
            |r| {
                let vantage: String = r.get(20)?;
                Ok(from_row(route, r)?.map(|o| (vantage, o)))
            },
        )?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row??);
        }
        Ok(out)
    }

    /// How many remote outcomes the store holds (tests and figures).
    pub fn vantage_outcome_count(&self) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn
            .query_row("SELECT COUNT(*) FROM vantage_outcomes", [], |r| r.get(0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Distinct uids stored (equal to [`Reader::vantage_outcome_count`]: the unique index).
    pub fn vantage_outcome_uids(&self, vantage: &str) -> Result<Vec<String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT uid FROM vantage_outcomes WHERE vantage = ?1 ORDER BY id")?;
        let rows = stmt.query_map([vantage], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
