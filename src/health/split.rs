//! Which latency signal moved: two faults look alike from outside —
//! queueing (the first token is late, tokens/s stay normal) and soft throttling (no 429,
//! tokens/s fall) — whose right responses differ (wait or shed load vs. move traffic). A
//! `PROBE_OK` probe cannot tell them apart (2–5 tokens), so after an abnormal latency the
//! next confirmation is a throughput probe, and real streams add their tokens/s when there is
//! traffic. [`Split`] keeps the latest verdict on each signal since the route was last NORMAL;
//! its [`Split::code`] names the fault once both have been measured.

use serde::{Deserialize, Serialize};

use super::{fmt_ms, fmt_spread};

/// First token late, tokens/s normal: the provider queues requests.
pub const TTFT_ABOVE_BASELINE: &str = "ttft_above_baseline";
/// Tokens/s below the floor: throttled, or degraded capacity.
pub const TPS_BELOW_BASELINE: &str = "tps_below_baseline";
/// Both moved.
pub const TTFT_AND_TPS_OFF_BASELINE: &str = "ttft_and_tps_off_baseline";

/// The first token of a probe against the route's first-token baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TtftCheck {
    pub observed_ms: f64,
    pub mean_ms: f64,
    pub stddev_ms: f64,
    pub threshold_ms: f64,
    pub late: bool,
}

/// Tokens/s (a throughput probe, or a second of real streams) against the tokens/s baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TpsCheck {
    pub observed: f64,
    pub mean: f64,
    pub floor: f64,
    pub low: bool,
}

/// The latest verdict on each signal since the route was last NORMAL.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Split {
    pub ttft: Option<TtftCheck>,
    pub tps: Option<TpsCheck>,
}

impl Split {
    /// The code naming the fault, when the evidence tells: a late first token needs a
    /// tokens/s figure to be called queueing; low tokens/s is throttling either way.
    pub fn code(&self) -> Option<&'static str> {
        let late = self.ttft.as_ref().map(|t| t.late);
        let low = self.tps.as_ref().map(|t| t.low);
        match (late, low) {
            (Some(true), Some(false)) => Some(TTFT_ABOVE_BASELINE),
            (Some(true), Some(true)) => Some(TTFT_AND_TPS_OFF_BASELINE),
            (_, Some(true)) => Some(TPS_BELOW_BASELINE),
            _ => None,
        }
    }

    /// The sentence for [`Split::code`], with both signals against their baselines.
    pub fn text(&self) -> Option<String> {
        let code = self.code()?;
        let ttft = self.ttft.as_ref().map(|t| {
            format!(
                "first token {} against a normal of {}",
                fmt_ms(t.observed_ms),
                fmt_spread(t.mean_ms, t.stddev_ms)
            )
        });
        let tps = self.tps.as_ref().map(|t| {
            format!(
                "{:.1} tokens/s against a normal of {:.1}",
                t.observed, t.mean
            )
        });
        Some(match code {
            TTFT_ABOVE_BASELINE => format!(
                "the provider is queueing: {}, tokens/s normal ({})",
                ttft.unwrap_or_default(),
                tps.unwrap_or_default()
            ),
            TTFT_AND_TPS_OFF_BASELINE => format!(
                "first token late and tokens/s low: {}; {}",
                ttft.unwrap_or_default(),
                tps.unwrap_or_default()
            ),
            _ => match ttft {
                Some(t) => format!(
                    "throttled or reduced capacity: {}, first token {} ({t})",
                    tps.unwrap_or_default(),
                    if self.ttft.as_ref().is_some_and(|t| t.late) {
                        "late too"
                    } else {
                        "on time"
                    }
                ),
                None => format!("throttled or reduced capacity: {}", tps.unwrap_or_default()),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ttft(late: bool) -> TtftCheck {
        TtftCheck {
            observed_ms: if late { 13_000.0 } else { 300.0 },
            mean_ms: 300.0,
            stddev_ms: 30.0,
            threshold_ms: 400.0,
            late,
        }
    }

    fn tps(low: bool) -> TpsCheck {
        TpsCheck {
            observed: if low { 8.0 } else { 49.0 },
            mean: 50.0,
            floor: 15.0,
            low,
        }
    }

    #[test]
    fn the_code_needs_both_signals_to_call_queueing() {
        let s = |t: Option<bool>, p: Option<bool>| Split {
            ttft: t.map(ttft),
            tps: p.map(tps),
        };
        assert_eq!(s(Some(true), None).code(), None, "late, tokens/s unknown");
        assert_eq!(s(Some(true), Some(false)).code(), Some(TTFT_ABOVE_BASELINE));
        assert_eq!(s(Some(false), Some(true)).code(), Some(TPS_BELOW_BASELINE));
        assert_eq!(s(None, Some(true)).code(), Some(TPS_BELOW_BASELINE));
        assert_eq!(
            s(Some(true), Some(true)).code(),
            Some(TTFT_AND_TPS_OFF_BASELINE)
        );
        assert_eq!(s(Some(false), Some(false)).code(), None);
        let q = s(Some(true), Some(false)).text().unwrap();
        assert!(q.contains("first token 13.0 s"), "{q}");
        assert!(q.contains("49.0 tokens/s against a normal of 50.0"), "{q}");
        let t = s(Some(false), Some(true)).text().unwrap();
        assert!(t.contains("8.0 tokens/s"), "{t}");
        assert!(t.contains("on time"), "{t}");
    }
}
