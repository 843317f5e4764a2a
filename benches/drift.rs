//! Drift figures, simulated through the real comparison code ([`History`]):
//!
//! 1. runs needed to detect a format change that breaks 30 % of a set's cases;
//! 2. false findings over 1,000 simulated stable runs (flaky cases, noisy lengths);
//! 3. the token cost of each shipped set per run.
//!
//! `CARGO_TARGET_DIR=/work/target cargo bench --bench drift` (seeded: the figures repeat).

use std::path::Path;

use chrono::{TimeZone, Utc};
use probeok::drift::{self, CaseResult, CompareOptions, DriftKind, History, SetRun};
use probeok::probe::measure::estimate_tokens;
use probeok::route::RouteId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Per-case chance that a healthy route fails anyway (a flaky case at temperature 0).
const FLAKE: f64 = 0.02;

struct Sim {
    rng: StdRng,
    cases: usize,
    /// Each case's usual answer length.
    lengths: Vec<f64>,
}

impl Sim {
    fn new(seed: u64, cases: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let lengths = (0..cases).map(|_| rng.gen_range(2.0..80.0)).collect();
        Self {
            rng,
            cases,
            lengths,
        }
    }

    /// One run: `broken(case)` says whether the change breaks that case this run.
    fn run(&mut self, i: usize, flake: f64, broken: &dyn Fn(usize, &mut StdRng) -> bool) -> SetRun {
        let cases = (0..self.cases)
            .map(|c| {
                let bad = broken(c, &mut self.rng) || self.rng.gen_bool(flake);
                // ±10 % length noise around the case's usual length.
                let len = self.lengths[c] * self.rng.gen_range(0.9..1.1);
                CaseResult {
                    case: format!("c{c}"),
                    passed: Some(!bad),
                    failures: Vec::new(),
                    output_chars: len.round() as u32,
                    latency_ms: 500.0,
                    output_tokens: None,
                    model_reported: Some("m".into()),
                    system_fingerprint: None,
                    error: None,
                    output: String::new(),
                }
            })
            .collect();
        SetRun {
            route: RouteId::new("p", "r", "m"),
            set: "s".into(),
            started_at: Utc
                .timestamp_opt(1_700_000_000 + i as i64 * 3600, 0)
                .unwrap(),
            cases,
        }
    }
}

fn drifting(h: &History) -> bool {
    h.findings()
        .iter()
        .any(|f| f.kind != DriftKind::ModelChanged)
}

/// Runs after the change until a drift finding; `None` within `limit` runs.
fn detect(seed: u64, cases: usize, warmup: usize, limit: usize, random: bool) -> Option<usize> {
    let mut sim = Sim::new(seed, cases);
    let mut h = History::new(CompareOptions::default());
    let ok = |_: usize, _: &mut StdRng| false;
    for i in 0..warmup {
        h.ingest(sim.run(i, FLAKE, &ok));
    }
    // 30 % of the cases break: at temperature 0 the same ones every run ("fixed"), or —
    // pessimistically — each case independently with p = 0.3 every run ("random").
    let fixed_n = ((cases as f64) * 0.3).round() as usize;
    let broken = move |c: usize, rng: &mut StdRng| {
        if random {
            rng.gen_bool(0.3)
        } else {
            c < fixed_n
        }
    };
    for k in 1..=limit {
        h.ingest(sim.run(warmup + k, FLAKE, &broken));
        if drifting(&h) {
            return Some(k);
        }
    }
    None
}

fn percentile(v: &mut [usize], p: f64) -> usize {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn detection_figures() {
    println!("1. Runs after the change until a drift finding (30 % of cases break; 2 % flaky cases; baseline 24 runs)");
    println!(
        "   {:<8} {:<7} {:>8} {:>6} {:>6} {:>6} {:>10}",
        "mode", "cases", "trials", "p50", "p95", "max", "missed@20"
    );
    for random in [false, true] {
        for cases in [4usize, 6, 10] {
            let trials = 1000;
            let mut found = Vec::new();
            let mut missed = 0;
            for t in 0..trials {
                match detect(1000 + t, cases, 24, 20, random) {
                    Some(k) => found.push(k),
                    None => missed += 1,
                }
            }
            let (p50, p95, max) = if found.is_empty() {
                (0, 0, 0)
            } else {
                let mut f = found.clone();
                (
                    percentile(&mut f, 0.5),
                    percentile(&mut f, 0.95),
                    *found.iter().max().unwrap_or(&0),
                )
            };
            println!(
                "   {:<8} {:<7} {:>8} {:>6} {:>6} {:>6} {:>10}",
                if random { "random" } else { "fixed" },
                cases,
                trials,
                p50,
                p95,
                max,
                missed
            );
        }
    }
}

fn false_findings() {
    println!();
    println!(
        "2. False findings over simulated stable runs (drift findings opened; ±10 % length noise)"
    );
    println!(
        "   {:<7} {:<7} {:>10} {:>14} {:>18}",
        "cases", "flaky", "runs", "findings", "per 1,000 runs"
    );
    for (cases, flake) in [(6usize, 0.02), (6, 0.05), (10, 0.05), (4, 0.10)] {
        let pairs = 20u64;
        let runs_each = 1000;
        let mut opened = 0;
        for p in 0..pairs {
            let mut sim = Sim::new(50_000 + p, cases);
            let mut h = History::new(CompareOptions::default());
            let ok = |_: usize, _: &mut StdRng| false;
            let mut was = false;
            for i in 0..runs_each {
                h.ingest(sim.run(i, flake, &ok));
                let now = drifting(&h);
                if now && !was {
                    opened += 1;
                }
                was = now;
            }
        }
        let total = pairs as usize * runs_each;
        println!(
            "   {:<7} {:<7} {:>10} {:>14} {:>18.3}",
            cases,
            format!("{:.0} %", flake * 100.0),
            total,
            opened,
            opened as f64 * 1000.0 / total as f64
        );
    }
}

fn token_costs() {
    println!();
    println!("3. Token cost of each shipped set per run (estimate: ~4 tokens framing per message + 3 per request; output = the known-good example + 1)");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("probes");
    let sets = match drift::load_dir(&dir) {
        Ok(s) => s,
        Err(e) => {
            println!("   cannot load {}: {e}", dir.display());
            return;
        }
    };
    println!(
        "   {:<14} {:>5} {:>7} {:>12} {:>12} {:>9} {:>16}",
        "set", "cases", "every", "input tok", "output tok", "out max", "CNY/day @2.4/9.6"
    );
    for s in &sets {
        let input: u32 = s
            .cases
            .iter()
            .map(|c| {
                3 + c
                    .messages
                    .iter()
                    .map(|m| 4 + estimate_tokens(&m.content))
                    .sum::<u32>()
            })
            .sum();
        let output: u32 = s
            .cases
            .iter()
            .map(|c| {
                1 + c
                    .example
                    .as_deref()
                    .map_or(s.params.max_tokens, estimate_tokens)
            })
            .sum();
        let bound = s.params.max_tokens * s.cases.len() as u32;
        let runs_per_day = 86_400.0 / s.every.as_secs_f64();
        let cny = (f64::from(input) * 2.4 + f64::from(output) * 9.6) / 1e6 * runs_per_day;
        println!(
            "   {:<14} {:>5} {:>7} {:>12} {:>12} {:>9} {:>16.4}",
            s.name,
            s.cases.len(),
            humantime::format_duration(s.every).to_string(),
            input,
            output,
            bound,
            cny
        );
    }
}

fn main() {
    // `cargo test --benches` runs this too; keep it to the quick part then.
    if std::env::args().any(|a| a == "--test") {
        token_costs();
        return;
    }
    let start = std::time::Instant::now();
    detection_figures();
    false_findings();
    token_costs();
    println!("\n(done in {:.1} s)", start.elapsed().as_secs_f64());
}
