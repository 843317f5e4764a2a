//! Figures, printed and never asserted (run with `--nocapture`; the machine may be shared,
//! so compare the rows of one run with each other, not with another run):
//!
//! - the latency a client's spend booking adds per request: one proxy per engine (SQLite,
//!   PostgreSQL of `PROBEOK_TEST_PG_URL`) with and without a limit, requests interleaved over
//!   the four so load on the machine hits them alike; p50/p99 as the client sees it, and the
//!   ledger's own reserve + settle;
//! - the hot row: how many reserve + settle pairs per second one client's ledger row takes from
//!   three replicas' connections at once, next to what one proxy serves per second.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::pg::TestDb;
use common::{fake, json, openai, Captured, Reply};
use probeok::clock::SystemClock;
use probeok::config::{
    ClientConfig, Config, Per, ProviderConfig, RegionConfig, RouteConfig, SpendLimit,
};
use probeok::proxy::{Proxy, ProxyOptions, WeightsView};
use probeok::route::{Price, Tier};
use probeok::spend::Spend;
use probeok::store::sql::Engine;
use probeok::store::{Store, StoreOptions};
use serde_json::json as j;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const KEY: &str = "sk-figures-0123456789";

fn config(base: String, limit: bool) -> Config {
    let mut config = Config::default();
    config.providers.push(ProviderConfig {
        id: "p0".into(),
        api_key_env: Some("UP".into()),
        regions: vec![RegionConfig {
            id: "r".into(),
            base_url: base,
        }],
        ..ProviderConfig::default()
    });
    config.routes.push(RouteConfig {
        provider: "p0".into(),
        region: "r".into(),
        model: "m".into(),
        serves: "chat".into(),
        tier: Tier::Primary,
        weight: 100,
        price: Some(Price {
            input_per_mtok: 1.0,
            output_per_mtok: 2.0,
            currency: "CNY".into(),
        }),
        ..RouteConfig::default()
    });
    config.env.set("UP", "sk-up-0123456789");
    config.env.set("FIG_KEY", KEY);
    config.proxy.enabled = true;
    config.proxy.clients.push(ClientConfig {
        id: "fig".into(),
        key_env: "FIG_KEY".into(),
        limit: limit.then_some(SpendLimit {
            amount: 1e9,
            per: Per::Month,
        }),
    });
    config
}

struct Served {
    base: String,
    _shutdown: tokio_util::sync::DropGuard,
    _passive: mpsc::Receiver<probeok::probe::ProbeOutcome>,
}

async fn serve(config: &Config, store: &Store) -> Served {
    let (_w, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, prx) = mpsc::channel(65_536);
    let proxy = Proxy::with_options(
        config,
        wrx,
        ptx,
        ProxyOptions {
            store: Some(store.clone()),
            ..ProxyOptions::default()
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(probeok::proxy::serve(listener, proxy, shutdown.clone()));
    Served {
        base,
        _shutdown: shutdown.drop_guard(),
        _passive: prx,
    }
}

async fn once(http: &reqwest::Client, base: &str) -> Duration {
    let t = Instant::now();
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&j!({"model": "chat", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    t.elapsed()
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn line(name: &str, mut d: Vec<Duration>) -> (f64, f64) {
    d.sort();
    let (p50, p99) = (pct(&d, 0.5), pct(&d, 0.99));
    println!(
        "  {name:<34} n={:<5} p50 {p50:>7.3} ms   p99 {p99:>7.3} ms",
        d.len()
    );
    (p50, p99)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn figures_spend_booking_latency_and_the_hot_row_on_postgres() {
    let (up, _reqs) = fake("/chat/completions", |_: &Captured| {
        Reply::now(json(StatusCode::OK, openai::body("hi", "stop", Some(3))))
    })
    .await;
    let sqlite = TestDb::new(Engine::Sqlite);
    let postgres = TestDb::new(Engine::Postgres);
    let stores = [
        ("sqlite", sqlite.open(StoreOptions::default())),
        ("postgres", postgres.open(StoreOptions::default())),
    ];
    let mut proxies = Vec::new();
    for (engine, store) in &stores {
        for limit in [false, true] {
            let name = format!(
                "{engine}, {}",
                if limit { "with a limit" } else { "no limit" }
            );
            proxies.push((name, serve(&config(up.base_url(), limit), store).await));
        }
    }
    let http = reqwest::Client::new();
    const N: usize = 400;
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); proxies.len()];
    for round in 0..(N + 20) {
        for (i, (_, p)) in proxies.iter().enumerate() {
            let d = once(&http, &p.base).await;
            if round >= 20 {
                times[i].push(d);
            }
        }
    }
    println!("\nrequest latency through one proxy, sequential, interleaved (client's view):");
    let mut medians = Vec::new();
    for ((name, _), t) in proxies.iter().zip(times) {
        medians.push(line(name, t));
    }
    for (k, engine) in ["sqlite", "postgres"].iter().enumerate() {
        let (base, lim) = (medians[2 * k], medians[2 * k + 1]);
        println!(
            "  {engine}: a limit adds {:+.3} ms at p50 ({:.2}×), {:+.3} ms at p99",
            lim.0 - base.0,
            lim.0 / base.0,
            lim.1 - base.1
        );
    }

    println!("\nthe ledger alone: one reserve, then its settle (sequential):");
    for (engine, store) in &stores {
        let spend = Spend::new(
            store.spend_ledger(),
            Arc::new(SystemClock),
            Duration::from_secs(60),
        );
        let (mut both, mut reserve) = (Vec::new(), Vec::new());
        for _ in 0..N {
            let t = Instant::now();
            let (hold, _) = spend
                .reserve("client:solo", Per::Month, 100, i64::MAX / 4)
                .await
                .unwrap()
                .unwrap();
            reserve.push(t.elapsed());
            spend.settle(hold, 50).await.unwrap();
            both.push(t.elapsed());
        }
        line(&format!("{engine}: reserve"), reserve);
        line(&format!("{engine}: reserve + settle"), both);
    }

    println!("\nthe hot row: reserve + settle pairs per second on one client's row, 3 replicas × 16 tasks:");
    for (engine, _) in &stores {
        let db = if *engine == "sqlite" {
            &sqlite
        } else {
            &postgres
        };
        // Three replicas: three stores (each its own connections) on one database.
        let replicas: Vec<Store> = (0..3).map(|_| db.open(StoreOptions::default())).collect();
        let spends: Vec<Spend> = replicas
            .iter()
            .map(|s| {
                Spend::new(
                    s.spend_ledger(),
                    Arc::new(SystemClock),
                    Duration::from_secs(60),
                )
            })
            .collect();
        let run = Duration::from_secs(3);
        let start = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..48 {
            let spend = spends[i % 3].clone();
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while start.elapsed() < run {
                    let (hold, _) = spend
                        .reserve("client:hot", Per::Month, 100, i64::MAX / 4)
                        .await
                        .unwrap()
                        .unwrap();
                    spend.settle(hold, 50).await.unwrap();
                    n += 1;
                }
                n
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "  {engine:<10} {:>8.0} pairs/s ({total} in {secs:.1} s)",
            total as f64 / secs
        );
        for s in replicas {
            s.close().await.unwrap();
        }
    }

    println!("\none proxy's own throughput, 32 clients at once, 3 s (no limit vs a limit):");
    for (name, p) in &proxies {
        let start = Instant::now();
        let run = Duration::from_secs(3);
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let (http, base) = (http.clone(), p.base.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while start.elapsed() < run {
                    once(&http, &base).await;
                    n += 1;
                }
                n
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        println!(
            "  {name:<34} {:>8.0} requests/s",
            total as f64 / start.elapsed().as_secs_f64()
        );
    }
    drop(proxies);
    for (_, s) in stores {
        s.close().await.unwrap();
    }
}
