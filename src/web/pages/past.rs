//! The day bars of the days before today, kept in memory by a task of their own.
//!
//! Reading 89 days of daily rollups for every route is the page's one long read (at 1,000
//! routes it is most of what a cold `/` waited for). The days before today change rarely —
//! an agent's late outcomes, a second monitor writing the same database, the demo's history —
//! so no request reads them: the keeper reads them when the service starts (requests before
//! its first read show the bars as warming) and again every [`PAST_DAYS_EVERY`] and right after
//! midnight UTC; a request reads only the days from the keeper's last read to now (today, and
//! yesterday for the moments after midnight until the keeper read again).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use chrono::{DateTime, Duration as TimeDelta, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::DAYS;
use crate::clock::Clock;
use crate::route::RouteMap;
use crate::store::{Counts, DailyCounts, Granularity, Store, StoreError};
use crate::web::api::UPTIME_KINDS;

/// How often the keeper reads the days before today again: late outcomes for a past day
/// (an agent's, or another monitor's on the same database) show in its bar within this.
pub const PAST_DAYS_EVERY: TimeDelta = TimeDelta::minutes(10);

/// How often the keeper looks at the clock for a due read (a read is due by the service's
/// clock, so that an injected clock drives it).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// After a failed read, the next try.
const RETRY_AFTER: TimeDelta = TimeDelta::seconds(30);

/// The days before `today` (a UTC day start), as read at `read_at`.
#[derive(Debug, Default)]
pub(super) struct PastDays {
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
#[derive(Debug)]
pub struct PastBars {
    current: RwLock<Option<Arc<PastDays>>>,
    /// Reads done so far (for whoever waits for one).
    reads: watch::Sender<u64>,
    started: AtomicBool,
}

impl Default for PastBars {
    fn default() -> Self {
        Self {
            current: RwLock::new(None),
            reads: watch::Sender::new(0),
            started: AtomicBool::new(false),
        }
    }
}

impl PastBars {
    /// The days last read; `None` while the first read runs.
    pub(super) fn get(&self) -> Option<Arc<PastDays>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reads the days before `now`'s day now, on this thread (the keeper's read; also for
    /// whoever measures it).
    pub fn read(&self, store: &Store, now: DateTime<Utc>) -> Result<(), StoreError> {
        self.set(PastDays::read(store, now)?);
        Ok(())
    }

    fn set(&self, days: PastDays) {
        let old = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(Arc::new(days));
        drop(old);
        self.reads.send_modify(|n| *n += 1);
    }

    /// Starts the keeper unless it runs: at the service's start (so that the first request
    /// finds the bars read), else at the first page request. It ends with `until`, or when
    /// the bars' owner is gone.
    pub fn start(
        self: &Arc<Self>,
        store: &Store,
        clock: &Arc<dyn Clock>,
        until: &CancellationToken,
    ) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let (store, clock, until) = (store.clone(), clock.clone(), until.clone());
        let bars = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::select! {
                () = keep(bars, store, clock) => {}
                () = until.cancelled() => {}
            }
        });
    }

    /// Waits until the keeper has finished a read after `after` reads (see [`Self::reads`]).
    pub async fn read_after(&self, after: u64) {
        let mut rx = self.reads.subscribe();
        // The sender lives as long as `self`: the wait ends with a read.
        let _ = rx.wait_for(|n| *n > after).await;
    }

    /// How many reads the keeper finished.
    pub fn reads(&self) -> u64 {
        *self.reads.borrow()
    }
}

/// The keeper: a read now, then one whenever [`PastDays::due`] says so.
async fn keep(bars: Weak<PastBars>, store: Store, clock: Arc<dyn Clock>) {
    // When the next read is due if the last one failed.
    let mut retry_at: Option<DateTime<Utc>> = None;
    loop {
        let due = {
            let Some(b) = bars.upgrade() else { return };
            let now = clock.now();
            match (&retry_at, b.get()) {
                (Some(at), _) => now >= *at,
                (None, Some(p)) => p.due(now),
                (None, None) => true,
            }
        };
        if due {
            let now = clock.now();
            let Some(b) = bars.upgrade() else { return };
            let s = store.clone();
            match tokio::task::spawn_blocking(move || b.read(&s, now)).await {
                Ok(Ok(())) => {
                    retry_at = None;
                    // The days it replaces free megabytes of small blocks at 10,000 routes.
                    tokio::task::spawn_blocking(crate::malloc::trim);
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "reading the status page's past days failed");
                    retry_at = Some(now + RETRY_AFTER);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading the status page's past days failed");
                    retry_at = Some(now + RETRY_AFTER);
                }
            }
        }
        tokio::time::sleep(LOOK_EVERY).await;
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
