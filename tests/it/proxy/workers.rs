//! The proxy's workers (`[proxy] workers`): threads each with a single-threaded runtime, its
//! own socket and upstream pool, in front of a fake OpenAI-compatible upstream (real HTTP on
//! 127.0.0.1:0, OpenAI's documented chat completion). Requests are taken by more than one
//! worker, on a listener handed over as on sockets the proxy binds itself (`SO_REUSEPORT`),
//! and an address already served is refused, not shared.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{fake, openai, Reply, Server};
use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig};
use probeok::proxy::{self, Proxy, WeightsView};
use probeok::route::Tier;
use serde_json::json as j;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn config(up: &Server, workers: u32) -> Config {
    let mut config = Config::default();
    config.providers.push(ProviderConfig {
        id: "p".into(),
        regions: vec![RegionConfig {
            id: "r".into(),
            base_url: up.base_url(),
        }],
        ..ProviderConfig::default()
    });
    config.routes.push(RouteConfig {
        provider: "p".into(),
        region: "r".into(),
        model: "up".into(),
        serves: "chat".into(),
        tier: Tier::Primary,
        weight: 100,
        ..RouteConfig::default()
    });
    config.proxy.enabled = true;
    config.proxy.workers = workers;
    config
}

async fn upstream() -> Server {
    let (server, _) = fake("/chat/completions", |_| {
        Reply::now(axum::Json(openai::body("hello", "stop", Some(3))))
    })
    .await;
    server
}

/// One request on a connection of its own (the kernel picks the worker per connection).
async fn one(base: &str) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&j!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "hello", "{body}");
}

/// Sends rounds of 16 requests at once, each on a new connection, until every worker has
/// taken some (within 20 s); answers how many were sent.
async fn until_every_worker_served(base: &str, p: &Proxy) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    loop {
        let round: Vec<_> = (0..16)
            .map(|_| {
                let base = base.to_owned();
                tokio::spawn(async move { one(&base).await })
            })
            .collect();
        for r in round {
            r.await.unwrap();
        }
        sent += 16;
        let served = p.served_by_worker();
        if served.iter().all(|&n| n > 0) {
            return sent;
        }
        assert!(
            Instant::now() < deadline,
            "after {sent} requests on new connections, some worker took none: {served:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_a_handed_over_listener_are_served_by_every_worker() {
    let up = upstream().await;
    let config = config(&up, 2);
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, _prx) = mpsc::channel(4096);
    let p = Proxy::new(&config, wrx, ptx).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(proxy::serve(listener, p.clone(), shutdown.clone()));

    let sent = until_every_worker_served(&base, &p).await;
    let by_worker = p.served_by_worker();
    assert_eq!(by_worker.len(), 2);
    assert_eq!(by_worker.iter().sum::<u64>(), sent, "{by_worker:?}");

    // Graceful shutdown ends every worker.
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the workers stop")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_bind_one_address_with_a_socket_each_and_refuse_one_in_use() {
    let up = upstream().await;
    let config = config(&up, 2);
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, _prx) = mpsc::channel(4096);
    let p = Proxy::new(&config, wrx, ptx).unwrap();
    let listeners = proxy::bind("127.0.0.1:0".parse().unwrap(), 2).unwrap();
    let addr = listeners.local_addr().unwrap();
    match &listeners {
        proxy::Listeners::PerWorker(sockets) => {
            assert_eq!(sockets.len(), 2);
            for s in sockets {
                assert_eq!(s.local_addr().unwrap(), addr);
            }
        }
        proxy::Listeners::Shared(_) => panic!("two workers bound one socket"),
    }
    // Another proxy on the same address is refused, not handed half the connections.
    let again = proxy::bind(addr, 2).err().expect("the address is in use");
    assert_eq!(again.kind(), std::io::ErrorKind::AddrInUse, "{again}");

    let shutdown = CancellationToken::new();
    let served = tokio::spawn(proxy::serve(listeners, p.clone(), shutdown.clone()));
    let base = format!("http://{addr}");
    until_every_worker_served(&base, &p).await;

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the workers stop")
        .unwrap()
        .unwrap();
}
