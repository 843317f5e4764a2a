//! What tracing adds to the proxy's latency: the same zero-delay upstream called directly,
//! through a proxy with tracing off, through a proxy tracing every request (sample ratio 1.0,
//! each request's spans exported over OTLP/HTTP to a local receiver that decodes them), and
//! through one tracing every request to a collector that is down, streaming and not, in one
//! run.
//!
//! Open loop: request i is due at `start + i / rate` and is measured from that due time. Each
//! mode runs the four targets alternately `TRACE_BENCH_REPEATS` times (default 3) for
//! `TRACE_BENCH_SECS` seconds (default 3) at `TRACE_BENCH_RATE` requests/s (default 500);
//! figures are medians over the repeats. Load generator, upstream, proxies and receiver share
//! this process, as they share the machine.
//!
//! `cargo bench --bench trace`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig, TracingConfig};
use probeok::proxy::{self, Proxy, ProxyOptions, WeightsView};
use probeok::trace::Tracer;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const STREAM_BODY: &str = concat!(
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15}}\n\n",
    "data: [DONE]\n\n",
);

const JSON_BODY: &str = r#"{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello, world"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;

async fn serve(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn upstream() -> std::net::SocketAddr {
    serve(Router::new().route(
        "/v1/chat/completions",
        post(|body: Bytes| async move {
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
    ))
    .await
}

/// A local OTLP/HTTP receiver counting the spans it decoded.
async fn receiver(spans: Arc<AtomicU64>) -> std::net::SocketAddr {
    serve(Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let spans = spans.clone();
            async move {
                if let Ok(r) = ExportTraceServiceRequest::decode(body) {
                    let n: usize = (r.resource_spans.iter())
                        .flat_map(|rs| rs.scope_spans.iter())
                        .map(|ss| ss.spans.len())
                        .sum();
                    spans.fetch_add(n as u64, Ordering::Relaxed);
                }
                ""
            }
        }),
    ))
    .await
}

async fn proxy(upstream: std::net::SocketAddr, tracer: Tracer) -> String {
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
    let (wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    std::mem::forget(wtx);
    let (ptx, mut prx) = mpsc::channel(4096);
    tokio::spawn(async move { while prx.recv().await.is_some() {} });
    let opts = ProxyOptions {
        tracer,
        ..ProxyOptions::default()
    };
    let p = Proxy::with_options(&config, wrx, ptx, opts).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(proxy::serve(listener, p, CancellationToken::new()));
    format!("http://{addr}/v1/chat/completions")
}

#[derive(Debug, Clone, Copy)]
struct Run {
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
}

async fn open_loop(client: &reqwest::Client, url: &str, body: &str, rate: u32, secs: u64) -> Run {
    let n = u64::from(rate) * secs;
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
                let r = (client.post(&url))
                    .header("content-type", "application/json")
                    .header(
                        "traceparent",
                        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                    )
                    .body(body)
                    .send()
                    .await
                    .ok()?;
                let ok = r.status().is_success();
                let body = r.bytes().await.ok()?;
                (ok && !body.windows(20).any(|w| w == b"provider_interrupted")).then_some(())
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
        errors,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let secs = env("TRACE_BENCH_SECS", 3);
    let repeats = env("TRACE_BENCH_REPEATS", 3) as usize;
    let rate = u32::try_from(env("TRACE_BENCH_RATE", 500)).unwrap_or(500);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let up = upstream().await;
        let spans = Arc::new(AtomicU64::new(0));
        let collector = receiver(spans.clone()).await;
        let tracer = Tracer::to_collector(&format!("http://{collector}"), &TracingConfig::default())
            .unwrap();
        let dead_port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let dead_tracer =
            Tracer::to_collector(&format!("http://{dead_port}"), &TracingConfig::default())
                .unwrap();
        let off = proxy(up, Tracer::off()).await;
        let on = proxy(up, tracer.clone()).await;
        let dead = proxy(up, dead_tracer.clone()).await;
        let direct = format!("http://{up}/v1/chat/completions");
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .tcp_nodelay(true)
            .build()
            .unwrap();
        let body = |model: &str, stream: bool| {
            format!(
                r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"hello"}}]}}"#
            )
        };
        for url in [&direct, &off, &on, &dead] {
            let model = if url == &direct { "m" } else { "chat" };
            open_loop(&client, url, &body(model, false), rate, 1).await;
        }
        println!(
            "trace bench: open loop at {rate} req/s, {secs}s per run, {repeats} repeats, medians; added = through the proxy minus direct"
        );
        println!(
            "{:<10} | {:>10} {:>10} | {:>13} {:>13} | {:>12} {:>12} | {:>14} {:>14} | {:>6}",
            "mode", "direct p50", "direct p99", "off added p50", "off added p99", "on added p50",
            "on added p99", "down added p50", "down added p99", "errors"
        );
        for stream in [false, true] {
            let (mut d, mut f, mut n, mut x) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..repeats {
                d.push(open_loop(&client, &direct, &body("m", stream), rate, secs).await);
                f.push(open_loop(&client, &off, &body("chat", stream), rate, secs).await);
                n.push(open_loop(&client, &on, &body("chat", stream), rate, secs).await);
                x.push(open_loop(&client, &dead, &body("chat", stream), rate, secs).await);
            }
            let m = |runs: &[Run], f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
            let (dp50, dp99) = (m(&d, |r| r.p50_ms), m(&d, |r| r.p99_ms));
            let errors: usize = (d.iter().chain(&f).chain(&n).chain(&x)).map(|r| r.errors).sum();
            println!(
                "{:<10} | {:>8.3}ms {:>8.3}ms | {:>11.3}ms {:>11.3}ms | {:>10.3}ms {:>10.3}ms | {:>12.3}ms {:>12.3}ms | {:>6}",
                if stream { "stream" } else { "non-stream" },
                dp50,
                dp99,
                m(&f, |r| r.p50_ms) - dp50,
                m(&f, |r| r.p99_ms) - dp99,
                m(&n, |r| r.p50_ms) - dp50,
                m(&n, |r| r.p99_ms) - dp99,
                m(&x, |r| r.p50_ms) - dp50,
                m(&x, |r| r.p99_ms) - dp99,
                errors
            );
        }
        tokio::time::sleep(probeok::trace::export::FLUSH_EVERY * 4).await;
        println!(
            "spans received by the collector: {}, dropped: {}; to the collector that is down, dropped: {}",
            spans.load(Ordering::Relaxed),
            tracer.dropped(),
            dead_tracer.dropped()
        );
    });
}
