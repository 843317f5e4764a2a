//! What serving Envoy's endpoint discovery costs the monitor: 100 Envoys polling
//! `POST /v3/discovery:endpoints` (REST xDS v3) every second at 1,000 routes, in 10
//! `[[envoy.cluster]]`s of 100 routes (IP-literal base_urls 127.0.0.1–100, one port).
//!
//! The monitor runs in this process (`probeok::app::start`), probing its 1,000 routes at the
//! default 30 s interval. The model server it probes and the 100 pollers run in a child
//! process (this binary again, `XDS_BENCH_ROLE=client`), so the CPU figure — this process's
//! user + system time (`getrusage`) over the wall time of a phase, in percent of one core — is
//! the monitor's alone. Phases of `XDS_BENCH_SECONDS` each (default 30), after 5 s of warm-up:
//! idle (probing only: the reference), polling, idle again.
//!
//! Each poller is one Envoy: its own connection, one cluster (`c0`…`c9`, ten pollers each), a
//! node of `XDS_BENCH_NODE_BYTES` (default 80,000: what Envoy 1.40 sends in every REST
//! request), polls spread over the second. Its first poll has no version (a full answer,
//! before the measured phase); from then on it alternates between the version it holds (the
//! 304 path, what a settled Envoy sends) and none (a full `DiscoveryResponse` of 100
//! endpoints, about 25 KB) — half of the polls each. Latency is the poller's, from sending to
//! the last byte of the answer; p50/p99 over the polling phase.
//!
//! `cargo bench --bench xds`

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use probeok::clock::SystemClock;
use probeok::config::Config;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

const CLUSTERS: usize = 10;
const PER_CLUSTER: usize = 100;
const POLLERS: usize = 100;
const TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

fn env(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// This process's user + system CPU time so far.
fn cpu() -> Duration {
    // SAFETY: getrusage writes the struct it is given; a zeroed rusage is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// CPU over wall time since `(cpu, instant)`, in percent of one core.
fn share(since: (Duration, Instant)) -> (f64, Duration) {
    let (c, wall) = (cpu() - since.0, since.1.elapsed());
    (100.0 * c.as_secs_f64() / wall.as_secs_f64(), c)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// 10 providers (one per cluster) of 100 regions at 127.0.0.{1..100}:`port`, a route per
/// region; logical models of 10 routes.
fn config(db: &std::path::Path, port: u16) -> Config {
    let mut src = format!("[storage]\npath = \"{}\"\n", db.display());
    for c in 0..CLUSTERS {
        src += &format!("[[provider]]\nid = \"p{c}\"\nkind = \"openai\"\n");
        for r in 0..PER_CLUSTER {
            src += &format!(
                "  [[provider.region]]\n  id = \"r{r}\"\n  base_url = \"http://127.0.0.{}:{port}/v1\"\n",
                r + 1
            );
        }
    }
    for c in 0..CLUSTERS {
        for r in 0..PER_CLUSTER {
            src += &format!(
                "[[route]]\nprovider = \"p{c}\"\nregion = \"r{r}\"\nmodel = \"qwen\"\nserves = \"m{c}-{}\"\ntier = \"primary\"\nweight = {}\n",
                r / 10,
                10 + (r % 7) * 10
            );
        }
    }
    for c in 0..CLUSTERS {
        src += &format!("[[envoy.cluster]]\nname = \"c{c}\"\nroutes = [\"p{c}/*/qwen\"]\n");
    }
    Config::parse(&src, "xds-bench.toml")
        .expect("bench config")
        .config
}

fn main() {
    if std::env::var("XDS_BENCH_ROLE").as_deref() == Ok("client") {
        return client();
    }
    // As `probeok serve` does.
    probeok::malloc::tune();
    let secs = env("XDS_BENCH_SECONDS", 30);
    let node_bytes = env("XDS_BENCH_NODE_BYTES", 80_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let monitor = listener.local_addr().unwrap();
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .env("XDS_BENCH_ROLE", "client")
            .env("XDS_BENCH_MONITOR", monitor.to_string())
            .env("XDS_BENCH_NODE_BYTES", node_bytes.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the client process");
        let mut to_child = child.stdin.take().unwrap();
        let mut from_child = BufReader::new(child.stdout.take().unwrap()).lines();
        let port: u16 = expect(&mut from_child, "upstream").await.parse().unwrap();

        let dir = tempfile::tempdir().unwrap();
        let cfg = config(&dir.path().join("xds.db"), port);
        assert_eq!(cfg.envoy.clusters.len(), CLUSTERS);
        let shutdown = CancellationToken::new();
        let running = probeok::app::start(cfg, listener, Arc::new(SystemClock), shutdown.clone())
            .await
            .expect("the monitor starts");
        println!(
            "xds bench: {} routes in {CLUSTERS} [[envoy.cluster]]s of {PER_CLUSTER}, {POLLERS} pollers every 1 s, node {node_bytes} B, phases of {secs} s",
            CLUSTERS * PER_CLUSTER
        );
        tokio::time::sleep(Duration::from_secs(5)).await;

        let phase = Duration::from_secs(secs);
        let t = (cpu(), Instant::now());
        tokio::time::sleep(phase).await;
        let (idle_before, idle_before_cpu) = share(t);

        to_child.write_all(b"poll\n").await.unwrap();
        to_child.flush().await.unwrap();
        let first_round = expect(&mut from_child, "polling").await;
        let t = (cpu(), Instant::now());
        tokio::time::sleep(phase).await;
        let (polling, polling_cpu) = share(t);
        let polling_rss = rss_kib();
        to_child.write_all(b"stop\n").await.unwrap();
        to_child.flush().await.unwrap();
        let results = expect(&mut from_child, "done").await;

        let t = (cpu(), Instant::now());
        tokio::time::sleep(phase).await;
        let (idle_after, idle_after_cpu) = share(t);
        drop(to_child);
        let _ = child.wait().await;

        println!("first round (one full answer per poller, not measured): {first_round}");
        println!("polling: {results}");
        println!(
            "monitor cpu, % of one core: idle before {idle_before:.2}% ({:.2} s), polling {polling:.2}% ({:.2} s), idle after {idle_after:.2}% ({:.2} s)",
            idle_before_cpu.as_secs_f64(),
            polling_cpu.as_secs_f64(),
            idle_after_cpu.as_secs_f64()
        );
        println!(
            "xDS cost: {:.2}% of one core for {POLLERS} pollers at 1/s (polling − mean idle); monitor RSS while polling {} MiB",
            polling - (idle_before + idle_after) / 2.0,
            polling_rss / 1024
        );
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), running.done).await;
    });
}

/// The rest of the child's next line that starts with `prefix` (other lines are printed).
async fn expect(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    prefix: &str,
) -> String {
    loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("the client process ended before {prefix:?}"));
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.trim().to_owned();
        }
        println!("{line}");
    }
}

const PROBE_OK_STREAM: &str = concat!(
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"PROBE\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"_OK\"},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15}}\n\n",
    "data: [DONE]\n\n",
);

/// The model server's answer: `PROBE_OK`, or the count the throughput probe asks for.
async fn chat(body: Bytes) -> Response {
    let text = if body.windows(12).any(|w| w == b"Count from 1") {
        let numbers: Vec<String> = (1..=40).map(|n| n.to_string()).collect();
        let content = numbers.join(" ");
        format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen\",\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"{content}\"}},\"finish_reason\":\"stop\"}}]}}\n\n\
             data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen\",\"choices\":[],\"usage\":{{\"prompt_tokens\":20,\"completion_tokens\":80,\"total_tokens\":100}}}}\n\ndata: [DONE]\n\n"
        )
    } else {
        PROBE_OK_STREAM.to_owned()
    };
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from(text))
        .unwrap()
}

/// The model server on 127.0.0.1–100 at one port; returns the port.
async fn upstream() -> u16 {
    let app = Router::new().route("/v1/chat/completions", post(chat));
    'again: loop {
        let first = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        let mut listeners = vec![first];
        for i in 2..=PER_CLUSTER {
            match tokio::net::TcpListener::bind(format!("127.0.0.{i}:{port}")).await {
                Ok(l) => listeners.push(l),
                Err(_) => continue 'again,
            }
        }
        for l in listeners {
            let app = app.clone();
            tokio::spawn(async move { axum::serve(l, app).await });
        }
        return port;
    }
}

/// What one poller saw in the measured phase.
#[derive(Default)]
struct Seen {
    full_ms: Vec<f64>,
    not_modified_ms: Vec<f64>,
    errors: usize,
    /// Answers 200 to a poll that held the current version: the version moved.
    moved: usize,
}

/// A DiscoveryRequest as Envoy sends it.
fn request(cluster: &str, version: &str, node: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "version_info": version,
        "node": {"id": "envoy", "cluster": "gw", "metadata": {"pad": node}},
        "resource_names": [cluster],
        "type_url": TYPE_URL,
    }))
    .unwrap()
}

/// One poll: the status, the version of a full answer, the latency.
async fn poll(
    http: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    cluster: &str,
) -> Result<(u16, Option<String>, f64), String> {
    let t = Instant::now();
    let r = http
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let bytes = r.bytes().await.map_err(|e| e.to_string())?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    match status {
        304 if bytes.is_empty() => Ok((status, None, ms)),
        200 => {
            let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
            let cla = &v["resources"][0];
            let endpoints = cla["endpoints"][0]["lb_endpoints"]
                .as_array()
                .map_or(0, Vec::len);
            if cla["cluster_name"] != cluster || endpoints != PER_CLUSTER {
                return Err(format!("{cluster}: {endpoints} endpoints in {cla}"));
            }
            let version = v["version_info"].as_str().unwrap_or_default().to_owned();
            Ok((status, Some(version), ms))
        }
        s => Err(format!(
            "status {s}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        )),
    }
}

/// The child: the model server the monitor probes, then (on "poll") the pollers until "stop".
fn client() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let monitor: SocketAddr = std::env::var("XDS_BENCH_MONITOR").unwrap().parse().unwrap();
        let node = "x".repeat(env("XDS_BENCH_NODE_BYTES", 80_000) as usize);
        let port = upstream().await;
        let out = |line: String| {
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{line}");
            let _ = o.flush();
        };
        out(format!("upstream {port}"));
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            if l == "poll" {
                break;
            }
        }

        let url = Arc::new(format!("http://{monitor}/v3/discovery:endpoints"));
        let node = Arc::new(node);
        // The first round: one full answer per poller, its version kept.
        let mut pollers = Vec::new();
        let mut first_ms = Vec::new();
        for i in 0..POLLERS {
            let http = reqwest::Client::builder()
                .pool_max_idle_per_host(1)
                .tcp_nodelay(true)
                .build()
                .unwrap();
            let cluster = format!("c{}", i % CLUSTERS);
            let (status, version, ms) = poll(&http, &url, request(&cluster, "", &node), &cluster)
                .await
                .unwrap_or_else(|e| panic!("first poll of {cluster}: {e}"));
            assert_eq!(status, 200);
            first_ms.push(ms);
            pollers.push((http, cluster, version.unwrap()));
        }
        let stop = CancellationToken::new();
        let start = tokio::time::Instant::now() + Duration::from_millis(100);
        let cpu0 = (cpu(), Instant::now());
        let tasks: Vec<_> = pollers
            .into_iter()
            .enumerate()
            .map(|(i, (http, cluster, mut version))| {
                let (url, node, stop) = (url.clone(), node.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut seen = Seen::default();
                    // Spread over the second, as independent Envoys are.
                    let mut tick = tokio::time::interval_at(
                        start + Duration::from_millis((i * 1000 / POLLERS) as u64),
                        Duration::from_secs(1),
                    );
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    for k in 0u64.. {
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            _ = tick.tick() => {}
                        }
                        let held = k % 2 == 0;
                        let body = request(&cluster, if held { &version } else { "" }, &node);
                        match poll(&http, &url, body, &cluster).await {
                            Ok((304, _, ms)) => seen.not_modified_ms.push(ms),
                            Ok((_, v, ms)) => {
                                seen.moved += usize::from(held);
                                seen.full_ms.push(ms);
                                version = v.unwrap_or(version);
                            }
                            Err(e) => {
                                if seen.errors == 0 {
                                    eprintln!("poller {i}: {e}");
                                }
                                seen.errors += 1;
                            }
                        }
                    }
                    seen
                })
            })
            .collect();
        out(format!(
            "polling {POLLERS} full answers, p50 {:.2} ms p99 {:.2} ms",
            pct(&mut first_ms.clone(), 0.5),
            pct(&mut first_ms, 0.99)
        ));
        while let Ok(Some(l)) = lines.next_line().await {
            if l == "stop" {
                break;
            }
        }
        stop.cancel();
        let (client_cpu, _) = share(cpu0);
        let mut all = Seen::default();
        for t in tasks {
            let s = t.await.unwrap();
            all.full_ms.extend(s.full_ms);
            all.not_modified_ms.extend(s.not_modified_ms);
            all.errors += s.errors;
            all.moved += s.moved;
        }
        let mut both: Vec<f64> = all.full_ms.iter().chain(&all.not_modified_ms).copied().collect();
        let polls = both.len() + all.errors;
        out(format!(
            "done {polls} polls ({} × 200 full, {} × 304, {} errors, {} version moves); latency all p50 {:.2} ms p99 {:.2} ms, 200 p50 {:.2} ms p99 {:.2} ms, 304 p50 {:.2} ms p99 {:.2} ms; pollers' process {client_cpu:.1}% of one core",
            all.full_ms.len(),
            all.not_modified_ms.len(),
            all.errors,
            all.moved,
            pct(&mut both, 0.5),
            pct(&mut both, 0.99),
            pct(&mut all.full_ms, 0.5),
            pct(&mut all.full_ms, 0.99),
            pct(&mut all.not_modified_ms, 0.5),
            pct(&mut all.not_modified_ms, 0.99),
        ));
        // Keep serving the probes through the last idle phase, until the parent closes stdin.
        while let Ok(Some(_)) = lines.next_line().await {}
    });
}
