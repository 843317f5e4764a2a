//! The `rollups` table: per route, outcome kind, granularity and time bucket — counts, sums and
//! a latency histogram, so uptime, SLO and percentiles over days never scan raw rows.
//!
//! The writer keeps the buckets it is filling in memory ([`RollupCache`]) and writes each
//! touched one once per batch, inside the batch's transaction. A bucket not in memory (after a
//! restart, or evicted) is loaded from its row first, so counts continue where they stopped.

use std::collections::HashMap;

use super::sql::{params, value_tuples, Connection, OptionalExtension, ValueRef};
use chrono::{DateTime, Utc};

use super::histogram::LatencyHistogram;
use super::{from_ms, kind_filter_sql, parse_kind, to_ms, Reader, StoreError};
use crate::outcome::{OutcomeKind, ProbeOutcome};
use crate::route::RouteId;

/// Rollup bucket sizes. Buckets are aligned to the unix epoch, i.e. to UTC hours and days.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Granularity {
    /// Kept 48 h: 24 h charts.
    FiveMinutes,
    /// Kept `rollup_retention_days`: 7 d / 30 d uptime and percentiles, local-time days.
    Hour,
    /// Kept `rollup_retention_days`: long history in few rows.
    Day,
}

impl Granularity {
    pub const ALL: [Granularity; 3] = [Self::FiveMinutes, Self::Hour, Self::Day];

    pub fn seconds(self) -> i64 {
        match self {
            Self::FiveMinutes => 300,
            Self::Hour => 3600,
            Self::Day => 86_400,
        }
    }

    pub(crate) fn millis(self) -> i64 {
        self.seconds() * 1000
    }

    pub fn from_seconds(s: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.seconds() == s)
    }

    /// The start of the bucket holding `t`.
    pub fn bucket_start(self, t: DateTime<Utc>) -> DateTime<Utc> {
        // Always in range: flooring moves `t` back by less than a day.
        DateTime::from_timestamp_millis(self.floor_ms(to_ms(t))).unwrap_or(t)
    }

    pub(crate) fn floor_ms(self, ms: i64) -> i64 {
        ms.div_euclid(self.millis()) * self.millis()
    }
}

/// Aggregates over one bucket (from [`Reader::rollups`]) or a merged range
/// ([`Reader::summary`]). Latency figures cover successes only.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollup {
    pub route: RouteId,
    /// `Some` when exactly one kind was asked for, `None` when several kinds are merged.
    pub kind: Option<OutcomeKind>,
    pub granularity: Granularity,
    /// Start of the (first) bucket.
    pub bucket_start: DateTime<Utc>,
    pub count: u64,
    pub successes: u64,
    /// Successes within the SLO latency threshold (`StoreOptions::latency_threshold`).
    pub good: u64,
    /// Outcomes whose answer was verified (`verified == Some(true)`).
    pub verified: u64,
    /// Sum of successes' `total_ms`, in integer microseconds: exact under any merge order.
    pub latency_sum_us: u64,
    /// Sum of successes' `ttfb_ms` (µs) over `ttfb_count` successes that had one.
    pub ttfb_sum_us: u64,
    pub ttfb_count: u64,
    /// Sum of `tokens_per_second` over the `tps_count` outcomes that had one.
    pub tps_sum: f64,
    pub tps_count: u64,
    /// Successes' `total_ms`.
    pub histogram: LatencyHistogram,
}

impl Rollup {
    pub fn empty(
        route: RouteId,
        kind: Option<OutcomeKind>,
        granularity: Granularity,
        bucket_start: DateTime<Utc>,
    ) -> Self {
        Self {
            route,
            kind,
            granularity,
            bucket_start,
            count: 0,
            successes: 0,
            good: 0,
            verified: 0,
            latency_sum_us: 0,
            ttfb_sum_us: 0,
            ttfb_count: 0,
            tps_sum: 0.0,
            tps_count: 0,
            histogram: LatencyHistogram::default(),
        }
    }

    /// Adds another rollup's figures (identity fields are left alone).
    pub fn merge(&mut self, o: &Rollup) {
        self.count += o.count;
        self.successes += o.successes;
        self.good += o.good;
        self.verified += o.verified;
        self.latency_sum_us += o.latency_sum_us;
        self.ttfb_sum_us += o.ttfb_sum_us;
        self.ttfb_count += o.ttfb_count;
        self.tps_sum += o.tps_sum;
        self.tps_count += o.tps_count;
        self.histogram.merge(&o.histogram);
    }

    /// Counts one outcome in. `threshold_ms` decides "good".
    pub(crate) fn add(&mut self, o: &ProbeOutcome, threshold_ms: f64) {
        self.count += 1;
        if o.verified == Some(true) {
            self.verified += 1;
        }
        if let Some(tps) = o.tokens_per_second {
            self.tps_sum += tps;
            self.tps_count += 1;
        }
        if !o.success {
            return;
        }
        self.successes += 1;
        if o.total_ms <= threshold_ms {
            self.good += 1;
        }
        self.latency_sum_us += ms_to_us(o.total_ms);
        if let Some(ttfb) = o.ttfb_ms {
            self.ttfb_sum_us += ms_to_us(ttfb);
            self.ttfb_count += 1;
        }
        self.histogram.record(o.total_ms);
    }

    pub fn latency_sum_ms(&self) -> f64 {
        self.latency_sum_us as f64 / 1000.0
    }

    /// Mean latency of successes.
    pub fn mean_ms(&self) -> Option<f64> {
        (self.successes > 0).then(|| self.latency_sum_ms() / self.successes as f64)
    }

    pub fn mean_ttfb_ms(&self) -> Option<f64> {
        (self.ttfb_count > 0).then(|| self.ttfb_sum_us as f64 / 1000.0 / self.ttfb_count as f64)
    }

    pub fn mean_tokens_per_second(&self) -> Option<f64> {
        (self.tps_count > 0).then(|| self.tps_sum / self.tps_count as f64)
    }

    /// successes / count: availability.
    pub fn success_ratio(&self) -> Option<f64> {
        (self.count > 0).then(|| self.successes as f64 / self.count as f64)
    }

    /// good / count: the SLO's good-outcome ratio.
    pub fn good_ratio(&self) -> Option<f64> {
        (self.count > 0).then(|| self.good as f64 / self.count as f64)
    }

    /// Latency quantile estimate (0..=1); within one histogram bucket (≈ ±19%) of exact.
    pub fn percentile(&self, q: f64) -> Option<f64> {
        self.histogram.quantile(q)
    }

    pub fn p50(&self) -> Option<f64> {
        self.percentile(0.50)
    }

    pub fn p95(&self) -> Option<f64> {
        self.percentile(0.95)
    }

    pub fn p99(&self) -> Option<f64> {
        self.percentile(0.99)
    }
}

/// Rounds to whole microseconds; inputs are validated finite and non-negative.
pub(crate) fn ms_to_us(ms: f64) -> u64 {
    (ms * 1000.0).round() as u64
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Identifies one rollup row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    route_id: i64,
    kind: OutcomeKind,
    granularity: Granularity,
    bucket_start_ms: i64,
}

struct Entry {
    figures: Rollup,
    dirty: bool,
    /// The batch that last touched it, for eviction.
    touched: u64,
}

/// The writer's in-memory copy of the buckets it is filling. It always equals the committed
/// rows plus the current batch's changes; after a failed transaction it must be cleared.
#[derive(Default)]
pub(crate) struct RollupCache {
    entries: HashMap<Key, Entry>,
    batch: u64,
}

/// Columns of one rollup row as [`RollupCache::flush`] writes it.
const UPSERT_COLUMNS: usize = 14;

/// Rows per upsert at most.
const UPSERT_CHUNK: usize = 256;

/// Buckets looked up per statement at most by [`RollupCache::preload`].
const PRELOAD_CHUNK: usize = 64;

/// Above this many cached buckets, those not touched by the last batch are dropped (they are
/// all committed by then, so dropping only costs a reload).
const CACHE_CAP: usize = 4096;

impl RollupCache {
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Adds an outcome to its bucket at every granularity.
    pub fn add(
        &mut self,
        conn: &Connection,
        route_id: i64,
        o: &ProbeOutcome,
        threshold_ms: f64,
    ) -> Result<(), StoreError> {
        for g in Granularity::ALL {
            let key = Key {
                route_id,
                kind: o.kind,
                granularity: g,
                bucket_start_ms: g.floor_ms(to_ms(o.started_at)),
            };
            let entry = match self.entries.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let figures = load(conn, &key, &o.route)?;
                    v.insert(Entry {
                        figures,
                        dirty: false,
                        touched: 0,
                    })
                }
            };
            entry.figures.add(o, threshold_ms);
            entry.dirty = true;
            entry.touched = self.batch;
        }
        Ok(())
    }

    /// Loads, in a few statements, the stored buckets of `outcomes` that are not in memory yet
    /// (a bucket with no row starts empty), so that [`RollupCache::add`] then finds each one
    /// without a round trip of its own.
    pub fn preload<'o>(
        &mut self,
        conn: &Connection,
        outcomes: impl Iterator<Item = (i64, &'o ProbeOutcome)>,
    ) -> Result<(), StoreError> {
        let mut missing: HashMap<Key, &RouteId> = HashMap::new();
        for (route_id, o) in outcomes {
            for g in Granularity::ALL {
                let key = Key {
                    route_id,
                    kind: o.kind,
                    granularity: g,
                    bucket_start_ms: g.floor_ms(to_ms(o.started_at)),
                };
                if !self.entries.contains_key(&key) {
                    missing.entry(key).or_insert(&o.route);
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let keys: Vec<Key> = missing.keys().copied().collect();
        let mut loaded: HashMap<Key, Figures> = HashMap::with_capacity(keys.len());
        let mut at = 0;
        for n in super::sql::row_chunks(keys.len(), PRELOAD_CHUNK) {
            let chunk = &keys[at..at + n];
            at += n;
            let mut values = Vec::with_capacity(n * 4);
            for k in chunk {
                values.extend([
                    ValueRef::Integer(k.route_id),
                    ValueRef::Integer(k.granularity.seconds()),
                    ValueRef::Integer(k.bucket_start_ms),
                    ValueRef::Text(k.kind.as_str()),
                ]);
            }
            let wanted = (0..n)
                .map(|i| {
                    let p = i * 4;
                    format!(
                        "(route_id = ?{} AND granularity_s = ?{} AND bucket_start_ms = ?{} AND kind = ?{})",
                        p + 1,
                        p + 2,
                        p + 3,
                        p + 4
                    )
                })
                .collect::<Vec<_>>()
                .join(" OR ");
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT route_id, granularity_s, bucket_start_ms, kind, count, successes, good,
                     verified, latency_sum_us, ttfb_sum_us, ttfb_count, tps_sum, tps_count,
                     histogram
                 FROM rollups WHERE {wanted}"
            ))?;
            let rows = stmt.query_map(&values[..], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, String>(3)?,
                    Figures {
                        counts: [
                            row.get(4)?,
                            row.get(5)?,
                            row.get(6)?,
                            row.get(7)?,
                            row.get(8)?,
                            row.get(9)?,
                            row.get(10)?,
                            row.get(12)?,
                        ],
                        tps_sum: row.get(11)?,
                        histogram: row.get(13)?,
                    },
                ))
            })?;
            for row in rows {
                let (route_id, seconds, bucket_start_ms, kind, figures) = row?;
                let granularity = Granularity::from_seconds(seconds).ok_or_else(|| {
                    StoreError::Corrupt(format!("rollup granularity of {seconds} s"))
                })?;
                let key = Key {
                    route_id,
                    kind: parse_kind(&kind)?,
                    granularity,
                    bucket_start_ms,
                };
                loaded.insert(key, figures);
            }
        }
        for (key, route) in missing {
            let mut figures = Rollup::empty(
                route.clone(),
                Some(key.kind),
                key.granularity,
                from_ms(key.bucket_start_ms)?,
            );
            if let Some(f) = loaded.remove(&key) {
                f.apply(&mut figures)?;
            }
            self.entries.insert(
                key,
                Entry {
                    figures,
                    dirty: false,
                    touched: self.batch,
                },
            );
        }
        Ok(())
    }

    /// Writes every changed bucket (inside the caller's transaction), several per statement;
    /// answers how many it wrote.
    pub fn flush(&mut self, conn: &Connection) -> Result<usize, StoreError> {
        let dirty: Vec<(&Key, &mut Entry)> =
            self.entries.iter_mut().filter(|(_, e)| e.dirty).collect();
        if dirty.is_empty() {
            return Ok(0);
        }
        let histograms: Vec<Vec<u8>> = dirty
            .iter()
            .map(|(_, e)| e.figures.histogram.encode())
            .collect();
        let mut values = Vec::with_capacity(dirty.len() * UPSERT_COLUMNS);
        for ((key, entry), histogram) in dirty.iter().zip(&histograms) {
            let f = &entry.figures;
            let int = |v: u64| ValueRef::Integer(to_i64(v));
            values.extend([
                ValueRef::Integer(key.route_id),
                ValueRef::Integer(key.granularity.seconds()),
                ValueRef::Integer(key.bucket_start_ms),
                ValueRef::Text(key.kind.as_str()),
                int(f.count),
                int(f.successes),
                int(f.good),
                int(f.verified),
                int(f.latency_sum_us),
                int(f.ttfb_sum_us),
                int(f.ttfb_count),
                ValueRef::Real(f.tps_sum),
                int(f.tps_count),
                ValueRef::Blob(histogram),
            ]);
        }
        // Each key once per statement (they come from a map): PostgreSQL refuses an upsert
        // that touches one row twice.
        conn.execute_rows(
            |n| {
                format!(
                    "INSERT INTO rollups (route_id, granularity_s, bucket_start_ms, kind, count,
                         successes, good, verified, latency_sum_us, ttfb_sum_us, ttfb_count,
                         tps_sum, tps_count, histogram)
                     VALUES {}
                     ON CONFLICT (granularity_s, bucket_start_ms, route_id, kind) DO UPDATE SET
                         count = excluded.count, successes = excluded.successes,
                         good = excluded.good, verified = excluded.verified,
                         latency_sum_us = excluded.latency_sum_us,
                         ttfb_sum_us = excluded.ttfb_sum_us, ttfb_count = excluded.ttfb_count,
                         tps_sum = excluded.tps_sum, tps_count = excluded.tps_count,
                         histogram = excluded.histogram",
                    value_tuples(n, UPSERT_COLUMNS)
                )
            },
            UPSERT_COLUMNS,
            &values,
            UPSERT_CHUNK,
        )?;
        let written = dirty.len();
        drop(values);
        for (_, entry) in dirty {
            // Cleared optimistically: if the commit fails the whole cache is cleared anyway.
            entry.dirty = false;
        }
        Ok(written)
    }

    /// Called after a commit: starts a new batch and bounds memory.
    pub fn committed(&mut self) {
        if self.entries.len() > CACHE_CAP {
            let last = self.batch;
            self.entries.retain(|_, e| e.touched == last);
        }
        // A burst (every route's outcome in one batch, at the start of an outage) grows the
        // table to tens of thousands of ~700-byte slots, and a map never gives them back.
        if self.entries.capacity() > 2 * CACHE_CAP {
            self.entries.shrink_to(CACHE_CAP);
        }
        self.batch += 1;
    }

    /// Forgets buckets of `g` that start before `cutoff_ms` (retention just deleted their rows).
    pub fn evict_before(&mut self, g: Granularity, cutoff_ms: i64) {
        self.entries
            .retain(|k, _| k.granularity != g || k.bucket_start_ms >= cutoff_ms);
    }
}

fn load(conn: &Connection, key: &Key, route: &RouteId) -> Result<Rollup, StoreError> {
    let bucket_start = from_ms(key.bucket_start_ms)?;
    let mut r = Rollup::empty(route.clone(), Some(key.kind), key.granularity, bucket_start);
    let row = conn
        .prepare_cached(
            "SELECT count, successes, good, verified, latency_sum_us, ttfb_sum_us, ttfb_count,
                 tps_sum, tps_count, histogram
             FROM rollups
             WHERE route_id = ?1 AND granularity_s = ?2 AND bucket_start_ms = ?3 AND kind = ?4",
        )?
        .query_row(
            params![
                key.route_id,
                key.granularity.seconds(),
                key.bucket_start_ms,
                key.kind.as_str()
            ],
            |row| {
                Ok(Figures {
                    counts: [
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                        row.get(5)?,
                        row.get(6)?,
                        row.get(8)?,
                    ],
                    tps_sum: row.get(7)?,
                    histogram: row.get(9)?,
                })
            },
        )
        .optional()?;
    if let Some(f) = row {
        f.apply(&mut r)?;
    }
    Ok(r)
}

/// A row's figures before conversion: count, successes, good, verified, latency_sum_us,
/// ttfb_sum_us, ttfb_count, tps_count; then tps_sum and the encoded histogram.
pub(crate) struct Figures {
    pub(crate) counts: [i64; 8],
    pub(crate) tps_sum: f64,
    pub(crate) histogram: Vec<u8>,
}

impl Figures {
    pub(crate) fn apply(self, r: &mut Rollup) -> Result<(), StoreError> {
        let [count, successes, good, verified, lat, ttfb, ttfb_n, tps_n] = self.counts.map(to_u64);
        r.count = count;
        r.successes = successes;
        r.good = good;
        r.verified = verified;
        r.latency_sum_us = lat;
        r.ttfb_sum_us = ttfb;
        r.ttfb_count = ttfb_n;
        r.tps_sum = self.tps_sum;
        r.tps_count = tps_n;
        r.histogram = LatencyHistogram::decode(&self.histogram)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(())
    }
}

impl Reader {
    /// One rollup per bucket of `g` that overlaps `[since, until)`, oldest first, merged over
    /// `kinds` (an empty slice means every kind). Buckets with no outcomes are absent.
    pub fn rollups(
        &self,
        route: &RouteId,
        g: Granularity,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        kinds: &[OutcomeKind],
    ) -> Result<Vec<Rollup>, StoreError> {
        let Some(id) = self.route_id(route)? else {
            return Ok(Vec::new());
        };
        let kind = match kinds {
            [k] => Some(*k),
            _ => None,
        };
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT bucket_start_ms, count, successes, good, verified, latency_sum_us,
                 ttfb_sum_us, ttfb_count, tps_sum, tps_count, histogram, kind
             FROM rollups
             WHERE route_id = ?1 AND granularity_s = ?2 AND bucket_start_ms >= ?3
                 AND bucket_start_ms < ?4 AND {}
             ORDER BY bucket_start_ms",
            kind_filter_sql("kind", kinds)
        ))?;
        let rows = stmt.query_map(
            params![id, g.seconds(), g.floor_ms(to_ms(since)), to_ms(until)],
            |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(11)?,
                    Figures {
                        counts: [
                            row.get(1)?,
                            row.get(2)?,
                            row.get(3)?,
                            row.get(4)?,
                            row.get(5)?,
                            row.get(6)?,
                            row.get(7)?,
                            row.get(9)?,
                        ],
                        tps_sum: row.get(8)?,
                        histogram: row.get(10)?,
                    },
                ))
            },
        )?;
        let mut out: Vec<Rollup> = Vec::new();
        for row in rows {
            let (start_ms, row_kind, figures) = row?;
            parse_kind(&row_kind)?;
            let mut one = Rollup::empty(route.clone(), kind, g, from_ms(start_ms)?);
            figures.apply(&mut one)?;
            match out.last_mut() {
                Some(last) if to_ms(last.bucket_start) == start_ms => last.merge(&one),
                _ => out.push(one),
            }
        }
        Ok(out)
    }

    /// Everything of `g`'s buckets overlapping `[since, until)` merged into one rollup (over
    /// `kinds`; empty means every kind). `bucket_start` is the start of the first bucket.
    /// Use hourly rollups for 24 h / 7 d / 30 d windows, daily ones beyond.
    pub fn summary(
        &self,
        route: &RouteId,
        g: Granularity,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        kinds: &[OutcomeKind],
    ) -> Result<Rollup, StoreError> {
        let kind = match kinds {
            [k] => Some(*k),
            _ => None,
        };
        let mut total = Rollup::empty(route.clone(), kind, g, g.bucket_start(since));
        for r in self.rollups(route, g, since, until, kinds)? {
            total.merge(&r);
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_align_to_utc() {
        let t = DateTime::parse_from_rfc3339("2026-03-04T13:47:12.345Z")
            .unwrap()
            .with_timezone(&Utc);
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        assert_eq!(
            Granularity::FiveMinutes.bucket_start(t),
            at("2026-03-04T13:45:00Z")
        );
        assert_eq!(
            Granularity::Hour.bucket_start(t),
            at("2026-03-04T13:00:00Z")
        );
        assert_eq!(Granularity::Day.bucket_start(t), at("2026-03-04T00:00:00Z"));
        assert_eq!(Granularity::from_seconds(3600), Some(Granularity::Hour));
        assert_eq!(Granularity::from_seconds(7), None);
    }

    #[test]
    fn the_cache_gives_back_the_room_a_burst_took() {
        let mut cache = RollupCache::default();
        let route = RouteId::new("p", "r", "m");
        let touch = |cache: &mut RollupCache, routes: i64| {
            for route_id in 0..routes {
                let key = Key {
                    route_id,
                    kind: OutcomeKind::Probe,
                    granularity: Granularity::Hour,
                    bucket_start_ms: 0,
                };
                let figures = Rollup::empty(route.clone(), None, Granularity::Hour, Utc::now());
                let touched = cache.batch;
                cache.entries.insert(
                    key,
                    Entry {
                        figures,
                        dirty: false,
                        touched,
                    },
                );
            }
            cache.committed();
        };
        // Every route at once, then the usual small batches.
        touch(&mut cache, 20_000);
        assert_eq!(cache.entries.len(), 20_000, "the burst's batch is kept");
        touch(&mut cache, 100);
        assert_eq!(
            cache.entries.len(),
            100,
            "older buckets are dropped past the cap"
        );
        assert!(
            cache.entries.capacity() <= 2 * CACHE_CAP,
            "capacity {} after the burst",
            cache.entries.capacity()
        );
    }
}
