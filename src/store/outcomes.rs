//! The `routes` and `outcomes` tables: one raw row per outcome, every field of
//! [`ProbeOutcome`]. `started_at` is kept at millisecond precision.

use super::sql::{params, value_tuples, Connection, Engine, OptionalExtension, Row, ValueRef};
use chrono::{DateTime, Utc};

use super::{from_ms, kind_filter_sql, outcome_hours, parse_kind, to_ms, Reader, StoreError};
use crate::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use crate::route::RouteId;

pub(crate) fn lookup_route(conn: &Connection, route: &RouteId) -> Result<Option<i64>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT id FROM routes WHERE name = ?1")?
        .query_row([route.as_str()], |r| r.get(0))
        .optional()?)
}

/// The route's id, inserting it on first sight (writer connection only).
pub(crate) fn intern_route(conn: &Connection, route: &RouteId) -> Result<i64, StoreError> {
    if let Some(id) = lookup_route(conn, route)? {
        return Ok(id);
    }
    // Another process on the same database may intern it first: then look it up again.
    let inserted = conn
        .prepare_cached(
            "INSERT INTO routes (name) VALUES (?1) ON CONFLICT (name) DO NOTHING RETURNING id",
        )?
        .query_row([route.as_str()], |r| r.get(0))
        .optional()?;
    match inserted {
        Some(id) => Ok(id),
        None => lookup_route(conn, route)?
            .ok_or_else(|| StoreError::Corrupt(format!("route {route} vanished while interned"))),
    }
}

/// Rejects values SQLite would silently mangle (NaN becomes NULL) or that make no sense.
pub(crate) fn validate(o: &ProbeOutcome) -> Result<(), StoreError> {
    let bad = |what: &str, v: f64| {
        StoreError::Invalid(format!(
            "{}: {what} = {v} (must be finite and >= 0)",
            o.route
        ))
    };
    let check = |what: &str, v: f64| {
        if v.is_finite() && v >= 0.0 {
            Ok(())
        } else {
            Err(bad(what, v))
        }
    };
    check("total_ms", o.total_ms)?;
    for (what, v) in [
        ("ttfb_ms", o.ttfb_ms),
        ("ttft_ms", o.ttft_ms),
        ("first_answer_ms", o.first_answer_ms),
        ("tokens_per_second", o.tokens_per_second),
    ] {
        if let Some(v) = v {
            check(what, v)?;
        }
    }
    Ok(())
}

/// Columns of one `outcomes` row as [`insert_many`] writes it.
const INSERT_COLUMNS: usize = 21;

/// Rows per `INSERT` at most (21 values each: well under either engine's parameter limit).
const INSERT_CHUNK: usize = 256;

/// Inserts the outcomes (each with its interned route id) in order, several rows per
/// statement: a batch costs a few round trips on PostgreSQL, not one per outcome.
pub(crate) fn insert_many(
    conn: &Connection,
    rows: &[(i64, &ProbeOutcome)],
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut values = Vec::with_capacity(rows.len() * INSERT_COLUMNS);
    for (route_id, o) in rows {
        push_values(&mut values, *route_id, o);
    }
    conn.execute_rows(
        |n| {
            format!(
                "INSERT INTO outcomes (route_id, kind, started_at_ms, success, verified, ttfb_ms,
                     ttft_ms, total_ms, output_tokens, tokens_estimated, tokens_per_second,
                     model_reported, system_fingerprint, http_status, error_kind, error_status,
                     error_message, retry_after_ms, answer, first_answer_ms, max_tokens_exhausted)
                 VALUES {}",
                value_tuples(n, INSERT_COLUMNS)
            )
        },
        INSERT_COLUMNS,
        &values,
        INSERT_CHUNK,
    )?;
    Ok(())
}

/// One outcome's [`INSERT_COLUMNS`] values, in the column order of [`insert_many`].
fn push_values<'a>(out: &mut Vec<ValueRef<'a>>, route_id: i64, o: &'a ProbeOutcome) {
    let err = o.error.as_ref();
    let int = |v: Option<i64>| v.map_or(ValueRef::Null, ValueRef::Integer);
    let real = |v: Option<f64>| v.map_or(ValueRef::Null, ValueRef::Real);
    let text = |v: Option<&'a str>| v.map_or(ValueRef::Null, ValueRef::Text);
    let flag = |v: bool| ValueRef::Integer(i64::from(v));
    out.extend([
        ValueRef::Integer(route_id),
        ValueRef::Text(o.kind.as_str()),
        ValueRef::Integer(to_ms(o.started_at)),
        flag(o.success),
        int(o.verified.map(i64::from)),
        real(o.ttfb_ms),
        real(o.ttft_ms),
        ValueRef::Real(o.total_ms),
        int(o.output_tokens.map(i64::from)),
        flag(o.tokens_estimated),
        real(o.tokens_per_second),
        text(o.model_reported.as_deref()),
        text(o.system_fingerprint.as_deref()),
        int(o.http_status.map(i64::from)),
        text(err.map(ProbeError::kind)),
        int(err.and_then(ProbeError::status).map(i64::from)),
        text(err.and_then(ProbeError::message)),
        // Saturate rather than fail: a retry hint beyond i64 ms is "forever" either way.
        int(err
            .and_then(ProbeError::retry_after_ms)
            .map(|v| i64::try_from(v).unwrap_or(i64::MAX))),
        text(o.answer.as_deref()),
        real(o.first_answer_ms),
        flag(o.max_tokens_exhausted),
    ]);
}

pub(super) const COLUMNS: &str =
    "kind, started_at_ms, success, verified, ttfb_ms, ttft_ms, total_ms,
    output_tokens, tokens_estimated, tokens_per_second, model_reported, system_fingerprint,
    http_status, error_kind, error_status, error_message, retry_after_ms, answer, first_answer_ms,
    max_tokens_exhausted";

/// Reads a row selected with [`COLUMNS`]. Conversion problems surface as SQL errors so
/// they can be raised from inside `query_map`.
pub(super) fn from_row(
    route: &RouteId,
    r: &Row<'_>,
) -> super::sql::Result<Result<ProbeOutcome, StoreError>> {
    let kind: String = r.get(0)?;
    let started_ms: i64 = r.get(1)?;
    let error_kind: Option<String> = r.get(13)?;
    let error = match error_kind {
        Some(k) => Some(ProbeError::from_parts(
            &k,
            r.get(14)?,
            r.get(15)?,
            r.get::<_, Option<i64>>(16)?
                .map(|v| u64::try_from(v).unwrap_or(0)),
        )),
        None => None,
    };
    let outcome = (|| {
        Ok(ProbeOutcome {
            route: route.clone(),
            kind: parse_kind(&kind)?,
            started_at: from_ms(started_ms)?,
            success: r.get(2)?,
            attributed_to: None,
            verified: r.get(3)?,
            ttfb_ms: r.get(4)?,
            ttft_ms: r.get(5)?,
            total_ms: r.get(6)?,
            output_tokens: r.get(7)?,
            tokens_estimated: r.get(8)?,
            tokens_per_second: r.get(9)?,
            model_reported: r.get(10)?,
            system_fingerprint: r.get(11)?,
            http_status: r.get(12)?,
            error,
            answer: r.get(17)?,
            first_answer_ms: r.get(18)?,
            max_tokens_exhausted: r.get(19)?,
            ratelimit: None,
        })
    })();
    Ok(outcome)
}

fn collect(
    route: &RouteId,
    stmt: &mut super::sql::Statement<'_>,
    params: impl super::sql::Params,
) -> Result<Vec<ProbeOutcome>, StoreError> {
    let rows = stmt.query_map(params, |r| from_row(route, r))?;
    let mut out = Vec::new();
    for row in rows {
        out.push(row??);
    }
    Ok(out)
}

impl Reader {
    /// The route's latest outcomes (every kind), newest first.
    pub fn recent_outcomes(
        &self,
        route: &RouteId,
        limit: usize,
    ) -> Result<Vec<ProbeOutcome>, StoreError> {
        self.recent_outcomes_of(route, &[], limit)
    }

    /// The route's latest outcomes of `kinds` (empty means every kind), newest first: raw
    /// rows and packed hours.
    pub fn recent_outcomes_of(
        &self,
        route: &RouteId,
        kinds: &[OutcomeKind],
        limit: usize,
    ) -> Result<Vec<ProbeOutcome>, StoreError> {
        self.snapshot(|| self.recent_in_snapshot(route, kinds, limit))
    }

    fn recent_in_snapshot(
        &self,
        route: &RouteId,
        kinds: &[OutcomeKind],
        limit: usize,
    ) -> Result<Vec<ProbeOutcome>, StoreError> {
        let Some(id) = self.route_id(route)? else {
            return Ok(Vec::new());
        };
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM outcomes WHERE route_id = ?1 AND {}
             ORDER BY started_at_ms DESC, id DESC LIMIT ?2",
            kind_filter_sql("kind", kinds)
        ))?;
        let mut out = collect(
            route,
            &mut stmt,
            params![id, i64::try_from(limit).unwrap_or(i64::MAX)],
        )?;
        // With `limit` raw rows, only a packed hour that ends after the oldest of them can
        // hold a newer outcome (a raw row can be older than packed hours: a late one).
        let from_ms = match out.last() {
            Some(o) if out.len() >= limit => to_ms(o.started_at),
            _ => i64::MIN,
        };
        let want = outcome_hours::Want {
            kinds,
            from_ms,
            to_ms: i64::MAX,
        };
        out.extend(outcome_hours::newest(&self.conn, route, id, &want, limit)?);
        // Stable: among equal starts the raw rows (stored later) stay first, as by id.
        out.sort_by_key(|o| std::cmp::Reverse(o.started_at));
        out.truncate(limit);
        Ok(out)
    }

    /// The route's outcomes that started at or after `since`, oldest first (baseline rebuilds).
    /// `kinds` filters; an empty slice means every kind.
    pub fn outcomes_since(
        &self,
        route: &RouteId,
        since: DateTime<Utc>,
        kinds: &[OutcomeKind],
    ) -> Result<Vec<ProbeOutcome>, StoreError> {
        self.outcomes_in(route, to_ms(since), i64::MAX, kinds)
    }

    /// The route's outcomes of `kinds` that started in `[from, to)`, oldest first.
    pub fn outcomes_between(
        &self,
        route: &RouteId,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        kinds: &[OutcomeKind],
    ) -> Result<Vec<ProbeOutcome>, StoreError> {
        self.outcomes_in(route, to_ms(from), to_ms(to), kinds)
    }

    /// Packed hours and raw rows of `[from_ms, to_ms)`, oldest first.
    fn outcomes_in(
        &self,
        route: &RouteId,
        from_ms: i64,
        to_ms: i64,
        kinds: &[OutcomeKind],
    ) -> Result<Vec<ProbeOutcome>, StoreError> {
        self.snapshot(|| self.outcomes_in_snapshot(route, from_ms, to_ms, kinds))
    }

    fn outcomes_in_snapshot(
        &self,
        route: &RouteId,
        from_ms: i64,
        to_ms: i64,
        kinds: &[OutcomeKind],
    ) -> Result<Vec<ProbeOutcome>, StoreError> {
        let Some(id) = self.route_id(route)? else {
            return Ok(Vec::new());
        };
        let want = outcome_hours::Want {
            kinds,
            from_ms,
            to_ms,
        };
        let mut out = outcome_hours::read(&self.conn, route, id, &want)?;
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM outcomes
             WHERE route_id = ?1 AND started_at_ms >= ?2 AND started_at_ms < ?3 AND {}
             ORDER BY started_at_ms, id",
            kind_filter_sql("kind", kinds)
        ))?;
        out.extend(collect(route, &mut stmt, params![id, from_ms, to_ms])?);
        // Stable: packed outcomes first among equal starts, as their smaller ids were.
        out.sort_by_key(|o| o.started_at);
        Ok(out)
    }

    /// Bad outcomes of `kinds` (failed, or slower than `threshold_ms`, as the rollups count
    /// "good") of the route that started in `[since, until)`: the error budget an incident
    /// spent, while its raw rows are kept. One indexed range count, and the packed hours.
    pub fn bad_outcomes_between(
        &self,
        route: &RouteId,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        kinds: &[OutcomeKind],
        threshold_ms: f64,
    ) -> Result<u64, StoreError> {
        self.snapshot(|| {
            let Some(id) = self.route_id(route)? else {
                return Ok(0);
            };
            let mut stmt = self.conn.prepare_cached(&format!(
                "SELECT COUNT(*) FROM outcomes
                 WHERE route_id = ?1 AND started_at_ms >= ?2 AND started_at_ms < ?3
                   AND (success = 0 OR total_ms > ?4) AND {}",
                kind_filter_sql("kind", kinds)
            ))?;
            let n: i64 = stmt
                .query_row(params![id, to_ms(since), to_ms(until), threshold_ms], |r| {
                    r.get(0)
                })?;
            let want = outcome_hours::Want {
                kinds,
                from_ms: to_ms(since),
                to_ms: to_ms(until),
            };
            let packed = outcome_hours::read(&self.conn, route, id, &want)?
                .iter()
                .filter(|o| !o.success || o.total_ms > threshold_ms)
                .count();
            Ok(u64::try_from(n).unwrap_or(0) + packed as u64)
        })
    }

    /// Runs `read` in one read transaction. Packing moves an hour from the raw rows to its
    /// packed row in one write; a read of both tables must see both before it or both after.
    fn snapshot<T>(&self, read: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.conn.execute_batch(match self.conn.engine() {
            Engine::Sqlite => "BEGIN",
            Engine::Postgres => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
        })?;
        let out = read();
        // A connection left inside a transaction is closed by the pool, not reused.
        let ended = self
            .conn
            .execute_batch(if out.is_ok() { "COMMIT" } else { "ROLLBACK" });
        let out = out?;
        ended?;
        Ok(out)
    }
}
