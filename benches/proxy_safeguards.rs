//! The proxy's safeguards (metering, breakers, idempotency), each figure a median over repeats:
//!
//! 1. **Metering overhead** on the proxy's latency: two proxies on the same zero-delay
//!    upstream, one metering every request into SQLite (a store), one without a store; open
//!    loop at 500 requests/s, run alternately in the same process, `SAFEGUARDS_BENCH_SECS` (default
//!    3) per run, `SAFEGUARDS_BENCH_REPEATS` (default 3) repeats. Latency from each request's due
//!    time (no coordinated omission).
//! 2. **Breaker reaction**: two routes (primary A, backup B) under 100 requests/s; A starts
//!    answering 503 at once. Measured from A's first failing answer to its breaker reading
//!    open, and to the last request A receives (traffic has moved); the client-visible errors
//!    and the requests A took while failing. 5 repeats, fresh proxy each.
//! 3. **Idempotency store cost**: closed loop, one request at a time, 500 per kind, without a
//!    key, with a fresh `Idempotency-Key` each (lookup + insert + stored answer), and with a
//!    repeated key (replayed from the store).
//!
//! `cargo bench --bench proxy_safeguards`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig};
use probeok::proxy::{self, BreakerState, Proxy, ProxyOptions, WeightsView};
use probeok::route::Tier;
use probeok::store::{Store, StoreOptions};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const JSON_BODY: &str = r#"{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello, world"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;
const ERROR_BODY: &str = r#"{"error":{"message":"down","type":"server_error","code":null}}"#;
const REQUEST: &str = r#"{"model":"chat","messages":[{"role":"user","content":"hello"}]}"#;

/// A zero-delay upstream; answers 503 while `failing` is set, noting when it first did and
/// when it last received a request.
#[derive(Clone, Default)]
struct Upstream {
    failing: Arc<AtomicBool>,
    first_failure: Arc<Mutex<Option<Instant>>>,
    last_hit: Arc<Mutex<Option<Instant>>>,
    hits_failing: Arc<AtomicU64>,
}

async fn upstream(u: Upstream) -> std::net::SocketAddr {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move || {
            let u = u.clone();
            async move {
                let now = Instant::now();
                *u.last_hit.lock().unwrap() = Some(now);
                let (status, body) = if u.failing.load(Ordering::SeqCst) {
                    u.hits_failing.fetch_add(1, Ordering::SeqCst);
                    u.first_failure.lock().unwrap().get_or_insert(now);
                    (StatusCode::SERVICE_UNAVAILABLE, ERROR_BODY)
                } else {
                    (StatusCode::OK, JSON_BODY)
                };
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(body))
                    .unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn config(upstreams: &[std::net::SocketAddr]) -> Config {
    let mut config = Config::default();
    for (i, addr) in upstreams.iter().enumerate() {
        config.providers.push(ProviderConfig {
            id: format!("p{i}"),
            regions: vec![RegionConfig {
                id: "local".into(),
                base_url: format!("http://{addr}/v1"),
            }],
            ..ProviderConfig::default()
        });
        config.routes.push(RouteConfig {
            provider: format!("p{i}"),
            region: "local".into(),
            model: "m".into(),
            serves: "chat".into(),
            tier: if i == 0 { Tier::Primary } else { Tier::Backup },
            weight: if i == 0 { 100 } else { 0 },
            ..RouteConfig::default()
        });
    }
    config.proxy.enabled = true;
    config.proxy.max_retry_wait = Duration::ZERO;
    config
}

struct Running {
    url: String,
    proxy: Proxy,
    shutdown: CancellationToken,
    _weights: watch::Sender<Arc<WeightsView>>,
}

async fn start(config: &Config, store: Option<Store>) -> Running {
    let (wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, mut prx) = mpsc::channel(4096);
    tokio::spawn(async move { while prx.recv().await.is_some() {} });
    let p = Proxy::with_options(
        config,
        wrx,
        ptx,
        ProxyOptions {
            store,
            ..ProxyOptions::default()
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p.clone(), shutdown.clone()));
    Running {
        url: format!("http://{addr}/v1/chat/completions"),
        proxy: p,
        shutdown,
        _weights: wtx,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .build()
        .unwrap()
}

struct Run {
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Offers `rate` requests/s for `secs`; each measured from its due time. Anything but a
/// complete 200 is an error.
async fn open_loop(client: &reqwest::Client, url: &str, rate: u32, secs: f64) -> Run {
    let n = (f64::from(rate) * secs) as u64;
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<Duration>>();
    let start = Instant::now();
    let mut ticker = tokio::time::interval_at(start, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for i in 0..n {
        ticker.tick().await;
        let due = start + period * i as u32;
        let (client, url, tx) = (client.clone(), url.to_owned(), tx.clone());
        tokio::spawn(async move {
            let r = client
                .post(&url)
                .header("content-type", "application/json")
                .body(REQUEST)
                .send()
                .await;
            let ok = match r {
                Ok(r) => {
                    let status = r.status().as_u16();
                    r.bytes().await.is_ok() && status == 200
                }
                Err(_) => false,
            };
            let _ = tx.send(ok.then(|| due.elapsed()));
        });
    }
    drop(tx);
    let mut lat = Vec::with_capacity(n as usize);
    let mut errors = 0;
    while let Some(r) = rx.recv().await {
        match r {
            Some(d) => lat.push(d.as_secs_f64() * 1000.0),
            None => errors += 1,
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    Run {
        p50_ms: pct(&lat, 0.50),
        p99_ms: pct(&lat, 0.99),
        errors,
    }
}

async fn metering(secs: f64, repeats: usize, dir: &std::path::Path) {
    let up = upstream(Upstream::default()).await;
    let config = config(&[up]);
    let store = Store::open(&dir.join("meter.db"), StoreOptions::default()).unwrap();
    let metered = start(&config, Some(store.clone())).await;
    let plain = start(&config, None).await;
    let client = client();
    open_loop(&client, &metered.url, 500, 1.0).await;
    open_loop(&client, &plain.url, 500, 1.0).await;
    let (mut m, mut p) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        p.push(open_loop(&client, &plain.url, 500, secs).await);
        m.push(open_loop(&client, &metered.url, 500, secs).await);
    }
    let med = |runs: &[Run], f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let errors: usize = m.iter().chain(&p).map(|r| r.errors).sum();
    println!("\n1. metering overhead: open loop 500 rps, zero-delay upstream, {secs}s x {repeats}, medians");
    println!("{:<16} | {:>9} | {:>9}", "proxy", "p50", "p99");
    println!(
        "{:<16} | {:>7.3}ms | {:>7.3}ms",
        "without metering",
        med(&p, |r| r.p50_ms),
        med(&p, |r| r.p99_ms)
    );
    println!(
        "{:<16} | {:>7.3}ms | {:>7.3}ms",
        "with metering",
        med(&m, |r| r.p50_ms),
        med(&m, |r| r.p99_ms)
    );
    println!(
        "{:<16} | {:>7.3}ms | {:>7.3}ms   (errors {errors}, metering records dropped {})",
        "overhead",
        med(&m, |r| r.p50_ms) - med(&p, |r| r.p50_ms),
        med(&m, |r| r.p99_ms) - med(&p, |r| r.p99_ms),
        metered.proxy.counters().meter_dropped
    );
    metered.shutdown.cancel();
    plain.shutdown.cancel();
}

async fn breaker_reaction(repeats: usize) {
    let mut to_open = Vec::new();
    let mut to_moved = Vec::new();
    let mut failing_hits = Vec::new();
    let mut errors = Vec::new();
    for _ in 0..repeats {
        let a = Upstream::default();
        let b = Upstream::default();
        let config = config(&[upstream(a.clone()).await, upstream(b.clone()).await]);
        let px = start(&config, None).await;
        let client = client();
        open_loop(&client, &px.url, 100, 0.5).await;
        let a_id = px.proxy.breakers()[0].route.clone();
        let load = {
            let (client, url) = (client.clone(), px.url.clone());
            tokio::spawn(async move { open_loop(&client, &url, 100, 3.0).await })
        };
        tokio::time::sleep(Duration::from_millis(1000)).await;
        a.failing.store(true, Ordering::SeqCst);
        let opened = loop {
            let open = px
                .proxy
                .breakers()
                .iter()
                .any(|s| s.route == a_id && s.state == BreakerState::Open);
            if open {
                break Instant::now();
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        };
        let run = load.await.unwrap();
        let first = a.first_failure.lock().unwrap().unwrap();
        let last = a.last_hit.lock().unwrap().unwrap();
        to_open.push(opened.duration_since(first).as_secs_f64() * 1000.0);
        to_moved.push(last.duration_since(first).as_secs_f64() * 1000.0);
        failing_hits.push(a.hits_failing.load(Ordering::SeqCst) as f64);
        errors.push(run.errors as f64);
        px.shutdown.cancel();
    }
    println!(
        "\n2. breaker reaction: hard-failing primary (503) under 100 rps, {repeats} runs, medians"
    );
    println!(
        "{:>22} | {:>26} | {:>20} | {:>14}",
        "first failure -> open",
        "first failure -> last hit",
        "requests to failing A",
        "client errors"
    );
    println!(
        "{:>20.1}ms | {:>24.1}ms | {:>20.0} | {:>14.0}",
        median(to_open),
        median(to_moved),
        median(failing_hits),
        median(errors)
    );
}

async fn idempotency(n: usize, dir: &std::path::Path) {
    let up = upstream(Upstream::default()).await;
    let config = config(&[up]);
    let store = Store::open(&dir.join("idem.db"), StoreOptions::default()).unwrap();
    let px = start(&config, Some(store)).await;
    let client = client();
    let one = |key: Option<String>| {
        let (client, url) = (client.clone(), px.url.clone());
        async move {
            let mut req = client
                .post(&url)
                .header("content-type", "application/json")
                .body(REQUEST);
            if let Some(k) = key {
                req = req.header("idempotency-key", k);
            }
            let t = Instant::now();
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
            t.elapsed().as_secs_f64() * 1000.0
        }
    };
    for i in 0..100 {
        one(None).await;
        one(Some(format!("warm-{i}"))).await;
    }
    let (mut none, mut fresh, mut replay) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        none.push(one(None).await);
        fresh.push(one(Some(format!("key-{i}"))).await);
        replay.push(one(Some("key-0".to_owned())).await);
    }
    for v in [&mut none, &mut fresh, &mut replay] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    println!("\n3. idempotency store cost: closed loop, one at a time, {n} requests each");
    println!("{:<28} | {:>9} | {:>9}", "request", "p50", "p99");
    for (name, v) in [
        ("no Idempotency-Key", &none),
        ("fresh key (store + answer)", &fresh),
        ("repeated key (replay)", &replay),
    ] {
        println!(
            "{:<28} | {:>7.3}ms | {:>7.3}ms",
            name,
            pct(v, 0.5),
            pct(v, 0.99)
        );
    }
    println!(
        "{:<28} | {:>7.3}ms | {:>7.3}ms",
        "cost of a fresh key",
        pct(&fresh, 0.5) - pct(&none, 0.5),
        pct(&fresh, 0.99) - pct(&none, 0.99)
    );
    px.shutdown.cancel();
}

fn main() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let secs = env("SAFEGUARDS_BENCH_SECS", 3) as f64;
    let repeats = env("SAFEGUARDS_BENCH_REPEATS", 3) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        metering(secs, repeats, dir.path()).await;
        breaker_reaction(5).await;
        idempotency(500, dir.path()).await;
    });
}
