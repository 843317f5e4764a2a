//! Detection figures: the cost of one observation through baseline + detector, the memory per
//! route at full windows, and the mean time to detect the failure modes of a scripted provider incident, from pure
//! simulation (no I/O, explicit time).
//!
//! `CARGO_TARGET_DIR=/work/target cargo bench --bench detection`

use std::hint::black_box;
use std::time::Instant;

use chrono::{DateTime, TimeZone, Utc};
use probeok::config::DetectionConfig;
use probeok::health::{confirm, Baseline, Detector, RouteHealth, State};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;
use rand::{Rng, SeedableRng};

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0)
        .single()
        .unwrap_or_default()
}

fn at(s: f64) -> DateTime<Utc> {
    t0() + chrono::Duration::milliseconds((s * 1000.0).round() as i64)
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

fn probe(route: &RouteId, when: DateTime<Utc>, ms: f64) -> ProbeOutcome {
    let mut o = outcome(route, OutcomeKind::Probe, when);
    o.total_ms = ms;
    o.ttft_ms = Some(ms * 0.8);
    o
}

fn fail(mut o: ProbeOutcome) -> ProbeOutcome {
    o.success = false;
    o.verified = None;
    o.error = Some(ProbeError::Http {
        status: 503,
        message: "unavailable".into(),
    });
    o.http_status = Some(503);
    o
}

fn with_tps(mut o: ProbeOutcome, tps: f64) -> ProbeOutcome {
    o.tokens_per_second = Some(tps);
    o.output_tokens = Some(80);
    o
}

fn lognormal(rng: &mut impl Rng, median: f64, sigma: f64) -> f64 {
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.gen();
    median * (sigma * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()).exp()
}

/// A route with a full day of history: every hour bucket full, tokens/s learned.
fn warmed(cfg: &DetectionConfig, rng: &mut impl Rng) -> (Detector, RouteHealth, Baseline, f64) {
    let r = RouteId::new("qwen", "cn", "qwen-max");
    let det = Detector::new(cfg);
    let mut h = det.route(r.clone(), at(0.0));
    let mut b = Baseline::new(r.clone(), cfg);
    let mut s = 0.0;
    while s < 86_400.0 {
        let o = probe(&r, at(s), lognormal(rng, 1100.0, 0.1));
        det.ingest(&mut h, &mut b, &o, at(s));
        if (s as u64) % 300 == 0 {
            let tp = with_tps(
                outcome(&r, OutcomeKind::Throughput, at(s + 5.0)),
                50.0 + rng.gen_range(-3.0..3.0),
            );
            det.ingest(&mut h, &mut b, &tp, at(s + 5.0));
        }
        s += 30.0;
    }
    // Fill the error window with a busy route's traffic.
    for k in 0..3000 {
        let when = at(s + k as f64 * 0.1);
        det.ingest(
            &mut h,
            &mut b,
            &outcome(&r, OutcomeKind::Passive, when),
            when,
        );
    }
    (det, h, b, s + 300.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn cost(cfg: &DetectionConfig) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (det, h0, b0, start) = warmed(cfg, &mut rng);
    let r = h0.route().clone();
    const N: usize = 20_000;
    let probes: Vec<ProbeOutcome> = (0..N)
        .map(|i| {
            probe(
                &r,
                at(start + i as f64 * 30.0),
                lognormal(&mut rng, 1100.0, 0.1),
            )
        })
        .collect();
    let passives: Vec<ProbeOutcome> = (0..N)
        .map(|i| outcome(&r, OutcomeKind::Passive, at(start + i as f64 * 0.1)))
        .collect();
    let mut probe_ns = Vec::new();
    let mut passive_ns = Vec::new();
    let mut tick_ns = Vec::new();
    for _ in 0..7 {
        let (mut h, mut b) = (h0.clone(), b0.clone());
        let t = Instant::now();
        for o in &probes {
            black_box(det.ingest(&mut h, &mut b, o, o.started_at));
        }
        probe_ns.push(t.elapsed().as_nanos() as f64 / N as f64);
        let (mut h, mut b) = (h0.clone(), b0.clone());
        let t = Instant::now();
        for o in &passives {
            black_box(det.ingest(&mut h, &mut b, o, o.started_at));
        }
        passive_ns.push(t.elapsed().as_nanos() as f64 / N as f64);
        let mut h = h0.clone();
        let t = Instant::now();
        for i in 0..N {
            black_box(det.tick(&mut h, at(start + i as f64 * 0.01)));
        }
        tick_ns.push(t.elapsed().as_nanos() as f64 / N as f64);
    }
    println!("cost per call (median of 7 runs of {N}, full windows, hourly buckets):");
    println!(
        "  probe outcome  (baseline judge + record + detector): {:>7.0} ns",
        median(probe_ns)
    );
    println!(
        "  passive outcome (error window + tps tally):          {:>7.0} ns",
        median(passive_ns)
    );
    println!(
        "  tick (1 s evaluation, 300-slot window):              {:>7.0} ns",
        median(tick_ns)
    );
    let json = serde_json::to_string(&h0).map(|j| j.len()).unwrap_or(0);
    println!("memory per route at full windows (24 hour buckets × latency/ttft/tps × 100, 300 s window):");
    println!("  Baseline:    {:>7} bytes", b0.approx_bytes());
    println!(
        "  RouteHealth: {:>7} bytes (no open incident; persisted JSON {json} bytes)",
        h0.approx_bytes()
    );
}

#[derive(Clone, Copy)]
enum Fault {
    HardOutage,
    LatencySpike,
    SoftRateLimit,
}

/// `[probe] confirm_after` at its default, `interval/6` of 30 s.
const CONFIRM_AFTER_S: f64 = 5.0;

/// A confirmation probe of `kind` during `fault` (the same outcomes the grid sees; a
/// throughput probe during the latency spike waits as long for its first token).
fn faulty(
    r: &RouteId,
    kind: OutcomeKind,
    fault: Fault,
    now: DateTime<Utc>,
    rng: &mut impl Rng,
) -> ProbeOutcome {
    if kind == OutcomeKind::Throughput {
        let o = with_tps(outcome(r, OutcomeKind::Throughput, now), 50.0);
        return match fault {
            Fault::HardOutage => fail(o),
            Fault::LatencySpike => {
                let mut o = o;
                let first = lognormal(rng, 13_000.0, 0.1) * 0.8;
                o.ttft_ms = Some(first);
                o.total_ms = first + 1600.0;
                o
            }
            Fault::SoftRateLimit => with_tps(o, 8.0),
        };
    }
    let o = probe(r, now, lognormal(rng, 1100.0, 0.1));
    match fault {
        Fault::HardOutage => fail(o),
        Fault::LatencySpike => probe(r, now, lognormal(rng, 13_000.0, 0.1)),
        Fault::SoftRateLimit => probe(r, now, o.total_ms + 300.0),
    }
}

/// Seconds from the fault's onset to DEGRADED (and to WARNING), with probes every 30 s
/// starting `phase_ds` deciseconds after the onset, throughput probes every 5 min at a random
/// phase, and optionally passive traffic at 10/s. Time moves in 0.1 s steps; a tick every 1 s.
/// With `confirm`, an abnormal probe or throughput outcome is followed by a confirmation
/// `confirm_after` (5 s, a sixth of the interval) after it completed, as the scheduler does
/// for the health service: at most `degraded_after` between two grid probes, none when the
/// grid probe comes first.
fn detect(
    cfg: &DetectionConfig,
    fault: Fault,
    passive: bool,
    confirm: bool,
    phase_ds: i64,
    seed: u64,
) -> (f64, f64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (det, mut h, mut b, start) = warmed(cfg, &mut rng);
    let r = h.route().clone();
    let (mut warn, mut degr) = (f64::NAN, f64::NAN);
    let tp_phase_ds: i64 = rng.gen_range(0..3000);
    let mut ds: i64 = 0;
    let mut pending: Option<(OutcomeKind, i64)> = None;
    let mut confirmed = 0u32;
    while ds < 36_000 && degr.is_nan() {
        let s = ds as f64 / 10.0;
        let now = at(start + s);
        let mut events: Vec<ProbeOutcome> = Vec::new();
        if let Some((kind, _)) = pending.filter(|(_, due)| *due == ds) {
            pending = None;
            confirmed += 1;
            events.push(faulty(&r, kind, fault, now, &mut rng));
        }
        if ds >= phase_ds && (ds - phase_ds) % 300 == 0 {
            confirmed = 0;
            pending = None;
            let o = probe(&r, now, lognormal(&mut rng, 1100.0, 0.1));
            events.push(match fault {
                Fault::HardOutage => fail(o),
                Fault::LatencySpike => probe(&r, now, lognormal(&mut rng, 13_000.0, 0.1)),
                // 3 tokens at 8 tokens/s instead of 50: ~300 ms more, first byte still fast.
                Fault::SoftRateLimit => probe(&r, now, o.total_ms + 300.0),
            });
        }
        if ds >= tp_phase_ds && (ds - tp_phase_ds) % 3000 == 0 {
            let o = with_tps(outcome(&r, OutcomeKind::Throughput, now), 50.0);
            events.push(match fault {
                Fault::HardOutage => fail(o),
                Fault::LatencySpike => o,
                Fault::SoftRateLimit => with_tps(o, 8.0),
            });
        }
        if passive {
            let o = outcome(&r, OutcomeKind::Passive, now);
            events.push(match fault {
                Fault::HardOutage => fail(o),
                Fault::LatencySpike => o,
                Fault::SoftRateLimit => with_tps(o, 8.0),
            });
        }
        let mut ts = Vec::new();
        for o in &events {
            ts.extend(det.ingest(&mut h, &mut b, o, now));
            if !confirm || pending.is_some() || confirmed >= cfg.degraded_after {
                continue;
            }
            if let Some(kind) = confirm::confirmation(&h, o, cfg) {
                let due = ds + ((o.total_ms / 1000.0 + CONFIRM_AFTER_S) * 10.0).round() as i64;
                let next_grid = if ds < phase_ds {
                    phase_ds
                } else {
                    phase_ds + ((ds - phase_ds) / 300 + 1) * 300
                };
                if due < next_grid {
                    pending = Some((kind, due));
                }
            }
        }
        if ds % 10 == 0 {
            ts.extend(det.tick(&mut h, now));
        }
        for t in ts {
            if t.to == State::Warning && warn.is_nan() {
                warn = s;
            }
            if t.to >= State::Degraded && degr.is_nan() {
                degr = s;
                if warn.is_nan() {
                    warn = s;
                }
            }
        }
        ds += 1;
    }
    (warn, degr)
}

fn mttd(cfg: &DetectionConfig) {
    println!("mean time to detect (onset → DEGRADED; WARNING in brackets), 30 s probes, throughput probe every 5 min, 12 onsets spread over the probe interval:");
    for (name, fault) in [
        ("hard outage (503)", Fault::HardOutage),
        ("latency spike (1.1 s → 13 s)", Fault::LatencySpike),
        ("soft rate limit (50 → 8 tokens/s)", Fault::SoftRateLimit),
    ] {
        for (passive, confirm) in [(false, false), (false, true), (true, false), (true, true)] {
            let runs: Vec<(f64, f64)> = (0..12)
                .map(|k| detect(cfg, fault, passive, confirm, 25 * k as i64, 100 + k))
                .collect();
            let mean = |f: &dyn Fn(&(f64, f64)) -> f64| {
                runs.iter().map(f).sum::<f64>() / runs.len() as f64
            };
            let d = mean(&|x| x.1);
            let w = mean(&|x| x.0);
            println!(
                "  {name:<36} {:<16} {:<15} {:>7.1} s = {:>5.2} probe intervals  [WARNING {:>6.1} s]",
                if passive {
                    "+ passive 10/s"
                } else {
                    "probes only"
                },
                if confirm {
                    "confirmations"
                } else {
                    "grid only"
                },
                d,
                d / 30.0,
                w
            );
        }
    }
}

/// A healthy, jittery route for a day after a day of warm-up; with `confirm`, every
/// confirmation detection asks for is another draw from the same healthy distribution
/// (`CONFIRM_AFTER_S` later, at most `degraded_after` before the next grid probe). Returns
/// (WARNING/day, DEGRADED/day, confirmation probes/day) over `days` days.
fn healthy_days(cfg: &DetectionConfig, sigma: f64, confirm: bool, days: u64) -> (f64, f64, f64) {
    let r = RouteId::new("qwen", "cn", "qwen-max");
    let (mut w, mut d, mut extra) = (0, 0, 0);
    for seed in 0..days {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1000 + seed);
        let det = Detector::new(cfg);
        let mut h = det.route(r.clone(), at(0.0));
        let mut b = Baseline::new(r.clone(), cfg);
        for i in 0..2880 * 2 {
            let mut now_s = 30.0 * i as f64;
            let mut confirmations = 0;
            loop {
                let now = at(now_s);
                let o = probe(&r, now, lognormal(&mut rng, 1100.0, sigma));
                let o = if rng.gen_bool(0.001) { fail(o) } else { o };
                let t = det.ingest(&mut h, &mut b, &o, now);
                // The first day only warms the baselines up.
                if i >= 2880 {
                    match t.map(|t| t.to) {
                        Some(State::Warning) => w += 1,
                        Some(State::Degraded) => d += 1,
                        _ => {}
                    }
                }
                let next = now_s + o.total_ms / 1000.0 + CONFIRM_AFTER_S;
                let again = confirm
                    && confirmations < cfg.degraded_after
                    && next < 30.0 * (i + 1) as f64
                    && confirm::confirmation(&h, &o, cfg).is_some();
                if !again {
                    break;
                }
                confirmations += 1;
                if i >= 2880 {
                    extra += 1;
                }
                now_s = next;
            }
        }
    }
    let per_day = |x: u64| x as f64 / days as f64;
    (per_day(w), per_day(d), per_day(extra))
}

fn false_alarms(cfg: &DetectionConfig) {
    let days = 10;
    for sigma in [0.1, 0.15, 0.2] {
        for confirm in [false, true] {
            let (w, d, extra) = healthy_days(cfg, sigma, confirm, days);
            println!(
                "false transitions, healthy route, log-normal σ={sigma}, 0.1% failures, {}: {w:.1} WARNING/day, {d:.2} DEGRADED/day, {extra:.1} confirmation probes/day (mean of {days} days)",
                if confirm { "confirmations" } else { "grid only" }
            );
        }
    }
}

/// Bytes malloc has handed out and not had back (glibc).
fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads malloc's counters.
    let m = unsafe { libc::mallinfo2() };
    m.uordblks + m.hblkhd
}

/// What 10,000 routes' baselines hold after a day at a 30 s interval (every hour bucket full),
/// measured as the heap they take, for a non-streaming probe (latency only) and a streaming
/// one (latency and first token, tokens/s every 5 minutes).
fn day_at_scale(cfg: &DetectionConfig) {
    const ROUTES: usize = 10_000;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    println!("baselines of {ROUTES} routes after a day (heap in use, from malloc):");
    for streaming in [false, true] {
        let r = RouteId::new("qwen", "cn", "qwen-max");
        let mut b = Baseline::new(r.clone(), cfg);
        let mut s = 0.0;
        while s < 86_400.0 {
            let mut o = probe(&r, at(s), lognormal(&mut rng, 1100.0, 0.1));
            if !streaming {
                o.ttfb_ms = None;
                o.ttft_ms = None;
            }
            b.record(&o);
            if streaming && (s as u64) % 300 == 0 {
                let tp = with_tps(outcome(&r, OutcomeKind::Throughput, at(s + 5.0)), 50.0);
                b.record(&tp);
            }
            s += 30.0;
        }
        let before = heap_in_use();
        let all: Vec<Baseline> = (0..ROUTES).map(|_| b.clone()).collect();
        let bytes = heap_in_use().saturating_sub(before);
        println!(
            "  {:<13} {:>6.1} MB ({} bytes a route; approx_bytes says {})",
            if streaming {
                "streaming:"
            } else {
                "non-streaming:"
            },
            bytes as f64 / 1e6,
            bytes / ROUTES,
            b.approx_bytes()
        );
        black_box(all);
    }
}

fn main() {
    probeok::malloc::tune();
    let cfg = DetectionConfig::default();
    day_at_scale(&cfg);
    cost(&cfg);
    mttd(&cfg);
    false_alarms(&cfg);
}
