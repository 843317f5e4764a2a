//! A pool of three self-hosted model servers behind a real proxy (Envoy, HAProxy) that
//! follows the monitor: the replicas on 127.0.0.1, 127.0.0.2 and 127.0.0.3, the monitor
//! probing each as a route of one logical model (`qwen`, configured weights 70/30/0), and the
//! helpers both proxies' tests share — traffic through the proxy, per-replica hit counts with
//! their times, the external programs found through the environment `scripts/test` sets.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use probeok::app::{self, Running};
use probeok::clock::SystemClock;
use probeok::config::Config;
use probeok::health::State as RouteState;
use probeok::route::RouteId;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::upstream::{json, openai, Script};

/// The header the tests' own traffic carries, so a replica tells it from the monitor's probes.
pub const CLIENT_HEADER: &str = "x-pool-client";
/// The configured weights of the three replicas.
pub const WEIGHTS: [u8; 3] = [70, 30, 0];

/// One OpenAI-compatible model server (`POST /v1/chat/completions`, as vLLM, SGLang and TGI
/// serve it: https://platform.openai.com/docs/api-reference/chat/create): streams `PROBE_OK`,
/// or answers 503 with OpenAI's error body while `failing`. Every request of the tests'
/// traffic is counted with its time.
pub struct Replica {
    pub addr: SocketAddr,
    pub failing: Arc<AtomicBool>,
    hits: Arc<Mutex<Vec<Instant>>>,
    _server: super::upstream::Server,
}

#[derive(Clone)]
struct ReplicaState {
    failing: Arc<AtomicBool>,
    hits: Arc<Mutex<Vec<Instant>>>,
}

async fn chat(State(s): State<ReplicaState>, headers: HeaderMap) -> Response {
    if headers.contains_key(CLIENT_HEADER) {
        s.hits.lock().unwrap().push(Instant::now());
    }
    if s.failing.load(Ordering::SeqCst) {
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            openai::error("overloaded", "server_error", None),
        );
    }
    Script::new()
        .send_all(openai::stream(&["PROBE_OK"], "stop", Some(3)))
        .sse()
        .into_response()
}

impl Replica {
    /// A replica on `ip` (a loopback address), on a port of its own.
    pub async fn start(ip: &str) -> Self {
        let failing = Arc::new(AtomicBool::new(false));
        let hits = Arc::new(Mutex::new(Vec::new()));
        let router = Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(ReplicaState {
                failing: failing.clone(),
                hits: hits.clone(),
            });
        let listener = tokio::net::TcpListener::bind(format!("{ip}:0"))
            .await
            .unwrap_or_else(|e| panic!("bind {ip}:0: {e}"));
        let addr = listener.local_addr().unwrap();
        let handle = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            addr,
            failing,
            hits,
            _server: super::upstream::Server::from_parts(addr, handle),
        }
    }

    /// Traffic requests received so far.
    pub fn hits(&self) -> usize {
        self.hits.lock().unwrap().len()
    }

    /// Traffic requests received after `t`.
    pub fn hits_since(&self, t: Instant) -> usize {
        self.hits.lock().unwrap().iter().filter(|h| **h > t).count()
    }

    /// The first traffic request after `t`.
    pub fn first_hit_after(&self, t: Instant) -> Option<Instant> {
        self.hits.lock().unwrap().iter().find(|h| **h > t).copied()
    }

    /// When the last traffic request arrived.
    pub fn last_hit(&self) -> Option<Instant> {
        self.hits.lock().unwrap().last().copied()
    }
}

/// The three replicas' route ids, in order.
pub fn route_ids() -> [RouteId; 3] {
    ["a", "b", "c"].map(|r| RouteId::new("selfhosted", r, "qwen2.5-72b"))
}

/// The monitor and its pool.
pub struct Pool {
    pub replicas: [Replica; 3],
    pub running: Running,
    pub monitor: SocketAddr,
    pub shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The monitor's config: fast probes and a fast detector (a failing replica is CRITICAL within
/// about 2 s, a healed one NORMAL again within about 5 s), one `[[envoy.cluster]]` over the
/// pool and the agent-check responder on `agent`.
fn config(db: &Path, replicas: &[Replica; 3], agent: SocketAddr) -> Config {
    let mut src = format!(
        r#"
[storage]
path = "{db}"

[probe]
interval = "200ms"
timeout = "1s"
first_byte_timeout = "500ms"
jitter = 0.0

[detection]
min_samples = 3
degraded_after = 2
error_window = "3s"
min_error_samples = 5
min_failures = 3
critical_after = "1s"
critical_degraded_for = "2s"
recover_after = "2s"

[haproxy]
agent_listen = "{agent}"

[[envoy.cluster]]
name = "vllm-qwen"
routes = ["selfhosted/*/qwen2.5-72b"]

[[provider]]
id = "selfhosted"
kind = "openai"
"#,
        db = db.display()
    );
    for (r, replica) in ["a", "b", "c"].iter().zip(replicas) {
        src += &format!(
            "  [[provider.region]]\n  id = \"{r}\"\n  base_url = \"http://{}/v1\"\n",
            replica.addr
        );
    }
    for (r, w) in ["a", "b", "c"].iter().zip(WEIGHTS) {
        src += &format!(
            "[[route]]\nprovider = \"selfhosted\"\nregion = \"{r}\"\nmodel = \"qwen2.5-72b\"\nserves = \"qwen\"\ntier = \"primary\"\nweight = {w}\n"
        );
    }
    Config::parse(&src, "pool.toml")
        .expect("valid pool config")
        .config
}

impl Pool {
    /// Three replicas and the monitor (with its agent-check responder on `agent`).
    pub async fn start(agent: SocketAddr) -> Self {
        let replicas = [
            Replica::start("127.0.0.1").await,
            Replica::start("127.0.0.2").await,
            Replica::start("127.0.0.3").await,
        ];
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(&dir.path().join("pool.db"), &replicas, agent);
        let shutdown = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let running = app::start(cfg, listener, Arc::new(SystemClock), shutdown.clone())
            .await
            .unwrap();
        let monitor = running.addr;
        Self {
            replicas,
            running,
            monitor,
            shutdown,
            _dir: dir,
        }
    }

    /// Waits until detection holds `route` in `state`; returns when it saw it.
    pub async fn wait_state(
        &self,
        route: &RouteId,
        want: &[RouteState],
        within: Duration,
    ) -> Instant {
        let mut health = self.running.health.clone();
        tokio::time::timeout(
            within,
            health.wait_for(|s| s.route(route).is_some_and(|r| want.contains(&r.state))),
        )
        .await
        .unwrap_or_else(|_| panic!("{route} not in {want:?} within {within:?}"))
        .unwrap();
        Instant::now()
    }

    /// The replicas' traffic hits so far.
    pub fn hits(&self) -> [usize; 3] {
        [0, 1, 2].map(|i| self.replicas[i].hits())
    }

    /// The first half of a flip: the first replica's probes fail until `route` is CRITICAL;
    /// returns when detection saw it.
    pub async fn fail_until_critical(&self, route: &RouteId) -> Instant {
        self.replicas[0].failing.store(true, Ordering::SeqCst);
        self.wait_state(route, &[RouteState::Critical], Duration::from_secs(20))
            .await
    }

    /// The second half: the first replica heals until `route` is NORMAL again; returns when
    /// detection saw it.
    pub async fn heal_until_normal(&self, route: &RouteId) -> Instant {
        self.replicas[0].failing.store(false, Ordering::SeqCst);
        self.wait_state(route, &[RouteState::Normal], Duration::from_secs(30))
            .await
    }

    /// Waits (up to `within`) until the proxy has stopped sending to the first replica — no
    /// request for 500 ms while the second keeps getting them — and returns how long after
    /// `critical` its last request came (zero when none came after it). `what` names it in
    /// the failure message.
    pub async fn traffic_stops(&self, critical: Instant, within: Duration, what: &str) -> Duration {
        let replica = &self.replicas[0];
        until(within, what, || async {
            let quiet = Instant::now() - Duration::from_millis(500);
            let others = self.replicas[1].hits_since(quiet);
            (replica.hits_since(quiet) == 0 && others > 0).then_some(())
        })
        .await;
        replica
            .last_hit()
            .unwrap_or(critical)
            .saturating_duration_since(critical)
    }

    /// Waits (up to `within`) for the first replica's first request after `normal`; returns
    /// how long after `normal` it came.
    pub async fn traffic_returns(&self, normal: Instant, within: Duration, what: &str) -> Duration {
        let first = until(within, what, || async {
            self.replicas[0].first_hit_after(normal)
        })
        .await;
        first.saturating_duration_since(normal)
    }
}

/// How many flips a flips test runs: `PROBEOK_FLIPS`, 3 by default.
pub fn flips() -> usize {
    std::env::var("PROBEOK_FLIPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// `label p50 N ms p99 N ms` of durations.
pub fn p50_p99_ms(label: &str, xs: &[Duration]) -> String {
    let (p50, p99) = p50_p99(xs.iter().map(|d| d.as_secs_f64() * 1000.0).collect());
    format!("{label} p50 {p50:.0} ms p99 {p99:.0} ms")
}

/// Sends `n` chat requests to `url` (8 at a time), each carrying [`CLIENT_HEADER`]; returns
/// how many got a 200.
pub async fn send(http: &reqwest::Client, url: &str, n: usize) -> usize {
    use futures_util::StreamExt;
    futures_util::stream::iter(0..n)
        .map(|_| one(http, url))
        .buffer_unordered(8)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await
}

/// One chat request through the proxy; whether it got a 200.
pub async fn one(http: &reqwest::Client, url: &str) -> bool {
    let body = serde_json::json!({"model": "qwen", "stream": true,
        "messages": [{"role": "user", "content": "hello"}]});
    match http
        .post(url)
        .header(CLIENT_HEADER, "1")
        .json(&body)
        .send()
        .await
    {
        Ok(r) => {
            let ok = r.status() == StatusCode::OK;
            let _ = r.bytes().await;
            ok
        }
        Err(_) => false,
    }
}

/// Keeps sending traffic to `url` (about one request each 10 ms) until dropped.
pub struct Traffic(tokio::task::JoinHandle<()>);

impl Traffic {
    pub fn start(http: reqwest::Client, url: String) -> Self {
        Self(tokio::spawn(async move {
            loop {
                one(&http, &url).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }))
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Each replica's share of `hits`, in percent.
pub fn shares(hits: [usize; 3]) -> [f64; 3] {
    let total = hits.iter().sum::<usize>().max(1) as f64;
    hits.map(|h| h as f64 * 100.0 / total)
}

/// The program an environment variable names (`scripts/test` installs it and sets the
/// variable); a clear failure when it is unset or missing.
pub fn program(var: &str, what: &str) -> PathBuf {
    let path = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: it names the {what} binary these tests run (scripts/test installs it and sets {var})")
    });
    let path = PathBuf::from(path);
    assert!(
        path.exists(),
        "{var}={} does not exist: install {what} (scripts/test does)",
        path.display()
    );
    path
}

/// A child process killed when dropped, its output kept in a file for failure messages.
pub struct Child {
    child: std::process::Child,
    pub log: PathBuf,
}

impl Child {
    pub fn spawn(program: &Path, args: &[&str], log: PathBuf) -> Self {
        let out = std::fs::File::create(&log).unwrap();
        let child = std::process::Command::new(program)
            .args(args)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        Self { child, log }
    }

    /// The end of its log, for a failure message.
    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Panics when the process has exited.
    pub fn alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the process exited ({status}):\n{}", self.tail());
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or panics with `what` after `within`.
pub async fn until<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Percentiles (p50, p99) of `xs` in milliseconds.
pub fn p50_p99(mut xs: Vec<f64>) -> (f64, f64) {
    xs.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| xs[((xs.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99))
}
