//! The weights feed: ETag/304 and long-poll timing on paused time (in-process, no socket, so
//! the paused clock drives every timer), then SSE over a real socket: the snapshot on
//! connect, change events, resume by `Last-Event-ID`, and shutdown ending a live stream.

use crate::common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::app::*;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use probeok::health::State;
use tokio::time::Instant;
use tower::ServiceExt;

const A: &str = "qwen/bj/qwen-max";
const B: &str = "qwen/sh/qwen-max";
const ROUTES: &[Spec<'static>] = &[
    Spec::new("qwen", "bj", "qwen-max")
        .serves("chat")
        .weight(50),
    Spec::new("qwen", "sh", "qwen-max")
        .serves("chat")
        .weight(50),
];

fn t0() -> chrono::DateTime<chrono::Utc> {
    at("2026-03-04T12:00:00Z")
}

fn healthy() -> probeok::health::HealthSnapshot {
    snapshot(t0(), vec![normal(A, t0()), normal(B, t0())])
}

fn a_critical() -> probeok::health::HealthSnapshot {
    snapshot(
        t0(),
        vec![
            with_state(normal(A, t0()), State::Critical, "error_rate_high"),
            normal(B, t0()),
        ],
    )
}

async fn call(
    h: &Harness,
    uri: &str,
    if_none_match: Option<String>,
) -> (StatusCode, Option<String>, Vec<u8>) {
    let mut req = Request::get(uri);
    if let Some(tag) = if_none_match {
        req = req.header("if-none-match", tag);
    }
    let r = probeok::web::router(h.state.clone())
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let etag = r
        .headers()
        .get("etag")
        .map(|v| v.to_str().unwrap().to_owned());
    let status = r.status();
    let body = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .unwrap()
        .to_vec();
    (status, etag, body)
}

async fn harness() -> (Harness, u64) {
    let h = Harness::new(ROUTES, t0()).await;
    h.publish(healthy());
    tokio::task::yield_now().await;
    let v = h.state.weights.borrow().version;
    (h, v)
}

#[tokio::test(start_paused = true)]
async fn etag_and_304() {
    let (h, v) = harness().await;
    let (code, etag, body) = call(&h, "/api/v1/weights", None).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(etag.as_deref(), Some(format!("\"{v}\"").as_str()));
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["version"], v);
    assert_eq!(json["models"]["chat"][0]["weight"], 50);

    let (code, etag, body) = call(&h, "/api/v1/weights", Some(format!("\"{v}\""))).await;
    assert_eq!(code, StatusCode::NOT_MODIFIED);
    assert_eq!(etag, Some(format!("\"{v}\"")));
    assert!(body.is_empty());
    let (code, ..) = call(&h, "/api/v1/weights", Some(format!("W/\"{v}\", \"1\""))).await;
    assert_eq!(code, StatusCode::NOT_MODIFIED);
    // An old (or future) version gets the current snapshot at once.
    let (code, ..) = call(&h, "/api/v1/weights", Some(format!("\"{}\"", v - 1))).await;
    assert_eq!(code, StatusCode::OK);
    let (code, _, body) = call(&h, "/api/v1/weights?wait=soon", None).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("bad_query"));
}

#[tokio::test(start_paused = true)]
async fn long_poll_waits_the_full_wait_then_304() {
    let (h, v) = harness().await;
    let start = Instant::now();
    let (code, ..) = call(&h, "/api/v1/weights?wait=30s", Some(format!("\"{v}\""))).await;
    assert_eq!(code, StatusCode::NOT_MODIFIED);
    assert_eq!(start.elapsed(), Duration::from_secs(30));

    // Waits are bounded at 60 s.
    let start = Instant::now();
    let (code, ..) = call(&h, "/api/v1/weights?wait=10m", Some(format!("\"{v}\""))).await;
    assert_eq!(code, StatusCode::NOT_MODIFIED);
    assert_eq!(start.elapsed(), Duration::from_secs(60));

    // Identical health publishes during the wait do not wake it with a new version.
    let tx = h.health_tx.clone();
    tokio::spawn(async move {
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send_replace(std::sync::Arc::new(healthy()));
        }
    });
    let start = Instant::now();
    let (code, ..) = call(&h, "/api/v1/weights?wait=20", Some(format!("\"{v}\""))).await;
    assert_eq!(code, StatusCode::NOT_MODIFIED);
    assert_eq!(start.elapsed(), Duration::from_secs(20));
}

#[tokio::test(start_paused = true)]
async fn long_poll_returns_the_new_version_as_soon_as_it_exists() {
    let (h, v) = harness().await;
    let tx = h.health_tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(10)).await;
        tx.send_replace(std::sync::Arc::new(a_critical()));
    });
    let start = Instant::now();
    let (code, etag, body) = call(&h, "/api/v1/weights?wait=30s", Some(format!("\"{v}\""))).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert_eq!(etag, Some(format!("\"{}\"", v + 1)));
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["models"]["chat"][0]["weight"], 0);
    assert_eq!(json["models"]["chat"][1]["weight"], 100);
}

#[tokio::test(start_paused = true)]
async fn long_poll_ends_on_shutdown() {
    let (h, v) = harness().await;
    let token = h.shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        token.cancel();
    });
    let start = Instant::now();
    let (code, ..) = call(&h, "/api/v1/weights?wait=60s", Some(format!("\"{v}\""))).await;
    assert_eq!(code, StatusCode::NOT_MODIFIED);
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

type Events = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<eventsource_stream::Event, String>> + Send>,
>;

async fn subscribe(url: &str, last_event_id: Option<u64>) -> Events {
    let mut req = reqwest::Client::new().get(url);
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id.to_string());
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    Box::pin(
        r.bytes_stream()
            .eventsource()
            .map(|e| e.map_err(|e| e.to_string())),
    )
}

async fn next(events: &mut Events) -> eventsource_stream::Event {
    tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("an event within 5 s")
        .expect("the stream is open")
        .expect("a well-formed event")
}

#[tokio::test]
async fn sse_sends_the_snapshot_then_each_change_and_resumes_by_last_event_id() {
    let (h, v) = harness().await;
    let s = h.serve().await;
    let url = s.url("/api/v1/weights/stream");

    let mut events = subscribe(&url, None).await;
    let first = next(&mut events).await;
    assert_eq!(first.event, "weights");
    assert_eq!(first.id, v.to_string());
    let json: serde_json::Value = serde_json::from_str(&first.data).unwrap();
    assert_eq!(json["version"], v);

    h.publish(a_critical());
    let second = next(&mut events).await;
    assert_eq!(second.event, "weights");
    assert_eq!(second.id, (v + 1).to_string());
    let json: serde_json::Value = serde_json::from_str(&second.data).unwrap();
    assert_eq!(json["models"]["chat"][1]["weight"], 100);

    // Resuming at the current version: nothing until the next change.
    let mut resumed = subscribe(&url, Some(v + 1)).await;
    let quiet = tokio::time::timeout(Duration::from_millis(300), resumed.next()).await;
    assert!(quiet.is_err(), "no event for a client that is up to date");
    // Resuming from an older version: the current one at once.
    let mut behind = subscribe(&url, Some(v)).await;
    assert_eq!(next(&mut behind).await.id, (v + 1).to_string());

    h.publish(healthy());
    assert_eq!(next(&mut resumed).await.id, (v + 2).to_string());
    assert_eq!(next(&mut behind).await.id, (v + 2).to_string());
    assert_eq!(next(&mut events).await.id, (v + 2).to_string());
}

#[tokio::test]
async fn shutdown_ends_live_streams_and_lets_the_server_stop() {
    let (h, _) = harness().await;
    let s = h.serve().await;
    let url = s.url("/api/v1/weights/stream");
    let mut a = subscribe(&url, None).await;
    let mut b = subscribe(&url, None).await;
    next(&mut a).await;
    next(&mut b).await;

    h.shutdown.cancel();
    for events in [&mut a, &mut b] {
        let end = tokio::time::timeout(Duration::from_secs(2), events.next())
            .await
            .expect("the stream ends promptly on shutdown");
        assert!(end.is_none(), "no further event: {end:?}");
    }
    tokio::time::timeout(Duration::from_secs(2), s.handle)
        .await
        .expect("graceful shutdown completes with subscribers connected")
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn sse_heartbeat_comment_every_15_seconds() {
    let (h, v) = harness().await;
    let r = probeok::web::router(h.state.clone())
        .oneshot(
            Request::get("/api/v1/weights/stream")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let mut body = r.into_body().into_data_stream();
    let first = body.next().await.unwrap().unwrap();
    let first = String::from_utf8_lossy(&first).into_owned();
    assert!(first.starts_with("event: weights\n"), "{first}");
    assert!(first.contains(&format!("id: {v}\n")), "{first}");
    let start = Instant::now();
    let beat = body.next().await.unwrap().unwrap();
    assert_eq!(&beat[..], b": heartbeat\n\n");
    assert_eq!(start.elapsed(), Duration::from_secs(15));
}
