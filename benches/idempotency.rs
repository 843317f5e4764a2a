//! What an `Idempotency-Key` adds to a request: the claim of a new key (a read, then a
//! pending row inserted in a writer transaction) and the store of its answer, on SQLite and
//! on PostgreSQL, against a bare round trip of the same store (`SELECT 1` from a reader) in
//! the same run. PostgreSQL comes from `PROBEOK_TEST_PG_URL` (a database of its own,
//! `fleet_bench_<pid>`, dropped at the end); without it only SQLite runs.
//!
//! `cargo bench --bench idempotency` (add `--profile dev` on a shared machine: the time is
//! the database's, not the code's).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use probeok::clock::{Clock, SystemClock};
use probeok::proxy::idempotency::{Idempotency, Lookup};
use probeok::store::sql::{Connection, PgUrl};
use probeok::store::{Store, StoreLocation, StoreOptions};

const N: usize = 400;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn line(what: &str, mut v: Vec<Duration>) {
    v.sort();
    println!(
        "  {what:<28} p50 {:>8.2} ms   p99 {:>8.2} ms",
        pct(&v, 0.5).as_secs_f64() * 1e3,
        pct(&v, 0.99).as_secs_f64() * 1e3
    );
}

async fn run(engine: &str, store: Store) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let idem = Idempotency::new(
        store.clone(),
        clock.clone(),
        Duration::from_secs(3600),
        Duration::from_secs(10),
        1 << 20,
        u64::MAX,
    );
    let (mut ping, mut claim, mut answer, mut replay) = (vec![], vec![], vec![], vec![]);
    let body = br#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
    for i in 0..N {
        let s = store.clone();
        let t = Instant::now();
        tokio::task::spawn_blocking(move || s.reader().unwrap().ping().unwrap())
            .await
            .unwrap();
        ping.push(t.elapsed());

        let key = format!("bench-{i}");
        let t = Instant::now();
        let Lookup::Proceed(guard) = idem.lookup("client", &key, body, clock.now()).await else {
            panic!("a new key is claimed");
        };
        claim.push(t.elapsed());
        let t = Instant::now();
        guard
            .store(200, &HeaderMap::new(), false, b"{}".to_vec(), clock.now())
            .await;
        answer.push(t.elapsed());
        let t = Instant::now();
        let Lookup::Replay(_) = idem.lookup("client", &key, body, clock.now()).await else {
            panic!("a used key replays");
        };
        replay.push(t.elapsed());
    }
    println!("{engine}, {N} keys, one at a time:");
    line("reference: SELECT 1", ping);
    line("claim a new key", claim);
    line("store its answer", answer);
    line("replay (read only)", replay);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.db");
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    run("SQLite", store.clone()).await;
    store.close().await.unwrap();

    let Ok(server) = std::env::var("PROBEOK_TEST_PG_URL") else {
        println!("PROBEOK_TEST_PG_URL unset: PostgreSQL skipped");
        return;
    };
    let server = PgUrl::parse(&server).unwrap().unwrap();
    let name = format!("fleet_bench_{}", std::process::id());
    let admin = Connection::open_postgres(&server).unwrap();
    admin
        .execute_batch(&format!("CREATE DATABASE {name}"))
        .unwrap();
    let loc = StoreLocation::Postgres(server.with_database(&name));
    let store = tokio::task::spawn_blocking(move || Store::open_at(&loc, StoreOptions::default()))
        .await
        .unwrap()
        .unwrap();
    run("PostgreSQL (local server)", store.clone()).await;
    store.close().await.unwrap();
    admin
        .execute_batch(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .unwrap();
}
