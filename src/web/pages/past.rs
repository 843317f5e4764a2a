//! The day bars of the days before today, kept in memory by a task of their own.
//!
//! Reading 89 days of daily rollups for every route is the page's one long read (at 1,000
//! routes it is most of what a cold `/` waited for). The days before today change rarely —
//! an agent's late outcomes, a second monitor writing the same database, the demo's history —
//! so no request reads them: the keeper reads them when the service starts (requests before
//! its first read show the bars as warming) and again every [`PAST_DAYS_EVERY`] and right after
//! midnight UTC; a request reads only the days from the keeper's last read to now (today, and
//! yesterday for the moments after midnight until the keeper read again).

use chrono::{DateTime, Duration as TimeDelta, Utc};

use super::DAYS;
use crate::route::RouteMap;
use crate::store::{Counts, DailyCounts, Granularity, Store, StoreError};
use crate::web::api::UPTIME_KINDS;
use crate::web::kept::{Keep, Kept};

/// How often the keeper reads the days before today again: late outcomes for a past day
/// (an agent's, or another monitor's on the same database) show in its bar within this.
pub const PAST_DAYS_EVERY: TimeDelta = TimeDelta::minutes(10);

/// The days before `today` (a UTC day start), as read at `read_at`.
#[derive(Debug, Default)]
pub struct PastDays {
    pub(super) today: DateTime<Utc>,
    pub(super) read_at: DateTime<Utc>,
    /// Per route, oldest first, exactly as many as it has: 16 bytes a day, not a growing
    /// vector of 40-byte entries (90 days of 10,000 routes: 14 MB instead of about 50).
    pub(super) days: RouteMap<Box<[PastDay]>>,
}

/// One route's counts of one day, as the bars read them.
#[derive(Debug, Clone, Copy)]
pub(super) struct PastDay {
    /// Days since 1970-01-01 (UTC).
    day: u32,
    count: u32,
    successes: u32,
    good: u32,
}

impl PastDays {
    /// The [`DAYS`] − 1 days before `now`'s day, read from the daily rollups.
    pub(super) fn read(store: &Store, now: DateTime<Utc>) -> Result<Self, StoreError> {
        let today = Granularity::Day.bucket_start(now);
        let since = today - TimeDelta::days(DAYS - 1);
        let days = store
            .reader()?
            .daily_counts_by_route(since, today, UPTIME_KINDS)?;
        Ok(Self {
            today,
            read_at: now,
            days: Self::compact(days),
        })
    }

    pub(super) fn compact(days: DailyCounts) -> RouteMap<Box<[PastDay]>> {
        // A day's counts of one route fit 32 bits (a probe every millisecond for a day).
        let n = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        days.into_iter()
            .map(|(id, v)| {
                let v = v
                    .into_iter()
                    .map(|(day, c)| PastDay {
                        day: n(day.max(0).unsigned_abs()),
                        count: n(c.count),
                        successes: n(c.successes),
                        good: n(c.good),
                    })
                    .collect();
                (id, v)
            })
            .collect()
    }

    pub(super) fn of(
        &self,
        id: &crate::route::RouteId,
    ) -> impl Iterator<Item = (DateTime<Utc>, Counts)> + '_ {
        self.days.get(id).into_iter().flatten().map(|d| {
            let at = DateTime::from_timestamp(i64::from(d.day) * 86_400, 0).unwrap_or_default();
            let c = Counts {
                count: u64::from(d.count),
                successes: u64::from(d.successes),
                good: u64::from(d.good),
            };
            (at, c)
        })
    }

    /// Whether a new read is due at `now`: a new UTC day, or [`PAST_DAYS_EVERY`] passed.
    fn due(&self, now: DateTime<Utc>) -> bool {
        Granularity::Day.bucket_start(now) != self.today || now - self.read_at >= PAST_DAYS_EVERY
    }
}

/// The kept days before today, shared by every page request; see the module doc.
pub type PastBars = Kept<PastDays>;

impl Keep for PastDays {
    const WHAT: &'static str = "status page's past days";

    fn read(store: &Store, now: DateTime<Utc>) -> Result<Self, StoreError> {
        PastDays::read(store, now)
    }

    fn due(&self, now: DateTime<Utc>) -> bool {
        PastDays::due(self, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::RouteId;
    use std::collections::HashMap;

    #[test]
    fn past_days_keep_their_counts_and_days_in_16_bytes_each() {
        let id = RouteId::new("p", "r", "m");
        let first = 1_780_000_000 / 86_400;
        let c = |n: u64| Counts {
            count: n,
            successes: n - 1,
            good: n - 2,
        };
        let read: Vec<(i64, Counts)> = (0..89).map(|d| (first + d, c(2880 + d as u64))).collect();
        let past = PastDays {
            days: PastDays::compact(HashMap::from([(id.clone(), read.clone())])),
            ..PastDays::default()
        };
        let day = |d: i64| DateTime::from_timestamp(d * 86_400, 0).unwrap();
        let shown: Vec<_> = read.iter().map(|(d, c)| (day(*d), *c)).collect();
        assert_eq!(past.of(&id).collect::<Vec<_>>(), shown);
        assert_eq!(past.of(&RouteId::new("x", "y", "z")).count(), 0);
        assert_eq!(std::mem::size_of::<PastDay>(), 16);
        assert_eq!(past.days[&id].len(), 89, "no room past the days read");
    }

    #[test]
    fn a_read_is_due_after_the_period_or_at_midnight() {
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let read_at = at("2026-05-20T23:45:00Z");
        let past = PastDays {
            today: Granularity::Day.bucket_start(read_at),
            read_at,
            ..PastDays::default()
        };
        assert!(!past.due(at("2026-05-20T23:54:59Z")));
        assert!(past.due(at("2026-05-20T23:55:00Z")), "the period passed");
        let read_at = at("2026-05-20T23:58:00Z");
        let past = PastDays { read_at, ..past };
        assert!(!past.due(at("2026-05-20T23:59:59Z")));
        assert!(past.due(at("2026-05-21T00:00:00Z")), "a new day");
    }
}
