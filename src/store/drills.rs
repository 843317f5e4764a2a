//! The `drills` table (`migrations/*/0009_drills.sql`) and the reads behind a drill's report:
//! proxy requests of its model, probe outcomes of a route, regression set runs — each over
//! the drill's window, aggregated in SQL (bounded however long the drill).

use std::collections::BTreeMap;

use super::sql::{params, Connection, OptionalExtension, Row};
use chrono::{DateTime, Utc};

use super::writer::{Ack, Command};
use super::{from_ms, to_ms, Reader, StoreError, Writer};
use crate::outcome::OutcomeKind;
use crate::records::drill::{Drill, EndedBy};
use crate::route::RouteId;

/// Success latencies read per route and window at most (the newest); percentiles of more
/// are not more true.
pub const MAX_LATENCIES: usize = 20_000;

/// A write to the `drills` table.
#[derive(Debug, Clone)]
pub enum DrillOp {
    /// Inserts a drill (its `id` is ignored); answers the new id. Fails on a second active
    /// drill for the same route (a unique index).
    Start(Box<Drill>),
    /// Ends an active drill; answers 1, or 0 when it had already ended.
    End {
        id: i64,
        at: DateTime<Utc>,
        by: EndedBy,
        who: Option<String>,
    },
    /// Replaces the routes that took the drill's traffic.
    Receivers { id: i64, routes: Vec<RouteId> },
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Invalid(format!("drill: {e}")))
}

pub(crate) fn apply(conn: &Connection, op: &DrillOp) -> Result<u64, StoreError> {
    match op {
        DrillOp::Start(d) => {
            let id = conn
                .prepare_cached(
                    "INSERT INTO drills (route, serves, target_weight, ramp, reason, started_by,
                     forced, started_at_ms, ends_at_ms, receivers)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) RETURNING id",
                )?
                .query_row(
                    params![
                        d.route.as_str(),
                        d.serves,
                        d.weight,
                        json(&d.ramp)?,
                        d.reason,
                        d.started_by,
                        d.forced,
                        to_ms(d.started_at),
                        to_ms(d.ends_at),
                        json(&d.receivers)?,
                    ],
                    |r| r.get::<_, i64>(0),
                )?;
            Ok(u64::try_from(id).unwrap_or(0))
        }
        DrillOp::End { id, at, by, who } => {
            let n = conn
                .prepare_cached(
                    "UPDATE drills SET ended_at_ms = ?2, ended_by = ?3, stopped_by = ?4
                     WHERE id = ?1 AND ended_at_ms IS NULL",
                )?
                .execute(params![id, to_ms(*at), by.as_str(), who])?;
            Ok(n as u64)
        }
        DrillOp::Receivers { id, routes } => {
            let n = conn
                .prepare_cached("UPDATE drills SET receivers = ?2 WHERE id = ?1")?
                .execute(params![id, json(routes)?])?;
            Ok(n as u64)
        }
    }
}

impl Writer {
    /// One write to the `drills` table; resolves after COMMIT with the op's answer.
    pub async fn drill(&self, op: DrillOp) -> Result<u64, StoreError> {
        self.request(|ack: Ack<u64>| Command::Drill { op, ack })
            .await
    }
}

const COLUMNS: &str = "id, route, serves, target_weight, ramp, reason, started_by, forced,
    started_at_ms, ends_at_ms, ended_at_ms, ended_by, stopped_by, receivers";

fn read(r: &Row<'_>) -> super::sql::Result<RawDrill> {
    Ok(RawDrill {
        id: r.get(0)?,
        route: r.get(1)?,
        serves: r.get(2)?,
        weight: r.get(3)?,
        ramp: r.get(4)?,
        reason: r.get(5)?,
        started_by: r.get(6)?,
        forced: r.get(7)?,
        started_at: r.get(8)?,
        ends_at: r.get(9)?,
        ended_at: r.get(10)?,
        ended_by: r.get(11)?,
        stopped_by: r.get(12)?,
        receivers: r.get(13)?,
    })
}

struct RawDrill {
    id: i64,
    route: String,
    serves: String,
    weight: u8,
    ramp: String,
    reason: String,
    started_by: Option<String>,
    forced: bool,
    started_at: i64,
    ends_at: i64,
    ended_at: Option<i64>,
    ended_by: Option<String>,
    stopped_by: Option<String>,
    receivers: String,
}

impl RawDrill {
    fn parse(self) -> Result<Drill, StoreError> {
        let corrupt = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::Corrupt(format!("drill {} {what}: {e}", self.id))
        };
        Ok(Drill {
            id: self.id,
            route: RouteId::parse(&self.route).ok_or_else(|| corrupt("route", &self.route))?,
            serves: self.serves.clone(),
            weight: self.weight,
            ramp: serde_json::from_str(&self.ramp).map_err(|e| corrupt("ramp", &e))?,
            reason: self.reason.clone(),
            started_by: self.started_by.clone(),
            forced: self.forced,
            started_at: from_ms(self.started_at)?,
            ends_at: from_ms(self.ends_at)?,
            ended_at: self.ended_at.map(from_ms).transpose()?,
            ended_by: match &self.ended_by {
                None => None,
                Some(s) => Some(EndedBy::parse(s).ok_or_else(|| corrupt("ended_by", s))?),
            },
            stopped_by: self.stopped_by.clone(),
            receivers: serde_json::from_str(&self.receivers)
                .map_err(|e| corrupt("receivers", &e))?,
        })
    }
}

/// The proxy's requests for one model over a window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFigures {
    pub total: u64,
    /// `outcome = 'ok'`.
    pub ok: u64,
    /// Rows with a `fallback_reason`.
    pub fallbacks: u64,
    /// Rows by `contract` (the degradation contract behaviour that answered).
    pub contracts: BTreeMap<String, u64>,
    /// Rows by the route that answered (or was tried last).
    pub by_route: BTreeMap<String, u64>,
}

/// One route's outcomes of some kinds over a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutcomeFigures {
    pub total: u64,
    pub successes: u64,
    /// Answers that came back but were wrong (`verified` false).
    pub validation_failures: u64,
    /// Success latencies (ms), newest first, at most [`MAX_LATENCIES`].
    pub latencies_ms: Vec<f64>,
}

/// Regression set runs of one set on one route over a window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunTotals {
    pub runs: u64,
    pub passed: u64,
    pub answered: u64,
    pub cases: u64,
}

impl Reader {
    /// The latest `limit` drills, newest first.
    pub fn drills(&self, limit: usize) -> Result<Vec<Drill>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM drills ORDER BY started_at_ms DESC, id DESC LIMIT ?1"
        ))?;
        let rows = stmt.query_map([i64::try_from(limit).unwrap_or(i64::MAX)], read)?;
        rows.map(|r| r?.parse()).collect()
    }

    /// Drills not ended, oldest first.
    pub fn active_drills(&self) -> Result<Vec<Drill>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM drills WHERE ended_at_ms IS NULL ORDER BY started_at_ms, id"
        ))?;
        let rows = stmt.query_map([], read)?;
        rows.map(|r| r?.parse()).collect()
    }

    pub fn drill(&self, id: i64) -> Result<Option<Drill>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM drills WHERE id = ?1"))?;
        stmt.query_row([id], read)
            .optional()?
            .map(RawDrill::parse)
            .transpose()
    }

    /// The proxy's requests for `serves` that started in `[from, to)`.
    pub fn drill_requests(
        &self,
        serves: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<RequestFigures, StoreError> {
        let mut out = RequestFigures::default();
        let mut stmt = self.conn.prepare_cached(
            "SELECT COUNT(*), CAST(COALESCE(SUM(CASE WHEN outcome = 'ok' THEN 1 ELSE 0 END), 0) AS BIGINT),
                    CAST(COALESCE(SUM(CASE WHEN fallback_reason IS NOT NULL THEN 1 ELSE 0 END), 0)
                        AS BIGINT)
             FROM proxy_requests WHERE serves = ?1 AND started_at_ms >= ?2 AND started_at_ms < ?3",
        )?;
        let window = params![serves, to_ms(from), to_ms(to)];
        let (total, ok, fallbacks): (i64, i64, i64) =
            stmt.query_row(window, |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        out.total = total as u64;
        out.ok = ok as u64;
        out.fallbacks = fallbacks as u64;
        for (column, into) in [
            ("contract", &mut out.contracts),
            ("route", &mut out.by_route),
        ] {
            let mut stmt = self.conn.prepare_cached(&format!(
                "SELECT {column}, COUNT(*) FROM proxy_requests
                 WHERE serves = ?1 AND started_at_ms >= ?2 AND started_at_ms < ?3
                     AND {column} IS NOT NULL
                 GROUP BY {column}"
            ))?;
            let rows = stmt.query_map(window, |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })?;
            for row in rows {
                let (k, n) = row?;
                into.insert(k, n as u64);
            }
        }
        Ok(out)
    }

    /// `route`'s outcomes of `kind` that started in `[from, to)` (raw rows and packed hours).
    pub fn drill_outcomes(
        &self,
        route: &RouteId,
        kind: OutcomeKind,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<OutcomeFigures, StoreError> {
        let all = self.outcomes_between(route, from, to, &[kind])?;
        let successes = all.iter().filter(|o| o.success);
        Ok(OutcomeFigures {
            total: all.len() as u64,
            successes: successes.clone().count() as u64,
            validation_failures: all.iter().filter(|o| o.verified == Some(false)).count() as u64,
            latencies_ms: successes
                .rev()
                .take(MAX_LATENCIES)
                .map(|o| o.total_ms)
                .collect(),
        })
    }

    /// `route`'s regression set runs that started in `[from, to)`, by set.
    pub fn drift_run_totals(
        &self,
        route: &RouteId,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<BTreeMap<String, RunTotals>, StoreError> {
        let Some(id) = self.route_id(route)? else {
            return Ok(BTreeMap::new());
        };
        let mut stmt = self.conn.prepare_cached(
            "SELECT set_name, COUNT(*), CAST(SUM(passed) AS BIGINT),
                    CAST(SUM(answered) AS BIGINT), CAST(SUM(cases) AS BIGINT) FROM drift_runs
             WHERE route_id = ?1 AND started_at_ms >= ?2 AND started_at_ms < ?3
             GROUP BY set_name",
        )?;
        let rows = stmt.query_map(params![id, to_ms(from), to_ms(to)], |r| {
            Ok((
                r.get::<_, String>(0)?,
                RunTotals {
                    runs: r.get::<_, i64>(1)? as u64,
                    passed: r.get::<_, i64>(2)? as u64,
                    answered: r.get::<_, i64>(3)? as u64,
                    cases: r.get::<_, i64>(4)? as u64,
                },
            ))
        })?;
        rows.map(|r| r.map_err(StoreError::from)).collect()
    }
}
