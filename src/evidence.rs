//! What a route's state was decided on: the outcome observed, the signals that made it
//! abnormal, the baselines and thresholds compared against, the error-rate window. Detection
//! builds it; the store keeps it with every transition; alerts, pages and the API show it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::outcome::{OutcomeKind, ProbeOutcome};

/// A set of dimensions (bit flags; serialized as the number).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Dims(u8);

impl Dims {
    pub const NONE: Dims = Dims(0);
    /// Calls fail (connect, 5xx, timeouts, stalls) or the error rate is high.
    pub const AVAILABILITY: Dims = Dims(1);
    /// Total latency against the probe baseline.
    pub const LATENCY: Dims = Dims(2);
    /// Tokens/s against the tokens/s baseline.
    pub const THROUGHPUT: Dims = Dims(4);
    /// The answer is not `PROBE_OK` (or not 1..40 for throughput probes).
    pub const BEHAVIOR: Dims = Dims(8);

    pub fn contains(self, other: Dims) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn intersects(self, other: Dims) -> bool {
        self.0 & other.0 != 0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    pub fn union(self, other: Dims) -> Dims {
        Dims(self.0 | other.0)
    }
    pub fn without(self, other: Dims) -> Dims {
        Dims(self.0 & !other.0)
    }
}

/// One reason an observation is abnormal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Signal {
    /// The call failed against the route (not the client's fault).
    ProbeFailed { error: String, status: Option<u16> },
    LatencyAboveBaseline {
        observed_ms: f64,
        threshold_ms: f64,
        bucket: String,
        mean_ms: f64,
        stddev_ms: f64,
        samples: usize,
    },
    /// A throughput probe's first token late while the route's latency is in doubt.
    TtftAboveBaseline {
        observed_ms: f64,
        threshold_ms: f64,
        bucket: String,
        mean_ms: f64,
        stddev_ms: f64,
        samples: usize,
    },
    TpsBelowBaseline {
        observed: f64,
        floor: f64,
        bucket: String,
        mean: f64,
        samples: usize,
    },
    /// Transport healthy, answer not what the probe expects.
    AnswerChanged { answer: Option<String> },
    /// `max_tokens` ran out before any answer token (a reasoning model spent it thinking):
    /// the route's configuration, not the provider's behaviour.
    MaxTokensExhausted { output_tokens: Option<u32> },
    /// The error-rate window (probes and passive) is above `critical_error_rate`.
    ErrorRateHigh {
        failures: u32,
        total: u32,
        window_s: u64,
    },
}

impl Signal {
    pub fn code(&self) -> &'static str {
        match self {
            Signal::ProbeFailed { .. } => "probe_failed",
            Signal::LatencyAboveBaseline { .. } => "latency_above_baseline",
            Signal::TtftAboveBaseline { .. } => "ttft_above_baseline",
            Signal::TpsBelowBaseline { .. } => "tps_below_baseline",
            Signal::AnswerChanged { .. } => "answer_changed",
            Signal::MaxTokensExhausted { .. } => "max_tokens_exhausted",
            Signal::ErrorRateHigh { .. } => "error_rate_high",
        }
    }

    /// A sentence with the numbers.
    pub fn text(&self) -> String {
        match self {
            Signal::ProbeFailed { error, status } => match status {
                Some(s) => format!("probe failed: {error} (HTTP {s})"),
                None => format!("probe failed: {error}"),
            },
            Signal::LatencyAboveBaseline {
                observed_ms,
                threshold_ms,
                bucket,
                mean_ms,
                stddev_ms,
                samples,
            } => format!(
                "latency {} against a normal of {} for {bucket} (limit {}, {samples} samples)",
                fmt_ms(*observed_ms),
                fmt_spread(*mean_ms, *stddev_ms),
                fmt_ms(*threshold_ms)
            ),
            Signal::TtftAboveBaseline {
                observed_ms,
                threshold_ms,
                bucket,
                mean_ms,
                stddev_ms,
                samples,
            } => format!(
                "first token {} against a normal of {} for {bucket} (limit {}, {samples} samples)",
                fmt_ms(*observed_ms),
                fmt_spread(*mean_ms, *stddev_ms),
                fmt_ms(*threshold_ms)
            ),
            Signal::TpsBelowBaseline {
                observed,
                floor,
                bucket,
                mean,
                samples,
            } => format!(
                "{observed:.1} tokens/s against a normal of {mean:.1} tokens/s for {bucket} \
                 (floor {floor:.1}, {samples} samples)"
            ),
            Signal::AnswerChanged { answer } => match answer {
                Some(a) => format!("answer changed: {a:?} instead of the expected text"),
                None => "answer changed".to_owned(),
            },
            Signal::MaxTokensExhausted { output_tokens } => match output_tokens {
                Some(n) => format!(
                    "max_tokens ran out after {n} tokens before any answer: \
                     raise max_tokens for this route"
                ),
                None => "max_tokens ran out before any answer: raise max_tokens for this route"
                    .to_owned(),
            },
            Signal::ErrorRateHigh {
                failures,
                total,
                window_s,
            } => format!(
                "error rate {:.1}% ({failures} of {total} calls in the last {window_s} s)",
                100.0 * f64::from(*failures) / f64::from((*total).max(1))
            ),
        }
    }

    /// The dimension this signal is about.
    pub fn dim(&self) -> Dims {
        match self {
            Signal::ProbeFailed { .. } | Signal::ErrorRateHigh { .. } => Dims::AVAILABILITY,
            Signal::LatencyAboveBaseline { .. } | Signal::TtftAboveBaseline { .. } => Dims::LATENCY,
            Signal::TpsBelowBaseline { .. } => Dims::THROUGHPUT,
            Signal::AnswerChanged { .. } | Signal::MaxTokensExhausted { .. } => Dims::BEHAVIOR,
        }
    }
}

/// The latency baseline an observation is judged against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyRef {
    /// `"14:00-15:00"`, `"peak 09:00-12:00"`, `"off-peak"` or `"all-day"` (fallback).
    pub bucket: String,
    pub samples: usize,
    pub mean_ms: f64,
    pub stddev_ms: f64,
    /// mean + max(sigma·σ, latency_floor_ratio·mean, latency_floor).
    pub threshold_ms: f64,
}

/// The tokens/s baseline an observation is judged against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TpsRef {
    pub bucket: String,
    pub samples: usize,
    pub mean: f64,
    /// `tps_floor` × mean: below it is abnormal.
    pub floor: f64,
}

/// The outcome an observation came from, as evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    pub kind: OutcomeKind,
    pub started_at: DateTime<Utc>,
    pub success: bool,
    pub verified: Option<bool>,
    pub total_ms: f64,
    pub ttft_ms: Option<f64>,
    pub tokens_per_second: Option<f64>,
    pub http_status: Option<u16>,
    /// `ProbeError::kind`.
    pub error: Option<String>,
}

impl Observed {
    pub fn of(o: &ProbeOutcome) -> Self {
        Self {
            kind: o.kind,
            started_at: o.started_at,
            success: o.success,
            verified: o.verified,
            total_ms: o.total_ms,
            ttft_ms: o.ttft_ms,
            tokens_per_second: o.tokens_per_second,
            http_status: o.http_status,
            error: o.error.as_ref().map(|e| e.kind().to_owned()),
        }
    }
}

/// One threshold a rule compared against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    /// `latency_ms`, `tokens_per_second`, `error_rate`, `consecutive_abnormal`,
    /// `error_rate_high_for_s`, `degraded_for_s`, `normal_for_s`, `recover_error_rate`.
    pub name: String,
    pub observed: f64,
    pub limit: f64,
}

/// The error-rate window at the time of a transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRateEvidence {
    pub window_s: u64,
    pub total: u32,
    pub failures: u32,
    pub rate: f64,
    pub fast_window_s: u64,
    pub fast_total: u32,
    pub fast_failures: u32,
    pub above_since: Option<DateTime<Utc>>,
}

/// Everything a transition was decided on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// The outcome that triggered it (`None` for a tick).
    pub observed: Option<Observed>,
    pub signals: Vec<Signal>,
    /// The latency baseline used (bucket, mean, stddev, samples, threshold).
    pub baseline: Option<LatencyRef>,
    pub tps_baseline: Option<TpsRef>,
    pub thresholds: Vec<Threshold>,
    pub error_rate: ErrorRateEvidence,
    pub consecutive_abnormal: u32,
}

/// `mean ± stddev` in one unit: `"1.1 s ± 0.3 s"`, `"850 ms ± 40 ms"`.
pub fn fmt_spread(mean_ms: f64, stddev_ms: f64) -> String {
    if mean_ms.abs() >= 1000.0 {
        format!("{:.1} s ± {:.1} s", mean_ms / 1000.0, stddev_ms / 1000.0)
    } else {
        format!("{:.0} ms ± {:.0} ms", mean_ms, stddev_ms)
    }
}

/// `1234.0` → `"1.2 s"`, `850.0` → `"850 ms"`: how people read latencies.
pub fn fmt_ms(ms: f64) -> String {
    if ms.abs() >= 1000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{:.0} ms", ms)
    }
}
