//! The routing proxy against fake upstreams (real axum servers on loopback): failover classes,
//! budgets, the stream watchdog, pass-through timing, mid-stream failures, capability
//! filtering, no model substitution, passive outcomes, headers.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::{fake, json, openai, Captured, Reply, Requests, Script, Server};
use futures_util::StreamExt;
use probeok::config::{Config, ProviderConfig, ProxyConfig, RegionConfig, RouteConfig};
use probeok::probe::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::proxy::{self, Proxy, WeightsView};
use probeok::route::{Capability, Tier};
use serde_json::{json as j, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One fake upstream: a provider `p{i}` with region `r`, serving `chat` with model `up-{i}`.
struct Up {
    server: Server,
    reqs: Requests,
    tier: Tier,
    caps: Vec<Capability>,
    context_window: Option<u32>,
}

async fn up<F>(respond: F) -> Up
where
    F: Fn(&Captured) -> Reply + Send + Sync + 'static,
{
    let (server, reqs) = fake("/chat/completions", respond).await;
    Up {
        server,
        reqs,
        tier: Tier::Primary,
        caps: vec![Capability::Stream],
        context_window: None,
    }
}

fn ok_body(text: &str) -> Reply {
    Reply::now(json(StatusCode::OK, openai::body(text, "stop", Some(3))))
}

fn ok_stream(pieces: &[&str]) -> Reply {
    Reply::now(
        Script::new()
            .send_all(openai::stream(pieces, "stop", Some(3)))
            .sse(),
    )
}

struct Running {
    base: String,
    passive: mpsc::Receiver<ProbeOutcome>,
    weights: watch::Sender<Arc<WeightsView>>,
    shutdown: CancellationToken,
    http: reqwest::Client,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Running {
    async fn post(&self, body: Value) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/chat/completions", self.base))
            .json(&body)
            .send()
            .await
            .expect("proxy answers")
    }

    /// Every passive outcome that arrives within a short while.
    async fn outcomes(&mut self) -> Vec<ProbeOutcome> {
        let mut out = Vec::new();
        while let Ok(Some(o)) =
            tokio::time::timeout(Duration::from_millis(300), self.passive.recv()).await
        {
            out.push(o);
        }
        out
    }
}

/// The first upstream is the only weighted primary, so candidates come in the given order:
/// later upstreams are backups (unless their tier says otherwise).
async fn start(ups: &[&Up], tweak: impl FnOnce(&mut ProxyConfig)) -> Running {
    let mut config = Config::default();
    for (i, u) in ups.iter().enumerate() {
        config.providers.push(ProviderConfig {
            id: format!("p{i}"),
            api_key_env: Some(format!("PROBEOK_TEST_PROXY_KEY_{i}")),
            regions: vec![RegionConfig {
                id: "r".into(),
                base_url: u.server.base_url(),
            }],
            ..ProviderConfig::default()
        });
        let tier = if i == 0 {
            u.tier
        } else {
            Tier::Backup.max(u.tier)
        };
        config.routes.push(RouteConfig {
            provider: format!("p{i}"),
            region: "r".into(),
            model: format!("up-{i}"),
            serves: "chat".into(),
            tier,
            weight: 100,
            capabilities: u.caps.clone(),
            context_window: u.context_window,
            ..RouteConfig::default()
        });
        config.env.set(
            format!("PROBEOK_TEST_PROXY_KEY_{i}"),
            format!("sk-upstream-key-{i}-0123456789"),
        );
    }
    config.proxy.enabled = true;
    config.proxy.total_timeout = Duration::from_secs(10);
    tweak(&mut config.proxy);
    let (wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, prx) = mpsc::channel(256);
    let p = Proxy::new(&config, wrx, ptx).expect("proxy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p, shutdown.clone()));
    Running {
        base: format!("http://{addr}"),
        passive: prx,
        weights: wtx,
        shutdown,
        http: reqwest::Client::new(),
    }
}

fn chat(stream: bool) -> Value {
    j!({"model": "chat", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Reads an SSE body to its end, returning each event's data with its arrival time.
async fn sse_events(r: reqwest::Response) -> Vec<(Instant, String)> {
    let mut out = Vec::new();
    let mut buf = String::new();
    let mut body = r.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.expect("body chunk");
        buf.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        while let Some(end) = buf.find("\n\n") {
            let ev: String = buf.drain(..end + 2).collect();
            let data: Vec<&str> = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect();
            out.push((Instant::now(), data.join("\n")));
        }
    }
    out
}

fn text_of(events: &[(Instant, String)]) -> String {
    events
        .iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test]
async fn non_streaming_answer_headers_model_name_and_keys() {
    let a = up(|_| ok_body("hello")).await;
    let mut px = start(&[&a], |_| {}).await;
    let r = px
        .http
        .post(format!("{}/v1/chat/completions", px.base))
        .header("authorization", "Bearer client-key")
        .header("x-request-id", "req-given-1")
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-route"), "p0/r/up-0");
    assert_eq!(header(&r, "x-probeok-attempts"), "1");
    assert_eq!(header(&r, "x-probeok-mode"), "normal");
    assert_eq!(header(&r, "x-request-id"), "req-given-1");
    assert!(r.headers().get("x-probeok-fallback-reason").is_none());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "hello");

    let got = a.reqs.last();
    assert_eq!(
        got.json()["model"],
        "up-0",
        "the route gets its own model name"
    );
    assert_eq!(got.json()["messages"][0]["content"], "hi");
    assert_eq!(
        got.header("authorization"),
        Some("Bearer sk-upstream-key-0-0123456789"),
        "our key, never the client's"
    );
    assert_eq!(got.header("x-request-id"), Some("req-given-1"));

    let r = px.post(chat(false)).await;
    assert!(header(&r, "x-request-id").starts_with("req_"), "generated");

    let outcomes = px.outcomes().await;
    assert_eq!(outcomes.len(), 2);
    let o = &outcomes[0];
    assert_eq!(o.kind, OutcomeKind::Passive);
    assert!(o.success);
    assert_eq!(o.route.as_str(), "p0/r/up-0");
    assert_eq!(o.output_tokens, Some(3));
    assert!(o.ttfb_ms.is_some() && o.total_ms >= o.ttfb_ms.unwrap());
    assert_eq!(o.answer, None, "real answers are never kept");
}

#[tokio::test]
async fn client_errors_are_returned_as_is_and_never_retried() {
    let a = up(|_| {
        Reply::now(json(
            StatusCode::BAD_REQUEST,
            openai::error(
                "messages[0].role is invalid",
                "invalid_request_error",
                Some("invalid_value"),
            ),
        ))
    })
    .await;
    let b = up(|_| ok_body("from b")).await;
    let mut px = start(&[&a, &b], |_| {}).await;
    let r = px.post(chat(false)).await;
    assert_eq!(r.status(), 400);
    assert_eq!(header(&r, "x-probeok-route"), "p0/r/up-0");
    assert_eq!(header(&r, "x-probeok-attempts"), "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_value");
    assert_eq!(
        b.reqs.all().len(),
        0,
        "a client's fault is never tried elsewhere"
    );

    // A content-policy refusal is the client's fault too.
    let c = up(|_| {
        Reply::now(json(
            StatusCode::BAD_REQUEST,
            openai::error(
                "inappropriate",
                "data_inspection_failed",
                Some("data_inspection_failed"),
            ),
        ))
    })
    .await;
    let d = up(|_| ok_body("from d")).await;
    let px2 = start(&[&c, &d], |_| {}).await;
    assert_eq!(px2.post(chat(true)).await.status(), 400);
    assert_eq!(d.reqs.all().len(), 0);

    let outcomes = px.outcomes().await;
    assert_eq!(outcomes.len(), 1);
    assert!(!outcomes[0].success);
    assert_eq!(outcomes[0].http_status, Some(400));
    assert!(
        probeok::health::classify::is_client_fault(outcomes[0].error.as_ref().unwrap()),
        "detection ignores it"
    );
}

#[tokio::test]
async fn auth_failures_move_on_and_all_401_is_502() {
    let unauthorized = |_: &Captured| {
        Reply::now(json(
            StatusCode::UNAUTHORIZED,
            openai::error(
                "Incorrect API key provided",
                "invalid_request_error",
                Some("invalid_api_key"),
            ),
        ))
    };
    let a = up(unauthorized).await;
    let b = up(|_| ok_body("from b")).await;
    let mut px = start(&[&a, &b], |_| {}).await;
    let r = px.post(chat(false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1");
    assert_eq!(header(&r, "x-probeok-attempts"), "2");
    assert_eq!(header(&r, "x-probeok-mode"), "fallback");
    assert_eq!(header(&r, "x-probeok-fallback-reason"), "http_401");
    assert_eq!(b.reqs.last().json()["model"], "up-1");
    let outcomes = px.outcomes().await;
    assert_eq!(outcomes.len(), 2);
    assert_eq!(
        outcomes[0].error.as_ref().and_then(ProbeError::status),
        Some(401)
    );
    assert!(outcomes[1].success);

    let c = up(unauthorized).await;
    let d = up(|_| {
        Reply::now(json(
            StatusCode::FORBIDDEN,
            openai::error("forbidden", "permission_error", None),
        ))
    })
    .await;
    let px = start(&[&c, &d], |_| {}).await;
    let r = px.post(chat(false)).await;
    assert_eq!(r.status(), 502, "never the upstream's 401");
    assert_eq!(header(&r, "x-probeok-attempts"), "2");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_auth_error");
    assert_eq!(v["error"]["type"], "upstream_error");
    assert!(!v.to_string().contains("Incorrect API key"));
}

// Paused time: the rest is Retry-After's second exactly, and the test does not wait it out.
#[tokio::test(start_paused = true)]
async fn rate_limits_move_on_and_the_route_rests_until_retry_after() {
    let a = up(|_| {
        let mut r = json(
            StatusCode::TOO_MANY_REQUESTS,
            openai::error("slow down", "rate_limit_error", None),
        );
        r.headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        Reply::now(r)
    })
    .await;
    let b = up(|_| ok_body("from b")).await;
    let mut px = start(&[&a, &b], |_| {}).await;
    let r = px.post(chat(false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-fallback-reason"), "rate_limited");
    assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1");

    // While it rests, the route is skipped.
    let r = px.post(chat(false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-attempts"), "1");
    assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1");
    assert_eq!(header(&r, "x-probeok-mode"), "fallback");
    assert_eq!(a.reqs.all().len(), 1, "resting until Retry-After");

    // Still resting just before the second is over; tried again after it.
    tokio::time::sleep(Duration::from_millis(900)).await;
    px.post(chat(false)).await;
    assert_eq!(a.reqs.all().len(), 1, "resting until Retry-After");
    tokio::time::sleep(Duration::from_millis(200)).await;
    px.post(chat(false)).await;
    assert_eq!(a.reqs.all().len(), 2);
    let outcomes = px.outcomes().await;
    assert!(matches!(
        outcomes[0].error,
        Some(ProbeError::RateLimited {
            retry_after_ms: Some(1000),
            ..
        })
    ));
}

#[tokio::test]
async fn server_errors_move_on() {
    let a = up(|_| {
        Reply::now(json(
            StatusCode::SERVICE_UNAVAILABLE,
            openai::error("overloaded", "server_error", None),
        ))
    })
    .await;
    let b = up(|_| ok_stream(&["from ", "b"])).await;
    let mut px = start(&[&a, &b], |_| {}).await;
    let r = px.post(chat(true)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-fallback-reason"), "http_503");
    assert_eq!(header(&r, "x-probeok-attempts"), "2");
    let events = sse_events(r).await;
    assert_eq!(text_of(&events), "from b");
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"));
    let outcomes = px.outcomes().await;
    assert_eq!(outcomes.len(), 2);
    assert_eq!(outcomes[0].http_status, Some(503));
    assert!(!outcomes[0].success);
    assert!(outcomes[1].success && outcomes[1].ttft_ms.is_some());

    // Every candidate failing: 503 upstream_unavailable, in the envelope.
    let c = up(|_| Reply::now(json(StatusCode::BAD_GATEWAY, j!({"error": "bad gateway"})))).await;
    let px = start(&[&c], |_| {}).await;
    let r = px.post(chat(false)).await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_unavailable");
}

// Paused time: the budgets are measured exactly, whatever the load on the machine.
#[tokio::test(start_paused = true)]
async fn a_hung_first_candidate_leaves_time_for_the_next() {
    let a = up(|_| {
        Reply::after(
            Duration::from_secs(60),
            json(StatusCode::OK, openai::body("too late", "stop", None)),
        )
    })
    .await;
    let b = up(|_| ok_body("from b")).await;
    let mut px = start(&[&a, &b], |p| p.total_timeout = Duration::from_secs(2)).await;
    let t0 = Instant::now();
    let r = px.post(chat(false)).await;
    let took = t0.elapsed();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1");
    assert_eq!(
        header(&r, "x-probeok-fallback-reason"),
        "timeout_before_first_byte"
    );
    // 2 s over 2 candidates: the first gets 1 s.
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_millis(1100),
        "{took:?}"
    );
    let outcomes = px.outcomes().await;
    assert_eq!(outcomes[0].error, Some(ProbeError::TimeoutBeforeFirstByte));
}

// Paused time: the watchdog's 300 ms are measured exactly, whatever the load on the machine.
#[tokio::test(start_paused = true)]
async fn stream_watchdog_moves_on_when_the_first_event_is_late() {
    // Headers at once, a keep-alive comment, the first data event only after 1.5 s.
    let a = up(|_| {
        Reply::now(
            Script::new()
                .send(": keep-alive\n\n")
                .after(Duration::from_millis(1500), openai::content("late"))
                .hang()
                .sse(),
        )
    })
    .await;
    let b = up(|_| ok_stream(&["on ", "time"])).await;
    let mut px = start(&[&a, &b], |p| {
        p.first_byte_timeout = Duration::from_millis(300)
    })
    .await;
    let t0 = Instant::now();
    let r = px.post(chat(true)).await;
    assert_eq!(r.status(), 200);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(400),
        "{took:?}"
    );
    assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1");
    assert_eq!(
        header(&r, "x-probeok-fallback-reason"),
        "timeout_before_first_byte"
    );
    assert_eq!(text_of(&sse_events(r).await), "on time");
    assert_eq!(a.reqs.all().len(), 1);
    let outcomes = px.outcomes().await;
    assert_eq!(outcomes[0].error, Some(ProbeError::TimeoutBeforeFirstByte));
    assert!(outcomes[0].ttfb_ms.is_some(), "headers did arrive");
}

/// The client sees each chunk while the upstream has not sent the next one yet: the proxy
/// passes a stream through as it arrives and buffers nothing. The upstream sends a chunk
/// only once the client has seen the previous one, so no clock is involved.
#[tokio::test]
async fn streams_pass_through_chunk_by_chunk() {
    let pieces = ["a", "b", "c", "d"];
    let (tx, rx) = mpsc::channel::<String>(1);
    let body = std::sync::Mutex::new(Some(rx));
    let a = up(move |_| {
        let rx = body.lock().unwrap().take().expect("one upstream call");
        let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
            let frame = rx.recv().await?;
            Some((Ok::<_, std::io::Error>(frame), rx))
        });
        Reply::now(common::with_type(
            StatusCode::OK,
            "text/event-stream",
            axum::body::Body::from_stream(chunks),
        ))
    })
    .await;
    let px = start(&[&a], |_| {}).await;
    let mut frames = openai::stream(&pieces, "stop", None).into_iter();
    // The proxy commits at the first data event: send it before the answer can start.
    tx.send(frames.next().unwrap()).await.unwrap();
    let r = px.post(chat(true)).await;
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let mut buf = String::new();
    let mut seen = String::new();
    for (k, piece) in pieces.iter().enumerate() {
        // The k-th piece arrives while the upstream holds the rest back.
        let data = loop {
            if let Some(end) = buf.find("\n\n") {
                let ev: String = buf.drain(..end + 2).collect();
                if let Some(d) = ev.lines().find_map(|l| l.strip_prefix("data: ")) {
                    break d.to_owned();
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), body.next())
                .await
                .unwrap_or_else(|_| panic!("chunk {k} never reached the client"))
                .expect("the stream goes on")
                .expect("body chunk");
            buf.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        };
        let v: Value = serde_json::from_str(&data).expect("a JSON chunk");
        assert_eq!(v["choices"][0]["delta"]["content"], *piece, "chunk {k}");
        seen.push_str(piece);
        // Now the next frame (the next piece, then the finish and [DONE]).
        if k + 1 < pieces.len() {
            tx.send(frames.next().unwrap()).await.unwrap();
        }
    }
    for rest in frames {
        tx.send(rest).await.unwrap();
    }
    drop(tx);
    while let Some(chunk) = body.next().await {
        buf.push_str(std::str::from_utf8(&chunk.expect("body chunk")).expect("utf-8"));
    }
    assert_eq!(seen, "abcd");
    assert!(buf.contains("data: [DONE]"), "{buf}");
}

/// Each mid-stream failure ends the client's stream with `provider_interrupted`, and nothing
/// is ever asked of a second upstream.
#[tokio::test]
async fn mid_stream_failures_interrupt_without_failover() {
    type Make = fn() -> Script;
    let cases: [(&str, Make, &str); 5] = [
        (
            "error event",
            || {
                Script::new()
                    .send(openai::content("par"))
                    .send(common::frame(
                        None,
                        &j!({"error": {"message": "overloaded", "code": 503}}).to_string(),
                    ))
            },
            "http",
        ),
        (
            "stall",
            || Script::new().send(openai::content("par")).hang(),
            "stalled",
        ),
        (
            "no finish, no [DONE]",
            || Script::new().send(openai::content("par")),
            "truncated",
        ),
        (
            "malformed chunk",
            || {
                Script::new()
                    .send(openai::content("par"))
                    .send("data: {not json\n\n")
            },
            "malformed",
        ),
        (
            "cut",
            || {
                Script::new()
                    .send(openai::content("par"))
                    .after(Duration::from_millis(100), ": ping\n\n")
                    .cut()
            },
            "truncated",
        ),
    ];
    for (name, make, kind) in cases {
        let a = up(move |_| Reply::now(make().sse())).await;
        let b = up(|_| ok_stream(&["spliced"])).await;
        let mut px = start(&[&a, &b], |p| {
            p.stream_idle_timeout = Duration::from_millis(300)
        })
        .await;
        let r = px.post(chat(true)).await;
        assert_eq!(r.status(), 200, "{name}");
        assert_eq!(header(&r, "x-probeok-route"), "p0/r/up-0", "{name}");
        let events = tokio::time::timeout(Duration::from_secs(5), sse_events(r))
            .await
            .unwrap_or_else(|_| panic!("{name}: the stream must end"));
        assert_eq!(text_of(&events), "par", "{name}: no splicing");
        let last: Value = serde_json::from_str(&events.last().unwrap().1).unwrap();
        assert_eq!(last["error"]["code"], "provider_interrupted", "{name}");
        assert_eq!(last["error"]["type"], "upstream_error", "{name}");
        assert_eq!(
            b.reqs.all().len(),
            0,
            "{name}: no failover after the commit point"
        );
        let outcomes = px.outcomes().await;
        assert_eq!(outcomes.len(), 1, "{name}");
        assert!(!outcomes[0].success, "{name}");
        assert_eq!(
            outcomes[0].error.as_ref().map(ProbeError::kind),
            Some(kind),
            "{name}"
        );
    }
}

#[tokio::test]
async fn capability_filtering_and_no_substitution() {
    let mut a = up(|_| ok_body("from a")).await;
    a.caps = vec![Capability::Stream];
    a.context_window = Some(50);
    let mut b = up(|_| ok_body("from b")).await;
    b.caps = vec![
        Capability::Stream,
        Capability::Tools,
        Capability::JsonSchema,
    ];
    b.context_window = Some(100_000);
    let px = start(&[&a, &b], |_| {}).await;

    let mut with_tools = chat(false);
    with_tools["tools"] = j!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    let r = px.post(with_tools).await;
    assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1");
    assert_eq!(b.reqs.last().json()["model"], "up-1");

    let mut long = chat(false);
    long["messages"][0]["content"] = Value::String("很长的问题".repeat(40));
    let r = px.post(long).await;
    assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1", "context window");

    let mut image = chat(false);
    image["messages"][0]["content"] = j!([{"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]);
    let r = px.post(image).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_capable_route");
    assert!(v["error"]["message"].as_str().unwrap().contains("vision"));
    assert_eq!(
        a.reqs.all().len(),
        0,
        "never sent to a route lacking what it needs"
    );
    assert_eq!(b.reqs.all().len(), 2);

    let r = px
        .http
        .post(format!("{}/v1/chat/completions", px.base))
        .header("x-probeok-residency", "eu")
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "no route has the residency tag");
}

#[tokio::test]
async fn bad_requests_and_unknown_models_never_reach_an_upstream() {
    let a = up(|_| ok_body("x")).await;
    let px = start(&[&a], |p| p.max_body = 1000).await;
    let mut other = chat(false);
    other["model"] = Value::String("gpt-5".into());
    let r = px.post(other).await;
    assert_eq!(r.status(), 404);
    assert_eq!(header(&r, "x-probeok-attempts"), "0");
    assert!(!header(&r, "x-request-id").is_empty());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(v["error"]["type"], "invalid_request_error");

    let r = px
        .http
        .post(format!("{}/v1/chat/completions", px.base))
        .header("content-type", "application/json")
        .body("{\"model\": \"chat\", ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = px.post(j!({"model": "chat"})).await;
    assert_eq!(r.status(), 400);
    let mut big = chat(false);
    big["messages"][0]["content"] = Value::String("x".repeat(2000));
    assert_eq!(px.post(big).await.status(), 413);
    assert_eq!(a.reqs.all().len(), 0);

    let models: Value = px
        .http
        .get(format!("{}/v1/models", px.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "chat");
}

#[tokio::test]
async fn all_weights_zero_is_degraded_least_bad_first() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let a = up(move |_| {
        seen.fetch_add(1, Ordering::SeqCst);
        ok_body("from a")
    })
    .await;
    let b = up(|_| ok_body("from b")).await;
    let px = start(&[&a, &b], |_| {}).await;
    let feed = j!({"version": "v9", "generated_at": "2026-01-01T00:00:00Z", "models": {"chat": [
        {"route": "p0/r/up-0", "provider": "p0", "region": "r", "model": "up-0", "tier": "primary", "weight": 0, "state": "CRITICAL", "reason": {"code": "x", "text": "x"}},
        {"route": "p1/r/up-1", "provider": "p1", "region": "r", "model": "up-1", "tier": "backup", "weight": 0, "state": "DEGRADED", "reason": {"code": "x", "text": "x"}}
    ]}});
    let view = WeightsView::from_json(feed.to_string().as_bytes()).unwrap();
    px.weights.send_replace(Arc::new(view));
    let r = px.post(chat(false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-mode"), "degraded");
    assert_eq!(
        header(&r, "x-probeok-route"),
        "p1/r/up-1",
        "least bad first"
    );
    let since = header(&r, "x-probeok-degraded-since").to_owned();
    assert!(since.ends_with('Z'), "{since}");
    let r = px.post(chat(false)).await;
    assert_eq!(
        header(&r, "x-probeok-degraded-since"),
        since,
        "stable while degraded"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}
