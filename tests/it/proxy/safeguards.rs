//! The proxy's safeguards against real loopback servers: circuit breakers and same-route backoff, metering
//! read back through `GET /api/v1/requests`, idempotency keys, bad input and client auth, and
//! the standalone proxy following a fake monitor's SSE weights feed (the feed's documented wire format).

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use axum::Router;
use common::{fake, json, openai, Captured, Reply, Requests, Server};
use futures_util::StreamExt;
use probeok::clock::{ManualClock, SystemClock};
use probeok::config::{Config, ProviderConfig, ProxyConfig, RegionConfig, RouteConfig};
use probeok::proxy::{self, remote, FeedStatus, Proxy, ProxyOptions, WeightsView};
use probeok::route::{Price, Tier};
use probeok::store::{Store, StoreOptions};
use serde_json::{json as j, Value};
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

fn status(code: StatusCode) -> Reply {
    Reply::now(json(code, openai::error("boom", "server_error", None)))
}

struct Px {
    base: String,
    shutdown: CancellationToken,
    http: reqwest::Client,
    proxy: Proxy,
    store: Option<Store>,
    _dir: tempfile::TempDir,
    weights: Option<watch::Sender<Arc<WeightsView>>>,
    _passive: mpsc::Receiver<probeok::probe::ProbeOutcome>,
}

impl Drop for Px {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

#[derive(Default)]
struct Setup {
    store: bool,
    feed: Option<Arc<FeedStatus>>,
    /// The proxy's clock (idempotency expiry); the system clock when `None`.
    clock: Option<Arc<ManualClock>>,
}

fn config(ups: &[&Up], tiers: &[Tier], tweak: impl FnOnce(&mut ProxyConfig)) -> Config {
    let mut config = Config::default();
    for (i, u) in ups.iter().enumerate() {
        config.providers.push(ProviderConfig {
            id: format!("p{i}"),
            api_key_env: Some(format!("PROBEOK_TEST_PROXY2_KEY_{i}")),
            regions: vec![RegionConfig {
                id: "r".into(),
                base_url: u.server.base_url(),
            }],
            ..ProviderConfig::default()
        });
        let tier =
            tiers
                .get(i)
                .copied()
                .unwrap_or(if i == 0 { Tier::Primary } else { Tier::Backup });
        config.routes.push(RouteConfig {
            provider: format!("p{i}"),
            region: "r".into(),
            model: format!("up-{i}"),
            serves: "chat".into(),
            tier,
            weight: if i == 0 { 100 } else { 0 },
            price: Some(Price {
                input_per_mtok: 1_000_000.0,
                output_per_mtok: 2_000_000.0,
                currency: "CNY".into(),
            }),
            ..RouteConfig::default()
        });
        config.env.set(
            format!("PROBEOK_TEST_PROXY2_KEY_{i}"),
            format!("sk-upstream2-key-{i}-0123456789"),
        );
    }
    config.proxy.enabled = true;
    config.proxy.total_timeout = Duration::from_secs(10);
    tweak(&mut config.proxy);
    config
}

async fn start_with(config: Config, setup: Setup) -> Px {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = if setup.store {
        Some(Store::open(&dir.path().join("p.db"), StoreOptions::default()).expect("store"))
    } else {
        None
    };
    let (wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, prx) = mpsc::channel(4096);
    let p = Proxy::with_options(
        &config,
        wrx,
        ptx,
        ProxyOptions {
            store: store.clone(),
            feed: setup.feed,
            body_read_timeout: Duration::from_millis(500),
            clock: match setup.clock {
                Some(c) => c,
                None => Arc::new(SystemClock),
            },
            ..ProxyOptions::default()
        },
    )
    .expect("proxy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p.clone(), shutdown.clone()));
    Px {
        base: format!("http://{addr}"),
        shutdown,
        http: reqwest::Client::new(),
        proxy: p,
        store,
        _dir: dir,
        weights: Some(wtx),
        _passive: prx,
    }
}

async fn start(ups: &[&Up], tweak: impl FnOnce(&mut ProxyConfig)) -> Px {
    let c = config(ups, &[], tweak);
    start_with(
        c,
        Setup {
            store: true,
            ..Setup::default()
        },
    )
    .await
}

fn chat() -> Value {
    j!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
}

impl Px {
    async fn post(&self, body: Value) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/chat/completions", self.base))
            .json(&body)
            .send()
            .await
            .expect("proxy answers")
    }
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

// Paused time (and no store, whose writer thread the paused clock would not wait for): "at
// once" is measured exactly, whatever the load on the machine.
#[tokio::test(start_paused = true)]
async fn a_hard_failing_route_trips_its_breaker_and_is_skipped() {
    let a = up(|_| status(StatusCode::SERVICE_UNAVAILABLE)).await;
    let b = up(|_| ok_body("from b")).await;
    let px = start_with(
        config(&[&a, &b], &[], |p| {
            p.max_retry_wait = Duration::ZERO;
            p.breaker.open_for = Duration::from_secs(60);
        }),
        Setup::default(),
    )
    .await;
    for _ in 0..5 {
        let r = px.post(chat()).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-probeok-fallback-reason"), "http_503");
    }
    assert_eq!(a.reqs.all().len(), 5);
    let snap = px.proxy.breakers();
    let sa = snap
        .iter()
        .find(|s| s.route.as_str() == "p0/r/up-0")
        .unwrap();
    assert_eq!(sa.state, proxy::BreakerState::Open);
    // Open: the route is skipped, the request goes straight to b and says why.
    let t = Instant::now();
    let r = px.post(chat()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1");
    assert_eq!(header(&r, "x-probeok-fallback-reason"), "breaker_open");
    assert_eq!(header(&r, "x-probeok-attempts"), "1");
    assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
    assert_eq!(a.reqs.all().len(), 5, "no call to the open route");
    let c = px.proxy.counters();
    assert!(c
        .failovers
        .iter()
        .any(|(k, n)| k == "breaker_open" && *n >= 1));
    assert!(c.failovers.iter().any(|(k, n)| k == "http_503" && *n == 5));
    assert!(c
        .requests
        .iter()
        .any(|r| r.route == "p1/r/up-1" && r.outcome == "ok" && r.value == 6));
}

#[tokio::test]
async fn an_open_route_is_still_tried_last_when_nothing_else_is_left() {
    let a = up(|_| status(StatusCode::SERVICE_UNAVAILABLE)).await;
    let px = start(&[&a], |p| {
        p.max_retry_wait = Duration::ZERO;
        p.max_attempts = 1;
    })
    .await;
    for _ in 0..5 {
        assert_eq!(px.post(chat()).await.status(), 503);
    }
    let r = px.post(chat()).await;
    assert_eq!(r.status(), 503);
    assert_eq!(header(&r, "x-probeok-fallback-reason"), "breaker_open");
    assert_eq!(a.reqs.all().len(), 6, "last resort: tried anyway");
}

// Paused time (and no store): the backoff waits are measured exactly, whatever the load.
#[tokio::test(start_paused = true)]
async fn same_route_retries_back_off_within_max_retry_wait() {
    let calls = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let seen = calls.clone();
    let a = up(move |_| {
        seen.lock().unwrap().push(Instant::now());
        status(StatusCode::BAD_GATEWAY)
    })
    .await;
    let px = start_with(
        config(&[&a], &[], |p| {
            p.max_attempts = 4;
            p.max_retry_wait = Duration::from_millis(700);
        }),
        Setup::default(),
    )
    .await;
    let t = Instant::now();
    let r = px.post(chat()).await;
    let took = t.elapsed();
    assert_eq!(r.status(), 503);
    let calls = calls.lock().unwrap().clone();
    assert!(
        calls.len() >= 2 && calls.len() <= 4,
        "{} calls",
        calls.len()
    );
    assert_eq!(header(&r, "x-probeok-attempts"), calls.len().to_string());
    // Waits: 0..100ms, 0..200ms, 0..400ms, and never more than 700 ms in total.
    assert!(took <= Duration::from_millis(750), "{took:?}");
    for (i, w) in calls.windows(2).enumerate() {
        let gap = w[1] - w[0];
        let ceiling = Duration::from_millis(100 << i) + Duration::from_millis(10);
        assert!(gap <= ceiling, "retry {i}: {gap:?}");
    }

    // No retry budget: one attempt only.
    let b = up(|_| status(StatusCode::BAD_GATEWAY)).await;
    let px = start_with(
        config(&[&b], &[], |p| {
            p.max_attempts = 4;
            p.max_retry_wait = Duration::ZERO;
        }),
        Setup::default(),
    )
    .await;
    assert_eq!(px.post(chat()).await.status(), 503);
    assert_eq!(b.reqs.all().len(), 1);
}

async fn requests_api(px: &Px, query: &str) -> Vec<Value> {
    let server = common::spawn(probeok::web::requests::router(
        px.store.clone().unwrap(),
        probeok::secret::Secret::new("adm"),
    ))
    .await;
    let v: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/requests{query}", server.base_url()))
        .bearer_auth("adm")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["requests"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn metering_records_attempts_cost_and_filters() {
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    let a = up(move |_| {
        if count.fetch_add(1, Ordering::SeqCst) == 0 {
            Reply::after(
                Duration::from_millis(20),
                json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    openai::error("x", "server_error", None),
                ),
            )
        } else {
            ok_body("from a")
        }
    })
    .await;
    let b = up(|_| ok_body("from b")).await;
    let px = start(&[&a, &b], |p| p.max_retry_wait = Duration::ZERO).await;
    let first = px.post(chat()).await;
    assert_eq!(header(&first, "x-probeok-route"), "p1/r/up-1");
    let first_id = header(&first, "x-request-id").to_owned();
    let second = px.post(chat()).await;
    assert_eq!(header(&second, "x-probeok-route"), "p0/r/up-0");
    // Rejected before any upstream call: metered too, with no attempts.
    let r = px
        .post(j!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}))
        .await;
    assert_eq!(r.status(), 404);

    // The writer is asynchronous: wait until both are there.
    let mut all = Vec::new();
    for _ in 0..50 {
        all = requests_api(&px, "").await;
        if all.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(all.len(), 2, "{all:?}");
    let failed_over = all
        .iter()
        .find(|r| r["request_id"] == first_id.as_str())
        .unwrap();
    assert_eq!(failed_over["outcome"], "ok");
    assert_eq!(failed_over["route"], "p1/r/up-1");
    assert_eq!(failed_over["fallback_reason"], "http_503");
    let attempts = failed_over["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["n"], 1);
    assert_eq!(attempts[0]["reason"], "http_503");
    assert_eq!(attempts[0]["status_class"], "5xx");
    assert!(attempts[0]["latency_ms"].as_f64().unwrap() >= 20.0);
    assert_eq!(attempts[1]["reason"], Value::Null);
    assert_eq!(attempts[1]["status_class"], "2xx");
    assert_eq!(attempts[1]["prompt_tokens"], 12);
    assert_eq!(attempts[1]["completion_tokens"], 3);
    assert!(attempts[1]["ttfb_ms"].as_f64().is_some());
    // 12 prompt tokens at 1e6/Mtok + 3 at 2e6/Mtok.
    assert!((failed_over["cost"].as_f64().unwrap() - 18.0).abs() < 1e-9);
    assert_eq!(failed_over["currency"], "CNY");

    // Filters: "which upstream failed over with a 503 in the last hour".
    let by_reason = requests_api(&px, "?reason=http_503&since=1h").await;
    assert_eq!(by_reason.len(), 1);
    assert_eq!(by_reason[0]["request_id"], first_id.as_str());
    let by_route = requests_api(&px, "?route=p1/r/up-1").await;
    assert_eq!(by_route.len(), 1);
    assert_eq!(requests_api(&px, "?route=p0/r/up-0").await.len(), 2);
    assert_eq!(requests_api(&px, "?limit=1").await.len(), 1);
    assert_eq!(
        requests_api(&px, "?since=2999-01-01T00:00:00Z").await.len(),
        0
    );
    let server = common::spawn(probeok::web::requests::router(
        px.store.clone().unwrap(),
        probeok::secret::Secret::new("adm"),
    ))
    .await;
    let bad = reqwest::Client::new()
        .get(format!("{}/api/v1/requests?limit=x", server.base_url()))
        .bearer_auth("adm")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

/// An upstream answer whose body is held: `arrival` is notified when the call comes, and the
/// body is sent once `release` is.
fn held(body: String, arrival: &tokio::sync::Notify, release: Arc<tokio::sync::Notify>) -> Reply {
    arrival.notify_one();
    let held = futures_util::stream::once(async move {
        release.notified().await;
        Ok::<_, std::io::Error>(body)
    });
    Reply::now(common::with_type(
        StatusCode::OK,
        "application/json",
        axum::body::Body::from_stream(held),
    ))
}

async fn post_key(px: &Px, key: &str, body: Value) -> reqwest::Response {
    px.http
        .post(format!("{}/v1/chat/completions", px.base))
        .header("idempotency-key", key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn idempotency_keys_replay_conflict_and_expire() {
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    // The first call's answer is held until the test releases it, so the second request
    // meets the key in progress however slow the machine is.
    let arrived = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let (on_arrival, on_release) = (arrived.clone(), release.clone());
    let a = up(move |_| {
        let i = count.fetch_add(1, Ordering::SeqCst);
        let body = openai::body(&format!("answer {i}"), "stop", Some(3)).to_string();
        if i > 0 {
            return Reply::now(common::with_type(
                StatusCode::OK,
                "application/json",
                body.into(),
            ));
        }
        held(body, &on_arrival, on_release.clone())
    })
    .await;
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let px = start_with(
        config(&[&a], &[], |p| {
            p.idempotency_ttl = Duration::from_secs(2);
            // The first answer is held until the second returns: no waiting for it.
            p.idempotency_wait = Duration::ZERO;
        }),
        Setup {
            store: true,
            clock: Some(clock.clone()),
            ..Setup::default()
        },
    )
    .await;

    // Concurrent: the second gets 409 while the first runs.
    let (first, second) = tokio::join!(post_key(&px, "k-1", chat()), async {
        arrived.notified().await;
        let second = post_key(&px, "k-1", chat()).await;
        release.notify_one();
        second
    });
    assert_eq!(first.status(), 200);
    assert_eq!(second.status(), 409);
    let v: Value = second.json().await.unwrap();
    assert_eq!(v["error"]["code"], "idempotency_in_progress");
    let route = header(&first, "x-probeok-route").to_owned();
    let body: Value = first.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "answer 0");

    // Repeat: the same answer, no second upstream call.
    let again = post_key(&px, "k-1", chat()).await;
    assert_eq!(again.status(), 200);
    assert_eq!(header(&again, "x-probeok-idempotent-replay"), "true");
    assert_eq!(header(&again, "x-probeok-route"), route);
    let v: Value = again.json().await.unwrap();
    assert_eq!(v, body);
    assert_eq!(a.reqs.all().len(), 1);

    // Another body with the same key: 422. Another key: a real call.
    let other = j!({"model": "chat", "messages": [{"role": "user", "content": "other"}]});
    assert_eq!(post_key(&px, "k-1", other).await.status(), 422);
    assert_eq!(post_key(&px, "k-2", chat()).await.status(), 200);
    assert_eq!(a.reqs.all().len(), 2);

    // Expiry: after the TTL the key is new again.
    clock.advance(Duration::from_millis(2100));
    let later = post_key(&px, "k-1", chat()).await;
    assert!(later.headers().get("x-probeok-idempotent-replay").is_none());
    let v: Value = later.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "answer 2");
    assert_eq!(a.reqs.all().len(), 3);
}

#[tokio::test]
async fn an_idempotent_answer_is_not_held_for_its_commit_and_a_repeat_still_replays_it() {
    let arrived = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let (on_arrival, on_release) = (arrived.clone(), release.clone());
    let a = up(move |_| {
        let body = openai::body("kept", "stop", Some(3)).to_string();
        held(body, &on_arrival, on_release.clone())
    })
    .await;
    let px = start(&[&a], |_| {}).await;

    // The key is claimed before the upstream is called; once it has been, another connection
    // takes the database's write lock, so the answer cannot be committed until it lets go.
    let (first, lock) = tokio::join!(post_key(&px, "k-held", chat()), async {
        arrived.notified().await;
        let lock = rusqlite::Connection::open(px._dir.path().join("p.db")).unwrap();
        lock.execute_batch("BEGIN IMMEDIATE").unwrap();
        release.notify_one();
        lock
    });

    // The client has its whole answer while the write lock is still held.
    assert_eq!(first.status(), 200);
    let body = first.text().await.unwrap();
    assert!(body.contains("kept"), "{body}");

    // A repeat gets the answer back once the lock goes, with no second upstream call: its
    // claim queues behind the answer's write, or comes after its commit.
    let (repeat, ()) = tokio::join!(post_key(&px, "k-held", chat()), async {
        lock.execute_batch("ROLLBACK").unwrap();
    });
    assert_eq!(repeat.status(), 200);
    assert_eq!(header(&repeat, "x-probeok-idempotent-replay"), "true");
    assert_eq!(repeat.text().await.unwrap(), body);
    assert_eq!(a.reqs.all().len(), 1);
}

#[tokio::test]
async fn idempotent_streams_replay_the_whole_event_sequence() {
    let a = up(|_| {
        Reply::now(
            common::Script::new()
                .send_all(openai::stream(&["he", "llo"], "stop", Some(2)))
                .sse(),
        )
    })
    .await;
    let px = start(&[&a], |_| {}).await;
    let body =
        j!({"model": "chat", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let first = post_key(&px, "s-1", body.clone())
        .await
        .text()
        .await
        .unwrap();
    assert!(first.contains("llo") && first.contains("[DONE]"));
    // The key is stored once the stream ended (asynchronously).
    let mut second = String::new();
    for _ in 0..40 {
        let r = post_key(&px, "s-1", body.clone()).await;
        if r.status() == 200 && header(&r, "x-probeok-idempotent-replay") == "true" {
            assert_eq!(header(&r, "content-type"), "text/event-stream");
            second = r.text().await.unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(second, first);
    assert_eq!(a.reqs.all().len(), 1);
}

#[tokio::test]
async fn bad_input_gets_its_4xx_and_no_upstream_call() {
    let a = up(|_| ok_body("never")).await;
    let px = start(&[&a], |p| p.max_body = 1024).await;
    let raw = |body: &'static str| {
        px.http
            .post(format!("{}/v1/chat/completions", px.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let cases: Vec<(reqwest::Response, u16, &str)> = vec![
        (raw("{not json").await.unwrap(), 400, "invalid_json"),
        (raw("[1,2]").await.unwrap(), 400, "invalid_request"),
        (raw(r#"{"model":"chat"}"#).await.unwrap(), 400, "missing_messages"),
        (
            raw(r#"{"model":"chat","messages":[]}"#).await.unwrap(),
            400,
            "missing_messages",
        ),
        (
            raw(r#"{"model":"chat","messages":"hi"}"#).await.unwrap(),
            400,
            "missing_messages",
        ),
        (
            raw(r#"{"model":"chat","messages":["hi"]}"#).await.unwrap(),
            400,
            "invalid_type",
        ),
        (
            raw(r#"{"model":7,"messages":[{"role":"user","content":"x"}]}"#)
                .await
                .unwrap(),
            400,
            "invalid_type",
        ),
        (
            raw(r#"{"model":"chat","stream":"yes","messages":[{"role":"user","content":"x"}]}"#)
                .await
                .unwrap(),
            400,
            "invalid_type",
        ),
        (
            raw(r#"{"model":"chat","max_tokens":"9","messages":[{"role":"user","content":"x"}]}"#)
                .await
                .unwrap(),
            400,
            "invalid_type",
        ),
        (
            raw(r#"{"model":"chat","temperature":"hot","messages":[{"role":"user","content":"x"}]}"#)
                .await
                .unwrap(),
            400,
            "invalid_type",
        ),
        (
            px.post(j!({"model": "chat", "messages": [{"role": "user", "content": "x".repeat(2000)}]}))
                .await,
            413,
            "request_too_large",
        ),
    ];
    for (r, code, err) in cases {
        assert_eq!(r.status().as_u16(), code, "{err}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], err);
        assert!(v["error"]["message"].is_string());
        assert!(v["error"]["type"].is_string());
    }
    let bad_key = px
        .http
        .post(format!("{}/v1/chat/completions", px.base))
        .header("idempotency-key", "")
        .json(&chat())
        .send()
        .await
        .unwrap();
    assert_eq!(bad_key.status(), 400);
    assert!(a.reqs.all().is_empty(), "no upstream call for bad input");
}

// Paused time (and no store): the 500 ms body read timeout is measured exactly.
#[tokio::test(start_paused = true)]
async fn a_slow_body_times_out() {
    let a = up(|_| ok_body("never")).await;
    let px = start_with(config(&[&a], &[], |_| {}), Setup::default()).await;
    let (tx, rx) = mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    tx.send(Ok(br#"{"model":"chat","#.to_vec())).await.unwrap();
    let body = reqwest::Body::wrap_stream(tokio_stream_from(rx));
    let t = Instant::now();
    let r = px
        .http
        .post(format!("{}/v1/chat/completions", px.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 408);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(600),
        "{took:?}"
    );
    drop(tx);
    assert!(a.reqs.all().is_empty());
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Vec<u8>, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[tokio::test]
async fn client_auth_requires_a_known_key() {
    let a = up(|_| ok_body("hi")).await;
    let mut c = config(&[&a], &[], |p| {
        p.client_keys_env = "PROBEOK_TEST_PROXY2_CLIENT_KEYS".into()
    });
    c.env
        .set("PROBEOK_TEST_PROXY2_CLIENT_KEYS", "client-a, client-b");
    let px = start_with(
        c,
        Setup {
            store: true,
            ..Setup::default()
        },
    )
    .await;
    let send = |auth: Option<&'static str>| {
        let mut req = px
            .http
            .post(format!("{}/v1/chat/completions", px.base))
            .json(&chat());
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        req.send()
    };
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer client-"),
        Some("client-a"),
    ] {
        let r = send(auth).await.unwrap();
        assert_eq!(r.status(), 401, "{auth:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
    assert!(a.reqs.all().is_empty());
    assert_eq!(send(Some("Bearer client-b")).await.unwrap().status(), 200);
    let got = a.reqs.last();
    assert_eq!(
        got.header("authorization"),
        Some("Bearer sk-upstream2-key-0-0123456789")
    );
}

/// A tiny monitor: `GET /api/v1/weights/stream` in the feed's documented shape, replaying whatever is pushed
/// on its channel, recording each subscriber's `Last-Event-ID`.
struct Monitor {
    server: Server,
    stop: CancellationToken,
    push: tokio::sync::broadcast::Sender<(String, Value)>,
    last_ids: Arc<Mutex<Vec<Option<String>>>>,
}

async fn monitor_on(
    listener: tokio::net::TcpListener,
    initial: (String, Value),
    push: tokio::sync::broadcast::Sender<(String, Value)>,
    last_ids: Arc<Mutex<Vec<Option<String>>>>,
    stop: CancellationToken,
) -> Server {
    let p = push.clone();
    let ids = last_ids.clone();
    let initial = Arc::new(Mutex::new(initial));
    let latest = initial.clone();
    let mut watch = push.subscribe();
    tokio::spawn(async move {
        while let Ok(v) = watch.recv().await {
            *latest.lock().unwrap() = v;
        }
    });
    let app = Router::new().route(
        "/api/v1/weights/stream",
        get(move |headers: HeaderMap| {
            let rx = p.subscribe();
            ids.lock().unwrap().push(
                headers
                    .get("last-event-id")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
            );
            let first = initial.lock().unwrap().clone();
            let stop = stop.clone();
            async move {
                let first = futures_util::stream::once(async move { first });
                let rest = tokio_stream_broadcast(rx);
                let events = first
                    .chain(rest)
                    .take_until(stop.cancelled_owned())
                    .map(|(id, v)| {
                        Ok::<_, std::convert::Infallible>(
                            Event::default().event("weights").id(id).data(v.to_string()),
                        )
                    });
                Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_millis(100)))
            }
        }),
    );
    let addr = listener.local_addr().unwrap();
    let handle = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    common::Server::from_parts(addr, handle)
}

fn tokio_stream_broadcast(
    rx: tokio::sync::broadcast::Receiver<(String, Value)>,
) -> impl futures_util::Stream<Item = (String, Value)> {
    futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(v) => return Some((v, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return None,
            }
        }
    })
}

fn weights(version: u32, a: (u8, &str), b: (u8, &str)) -> (String, Value) {
    let entry = |i: usize, (w, state): (u8, &str)| {
        j!({"route": format!("p{i}/r/up-{i}"), "provider": format!("p{i}"), "region": "r",
            "model": format!("up-{i}"), "tier": "primary", "weight": w, "state": state,
            "reason": {"code": "test", "text": "test"}})
    };
    (
        version.to_string(),
        j!({"version": version, "generated_at": "2026-01-01T00:00:00Z",
            "models": {"chat": [entry(0, a), entry(1, b)]}}),
    )
}

#[tokio::test]
async fn standalone_proxy_follows_a_remote_monitor() {
    let a = up(|_| ok_body("from a")).await;
    let b = up(|_| ok_body("from b")).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let maddr = listener.local_addr().unwrap();
    let (push, _) = tokio::sync::broadcast::channel(16);
    let last_ids = Arc::new(Mutex::new(Vec::new()));
    let mstop = CancellationToken::new();
    let monitor = Monitor {
        server: monitor_on(
            listener,
            weights(1, (100, "NORMAL"), (0, "NORMAL")),
            push.clone(),
            last_ids.clone(),
            mstop.clone(),
        )
        .await,
        stop: mstop,
        push,
        last_ids,
    };

    let cfg = config(&[&a, &b], &[Tier::Primary, Tier::Primary], |_| {});
    let status = Arc::new(FeedStatus::new(Duration::from_millis(800)));
    let mut px = start_with(
        cfg,
        Setup {
            feed: Some(status.clone()),
            ..Setup::default()
        },
    )
    .await;
    let wtx = px.weights.take().unwrap();
    // What the proxy routes on: the follower's writes to this channel are what moves traffic.
    let mut routed = wtx.subscribe();
    let stop = CancellationToken::new();
    let _follow = remote::follow(
        format!("http://{maddr}"),
        wtx,
        status,
        Duration::from_millis(800),
        stop.clone(),
    );
    // Wait for the first event: traffic on a.
    let mut route = String::new();
    for _ in 0..50 {
        let r = px.post(chat()).await;
        route = header(&r, "x-probeok-route").to_owned();
        if route == "p0/r/up-0" && header(&r, "x-probeok-mode") == "normal" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(route, "p0/r/up-0");

    // a goes CRITICAL: once the follower has taken the event, the very next request goes
    // to b (the deadline only bounds a hang; the order is what is asserted).
    monitor
        .push
        .send(weights(2, (0, "CRITICAL"), (100, "NORMAL")))
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        routed.wait_for(|w| w.version == "2"),
    )
    .await
    .expect("the follower took version 2")
    .unwrap();
    let r = px.post(chat()).await;
    assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1", "traffic moved");
    let a_calls = a.reqs.all().len();

    // The monitor goes away: traffic keeps flowing on the last weights, degraded once stale.
    monitor.stop.cancel();
    drop(monitor.server);
    let r = px.post(chat()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1");
    // Served on b all along, until the silence makes the feed stale and the answers say so.
    let t = Instant::now();
    let r = loop {
        let r = px.post(chat()).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1");
        if header(&r, "x-probeok-mode") == "degraded" {
            break r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the feed never went stale"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!header(&r, "x-probeok-degraded-since").is_empty());
    assert_eq!(
        a.reqs.all().len(),
        a_calls,
        "a stays out while the monitor is away"
    );

    // It comes back on the same address: the proxy reconnects with Last-Event-ID, and the
    // answers are normal again.
    let listener = loop {
        match tokio::net::TcpListener::bind(maddr).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let (push, _) = tokio::sync::broadcast::channel(16);
    let _back = monitor_on(
        listener,
        weights(3, (50, "NORMAL"), (50, "NORMAL")),
        push,
        monitor.last_ids.clone(),
        CancellationToken::new(),
    )
    .await;
    let t = Instant::now();
    loop {
        let r = px.post(chat()).await;
        if header(&r, "x-probeok-mode") == "normal" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no reconnect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ids = monitor.last_ids.lock().unwrap().clone();
    assert_eq!(ids.first(), Some(&None), "the first subscription has no id");
    assert_eq!(
        ids.last(),
        Some(&Some("2".to_owned())),
        "resumed after version 2"
    );
    stop.cancel();
    px.shutdown.cancel();
}
