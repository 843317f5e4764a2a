//! Two `probeok serve` processes on one database form a pair: one leads (the lease on the
//! PostgreSQL server of `PROBEOK_TEST_PG_URL`), `kill -9` of the leader — or a leader that
//! hangs (`SIGSTOP`) — hands the lead to the other within `lease` + 5 s, probes go on once per interval (not twice while both run), and
//! the old leader, started again, comes back as a follower.
//!
//! The outcomes both processes write go to one store named by `[storage]`; the simulated
//! provider they probe runs in this test on a real socket. Real processes, real time: every
//! wait polls with a deadline.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster::Db;
use probeok::route::RouteId;
use probeok::sim::{self, Scenario, SimConfig, SimRoute};
use probeok::store::sql::PgUrl;
use probeok::store::{Store, StoreLocation, StoreOptions};
use tokio_util::sync::CancellationToken;

const LEASE_S: u64 = 3;
/// What the members read their database URL from (set on the child processes only).
const URL_VAR: &str = "PROBEOK_PAIR_DATABASE_URL";

use common::free_port;

fn write_config(
    dir: &Path,
    name: &str,
    port: u16,
    db: &Path,
    sim: std::net::SocketAddr,
) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::create_dir_all(dir.join("no-sets")).unwrap();
    let body = format!(
        r#"
[server]
listen = "127.0.0.1:{port}"

[storage]
path = "{db}"
url_env = "{URL_VAR}"

[cluster]
lease = "{LEASE_S}s"

[probe]
interval = "1s"
timeout = "900ms"
first_byte_timeout = "800ms"

[drift]
sets = "{sets}"

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
        sets = dir.join("no-sets").display(),
        base = sim::base_url(sim, "sim", "r1"),
    );
    std::fs::write(&path, body).unwrap();
    path
}

struct Member {
    child: Child,
    base: String,
}

fn start(config: &Path, port: u16, url: &str, log: &Path) -> Member {
    let log = std::fs::File::create(log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_probeok"))
        .args(["serve", "--config"])
        .arg(config)
        .env_remove("PROBEOK_CONFIG")
        .env(URL_VAR, url)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start probeok serve");
    Member {
        child,
        base: format!("http://127.0.0.1:{port}"),
    }
}

/// The member's `role` from `/readyz`, `None` while it does not answer.
async fn role(http: &reqwest::Client, m: &Member) -> Option<String> {
    let r = http.get(format!("{}/readyz", m.base)).send().await.ok()?;
    let v: serde_json::Value = r.json().await.ok()?;
    v["role"].as_str().map(str::to_owned)
}

async fn until_role(http: &reqwest::Client, m: &Member, want: &str, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if role(http, m).await.as_deref() == Some(want) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{} did not become {want} within {within:?}",
            m.base
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn probes_between(
    store: &Store,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> usize {
    let route = RouteId::new("sim", "r1", "m1");
    store
        .reader()
        .unwrap()
        .recent_outcomes(&route, 100_000)
        .unwrap()
        .into_iter()
        .filter(|o| o.started_at >= from && o.started_at < to)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_leader_hands_the_lead_over_and_probing_goes_on_once() {
    let db = Db::create().await;
    let dir = tempfile::tempdir().unwrap();
    let sim_stop = CancellationToken::new();
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
        sim_stop.clone(),
    ));
    // Both members' store is the PostgreSQL database their `url_env` names (`path` is then
    // ignored); the schema first, so both open a migrated store.
    let store_path = dir.path().join("ignored.db");
    let location = StoreLocation::Postgres(PgUrl::parse(&db.url).unwrap().unwrap());
    Store::open_at(&location, StoreOptions::default())
        .unwrap()
        .close()
        .await
        .unwrap();
    let (pa, pb) = (free_port(), free_port());
    let ca = write_config(dir.path(), "a", pa, &store_path, sim_addr);
    let cb = write_config(dir.path(), "b", pb, &store_path, sim_addr);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();

    let mut a = start(&ca, pa, &db.url, &dir.path().join("a.log"));
    until_role(&http, &a, "leader", Duration::from_secs(20)).await;
    let b = start(&cb, pb, &db.url, &dir.path().join("b.log"));
    until_role(&http, &b, "follower", Duration::from_secs(20)).await;

    let store = Store::open_at(&location, StoreOptions::default()).unwrap();
    // Both run, one probes.
    let t0 = chrono::Utc::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let both = probes_between(&store, t0, chrono::Utc::now());
    assert_eq!(role(&http, &a).await.as_deref(), Some("leader"));
    assert_eq!(role(&http, &b).await.as_deref(), Some("follower"));

    // kill -9 the leader.
    a.child.kill().unwrap();
    let _ = a.child.wait();
    let took = until_role(&http, &b, "leader", Duration::from_secs(LEASE_S + 5)).await;
    println!("takeover after kill -9 of the leader process: {took:?}");

    // The new leader probes, at the same rate.
    let t1 = chrono::Utc::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = probes_between(&store, t1, chrono::Utc::now());
    assert!(
        both >= 2 && after >= 2,
        "probes went on: {both} then {after}"
    );
    assert!(
        both * 2 <= after * 3 && after * 2 <= both * 3,
        "one member probes at a time: {both} in 5 s with both running, {after} in 5 s after the takeover"
    );

    // The old leader comes back as a follower.
    let a = start(&ca, pa, &db.url, &dir.path().join("a2.log"));
    until_role(&http, &a, "follower", Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(LEASE_S * 1000)).await;
    assert_eq!(role(&http, &a).await.as_deref(), Some("follower"));
    assert_eq!(role(&http, &b).await.as_deref(), Some("leader"));

    // Four more takeovers, each way in turn, for the median of five.
    let mut times = vec![took];
    let (mut leader, mut follower) = (b, a);
    let mut configs = [(cb, pb), (ca, pa)];
    for round in 0..4 {
        leader.child.kill().unwrap();
        let _ = leader.child.wait();
        times.push(until_role(&http, &follower, "leader", Duration::from_secs(LEASE_S + 5)).await);
        let (config, port) = &configs[0];
        let back = start(
            config,
            *port,
            &db.url,
            &dir.path().join(format!("back{round}.log")),
        );
        until_role(&http, &back, "follower", Duration::from_secs(20)).await;
        configs.swap(0, 1);
        (leader, follower) = (follower, back);
    }
    let mut sorted = times.clone();
    sorted.sort();
    println!(
        "takeover times after kill -9 of the leader process: {times:?}; median {:?}",
        sorted[2]
    );

    for mut m in [leader, follower] {
        let _ = m.child.kill();
        let _ = m.child.wait();
    }
    let _ = store.close().await;
    sim_stop.cancel();
    db.drop_now().await;
}

/// A hung leader keeps its TCP connection (its kernel answers keepalives): the lead passes
/// only because the server ends a lease session that asks nothing for the lease. Resumed,
/// the old leader finds its session gone and serves as a follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_hangs_hands_the_lead_over() {
    let db = Db::create().await;
    let dir = tempfile::tempdir().unwrap();
    let sim_stop = CancellationToken::new();
    let sim_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim_addr = sim_listener.local_addr().unwrap();
    let routes = vec![SimRoute {
        provider: "sim".into(),
        region: "r1".into(),
        model: "m1".into(),
        scenario: Scenario::Healthy,
    }];
    let config = SimConfig {
        routes,
        time_scale: 1.0,
        seed: 7,
    };
    tokio::spawn(sim::serve(sim_listener, config, sim_stop.clone()));
    let store_path = dir.path().join("ignored.db");
    let (pa, pb) = (free_port(), free_port());
    let ca = write_config(dir.path(), "a", pa, &store_path, sim_addr);
    let cb = write_config(dir.path(), "b", pb, &store_path, sim_addr);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut a = start(&ca, pa, &db.url, &dir.path().join("a.log"));
    until_role(&http, &a, "leader", Duration::from_secs(30)).await;
    let mut b = start(&cb, pb, &db.url, &dir.path().join("b.log"));
    until_role(&http, &b, "follower", Duration::from_secs(30)).await;

    let pid = a.child.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let took = until_role(&http, &b, "leader", Duration::from_secs(LEASE_S + 5)).await;
    println!("takeover from a hung leader: {took:?}");
    unsafe { libc::kill(pid, libc::SIGCONT) };
    until_role(&http, &a, "follower", Duration::from_secs(10)).await;
    assert_eq!(role(&http, &b).await.as_deref(), Some("leader"));

    for m in [&mut a, &mut b] {
        let _ = m.child.kill();
        let _ = m.child.wait();
    }
    sim_stop.cancel();
    db.drop_now().await;
}
