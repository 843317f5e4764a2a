//! Drift: offline regression sets (`probes/*.toml`) that catch silent model changes per route
//! ("interface healthy, output changed", which no online signal shows).
//!
//! The `PROBE_OK` probe's mismatches are the fast signal; regression sets are the thorough one.
//! Each set is run on each route it applies to on its schedule, and every route is compared
//! only with **its own** past — never with another route (different providers differ by
//! design).
//!
//! - [`sets`]: parsing and checking the set files (located errors, like the config).
//! - [`validate`]: the validators (`exact`, `contains`, `regex`, `json`, `json_schema` — a
//!   strict subset validator —, `min_chars`/`max_chars`, `one_of`).
//! - [`stats`]: Fisher's exact test and Mann–Whitney U on top of `statrs` distributions.
//! - [`runner`]: runs sets (one run per route at a time, spread out, low priority), records
//!   them, keeps [`History`] and publishes a [`DriftSnapshot`] on a `watch` channel.
//! - [`compare`]: the statistics over a route's own history → [`DriftFinding`]s with evidence.
//! - The snapshot ([`DriftSnapshot`]) is what `GET /api/v1/drift` serves.
//! - [`events`]: findings opened/closed as `HealthEvent::DriftFinding` for the alert engine.
//! - [`report`]: the text report of `probeok regress`.
//! - [`traffic`]: structured-output validity of real proxy traffic against the route's own
//!   past (`validity_drop` findings, merged into the snapshot with
//!   [`DriftSnapshot::with_traffic`]).
//!
//! Consumers (alerts, weights, status page) read the [`DriftSnapshot`]: its findings (each
//! with a stable [`DriftFinding::id`] to track open/closed, see [`DriftSnapshot::diff`]) and
//! the quality gate [`DriftSnapshot::eligible`] for backup and fallback routes (a
//! backup that answers in the wrong format is no backup).

pub(crate) mod compare;
pub mod events;
pub(crate) mod report;
pub(crate) mod runner;
pub mod sets;
pub(crate) mod stats;
pub mod traffic;
pub(crate) mod validate;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use compare::{compare, CompareOptions, History};
pub use runner::{run_set, spawn, DriftHandle, RunnerOptions};
pub use sets::{load_dir, RegressionSet};

use crate::health::FailureMode;
use crate::route::{Route, RouteId, Tier};

pub use crate::records::drift::{CaseResult, SetRun, ValidatorFailure, MAX_OUTPUT_CHARS};

/// What kind of change a finding reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriftKind {
    /// Fewer cases pass than this route's own history says they should.
    PassRateDrop,
    /// Answers got markedly longer or shorter than this route's own history.
    LengthShift,
    /// The reported model or `system_fingerprint` changed (informational).
    ModelChanged,
    /// Real traffic's structured-output validity fell below this route's own past
    /// ([`traffic`]).
    ValidityDrop,
    /// A declared `tools` or `json_schema` capability failed its probe twice in a row while
    /// chat still answers (`crate::capability`); the finding's `set` names the capability.
    /// It alerts and marks the route `behavior_changed` but never moves its weight: chat
    /// traffic still works, and the proxy already routes requests needing the capability by
    /// what routes declare.
    CapabilityLost,
    /// An embeddings route's vector for the fixed text no longer matches its stored
    /// reference (`crate::embed`): another model answers under the same name.
    EmbeddingChanged,
    /// The long-prompt probe's time to first token passed twice its route's own baseline twice
    /// in a row (`crate::capability::long_prompt`). A warning only: it sets no failure mode,
    /// moves no state and no weight (short requests are as fast as ever).
    LongPromptSlow,
}

impl DriftKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::PassRateDrop => "pass_rate_drop",
            DriftKind::LengthShift => "length_shift",
            DriftKind::ModelChanged => "model_changed",
            DriftKind::ValidityDrop => "validity_drop",
            DriftKind::CapabilityLost => "capability_lost",
            DriftKind::EmbeddingChanged => "embedding_changed",
            DriftKind::LongPromptSlow => "long_prompt_slow",
        }
    }
}

/// Alert severities; drift findings are `warning`, model changes `info`, a changed embedding
/// model `critical` (every vector index built on the route is silently wrong).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

/// A pass count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RateSample {
    pub runs: usize,
    pub passed: u64,
    /// Cases judged (complete answers).
    pub total: u64,
    /// `passed / total`; `None` with nothing judged.
    pub rate: Option<f64>,
}

/// One of the runs that showed the shift.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStat {
    pub started_at: DateTime<Utc>,
    pub passed: u64,
    pub total: u64,
    /// That run alone against the baseline (pass-rate findings).
    pub p_value: Option<f64>,
    /// Median answer length relative to the baseline's per-case median (length findings).
    pub median_length_ratio: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LengthEvidence {
    pub before_median_chars: Option<f64>,
    pub after_median_chars: Option<f64>,
    pub before_median_ratio: f64,
    pub after_median_ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEvidence {
    pub before_model: Option<String>,
    pub after_model: Option<String>,
    pub before_fingerprint: Option<String>,
    pub after_fingerprint: Option<String>,
    /// The first run of the unbroken streak reporting the new value.
    pub since: DateTime<Utc>,
}

/// One case's answer before and after, bounded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Example {
    pub case: String,
    /// Why the latest answer failed (empty for length findings of passing answers).
    pub failures: Vec<ValidatorFailure>,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// What a finding rests on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// `fisher_exact_one_sided`, `mann_whitney_u_two_sided`, or `none` (model changes).
    pub test: String,
    /// The pooled test over the last two runs.
    pub p_value: Option<f64>,
    /// The baseline (this route's own earlier runs).
    pub before: RateSample,
    /// The runs judged.
    pub after: RateSample,
    /// Each of the (two) runs that showed it.
    pub runs: Vec<RunStat>,
    pub length: Option<LengthEvidence>,
    pub model: Option<ModelEvidence>,
    pub examples: Vec<Example>,
}

/// A change in one route's behaviour on one regression set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriftFinding {
    /// `route|set|kind`: stable while the finding lasts (alerts track open/closed by it).
    pub id: String,
    pub route: RouteId,
    pub set: String,
    pub kind: DriftKind,
    pub severity: Severity,
    /// `behavior_changed` for drift; `None` for the informational model change.
    pub failure_mode: Option<FailureMode>,
    /// Start of the latest run it rests on.
    pub detected_at: DateTime<Utc>,
    /// One human sentence with the numbers.
    pub summary: String,
    pub evidence: Evidence,
}

impl DriftFinding {
    pub fn key(route: &RouteId, set: &str, kind: DriftKind) -> String {
        format!("{route}|{set}|{}", kind.as_str())
    }

    /// Drift proper (not the informational model change, nor a slow long prompt): sets the route's failure mode to
    /// `behavior_changed`, alerts, and with `on_drift = "deweight"` lowers its weight.
    pub fn is_drift(&self) -> bool {
        !matches!(
            self.kind,
            DriftKind::ModelChanged | DriftKind::LongPromptSlow
        )
    }
}

/// One (route, set)'s latest runs, for the quality gate and the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetStatus {
    pub route: RouteId,
    pub set: String,
    /// Newest last; at most [`GATE_RUNS`].
    pub runs: Vec<RunSummary>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub started_at: DateTime<Utc>,
    pub passed: usize,
    pub answered: usize,
    pub errors: usize,
    /// `case: validator` of every failed case.
    pub failed: Vec<String>,
    pub model: Option<String>,
}

impl From<&SetRun> for RunSummary {
    fn from(r: &SetRun) -> Self {
        Self {
            started_at: r.started_at,
            passed: r.passed(),
            answered: r.answered(),
            errors: r.errors(),
            failed: r
                .cases
                .iter()
                .filter(|c| c.passed == Some(false))
                .map(|c| {
                    let v: Vec<&str> = c.failures.iter().map(|f| f.validator.as_str()).collect();
                    format!("{}: {}", c.case, v.join(", "))
                })
                .collect(),
            model: r.model(),
        }
    }
}

/// The latest runs the quality gate looks at.
pub const GATE_RUNS: usize = 2;

/// Why a backup or fallback route gets no traffic share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ineligible {
    /// `regression_failed`.
    pub code: String,
    pub text: String,
}

/// What drift publishes: every current finding and every (route, set)'s latest runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriftSnapshot {
    pub generated_at: DateTime<Utc>,
    pub findings: Vec<DriftFinding>,
    pub sets: Vec<SetStatus>,
}

impl DriftSnapshot {
    pub fn empty(now: DateTime<Utc>) -> Self {
        Self {
            generated_at: now,
            findings: Vec::new(),
            sets: Vec::new(),
        }
    }

    pub fn from_history(history: &History, now: DateTime<Utc>) -> Self {
        Self {
            generated_at: now,
            findings: history.findings(),
            sets: history
                .latest(GATE_RUNS)
                .into_iter()
                .map(|(route, set, runs)| SetStatus {
                    route,
                    set,
                    runs: runs.iter().map(RunSummary::from).collect(),
                })
                .collect(),
        }
    }

    /// This snapshot with the findings judged outside the regression runs — real traffic's
    /// ([`traffic`]) and embeddings routes' (`crate::embed`) — in place of any earlier ones.
    pub fn with_traffic(&self, traffic: &[DriftFinding]) -> Self {
        let mut out = self.clone();
        out.findings.retain(|f| {
            !matches!(
                f.kind,
                DriftKind::ValidityDrop | DriftKind::EmbeddingChanged
            )
        });
        out.findings.extend(traffic.iter().cloned());
        out
    }

    /// This snapshot with the capability probes' findings (`crate::capability`) in place of
    /// any earlier ones.
    pub fn with_capabilities(&self, lost: &[DriftFinding]) -> Self {
        let mut out = self.clone();
        out.findings.retain(|f| {
            !matches!(
                f.kind,
                DriftKind::CapabilityLost | DriftKind::LongPromptSlow
            )
        });
        out.findings.extend(lost.iter().cloned());
        out
    }

    /// The route's current findings.
    pub fn route_findings<'a>(
        &'a self,
        route: &'a RouteId,
    ) -> impl Iterator<Item = &'a DriftFinding> {
        self.findings.iter().filter(move |f| &f.route == route)
    }

    /// Whether the route has a drift finding (not just a model change): its failure mode is
    /// then `behavior_changed`.
    pub fn behavior_changed(&self, route: &RouteId) -> bool {
        self.route_findings(route).any(DriftFinding::is_drift)
    }

    /// Whether `on_drift = "deweight"` lowers the route's weight: a drift finding other than a
    /// lost capability (chat traffic still works on such a route).
    pub fn deweights(&self, route: &RouteId) -> bool {
        self.route_findings(route)
            .any(|f| f.is_drift() && f.kind != DriftKind::CapabilityLost)
    }

    /// The quality gate. Primary routes always pass (their drift is a finding that
    /// alerts and, with `on_drift = "deweight"`, lowers their weight). A `backup` or `fallback`
    /// route is not eligible for traffic share when, for some set, its latest runs (the last
    /// [`GATE_RUNS`], or the only one) all had failing cases: a backup that answers in the
    /// wrong format is no backup. Runs whose every call failed judge nothing.
    pub fn eligible(&self, route: &Route) -> Result<(), Ineligible> {
        if route.tier == Tier::Primary {
            return Ok(());
        }
        for s in self.sets.iter().filter(|s| s.route == route.id) {
            let judged: Vec<&RunSummary> = s.runs.iter().filter(|r| r.answered > 0).collect();
            if judged.is_empty() || judged.iter().any(|r| r.failed.is_empty()) {
                continue;
            }
            let Some(last) = judged.last() else { continue };
            return Err(Ineligible {
                code: "regression_failed".into(),
                text: format!(
                    "{} route failed regression set {:?} in its latest {} run(s): {}/{} cases passed; failing: {}",
                    route.tier.as_str(),
                    s.set,
                    judged.len(),
                    last.passed,
                    last.answered,
                    last.failed.join("; ")
                ),
            });
        }
        Ok(())
    }

    /// Findings opened and closed between two snapshots (by id), for alerting.
    pub fn diff<'a>(
        old: &'a DriftSnapshot,
        new: &'a DriftSnapshot,
    ) -> (Vec<&'a DriftFinding>, Vec<&'a DriftFinding>) {
        let opened = new
            .findings
            .iter()
            .filter(|f| !old.findings.iter().any(|o| o.id == f.id))
            .collect();
        let closed = old
            .findings
            .iter()
            .filter(|f| !new.findings.iter().any(|n| n.id == f.id))
            .collect();
        (opened, closed)
    }
}

/// The quality gate as a free function (see [`DriftSnapshot::eligible`]).
pub fn eligible(route: &Route, snapshot: &DriftSnapshot) -> Result<(), Ineligible> {
    snapshot.eligible(route)
}

/// The receiving end consumers hold.
pub type DriftRx = tokio::sync::watch::Receiver<Arc<DriftSnapshot>>;
