//! The quorum's per-second recompute at scale: 10,000 routes, each probed from three
//! vantages (the monitor's own and two agents), as the detection loop does it every second —
//! every vantage machine ticks and agents' freshness is checked ([`Board::tick`]), then every
//! route's quorum is judged and noted ([`Board::verdict`], [`Board::note`]); the findings
//! (`vantage_local`, `vantage_stale`) are computed once after it, as when one changed.
//!
//! Pure computation, explicit time, no I/O. Prints the median (and min–max) of the runs; the
//! per-second budget is one second, so the figure is also the share of a core it takes.
//! `cargo bench --bench quorum`

use std::hint::black_box;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use probeok::health::vantages::Board;
use probeok::health::Detector;
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;

const ROUTES: usize = 10_000;
const AGENTS: [&str; 2] = ["cn-beijing", "cn-shanghai"];
const RUNS: usize = 15;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0)
        .single()
        .unwrap_or_default()
}

fn config() -> probeok::config::Config {
    let mut src = String::from(
        "[server]\nvantage = \"cn-hangzhou\"\n[quorum]\nmin_vantages = 2\n\
         [[provider]]\nid = \"qwen\"\nkind = \"openai\"\n  [[provider.region]]\n  id = \"cn\"\n  base_url = \"http://127.0.0.1:9/v1\"\n",
    );
    for a in AGENTS {
        src += &format!("[[vantage]]\nid = \"{a}\"\nstale_after = \"2m\"\n");
    }
    for i in 0..ROUTES {
        src += &format!(
            "[[route]]\nprovider = \"qwen\"\nregion = \"cn\"\nmodel = \"qwen-{i:05}\"\nserves = \"m-{:03}\"\n",
            i % 100
        );
    }
    match probeok::config::Config::parse(&src, "quorum.toml") {
        Ok(p) => p.config,
        Err(e) => panic!("{e}"),
    }
}

fn outcome(route: &RouteId, ok: bool, at: DateTime<Utc>) -> ProbeOutcome {
    ProbeOutcome {
        route: route.clone(),
        kind: OutcomeKind::Probe,
        started_at: at,
        success: ok,
        attributed_to: None,
        verified: ok.then_some(true),
        ttfb_ms: Some(150.0),
        ttft_ms: Some(300.0),
        first_answer_ms: Some(300.0),
        total_ms: 900.0,
        output_tokens: Some(3),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: Some(if ok { 200 } else { 503 }),
        error: (!ok).then(|| ProbeError::Http {
            status: 503,
            message: "busy".into(),
        }),
        answer: ok.then(|| "PROBE_OK".into()),
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

fn main() {
    let config = config();
    let detector = Detector::new(&config.detection);
    let ids: Vec<RouteId> = config.routes().into_iter().map(|r| r.id).collect();
    let mut board = Board::new(&config, &detector, Default::default(), t0());
    // A few minutes of probes from every vantage; one agent sees 1% of the routes failing
    // alone, so the quorum has real disagreements to judge.
    let mut baselines: Vec<probeok::health::Baseline> = ids
        .iter()
        .map(|id| probeok::health::Baseline::new(id.clone(), detector.config()))
        .collect();
    let mut now = t0();
    for round in 0..10 {
        now = t0() + chrono::Duration::seconds(30 * (round + 1));
        for (i, id) in ids.iter().enumerate() {
            if let Some(local) = board.local_mut(id) {
                let _ = detector.ingest(local, &mut baselines[i], &outcome(id, true, now), now);
            }
            for (a, agent) in AGENTS.iter().enumerate() {
                let ok = !(a == 0 && i % 100 == 7);
                let _ = board.ingest_remote(&detector, agent, &outcome(id, ok, now), now);
            }
        }
    }
    for id in &ids {
        if let Some(v) = board.verdict(id) {
            let _ = board.note(id, &v, true, now);
        }
    }
    println!(
        "probeok quorum benchmark: {ROUTES} routes x {} vantages (min_vantages 2), one core",
        AGENTS.len() + 1
    );
    let mut ticks = Vec::new();
    let mut judge = Vec::new();
    let mut find = Vec::new();
    for run in 0..RUNS {
        let at = now + chrono::Duration::seconds(run as i64 + 1);
        let start = Instant::now();
        black_box(board.tick(&detector, at));
        let ticked = start.elapsed();
        let start = Instant::now();
        let mut moved = 0usize;
        for id in &ids {
            if let Some(v) = board.verdict(id) {
                moved += usize::from(board.note(id, &v, false, at).0.is_some());
            }
        }
        black_box(moved);
        let judged = start.elapsed();
        let start = Instant::now();
        black_box(board.findings(at).len());
        let found = start.elapsed();
        ticks.push(ticked);
        judge.push(judged);
        find.push(found);
    }
    let report = |name: &str, mut v: Vec<Duration>| {
        v.sort();
        println!(
            "{name:<44} {:>9.2} ms  (min {:.2}, max {:.2}, {RUNS} runs)",
            v[v.len() / 2].as_secs_f64() * 1e3,
            v[0].as_secs_f64() * 1e3,
            v[v.len() - 1].as_secs_f64() * 1e3
        );
    };
    let total: Vec<Duration> = (0..RUNS).map(|i| ticks[i] + judge[i] + find[i]).collect();
    report("tick: every vantage machine + freshness", ticks);
    report("verdict + note, every route", judge);
    report("findings (vantage_local, vantage_stale)", find);
    report("one second's recompute, total", total);
}
