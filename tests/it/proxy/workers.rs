//! The proxy's workers (`[proxy] workers`): threads each with a single-threaded runtime, its
//! own socket and upstream pool, in front of a fake OpenAI-compatible upstream (real HTTP on
//! 127.0.0.1:0, OpenAI's documented chat completion). Requests are taken by more than one
//! worker, on a listener handed over as on sockets the proxy binds itself (`SO_REUSEPORT`);
//! an address already served is refused, not shared; `max_connections` bounds the workers
//! together.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{fake, openai, Reply, Server};
use probeok::config::Config;
use probeok::proxy::{self, Proxy, WeightsView};
use serde_json::json as j;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn config(up: &Server, workers: u32) -> Config {
    let mut config = super::one_route(up);
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

/// `max_connections` bounds the workers together, not each: with one connection allowed, a
/// second client's request reaches the upstream only once the first client's connection has
/// closed, though the other worker is idle. (By causality: the first connection's next
/// request is answered while the second waits.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_bounds_every_worker_together() {
    use axum::routing::post;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::Semaphore;

    // The upstream notes each request's message and holds the first until released.
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let release = Arc::new(Semaphore::new(0));
    let (arrived_tx, mut arrived) = mpsc::unbounded_channel::<String>();
    let (s, r) = (seen.clone(), release.clone());
    let router = axum::Router::new().route(
        "/chat/completions",
        post(move |axum::Json(body): axum::Json<serde_json::Value>| {
            let (seen, release, arrived) = (s.clone(), r.clone(), arrived_tx.clone());
            async move {
                let said = body["messages"][0]["content"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                seen.lock().unwrap().push(said.clone());
                let _ = arrived.send(said.clone());
                if said == "first" {
                    release.acquire().await.unwrap().forget();
                }
                axum::Json(openai::body(&format!("re {said}"), "stop", Some(3)))
            }
        }),
    );
    let up = common::spawn(router).await;
    let mut config = config(&up, 2);
    config.proxy.max_connections = 1;
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, _prx) = mpsc::channel(4096);
    let p = Proxy::new(&config, wrx, ptx).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p.clone(), shutdown.clone()));

    let ask = |http: reqwest::Client, said: &'static str| {
        let url = format!("{base}/v1/chat/completions");
        async move {
            let r = http
                .post(url)
                .json(&j!({"model": "chat", "messages": [{"role": "user", "content": said}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let body: serde_json::Value = r.json().await.unwrap();
            body["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let holder = reqwest::Client::new();
    let first = tokio::spawn(ask(holder.clone(), "first"));
    let got = tokio::time::timeout(Duration::from_secs(10), arrived.recv()).await;
    assert_eq!(got.unwrap().as_deref(), Some("first"));
    // The second client connects and sends its whole request while the first holds the only
    // connection: its bytes wait in the kernel, ahead of everything below.
    let addr = base.trim_start_matches("http://").to_owned();
    let body =
        j!({"model": "chat", "messages": [{"role": "user", "content": "second"}]}).to_string();
    let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    raw.write_all(head.as_bytes()).await.unwrap();
    raw.write_all(body.as_bytes()).await.unwrap();
    let second = tokio::spawn(async move {
        let mut answer = String::new();
        raw.read_to_string(&mut answer).await.unwrap();
        answer
    });
    release.add_permits(1);
    assert_eq!(first.await.unwrap(), "re first");
    // The first client's connection stays open and is served again…
    let again = tokio::time::timeout(Duration::from_secs(10), ask(holder.clone(), "again")).await;
    assert_eq!(again.expect("the holder is served"), "re again");
    assert_eq!(*seen.lock().unwrap(), ["first", "again"]);
    // …and the second client is served once it closes.
    drop(holder);
    let answered = tokio::time::timeout(Duration::from_secs(10), second).await;
    let answer = answered
        .expect("served once the connection closed")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("re second"), "{answer}");
    assert_eq!(*seen.lock().unwrap(), ["first", "again", "second"]);
    shutdown.cancel();
}
