//! The built-in demo runs no regression sets: the simulator answers the shipped sets'
//! prompts generically, so every backup would fail the quality gate. Every demo route gets
//! its share at start, and the backups take over with non-zero weights when the primaries go.

use std::sync::Arc;

use probeok::clock::{Clock, SystemClock};
use probeok::health::{HealthSnapshot, State};
use probeok::probe::ProbeClient;
use probeok::route::{RouteId, Tier};
use probeok::store::{Store, StoreOptions};
use probeok::weights::{compute, Inputs, Policy};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn the_demo_runs_no_regression_sets_and_every_route_can_carry_traffic() {
    let shutdown = CancellationToken::new();
    let demo = probeok::demo::start(shutdown.clone()).await.unwrap();
    assert!(!demo.config.drift.run_sets);
    // The shipped sets are right here (tests run in the crate root): the demo must ignore them.
    assert!(demo.config.drift_sets_dir().is_dir());
    let routes = demo.config.routes();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("demo.db"), StoreOptions::default()).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let client = ProbeClient::new(&routes, clock.clone()).unwrap();
    let drift = probeok::drift::spawn(
        &demo.config,
        &routes,
        client,
        store.clone(),
        clock.clone(),
        probeok::drift::RunnerOptions::default(),
        shutdown.clone(),
    )
    .await
    .unwrap();
    assert!(drift.jobs.is_empty(), "no drift job: {:?}", drift.jobs);
    let snapshot = drift.rx.borrow().clone();
    assert!(snapshot.sets.is_empty() && snapshot.findings.is_empty());
    drift.task.await.unwrap();

    let policy = Policy::from_config(&demo.config);
    let ids: Vec<RouteId> = routes.iter().map(|r| r.id.clone()).collect();
    let now = clock.now();
    let start = HealthSnapshot::initial(&ids, now);
    let models = compute(&Inputs {
        policy: &policy,
        drift: Some(&snapshot),
        ..Inputs::new(&routes, &start)
    });
    for (serves, m) in &models {
        for e in &m.entries {
            assert_ne!(e.reason, "regression_failed", "{serves}: {}", e.route);
            if e.tier == Tier::Primary {
                assert!(e.weight > 0, "{serves}: {} has weight 0 at start", e.route);
            }
        }
    }
    // Every primary down: the backups carry the traffic, each with a non-zero weight.
    let mut down = start.clone();
    for (s, r) in down.routes.iter_mut().zip(&routes) {
        if r.tier == Tier::Primary {
            s.state = State::Critical;
        } else {
            s.state = State::Normal;
        }
    }
    let models = compute(&Inputs {
        policy: &policy,
        drift: Some(&snapshot),
        ..Inputs::new(&routes, &down)
    });
    for (serves, m) in &models {
        assert_eq!(m.serving.tier, Some(Tier::Backup), "{serves}");
        for e in m.entries.iter().filter(|e| e.tier == Tier::Backup) {
            assert!(e.weight > 0, "{serves}: backup {} has weight 0", e.route);
        }
    }
    shutdown.cancel();
    store.close().await.unwrap();
}

/// The demo runs an agent in-process as a second vantage: it probes the same simulator and
/// pushes to the demo's own ingest over real HTTP with the demo's made-up token, so
/// `/api/v1/status` shows both vantages on every route, each seen recently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_agent_pushes_as_a_second_vantage() {
    let shutdown = CancellationToken::new();
    let mut demo = probeok::demo::start(shutdown.clone()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    demo.config.storage.path = dir.path().join("demo.db");
    demo.config.server.listen = "127.0.0.1:0".parse().unwrap();
    demo.config.proxy.enabled = false;
    assert_eq!(demo.config.vantages.len(), 1);
    assert_eq!(demo.config.vantages[0].id, probeok::demo::DEMO_AGENT);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let monitor = listener.local_addr().unwrap();
    let running = probeok::app::start_with(
        demo.config.clone(),
        listener,
        Arc::new(SystemClock),
        shutdown.clone(),
        probeok::app::StartOptions::default(),
    )
    .await
    .unwrap();
    let agent = probeok::demo::start_agent(
        &demo.config,
        monitor,
        dir.path().join("agent.db"),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let routes = demo.config.routes().len();
    loop {
        let status: serde_json::Value = http
            .get(format!("http://{}/api/v1/status", running.addr))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let seen = status["routes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                let v = &r["vantages"];
                !v[probeok::demo::DEMO_AGENT]["last_seen"].is_null() && !v["local"].is_null()
            })
            .count();
        if seen == routes {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after 60 s only {seen} of {routes} routes show the demo agent's vantage: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    // The pushes went through the monitor's real ingest.
    let metrics = http
        .get(format!("http://{}/metrics", running.addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!("vantage=\"{}\"", probeok::demo::DEMO_AGENT)),
        "{metrics}"
    );
    shutdown.cancel();
    let _ = agent.done.await;
    let _ = running.done.await;
}
