//! Bookkeeping tables: `heartbeats` (last sign of life per scheduled job), `probe_skips`
//! (probes skipped because the previous one overran), `store_meta`, and retention.

use super::sql::{params, Connection};
use chrono::{DateTime, Utc};
use std::time::{Duration, Instant};

use super::rollups::Granularity;
use super::{from_ms, to_ms, Reader, StoreError};
use crate::outcome::OutcomeKind;
use crate::route::RouteId;

pub(crate) fn insert_skip(
    conn: &Connection,
    route_id: i64,
    kind: OutcomeKind,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    conn.prepare_cached("INSERT INTO probe_skips (route_id, kind, at_ms) VALUES (?1, ?2, ?3)")?
        .execute(params![route_id, kind.as_str(), to_ms(at)])?;
    Ok(())
}

pub(crate) fn upsert_heartbeat(
    conn: &Connection,
    job: &str,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO heartbeats (job, at_ms) VALUES (?1, ?2)
         ON CONFLICT (job) DO UPDATE SET at_ms = excluded.at_ms",
    )?
    .execute(params![job, to_ms(at)])?;
    Ok(())
}

/// The write half of `check_writable`: a real row update through the writer.
pub(crate) fn touch_meta(conn: &Connection, key: &str, value: &str) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO store_meta (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![key, value])?;
    Ok(())
}

/// What one retention step deletes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Outcomes,
    Skips,
    Rollups(Granularity),
    /// Regression set runs (`store/drift.rs`), kept as long as raw outcomes.
    DriftRuns,
    /// Metered proxy requests (`store/requests.rs`), kept as long as raw outcomes.
    ProxyRequests,
}

impl Target {
    pub const ALL: [Target; 7] = [
        Target::Outcomes,
        Target::Skips,
        Target::DriftRuns,
        Target::ProxyRequests,
        Target::Rollups(Granularity::FiveMinutes),
        Target::Rollups(Granularity::Hour),
        Target::Rollups(Granularity::Day),
    ];
}

/// Deletes the oldest rows of `table` (at most `limit`, and for at most [`STEP_TIME`]) whose
/// `time_col` is before `cutoff_ms`: their ids read in the order of the time column's index, then each deleted by
/// its primary key. Not `DELETE … WHERE id IN (SELECT …)`: how the planner runs that depends
/// on its statistics, and statistics gathered while the table was nearly empty (a fresh
/// database's `PRAGMA optimize`) had it scan a table of 100 million outcomes for every step
/// while every other write waited for the lock.
pub(crate) fn delete_oldest(
    conn: &Connection,
    table: &str,
    time_col: &str,
    cutoff_ms: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let ids = conn
        .prepare_cached(&format!(
            "SELECT id FROM {table} WHERE {time_col} < ?1 ORDER BY {time_col} LIMIT ?2"
        ))?
        .query_map(params![cutoff_ms, limit], |r| r.get::<_, i64>(0))?
        .collect::<Result<Vec<i64>, _>>()?;
    let mut delete = conn.prepare_cached(&format!("DELETE FROM {table} WHERE id = ?1"))?;
    let started = Instant::now();
    let mut n = 0;
    for id in ids {
        n += delete.execute(params![id])?;
        if started.elapsed() >= STEP_TIME {
            break;
        }
    }
    Ok(n as u64)
}

/// How long one step of [`delete_oldest`] deletes at most (it deletes one row whatever the
/// time). Steps are bounded by time as well as by rows because a row's cost is not bounded:
/// when the old rows' pages are not cached (a database larger than the page cache, a reader
/// scanning history beside it) one delete took tens of milliseconds, a 1,000-row step
/// twenty seconds, and the outcomes waiting behind each step got one transaction of 512 per
/// step — 25 a second committed of the 333 a second probed.
pub(crate) const STEP_TIME: Duration = Duration::from_millis(100);

/// Deletes up to `limit` rows of `target` older than `cutoff_ms`, oldest first (by key, see
/// [`delete_oldest`]).
pub(crate) fn delete_old(
    conn: &Connection,
    target: Target,
    cutoff_ms: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let n = match target {
        Target::Outcomes => {
            // Raw rows first (stragglers of packed hours, the hours not yet packed), then
            // the packed hours that have wholly expired.
            let n = super::outcome_days::delete_old(conn, cutoff_ms, limit as usize)?;
            if n > 0 {
                return Ok(n);
            }
            return super::outcome_hours::delete_old(conn, cutoff_ms, limit as usize);
        }
        Target::Skips => {
            return delete_oldest(conn, "probe_skips", "at_ms", cutoff_ms, limit as usize)
        }
        Target::Rollups(g) => {
            let keys = conn
                .prepare_cached(
                    "SELECT bucket_start_ms, route_id, kind FROM rollups
                     WHERE granularity_s = ?1 AND bucket_start_ms < ?2
                     ORDER BY bucket_start_ms LIMIT ?3",
                )?
                .query_map(params![g.seconds(), cutoff_ms, limit], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut delete = conn.prepare_cached(
                "DELETE FROM rollups WHERE granularity_s = ?1 AND bucket_start_ms = ?2
                     AND route_id = ?3 AND kind = ?4",
            )?;
            let mut n = 0;
            for (start, route, kind) in keys {
                n += delete.execute(params![g.seconds(), start, route, kind])?;
            }
            n
        }
        Target::DriftRuns => return super::drift::delete_old(conn, cutoff_ms, limit as usize),
        Target::ProxyRequests => {
            return super::requests::delete_old(conn, cutoff_ms, limit as usize)
        }
    };
    Ok(n as u64)
}

/// What a retention run deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Raw outcomes older than `retention_days`.
    pub outcomes: u64,
    /// Skipped-probe records older than `retention_days`.
    pub skips: u64,
    /// 5-minute rollups older than 48 h.
    pub rollups_five_minutes: u64,
    /// Regression set runs older than `retention_days`.
    pub drift_runs: u64,
    /// Metered proxy requests older than `retention_days`.
    pub proxy_requests: u64,
    /// Hourly rollups older than `rollup_retention_days`.
    pub rollups_hour: u64,
    /// Daily rollups older than `rollup_retention_days`.
    pub rollups_day: u64,
    /// Delete steps taken; each is a small part of one writer transaction.
    pub steps: u64,
}

impl RetentionReport {
    pub(crate) fn add(&mut self, target: Target, n: u64) {
        let slot = match target {
            Target::Outcomes => &mut self.outcomes,
            Target::Skips => &mut self.skips,
            Target::Rollups(Granularity::FiveMinutes) => &mut self.rollups_five_minutes,
            Target::Rollups(Granularity::Hour) => &mut self.rollups_hour,
            Target::Rollups(Granularity::Day) => &mut self.rollups_day,
            Target::DriftRuns => &mut self.drift_runs,
            Target::ProxyRequests => &mut self.proxy_requests,
        };
        *slot += n;
        self.steps += 1;
    }

    pub fn total(&self) -> u64 {
        self.outcomes
            + self.skips
            + self.rollups_five_minutes
            + self.rollups_hour
            + self.rollups_day
            + self.drift_runs
            + self.proxy_requests
    }
}

impl Reader {
    /// Every job's last heartbeat, by job name.
    pub fn heartbeats(&self) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT job, at_ms FROM heartbeats ORDER BY job")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (job, at) = row?;
            out.push((job, from_ms(at)?));
        }
        Ok(out)
    }

    /// A `store_meta` value (set with [`super::Writer::set_meta`]); `None` when never set.
    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        use super::sql::OptionalExtension;
        Ok(self
            .conn
            .prepare_cached("SELECT value FROM store_meta WHERE key = ?1")?
            .query_row(params![key], |r| r.get(0))
            .optional()?)
    }

    /// How many probes of the route were skipped (overruns) at or after `since`.
    pub fn skips(&self, route: &RouteId, since: DateTime<Utc>) -> Result<u64, StoreError> {
        let Some(id) = self.route_id(route)? else {
            return Ok(0);
        };
        let n: i64 = self
            .conn
            .prepare_cached("SELECT count(*) FROM probe_skips WHERE route_id = ?1 AND at_ms >= ?2")?
            .query_row(params![id, to_ms(since)], |r| r.get(0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}
