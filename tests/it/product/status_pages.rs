//! `[[provider.status_page]]` against a fake Statuspage page and its Atom feed
//! (`tests/common/statuspage.rs`, real HTTP on 127.0.0.1:0): the leader's task on the
//! injected clock, the store, `/api/v1/status`'s `declared`, `/api/v1/incidents`'
//! `provider_declared` lead time, the month's summary, the lead histogram on `/metrics`,
//! `provider_declared` through the alert engine's grouping, and pages that fail.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use common::app::*;
use common::statuspage::{FakeIncident, FakeStatusPage, Fault};
use probeok::config::{Config, StatusPageConfig, StatusPageKind};
use probeok::declared::{DeclaredBoard, DeclaredDriver};
use probeok::health::{HealthEvent, Incident, State};
use serde_json::Value;
use tokio::sync::broadcast;

const SONNET: &str = "anthropic/us/claude-sonnet";
const HAIKU: &str = "anthropic/us/claude-haiku";
const EMBED: &str = "anthropic/us/embed";
const ROUTES: &[Spec<'static>] = &[
    Spec::new("anthropic", "us", "claude-sonnet").serves("chat"),
    Spec::new("anthropic", "us", "claude-haiku").serves("chat"),
    Spec::new("anthropic", "us", "embed").serves("embed"),
];

fn t0() -> DateTime<Utc> {
    at("2026-12-06T08:00:00Z")
}

struct Rig {
    h: Harness,
    page: FakeStatusPage,
    board: DeclaredBoard,
    events: broadcast::Receiver<HealthEvent>,
    served: Served,
    http: reqwest::Client,
}

/// The page maps "API" to the two chat routes and "Embeddings" to the embeddings route.
async fn rig(kind: StatusPageKind, alert: bool) -> Rig {
    let mut h = Harness::new(ROUTES, t0()).await;
    h.publish(all(State::Normal));
    let page =
        FakeStatusPage::start(&[("API", "operational"), ("Embeddings", "operational")]).await;
    let mut config: Config = (*h.state.config.current()).clone();
    config.providers[0].status_pages = vec![StatusPageConfig {
        provider: "anthropic".into(),
        kind,
        url: match kind {
            StatusPageKind::Statuspage => page.url(),
            StatusPageKind::Feed => format!("{}/history.atom", page.url()),
        },
        components: BTreeMap::from([
            ("API".into(), vec!["anthropic/*/claude-*".into()]),
            ("Embeddings".into(), vec![EMBED.into()]),
        ]),
        every: Duration::from_secs(60),
        alert,
    }];
    let config = Arc::new(config);
    h.state.config = config.clone().into();
    h.state.incidents = Arc::new(probeok::web::StoreIncidents);
    let board = DeclaredBoard::new(&config, Some(h.state.metrics.incident_lead()));
    h.state.metrics.attach_declared(board.clone());
    let events = h.state.events.subscribe();
    tokio::spawn(probeok::declared::run(
        DeclaredDriver {
            config,
            routes: [SONNET, HAIKU, EMBED].iter().map(|r| id(r)).collect(),
            store: h.store.clone(),
            clock: h.clock.clone(),
            events: h.state.events.clone(),
            health: h.state.health.clone(),
            board: board.clone(),
            tick: Duration::from_millis(5),
            timeout: Duration::from_millis(500),
        },
        h.shutdown.clone(),
    ));
    let served = h.serve().await;
    let r = Rig {
        h,
        page,
        board,
        events,
        served,
        http: reqwest::Client::new(),
    };
    r.reads(1).await;
    r
}

/// Every route in `state`.
fn all(state: State) -> probeok::health::HealthSnapshot {
    let now = t0();
    let r = |id: &str| match state {
        State::Normal => normal(id, now),
        s => with_state(normal(id, now), s, "test"),
    };
    snapshot(now, vec![r(SONNET), r(HAIKU), r(EMBED)])
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl Rig {
    /// Waits until the page has been read `n` times in all, and one more loop has passed.
    async fn reads(&self, n: u64) {
        until(&format!("{n} page reads"), || self.board.reads() >= n).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }

    /// Moves the clock past the page's period and waits for the read that follows.
    async fn next_read(&self) {
        let before = self.board.reads();
        self.h.clock.advance(Duration::from_secs(61));
        self.reads(before + 1).await;
    }

    async fn get(&self, path: &str) -> Value {
        common::get_json(&self.http, &self.served.url(path)).await
    }

    async fn route(&self, route: &str) -> Value {
        let s = self.get("/api/v1/status").await;
        s["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == route)
            .cloned()
            .unwrap()
    }

    fn declared_events(&mut self) -> Vec<(String, bool, Vec<String>)> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            if let HealthEvent::ProviderDeclared {
                what,
                firing,
                routes,
                ..
            } = e
            {
                out.push((what, firing, routes.iter().map(|r| r.to_string()).collect()));
            }
        }
        out
    }
}

fn ours(route: &str, opened: DateTime<Utc>, closed: Option<DateTime<Utc>>) -> Incident {
    Incident {
        id: format!("{route}@{}", probeok::clock::rfc3339(opened)),
        route: id(route),
        opened_at: opened,
        closed_at: closed,
        peak: State::Degraded,
        failure_mode: None,
        transitions: Vec::new(),
        cause: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declaration_twelve_minutes_after_our_detection_is_a_twelve_minute_lead() {
    let mut r = rig(StatusPageKind::Statuspage, true).await;
    // We detect the outage at t0 (the incident detection opens, as it stores it).
    r.h.publish(all(State::Degraded));
    r.h.store
        .writer()
        .upsert_incident(&ours(SONNET, t0(), None))
        .await
        .unwrap();
    let inc = r.get("/api/v1/incidents").await;
    assert_eq!(
        inc["incidents"][0]["provider_declared"]["status"], "not_declared",
        "{inc}"
    );

    // Twelve minutes later the provider declares it on "API".
    r.h.clock.advance(Duration::from_secs(12 * 60 - 61));
    let declared_at = t0() + TimeDelta::minutes(12);
    r.page.set(|p| {
        p.components[0].1 = "major_outage".into();
        p.incidents.push(FakeIncident::new(
            "k3xq",
            "Elevated errors on the API",
            declared_at,
            &["API"],
        ));
    });
    r.next_read().await;
    let inc = r.get("/api/v1/incidents").await;
    let lead = &inc["incidents"][0]["provider_declared"];
    assert_eq!(lead["status"], "declared", "{inc}");
    assert_eq!(lead["lead_seconds"], 720);
    assert_eq!(lead["incident"], "k3xq");
    assert_eq!(lead["url"], "https://stspg.io/k3xq");

    // The route shows the provider's word beside ours; the embeddings route is not touched.
    let sonnet = r.route(SONNET).await;
    assert_eq!(sonnet["declared"]["status"], "major_outage");
    assert_eq!(sonnet["declared"]["incident"], "Elevated errors on the API");
    assert_eq!(
        sonnet["declared"]["since"],
        probeok::clock::rfc3339(declared_at)
    );
    assert_eq!(r.route(EMBED).await["declared"]["status"], "operational");
    let status = r.get("/api/v1/status").await;
    assert_eq!(status["status_pages"][0]["kind"], "statuspage");
    assert!(status["status_pages"][0]["last_ok"].is_string());

    // The lead is observed once, however many reads follow.
    r.next_read().await;
    r.next_read().await;
    let metrics = r
        .http
        .get(r.served.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("probeok_incident_lead_seconds_count 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("probeok_incident_lead_seconds_sum 720"),
        "{metrics}"
    );
    // Our routes were already DEGRADED when the provider spoke: nothing to tell the on-call.
    assert!(r.declared_events().is_empty());

    // The pages say the same: a box on `/` and a mark on the route's line, a line on the
    // route page with the provider's link, the lead beside the incident.
    let page = |path: &str| {
        let url = r.served.url(path);
        let http = r.http.clone();
        async move { http.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let home = page("/?lang=en").await;
    assert!(home.contains("id=\"declared\""), "{home}");
    assert!(
        home.contains("anthropic: Elevated errors on the API"),
        "{home}"
    );
    assert!(home.contains("status page: major outage"), "{home}");
    let route = page("/routes/anthropic/us/claude-sonnet?lang=en").await;
    assert!(
        route.contains("status page: major outage — Elevated errors on the API"),
        "{route}"
    );
    assert!(route.contains("href=\"https://stspg.io/k3xq\""), "{route}");
    assert!(route.contains("before the provider declared it"), "{route}");
    let zh = page("/routes/anthropic/us/claude-sonnet?lang=zh").await;
    assert!(zh.contains("服务商状态页：严重中断"), "{zh}");
    r.h.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_the_provider_never_declares_is_never_declared_and_counted_in_the_month() {
    let r = rig(StatusPageKind::Statuspage, true).await;
    let w = r.h.store.writer();
    // Declared 12 minutes after ours.
    w.upsert_incident(&ours(
        SONNET,
        t0() - TimeDelta::hours(3),
        Some(t0() - TimeDelta::hours(2)),
    ))
    .await
    .unwrap();
    // Never declared: the page only had an incident on another component, and one long after.
    w.upsert_incident(&ours(
        HAIKU,
        t0() - TimeDelta::hours(1),
        Some(t0() - TimeDelta::minutes(30)),
    ))
    .await
    .unwrap();
    r.page.set(|p| {
        let mut a = FakeIncident::new("a", "API errors", t0() - TimeDelta::minutes(168), &["API"]);
        a.status = "resolved".into();
        a.resolved_at = Some(t0() - TimeDelta::minutes(100));
        let mut b = FakeIncident::new(
            "b",
            "Embeddings slow",
            t0() - TimeDelta::minutes(50),
            &["Embeddings"],
        );
        b.status = "resolved".into();
        b.resolved_at = Some(t0() - TimeDelta::minutes(20));
        p.incidents = vec![b, a];
    });
    r.next_read().await;
    let inc = r.get("/api/v1/incidents").await;
    let by_route = |route: &str| {
        inc["incidents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["route"] == route)
            .unwrap()["provider_declared"]
            .clone()
    };
    assert_eq!(by_route(SONNET)["lead_seconds"], 720, "{inc}");
    assert_eq!(by_route(HAIKU)["status"], "never_declared", "{inc}");

    let month = r.get("/api/v1/incidents/lead?month=2026-12").await;
    assert_eq!(month["incidents"], 2, "{month}");
    assert_eq!(month["declared"], 1);
    assert_eq!(month["never_declared"], 1);
    assert_eq!(month["median_lead_seconds"], 720);
    assert_eq!(month["never_declared_share"], 0.5);
    assert_eq!(month["provider_first"], 0);
    assert_eq!(
        r.get("/api/v1/incidents/lead?month=2026-11").await["incidents"],
        0
    );
    let page = r
        .http
        .get(r.served.url("/incidents?lang=en"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("2026-12: 2 incidents on routes with a provider status page"),
        "{page}"
    );
    assert!(page.contains("never declared 50%"), "{page}");
    assert!(page.contains("the provider never declared it"), "{page}");
    let bad = r
        .http
        .get(r.served.url("/api/v1/incidents/lead?month=2026-13"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    r.h.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_incident_while_our_probes_are_fine_is_one_provider_declared_alert() {
    let mut r = rig(StatusPageKind::Statuspage, true).await;
    r.page.set(|p| {
        p.components[0].1 = "partial_outage".into();
        p.incidents
            .push(FakeIncident::new("q1", "Elevated latency", t0(), &["API"]));
    });
    r.next_read().await;
    let events = r.declared_events();
    assert_eq!(
        events,
        vec![(
            "Elevated latency".to_owned(),
            true,
            vec![SONNET.to_owned(), HAIKU.to_owned()]
        )],
        "one alert naming the routes of the component, not the embeddings route"
    );
    // Read again and again while it lasts: no second alert.
    for _ in 0..3 {
        r.next_read().await;
    }
    assert!(r.declared_events().is_empty());

    // The same event through the alert engine to a webhook: one warning, the provider's
    // words first, the page's link, the routes.
    use common::alerts::{Fake, Kind};
    let clock = r.h.clock.clone();
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _) = common::alerts::serve(hook.clone(), None).await;
    let channel =
        common::alerts::webhook("webhook[0]", addr, None, probeok::alert::Severity::Warning);
    let alerts = common::alerts::rig(vec![channel], clock, |_| {}).await;
    let raised = HealthEvent::ProviderDeclared {
        key: "provider_declared:page#q1".into(),
        provider: "anthropic".into(),
        what: "Elevated latency".into(),
        url: Some("https://stspg.io/q1".into()),
        routes: vec![id(SONNET), id(HAIKU)],
        firing: true,
        at: t0(),
    };
    assert_eq!(alerts.push(vec![raised.clone(), raised]).await, 1);
    assert_eq!(alerts.service.deliver().await.unwrap().delivered, 1);
    let got = hook.got();
    assert_eq!(got.len(), 1);
    let body = got[0].body.to_string();
    assert!(
        body.contains("anthropic declares Elevated latency"),
        "{body}"
    );
    assert!(body.contains("provider_declared"), "{body}");
    assert!(body.contains("https://stspg.io/q1"), "{body}");
    assert!(body.contains(SONNET), "{body}");

    // The provider resolves it: one resolution.
    r.page.set(|p| {
        p.components[0].1 = "operational".into();
        p.incidents[0].status = "resolved".into();
        p.incidents[0].resolved_at = Some(t0() + TimeDelta::minutes(20));
    });
    r.next_read().await;
    let events = r.declared_events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(!events[0].1, "a resolution");
    r.h.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_provider_declared_when_turned_off_or_when_we_already_see_it() {
    let mut off = rig(StatusPageKind::Statuspage, false).await;
    off.page.set(|p| {
        p.incidents
            .push(FakeIncident::new("x", "Outage", t0(), &["API"]))
    });
    off.next_read().await;
    assert!(off.declared_events().is_empty(), "alert = false");
    assert_eq!(off.route(SONNET).await["declared"]["status"], "incident");
    off.h.shutdown.cancel();

    let mut seen = rig(StatusPageKind::Statuspage, true).await;
    seen.h.publish(all(State::Critical));
    seen.page.set(|p| {
        p.incidents
            .push(FakeIncident::new("y", "Outage", t0(), &["API"]))
    });
    seen.next_read().await;
    // Our routes recover while the provider still declares: still nothing, we knew first.
    seen.h.publish(all(State::Normal));
    seen.next_read().await;
    assert!(seen.declared_events().is_empty());
    seen.h.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atom_feed_is_read_for_incidents_and_their_components() {
    let r = rig(StatusPageKind::Feed, true).await;
    r.h.publish(all(State::Degraded));
    r.h.store
        .writer()
        .upsert_incident(&ours(SONNET, t0(), None))
        .await
        .unwrap();
    r.page.set(|p| {
        p.incidents.push(FakeIncident::new(
            "f1",
            "Errors on Embeddings",
            t0() + TimeDelta::minutes(3),
            &["Embeddings"],
        ));
        p.incidents.insert(
            0,
            FakeIncident::new(
                "f2",
                "Elevated errors",
                t0() + TimeDelta::minutes(5),
                &["API"],
            ),
        );
    });
    r.next_read().await;
    let lead = &r.get("/api/v1/incidents").await["incidents"][0]["provider_declared"];
    assert_eq!(lead["status"], "declared");
    assert_eq!(
        lead["lead_seconds"], 300,
        "the API entry, not the embeddings one"
    );
    assert_eq!(r.route(SONNET).await["declared"]["status"], "incident");
    assert_eq!(
        r.route(EMBED).await["declared"]["incident"],
        "Errors on Embeddings"
    );
    r.h.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_fails_keeps_the_last_known_state() {
    let r = rig(StatusPageKind::Statuspage, true).await;
    r.page.set(|p| {
        p.components[0].1 = "major_outage".into();
        p.incidents
            .push(FakeIncident::new("z", "API down", t0(), &["API"]));
    });
    r.next_read().await;
    // Unchanged: conditional requests cost 304s, not bodies.
    let (full, _) = r.page.counts();
    r.next_read().await;
    let (full_after, not_modified) = r.page.counts();
    assert_eq!(full_after, full, "no body sent for an unchanged page");
    assert!(not_modified >= 2, "{not_modified}");

    for (fault, says) in [
        (Fault::Http500, "HTTP 500"),
        (Fault::NotJson, "not Statuspage v2 JSON"),
        (Fault::Huge, "larger than"),
        (Fault::Silent, "no answer"),
    ] {
        r.page.set(|p| p.fault = fault);
        r.next_read().await;
        let status = r.get("/api/v1/status").await;
        let error = status["status_pages"][0]["last_error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(error.contains(says), "{fault:?}: {error}");
        let sonnet = r.route(SONNET).await;
        assert_eq!(
            sonnet["declared"]["status"], "major_outage",
            "{fault:?}: last known kept"
        );
        assert_eq!(sonnet["declared"]["incident"], "API down");
    }
    r.page.set(|p| p.fault = Fault::None);
    r.next_read().await;
    let status = r.get("/api/v1/status").await;
    assert!(
        status["status_pages"][0]["last_error"].is_null(),
        "{status}"
    );
    r.h.shutdown.cancel();
}

#[test]
fn the_config_locates_a_status_page_that_maps_nothing() {
    let src = r#"
[[provider]]
id = "anthropic"
kind = "anthropic"
  [[provider.region]]
  id = "us"
  base_url = "https://api.anthropic.com"
  [[provider.status_page]]
  kind = "statuspage"
  url = "https://status.anthropic.com"
  every = "5s"
  components = { "Claude API" = ["anthropic/*/claude-*"], "Console" = ["openai/*"] }

[[route]]
provider = "anthropic"
region = "us"
model = "claude-sonnet"
serves = "chat"
"#;
    let err = Config::parse(src, "probeok.toml").unwrap_err().to_string();
    assert!(err.contains("provider[0].status_page[0].every"), "{err}");
    assert!(err.contains("at least 10s"), "{err}");
    assert!(
        err.contains("\"openai/*\" matches no route of provider \"anthropic\""),
        "{err}"
    );
    assert!(err.contains("probeok.toml:"), "located: {err}");
    let good = src
        .replace("every = \"5s\"", "")
        .replace(", \"Console\" = [\"openai/*\"]", "");
    let c = Config::parse(&good, "probeok.toml").unwrap().config;
    let page = &c.providers[0].status_pages[0];
    assert_eq!(page.every, Duration::from_secs(60));
    assert!(page.alert);
    assert_eq!(page.components.keys().collect::<Vec<_>>(), ["Claude API"]);
}

/// `serve` in-process with a `[[provider.status_page]]`: the leader (a lone SQLite monitor
/// always leads) reads the page under supervision, and `/api/v1/status` shows its word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reads_the_status_page_from_the_leader() {
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
    let page = FakeStatusPage::start(&[("Chat API", "degraded_performance")]).await;
    page.set(|p| {
        p.incidents
            .push(FakeIncident::new("s1", "Slow answers", t0(), &["Chat API"]))
    });
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
  [[provider.status_page]]
  kind = "statuspage"
  url = "{page}"
  components = {{ "Chat API" = ["sim/*"] }}

[[route]]
provider = "sim"
region = "r1"
model = "m1"
serves = "chat"
"#,
        db = dir.path().join("serve.db").display(),
        base = probeok::sim::base_url(sim_addr, "sim", "r1"),
        page = page.url(),
    );
    let config = Config::parse(&src, "test.toml").unwrap().config;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = probeok::app::start(
        config,
        listener,
        Arc::new(probeok::clock::SystemClock),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let url = format!("http://{}/api/v1/status", running.addr);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let s = common::get_json(&http, &url).await;
        if s["status_pages"][0]["last_ok"].is_string() {
            break s;
        }
        assert!(Instant::now() < deadline, "the page was never read: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let route = &status["routes"][0];
    assert_eq!(
        route["declared"]["status"], "degraded_performance",
        "{status}"
    );
    assert_eq!(route["declared"]["incident"], "Slow answers");
    let metrics = http
        .get(format!("http://{}/metrics", running.addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("probeok_task_failures_total{task=\"status_pages\"} 0"),
        "{metrics}"
    );
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
