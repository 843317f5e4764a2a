//! A monitor's role drives its work (`probeok serve` in-process on SQLite, the role watch
//! driven by the test, the simulated provider on a real socket): a follower neither probes
//! nor judges but serves what is stored, says `follower` in `/readyz`, `/api/v1/status` and
//! `probeok_cluster_leader`; becoming leader starts the scheduler, losing it stops it, and
//! regaining it resumes it.
//!
//! Real time (real sockets, the system clock): every wait polls with a deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use probeok::app::{self, StartOptions};
use probeok::clock::SystemClock;
use probeok::cluster::Role;
use probeok::config::Config;
use probeok::health::{Detector, RouteHealth, State};
use probeok::route::RouteId;
use probeok::sim::{self, Scenario, SimConfig, SimRoute};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_secs(1);

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
interval = "1s"
timeout = "900ms"
first_byte_timeout = "800ms"
jitter = 0.0

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

fn route() -> RouteId {
    RouteId::new("sim", "r1", "m1")
}

struct Member {
    running: app::Running,
    role: watch::Sender<Role>,
    base: String,
    http: reqwest::Client,
    shutdown: CancellationToken,
}

async fn member(db: &std::path::Path, sim: std::net::SocketAddr, first: Role) -> Member {
    let shutdown = CancellationToken::new();
    let (role, role_rx) = watch::channel(first);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::start_with(
        config_for(sim, db),
        listener,
        Arc::new(SystemClock),
        shutdown.clone(),
        StartOptions {
            role: Some(role_rx),
            ..StartOptions::default()
        },
    )
    .await
    .unwrap();
    let base = format!("http://{}", running.addr);
    Member {
        running,
        role,
        base,
        http: reqwest::Client::new(),
        shutdown,
    }
}

impl Member {
    fn probes(&self) -> usize {
        self.running
            .store
            .reader()
            .unwrap()
            .recent_outcomes(&route(), 10_000)
            .unwrap()
            .len()
    }

    async fn json(&self, path: &str) -> serde_json::Value {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// `/readyz`, `/api/v1/status` and `/metrics` all say `role`.
    async fn says(&self, role: Role) {
        assert_eq!(self.json("/readyz").await["role"], role.as_str());
        assert_eq!(self.json("/api/v1/status").await["role"], role.as_str());
        let gauge = format!("probeok_cluster_leader {}", i64::from(role.is_leader()));
        let m = self.metrics().await;
        assert!(m.contains(&gauge), "no {gauge:?} in:\n{m}");
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(15), self.running.done)
            .await
            .expect("the member stops within its drain")
            .unwrap()
            .unwrap();
    }
}

async fn until<F: FnMut() -> bool>(within: Duration, what: &str, mut f: F) -> Duration {
    let start = Instant::now();
    loop {
        if f() {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_runs_only_while_the_member_leads() {
    let dir = tempfile::tempdir().unwrap();
    let shutdown_sim = CancellationToken::new();
    let sim = start_sim(shutdown_sim.clone()).await;
    let m = member(&dir.path().join("roles.db"), sim, Role::Follower).await;

    // A follower: nothing is probed over several intervals.
    tokio::time::sleep(INTERVAL * 3).await;
    assert_eq!(m.probes(), 0, "a follower probed");
    m.says(Role::Follower).await;

    // Leader: the scheduler starts, and detection judges what it stores.
    m.role.send_replace(Role::Leader);
    until(Duration::from_secs(10), "probes once leading", || {
        m.probes() >= 2
    })
    .await;
    let mut health = m.running.health.clone();
    tokio::time::timeout(
        Duration::from_secs(10),
        health.wait_for(|s| s.route(&route()).is_some_and(|r| r.success_ratio.is_some())),
    )
    .await
    .expect("detection judged the leader's probes")
    .unwrap();
    m.says(Role::Leader).await;

    // Follower again: probing stops (one in flight may still land).
    m.role.send_replace(Role::Follower);
    tokio::time::sleep(INTERVAL + Duration::from_millis(500)).await;
    let stopped_at = m.probes();
    tokio::time::sleep(INTERVAL * 3).await;
    assert_eq!(m.probes(), stopped_at, "a follower kept probing");
    m.says(Role::Follower).await;

    // Leader once more: probing resumes.
    m.role.send_replace(Role::Leader);
    until(Duration::from_secs(10), "probes resume", || {
        m.probes() >= stopped_at + 2
    })
    .await;
    m.says(Role::Leader).await;

    m.stop().await;
    shutdown_sim.cancel();
}

/// What the leader stores, a follower shows within 2 s: here a SWITCHED overlay written to
/// the route's stored state (as the leader's detection saves it) appears in the follower's
/// `/api/v1/status`, and its removal too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_status_follows_the_stored_health_within_two_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let shutdown_sim = CancellationToken::new();
    let sim = start_sim(shutdown_sim.clone()).await;
    let db = dir.path().join("follow.db");
    let m = member(&db, sim, Role::Follower).await;
    let state_of = |v: &serde_json::Value| v["routes"][0]["state"].as_str().map(str::to_owned);
    assert_eq!(
        state_of(&m.json("/api/v1/status").await).as_deref(),
        Some("UNKNOWN")
    );

    let config = config_for(sim, &db);
    let detector = Detector::new(&config.detection);
    for (switched, shown) in [(true, "SWITCHED"), (false, "UNKNOWN")] {
        let mut h: RouteHealth = detector.route(route(), chrono::Utc::now());
        h.set_switched(switched);
        assert_eq!(
            h.display_state(),
            if switched {
                State::Switched
            } else {
                State::Unknown
            }
        );
        m.running
            .store
            .writer()
            .save_health(&[h], chrono::Utc::now())
            .await
            .unwrap();
        let saved = Instant::now();
        loop {
            if state_of(&m.json("/api/v1/status").await).as_deref() == Some(shown) {
                break;
            }
            assert!(
                saved.elapsed() < Duration::from_secs(2),
                "the follower did not show {shown} within 2 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The weights feed follows the same health.
        let weights = m.json("/api/v1/weights").await;
        assert!(weights.is_object(), "{weights}");
    }
    // It never probed.
    assert_eq!(m.probes(), 0);
    m.stop().await;
    shutdown_sim.cancel();
}
