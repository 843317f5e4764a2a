//! When a long-prompt result is a finding (pure).
//!
//! - Baseline: the median TTFT of the route's last [`WINDOW`] good results (the code word
//!   returned, not slow). The median, not the mean: one cold-start outlier among seven daily
//!   probes would drag a mean and its σ far enough to hide a real slowdown.
//! - Slow: TTFT above [`FACTOR`] × baseline. The first slow result asks for a quick re-probe
//!   ([`RECHECK`]); the second in a row opens `long_prompt_slow` (a warning). One result back
//!   under the threshold closes it. Slow results never join the baseline, so a slowdown that
//!   lasts cannot become the new normal behind the finding's back.
//! - Until [`MIN_SAMPLES`] good results exist there is no baseline and no `long_prompt_slow`.
//! - Wrong: an answer without the code word, or a failed call, twice in a row while chat
//!   answers, is `capability_lost: long_prompt`; one right answer closes it.

use std::collections::{BTreeMap, VecDeque};

use chrono::{DateTime, Utc};

use crate::capability::judge::{finding as lost_finding, Verdict, CONFIRM};
use crate::drift::{DriftFinding, DriftKind, Severity};
use crate::route::RouteId;

pub use crate::capability::judge::RECHECK;

/// The capability name in findings and stored rows.
pub const NAME: &str = "long_prompt";
/// Good results the baseline is the median of.
pub const WINDOW: usize = 7;
/// Good results needed before a baseline exists.
pub const MIN_SAMPLES: usize = 3;
/// How many times the baseline a TTFT must exceed to be slow.
pub const FACTOR: f64 = 2.0;

/// One long-prompt probe's result.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A complete answer: its TTFT and whether it held the code word.
    Answered { ttft_ms: f64, correct: bool },
    /// No complete answer (HTTP error, timeout, context refused): why.
    Failed(String),
}

/// The median of `samples` (ms), `None` below [`MIN_SAMPLES`].
pub fn baseline(samples: &[f64]) -> Option<f64> {
    if samples.len() < MIN_SAMPLES {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// The TTFT above which a result is slow.
pub fn threshold(baseline_ms: f64) -> f64 {
    FACTOR * baseline_ms
}

#[derive(Debug, Default)]
struct Track {
    /// The last [`WINDOW`] good TTFTs, oldest first.
    good: VecDeque<f64>,
    slow: u32,
    wrong: u32,
    slow_open: Option<DriftFinding>,
    lost_open: Option<DriftFinding>,
}

/// How one result was classified, for the stored row.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    pub verdict: Verdict,
    /// `Some(reason)` when the result was slow or wrong; `None` for a good result.
    pub note: Option<String>,
}

/// Every route's baseline, streaks and open findings.
#[derive(Debug, Default)]
pub struct Judge {
    tracks: BTreeMap<RouteId, Track>,
}

impl Judge {
    /// Resumes `route`'s baseline from stored good TTFTs, oldest first (a new leader term
    /// continues where the last one stopped).
    pub fn resume(&mut self, route: &RouteId, good: &[f64]) {
        let t = self.tracks.entry(route.clone()).or_default();
        for &g in good {
            push(&mut t.good, g);
        }
    }

    /// The route's baseline now, if formed.
    pub fn baseline(&self, route: &RouteId) -> Option<f64> {
        let t = self.tracks.get(route)?;
        baseline(&Vec::from(t.good.clone()))
    }

    /// Takes one result. `chat_ok`: detection says the route's chat answers (failures while
    /// it does not are the outage's).
    pub fn observe(
        &mut self,
        route: &RouteId,
        answer: &Answer,
        chat_ok: bool,
        at: DateTime<Utc>,
    ) -> Judged {
        let t = self.tracks.entry(route.clone()).or_default();
        let (ttft, why_wrong) = match answer {
            Answer::Answered {
                ttft_ms,
                correct: true,
            } => (*ttft_ms, None),
            Answer::Answered { correct: false, .. } => {
                (0.0, Some("the answer lacks the code word".to_owned()))
            }
            Answer::Failed(e) => (0.0, Some(e.clone())),
        };
        if let Some(why) = why_wrong {
            if !chat_ok {
                return judged(Verdict::Next, Some(why));
            }
            t.wrong = t.wrong.saturating_add(1);
            if t.wrong < CONFIRM {
                return judged(Verdict::Recheck, Some(why));
            }
            if t.lost_open.is_none() {
                t.lost_open = Some(lost_finding(route, NAME, &why, t.wrong, at));
            }
            return judged(Verdict::Next, Some(why));
        }
        t.wrong = 0;
        t.lost_open = None;
        let base = baseline(&Vec::from(t.good.clone()));
        match base {
            Some(b) if ttft > threshold(b) => {
                let why = format!(
                    "ttft {ttft:.0} ms > {:.0} ms ({FACTOR}× the baseline {b:.0} ms)",
                    threshold(b)
                );
                t.slow = t.slow.saturating_add(1);
                if t.slow < CONFIRM {
                    return judged(Verdict::Recheck, Some(why));
                }
                if t.slow_open.is_none() {
                    t.slow_open = Some(slow_finding(route, ttft, b, t.slow, at));
                }
                judged(Verdict::Next, Some(why))
            }
            _ => {
                t.slow = 0;
                t.slow_open = None;
                push(&mut t.good, ttft);
                judged(Verdict::Next, None)
            }
        }
    }

    /// The open findings, by route.
    pub fn findings(&self) -> Vec<DriftFinding> {
        self.tracks
            .values()
            .flat_map(|t| t.lost_open.iter().chain(t.slow_open.iter()).cloned())
            .collect()
    }
}

fn judged(verdict: Verdict, note: Option<String>) -> Judged {
    Judged { verdict, note }
}

fn push(good: &mut VecDeque<f64>, v: f64) {
    good.push_back(v);
    while good.len() > WINDOW {
        good.pop_front();
    }
}

/// The `long_prompt_slow` finding: its `set` is `long_prompt`.
pub fn slow_finding(
    route: &RouteId,
    ttft_ms: f64,
    baseline_ms: f64,
    slow: u32,
    at: DateTime<Utc>,
) -> DriftFinding {
    DriftFinding {
        id: DriftFinding::key(route, NAME, DriftKind::LongPromptSlow),
        route: route.clone(),
        set: NAME.to_owned(),
        kind: DriftKind::LongPromptSlow,
        severity: Severity::Warning,
        failure_mode: None,
        detected_at: at,
        summary: format!(
            "long_prompt_slow: time to first token {ttft_ms:.0} ms on the long prompt, \
             over {FACTOR}× the route's baseline {baseline_ms:.0} ms, {slow} probes in a row"
        ),
        evidence: crate::capability::judge::in_a_row(slow),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(ms: f64) -> Answer {
        Answer::Answered {
            ttft_ms: ms,
            correct: true,
        }
    }

    #[test]
    fn no_finding_before_three_samples_then_twice_over_twice_the_median() {
        let r = RouteId::new("openai", "us", "gpt-4o");
        let t = DateTime::from_timestamp(1_767_225_600, 0).unwrap_or_default();
        let mut j = Judge::default();
        // Slow-looking results before a baseline exists are samples, not findings.
        assert_eq!(j.observe(&r, &ok(1_000.0), true, t).verdict, Verdict::Next);
        assert_eq!(j.observe(&r, &ok(5_000.0), true, t).verdict, Verdict::Next);
        assert_eq!(j.baseline(&r), None);
        assert_eq!(j.observe(&r, &ok(1_200.0), true, t).verdict, Verdict::Next);
        assert_eq!(
            j.baseline(&r),
            Some(1_200.0),
            "the median shrugs off the outlier"
        );
        // At exactly twice: not slow.
        assert_eq!(j.observe(&r, &ok(2_400.0), true, t).note, None);
        let base = j.baseline(&r).unwrap_or_default();
        let first = j.observe(&r, &ok(3.0 * base), true, t);
        assert_eq!(first.verdict, Verdict::Recheck);
        assert!(j.findings().is_empty());
        assert_eq!(
            j.observe(&r, &ok(3.0 * base), true, t).verdict,
            Verdict::Next
        );
        let f = j.findings();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, DriftKind::LongPromptSlow);
        assert_eq!(j.baseline(&r), Some(base), "slow results stay out");
        j.observe(&r, &ok(base), true, t);
        assert!(j.findings().is_empty());
    }

    #[test]
    fn wrong_answers_while_chat_answers_are_capability_lost() {
        let r = RouteId::new("anthropic", "us", "claude");
        let t = DateTime::from_timestamp(1_767_225_600, 0).unwrap_or_default();
        let mut j = Judge::default();
        let wrong = Answer::Answered {
            ttft_ms: 900.0,
            correct: false,
        };
        assert_eq!(j.observe(&r, &wrong, false, t).verdict, Verdict::Next);
        assert_eq!(j.observe(&r, &wrong, true, t).verdict, Verdict::Recheck);
        let failed = Answer::Failed("HTTP 400: context too long".into());
        assert_eq!(j.observe(&r, &failed, true, t).verdict, Verdict::Next);
        let f = j.findings();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].id, "anthropic/us/claude|long_prompt|capability_lost");
        assert!(
            f[0].summary.contains("context too long"),
            "{}",
            f[0].summary
        );
        j.observe(&r, &ok(900.0), true, t);
        assert!(j.findings().is_empty());
    }
}
