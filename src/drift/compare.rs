//! A route against ITS OWN history, one regression set at a time — never route against route:
//! different providers differ by design, and a backup's style is not a defect.
//!
//! For the latest `m` runs `R` of a (route, set) — `m` from 2 to [`CompareOptions::max_recent`],
//! so a change that started a few runs ago is still compared with the runs before it — and
//! the baseline `B` (up to [`CompareOptions::baseline_runs`] runs just before `R`):
//!
//! - **pass rate drop** (`warning`, `behavior_changed`): Fisher's exact test, one-sided, of the
//!   pooled pass count of `R` against `B`, at `alpha` (0.001); and every run of `R` on its own
//!   must show the drop (pass rate below `B`'s). A small α and "seen in (at least) two
//!   consecutive runs" keep many tests over many runs from raising false findings.
//! - **output length shift** (`warning`, `behavior_changed`): each answer's length as a ratio
//!   to its case's median length in `B` (so cases of different lengths pool), Mann–Whitney U of
//!   `R` against `B` at `alpha`, the medians at least `min_length_shift` apart, and every run
//!   of `R` on the same side.
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
    /// Runs before the last two that form the baseline.
    pub baseline_runs: usize,
    /// Below this many baseline runs nothing is judged (model changes excepted).
    pub min_baseline_runs: usize,
    /// A change is looked for in the last 2..=this many runs (each against the runs before).
    pub max_recent: usize,
    /// The smallest relative change of median length worth a finding.
    pub min_length_shift: f64,
    /// Examples kept per finding.
    pub max_examples: usize,
}

impl Default for CompareOptions {
    fn default() -> Self {
        Self {
            alpha: 0.001,
            baseline_runs: 24,
            min_baseline_runs: 4,
            max_recent: 6,
            min_length_shift: 0.25,
            max_examples: 3,
        }
    }
}

/// Findings for one (route, set) from its history, oldest run first. `frozen`: the baseline
/// to use instead of the runs before the last two (see [`History`]: once drift is found, the
/// baseline stays the pre-change runs, so the finding lasts while the change does).
pub fn compare(
    history: &[SetRun],
    frozen: Option<&[SetRun]>,
    o: &CompareOptions,
) -> Vec<DriftFinding> {
    let mut out = Vec::new();
    let n = history.len();
    if n < 2 {
        return out;
    }
    if let Some(f) = model_changed(history, o) {
        out.push(f);
    }
    // A change may have started up to `max_recent` runs ago (a window that missed it at two
    // runs must not lose it as the baseline fills with the changed runs): scan the last m
    // runs, m = 2..=max_recent, each against the runs just before them.
    let windows: Vec<usize> = match frozen {
        Some(_) => vec![2],
        None => (2..=o.max_recent.max(2)).collect(),
    };
    let mut drop = None;
    let mut shift = None;
    for m in windows {
        if m > n {
            break;
        }
        let end = n - m;
        let base = match frozen {
            Some(base) => base,
            None => &history[end.saturating_sub(o.baseline_runs)..end],
        };
        if base.len() < o.min_baseline_runs {
            continue;
        }
        let recent = &history[end..];
        if drop.is_none() {
            drop = pass_rate_drop(base, recent, o);
        }
        if shift.is_none() {
            shift = length_shift(base, recent, o);
        }
    }
    out.extend(drop);
    out.extend(shift);
    out
}

/// The baseline a drift finding was found against (what [`History`] freezes): the
/// `baseline_runs` runs before the finding's first run.
fn baseline_of<'a>(history: &'a [SetRun], f: &DriftFinding, o: &CompareOptions) -> &'a [SetRun] {
    let first = f
        .evidence
        .runs
        .first()
        .map_or(f.detected_at, |r| r.started_at);
    let end = history
        .iter()
        .position(|r| r.started_at >= first)
        .unwrap_or(history.len());
    &history[end.saturating_sub(o.baseline_runs)..end]
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
        if p as f64 / t as f64 >= rate_b {
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
        "set {:?} on {}: pass rate fell from {}/{} ({:.0}%) to {}/{} ({:.0}%) over the last {} runs (Fisher exact, one-sided p = {:.2e})",
        latest.set,
        latest.route,
        pb,
        nb,
        rate_b * 100.0,
        pa,
        na,
        pa as f64 / na as f64 * 100.0,
        recent.len(),
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
        "set {:?} on {}: answers got {} — median {:.0}% of their usual length over the last {} runs (Mann–Whitney U, p = {:.2e})",
        latest.set,
        latest.route,
        if longer { "longer" } else { "shorter" },
        ma / mb * 100.0,
        recent.len(),
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
///
/// When a drift finding opens, the baseline it was found against is frozen: later runs are
/// compared with the pre-change runs, not with a window that slowly fills with the changed
/// behaviour, so the finding lasts as long as the change does. It closes when the latest two
/// runs no longer differ from that baseline (the route went back), or when an operator
/// accepts the new behaviour as normal ([`History::accept`]).
#[derive(Debug, Default, Clone)]
pub struct History {
    pairs: HashMap<(RouteId, String), Pair>,
    options: CompareOptions,
}

#[derive(Debug, Default, Clone)]
struct Pair {
    runs: VecDeque<SetRun>,
    frozen: Option<Vec<SetRun>>,
    findings: Vec<DriftFinding>,
}

impl History {
    pub fn new(options: CompareOptions) -> Self {
        Self {
            options,
            ..Self::default()
        }
    }

    /// Runs to load from the store to rebuild a pair (replaying them through [`ingest`]
    /// refreezes a baseline found within this window).
    ///
    /// [`ingest`]: History::ingest
    pub fn replay_window(&self) -> usize {
        3 * self.options.baseline_runs + 2
    }

    /// Adds a run (runs of one pair must come in time order) and recomputes that pair's
    /// findings, which it returns.
    pub fn ingest(&mut self, run: SetRun) -> &[DriftFinding] {
        let key = (run.route.clone(), run.set.clone());
        let o = &self.options;
        let keep = o.baseline_runs + 2;
        let pair = self.pairs.entry(key).or_default();
        pair.runs.push_back(run);
        while pair.runs.len() > keep {
            pair.runs.pop_front();
        }
        let runs = pair.runs.make_contiguous();
        let found = compare(runs, pair.frozen.as_deref(), o);
        let drifting = found.iter().any(DriftFinding::is_drift);
        match (&pair.frozen, drifting) {
            (None, true) => {
                if let Some(f) = found.iter().find(|f| f.is_drift()) {
                    pair.frozen = Some(baseline_of(runs, f, o).to_vec());
                }
            }
            (Some(_), false) => pair.frozen = None,
            _ => {}
        }
        pair.findings = found;
        &pair.findings
    }

    /// Takes the current behaviour of (route, set) as its new normal: drops the frozen
    /// baseline and the runs before the latest two, and clears the drift findings.
    pub fn accept(&mut self, route: &RouteId, set: &str) {
        if let Some(pair) = self.pairs.get_mut(&(route.clone(), set.to_owned())) {
            pair.frozen = None;
            while pair.runs.len() > 2 {
                pair.runs.pop_front();
            }
            pair.findings.retain(|f| !f.is_drift());
        }
    }

    /// Every current finding, in (route, set, kind) order.
    pub fn findings(&self) -> Vec<DriftFinding> {
        let mut all: Vec<DriftFinding> = self
            .pairs
            .values()
            .flat_map(|p| p.findings.iter().cloned())
            .collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// The runs kept for a pair, oldest first.
    pub fn runs(&self, route: &RouteId, set: &str) -> Vec<SetRun> {
        self.pairs
            .get(&(route.clone(), set.to_owned()))
            .map(|p| p.runs.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Every pair's latest runs (newest last), at most `n` each, in (route, set) order.
    pub fn latest(&self, n: usize) -> Vec<(RouteId, String, Vec<SetRun>)> {
        let mut out: Vec<_> = self
            .pairs
            .iter()
            .map(|((route, set), p)| {
                let skip = p.runs.len().saturating_sub(n);
                (
                    route.clone(),
                    set.clone(),
                    p.runs.iter().skip(skip).cloned().collect(),
                )
            })
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drift::CaseResult;
    use chrono::{TimeZone, Utc};

    /// A run of `n` cases, the first `fail` failing, each answer `len` chars long.
    fn run(i: i64, n: usize, fail: usize, len: u32, model: &str) -> SetRun {
        SetRun {
            route: RouteId::new("p", "r", "m"),
            set: "s".into(),
            started_at: Utc.timestamp_opt(1_700_000_000 + i * 3600, 0).unwrap(),
            cases: (0..n)
                .map(|c| CaseResult {
                    case: format!("c{c}"),
                    passed: Some(c >= fail),
                    failures: Vec::new(),
                    output_chars: len + c as u32,
                    latency_ms: 100.0,
                    output_tokens: None,
                    model_reported: Some(model.into()),
                    system_fingerprint: None,
                    error: None,
                    output: "x".repeat(len as usize),
                })
                .collect(),
        }
    }

    fn kinds(h: &History) -> Vec<DriftKind> {
        h.findings().iter().map(|f| f.kind).collect()
    }

    #[test]
    fn drift_persists_while_it_lasts_and_closes_when_the_route_goes_back() {
        let mut h = History::new(CompareOptions::default());
        let mut i = 0;
        let mut feed = |h: &mut History, fail: usize| {
            i += 1;
            h.ingest(run(i, 6, fail, 10, "m1"));
        };
        for _ in 0..10 {
            feed(&mut h, 0);
        }
        feed(&mut h, 3);
        assert!(kinds(&h).is_empty(), "one run is not enough");
        feed(&mut h, 3);
        assert_eq!(kinds(&h), vec![DriftKind::PassRateDrop]);
        // 40 more drifted runs: the baseline stays the pre-change runs, the finding stays.
        for _ in 0..40 {
            feed(&mut h, 3);
        }
        assert_eq!(kinds(&h), vec![DriftKind::PassRateDrop]);
        // Back to normal for two runs: closed.
        feed(&mut h, 0);
        feed(&mut h, 0);
        assert!(kinds(&h).is_empty(), "{:?}", kinds(&h));
    }

    #[test]
    fn accept_takes_the_new_behaviour_as_normal() {
        let mut h = History::new(CompareOptions::default());
        for i in 0..10 {
            h.ingest(run(i, 6, 0, 10, "m1"));
        }
        for i in 10..13 {
            h.ingest(run(i, 6, 4, 10, "m1"));
        }
        assert_eq!(kinds(&h), vec![DriftKind::PassRateDrop]);
        h.accept(&RouteId::new("p", "r", "m"), "s");
        assert!(kinds(&h).is_empty());
        for i in 13..30 {
            h.ingest(run(i, 6, 4, 10, "m1"));
        }
        assert!(kinds(&h).is_empty(), "{:?}", kinds(&h));
    }

    #[test]
    fn lengths_that_double_are_a_length_shift() {
        let mut h = History::new(CompareOptions::default());
        for i in 0..10 {
            h.ingest(run(i, 6, 0, 20, "m1"));
        }
        h.ingest(run(10, 6, 0, 45, "m1"));
        assert!(kinds(&h).is_empty());
        h.ingest(run(11, 6, 0, 45, "m1"));
        assert_eq!(kinds(&h), vec![DriftKind::LengthShift]);
        let f = &h.findings()[0];
        let l = f.evidence.length.as_ref().unwrap();
        assert!(
            l.after_median_ratio > 2.0 * l.before_median_ratio * 0.9,
            "{l:?}"
        );
        assert!(f.summary.contains("longer"), "{}", f.summary);
    }

    #[test]
    fn too_little_history_judges_nothing_and_model_changes_are_info() {
        let mut h = History::new(CompareOptions::default());
        h.ingest(run(0, 6, 0, 10, "m1"));
        h.ingest(run(1, 6, 6, 10, "m1"));
        h.ingest(run(2, 6, 6, 10, "m1"));
        assert!(kinds(&h).is_empty(), "needs min_baseline_runs first");
        h.ingest(run(3, 6, 6, 10, "m2"));
        assert_eq!(kinds(&h), vec![DriftKind::ModelChanged]);
        assert_eq!(h.findings()[0].severity, Severity::Info);
    }
}
