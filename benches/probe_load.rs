//! Scheduler + probe client + store under load, against real HTTP on loopback.
//!
//! Part 1 — sustained rate: N routes at a 1 s interval (jitter 0) against a zero-delay
//! OpenAI-compatible upstream; offered N probes/s, measured: outcomes committed per second and
//! scheduling lateness (actual start − its grid point) p50/p99.
//! Part 2 — 1,000 routes at a 30 s interval against the simulator (healthy, ~1.1 s answers) run
//! as a separate `probeok simulate` process: this process's CPU share and RSS.
//!
//! `cargo bench --bench probe_load` (set PROBE_LOAD_QUICK=1 for a short run).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use probeok::clock::SystemClock;
use probeok::config::Config;
use probeok::probe::client::ProbeClient;
use probeok::route::Route;
use probeok::scheduler::{self, SchedulerEvent, SchedulerOptions};
use probeok::store::{Store, StoreOptions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const PROBE_OK_STREAM: &str = concat!(
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"PROBE\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"_OK\"},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15}}\n\n",
    "data: [DONE]\n\n",
);

async fn zero_delay_upstream() -> std::net::SocketAddr {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from(PROBE_OK_STREAM))
                .unwrap()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// `providers` × 2 regions × 2 models routes, every region at `base_url(provider, region)`.
fn config(
    providers: usize,
    interval: &str,
    timeout: &str,
    db: &std::path::Path,
    base_url: impl Fn(usize, &str) -> String,
    models: [&str; 2],
) -> Config {
    let mut src = format!(
        "[storage]\npath = \"{}\"\n[probe]\ninterval = \"{interval}\"\ntimeout = \"{timeout}\"\nfirst_byte_timeout = \"{timeout}\"\njitter = 0.0\nthroughput_every = \"1h\"\n",
        db.display()
    );
    for p in 0..providers {
        src.push_str(&format!("[[provider]]\nid = \"p{p}\"\nkind = \"openai\"\n"));
        for r in ["r1", "r2"] {
            src.push_str(&format!(
                "  [[provider.region]]\n  id = \"{r}\"\n  base_url = \"{}\"\n",
                base_url(p, r)
            ));
        }
    }
    for p in 0..providers {
        for r in ["r1", "r2"] {
            for m in models {
                src.push_str(&format!(
                    "[[route]]\nprovider = \"p{p}\"\nregion = \"{r}\"\nmodel = \"{m}\"\nserves = \"chat\"\n"
                ));
            }
        }
    }
    Config::parse(&src, "bench.toml").unwrap().config
}

struct Run {
    committed: usize,
    elapsed: Duration,
    lateness_ms: Vec<f64>,
    skips: usize,
    failures: usize,
}

/// Runs the scheduler for `duration` and writes every outcome to a real store.
async fn run(config: &Config, duration: Duration, warmup: Duration) -> Run {
    let routes: Vec<Route> = config.routes();
    let interval = routes[0].probe.interval;
    let store = Store::open(
        &config.storage.path,
        StoreOptions {
            latency_threshold: Duration::from_secs(10),
        },
    )
    .unwrap();
    let client = ProbeClient::new(&routes, Arc::new(SystemClock)).unwrap();
    let (tx, mut rx) = mpsc::channel(4096);
    let shutdown = CancellationToken::new();
    let sched = tokio::spawn(scheduler::run(
        routes.into_iter().map(Arc::new).collect(),
        Arc::new(client),
        Arc::new(SystemClock),
        tx,
        SchedulerOptions {
            max_concurrency: 256,
            ..SchedulerOptions::default()
        },
        shutdown.clone(),
    ));
    let writer = store.writer();
    let started = Instant::now();
    let mut first_start: HashMap<String, (chrono::DateTime<chrono::Utc>, u32)> = HashMap::new();
    let mut lateness_ms = Vec::new();
    let (mut committed, mut skips, mut failures) = (0, 0, 0);
    let mut pending = tokio::task::JoinSet::new();
    let deadline = tokio::time::sleep(duration);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            ev = rx.recv() => match ev {
                Some(SchedulerEvent::Outcome(o)) => {
                    let entry = first_start.entry(o.route.to_string()).or_insert((o.started_at, 0));
                    let expected = entry.0 + chrono::Duration::from_std(interval * entry.1).unwrap();
                    entry.1 += 1;
                    if started.elapsed() > warmup {
                        lateness_ms.push((o.started_at - expected).num_microseconds().unwrap() as f64 / 1000.0);
                        failures += usize::from(!o.success);
                        let w = writer.clone();
                        pending.spawn(async move { w.record(o).await.unwrap() });
                        committed += 1;
                    }
                    while pending.try_join_next().is_some() {}
                }
                Some(SchedulerEvent::Skipped { .. }) => skips += 1,
                Some(SchedulerEvent::Heartbeat { .. }) => {}
                None => break,
            }
        }
    }
    while pending.join_next().await.is_some() {}
    let elapsed = started.elapsed().saturating_sub(warmup);
    shutdown.cancel();
    drop(rx);
    let _ = sched.await;
    store.close().await.unwrap();
    Run {
        committed,
        elapsed,
        lateness_ms,
        skips,
        failures,
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// (utime + stime) of this process, and its resident set size, from /proc.
fn cpu_and_rss() -> (Duration, u64, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11).and_then(|x| x.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|x| x.parse().ok()).unwrap_or(0);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|x| x.parse().ok())
            .unwrap_or(0)
    };
    (
        Duration::from_millis(ticks * 10),
        kb("VmRSS:"),
        kb("VmHWM:"),
    )
}

fn main() {
    // As `probeok serve` does: the RSS figure is the product's.
    probeok::malloc::tune();
    let quick = std::env::var_os("PROBE_LOAD_QUICK").is_some();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        // Part 2 first: its RSS is then not what part 1's higher rates left behind.
        println!("part 2: 1,000 routes, 30 s interval, against `probeok simulate` (healthy) in its own process");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut sim = std::process::Command::new(env!("CARGO_BIN_EXE_probeok"))
            .args(["simulate", "--listen", &format!("127.0.0.1:{port}"), "--scenario", "healthy"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let sim_addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(sim_addr).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let db = dir.path().join("sim1000.db");
        let cfg = config(
            250,
            "30s",
            "20s",
            &db,
            |_, r| probeok::sim::base_url(sim_addr, "sim", r),
            ["sim-large", "sim-small"],
        );
        let (total, warmup) = if quick { (40, 32) } else { (95, 35) };
        let cpu_task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(warmup)).await;
            let (c0, _, _) = cpu_and_rss();
            let t0 = Instant::now();
            tokio::time::sleep(Duration::from_secs(total - warmup - 2)).await;
            let (c1, rss, hwm) = cpu_and_rss();
            (c1 - c0, t0.elapsed(), rss, hwm)
        });
        let mut r = run(&cfg, Duration::from_secs(total), Duration::from_secs(warmup)).await;
        let (cpu, wall, rss, hwm) = cpu_task.await.unwrap();
        let _ = sim.kill();
        let _ = sim.wait();
        println!(
            "committed {:.1}/s (expected {:.1}/s), failures {}, skips {}, lateness p50 {:.1} ms p99 {:.1} ms",
            r.committed as f64 / r.elapsed.as_secs_f64(),
            1000.0 / 30.0,
            r.failures,
            r.skips,
            pct(&mut r.lateness_ms, 0.5),
            pct(&mut r.lateness_ms, 0.99),
        );
        println!(
            "cpu {:.1}% of one core over {:.0} s steady state; rss {} MiB (peak {} MiB)",
            100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
            wall.as_secs_f64(),
            rss / 1024,
            hwm / 1024
        );

        let upstream = zero_delay_upstream().await;
        println!("\npart 1: offered load against a zero-delay upstream (1 s interval, jitter 0)");
        println!("routes  offered/s  committed/s  lateness_p50_ms  lateness_p99_ms  skips  failures");
        let sizes: &[usize] = if quick { &[100, 250] } else { &[250, 1000, 2000, 4000] };
        for (i, &routes) in sizes.iter().enumerate() {
            let db = dir.path().join(format!("load{i}.db"));
            let cfg = config(routes / 4, "1s", "900ms", &db, |_, _| format!("http://{upstream}/v1"), ["m1", "m2"]);
            let secs = if quick { 4 } else { 10 };
            let mut r = run(&cfg, Duration::from_secs(secs + 2), Duration::from_secs(2)).await;
            println!(
                "{routes:>6}  {routes:>9}  {:>11.0}  {:>15.1}  {:>15.1}  {:>5}  {:>8}",
                r.committed as f64 / r.elapsed.as_secs_f64(),
                pct(&mut r.lateness_ms, 0.5),
                pct(&mut r.lateness_ms, 0.99),
                r.skips,
                r.failures,
            );
        }

    });
}
