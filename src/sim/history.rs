//! Simulated history: what probing a simulated route would have recorded in one past hour,
//! as [`ProbeOutcome`]s, without the wire. The built-in demo writes 30 days of it on first
//! start, so its day bars, uptime, incidents and budget have a past.
//!
//! Each hour of history holds [`MINUTES_PER_HOUR`] minutes of probing at the route's own
//! interval (and its throughput probes), from the same [`scenario::behaviour`] the HTTP
//! simulator acts out. Most hours are healthy; a *fault hour* is probed for
//! [`FAULT_HOUR_MINUTES`] without a gap: a minute before the fault, the scenario's misbehaving
//! window acted out over [`FAULT_MINUTES`], then long enough for detection's default
//! `recover_after` to close the incident. So an incident of the history lasts as long as the
//! bad time it spends from the error budget says (plus the recovery it waited for), instead of
//! an hour of incident over a few minutes of samples. Which hours are fault hours is drawn per
//! provider region and scenario ([`fault_hours`]), so the two models of a failing region fail
//! together, as they would.
//!
//! A behaviour becomes an outcome the way the probe client classifies a real call: no
//! headers by `first_byte_timeout` is `timeout_before_first_byte`, a call past `timeout` is
//! `timeout`, a stream silent past `stall_timeout` after its first answer token is `stalled`,
//! 429 is `rate_limited`, other statuses `http`, a reset `connect`.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Duration as TimeDelta, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::openai::{self, Prompt};
use super::scenario::{self, Behaviour, Fault, Scenario};
use crate::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use crate::route::Route;

/// Minutes of simulated probing per hour of history.
pub const MINUTES_PER_HOUR: u32 = 3;

/// Minutes of probing, without a gap, in a fault hour.
pub const FAULT_HOUR_MINUTES: u32 = 20;

/// Minutes of a fault hour the scenario's misbehaving window is acted out over, starting a
/// minute in.
pub const FAULT_MINUTES: u32 = 6;

/// Share of a misbehaving route's hours that hold its fault: about one a week.
pub const FAULT_HOUR_SHARE: f64 = 1.0 / 150.0;

/// The fault hours (indices from the first hour of history) of one provider region under one
/// scenario, out of `hours`. A healthy scenario has none.
pub fn fault_hours(
    seed: u64,
    provider: &str,
    region: &str,
    scenario: Scenario,
    hours: u32,
) -> BTreeSet<u32> {
    if scenario == Scenario::Healthy {
        return BTreeSet::new();
    }
    let mut rng = StdRng::seed_from_u64(seed ^ fnv(&[provider, region, scenario.as_str()]));
    let mut out: BTreeSet<u32> = (0..hours)
        .filter(|_| rng.gen_bool(FAULT_HOUR_SHARE))
        .collect();
    // Every misbehaving route shows its fault at least twice in a month of history.
    while out.len() < 2 && hours > 0 {
        out.insert(rng.gen_range(0..hours));
    }
    out
}

/// The outcomes of one hour of history starting at `hour_start`, oldest first: regular probes
/// every `interval` and throughput probes every `throughput_every` for [`MINUTES_PER_HOUR`]
/// minutes, or [`FAULT_HOUR_MINUTES`] in a `fault` hour, which acts out the scenario's
/// misbehaving window over [`FAULT_MINUTES`] from its second minute.
pub fn hour<R: Rng + ?Sized>(
    route: &Route,
    scenario: Scenario,
    hour_start: DateTime<Utc>,
    fault: bool,
    rng: &mut R,
) -> Vec<ProbeOutcome> {
    let s = &route.probe;
    let minutes = if fault {
        FAULT_HOUR_MINUTES
    } else {
        MINUTES_PER_HOUR
    };
    let burst = Duration::from_secs(u64::from(minutes) * 60);
    let mut starts: Vec<(Duration, OutcomeKind)> = Vec::new();
    let step = s.interval.max(Duration::from_secs(1));
    let mut t = Duration::ZERO;
    while t < burst {
        starts.push((t, OutcomeKind::Probe));
        t += step;
    }
    let every = s.throughput_every.max(Duration::from_secs(1));
    // Half an interval after a regular probe, so the two never start together.
    let mut t = step / 2;
    while t < burst {
        starts.push((t, OutcomeKind::Throughput));
        t += every;
    }
    starts.sort_by_key(|(t, _)| *t);
    let timeline = scenario.timeline();
    // The fault's own timeline, stretched or squeezed onto FAULT_MINUTES from minute one;
    // before and after it the route behaves.
    let lead = 60.0;
    let window = timeline.end.saturating_sub(timeline.start).as_secs_f64();
    let scale = window / f64::from(FAULT_MINUTES * 60);
    starts
        .into_iter()
        .map(|(offset, kind)| {
            let into = (offset.as_secs_f64() - lead) * scale;
            let b = if fault && (0.0..window).contains(&into) {
                let elapsed = timeline.start + Duration::from_secs_f64(into);
                scenario::behaviour(scenario, elapsed, true, rng)
            } else {
                scenario::behaviour(scenario, Duration::ZERO, false, rng)
            };
            let at = hour_start + TimeDelta::from_std(offset).unwrap_or_default();
            outcome(route, kind, at, &b, rng)
        })
        .collect()
}

/// One call of `kind` to `route` starting at `at` that meets behaviour `b`, as the probe
/// client would have recorded it.
pub fn outcome<R: Rng + ?Sized>(
    route: &Route,
    kind: OutcomeKind,
    at: DateTime<Utc>,
    b: &Behaviour,
    rng: &mut R,
) -> ProbeOutcome {
    let s = &route.probe;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let prompt = if kind == OutcomeKind::Throughput {
        Prompt::Throughput
    } else {
        Prompt::Probe
    };
    let tokens = openai::answer_tokens(prompt, b.version, &route.model, rng);
    let headers = ms(b.headers_after);
    let first = ms(b.first_token_after);
    let total = ms(b.total(tokens.len()));
    let (fbt, timeout, stall) = (ms(s.first_byte_timeout), ms(s.timeout), ms(s.stall_timeout));
    let mut o = ProbeOutcome {
        route: route.id.clone(),
        kind,
        started_at: at,
        success: false,
        attributed_to: None,
        verified: None,
        ttfb_ms: None,
        ttft_ms: None,
        first_answer_ms: None,
        total_ms: 0.0,
        output_tokens: None,
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: None,
        error: None,
        answer: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    };
    let fail = |o: &mut ProbeOutcome, e: ProbeError, total_ms: f64| {
        o.error = Some(e);
        o.total_ms = total_ms;
    };
    match b.fault {
        _ if headers > fbt && b.fault != Some(Fault::Reset) => {
            fail(&mut o, ProbeError::TimeoutBeforeFirstByte, fbt)
        }
        Some(Fault::NoHeaders) => fail(&mut o, ProbeError::TimeoutBeforeFirstByte, fbt),
        Some(Fault::Reset) => fail(
            &mut o,
            ProbeError::Connect {
                message: "connection reset by peer".to_owned(),
            },
            headers,
        ),
        Some(Fault::Status(status)) => {
            o.ttfb_ms = Some(headers);
            o.http_status = Some(status);
            let message = "simulated upstream error".to_owned();
            let e = if status == 429 {
                ProbeError::RateLimited {
                    retry_after_ms: None,
                    message,
                }
            } else {
                ProbeError::Http { status, message }
            };
            fail(&mut o, e, headers);
        }
        Some(Fault::Stall { chunks }) => {
            o.ttfb_ms = Some(headers);
            o.http_status = Some(200);
            if chunks > 0 && first + stall < timeout {
                o.ttft_ms = Some(first);
                o.first_answer_ms = Some(first);
                fail(&mut o, ProbeError::Stalled, first + stall);
            } else {
                // Before the first answer token only the call's timeout bounds the wait.
                fail(&mut o, ProbeError::Timeout, timeout);
            }
        }
        None if total > timeout => {
            o.ttfb_ms = Some(headers);
            o.http_status = Some(200);
            if first < timeout {
                o.ttft_ms = Some(first);
                o.first_answer_ms = Some(first);
            }
            fail(&mut o, ProbeError::Timeout, timeout);
        }
        None => {
            let answer: String = tokens.concat().trim().to_owned();
            let n = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
            o.success = true;
            o.ttfb_ms = Some(headers);
            o.ttft_ms = Some(first);
            o.first_answer_ms = Some(first);
            o.total_ms = total;
            o.output_tokens = Some(n);
            o.tokens_per_second = (n >= crate::outcome::MIN_TOKENS_FOR_TPS && total > first)
                .then(|| f64::from(n - 1) / ((total - first) / 1000.0));
            o.http_status = Some(200);
            o.model_reported = Some(openai::reported_model(&route.model, b.version));
            o.system_fingerprint = Some(openai::fingerprint(b.version).to_owned());
            o.verified = Some(if kind == OutcomeKind::Throughput {
                answer == throughput_answer()
            } else {
                answer == s.expect
            });
            o.answer = Some(answer);
        }
    }
    o
}

fn throughput_answer() -> String {
    (1..=40)
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// FNV-1a over the parts, for a stable per-region seed.
fn fnv(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(interval_s: u64) -> Route {
        let src = format!(
            "[probe]\ninterval = \"{interval_s}s\"\ntimeout = \"4500ms\"\nfirst_byte_timeout = \"3s\"\nthroughput_every = \"60s\"\n\
             [[provider]]\nid = \"p\"\nkind = \"openai\"\n  [[provider.region]]\n  id = \"r\"\n  base_url = \"http://127.0.0.1:9/v1\"\n\
             [[route]]\nprovider = \"p\"\nregion = \"r\"\nmodel = \"m\"\nserves = \"chat\"\ntier = \"primary\"\nweight = 100\n"
        );
        crate::config::Config::parse(&src, "t.toml")
            .unwrap()
            .config
            .routes()
            .remove(0)
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_healthy_hour_is_minutes_of_probes_at_the_interval() {
        let r = route(5);
        let mut rng = StdRng::seed_from_u64(1);
        let h = hour(
            &r,
            Scenario::Healthy,
            at("2026-05-01T10:00:00Z"),
            false,
            &mut rng,
        );
        let probes = h.iter().filter(|o| o.kind == OutcomeKind::Probe).count();
        let tp: Vec<_> = h
            .iter()
            .filter(|o| o.kind == OutcomeKind::Throughput)
            .collect();
        assert_eq!(probes, 36, "3 minutes at 5 s");
        assert_eq!(tp.len(), 3, "one a minute");
        assert!(h.windows(2).all(|w| w[0].started_at <= w[1].started_at));
        assert_eq!(h[0].started_at, at("2026-05-01T10:00:00Z"));
        let ok: Vec<_> = h.iter().filter(|o| o.success).collect();
        assert!(ok.len() >= 37, "{} of 39 succeeded", ok.len());
        for o in &ok {
            assert_eq!(o.verified, Some(true), "{o:?}");
            assert!(o.total_ms > 300.0 && o.total_ms < 4500.0, "{o:?}");
            assert_eq!(o.system_fingerprint.as_deref(), Some("fp_sim_3c1a2b"));
        }
        for o in tp.iter().filter(|o| o.success) {
            let tps = o.tokens_per_second.unwrap();
            assert!((30.0..80.0).contains(&tps), "{tps}");
        }
    }

    #[test]
    fn a_fault_hour_sweeps_the_scenarios_window() {
        let r = route(5);
        let mut rng = StdRng::seed_from_u64(2);
        let h = hour(
            &r,
            Scenario::PartialOutage,
            at("2026-05-01T10:00:00Z"),
            true,
            &mut rng,
        );
        let probes: Vec<_> = h.iter().filter(|o| o.kind == OutcomeKind::Probe).collect();
        assert_eq!(probes.len(), 240, "20 minutes at 5 s, without a gap");
        let failed: Vec<_> = probes.iter().filter(|o| !o.success).collect();
        // The fault is acted out over 6 minutes: about 72 probes never get headers, all of
        // them between minute one and minute seven.
        assert!(
            (60..=76).contains(&failed.len()),
            "{} of 240 failed",
            failed.len()
        );
        let minute = |m: i64| at("2026-05-01T10:00:00Z") + TimeDelta::minutes(m);
        assert!(failed
            .iter()
            .all(|o| o.started_at >= minute(1) && o.started_at < minute(7)));
        assert!(probes[0].success, "a healthy minute before the fault");
        assert!(
            probes.iter().rev().take(90).all(|o| o.success),
            "and healthy minutes after it, enough to recover"
        );
        let e = probes.iter().find(|o| !o.success).unwrap();
        assert_eq!(e.error, Some(ProbeError::TimeoutBeforeFirstByte));
        assert_eq!(e.total_ms, 3000.0);

        // A region failover: fast 502/503s and resets.
        let h = hour(
            &r,
            Scenario::RegionFailover,
            at("2026-05-01T11:00:00Z"),
            true,
            &mut rng,
        );
        let kinds: BTreeSet<_> = h
            .iter()
            .filter_map(|o| o.error.as_ref().map(ProbeError::kind))
            .collect();
        assert!(kinds.contains("http"), "{kinds:?}");
        // A drifted version answers differently: a success that fails verification.
        let h = hour(
            &r,
            Scenario::VersionDrift,
            at("2026-05-01T12:00:00Z"),
            true,
            &mut rng,
        );
        assert!(h.iter().any(|o| o.success
            && o.verified == Some(false)
            && o.system_fingerprint.as_deref() == Some("fp_sim_9e7d4f")));
    }

    #[test]
    fn fault_hours_are_rare_shared_by_a_region_and_reproducible() {
        let a = fault_hours(7, "openai", "us-east", Scenario::RegionFailover, 720);
        assert_eq!(
            a,
            fault_hours(7, "openai", "us-east", Scenario::RegionFailover, 720)
        );
        assert!((2..=15).contains(&a.len()), "{a:?}");
        assert_ne!(
            a,
            fault_hours(7, "openai", "eu-west", Scenario::RegionFailover, 720)
        );
        assert!(fault_hours(7, "qwen", "x", Scenario::Healthy, 720).is_empty());
    }

    #[test]
    fn slow_answers_past_the_timeout_are_timeouts() {
        let r = route(5);
        let mut rng = StdRng::seed_from_u64(3);
        let b = Behaviour {
            headers_after: Duration::from_millis(500),
            first_token_after: Duration::from_secs(6),
            tokens_per_second: 40.0,
            fault: None,
            version: scenario::Version::Current,
            keepalive: false,
        };
        let o = outcome(
            &r,
            OutcomeKind::Probe,
            at("2026-05-01T10:00:00Z"),
            &b,
            &mut rng,
        );
        assert_eq!(o.error, Some(ProbeError::Timeout));
        assert_eq!(o.total_ms, 4500.0);
        assert_eq!(o.ttfb_ms, Some(500.0));
    }
}
