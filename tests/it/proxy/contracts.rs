//! Degradation contracts in the proxy: each behaviour against real fake upstreams,
//! with the model's state driven through the proxy's weights channel — `reject`,
//! `fallback_model` (used, refused when the fallback is down or incapable), `cached_response`
//! (max age on a manual clock, per client key), `async_queue` (persisted, survives a restart,
//! runs on recovery, expires), the feature header, `user_message` in body and header, and
//! metering.

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::{fake, json, openai, Captured, Reply, Requests, Server};
use probeok::clock::{Clock, ManualClock};
use probeok::config::{
    Behaviour, Config, ContractConfig, ProviderConfig, RegionConfig, RouteConfig,
};
use probeok::proxy::{self, jobs::WorkerOptions, Proxy, ProxyOptions, WeightsView};
use probeok::route::{Capability, Tier};
use probeok::store::{Store, StoreOptions};
use serde_json::{json as j, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const KEY_A: &str = "sk-client-contracts-a-0123456789";
const KEY_B: &str = "sk-client-contracts-b-0123456789";
const CLIENT_KEYS_ENV: &str = "PROBEOK_TEST_CONTRACT_CLIENT_KEYS";
const MESSAGE: &str = "稍后再试 — AI is resting (backup mode)";

struct Up {
    server: Server,
    reqs: Requests,
}

/// An upstream answering `text #n` (n counts its calls from 1).
async fn counting(text: &'static str) -> Up {
    let n = Arc::new(AtomicUsize::new(0));
    let (server, reqs) = fake("/chat/completions", move |c: &Captured| {
        let i = n.fetch_add(1, Ordering::SeqCst) + 1;
        let stream = c.json()["stream"].as_bool() == Some(true);
        if stream {
            let body: String = openai::stream(&[text, &format!(" #{i}")], "stop", Some(2)).concat();
            return Reply::now(common::with_type(
                StatusCode::OK,
                "text/event-stream",
                axum::body::Body::from(body),
            ));
        }
        Reply::now(json(
            StatusCode::OK,
            openai::body(&format!("{text} #{i}"), "stop", Some(3)),
        ))
    })
    .await;
    Up { server, reqs }
}

/// `chat` served by `main` (primary, stream + tools), `lite` by `lite` (primary, stream only).
fn config(main: &Up, lite: &Up, contracts: Vec<ContractConfig>, auth: bool) -> Config {
    let mut config = Config::default();
    for (i, (u, serves, caps)) in [
        (main, "chat", vec![Capability::Stream, Capability::Tools]),
        (lite, "lite", vec![Capability::Stream]),
    ]
    .into_iter()
    .enumerate()
    {
        config.providers.push(ProviderConfig {
            id: format!("p{i}"),
            api_key_env: Some(format!("PROBEOK_TEST_CONTRACT_KEY_{i}")),
            regions: vec![RegionConfig {
                id: "r".into(),
                base_url: u.server.base_url(),
            }],
            ..ProviderConfig::default()
        });
        config.routes.push(RouteConfig {
            provider: format!("p{i}"),
            region: "r".into(),
            model: format!("up-{i}"),
            serves: serves.into(),
            tier: Tier::Primary,
            weight: 100,
            capabilities: caps,
            ..RouteConfig::default()
        });
        config.env.set(
            format!("PROBEOK_TEST_CONTRACT_KEY_{i}"),
            format!("sk-upstream-contract-key-{i}-0123456789"),
        );
    }
    config.proxy.enabled = true;
    config.proxy.total_timeout = Duration::from_secs(10);
    if auth {
        config.env.set(CLIENT_KEYS_ENV, format!("{KEY_A},{KEY_B}"));
        config.proxy.client_keys_env = CLIENT_KEYS_ENV.into();
    } else {
        config.proxy.client_keys_env = "PROBEOK_TEST_CONTRACT_NO_SUCH_VAR".into();
    }
    config.contracts = contracts;
    config
}

fn contract(degraded: Option<Behaviour>, critical: Option<Behaviour>) -> ContractConfig {
    ContractConfig {
        feature: "default".into(),
        degraded,
        critical,
        user_message: Some(MESSAGE.into()),
        retry_after: Duration::from_secs(42),
    }
}

struct Px {
    base: String,
    shutdown: CancellationToken,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    proxy: Proxy,
    weights: watch::Sender<Arc<WeightsView>>,
    config: Config,
    http: reqwest::Client,
}

async fn start(config: &Config, store: Option<Store>, clock: Arc<dyn Clock>) -> Px {
    start_live(config, store, clock, None).await
}

/// [`start`] with the proxy following `live` (what hot reload publishes).
async fn start_live(
    config: &Config,
    store: Option<Store>,
    clock: Arc<dyn Clock>,
    live: Option<watch::Receiver<Arc<Config>>>,
) -> Px {
    let (wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, mut prx) = mpsc::channel(1024);
    tokio::spawn(async move { while prx.recv().await.is_some() {} });
    let opts = ProxyOptions {
        store,
        clock,
        live,
        ..ProxyOptions::default()
    };
    let p = Proxy::with_options(config, wrx, ptx, opts).expect("proxy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(proxy::serve(listener, p.clone(), shutdown.clone()));
    Px {
        base: format!("http://{addr}"),
        shutdown,
        served,
        proxy: p,
        weights: wtx,
        config: config.clone(),
        http: reqwest::Client::new(),
    }
}

impl Px {
    /// Sets the primaries' states per model (`CRITICAL` with weight 0, like the feed).
    fn states(&self, states: &[(&str, &str)]) {
        let mut view = WeightsView::from_config(&self.config.routes());
        view.version = format!("v{}", rand::random::<u32>());
        for (model, state) in states {
            let m = view.models.get_mut(*model).expect("model");
            for r in &mut m.routes {
                r.state = (*state).to_owned();
                if matches!(*state, "CRITICAL" | "SWITCHED") {
                    r.weight = 0;
                }
            }
            m.all_unhealthy = m.routes.iter().all(|r| r.weight == 0);
        }
        self.weights.send_replace(Arc::new(view));
    }

    async fn post(&self, body: Value, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = self
            .http
            .post(format!("{}/v1/chat/completions", self.base))
            .json(&body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.expect("proxy answers")
    }

    async fn job(&self, id: &str, key: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .get(format!("{}/v1/jobs/{id}", self.base))
            .bearer_auth(key)
            .send()
            .await
            .expect("proxy answers");
        let status = r.status();
        (status, r.json().await.expect("json"))
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.served).await;
    }
}

fn chat() -> Value {
    j!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .map_or("", |v| v.to_str().expect("ascii header"))
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .expect("utf-8")
        .into_owned()
}

async fn open(path: &Path) -> Store {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || Store::open(&path, StoreOptions::default()))
        .await
        .unwrap()
        .unwrap()
}

/// Polls `check` every 20 ms until it returns `Some`, for at most 10 s.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn count(path: &Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[tokio::test]
async fn reject_answers_503_with_the_message_and_retry_after_without_an_upstream_call() {
    let main = counting("main").await;
    let lite = counting("lite").await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let store = open(&db).await;
    let reject = Behaviour::Reject {
        message: "AI features are temporarily unavailable, please retry later".into(),
    };
    let cfg = config(&main, &lite, vec![contract(None, Some(reject))], false);
    let px = start(
        &cfg,
        Some(store.clone()),
        Arc::new(probeok::clock::SystemClock),
    )
    .await;

    // DEGRADED has no behaviour here: served as usual.
    let started = chrono::Utc::now();
    px.states(&[("chat", "DEGRADED")]);
    let r = px.post(chat(), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(main.reqs.all().len(), 1);

    px.states(&[("chat", "CRITICAL")]);
    let r = px.post(chat(), &[("x-request-id", "req-reject-1")]).await;
    assert_eq!(r.status(), 503);
    assert_eq!(header(&r, "retry-after"), "42");
    assert_eq!(header(&r, "x-probeok-mode"), "degraded");
    assert_eq!(header(&r, "x-probeok-route"), "none");
    assert_eq!(header(&r, "x-probeok-attempts"), "0");
    assert_eq!(header(&r, "x-request-id"), "req-reject-1");
    assert_eq!(decode(header(&r, "x-probeok-user-message")), MESSAGE);
    let mut body: Value = r.json().await.unwrap();
    assert_eq!(
        body["error"],
        j!({"message": "AI features are temporarily unavailable, please retry later",
            "type": "service_unavailable", "code": "feature_degraded"})
    );
    // Since the proxy first saw the model's primaries DEGRADED (the request before), not
    // since this answer.
    let since = body["probeok"]["degraded_since"].take();
    let since =
        chrono::DateTime::parse_from_rfc3339(since.as_str().expect("a time")).expect("RFC 3339");
    assert!(since <= chrono::Utc::now() && since >= started - chrono::Duration::seconds(1));
    assert_eq!(
        body["probeok"],
        j!({"mode": "degraded", "feature": "default", "contract": "reject", "user_message": MESSAGE,
            "degraded_reason": "contract_reject", "degraded_since": null, "route": null,
            "quality_hint": "normal"})
    );
    assert_eq!(main.reqs.all().len(), 1, "no upstream call");

    // Metered with the behaviour, shown by GET /api/v1/requests, counted.
    let api = common::spawn(probeok::web::requests::router(
        store.clone(),
        probeok::secret::Secret::new("adm"),
    ))
    .await;
    let url = format!("{}/api/v1/requests", api.base_url());
    let listed: Value = eventually("the metered reject", || async {
        let v: Value = reqwest::Client::new()
            .get(&url)
            .bearer_auth("adm")
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (v["requests"].as_array()?.len() == 2).then_some(v)
    })
    .await;
    let newest = &listed["requests"][0];
    assert_eq!(newest["request_id"], "req-reject-1");
    assert_eq!(newest["contract"], "reject");
    assert_eq!(newest["outcome"], "rejected");
    assert_eq!(newest["status"], 503);
    assert_eq!(listed["requests"][1]["contract"], Value::Null);
    let uses = px.proxy.counters().contract_uses;
    assert_eq!(uses, vec![(("default".into(), "reject".into()), 1)]);
    // …and exported as an OpenMetrics counter.
    let slot = proxy::export::ProxySlot::default();
    slot.attach(px.proxy.stats());
    let mut registry = prometheus_client::registry::Registry::with_prefix("probeok");
    registry.register_collector(Box::new(slot));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(r#"probeok_contract_uses_total{feature="default",contract="reject"} 1"#),
        "{text}"
    );
    px.stop().await;
}

#[tokio::test]
async fn fallback_model_serves_a_degraded_model_from_the_fallback_openly() {
    let main = counting("main").await;
    let lite = counting("lite").await;
    let fallback = Behaviour::FallbackModel("lite".into());
    let cfg = config(&main, &lite, vec![contract(Some(fallback), None)], false);
    let px = start(&cfg, None, Arc::new(probeok::clock::SystemClock)).await;
    px.states(&[("chat", "DEGRADED"), ("lite", "NORMAL")]);

    let r = px.post(chat(), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-mode"), "fallback");
    assert_eq!(
        header(&r, "x-probeok-fallback-reason"),
        "contract_fallback_model"
    );
    assert_eq!(header(&r, "x-probeok-model"), "lite");
    assert_eq!(header(&r, "x-probeok-route"), "p1/r/up-1");
    assert_eq!(header(&r, "x-probeok-attempts"), "1");
    assert_eq!(decode(header(&r, "x-probeok-user-message")), MESSAGE);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "lite #1");
    assert_eq!(
        body["probeok"],
        j!({"mode": "fallback", "feature": "default", "contract": "fallback_model", "user_message": MESSAGE,
            "degraded_reason": "contract_fallback_model", "degraded_since": null,
            "route": "p1/r/up-1", "quality_hint": "reduced"})
    );
    assert_eq!(
        lite.reqs.last().json()["model"],
        "up-1",
        "the fallback's own model name"
    );
    assert!(main.reqs.all().is_empty());

    // A stream from the fallback: the header says it, and so does the first chunk.
    let mut streamed = chat();
    streamed["stream"] = j!(true);
    let r = px.post(streamed, &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-mode"), "fallback");
    assert_eq!(header(&r, "x-probeok-model"), "lite");
    assert_eq!(decode(header(&r, "x-probeok-user-message")), MESSAGE);
    let text = r.text().await.unwrap();
    assert!(text.contains("lite") && text.contains("[DONE]"), "{text}");
    let first: Value = serde_json::from_str(
        text.split("\n\n")
            .next()
            .and_then(|e| e.strip_prefix("data: "))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["probeok"]["contract"], "fallback_model");
    assert_eq!(first["probeok"]["quality_hint"], "reduced");
    assert!(main.reqs.all().is_empty());
    px.stop().await;
}

#[tokio::test]
async fn fallback_model_is_refused_when_the_fallback_is_down_or_incapable() {
    let main = counting("main").await;
    let lite = counting("lite").await;
    let fallback = Behaviour::FallbackModel("lite".into());
    let cfg = config(&main, &lite, vec![contract(Some(fallback), None)], false);
    let px = start(&cfg, None, Arc::new(probeok::clock::SystemClock)).await;

    // The fallback is itself down: the original model serves, and the answer says why.
    px.states(&[("chat", "DEGRADED"), ("lite", "CRITICAL")]);
    let r = px.post(chat(), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-contract"), "fallback_model_unusable");
    assert_eq!(header(&r, "x-probeok-route"), "p0/r/up-0");
    assert_eq!(header(&r, "x-probeok-model"), "");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "main #1");
    assert!(
        body.get("probeok").is_none(),
        "no contract answered: {body}"
    );

    // Healthy but incapable: `lite` has no tools, the request needs them.
    px.states(&[("chat", "DEGRADED"), ("lite", "NORMAL")]);
    let mut tools = chat();
    tools["tools"] = j!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    let r = px.post(tools, &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-contract"), "fallback_model_unusable");
    assert_eq!(header(&r, "x-probeok-route"), "p0/r/up-0");
    assert!(lite.reqs.all().is_empty(), "the fallback was never called");
    assert_eq!(main.reqs.all().len(), 2);
    px.stop().await;
}

#[tokio::test]
async fn a_cached_answer_is_served_within_max_age_not_after_and_not_to_another_client() {
    let main = counting("main").await;
    let lite = counting("lite").await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let store = open(&db).await;
    let clock = Arc::new(ManualClock::new(
        "2026-01-01T00:00:00Z".parse().expect("time"),
    ));
    let cached = Behaviour::CachedResponse {
        max_age: Duration::from_secs(300),
    };
    let cfg = config(&main, &lite, vec![contract(Some(cached), None)], true);
    let px = start(&cfg, Some(store.clone()), clock.clone()).await;
    let a = [("authorization", &*format!("Bearer {KEY_A}"))];
    let b = [("authorization", &*format!("Bearer {KEY_B}"))];
    let mut first = chat();
    first["user"] = j!("end-user-1");

    // Healthy: served, and remembered (the contract has a cached_response).
    let r = px.post(first, &a).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-cache"), "");
    eventually("the answer remembered", || async {
        (count(&db, "SELECT COUNT(*) FROM contract_cache") == 1).then_some(())
    })
    .await;

    // DEGRADED: the same request (another `user`, which does not change the answer) gets it.
    px.states(&[("chat", "DEGRADED")]);
    clock.advance(Duration::from_secs(100));
    let mut again = chat();
    again["user"] = j!("end-user-2");
    let r = px.post(again.clone(), &a).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-cache"), "hit");
    assert_eq!(header(&r, "x-probeok-mode"), "degraded");
    assert_eq!(header(&r, "age"), "100");
    assert_eq!(header(&r, "x-probeok-route"), "none");
    assert_eq!(header(&r, "x-probeok-attempts"), "0");
    assert_eq!(decode(header(&r, "x-probeok-user-message")), MESSAGE);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "main #1");
    assert_eq!(body["probeok"]["contract"], "cached_response");
    assert_eq!(body["probeok"]["mode"], "degraded");
    assert_eq!(main.reqs.all().len(), 1, "no upstream call for a hit");

    // Another client key never sees it: a miss, served by the upstream.
    let r = px.post(again.clone(), &b).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-cache"), "miss");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "main #2");

    // Past the max age: a miss for the first client too.
    clock.advance(Duration::from_secs(201));
    let r = px.post(again, &a).await;
    assert_eq!(header(&r, "x-probeok-cache"), "miss");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "main #3");
    assert_eq!(main.reqs.all().len(), 3);
    px.stop().await;
}

#[tokio::test]
async fn an_async_job_survives_a_restart_and_runs_when_the_model_recovers() {
    let main = counting("main").await;
    let lite = counting("lite").await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let queue = Behaviour::AsyncQueue {
        ttl: Duration::from_secs(3600),
    };
    let cfg = config(&main, &lite, vec![contract(Some(queue), None)], true);
    let auth = format!("Bearer {KEY_A}");
    let workers = WorkerOptions {
        tick: Duration::from_millis(50),
        ..WorkerOptions::default()
    };

    let store = open(&db).await;
    let px = start(
        &cfg,
        Some(store.clone()),
        Arc::new(probeok::clock::SystemClock),
    )
    .await;
    let worker = px
        .proxy
        .spawn_jobs(workers.clone(), px.shutdown.clone())
        .expect("a store: a worker");
    px.states(&[("chat", "DEGRADED")]);
    let mut streamed = chat();
    streamed["stream"] = j!(true);
    let r = px
        .post(
            streamed,
            &[("authorization", &auth), ("x-probeok-feature", "summaries")],
        )
        .await;
    assert_eq!(r.status(), 202);
    assert_eq!(header(&r, "x-probeok-mode"), "degraded");
    assert_eq!(header(&r, "x-probeok-route"), "none");
    assert_eq!(header(&r, "retry-after"), "42");
    let location = header(&r, "location").to_owned();
    let job: Value = r.json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("job_"), "{id}");
    assert_eq!(location, format!("/v1/jobs/{id}"));
    assert_eq!(job["object"], "probeok.job");
    assert_eq!(job["status"], "queued");
    assert_eq!(job["model"], "chat");
    assert_eq!(job["feature"], "summaries");
    assert_eq!(job["stream_requested"], true);
    assert_eq!(
        job["expires_at"].as_i64().unwrap() - job["created_at"].as_i64().unwrap(),
        3600
    );
    assert_eq!(job["probeok"]["contract"], "async_queue");
    assert_eq!(job["probeok"]["user_message"], MESSAGE);
    // Persisted before the 202, with the client's hash, never the key.
    assert_eq!(count(&db, "SELECT COUNT(*) FROM contract_jobs"), 1);
    let owner: String = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT owner FROM contract_jobs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(owner.len(), 64);
    assert!(!owner.contains("sk-client"));
    let (status, polled) = px.job(&id, KEY_A).await;
    assert_eq!(status, 200);
    assert_eq!(polled["status"], "queued");
    let (status, _) = px.job(&id, KEY_B).await;
    assert_eq!(status, 404, "another client key never sees the job");

    // Restart while still degraded: drop the proxy, close the store, reopen the file.
    px.stop().await;
    worker.await.unwrap();
    store.close().await.unwrap();
    let store = open(&db).await;
    let px = start(
        &cfg,
        Some(store.clone()),
        Arc::new(probeok::clock::SystemClock),
    )
    .await;
    px.states(&[("chat", "DEGRADED")]);
    let _worker = px.proxy.spawn_jobs(workers, px.shutdown.clone());
    let (status, polled) = px.job(&id, KEY_A).await;
    assert_eq!(status, 200);
    assert_eq!(polled["status"], "queued", "nothing queued is lost");
    assert!(main.reqs.all().is_empty(), "not run while degraded");

    // Recovery: the worker runs it once, non-streaming, and keeps the upstream's answer.
    px.states(&[("chat", "NORMAL")]);
    let done = eventually("the job to succeed", || async {
        let (_, v) = px.job(&id, KEY_A).await;
        (v["status"] == "succeeded").then_some(v)
    })
    .await;
    assert_eq!(done["result"]["status"], 200);
    assert_eq!(
        done["result"]["body"]["choices"][0]["message"]["content"],
        "main #1"
    );
    assert!(done["completed_at"].is_i64());
    let sent = main.reqs.all();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].json()["stream"], false, "run with stream: false");
    // The worker beats its heartbeat.
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM heartbeats WHERE job = 'async_jobs'"
        ),
        1
    );
    px.stop().await;
}

#[tokio::test]
async fn an_async_job_expires_after_its_ttl_and_never_runs() {
    let main = counting("main").await;
    let lite = counting("lite").await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let store = open(&db).await;
    let clock = Arc::new(ManualClock::new(
        "2026-01-01T00:00:00Z".parse().expect("time"),
    ));
    let queue = Behaviour::AsyncQueue {
        ttl: Duration::from_secs(60),
    };
    let cfg = config(&main, &lite, vec![contract(None, Some(queue))], false);
    let px = start(&cfg, Some(store.clone()), clock.clone()).await;
    px.states(&[("chat", "CRITICAL")]);
    let r = px.post(chat(), &[]).await;
    assert_eq!(r.status(), 202);
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    clock.advance(Duration::from_secs(61));
    let (_, polled) = px.job(&id, "").await;
    assert_eq!(polled["status"], "expired");
    assert_eq!(polled["error"]["code"], "job_expired");

    // The worker marks it expired; recovery afterwards never runs it.
    let _worker = px.proxy.spawn_jobs(
        WorkerOptions {
            tick: Duration::from_millis(50),
            ..WorkerOptions::default()
        },
        px.shutdown.clone(),
    );
    eventually("the job marked expired", || async {
        let n = count(
            &db,
            "SELECT COUNT(*) FROM contract_jobs WHERE status = 'expired' AND finished_at_ms IS NOT NULL",
        );
        (n == 1).then_some(())
    })
    .await;
    px.states(&[("chat", "NORMAL")]);
    let r = px.post(chat(), &[]).await;
    assert_eq!(r.status(), 200, "healthy again: served");
    assert_eq!(main.reqs.all().len(), 1, "only the new request reached it");
    px.stop().await;
}

#[tokio::test]
async fn a_malformed_feature_header_is_refused_before_any_upstream_call() {
    let main = counting("main").await;
    let lite = counting("lite").await;
    let cfg = config(&main, &lite, Vec::new(), false);
    let px = start(&cfg, None, Arc::new(probeok::clock::SystemClock)).await;
    let long = "x".repeat(65);
    for bad in ["has space", "a/b", long.as_str(), "semi;colon"] {
        let r = px.post(chat(), &[("x-probeok-feature", bad)]).await;
        assert_eq!(r.status(), 400, "{bad}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_feature");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
    let r = px
        .post(chat(), &[("x-probeok-feature", "chat.v2_beta-1")])
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(main.reqs.all().len(), 1);
    px.stop().await;
}

#[tokio::test]
async fn the_features_contract_applies_else_the_default_and_never_to_a_switched_model() {
    let main = counting("main").await;
    let lite = counting("lite").await;
    let search = ContractConfig {
        feature: "search".into(),
        degraded: Some(Behaviour::Reject {
            message: "search is paused".into(),
        }),
        critical: None,
        user_message: None,
        retry_after: Duration::from_secs(5),
    };
    let default = contract(
        Some(Behaviour::Reject {
            message: "everything else is paused".into(),
        }),
        None,
    );
    let cfg = config(&main, &lite, vec![search, default], false);
    let px = start(&cfg, None, Arc::new(probeok::clock::SystemClock)).await;
    px.states(&[("chat", "CRITICAL")]);

    let r = px.post(chat(), &[("x-probeok-feature", "search")]).await;
    assert_eq!(r.status(), 503);
    assert_eq!(header(&r, "retry-after"), "5");
    assert_eq!(header(&r, "x-probeok-user-message"), "", "no message set");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["message"], "search is paused");
    assert_eq!(body["probeok"]["feature"], "search");
    assert_eq!(body["probeok"]["user_message"], Value::Null);

    let r = px
        .post(chat(), &[("x-probeok-feature", "unknown-feature")])
        .await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["message"], "everything else is paused");
    assert_eq!(body["probeok"]["feature"], "unknown-feature");

    // SWITCHED: a backup already serves, disclosed; no contract.
    px.states(&[("chat", "SWITCHED")]);
    let r = px.post(chat(), &[("x-probeok-feature", "search")]).await;
    assert_eq!(r.status(), 200);
    assert!(main.reqs.all().len() == 1);
    let uses = px.proxy.counters().contract_uses;
    assert_eq!(
        uses,
        vec![
            (("default".into(), "reject".into()), 1),
            (("search".into(), "reject".into()), 1)
        ]
    );
    px.stop().await;
}

#[tokio::test]
async fn cached_streams_are_replayed_as_their_events_and_kept_apart_from_plain_answers() {
    let main = counting("main").await;
    let lite = counting("lite").await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let store = open(&db).await;
    let cached = Behaviour::CachedResponse {
        max_age: Duration::from_secs(300),
    };
    let cfg = config(&main, &lite, vec![contract(None, Some(cached))], false);
    let px = start(
        &cfg,
        Some(store.clone()),
        Arc::new(probeok::clock::SystemClock),
    )
    .await;
    let mut streamed = chat();
    streamed["stream"] = j!(true);
    let live = px.post(streamed.clone(), &[]).await.text().await.unwrap();
    assert!(live.contains("main") && live.contains("[DONE]"), "{live}");
    eventually("the stream remembered", || async {
        (count(&db, "SELECT COUNT(*) FROM contract_cache WHERE stream = 1") == 1).then_some(())
    })
    .await;

    px.states(&[("chat", "CRITICAL")]);
    let r = px.post(streamed, &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-cache"), "hit");
    assert_eq!(header(&r, "content-type"), "text/event-stream");
    assert_eq!(decode(header(&r, "x-probeok-user-message")), MESSAGE);
    // The same events, byte for byte, but for the notice in the first one.
    let replay = r.text().await.unwrap();
    let (first, rest) = replay.split_once("\n\n").unwrap();
    let (live_first, live_rest) = live.split_once("\n\n").unwrap();
    assert_eq!(rest, live_rest, "the same events after the first");
    let mut first: Value = serde_json::from_str(first.strip_prefix("data: ").unwrap()).unwrap();
    let notice = first.as_object_mut().unwrap().remove("probeok").unwrap();
    assert_eq!(notice["contract"], "cached_response");
    assert_eq!(notice["mode"], "degraded");
    assert_eq!(notice["quality_hint"], "normal");
    let live_first: Value =
        serde_json::from_str(live_first.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(first, live_first);
    assert_eq!(main.reqs.all().len(), 1);

    // The same request without streaming is another entry: a miss.
    let r = px.post(chat(), &[]).await;
    assert_eq!(header(&r, "x-probeok-cache"), "miss");
    assert_eq!(main.reqs.all().len(), 2);
    px.stop().await;
}

#[tokio::test]
async fn an_idempotency_key_retried_while_degraded_gets_the_same_job() {
    let main = counting("main").await;
    let lite = counting("lite").await;
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("p.db")).await;
    let queue = Behaviour::AsyncQueue {
        ttl: Duration::from_secs(600),
    };
    let cfg = config(&main, &lite, vec![contract(Some(queue), None)], false);
    let px = start(&cfg, Some(store), Arc::new(probeok::clock::SystemClock)).await;
    px.states(&[("chat", "DEGRADED")]);
    let key = [("idempotency-key", "order-42")];
    let first = px.post(chat(), &key).await;
    assert_eq!(first.status(), 202);
    let location = header(&first, "location").to_owned();
    let first: Value = first.json().await.unwrap();
    let again = px.post(chat(), &key).await;
    assert_eq!(again.status(), 202);
    assert_eq!(header(&again, "x-probeok-idempotent-replay"), "true");
    assert_eq!(header(&again, "location"), location);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["id"], first["id"], "one job, not two");
    px.stop().await;
}

#[tokio::test]
async fn contracts_follow_the_live_config_without_a_restart() {
    let main = counting("main").await;
    let lite = counting("lite").await;
    let reject = |m: &str| Behaviour::Reject { message: m.into() };
    let cfg = config(
        &main,
        &lite,
        vec![contract(Some(reject("first")), None)],
        false,
    );
    let (live_tx, live_rx) = watch::channel(Arc::new(cfg.clone()));
    let px = start_live(
        &cfg,
        None,
        Arc::new(probeok::clock::SystemClock),
        Some(live_rx),
    )
    .await;
    px.states(&[("chat", "DEGRADED")]);
    let message = |v: Value| {
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };

    let r = px.post(chat(), &[]).await;
    assert_eq!(r.status(), 503);
    assert_eq!(message(r.json().await.unwrap()), "first");

    // A reload publishes a new config: the next request follows it.
    let mut next = cfg.clone();
    next.contracts = vec![contract(Some(reject("second")), None)];
    live_tx.send_replace(Arc::new(next.clone()));
    let r = px.post(chat(), &[]).await;
    assert_eq!(r.status(), 503);
    assert_eq!(message(r.json().await.unwrap()), "second");
    assert!(main.reqs.all().is_empty(), "a reject never calls upstream");

    // The contract removed: served as usual, by the route.
    next.contracts.clear();
    live_tx.send_replace(Arc::new(next));
    let r = px.post(chat(), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-probeok-route"), "p0/r/up-0");
    assert_eq!(main.reqs.all().len(), 1);
    px.stop().await;
}
