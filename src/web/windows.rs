//! The counts of the status figures' long windows — uptime over 24 hours, 7 and 30 days, the
//! error budget's 30 days, this calendar month's budget — kept by a task of their own
//! ([`super::kept`]), not read by requests.
//!
//! At 1,000 routes these windows are about 90,000 rollup rows, most of what the first `/`
//! after a start (or after a quiet spell) waited for. A window ending now is made of the
//! rollup buckets starting before now's hour, which change only with late outcomes, and the
//! hourly buckets from now's hour on. The keeper reads the first part ([`KeptWindows`]:
//! every bucket before the hour it read in) at the start, every [`WINDOWS_EVERY`] and at each
//! new hour of the service's clock (the windows' starts move by the hour, midnight included);
//! a request reads only the hourly buckets from that hour on (an hour or two: a row a route a
//! kind each) and adds them ([`KeptWindows::at`]). Within the keeper's hour the sum is exactly
//! what a direct read of the whole window gives; late outcomes for an earlier hour (an agent's,
//! or another monitor's on the same database) show within [`WINDOWS_EVERY`]. In the moment
//! after a new hour until the keeper's read at it ends, a window still starts where it did in
//! the previous hour (it is up to an hour longer), and the month is counted from its first
//! day once a new month began.
//!
//! Until the first read ends (right after a start) there are no window counts: the pages say
//! the uptimes are still being read, and `/api/v1/status` reads the windows itself as before.

use chrono::{DateTime, Duration as TimeDelta, Utc};

use super::api::UPTIME_KINDS;
use super::kept::{Keep, Kept};
use super::pages::month_bounds;
use crate::outcome::OutcomeKind;
use crate::route::RouteMap;
use crate::slo;
use crate::store::{Counts, Granularity, Reader, Store, StoreError, Window};

/// How often the keeper reads the windows again within an hour: late outcomes for an earlier
/// hour show in the uptimes and budgets within this.
pub const WINDOWS_EVERY: TimeDelta = TimeDelta::minutes(10);

/// The long windows, in [`Counted`]'s order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// Uptime, the last 24 hours.
    Day,
    /// Uptime, the last 7 days.
    Week,
    /// Uptime, the last 30 days.
    Days30,
    /// The error budget's window ([`slo::WINDOW`]), probes only.
    Slo,
    /// This calendar month (UTC), probes only: `/incidents`' budget.
    Month,
}

impl Span {
    pub const ALL: [Span; 5] = [Span::Day, Span::Week, Span::Days30, Span::Slo, Span::Month];

    fn kinds(self) -> &'static [OutcomeKind] {
        match self {
            Span::Day | Span::Week | Span::Days30 => UPTIME_KINDS,
            Span::Slo | Span::Month => slo::KINDS,
        }
    }

    /// Where the window ending at `now` starts (the store reads from its hour on).
    fn since(self, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Span::Day => now - TimeDelta::days(1),
            Span::Week => now - TimeDelta::days(7),
            Span::Days30 => now - TimeDelta::days(30),
            Span::Slo => now - TimeDelta::from_std(slo::WINDOW).unwrap_or(TimeDelta::days(30)),
            Span::Month => month_bounds(now).0,
        }
    }

    fn window(self, now: DateTime<Utc>) -> Window<'static> {
        Window {
            since: self.since(now),
            kinds: self.kinds(),
        }
    }
}

/// Per window of [`Span::ALL`], per route.
pub type Counted = [RouteMap<Counts>; 5];

/// Every window's counts of the buckets before `hour`, read at `read_at` (in that hour).
#[derive(Debug, Default)]
pub struct KeptWindows {
    hour: DateTime<Utc>,
    read_at: DateTime<Utc>,
    counts: Counted,
}

/// The kept windows, shared by every request; see the module doc.
pub type SharedWindows = Kept<KeptWindows>;

impl KeptWindows {
    /// Every window as of `now`, without the buckets of `now`'s hour and after.
    pub fn read(reader: &Reader, now: DateTime<Utc>) -> Result<Self, StoreError> {
        let hour = Granularity::Hour.bucket_start(now);
        // Buckets starting before `hour`: a window from now's hour-aligned start read up to
        // `hour` is the one ending now without its last hour.
        let windows = Span::ALL.map(|s| s.window(now));
        let read = reader.counts_by_routes::<RouteMap<Counts>>(&windows, hour)?;
        let mut counts = Counted::default();
        for (into, c) in counts.iter_mut().zip(read) {
            *into = c;
        }
        Ok(Self {
            hour,
            read_at: now,
            counts,
        })
    }

    /// The hour it was read in: it holds the buckets before it.
    pub fn hour(&self) -> DateTime<Utc> {
        self.hour
    }

    /// The windows in `spans` ending at `now`: the kept counts and the hourly buckets from the
    /// kept hour on, read here (see the module doc).
    pub fn at(
        &self,
        reader: &Reader,
        now: DateTime<Utc>,
        spans: &[Span],
    ) -> Result<Vec<RouteMap<Counts>>, StoreError> {
        let until = now + TimeDelta::milliseconds(1);
        let month = month_bounds(now).0;
        // A month that began after the kept hour is counted from its first day alone.
        let since = |s: Span| match s {
            Span::Month => month.max(self.hour),
            _ => self.hour,
        };
        let recent: Vec<Window<'static>> = spans
            .iter()
            .map(|&s| Window {
                since: since(s),
                kinds: s.kinds(),
            })
            .collect();
        // Every window from the same hour: one scan of the hourly rollups since it.
        let recent = reader.counts_by_routes::<RouteMap<Counts>>(&recent, until)?;
        Ok(spans
            .iter()
            .zip(recent)
            .map(|(&s, mut sum)| {
                if s == Span::Month && month > self.hour {
                    return sum;
                }
                let kept = &self.counts[s as usize];
                for (id, c) in kept {
                    let into = sum.entry(id.clone()).or_default();
                    into.count += c.count;
                    into.successes += c.successes;
                    into.good += c.good;
                }
                sum
            })
            .collect())
    }

    /// Whether a new read is due at `now`: another hour, or [`WINDOWS_EVERY`] passed.
    fn due(&self, now: DateTime<Utc>) -> bool {
        Granularity::Hour.bucket_start(now) != self.hour || now - self.read_at >= WINDOWS_EVERY
    }
}

impl Keep for KeptWindows {
    const WHAT: &'static str = "status figures' long windows";

    fn read(store: &Store, now: DateTime<Utc>) -> Result<Self, StoreError> {
        KeptWindows::read(&store.reader()?, now)
    }

    fn due(&self, now: DateTime<Utc>) -> bool {
        KeptWindows::due(self, now)
    }
}

/// Every window of `spans` ending at `now`, read whole from the store: what the kept windows
/// stand for.
pub fn direct(
    reader: &Reader,
    now: DateTime<Utc>,
    spans: &[Span],
) -> Result<Vec<RouteMap<Counts>>, StoreError> {
    let windows: Vec<_> = spans.iter().map(|s| s.window(now)).collect();
    reader.counts_by_routes(&windows, now + TimeDelta::milliseconds(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_read_is_due_each_hour_and_after_the_period() {
        let read_at = at("2026-05-20T12:45:00Z");
        let kept = KeptWindows {
            hour: at("2026-05-20T12:00:00Z"),
            read_at,
            counts: Counted::default(),
        };
        assert!(!kept.due(at("2026-05-20T12:54:59Z")));
        assert!(kept.due(at("2026-05-20T12:55:00Z")), "the period passed");
        let kept = KeptWindows {
            read_at: at("2026-05-20T12:58:00Z"),
            ..kept
        };
        assert!(!kept.due(at("2026-05-20T12:59:59Z")));
        assert!(kept.due(at("2026-05-20T13:00:00Z")), "a new hour");
    }

    #[test]
    fn the_windows_start_as_the_status_figures_do() {
        let now = at("2026-05-20T12:34:56Z");
        assert_eq!(Span::Day.since(now), at("2026-05-19T12:34:56Z"));
        assert_eq!(Span::Days30.since(now), at("2026-04-20T12:34:56Z"));
        assert_eq!(Span::Slo.since(now), Span::Days30.since(now));
        assert_eq!(Span::Month.since(now), at("2026-05-01T00:00:00Z"));
        assert_eq!(Span::Month.kinds(), slo::KINDS);
    }
}
