//! Bulk reads for the published views (`/api/v1/status`, the status page): one query answers
//! a figure for *every* route, so a status request at 1,000 routes costs a handful of range
//! scans instead of thousands of per-route queries.
//!
//! - [`Reader::counts_by_route`]: count / successes / good over a window, from hourly rollups
//!   at the window's edges and daily rollups in between (30 days is ~30 rows per route).
//! - [`Reader::summaries_by_route`]: merged rollups (with latency histograms) per route.
//! - [`Reader::recent_samples`]: raw TTFB and tokens/s values of the last minutes, for
//!   percentiles the rollups do not keep (they hold only sums for those two).

use std::collections::HashMap;

use rustc_hash::FxBuildHasher;

use super::sql::{params, Row, SqlError};
use chrono::{DateTime, Utc};

use super::rollups::Figures;
use super::{from_ms, kind_filter_sql, to_ms, Granularity, Reader, Rollup, StoreError, ALL_KINDS};
use crate::outcome::OutcomeKind;
use crate::route::RouteId;

/// Outcome counts over a window (see [`Rollup`] for what each means).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub count: u64,
    pub successes: u64,
    pub good: u64,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        self.count += o.count;
        self.successes += o.successes;
        self.good += o.good;
    }

    /// successes / count; `None` without outcomes.
    pub fn success_ratio(&self) -> Option<f64> {
        (self.count > 0).then(|| self.successes as f64 / self.count as f64)
    }

    /// good / count; `None` without outcomes.
    pub fn good_ratio(&self) -> Option<f64> {
        (self.count > 0).then(|| self.good as f64 / self.count as f64)
    }
}

/// Raw values of one route, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    /// TTFB of successful outcomes of the kinds asked for TTFB.
    pub ttfb_ms: Vec<f64>,
    /// Tokens/s of successful outcomes of the kinds asked for throughput.
    pub tokens_per_second: Vec<f64>,
}

/// Per route, `(UTC day, counts)` oldest first, the day counted from 1970-01-01 (its start is
/// the day × 86,400 s): [`Reader::daily_counts_by_route`]. Days as numbers, not times: the
/// status page keeps 90 of them for every route.
pub type DailyCounts = HashMap<RouteId, Vec<(i64, Counts)>>;

/// Most raw rows [`Reader::recent_samples`] reads in one call (newest first): bounds a status
/// request even when passive traffic floods the window.
pub const MAX_SAMPLE_ROWS: usize = 500_000;

/// One window of [`Reader::counts_by_routes`]: outcomes of `kinds` (empty: every kind)
/// since `since`.
#[derive(Debug, Clone, Copy)]
pub struct Window<'k> {
    pub since: DateTime<Utc>,
    pub kinds: &'k [OutcomeKind],
}

/// Rollups of one granularity whose bucket starts in `[from, to)` (epoch ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stretch {
    granularity: Granularity,
    from: i64,
    to: i64,
}

impl Stretch {
    fn is_empty(&self) -> bool {
        self.from >= self.to
    }

    fn holds(&self, g: Granularity, start: i64) -> bool {
        g == self.granularity && (self.from..self.to).contains(&start)
    }
}

/// The rollups that make up the window from `since` to `end` (ms): hourly ones for the
/// partial days at both ends, daily ones for the whole days between; some may be empty.
fn stretches(since: DateTime<Utc>, end: i64) -> [Stretch; 3] {
    let (hour, day) = (Granularity::Hour, Granularity::Day);
    let start = hour.floor_ms(to_ms(since));
    // Whole days strictly inside the window.
    let first_day = day.floor_ms(start + day.millis() - 1);
    let last_day = day.floor_ms(end);
    let stretch = |granularity, from, to| Stretch {
        granularity,
        from,
        to,
    };
    if first_day < last_day {
        [
            stretch(hour, start, first_day),
            stretch(day, first_day, last_day),
            stretch(hour, last_day, end),
        ]
    } else {
        [
            stretch(hour, start, end),
            stretch(day, 0, 0),
            stretch(hour, 0, 0),
        ]
    }
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The count, successes and good columns starting at column `first`.
fn counts_at(r: &Row<'_>, first: usize) -> Result<Counts, SqlError> {
    Ok(Counts {
        count: u(r.get(first)?),
        successes: u(r.get(first + 1)?),
        good: u(r.get(first + 2)?),
    })
}

impl Reader {
    /// Interned id → route, for the bulk queries.
    fn route_names(&self) -> Result<HashMap<i64, RouteId>, StoreError> {
        let mut stmt = self.conn.prepare_cached("SELECT id, name FROM routes")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
        let mut out = HashMap::new();
        for row in rows {
            let (id, name) = row?;
            if let Some(route) = RouteId::parse(&name) {
                out.insert(id, route);
            }
        }
        Ok(out)
    }

    /// Counts per route over `[since, until)`, hour-aligned: hourly rollups for the partial
    /// days at both ends, daily rollups for the whole days between. The window starts at the
    /// hour holding `since` (so "24 h" covers 24–25 h of buckets). Routes without outcomes
    /// are absent.
    pub fn counts_by_route(
        &self,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        kinds: &[OutcomeKind],
    ) -> Result<HashMap<RouteId, Counts>, StoreError> {
        let mut all = self.counts_by_routes::<HashMap<_, _>>(&[Window { since, kinds }], until)?;
        Ok(all.pop().unwrap_or_default())
    }

    /// [`Reader::counts_by_route`] for several windows ending at `until`, answered in their
    /// order. Each stretch of rollups is read once for all the windows that need it (the
    /// 30-day window's days hold the 7-day window's, and every window ends with today's
    /// hours), without grouping in SQL: summing here spares the database a sort per window.
    pub fn counts_by_routes<M: FromIterator<(RouteId, Counts)>>(
        &self,
        windows: &[Window<'_>],
        until: DateTime<Utc>,
    ) -> Result<Vec<M>, StoreError> {
        let end = to_ms(until);
        let plans: Vec<[Stretch; 3]> = windows.iter().map(|w| stretches(w.since, end)).collect();
        let mut scans: Vec<Stretch> = plans
            .iter()
            .flatten()
            .filter(|s| !s.is_empty())
            .copied()
            .collect();
        scans.sort_by_key(|s| (s.granularity, s.from));
        let mut merged: Vec<Stretch> = Vec::with_capacity(scans.len());
        for s in scans {
            match merged.last_mut() {
                Some(m) if m.granularity == s.granularity && s.from <= m.to => {
                    m.to = m.to.max(s.to)
                }
                _ => merged.push(s),
            }
        }
        // The kinds any window wants (a window with none wants every kind): rows of other
        // kinds, or of a kind this version does not know, are not read.
        let mut kinds: Vec<OutcomeKind> = Vec::new();
        for w in windows {
            let wants = if w.kinds.is_empty() {
                ALL_KINDS
            } else {
                w.kinds
            };
            for k in wants {
                if !kinds.contains(k) {
                    kinds.push(*k);
                }
            }
        }
        let mut by_id: Vec<HashMap<i64, Counts, FxBuildHasher>> =
            vec![HashMap::default(); windows.len()];
        for scan in merged {
            let mut stmt = self.conn.prepare_cached(&format!(
                "SELECT route_id, bucket_start_ms, kind, count, successes, good FROM rollups
                 WHERE granularity_s = ?1 AND bucket_start_ms >= ?2 AND bucket_start_ms < ?3
                     AND {}",
                kind_filter_sql("kind", &kinds)
            ))?;
            let rows = stmt.query_map(
                params![scan.granularity.seconds(), scan.from, scan.to],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, OutcomeKind>(2)?,
                        counts_at(r, 3)?,
                    ))
                },
            )?;
            for row in rows {
                let (id, start, kind, c) = row?;
                for ((w, plan), into) in windows.iter().zip(&plans).zip(by_id.iter_mut()) {
                    let wanted = w.kinds.is_empty() || w.kinds.contains(&kind);
                    if wanted && plan.iter().any(|s| s.holds(scan.granularity, start)) {
                        into.entry(id).or_default().add(c);
                    }
                }
            }
        }
        let names = self.route_names()?;
        Ok(by_id
            .into_iter()
            .map(|counts| {
                counts
                    .into_iter()
                    .filter_map(|(id, c)| names.get(&id).map(|r| (r.clone(), c)))
                    .collect()
            })
            .collect())
    }

    /// Every route's buckets of `g` overlapping `[since, until)` merged into one rollup per
    /// route (over `kinds`; empty means every kind). Routes without outcomes are absent.
    pub fn summaries_by_route(
        &self,
        g: Granularity,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        kinds: &[OutcomeKind],
    ) -> Result<HashMap<RouteId, Rollup>, StoreError> {
        let kind = match kinds {
            [k] => Some(*k),
            _ => None,
        };
        let names = self.route_names()?;
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT route_id, count, successes, good, verified, latency_sum_us, ttfb_sum_us,
                 ttfb_count, tps_sum, tps_count, histogram
             FROM rollups
             WHERE granularity_s = ?1 AND bucket_start_ms >= ?2 AND bucket_start_ms < ?3 AND {}",
            kind_filter_sql("kind", kinds)
        ))?;
        let from = to_ms(g.bucket_start(since));
        let rows = stmt.query_map(params![g.seconds(), from, to_ms(until)], |row| {
            Ok((
                row.get::<_, i64>(0)?,
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
        })?;
        let start = from_ms(from)?;
        let mut out: HashMap<RouteId, Rollup> = HashMap::new();
        for row in rows {
            let (id, figures) = row?;
            let Some(route) = names.get(&id) else {
                continue;
            };
            let mut one = Rollup::empty(route.clone(), kind, g, start);
            figures.apply(&mut one)?;
            out.entry(route.clone())
                .or_insert_with(|| Rollup::empty(route.clone(), kind, g, start))
                .merge(&one);
        }
        Ok(out)
    }

    /// Every route's daily buckets starting in `[since, until)` (UTC days), summed over
    /// `kinds`, oldest first: the status page's day bars. One range scan of the rollups'
    /// primary key in its order (no sort), no histogram decoded. The kinds of a day arrive
    /// next to each other and are summed here: grouping in SQL cost the database more than
    /// the scan itself. (An index of the daily counts alone halved this read, but cost the
    /// writer 10–16% of its insert rate: it rewrote an index entry per daily bucket update.)
    pub fn daily_counts_by_route(
        &self,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        kinds: &[OutcomeKind],
    ) -> Result<DailyCounts, StoreError> {
        let mut stmt = self.conn.prepare_cached(&daily_counts_sql(kinds))?;
        let from = to_ms(Granularity::Day.bucket_start(since));
        let params = params![Granularity::Day.seconds(), from, to_ms(until)];
        let rows = stmt.query_map(params, |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, counts_at(r, 2)?))
        })?;
        let mut by_id: HashMap<i64, Vec<(i64, Counts)>, FxBuildHasher> = HashMap::default();
        for row in rows {
            let (id, start, c) = row?;
            let day = start.div_euclid(Granularity::Day.millis());
            let days = by_id.entry(id).or_default();
            match days.last_mut() {
                Some((last, sum)) if *last == day => sum.add(c),
                _ => days.push((day, c)),
            }
        }
        let names = self.route_names()?;
        Ok(by_id
            .into_iter()
            .filter_map(|(id, days)| Some((names.get(&id)?.clone(), days)))
            .collect())
    }

    /// Raw TTFB (from successful outcomes of `ttfb_kinds`) and tokens/s (from successful
    /// outcomes of `tps_kinds`) of every route since `since`, newest first; at most
    /// [`MAX_SAMPLE_ROWS`] rows are read.
    pub fn recent_samples(
        &self,
        since: DateTime<Utc>,
        ttfb_kinds: &[OutcomeKind],
        tps_kinds: &[OutcomeKind],
    ) -> Result<HashMap<RouteId, Samples>, StoreError> {
        let names = self.route_names()?;
        let mut kinds = ttfb_kinds.to_vec();
        kinds.extend(tps_kinds.iter().filter(|k| !ttfb_kinds.contains(k)));
        if kinds.is_empty() {
            return Ok(HashMap::new());
        }
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT route_id, kind, ttfb_ms, tokens_per_second FROM outcomes
             WHERE started_at_ms >= ?1 AND success = 1
                 AND (ttfb_ms IS NOT NULL OR tokens_per_second IS NOT NULL) AND {}
             ORDER BY started_at_ms DESC LIMIT ?2",
            kind_filter_sql("kind", &kinds)
        ))?;
        let rows = stmt.query_map(
            params![
                to_ms(since),
                i64::try_from(MAX_SAMPLE_ROWS).unwrap_or(i64::MAX)
            ],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, OutcomeKind>(1)?,
                    r.get::<_, Option<f64>>(2)?,
                    r.get::<_, Option<f64>>(3)?,
                ))
            },
        )?;
        let mut out: HashMap<RouteId, Samples> = HashMap::new();
        for row in rows {
            let (id, kind, ttfb, tps) = row?;
            let Some(route) = names.get(&id) else {
                continue;
            };
            let want_ttfb = ttfb.filter(|_| ttfb_kinds.contains(&kind));
            let want_tps = tps.filter(|_| tps_kinds.contains(&kind));
            if want_ttfb.is_none() && want_tps.is_none() {
                continue;
            }
            let s = out.entry(route.clone()).or_default();
            s.ttfb_ms.extend(want_ttfb);
            s.tokens_per_second.extend(want_tps);
        }
        Ok(out)
    }
}

/// [`Reader::daily_counts_by_route`]'s query: `?1` the granularity, `?2` and `?3` bound the
/// bucket starts (ms).
fn daily_counts_sql(kinds: &[OutcomeKind]) -> String {
    format!(
        "SELECT route_id, bucket_start_ms, count, successes, good FROM rollups
         WHERE granularity_s = ?1 AND bucket_start_ms >= ?2 AND bucket_start_ms < ?3 AND {}
         ORDER BY bucket_start_ms, route_id",
        kind_filter_sql("kind", kinds)
    )
}

/// The `q` quantile (0..=1) of `values` by the nearest-rank method; `None` when empty.
/// Sorts `values` in place.
pub fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = (q.clamp(0.0, 1.0) * values.len() as f64).ceil() as usize;
    values
        .get(rank.saturating_sub(1).min(values.len() - 1))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_bars_scan_the_primary_key_in_its_order() {
        let mut conn = super::super::sql::Connection::from_sqlite(
            rusqlite::Connection::open_in_memory().unwrap(),
        );
        super::super::migrate::migrate(&mut conn).unwrap();
        let raw = conn.as_sqlite().unwrap();
        for kinds in [&[][..], &[OutcomeKind::Probe, OutcomeKind::Throughput][..]] {
            let sql = daily_counts_sql(kinds);
            let mut plan = raw.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let rows = plan
                .query_map([0, 0, 1], |r| r.get::<_, String>(3))
                .unwrap();
            let steps = rows.map(Result::unwrap).collect::<Vec<_>>().join("; ");
            assert!(steps.contains("USING PRIMARY KEY"), "{kinds:?}: {steps}");
            assert!(!steps.contains("TEMP B-TREE"), "{kinds:?}: {steps}");
        }
    }

    #[test]
    fn nearest_rank_quantiles() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.5), Some(50.0));
        assert_eq!(quantile(&mut v, 0.95), Some(95.0));
        assert_eq!(quantile(&mut v, 0.99), Some(99.0));
        assert_eq!(quantile(&mut v, 1.0), Some(100.0));
        assert_eq!(quantile(&mut v, 0.0), Some(1.0));
        assert_eq!(quantile(&mut [], 0.5), None);
        assert_eq!(quantile(&mut [7.0], 0.99), Some(7.0));
    }
}
