//! The error-rate window: per-second counters of counted outcomes (probes and passive), kept
//! for `error_window`. Memory is bounded by the window's length in seconds, whatever the
//! traffic, and the whole thing serializes with the route's state.

use std::collections::VecDeque;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Outcomes and failures in one second (or summed over a span).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub total: u32,
    pub failures: u32,
    /// Of which passive (real traffic): request-side findings compare them with probes.
    pub passive_total: u32,
    pub passive_failures: u32,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.total = self.total.saturating_add(o.total);
        self.failures = self.failures.saturating_add(o.failures);
        self.passive_total = self.passive_total.saturating_add(o.passive_total);
        self.passive_failures = self.passive_failures.saturating_add(o.passive_failures);
    }

    /// failures / total, 0 for an empty span.
    pub fn rate(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            f64::from(self.failures) / f64::from(self.total)
        }
    }

    /// The same counts without the passive outcomes (probes only).
    pub fn probes_only(&self) -> Counts {
        Counts {
            total: self.total - self.passive_total.min(self.total),
            failures: self.failures - self.passive_failures.min(self.failures),
            passive_total: 0,
            passive_failures: 0,
        }
    }

    pub fn passive_rate(&self) -> f64 {
        if self.passive_total == 0 {
            0.0
        } else {
            f64::from(self.passive_failures) / f64::from(self.passive_total)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Slot {
    /// Unix second.
    sec: i64,
    #[serde(flatten)]
    c: Counts,
}

/// Per-second counters over the last `len_s` seconds, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorWindow {
    len_s: i64,
    slots: VecDeque<Slot>,
}

impl ErrorWindow {
    pub fn new(len_s: u64) -> Self {
        Self {
            len_s: i64::try_from(len_s.max(1)).unwrap_or(i64::MAX),
            slots: VecDeque::new(),
        }
    }

    /// The window's length in seconds.
    pub fn len_s(&self) -> u64 {
        self.len_s.unsigned_abs()
    }

    /// Counts one outcome at `at`. An `at` earlier than the newest slot (clocks are not
    /// monotonic across sources) is counted in the newest slot.
    pub fn add(&mut self, at: DateTime<Utc>, failed: bool, passive: bool) {
        let sec = at.timestamp();
        let c = Counts {
            total: 1,
            failures: u32::from(failed),
            passive_total: u32::from(passive),
            passive_failures: u32::from(failed && passive),
        };
        match self.slots.back_mut() {
            Some(last) if last.sec >= sec => last.c.add(&c),
            _ => self.slots.push_back(Slot { sec, c }),
        }
        self.prune(at);
    }

    /// Forgets seconds that left the window.
    pub fn prune(&mut self, now: DateTime<Utc>) {
        let oldest = now.timestamp() - self.len_s;
        while self.slots.front().is_some_and(|s| s.sec <= oldest) {
            self.slots.pop_front();
        }
    }

    /// Counts over the last `span_s` seconds up to `now` (`(now − span, now]`, capped at the
    /// window's length).
    pub fn counts(&self, now: DateTime<Utc>, span_s: u64) -> Counts {
        let span = i64::try_from(span_s).unwrap_or(i64::MAX).min(self.len_s);
        self.counts_after(now, now.timestamp() - span)
    }

    /// Counts over the seconds after `after_sec` (a Unix second) and within the window.
    pub fn counts_after(&self, now: DateTime<Utc>, after_sec: i64) -> Counts {
        let after = after_sec.max(now.timestamp() - self.len_s);
        let mut c = Counts::default();
        for s in self.slots.iter().rev() {
            if s.sec <= after {
                break;
            }
            c.add(&s.c);
        }
        c
    }

    /// Failures in the seconds held (all of them within the window once pruned).
    pub fn failures_held(&self) -> u32 {
        self.slots
            .iter()
            .fold(0u32, |n, s| n.saturating_add(s.c.failures))
    }

    /// The Unix second at which the oldest second held leaves the window (what
    /// [`ErrorWindow::counts`] sees changes then, by time alone); `None` when empty.
    pub fn next_expiry(&self) -> Option<i64> {
        self.slots.front().map(|s| s.sec.saturating_add(self.len_s))
    }

    /// Bytes held (the per-second slots).
    pub fn approx_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
    }

    /// Seconds currently held (memory is proportional to it, at most the window's length).
    pub fn slots(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn counts_spans_and_forgets() {
        let t0 = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let at = |s: i64| t0 + chrono::Duration::seconds(s);
        let mut w = ErrorWindow::new(300);
        for s in 0..400 {
            w.add(at(s), s % 10 == 0, s % 2 == 0);
        }
        let now = at(399);
        let all = w.counts(now, 300);
        assert_eq!(all.total, 300);
        assert_eq!(all.failures, 30);
        assert_eq!(w.counts(now, 10).total, 10);
        assert_eq!(w.counts(now, 10).failures, 1);
        assert_eq!(all.passive_total, 150);
        assert_eq!(all.probes_only().total, 150);
        assert!(w.slots() <= 300);
        w.prune(at(1000));
        assert_eq!(w.slots(), 0);
        assert_eq!(w.counts(at(1000), 300).rate(), 0.0);
    }
}
