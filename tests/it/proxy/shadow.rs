//! Shadow traffic, route profiles and degraded answers that say so, through the real proxy on
//! 127.0.0.1 with fake upstreams speaking OpenAI's wire format:
//!
//! - a copy leaves after the client's answer and never delays it: the client has its answer
//!   while the shadow upstream is still held by a gate the test controls;
//! - the comparison is reported; an `Idempotency-Key` request is never copied; the shadow
//!   route gets copies only, never real traffic; the queue and the hourly budget hold;
//! - a profile reaches the upstream as configured, and only that route's requests;
//! - a fallback-tier answer says `quality_hint: "reduced"` in its body and in a stream's first
//!   chunk, while a normal answer is the upstream's bytes unchanged;
//! - the whole service (`app::start`): `/api/v1/shadow` behind the admin token, the shadow
//!   route's page, and probes to a profiled route sent as probes always are.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing;
use axum::Router;
use bytes::Bytes;
use common::{fake, json, openai, Reply, Script};
use probeok::config::{
    Config, ProviderConfig, RegionConfig, RequestProfile, RouteConfig, ShadowConfig,
};
use probeok::proxy::shadow::ShadowLimits;
use probeok::proxy::{self, Proxy, ProxyOptions, WeightsView};
use probeok::route::{Price, Tier};
use serde_json::{json as j, Value};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_util::sync::CancellationToken;

/// A fake upstream whose answers wait for the test's permission (one permit per answer).
struct Gated {
    server: common::Server,
    gate: Arc<Semaphore>,
    seen: Arc<AtomicUsize>,
    bodies: Arc<std::sync::Mutex<Vec<Value>>>,
}

#[derive(Clone)]
struct GateState {
    gate: Arc<Semaphore>,
    seen: Arc<AtomicUsize>,
    bodies: Arc<std::sync::Mutex<Vec<Value>>>,
    completion_tokens: u32,
}

async fn gated_answer(State(s): State<GateState>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    s.bodies.lock().unwrap().push(v.clone());
    s.seen.fetch_add(1, Ordering::SeqCst);
    s.gate.acquire().await.expect("gate open").forget();
    let n = s.completion_tokens;
    if v["stream"] == true {
        Script::new()
            .send_all(openai::stream(&["{\"ok\"", ": true}"], "stop", Some(n)))
            .sse()
    } else {
        json(
            StatusCode::OK,
            openai::body("{\"ok\": true}", "stop", Some(n)),
        )
        .into_response()
    }
}

async fn gated(completion_tokens: u32) -> Gated {
    let gate = Arc::new(Semaphore::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let state = GateState {
        gate: gate.clone(),
        seen: seen.clone(),
        bodies: bodies.clone(),
        completion_tokens,
    };
    let router = Router::new()
        .route("/chat/completions", routing::post(gated_answer))
        .with_state(state);
    Gated {
        server: common::spawn(router).await,
        gate,
        seen,
        bodies,
    }
}

/// The primary upstream: answers at once (JSON content, so validity can be compared).
async fn primary() -> (common::Server, common::Requests) {
    fake("/chat/completions", |req| {
        if req.json()["stream"] == true {
            Reply::now(
                Script::new()
                    .send_all(openai::stream(&["{\"a\":", " 1}"], "stop", Some(4)))
                    .sse(),
            )
        } else {
            Reply::now(json(
                StatusCode::OK,
                openai::body("{\"a\": 1}", "stop", Some(4)),
            ))
        }
    })
    .await
}

fn route(region: &str, model: &str, tier: Tier) -> RouteConfig {
    RouteConfig {
        provider: "fake".into(),
        region: region.into(),
        model: model.into(),
        serves: "chat".into(),
        tier,
        ..RouteConfig::default()
    }
}

/// `chat` served by `fake/main/m1`, shadowed by `fake/shadow/m2` (a primary-tier route: being
/// shadowed must keep it out of real traffic all the same).
fn config(main: &str, shadow: &str, shadowing: Option<ShadowConfig>) -> Config {
    let mut config = Config::default();
    config.providers.push(ProviderConfig {
        id: "fake".into(),
        regions: vec![
            RegionConfig {
                id: "main".into(),
                base_url: main.into(),
            },
            RegionConfig {
                id: "shadow".into(),
                base_url: shadow.into(),
            },
        ],
        ..ProviderConfig::default()
    });
    config.routes.push(route("main", "m1", Tier::Primary));
    let mut s = route("shadow", "m2", Tier::Primary);
    s.price = Some(Price {
        input_per_mtok: 0.0,
        output_per_mtok: 100_000.0,
        currency: "USD".into(),
    });
    if shadowing.is_none() {
        // Not a shadow: a backup that answers only when the main route cannot.
        s.tier = Tier::Backup;
    }
    config.routes.push(s);
    config.shadows.extend(shadowing);
    config.proxy.enabled = true;
    config
}

fn shadowing(max_cost_per_hour: f64) -> ShadowConfig {
    ShadowConfig {
        serves: "chat".into(),
        route: "fake/shadow/m2".into(),
        ratio: 1.0,
        max_cost_per_hour,
    }
}

struct Running {
    base: String,
    proxy: Proxy,
    shutdown: CancellationToken,
    /// Every passive outcome the proxy reported.
    passive: Arc<std::sync::Mutex<Vec<probeok::probe::ProbeOutcome>>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn serve(config: &Config, limits: ShadowLimits) -> Running {
    config.validate().expect("valid config");
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    std::mem::forget(_wtx);
    let (ptx, mut prx) = mpsc::channel(64);
    let passive = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = passive.clone();
    tokio::spawn(async move {
        while let Some(o) = prx.recv().await {
            seen.lock().unwrap().push(o);
        }
    });
    let opts = ProxyOptions {
        shadow: limits,
        ..ProxyOptions::default()
    };
    let p = Proxy::with_options(config, wrx, ptx, opts).expect("proxy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p.clone(), shutdown.clone()));
    Running {
        base: format!("http://{addr}/v1"),
        proxy: p,
        shutdown,
        passive,
    }
}

fn ask(stream: bool) -> Value {
    j!({"model": "chat", "stream": stream, "max_tokens": 10,
        "response_format": {"type": "json_object"},
        "messages": [{"role": "user", "content": "hello"}]})
}

async fn post(base: &str, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .post(format!("{base}/chat/completions"))
        .json(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.expect("the proxy answers")
}

/// Polls `check` until it holds (10 s at most).
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn report(p: &Proxy) -> Value {
    p.shadow_report().into_iter().next().expect("one shadow")
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_never_delays_the_client_and_is_compared_after_it() {
    let (main, main_reqs) = primary().await;
    let shadow = gated(4).await;
    let on = serve(
        &config(
            &main.base_url(),
            &shadow.server.base_url(),
            Some(shadowing(100.0)),
        ),
        ShadowLimits::default(),
    )
    .await;
    let off = serve(
        &config(&main.base_url(), &shadow.server.base_url(), None),
        ShadowLimits::default(),
    )
    .await;

    // Non-streamed: the answer is here while the shadow upstream is held at its gate.
    let t = std::time::Instant::now();
    let r = post(&on.base, &ask(false), &[]).await;
    let with_shadow = t.elapsed();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-probeok-route"], "fake/main/m1");
    assert_eq!(r.headers()["x-probeok-mode"], "normal");
    let body: Value = r.json().await.unwrap();
    assert!(
        body.get("probeok").is_none(),
        "a normal answer is untouched"
    );
    until("the copy reached the shadow", || {
        shadow.seen.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(
        shadow.gate.available_permits(),
        0,
        "the shadow has not answered yet"
    );
    assert_eq!(report(&on.proxy)["last_hour"]["compared"], 0);
    let t = std::time::Instant::now();
    let r = post(&off.base, &ask(false), &[]).await;
    let without = t.elapsed();
    assert_eq!(r.status(), 200);
    assert!(with_shadow < Duration::from_secs(1), "{with_shadow:?}");
    eprintln!("client latency with a held shadow: {with_shadow:?}; shadowing off: {without:?}");

    // The copy is the client's request with the shadow route's model name, sent once.
    let copy = shadow.bodies.lock().unwrap()[0].clone();
    assert_eq!(copy["model"], "m2");
    assert_eq!(copy["messages"], ask(false)["messages"]);
    shadow.gate.add_permits(1);
    until("the comparison", || {
        report(&on.proxy)["last_hour"]["compared"] == 1
    })
    .await;
    let h = report(&on.proxy)["last_hour"].clone();
    assert_eq!(h["copied"], 1);
    assert_eq!(h["success"]["both"], 1);
    assert_eq!(h["validity"]["checked"], 1);
    assert_eq!(h["validity"]["primary"], 1.0);
    assert_eq!(h["validity"]["shadow"], 1.0);
    assert_eq!(h["output_length_ratio"], 1.0);
    assert!(h["latency_ms_p50"]["shadow"].as_f64().is_some());

    // Streamed: the client's stream ends while the copy is still held; then the copy's TTFT.
    let r = post(&on.base, &ask(true), &[]).await;
    let text = r.text().await.unwrap();
    assert!(text.contains("[DONE]"), "{text}");
    until("the streamed copy", || {
        shadow.seen.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(shadow.bodies.lock().unwrap()[1]["stream"], true);
    shadow.gate.add_permits(1);
    until("the streamed comparison", || {
        report(&on.proxy)["last_hour"]["compared"] == 2
    })
    .await;
    let h = report(&on.proxy)["last_hour"].clone();
    assert!(h["ttft_ms_p50"]["shadow"].as_f64().is_some(), "{h}");
    assert!(h["ttft_ms_p50"]["primary"].as_f64().is_some(), "{h}");
    assert_eq!(h["validity"]["shadow"], 1.0);

    // An Idempotency-Key request is never copied.
    let r = post(&on.base, &ask(false), &[("idempotency-key", "k-1")]).await;
    assert_eq!(r.status(), 200);
    until("the skip counted", || {
        report(&on.proxy)["last_hour"]["skipped"]["idempotency_key"] == 1
    })
    .await;
    tokio::task::yield_now().await;
    assert_eq!(shadow.seen.load(Ordering::SeqCst), 2, "not copied");

    // The shadow route never served real traffic: every real request went to the main route.
    assert_eq!(main_reqs.all().len(), 4);

    // Overhead on the client path, one run on a shared machine (figures in the report).
    let mut on_ms = Vec::new();
    let mut off_ms = Vec::new();
    shadow.gate.add_permits(10_000);
    for _ in 0..40 {
        for (base, out) in [(&on.base, &mut on_ms), (&off.base, &mut off_ms)] {
            let t = std::time::Instant::now();
            let r = post(base, &ask(false), &[]).await;
            assert_eq!(r.status(), 200);
            let _ = r.bytes().await;
            out.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let p99 = |xs: &mut Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[(xs.len() * 99 / 100).min(xs.len() - 1)]
    };
    eprintln!(
        "shadow overhead: p50 on {:.2} ms / off {:.2} ms; p99 on {:.2} ms / off {:.2} ms",
        median(on_ms.clone()),
        median(off_ms.clone()),
        p99(&mut on_ms),
        p99(&mut off_ms)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_and_the_hourly_budget_hold() {
    let (main, _) = primary().await;
    // One copy in flight and one waiting: the rest are dropped and counted.
    let shadow = gated(1).await;
    let p = serve(
        &config(
            &main.base_url(),
            &shadow.server.base_url(),
            Some(shadowing(100.0)),
        ),
        ShadowLimits {
            queue: 1,
            concurrency: 1,
        },
    )
    .await;
    assert_eq!(post(&p.base, &ask(false), &[]).await.status(), 200);
    until("the first copy in flight", || {
        shadow.seen.load(Ordering::SeqCst) == 1
    })
    .await;
    for _ in 0..3 {
        assert_eq!(post(&p.base, &ask(false), &[]).await.status(), 200);
    }
    let h = report(&p.proxy)["last_hour"].clone();
    assert_eq!(h["copied"], 2, "{h}");
    assert_eq!(h["skipped"]["queue_full"], 2, "{h}");
    shadow.gate.add_permits(2);
    until("both copies compared", || {
        report(&p.proxy)["last_hour"]["compared"] == 2
    })
    .await;
    assert_eq!(shadow.seen.load(Ordering::SeqCst), 2);

    // The budget: a copy may cost 10 tokens × 0.1 = 1.0 (reserved before sending, settled to
    // the 10 tokens it used); 1.5 an hour covers one copy, not two.
    let shadow = gated(10).await;
    let p = serve(
        &config(
            &main.base_url(),
            &shadow.server.base_url(),
            Some(shadowing(1.5)),
        ),
        ShadowLimits::default(),
    )
    .await;
    shadow.gate.add_permits(10);
    assert_eq!(post(&p.base, &ask(false), &[]).await.status(), 200);
    until("the first copy compared", || {
        report(&p.proxy)["last_hour"]["compared"] == 1
    })
    .await;
    assert_eq!(post(&p.base, &ask(false), &[]).await.status(), 200);
    let r = report(&p.proxy);
    assert_eq!(r["last_hour"]["skipped"]["budget"], 1, "{r}");
    assert_eq!(r["last_hour"]["copied"], 1);
    assert!(
        (r["spent_this_hour"].as_f64().unwrap() - 1.0).abs() < 1e-9,
        "{r}"
    );
    assert_eq!(shadow.seen.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_reaches_its_route_only_and_the_answer_says_so() {
    let (main, main_reqs) = primary().await;
    let (other, other_reqs) = primary().await;
    let mut config = config(&main.base_url(), &other.base_url(), None);
    config.routes[0].request = Some(RequestProfile {
        system_prefix: Some("Answer in JSON.".into()),
        set: j!({"temperature": 0.3}).as_object().cloned().unwrap(),
        drop: vec!["logprobs".into()],
    });
    // The second route is a backup here: it answers when the first fails over.
    config.routes[1].tier = Tier::Backup;
    let p = serve(&config, ShadowLimits::default()).await;
    let mut body = ask(false);
    body["logprobs"] = j!(true);
    body["temperature"] = j!(1.0);
    body["messages"] =
        j!([{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]);
    let r = post(&p.base, &body, &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-probeok-profile"], "fake/main/m1");
    let sent = main_reqs.last().json();
    assert_eq!(
        sent["messages"][0]["content"],
        "Answer in JSON.\n\nBe kind."
    );
    assert_eq!(sent["messages"][1]["content"], "hi");
    assert_eq!(sent["temperature"], 0.3);
    assert!(sent.get("logprobs").is_none());
    assert_eq!(sent["model"], "m1");
    assert!(other_reqs.all().is_empty());

    // A route without a profile gets the client's request as it came, and no header.
    drop(main);
    let r = post(&p.base, &body, &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-probeok-route"], "fake/shadow/m2");
    assert!(r.headers().get("x-probeok-profile").is_none());
    let sent = other_reqs.last().json();
    assert_eq!(sent["messages"][0]["content"], "Be kind.");
    assert_eq!(sent["temperature"], 1.0);
    assert_eq!(sent["logprobs"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_tier_answer_says_reduced_in_its_body_and_first_chunk() {
    let upstream_body = openai::body("fine", "stop", Some(2));
    let expected = serde_json::to_vec(&upstream_body).unwrap();
    let (good, _) = fake("/chat/completions", move |req| {
        if req.json()["stream"] == true {
            Reply::now(
                Script::new()
                    .send_all(openai::stream(&["fi", "ne"], "stop", None))
                    .sse(),
            )
        } else {
            Reply::now(
                Response::builder()
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(
                        serde_json::to_vec(&openai::body("fine", "stop", Some(2))).unwrap(),
                    ))
                    .unwrap(),
            )
        }
    })
    .await;
    let (down, _) = fake("/chat/completions", |_| {
        Reply::now(json(
            StatusCode::SERVICE_UNAVAILABLE,
            openai::error("down", "server_error", None),
        ))
    })
    .await;

    // Normal: the upstream's bytes, unchanged.
    let normal = serve(
        &config(&good.base_url(), &down.base_url(), None),
        ShadowLimits::default(),
    )
    .await;
    let mut plain = ask(false);
    plain.as_object_mut().unwrap().remove("response_format");
    let r = post(&normal.base, &plain, &[]).await;
    assert_eq!(r.headers()["x-probeok-mode"], "normal");
    assert_eq!(r.bytes().await.unwrap().to_vec(), expected);

    // The primary fails; the fallback-tier route answers.
    let mut c = config(&down.base_url(), &good.base_url(), None);
    c.routes[1].tier = Tier::Fallback;
    let p = serve(&c, ShadowLimits::default()).await;
    let r = post(&p.base, &plain, &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-probeok-mode"], "fallback");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "fine");
    assert_eq!(
        body["probeok"],
        j!({"mode": "fallback", "degraded_reason": "http_503", "degraded_since": null,
            "route": "fake/shadow/m2", "quality_hint": "reduced"})
    );
    let mut streamed = plain.clone();
    streamed["stream"] = j!(true);
    let r = post(&p.base, &streamed, &[]).await;
    assert_eq!(r.headers()["x-probeok-mode"], "fallback");
    let text = r.text().await.unwrap();
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(events[0]["probeok"]["quality_hint"], "reduced");
    assert_eq!(events[0]["probeok"]["route"], "fake/shadow/m2");
    assert!(
        events[1..].iter().all(|e| e.get("probeok").is_none()),
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"));
}

fn service_config(upstream: &str, db: &std::path::Path, proxy_port: u16) -> Config {
    let src = format!(
        r#"
[server]
admin_token_env = "SHADOW_TEST_ADMIN"

[storage]
path = "{db}"

[probe]
interval = "2s"
timeout = "1500ms"
first_byte_timeout = "1s"

[proxy]
enabled = true
listen = "127.0.0.1:{proxy_port}"

[[provider]]
id = "fake"
kind = "openai"
  [[provider.region]]
  id = "main"
  base_url = "{upstream}"
  [[provider.region]]
  id = "shadow"
  base_url = "{upstream}"

[[route]]
provider = "fake"
region = "main"
model = "m1"
serves = "chat"
request = {{ system_prefix = "Answer in JSON.", set = {{ temperature = 0.3 }}, drop = ["logprobs"] }}

[[route]]
provider = "fake"
region = "shadow"
model = "m2"
serves = "chat"

[[shadow]]
serves = "chat"
route = "fake/shadow/m2"
ratio = 1.0
max_cost_per_hour = 5.0
"#,
        db = db.display(),
    );
    let mut c = Config::parse(&src, "shadow.toml").expect("valid").config;
    c.env = probeok::secret::Env::given().with("SHADOW_TEST_ADMIN", "adm");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_reports_shadows_and_probes_stay_probes() {
    let (upstream, reqs) = fake("/chat/completions", |req| {
        let v = req.json();
        if v["stream"] == true {
            Reply::now(
                Script::new()
                    .send_all(openai::stream(&["PROBE_OK"], "stop", Some(2)))
                    .sse(),
            )
        } else {
            Reply::now(json(
                StatusCode::OK,
                openai::body("PROBE_OK", "stop", Some(2)),
            ))
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let proxy_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let config = service_config(&upstream.base_url(), &dir.path().join("s.db"), proxy_port);
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = probeok::app::start(
        config,
        listener,
        Arc::new(probeok::clock::SystemClock),
        shutdown.clone(),
    )
    .await
    .expect("the service starts");
    let base = format!("http://{}", running.addr);
    let proxy_base = format!("http://127.0.0.1:{proxy_port}/v1");
    let http = reqwest::Client::new();

    // A real request through the in-process proxy, once it listens.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let answer = loop {
        let sent = http
            .post(format!("{proxy_base}/chat/completions"))
            .json(&j!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await;
        if let Ok(r) = sent {
            break r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the proxy never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["x-probeok-route"], "fake/main/m1");
    assert_eq!(answer.headers()["x-probeok-profile"], "fake/main/m1");

    // The admin token guards the report.
    let url = format!("{base}/api/v1/shadow");
    assert_eq!(http.get(&url).send().await.unwrap().status(), 401);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let shadow = loop {
        let v: Value = http
            .get(&url)
            .bearer_auth("adm")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if v["shadows"][0]["last_hour"]["compared"] == 1 {
            break v["shadows"][0].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "no comparison: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(shadow["route"], "fake/shadow/m2");
    assert_eq!(shadow["serves"], "chat");
    assert_eq!(shadow["last_day"]["success"]["both"], 1);

    // The shadow route's page: aggregates only.
    let page = http
        .get(format!("{base}/routes/fake/shadow/m2?lang=en"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("ready to enter the pool?"), "{page}");
    assert!(page.contains("1 requests copied, 1 compared"), "{page}");
    assert!(!page.contains("\"hi\""));

    // Probes of the profiled route went out as probes do: no prefix, no profile parameters.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let probes: Vec<Value> = reqs
            .all()
            .iter()
            .map(|c| c.json())
            .filter(|v| v["model"] == "m1" && v["messages"][0]["content"] != "Answer in JSON.")
            .filter(|v| {
                v["messages"]
                    .as_array()
                    .is_some_and(|m| m.iter().all(|m| m["content"] != "hi"))
            })
            .collect();
        if let Some(probe) = probes.first() {
            let system = probe["messages"][0]["content"].as_str().unwrap_or_default();
            assert!(!system.starts_with("Answer in JSON."), "{probe}");
            assert_ne!(probe["temperature"], 0.3, "{probe}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no probe of m1 seen"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), running.done).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_shadow_touches_nothing_of_the_real_routes() {
    let (main, _) = primary().await;
    let (broken, broken_reqs) = fake("/chat/completions", |_| {
        Reply::now(json(
            StatusCode::SERVICE_UNAVAILABLE,
            openai::error("down", "server_error", None),
        ))
    })
    .await;
    let p = serve(
        &config(&main.base_url(), &broken.base_url(), Some(shadowing(100.0))),
        ShadowLimits::default(),
    )
    .await;
    for _ in 0..8 {
        let r = post(&p.base, &ask(false), &[]).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-probeok-route"], "fake/main/m1");
        assert_eq!(r.headers()["x-probeok-mode"], "normal");
    }
    until("eight failed copies compared", || {
        report(&p.proxy)["last_hour"]["compared"] == 8
    })
    .await;
    let h = report(&p.proxy)["last_hour"].clone();
    assert_eq!(h["success"]["shadow"], 0, "{h}");
    assert_eq!(h["success"]["primary"], 8, "{h}");
    assert_eq!(h["success"]["either"], 8, "{h}");
    assert_eq!(broken_reqs.all().len(), 8, "one copy each, never retried");
    // No breaker of the shadow route, the real one closed; detection heard of the real
    // route only.
    let breakers = p.proxy.breakers();
    assert!(breakers
        .iter()
        .all(|b| b.route.as_str() != "fake/shadow/m2"));
    assert!(breakers
        .iter()
        .all(|b| b.state == probeok::proxy::BreakerState::Closed));
    let passive = p.passive.lock().unwrap().clone();
    assert_eq!(passive.len(), 8);
    assert!(passive.iter().all(|o| o.route.as_str() == "fake/main/m1"));
}
