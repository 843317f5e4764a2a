//! What a regression-set run recorded, case by case: the drift runner writes it, the store
//! keeps it, the comparisons read a route's own history of it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::route::RouteId;

/// Stored and shown answers are evidence, not transcripts.
pub const MAX_OUTPUT_CHARS: usize = 2000;

/// What one validator said about one answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidatorFailure {
    /// `exact`, `contains`, `regex`, `json`, `json_schema`, `min_chars`, `max_chars`, `one_of`.
    pub validator: String,
    pub message: String,
}

/// One case of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    pub case: String,
    /// Every validator accepted the answer; `None` when there was no complete answer to judge
    /// (transport or protocol failure: the health detector's business, not drift).
    pub passed: Option<bool>,
    /// The validators that rejected it (empty when passed).
    pub failures: Vec<ValidatorFailure>,
    /// Length of the whole trimmed answer, in characters.
    pub output_chars: u32,
    pub latency_ms: f64,
    pub output_tokens: Option<u32>,
    pub model_reported: Option<String>,
    pub system_fingerprint: Option<String>,
    /// The call's error (`kind: message`) when it failed.
    pub error: Option<String>,
    /// The trimmed answer, bounded to [`MAX_OUTPUT_CHARS`].
    pub output: String,
}

/// One run of one set on one route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetRun {
    pub route: RouteId,
    pub set: String,
    pub started_at: DateTime<Utc>,
    pub cases: Vec<CaseResult>,
}

impl SetRun {
    /// Cases whose answer passed every validator.
    pub fn passed(&self) -> usize {
        self.cases.iter().filter(|c| c.passed == Some(true)).count()
    }

    /// Cases with a complete answer (judged at all).
    pub fn answered(&self) -> usize {
        self.cases.iter().filter(|c| c.passed.is_some()).count()
    }

    /// Cases whose call failed.
    pub fn errors(&self) -> usize {
        self.cases.len() - self.answered()
    }

    /// The model most cases reported (ties: the first seen).
    pub fn model(&self) -> Option<String> {
        mode(self.cases.iter().filter_map(|c| c.model_reported.clone()))
    }

    pub fn fingerprint(&self) -> Option<String> {
        mode(
            self.cases
                .iter()
                .filter_map(|c| c.system_fingerprint.clone()),
        )
    }
}

fn mode(items: impl Iterator<Item = String>) -> Option<String> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for item in items {
        match counts.iter_mut().find(|(k, _)| *k == item) {
            Some((_, n)) => *n += 1,
            None => counts.push((item, 1)),
        }
    }
    let best = counts.iter().map(|(_, n)| *n).max()?;
    counts.into_iter().find(|(_, n)| *n == best).map(|(k, _)| k)
}
