//! The proxy seen from the monitor, and its listener: the proxy's listener against slow-loris clients, breaker state and proxy counters
//! on the monitor's `/metrics` and `/api/v1/status`, and the standalone proxy's batched ingest
//! into a real monitor.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::{fake, json, openai, Captured, Reply, Requests, Server};
use probeok::config::{Config, ProviderConfig, ProxyConfig, RegionConfig, RouteConfig};
use probeok::proxy::{self, Proxy, ProxyOptions, WeightsView};
use probeok::route::Tier;
use serde_json::{json as j, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

struct Up {
    server: Server,
    reqs: Requests,
}

async fn up<F>(respond: F) -> Up
where
    F: Fn(&Captured) -> Reply + Send + Sync + 'static,
{
    let (server, reqs) = fake("/chat/completions", respond).await;
    Up { server, reqs }
}

fn ok_body(text: &str) -> Reply {
    Reply::now(json(StatusCode::OK, openai::body(text, "stop", Some(3))))
}

fn failing() -> Reply {
    Reply::now(json(
        StatusCode::SERVICE_UNAVAILABLE,
        openai::error("boom", "server_error", None),
    ))
}

/// Routes `p{i}/r/up-{i}` serving `chat`, the first primary.
fn config(ups: &[&Up], tweak: impl FnOnce(&mut ProxyConfig)) -> Config {
    let mut config = Config::default();
    for (i, u) in ups.iter().enumerate() {
        config.providers.push(ProviderConfig {
            id: format!("p{i}"),
            api_key_env: Some(format!("PROBEOK_TEST_PROXY3_KEY_{i}")),
            regions: vec![RegionConfig {
                id: "r".into(),
                base_url: u.server.base_url(),
            }],
            ..ProviderConfig::default()
        });
        config.routes.push(RouteConfig {
            provider: format!("p{i}"),
            region: "r".into(),
            model: format!("up-{i}"),
            serves: "chat".into(),
            tier: if i == 0 { Tier::Primary } else { Tier::Backup },
            weight: if i == 0 { 100 } else { 0 },
            ..RouteConfig::default()
        });
        config.env.set(
            format!("PROBEOK_TEST_PROXY3_KEY_{i}"),
            format!("sk-upstream3-key-{i}-0123456789"),
        );
    }
    config.proxy.enabled = true;
    config.proxy.total_timeout = Duration::from_secs(10);
    tweak(&mut config.proxy);
    config
}

struct Px {
    base: String,
    addr: std::net::SocketAddr,
    shutdown: CancellationToken,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    proxy: Proxy,
    _weights: watch::Sender<Arc<WeightsView>>,
}

async fn start(
    config: &Config,
    passive: mpsc::Sender<probeok::probe::ProbeOutcome>,
    opts: ProxyOptions,
) -> Px {
    let (wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let p = Proxy::with_options(config, wrx, passive, opts).expect("proxy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(proxy::serve(listener, p.clone(), shutdown.clone()));
    Px {
        base: format!("http://{addr}"),
        addr,
        shutdown,
        served,
        proxy: p,
        _weights: wtx,
    }
}

fn chat() -> Value {
    j!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
}

async fn post(px: &Px, http: &reqwest::Client) -> reqwest::Response {
    http.post(format!("{}/v1/chat/completions", px.base))
        .json(&chat())
        .send()
        .await
        .expect("proxy answers")
}

// Paused time: the 300 ms header timeout is measured exactly, whatever the load.
#[tokio::test(start_paused = true)]
async fn a_slow_loris_client_is_disconnected_after_the_header_timeout() {
    let a = up(|_| ok_body("from a")).await;
    let (ptx, _prx) = mpsc::channel(64);
    let px = start(
        &config(&[&a], |_| {}),
        ptx,
        ProxyOptions {
            header_read_timeout: Duration::from_millis(300),
            ..ProxyOptions::default()
        },
    )
    .await;

    // Half a request line, then nothing: the proxy hangs up after the timeout.
    let mut loris = tokio::net::TcpStream::connect(px.addr).await.unwrap();
    loris.write_all(b"POST /v1/chat/compl").await.unwrap();
    let t = Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), loris.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the slow client was never disconnected");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(400),
        "disconnected after {waited:?}"
    );
    assert!(
        !String::from_utf8_lossy(&buf).contains("200 OK"),
        "no answer for half a request"
    );

    // A normal request (and a second on the same kept-alive connection) still works.
    let http = reqwest::Client::new();
    for _ in 0..2 {
        let r = post(&px, &http).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-probeok-route"], "p0/r/up-0");
    }
    assert_eq!(a.reqs.all().len(), 2);

    // Shutdown ends the server, with the client's idle keep-alive connection still open.
    px.shutdown.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(5), px.served).await;
    assert!(
        matches!(ended, Ok(Ok(Ok(())))),
        "the server did not stop: {ended:?}"
    );
}

const MONITOR_ROUTES: &[common::app::Spec<'static>] = &[
    common::app::Spec::new("p0", "r", "up-0").serves("chat"),
    common::app::Spec::new("p1", "r", "up-1")
        .serves("chat")
        .backup()
        .weight(0),
];

#[tokio::test]
async fn breaker_state_and_proxy_counters_show_on_metrics_and_status() {
    let a = up(|_| failing()).await;
    let b = up(|_| ok_body("from b")).await;
    let monitor =
        common::app::Harness::new(MONITOR_ROUTES, common::app::at("2026-01-01T00:00:00Z")).await;
    let served = monitor.serve().await;
    let http = reqwest::Client::new();

    // No proxy attached: no proxy families, no breaker field.
    let text = http.get(served.url("/metrics")).send().await.unwrap();
    let text = text.text().await.unwrap();
    assert!(!text.contains("probeok_proxy_"), "{text}");
    let status: Value = http
        .get(served.url("/api/v1/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(status["routes"][0].get("breaker").is_none(), "{status}");

    let (ptx, _prx) = mpsc::channel(64);
    let px = start(
        &config(&[&a, &b], |p| {
            p.max_retry_wait = Duration::ZERO;
            p.breaker.open_for = Duration::from_secs(60);
        }),
        ptx,
        ProxyOptions::default(),
    )
    .await;
    monitor.state.metrics.attach_proxy(px.proxy.stats());
    for _ in 0..5 {
        let r = post(&px, &http).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(a.reqs.all().len(), 5, "a's breaker opened after 5 failures");
    let r = post(&px, &http).await;
    assert_eq!(r.headers()["x-probeok-fallback-reason"], "breaker_open");

    let text = http
        .get(served.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "probeok_proxy_breaker_state{route=\"p0/r/up-0\"} 2",
        "probeok_proxy_breaker_state{route=\"p1/r/up-1\"} 0",
        "probeok_proxy_requests_total{serves=\"chat\",route=\"p1/r/up-1\",outcome=\"ok\"} 6",
        "probeok_proxy_failovers_total{reason=\"http_503\"} 5",
        "probeok_proxy_failovers_total{reason=\"breaker_open\"} 1",
        "probeok_proxy_dropped_total{what=\"passive\"} 0",
        "# TYPE probeok_proxy_breaker_state gauge",
        "# TYPE probeok_proxy_requests counter",
        // Every answer is complete: nothing in flight.
        "probeok_proxy_in_flight{route=\"p0/r/up-0\"} 0",
        "probeok_proxy_in_flight{route=\"p1/r/up-1\"} 0",
        "probeok_proxy_provider_in_flight{provider=\"p1\"} 0",
        "# TYPE probeok_proxy_in_flight gauge",
        "# TYPE probeok_proxy_provider_in_flight gauge",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in:\n{text}"
        );
    }
    assert!(text.ends_with("# EOF\n"));

    let status: Value = http
        .get(served.url("/api/v1/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let breaker_of = |id: &str| {
        status["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .map(|r| r["breaker"].clone())
            .unwrap()
    };
    assert_eq!(breaker_of("p0/r/up-0"), "open");
    assert_eq!(breaker_of("p1/r/up-1"), "closed");
    monitor.shutdown.cancel();
}

/// The standalone proxy's passive outcomes reach a real monitor's `POST /api/v1/ingest` (which
/// refuses anything without the bearer token), in batches.
#[tokio::test]
async fn standalone_ingest_reaches_a_real_monitor_with_its_token() {
    let a = up(|_| ok_body("from a")).await;
    let b = up(|_| ok_body("from b")).await;
    let mut monitor = common::app::Harness::new(MONITOR_ROUTES, chrono::Utc::now()).await;
    let served = monitor.serve().await;

    let (ptx, prx) = mpsc::channel(64);
    let (ingest, dropped) = proxy::remote::ingest_with(
        served.url(""),
        Some(probeok::secret::Secret::new("test-ingest-token")),
        prx,
        proxy::remote::IngestOptions {
            batch: 4,
            buffer: 100,
            every: Duration::from_millis(100),
        },
    );
    let px = start(&config(&[&a, &b], |_| {}), ptx, ProxyOptions::default()).await;
    let http = reqwest::Client::new();
    for _ in 0..6 {
        assert_eq!(post(&px, &http).await.status(), 200);
    }
    let mut got = Vec::new();
    while got.len() < 6 {
        let o = tokio::time::timeout(Duration::from_secs(5), monitor.passive_rx.recv())
            .await
            .expect("outcomes reach the monitor")
            .expect("passive channel open");
        got.push(o);
    }
    assert!(got.iter().all(|o| o.route.as_str() == "p0/r/up-0"
        && o.kind == probeok::probe::OutcomeKind::Passive
        && o.success));
    assert_eq!(dropped.load(std::sync::atomic::Ordering::Relaxed), 0);
    let text = http
        .get(served.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("probeok_ingest_items_total{result=\"accepted\"} 6"),
        "{text}"
    );

    // The proxy stops: its senders close and the ingest task ends.
    px.shutdown.cancel();
    drop(px);
    tokio::time::timeout(Duration::from_secs(5), ingest)
        .await
        .expect("ingest ends with the proxy")
        .unwrap();
    monitor.shutdown.cancel();
}

/// A standalone proxy's reading of the upstream's rate-limit headers travels with its passive
/// outcome through `POST /api/v1/ingest` to the monitor, held to the same rules there.
#[tokio::test]
async fn standalone_ingest_carries_the_rate_limit_headroom() {
    let a = up(|_| {
        let mut h = axum::http::HeaderMap::new();
        for (k, v) in [
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "12"),
            ("x-ratelimit-limit-tokens", "0"),
            ("x-ratelimit-remaining-tokens", "0"),
        ] {
            h.insert(k, v.parse().unwrap());
        }
        Reply::now((h, json(StatusCode::OK, openai::body("hi", "stop", Some(3)))))
    })
    .await;
    let b = up(|_| ok_body("from b")).await;
    let mut monitor = common::app::Harness::new(MONITOR_ROUTES, chrono::Utc::now()).await;
    let served = monitor.serve().await;
    let (ptx, prx) = mpsc::channel(64);
    let (ingest, _dropped) = proxy::remote::ingest_with(
        served.url(""),
        Some(probeok::secret::Secret::new("test-ingest-token")),
        prx,
        proxy::remote::IngestOptions {
            batch: 4,
            buffer: 100,
            every: Duration::from_millis(100),
        },
    );
    let px = start(&config(&[&a, &b], |_| {}), ptx, ProxyOptions::default()).await;
    let http = reqwest::Client::new();
    assert_eq!(post(&px, &http).await.status(), 200);
    let o = tokio::time::timeout(Duration::from_secs(5), monitor.passive_rx.recv())
        .await
        .expect("the outcome reaches the monitor")
        .expect("passive channel open");
    let limits = o.ratelimit.expect("the reading travels with the outcome");
    assert_eq!(limits.requests, probeok::ratelimit::Quota::new(12, 500));
    assert_eq!(limits.tokens, None, "a limit of 0 is no figure");
    px.shutdown.cancel();
    drop(px);
    tokio::time::timeout(Duration::from_secs(5), ingest)
        .await
        .expect("ingest ends with the proxy")
        .unwrap();
    monitor.shutdown.cancel();
}

/// With the monitor down the buffer stays bounded (the oldest are dropped and counted); when
/// the monitor comes back the newest outcomes arrive.
#[tokio::test]
async fn standalone_ingest_buffer_is_bounded_while_the_monitor_is_down() {
    let mut monitor = common::app::Harness::new(MONITOR_ROUTES, chrono::Utc::now()).await;
    // An address with nobody listening, for now.
    let addr = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let (tx, rx) = mpsc::channel(256);
    let (ingest, dropped) = proxy::remote::ingest_with(
        format!("http://{addr}"),
        Some(probeok::secret::Secret::new("test-ingest-token")),
        rx,
        proxy::remote::IngestOptions {
            batch: 10,
            buffer: 50,
            every: Duration::from_millis(100),
        },
    );
    let now = chrono::Utc::now();
    for i in 0..80 {
        let o = common::app::outcome(
            "p0/r/up-0",
            probeok::probe::OutcomeKind::Passive,
            now,
            true,
            f64::from(i),
        );
        tx.send(o).await.unwrap();
    }
    // Every outcome taken off the channel (the drop is counted as each one is taken): what
    // was dropped by then is final while the monitor stays down. The deadline bounds a hang.
    let t = Instant::now();
    while tx.capacity() < tx.max_capacity() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the outcomes were never taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        dropped.load(std::sync::atomic::Ordering::Relaxed),
        30,
        "exactly the overflow beyond the buffer is dropped"
    );

    // The monitor comes up on that address: the 50 newest arrive, in order.
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let router = probeok::web::router(monitor.state.clone());
    let stop = monitor.shutdown.clone();
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    });
    let mut got = Vec::new();
    while got.len() < 50 {
        let o = tokio::time::timeout(Duration::from_secs(5), monitor.passive_rx.recv())
            .await
            .expect("buffered outcomes reach the monitor")
            .expect("passive channel open");
        got.push(o.total_ms);
    }
    let expected: Vec<f64> = (30..80).map(f64::from).collect();
    assert_eq!(got, expected);
    drop(tx);
    tokio::time::timeout(Duration::from_secs(5), ingest)
        .await
        .expect("ingest ends")
        .unwrap();
    assert_eq!(dropped.load(std::sync::atomic::Ordering::Relaxed), 30);
    monitor.shutdown.cancel();
}
