//! A real HAProxy (Debian's, named by `PROBEOK_HAPROXY`) with `docs/routers/haproxy.cfg`,
//! addresses substituted, asks the monitor's agent-check responder about each server's route:
//! traffic splits by the weights, leaves a CRITICAL replica within the agent interval plus
//! 2 s and returns when it heals — read from the replicas' hit counts and from HAProxy's
//! `show servers state`. And the responder's answers to lines that are not right.
//!
//! `PROBEOK_FLIPS=20 cargo test --test haproxy flips -- --nocapture` measures the time from a
//! route's transition to HAProxy acting on it over 20 flips (3 by default).

mod common;

use std::time::Duration;

use common::pool::{self, Child, Pool, Traffic};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

const CONFIG: &str = include_str!("../docs/routers/haproxy.cfg");
/// The config's `agent-inter`.
const INTER: Duration = Duration::from_millis(500);

struct Haproxy {
    process: Child,
    url: String,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    fn start(pool: &Pool, agent: std::net::SocketAddr) -> Self {
        let binary = pool::program("PROBEOK_HAPROXY", "HAProxy");
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("haproxy.sock");
        let listen = common::free_port();
        let mut cfg = CONFIG
            .replace("/tmp/probeok-haproxy.sock", socket.to_str().unwrap())
            .replace("127.0.0.1:10080", &format!("127.0.0.1:{listen}"))
            .replace("agent-port 9403", &format!("agent-port {}", agent.port()));
        for (ip, r) in ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
            .iter()
            .zip(&pool.replicas)
        {
            cfg = cfg.replace(&format!(" {ip}:8000 "), &format!(" {} ", r.addr));
        }
        let file = dir.path().join("haproxy.cfg");
        std::fs::write(&file, cfg).unwrap();
        let process = Child::spawn(
            &binary,
            &["-db", "-f", file.to_str().unwrap()],
            dir.path().join("haproxy.log"),
        );
        Self {
            process,
            url: format!("http://127.0.0.1:{listen}/v1/chat/completions"),
            socket,
            _dir: dir,
        }
    }

    /// `show servers state qwen`: per server (a, b, c) its operational state (2 up, 0 down),
    /// admin state (0 ready, 8 drain by the agent, …) and user weight.
    async fn state(&mut self) -> Vec<(String, u32, u32, u32)> {
        self.process.alive();
        let Ok(mut s) = tokio::net::UnixStream::connect(&self.socket).await else {
            return Vec::new();
        };
        let _ = s.write_all(b"show servers state qwen\n").await;
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out.lines()
            .filter(|l| !l.starts_with('#') && l.split_whitespace().count() > 8)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight …
                Some((
                    f[3].to_owned(),
                    f[5].parse().ok()?,
                    f[6].parse().ok()?,
                    f[7].parse().ok()?,
                ))
            })
            .collect()
    }

    /// Waits until `check` holds for the servers' state (asked every 50 ms); returns when it
    /// was first seen to hold.
    async fn wait(
        &mut self,
        what: &str,
        check: impl Fn(&[(String, u32, u32, u32)]) -> bool,
    ) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.state().await;
            if !s.is_empty() && check(&s) {
                return Instant::now();
            }
            assert!(
                Instant::now() < deadline,
                "HAProxy: {what} not within 20 s: {s:?}\n{}",
                self.process.tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn server<'a>(s: &'a [(String, u32, u32, u32)], name: &str) -> &'a (String, u32, u32, u32) {
    s.iter().find(|x| x.0 == name).expect("server listed")
}

/// 70/30/0 → a up ready 100%, b up ready 43%, c drain.
fn weights_100_43_c_drained(s: &[(String, u32, u32, u32)]) -> bool {
    let (a, b, c) = (server(s, "a"), server(s, "b"), server(s, "c"));
    a.1 == 2 && a.3 == 100 && b.1 == 2 && b.3 == 43 && c.2 & 8 != 0
}

fn agent_addr() -> std::net::SocketAddr {
    format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_splits_by_the_weights_and_follows_a_replica_down_and_back() {
    let agent = agent_addr();
    let pool = Pool::start(agent).await;
    let mut haproxy = Haproxy::start(&pool, agent);
    let http = reqwest::Client::new();
    let [a, ..] = pool::route_ids();

    haproxy
        .wait("weights 100/43 and c drained", weights_100_43_c_drained)
        .await;
    let before = pool.hits();
    let ok = pool::send(&http, &haproxy.url, 2000).await;
    let after = pool.hits();
    let hits = [0, 1, 2].map(|i| after[i] - before[i]);
    assert_eq!(ok, 2000, "every request answered; hits {hits:?}");
    assert_eq!(hits[2], 0, "the drained replica got traffic: {hits:?}");
    let shares = pool::shares(hits);
    assert!(
        (shares[0] - 70.0).abs() <= 5.0 && (shares[1] - 30.0).abs() <= 5.0,
        "split {shares:?} (hits {hits:?}), not 70/30 ±5"
    );

    // CRITICAL: down on HAProxy's side, and no more traffic; healed: up again, traffic back.
    let _traffic = Traffic::start(http.clone(), haproxy.url.clone());
    let f = flip(&pool, &mut haproxy, &a).await;
    eprintln!(
        "haproxy: down {:?} and stopped {:?} after CRITICAL, up {:?} and resumed {:?} after NORMAL",
        f.down, f.off, f.up, f.on
    );
}

/// What one flip took, each from the route's transition: HAProxy's `show servers state`
/// showing the first replica's server down (`down`), its last request to it (`off`, zero when
/// none came after CRITICAL); the state showing it up again at its weight (`up`), its first
/// request to it (`on`). The state times are when a poll (every 50 ms) first saw the change.
struct Flip {
    down: Duration,
    off: Duration,
    up: Duration,
    on: Duration,
}

/// One flip of the first replica: failing until CRITICAL, down in HAProxy's state and out of
/// its traffic (asserted within the agent interval and 2 s); healed until NORMAL, up again at
/// weight 100 and back in the traffic (within a second more).
async fn flip(pool: &Pool, haproxy: &mut Haproxy, route: &probeok::route::RouteId) -> Flip {
    let critical = pool.fail_until_critical(route).await;
    let bound = INTER + Duration::from_secs(2);
    let down = haproxy
        .wait("a down", |s| server(s, "a").1 == 0)
        .await
        .saturating_duration_since(critical);
    let off = pool
        .traffic_stops(
            critical,
            bound + Duration::from_secs(1),
            "HAProxy stops sending to the CRITICAL replica",
        )
        .await;
    assert!(
        down <= bound && off <= bound,
        "HAProxy marked the CRITICAL replica down {down:?} and kept sending {off:?} after CRITICAL (bound {bound:?}); state {:?}",
        haproxy.state().await
    );

    let normal = pool.heal_until_normal(route).await;
    let up = haproxy
        .wait("a up again", |s| {
            server(s, "a").1 == 2 && server(s, "a").3 == 100
        })
        .await
        .saturating_duration_since(normal);
    let on = pool
        .traffic_returns(
            normal,
            bound + Duration::from_secs(1),
            "traffic returns to the healed replica",
        )
        .await;
    assert!(
        up <= bound + Duration::from_secs(1),
        "HAProxy took {up:?} after NORMAL to mark the healed replica up (bound {:?})",
        bound + Duration::from_secs(1)
    );
    Flip { down, off, up, on }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flips_transition_to_haproxy_acting() {
    let flips = pool::flips();
    let agent = agent_addr();
    let pool = Pool::start(agent).await;
    let mut haproxy = Haproxy::start(&pool, agent);
    let http = reqwest::Client::new();
    let [a, ..] = pool::route_ids();
    haproxy
        .wait("weights 100/43 and c drained", weights_100_43_c_drained)
        .await;
    let _traffic = Traffic::start(http.clone(), haproxy.url.clone());
    let mut f = Vec::new();
    for _ in 0..flips {
        f.push(flip(&pool, &mut haproxy, &a).await);
    }
    let all = |g: fn(&Flip) -> Duration| f.iter().map(g).collect::<Vec<_>>();
    eprintln!(
        "haproxy over {flips} flips: {}; {}; {}; {}",
        pool::p50_p99_ms("CRITICAL -> last request", &all(|f| f.off)),
        pool::p50_p99_ms("CRITICAL -> state down", &all(|f| f.down)),
        pool::p50_p99_ms("NORMAL -> first request", &all(|f| f.on)),
        pool::p50_p99_ms("NORMAL -> state up", &all(|f| f.up)),
    );
}

/// Sends `bytes` on a fresh agent connection and reads the answer until the responder closes.
async fn ask(agent: std::net::SocketAddr, bytes: &[u8], half_close: bool) -> String {
    let mut s = tokio::net::TcpStream::connect(agent).await.unwrap();
    let _ = s.write_all(bytes).await;
    if half_close {
        s.shutdown().await.unwrap();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_answers_each_route_and_refuses_bad_lines() {
    let agent = agent_addr();
    let _pool = Pool::start(agent).await;
    assert_eq!(
        ask(agent, b"selfhosted/a/qwen2.5-72b\n", false).await,
        "up ready 100%\n"
    );
    assert_eq!(
        ask(agent, b"selfhosted/b/qwen2.5-72b\r\n", false).await,
        "up ready 43%\n"
    );
    assert_eq!(
        ask(agent, b"selfhosted/c/qwen2.5-72b\n", false).await,
        "drain\n"
    );
    assert_eq!(
        ask(agent, b"nobody/x/y\n", false).await,
        "maint #unknown route\n"
    );
    // No newline before the end, 10 KiB, not UTF-8: maint with the reason, never a hang.
    let no_newline = ask(agent, b"selfhosted/a/qwen2.5-72b", true).await;
    assert!(
        no_newline.starts_with("maint #bad request"),
        "{no_newline:?}"
    );
    let long = ask(agent, &vec![b'a'; 10 * 1024], false).await;
    assert!(
        long.is_empty() || long.starts_with("maint #bad request"),
        "{long:?}"
    );
    let binary = ask(agent, b"\xff\xfe\n", false).await;
    assert!(binary.starts_with("maint #bad request"), "{binary:?}");
    // And it still answers.
    assert_eq!(
        ask(agent, b"selfhosted/a/qwen2.5-72b\n", false).await,
        "up ready 100%\n"
    );
}
