//! How far the store is behind the probes: the age of the oldest outcome the recorder has
//! handed to the store and not yet seen committed. Exported as `probeok_store_lag_seconds`;
//! `/readyz` says not ready past [`MAX_READY_LAG`], so a monitor whose writer cannot keep up
//! is taken out of rotation loudly instead of judging stale data quietly.
//!
//! The recorder batches whatever is queued into one transaction, so a writer that falls
//! behind writes bigger batches rather than dropping anything; the lag shows how far behind
//! it runs while it catches up.

use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Utc};

/// Past this lag `/readyz` answers 503: outcomes older than a minute are not yet stored, so
/// pages, burn rates and the API describe the past.
pub const MAX_READY_LAG: std::time::Duration = std::time::Duration::from_secs(60);

const NONE: i64 = i64::MAX;

/// Shared between the recorder (which marks batches) and the readers (metrics, readiness).
#[derive(Debug)]
pub struct StoreLag {
    /// When the oldest outcome of the batch in flight was ready, in unix ms; [`NONE`] when
    /// nothing is in flight.
    oldest_ms: AtomicI64,
}

impl Default for StoreLag {
    fn default() -> Self {
        Self {
            oldest_ms: AtomicI64::new(NONE),
        }
    }
}

impl StoreLag {
    /// A batch whose oldest outcome was ready at `oldest` goes to the store.
    pub fn begin(&self, oldest: DateTime<Utc>) {
        self.oldest_ms
            .store(oldest.timestamp_millis(), Ordering::Relaxed);
    }

    /// The batch in flight is committed (or failed: either way nothing waits any more).
    pub fn done(&self) {
        self.oldest_ms.store(NONE, Ordering::Relaxed);
    }

    /// Seconds the oldest outcome in flight has waited at `now`; 0 when nothing waits.
    pub fn seconds(&self, now: DateTime<Utc>) -> f64 {
        match self.oldest_ms.load(Ordering::Relaxed) {
            NONE => 0.0,
            ms => ((now.timestamp_millis() - ms).max(0)) as f64 / 1000.0,
        }
    }

    /// Over [`MAX_READY_LAG`] at `now`.
    pub fn behind(&self, now: DateTime<Utc>) -> bool {
        self.seconds(now) > MAX_READY_LAG.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_the_age_of_the_oldest_outcome_in_flight() {
        let lag = StoreLag::default();
        let t = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        assert_eq!(lag.seconds(t), 0.0);
        lag.begin(t);
        assert_eq!(lag.seconds(t + chrono::Duration::milliseconds(2500)), 2.5);
        assert!(!lag.behind(t + chrono::Duration::seconds(60)));
        assert!(lag.behind(t + chrono::Duration::seconds(61)));
        // A clock that stepped back is no negative lag.
        assert_eq!(lag.seconds(t - chrono::Duration::seconds(5)), 0.0);
        lag.done();
        assert_eq!(lag.seconds(t + chrono::Duration::seconds(600)), 0.0);
    }
}
