//! A drill's report: what happened during its window, against the backup's own history, and
//! a verdict line. Pure: [`build`] summarises figures read by `store/drills.rs` (see
//! [`super::api`] for the reads); [`render_text`] (in `text`) is the CLI's human-readable
//! form.
//!
//! - **Requests**: the proxy's requests for the drilled model — total, success rate,
//!   fallbacks (rows with a `fallback_reason`), contract uses by behaviour, answering routes.
//! - **Probes**: the drilled route's and each backup's probe outcomes — success rate,
//!   validation failures (an answer that came back wrong, `verified = false`), latency
//!   p50/p95 (successes).
//! - **Baseline**: the backup's own probe latency in the same local hours of day
//!   (`detection.timezone`) over the [`BASELINE_DAYS`] before the drill, from the hourly
//!   rollups (`source: same_hour_of_day_7d`); the health baseline detection keeps is rolling
//!   and would already include the drill.
//! - **Regression sets**: each set's pass rate on the backup during the drill against its runs
//!   in the [`HISTORY_DAYS`] before, with Fisher's exact test (one-sided: lower during).
//! - **Verdict**: `pass`, `warn`, `fail` or `inconclusive`, with the findings behind it.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Timelike, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

mod text;

pub use text::render_text;

use super::Drill;
use crate::drift::stats::fisher_exact;
use crate::probe::OutcomeKind;
use crate::route::RouteId;
use crate::store::drills::{OutcomeFigures, RequestFigures, RunTotals};
use crate::store::{quantile, Granularity, Rollup};

/// The latency baseline looks this far back.
pub const BASELINE_DAYS: i64 = 7;
/// Regression history looks this far back.
pub const HISTORY_DAYS: i64 = 30;
/// Fewer probes than this on a backup judge nothing.
pub const MIN_PROBES: u64 = 5;
/// Fewer baseline samples than this judge no latency.
pub const MIN_BASELINE: u64 = 20;
/// Fewer requests than this judge no request success rate.
pub const MIN_REQUESTS: u64 = 10;
/// One-sided Fisher p-value below which a lower regression pass rate fails the drill.
pub const REGRESSION_ALPHA: f64 = 0.05;

/// What the report is built from.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub drill: Drill,
    pub now: DateTime<Utc>,
    pub tz: Tz,
    pub requests: RequestFigures,
    pub drilled: OutcomeFigures,
    pub backups: Vec<BackupInputs>,
}

/// One backup route's figures.
#[derive(Debug, Clone)]
pub struct BackupInputs {
    pub route: RouteId,
    pub probes: OutcomeFigures,
    /// Hourly probe rollups of the [`BASELINE_DAYS`] before the drill.
    pub history: Vec<Rollup>,
    pub regression: BTreeMap<String, RunTotals>,
    pub regression_history: BTreeMap<String, RunTotals>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub drill: i64,
    pub route: RouteId,
    pub serves: String,
    pub window: Window,
    pub requests: Requests,
    pub drilled: RouteFigures,
    /// The routes that took the drilled route's traffic.
    pub backups: Vec<Backup>,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// The drill is still running: figures so far.
    pub running: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Requests {
    pub total: u64,
    pub ok: u64,
    pub success_rate: Option<f64>,
    pub fallbacks: u64,
    /// Contract behaviour → requests it answered.
    pub contracts: BTreeMap<String, u64>,
    /// Answering route → requests.
    pub by_route: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteFigures {
    pub route: RouteId,
    pub probes: u64,
    pub successes: u64,
    pub success_rate: Option<f64>,
    pub validation_failures: u64,
    pub latency_ms: Latency,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// `same_hour_of_day_7d`: the route's probes in the same local hours over the 7 days
    /// before the drill (hourly rollups).
    pub source: String,
    /// The local hours of day it covers.
    pub hours: Vec<u32>,
    pub samples: u64,
    pub latency_ms: Latency,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Backup {
    #[serde(flatten)]
    pub figures: RouteFigures,
    pub baseline: Baseline,
    /// p95 during the drill ÷ the baseline's p95.
    pub p95_vs_baseline: Option<f64>,
    pub regression: Vec<SetResult>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PassRate {
    pub runs: u64,
    pub passed: u64,
    pub cases: u64,
    pub rate: Option<f64>,
}

impl From<&RunTotals> for PassRate {
    fn from(t: &RunTotals) -> Self {
        Self {
            runs: t.runs,
            passed: t.passed,
            cases: t.cases,
            rate: ratio(t.passed, t.cases),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetResult {
    pub set: String,
    pub during: PassRate,
    pub history: PassRate,
    /// One-sided Fisher p-value for "lower during the drill".
    pub p_value: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Pass,
    Warn,
    Fail,
    Inconclusive,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Pass => "pass",
            Level::Warn => "warn",
            Level::Fail => "fail",
            Level::Inconclusive => "inconclusive",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub level: Level,
    /// One line for people.
    pub line: String,
    /// Each reason for a warn or fail, and each thing that could not be judged.
    pub findings: Vec<String>,
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

fn latency(values: &[f64]) -> Latency {
    let mut v = values.to_vec();
    Latency {
        p50: quantile(&mut v, 0.50),
        p95: quantile(&mut v, 0.95),
    }
}

fn figures(route: &RouteId, f: &OutcomeFigures) -> RouteFigures {
    RouteFigures {
        route: route.clone(),
        probes: f.total,
        successes: f.successes,
        success_rate: ratio(f.successes, f.total),
        validation_failures: f.validation_failures,
        latency_ms: latency(&f.latencies_ms),
    }
}

/// The local hours of day (in `tz`) that `[from, to)` touches.
pub fn local_hours(tz: Tz, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<u32> {
    let mut hours = BTreeSet::new();
    let mut t = Granularity::Hour.bucket_start(from);
    while t < to.max(from + TimeDelta::milliseconds(1)) && hours.len() < 24 {
        hours.insert(t.with_timezone(&tz).hour());
        t += TimeDelta::hours(1);
    }
    hours.into_iter().collect()
}

/// The same-hour-of-day baseline from hourly rollups.
pub fn baseline(route: &RouteId, history: &[Rollup], tz: Tz, hours: &[u32]) -> Baseline {
    let start = history
        .first()
        .map_or(DateTime::UNIX_EPOCH, |r| r.bucket_start);
    let mut merged = Rollup::empty(
        route.clone(),
        Some(OutcomeKind::Probe),
        Granularity::Hour,
        start,
    );
    for r in history
        .iter()
        .filter(|r| hours.contains(&r.bucket_start.with_timezone(&tz).hour()))
    {
        merged.merge(r);
    }
    Baseline {
        source: format!("same_hour_of_day_{BASELINE_DAYS}d"),
        hours: hours.to_vec(),
        samples: merged.successes,
        latency_ms: Latency {
            p50: merged.p50(),
            p95: merged.p95(),
        },
    }
}

/// Builds the report.
pub fn build(i: &Inputs) -> Report {
    let (from, to) = i.drill.window(i.now);
    let hours = local_hours(i.tz, from, to);
    let backups: Vec<Backup> = i
        .backups
        .iter()
        .map(|b| {
            let figures = figures(&b.route, &b.probes);
            let baseline = baseline(&b.route, &b.history, i.tz, &hours);
            let p95_vs_baseline = match (figures.latency_ms.p95, baseline.latency_ms.p95) {
                (Some(now), Some(base)) if base > 0.0 && baseline.samples >= MIN_BASELINE => {
                    Some(now / base)
                }
                _ => None,
            };
            let sets: BTreeSet<&String> = b.regression.keys().collect();
            let regression = sets
                .into_iter()
                .map(|set| {
                    let during = b.regression.get(set).cloned().unwrap_or_default();
                    let history = b.regression_history.get(set).cloned().unwrap_or_default();
                    let p_value = (during.cases > 0 && history.cases > 0).then(|| {
                        fisher_exact(
                            during.passed,
                            during.cases - during.passed.min(during.cases),
                            history.passed,
                            history.cases - history.passed.min(history.cases),
                        )
                        .less
                    });
                    SetResult {
                        set: set.clone(),
                        during: (&during).into(),
                        history: (&history).into(),
                        p_value,
                    }
                })
                .collect();
            Backup {
                figures,
                baseline,
                p95_vs_baseline,
                regression,
            }
        })
        .collect();
    let requests = Requests {
        total: i.requests.total,
        ok: i.requests.ok,
        success_rate: ratio(i.requests.ok, i.requests.total),
        fallbacks: i.requests.fallbacks,
        contracts: i.requests.contracts.clone(),
        by_route: i.requests.by_route.clone(),
    };
    let running = i.drill.active() && i.now < i.drill.ends_at;
    let verdict = verdict(&requests, &backups, running);
    Report {
        drill: i.drill.id,
        route: i.drill.route.clone(),
        serves: i.drill.serves.clone(),
        window: Window { from, to, running },
        requests,
        drilled: figures(&i.drill.route, &i.drilled),
        backups,
        verdict,
    }
}

/// A ratio as a percentage with one decimal.
fn pct(r: f64) -> String {
    format!("{:.1}%", r * 100.0)
}

/// A latency in whole milliseconds, `–` when there is none.
fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.0} ms"))
}

/// The verdict: the worst of the findings; `inconclusive` when neither the backups nor the
/// proxy saw enough to judge.
pub fn verdict(requests: &Requests, backups: &[Backup], running: bool) -> Verdict {
    let mut fails = Vec::new();
    let mut warns = Vec::new();
    let mut notes = Vec::new();
    let mut judged = false;
    if requests.total >= MIN_REQUESTS {
        judged = true;
        let r = requests.success_rate.unwrap_or(0.0);
        let s = format!("proxy success {} over {} requests", pct(r), requests.total);
        if r < 0.95 {
            fails.push(s);
        } else if r < 0.99 {
            warns.push(s);
        }
    } else {
        notes.push(format!(
            "{} proxy request(s): too few to judge the model's success rate",
            requests.total
        ));
    }
    if backups.is_empty() {
        notes.push("no route took the drilled route's traffic".to_owned());
    }
    for b in backups {
        let f = &b.figures;
        let who = f.route.as_str();
        if f.probes < MIN_PROBES {
            notes.push(format!("{who}: {} probe(s), too few to judge", f.probes));
        } else {
            judged = true;
            let r = f.success_rate.unwrap_or(0.0);
            let s = format!("{who}: probe success {} ({} probes)", pct(r), f.probes);
            if r < 0.95 {
                fails.push(s);
            } else if r < 0.99 {
                warns.push(s);
            }
        }
        if f.validation_failures > 0 {
            let share = f.validation_failures as f64 / f.probes.max(1) as f64;
            let s = format!("{who}: {} wrong answer(s)", f.validation_failures);
            if f.validation_failures >= 3 || share >= 0.05 {
                fails.push(s);
            } else {
                warns.push(s);
            }
        }
        match b.p95_vs_baseline {
            Some(x) => {
                let s = format!(
                    "{who}: p95 {} vs baseline {} ({x:.2}×)",
                    ms(f.latency_ms.p95),
                    ms(b.baseline.latency_ms.p95)
                );
                if x > 2.0 {
                    fails.push(s);
                } else if x > 1.5 {
                    warns.push(s);
                }
            }
            None if f.probes > 0 => notes.push(format!(
                "{who}: no latency baseline ({} sample(s) in the same hours)",
                b.baseline.samples
            )),
            None => {}
        }
        for set in &b.regression {
            let (Some(now), Some(before)) = (set.during.rate, set.history.rate) else {
                continue;
            };
            if now >= before {
                continue;
            }
            let s = format!(
                "{who}: regression set {} passed {} vs {} before",
                set.set,
                pct(now),
                pct(before)
            );
            if set.p_value.is_some_and(|p| p < REGRESSION_ALPHA) {
                fails.push(format!("{s} (p = {:.3})", set.p_value.unwrap_or(1.0)));
            } else {
                warns.push(s);
            }
        }
    }
    let level = if !fails.is_empty() {
        Level::Fail
    } else if !warns.is_empty() {
        Level::Warn
    } else if !judged {
        Level::Inconclusive
    } else {
        Level::Pass
    };
    let so_far = if running { " so far" } else { "" };
    let carried: Vec<String> = backups
        .iter()
        .map(|b| {
            format!(
                "{} ({} probes, {} ok, p95 {})",
                b.figures.route,
                b.figures.probes,
                b.figures.success_rate.map_or_else(|| "–".to_owned(), pct),
                ms(b.figures.latency_ms.p95)
            )
        })
        .collect();
    let head = match level {
        Level::Pass => format!("PASS{so_far}: the backup carried the traffic"),
        Level::Warn => format!("WARN{so_far}: {}", warns.join("; ")),
        Level::Fail => format!("FAIL{so_far}: {}", fails.join("; ")),
        Level::Inconclusive => {
            format!("INCONCLUSIVE{so_far}: too little traffic and too few probes to judge")
        }
    };
    let line = if carried.is_empty() || matches!(level, Level::Inconclusive) {
        head
    } else {
        format!(
            "{head} — {}; proxy {} of {} requests ok, {} fallback(s)",
            carried.join(", "),
            requests.ok,
            requests.total,
            requests.fallbacks
        )
    };
    Verdict {
        level,
        line,
        findings: fails.into_iter().chain(warns).chain(notes).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LatencyHistogram;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn id(s: &str) -> RouteId {
        RouteId::parse(s).unwrap()
    }

    fn drill() -> Drill {
        Drill {
            id: 3,
            route: id("a/cn/main"),
            serves: "chat".into(),
            weight: 0,
            ramp: vec![50, 100],
            reason: "failover drill".into(),
            started_by: Some("ops".into()),
            forced: false,
            started_at: t("2026-11-30T18:10:00Z"),
            ends_at: t("2026-11-30T18:40:00Z"),
            ended_at: Some(t("2026-11-30T18:40:00Z")),
            ended_by: Some(super::super::EndedBy::Auto),
            stopped_by: None,
            receivers: vec![id("b/cn/backup")],
        }
    }

    fn probes(total: u64, ok: u64, wrong: u64, ms: f64) -> OutcomeFigures {
        OutcomeFigures {
            total,
            successes: ok,
            validation_failures: wrong,
            latencies_ms: (0..ok).map(|i| ms + i as f64).collect(),
        }
    }

    fn hour(start: &str, n: u64, ms: f64) -> Rollup {
        let mut r = Rollup::empty(
            id("b/cn/backup"),
            Some(OutcomeKind::Probe),
            Granularity::Hour,
            t(start),
        );
        r.count = n;
        r.successes = n;
        let mut h = LatencyHistogram::default();
        for _ in 0..n {
            h.record(ms);
        }
        r.histogram = h;
        r
    }

    fn inputs() -> Inputs {
        Inputs {
            drill: drill(),
            now: t("2026-11-30T19:00:00Z"),
            tz: chrono_tz::Asia::Shanghai,
            requests: RequestFigures {
                total: 200,
                ok: 199,
                fallbacks: 4,
                contracts: [("fallback_model".to_owned(), 4)].into(),
                by_route: [
                    ("b/cn/backup".to_owned(), 150),
                    ("a/cn/main".to_owned(), 50),
                ]
                .into(),
            },
            drilled: probes(30, 30, 0, 400.0),
            backups: vec![BackupInputs {
                route: id("b/cn/backup"),
                probes: probes(60, 60, 0, 500.0),
                // 02:00 local (18:00Z) is a drill hour; 12:00 local (04:00Z) is not.
                history: vec![
                    hour("2026-11-29T18:00:00Z", 40, 480.0),
                    hour("2026-11-29T04:00:00Z", 40, 3000.0),
                ],
                regression: [(
                    "json".to_owned(),
                    RunTotals {
                        runs: 2,
                        passed: 20,
                        answered: 20,
                        cases: 20,
                    },
                )]
                .into(),
                regression_history: [(
                    "json".to_owned(),
                    RunTotals {
                        runs: 20,
                        passed: 195,
                        answered: 200,
                        cases: 200,
                    },
                )]
                .into(),
            }],
        }
    }

    #[test]
    fn the_local_hours_of_the_window() {
        let tz = chrono_tz::Asia::Shanghai;
        assert_eq!(
            local_hours(tz, t("2026-11-30T18:10:00Z"), t("2026-11-30T18:40:00Z")),
            vec![2]
        );
        assert_eq!(
            local_hours(tz, t("2026-11-30T18:50:00Z"), t("2026-11-30T19:10:00Z")),
            vec![2, 3]
        );
        assert_eq!(
            local_hours(tz, t("2026-11-30T00:00:00Z"), t("2026-12-03T00:00:00Z")).len(),
            24
        );
    }

    #[test]
    fn a_healthy_backup_passes_against_its_same_hour_baseline() {
        let r = build(&inputs());
        assert!(!r.window.running);
        assert_eq!(r.requests.success_rate, Some(0.995));
        assert_eq!(r.requests.contracts["fallback_model"], 4);
        let b = &r.backups[0];
        assert_eq!(b.baseline.hours, vec![2]);
        // Only the same-hour bucket counts: 40 samples near 480 ms, not the 3 s midday ones.
        assert_eq!(b.baseline.samples, 40);
        let base = b.baseline.latency_ms.p95.unwrap();
        // Histogram buckets: within their width of the true value.
        assert!((base - 480.0).abs() / 480.0 < 0.10, "{base}");
        assert!(b.p95_vs_baseline.unwrap() < 1.2);
        assert_eq!(b.regression[0].during.rate, Some(1.0));
        assert_eq!(r.verdict.level, Level::Pass, "{:?}", r.verdict);
        assert!(
            r.verdict.line.starts_with(
                "PASS: the backup carried the traffic — b/cn/backup (60 probes, 100.0% ok"
            ),
            "{}",
            r.verdict.line
        );
        let text = render_text(&drill(), &r);
        assert!(text.contains("contract uses: fallback_model 4"), "{text}");
        assert!(text.contains("regression set json: 20/20 passed"), "{text}");
    }

    #[test]
    fn slow_wrong_or_drifting_backups_fail() {
        let mut i = inputs();
        i.backups[0].probes = probes(60, 60, 0, 1200.0);
        let r = build(&i);
        assert_eq!(r.verdict.level, Level::Fail);
        assert!(r.verdict.line.contains("vs baseline"), "{}", r.verdict.line);

        let mut i = inputs();
        i.backups[0].probes = probes(60, 60, 1, 500.0);
        assert_eq!(build(&i).verdict.level, Level::Warn);
        i.backups[0].probes = probes(60, 60, 3, 500.0);
        assert_eq!(build(&i).verdict.level, Level::Fail);

        let mut i = inputs();
        i.backups[0].regression.insert(
            "json".into(),
            RunTotals {
                runs: 2,
                passed: 12,
                answered: 20,
                cases: 20,
            },
        );
        let r = build(&i);
        assert_eq!(r.verdict.level, Level::Fail);
        assert!(r.backups[0].regression[0].p_value.unwrap() < 0.05);

        let mut i = inputs();
        i.requests.ok = 180;
        assert_eq!(build(&i).verdict.level, Level::Fail);
    }

    #[test]
    fn too_little_evidence_is_inconclusive_and_a_running_drill_says_so_far() {
        let mut i = inputs();
        i.requests = RequestFigures::default();
        i.backups[0].probes = probes(2, 2, 0, 500.0);
        let r = build(&i);
        assert_eq!(r.verdict.level, Level::Inconclusive);
        let mut i = inputs();
        i.drill.ended_at = None;
        i.drill.ended_by = None;
        i.now = t("2026-11-30T18:20:00Z");
        let r = build(&i);
        assert!(r.window.running);
        assert_eq!(r.window.to, i.now);
        assert!(
            r.verdict.line.starts_with("PASS so far"),
            "{}",
            r.verdict.line
        );
    }
}
