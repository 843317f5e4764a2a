//! Store benchmark: insert rate through the batching writer, and size on disk per million
//! outcomes. `cargo bench --bench store`; with `PROBEOK_BENCH_PG_URL=postgres://…` the insert
//! rates are measured on PostgreSQL too, in the same run, with the same outcomes.
//!
//! Every run uses a fresh database: a SQLite file in a temp dir (on the same filesystem as
//! `TMPDIR`), or a new PostgreSQL database on that server (dropped afterwards).
//! Prints the median (and min–max) of several runs (`PROBEOK_BENCH_RUNS`, default 5).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use chrono::{DateTime, Utc};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;
use probeok::store::sql::{Connection, PgUrl};
use probeok::store::{Store, StoreLocation, StoreOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ROUTES: usize = 50;

/// Runs per figure: 5, or `PROBEOK_BENCH_RUNS` (at least 1) on a busy machine.
fn run_count() -> usize {
    std::env::var("PROBEOK_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5usize)
        .max(1)
}

fn routes() -> Vec<RouteId> {
    (0..ROUTES)
        .map(|i| {
            let provider = ["qwen", "deepseek", "zhipu", "moonshot", "openai"][i % 5];
            RouteId::new(
                provider,
                &format!("region-{}", i / 5),
                &format!("{provider}-model-{i}"),
            )
        })
        .collect()
}

/// A probe as the client records it: mostly `PROBE_OK` successes, one in ten a throughput
/// probe with its longer answer, about 2% failures with a bounded upstream message.
fn realistic(rng: &mut StdRng, route: RouteId, started_at: DateTime<Utc>) -> ProbeOutcome {
    let throughput = rng.gen_ratio(1, 10);
    let total_ms = if throughput {
        rng.gen_range(1_500.0..6_000.0)
    } else {
        rng.gen_range(250.0..1_800.0)
    };
    let failed = rng.gen_ratio(1, 50);
    let tokens = if throughput { 79 } else { 3 };
    ProbeOutcome {
        route,
        kind: if throughput {
            OutcomeKind::Throughput
        } else {
            OutcomeKind::Probe
        },
        started_at,
        success: !failed,
        attributed_to: None,
        verified: (!failed).then_some(true),
        ttfb_ms: Some(total_ms * 0.3),
        ttft_ms: Some(total_ms * 0.45),
        total_ms,
        output_tokens: (!failed).then_some(tokens),
        tokens_estimated: false,
        tokens_per_second: (throughput && !failed).then(|| rng.gen_range(20.0..90.0)),
        model_reported: Some("qwen-max-2025-01-25".into()),
        system_fingerprint: rng.gen_ratio(1, 2).then(|| "fp_3b8e6cd14a".into()),
        http_status: Some(if failed { 503 } else { 200 }),
        error: failed.then(|| ProbeError::Http {
            status: 503,
            message: "The service is temporarily overloaded, please try again later.".into(),
        }),
        answer: (!failed).then(|| {
            if throughput {
                (1..=40)
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                "PROBE_OK".into()
            }
        }),
        first_answer_ms: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

/// `n` outcomes, each route probed every 30 s.
fn outcomes(n: usize, seed: u64) -> Vec<ProbeOutcome> {
    let mut rng = StdRng::seed_from_u64(seed);
    let routes = routes();
    let t0 = DateTime::parse_from_rfc3339("2026-03-01T00:00:00Z")
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_default();
    (0..n)
        .map(|i| {
            let tick = (i / ROUTES) as i64;
            let t = t0 + chrono::Duration::milliseconds(tick * 30_000 + rng.gen_range(0..3_000));
            realistic(&mut rng, routes[i % ROUTES].clone(), t)
        })
        .collect()
}

/// Which engine a run writes to.
#[derive(Clone)]
enum Engine {
    Sqlite,
    Postgres(PgUrl),
}

/// A fresh store for one run, removed when dropped.
struct Fresh {
    store: Store,
    _dir: tempfile::TempDir,
    database: Option<(PgUrl, String)>,
}

impl Drop for Fresh {
    fn drop(&mut self) {
        if let Some((server, name)) = &self.database {
            if let Ok(admin) = Connection::open_postgres(server) {
                let _ =
                    admin.execute_batch(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
    }
}

fn open(engine: &Engine) -> Fresh {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (location, database) = match engine {
        Engine::Sqlite => (StoreLocation::Sqlite(dir.path().join("bench.db")), None),
        Engine::Postgres(server) => {
            let name = format!(
                "{}_bench_{}_{}",
                server.database(),
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            );
            let admin = Connection::open_postgres(server).unwrap_or_else(|e| panic!("{e}"));
            admin
                .execute_batch(&format!("CREATE DATABASE {name}"))
                .unwrap_or_else(|e| panic!("{e}"));
            (
                StoreLocation::Postgres(server.with_database(&name)),
                Some((server.clone(), name)),
            )
        }
    };
    let store =
        Store::open_at(&location, StoreOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    Fresh {
        store,
        _dir: dir,
        database,
    }
}

/// Rows/s with `tasks` concurrent callers, each awaiting `record` one outcome at a time.
async fn concurrent(engine: &Engine, tasks: usize, per_task: usize, data: &[ProbeOutcome]) -> f64 {
    let fresh = open(engine);
    let store = fresh.store.clone();
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let writer = store.writer();
        // Interleaved, so that like real callers all tasks write around "now".
        let mine: Vec<ProbeOutcome> = data
            .iter()
            .skip(t)
            .step_by(tasks)
            .take(per_task)
            .cloned()
            .collect();
        handles.push(tokio::spawn(async move {
            for o in mine {
                writer.record(o).await.unwrap_or_else(|e| panic!("{e}"));
            }
        }));
    }
    for h in handles {
        h.await.unwrap_or_else(|e| panic!("{e}"));
    }
    let rate = (tasks * per_task) as f64 / start.elapsed().as_secs_f64();
    store.close().await.unwrap_or_else(|e| panic!("{e}"));
    rate
}

/// Rows/s with one caller: every `record` waits for its own commit.
async fn sequential(engine: &Engine, data: &[ProbeOutcome]) -> f64 {
    let fresh = open(engine);
    let store = fresh.store.clone();
    let writer = store.writer();
    let start = Instant::now();
    for o in data {
        writer
            .record(o.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let rate = data.len() as f64 / start.elapsed().as_secs_f64();
    store.close().await.unwrap_or_else(|e| panic!("{e}"));
    rate
}

/// Rows/s with one caller sending `record_many` chunks (e.g. an ingest request).
async fn chunks(engine: &Engine, data: &[ProbeOutcome], chunk: usize) -> f64 {
    let fresh = open(engine);
    let store = fresh.store.clone();
    let writer = store.writer();
    let start = Instant::now();
    for c in data.chunks(chunk) {
        writer
            .record_many(c.to_vec())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let rate = data.len() as f64 / start.elapsed().as_secs_f64();
    store.close().await.unwrap_or_else(|e| panic!("{e}"));
    rate
}

/// Bytes on disk after inserting `data` (raw rows + rollups + indexes), checkpointed.
async fn size(data: &[ProbeOutcome]) -> (u64, Vec<(String, u64)>) {
    let fresh = open(&Engine::Sqlite);
    let store = fresh.store.clone();
    let path = store.path().to_owned();
    let mut handles = Vec::new();
    for t in 0..50 {
        let writer = store.writer();
        let part: Vec<ProbeOutcome> = data.iter().skip(t).step_by(50).cloned().collect();
        handles.push(tokio::spawn(async move {
            for o in part {
                writer.record(o).await.unwrap_or_else(|e| panic!("{e}"));
            }
        }));
    }
    for h in handles {
        h.await.unwrap_or_else(|e| panic!("{e}"));
    }
    store.close().await.unwrap_or_else(|e| panic!("{e}"));
    let conn = rusqlite::Connection::open(&path).unwrap_or_else(|e| panic!("{e}"));
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap_or_else(|e| panic!("{e}"));
    let file = |suffix: &str| {
        std::fs::metadata(format!("{}{suffix}", path.display()))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    let total = file("") + file("-wal");
    // Per-table pages, when this SQLite has the dbstat table.
    let tables = conn
        .prepare("SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC")
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })?
            .collect::<Result<Vec<_>, _>>()
        })
        .unwrap_or_default();
    (total, tables)
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn report(name: &str, v: Vec<f64>) {
    let (m, lo, hi) = median(v);
    println!(
        "{name:<52} {m:>10.0} rows/s  (min {lo:.0}, max {hi:.0}, {} runs)",
        run_count()
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    rt.block_on(async {
        println!("probeok store benchmark (SQLite {})", rusqlite::version());
        let data = outcomes(100_000, 1);
        let mut engines = vec![("SQLite", Engine::Sqlite)];
        match std::env::var("PROBEOK_BENCH_PG_URL")
            .ok()
            .as_deref()
            .map(PgUrl::parse)
        {
            Some(Some(Ok(url))) => engines.push(("PostgreSQL", Engine::Postgres(url))),
            Some(_) => panic!("PROBEOK_BENCH_PG_URL must be a postgres:// URL"),
            None => println!("(PROBEOK_BENCH_PG_URL unset: SQLite only)"),
        }
        for (label, engine) in &engines {
            println!("{label}:");
            let mut runs = Vec::new();
            for _ in 0..run_count() {
                runs.push(concurrent(engine, 100, 1_000, &data).await);
            }
            report("insert, 100 tasks x record() concurrently", runs);

            let mut runs = Vec::new();
            for _ in 0..run_count() {
                runs.push(sequential(engine, &data[..10_000]).await);
            }
            report("insert, 1 caller, record() one at a time", runs);

            let mut runs = Vec::new();
            for _ in 0..run_count() {
                runs.push(chunks(engine, &data, 500).await);
            }
            report("insert, 1 caller, record_many() of 500", runs);
        }

        let n = 200_000;
        let data = outcomes(n, 2);
        let mut sizes = Vec::new();
        let mut tables = Vec::new();
        for _ in 0..3 {
            let (bytes, t) = size(&data).await;
            sizes.push(bytes as f64);
            tables = t;
        }
        let (bytes, _, _) = median(sizes);
        println!(
            "size on disk: {:.1} MB for {n} outcomes over {ROUTES} routes \
             ({:.0} bytes/outcome) -> {:.0} MB per million outcomes",
            bytes / 1e6,
            bytes / n as f64,
            bytes / n as f64 * 1e6 / 1e6
        );
        for (name, b) in tables {
            println!("    {name:<28} {:>8.1} MB", b as f64 / 1e6);
        }
    });
    println!("total {:.1?}", started.elapsed());
}
