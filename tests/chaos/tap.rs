//! The tap between every process and the simulated providers: each process's base URL is
//! `http://TAP/{who}/sim/{region}/v1`, the tap forwards `/{who}/{rest}` to the simulator
//! unchanged (streams stream through as they come), and on the way it
//!
//! - injects provider faults: a region it is told to fail answers 503 with OpenAI's error
//!   body, without reaching the simulator;
//! - counts, per idempotency key a client wrote into its prompt (`chaos-idem-N`), how many
//!   times an upstream answered it with 200: the proxies may retry a refusal on another route
//!   (that is their failover), never a request the upstream did.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;

#[derive(Default)]
pub struct Tap {
    /// Regions answering 503 until the instant.
    failing: Mutex<HashMap<String, Instant>>,
    /// Idempotency marker → upstream 200 answers.
    answered: Mutex<HashMap<String, u32>>,
    sim: Mutex<Option<SocketAddr>>,
    http: reqwest::Client,
}

impl Tap {
    pub fn fail_region(&self, region: &str, until: Instant) {
        self.failing
            .lock()
            .unwrap()
            .insert(region.to_owned(), until);
    }

    pub fn heal(&self) {
        self.failing.lock().unwrap().clear();
    }

    /// Keys an upstream answered more than once, with the count.
    pub fn answered_twice(&self) -> Vec<(String, u32)> {
        let mut v: Vec<_> = self
            .answered
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        v.sort();
        v
    }

    pub fn keys_answered(&self) -> usize {
        self.answered.lock().unwrap().len()
    }

    fn failing(&self, region: &str) -> bool {
        self.failing
            .lock()
            .unwrap()
            .get(region)
            .is_some_and(|until| Instant::now() < *until)
    }
}

/// The marker a client wrote into its prompt: `chaos-idem-` and digits.
fn marker(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let at = text.find("chaos-idem-")?;
    let digits: String = text[at + 11..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    (!digits.is_empty()).then(|| format!("chaos-idem-{digits}"))
}

pub async fn serve(sim: SocketAddr) -> (Arc<Tap>, SocketAddr) {
    let tap = Arc::new(Tap {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .unwrap(),
        ..Tap::default()
    });
    *tap.sim.lock().unwrap() = Some(sim);
    let app = Router::new()
        .route("/{who}/{*rest}", any(forward))
        .with_state(tap.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (tap, addr)
}

async fn forward(
    State(tap): State<Arc<Tap>>,
    Path((_who, rest)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // rest = "sim/{region}/v1/…"
    let region = rest.split('/').nth(1).unwrap_or_default().to_owned();
    if tap.failing(&region) {
        let body = serde_json::json!({"error": {"message": "The service is temporarily unavailable", "type": "server_error", "code": null}});
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    }
    let sim = tap.sim.lock().unwrap().expect("the simulator's address");
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let url = format!("http://{sim}/{rest}{query}");
    let mut req = tap.http.request(method, &url).body(body.clone());
    for (name, value) in &headers {
        if name != "host" && name != "content-length" {
            req = req.header(name, value);
        }
    }
    let upstream = match req.send().await {
        Ok(r) => r,
        Err(_) => return StatusCode::BAD_GATEWAY.into_response(),
    };
    let status = upstream.status();
    if status == StatusCode::OK {
        if let Some(key) = marker(&body) {
            *tap.answered.lock().unwrap().entry(key).or_default() += 1;
        }
    }
    let mut out = Response::builder().status(status);
    for (name, value) in upstream.headers() {
        if name != "content-length" && name != "transfer-encoding" {
            out = out.header(name, value);
        }
    }
    out.body(Body::from_stream(upstream.bytes_stream()))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

#[cfg(test)]
mod tests {
    use super::marker;

    #[test]
    fn the_marker_is_read_from_a_prompt() {
        let body = br#"{"messages":[{"role":"user","content":"hello chaos-idem-42 please"}]}"#;
        assert_eq!(marker(body).as_deref(), Some("chaos-idem-42"));
        assert_eq!(marker(br#"{"content":"PROBE_OK"}"#), None);
        assert_eq!(marker(b"chaos-idem-"), None);
    }
}
