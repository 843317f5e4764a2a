//! The scenario timelines as a pure function: given a scenario, how far into it we are
//! (already scaled by `time_scale`) and a random source, what one request experiences.
//! The HTTP handlers only act the answer out, so every number here is unit-testable.
//!
//! Numbers come from field reports of real provider incidents: a healthy
//! route answers the probe in ~1.1 s; a capacity event lifts p95 to ~14 s for ~23 minutes
//! with errors under 0.5%; soft rate limiting drops tokens/s from ~50 to ~8 with no error;
//! a region failover has a 2–5 minute window of high error rate.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::Rng;

/// A scripted fault pattern. Each is a cycle that starts healthy, goes wrong within the first
/// minutes (scenario time), returns to healthy and repeats, so a demo always has something moving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scenario {
    Healthy,
    LatencySpike,
    SoftRateLimit,
    PartialOutage,
    RegionFailover,
    VersionDrift,
    Stall,
    Flapping,
}

impl Scenario {
    pub const ALL: [Scenario; 8] = [
        Scenario::Healthy,
        Scenario::LatencySpike,
        Scenario::SoftRateLimit,
        Scenario::PartialOutage,
        Scenario::RegionFailover,
        Scenario::VersionDrift,
        Scenario::Stall,
        Scenario::Flapping,
    ];

    /// The documented kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::Healthy => "healthy",
            Scenario::LatencySpike => "latency-spike",
            Scenario::SoftRateLimit => "soft-rate-limit",
            Scenario::PartialOutage => "partial-outage",
            Scenario::RegionFailover => "region-failover",
            Scenario::VersionDrift => "version-drift",
            Scenario::Stall => "stall",
            Scenario::Flapping => "flapping",
        }
    }

    /// One line for `probeok simulate` and the demo log.
    pub fn description(self) -> &'static str {
        match self {
            Scenario::Healthy => "always healthy: ~1.1 s probe, ~50 tok/s, 0.1% errors",
            Scenario::LatencySpike => {
                "p95 from ~1.1 s to ~14 s for 23 min (from minute 10 of every hour), errors < 0.5%"
            }
            Scenario::SoftRateLimit => {
                "200s with fast first byte, tokens/s falling from ~50 to ~8 (minutes 8-32 of every hour)"
            }
            Scenario::PartialOutage => {
                "accepts and never sends headers (minutes 5-25 of every hour)"
            }
            Scenario::RegionFailover => {
                "~70% 502/503/connection resets for 4 min (minutes 5-9 of every 30)"
            }
            Scenario::VersionDrift => {
                "answers change shape, new model suffix and fingerprint (minutes 10-40 of every hour)"
            }
            Scenario::Stall => {
                "headers and at most one chunk, then silence (minutes 5-12 of every 30)"
            }
            Scenario::Flapping => {
                "failing and healthy minute by minute (minutes 5-25 of every 40)"
            }
        }
    }

    /// When the scenario misbehaves, in scenario time (multiply by `1/time_scale` for wall time).
    pub fn timeline(self) -> Timeline {
        let m = |n: u64| Duration::from_secs(n * 60);
        let (cycle, start, end) = match self {
            Scenario::Healthy => (m(60), m(0), m(0)),
            Scenario::LatencySpike => (m(60), m(10), m(33)),
            Scenario::SoftRateLimit => (m(60), m(8), m(32)),
            Scenario::PartialOutage => (m(60), m(5), m(25)),
            Scenario::RegionFailover => (m(30), m(5), m(9)),
            Scenario::VersionDrift => (m(60), m(10), m(40)),
            Scenario::Stall => (m(30), m(5), m(12)),
            Scenario::Flapping => (m(40), m(5), m(25)),
        };
        Timeline { cycle, start, end }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of [`Scenario::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scenario {0:?} (expected one of: healthy, latency-spike, soft-rate-limit, partial-outage, region-failover, version-drift, stall, flapping)")]
pub struct UnknownScenario(pub String);

impl FromStr for Scenario {
    type Err = UnknownScenario;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scenario::ALL
            .into_iter()
            .find(|sc| sc.as_str() == s)
            .ok_or_else(|| UnknownScenario(s.to_owned()))
    }
}

/// The misbehaving window `[start, end)` inside every `cycle` (scenario time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeline {
    pub cycle: Duration,
    pub start: Duration,
    pub end: Duration,
}

impl Timeline {
    /// Where `elapsed` falls inside the current cycle.
    pub fn phase(&self, elapsed: Duration) -> Duration {
        let cycle = self.cycle.as_nanos().max(1);
        Duration::from_nanos((elapsed.as_nanos() % cycle) as u64)
    }

    /// Inside the window, and how far into it.
    pub fn in_window(&self, elapsed: Duration) -> Option<Duration> {
        let p = self.phase(elapsed);
        (p >= self.start && p < self.end).then(|| p - self.start)
    }
}

/// What goes wrong with one request, beyond being slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// An HTTP error with an OpenAI-style body, sent at `headers_after`.
    Status(u16),
    /// The connection is reset at `headers_after` without any response.
    Reset,
    /// The request is accepted and never answered: no headers, ever (until the client or
    /// the server gives up).
    NoHeaders,
    /// Headers at `headers_after`, then `chunks` content chunks (0 or 1), then silence.
    Stall { chunks: u8 },
}

/// Which model version answers: drift changes the answer's shape, the reported model and
/// the `system_fingerprint`, as a silent upstream upgrade would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Current,
    /// `variant` picks one of the drifted answer shapes.
    Drifted {
        variant: u8,
    },
}

/// What one request experiences. Times are from the request's arrival.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Behaviour {
    /// Response headers (or the fault) after this long.
    pub headers_after: Duration,
    /// The first content token after this long (≥ `headers_after`).
    pub first_token_after: Duration,
    /// The pace of content tokens after the first.
    pub tokens_per_second: f64,
    pub fault: Option<Fault>,
    pub version: Version,
    /// A stream waiting for its first token sends SSE keep-alive comments (as many gateways
    /// do). `false`: headers at once, then silence until the first token, as vLLM and other
    /// Starlette/FastAPI servers queue a request.
    pub keepalive: bool,
}

impl Behaviour {
    /// When the last of `tokens` content tokens goes out.
    pub fn total(&self, tokens: usize) -> Duration {
        let rest = tokens.saturating_sub(1) as f64 / self.tokens_per_second.max(0.1);
        self.first_token_after + Duration::from_secs_f64(rest)
    }

    /// The request ends in an error or never completes.
    pub fn fails(&self) -> bool {
        self.fault.is_some()
    }
}

/// Token count of the probe answer (`PROBE_OK` in 3 chunks at most), for timing estimates.
pub const PROBE_TOKENS: usize = 3;

/// Healthy error rate (providers run near 99.9%).
const HEALTHY_ERROR_RATE: f64 = 0.001;
/// During a capacity event the error rate stays below 0.5%.
const SPIKE_ERROR_RATE: f64 = 0.003;
/// Share of failed requests in a failing region's window.
const FAILOVER_ERROR_RATE: f64 = 0.7;
/// Share of failed requests in a flapping route's failing minute.
const FLAP_ERROR_RATE: f64 = 0.85;
const HEALTHY_TPS: f64 = 50.0;
const THROTTLED_TPS: f64 = 8.0;

/// What a request arriving `elapsed` (scenario time, already scaled) into `scenario`
/// experiences. `route_is_target` says whether this route is the one the scenario hits;
/// a bystander (false) is always healthy.
pub fn behaviour<R: Rng + ?Sized>(
    scenario: Scenario,
    elapsed: Duration,
    route_is_target: bool,
    rng: &mut R,
) -> Behaviour {
    let timeline = scenario.timeline();
    let window = if route_is_target {
        timeline.in_window(elapsed)
    } else {
        None
    };
    let Some(into) = window else {
        return healthy(rng);
    };
    match scenario {
        Scenario::Healthy => healthy(rng),
        Scenario::LatencySpike => latency_spike(rng),
        Scenario::SoftRateLimit => {
            // Ramp down over 4 minutes, hold, ramp back up over the last 4.
            let len = timeline.end - timeline.start;
            let ramp = Duration::from_secs(4 * 60);
            let depth = if into < ramp {
                into.as_secs_f64() / ramp.as_secs_f64()
            } else if into > len - ramp {
                (len - into).as_secs_f64() / ramp.as_secs_f64()
            } else {
                1.0
            };
            let mut b = healthy(rng);
            let target = HEALTHY_TPS + (THROTTLED_TPS - HEALTHY_TPS) * depth.clamp(0.0, 1.0);
            b.tokens_per_second = target * log_normal(rng, 1.0, 0.08);
            b
        }
        Scenario::PartialOutage => Behaviour {
            fault: Some(Fault::NoHeaders),
            ..healthy(rng)
        },
        Scenario::RegionFailover => {
            let mut b = healthy(rng);
            if rng.gen_bool(FAILOVER_ERROR_RATE) {
                // Gateways answer fast when the backend is gone.
                b.headers_after = dur(log_normal(rng, 0.08, 0.5).clamp(0.005, 1.0));
                b.first_token_after = b.headers_after;
                let r: f64 = rng.gen();
                b.fault = Some(if r < 0.45 {
                    Fault::Status(502)
                } else if r < 0.8 {
                    Fault::Status(503)
                } else {
                    Fault::Reset
                });
            } else {
                // The survivors queue behind the retries.
                b.first_token_after = b.first_token_after.mul_f64(1.4);
            }
            b
        }
        Scenario::VersionDrift => Behaviour {
            version: Version::Drifted {
                variant: rng.gen_range(0..2),
            },
            ..healthy(rng)
        },
        Scenario::Stall => Behaviour {
            fault: Some(Fault::Stall {
                chunks: rng.gen_range(0..2),
            }),
            ..healthy(rng)
        },
        Scenario::Flapping => {
            let failing = (into.as_secs() / 60) % 2 == 0;
            let mut b = healthy(rng);
            if failing && rng.gen_bool(FLAP_ERROR_RATE) {
                b.fault = Some(Fault::Status(if rng.gen_bool(0.8) { 503 } else { 500 }));
            }
            b
        }
    }
}

/// Healthy: headers in ~150–400 ms, the probe's last token at ~0.8–1.4 s (mean ≈ 1.1 s),
/// ~50 tok/s, 0.1% errors. Log-normal, so there is always a spread and a right tail.
fn healthy<R: Rng + ?Sized>(rng: &mut R) -> Behaviour {
    let headers = log_normal(rng, 0.25, 0.25).clamp(0.1, 0.7);
    let thinking = log_normal(rng, 0.78, 0.17).clamp(0.3, 2.0);
    let fault = rng
        .gen_bool(HEALTHY_ERROR_RATE)
        .then(|| Fault::Status(if rng.gen_bool(0.5) { 500 } else { 503 }));
    Behaviour {
        headers_after: dur(headers),
        first_token_after: dur(headers + thinking),
        tokens_per_second: HEALTHY_TPS * log_normal(rng, 1.0, 0.08),
        fault,
        version: Version::Current,
        keepalive: true,
    }
}

/// A capacity event: requests queue (no errors), the probe's total is log-normal with median
/// 6 s and p95 ≈ 14 s. Headers still come within ~3 s, then the stream is silent until its
/// first token, with no keep-alive comments (the way vLLM-style servers queue): a client
/// must see a slow success, not a stall.
fn latency_spike<R: Rng + ?Sized>(rng: &mut R) -> Behaviour {
    let tps = 45.0 * log_normal(rng, 1.0, 0.1);
    let total = log_normal(rng, 6.0, 0.52).clamp(0.5, 40.0);
    let headers = log_normal(rng, 0.6, 0.5).clamp(0.1, 3.0).min(total * 0.5);
    let tail = (PROBE_TOKENS - 1) as f64 / tps;
    let first = (total - tail).max(headers);
    let fault = rng
        .gen_bool(SPIKE_ERROR_RATE)
        .then(|| Fault::Status(if rng.gen_bool(0.5) { 503 } else { 504 }));
    Behaviour {
        headers_after: dur(headers),
        first_token_after: dur(first),
        tokens_per_second: tps,
        fault,
        version: Version::Current,
        keepalive: false,
    }
}

/// exp(N(ln median, sigma)), Box–Muller (rand 0.8 has no distributions beyond uniform here).
fn log_normal<R: Rng + ?Sized>(rng: &mut R, median: f64, sigma: f64) -> f64 {
    median * (sigma * standard_normal(rng)).exp()
}

fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    // 1 - u is in (0, 1], so ln never sees 0.
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn dur(secs: f64) -> Duration {
    Duration::from_secs_f64(secs.max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    const N: usize = 20_000;

    fn mins(m: f64) -> Duration {
        Duration::from_secs_f64(m * 60.0)
    }

    fn sample(scenario: Scenario, at: Duration, target: bool) -> Vec<Behaviour> {
        sample_n(scenario, at, target, N)
    }

    fn sample_n(scenario: Scenario, at: Duration, target: bool, n: usize) -> Vec<Behaviour> {
        let mut rng = StdRng::seed_from_u64(7);
        (0..n)
            .map(|_| behaviour(scenario, at, target, &mut rng))
            .collect()
    }

    fn totals(bs: &[Behaviour]) -> Vec<f64> {
        let mut v: Vec<f64> = bs
            .iter()
            .filter(|b| !b.fails())
            .map(|b| b.total(PROBE_TOKENS).as_secs_f64())
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }

    fn p(sorted: &[f64], q: f64) -> f64 {
        sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
    }

    fn mean(v: &[f64]) -> f64 {
        v.iter().sum::<f64>() / v.len() as f64
    }

    fn error_rate(bs: &[Behaviour]) -> f64 {
        bs.iter().filter(|b| b.fails()).count() as f64 / bs.len() as f64
    }

    #[test]
    fn names_round_trip() {
        for s in Scenario::ALL {
            assert_eq!(s.to_string().parse::<Scenario>(), Ok(s));
        }
        assert!("latency_spike".parse::<Scenario>().is_err());
    }

    #[test]
    fn healthy_has_a_spread_around_1_1_s() {
        let bs = sample(Scenario::Healthy, mins(12.0), true);
        let t = totals(&bs);
        let m = mean(&t);
        let sd = (t.iter().map(|x| (x - m).powi(2)).sum::<f64>() / t.len() as f64).sqrt();
        assert!((1.0..1.2).contains(&m), "mean {m}");
        assert!(sd > 0.05, "stddev {sd}");
        assert!(
            p(&t, 0.05) > 0.75 && p(&t, 0.95) < 1.5,
            "{} {}",
            p(&t, 0.05),
            p(&t, 0.95)
        );
        let mut ttfb: Vec<f64> = bs.iter().map(|b| b.headers_after.as_secs_f64()).collect();
        ttfb.sort_by(f64::total_cmp);
        assert!(p(&ttfb, 0.05) > 0.14 && p(&ttfb, 0.95) < 0.42, "{ttfb:?}");
        let tps = mean(&bs.iter().map(|b| b.tokens_per_second).collect::<Vec<_>>());
        assert!((45.0..55.0).contains(&tps), "{tps}");
        assert!(error_rate(&bs) < 0.004, "{}", error_rate(&bs));
        for b in &bs {
            assert!(b.first_token_after >= b.headers_after);
            assert_eq!(b.version, Version::Current);
        }
    }

    #[test]
    fn latency_spike_lifts_p95_to_about_14_s_without_errors() {
        let before = totals(&sample(Scenario::LatencySpike, mins(5.0), true));
        assert!(p(&before, 0.95) < 1.6, "{}", p(&before, 0.95));
        let bs = sample(Scenario::LatencySpike, mins(20.0), true);
        let t = totals(&bs);
        let p95 = p(&t, 0.95);
        assert!((12.0..16.0).contains(&p95), "p95 {p95}");
        assert!(error_rate(&bs) < 0.005, "{}", error_rate(&bs));
        // Headers still arrive in time for a 5 s first-byte timeout.
        assert!(bs.iter().all(|b| b.headers_after <= Duration::from_secs(3)));
        // Over by minute 33, and back in the next hour.
        assert!(
            p(
                &totals(&sample(Scenario::LatencySpike, mins(34.0), true)),
                0.95
            ) < 1.6
        );
        assert!(
            p(
                &totals(&sample(Scenario::LatencySpike, mins(80.0), true)),
                0.95
            ) > 12.0
        );
        // A bystander is unaffected.
        assert!(
            p(
                &totals(&sample(Scenario::LatencySpike, mins(20.0), false)),
                0.95
            ) < 1.6
        );
    }

    #[test]
    fn soft_rate_limit_drops_tokens_per_second_to_about_8() {
        let tps = |m: f64| {
            mean(
                &sample(Scenario::SoftRateLimit, mins(m), true)
                    .iter()
                    .map(|b| b.tokens_per_second)
                    .collect::<Vec<_>>(),
            )
        };
        assert!(tps(2.0) > 45.0);
        assert!((7.0..9.0).contains(&tps(20.0)), "{}", tps(20.0));
        let ramp = tps(10.0);
        assert!(ramp > 10.0 && ramp < 45.0, "{ramp}");
        assert!(tps(40.0) > 45.0);
        // First byte stays fast and nothing fails.
        let bs = sample(Scenario::SoftRateLimit, mins(20.0), true);
        assert!(bs
            .iter()
            .all(|b| b.headers_after < Duration::from_millis(800)));
        assert!(error_rate(&bs) < 0.004);
    }

    #[test]
    fn partial_outage_hangs_only_the_target() {
        let bs = sample(Scenario::PartialOutage, mins(10.0), true);
        assert!(bs.iter().all(|b| b.fault == Some(Fault::NoHeaders)));
        assert!(error_rate(&sample(Scenario::PartialOutage, mins(10.0), false)) < 0.004);
        assert!(error_rate(&sample(Scenario::PartialOutage, mins(30.0), true)) < 0.004);
    }

    #[test]
    fn region_failover_hits_only_the_target_within_its_window() {
        let inside = sample(Scenario::RegionFailover, mins(6.0), true);
        let rate = error_rate(&inside);
        assert!((0.6..0.8).contains(&rate), "{rate}");
        assert!(inside.iter().any(|b| b.fault == Some(Fault::Reset)));
        assert!(inside.iter().any(|b| b.fault == Some(Fault::Status(502))));
        assert!(inside.iter().any(|b| b.fault == Some(Fault::Status(503))));
        assert!(error_rate(&sample(Scenario::RegionFailover, mins(6.0), false)) < 0.004);
        assert!(error_rate(&sample(Scenario::RegionFailover, mins(4.0), true)) < 0.004);
        assert!(error_rate(&sample(Scenario::RegionFailover, mins(10.0), true)) < 0.004);
        let w = Scenario::RegionFailover.timeline();
        let len = w.end - w.start;
        assert!(len >= mins(2.0) && len <= mins(5.0));
        // The cycle repeats.
        assert!(error_rate(&sample(Scenario::RegionFailover, mins(36.0), true)) > 0.6);
    }

    #[test]
    fn version_drift_changes_answers_after_onset() {
        let before = sample(Scenario::VersionDrift, mins(5.0), true);
        assert!(before.iter().all(|b| b.version == Version::Current));
        let after = sample(Scenario::VersionDrift, mins(15.0), true);
        assert!(after
            .iter()
            .all(|b| matches!(b.version, Version::Drifted { .. })));
        assert!(after
            .iter()
            .any(|b| b.version == Version::Drifted { variant: 0 }));
        assert!(after
            .iter()
            .any(|b| b.version == Version::Drifted { variant: 1 }));
        assert!(error_rate(&after) < 0.004);
    }

    #[test]
    fn stall_sends_at_most_one_chunk_inside_its_window() {
        let bs = sample(Scenario::Stall, mins(6.0), true);
        assert!(bs
            .iter()
            .all(|b| matches!(b.fault, Some(Fault::Stall { chunks: 0 | 1 }))));
        assert!(error_rate(&sample(Scenario::Stall, mins(20.0), true)) < 0.004);
    }

    #[test]
    fn flapping_alternates_minute_by_minute() {
        let rates: Vec<f64> = (5..25)
            .map(|m| {
                let at = mins(m as f64 + 0.5);
                error_rate(&sample_n(Scenario::Flapping, at, true, 2_000))
            })
            .collect();
        for (i, r) in rates.iter().enumerate() {
            if i % 2 == 0 {
                assert!(*r > 0.7, "minute {}: {r}", i + 5);
            } else {
                assert!(*r < 0.004, "minute {}: {r}", i + 5);
            }
        }
        assert!(error_rate(&sample(Scenario::Flapping, mins(30.0), true)) < 0.004);
    }

    #[test]
    fn same_seed_same_behaviour() {
        let a = sample(Scenario::LatencySpike, mins(20.0), true);
        let b = sample(Scenario::LatencySpike, mins(20.0), true);
        assert_eq!(a, b);
    }
}
