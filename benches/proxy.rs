//! The proxy's added latency and throughput against calling the same zero-delay upstream
//! directly, under open-loop load (500 and 1,000 requests/s), streaming and not; RSS.
//!
//! Open loop: request i is due at `start + i / rate` whatever happened to earlier ones, and its
//! latency is measured from that due time (no coordinated omission). Each (mode, rate) pair
//! runs direct and through the proxy, alternately, `PROXY_BENCH_REPEATS` times (default 3) for
//! `PROXY_BENCH_SECS` seconds (default 3); the figures are the medians over the repeats. The
//! load generator, the fake upstream and the proxy share this process and its runtime, as
//! they share the machine.
//!
//! `cargo bench --bench proxy`

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig};
use probeok::proxy::{self, Proxy, WeightsView};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const STREAM_BODY: &str = concat!(
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\", world\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15}}\n\n",
    "data: [DONE]\n\n",
);

const JSON_BODY: &str = r#"{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello, world"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;

async fn zero_delay_upstream() -> std::net::SocketAddr {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(|body: axum::body::Bytes| async move {
            let stream = body.windows(13).any(|w| w == b"\"stream\":true");
            let (ct, b) = if stream {
                ("text/event-stream", STREAM_BODY)
            } else {
                ("application/json", JSON_BODY)
            };
            Response::builder()
                .header("content-type", ct)
                .body(Body::from(b))
                .unwrap()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

static FIRST_ERROR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[derive(Debug, Clone, Copy)]
struct Run {
    p50_ms: f64,
    p99_ms: f64,
    /// Completed answers per second over the run.
    throughput: f64,
    errors: usize,
}

/// Offers `rate` requests/s for `secs` to `url` and measures each from its due time.
async fn open_loop(client: &reqwest::Client, url: &str, body: &str, rate: u32, secs: u64) -> Run {
    let n = rate as u64 * secs;
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<Duration>>();
    let start = tokio::time::Instant::now();
    let mut ticker = tokio::time::interval_at(start, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for i in 0..n {
        ticker.tick().await;
        let due = start + period * i as u32;
        let (client, url, body, tx) = (client.clone(), url.to_owned(), body.to_owned(), tx.clone());
        tokio::spawn(async move {
            let ok = async {
                let r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .ok()?;
                let status = r.status();
                let body = r.bytes().await.ok()?;
                // A stream the proxy interrupted is a failure too.
                if !status.is_success() || body.windows(20).any(|w| w == b"provider_interrupted") {
                    if !FIRST_ERROR.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        eprintln!("first error: {status} {}", String::from_utf8_lossy(&body));
                    }
                    return None;
                }
                Some(body)
            }
            .await;
            let _ = tx.send(ok.map(|_| due.elapsed()));
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
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        if lat.is_empty() {
            f64::NAN
        } else {
            lat[((lat.len() - 1) as f64 * p).round() as usize]
        }
    };
    Run {
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        throughput: lat.len() as f64 / elapsed,
        errors,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let secs = env("PROXY_BENCH_SECS", 3);
    let only_stream = std::env::var_os("PROXY_BENCH_STREAM_ONLY").is_some();
    let repeats = env("PROXY_BENCH_REPEATS", 3) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let upstream = zero_delay_upstream().await;
        let rss_before_proxy = rss_kib("VmRSS:");
        let mut config = Config::default();
        config.providers.push(ProviderConfig {
            id: "bench".into(),
            regions: vec![RegionConfig {
                id: "local".into(),
                base_url: format!("http://{upstream}/v1"),
            }],
            ..ProviderConfig::default()
        });
        config.routes.push(RouteConfig {
            provider: "bench".into(),
            region: "local".into(),
            model: "m".into(),
            serves: "chat".into(),
            ..RouteConfig::default()
        });
        config.proxy.enabled = true;
        let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
        let (ptx, mut prx) = mpsc::channel(4096);
        tokio::spawn(async move { while prx.recv().await.is_some() {} });
        let p = Proxy::new(&config, wrx, ptx).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(proxy::serve(listener, p.clone(), shutdown.clone()));

        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .tcp_nodelay(true)
            .build()
            .unwrap();
        let direct = format!("http://{upstream}/v1/chat/completions");
        let via = format!("http://{proxy_addr}/v1/chat/completions");
        // Warm both paths (connections, allocator).
        let warm = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
        open_loop(&client, &direct, &warm.replace("chat", "m"), 500, 1).await;
        open_loop(&client, &via, warm, 500, 1).await;

        println!(
            "proxy bench: open loop, {secs}s per run, {repeats} repeats, medians; latency from each request's due time"
        );
        println!(
            "{:<10} {:>6} | {:>10} {:>10} | {:>10} {:>10} | {:>10} {:>10} | {:>9} {:>9} | {:>6}",
            "mode", "rps", "direct p50", "direct p99", "proxy p50", "proxy p99", "added p50", "added p99",
            "thr dir", "thr proxy", "errors"
        );
        let mut peak_rss = 0;
        let modes: &[bool] = if only_stream { &[true] } else { &[false, true] };
        for &stream in modes {
            for rate in [500u32, 1000] {
                let body = |model: &str| {
                    format!(
                        r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"hello"}}]}}"#
                    )
                };
                let (mut d, mut v) = (Vec::new(), Vec::new());
                for _ in 0..repeats {
                    d.push(open_loop(&client, &direct, &body("m"), rate, secs).await);
                    v.push(open_loop(&client, &via, &body("chat"), rate, secs).await);
                    peak_rss = peak_rss.max(rss_kib("VmRSS:"));
                }
                let m = |runs: &[Run], f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
                let (dp50, dp99) = (m(&d, |r| r.p50_ms), m(&d, |r| r.p99_ms));
                let (vp50, vp99) = (m(&v, |r| r.p50_ms), m(&v, |r| r.p99_ms));
                let errors: usize = d.iter().chain(&v).map(|r| r.errors).sum();
                println!(
                    "{:<10} {:>6} | {:>8.3}ms {:>8.3}ms | {:>8.3}ms {:>8.3}ms | {:>8.3}ms {:>8.3}ms | {:>9.0} {:>9.0} | {:>6}",
                    if stream { "stream" } else { "non-stream" },
                    rate,
                    dp50,
                    dp99,
                    vp50,
                    vp99,
                    vp50 - dp50,
                    vp99 - dp99,
                    m(&d, |r| r.throughput),
                    m(&v, |r| r.throughput),
                    errors
                );
            }
        }
        println!(
            "RSS (whole process: load generator + fake upstream + proxy): before the proxy {} KiB, peak under load {} KiB, high-water mark {} KiB; passive outcomes dropped: {}",
            rss_before_proxy,
            peak_rss,
            rss_kib("VmHWM:"),
            p.passive_dropped()
        );
        shutdown.cancel();
    });
}
