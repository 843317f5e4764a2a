//! The monitor's bounds on a served router: public reads beyond their bound get 503
//! `overloaded` with `Retry-After` (other endpoints go on), and the silences endpoint checks
//! the admin token before it reads a byte of the body.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::app::{at, Harness};
use probeok::web::guards::Guards;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUTES: &[common::app::Spec<'static>] =
    &[common::app::Spec::new("qwen", "cn", "m").serves("chat")];

#[tokio::test]
async fn public_reads_past_their_bound_get_503_with_retry_after() {
    let mut h = Harness::new(ROUTES, at("2026-03-04T12:00:00Z")).await;
    h.state.guards = Arc::new(Guards::new(2, Duration::from_millis(100)));
    let guards = h.state.guards.clone();
    let served = h.serve().await;
    let http = reqwest::Client::new();
    let held: Vec<_> = (0..2).map(|_| guards.try_hold().unwrap()).collect();
    assert!(guards.try_hold().is_none());
    for path in [
        "/api/v1/status",
        "/",
        "/incidents",
        "/badges/qwen/cn/m/state.svg",
    ] {
        let r = http.get(served.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 503, "{path}");
        assert_eq!(r.headers()["retry-after"], "1", "{path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "overloaded", "{path}");
    }
    // Liveness, readiness, metrics and the weights feed are not public page reads.
    for path in ["/healthz", "/api/v1/weights", "/metrics"] {
        let r = http.get(served.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    drop(held);
    let r = http.get(served.url("/api/v1/status")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // A read that finds the bound taken waits a little for a place before giving up.
    let one = guards.try_hold().unwrap();
    let _two = guards.try_hold().unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(one);
    });
    let r = http.get(served.url("/api/v1/status")).send().await.unwrap();
    assert_eq!(r.status(), 200, "a place freed within the wait");
    release.await.unwrap();
}

/// Without a token the answer is 401 at once, although the declared body never arrives.
#[tokio::test]
async fn silences_check_the_token_before_reading_the_body() {
    let h = Harness::new(ROUTES, at("2026-03-04T12:00:00Z")).await;
    let served = h.serve().await;
    let mut s = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    let head = "POST /api/v1/admin/silences HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 16000\r\nconnection: close\r\n\r\n{\"routes\":";
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("answered without waiting for the body")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(
        text.starts_with("HTTP/1.1 401") || text.starts_with("HTTP/1.1 403"),
        "{text}"
    );
}
