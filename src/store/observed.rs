//! The `route_observed` table: what real proxy traffic showed of each route, as minute and hour
//! rollups ([`ObservedBucket`]: counts, a TTFT and a TPOT histogram, cost sums and a few
//! validity errors). No prompt or answer text is ever stored.
//!
//! Each writing process (a proxy) owns its rows (`source`) and rewrites a bucket's row whole
//! with what it holds in memory, so proxies sharing a PostgreSQL database never race on a
//! counter; readers add the sources up. Old rows are pruned by the writes themselves (minutes
//! after [`MINUTE_RETENTION`], hours after [`HOUR_RETENTION`]), a bounded batch at a time.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};

use super::histogram::LatencyHistogram;
use super::sql::{params, Connection};
use super::writer::{Ack, Command};
use super::{to_ms, Reader, StoreError, Writer};

/// Validity errors kept per bucket (distinct texts, the first ones seen).
pub const MAX_ERRORS: usize = 3;
/// Minute rows live this long (they serve the 1 h view and the drift windows).
pub const MINUTE_RETENTION: chrono::Duration = chrono::Duration::hours(48);
/// Hour rows live this long (the 24 h view and the validity baseline).
pub const HOUR_RETENTION: chrono::Duration = chrono::Duration::days(8);
/// Rows pruned per write, at most.
const PRUNE_BATCH: i64 = 1000;
/// TPOT is kept in the latency histogram's layout in tenths of a millisecond, so its range
/// (1 ms to 60 s per token) suits per-token times.
pub const TPOT_SCALE: f64 = 10.0;

/// A bucket's width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Span {
    Minute,
    Hour,
}

impl Span {
    pub fn seconds(self) -> i64 {
        match self {
            Self::Minute => 60,
            Self::Hour => 3600,
        }
    }

    /// The start (ms) of the bucket holding `t`.
    pub fn start(self, t: DateTime<Utc>) -> i64 {
        let ms = to_ms(t);
        let w = self.seconds() * 1000;
        ms - ms.rem_euclid(w)
    }
}

/// The figures of one bucket (or of several merged).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ObservedBucket {
    pub requests: u64,
    pub ok: u64,
    pub rate_limited: u64,
    pub server_error: u64,
    pub refused: u64,
    pub checked: u64,
    pub valid: u64,
    pub not_checked: u64,
    pub cost_sum: f64,
    pub cost_n: u64,
    /// Time to first token of streamed answers, ms.
    pub ttft: LatencyHistogram,
    /// Time per output token of streamed answers, tenths of a ms ([`TPOT_SCALE`]).
    pub tpot: LatencyHistogram,
    /// Up to [`MAX_ERRORS`] validity errors.
    pub errors: Vec<String>,
}

impl ObservedBucket {
    pub fn merge(&mut self, o: &ObservedBucket) {
        self.requests += o.requests;
        self.ok += o.ok;
        self.rate_limited += o.rate_limited;
        self.server_error += o.server_error;
        self.refused += o.refused;
        self.checked += o.checked;
        self.valid += o.valid;
        self.not_checked += o.not_checked;
        self.cost_sum += o.cost_sum;
        self.cost_n += o.cost_n;
        self.ttft.merge(&o.ttft);
        self.tpot.merge(&o.tpot);
        for e in &o.errors {
            self.note_error(e);
        }
    }

    /// Keeps `e` among the examples when there is room and it is new.
    pub fn note_error(&mut self, e: &str) {
        if self.errors.len() < MAX_ERRORS && !self.errors.iter().any(|x| x == e) {
            self.errors.push(e.to_owned());
        }
    }

    /// TPOT percentile in ms.
    pub fn tpot_ms(&self, q: f64) -> Option<f64> {
        self.tpot.quantile(q).map(|v| v / TPOT_SCALE)
    }
}

/// One stored row: a route's bucket as one process saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedRow {
    pub span: Span,
    pub bucket_ms: i64,
    pub route: String,
    pub source: String,
    pub bucket: ObservedBucket,
}

/// Milliseconds since the epoch, as bucket starts are written.
pub fn to_ms_pub(t: DateTime<Utc>) -> i64 {
    to_ms(t)
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Writes `rows` (whole: a row replaces the same source's row of that bucket) and prunes
/// old ones, inside the writer's transaction.
pub(crate) fn upsert(
    conn: &Connection,
    rows: &[ObservedRow],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO route_observed (span_s, bucket_ms, route, source, requests, ok, rate_limited,
             server_error, refused, checked, valid, not_checked, cost_sum, cost_n, ttft, tpot, errors)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)
         ON CONFLICT (span_s, bucket_ms, route, source) DO UPDATE SET
             requests = excluded.requests, ok = excluded.ok, rate_limited = excluded.rate_limited,
             server_error = excluded.server_error, refused = excluded.refused,
             checked = excluded.checked, valid = excluded.valid, not_checked = excluded.not_checked,
             cost_sum = excluded.cost_sum, cost_n = excluded.cost_n, ttft = excluded.ttft,
             tpot = excluded.tpot, errors = excluded.errors",
    )?;
    for r in rows {
        let b = &r.bucket;
        if !b.cost_sum.is_finite() {
            return Err(StoreError::Invalid(format!(
                "{}: observed cost_sum = {}",
                r.route, b.cost_sum
            )));
        }
        let errors = serde_json::to_string(&b.errors)
            .map_err(|e| StoreError::Invalid(format!("observed errors: {e}")))?;
        stmt.execute(params![
            r.span.seconds(),
            r.bucket_ms,
            r.route,
            r.source,
            count(b.requests),
            count(b.ok),
            count(b.rate_limited),
            count(b.server_error),
            count(b.refused),
            count(b.checked),
            count(b.valid),
            count(b.not_checked),
            b.cost_sum,
            count(b.cost_n),
            b.ttft.encode(),
            b.tpot.encode(),
            errors,
        ])?;
    }
    for (span, keep) in [
        (Span::Minute, MINUTE_RETENTION),
        (Span::Hour, HOUR_RETENTION),
    ] {
        conn.prepare_cached(
            "DELETE FROM route_observed WHERE (span_s, bucket_ms, route, source) IN
                 (SELECT span_s, bucket_ms, route, source FROM route_observed
                  WHERE span_s = ?1 AND bucket_ms < ?2 ORDER BY bucket_ms LIMIT ?3)",
        )?
        .execute(params![span.seconds(), to_ms(now - keep), PRUNE_BATCH])?;
    }
    Ok(())
}

impl Writer {
    /// Writes observed rollup rows (each replacing its source's row); resolves after COMMIT.
    pub async fn record_observed(
        &self,
        rows: Vec<ObservedRow>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        self.request(|ack: Ack<()>| Command::Observed { rows, now, ack })
            .await
    }
}

impl Reader {
    /// Every route's buckets of `span` starting in `[since_ms, until_ms)`, the sources added
    /// up: route → bucket start → figures.
    pub fn observed_buckets(
        &self,
        span: Span,
        since_ms: i64,
        until_ms: i64,
    ) -> Result<HashMap<String, BTreeMap<i64, ObservedBucket>>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT route, bucket_ms, requests, ok, rate_limited, server_error, refused, checked,
                    valid, not_checked, cost_sum, cost_n, ttft, tpot, errors
             FROM route_observed WHERE span_s = ?1 AND bucket_ms >= ?2 AND bucket_ms < ?3",
        )?;
        type Row = (String, i64, [i64; 8], f64, i64, Vec<u8>, Vec<u8>, String);
        let rows: Vec<Row> = stmt
            .query_map(params![span.seconds(), since_ms, until_ms], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    [
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                        r.get(8)?,
                        r.get(9)?,
                    ],
                    r.get(10)?,
                    r.get(11)?,
                    r.get(12)?,
                    r.get(13)?,
                    r.get(14)?,
                ))
            })?
            .collect::<Result<_, _>>()?;
        let mut out: HashMap<String, BTreeMap<i64, ObservedBucket>> = HashMap::new();
        for (route, at, c, cost_sum, cost_n, ttft, tpot, errors) in rows {
            let [requests, ok, rate_limited, server_error, refused, checked, valid, not_checked] =
                c.map(to_u64);
            let corrupt = |e: String| StoreError::Corrupt(format!("route_observed: {e}"));
            let b = ObservedBucket {
                requests,
                ok,
                rate_limited,
                server_error,
                refused,
                checked,
                valid,
                not_checked,
                cost_sum,
                cost_n: to_u64(cost_n),
                ttft: LatencyHistogram::decode(&ttft).map_err(|e| corrupt(e.to_string()))?,
                tpot: LatencyHistogram::decode(&tpot).map_err(|e| corrupt(e.to_string()))?,
                errors: serde_json::from_str(&errors).map_err(|e| corrupt(e.to_string()))?,
            };
            out.entry(route)
                .or_default()
                .entry(at)
                .or_default()
                .merge(&b);
        }
        Ok(out)
    }

    /// Every route's figures over the buckets of `span` starting in `[since_ms, until_ms)`.
    pub fn observed(
        &self,
        span: Span,
        since_ms: i64,
        until_ms: i64,
    ) -> Result<HashMap<String, ObservedBucket>, StoreError> {
        Ok(self
            .observed_buckets(span, since_ms, until_ms)?
            .into_iter()
            .map(|(route, buckets)| {
                let mut all = ObservedBucket::default();
                for b in buckets.values() {
                    all.merge(b);
                }
                (route, all)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_merge_and_keep_few_errors() {
        let mut a = ObservedBucket {
            requests: 2,
            ok: 1,
            cost_sum: 0.5,
            cost_n: 1,
            ..Default::default()
        };
        a.tpot.record(200.0);
        let mut b = a.clone();
        for e in ["x", "y", "x", "z", "w"] {
            b.note_error(e);
        }
        assert_eq!(b.errors, ["x", "y", "z"]);
        a.merge(&b);
        assert_eq!((a.requests, a.ok, a.cost_n), (4, 2, 2));
        assert_eq!(a.tpot.count(), 2);
        let tpot = a.tpot_ms(0.5).unwrap();
        assert!((tpot - 20.0).abs() < 2.0, "{tpot}");
        let t = DateTime::parse_from_rfc3339("2026-01-01T10:17:42Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(Span::Minute.start(t) % 60_000, 0);
        assert_eq!(to_ms(t) - Span::Hour.start(t), (17 * 60 + 42) * 1000);
    }
}
