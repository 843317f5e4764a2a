//! Capability probes against fake providers that are real HTTP servers on 127.0.0.1:0 and
//! answer as the providers document it: OpenAI's Chat Completions (a forced function call as
//! `choices[0].message.tool_calls[0].function` with `arguments` a JSON string; a
//! `response_format` of type `json_schema` as `message.content`; the chat probe streamed) and
//! Anthropic's Messages (a forced tool as a `tool_use` content block whose `input` is an
//! object; the chat probe streamed). Each fake checks the key header its provider uses.
//!
//! The probes are driven one by one ([`Prober::pass`]) where the store, the status API and the
//! alert engine are involved, and by their own cadence in paused time where the timing is what
//! is tested.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use common::alerts::{rig as alert_rig, serve as serve_receiver, webhook, Fake, Kind};
use common::app::{at, normal, snapshot};
use common::{anthropic, json, openai, Script, Server};
use probeok::alert::Severity;
use probeok::capability::judge::Verdict;
use probeok::capability::{CapabilityDriver, Probed, Prober};
use probeok::clock::{Clock, ManualClock};
use probeok::config::Config;
use probeok::drift::{DriftFinding, DriftKind, DriftSnapshot};
use probeok::health::{HealthEvent, HealthSnapshot, IncidentSummary, State as St};
use probeok::probe::{OutcomeKind, ProbeClient};
use probeok::route::Route;
use probeok::secret::Env;
use probeok::store::{Store, StoreOptions};
use probeok::web::{self, AppState, Metrics, SnapshotIncidents};
use serde_json::{json as j, Value};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

const KEY: &str = "sk-capability-test";
const GPT: &str = "openai/us/gpt-4o";
const CLAUDE: &str = "anthropic/us/claude-sonnet-4-5";

/// What the fake model does, changed by the test.
#[derive(Default)]
struct Behaviour {
    /// Tool-call arguments that stop parsing (OpenAI) or carry the wrong token (Anthropic).
    tools_broken: bool,
    /// Structured output that does not validate against the schema asked for.
    schema_invalid: bool,
    /// Capability requests seen: (which, when in tokio time).
    seen: Vec<(&'static str, tokio::time::Instant)>,
}

type Shared = Arc<Mutex<Behaviour>>;

fn unauthorized() -> Response {
    json(
        StatusCode::UNAUTHORIZED,
        openai::error(
            "Incorrect API key provided",
            "invalid_request_error",
            Some("invalid_api_key"),
        ),
    )
}

/// `POST /v1/chat/completions`.
async fn openai_chat(
    State(b): State<Shared>,
    headers: HeaderMap,
    Json(req): Json<Value>,
) -> Response {
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {KEY}"))
    {
        return unauthorized();
    }
    if req["stream"] == true {
        return Script::new()
            .send_all(openai::stream(&["PROBE_OK"], "stop", Some(3)))
            .sse();
    }
    let model = req["model"].clone();
    let mut b = b.lock().unwrap();
    let message = if req.get("tools").is_some() {
        b.seen.push(("tools", tokio::time::Instant::now()));
        // The forced function's name, as `tool_choice` names it.
        let name = req["tool_choice"]["function"]["name"].clone();
        let arguments = if b.tools_broken {
            r#"{"token": PROBE"#
        } else {
            r#"{"token":"PROBE_OK"}"#
        };
        j!({"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_abc123", "type": "function",
            "function": {"name": name, "arguments": arguments}}]})
    } else if req["response_format"]["type"] == "json_schema" {
        b.seen.push(("json_schema", tokio::time::Instant::now()));
        let content = if b.schema_invalid {
            r#"{"token":"PROBE_OK","n":"one"}"#
        } else {
            r#"{"token":"PROBE_OK","n":1}"#
        };
        j!({"role": "assistant", "content": content, "refusal": null})
    } else {
        j!({"role": "assistant", "content": "PROBE_OK"})
    };
    let finish = if message.get("tool_calls").is_some() {
        "tool_calls"
    } else {
        "stop"
    };
    json(
        StatusCode::OK,
        j!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1_767_225_600,
            "model": model, "choices": [{"index": 0, "message": message, "logprobs": null,
            "finish_reason": finish}],
            "usage": {"prompt_tokens": 60, "completion_tokens": 9, "total_tokens": 69}}),
    )
}

/// `POST /v1/messages`.
async fn anthropic_messages(
    State(b): State<Shared>,
    headers: HeaderMap,
    Json(req): Json<Value>,
) -> Response {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    if h("x-api-key").as_deref() != Some(KEY) || h("anthropic-version").is_none() {
        return json(
            StatusCode::UNAUTHORIZED,
            anthropic::error("authentication_error", "invalid x-api-key"),
        );
    }
    if req["stream"] == true {
        return Script::new()
            .send_all(anthropic::stream(&["PROBE_OK"], "end_turn", Some(3)))
            .sse();
    }
    let Some(name) = req["tool_choice"]["name"].as_str().map(str::to_owned) else {
        return json(
            StatusCode::OK,
            anthropic::body("PROBE_OK", "end_turn", Some(3)),
        );
    };
    let mut b = b.lock().unwrap();
    let input = if name == "probe_echo" {
        b.seen.push(("tools", tokio::time::Instant::now()));
        if b.tools_broken {
            j!({"token": "PROBE"})
        } else {
            j!({"token": "PROBE_OK"})
        }
    } else {
        b.seen.push(("json_schema", tokio::time::Instant::now()));
        if b.schema_invalid {
            j!({"token": "PROBE_OK"})
        } else {
            j!({"token": "PROBE_OK", "n": 1})
        }
    };
    json(
        StatusCode::OK,
        j!({"id": "msg_01", "type": "message", "role": "assistant", "model": req["model"],
            "content": [{"type": "tool_use", "id": "toolu_01", "name": name, "input": input}],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 380, "output_tokens": 40}}),
    )
}

async fn provider() -> (Server, Shared) {
    let b: Shared = Arc::default();
    let router = Router::new()
        .route("/v1/chat/completions", post(openai_chat))
        .route("/v1/messages", post(anthropic_messages))
        .with_state(b.clone());
    (common::spawn(router).await, b)
}

fn config(server: &Server, db: &std::path::Path, every: &str) -> Config {
    let base = server.base_url();
    let src = format!(
        r#"
[storage]
path = "{db}"
[capability]
every = "{every}"
[[provider]]
id = "openai"
api_key_env = "FAKE_KEY"
  [[provider.region]]
  id = "us"
  base_url = "{base}/v1"
[[provider]]
id = "anthropic"
kind = "anthropic"
api_key_env = "FAKE_KEY"
  [[provider.region]]
  id = "us"
  base_url = "{base}"
[[route]]
provider = "openai"
region = "us"
model = "gpt-4o"
serves = "chat"
capabilities = ["stream", "tools", "json_schema"]
[[route]]
provider = "anthropic"
region = "us"
model = "claude-sonnet-4-5"
serves = "chat"
capabilities = ["stream", "tools", "json_schema"]
"#,
        db = db.display()
    );
    let mut c = Config::parse(&src, "capability.toml").unwrap().config;
    c.env = Env::given().with("FAKE_KEY", KEY);
    c
}

fn healthy(now: DateTime<Utc>) -> HealthSnapshot {
    snapshot(now, vec![normal(GPT, now), normal(CLAUDE, now)])
}

/// The monitor's pieces around a real store: the config, the health channel the test sets,
/// the prober, its findings, and the web surface.
struct Rig {
    _dir: tempfile::TempDir,
    config: Config,
    routes: Arc<Vec<Route>>,
    store: Store,
    clock: Arc<ManualClock>,
    health_tx: watch::Sender<Arc<HealthSnapshot>>,
    lost: watch::Receiver<Arc<Vec<DriftFinding>>>,
    drift_tx: watch::Sender<Arc<DriftSnapshot>>,
    prober: Prober,
    shutdown: CancellationToken,
}

impl Rig {
    async fn new(server: &Server, now: DateTime<Utc>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("capabilities.db");
        let config = config(server, &db, "15m");
        let routes = Arc::new(config.routes());
        let store = Store::open(&db, StoreOptions::default()).unwrap();
        let clock = Arc::new(ManualClock::new(now));
        let (health_tx, health) = watch::channel(Arc::new(healthy(now)));
        let (lost_tx, lost) = watch::channel(Arc::new(Vec::new()));
        let prober = Prober::new(
            CapabilityDriver {
                routes: routes.clone(),
                config: config.capability.clone(),
                env: config.env.clone(),
                store: Some(store.clone()),
                retention: Duration::from_secs(14 * 86_400),
                clock: clock.clone(),
                health,
            },
            lost_tx,
        )
        .unwrap();
        let (drift_tx, _) = watch::channel(Arc::new(DriftSnapshot::empty(now)));
        Self {
            _dir: dir,
            config,
            routes,
            store,
            clock,
            health_tx,
            lost,
            drift_tx,
            prober,
            shutdown: CancellationToken::new(),
        }
    }

    /// The drift snapshot the monitor publishes: the capability findings merged in.
    fn publish_drift(&self) -> Arc<DriftSnapshot> {
        let merged =
            Arc::new(DriftSnapshot::empty(self.clock.now()).with_capabilities(&self.lost.borrow()));
        self.drift_tx.send_replace(merged.clone());
        merged
    }

    /// Waits until every result queued so far is committed (the writer commits in order).
    async fn settle(&self) {
        self.store.writer().check_writable().await.unwrap();
    }

    /// The monitor's HTTP surface on this store, health and drift.
    async fn serve(&self) -> String {
        let health = self.health_tx.subscribe();
        let weights = probeok::weights::spawn_publisher(
            probeok::weights::Feeds::new(self.routes.clone(), health.clone()),
            self.shutdown.clone(),
        );
        let state = AppState {
            config: Arc::new(self.config.clone()).into(),
            metrics: Arc::new(Metrics::new(&self.routes)),
            routes: self.routes.clone(),
            store: self.store.clone(),
            clock: self.clock.clone(),
            jobs: Default::default(),
            health,
            events: broadcast::channel(16).0,
            passive: mpsc::channel(16).0,
            weights,
            ingest_token: None,
            incidents: Arc::new(SnapshotIncidents),
            drift: Some(self.drift_tx.subscribe()),
            drills: None,
            figures: Default::default(),
            guards: Default::default(),
            shutdown: self.shutdown.clone(),
            vantages: None,
            xds: Default::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = web::router(state);
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
                .unwrap();
        });
        format!("http://{addr}")
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn status(base: &str) -> Value {
    common::get_json(&reqwest::Client::new(), &format!("{base}/api/v1/status")).await
}

fn route<'a>(status: &'a Value, id: &str) -> &'a Value {
    status["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("{id} in {status}"))
}

async fn next(rx: &mut broadcast::Receiver<HealthEvent>) -> HealthEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event in time")
        .expect("the channel is open")
}

fn item(prober: &Prober, route: &str, cap: Probed) -> usize {
    prober
        .items()
        .iter()
        .position(|(r, c)| r.as_str() == route && *c == cap)
        .unwrap()
}

#[tokio::test]
async fn working_tools_and_json_schema_on_both_dialects_show_ok_and_full_success() {
    let (server, _b) = provider().await;
    let now = at("2026-03-04T12:00:00Z");
    let mut rig = Rig::new(&server, now).await;

    // Chat answers through the same fakes (the streamed PROBE_OK probe).
    let client = ProbeClient::with_env(&rig.routes, rig.clock.clone(), &rig.config.env).unwrap();
    for r in rig.routes.iter() {
        let o = client.probe(r, OutcomeKind::Probe).await;
        assert!(o.success, "{}: {:?}", r.id, o.error);
    }

    assert_eq!(rig.prober.items().len(), 4);
    for _ in 0..3 {
        let verdicts = rig.prober.pass().await;
        assert!(verdicts.iter().all(|v| *v == Verdict::Next), "{verdicts:?}");
        rig.clock.advance(Duration::from_secs(900));
    }
    assert!(rig.lost.borrow().is_empty());
    rig.settle().await;
    rig.publish_drift();

    let base = rig.serve().await;
    let s = status(&base).await;
    for id in [GPT, CLAUDE] {
        let r = route(&s, id);
        assert_eq!(r["state"], "NORMAL", "{r}");
        assert_eq!(r["behavior_changed"], false);
        for cap in ["tools", "json_schema"] {
            let c = &r["capabilities"][cap];
            assert_eq!(c["ok"], true, "{id} {cap}: {c}");
            assert_eq!(c["success_7d"], 1.0, "{id} {cap}: {c}");
            assert_eq!(
                c["checked_at"], "2026-03-04T12:30:00.000Z",
                "{id} {cap}: {c}"
            );
            assert!(c.get("error").is_none(), "{c}");
        }
        assert!(r["capabilities"].get("stream").is_none());
    }
    // The route page shows each capability's latest result and 7-day success.
    let page = reqwest::get(format!("{base}/routes/{GPT}?lang=en"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(r#"id="capability-tools""#), "{page}");
    assert!(page.contains(r#"id="capability-json_schema""#));
    assert!(page.contains("100.0%"));
}

#[tokio::test]
async fn tool_arguments_that_stop_parsing_are_capability_lost_with_one_alert_then_recovery() {
    let (server, b) = provider().await;
    let now = at("2026-03-04T12:00:00Z");
    let mut rig = Rig::new(&server, now).await;
    let tools = item(&rig.prober, GPT, Probed::Tools);

    // The alert path of drift findings: the forwarder, the grouping, a real outbox and a
    // webhook receiver that is a real HTTP server.
    let (events_tx, mut events) = broadcast::channel(64);
    let forwarder = probeok::drift::events::spawn(
        rig.drift_tx.subscribe(),
        events_tx,
        rig.clock.clone(),
        rig.shutdown.clone(),
    );
    let receiver = Fake::new(Kind::Webhook, None, rig.clock.clone());
    let (addr, _h) = serve_receiver(receiver.clone(), None).await;
    let alerts = alert_rig(
        vec![webhook("webhook[0]", addr, None, Severity::Warning)],
        rig.clock.clone(),
        |_| {},
    )
    .await;

    rig.prober.pass().await;
    let healthy_snapshot = rig.publish_drift();
    // Even where drift findings lower weights (`on_drift = "deweight"`), a lost capability
    // does not: chat traffic still works on the route.
    let mut deweighting = rig.config.clone();
    deweighting.drift.on_drift = probeok::config::OnDrift::Deweight;
    let policy = probeok::weights::Policy::from_config(&deweighting);
    let before = probeok::weights::compute(&probeok::weights::Inputs {
        drift: Some(&healthy_snapshot),
        policy: &policy,
        ..probeok::weights::Inputs::new(&rig.routes, &healthy(now))
    });

    // Tool calls break; chat keeps answering.
    b.lock().unwrap().tools_broken = true;
    rig.clock.advance(Duration::from_secs(900));
    assert_eq!(
        rig.prober.probe(tools).await,
        Verdict::Recheck,
        "a first failure is re-probed"
    );
    assert!(rig.lost.borrow().is_empty(), "one failure is not a finding");
    rig.clock.advance(Duration::from_secs(60));
    assert_eq!(rig.prober.probe(tools).await, Verdict::Next);
    let lost = rig.lost.borrow().clone();
    assert_eq!(lost.len(), 1, "{lost:?}");
    let f = &lost[0];
    assert_eq!(f.kind, DriftKind::CapabilityLost);
    assert_eq!(f.set, "tools");
    assert_eq!(f.route.as_str(), GPT);
    assert!(
        f.summary.starts_with("capability_lost: tools"),
        "{}",
        f.summary
    );
    assert!(f.summary.contains("not JSON"), "{}", f.summary);

    let drift = rig.publish_drift();
    // Not an outage: weights are what they were, with the finding open.
    let after = probeok::weights::compute(&probeok::weights::Inputs {
        drift: Some(&drift),
        policy: &policy,
        ..probeok::weights::Inputs::new(&rig.routes, &healthy(now))
    });
    assert_eq!(after, before);

    // One alert, however many probes keep failing.
    let mut opened = vec![next(&mut events).await];
    for _ in 0..3 {
        rig.clock.advance(Duration::from_secs(900));
        assert_eq!(rig.prober.probe(tools).await, Verdict::Next);
        rig.publish_drift();
    }
    // Nothing more: the forwarder has seen every change by the time the next one is published
    // (a watch keeps the latest), and none opened or closed a finding.
    rig.publish_drift();
    tokio::task::yield_now().await;
    while let Ok(e) = events.try_recv() {
        opened.push(e);
    }
    assert_eq!(opened.len(), 1, "{opened:?}");
    assert!(matches!(
        &opened[0],
        HealthEvent::DriftFinding { opened: true, .. }
    ));
    alerts.push(opened).await;
    let round = alerts.service.deliver().await.unwrap();
    assert_eq!(round.delivered, 1, "{round:?}");
    let got = receiver.got();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body["severity"], "warning", "{}", got[0].body);
    let text = got[0].body.to_string();
    assert!(text.contains("capability_lost: tools"), "{text}");
    assert!(text.contains(GPT), "{text}");

    // The status API: still NORMAL, the capability failing with its reason.
    rig.settle().await;
    let base = rig.serve().await;
    let s = status(&base).await;
    let r = route(&s, GPT);
    assert_eq!(r["state"], "NORMAL", "{r}");
    assert_eq!(r["behavior_changed"], true);
    let c = &r["capabilities"]["tools"];
    assert_eq!(c["ok"], false, "{c}");
    assert!(c["error"].as_str().unwrap().contains("not JSON"), "{c}");
    assert_eq!(r["capabilities"]["json_schema"]["ok"], true);
    let page = reqwest::get(format!("{base}/routes/{GPT}?lang=zh"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("capability_lost: 对话正常，但声明的 tools 能力失效"),
        "{page}"
    );

    // Recovery: one good answer closes the finding and resolves the alert.
    b.lock().unwrap().tools_broken = false;
    rig.clock.advance(Duration::from_secs(900));
    assert_eq!(rig.prober.probe(tools).await, Verdict::Next);
    assert!(rig.lost.borrow().is_empty());
    rig.publish_drift();
    let closed = vec![next(&mut events).await];
    assert!(matches!(
        &closed[0],
        HealthEvent::DriftFinding { opened: false, .. }
    ));
    alerts.push(closed).await;
    alerts.service.deliver().await.unwrap();
    let got = receiver.got();
    assert_eq!(got.len(), 2, "the firing message, then its resolution");
    assert_eq!(got[1].body["status"], "resolved", "{}", got[1].body);
    assert!(alerts.outbox().iter().all(|r| r.status == "delivered"));
    forwarder.abort();
}

#[tokio::test]
async fn json_schema_answers_that_do_not_validate_are_capability_lost_on_both_dialects() {
    let (server, b) = provider().await;
    let now = at("2026-03-04T12:00:00Z");
    let mut rig = Rig::new(&server, now).await;
    b.lock().unwrap().schema_invalid = true;
    rig.prober.pass().await;
    assert!(rig.lost.borrow().is_empty());
    rig.clock.advance(Duration::from_secs(60));
    rig.prober.pass().await;
    let lost = rig.lost.borrow().clone();
    let ids: Vec<&str> = lost.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(
        ids,
        vec![
            "anthropic/us/claude-sonnet-4-5|json_schema|capability_lost",
            "openai/us/gpt-4o|json_schema|capability_lost",
        ]
    );
    assert!(lost
        .iter()
        .all(|f| f.summary.contains("does not match the schema")));

    // Each is one warning, written in both languages.
    let merged = DriftSnapshot::empty(now).with_capabilities(&lost);
    let events = probeok::drift::events::events(&DriftSnapshot::empty(now), &merged, now);
    let mut grouper = probeok::alert::group::Grouper::new(Duration::ZERO, &rig.config.routes());
    for e in events {
        grouper.push(e, now);
    }
    let drafts = grouper.flush(now);
    assert_eq!(drafts.len(), 2);
    let ctx = probeok::alert::RenderCtx::from_config(&rig.config);
    let m = &drafts[1].message;
    assert_eq!(m.severity, Severity::Warning);
    let en = probeok::alert::render::render(m, probeok::alert::Lang::En, &ctx);
    assert!(
        en.title.contains(
            "openai/us/gpt-4o: json_schema capability lost while chat still answers (capability_lost: json_schema)"
        ),
        "{}",
        en.title
    );
    assert!(
        en.text.contains("route's state and weight are unchanged"),
        "{}",
        en.text
    );
    let zh = probeok::alert::render::render(m, probeok::alert::Lang::Zh, &ctx);
    assert!(
        zh.title
            .contains("对话正常但 json_schema 能力失效(capability_lost: json_schema)"),
        "{}",
        zh.title
    );
}

#[tokio::test]
async fn capability_failures_while_chat_fails_are_left_to_the_outage() {
    let (server, b) = provider().await;
    let now = at("2026-03-04T12:00:00Z");
    let mut rig = Rig::new(&server, now).await;
    let mut down = normal(GPT, now);
    down.state = St::Critical;
    down.judged = St::Critical;
    down.incident = Some(IncidentSummary {
        id: "inc-1".into(),
        opened_at: now,
        peak: St::Critical,
        failure_mode: Some(probeok::health::FailureMode::Unavailable),
    });
    rig.health_tx
        .send_replace(Arc::new(snapshot(now, vec![down, normal(CLAUDE, now)])));
    b.lock().unwrap().tools_broken = true;
    for _ in 0..3 {
        rig.prober.pass().await;
    }
    let lost = rig.lost.borrow().clone();
    assert_eq!(lost.len(), 1, "only the route whose chat answers: {lost:?}");
    assert_eq!(lost[0].route.as_str(), CLAUDE);
}

/// The cadence in paused time: the first round spread over one interval, each capability
/// probed once per interval, and a break found at the next probe plus one quick re-probe.
#[tokio::test(start_paused = true)]
async fn probes_are_spread_and_a_break_is_found_within_one_interval_and_a_recheck() {
    let (server, b) = provider().await;
    let now = at("2026-03-04T12:00:00Z");
    let dir = tempfile::tempdir().unwrap();
    let config = config(&server, &dir.path().join("unused.db"), "15m");
    let every = config.capability.every;
    let routes = Arc::new(config.routes());
    let (_health_tx, health) = watch::channel(Arc::new(healthy(now)));
    let (lost_tx, mut lost) = watch::channel(Arc::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let start = tokio::time::Instant::now();
    let task = tokio::spawn(probeok::capability::run(
        CapabilityDriver {
            routes,
            config: config.capability.clone(),
            env: config.env.clone(),
            store: None,
            retention: Duration::from_secs(86_400),
            clock: Arc::new(ManualClock::new(now)),
            health,
        },
        lost_tx,
        shutdown.clone(),
    ));

    // Three intervals: each of the 4 items exactly 3 times, the first round at 0, ¼, ½, ¾.
    tokio::time::sleep(every * 3 - Duration::from_secs(1)).await;
    let seen = b.lock().unwrap().seen.clone();
    assert_eq!(seen.len(), 12, "{seen:?}");
    let mut offsets: Vec<u64> = seen[..4]
        .iter()
        .map(|(_, t)| (*t - start).as_secs())
        .collect();
    offsets.sort_unstable();
    assert_eq!(offsets, vec![0, 225, 450, 675]);
    for (which, _) in [("tools", ()), ("json_schema", ())] {
        assert_eq!(seen.iter().filter(|(w, _)| *w == which).count(), 6);
    }

    // Break tool calls right after the OpenAI route's tools probe ran (its fourth, at three
    // intervals): the worst case for that route.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(b.lock().unwrap().seen.len(), 13);
    let broke = tokio::time::Instant::now();
    b.lock().unwrap().tools_broken = true;
    let gpt_found = |l: &[DriftFinding]| l.iter().any(|f| f.route.as_str() == GPT);
    while !gpt_found(&lost.borrow_and_update()) {
        lost.changed().await.unwrap();
    }
    let took = tokio::time::Instant::now() - broke;
    // The next probe one interval later fails, the re-probe a minute after it confirms.
    assert_eq!(took, every + Duration::from_secs(59), "{took:?}");
    let found = lost.borrow().clone();
    assert_eq!(found.len(), 2, "both routes' tools: {found:?}");
    assert!(found.iter().all(|f| f.set == "tools"));
    println!(
        "capability break to capability_lost: {took:?} = {:.3} x [capability] every",
        took.as_secs_f64() / every.as_secs_f64()
    );
    shutdown.cancel();
    task.await.unwrap();
}

#[test]
fn a_bad_capability_every_is_a_located_error() {
    let src = r#"[[provider]]
id = "openai"
  [[provider.region]]
  id = "us"
  base_url = "https://api.openai.com/v1"
[[route]]
provider = "openai"
region = "us"
model = "gpt-4o"
serves = "chat"
capabilities = ["stream", "tools"]
[capability]
every = "10s"
"#;
    let errors = |src: &str| match Config::parse(src, "p.toml") {
        Ok(_) => vec!["(loaded)".to_owned()],
        Err(e) => e.0.iter().map(ToString::to_string).collect::<Vec<_>>(),
    };
    assert_eq!(
        errors(src),
        vec!["p.toml:13:9: capability.every: must be between 1m and 24h, got 10s"]
    );
    let bad = errors(&src.replace("10s", "fortnightly"));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].starts_with(r#"p.toml:13:9: capability.every: invalid duration "fortnightly""#),
        "{bad:?}"
    );
    assert_eq!(
        errors(&src.replace("10s", "48h")),
        vec!["p.toml:13:9: capability.every: must be between 1m and 24h, got 2days"]
    );
    let ok = Config::parse(&src.replace("every = \"10s\"\n", ""), "p.toml")
        .unwrap()
        .config;
    assert_eq!(ok.capability.every, Duration::from_secs(15 * 60));
}

/// The wiring: `serve`'s leader probes a declared capability on its own (the first item of a
/// round at once) and `/api/v1/status` shows the stored result. Polled with a deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_probes_declared_capabilities_and_the_status_shows_them() {
    let (server, b) = provider().await;
    let dir = tempfile::tempdir().unwrap();
    let src = format!(
        r#"
[storage]
path = "{db}"
[probe]
interval = "3s"
timeout = "2800ms"
first_byte_timeout = "1s"
[capability]
every = "1m"
[[provider]]
id = "openai"
api_key_env = "FAKE_KEY"
  [[provider.region]]
  id = "us"
  base_url = "{base}/v1"
[[route]]
provider = "openai"
region = "us"
model = "gpt-4o"
serves = "chat"
capabilities = ["stream", "tools"]
"#,
        db = dir.path().join("serve.db").display(),
        base = server.base_url()
    );
    let mut config = Config::parse(&src, "serve.toml").unwrap().config;
    config.env = Env::given().with("FAKE_KEY", KEY);
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = probeok::app::start(
        config,
        listener,
        Arc::new(probeok::clock::SystemClock),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let base = format!("http://{}", running.addr);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let tools = loop {
        let s = status(&base).await;
        let c = route(&s, GPT)["capabilities"]["tools"].clone();
        if c["ok"] == true {
            break c;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no capability result shown in 20 s: {c}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(tools["success_7d"], 1.0, "{tools}");
    assert_eq!(b.lock().unwrap().seen.len(), 1, "one probe per minute");
    shutdown.cancel();
    let stopped = tokio::time::timeout(
        probeok::app::DRAIN_TIMEOUT + Duration::from_secs(2),
        running.done,
    )
    .await
    .expect("shutdown drains within its bound")
    .unwrap();
    assert!(stopped.is_ok(), "{stopped:?}");
}
