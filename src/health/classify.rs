//! Is one outcome abnormal, on which dimension, and why.
//!
//! An outcome is judged only on what it measures: a `PROBE_OK` probe says nothing about
//! tokens/s (2–5 tokens are noise), a throughput probe's latency is not comparable with the
//! `PROBE_OK` baseline. So a judgement lists the dimensions found abnormal *and* those measured
//! and found fine; the detector lets a "normal" observation end trouble only on the dimensions
//! it actually measured (a fast `PROBE_OK` probe does not clear a soft rate limit).

use super::baseline::{Baseline, LatencyRef, TpsRef};
use super::split::TtftCheck;
pub use crate::evidence::{Dims, Signal};
use crate::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
/// The verdict on one outcome.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Judgement {
    /// Counts in the error-rate window (false for the client's own errors).
    pub counted: bool,
    /// Counts as a failure there.
    pub failed: bool,
    /// Dimensions found abnormal.
    pub abnormal: Dims,
    /// Dimensions measured and found fine.
    pub fine: Dims,
    pub signals: Vec<Signal>,
    /// The latency baseline used, when latency was judged.
    pub latency: Option<LatencyRef>,
    /// The tokens/s baseline used, when tokens/s was judged.
    pub tps: Option<TpsRef>,
    /// The first token against the first-token baseline, for a probe or throughput outcome
    /// that reported one: it tells queueing (late) from throttling (on time). It makes a
    /// `PROBE_OK` probe no more or less abnormal (its total latency decides); the detector
    /// judges a throughput probe's latency by it only while the route's latency is in doubt.
    pub ttft: Option<TtftCheck>,
}

/// The client's own fault never counts against a route: 400/413/422 and content-policy
/// refusals (they are returned as they are and never retried elsewhere).
pub fn is_client_fault(e: &ProbeError) -> bool {
    matches!(
        e,
        ProbeError::Refused { .. }
            | ProbeError::Http {
                status: 400 | 413 | 422,
                ..
            }
    )
}

/// Judges one outcome against the route's baseline (as it was before this outcome).
pub fn judge(o: &ProbeOutcome, baseline: &Baseline) -> Judgement {
    let mut j = Judgement::default();
    if let Some(e) = &o.error {
        if !o.success {
            if is_client_fault(e) {
                return j; // Not counted, not abnormal, measures nothing about the route.
            }
            j.counted = true;
            j.failed = true;
            j.signals.push(Signal::ProbeFailed {
                error: e.kind().to_owned(),
                status: e.status(),
            });
            j.abnormal = Dims::AVAILABILITY;
            return j;
        }
    }
    j.counted = true;
    if !o.success {
        // No error classification but no success either: still a failure of the route.
        j.failed = true;
        j.signals.push(Signal::ProbeFailed {
            error: "unknown".to_owned(),
            status: o.http_status,
        });
        j.abnormal = Dims::AVAILABILITY;
        return j;
    }
    // A slow but complete answer is a success: availability is fine.
    j.fine = Dims::AVAILABILITY;
    if o.kind == OutcomeKind::Probe {
        if let Some(r) = baseline.latency_ref(o.started_at) {
            if o.total_ms > r.threshold_ms {
                j.signals.push(Signal::LatencyAboveBaseline {
                    observed_ms: o.total_ms,
                    threshold_ms: r.threshold_ms,
                    bucket: r.bucket.clone(),
                    mean_ms: r.mean_ms,
                    stddev_ms: r.stddev_ms,
                    samples: r.samples,
                });
            } else {
                j.fine = j.fine.union(Dims::LATENCY);
            }
            j.latency = Some(r);
        }
    }
    if matches!(o.kind, OutcomeKind::Throughput | OutcomeKind::Passive) {
        if let (Some(tps), Some(r)) = (o.tokens_per_second, baseline.tps_ref(o.started_at)) {
            if tps < r.floor {
                j.signals.push(Signal::TpsBelowBaseline {
                    observed: tps,
                    floor: r.floor,
                    bucket: r.bucket.clone(),
                    mean: r.mean,
                    samples: r.samples,
                });
            } else {
                j.fine = j.fine.union(Dims::THROUGHPUT);
            }
            j.tps = Some(r);
        }
    }
    if matches!(o.kind, OutcomeKind::Probe | OutcomeKind::Throughput) {
        if let (Some(ms), Some(r)) = (o.ttft_ms, baseline.ttft_ref(o.started_at)) {
            j.ttft = Some(TtftCheck {
                observed_ms: ms,
                mean_ms: r.mean_ms,
                stddev_ms: r.stddev_ms,
                threshold_ms: r.threshold_ms,
                late: ms > r.threshold_ms,
            });
        }
    }
    match o.verified {
        // No answer at all because the budget ran out: our config, not a changed answer.
        Some(false) if o.kind != OutcomeKind::Passive && o.max_tokens_exhausted => {
            j.signals.push(Signal::MaxTokensExhausted {
                output_tokens: o.output_tokens,
            })
        }
        Some(false) if o.kind != OutcomeKind::Passive => j.signals.push(Signal::AnswerChanged {
            answer: o.answer.clone(),
        }),
        Some(true) => j.fine = j.fine.union(Dims::BEHAVIOR),
        _ => {}
    }
    j.abnormal = j.signals.iter().fold(Dims::NONE, |d, s| d.union(s.dim()));
    j
}
