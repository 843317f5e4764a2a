//! A route against ITS OWN history, one regression set at a time — never route against route:
//! different providers differ by design (seed 003), and a backup's style is not a defect.
//!
//! For the latest two runs `r1, r2` of a (route, set) and the baseline `B` (up to
//! [`CompareOptions::baseline_runs`] runs just before them):
//!
//! - **pass rate drop** (`warning`, `behavior_changed`): Fisher's exact test, one-sided, of the
//!   pooled pass count of `r1+r2` against `B`, at `alpha` (0.001); and each of `r1`, `r2` on its
//!   own must show the drop (rate below `B`'s, one-sided p < `per_run_alpha`). A small α and
//!   "seen in two consecutive runs" keep many tests over many runs from raising false findings.
//! - **output length shift** (`warning`, `behavior_changed`): each answer's length as a ratio
//!   to its case's median length in `B` (so cases of different lengths pool), Mann–Whitney U of
//!   `r1+r2` against `B` at `alpha`, the medians at least `min_length_shift` apart, and both
//!   runs on the same side.
//! - **model changed** (`info`): the latest run's reported model or `system_fingerprint` is not
//!   the one most runs before it reported. Informational: not drift by itself.
//!
//! Calls that failed (transport, HTTP, timeouts) are left out of every test: availability is
//! the health detector's business, and a timeout is not a format change.

use std::collections::{HashMap, VecDeque};

use super::stats::{fisher_exact, mann_whitney_u, median};
use super::validate::excerpt;
use super::{
    DriftFinding, DriftKind, Evidence, Example, LengthEvidence, ModelEvidence, RateSample, RunStat,
    SetRun, Severity,
};
use crate::health::FailureMode;
use crate::route::RouteId;

/// Thresholds of the comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareOptions {
    /// Significance of the pooled test over the last two runs.
    pub alpha: f64,
    /// Each of the two runs must show the shift on its own at this level.
    pub per_run_alpha: f64,
    /// Runs before the last two that form the baseline.
    pub baseline_runs: usize,
    /// Below this many baseline runs nothing is judged (model changes excepted).
    pub min_baseline_runs: usize,
    /// The smallest relative change of median length worth a finding.
    pub min_length_shift: f64,
    /// Examples kept per finding.
    pub max_examples: usize,
}

impl Default for CompareOptions {
    fn default() -> Self {
        Self {
            alpha: 0.001,
            per_run_alpha: 0.05,
            baseline_runs: 24,
            min_baseline_runs: 4,
            min_length_shift: 0.25,
            max_examples: 3,
        }
    }
}

/// Findings for one (route, set) from its history, oldest run first.
pub fn compare(history: &[SetRun], o: &CompareOptions) -> Vec<DriftFinding> {
    let mut out = Vec::new();
    let n = history.len();
    if n < 2 {
        return out;
    }
    if let Some(f) = model_changed(history, o) {
        out.push(f);
    }
    if n < 2 + o.min_baseline_runs {
        return out;
    }
    let end = n - 2;
    let base = &history[end.saturating_sub(o.baseline_runs)..end];
    let recent = &history[end..];
    if let Some(f) = pass_rate_drop(base, recent, o) {
        out.push(f);
    }
    if let Some(f) = length_shift(base, recent, o) {
        out.push(f);
    }
    out
}

fn counts(runs: &[SetRun]) -> (u64, u64) {
    runs.iter().fold((0, 0), |(p, t), r| {
        (p + r.passed() as u64, t + r.answered() as u64)
    })
}

fn sample(runs: &[SetRun]) -> RateSample {
    let (passed, total) = counts(runs);
    RateSample {
        runs: runs.len(),
        passed,
        total,
        rate: if total == 0 {
            None
        } else {
            Some(passed as f64 / total as f64)
        },
    }
}

fn finding(latest: &SetRun, kind: DriftKind, summary: String, evidence: Evidence) -> DriftFinding {
    let (severity, failure_mode) = match kind {
        DriftKind::ModelChanged => (Severity::Info, None),
        _ => (Severity::Warning, Some(FailureMode::BehaviorChanged)),
    };
    DriftFinding {
        id: DriftFinding::key(&latest.route, &latest.set, kind),
        route: latest.route.clone(),
        set: latest.set.clone(),
        kind,
        severity,
        failure_mode,
        detected_at: latest.started_at,
        summary,
        evidence,
    }
}

fn pass_rate_drop(base: &[SetRun], recent: &[SetRun], o: &CompareOptions) -> Option<DriftFinding> {
    let (pb, nb) = counts(base);
    let (pa, na) = counts(recent);
    if nb == 0 || na == 0 {
        return None;
    }
    let rate_b = pb as f64 / nb as f64;
    let pooled = fisher_exact(pa, na - pa, pb, nb - pb).less;
    if pooled >= o.alpha {
        return None;
    }
    let mut per_run = Vec::new();
    for r in recent {
        let (p, t) = (r.passed() as u64, r.answered() as u64);
        if t == 0 {
            return None;
        }
        let p_value = fisher_exact(p, t - p, pb, nb - pb).less;
        if p as f64 / t as f64 >= rate_b || p_value >= o.per_run_alpha {
            return None;
        }
        per_run.push(RunStat {
            started_at: r.started_at,
            passed: p,
            total: t,
            p_value: Some(p_value),
            median_length_ratio: None,
        });
    }
    let latest = recent.last()?;
    let before = sample(base);
    let after = sample(recent);
    let examples = failing_examples(base, latest, o.max_examples);
    let summary = format!(
        "set {:?} on {}: pass rate fell from {}/{} ({:.0}%) to {}/{} ({:.0}%) over the last 2 runs (Fisher exact, one-sided p = {:.2e})",
        latest.set,
        latest.route,
        pb,
        nb,
        rate_b * 100.0,
        pa,
        na,
        pa as f64 / na as f64 * 100.0,
        pooled
    );
    Some(finding(
        latest,
        DriftKind::PassRateDrop,
        summary,
        Evidence {
            test: "fisher_exact_one_sided".into(),
            p_value: Some(pooled),
            before,
            after,
            runs: per_run,
            length: None,
            model: None,
            examples,
        },
    ))
}

/// Up to `max` cases that failed in `latest`, each with the last answer of that case that
/// passed in the baseline.
fn failing_examples(base: &[SetRun], latest: &SetRun, max: usize) -> Vec<Example> {
    latest
        .cases
        .iter()
        .filter(|c| c.passed == Some(false))
        .take(max)
        .map(|c| Example {
            case: c.case.clone(),
            failures: c.failures.clone(),
            before: base
                .iter()
                .rev()
                .flat_map(|r| r.cases.iter())
                .find(|b| b.case == c.case && b.passed == Some(true))
                .map(|b| excerpt(&b.output, 200)),
            after: Some(excerpt(&c.output, 200)),
        })
        .collect()
}

fn length_shift(base: &[SetRun], recent: &[SetRun], o: &CompareOptions) -> Option<DriftFinding> {
    // Median length of each case in the baseline.
    let mut per_case: HashMap<&str, Vec<f64>> = HashMap::new();
    for r in base {
        for c in r.cases.iter().filter(|c| c.passed.is_some()) {
            per_case
                .entry(c.case.as_str())
                .or_default()
                .push(f64::from(c.output_chars));
        }
    }
    let medians: HashMap<&str, f64> = per_case
        .iter()
        .filter_map(|(k, v)| median(v).map(|m| (*k, m)))
        .collect();
    let ratios = |r: &SetRun| -> Vec<f64> {
        r.cases
            .iter()
            .filter(|c| c.passed.is_some())
            .filter_map(|c| {
                medians
                    .get(c.case.as_str())
                    .map(|m| (f64::from(c.output_chars) + 1.0) / (m + 1.0))
            })
            .collect()
    };
    let before: Vec<f64> = base.iter().flat_map(ratios).collect();
    let after: Vec<f64> = recent.iter().flat_map(ratios).collect();
    let (mb, ma) = (median(&before)?, median(&after)?);
    let test = mann_whitney_u(&after, &before);
    if test.two_sided >= o.alpha || (ma / mb - 1.0).abs() < o.min_length_shift {
        return None;
    }
    let longer = ma > mb;
    let mut runs = Vec::new();
    for r in recent {
        let m = median(&ratios(r))?;
        if (m > mb) != longer || m == mb {
            return None;
        }
        runs.push(RunStat {
            started_at: r.started_at,
            passed: r.passed() as u64,
            total: r.answered() as u64,
            p_value: None,
            median_length_ratio: Some(m),
        });
    }
    let latest = recent.last()?;
    let median_chars = |runs: &[SetRun]| {
        let v: Vec<f64> = runs
            .iter()
            .flat_map(|r| r.cases.iter().filter(|c| c.passed.is_some()))
            .map(|c| f64::from(c.output_chars))
            .collect();
        median(&v)
    };
    // The case whose answer moved most, as the example.
    let example = latest
        .cases
        .iter()
        .filter(|c| c.passed.is_some())
        .filter_map(|c| {
            let m = medians.get(c.case.as_str())?;
            Some((
                ((f64::from(c.output_chars) + 1.0) / (m + 1.0)).ln().abs(),
                c,
            ))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| Example {
            case: c.case.clone(),
            failures: c.failures.clone(),
            before: base
                .iter()
                .rev()
                .flat_map(|r| r.cases.iter())
                .find(|b| b.case == c.case && b.passed.is_some())
                .map(|b| excerpt(&b.output, 200)),
            after: Some(excerpt(&c.output, 200)),
        });
    let summary = format!(
        "set {:?} on {}: answers got {} — median {:.0}% of their usual length over the last 2 runs (Mann–Whitney U, p = {:.2e})",
        latest.set,
        latest.route,
        if longer { "longer" } else { "shorter" },
        ma / mb * 100.0,
        test.two_sided
    );
    Some(finding(
        latest,
        DriftKind::LengthShift,
        summary,
        Evidence {
            test: "mann_whitney_u_two_sided".into(),
            p_value: Some(test.two_sided),
            before: sample(base),
            after: sample(recent),
            runs,
            length: Some(LengthEvidence {
                before_median_chars: median_chars(base),
                after_median_chars: median_chars(recent),
                before_median_ratio: mb,
                after_median_ratio: ma,
            }),
            model: None,
            examples: example.into_iter().collect(),
        },
    ))
}

fn model_changed(history: &[SetRun], o: &CompareOptions) -> Option<DriftFinding> {
    let latest = history.last()?;
    let prior = &history[history.len().saturating_sub(1 + o.baseline_runs)..history.len() - 1];
    let now = (latest.model(), latest.fingerprint());
    let usual = most_common(prior.iter().map(|r| (r.model(), r.fingerprint())))?;
    let model_moved = matches!((&usual.0, &now.0), (Some(a), Some(b)) if a != b);
    let fp_moved = matches!((&usual.1, &now.1), (Some(a), Some(b)) if a != b);
    if !model_moved && !fp_moved {
        return None;
    }
    // When it changed: the first run since which every run reports the new value.
    let since = history
        .iter()
        .rev()
        .take_while(|r| (r.model(), r.fingerprint()) == now)
        .last()
        .map_or(latest.started_at, |r| r.started_at);
    let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let summary = if model_moved {
        format!(
            "set {:?} on {}: the reported model changed from {} to {} (since {})",
            latest.set,
            latest.route,
            show(&usual.0),
            show(&now.0),
            since.to_rfc3339()
        )
    } else {
        format!(
            "set {:?} on {}: system_fingerprint changed from {} to {} (since {})",
            latest.set,
            latest.route,
            show(&usual.1),
            show(&now.1),
            since.to_rfc3339()
        )
    };
    Some(finding(
        latest,
        DriftKind::ModelChanged,
        summary,
        Evidence {
            test: "none".into(),
            p_value: None,
            before: sample(prior),
            after: sample(std::slice::from_ref(latest)),
            runs: Vec::new(),
            length: None,
            model: Some(ModelEvidence {
                before_model: usual.0,
                after_model: now.0,
                before_fingerprint: usual.1,
                after_fingerprint: now.1,
                since,
            }),
            examples: Vec::new(),
        },
    ))
}

fn most_common<T: PartialEq + Clone>(items: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: Vec<(T, usize)> = Vec::new();
    for item in items {
        match counts.iter_mut().find(|(k, _)| *k == item) {
            Some((_, n)) => *n += 1,
            None => counts.push((item, 1)),
        }
    }
    // Ties go to the most recent value (the later entry).
    counts
        .into_iter()
        .rev()
        .max_by_key(|(_, n)| *n)
        .map(|(k, _)| k)
}

/// The bounded history of every (route, set) and the findings it gives: the runner's state,
/// pure (tests and the benchmark drive it without a server).
#[derive(Debug, Default, Clone)]
pub struct History {
    runs: HashMap<(RouteId, String), VecDeque<SetRun>>,
    findings: HashMap<(RouteId, String), Vec<DriftFinding>>,
    options: CompareOptions,
}

impl History {
    pub fn new(options: CompareOptions) -> Self {
        Self {
            options,
            ..Self::default()
        }
    }

    /// Adds a run (runs of one pair must come in time order) and recomputes that pair's
    /// findings, which it returns.
    pub fn ingest(&mut self, run: SetRun) -> &[DriftFinding] {
        let key = (run.route.clone(), run.set.clone());
        let keep = self.options.baseline_runs + 2;
        let runs = self.runs.entry(key.clone()).or_default();
        runs.push_back(run);
        while runs.len() > keep {
            runs.pop_front();
        }
        let found = compare(runs.make_contiguous(), &self.options);
        let slot = self.findings.entry(key).or_default();
        *slot = found;
        slot
    }

    /// Every current finding, in (route, set, kind) order.
    pub fn findings(&self) -> Vec<DriftFinding> {
        let mut all: Vec<DriftFinding> = self.findings.values().flatten().cloned().collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// The runs kept for a pair, oldest first.
    pub fn runs(&self, route: &RouteId, set: &str) -> Vec<SetRun> {
        self.runs
            .get(&(route.clone(), set.to_owned()))
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Every pair's latest runs (newest last), at most `n` each, in (route, set) order.
    pub fn latest(&self, n: usize) -> Vec<(RouteId, String, Vec<SetRun>)> {
        let mut out: Vec<_> = self
            .runs
            .iter()
            .map(|((route, set), runs)| {
                let skip = runs.len().saturating_sub(n);
                (
                    route.clone(),
                    set.clone(),
                    runs.iter().skip(skip).cloned().collect(),
                )
            })
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }
}
