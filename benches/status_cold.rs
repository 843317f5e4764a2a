//! The status page cold, over a real socket, at 1,000 routes × 90 days:
//! `cargo bench --bench status_cold` (`BENCH_STARTS` starts, 15 by default).
//!
//! The store is filled once through the store's writer (rollups as the monitor writes them):
//! for every route, 90 days of 4 probes a day plus the last hour every 5 minutes, about
//! 372,000 outcomes. Then, per start, the database is opened again and a fresh service
//! (`AppState` and `web::router`, on the injected clock) serves it on 127.0.0.1:0:
//!
//! - **first**: the first `GET /` right after the listener is up (nothing read yet: it
//!   answers with the states and starts the last hour's figures' read);
//! - **warm**: 20 requests after it, one after another;
//! - **past TTL**: 6 s later (the shared figures are no longer fresh: the next request
//!   starts their background read) with the clock moved on by 10 minutes and a second (the
//!   days before today and the long windows are due again), 10 requests; **midnight**: 6 s
//!   later again with the clock at 00:00:30 of the next day, 10 requests. Whatever a request
//!   waits for, or competes with, shows in these.
//!
//! Prints p50, p95 and max of each, the page's bytes, the store rows read on average while
//! each kind of request ran (`Store::rows_read`, background reads included: the first
//! request's include the keepers' first reads, which run beside it), and how long after the
//! start the days before today, the long windows (uptimes, budgets) and the last hour's
//! figures (latencies) were read: from then on a page is whole. Not measured here: a request
//! after a quiet spell (10 minutes without one: the figures are no longer kept warm) waits
//! for the last hour's figures' read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Duration as D, Utc};
use probeok::clock::ManualClock;
use probeok::config::Config;
use probeok::health::HealthSnapshot;
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;
use probeok::secret::Secret;
use probeok::store::{Store, StoreOptions};
use probeok::web::{self, AppState, Metrics, SnapshotIncidents};
use probeok::weights;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

#[path = "shared/fleet.rs"]
mod fleet;

const ROUTES: usize = 1000;
const WARM: usize = 20;
const AFTER: usize = 10;
const STALE: Duration = Duration::from_secs(6);

fn config(db: &std::path::Path) -> Config {
    fleet::config(db, ROUTES, |_| 50)
}

fn outcome(route: &RouteId, at: DateTime<Utc>, rng: &mut StdRng) -> ProbeOutcome {
    let ok = !rng.gen_ratio(1, 60);
    let ms = rng.gen_range(300.0..1800.0);
    ProbeOutcome {
        route: route.clone(),
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
    }
}

async fn fill(store: &Store, ids: &[RouteId], now: DateTime<Utc>) -> usize {
    let mut rng = StdRng::seed_from_u64(7);
    let mut all = Vec::with_capacity(ids.len() * 372);
    for id in ids {
        for d in 0..90 {
            for k in 0..4 {
                all.push(outcome(
                    id,
                    now - D::days(d) - D::hours(2 + 5 * k),
                    &mut rng,
                ));
            }
        }
        for m in 0..12 {
            all.push(outcome(
                id,
                now - D::minutes(5 * m) - D::seconds(10),
                &mut rng,
            ));
        }
    }
    // In the order a monitor writes them: as they happen, every route's interleaved.
    all.sort_by_key(|o| o.started_at);
    let n = all.len();
    for chunk in all.chunks(15_000) {
        store
            .writer()
            .record_many(chunk.to_vec())
            .await
            .expect("record");
    }
    n
}

/// p50, p95, max.
fn pct(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).saturating_sub(1)];
    (at(0.5), at(0.95), v[v.len() - 1])
}

struct Timed {
    ms: Vec<f64>,
    rows: u64,
}

impl Timed {
    fn new() -> Self {
        Self {
            ms: Vec::new(),
            rows: 0,
        }
    }

    fn line(self, name: &str) {
        let n = self.ms.len() as u64;
        let (p50, p95, max) = pct(self.ms);
        println!(
            "  {name:<10} p50 {p50:7.1} ms  p95 {p95:7.1} ms  max {max:7.1} ms  ({n} requests, {} rows read each)",
            self.rows / n
        );
    }
}

/// One `GET /` timed, with the rows the store read meanwhile; the body's length.
async fn get(client: &reqwest::Client, url: &str, store: &Store, into: &mut Timed) -> usize {
    let rows = store.rows_read();
    let t = Instant::now();
    let r = client.get(url).send().await.expect("GET /");
    assert_eq!(r.status(), 200);
    let body = r.bytes().await.expect("body");
    into.ms.push(t.elapsed().as_secs_f64() * 1000.0);
    into.rows += store.rows_read() - rows;
    body.len()
}

#[tokio::main]
async fn main() {
    let starts: usize = std::env::var("BENCH_STARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("cold.db");
    let config = config(&db);
    let routes = Arc::new(config.routes());
    let ids: Vec<RouteId> = routes.iter().map(|r| r.id.clone()).collect();
    let now: DateTime<Utc> = DateTime::parse_from_rfc3339("2026-05-20T12:00:00Z")
        .expect("time")
        .with_timezone(&Utc);
    {
        let store = Store::open(&db, StoreOptions::default()).expect("store");
        let t = Instant::now();
        let n = fill(&store, &ids, now).await;
        eprintln!(
            "filled {n} outcomes for {ROUTES} routes in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }

    let (mut first, mut warm, mut ttl, mut midnight) =
        (Timed::new(), Timed::new(), Timed::new(), Timed::new());
    let mut bytes = 0;
    let mut past_read = Vec::new();
    let mut windows_read = Vec::new();
    let mut latest_read = Vec::new();
    let client = reqwest::Client::new();
    for _ in 0..starts {
        let store = Store::open(&db, StoreOptions::default()).expect("store");
        let clock = Arc::new(ManualClock::new(now));
        let shutdown = CancellationToken::new();
        let (_health_tx, health_rx) = watch::channel(Arc::new(HealthSnapshot::initial(&ids, now)));
        let weights_rx = weights::spawn_publisher(
            weights::Feeds::new(routes.clone(), health_rx.clone()),
            shutdown.clone(),
        );
        let (passive_tx, _passive_rx) = mpsc::channel(16);
        let state = AppState {
            config: Arc::new(config.clone()).into(),
            routes: routes.clone(),
            store: store.clone(),
            clock: clock.clone(),
            jobs: Default::default(),
            health: health_rx,
            events: broadcast::channel(16).0,
            passive: passive_tx,
            weights: weights_rx,
            metrics: Arc::new(Metrics::new(&routes)),
            ingest_token: Some(Secret::new("bench")),
            incidents: Arc::new(SnapshotIncidents),
            drift: None,
            drills: None,
            figures: Default::default(),
            guards: Default::default(),
            shutdown: shutdown.clone(),
            vantages: None,
            xds: Default::default(),
        };
        let figures = state.figures.clone();
        let started = Instant::now();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/", listener.local_addr().expect("addr"));
        let until = shutdown.clone();
        let server = tokio::spawn(async move {
            axum::serve(listener, web::router(state))
                .with_graceful_shutdown(until.cancelled_owned())
                .await
        });
        get(&client, &url, &store, &mut first).await;
        // The last hour's figures, read in the background since the first request.
        figures.first_read().await;
        latest_read.push(started.elapsed().as_secs_f64() * 1000.0);
        // The days before today and the long windows, read by their own tasks since the start.
        figures.past().read_after(0).await;
        past_read.push(started.elapsed().as_secs_f64() * 1000.0);
        figures.windows().read_after(0).await;
        windows_read.push(started.elapsed().as_secs_f64() * 1000.0);
        for _ in 0..WARM {
            bytes = get(&client, &url, &store, &mut warm).await;
        }
        // Past the shared figures' 5 s of freshness.
        tokio::time::sleep(STALE).await;
        clock.advance(Duration::from_secs(601));
        for _ in 0..AFTER {
            get(&client, &url, &store, &mut ttl).await;
        }
        tokio::time::sleep(STALE).await;
        clock.set(
            now.date_naive()
                .succ_opt()
                .expect("day")
                .and_hms_opt(0, 0, 30)
                .expect("time")
                .and_utc(),
        );
        for _ in 0..AFTER {
            get(&client, &url, &store, &mut midnight).await;
        }
        shutdown.cancel();
        let _ = server.await;
    }
    println!("GET / at {ROUTES} routes x 90 days, {starts} starts, {bytes} bytes");
    first.line("first");
    warm.line("warm");
    ttl.line("past TTL");
    midnight.line("midnight");
    let (p50, p95, max) = pct(past_read);
    println!(
        "  days before today read {p50:.1} ms after the start (p50; p95 {p95:.1}, max {max:.1})"
    );
    let (p50, p95, max) = pct(windows_read);
    println!("  long windows read {p50:.1} ms after the start (p50; p95 {p95:.1}, max {max:.1})");
    let (p50, p95, max) = pct(latest_read);
    println!(
        "  last hour's figures read {p50:.1} ms after the start (p50; p95 {p95:.1}, max {max:.1})"
    );
}
