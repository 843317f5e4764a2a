//! Status page benchmark at 1,000 routes × 90 days: `/` render time (view model + askama) with
//! the store figures cached (what a request pays within the 5 s figure cache), the same with
//! the store read first (a cold cache: `Figures::load` beside `PageData::load` and the days
//! before today's and the long windows' reads, as a first `GET /` after a start would if they
//! were not kept), a refresh (the read once the figures expired, the days before today and the
//! long windows kept from the keepers' reads), and the page weight.
//! `CARGO_TARGET_DIR=/work/target cargo bench --bench pages`
//!
//! Store contents: for every route, 90 days of 4 probes a day (daily and hourly rollups), plus
//! the last hour every 5 minutes — about 372,000 outcomes, written in time order as a monitor
//! writes them. Routes are in mixed states.

use std::sync::Arc;
use std::time::Instant;

use askama::Template;
use chrono::{DateTime, Duration as D, Utc};
use probeok::config::Config;
use probeok::health::{BaselineSnapshot, HealthSnapshot, Reason, RouteStatus, State};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::store::{Store, StoreOptions};
use probeok::web::api::Figures;
use probeok::web::i18n::Lang;
use probeok::web::pages::{status_page, ErrorBudgetSource, PageData, PastBars};
use probeok::web::windows::KeptWindows;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[path = "shared/fleet.rs"]
mod fleet;

const ROUTES: usize = 1000;
const WARM_RUNS: usize = 60;
const COLD_RUNS: usize = 15;

fn config(db: &std::path::Path) -> Config {
    fleet::config(db, ROUTES, |_| 50)
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * q).ceil() as usize)
        .saturating_sub(1)
        .min(v.len() - 1)]
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("pages.db");
    let config = config(&db);
    let routes = config.routes();
    let store = Store::open(&db, StoreOptions::default()).expect("store");
    let now: DateTime<Utc> = DateTime::parse_from_rfc3339("2026-05-20T12:00:00Z")
        .expect("time")
        .with_timezone(&Utc);
    let mut rng = StdRng::seed_from_u64(7);

    let started = Instant::now();
    let mut all = Vec::with_capacity(ROUTES * 372);
    for r in &routes {
        let mut push = |at: DateTime<Utc>, rng: &mut StdRng| {
            let ok = !rng.gen_ratio(1, 60);
            let ms = rng.gen_range(300.0..1800.0);
            all.push(ProbeOutcome {
                route: r.id.clone(),
                kind: OutcomeKind::Probe,
                started_at: at,
                success: ok,
                attributed_to: None,
                verified: ok.then_some(true),
                ttfb_ms: Some(ms * 0.3),
                ttft_ms: Some(ms * 0.5),
                total_ms: ms,
                output_tokens: Some(3),
                tokens_estimated: false,
                tokens_per_second: None,
                model_reported: Some("model".into()),
                system_fingerprint: None,
                http_status: Some(if ok { 200 } else { 503 }),
                error: (!ok).then(|| ProbeError::Http {
                    status: 503,
                    message: "busy".into(),
                }),
                answer: None,
                first_answer_ms: None,
                max_tokens_exhausted: false,
                ratelimit: None,
            });
        };
        for d in 0..90 {
            for k in 0..4 {
                push(now - D::days(d) - D::hours(2 + 5 * k), &mut rng);
            }
        }
        for m in 0..12 {
            push(now - D::minutes(5 * m) - D::seconds(10), &mut rng);
        }
    }
    // In the order a monitor writes them: as they happen, every route's interleaved.
    all.sort_by_key(|o| o.started_at);
    let total = all.len();
    for chunk in all.chunks(15_000) {
        store
            .writer()
            .record_many(chunk.to_vec())
            .await
            .expect("record");
    }
    eprintln!(
        "filled {total} outcomes for {ROUTES} routes in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let states = [
        State::Normal,
        State::Normal,
        State::Normal,
        State::Warning,
        State::Degraded,
        State::Critical,
        State::Switched,
        State::Unknown,
    ];
    let health = HealthSnapshot {
        generated_at: now,
        routes: routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let state = states[i % states.len()];
                RouteStatus {
                    route: r.id.clone(),
                    state,
                    judged: state,
                    since: now - D::minutes(i as i64 % 300),
                    reason: (state != State::Normal)
                        .then(|| Reason::new("latency_above_baseline", "p95 above the baseline")),
                    failure_mode: None,
                    baseline: Some(BaselineSnapshot {
                        bucket: "12:00-13:00".into(),
                        samples: 100,
                        mean_ms: 1100.0,
                        stddev_ms: 300.0,
                        p50_ms: 1000.0,
                        p95_ms: 1700.0,
                        p99_ms: 1900.0,
                        ttft_samples: 100,
                        ttft_mean_ms: Some(400.0),
                        ttft_p50_ms: Some(380.0),
                        ttft_p95_ms: Some(600.0),
                        ttft_p99_ms: Some(700.0),
                        tps_samples: 10,
                        tps_mean: Some(40.0),
                    }),
                    success_ratio: Some(0.99),
                    success_judged: true,
                    behavior_changed: false,
                    incident: None,
                    split: Default::default(),
                    cause: None,
                }
            })
            .collect(),
        findings: Vec::new(),
    };

    // As `GET /` reads them when both are due: side by side, each on its own connection.
    // The days before today and the long windows: read by the service's own tasks
    // ([`PastBars`], [`KeptWindows`]), kept between.
    let load = |kept: Option<(&Arc<PastBars>, &KeptWindows)>| {
        let (past, windows) = match kept {
            Some((p, _)) => (p.clone(), None),
            None => {
                let p = Arc::new(PastBars::default());
                p.read(&store, now).expect("past days");
                let w = KeptWindows::read(&store.reader().expect("reader"), now).expect("windows");
                (p, Some(w))
            }
        };
        let kept_windows = kept.map(|(_, w)| w);
        std::thread::scope(|s| {
            let figures = s.spawn(|| {
                let r = store.reader().expect("reader");
                match kept_windows {
                    Some(w) => Figures::load_kept(&r, now, Some(w)),
                    None => Figures::load(&r, now),
                }
                .expect("figures")
            });
            let data = PageData::load(
                &store.reader().expect("reader"),
                now,
                ErrorBudgetSource::from_config(&config),
                &past,
                kept_windows.or(windows.as_ref()),
            )
            .expect("page data");
            (figures.join().expect("figures thread"), data)
        })
    };
    let render = |lang: Lang, figures: &Figures, data: &PageData| {
        status_page(
            lang,
            "LLM provider status",
            &routes,
            &config.maintenance,
            &health,
            figures,
            data,
            Default::default(),
            now,
        )
        .render()
        .expect("render")
    };

    let kept = Arc::new(PastBars::default());
    kept.read(&store, now).expect("past days");
    let kept_windows = KeptWindows::read(&store.reader().expect("reader"), now).expect("windows");
    let (figures, data) = load(Some((&kept, &kept_windows)));
    let bars: usize = routes.iter().map(|r| data.days_of(&r.id).len()).sum();
    eprintln!("daily rollups read: {bars} route-days");
    let mut weight = 0;
    let mut warm = Vec::new();
    for i in 0..WARM_RUNS {
        let lang = if i % 2 == 0 { Lang::En } else { Lang::Zh };
        let t = Instant::now();
        let body = render(lang, &figures, &data);
        warm.push(t.elapsed().as_secs_f64() * 1000.0);
        if lang == Lang::En {
            weight = body.len();
        }
    }
    let mut cold = Vec::new();
    for _ in 0..COLD_RUNS {
        let t = Instant::now();
        let (figures, data) = load(None);
        let _ = render(Lang::En, &figures, &data);
        cold.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    // What a refresh reads once the figures expired: the days before today and the long
    // windows are reused.
    let mut refresh = Vec::new();
    for _ in 0..COLD_RUNS {
        let t = Instant::now();
        let (figures, next) = load(Some((&kept, &kept_windows)));
        let _ = render(Lang::En, &figures, &next);
        refresh.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!("/ at {ROUTES} routes x 90 days");
    println!(
        "  render (figures cached):      p50 {:.1} ms  p95 {:.1} ms  ({WARM_RUNS} runs)",
        pct(&mut warm, 0.5),
        pct(&mut warm, 0.95)
    );
    println!(
        "  store read + render (cold):   p50 {:.1} ms  p95 {:.1} ms  ({COLD_RUNS} runs)",
        pct(&mut cold, 0.5),
        pct(&mut cold, 0.95)
    );
    println!(
        "  refresh + render (past days, windows kept): p50 {:.1} ms  p95 {:.1} ms  ({COLD_RUNS} runs)",
        pct(&mut refresh, 0.5),
        pct(&mut refresh, 0.95)
    );
    println!(
        "  page weight (en): {weight} bytes ({:.0} bytes per route)",
        weight as f64 / ROUTES as f64
    );
    store.close().await.expect("close");
}
