//! `[[sync]]` against a fake new-api / one-api (`tests/common/gateway.rs`, built from their Go
//! sources): the monitor's weights feed (a real publisher over hand-fed health), the sync task
//! on the injected clock, the gateway over real HTTP on 127.0.0.1:0, the store, the alert
//! engine's grouping and `/api/v1/status` on the served router.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::app::*;
use common::gateway::{channel, FakeGateway, Flavor};
use probeok::clock::Clock;
use probeok::config::{SyncConfig, SyncKind};
use probeok::health::{HealthEvent, State};
use probeok::secret::Env;
use probeok::sync::{SyncBoard, SyncDriver};
use tokio::sync::broadcast;

const QWEN: &str = "qwen/cn-beijing/qwen-max";
const DEEPSEEK: &str = "deepseek/default/deepseek-chat";
const GLM: &str = "zhipu/default/glm-4";
const ROUTES: &[Spec<'static>] = &[
    Spec::new("qwen", "cn-beijing", "qwen-max")
        .serves("chat")
        .weight(70),
    Spec::new("deepseek", "default", "deepseek-chat")
        .serves("chat")
        .weight(30),
    Spec::new("zhipu", "default", "glm-4"),
];
const TOKEN: &str = "admin-access-token-9f3c";

fn t0() -> DateTime<Utc> {
    at("2026-12-06T08:00:00Z")
}

struct Rig {
    h: Harness,
    gw: FakeGateway,
    board: SyncBoard,
    events: broadcast::Receiver<HealthEvent>,
}

/// Channels 12 (qwen) and 15 (deepseek) enabled at weight 1; 16 (glm) disabled by an operator.
async fn rig(flavor: Flavor, user_id: Option<u64>) -> Rig {
    let h = Harness::new(ROUTES, t0()).await;
    h.publish(health(State::Normal));
    let gw = FakeGateway::start(
        flavor,
        TOKEN,
        1,
        vec![
            channel(12, "qwen-max", 1, 1),
            channel(15, "deepseek", 1, 1),
            channel(16, "glm", 2, 5),
        ],
    )
    .await;
    let cfg = SyncConfig {
        kind: match flavor {
            Flavor::NewApi => SyncKind::NewApi,
            Flavor::OneApi => SyncKind::OneApi,
        },
        url: gw.url(),
        token_env: "GATEWAY_TOKEN".into(),
        user_id,
        channels: BTreeMap::from([(QWEN.into(), 12), (DEEPSEEK.into(), 15), (GLM.into(), 16)]),
    };
    let board = SyncBoard::new(std::slice::from_ref(&cfg));
    h.state.metrics.attach_sync(board.clone());
    let events = h.state.events.subscribe();
    tokio::spawn(probeok::sync::run(
        SyncDriver {
            gateways: vec![cfg],
            env: Env::given().with("GATEWAY_TOKEN", TOKEN),
            weights: h.state.weights.clone(),
            store: h.store.clone(),
            clock: h.clock.clone(),
            events: h.state.events.clone(),
            board: board.clone(),
            tick: Duration::from_millis(5),
        },
        h.shutdown.clone(),
    ));
    Rig {
        h,
        gw,
        board,
        events,
    }
}

/// Every route NORMAL but qwen in `qwen`.
fn health(qwen: State) -> probeok::health::HealthSnapshot {
    let now = t0();
    let q = match qwen {
        State::Normal => normal(QWEN, now),
        s => with_state(normal(QWEN, now), s, "test"),
    };
    snapshot(now, vec![q, normal(DEEPSEEK, now), normal(GLM, now)])
}

/// Polls `f` until true; fails after 10 s of real time (the sync clock is the test's).
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl Rig {
    /// Publishes qwen's state and waits until the feed shows it and the sync task has run two
    /// rounds after that (so it has seen it).
    async fn qwen(&self, state: State) {
        let before = self.h.state.weights.borrow().version;
        self.h.publish(health(state));
        let weights = self.h.state.weights.clone();
        let expect = match state {
            State::Critical => 0,
            State::Warning => 54,
            _ => 70,
        };
        let q = common::app::id(QWEN);
        until("the feed", || {
            let s = weights.borrow();
            s.version > before || s.weight(&q) == Some(expect)
        })
        .await;
        self.rounds().await;
    }

    async fn advance(&self, secs: u64) {
        self.h.clock.advance(Duration::from_secs(secs));
        self.rounds().await;
    }

    async fn rounds(&self) {
        let r = self.board.rounds();
        until("two sync rounds", || self.board.rounds() >= r + 2).await;
    }

    fn disabled_by_probeok(&self) -> Vec<i64> {
        self.h
            .store
            .reader()
            .unwrap()
            .sync_disabled(&self.gw.url())
            .unwrap()
    }

    fn sync_events(&mut self) -> Vec<Option<String>> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            if let HealthEvent::SyncFailed { error, .. } = e {
                out.push(error);
            }
        }
        out
    }
}

#[tokio::test]
async fn channel_weights_follow_routes_and_weight_zero_disables_then_returns() {
    let started = Instant::now();
    let r = rig(Flavor::NewApi, Some(1)).await;
    until("channels written", || {
        r.gw.status_weight(12) == (1, 70) && r.gw.status_weight(15) == (1, 30)
    })
    .await;
    let first = started.elapsed();

    // qwen CRITICAL: weight 0 → its channel disabled; deepseek takes the whole share. The
    // last writes were at t0, so the gap holds them until t0 + 10 s.
    r.qwen(State::Critical).await;
    assert_eq!(r.gw.status_weight(12), (1, 70), "held by the 10 s gap");
    let changed = Instant::now();
    r.advance(10).await;
    until("qwen disabled", || r.gw.status_weight(12).0 == 2).await;
    until("deepseek at 100", || r.gw.status_weight(15) == (1, 100)).await;
    let disable_latency = changed.elapsed();
    assert_eq!(r.disabled_by_probeok(), vec![12]);

    // qwen returns: only the channel probeok disabled comes back, at the route's weight.
    r.qwen(State::Normal).await;
    r.advance(10).await;
    until("qwen enabled again", || r.gw.status_weight(12) == (1, 70)).await;
    until("deepseek back at 30", || r.gw.status_weight(15) == (1, 30)).await;
    assert!(r.disabled_by_probeok().is_empty());

    // The operator-disabled glm channel: its route is at 100 all along, it is never enabled.
    assert_eq!(r.gw.status_weight(16), (2, 5));
    assert!(r.gw.writes(16).is_empty());
    // Whole channels went back: the key GET never shows is kept (GORM skips zero values).
    let g = r.gw.inner.lock().unwrap();
    assert_eq!(g.channels[&12]["key"], "sk-upstream-12");
    assert_eq!(g.channels[&12]["models"], "qwen-max,qwen-plus");
    // Every call carried the token and new-api's user header.
    assert!(g
        .seen_auth
        .iter()
        .all(|(a, u)| a == &format!("Bearer {TOKEN}") && u.as_deref() == Some("1")));
    assert!(g.refusals.is_empty());
    drop(g);
    eprintln!(
        "figures: first write {first:?} after start; weight change → channel written {disable_latency:?} (0 s of the injected clock once the 10 s gap is over)"
    );
    r.h.shutdown.cancel();
}

#[tokio::test]
async fn an_operator_disabled_channel_is_never_enabled() {
    let r = rig(Flavor::NewApi, Some(1)).await;
    until("in step", || {
        r.gw.status_weight(12) == (1, 70) && r.gw.status_weight(15) == (1, 30)
    })
    .await;
    // The operator disables deepseek's channel by hand while its route is healthy.
    r.gw.set(15, 2, 30);
    // Routes move both ways, past the gap and past a whole read-again of every channel.
    r.qwen(State::Critical).await;
    r.advance(10).await;
    r.qwen(State::Normal).await;
    r.advance(10).await;
    r.advance(300).await;
    r.advance(10).await;
    assert_eq!(r.gw.status_weight(15), (2, 30), "never enabled by probeok");
    assert!(!r.disabled_by_probeok().contains(&15));
    assert_eq!(r.gw.status_weight(16), (2, 5));
    // qwen, disabled by probeok, did come back.
    assert_eq!(r.gw.status_weight(12), (1, 70));
    r.h.shutdown.cancel();
}

#[tokio::test]
async fn writes_are_rate_limited_to_one_per_channel_per_10_s_while_a_route_flaps() {
    let r = rig(Flavor::NewApi, Some(1)).await;
    until("in step", || r.gw.status_weight(12) == (1, 70)).await;
    let base = r.gw.writes(12).len();
    // qwen flaps NORMAL ↔ WARNING every second of the clock for 60 s.
    let mut written_at = Vec::new();
    for s in 1..=60u64 {
        r.h.clock.advance(Duration::from_secs(1));
        let state = if s % 2 == 1 {
            State::Warning
        } else {
            State::Normal
        };
        let n = r.gw.writes(12).len();
        r.qwen(state).await;
        if r.gw.writes(12).len() > n {
            written_at.push(s);
        }
    }
    let writes = r.gw.writes(12).len() - base;
    assert_eq!(writes, written_at.len());
    assert!(
        writes <= 6,
        "at most one write per 10 s over 60 s: {written_at:?}"
    );
    assert!(
        writes >= 5,
        "the flapping route is still followed: {written_at:?}"
    );
    for pair in written_at.windows(2) {
        assert!(pair[1] - pair[0] >= 10, "writes {written_at:?}");
    }
    // Once it settles, the last weight is written after the gap.
    r.advance(10).await;
    until("settled", || r.gw.status_weight(12) == (1, 70)).await;
    eprintln!(
        "figures: flapping every 1 s for 60 s → {writes} writes to the channel (at clock seconds {written_at:?}) instead of 60"
    );
    r.h.shutdown.cancel();
}

#[tokio::test]
async fn a_refused_write_raises_sync_failed_is_retried_with_backoff_and_resolves() {
    let mut r = rig(Flavor::NewApi, Some(1)).await;
    until("in step", || {
        r.gw.status_weight(12) == (1, 70) && r.gw.status_weight(15) == (1, 30)
    })
    .await;
    r.rounds().await;
    assert!(r.sync_events().is_empty());
    // The token now belongs to another user: new-api answers 401 to our New-Api-User.
    r.gw.inner.lock().unwrap().user_id = 7;
    r.qwen(State::Critical).await;
    r.advance(10).await;
    // Both channels whose route moved (qwen to 0, deepseek to 100) were due: both refused.
    until("the refusals", || r.gw.refusals().len() >= 2).await;
    assert_eq!(r.gw.refusals().len(), 2, "{:?}", r.gw.refusals());
    let events = r.sync_events();
    assert_eq!(events.len(), 1, "one alert for the gateway: {events:?}");
    let error = events[0].clone().unwrap();
    assert!(
        error.contains("401") && error.contains("New-Api-User 与登录用户不匹配"),
        "{error}"
    );
    assert!(!error.contains(TOKEN));
    assert_eq!(r.gw.status_weight(12), (1, 70), "nothing written");

    // Status shows the failing gateway, never the token.
    let served = r.h.serve().await;
    let body = reqwest::get(served.url("/api/v1/status"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!body.contains(TOKEN));
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let sync = &doc["sync"][0];
    assert_eq!(sync["kind"], "new-api");
    assert_eq!(sync["url"], r.gw.url());
    assert!(sync["last_error"].as_str().unwrap().contains("401"));

    // Backoff per channel: 10 s, then 20 s. Retries refused again raise no second alert.
    r.advance(5).await;
    assert_eq!(r.gw.refusals().len(), 2, "no retry before 10 s");
    r.advance(5).await;
    until("first retries", || r.gw.refusals().len() == 4).await;
    r.advance(10).await;
    assert_eq!(r.gw.refusals().len(), 4, "the second retry waits 20 s");
    r.advance(10).await;
    until("second retries", || r.gw.refusals().len() == 6).await;
    assert!(r.sync_events().is_empty(), "one alert per failing spell");

    // Fixed on the gateway: the next retry (40 s) succeeds and resolves the alert.
    r.gw.inner.lock().unwrap().user_id = 1;
    r.advance(40).await;
    until("written", || r.gw.status_weight(12).0 == 2).await;
    until("deepseek written", || r.gw.status_weight(15) == (1, 100)).await;
    r.rounds().await;
    let events = r.sync_events();
    assert_eq!(events, vec![None], "resolved once");
    let body: serde_json::Value = reqwest::get(served.url("/api/v1/status"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(body["sync"][0]["last_error"].is_null());
    assert!(body["sync"][0]["last_ok"].is_string());

    // The same two events through the alert engine's grouping: one sync_failed warning, then
    // its resolution.
    let rig = common::alerts::rig(Vec::new(), r.h.clock.clone(), |_| {}).await;
    let kind = "new-api".to_owned();
    let mut g = rig.service.grouper();
    let now = r.h.clock.now();
    g.push(
        HealthEvent::SyncFailed {
            kind: kind.clone(),
            gateway: r.gw.url(),
            error: Some(error),
            at: now,
        },
        now,
    );
    g.push(
        HealthEvent::SyncFailed {
            kind,
            gateway: r.gw.url(),
            error: None,
            at: now,
        },
        now,
    );
    let drafts = g.flush(now);
    let subjects: Vec<_> = drafts
        .iter()
        .map(|d| {
            (
                serde_json::to_value(&d.message.subject).unwrap()["type"].clone(),
                d.message.status,
                d.message.severity,
            )
        })
        .collect();
    assert_eq!(
        subjects,
        vec![
            (
                "sync_failed".into(),
                probeok::alert::Status::Firing,
                probeok::severity::Severity::Warning
            ),
            (
                "sync_failed".into(),
                probeok::alert::Status::Resolved,
                probeok::severity::Severity::Warning
            ),
        ]
    );
    r.h.shutdown.cancel();
}

#[tokio::test]
async fn new_api_needs_new_api_user_and_one_api_does_not() {
    // new-api without the user header: refused with its 401, alerted, nothing written.
    let mut r = rig(Flavor::NewApi, None).await;
    until("the refusal", || !r.gw.refusals().is_empty()).await;
    r.rounds().await;
    assert_eq!(r.gw.refusals()[0], "无权进行此操作，未提供 New-Api-User");
    assert_eq!(r.sync_events().len(), 1);
    assert!(r.gw.writes(12).is_empty());
    r.h.shutdown.cancel();

    // one-api has no such header: the same driver keeps its channels in step.
    let r = rig(Flavor::OneApi, None).await;
    until("channels written", || {
        r.gw.status_weight(12) == (1, 70) && r.gw.status_weight(15) == (1, 30)
    })
    .await;
    assert!(r.gw.refusals().is_empty());
    assert!(r
        .gw
        .inner
        .lock()
        .unwrap()
        .seen_auth
        .iter()
        .all(|(a, u)| a == &format!("Bearer {TOKEN}") && u.is_none()));
    // one-api answers an invalid token with HTTP 200 and success: false: a refusal too.
    r.gw.inner.lock().unwrap().token = "rotated".into();
    r.qwen(State::Critical).await;
    r.advance(10).await;
    until("the refusal", || !r.gw.refusals().is_empty()).await;
    r.rounds().await;
    assert_eq!(r.gw.refusals()[0], "无权进行此操作，access token 无效");
    let b = r.board.snapshot();
    assert!(b[0].last_error.as_deref().unwrap().contains("HTTP 200"));
    r.h.shutdown.cancel();
}

/// `serve` in-process with a `[[sync]]` table: the leader (a lone SQLite monitor always
/// leads) starts the sync task under supervision, and `/api/v1/status` shows the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_a_gateway_in_step_from_the_leader() {
    use probeok::sim::{self, Scenario, SimConfig, SimRoute};
    let shutdown = tokio_util::sync::CancellationToken::new();
    let sim_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim_addr = sim_listener.local_addr().unwrap();
    tokio::spawn(sim::serve(
        sim_listener,
        SimConfig {
            routes: vec![SimRoute {
                provider: "sim".into(),
                region: "r1".into(),
                model: "m1".into(),
                scenario: Scenario::Healthy,
            }],
            time_scale: 1.0,
            seed: 7,
        },
        shutdown.child_token(),
    ));
    let gw = FakeGateway::start(Flavor::OneApi, TOKEN, 1, vec![channel(12, "sim", 1, 1)]).await;
    let dir = tempfile::tempdir().unwrap();
    let src = format!(
        r#"
[storage]
path = "{db}"

[[provider]]
id = "sim"
kind = "openai"
  [[provider.region]]
  id = "r1"
  base_url = "{base}"

[[route]]
provider = "sim"
region = "r1"
model = "m1"
serves = "chat"

[[sync]]
kind = "one-api"
url = "{gw}"
token_env = "ONEAPI_ADMIN_TOKEN"
channels = {{ "sim/r1/m1" = 12 }}
"#,
        db = dir.path().join("serve.db").display(),
        base = sim::base_url(sim_addr, "sim", "r1"),
        gw = gw.url(),
    );
    let mut config = probeok::config::Config::parse(&src, "test.toml")
        .unwrap()
        .config;
    config.env = Env::given().with("ONEAPI_ADMIN_TOKEN", TOKEN);
    assert!(config.missing_secrets().is_empty());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = probeok::app::start(
        config,
        listener,
        std::sync::Arc::new(probeok::clock::SystemClock),
        shutdown.clone(),
    )
    .await
    .unwrap();
    until("the channel at its route's weight", || {
        gw.status_weight(12) == (1, 100)
    })
    .await;
    let status: serde_json::Value = reqwest::get(format!("http://{}/api/v1/status", running.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["sync"][0]["kind"], "one-api");
    assert!(status["sync"][0]["last_ok"].is_string(), "{status}");
    assert!(!status.to_string().contains(TOKEN));
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
