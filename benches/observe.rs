//! What the route observables add to the proxy's latency: the same structured requests
//! (`response_format` `json_schema`, non-streamed and streamed) through a proxy on one SQLite
//! store with the observables on and off (`ProxyOptions::observe`), against a zero-delay
//! upstream. Closed loop, `OBSERVE_BENCH_CLIENTS` concurrent clients (default 8), each
//! mode `OBSERVE_BENCH_REQUESTS` requests (default 4,000) per round, modes alternating over 3
//! rounds; the figures are the medians of the rounds' p50 and p99. The load generator, the
//! upstream and the proxy share this process, as they share the machine.
//!
//! `cargo bench --bench observe`

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig};
use probeok::proxy::{self, Proxy, ProxyOptions, WeightsView};
use probeok::route::Capability;
use probeok::store::{Store, StoreOptions};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const JSON_BODY: &str = r#"{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"{\"name\": \"Ann\", \"age\": 3}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}}"#;

const STREAM_BODY: &str = concat!(
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"{\\\"name\\\": \"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\\"Ann\\\", \\\"age\\\": 3}\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":9,\"total_tokens\":21}}\n\n",
    "data: [DONE]\n\n",
);

fn request(stream: bool) -> String {
    serde_json::json!({"model": "chat", "stream": stream,
        "messages": [{"role": "user", "content": "who?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"]}}}})
    .to_string()
}

async fn upstream() -> std::net::SocketAddr {
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

async fn proxy(up: std::net::SocketAddr, store: &Store, observe: bool) -> String {
    let mut config = Config::default();
    config.providers.push(ProviderConfig {
        id: "fake".into(),
        regions: vec![RegionConfig {
            id: "r1".into(),
            base_url: format!("http://{up}/v1"),
        }],
        ..ProviderConfig::default()
    });
    config.routes.push(RouteConfig {
        provider: "fake".into(),
        region: "r1".into(),
        model: "m".into(),
        serves: "chat".into(),
        capabilities: vec![Capability::Stream, Capability::JsonSchema],
        ..RouteConfig::default()
    });
    config.proxy.enabled = true;
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    std::mem::forget(_wtx);
    let (ptx, mut prx) = mpsc::channel(65_536);
    tokio::spawn(async move { while prx.recv().await.is_some() {} });
    let opts = ProxyOptions {
        store: Some(store.clone()),
        observe,
        ..ProxyOptions::default()
    };
    let p = Proxy::with_options(&config, wrx, ptx, opts).expect("proxy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(proxy::serve(listener, p, CancellationToken::new()));
    format!("http://{addr}/v1/chat/completions")
}

/// `n` requests from `clients` concurrent clients; every latency, sorted (ms).
async fn run(
    client: &reqwest::Client,
    url: &str,
    body: &str,
    clients: usize,
    n: usize,
) -> Vec<f64> {
    let per = n / clients;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, url, body) = (client.clone(), url.to_owned(), body.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(per);
            for _ in 0..per {
                let t = Instant::now();
                let r = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .expect("send");
                assert_eq!(r.status(), 200);
                let _ = r.bytes().await.expect("body");
                out.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            out
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await.expect("client"));
    }
    all.sort_by(f64::total_cmp);
    all
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let clients = env("OBSERVE_BENCH_CLIENTS", 8);
    let n = env("OBSERVE_BENCH_REQUESTS", 4_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("bench.db"), StoreOptions::default()).expect("store");
    let up = upstream().await;
    let on = proxy(up, &store, true).await;
    let off = proxy(up, &store, false).await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    println!("route observables: added proxy latency ({clients} clients, {n} requests per mode and round, 3 rounds; shared machine)");
    for stream in [false, true] {
        let body = request(stream);
        // Warm both proxies (connections, the compiled schema).
        run(&client, &on, &body, clients, clients * 20).await;
        run(&client, &off, &body, clients, clients * 20).await;
        let mut figures: [Vec<f64>; 4] = Default::default();
        for _ in 0..3 {
            for (i, url) in [&off, &on].into_iter().enumerate() {
                let lat = run(&client, url, &body, clients, n).await;
                figures[i * 2].push(pct(&lat, 0.5));
                figures[i * 2 + 1].push(pct(&lat, 0.99));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let [off50, off99, on50, on99] = figures.map(median);
        let mode = if stream { "stream" } else { "json" };
        println!(
            "{mode:6}  observables off: p50 {off50:.3} ms p99 {off99:.3} ms | on: p50 {on50:.3} ms p99 {on99:.3} ms | added p50 {:+.3} ms p99 {:+.3} ms",
            on50 - off50,
            on99 - off99
        );
    }
}
