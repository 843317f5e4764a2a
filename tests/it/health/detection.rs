//! The detection core replayed second by second with explicit times (no sleeps): a whole
//! provider incident's timeline, its failure modes, peak-hour buckets, hysteresis, egress and request-side
//! findings, restart, and a day of a healthy jittery route.

use std::time::Duration;

use chrono::{DateTime, NaiveTime, TimeZone, Utc};
use probeok::config::{Buckets, DetectionConfig};
use probeok::health::findings::{findings, FindingKind, RouteSummary};
use probeok::health::{
    Baseline, Detector, FailureMode, RouteHealth, State, Suppression, Transition,
};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;
use rand::{Rng, SeedableRng};

/// 14:30 in Asia/Shanghai (the default timezone).
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 6, 30, 0).unwrap()
}

fn at(s: f64) -> DateTime<Utc> {
    t0() + chrono::Duration::milliseconds((s * 1000.0).round() as i64)
}

fn rid(p: &str) -> RouteId {
    RouteId::new(p, "cn", "m")
}

fn outcome(route: &RouteId, kind: OutcomeKind, when: DateTime<Utc>) -> ProbeOutcome {
    ProbeOutcome {
        route: route.clone(),
        kind,
        started_at: when,
        success: true,
        attributed_to: None,
        verified: (kind != OutcomeKind::Passive).then_some(true),
        ttfb_ms: Some(150.0),
        ttft_ms: Some(300.0),
        total_ms: 1100.0,
        output_tokens: Some(3),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: Some(200),
        error: None,
        answer: Some("PROBE_OK".into()),
        first_answer_ms: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

fn probe(route: &RouteId, when: DateTime<Utc>, total_ms: f64) -> ProbeOutcome {
    let mut o = outcome(route, OutcomeKind::Probe, when);
    o.total_ms = total_ms;
    o.ttft_ms = Some(total_ms * 0.8);
    o
}

fn failing(mut o: ProbeOutcome, e: ProbeError) -> ProbeOutcome {
    o.success = false;
    o.verified = None;
    o.http_status = e.status();
    o.error = Some(e);
    o.answer = None;
    o
}

fn http(status: u16) -> ProbeError {
    ProbeError::Http {
        status,
        message: "busy".into(),
    }
}

fn passive(route: &RouteId, when: DateTime<Utc>, ok: bool) -> ProbeOutcome {
    let o = outcome(route, OutcomeKind::Passive, when);
    if ok {
        o
    } else {
        failing(o, http(503))
    }
}

fn throughput(route: &RouteId, when: DateTime<Utc>, tps: f64) -> ProbeOutcome {
    let mut o = outcome(route, OutcomeKind::Throughput, when);
    o.total_ms = 300.0 + 80.0 / tps * 1000.0;
    o.output_tokens = Some(80);
    o.tokens_per_second = Some(tps);
    o
}

/// One route driven through the detector, remembering every outcome (for restarts) and every
/// transition with its time in seconds after t0.
struct Sim {
    det: Detector,
    h: RouteHealth,
    b: Baseline,
    route: RouteId,
    log: Vec<ProbeOutcome>,
    transitions: Vec<(f64, Transition)>,
}

impl Sim {
    fn new(cfg: &DetectionConfig, route: RouteId, start: DateTime<Utc>) -> Self {
        let det = Detector::new(cfg);
        Self {
            h: det.route(route.clone(), start),
            b: Baseline::new(route.clone(), cfg),
            det,
            route,
            log: Vec::new(),
            transitions: Vec::new(),
        }
    }

    /// A route with a learned baseline of `n` probes alternating mean ± sd (sample σ ≈ sd),
    /// 30 s apart, ending just before t0.
    fn seeded(cfg: &DetectionConfig, route: RouteId, n: usize, mean: f64, sd: f64) -> Self {
        let start = at(-30.0 * n as f64);
        let mut sim = Self::new(cfg, route, start);
        // ± a·sd with a = √((n−1)/n) gives a sample σ of exactly sd.
        let a = sd * ((n as f64 - 1.0) / n as f64).sqrt();
        for i in 0..n {
            let x = if i % 2 == 0 { mean - a } else { mean + a };
            let when = at(-30.0 * (n - i) as f64);
            let o = probe(&sim.route, when, x);
            sim.feed(o, when);
        }
        assert_eq!(
            sim.h.state(),
            State::Normal,
            "seeding makes the route NORMAL"
        );
        sim.transitions.clear();
        sim
    }

    fn feed(&mut self, o: ProbeOutcome, now: DateTime<Utc>) -> Option<Transition> {
        self.log.push(o.clone());
        let t = self.det.ingest(&mut self.h, &mut self.b, &o, now);
        if let Some(t) = &t {
            self.transitions.push((secs(now), t.clone()));
        }
        t
    }

    fn tick(&mut self, now: DateTime<Utc>) -> Option<Transition> {
        let t = self.det.tick(&mut self.h, now);
        if let Some(t) = &t {
            self.transitions.push((secs(now), t.clone()));
        }
        t
    }

    fn count(&self, to: State) -> usize {
        self.transitions.iter().filter(|(_, t)| t.to == to).count()
    }

    fn first(&self, to: State) -> Option<&(f64, Transition)> {
        self.transitions.iter().find(|(_, t)| t.to == to)
    }
}

fn secs(now: DateTime<Utc>) -> f64 {
    (now - t0()).num_milliseconds() as f64 / 1000.0
}

fn cfg() -> DetectionConfig {
    DetectionConfig::default()
}

/// A provider incident's timeline. Baseline 1.1 s ± 0.3 s; probes every 30 s: 4.2 s, 5.1 s, 6.8 s →
/// WARNING, WARNING, DEGRADED; then real traffic at 10/s with 8% errors held past
/// `critical_after` → CRITICAL; then normal observations → NORMAL exactly `recover_after`
/// after the first one, not a second before.
#[test]
fn seed_000_timeline() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    let lref = sim.b.latency_ref(at(0.0)).unwrap();
    assert_eq!(lref.bucket, "14:00-15:00");
    assert!((lref.mean_ms - 1100.0).abs() < 1.0);
    assert!((lref.stddev_ms - 300.0).abs() < 10.0, "{}", lref.stddev_ms);

    let t = sim.feed(probe(&r, at(0.0), 4200.0), at(0.0)).unwrap();
    assert_eq!((t.from, t.to), (State::Normal, State::Warning));
    assert_eq!(t.reason.code, "latency_above_baseline");
    assert!(t.reason.text.contains("4.2 s"), "{}", t.reason.text);
    assert!(
        t.reason
            .text
            .contains("against a normal of 1.1 s ± 0.3 s for 14:00-15:00"),
        "{}",
        t.reason.text
    );
    let bl = t.evidence.baseline.as_ref().unwrap();
    assert_eq!((bl.bucket.as_str(), bl.samples), ("14:00-15:00", 40));
    assert_eq!(t.evidence.thresholds[0].name, "latency_ms");

    for s in 1..30 {
        assert!(sim.tick(at(s as f64)).is_none());
    }
    assert!(sim.feed(probe(&r, at(30.0), 5100.0), at(30.0)).is_none());
    assert_eq!(sim.h.state(), State::Warning);
    assert_eq!(sim.h.streak(), 2);
    for s in 31..60 {
        assert!(sim.tick(at(s as f64)).is_none());
    }
    let t = sim.feed(probe(&r, at(60.0), 6800.0), at(60.0)).unwrap();
    assert_eq!((t.from, t.to), (State::Warning, State::Degraded));
    assert_eq!(t.failure_mode, Some(FailureMode::Degraded));
    assert!(t.incident_id.is_some());
    assert!(sim.h.incident().is_some());

    // Real traffic at 10/s with exactly 8% errors; probes stay slow. Then, from `heal`, all
    // normal: probes 1.1 s, no errors.
    let heal = 400;
    let mut i = 0u64;
    let mut last_state = sim.h.state();
    let mut normal_since_seen: Option<DateTime<Utc>> = None;
    for s in 61..1200 {
        let healthy = s >= heal;
        let prev = sim.h.state();
        sim.tick(at(s as f64));
        if s % 30 == 0 {
            let x = if healthy { 1100.0 } else { 7000.0 };
            sim.feed(probe(&r, at(s as f64), x), at(s as f64));
        }
        for k in 0..10 {
            let when = at(s as f64 + 0.1 * k as f64);
            let ok = healthy || !(i % 25 == 0 || i % 25 == 12);
            i += 1;
            sim.feed(passive(&r, when, ok), when);
        }
        if sim.h.state() == State::Normal && prev != State::Normal {
            // The last second before: still CRITICAL, with normal observations running.
            assert_eq!(prev, State::Critical);
            let since = normal_since_seen.expect("normal observations before recovery");
            assert_eq!(
                (at(s as f64) - since).num_seconds(),
                300,
                "exactly recover_after"
            );
            last_state = State::Normal;
            break;
        }
        normal_since_seen = sim.h.normal_since();
        last_state = sim.h.state();
    }
    assert_eq!(last_state, State::Normal);
    let (tc, crit) = sim.first(State::Critical).unwrap().clone();
    assert_eq!(crit.reason.code, "error_rate_high", "{}", crit.reason.text);
    let above = crit.evidence.error_rate.above_since.unwrap();
    assert!((crit.at - above).num_seconds() >= 60);
    assert!(tc < 61.0 + 10.0 + 60.0, "CRITICAL at t={tc}");
    assert_eq!(crit.failure_mode, Some(FailureMode::Unavailable));
    let (tn, normal) = sim.first(State::Normal).unwrap().clone();
    assert_eq!(normal.reason.code, "recovered");
    assert!(tn >= heal as f64 + 300.0);
    let closed = sim.h.last_closed().unwrap();
    assert_eq!(closed.peak, State::Critical);
    assert!(closed.closed_at.is_some());
    assert!(sim.h.incident().is_none());
    println!(
        "incident timeline: WARNING t=0, DEGRADED t=60, CRITICAL t={tc}, healthy from t={heal}, NORMAL t={tn}"
    );
}

/// Recovery needs `recover_after` of normal observations: one second short is not enough.
#[test]
fn recovery_not_one_second_early() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    for k in 0..3 {
        sim.feed(probe(&r, at(30.0 * k as f64), 6000.0), at(30.0 * k as f64));
    }
    assert_eq!(sim.h.state(), State::Degraded);
    // Normal probes every 10 s from t=70.
    let mut s = 70;
    while s < 70 + 290 {
        sim.feed(probe(&r, at(s as f64), 1100.0), at(s as f64));
        s += 10;
    }
    // t=360: the last normal probe 290 s after the first; one more at 369 s is still short.
    assert_eq!(sim.h.state(), State::Degraded);
    sim.feed(probe(&r, at(369.0), 1100.0), at(369.0));
    assert_eq!(
        sim.h.state(),
        State::Degraded,
        "299 s of normal observations"
    );
    let t = sim.feed(probe(&r, at(370.0), 1100.0), at(370.0)).unwrap();
    assert_eq!(t.to, State::Normal);
    assert_eq!(t.evidence.thresholds[0].name, "normal_for_s");
}

/// A long latency spike: p95 1.1 s → 14.3 s for 23 minutes with errors below 0.5%:
/// `degraded`, and the baseline does not learn the spike halfway through.
#[test]
fn latency_spike_is_degraded_and_not_learned() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 100, 1100.0, 150.0);
    let mut i = 0u64;
    let spike_end = 23 * 60;
    let mut degraded_at = None;
    for s in 0..spike_end {
        sim.tick(at(s as f64));
        if s % 30 == 0 {
            let x = 12_000.0 + (s % 7) as f64 * 400.0; // 12.0–14.4 s
            sim.feed(probe(&r, at(s as f64), x), at(s as f64));
        }
        for k in 0..10 {
            let when = at(s as f64 + 0.1 * k as f64);
            let ok = i % 300 != 7; // 0.33% errors
            i += 1;
            sim.feed(passive(&r, when, ok), when);
        }
        if degraded_at.is_none() && sim.h.state() >= State::Degraded {
            degraded_at = Some(s);
        }
        if s > 60 {
            assert!(
                sim.h.state() >= State::Degraded,
                "t={s}: {:?}",
                sim.h.state()
            );
        }
    }
    assert_eq!(degraded_at, Some(60));
    let d = sim.first(State::Degraded).unwrap().1.clone();
    assert_eq!(d.failure_mode, Some(FailureMode::Degraded));
    assert_eq!(d.reason.code, "latency_above_baseline");
    assert_eq!(sim.h.failure_mode(), Some(FailureMode::Degraded));
    // DEGRADED for 2 min with no normal observation → CRITICAL, still `degraded` in mode.
    let (tc, c) = sim.first(State::Critical).unwrap().clone();
    assert_eq!(c.reason.code, "degraded_too_long");
    assert_eq!(tc, 180.0);
    assert_eq!(c.failure_mode, Some(FailureMode::Degraded));
    // The baseline still says 1.1 s.
    let lref = sim.b.latency_ref(at(spike_end as f64)).unwrap();
    assert!(lref.mean_ms < 1200.0, "{lref:?}");
}

/// A soft rate limit: tokens/s 50 → 8, fast first byte, no errors. Caught by the throughput
/// probes alone (every 5 min), and within seconds by real streams.
#[test]
fn soft_rate_limit_is_caught() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 150.0);
    for k in 0..30 {
        let when = at(-300.0 * (30 - k) as f64 + 7.0);
        let tps = if k % 2 == 0 { 45.0 } else { 55.0 };
        sim.b.record(&throughput(&r, when, tps));
    }
    assert!((sim.b.tps_ref(at(0.0)).unwrap().mean - 50.0).abs() < 0.1);
    let mut base = sim.h.clone();
    // Probes only: PROBE_OK probes barely slower (fast first byte), throughput at 8 tokens/s.
    for s in (0..=1800).step_by(30) {
        sim.tick(at(s as f64));
        sim.feed(probe(&r, at(s as f64), 1250.0), at(s as f64));
        if s % 300 == 0 {
            sim.feed(throughput(&r, at(s as f64 + 5.0), 8.0), at(s as f64 + 5.0));
        }
    }
    let (td, d) = sim.first(State::Degraded).unwrap().clone();
    assert_eq!(d.reason.code, "tps_below_baseline", "{}", d.reason.text);
    assert_eq!(d.failure_mode, Some(FailureMode::Degraded));
    assert!(
        d.reason
            .text
            .contains("8.0 tokens/s against a normal of 50.0"),
        "{}",
        d.reason.text
    );
    assert_eq!(td, 605.0, "third throughput probe");
    let w = sim.first(State::Warning).unwrap();
    assert_eq!(w.0, 5.0);

    // With real streams at 10/s reporting 8 tokens/s: DEGRADED in seconds.
    std::mem::swap(&mut sim.h, &mut base);
    sim.transitions.clear();
    for s in 0..30 {
        sim.tick(at(s as f64));
        for k in 0..10 {
            let when = at(s as f64 + 0.1 * k as f64);
            let mut o = outcome(&r, OutcomeKind::Passive, when);
            o.tokens_per_second = Some(8.0);
            sim.feed(o, when);
        }
    }
    let (td, d) = sim.first(State::Degraded).unwrap().clone();
    assert!(td <= 3.0, "DEGRADED at {td}");
    assert_eq!(d.reason.code, "tps_below_baseline");
}

/// A clean 503 outage (probes only): `unavailable`, DEGRADED after three probes, CRITICAL
/// after two more minutes without a normal observation.
#[test]
fn clean_503_outage_is_unavailable() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    for s in (0..=300).step_by(30) {
        let o = failing(probe(&r, at(s as f64), 40.0), http(503));
        sim.feed(o, at(s as f64));
        for k in 1..30 {
            sim.tick(at((s + k) as f64));
        }
    }
    let w = sim.first(State::Warning).unwrap().1.clone();
    assert_eq!(w.reason.code, "probe_failed");
    assert!(w.reason.text.contains("HTTP 503"), "{}", w.reason.text);
    let (td, d) = sim.first(State::Degraded).unwrap().clone();
    assert_eq!(td, 60.0);
    assert_eq!(d.failure_mode, Some(FailureMode::Unavailable));
    let (tc, _) = sim.first(State::Critical).unwrap().clone();
    assert_eq!(tc, 180.0);
    assert_eq!(
        sim.h.incident().unwrap().failure_mode,
        Some(FailureMode::Unavailable)
    );
}

/// Answers that stop being PROBE_OK: `behavior_changed`, WARNING at most, for as long as it
/// lasts; back to NORMAL on the first right answer.
#[test]
fn answer_change_is_behavior_changed_and_warning_at_most() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    for s in (0..3600).step_by(30) {
        let mut o = probe(&r, at(s as f64), 1100.0);
        o.verified = Some(false);
        o.answer = Some("PROBE OK.".into());
        sim.feed(o, at(s as f64));
        sim.tick(at(s as f64 + 1.0));
        assert_eq!(sim.h.state(), State::Warning, "t={s}");
    }
    assert_eq!(sim.transitions.len(), 1);
    let t = &sim.transitions[0].1;
    assert_eq!(t.reason.code, "answer_changed");
    assert_eq!(t.failure_mode, Some(FailureMode::BehaviorChanged));
    assert!(sim.h.behavior_changed());
    let t = sim.feed(probe(&r, at(3600.0), 1100.0), at(3600.0)).unwrap();
    assert_eq!(t.to, State::Normal);
}

/// Peak windows: the same latency is normal at peak and abnormal off-peak.
#[test]
fn peak_bucket_has_its_own_normal() {
    let mut cfg = cfg();
    let hm = |h, m| NaiveTime::from_hms_opt(h, m, 0).unwrap();
    cfg.buckets = Buckets::Windows(vec![(hm(9, 0), hm(12, 0))]);
    let r = rid("qwen");
    let mut b = Baseline::new(r.clone(), &cfg);
    // Peak (10:00 Shanghai = 02:00 UTC) ~2.0 s; off-peak (14:00 = 06:00 UTC) ~1.0 s.
    let peak = Utc.with_ymd_and_hms(2026, 11, 30, 2, 0, 0).unwrap();
    let off = Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap();
    for i in 0..40 {
        let d = chrono::Duration::seconds(30 * i);
        let j = if i % 2 == 0 { -100.0 } else { 100.0 };
        b.record(&probe(&r, peak + d, 2000.0 + j));
        b.record(&probe(&r, off + d, 1000.0 + j / 2.0));
    }
    let later = chrono::Duration::minutes(30);
    let p = b.latency_ref(peak + later).unwrap();
    let o = b.latency_ref(off + later).unwrap();
    assert_eq!(p.bucket, "peak 09:00-12:00");
    assert_eq!(o.bucket, "off-peak");
    let det = Detector::new(&cfg);
    let mut hp = det.route(r.clone(), peak);
    let mut ho = det.route(r.clone(), off);
    hp.clone_from(&ho);
    let x = 2200.0;
    let tp = det.observe(&mut hp, &probe(&r, peak + later, x), &b, peak + later);
    let to = det.observe(&mut ho, &probe(&r, off + later, x), &b, off + later);
    assert!(tp.is_none(), "2.2 s is normal at peak");
    let to = to.expect("2.2 s is abnormal off-peak");
    assert_eq!(to.reason.code, "latency_above_baseline");
    assert!(to.reason.text.contains("off-peak"), "{}", to.reason.text);
    let snap = b.snapshot(peak + later).unwrap();
    assert_eq!(
        (snap.bucket.as_str(), snap.samples),
        ("peak 09:00-12:00", 40)
    );
    assert!(snap.p95_ms > snap.p50_ms);
}

/// A very steady route (σ = 0) with ±5% jitter raises nothing: the floor under the threshold.
#[test]
fn near_zero_stddev_with_jitter_raises_nothing() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::new(&cfg, r.clone(), at(-1200.0));
    for i in 0..40 {
        let when = at(-1200.0 + 30.0 * i as f64);
        sim.feed(probe(&r, when, 1000.0), when);
    }
    assert_eq!(sim.h.state(), State::Normal);
    assert_eq!(sim.b.latency_ref(at(0.0)).unwrap().stddev_ms, 0.0);
    sim.transitions.clear();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for i in 0..2000 {
        let x = 1000.0 * (1.0 + rng.gen_range(-0.05..=0.05));
        sim.feed(probe(&r, at(30.0 * i as f64), x), at(30.0 * i as f64));
    }
    assert!(sim.transitions.is_empty(), "{:?}", sim.transitions.first());
}

/// Alternating good and bad probes around the threshold do not bounce DEGRADED↔NORMAL; one
/// failure out of two outcomes escalates nothing.
#[test]
fn no_flapping() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    // Threshold 1.7 s. Three bad → DEGRADED, then good (1.1 s) and bad (2.0 s) alternating for
    // an hour: every bad one restarts the 5 minutes, and the bad ones are not learned.
    for k in 0..3 {
        sim.feed(probe(&r, at(30.0 * k as f64), 2000.0), at(30.0 * k as f64));
    }
    assert_eq!(sim.h.state(), State::Degraded);
    for k in 3..123 {
        let x = if k % 2 == 0 { 1100.0 } else { 2000.0 };
        let s = 30.0 * k as f64;
        sim.feed(probe(&r, at(s), x), at(s));
        sim.tick(at(s + 1.0));
        assert_eq!(sim.h.state(), State::Degraded, "k={k}");
    }
    assert_eq!(sim.count(State::Normal), 0);
    assert_eq!(
        sim.count(State::Critical),
        0,
        "normal observations in between"
    );

    // From NORMAL, alternating never reaches DEGRADED (WARNING↔NORMAL is by design).
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    for k in 0..120 {
        let x = if k % 2 == 0 { 1600.0 } else { 1800.0 };
        sim.feed(probe(&r, at(30.0 * k as f64), x), at(30.0 * k as f64));
    }
    assert_eq!(sim.count(State::Degraded), 0);

    // One failure out of two outcomes: below min_error_samples, nothing.
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    sim.feed(passive(&r, at(0.5), false), at(0.5));
    sim.feed(passive(&r, at(0.6), true), at(0.6));
    for s in 1..120 {
        assert!(sim.tick(at(s as f64)).is_none());
    }
}

/// A route down from its very first probe leaves UNKNOWN for DEGRADED, then CRITICAL.
#[test]
fn down_from_the_first_probe() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::new(&cfg, r.clone(), at(0.0));
    assert_eq!(sim.h.state(), State::Unknown);
    for s in (0..=240).step_by(30) {
        let e = ProbeError::Connect {
            message: "connection refused".into(),
        };
        sim.feed(failing(probe(&r, at(s as f64), 5.0), e), at(s as f64));
        for k in 1..30 {
            sim.tick(at((s + k) as f64));
        }
    }
    let states: Vec<(f64, State, State)> = sim
        .transitions
        .iter()
        .map(|(t, x)| (*t, x.from, x.to))
        .collect();
    assert_eq!(
        states,
        vec![
            (0.0, State::Unknown, State::Warning),
            (60.0, State::Warning, State::Degraded),
            (180.0, State::Degraded, State::Critical),
        ]
    );
    assert_eq!(sim.h.failure_mode(), Some(FailureMode::Unavailable));
    // Client errors never count against it.
    let mut sim = Sim::new(&cfg, r.clone(), at(0.0));
    for s in 0..10 {
        let o = failing(
            probe(&r, at(s as f64), 5.0),
            http(if s % 2 == 0 { 400 } else { 422 }),
        );
        sim.feed(o, at(s as f64));
        let o = failing(
            probe(&r, at(s as f64 + 0.5), 5.0),
            ProbeError::Refused {
                message: "policy".into(),
            },
        );
        sim.feed(o, at(s as f64 + 0.5));
    }
    assert!(sim.transitions.is_empty());
}

/// Routes of two providers failing with the control URL failing too: one egress finding, and
/// the marked routes are not escalated one by one. One provider failing is not egress.
#[test]
fn egress_versus_provider() {
    let cfg = cfg();
    let routes = [rid("qwen"), rid("deepseek"), rid("glm")];
    let mut sims: Vec<Sim> = routes
        .iter()
        .map(|r| Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0))
        .collect();
    let fail = |sim: &mut Sim, s: f64| {
        let o = failing(
            probe(&sim.route.clone(), at(s), 5.0),
            ProbeError::Connect {
                message: "dns".into(),
            },
        );
        sim.feed(o, at(s));
    };
    for sim in sims.iter_mut().take(2) {
        fail(sim, 0.0);
    }
    let ok = probe(&routes[2], at(0.0), 1100.0);
    sims[2].feed(ok, at(0.0));
    let summaries: Vec<RouteSummary> = sims
        .iter()
        .map(|s| RouteSummary::of(&s.h, &s.det, at(1.0)))
        .collect();
    let f = findings(&summaries, Some(false));
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, FindingKind::Egress);
    assert_eq!(f[0].routes, vec![routes[0].clone(), routes[1].clone()]);
    assert_eq!(
        f[0].providers,
        vec!["deepseek".to_owned(), "qwen".to_owned()]
    );
    // The shell marks the routes; further failures escalate nothing.
    for (sim, r) in sims.iter_mut().zip(&routes).take(2) {
        assert!(f[0].routes.contains(r));
        sim.h.set_suppression(f[0].kind.suppression());
        for k in 1..20 {
            fail(sim, 30.0 * k as f64);
        }
        assert_eq!(sim.h.state(), State::Warning);
        assert_eq!(sim.count(State::Degraded), 0);
    }
    // With the control URL fine, or unknown, it is the providers.
    assert!(findings(&summaries, Some(true)).is_empty());
    assert!(findings(&summaries, None).is_empty());
    // One provider failing with the control URL failing: a provider problem, no egress.
    let one: Vec<RouteSummary> = summaries
        .iter()
        .cloned()
        .map(|mut s| {
            s.probe_failing = s.route == routes[0];
            s
        })
        .collect();
    assert!(findings(&one, Some(false)).is_empty());
}

/// Probes fine while real traffic fails: a request-side finding, and with it marked the
/// passive failures stop counting against the route.
#[test]
fn request_side_finding() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    for s in 0..40 {
        sim.tick(at(s as f64));
        if s % 30 == 0 {
            sim.feed(probe(&r, at(s as f64 + 0.05), 1100.0), at(s as f64 + 0.05));
        }
        for k in 1..10 {
            let when = at(s as f64 + 0.1 * k as f64);
            let mut o = passive(&r, when, k % 2 == 0);
            if k % 2 == 1 {
                o = failing(outcome(&r, OutcomeKind::Passive, when), http(500));
            }
            sim.feed(o, when);
        }
    }
    let s = RouteSummary::of(&sim.h, &sim.det, at(40.0));
    let f = findings(&[s], Some(true));
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, FindingKind::RequestSide);
    sim.h.set_suppression(Suppression::RequestSide);
    // Marked: the route recovers on its probes despite the failing requests.
    for s in 40..800 {
        sim.tick(at(s as f64));
        if s % 30 == 0 {
            sim.feed(probe(&r, at(s as f64), 1100.0), at(s as f64));
        }
        let when = at(s as f64 + 0.5);
        sim.feed(
            failing(outcome(&r, OutcomeKind::Passive, when), http(500)),
            when,
        );
    }
    assert_eq!(sim.h.state(), State::Normal);
}

/// Failures the proxy attributed to one client's own requests never reach the route's error
/// rate: a flood of them leaves the route NORMAL, and the finding names the client; a tally
/// per client is bounded and forgets clients whose failures left the error window.
#[test]
fn attributed_failures_are_the_requests_not_the_routes() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    for s in 0..120 {
        sim.tick(at(s as f64));
        if s % 30 == 0 {
            sim.feed(probe(&r, at(s as f64 + 0.05), 1100.0), at(s as f64 + 0.05));
        }
        for k in 1..10 {
            let when = at(s as f64 + 0.1 * k as f64);
            let mut o = failing(
                outcome(&r, OutcomeKind::Passive, when),
                ProbeError::TimeoutBeforeFirstByte,
            );
            o.attributed_to = Some(format!("key:{:08}", k % 3));
            sim.feed(o, when);
            sim.feed(passive(&r, when, true), when);
        }
    }
    assert_eq!(sim.h.state(), State::Normal, "{:?}", sim.transitions);
    assert!(sim.transitions.is_empty(), "{:?}", sim.transitions);
    let c = sim.h.window().counts(at(120.0), 300);
    assert_eq!(c.passive_failures, 0, "{c:?}");
    let s = RouteSummary::of(&sim.h, &sim.det, at(120.0));
    assert_eq!(s.attributed.len(), 3, "{:?}", s.attributed);
    let f = findings(&[s], None);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, FindingKind::RequestSide);
    assert!(
        f[0].text
            .contains("client key:00000001: 360 requests failed (timeout_before_first_byte)"),
        "{}",
        f[0].text
    );
    // Once the route's own probes fail, the failures are no longer the requests' alone.
    let mut failing_now = RouteSummary::of(&sim.h, &sim.det, at(120.0));
    failing_now.probe_failing = true;
    assert!(findings(&[failing_now], None).is_empty());
    // Bounded, and forgotten after the error window.
    for k in 0..50 {
        let when = at(121.0);
        let mut o = failing(outcome(&r, OutcomeKind::Passive, when), ProbeError::Timeout);
        o.attributed_to = Some(format!("key:x{k}"));
        sim.feed(o, when);
    }
    assert_eq!(
        sim.h.attributed().len(),
        probeok::health::findings::MAX_ATTRIBUTED_CLIENTS
    );
    let later = at(121.0 + cfg.error_window.as_secs_f64() + 1.0);
    assert!(RouteSummary::of(&sim.h, &sim.det, later)
        .attributed
        .is_empty());
}

/// Restart: persist RouteHealth as JSON, rebuild the baseline from the same outcomes, and
/// every later decision is identical.
#[test]
fn restart_gives_identical_decisions() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 60, 1100.0, 300.0);
    let drive = |sim: &mut Sim, from: u64, to: u64| {
        for s in from..to {
            sim.tick(at(s as f64));
            if s % 30 == 0 {
                let x = if (60..500).contains(&s) {
                    6000.0
                } else {
                    1000.0 + (s % 7) as f64 * 40.0
                };
                sim.feed(probe(&r, at(s as f64), x), at(s as f64));
            }
            if (100..300).contains(&s) {
                let ok = s % 10 != 0;
                sim.feed(passive(&r, at(s as f64 + 0.5), ok), at(s as f64 + 0.5));
            }
        }
    };
    drive(&mut sim, 0, 200);
    assert!(sim.h.state().is_incident());
    let json = serde_json::to_string(&sim.h).unwrap();
    let restored_h: RouteHealth = serde_json::from_str(&json).unwrap();
    assert_eq!(restored_h, sim.h);
    let rebuilt = Baseline::rebuild(r.clone(), &cfg, sim.log.iter());
    assert_eq!(rebuilt.snapshots(), sim.b.snapshots());
    let mut restored = Sim {
        det: Detector::new(&cfg),
        h: restored_h,
        b: rebuilt,
        route: r.clone(),
        log: sim.log.clone(),
        transitions: Vec::new(),
    };
    sim.transitions.clear();
    drive(&mut sim, 200, 1500);
    drive(&mut restored, 200, 1500);
    assert!(!sim.transitions.is_empty());
    assert_eq!(sim.transitions, restored.transitions);
    assert_eq!(sim.h, restored.h);
    assert_eq!(sim.h.state(), State::Normal);
    assert!(sim.h.last_closed().is_some());
}

/// With real traffic at 10 outcomes/s, a hard outage reaches DEGRADED in under 5 s.
#[test]
fn passive_hard_outage_degraded_within_5_seconds() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    // Five minutes of healthy traffic fill the window first.
    for s in -300..0 {
        sim.tick(at(s as f64));
        for k in 0..10 {
            let when = at(s as f64 + 0.1 * k as f64);
            sim.feed(passive(&r, when, true), when);
        }
    }
    assert!(sim.transitions.is_empty());
    for s in 0..10 {
        sim.tick(at(s as f64));
        for k in 0..10 {
            let when = at(s as f64 + 0.1 * k as f64);
            let o = failing(
                outcome(&r, OutcomeKind::Passive, when),
                ProbeError::Connect {
                    message: "refused".into(),
                },
            );
            sim.feed(o, when);
        }
    }
    let (td, d) = sim.first(State::Degraded).unwrap().clone();
    assert!(td < 5.0, "DEGRADED after {td} s");
    assert_eq!(d.failure_mode, Some(FailureMode::Unavailable));
    assert_eq!(d.reason.code, "error_rate_high");
    println!("passive hard outage: DEGRADED after {td} s");
}

/// 24 simulated hours of a healthy, jittery route: log-normal latency around 1.1 s, 30 s
/// probes, 0.1% single failures. Zero DEGRADED; WARNINGs are counted and printed.
#[test]
fn healthy_jittery_day_never_degrades() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::new(&cfg, r.clone(), at(0.0));
    let mut rng = rand::rngs::StdRng::seed_from_u64(2026);
    let sigma = 0.1; // log-normal σ: about ±10% jitter
    let mut warnings = 0;
    for i in 0..2880 {
        let s = 30.0 * i as f64;
        let now = at(s);
        let o = if rng.gen_bool(0.001) {
            failing(probe(&r, now, 30_000.0), ProbeError::Timeout)
        } else {
            probe(&r, now, lognormal(&mut rng, 1100.0, sigma))
        };
        if let Some(t) = sim.feed(o, now) {
            if t.to == State::Warning {
                warnings += 1;
            }
        }
        sim.tick(at(s + 1.0));
    }
    println!(
        "24 h healthy (log-normal σ={sigma}): {warnings} WARNING, {} DEGRADED, {} CRITICAL",
        sim.count(State::Degraded),
        sim.count(State::Critical)
    );
    assert_eq!(sim.count(State::Degraded), 0);
    assert_eq!(sim.count(State::Critical), 0);
}

/// A log-normal sample with the given median and log-σ (Box–Muller).
fn lognormal(rng: &mut impl Rng, median: f64, sigma: f64) -> f64 {
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.gen();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    median * (sigma * z).exp()
}

#[test]
fn error_window_memory_is_bounded() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    for s in 0..1000 {
        for k in 0..10 {
            let when = at(s as f64 + 0.1 * k as f64);
            sim.feed(passive(&r, when, true), when);
        }
    }
    assert!(sim.h.window().slots() <= cfg.error_window.as_secs() as usize);
    let _ = Duration::from_secs(1);
}

/// Successes left in the error window by traffic that has since stopped do not vouch for the
/// route: a probes-only outage right after busy traffic still reaches DEGRADED on the third
/// failed probe.
#[test]
fn stale_passive_successes_do_not_clear_failing_probes() {
    let cfg = cfg();
    let r = rid("qwen");
    let mut sim = Sim::seeded(&cfg, r.clone(), 40, 1100.0, 300.0);
    for s in -300..0 {
        sim.tick(at(s as f64));
        for k in 0..10 {
            let when = at(s as f64 + 0.1 * k as f64);
            sim.feed(passive(&r, when, true), when);
        }
    }
    for s in 0..100 {
        sim.tick(at(s as f64));
        if s % 30 == 5 {
            sim.feed(
                failing(probe(&r, at(s as f64), 30.0), http(503)),
                at(s as f64),
            );
        }
    }
    assert_eq!(sim.count(State::Normal), 0, "{:?}", sim.transitions.last());
    assert_eq!(sim.first(State::Degraded).unwrap().0, 65.0);
}
