//! When a failed capability probe becomes a `capability_lost` finding (pure).
//!
//! The rule: one failure asks for a quick re-probe ([`RECHECK`] later); the second failure in
//! a row opens the finding, so a single flaky answer never pages. One success closes it.
//! Failures while chat itself is failing (the route has an open incident, or its latest
//! verdict is `unavailable`) are not counted: the outage covers them, and the capability is
//! probed again at its usual cadence.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Probed;
use crate::drift::{DriftFinding, DriftKind, Evidence, RateSample, Severity};
use crate::health::{FailureMode, RouteStatus};
use crate::route::RouteId;

/// How soon a first failure is probed again.
pub const RECHECK: Duration = Duration::from_secs(60);
/// Failures in a row that open the finding.
pub const CONFIRM: u32 = 2;

/// What the runner does after a result.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Probe again at the usual cadence.
    Next,
    /// Probe again after [`RECHECK`] to confirm a first failure.
    Recheck,
}

#[derive(Debug, Clone, Default)]
struct Track {
    failures: u32,
    open: Option<DriftFinding>,
}

/// Every route's capabilities' failure streaks and open findings.
#[derive(Debug, Default)]
pub struct Judge {
    tracks: BTreeMap<(RouteId, Probed), Track>,
}

/// Whether the route's chat answers, by detection's latest verdict.
pub fn chat_answers(status: Option<&RouteStatus>) -> bool {
    status.is_none_or(|s| s.incident.is_none() && s.failure_mode != Some(FailureMode::Unavailable))
}

impl Judge {
    /// Takes one probe's result: `Ok` or the reason it failed.
    pub fn observe(
        &mut self,
        route: &RouteId,
        cap: Probed,
        result: Result<(), &str>,
        chat_ok: bool,
        at: DateTime<Utc>,
    ) -> Verdict {
        let t = self.tracks.entry((route.clone(), cap)).or_default();
        let error = match result {
            Ok(()) => {
                t.failures = 0;
                t.open = None;
                return Verdict::Next;
            }
            Err(e) => e,
        };
        if !chat_ok {
            return Verdict::Next;
        }
        t.failures = t.failures.saturating_add(1);
        if t.failures < CONFIRM {
            return Verdict::Recheck;
        }
        if t.open.is_none() {
            t.open = Some(finding(route, cap.as_str(), error, t.failures, at));
        }
        Verdict::Next
    }

    /// The open findings, by route then capability.
    pub fn findings(&self) -> Vec<DriftFinding> {
        self.tracks
            .values()
            .filter_map(|t| t.open.clone())
            .collect()
    }
}

/// The `capability_lost` finding of capability `cap` (`tools`, `json_schema`, `long_prompt`)
/// on `route`, its `set` the capability's name.
pub fn finding(
    route: &RouteId,
    cap: &str,
    error: &str,
    failures: u32,
    at: DateTime<Utc>,
) -> DriftFinding {
    DriftFinding {
        id: DriftFinding::key(route, cap, DriftKind::CapabilityLost),
        route: route.clone(),
        set: cap.to_owned(),
        kind: DriftKind::CapabilityLost,
        severity: Severity::Warning,
        failure_mode: Some(FailureMode::BehaviorChanged),
        detected_at: at,
        summary: format!(
            "capability_lost: {cap} — {failures} probes in a row failed while chat answers: {error}"
        ),
        evidence: in_a_row(failures),
    }
}

/// The evidence of a finding opened by `n` bad probes in a row (no statistical test: the
/// streak is the evidence).
pub fn in_a_row(n: u32) -> Evidence {
    Evidence {
        test: "none".into(),
        p_value: None,
        before: RateSample {
            runs: 0,
            passed: 0,
            total: 0,
            rate: None,
        },
        after: RateSample {
            runs: usize::try_from(n).unwrap_or(usize::MAX),
            passed: 0,
            total: u64::from(n),
            rate: Some(0.0),
        },
        runs: Vec::new(),
        length: None,
        model: None,
        examples: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_failures_in_a_row_open_one_finding_and_a_success_closes_it() {
        let r = RouteId::new("openai", "us", "gpt-4o");
        let t = DateTime::from_timestamp(1_767_225_600, 0).unwrap_or_default();
        let mut j = Judge::default();
        assert_eq!(
            j.observe(&r, Probed::Tools, Err("bad"), true, t),
            Verdict::Recheck
        );
        assert!(j.findings().is_empty());
        assert_eq!(
            j.observe(&r, Probed::Tools, Err("bad"), true, t),
            Verdict::Next
        );
        let f = j.findings();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].id, "openai/us/gpt-4o|tools|capability_lost");
        j.observe(&r, Probed::Tools, Err("bad"), true, t);
        assert_eq!(
            j.findings(),
            f,
            "still the one finding, first detection time"
        );
        j.observe(&r, Probed::Tools, Ok(()), true, t);
        assert!(j.findings().is_empty());
    }

    #[test]
    fn failures_while_chat_fails_are_the_outage_s() {
        let r = RouteId::new("openai", "us", "gpt-4o");
        let t = DateTime::from_timestamp(1_767_225_600, 0).unwrap_or_default();
        let mut j = Judge::default();
        for _ in 0..3 {
            assert_eq!(
                j.observe(&r, Probed::JsonSchema, Err("x"), false, t),
                Verdict::Next
            );
        }
        assert!(j.findings().is_empty());
        // A flaky answer between two good ones is never a finding.
        j.observe(&r, Probed::JsonSchema, Err("x"), true, t);
        j.observe(&r, Probed::JsonSchema, Ok(()), true, t);
        j.observe(&r, Probed::JsonSchema, Err("x"), true, t);
        assert!(j.findings().is_empty());
    }
}
