//! Capability probes (`migrations/*/0026_capabilities.sql`): one row per probe of a route's
//! declared `tools` or `json_schema` capability, or of its long prompt (`long_prompt`, the
//! latency its time to first token), kept as long as raw outcomes. Writes go
//! through the writer thread ([`Writer::capability`]); reads are [`Reader`] methods.

use chrono::{DateTime, Utc};

use super::sql::params;
use super::writer::{Ack, Command, Queued};
use super::{from_ms, to_ms, Reader, StoreError, Writer};

/// The most rows one write deletes past retention, so a long backlog is trimmed over many
/// writes instead of one long transaction.
const RETENTION_STEP: usize = 500;

/// One capability probe's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityRow {
    /// `provider/region/model`.
    pub route: String,
    /// `tools`, `json_schema` or `long_prompt`.
    pub capability: String,
    /// When the probe started.
    pub at: DateTime<Utc>,
    pub ok: bool,
    pub latency_ms: u64,
    /// Why it failed (short); `None` when it succeeded. A long prompt answered correctly but
    /// slowly is `ok` with a note here, and does not count towards its baseline.
    pub error: Option<String>,
}

/// Success counts of one route's capability over a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityTally {
    pub route: String,
    pub capability: String,
    pub ok: u64,
    pub total: u64,
}

/// A write to the capability table.
#[derive(Debug, Clone)]
pub struct CapabilityOp {
    pub row: CapabilityRow,
    /// Rows that started before it are deleted, one bounded step per write.
    pub keep_since: DateTime<Utc>,
}

pub(crate) fn apply(conn: &super::sql::Connection, op: &CapabilityOp) -> Result<u64, StoreError> {
    let r = &op.row;
    let n = conn
        .prepare_cached(
            "INSERT INTO capability_results (route, capability, at_ms, ok, latency_ms, error)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            r.route,
            r.capability,
            to_ms(r.at),
            i64::from(r.ok),
            i64::try_from(r.latency_ms).unwrap_or(i64::MAX),
            r.error
        ])?;
    let trimmed = super::jobs::delete_oldest(
        conn,
        "capability_results",
        "at_ms",
        to_ms(op.keep_since),
        RETENTION_STEP,
    )?;
    Ok(u64::try_from(n).unwrap_or(0) + trimmed)
}

impl Writer {
    /// Stores one capability probe's result and trims past retention; resolves after COMMIT.
    pub async fn capability(&self, op: CapabilityOp) -> Result<u64, StoreError> {
        self.request(|ack: Ack<u64>| Command::Capability { op, ack })
            .await
    }

    /// [`Writer::capability`], resolving once queued: later writes commit after it.
    pub async fn queue_capability(&self, op: CapabilityOp) -> Result<Queued<u64>, StoreError> {
        self.queue(|ack: Ack<u64>| Command::Capability { op, ack })
            .await
    }
}

impl Reader {
    /// The latest result of every route's every probed capability, by route then capability.
    pub fn capability_latest(&self) -> Result<Vec<CapabilityRow>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT c.route, c.capability, c.at_ms, c.ok, c.latency_ms, c.error
             FROM capability_results c
             JOIN (SELECT MAX(id) AS id FROM capability_results GROUP BY route, capability) l
               ON c.id = l.id
             ORDER BY c.route, c.capability",
        )?;
        let rows = stmt.query_map(params![], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, Option<String>>(5)?,
            ))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (route, capability, at, ok, latency, error) = r?;
            out.push(CapabilityRow {
                route,
                capability,
                at: from_ms(at)?,
                ok: ok != 0,
                latency_ms: u64::try_from(latency).unwrap_or(0),
                error,
            });
        }
        Ok(out)
    }

    /// Successes and probes per route and capability since `since`, by route then capability.
    pub fn capability_tallies(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<CapabilityTally>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT route, capability, CAST(SUM(ok) AS BIGINT), COUNT(*)
             FROM capability_results WHERE at_ms >= ?1
             GROUP BY route, capability ORDER BY route, capability",
        )?;
        let rows = stmt.query_map(params![to_ms(since)], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (route, capability, ok, total) = r?;
            out.push(CapabilityTally {
                route,
                capability,
                ok: u64::try_from(ok).unwrap_or(0),
                total: u64::try_from(total).unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// The latencies of the last `n` good results (`ok` and no error note) of `capability` on
    /// every route, oldest first, by route: the long-prompt probe's TTFT baseline.
    pub fn capability_recent_good(
        &self,
        capability: &str,
        n: usize,
    ) -> Result<Vec<(String, Vec<u64>)>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT route, latency_ms FROM
                 (SELECT route, latency_ms, at_ms, ROW_NUMBER() OVER
                      (PARTITION BY route ORDER BY at_ms DESC, id DESC) AS k
                  FROM capability_results
                  WHERE capability = ?1 AND ok = 1 AND error IS NULL) t
             WHERE k <= ?2 ORDER BY route, at_ms",
        )?;
        let rows = stmt.query_map(
            params![capability, i64::try_from(n).unwrap_or(i64::MAX)],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
        )?;
        let mut out: Vec<(String, Vec<u64>)> = Vec::new();
        for r in rows {
            let (route, latency) = r?;
            let latency = u64::try_from(latency).unwrap_or(0);
            match out.last_mut() {
                Some((last, v)) if *last == route => v.push(latency),
                _ => out.push((route, vec![latency])),
            }
        }
        Ok(out)
    }
}
