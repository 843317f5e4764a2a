//! The burn-rate windows as running sums, kept in memory as outcomes are committed, so an
//! evaluation reads no store row: at thousands of routes, reading five rollup windows per
//! route every minute was most of the monitor's work.
//!
//! Per route, two rings of buckets aligned like the store's rollups: 5-minute buckets
//! covering the 6-hour window, hourly ones covering 3 days — the granularities
//! [`super::burn::read_windows`] reads, so a window covers exactly the buckets it would read
//! from the store (bucket-aligned, up to one bucket further back). The counts are those of
//! the rollups: **probe** outcomes ([`crate::slo::KINDS`]), bad = not a success within
//! `[slo] latency_threshold`.
//!
//! [`Tally::seed`] reads the rollups once at start; from then on the wiring calls
//! [`Tally::record`] with every outcome the store accepted, so the sums equal the rollups.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::burn::{Counts, Windows};
use crate::outcome::ProbeOutcome;
use crate::route::RouteId;
use crate::store::{Granularity, Reader, StoreError};

const FINE_MS: i64 = 300_000;
const COARSE_MS: i64 = 3_600_000;
/// 6 h of 5-minute buckets and the one a window may reach back into.
const FINE_SLOTS: usize = 73;
/// 3 d of hourly buckets and the one a window may reach back into.
const COARSE_SLOTS: usize = 73;

/// A bucket's counts. A 5-minute bucket counts in 16 bits (it saturates only at a probe
/// every 5 ms), an hourly one in 32: a route holds 146 of them.
trait Count: Copy + Default + Into<u64> {
    fn plus(self, n: u64) -> Self;
}

macro_rules! count {
    ($t:ty) => {
        impl Count for $t {
            fn plus(self, n: u64) -> Self {
                self.saturating_add(<$t>::try_from(n).unwrap_or(<$t>::MAX))
            }
        }
    };
}
count!(u16);
count!(u32);

#[derive(Debug, Clone, Copy, Default)]
struct Slot<C> {
    total: C,
    bad: C,
}

/// The `N` latest buckets of `size_ms`, counted from the epoch: bucket `b` lives in slot
/// `b % N` while `latest − N < b ≤ latest`. Moving `latest` on empties the slots it passes,
/// so a slot never holds a bucket older than the ring (no per-slot bucket number needed).
#[derive(Debug, Clone)]
struct Ring<C, const N: usize> {
    /// The newest bucket counted (0, a bucket of 1970: none yet).
    latest: u32,
    slots: [Slot<C>; N],
}

impl<C: Count, const N: usize> Default for Ring<C, N> {
    fn default() -> Self {
        Self {
            latest: 0,
            slots: [Slot::default(); N],
        }
    }
}

impl<C: Count, const N: usize> Ring<C, N> {
    fn add(&mut self, bucket: i64, total: u64, bad: u64) {
        // Before 1970 or after the year 42,000: no bucket of a real outcome.
        let Some(bucket) = u32::try_from(bucket).ok().filter(|b| *b > 0) else {
            return;
        };
        if bucket > self.latest {
            let passed = (bucket - self.latest) as usize;
            if passed >= N {
                self.slots = [Slot::default(); N];
            } else {
                for b in self.latest + 1..=bucket {
                    self.slots[b as usize % N] = Slot::default();
                }
            }
            self.latest = bucket;
        } else if self.latest - bucket >= N as u32 {
            // Older than what the ring holds: outside every window already.
            return;
        }
        let s = &mut self.slots[bucket as usize % N];
        s.total = s.total.plus(total);
        s.bad = s.bad.plus(bad);
    }

    /// Buckets `from..=to`.
    fn sum(&self, from: i64, to: i64) -> Counts {
        let mut c = Counts::default();
        let oldest = i64::from(self.latest) - N as i64 + 1;
        for b in from.max(oldest).max(1)..=to.min(i64::from(self.latest)) {
            let s = self.slots[b as usize % N];
            c.total += s.total.into();
            c.bad += s.bad.into();
        }
        c
    }
}

#[derive(Debug, Clone, Default)]
struct RouteSums {
    fine: Ring<u16, FINE_SLOTS>,
    coarse: Ring<u32, COARSE_SLOTS>,
}

impl RouteSums {
    fn add(&mut self, at_ms: i64, total: u64, bad: u64) {
        self.fine.add(at_ms.div_euclid(FINE_MS), total, bad);
        self.coarse.add(at_ms.div_euclid(COARSE_MS), total, bad);
    }

    fn windows(&self, now: DateTime<Utc>) -> Windows {
        let now_ms = now.timestamp_millis();
        // As the store reads them: buckets overlapping `[now − w + 1 ms, now + 1 ms)`.
        let fine = |secs: i64| {
            self.fine.sum(
                (now_ms - secs * 1000 + 1).div_euclid(FINE_MS),
                now_ms.div_euclid(FINE_MS),
            )
        };
        let coarse = |secs: i64| {
            self.coarse.sum(
                (now_ms - secs * 1000 + 1).div_euclid(COARSE_MS),
                now_ms.div_euclid(COARSE_MS),
            )
        };
        Windows {
            m5: fine(300),
            m30: fine(1800),
            h1: fine(3600),
            h6: fine(6 * 3600),
            d3: coarse(3 * 86_400),
        }
    }
}

/// The running sums of every configured route; shared by the wiring (which records) and the
/// alert engine (which reads). Outcomes of routes it was not built with are ignored.
#[derive(Debug)]
pub struct Tally {
    /// Each route's place in `sums` (fixed at construction).
    index: HashMap<RouteId, usize>,
    sums: Mutex<Vec<RouteSums>>,
    threshold_ms: f64,
}

impl Tally {
    /// Empty sums for `routes`; `latency_threshold` is `[slo] latency_threshold`.
    pub fn new<'a>(
        routes: impl IntoIterator<Item = &'a RouteId>,
        latency_threshold: Duration,
    ) -> Self {
        let index: HashMap<RouteId, usize> = routes
            .into_iter()
            .enumerate()
            .map(|(i, r)| (r.clone(), i))
            .collect();
        let sums = vec![RouteSums::default(); index.len()];
        Self {
            index,
            sums: Mutex::new(sums),
            threshold_ms: latency_threshold.as_secs_f64() * 1000.0,
        }
    }

    /// Loads what the store's rollups hold of the windows ending at `now`. Call before any
    /// outcome is recorded (what is recorded afterwards is added on top). Blocking.
    pub fn seed(&self, reader: &Reader, now: DateTime<Utc>) -> Result<(), StoreError> {
        let ids: Vec<(&RouteId, usize)> = self.index.iter().map(|(r, i)| (r, *i)).collect();
        let until = now + chrono::Duration::milliseconds(1);
        let fine_since = now - chrono::Duration::seconds(6 * 3600 + 300);
        let coarse_since = now - chrono::Duration::seconds(3 * 86_400 + 3600);
        for (id, i) in ids {
            let fine = reader.rollups(
                id,
                Granularity::FiveMinutes,
                fine_since,
                until,
                crate::slo::KINDS,
            )?;
            let coarse = reader.rollups(
                id,
                Granularity::Hour,
                coarse_since,
                until,
                crate::slo::KINDS,
            )?;
            let mut all = self.lock();
            let sums = &mut all[i];
            for r in fine {
                let bad = r.count.saturating_sub(r.good);
                sums.fine.add(
                    r.bucket_start.timestamp_millis().div_euclid(FINE_MS),
                    r.count,
                    bad,
                );
            }
            for r in coarse {
                let bad = r.count.saturating_sub(r.good);
                sums.coarse.add(
                    r.bucket_start.timestamp_millis().div_euclid(COARSE_MS),
                    r.count,
                    bad,
                );
            }
        }
        Ok(())
    }

    /// Counts one stored outcome in (only probe outcomes count, as in the rollups).
    pub fn record(&self, o: &ProbeOutcome) {
        if !crate::slo::KINDS.contains(&o.kind) {
            return;
        }
        let good = o.success && o.total_ms <= self.threshold_ms;
        if let Some(&i) = self.index.get(&o.route) {
            self.lock()[i].add(o.started_at.timestamp_millis(), 1, u64::from(!good));
        }
    }

    /// The windows of `route` ending at `now` (`None`: not a route of this tally).
    pub fn windows(&self, route: &RouteId, now: DateTime<Utc>) -> Option<Windows> {
        let i = *self.index.get(route)?;
        Some(self.lock()[i].windows(now))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RouteSums>> {
        self.sums.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::OutcomeKind;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn outcome(route: &RouteId, t: DateTime<Utc>, success: bool, ms: f64) -> ProbeOutcome {
        ProbeOutcome {
            route: route.clone(),
            kind: OutcomeKind::Probe,
            started_at: t,
            success,
            attributed_to: None,
            verified: None,
            ttfb_ms: None,
            ttft_ms: None,
            first_answer_ms: None,
            total_ms: ms,
            output_tokens: None,
            tokens_estimated: false,
            tokens_per_second: None,
            model_reported: None,
            system_fingerprint: None,
            http_status: None,
            error: None,
            answer: None,
            max_tokens_exhausted: false,
            ratelimit: None,
        }
    }

    #[test]
    fn windows_count_the_buckets_they_overlap() {
        let r = RouteId::new("p", "r", "m");
        let t = Tally::new([&r], Duration::from_secs(10));
        let now = at("2026-03-04T12:07:00Z");
        // In the current 5-minute bucket (12:05): counted by every window.
        t.record(&outcome(&r, at("2026-03-04T12:06:00Z"), false, 100.0));
        // 12:00 bucket: the 5-minute window 12:02–12:07 overlaps it, so it counts (bucket-
        // aligned, as the store reads it).
        t.record(&outcome(&r, at("2026-03-04T12:01:00Z"), true, 100.0));
        // 11:50: outside the 5-minute window, inside 30 minutes.
        t.record(&outcome(&r, at("2026-03-04T11:50:00Z"), true, 20_000.0));
        // 7 h ago: only the 3-day window.
        t.record(&outcome(&r, at("2026-03-04T05:00:00Z"), false, 100.0));
        // 4 days ago: nowhere.
        t.record(&outcome(&r, at("2026-02-28T12:00:00Z"), false, 100.0));
        let w = t.windows(&r, now).unwrap();
        assert_eq!(w.m5, Counts::new(2, 1));
        // The slow success is bad (over the latency threshold).
        assert_eq!(w.m30, Counts::new(3, 2));
        assert_eq!(w.h1, Counts::new(3, 2));
        assert_eq!(w.h6, Counts::new(3, 2));
        assert_eq!(w.d3, Counts::new(4, 3));
        assert_eq!(t.windows(&RouteId::new("x", "y", "z"), now), None);
    }

    #[test]
    fn passive_outcomes_and_unknown_routes_are_not_counted() {
        let r = RouteId::new("p", "r", "m");
        let t = Tally::new([&r], Duration::from_secs(10));
        let now = at("2026-03-04T12:07:00Z");
        let mut o = outcome(&r, now, false, 1.0);
        o.kind = OutcomeKind::Passive;
        t.record(&o);
        t.record(&outcome(&RouteId::new("x", "y", "z"), now, false, 1.0));
        assert_eq!(t.windows(&r, now).unwrap(), Windows::default());
    }

    #[test]
    fn a_ring_slot_is_reused_for_its_newer_bucket() {
        let r = RouteId::new("p", "r", "m");
        let t = Tally::new([&r], Duration::from_secs(10));
        let old = at("2026-03-04T00:00:00Z");
        t.record(&outcome(&r, old, false, 1.0));
        // 73 five-minute buckets later the same slot holds the new bucket only.
        let new = old + chrono::Duration::minutes(5 * 73);
        t.record(&outcome(&r, new, true, 1.0));
        let w = t.windows(&r, new).unwrap();
        assert_eq!(w.h6, Counts::new(1, 0));
        // A late outcome for the overwritten bucket is outside every short window: dropped.
        t.record(&outcome(&r, old, false, 1.0));
        assert_eq!(t.windows(&r, new).unwrap().h6, Counts::new(1, 0));
    }

    #[test]
    fn a_late_outcome_inside_the_ring_counts_and_a_route_holds_under_900_bytes() {
        let r = RouteId::new("p", "r", "m");
        let t = Tally::new([&r], Duration::from_secs(10));
        let now = at("2026-03-04T12:07:00Z");
        t.record(&outcome(&r, now, true, 1.0));
        // Committed after a newer one (a slow probe): still in its 5-minute bucket.
        t.record(&outcome(&r, at("2026-03-04T11:58:00Z"), false, 1.0));
        let w = t.windows(&r, now).unwrap();
        assert_eq!(w.m30, Counts::new(2, 1));
        assert_eq!(w.m5, Counts::new(1, 0));
        // A 5-minute bucket's 16-bit counts saturate instead of wrapping.
        let mut ring = Ring::<u16, 4>::default();
        ring.add(10, 70_000, 1);
        ring.add(10, 1, 1);
        assert_eq!(ring.sum(10, 10), Counts::new(65_535, 2));
        // Two rings of 73 buckets: 146 × 12 bytes with a bucket number per slot.
        assert!(std::mem::size_of::<RouteSums>() <= 900);
    }
}
