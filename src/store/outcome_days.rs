//! Raw outcomes on PostgreSQL: one partition per UTC day (`outcomes_YYYYMMDD`), so retention
//! drops an expired day whole — an instant catalogue change — where deleting a day's rows
//! one by one (28 million at 10,000 routes probed every 30 s) costs hours of writes and
//! leaves as much dead space for VACUUM. Rows stored before this layout stay in
//! `outcomes_unpartitioned`, the partition of every time before the day after the newest of
//! them, and are deleted by key as they expire, as on SQLite.
//!
//! Packing moves a closed hour's rows into `outcome_hours`; a day whose every hour is packed
//! has its partition dropped then ([`drop_packed`]), hours after it ended.
//!
//! A partition must exist before a row of its day is inserted (there is no default partition
//! to catch strays: a day's partition could not be created later over rows already there).
//! The writer creates the days of each batch under its advisory lock, so two processes never
//! race to create one. Retention is by day on PostgreSQL: a day's rows go when the whole day
//! is older than `retention_days`, up to a day later than on SQLite.

use std::collections::HashSet;

use chrono::DateTime;

use super::sql::{params, Connection, Engine, OptionalExtension};
use super::StoreError;

const DAY_MS: i64 = 86_400_000;

/// A day ending less than this before now can never have been dropped by retention (which
/// keeps at least a day, and drops a day only once all of it has expired) or by packing
/// (which waits twice as long: see [`drop_packed`]), by this process or another whose clock is
/// up to this far off: only such days are remembered as existing. An older day is asked for
/// each time (`IF NOT EXISTS`, one statement for a batch that holds a late row): a late row
/// may come for a day dropped meanwhile, and its partition is then made again.
const REMEMBER_WITHIN_MS: i64 = 3 * 3_600_000;

/// The days that have a partition, as far as this writer knows.
#[derive(Debug, Default)]
pub(crate) struct Days {
    /// Where the days begin (see [`days_from`]), once read.
    from: Option<i64>,
    /// Recent days known to exist (a handful: today, tomorrow, yesterday).
    known: HashSet<i64>,
}

impl Days {
    /// Creates the partitions of the days `started_ms` fall in that do not exist yet (on
    /// PostgreSQL; nothing on SQLite). Inside the writer's transaction, after its lock.
    pub fn ensure(
        &mut self,
        conn: &Connection,
        now_ms: i64,
        started_ms: impl Iterator<Item = i64>,
    ) -> Result<(), StoreError> {
        if conn.engine() != Engine::Postgres {
            return Ok(());
        }
        let from = match self.from {
            Some(f) => f,
            None => {
                let f = days_from(conn)?;
                self.from = Some(f);
                f
            }
        };
        let recent =
            |day: i64| (day + 1).saturating_mul(DAY_MS) > now_ms.saturating_sub(REMEMBER_WITHIN_MS);
        let mut missing: Vec<i64> = started_ms
            .filter(|&ms| ms >= from)
            .map(|ms| ms.div_euclid(DAY_MS))
            .filter(|d| !self.known.contains(d))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        self.known.retain(|&d| recent(d));
        for day in missing {
            create(conn, day)?;
            if recent(day) {
                self.known.insert(day);
            }
        }
        Ok(())
    }

    /// Forgets what it knew (a failed transaction may have created days that are gone).
    pub fn forget(&mut self) {
        self.known.clear();
    }
}

/// Where the days begin: the upper bound of `outcomes_unpartitioned`, the partition of every
/// time before it (read from the catalogue, which cannot disagree with itself).
fn days_from(conn: &Connection) -> Result<i64, StoreError> {
    let bound: Option<String> = conn
        .query_row(
            "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c
             WHERE c.relname = 'outcomes_unpartitioned' AND c.relispartition",
            [],
            |r| r.get(0),
        )
        .optional()?;
    match bound.as_deref().map(upper_bound) {
        Some(Some(ms)) => Ok(ms),
        Some(None) => Err(StoreError::Corrupt(format!(
            "outcomes_unpartitioned has an unexpected bound: {bound:?}"
        ))),
        // Not a partition (a store that never had the old table attached): no rows before.
        None => Ok(i64::MIN),
    }
}

/// The upper bound of `FOR VALUES FROM (MINVALUE) TO ('1796601600000')`.
fn upper_bound(expr: &str) -> Option<i64> {
    let (_, to) = expr.rsplit_once("TO (")?;
    to.trim_end_matches(')').trim_matches('\'').parse().ok()
}

/// `outcomes_YYYYMMDD` for day `day` (days since 1970-01-01).
fn name(day: i64) -> Option<String> {
    let at = DateTime::from_timestamp(day.checked_mul(86_400)?, 0)?;
    Some(at.format("outcomes_%Y%m%d").to_string())
}

/// The day a partition's name stands for.
fn day_of(name: &str) -> Option<i64> {
    let digits = name.strip_prefix("outcomes_")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let date = chrono::NaiveDate::parse_from_str(digits, "%Y%m%d").ok()?;
    Some(
        date.and_hms_opt(0, 0, 0)?
            .and_utc()
            .timestamp()
            .div_euclid(86_400),
    )
}

fn create(conn: &Connection, day: i64) -> Result<(), StoreError> {
    let Some(table) = name(day) else {
        return Err(StoreError::Invalid(format!("no date for day {day}")));
    };
    // The name and bounds are computed here, never taken from input.
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {table} PARTITION OF outcomes
             FOR VALUES FROM ({}) TO ({})",
        day * DAY_MS,
        (day + 1) * DAY_MS
    ))?;
    Ok(())
}

/// Copies into PostgreSQL need the partitions of every day they bring.
pub(crate) fn ensure_all(conn: &Connection, days: &[i64]) -> Result<(), StoreError> {
    Days::default().ensure(conn, i64::MIN, days.iter().map(|d| d * DAY_MS))
}

/// The day partitions there are, with their days.
fn partitions(conn: &Connection) -> Result<Vec<(String, i64)>, StoreError> {
    let names = conn
        .prepare_cached(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'outcomes'::regclass",
        )?
        .query_map(params![], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<String>, _>>()?;
    Ok(names
        .into_iter()
        .filter_map(|n| day_of(&n).map(|d| (n, d)))
        .collect())
}

/// On PostgreSQL, after packing left no raw row before `before_ms` but those of the `passed`
/// hours: drops the partitions of the days that ended before it and hold none of those
/// hours (their pages hold only deleted rows, which no new row would reuse). Only days that
/// ended twice [`REMEMBER_WITHIN_MS`] before are dropped (about 7 hours after the day's end,
/// packing itself waiting an hour or two): a writer remembers a newer day as existing and
/// would insert a late row into it without making it again, so a writer whose clock is
/// behind by less than that never does. Raw partitions take at most about a day and a third
/// of outcomes. Inside the writer's transaction, after its lock; each drop is logged.
pub(crate) fn drop_packed(
    conn: &Connection,
    before_ms: i64,
    passed: &[(i64, i64)],
) -> Result<(), StoreError> {
    let until = before_ms.saturating_sub(2 * REMEMBER_WITHIN_MS);
    for (table, day) in partitions(conn)? {
        let (from, to) = (day * DAY_MS, (day + 1) * DAY_MS);
        if to > until || passed.iter().any(|&(_, h)| h >= from && h < to) {
            continue;
        }
        conn.execute_batch(&format!("DROP TABLE {table}"))?;
        tracing::info!(partition = %table, "a packed day's raw partition dropped");
    }
    Ok(())
}

/// On PostgreSQL: drops the day partitions that end at or before `cutoff_ms`, answering the
/// rows they held (counted first: the retention report says what went).
fn drop_expired(conn: &Connection, cutoff_ms: i64) -> Result<u64, StoreError> {
    let mut rows = 0u64;
    for (table, day) in partitions(conn)? {
        if (day + 1) * DAY_MS > cutoff_ms {
            continue;
        }
        let n: i64 = conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?;
        conn.execute_batch(&format!("DROP TABLE {table}"))?;
        rows += u64::try_from(n).unwrap_or(0);
    }
    Ok(rows)
}

/// Retention of raw outcomes: up to `limit` of the oldest rows before `cutoff_ms` deleted by
/// key (SQLite; on PostgreSQL the rows from before the day partitions), and on PostgreSQL
/// every day partition that has wholly expired dropped. Answers the rows removed.
pub(crate) fn delete_old(
    conn: &Connection,
    cutoff_ms: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    if conn.engine() != Engine::Postgres {
        return super::jobs::delete_oldest(conn, "outcomes", "started_at_ms", cutoff_ms, limit);
    }
    let dropped = drop_expired(conn, cutoff_ms)?;
    let before_days = cutoff_ms.min(days_from(conn)?);
    let deleted = super::jobs::delete_oldest(
        conn,
        "outcomes_unpartitioned",
        "started_at_ms",
        before_days,
        limit,
    )?;
    Ok(dropped + deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_and_its_name_round_trip() {
        for day in [0, 1, 20_429, 30_000] {
            let n = name(day).unwrap();
            assert_eq!(day_of(&n), Some(day), "{n}");
        }
        assert_eq!(name(20_429).as_deref(), Some("outcomes_20251207"));
        assert_eq!(day_of("outcomes_unpartitioned"), None);
        assert_eq!(day_of("outcomes_2025120"), None);
        assert_eq!(day_of("outcomes_20251332"), None);
    }

    #[test]
    fn the_attached_rows_bound_is_read_from_the_catalogue_text() {
        let b = "FOR VALUES FROM (MINVALUE) TO ('1796601600000')";
        assert_eq!(upper_bound(b), Some(1_796_601_600_000));
        assert_eq!(upper_bound("FOR VALUES FROM (MINVALUE) TO ('0')"), Some(0));
        assert_eq!(upper_bound("DEFAULT"), None);
    }
}
