//! The proxy's bounds against real loopback upstreams: a committed stream's longest life
//! (`[proxy] max_stream_duration`), an upstream SSE line that never ends, bytes that are not
//! UTF-8 in a stream that stays open, and the per-client
//! shares of the async queue, the idempotency keys and the cached answers.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;
use common::{fake, openai, Captured, Reply, Script, Server};
use probeok::config::{Config, ProxyConfig};
use probeok::probe::ProbeOutcome;
use probeok::proxy::{self, Proxy, ProxyOptions, WeightsView};
use probeok::secret::Secret;
use probeok::store::{Store, StoreOptions};
use serde_json::json as j;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

struct Px {
    base: String,
    shutdown: CancellationToken,
    http: reqwest::Client,
    passive: mpsc::Receiver<ProbeOutcome>,
    _store: Store,
    _dir: tempfile::TempDir,
    _weights: watch::Sender<Arc<WeightsView>>,
    _upstream: Server,
}

impl Drop for Px {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn config(up: &Server, tweak: impl FnOnce(&mut Config)) -> Config {
    let mut config = super::one_route(up);
    config.proxy.total_timeout = Duration::from_secs(10);
    tweak(&mut config);
    config
}

async fn start(
    upstream: Server,
    keys: Option<&[&str]>,
    tweak: impl FnOnce(&mut ProxyConfig),
) -> Px {
    start_config(config(&upstream, |c| tweak(&mut c.proxy)), upstream, keys).await
}

async fn start_config(config: Config, upstream: Server, keys: Option<&[&str]>) -> Px {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("p.db"), StoreOptions::default()).unwrap();
    let (wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, prx) = mpsc::channel(4096);
    let p = Proxy::with_options(
        &config,
        wrx,
        ptx,
        ProxyOptions {
            store: Some(store.clone()),
            client_keys: keys.map(|k| k.iter().map(|k| Secret::new(*k)).collect()),
            ..ProxyOptions::default()
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p.clone(), shutdown.clone()));
    Px {
        base: format!("http://{addr}"),
        shutdown,
        http: reqwest::Client::new(),
        passive: prx,
        _store: store,
        _dir: dir,
        _weights: wtx,
        _upstream: upstream,
    }
}

impl Px {
    /// A streamed request; the whole body the client received, within `within`.
    async fn stream(&mut self, within: Duration) -> (StatusCode, String) {
        let body = j!({"model": "chat", "stream": true,
            "messages": [{"role": "user", "content": "hi"}]});
        let r = self
            .http
            .post(format!("{}/v1/chat/completions", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let text = tokio::time::timeout(within, r.text())
            .await
            .expect("the proxy ended the stream in time")
            .unwrap();
        (status, text)
    }

    /// The next passive outcome, within 5 s.
    async fn outcome(&mut self) -> ProbeOutcome {
        tokio::time::timeout(Duration::from_secs(5), self.passive.recv())
            .await
            .expect("a passive outcome")
            .unwrap()
    }
}

/// A stream that would last 10 s ends as `provider_interrupted` once it is older than
/// `max_stream_duration`, although chunks keep arriving well within the idle timeout.
#[tokio::test]
async fn a_stream_older_than_max_stream_duration_is_interrupted() {
    let (server, _) = fake("/chat/completions", |_: &Captured| {
        let chunks = (0..100).map(|i| openai::content(&format!("w{i} ")));
        Reply::now(
            Script::new()
                .every(Duration::from_millis(100), chunks)
                .sse(),
        )
    })
    .await;
    let mut px = start(server, None, |p| {
        p.max_stream_duration = Duration::from_millis(800);
        p.stream_idle_timeout = Duration::from_secs(30);
    })
    .await;
    let started = Instant::now();
    let (status, text) = px.stream(Duration::from_secs(8)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("provider_interrupted"), "{text}");
    assert!(text.contains("(timeout)"), "{text}");
    assert!(!text.contains("w99"), "the stream ran to its end: {text}");
    assert!(started.elapsed() < Duration::from_secs(8));
    let o = px.outcome().await;
    assert!(!o.success);
    assert_eq!(o.error.map(|e| e.kind()), Some("timeout"));
}

/// Bytes that are not UTF-8 end the committed stream as malformed at once, after what came
/// before them, though the upstream keeps the connection open and its later events are fine.
#[tokio::test]
async fn bytes_that_are_not_utf8_end_the_stream_as_malformed_at_once() {
    let (server, _) = fake("/chat/completions", |_: &Captured| {
        let script = Script::new()
            .send(openai::content("hello "))
            .send(Bytes::from_static(
                b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xff\"}}]}\n\n",
            ))
            .send(openai::content("after "))
            .hang();
        Reply::now(script.sse())
    })
    .await;
    let mut px = start(server, None, |p| {
        p.stream_idle_timeout = Duration::from_secs(60);
    })
    .await;
    let (status, text) = px.stream(Duration::from_secs(8)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("hello"), "{text}");
    assert!(text.contains("provider_interrupted"), "{text}");
    assert!(
        !text.contains("after"),
        "nothing past the bad bytes: {text}"
    );
    let o = px.outcome().await;
    assert_eq!(o.error.as_ref().map(|e| e.kind()), Some("malformed"));
    assert!(o.error.unwrap().to_string().contains("UTF-8"));
}

/// An upstream line of 10 MiB without a newline ends the committed stream as malformed
/// (`provider_interrupted`) as soon as it passes 1 MiB; the rest is never read into memory.
#[tokio::test]
async fn an_endless_sse_line_ends_the_stream_as_malformed() {
    let (server, _) = fake("/chat/completions", |_: &Captured| {
        let piece = Bytes::from(vec![b'x'; 64 * 1024]);
        let script = Script::new()
            .send(openai::content("hello "))
            .send("data: {\"choices\":[{\"delta\":{\"content\":\"")
            .send_all((0..160).map(move |_| piece.clone()))
            .hang();
        Reply::now(script.sse())
    })
    .await;
    let mut px = start(server, None, |_| {}).await;
    let (status, text) = px.stream(Duration::from_secs(8)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("hello"), "{text}");
    assert!(text.contains("provider_interrupted"), "{text}");
    assert!(
        text.len() < 64 * 1024,
        "no part of the line reached the client"
    );
    let o = px.outcome().await;
    assert_eq!(o.error.as_ref().map(|e| e.kind()), Some("malformed"));
    assert!(
        o.error
            .unwrap()
            .to_string()
            .contains("longer than 1048576 bytes"),
        "the reason names the bound"
    );
}
