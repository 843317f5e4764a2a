//! The built-in demo runs no regression sets: the simulator answers the shipped sets'
//! prompts generically, so every backup would fail the quality gate. Every demo route gets
//! its share at start, and the backups take over with non-zero weights when the primaries go.

use crate::common;

use std::sync::Arc;

use std::time::Duration;

use probeok::clock::{Clock, SystemClock};
use probeok::demo::edge::{EdgeOutage, EDGE_REGION};
use probeok::demo::DEMO_AGENT;
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
/// `/api/v1/status` shows both vantages on every route, each seen recently. Its own network
/// path to one region is cut (here from the start): those routes stay NORMAL by quorum and
/// carry a `vantage_local` finding naming the agent, with no incident.
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
        demo.sim_addr,
        monitor,
        dir.path().join("agent.db"),
        EdgeOutage {
            after: Duration::ZERO,
            lasts: Duration::from_secs(3600),
            every: Duration::ZERO,
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let routes = demo.config.routes().len();
    loop {
        let status =
            common::get_json(&http, &format!("http://{}/api/v1/status", running.addr)).await;
        let all = status["routes"].as_array().unwrap();
        let seen = all
            .iter()
            .filter(|r| {
                let v = &r["vantages"];
                !v[probeok::demo::DEMO_AGENT]["last_seen"].is_null() && !v["local"].is_null()
            })
            .count();
        // The routes behind the agent's cut path: judged local to the agent, not the provider's.
        let (provider, region) = EDGE_REGION;
        let cut: Vec<&serde_json::Value> = all
            .iter()
            .filter(|r| r["provider"] == provider && r["region"] == region)
            .collect();
        let local = cut
            .iter()
            .filter(|r| r["vantage_local"]["vantages"] == serde_json::json!([DEMO_AGENT]))
            .count();
        if seen == routes && local == cut.len() {
            for r in &cut {
                assert!(
                    r["state"] == "NORMAL" || r["state"] == "UNKNOWN",
                    "one place's outage is not the route's: {r}"
                );
            }
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after 60 s {seen} of {routes} routes show the demo agent's vantage and {local} of \
             {} behind its cut path a vantage_local finding: {status}",
            cut.len()
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
    // One place's outage opened no incident.
    let incidents =
        common::get_json(&http, &format!("http://{}/api/v1/incidents", running.addr)).await;
    let (provider, region) = EDGE_REGION;
    let prefix = format!("{provider}/{region}/");
    assert!(
        !incidents.to_string().contains(&prefix),
        "no incident on {prefix}: {incidents}"
    );
    shutdown.cancel();
    let _ = agent.done.await;
    let _ = running.done.await;
}
