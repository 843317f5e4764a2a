//! Shared helpers for integration tests: fake upstreams are small, REAL axum HTTP servers on
//! `127.0.0.1:0`, with request capture and response bodies whose timing is scripted.
//!
//! - [`spawn`] serves any `Router`; [`fake`] serves one path with a closure that sees each
//!   captured request and returns a [`Reply`] (optionally delayed before the headers).
//! - [`Script`] builds a body sent chunk by chunk at fixed offsets (no drift), that can end
//!   cleanly, be cut (connection reset mid-body) or hang.
//! - [`openai`] and [`anthropic`] build SSE frames and JSON bodies in each dialect.

// Each test binary compiles this module and uses a different subset of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::serve::ListenerExt;
use axum::Router;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A running fake server; aborted when dropped.
pub struct Server {
    pub addr: SocketAddr,
    handle: JoinHandle<()>,
}

impl Server {
    /// A server the test spawned itself; aborted when dropped like the others.
    pub fn from_parts(addr: SocketAddr, handle: JoinHandle<()>) -> Self {
        Self { addr, handle }
    }

    /// `http://127.0.0.1:PORT` (no trailing slash), for `base_url`s.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Serves `router` on a fresh loopback port. `TCP_NODELAY` is set on accepted connections so
/// scripted chunk timings reach the client as scripted (no Nagle batching). Handlers can
/// extract `ConnectInfo<SocketAddr>`.
pub async fn spawn(router: Router) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let handle = tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    Server { addr, handle }
}

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Captured {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The client's address: the same port on two requests means a reused connection.
    pub peer: SocketAddr,
}

impl Captured {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Every request a [`fake`] received, in order.
#[derive(Debug, Clone, Default)]
pub struct Requests(Arc<Mutex<Vec<Captured>>>);

impl Requests {
    pub fn all(&self) -> Vec<Captured> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn last(&self) -> Captured {
        self.all().pop().expect("the fake received a request")
    }
}

/// What a fake answers: a response, sent after `delay` (nothing at all, not even headers,
/// before then).
pub struct Reply {
    pub delay: Duration,
    pub response: Response,
}

impl Reply {
    pub fn now(response: impl IntoResponse) -> Self {
        Self {
            delay: Duration::ZERO,
            response: response.into_response(),
        }
    }

    pub fn after(delay: Duration, response: impl IntoResponse) -> Self {
        Self {
            delay,
            response: response.into_response(),
        }
    }
}

/// A fake upstream serving `path` (any method) with `respond`, capturing every request.
pub async fn fake<F>(path: &str, respond: F) -> (Server, Requests)
where
    F: Fn(&Captured) -> Reply + Send + Sync + 'static,
{
    let requests = Requests::default();
    let respond = Arc::new(respond);
    let seen = requests.clone();
    let handler = move |ConnectInfo(peer): ConnectInfo<SocketAddr>,
                        method: Method,
                        uri: Uri,
                        headers: HeaderMap,
                        body: Bytes| {
        let respond = respond.clone();
        let seen = seen.clone();
        async move {
            let captured = Captured {
                method,
                path: uri.path().to_owned(),
                headers,
                body,
                peer,
            };
            seen.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(captured.clone());
            let reply = respond(&captured);
            tokio::time::sleep(reply.delay).await;
            reply.response
        }
    };
    let server = spawn(Router::new().route(path, any(handler))).await;
    (server, requests)
}

enum Step {
    Send(Duration, Bytes),
    Cut(Duration),
    Hang,
}

/// A response body sent in scripted chunks. Offsets are absolute from the moment the body
/// starts streaming (right after the headers), so small scheduling delays do not accumulate.
#[derive(Default)]
pub struct Script {
    steps: Vec<Step>,
    at: Duration,
}

impl Script {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends `chunk` at the current offset.
    pub fn send(mut self, chunk: impl Into<Bytes>) -> Self {
        self.steps.push(Step::Send(self.at, chunk.into()));
        self
    }

    /// Moves the offset `delay` later, then sends `chunk`.
    pub fn after(mut self, delay: Duration, chunk: impl Into<Bytes>) -> Self {
        self.at += delay;
        self.send(chunk)
    }

    /// Sends each chunk `every` after the previous one (the first one after `every` too).
    pub fn every<I, B>(mut self, every: Duration, chunks: I) -> Self
    where
        I: IntoIterator<Item = B>,
        B: Into<Bytes>,
    {
        for c in chunks {
            self = self.after(every, c);
        }
        self
    }

    /// Sends all chunks at the current offset.
    pub fn send_all<I, B>(mut self, chunks: I) -> Self
    where
        I: IntoIterator<Item = B>,
        B: Into<Bytes>,
    {
        for c in chunks {
            self = self.send(c);
        }
        self
    }

    /// Fails the body at the current offset: the server aborts the connection mid-body.
    pub fn cut(mut self) -> Self {
        self.steps.push(Step::Cut(self.at));
        self
    }

    /// Never sends another byte and never ends.
    pub fn hang(mut self) -> Self {
        self.steps.push(Step::Hang);
        self
    }

    pub fn into_body(self) -> Body {
        let steps = std::collections::VecDeque::from(self.steps);
        let stream = futures_util::stream::unfold(
            (steps, None::<Instant>),
            |(mut steps, start)| async move {
                let start = start.unwrap_or_else(Instant::now);
                match steps.pop_front()? {
                    Step::Send(at, bytes) => {
                        tokio::time::sleep_until(start + at).await;
                        Some((Ok::<_, std::io::Error>(bytes), (steps, Some(start))))
                    }
                    Step::Cut(at) => {
                        tokio::time::sleep_until(start + at).await;
                        Some((
                            Err(std::io::Error::other("scripted cut")),
                            (std::collections::VecDeque::new(), Some(start)),
                        ))
                    }
                    Step::Hang => {
                        futures_util::future::pending::<()>().await;
                        None
                    }
                }
            },
        );
        Body::from_stream(stream)
    }

    /// A 200 `text/event-stream` response with this body.
    pub fn sse(self) -> Response {
        with_type(StatusCode::OK, "text/event-stream", self.into_body())
    }

    /// A 200 `application/json` response with this body (for slow or cut JSON bodies).
    pub fn json(self) -> Response {
        with_type(StatusCode::OK, "application/json", self.into_body())
    }
}

/// A response with a status, a content type and a body.
pub fn with_type(status: StatusCode, content_type: &'static str, body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A JSON response with `status`.
pub fn json(status: StatusCode, value: serde_json::Value) -> Response {
    with_type(status, "application/json", Body::from(value.to_string()))
}

/// One SSE frame: `data: {data}\n\n`, with an `event:` line when `event` is given.
pub fn frame(event: Option<&str>, data: &str) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// OpenAI-compatible chunks and bodies.
pub mod openai {
    use serde_json::{json, Value};

    use super::frame;

    pub const MODEL: &str = "fake-model-2026-01";

    pub fn content(text: &str) -> String {
        frame(
            None,
            &json!({"id":"c1","object":"chat.completion.chunk","model":MODEL,"system_fingerprint":"fp_fake",
                "choices":[{"index":0,"delta":{"content":text},"finish_reason":null}]})
            .to_string(),
        )
    }

    pub fn finish(reason: &str) -> String {
        frame(
            None,
            &json!({"id":"c1","object":"chat.completion.chunk","model":MODEL,
                "choices":[{"index":0,"delta":{},"finish_reason":reason}]})
            .to_string(),
        )
    }

    pub fn usage(completion_tokens: u32) -> String {
        frame(
            None,
            &json!({"id":"c1","object":"chat.completion.chunk","model":MODEL,"choices":[],
                "usage":{"prompt_tokens":12,"completion_tokens":completion_tokens,"total_tokens":12+completion_tokens}})
            .to_string(),
        )
    }

    pub fn done() -> String {
        frame(None, "[DONE]")
    }

    /// A whole stream: one chunk per piece, the finish, the usage chunk when given, `[DONE]`.
    pub fn stream(pieces: &[&str], finish_reason: &str, usage_tokens: Option<u32>) -> Vec<String> {
        let mut out: Vec<String> = pieces.iter().map(|p| content(p)).collect();
        out.push(finish(finish_reason));
        out.extend(usage_tokens.map(usage));
        out.push(done());
        out
    }

    /// A non-streamed answer.
    pub fn body(text: &str, finish_reason: &str, usage_tokens: Option<u32>) -> Value {
        let mut v = json!({"id":"c1","object":"chat.completion","model":MODEL,"system_fingerprint":"fp_fake",
            "choices":[{"index":0,"message":{"role":"assistant","content":text},"finish_reason":finish_reason}]});
        if let Some(n) = usage_tokens {
            v["usage"] = json!({"prompt_tokens":12,"completion_tokens":n,"total_tokens":12+n});
        }
        v
    }

    /// The error envelope.
    pub fn error(message: &str, kind: &str, code: Option<&str>) -> Value {
        json!({"error":{"message":message,"type":kind,"code":code}})
    }
}

/// Anthropic Messages events and bodies.
pub mod anthropic {
    use serde_json::{json, Value};

    use super::frame;

    pub const MODEL: &str = "claude-fake-20260101";

    fn ev(v: Value) -> String {
        let name = v["type"].as_str().unwrap_or("message").to_owned();
        frame(Some(&name), &v.to_string())
    }

    pub fn message_start() -> String {
        ev(
            json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",
            "model":MODEL,"content":[],"stop_reason":null,"usage":{"input_tokens":12,"output_tokens":1}}}),
        )
    }

    pub fn block_start() -> String {
        ev(
            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
        )
    }

    pub fn text(t: &str) -> String {
        ev(json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":t}}))
    }

    pub fn ping() -> String {
        ev(json!({"type":"ping"}))
    }

    pub fn block_stop() -> String {
        ev(json!({"type":"content_block_stop","index":0}))
    }

    /// `message_delta` with the stop reason and, when given, the final output token count.
    pub fn message_delta(stop_reason: &str, output_tokens: Option<u32>) -> String {
        let mut v = json!({"type":"message_delta","delta":{"stop_reason":stop_reason,"stop_sequence":null}});
        if let Some(n) = output_tokens {
            v["usage"] = json!({"output_tokens": n});
        }
        ev(v)
    }

    pub fn message_stop() -> String {
        ev(json!({"type":"message_stop"}))
    }

    pub fn error_event(kind: &str, message: &str) -> String {
        ev(json!({"type":"error","error":{"type":kind,"message":message}}))
    }

    /// The opening events before the first text delta.
    pub fn head() -> Vec<String> {
        vec![message_start(), block_start(), ping()]
    }

    /// The closing events after the last text delta.
    pub fn tail(stop_reason: &str, output_tokens: Option<u32>) -> Vec<String> {
        vec![
            block_stop(),
            message_delta(stop_reason, output_tokens),
            message_stop(),
        ]
    }

    /// A whole stream: head, one delta per piece, tail.
    pub fn stream(pieces: &[&str], stop_reason: &str, output_tokens: Option<u32>) -> Vec<String> {
        let mut out = head();
        out.extend(pieces.iter().map(|p| text(p)));
        out.extend(tail(stop_reason, output_tokens));
        out
    }

    /// A non-streamed message.
    pub fn body(text: &str, stop_reason: &str, output_tokens: Option<u32>) -> Value {
        let mut v = json!({"id":"msg_1","type":"message","role":"assistant","model":MODEL,
            "content":[{"type":"text","text":text}],"stop_reason":stop_reason,"stop_sequence":null});
        v["usage"] = match output_tokens {
            Some(n) => json!({"input_tokens":12,"output_tokens":n}),
            None => json!({"input_tokens":12}),
        };
        v
    }

    /// The error envelope.
    pub fn error(kind: &str, message: &str) -> Value {
        json!({"type":"error","error":{"type":kind,"message":message}})
    }
}

/// A loopback port free right now, for a process the test starts that must bind it itself.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An OpenAI-compatible upstream that streams `PROBE_OK`, or answers 503 (OpenAI's overload
/// body) while `failing` is set.
pub async fn probe_ok_unless(failing: Arc<std::sync::atomic::AtomicBool>) -> Server {
    let (server, _) = fake("/v1/chat/completions", move |_| {
        if failing.load(std::sync::atomic::Ordering::SeqCst) {
            Reply::now(json(
                StatusCode::SERVICE_UNAVAILABLE,
                openai::error("overloaded", "server_error", None),
            ))
        } else {
            Reply::now(
                Script::new()
                    .send_all(openai::stream(&["PROBE_OK"], "stop", Some(3)))
                    .sse(),
            )
        }
    })
    .await;
    server
}
