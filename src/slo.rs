//! The error budget, one definition for every place that shows or alerts on it.
//!
//! The budget is time. Each probe outcome stands for its route's probe interval; a bad outcome
//! (failed, or slower than `[slo] latency_threshold`) is that much bad time. The budget of a
//! window is `(1 − target) × window` — 43.2 minutes for 99.9 % over 30 days. History the
//! window does not have yet is not counted as bad, so a fresh route starts with its whole
//! budget instead of "43× spent" after one failed probe.
//!
//! The route page, `/api/v1/status` (`slo`), the incidents page's monthly account and the
//! burn-rate alerts all read their figures from here, so they agree to the second.

use std::time::Duration;

use serde::Serialize;

use crate::outcome::OutcomeKind;

/// The outcomes the budget counts: the regular probe, the same call at the same interval on
/// every route (throughput checks and real traffic have their own rhythm and sizes).
pub const KINDS: &[OutcomeKind] = &[OutcomeKind::Probe];

/// A route's error budget over one window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ErrorBudget {
    /// The availability target, e.g. 0.999.
    pub target: f64,
    /// Bad time spent in the window, in seconds.
    pub bad_seconds: f64,
    /// `(1 − target) × window`, in seconds.
    pub budget_seconds: f64,
    /// `1 − bad / budget`, rounded to 1e-4; negative when overspent.
    pub error_budget_remaining: f64,
}

impl ErrorBudget {
    /// The budget after `bad_outcomes` bad probe outcomes, each standing for `interval`.
    pub fn new(bad_outcomes: u64, interval: Duration, target: f64, window: Duration) -> Self {
        let bad_seconds = bad_time(bad_outcomes, interval);
        Self::from_bad_seconds(bad_seconds, target, window)
    }

    /// The budget after `bad_seconds` of bad time.
    pub fn from_bad_seconds(bad_seconds: f64, target: f64, window: Duration) -> Self {
        let budget_seconds = budget_seconds(target, window);
        let remaining = if budget_seconds <= 0.0 {
            // A 100 % target has no budget: any bad time spends all of it.
            if bad_seconds > 0.0 {
                0.0
            } else {
                1.0
            }
        } else {
            round4(1.0 - bad_seconds / budget_seconds)
        };
        Self {
            target,
            bad_seconds,
            budget_seconds,
            error_budget_remaining: remaining,
        }
    }

    /// The share of the budget spent (1.0 = all of it; above 1 when overspent).
    pub fn spent(&self) -> f64 {
        1.0 - self.error_budget_remaining
    }
}

/// Bad time of `bad_outcomes` probe outcomes, each standing for `interval`, in seconds.
pub fn bad_time(bad_outcomes: u64, interval: Duration) -> f64 {
    bad_outcomes as f64 * interval.as_secs_f64()
}

/// `(1 − target) × window`, in seconds to the millisecond (`1 − 0.999` is not exact in
/// binary); never negative.
pub fn budget_seconds(target: f64, window: Duration) -> f64 {
    let s = ((1.0 - target) * window.as_secs_f64()).max(0.0);
    (s * 1000.0).round() / 1000.0
}

/// The burn rate over a window: bad time against the time the window's outcomes cover, over
/// the budget's share `(1 − target)`. 1.0 spends the budget exactly over its period. Time the
/// window has no outcomes for is neither good nor bad.
pub fn burn_rate(bad_outcomes: u64, outcomes: u64, target: f64) -> Option<f64> {
    if outcomes == 0 {
        return None;
    }
    let budget = 1.0 - target;
    let bad_share = bad_outcomes as f64 / outcomes as f64;
    Some(if budget <= 0.0 {
        if bad_outcomes > 0 {
            f64::INFINITY
        } else {
            0.0
        }
    } else {
        bad_share / budget
    })
}

/// The rolling window the status page and API account over.
pub const WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_time() {
        // 99.9 % over 30 days is 43.2 minutes.
        let b = ErrorBudget::new(0, Duration::from_secs(30), 0.999, WINDOW);
        assert!((b.budget_seconds - 43.2 * 60.0).abs() < 1e-6, "{b:?}");
        assert_eq!(b.error_budget_remaining, 1.0);
        // 18 bad probes 5 s apart: 90 s of the 2,592 s budget.
        let b = ErrorBudget::new(18, Duration::from_secs(5), 0.999, WINDOW);
        assert_eq!(b.bad_seconds, 90.0);
        assert_eq!(b.error_budget_remaining, round4(1.0 - 90.0 / 2592.0));
        assert!((b.spent() - 0.0347).abs() < 1e-4, "{b:?}");
    }

    #[test]
    fn one_bad_probe_on_a_fresh_route_is_not_an_overspent_budget() {
        // One failure among the first 24 probes: 30 s of bad time, about 1 % of the budget
        // (an outcome ratio would have said 40× spent).
        let b = ErrorBudget::new(1, Duration::from_secs(30), 0.999, WINDOW);
        assert!(b.error_budget_remaining > 0.98, "{b:?}");
    }

    #[test]
    fn overspent_and_no_budget() {
        let b = ErrorBudget::new(200, Duration::from_secs(30), 0.999, WINDOW);
        assert!(b.error_budget_remaining < 0.0);
        assert!(b.spent() > 2.0);
        let b = ErrorBudget::new(1, Duration::from_secs(30), 1.0, WINDOW);
        assert_eq!(b.error_budget_remaining, 0.0);
        let b = ErrorBudget::new(0, Duration::from_secs(30), 1.0, WINDOW);
        assert_eq!(b.error_budget_remaining, 1.0);
    }

    #[test]
    fn burn_rates() {
        assert_eq!(burn_rate(0, 0, 0.999), None);
        let r = burn_rate(1, 100, 0.999).unwrap();
        assert!((r - 10.0).abs() < 1e-9, "{r}");
        assert_eq!(burn_rate(0, 10, 1.0), Some(0.0));
        assert_eq!(burn_rate(1, 10, 1.0), Some(f64::INFINITY));
    }
}
