//! `serve` in-process on 127.0.0.1:0 against the simulated providers on a real socket:
//! health endpoints answer, probes land in the store and reach detection, shutdown drains and
//! exits cleanly.

use std::sync::Arc;
use std::time::Duration;

use probeok::app;
use probeok::clock::SystemClock;
use probeok::config::Config;
use probeok::health::State;
use probeok::route::RouteId;
use probeok::sim::{self, Scenario, SimConfig, SimRoute};
use tokio_util::sync::CancellationToken;

async fn start_sim(shutdown: CancellationToken) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = SimConfig {
        routes: vec![SimRoute {
            provider: "sim".into(),
            region: "r1".into(),
            model: "m1".into(),
            scenario: Scenario::Healthy,
        }],
        time_scale: 1.0,
        seed: 7,
    };
    tokio::spawn(sim::serve(listener, config, shutdown));
    addr
}

fn config_for(sim: std::net::SocketAddr, db: &std::path::Path) -> Config {
    let src = format!(
        r#"
[storage]
path = "{db}"

[probe]
interval = "3s"
timeout = "2800ms"
first_byte_timeout = "1s"

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
tier = "primary"
weight = 100
"#,
        db = db.display(),
        base = sim::base_url(sim, "sim", "r1"),
    );
    Config::parse(&src, "test.toml").unwrap().config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_health_records_probes_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("serve.db");
    let shutdown = CancellationToken::new();
    let sim_addr = start_sim(shutdown.child_token()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::start(
        config_for(sim_addr, &db),
        listener,
        Arc::new(SystemClock),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let base = format!("http://{}", running.addr);
    let http = reqwest::Client::new();

    let health = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let body: serde_json::Value = health.json().await.unwrap();
    assert_eq!(body["status"], "ok");

    let missing = http.get(format!("{base}/nope")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    let body: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");

    // The route is probed within its first interval; wait for the row, bounded.
    let route = RouteId::new("sim", "r1", "m1");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let outcome = loop {
        let reader = running.store.reader().unwrap();
        if let Some(o) = reader
            .recent_outcomes(&route, 1)
            .unwrap()
            .into_iter()
            .next()
        {
            break o;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no probe recorded in 15 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(outcome.success, "{outcome:?}");
    assert_eq!(outcome.verified, Some(true));

    // Detection saw it too: the snapshot is no longer the initial one (UNKNOWN, no outcome
    // yet) — the route has a success ratio. Bounded wait: the recorder stores, then forwards.
    let mut health = running.health.clone();
    let status = tokio::time::timeout(
        Duration::from_secs(15),
        health.wait_for(|s| s.route(&route).is_some_and(|r| r.success_ratio.is_some())),
    )
    .await
    .expect("detection judged the probes within 15 s")
    .unwrap()
    .route(&route)
    .unwrap()
    .clone();
    assert_eq!(status.success_ratio, Some(1.0));
    assert!(
        matches!(status.state, State::Unknown | State::Normal),
        "{status:?}"
    );

    // Ready once the scheduler, retention and health jobs have beaten.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
        if ready.status() == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ready: {}",
            ready.text().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    shutdown.cancel();
    let stopped = tokio::time::timeout(app::DRAIN_TIMEOUT + Duration::from_secs(2), running.done)
        .await
        .expect("shutdown drains within its bound")
        .unwrap();
    assert!(stopped.is_ok(), "{stopped:?}");
    assert!(
        http.get(format!("{base}/healthz")).send().await.is_err(),
        "the listener is closed after shutdown"
    );
}
