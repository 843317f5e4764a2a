//! Wall-clock time behind a trait, so the state machine and rollups can be driven second by
//! second in tests (`ManualClock`) while production uses the system clock.

use std::sync::Mutex;

use chrono::{DateTime, SecondsFormat, Utc};

/// Where "now" comes from. Timers and timeouts use `tokio::time` (pausable in tests); this is
/// only for timestamps that are stored, compared with stored ones, or bucketed by time of day.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
}

/// RFC 3339 UTC with milliseconds: how every time in the API, the weights feed and messages
/// is written.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that only moves when a test moves it.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            now: Mutex::new(start),
        }
    }

    pub fn set(&self, to: DateTime<Utc>) {
        *self.lock() = to;
    }

    pub fn advance(&self, by: std::time::Duration) {
        let by = chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
        let mut now = self.lock();
        *now += by;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DateTime<Utc>> {
        // A poisoned clock still holds a valid time.
        self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let start = DateTime::parse_from_rfc3339("2026-11-29T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let clock = ManualClock::new(start);
        assert_eq!(clock.now(), start);
        clock.advance(std::time::Duration::from_secs(90));
        assert_eq!((clock.now() - start).num_seconds(), 90);
    }

    #[test]
    fn rfc3339_is_utc_with_milliseconds() {
        let t = DateTime::from_timestamp_millis(1_764_374_400_123).unwrap();
        assert_eq!(rfc3339(t), "2025-11-29T00:00:00.123Z");
        let t = DateTime::from_timestamp(1_764_374_400, 0).unwrap();
        assert_eq!(rfc3339(t), "2025-11-29T00:00:00.000Z");
    }
}
