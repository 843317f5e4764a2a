//! A monitor with a month of history starts on summaries, not on the history: the whole app
//! in-process on 127.0.0.1:0 (`app::start`, a `ManualClock`) on a SQLite file holding 100
//! routes × 30 days of probes written by the store's own writer. The first start after the
//! history was written has nothing saved and replays it (in the background); it saves the
//! baselines at its stop. The second start reads rows bounded by routes and buckets — counted
//! by the store itself ([`Store::rows_read`]), not timed.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use tokio_util::sync::CancellationToken;

use probeok::app;
use probeok::clock::ManualClock;
use probeok::config::Config;
use probeok::probe::outcome::OutcomeKind;
use probeok::store::{Store, StoreOptions};

use crate::common::app::{config, outcome, Spec};

const ROUTES: usize = 100;
const DAYS: i64 = 30;
/// Probes a route an hour in the written history (every 30 min: the row count matters, not
/// the density).
const PER_HOUR: i64 = 2;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 6, 1, 12, 0, 0).unwrap()
}

/// Starts the app, waits until no baseline is still warming, and gives the rows the store read
/// meanwhile; then stops it (which saves the baselines).
async fn start_and_stop(cfg: &Config, clock: Arc<ManualClock>) -> u64 {
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::start(cfg.clone(), listener, clock, shutdown.clone())
        .await
        .unwrap();
    let url = format!("http://{}/readyz", running.addr);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let body = reqwest::get(&url).await.unwrap().text().await.unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if v.get("warming").is_none() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never warm: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rows = running.store.rows_read();
    shutdown.cancel();
    running.done.await.unwrap().unwrap();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_reads_rows_bounded_by_routes_and_buckets_not_by_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("history.db");
    let models: Vec<String> = (0..ROUTES).map(|i| format!("m{i:03}")).collect();
    let specs: Vec<Spec<'_>> = models.iter().map(|m| Spec::new("acme", "us", m)).collect();
    let mut cfg = config(&specs, &db);
    // Probes go to a closed port: they fail and teach the baselines nothing.
    cfg.probe.interval = Duration::from_secs(3600);

    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let (mut written, mut kept) = (0u64, 0u64);
    let lookback = t0() - chrono::Duration::days(cfg.storage.retention_days.into());
    for s in &specs {
        let id = s.id();
        let batch: Vec<_> = (0..DAYS * 24 * PER_HOUR)
            .map(|k| {
                let at =
                    t0() - chrono::Duration::minutes(60 / PER_HOUR * (DAYS * 24 * PER_HOUR - k));
                outcome(
                    &id,
                    OutcomeKind::Probe,
                    at,
                    true,
                    800.0 + (k % 13) as f64 * 10.0,
                )
            })
            .collect();
        written += batch.len() as u64;
        kept += batch.iter().filter(|o| o.started_at >= lookback).count() as u64;
        store.writer().record_many(batch).await.unwrap();
    }
    store.close().await.unwrap();

    let clock = Arc::new(ManualClock::new(t0()));
    let upgrade = start_and_stop(&cfg, clock.clone()).await;
    assert!(
        upgrade >= kept,
        "nothing saved yet: the first start replays the history kept ({upgrade} rows read, {kept} within retention_days)"
    );
    let restart = start_and_stop(&cfg, clock.clone()).await;
    // Per route: a baseline head and 24 hourly buckets, the last 72 hours' hourly rollups (the
    // figures the pages keep warm), the status page's day bars (a daily rollup a day, up to
    // 89) and the long windows (a daily rollup a day of 30, the hours at their edges), both
    // read in the background from the start, its state and a lookup or two: under 200 rows a
    // route, whatever the history's length.
    let bound = (ROUTES * 200) as u64;
    eprintln!("rows read at start: {upgrade} replaying the history, {restart} from the saved state ({written} outcomes stored)");
    assert!(
        restart <= bound,
        "the start read {restart} rows: bounded by routes × buckets ({bound}), not by the {written} outcomes"
    );
}
