//! Embeddings routes against a fake OpenAI-compatible embeddings endpoint (real HTTP on
//! 127.0.0.1:0, OpenAI's documented request and answer shapes):
//!
//! - the prober alone, on a `ManualClock` and a real store: the first good vector becomes the
//!   stored reference, the outcome carries a first byte and a total and no invented token
//!   timings, a model swapped under the same name is an `embedding_changed` finding at the
//!   first probe after the swap, the admin replacement closes it at the next probe, and a
//!   vector of the wrong length is a failed probe, not a finding;
//! - the whole service (`app::start`): the route goes NORMAL with its latency recorded; the
//!   swap is a critical `embedding_changed` finding and exactly one alert at a webhook
//!   receiver; `POST /api/v1/admin/routes/{id}/embedding-reference` replaces the reference and
//!   the finding closes; wrong vector lengths take the outage path.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::embeddings::{embed_fake, EmbedFake, Mode, DIMENSIONS, MODEL_A, MODEL_B};
use common::upstream;
use probeok::app;
use probeok::clock::{ManualClock, SystemClock};
use probeok::config::Config;
use probeok::embed::{replace_reference, EmbedProber, Replaced};
use probeok::probe::{OutcomeKind, ProbeClient};
use probeok::route::RouteId;
use probeok::scheduler::Prober;
use probeok::secret::Env;
use probeok::store::{Store, StoreOptions};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const ROUTE: &str = "acme/r0/text-embedding-v3";
const ADMIN: &str = "T_EMBED_ADMIN";

fn config(base_v1: &str, db: &std::path::Path, hook: Option<&str>) -> Config {
    let alert = if hook.is_some() {
        "[alerting]\ngroup_wait = \"1s\"\n\n[[alert.webhook]]\nurl_env = \"T_EMBED_HOOK\"\nlang = \"en\"\n"
    } else {
        ""
    };
    let src = format!(
        r#"
[server]
admin_token_env = "{ADMIN}"

[storage]
path = "{db}"

[probe]
interval = "300ms"
timeout = "2s"
first_byte_timeout = "1s"
jitter = 0.0

[detection]
min_samples = 3

{alert}
[[provider]]
id = "acme"
kind = "openai"
  [[provider.region]]
  id = "r0"
  base_url = "{base_v1}"

[[route]]
provider = "acme"
region = "r0"
model = "text-embedding-v3"
serves = "embed-v3"
kind = "embeddings"
dimensions = {DIMENSIONS}
"#,
        db = db.display(),
    );
    let mut c = Config::parse(&src, "embeddings.toml").unwrap().config;
    let mut env = Env::given().with(ADMIN, "embed-admin-secret");
    if let Some(hook) = hook {
        env = env.with("T_EMBED_HOOK", hook);
    }
    c.env = env;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_model_is_found_at_the_first_probe_after_the_swap_and_the_admin_call_closes_it() {
    let up = embed_fake().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&up.base_v1(), &dir.path().join("e.db"), None);
    let routes = cfg.routes();
    let route = routes[0].clone();
    assert_eq!(route.embedding, Some(DIMENSIONS));
    // No throughput probe: an embeddings route has no tokens per second.
    assert!(route.probe.throughput_every.is_zero());
    let clock = Arc::new(ManualClock::new(common::app::at("2026-06-01T10:00:00Z")));
    let client = ProbeClient::with_env(&routes, clock.clone(), &cfg.env).unwrap();
    let store = Store::open(&dir.path().join("e.db"), StoreOptions::default()).unwrap();
    // The probe client alone (an agent, `probeok probe`) sends the embeddings probe too; only
    // the monitor's prober keeps and judges vectors.
    let alone: &dyn Prober = &client;
    let o = alone.probe(&route, OutcomeKind::Probe).await;
    assert!(o.success && o.ttft_ms.is_none(), "{o:?}");
    assert_eq!(up.requests.last().path, "/v1/embeddings");
    assert_eq!(store.reader().unwrap().embedding_row(ROUTE).unwrap(), None);
    let (prober, mut findings) = EmbedProber::new(
        client.clone(),
        cfg.embedding_routes(),
        store.clone(),
        clock.clone(),
    );
    let id = RouteId::parse(ROUTE).unwrap();
    let row = |store: &Store| store.reader().unwrap().embedding_row(ROUTE).unwrap();

    // Steady vectors: the first is the reference; the outcome is honest about what a
    // non-streamed vector has.
    let first = prober.probe(&route, OutcomeKind::Probe).await;
    assert!(first.success, "{first:?}");
    assert!(first.ttfb_ms.is_some() && first.total_ms >= first.ttfb_ms.unwrap());
    assert_eq!(
        (first.ttft_ms, first.tokens_per_second, first.output_tokens),
        (None, None, None)
    );
    assert_eq!(first.model_reported.as_deref(), Some("text-embedding-v3"));
    let sent = up.requests.last().json();
    assert_eq!(sent["model"], "text-embedding-v3");
    assert_eq!(sent["encoding_format"], "float");
    assert!(sent["input"].is_string());
    assert_eq!(row(&store).unwrap().reference, MODEL_A.to_vec());
    clock.advance(Duration::from_secs(30));
    assert!(prober.probe(&route, OutcomeKind::Probe).await.success);
    assert!(findings.borrow_and_update().is_empty());

    // The provider swaps the model: found at the first probe after the swap.
    up.set(Mode::ModelB);
    clock.advance(Duration::from_secs(30));
    let swapped = prober.probe(&route, OutcomeKind::Probe).await;
    assert!(
        swapped.success,
        "a changed model still answers: {swapped:?}"
    );
    let open = findings.borrow_and_update().clone();
    assert_eq!(open.len(), 1, "{open:?}");
    let f = &open[0];
    assert_eq!(
        (f.route.clone(), f.kind.as_str()),
        (id.clone(), "embedding_changed")
    );
    assert_eq!(f.severity, probeok::drift::Severity::Critical);
    assert_eq!(
        f.failure_mode,
        Some(probeok::health::FailureMode::BehaviorChanged)
    );
    assert!(f.summary.contains("0.8000"), "{}", f.summary);
    // The reference stays the old model's; the latest is the new one's.
    let r = row(&store).unwrap();
    assert_eq!(
        (r.reference, r.latest),
        (MODEL_A.to_vec(), MODEL_B.to_vec())
    );
    // Still changed at the next probe: the same finding, nothing new published.
    clock.advance(Duration::from_secs(30));
    prober.probe(&route, OutcomeKind::Probe).await;
    assert!(!findings.has_changed().unwrap());

    // The change was intended: the latest vector becomes the reference, and the next probe
    // closes the finding.
    assert_eq!(
        replace_reference(&store, &id).await.unwrap(),
        Replaced::Latest
    );
    assert_eq!(row(&store).unwrap().reference, MODEL_B.to_vec());
    clock.advance(Duration::from_secs(30));
    prober.probe(&route, OutcomeKind::Probe).await;
    assert!(findings.borrow_and_update().is_empty());

    // A vector of the wrong length: a failed probe, the reference untouched, no finding.
    up.set(Mode::WrongLength);
    clock.advance(Duration::from_secs(30));
    let wrong = prober.probe(&route, OutcomeKind::Probe).await;
    assert!(!wrong.success);
    let e = wrong.error.as_ref().unwrap();
    assert_eq!(e.kind(), "malformed");
    assert!(e.message().unwrap().contains("5 dimensions"), "{e}");
    assert!(findings.borrow_and_update().is_empty());
    assert_eq!(row(&store).unwrap().reference, MODEL_B.to_vec());
    store.close().await.unwrap();
}

async fn status(http: &reqwest::Client, base: &str) -> Value {
    common::get_json(http, &format!("{base}/api/v1/status")).await
}

/// Polls `/api/v1/status` until the one route satisfies `done`, within `secs`.
async fn until_route(
    http: &reqwest::Client,
    base: &str,
    secs: u64,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = status(http, base).await;
        let r = v["routes"][0].clone();
        if done(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "{what} within {secs} s: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn drift(http: &reqwest::Client, base: &str) -> Vec<Value> {
    let v = common::get_json(http, &format!("{base}/api/v1/drift")).await;
    v["findings"].as_array().cloned().unwrap_or_default()
}

async fn start(cfg: Config) -> (app::Running, CancellationToken, String) {
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::start(cfg, listener, Arc::new(SystemClock), shutdown.clone())
        .await
        .unwrap();
    let base = format!("http://{}", running.addr);
    (running, shutdown, base)
}

/// Waits until the fake has answered `n` more calls than `from`.
async fn calls_past(up: &EmbedFake, from: usize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while up.calls() < from + n {
        assert!(Instant::now() < deadline, "{n} probes after call {from}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embeddings_route_is_judged_like_a_chat_route_and_a_swapped_model_is_one_critical_alert()
{
    let up = embed_fake().await;
    let (hook, hooks) = upstream::fake("/hook", |_| upstream::Reply::now(StatusCode::OK)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &up.base_v1(),
        &dir.path().join("e.db"),
        Some(&format!("{}/hook", hook.base_url())),
    );
    let (running, shutdown, base) = start(cfg).await;
    let http = reqwest::Client::new();

    // Steady vectors: NORMAL, its latency recorded, its reference stored.
    let r = until_route(&http, &base, 30, "NORMAL", |r| r["state"] == "NORMAL").await;
    assert_eq!(r["kind"], "embeddings");
    assert_eq!(r["behavior_changed"], false);
    let probes = common::get_json(&http, &format!("{base}/api/v1/routes/{ROUTE}/probes")).await;
    let latest = &probes["probes"][0];
    assert_eq!(latest["success"], true, "{probes}");
    assert!(latest["total_ms"].as_f64().unwrap() > 0.0, "{latest}");
    assert!(latest["ttfb_ms"].is_number(), "{latest}");
    assert!(latest["ttft_ms"].is_null() && latest["tokens_per_second"].is_null());
    let stored = running
        .store
        .reader()
        .unwrap()
        .embedding_row(ROUTE)
        .unwrap();
    assert_eq!(stored.unwrap().reference, MODEL_A.to_vec());
    // The route page says what kind of route it is, in both languages.
    for (lang, words) in [
        ("en", "embeddings, 8 dimensions"),
        ("zh", "向量模型（embeddings），8 维"),
    ] {
        let page = http
            .get(format!("{base}/routes/{ROUTE}?lang={lang}"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(page.contains(words), "{lang}: {page}");
    }

    // The provider swaps the model under the same name.
    let at_swap = up.calls();
    let swapped_at = chrono::Utc::now();
    up.set(Mode::ModelB);
    let deadline = Instant::now() + Duration::from_secs(20);
    let finding = loop {
        if let Some(f) = drift(&http, &base).await.into_iter().next() {
            break f;
        }
        assert!(Instant::now() < deadline, "an embedding_changed finding");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(finding["kind"], "embedding_changed");
    // Reported, not asserted (a loaded machine may delay the scheduler; the prober test
    // above holds the rule: the first probe after the swap finds it).
    let detected: chrono::DateTime<chrono::Utc> =
        finding["detected_at"].as_str().unwrap().parse().unwrap();
    let after_ms = (detected - swapped_at).num_milliseconds();
    eprintln!(
        "embedding_changed {after_ms} ms after the swap ({:.2} probe intervals of 300 ms)",
        after_ms as f64 / 300.0
    );
    assert_eq!(finding["severity"], "critical");
    assert_eq!(finding["route"], ROUTE);
    let r = until_route(&http, &base, 10, "behavior_changed", |r| {
        r["behavior_changed"] == true
    })
    .await;
    assert_eq!(r["failure_mode"], "behavior_changed", "{r}");
    // Several more probes of the changed model, and the group wait, pass: still one alert.
    calls_past(&up, at_swap, 8).await;
    let firing = |hooks: &upstream::Requests| -> Vec<Value> {
        hooks
            .all()
            .iter()
            .map(|c| c.json())
            .filter(|m| m["status"] == "firing")
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while firing(&hooks).is_empty() {
        assert!(Instant::now() < deadline, "the alert at the webhook");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    calls_past(&up, up.calls(), 5).await;
    let sent = firing(&hooks);
    assert_eq!(sent.len(), 1, "exactly one alert: {sent:?}");
    assert_eq!(sent[0]["severity"], "critical");
    let title = sent[0]["title"].as_str().unwrap();
    assert!(
        title.contains("embedding model changed under the same name"),
        "{title}"
    );

    // The change was intended: the admin call replaces the reference, the finding closes.
    let url = format!("{base}/api/v1/admin/routes/{ROUTE}/embedding-reference");
    let refused = http.post(&url).send().await.unwrap();
    assert_eq!(refused.status(), 401);
    let done = http
        .post(&url)
        .bearer_auth("embed-admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), 200);
    let body: Value = done.json().await.unwrap();
    assert_eq!(body["reference"], "latest", "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !drift(&http, &base).await.is_empty() {
        assert!(Instant::now() < deadline, "the finding closes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until_route(&http, &base, 10, "behavior unchanged", |r| {
        r["behavior_changed"] == false
    })
    .await;
    assert_eq!(firing(&hooks).len(), 1, "no second firing alert");
    shutdown.cancel();
    running.done.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectors_of_the_wrong_length_take_the_outage_path_not_embedding_changed() {
    let up = embed_fake().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&up.base_v1(), &dir.path().join("e.db"), None);
    let (running, shutdown, base) = start(cfg).await;
    let http = reqwest::Client::new();
    until_route(&http, &base, 30, "NORMAL", |r| r["state"] == "NORMAL").await;

    up.set(Mode::WrongLength);
    let r = until_route(&http, &base, 30, "DEGRADED or worse", |r| {
        matches!(r["state"].as_str(), Some("DEGRADED" | "CRITICAL"))
    })
    .await;
    assert_eq!(r["failure_mode"], "unavailable", "{r}");
    assert_eq!(r["behavior_changed"], false, "{r}");
    assert!(drift(&http, &base).await.is_empty());
    let probes = common::get_json(&http, &format!("{base}/api/v1/routes/{ROUTE}/probes")).await;
    let latest = &probes["probes"][0];
    assert_eq!(latest["success"], false, "{latest}");
    assert_eq!(latest["error"]["kind"], "malformed", "{latest}");
    shutdown.cancel();
    running.done.await.unwrap().unwrap();
}
