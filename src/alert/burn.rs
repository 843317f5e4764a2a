//! SLO burn-rate alerts (Google SRE workbook, multiwindow multi-burn-rate, 30-day SLO):
//!
//! | alert  | burn rate | long window | short window | budget spent when it fires |
//! | ------ | --------- | ----------- | ------------ | -------------------------- |
//! | page   | 14.4×     | 1 h         | 5 m          | 2 % in 1 h                 |
//! | page   | 6×        | 6 h         | 30 m         | 5 % in 6 h                 |
//! | ticket | 1×        | 3 d         | 6 h          | 10 % in 3 d                |
//!
//! The burn rate is the error ratio divided by the error budget `1 − slo`. Both windows must
//! burn at the rule's rate, and the long window must hold at least `min_failures` failures:
//! at one probe a minute and 99.9 %, one failure in 60 is already 16.7× — noise, not a page.
//!
//! [`evaluate`] is pure over counts; [`read_windows`] is the I/O around it (the store's
//! 5-minute rollups for windows up to 6 h, hourly ones for 3 d, of **probe** outcomes as
//! [`crate::slo`] counts them — the same bad outcomes the route page, `/api/v1/status` and
//! the incidents page spend the budget with; "bad" = not good per `[slo] latency_threshold`,
//! as the rollups count it).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::route::RouteId;
use crate::store::{Granularity, Reader, StoreError};

/// Outcomes and bad outcomes in one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub total: u64,
    pub bad: u64,
}

impl Counts {
    pub fn new(total: u64, bad: u64) -> Self {
        Self { total, bad }
    }

    /// Error ratio over the budget ([`crate::slo::burn_rate`]); 0 with no outcome.
    pub fn burn_rate(self, slo: f64) -> f64 {
        crate::slo::burn_rate(self.bad, self.total, slo).unwrap_or(0.0)
    }
}

/// The five windows the rules read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Windows {
    pub m5: Counts,
    pub m30: Counts,
    pub h1: Counts,
    pub h6: Counts,
    pub d3: Counts,
}

/// One row of the table above.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    pub factor: f64,
    pub long_s: i64,
    pub short_s: i64,
    pub page: bool,
}

/// The table above, most urgent first.
pub const RULES: [Rule; 3] = [
    Rule {
        factor: 14.4,
        long_s: 3600,
        short_s: 300,
        page: true,
    },
    Rule {
        factor: 6.0,
        long_s: 6 * 3600,
        short_s: 1800,
        page: true,
    },
    Rule {
        factor: 1.0,
        long_s: 3 * 86400,
        short_s: 6 * 3600,
        page: false,
    },
];

impl Windows {
    fn get(&self, seconds: i64) -> Counts {
        match seconds {
            300 => self.m5,
            1800 => self.m30,
            3600 => self.h1,
            21600 => self.h6,
            _ => self.d3,
        }
    }
}

/// A firing burn-rate alert: `page` (critical) or ticket (warning).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BurnAlert {
    pub route: RouteId,
    pub page: bool,
    pub slo: f64,
    pub factor: f64,
    pub burn_long: f64,
    pub burn_short: f64,
    pub long_window_s: i64,
    pub short_window_s: i64,
    /// In the long window.
    pub failures: u64,
    pub total: u64,
}

/// The most urgent rule that fires, if any.
pub fn evaluate(route: &RouteId, slo: f64, w: &Windows, min_failures: u64) -> Option<BurnAlert> {
    RULES.iter().find_map(|r| {
        let long = w.get(r.long_s);
        let short = w.get(r.short_s);
        let (bl, bs) = (long.burn_rate(slo), short.burn_rate(slo));
        let fires = bl >= r.factor && bs >= r.factor && long.bad >= min_failures.max(1);
        fires.then(|| BurnAlert {
            route: route.clone(),
            page: r.page,
            slo,
            factor: r.factor,
            burn_long: bl,
            burn_short: bs,
            long_window_s: r.long_s,
            short_window_s: r.short_s,
            failures: long.bad,
            total: long.total,
        })
    })
}

/// The windows ending at `now`, from rollups (bucket-aligned: a window covers the buckets
/// overlapping it, so it may reach up to one bucket further back). Blocking: call from
/// `spawn_blocking`.
pub fn read_windows(
    reader: &Reader,
    route: &RouteId,
    now: DateTime<Utc>,
) -> Result<Windows, StoreError> {
    let read = |g: Granularity, secs: i64| -> Result<Counts, StoreError> {
        let since = now - chrono::Duration::seconds(secs) + chrono::Duration::milliseconds(1);
        let r = reader.summary(
            route,
            g,
            since,
            now + chrono::Duration::milliseconds(1),
            crate::slo::KINDS,
        )?;
        Ok(Counts::new(r.count, r.count.saturating_sub(r.good)))
    };
    Ok(Windows {
        m5: read(Granularity::FiveMinutes, 300)?,
        m30: read(Granularity::FiveMinutes, 1800)?,
        h1: read(Granularity::FiveMinutes, 3600)?,
        h6: read(Granularity::FiveMinutes, 6 * 3600)?,
        d3: read(Granularity::Hour, 3 * 86400)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> RouteId {
        RouteId::new("p", "r", "m")
    }

    fn uniform(total_per_min: u64, bad_ratio: f64) -> Windows {
        let c = |mins: u64| {
            let total = total_per_min * mins;
            Counts::new(total, (total as f64 * bad_ratio).round() as u64)
        };
        Windows {
            m5: c(5),
            m30: c(30),
            h1: c(60),
            h6: c(360),
            d3: c(3 * 1440),
        }
    }

    #[test]
    fn burn_rate_arithmetic() {
        // 99.9 %: budget 0.1 %. 1.44 % errors burn 14.4×.
        let b = Counts::new(10_000, 144).burn_rate(0.999);
        assert!((b - 14.4).abs() < 1e-9, "{b}");
        assert_eq!(Counts::new(0, 0).burn_rate(0.999), 0.0);
        assert!((Counts::new(60, 1).burn_rate(0.999) - 16.666).abs() < 0.01);
    }

    #[test]
    fn table_thresholds() {
        let slo = 0.999;
        // 20× everywhere: the fast page.
        let a = evaluate(&route(), slo, &uniform(100, 0.02), 3).unwrap();
        assert!(a.page && a.factor == 14.4 && a.long_window_s == 3600 && a.short_window_s == 300);
        // 10× everywhere: not the fast page, the slow one (6× over 6 h and 30 m).
        let a = evaluate(&route(), slo, &uniform(100, 0.010), 3).unwrap();
        assert!(a.page && a.factor == 6.0 && a.long_window_s == 21600);
        // 2×: a ticket.
        let a = evaluate(&route(), slo, &uniform(100, 0.002), 3).unwrap();
        assert!(!a.page && a.factor == 1.0 && a.long_window_s == 3 * 86400);
        // 0.5×: nothing.
        assert_eq!(evaluate(&route(), slo, &uniform(100, 0.0005), 3), None);
    }

    #[test]
    fn both_windows_must_burn() {
        let slo = 0.999;
        // The last hour burnt hard but the last 5 minutes are clean: the incident is over,
        // no fast page (the 6 h rule still sees it if its own windows agree).
        let mut w = uniform(100, 0.0);
        w.h1 = Counts::new(6000, 120); // 20×
        assert_eq!(evaluate(&route(), slo, &w, 3), None);
        w.m5 = Counts::new(500, 10); // 20×
        assert!(evaluate(&route(), slo, &w, 3).unwrap().page);
    }

    #[test]
    fn one_failed_probe_in_sixty_does_not_page() {
        // One probe a minute, one failure in the last hour, in the last 5 minutes: 16.7× on
        // both windows of the fast rule — but one failure is below min_failures.
        let w = Windows {
            m5: Counts::new(5, 1),
            m30: Counts::new(30, 1),
            h1: Counts::new(60, 1),
            h6: Counts::new(360, 1),
            d3: Counts::new(4320, 1),
        };
        assert!(w.h1.burn_rate(0.999) > 14.4 && w.m5.burn_rate(0.999) > 14.4);
        assert_eq!(evaluate(&route(), 0.999, &w, 3), None);
        // Three failures within the hour do page.
        let w = Windows {
            m5: Counts::new(5, 1),
            h1: Counts::new(60, 3),
            ..w
        };
        assert!(evaluate(&route(), 0.999, &w, 3).unwrap().page);
    }
}
