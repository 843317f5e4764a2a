//! Embeddings routes: a model swapped under the same name silently ruins every vector index
//! built with the old one, and nothing at the transport level shows it. Each embeddings route
//! (`kind = "embeddings"`) is probed with one fixed text (`crate::probe::embed`) instead of the
//! chat probe; its first good vector becomes the route's stored reference, and every later
//! vector is compared with it by cosine similarity. Below [`THRESHOLD`] another model answers:
//! an `embedding_changed` finding (`behavior_changed`, severity critical), published with the
//! drift findings so the status, the weights and the alert engine treat it like any other.
//!
//! - this file: the pure judgement ([`cosine`], [`judge`]) and the finding it opens
//!   ([`finding`]);
//! - [`service`]: the prober the scheduler calls (chat routes go to the probe client as
//!   before), the reference kept in the store (`store::embeddings`), the findings' `watch`.
//!
//! A vector of the wrong length is a failed probe, not a finding: the outcome says so and the
//! state machine counts it like any other failure.

pub mod service;

use chrono::{DateTime, Utc};

use crate::drift::{DriftFinding, DriftKind, Evidence, Example, RateSample, Severity};
use crate::health::FailureMode;
use crate::route::RouteId;

pub use service::{replace_reference, EmbedError, EmbedProber, FindingsRx, Replaced};

/// Cosine similarity to the reference below this: another model. The same model answers the
/// same text with the same vector up to float noise (≥ 0.9999 across providers' batching and
/// hardware); two different models, even of one family, land far below.
pub const THRESHOLD: f64 = 0.999;

/// The name findings carry where regression sets carry theirs.
pub const SET: &str = "embeddings";

/// Cosine similarity of two vectors of one length (0 when either is all zeros).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut dot, mut na, mut nb) = (0.0_f64, 0.0_f64, 0.0_f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    dot / (na.sqrt() * nb.sqrt())
}

/// What one good vector says, against the stored reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// No reference of this length (none yet, or the route's `dimensions` changed): this
    /// vector becomes it.
    NewReference,
    /// The same model answers.
    Same { cosine: f64 },
    /// Another model answers under the same name.
    Changed { cosine: f64 },
}

/// Judges `vector` against `reference`.
pub fn judge(reference: Option<&[f32]>, vector: &[f32]) -> Verdict {
    match reference {
        Some(r) if r.len() == vector.len() => {
            let c = cosine(r, vector);
            if c < THRESHOLD {
                Verdict::Changed { cosine: c }
            } else {
                Verdict::Same { cosine: c }
            }
        }
        _ => Verdict::NewReference,
    }
}

/// The `embedding_changed` finding of `route`: its vector at `detected_at` has `cosine` to the
/// reference taken at `reference_at`.
pub fn finding(
    route: &RouteId,
    cosine: f64,
    reference_at: DateTime<Utc>,
    detected_at: DateTime<Utc>,
) -> DriftFinding {
    let none = || RateSample {
        runs: 0,
        passed: 0,
        total: 0,
        rate: None,
    };
    let since = crate::clock::rfc3339(reference_at);
    DriftFinding {
        id: DriftFinding::key(route, SET, DriftKind::EmbeddingChanged),
        route: route.clone(),
        set: SET.into(),
        kind: DriftKind::EmbeddingChanged,
        severity: Severity::Critical,
        failure_mode: Some(FailureMode::BehaviorChanged),
        detected_at,
        summary: format!(
            "the embedding of the fixed probe text has cosine similarity {cosine:.4} to the route's reference of {since} (below {THRESHOLD}): another model answers under the same name; vectors from it do not match indexes built before"
        ),
        evidence: Evidence {
            test: "cosine_similarity".into(),
            p_value: None,
            before: none(),
            after: none(),
            runs: Vec::new(),
            length: None,
            model: None,
            examples: vec![Example {
                case: "cosine_similarity".into(),
                failures: Vec::new(),
                before: Some(format!("reference of {since}")),
                after: Some(format!("{cosine:.4}")),
            }],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_is_one_for_the_same_direction_and_zero_for_orthogonal() {
        assert!((cosine(&[1.0, 2.0], &[2.0, 4.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-12);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 1.0]), 0.0);
    }

    #[test]
    fn the_threshold_separates_noise_from_another_model() {
        let r = [0.6_f32, 0.8, 0.0];
        assert_eq!(judge(None, &r), Verdict::NewReference);
        assert_eq!(judge(Some(&[1.0, 0.0]), &r), Verdict::NewReference);
        assert!(matches!(
            judge(Some(&r), &[0.6001, 0.7999, 0.0001]),
            Verdict::Same { .. }
        ));
        // cos = 0.8.
        assert!(matches!(
            judge(Some(&r), &[0.48, 0.64, 0.6]),
            Verdict::Changed { cosine } if (cosine - 0.8).abs() < 1e-6
        ));
    }
}
