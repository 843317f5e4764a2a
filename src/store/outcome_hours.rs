//! Closed hours of raw outcomes, packed (`outcome_hours`, the value's layout in
//! [`super::pack`]): packing them, reading them beside the raw rows, and their retention.
//!
//! An hour of a route is packed once the hour has been over for [`PACK_AFTER_MS`]: its raw
//! rows are read, merged with whatever was packed for that hour before (a late outcome),
//! written as one row and deleted, in the writer's transaction (on PostgreSQL under the
//! writers' advisory lock, so a pair's two writers never pack the same hour at once, nor
//! insert a row into an hour while it is packed). An hour with a row that cannot be read back
//! stays raw ([`Skipped`]).
//!
//! On PostgreSQL a deleted row's space stays in its day partition (new rows go to today's),
//! so once a packing run has left a day with no raw row, the day's partition is dropped whole
//! ([`super::outcome_days::drop_packed`]).

use std::time::Instant;

use super::outcomes::{from_row, COLUMNS};
use super::pack;
use super::sql::{params, Connection, Engine, OptionalExtension};
use super::StoreError;
use crate::outcome::{OutcomeKind, ProbeOutcome};
use crate::route::RouteId;

pub(crate) const HOUR_MS: i64 = 3_600_000;

/// An hour is packed once it has been over this long: late outcomes (an agent's backlog, the
/// other monitor of a pair) mostly arrive well within it, and what reads the last hour across
/// every route (the status API's percentiles) finds raw rows only.
pub const PACK_AFTER_MS: i64 = HOUR_MS;

/// Hours read per statement when reading newest first until enough are found.
const HOURS_PER_READ: i64 = 4;

/// The start of the hour before which raw outcomes are packed, at `now_ms`.
pub(crate) fn pack_before(now_ms: i64) -> i64 {
    now_ms
        .saturating_sub(PACK_AFTER_MS)
        .div_euclid(HOUR_MS)
        .saturating_mul(HOUR_MS)
}

/// A route's hour packing passed over, `(route_id, hour_ms)`: a row of it (or what was packed
/// of it before) cannot be read back. Its rows stay as they are, and packing goes on with the
/// other hours rather than stopping at the oldest one for good.
pub(crate) type Skipped = (i64, i64);

/// The most hours one packing run passes over; at it the run ends (its next step packs
/// nothing; the next run, an hour later, tries them again).
pub(crate) const MAX_SKIPPED: usize = 8;

/// Packs up to `limit` route-hours of raw outcomes that started before `before_ms`, oldest
/// first, for at most [`super::jobs::STEP_TIME`] (at least one), passing over the hours in
/// `skip`. Answers the raw rows packed (0 when none are left) and the hours this step passed
/// over, each logged. The step that finds none left drops, on PostgreSQL, the day partitions
/// it leaves empty.
pub(crate) fn pack_step(
    conn: &Connection,
    before_ms: i64,
    limit: usize,
    skip: &[Skipped],
) -> Result<(u64, Vec<Skipped>), StoreError> {
    // A run that passed over as many hours as it may ends.
    if skip.len() >= MAX_SKIPPED {
        return Ok((0, Vec::new()));
    }
    let started = Instant::now();
    let (mut packed, mut skipped) = (0, Vec::new());
    for _ in 0..limit.max(1) {
        let mut sql =
            String::from("SELECT route_id, started_at_ms FROM outcomes WHERE started_at_ms < ?");
        let mut values = vec![before_ms];
        for &(route_id, hour_ms) in skip.iter().chain(&skipped) {
            sql.push_str(" AND NOT (route_id = ? AND started_at_ms >= ? AND started_at_ms < ?)");
            values.extend([route_id, hour_ms, hour_ms + HOUR_MS]);
        }
        sql.push_str(" ORDER BY started_at_ms LIMIT 1");
        let values: Vec<&dyn super::sql::ToSql> =
            values.iter().map(|v| v as &dyn super::sql::ToSql).collect();
        let next: Option<(i64, i64)> = conn
            .prepare_cached(&sql)?
            .query_row(values.as_slice(), |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((route_id, at)) = next else {
            // Every due hour is packed but the ones passed over (all of them: fewer than
            // the most a run passes over).
            if conn.engine() == Engine::Postgres && skip.len() + skipped.len() < MAX_SKIPPED {
                let passed: Vec<Skipped> = skip.iter().chain(&skipped).copied().collect();
                super::outcome_days::drop_packed(conn, before_ms, &passed)?;
            }
            break;
        };
        let hour_ms = at.div_euclid(HOUR_MS) * HOUR_MS;
        match pack_hour(conn, route_id, hour_ms) {
            Ok(n) => packed += n,
            // Nothing of the hour was written yet: its rows stay raw.
            Err(StoreError::Corrupt(e)) => {
                tracing::warn!(
                    route_id, hour_ms, error = %e,
                    "an hour of outcomes cannot be packed: its rows stay as they are"
                );
                skipped.push((route_id, hour_ms));
                if skip.len() + skipped.len() >= MAX_SKIPPED {
                    break;
                }
            }
            Err(e) => return Err(e),
        }
        if started.elapsed() >= super::jobs::STEP_TIME {
            break;
        }
    }
    Ok((packed, skipped))
}

/// A column whose value is not of the type the row wants (SQLite keeps whatever it is given).
fn bad_value(e: &super::sql::SqlError) -> bool {
    use super::sql::SqlError;
    use rusqlite::Error as E;
    matches!(
        e,
        SqlError::Convert { .. }
            | SqlError::Sqlite(
                E::InvalidColumnType(..)
                    | E::FromSqlConversionFailure(..)
                    | E::IntegralValueOutOfRange(..)
            )
    )
}

/// Moves the route's raw rows of the hour starting at `hour_ms` into its packed row.
fn pack_hour(conn: &Connection, route_id: i64, hour_ms: i64) -> Result<u64, StoreError> {
    // The packed value does not hold the route: any id reads the rows back.
    let route = RouteId::new("-", "-", "-");
    let window = params![route_id, hour_ms, hour_ms + HOUR_MS];
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM outcomes
         WHERE route_id = ?1 AND started_at_ms >= ?2 AND started_at_ms < ?3
         ORDER BY started_at_ms, id"
    ))?;
    let mut raw = Vec::new();
    for row in stmt.query_map(window, |r| from_row(&route, r))? {
        // A value of the wrong type in a column is the row's fault, as a bad value is.
        let corrupt = |e: super::sql::SqlError| match bad_value(&e) {
            true => StoreError::Corrupt(format!("route {route_id}, hour {hour_ms}: {e}")),
            false => StoreError::Sql(e),
        };
        raw.push(row.map_err(corrupt)?.map_err(|e| match e {
            StoreError::Sql(e) => corrupt(e),
            e => e,
        })?);
    }
    let before: Option<Vec<u8>> = conn
        .prepare_cached("SELECT packed FROM outcome_hours WHERE route_id = ?1 AND hour_ms = ?2")?
        .query_row(params![route_id, hour_ms], |r| r.get(0))
        .optional()?;
    let mut all = match before {
        Some(b) => pack::decode(&route, hour_ms, &b)
            .map_err(|e| StoreError::Corrupt(format!("route {route_id}, hour {hour_ms}: {e}")))?,
        None => Vec::new(),
    };
    let n = raw.len();
    all.extend(raw);
    // Stable: what was packed before comes first among equal starts, as its ids did.
    all.sort_by_key(|o| o.started_at);
    let refs: Vec<&ProbeOutcome> = all.iter().collect();
    let value = pack::encode(hour_ms, &refs);
    conn.prepare_cached(
        "INSERT INTO outcome_hours (route_id, hour_ms, count, packed) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (route_id, hour_ms) DO UPDATE
             SET count = excluded.count, packed = excluded.packed",
    )?
    .execute(params![route_id, hour_ms, all.len() as i64, value])?;
    conn.prepare_cached(
        "DELETE FROM outcomes WHERE route_id = ?1 AND started_at_ms >= ?2 AND started_at_ms < ?3",
    )?
    .execute(window)?;
    Ok(n as u64)
}

/// Retention of packed hours: up to `limit` hours that ended at or before `cutoff_ms`, oldest
/// first. Answers the outcomes they held.
pub(crate) fn delete_old(
    conn: &Connection,
    cutoff_ms: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    let keys = conn
        .prepare_cached(
            "SELECT route_id, hour_ms, count FROM outcome_hours WHERE hour_ms <= ?1
             ORDER BY hour_ms LIMIT ?2",
        )?
        .query_map(
            params![
                cutoff_ms.saturating_sub(HOUR_MS),
                i64::try_from(limit).unwrap_or(i64::MAX)
            ],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            },
        )?
        .collect::<Result<Vec<_>, _>>()?;
    let mut delete =
        conn.prepare_cached("DELETE FROM outcome_hours WHERE route_id = ?1 AND hour_ms = ?2")?;
    let mut n = 0u64;
    for (route_id, hour_ms, count) in keys {
        if delete.execute(params![route_id, hour_ms])? > 0 {
            n += u64::try_from(count).unwrap_or(0);
        }
    }
    Ok(n)
}

/// Which packed outcomes a read wants.
pub(crate) struct Want<'a> {
    pub kinds: &'a [OutcomeKind],
    /// Started at or after.
    pub from_ms: i64,
    /// Started before.
    pub to_ms: i64,
}

impl Want<'_> {
    fn keeps(&self, o: &ProbeOutcome) -> bool {
        let at = o.started_at.timestamp_millis();
        (self.kinds.is_empty() || self.kinds.contains(&o.kind))
            && at >= self.from_ms
            && at < self.to_ms
    }
}

/// The route's packed outcomes that `want` keeps, oldest first.
pub(crate) fn read(
    conn: &Connection,
    route: &RouteId,
    route_id: i64,
    want: &Want<'_>,
) -> Result<Vec<ProbeOutcome>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT hour_ms, packed FROM outcome_hours
         WHERE route_id = ?1 AND hour_ms > ?2 AND hour_ms < ?3 ORDER BY hour_ms",
    )?;
    let hours = stmt.query_map(
        params![route_id, want.from_ms.saturating_sub(HOUR_MS), want.to_ms],
        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)),
    )?;
    let mut out = Vec::new();
    for hour in hours {
        let (hour_ms, value) = hour?;
        out.extend(
            unpack(conn, route, hour_ms, &value)?
                .into_iter()
                .filter(|o| want.keeps(o)),
        );
    }
    Ok(out)
}

/// The route's newest packed outcomes that `want` keeps, newest first: hours are read newest
/// first until `limit` are found.
pub(crate) fn newest(
    conn: &Connection,
    route: &RouteId,
    route_id: i64,
    want: &Want<'_>,
    limit: usize,
) -> Result<Vec<ProbeOutcome>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT hour_ms, packed FROM outcome_hours
         WHERE route_id = ?1 AND hour_ms > ?2 AND hour_ms < ?3 ORDER BY hour_ms DESC LIMIT ?4",
    )?;
    let mut out = Vec::new();
    let mut below = want.to_ms;
    while out.len() < limit {
        let hours = stmt
            .query_map(
                params![
                    route_id,
                    want.from_ms.saturating_sub(HOUR_MS),
                    below,
                    HOURS_PER_READ
                ],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)),
            )?
            .collect::<Result<Vec<_>, _>>()?;
        let Some(last) = hours.last() else { break };
        below = last.0;
        for (hour_ms, value) in hours {
            let mut these = unpack(conn, route, hour_ms, &value)?;
            these.retain(|o| want.keeps(o));
            out.extend(these.into_iter().rev());
        }
    }
    out.truncate(limit);
    Ok(out)
}

fn unpack(
    conn: &Connection,
    route: &RouteId,
    hour_ms: i64,
    value: &[u8],
) -> Result<Vec<ProbeOutcome>, StoreError> {
    let all = pack::decode(route, hour_ms, value)
        .map_err(|e| StoreError::Corrupt(format!("{route}, hour {hour_ms}: {e}")))?;
    conn.count_rows(all.len());
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_hour_is_packed_once_it_has_been_over_an_hour() {
        let h = 1_796_601_600_000;
        // At 12:30 the hour 11:00–12:00 is still raw; at 13:00 it packs.
        assert_eq!(pack_before(h + 30 * 60_000), h - HOUR_MS);
        assert_eq!(pack_before(h + HOUR_MS - 1), h - HOUR_MS);
        assert_eq!(pack_before(h + HOUR_MS), h);
        assert_eq!(pack_before(i64::MIN), i64::MIN);
    }
}
