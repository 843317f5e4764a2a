//! Detection's start on a stored history: N routes × H hours of 30-second probes written
//! through the store's writer, then `HealthService::restore` timed twice — waiting for every
//! baseline (the start before background warming), and waiting for none (the start now) with
//! the time until every baseline is warm in the background.
//!
//! `cargo bench --bench restore -- [routes] [hours]` (default 1000 routes × 24 hours).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use probeok::clock::ManualClock;
use probeok::config::Config;
use probeok::health::service::{HealthOptions, HealthService};
use probeok::probe::outcome::{OutcomeKind, ProbeOutcome};
use probeok::route::RouteId;
use probeok::store::{Store, StoreOptions};
use tokio::sync::broadcast;

fn config(db: &std::path::Path, routes: usize) -> Config {
    let mut src = format!(
        "[storage]\npath = \"{}\"\nretention_days = 14\n\n[[provider]]\nid = \"p\"\nkind = \"openai\"\n  [[provider.region]]\n  id = \"r\"\n  base_url = \"http://127.0.0.1:9/v1\"\n",
        db.display()
    );
    for i in 0..routes {
        src += &format!(
            "[[route]]\nprovider = \"p\"\nregion = \"r\"\nmodel = \"m{i}\"\nserves = \"chat\"\n"
        );
    }
    Config::parse(&src, "bench.toml")
        .expect("bench config")
        .config
}

fn probe(route: &RouteId, at: DateTime<Utc>, i: u64) -> ProbeOutcome {
    let total_ms = 900.0 + (i % 13) as f64 * 40.0;
    ProbeOutcome {
        route: route.clone(),
        kind: OutcomeKind::Probe,
        started_at: at,
        success: true,
        attributed_to: None,
        verified: Some(true),
        ttfb_ms: Some(150.0),
        ttft_ms: Some(total_ms * 0.6),
        total_ms,
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

async fn restore(config: &Config, store: &Store, now: DateTime<Utc>, wait: Duration) -> (f64, f64) {
    let opts = HealthOptions {
        warm_wait: wait,
        ..HealthOptions::default()
    };
    let warm = opts.warm.clone();
    let t = Instant::now();
    let svc = HealthService::restore(
        config,
        opts,
        store,
        Arc::new(ManualClock::new(now)),
        broadcast::channel(16).0,
    )
    .await
    .expect("restore");
    let returned = t.elapsed().as_secs_f64();
    // The service must run for the background rebuild to be taken in.
    let (tx, inputs) = tokio::sync::mpsc::channel(16);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(svc.run(inputs, shutdown.clone()));
    loop {
        let (done, total) = warm.get();
        if done >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let warm_s = t.elapsed().as_secs_f64();
    // Its shutdown drains the inputs until every sender is gone.
    drop(tx);
    shutdown.cancel();
    let _ = task.await;
    (returned, warm_s)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let routes = args.first().copied().unwrap_or(1000);
    let hours = args.get(1).copied().unwrap_or(24);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("restore.db");
        let config = config(&db, routes);
        let ids: Vec<RouteId> = config.routes().into_iter().map(|r| r.id).collect();
        let store = Store::open(&db, StoreOptions::default()).expect("store");
        let now = Utc::now();
        let per_route = (hours * 120) as u64;
        let t = Instant::now();
        // One interval at a time across the routes, as the recorder writes them.
        for k in 0..per_route {
            let at = now - chrono::Duration::seconds(30 * (per_route - k) as i64);
            let batch = ids.iter().map(|id| probe(id, at, k)).collect();
            store.writer().record_many(batch).await.expect("write");
        }
        let rows = per_route * routes as u64;
        println!(
            "history: {routes} routes × {hours} h = {rows} outcomes written in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let (waited, _) = restore(&config, &store, now, Duration::from_secs(86_400)).await;
        println!("start waiting for every baseline: {waited:.2} s");
        let (returned, warm) = restore(&config, &store, now, Duration::ZERO).await;
        println!(
            "start warming in the background: returned in {returned:.3} s, every baseline warm after {warm:.2} s"
        );
    });
}
