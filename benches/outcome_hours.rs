//! Disk per outcome, raw and packed, and what packing costs:
//! `cargo bench --bench outcome_hours` (`BENCH_ROUTES`, 1,000 by default; `BENCH_HOURS`, 24).
//!
//! Writes ROUTES × HOURS of probe history through the store's writer (every 30 s a route, as
//! the monitor does: sub-millisecond latencies spread like real ones, one failure in 40, the
//! provider's model and fingerprint strings, the answer), then packs the closed hours with
//! the writer's own packing, then writes and packs the same again (the file reuses the pages
//! packing freed, as at steady state). Prints the write and packing rates and, by `dbstat`,
//! the bytes per outcome of the raw table and its indexes before packing and of the packed
//! hours after, the rollups' rows and bytes, and the file's size.
//!
//! With `BENCH_PG_URL` (an empty PostgreSQL database) the store is there instead, and the
//! bytes are PostgreSQL's own (`pg_total_relation_size`: heap, TOAST and indexes): the raw
//! day partitions before packing, the packed hours after, and what the partitions still hold
//! (their deleted rows' pages, until packing drops the day).

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;
use probeok::store::sql::{Connection, Engine, PgUrl};
use probeok::store::{Store, StoreLocation, StoreOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn outcome(route: &RouteId, at: DateTime<Utc>, rng: &mut StdRng) -> ProbeOutcome {
    // A log-normal-ish spread around ~600 ms with a slow tail, measured to the nanosecond.
    let total_ms = 250.0 * (1.0 + rng.gen::<f64>().powi(2) * 3.0) + rng.gen::<f64>() * 80.0;
    let ok = !rng.gen_ratio(1, 40);
    ProbeOutcome {
        route: route.clone(),
        kind: OutcomeKind::Probe,
        started_at: at,
        success: ok,
        attributed_to: None,
        verified: ok.then_some(true),
        ttfb_ms: Some(total_ms * rng.gen_range(0.3..0.5)),
        ttft_ms: ok.then(|| total_ms * rng.gen_range(0.6..0.8)),
        first_answer_ms: ok.then(|| total_ms * rng.gen_range(0.6..0.8)),
        total_ms,
        output_tokens: ok.then_some(3),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: ok.then(|| "qwen-plus-2025-04-28".to_string()),
        system_fingerprint: ok.then(|| "fp_2f9a61c4d8".to_string()),
        http_status: Some(if ok { 200 } else { 503 }),
        error: (!ok).then(|| ProbeError::Http {
            status: 503,
            message: "The server is overloaded, please try again later.".into(),
        }),
        answer: ok.then(|| "PROBE_OK".to_string()),
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

/// Bytes of the tables named like `like` and of their indexes.
fn bytes_of(conn: &Connection, like: &str) -> u64 {
    let sql = match conn.engine() {
        Engine::Sqlite => "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name LIKE ?1",
        // Tables only (an index's size is in its table's total), partitions included.
        Engine::Postgres => {
            "SELECT CAST(COALESCE(SUM(pg_total_relation_size(c.oid)), 0) AS BIGINT)
             FROM pg_class c WHERE c.relname LIKE ?1 AND c.relkind = 'r'"
        }
    };
    conn.query_row(sql, [like], |r| r.get::<_, i64>(0))
        .unwrap_or(0) as u64
}

/// The database's size and the part of it free for new rows (SQLite: the free pages; on
/// PostgreSQL the database's size only).
fn file_of(conn: &Connection) -> (i64, Option<i64>) {
    if conn.engine() == Engine::Postgres {
        let size = conn
            .query_row(
                "SELECT CAST(pg_database_size(current_database()) AS BIGINT)",
                [],
                |r| r.get(0),
            )
            .unwrap();
        return (size, None);
    }
    let pragma = |p: &str| -> i64 { conn.query_row(p, [], |r| r.get(0)).unwrap() };
    let page = pragma("PRAGMA page_size");
    (
        pragma("PRAGMA page_count") * page,
        Some(pragma("PRAGMA freelist_count") * page),
    )
}

async fn write(
    store: &Store,
    routes: &[RouteId],
    from: DateTime<Utc>,
    hours: usize,
    rng: &mut StdRng,
) -> (u64, Duration) {
    let t = Instant::now();
    let mut n = 0u64;
    for tick in 0..hours * 120 {
        let at = from + chrono::Duration::seconds(tick as i64 * 30);
        let batch: Vec<ProbeOutcome> = routes
            .iter()
            .enumerate()
            .map(|(j, r)| {
                let at = at + chrono::Duration::milliseconds((j % 1000) as i64);
                outcome(r, at, rng)
            })
            .collect();
        n += batch.len() as u64;
        for chunk in batch.chunks(2000) {
            store.writer().record_many(chunk.to_vec()).await.unwrap();
        }
    }
    (n, t.elapsed())
}

#[tokio::main]
async fn main() {
    let routes_n = env("BENCH_ROUTES", 1000);
    let hours = env("BENCH_HOURS", 24);
    let dir = tempfile::tempdir().unwrap();
    let location = match std::env::var("BENCH_PG_URL") {
        Ok(url) => StoreLocation::Postgres(PgUrl::parse(&url).expect("a postgres:// URL").unwrap()),
        Err(_) => StoreLocation::Sqlite(dir.path().join("probeok.db")),
    };
    let store = Store::open_at(&location, StoreOptions::default()).unwrap();
    let routes: Vec<RouteId> = (0..routes_n)
        .map(|i| RouteId::new("qwen", "cn-beijing", &format!("qwen-plus-{i:05}")))
        .collect();
    let mut rng = StdRng::seed_from_u64(1);
    let from = Utc.with_ymd_and_hms(2026, 6, 1, 0, 0, 0).unwrap();
    println!(
        "load: {} on {} cores",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split(' ')
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let conn = location.connect().unwrap();
    let mut outcomes = 0;
    for round in 0..2 {
        let start = from + chrono::Duration::hours((round * hours) as i64);
        let (n, took) = write(&store, &routes, start, hours, &mut rng).await;
        outcomes += n;
        let raw = bytes_of(&conn, "outcomes%");
        println!(
            "round {}: {n} outcomes ({routes_n} routes × {hours} h) written in {:.1} s, {:.0} a second; raw table and indexes {:.1} B an outcome",
            round + 1,
            took.as_secs_f64(),
            n as f64 / took.as_secs_f64(),
            raw as f64 / n as f64
        );
        // An hour after the last hour closed: every hour written is packed.
        let now = start + chrono::Duration::hours(hours as i64 + 1);
        let t = Instant::now();
        let packed = store.writer().pack(now).await.unwrap();
        let took = t.elapsed();
        let (size, free) = file_of(&conn);
        let hours_bytes = bytes_of(&conn, "outcome_hours%");
        let rollup_rows: i64 = conn
            .query_row(
                "SELECT count(*) FROM rollups WHERE granularity_s = 3600",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let five_rows: i64 = conn
            .query_row(
                "SELECT count(*) FROM rollups WHERE granularity_s = 300",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let all_rollups: i64 = conn
            .query_row("SELECT count(*) FROM rollups", [], |r| r.get(0))
            .unwrap();
        let rollup_bytes = bytes_of(&conn, "rollups%");
        println!(
            "  rollups: {all_rollups} rows ({rollup_rows} hourly, {five_rows} of 5 minutes), {:.0} B a row with its route index",
            rollup_bytes as f64 / all_rollups.max(1) as f64
        );
        let raw_left = bytes_of(&conn, "outcomes%");
        println!(
            "  packed {packed} outcomes in {:.1} s, {:.0} a second; packed hours {:.1} B an outcome \
             (of {outcomes} stored), raw table and indexes left {:.1} MB; database {:.1} MB{}",
            took.as_secs_f64(),
            packed as f64 / took.as_secs_f64(),
            hours_bytes as f64 / outcomes as f64,
            raw_left as f64 / 1e6,
            size as f64 / 1e6,
            free.map_or(String::new(), |f| format!(", {:.1} MB of it free pages", f as f64 / 1e6)),
        );
    }
    store.close().await.unwrap();
}
