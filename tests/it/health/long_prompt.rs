//! The long-prompt probe against fake providers that are real HTTP servers on 127.0.0.1:0 and
//! stream as the providers document it (OpenAI's Chat Completions SSE `chat.completion.chunk`
//! deltas; Anthropic's Messages events). Like a real model, the fakes take prefill time in
//! proportion to the prompt's length before the first token, read the code word the prompt
//! ends with, and answer it.
//!
//! Time is tokio's paused clock: the TTFTs measured are exactly the fakes' prefill times, and
//! the cadence's figures are exact.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use common::alerts::{rig as alert_rig, serve as serve_receiver, webhook, Fake, Kind};
use common::app::{at, normal, snapshot};
use common::{anthropic, openai, Script, Server};
use probeok::alert::Severity;
use probeok::capability::judge::Verdict;
use probeok::capability::long_prompt::{self, LongProber, LongPromptDriver};
use probeok::clock::{Clock, ManualClock};
use probeok::config::Config;
use probeok::drift::{DriftFinding, DriftKind, DriftSnapshot};
use probeok::health::{HealthEvent, HealthSnapshot};
use probeok::probe::{OutcomeKind, ProbeClient};
use probeok::route::Route;
use probeok::secret::Env;
use probeok::store::{Store, StoreOptions};
use probeok::web::{self, AppState, Metrics, SnapshotIncidents};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

const GPT: &str = "openai/us/gpt-4o";
const CLAUDE: &str = "anthropic/us/claude-sonnet-4-5";
/// Prefill per prompt character: a 1,000-token prompt (about 5,000 characters) takes about a
/// second before its first token.
const PREFILL_PER_CHAR: Duration = Duration::from_micros(200);

/// What the fake model does, changed by the test.
struct Behaviour {
    /// Prefill time is the prompt's length × this × `slow`.
    slow: u32,
    /// Answer something other than the code word.
    forget: bool,
    /// Long requests seen (prompt characters, when in tokio time).
    long: Vec<(usize, tokio::time::Instant)>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            slow: 1,
            forget: false,
            long: Vec::new(),
        }
    }
}

type Shared = Arc<Mutex<Behaviour>>;

/// The last user message's text (a string, or text blocks).
fn user_text(req: &Value) -> String {
    let last = req["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or_default();
    match &last["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The prefill delay and the answer to a prompt: a long prompt's code word (what a model
/// reads at its end), else `PROBE_OK`.
fn answer(b: &Shared, prompt: &str) -> (Duration, String) {
    const FACT: &str = "The code word is ";
    let Some(i) = prompt.rfind(FACT) else {
        return (Duration::ZERO, "PROBE_OK".to_owned());
    };
    let word = prompt[i + FACT.len()..]
        .split(". ")
        .next()
        .unwrap_or_default()
        .to_owned();
    let mut b = b.lock().unwrap();
    b.long.push((prompt.len(), tokio::time::Instant::now()));
    let delay = PREFILL_PER_CHAR * u32::try_from(prompt.len()).unwrap() * b.slow;
    let text = if b.forget {
        "I could not find a code word.".to_owned()
    } else {
        word
    };
    (delay, text)
}

/// `POST /v1/chat/completions`, streamed.
async fn openai_chat(State(b): State<Shared>, Json(req): Json<Value>) -> Response {
    let (delay, text) = answer(&b, &user_text(&req));
    let mut chunks = openai::stream(&[text.as_str()], "stop", Some(4)).into_iter();
    let first = chunks.next().unwrap();
    Script::new().after(delay, first).send_all(chunks).sse()
}

/// `POST /v1/messages`, streamed.
async fn anthropic_messages(State(b): State<Shared>, Json(req): Json<Value>) -> Response {
    let (delay, text) = answer(&b, &user_text(&req));
    Script::new()
        .send_all(anthropic::head())
        .after(delay, anthropic::text(&text))
        .send_all(anthropic::tail("end_turn", Some(4)))
        .sse()
}

async fn provider() -> (Server, Shared) {
    let b: Shared = Arc::default();
    let router = Router::new()
        .route("/v1/chat/completions", post(openai_chat))
        .route("/v1/messages", post(anthropic_messages))
        .with_state(b.clone());
    (common::spawn(router).await, b)
}

fn config_src(server: &Server, db: &std::path::Path, long_prompt: &str) -> String {
    let base = server.base_url();
    format!(
        r#"
[storage]
path = "{db}"
[capability]
{long_prompt}
[[provider]]
id = "openai"
  [[provider.region]]
  id = "us"
  base_url = "{base}/v1"
[[provider]]
id = "anthropic"
kind = "anthropic"
  [[provider.region]]
  id = "us"
  base_url = "{base}"
[[route]]
provider = "openai"
region = "us"
model = "gpt-4o"
serves = "chat"
[[route]]
provider = "anthropic"
region = "us"
model = "claude-sonnet-4-5"
serves = "chat"
[[route]]
provider = "openai"
region = "us"
model = "text-embedding-3-small"
serves = "embed"
kind = "embeddings"
dimensions = 8
"#,
        db = db.display()
    )
}

fn config(server: &Server, db: &std::path::Path, long_prompt: &str) -> Config {
    let mut c = Config::parse(&config_src(server, db, long_prompt), "long.toml")
        .unwrap()
        .config;
    c.env = Env::given();
    c
}

const ON: &str = r#"long_prompt = { tokens = 1000, every = "24h" }"#;

fn healthy(now: DateTime<Utc>) -> HealthSnapshot {
    let embed = "openai/us/text-embedding-3-small";
    snapshot(
        now,
        vec![normal(GPT, now), normal(CLAUDE, now), normal(embed, now)],
    )
}

/// The monitor's pieces around a real store.
struct Rig {
    _dir: tempfile::TempDir,
    config: Config,
    routes: Arc<Vec<Route>>,
    store: Store,
    clock: Arc<ManualClock>,
    health_tx: watch::Sender<Arc<HealthSnapshot>>,
    found: watch::Receiver<Arc<Vec<DriftFinding>>>,
    drift_tx: watch::Sender<Arc<DriftSnapshot>>,
    prober: LongProber,
    shutdown: CancellationToken,
}

impl Rig {
    async fn new(server: &Server, now: DateTime<Utc>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("long.db");
        let config = config(server, &db, ON);
        let routes = Arc::new(config.routes());
        let store = Store::open(&db, StoreOptions::default()).unwrap();
        let clock = Arc::new(ManualClock::new(now));
        let (health_tx, health) = watch::channel(Arc::new(healthy(now)));
        let (found_tx, found) = watch::channel(Arc::new(Vec::new()));
        let prober = LongProber::new(
            LongPromptDriver {
                routes: routes.clone(),
                config: config.capability.long_prompt.unwrap(),
                env: config.env.clone(),
                store: Some(store.clone()),
                retention: Duration::from_secs(14 * 86_400),
                clock: clock.clone(),
                health,
            },
            found_tx,
        )
        .await
        .unwrap();
        let (drift_tx, _) = watch::channel(Arc::new(DriftSnapshot::empty(now)));
        Self {
            _dir: dir,
            config,
            routes,
            store,
            clock,
            health_tx,
            found,
            drift_tx,
            prober,
            shutdown: CancellationToken::new(),
        }
    }

    fn publish_drift(&self) -> Arc<DriftSnapshot> {
        let merged = Arc::new(
            DriftSnapshot::empty(self.clock.now()).with_capabilities(&self.found.borrow()),
        );
        self.drift_tx.send_replace(merged.clone());
        merged
    }

    async fn settle(&self) {
        self.store.writer().check_writable().await.unwrap();
    }

    /// `n` passes a day apart, every answer good.
    async fn days(&mut self, n: usize) {
        for _ in 0..n {
            let v = self.prober.pass().await;
            assert!(v.iter().all(|v| *v == Verdict::Next), "{v:?}");
            self.clock.advance(Duration::from_secs(86_400));
        }
    }

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

fn item(prober: &LongProber, id: &str) -> usize {
    prober
        .routes()
        .iter()
        .position(|r| r.as_str() == id)
        .unwrap()
}

/// The prefill the fakes take for the configured prompt, in whole ms.
fn prefill_ms(slow: u32) -> u64 {
    let chars = long_prompt::prompt::text(1_000).len();
    let d = PREFILL_PER_CHAR * u32::try_from(chars).unwrap() * slow;
    (d.as_secs_f64() * 1e3).round() as u64
}

/// A measured whole-ms figure: the prefill, within the timer's 1 ms resolution.
fn near(v: &Value, expected: u64) {
    let got = v.as_u64().unwrap_or_else(|| panic!("a number, got {v}"));
    assert!(
        got.abs_diff(expected) <= 1,
        "{got} ms, expected {expected} ms"
    );
}

async fn next(rx: &mut broadcast::Receiver<HealthEvent>) -> HealthEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event in time")
        .expect("the channel is open")
}

#[tokio::test(start_paused = true)]
async fn a_ttft_baseline_forms_from_steady_answers_and_shows_beside_the_short_probe() {
    let (server, b) = provider().await;
    let now = at("2026-03-04T12:00:00Z");
    let mut rig = Rig::new(&server, now).await;
    // Chat routes only: the embeddings route gets no long prompt.
    let ids: Vec<String> = rig.prober.routes().iter().map(|r| r.to_string()).collect();
    assert_eq!(ids, vec![GPT, CLAUDE]);

    // The short probe through the same fakes.
    let client = ProbeClient::with_env(&rig.routes, rig.clock.clone(), &rig.config.env).unwrap();
    for r in rig.routes.iter().filter(|r| r.embedding.is_none()) {
        let o = client.probe(r, OutcomeKind::Probe).await;
        assert!(o.success, "{}: {:?}", r.id, o.error);
    }

    // Two good answers: no baseline yet.
    rig.days(2).await;
    rig.settle().await;
    let base = rig.serve().await;
    let s = status(&base).await;
    let lp = &route(&s, GPT)["long_prompt"];
    assert_eq!(lp["ok"], true, "{lp}");
    near(&lp["ttft_ms"], prefill_ms(1));
    assert!(lp["baseline_ms"].is_null(), "{lp}");
    assert!(route(&s, "openai/us/text-embedding-3-small")["long_prompt"].is_null());

    // The third forms it, on both dialects: the median of the steady TTFTs (a fresh surface:
    // the status figures are cached for a while).
    rig.days(1).await;
    rig.settle().await;
    let base = rig.serve().await;
    let s = status(&base).await;
    for id in [GPT, CLAUDE] {
        let r = route(&s, id);
        let lp = &r["long_prompt"];
        assert_eq!(lp["ok"], true, "{id}: {lp}");
        near(&lp["ttft_ms"], prefill_ms(1));
        near(&lp["baseline_ms"], prefill_ms(1));
        assert_eq!(lp["checked_at"], "2026-03-06T12:00:00.000Z", "{id}: {lp}");
        assert!(lp.get("note").is_none(), "{lp}");
        assert_eq!(r["state"], "NORMAL");
        let g = rig
            .prober
            .baseline(&probeok::route::RouteId::parse(id).unwrap());
        near(&Value::from(g.unwrap().round() as u64), prefill_ms(1));
    }
    assert!(rig.found.borrow().is_empty());
    assert_eq!(b.lock().unwrap().long.len(), 6);
    println!(
        "long prompt: {} characters, TTFT baseline {} ms",
        long_prompt::prompt::text(1_000).len(),
        prefill_ms(1)
    );

    // The route page shows it next to the short probe's first token.
    let page = reqwest::get(format!("{base}/routes/{GPT}?lang=en"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let at = page
        .find(r#"id="long-prompt""#)
        .expect("the long prompt's line");
    assert!(
        page[at..].contains("Long prompt first token (1000 tokens)"),
        "{page}"
    );
    assert!(page[at..].contains("baseline"), "{page}");

    // A new leader term resumes the baselines from the store.
    let (tx, _) = watch::channel(Arc::new(Vec::new()));
    let again = LongProber::new(
        LongPromptDriver {
            routes: rig.routes.clone(),
            config: rig.config.capability.long_prompt.unwrap(),
            env: rig.config.env.clone(),
            store: Some(rig.store.clone()),
            retention: Duration::from_secs(14 * 86_400),
            clock: rig.clock.clone(),
            health: rig.health_tx.subscribe(),
        },
        tx,
    )
    .await
    .unwrap();
    let resumed = again.baseline(&probeok::route::RouteId::parse(CLAUDE).unwrap());
    near(&Value::from(resumed.unwrap() as u64), prefill_ms(1));
}

#[tokio::test(start_paused = true)]
async fn a_three_times_slower_prefill_is_long_prompt_slow_after_the_re_probe_then_closes() {
    let (server, b) = provider().await;
    let now = at("2026-03-04T12:00:00Z");
    let mut rig = Rig::new(&server, now).await;
    let gpt = item(&rig.prober, GPT);

    let (events_tx, mut events) = broadcast::channel(64);
    let _forwarder = probeok::drift::events::spawn(
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

    rig.days(3).await;
    let steady = rig.publish_drift();
    let mut deweighting = rig.config.clone();
    deweighting.drift.on_drift = probeok::config::OnDrift::Deweight;
    let policy = probeok::weights::Policy::from_config(&deweighting);
    let weights = |drift: &DriftSnapshot| {
        probeok::weights::compute(&probeok::weights::Inputs {
            drift: Some(drift),
            policy: &policy,
            ..probeok::weights::Inputs::new(&rig.routes, &healthy(now))
        })
    };
    let before = weights(&steady);

    // Prefill three times slower; short requests as fast as ever.
    b.lock().unwrap().slow = 3;
    assert_eq!(rig.prober.probe(gpt).await, Verdict::Recheck, "re-probed");
    assert!(
        rig.found.borrow().is_empty(),
        "one slow answer is not a finding"
    );
    rig.clock.advance(Duration::from_secs(60));
    assert_eq!(rig.prober.probe(gpt).await, Verdict::Next);
    let found = rig.found.borrow().clone();
    assert_eq!(found.len(), 1, "{found:?}");
    let f = &found[0];
    assert_eq!(f.kind, DriftKind::LongPromptSlow);
    assert_eq!(f.route.as_str(), GPT);
    assert_eq!(f.id, format!("{GPT}|long_prompt|long_prompt_slow"));
    assert!(f.summary.starts_with("long_prompt_slow"), "{}", f.summary);
    assert!(!f.is_drift(), "a warning, not behaviour drift");

    // Not an outage: no failure mode, the same weights.
    let drift = rig.publish_drift();
    assert!(!drift.behavior_changed(&f.route));
    assert_eq!(weights(&drift), before);
    let opened = vec![next(&mut events).await];
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
    assert!(text.contains("long_prompt_slow"), "{text}");
    assert!(text.contains(GPT), "{text}");

    rig.settle().await;
    let base = rig.serve().await;
    let s = status(&base).await;
    let r = route(&s, GPT);
    assert_eq!(r["state"], "NORMAL", "{r}");
    assert_eq!(r["behavior_changed"], false, "{r}");
    let lp = &r["long_prompt"];
    near(&lp["ttft_ms"], prefill_ms(3));
    // Slow answers stay out of the baseline.
    near(&lp["baseline_ms"], prefill_ms(1));
    assert_eq!(lp["ok"], true, "the answer was right: {lp}");
    assert!(lp["note"].as_str().unwrap().contains("ttft"), "{lp}");

    // Back to normal: one probe under the threshold closes it.
    b.lock().unwrap().slow = 1;
    rig.clock.advance(Duration::from_secs(86_400));
    assert_eq!(rig.prober.probe(gpt).await, Verdict::Next);
    assert!(rig.found.borrow().is_empty());
    rig.publish_drift();
    let closed = next(&mut events).await;
    assert!(matches!(
        closed,
        HealthEvent::DriftFinding { opened: false, .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn an_answer_without_the_code_word_is_capability_lost_long_prompt() {
    let (server, b) = provider().await;
    let now = at("2026-03-04T12:00:00Z");
    let mut rig = Rig::new(&server, now).await;
    let claude = item(&rig.prober, CLAUDE);
    rig.days(1).await;

    b.lock().unwrap().forget = true;
    assert_eq!(rig.prober.probe(claude).await, Verdict::Recheck);
    assert!(rig.found.borrow().is_empty());
    rig.clock.advance(Duration::from_secs(60));
    assert_eq!(rig.prober.probe(claude).await, Verdict::Next);
    let found = rig.found.borrow().clone();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].kind, DriftKind::CapabilityLost);
    assert_eq!(found[0].set, "long_prompt");
    assert_eq!(found[0].route.as_str(), CLAUDE);
    assert!(
        found[0].summary.starts_with("capability_lost: long_prompt"),
        "{}",
        found[0].summary
    );
    rig.settle().await;
    rig.publish_drift();
    let base = rig.serve().await;
    let s = status(&base).await;
    assert_eq!(route(&s, CLAUDE)["long_prompt"]["ok"], false);
    assert_eq!(route(&s, GPT)["long_prompt"]["ok"], true);

    b.lock().unwrap().forget = false;
    assert_eq!(rig.prober.probe(claude).await, Verdict::Next);
    assert!(rig.found.borrow().is_empty());
}

/// The cadence in paused time, through the leader's task: with the key, each chat route once
/// a day (the first round spread over the day), a slowdown found at the next probe plus one
/// re-probe; without it, no long request at all.
#[tokio::test(start_paused = true)]
async fn on_its_cadence_a_slowdown_is_found_within_a_day_and_a_recheck_and_absent_is_off() {
    let (server, b) = provider().await;
    let now = at("2026-03-04T12:00:00Z");
    let dir = tempfile::tempdir().unwrap();
    let day = Duration::from_secs(86_400);

    // The key absent: off, whatever the time.
    let off = config(&server, &dir.path().join("unused.db"), "");
    assert_eq!(off.capability.long_prompt, None);
    let driver = |c: &Config, health| {
        c.capability.long_prompt.map(|config| LongPromptDriver {
            routes: Arc::new(c.routes()),
            config,
            env: c.env.clone(),
            store: None,
            retention: day,
            clock: Arc::new(ManualClock::new(now)),
            health,
        })
    };
    let (_h0, health0) = watch::channel(Arc::new(healthy(now)));
    let (tx0, _rx0) = watch::channel(Arc::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(long_prompt::run(
        driver(&off, health0),
        tx0,
        shutdown.clone(),
    ));
    tokio::time::sleep(day * 3).await;
    assert!(
        b.lock().unwrap().long.is_empty(),
        "no long request when off"
    );
    shutdown.cancel();
    task.await.unwrap();

    // On.
    let on = config(&server, &dir.path().join("unused.db"), ON);
    let (_h1, health1) = watch::channel(Arc::new(healthy(now)));
    let (tx1, mut found) = watch::channel(Arc::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let start = tokio::time::Instant::now();
    let task = tokio::spawn(long_prompt::run(
        driver(&on, health1),
        tx1,
        shutdown.clone(),
    ));
    // Three days: each of the two chat routes three times, the first round at 0 and ½ day.
    tokio::time::sleep(day * 3 - Duration::from_secs(60)).await;
    let seen = b.lock().unwrap().long.clone();
    assert_eq!(seen.len(), 6, "{seen:?}");
    let offsets: Vec<u64> = seen[..2]
        .iter()
        .map(|(_, t)| (*t - start).as_secs())
        .collect();
    assert_eq!(offsets, vec![0, 43_200]);

    // Slow down right after the GPT route's probe: the worst case for it.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(b.lock().unwrap().long.len(), 7);
    let slowed = tokio::time::Instant::now();
    b.lock().unwrap().slow = 3;
    let gpt_found = |l: &[DriftFinding]| l.iter().any(|f| f.route.as_str() == GPT);
    while !gpt_found(&found.borrow_and_update()) {
        found.changed().await.unwrap();
    }
    let took = tokio::time::Instant::now() - slowed;
    println!(
        "prefill 3x slower to long_prompt_slow: {took:?} = {:.3} x long_prompt.every",
        took.as_secs_f64() / day.as_secs_f64()
    );
    // Slowed 60 s after the GPT route's probe: the next one a day less 60 s later is slow, the
    // re-probe 60 s after it confirms as its slow first token arrives.
    assert!(took > day, "{took:?}");
    near(&Value::from((took - day).as_millis() as u64), prefill_ms(3));
    shutdown.cancel();
    task.await.unwrap();
}

#[test]
fn bad_long_prompt_tokens_and_every_are_located_errors() {
    let src = |lp: &str| {
        format!(
            "[capability]\n{lp}\n[[provider]]\nid = \"openai\"\n  [[provider.region]]\n  id = \"us\"\n  base_url = \"http://127.0.0.1:1/v1\"\n[[route]]\nprovider = \"openai\"\nregion = \"us\"\nmodel = \"gpt-4o\"\nserves = \"chat\"\n"
        )
    };
    let err = |lp: &str| match Config::parse(&src(lp), "bad.toml") {
        Ok(_) => panic!("{lp} must not load"),
        Err(e) => e.to_string(),
    };
    let e = err(r#"long_prompt = { tokens = 500, every = "24h" }"#);
    assert!(
        e.contains("bad.toml:2:")
            && e.contains(
                "capability.long_prompt.tokens: must be between 1000 and 200000, got 500"
            ),
        "{e}"
    );
    let e = err(r#"long_prompt = { tokens = 300000 }"#);
    assert!(e.contains("capability.long_prompt.tokens"), "{e}");
    let e = err(r#"long_prompt = { tokens = 8000, every = "30m" }"#);
    assert!(
        e.contains("bad.toml:2:")
            && e.contains("capability.long_prompt.every: must be at least 1h"),
        "{e}"
    );
    let e = err(r#"long_prompt = { tokens = 8000, often = "1h" }"#);
    assert!(e.contains("bad.toml:2:"), "{e}");
    let ok = Config::parse(
        &src(r#"long_prompt = { tokens = 8000, every = "24h" }"#),
        "ok.toml",
    )
    .unwrap()
    .config;
    assert_eq!(
        ok.capability.long_prompt,
        Some(probeok::config::LongPromptConfig {
            tokens: 8_000,
            every: Duration::from_secs(86_400)
        })
    );
    let off = Config::parse(&src(""), "off.toml").unwrap().config;
    assert_eq!(off.capability.long_prompt, None);
}

/// `probeok check-config` shows the long prompt's month per chat route (none for the
/// embeddings route): 30 × (8,011 in + 16 out) = 240,810 tokens at `tokens = 8000` daily.
#[test]
fn check_config_shows_the_long_prompt_per_route() {
    let dir = tempfile::tempdir().unwrap();
    let src = format!(
        "[capability]\n{}\n[[provider]]\nid = \"openai\"\n  [[provider.region]]\n  id = \"us\"\n  base_url = \"http://127.0.0.1:1/v1\"\n[[route]]\nprovider = \"openai\"\nregion = \"us\"\nmodel = \"gpt-4o\"\nserves = \"chat\"\n[[route]]\nprovider = \"openai\"\nregion = \"us\"\nmodel = \"text-embedding-3-small\"\nserves = \"embed\"\nkind = \"embeddings\"\ndimensions = 8\n",
        r#"long_prompt = { tokens = 8000, every = "24h" }"#
    );
    let path = dir.path().join("lp.toml");
    std::fs::write(&path, src).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_probeok"))
        .env_remove("PROBEOK_CONFIG")
        .env("RUST_LOG", "warn")
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("a long prompt of 8000 tokens to every chat route every 1day"),
        "{stdout}"
    );
    // The cost table (the route table above it starts with ROUTE too).
    let table = stdout.split("probe cost per month").nth(1).unwrap();
    let header: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("ROUTE"))
        .unwrap()
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    let at = header
        .iter()
        .position(|c| *c == "LONG PROMPT TOKENS")
        .unwrap();
    let col = |id: &str| -> String {
        let line = table.lines().find(|l| l.starts_with(id)).unwrap();
        line.split_whitespace().nth(at).unwrap().to_owned()
    };
    assert_eq!(col("openai/us/gpt-4o "), "240810", "{stdout}");
    assert_eq!(col("openai/us/text-embedding-3-small "), "0", "{stdout}");
}
