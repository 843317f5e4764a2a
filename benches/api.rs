//! Publishing benchmark at 1,000 routes: `/api/v1/status` latency over a real socket with a
//! real store full of rollups, the weights snapshot build time, and SSE fan-out latency to
//! 1,000 subscribers (`BENCH_SUBSCRIBERS` sets another count; they run in a process of their
//! own, so 10,000 fit under a descriptor limit of 20,000). `cargo bench --bench api`
//!
//! Store contents: for every route, 30 days of hourly probes (rollups at every granularity)
//! plus the last hour at the default 30 s interval with a throughput probe every 5 minutes —
//! about 850,000 outcomes. Prints medians (and min–max).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Duration as D, Utc};
use probeok::clock::ManualClock;
use probeok::config::Config;
use probeok::health::{HealthSnapshot, Reason, RouteStatus, State};
use probeok::probe::outcome::{OutcomeKind, ProbeOutcome};
use probeok::route::{Route, RouteId};
use probeok::secret::Secret;
use probeok::store::{Store, StoreOptions};
use probeok::web::{self, AppState, Metrics, SnapshotIncidents};
use probeok::weights::{self, Policy, Weights};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

#[path = "shared/fleet.rs"]
mod fleet;

const ROUTES: usize = 1000;

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn config(db: &std::path::Path) -> Config {
    fleet::config(db, ROUTES, |i| 10 + (i % 7) * 10)
}

fn outcome(
    rng: &mut StdRng,
    route: &RouteId,
    kind: OutcomeKind,
    at: DateTime<Utc>,
) -> ProbeOutcome {
    let ok = !rng.gen_ratio(1, 50);
    let total_ms = rng.gen_range(250.0..1800.0);
    ProbeOutcome {
        route: route.clone(),
        kind,
        started_at: at,
        success: ok,
        attributed_to: None,
        verified: ok.then_some(true),
        ttfb_ms: Some(total_ms * 0.3),
        ttft_ms: Some(total_ms * 0.45),
        total_ms,
        output_tokens: Some(if kind == OutcomeKind::Throughput {
            79
        } else {
            3
        }),
        tokens_estimated: false,
        tokens_per_second: (kind == OutcomeKind::Throughput && ok)
            .then(|| rng.gen_range(20.0..90.0)),
        model_reported: None,
        system_fingerprint: None,
        http_status: Some(if ok { 200 } else { 503 }),
        error: (!ok).then(|| probeok::probe::ProbeError::Http {
            status: 503,
            message: "busy".into(),
        }),
        answer: None,
        first_answer_ms: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

/// Generates the history, then records it in time order, as a running service would.
async fn fill(store: &Store, routes: &[Route], now: DateTime<Utc>) -> usize {
    let mut rng = StdRng::seed_from_u64(5);
    let mut all = Vec::with_capacity(routes.len() * 840);
    for r in routes {
        for h in 1..(30 * 24) {
            all.push(outcome(
                &mut rng,
                &r.id,
                OutcomeKind::Probe,
                now - D::hours(h),
            ));
        }
        for s in 0..120 {
            let kind = if s % 10 == 0 {
                OutcomeKind::Throughput
            } else {
                OutcomeKind::Probe
            };
            let jitter = D::milliseconds(rng.gen_range(0..30_000));
            all.push(outcome(
                &mut rng,
                &r.id,
                kind,
                now - D::seconds(30 * s + 30) + jitter,
            ));
        }
    }
    all.sort_by_key(|o| o.started_at);
    let total = all.len();
    let writer = store.writer();
    let mut it = all.into_iter().peekable();
    while it.peek().is_some() {
        let batch: Vec<ProbeOutcome> = it.by_ref().take(20_000).collect();
        writer.record_many(batch).await.expect("record");
    }
    total
}

fn health(routes: &[Route], now: DateTime<Utc>, critical_every: usize) -> HealthSnapshot {
    HealthSnapshot {
        generated_at: now,
        routes: routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let bad = critical_every > 0 && i % critical_every == 0;
                RouteStatus {
                    route: r.id.clone(),
                    state: if bad { State::Critical } else { State::Normal },
                    judged: if bad { State::Critical } else { State::Normal },
                    since: now,
                    reason: bad.then(|| Reason::new("error_rate_high", "error rate 12% over 5m")),
                    failure_mode: None,
                    baseline: None,
                    success_ratio: Some(if bad { 0.5 } else { 0.99 }),
                    success_judged: true,
                    behavior_changed: false,
                    incident: None,
                    split: Default::default(),
                    cause: None,
                }
            })
            .collect(),
        findings: Vec::new(),
    }
}

/// One SSE subscription with its read buffer, kept from one event to the next: a buffer
/// made afresh for each event would have the subscribers' process fault in a gigabyte of
/// new pages at 10,000 subscribers, and the first rounds would measure that.
struct Sub {
    s: tokio::net::TcpStream,
    chunk: Vec<u8>,
}

/// Opens a raw HTTP/1.1 SSE subscription and reads until `id: {first}` arrived.
async fn subscribe(addr: std::net::SocketAddr, first: u64) -> Sub {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /api/v1/weights/stream HTTP/1.1\r\nHost: bench\r\n\r\n")
        .await
        .expect("write");
    let mut sub = Sub {
        s,
        chunk: vec![0u8; 64 * 1024],
    };
    sub.chunk.fill(1); // resident now, not during a round
    wait_for(&mut sub, &format!("id: {first}\n")).await;
    sub
}

/// Reads until the event carrying `needle` (its `id:` line) has fully arrived (the blank line
/// ending it). Only new bytes are searched, so the client costs little next to the server.
async fn wait_for(sub: &mut Sub, needle: &str) {
    let Sub { s, chunk } = sub;
    let mut tail: Vec<u8> = Vec::new();
    let mut found = false;
    loop {
        let n = s.read(chunk).await.expect("read");
        assert!(n > 0, "stream closed before {needle:?}");
        // The last bytes of the previous read plus this one, so a split needle is seen.
        let mut window = std::mem::take(&mut tail);
        window.extend_from_slice(&chunk[..n.min(4096)]);
        if !found {
            found = window.windows(needle.len()).any(|w| w == needle.as_bytes());
        }
        let end = &chunk[n.saturating_sub(16)..n];
        // An event ends with a blank line; chunked framing adds `\r\n` after it.
        if found && end.windows(2).any(|w| w == b"\n\n") {
            return;
        }
        tail = chunk[n.saturating_sub(needle.len())..n].to_vec();
    }
}

/// SSE subscribers: `BENCH_SUBSCRIBERS`, or 1,000.
fn subscribers() -> usize {
    std::env::var("BENCH_SUBSCRIBERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// The argument that makes this bench the subscribers' process: `subscribers ADDR N FIRST`.
const SUBSCRIBERS_ROLE: &str = "subscribers";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // One descriptor per subscriber on each side.
    if let Err(e) = rlimit::increase_nofile_limit(subscribers() as u64 + 4096) {
        eprintln!("could not raise RLIMIT_NOFILE: {e}");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match args.as_slice() {
        [role, addr, n, first] if role == SUBSCRIBERS_ROLE => rt.block_on(subscribe_all(
            addr.parse().expect("address"),
            n.parse().expect("count"),
            first.parse().expect("version"),
        )),
        _ => rt.block_on(run()),
    }
}

/// The subscribers' process, driven over its stdin and stdout: once all `n` are connected
/// (each has read event `first`) it says `ready`; for each `round V` it says `armed` once
/// every subscriber waits for event V, then `done` and, per subscriber, when its event
/// arrived (nanoseconds since the Unix epoch, comma-separated).
async fn subscribe_all(addr: std::net::SocketAddr, n: usize, first: u64) {
    use tokio::io::AsyncBufReadExt;
    let mut subs = Vec::with_capacity(n);
    for _ in 0..n {
        subs.push(subscribe(addr, first).await);
    }
    let mut out = tokio::io::stdout();
    out.write_all(b"ready\n").await.expect("stdout");
    out.flush().await.expect("stdout");
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await.expect("stdin") {
        let Some(version) = line.strip_prefix("round ") else {
            break;
        };
        let needle = format!("id: {version}\n");
        let tasks: Vec<_> = subs
            .drain(..)
            .map(|mut s| {
                let needle = needle.clone();
                tokio::spawn(async move {
                    wait_for(&mut s, &needle).await;
                    (std::time::SystemTime::now(), s)
                })
            })
            .collect();
        out.write_all(b"armed\n").await.expect("stdout");
        out.flush().await.expect("stdout");
        let mut at = Vec::with_capacity(n);
        for task in tasks {
            let (t, s) = task.await.expect("subscriber");
            let ns = t.duration_since(std::time::UNIX_EPOCH).expect("clock");
            at.push(ns.as_nanos().to_string());
            subs.push(s);
        }
        out.write_all(format!("done {}\n", at.join(",")).as_bytes())
            .await
            .expect("stdout");
        out.flush().await.expect("stdout");
    }
}

/// The subscribers' process, seen from the bench.
struct Subscribers {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Subscribers {
    async fn start(addr: std::net::SocketAddr, n: usize, first: u64) -> Self {
        use tokio::io::AsyncBufReadExt;
        let t = Instant::now();
        let mut child = tokio::process::Command::new(std::env::current_exe().expect("exe"))
            .args([
                SUBSCRIBERS_ROLE,
                &addr.to_string(),
                &n.to_string(),
                &first.to_string(),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("subscribers' process");
        let stdin = child.stdin.take().expect("stdin");
        let lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut me = Self {
            child,
            stdin,
            lines,
        };
        me.expect("ready").await;
        println!(
            "sse: {n} subscribers connected in {:.2} s (in a process of their own)",
            t.elapsed().as_secs_f64()
        );
        me
    }

    async fn line(&mut self) -> String {
        match self.lines.next_line().await.expect("subscribers' stdout") {
            Some(line) => line,
            None => panic!(
                "the subscribers' process ended: {:?}",
                self.child.try_wait()
            ),
        }
    }

    async fn expect(&mut self, what: &str) {
        let line = self.line().await;
        assert_eq!(line, what, "the subscribers' process");
    }

    /// Every subscriber waits for event `version` once this returns.
    async fn arm(&mut self, version: u64) {
        self.stdin
            .write_all(format!("round {version}\n").as_bytes())
            .await
            .expect("subscribers' stdin");
        self.expect("armed").await;
    }

    /// When each subscriber's event arrived.
    async fn received(&mut self) -> Vec<std::time::SystemTime> {
        let line = self.line().await;
        let list = line.strip_prefix("done ").expect("done");
        list.split(',')
            .map(|ns| std::time::UNIX_EPOCH + Duration::from_nanos(ns.parse().expect("nanos")))
            .collect()
    }
}

/// A status page per provider (components "API" → `pN/*`, "Embeddings" → `pN/r0/*`), the
/// first provider's API in a major outage with an open incident.
fn declared_extras(
    config: &Config,
    now: DateTime<Utc>,
) -> (
    probeok::declared::lead::Mapping,
    Arc<probeok::declared::judge::Declared>,
    Arc<Vec<probeok::declared::PageStatus>>,
) {
    use probeok::config::{StatusPageConfig, StatusPageKind};
    use probeok::store::declared::{DeclaredComponent, DeclaredIncident};
    let mut c = config.clone();
    let mut view = probeok::declared::judge::Declared::default();
    for p in &mut c.providers {
        let page = format!("https://status.{}.example", p.id);
        p.status_pages.push(StatusPageConfig {
            provider: p.id.clone(),
            kind: StatusPageKind::Statuspage,
            url: page.clone(),
            components: std::collections::BTreeMap::from([
                ("API".to_owned(), vec![format!("{}/*", p.id)]),
                ("Embeddings".to_owned(), vec![format!("{}/r0/*", p.id)]),
            ]),
            every: Duration::from_secs(60),
            alert: true,
        });
        for (component, status) in [("API", "operational"), ("Embeddings", "operational")] {
            let status = if p.id == "p0" && component == "API" {
                "major_outage"
            } else {
                status
            };
            view.components.push(DeclaredComponent {
                provider: p.id.clone(),
                page: page.clone(),
                component: component.into(),
                status: status.into(),
                since: now,
            });
        }
    }
    view.open.push(DeclaredIncident {
        provider: "p0".into(),
        page: "https://status.p0.example".into(),
        id: "i1".into(),
        name: "Elevated errors".into(),
        status: "investigating".into(),
        impact: Some("major".into()),
        declared_at: now,
        started_at: now,
        resolved_at: None,
        url: None,
        components: vec!["API".into()],
        seen_at: now,
    });
    let pages = c
        .providers
        .iter()
        .flat_map(|p| p.status_pages.iter())
        .map(|s| probeok::declared::PageStatus {
            provider: s.provider.clone(),
            kind: s.kind.as_str(),
            url: s.url.clone(),
            last_ok: None,
            last_error: None,
        })
        .collect();
    (
        probeok::declared::lead::Mapping::from_config(&c),
        Arc::new(view),
        Arc::new(pages),
    )
}

async fn run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("bench.db");
    let config = config(&db);
    let routes = Arc::new(config.routes());
    let now = Utc::now();
    let store = Store::open(&db, StoreOptions::default()).expect("store");
    let t = Instant::now();
    let n = fill(&store, &routes, now).await;
    println!(
        "setup: {} routes, {n} outcomes stored in {:.1} s",
        routes.len(),
        t.elapsed().as_secs_f64()
    );

    // Weights build.
    let a = health(&routes, now, 0);
    let b = health(&routes, now, 7);
    let mut compute_ms = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        std::hint::black_box(weights::compute(&weights::Inputs::new(&routes, &a)));
        compute_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut w = Weights::new(routes.clone(), Policy::default(), &a);
    let mut build_ms = Vec::new();
    let mut bytes = 0;
    for i in 0..50 {
        let t = Instant::now();
        let snap = w
            .update(if i % 2 == 0 { &b } else { &a })
            .expect("a change");
        build_ms.push(t.elapsed().as_secs_f64() * 1e3);
        bytes = snap.json.len();
    }
    let mut same_ms = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        assert!(w.update(&a).is_none());
        same_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (m, lo, hi) = median(compute_ms);
    println!(
        "weights compute (1,000 routes, 100 models): median {m:.2} ms (min {lo:.2}, max {hi:.2})"
    );
    let (m, lo, hi) = median(build_ms);
    println!("weights new version (compute + compare + serialise {bytes} B): median {m:.2} ms (min {lo:.2}, max {hi:.2})");
    let (m, lo, hi) = median(same_ms);
    println!("weights unchanged (compute + compare, no version): median {m:.2} ms (min {lo:.2}, max {hi:.2})");

    // The service around the store.
    let (health_tx, health_rx) = watch::channel(Arc::new(a.clone()));
    let shutdown = CancellationToken::new();
    let weights_rx = weights::spawn_publisher(
        weights::Feeds::new(routes.clone(), health_rx.clone()),
        shutdown.clone(),
    );
    let (passive_tx, _passive_rx) = mpsc::channel(16);
    let state = AppState {
        config: Arc::new(config.clone()).into(),
        routes: routes.clone(),
        store: store.clone(),
        clock: Arc::new(ManualClock::new(now)),
        jobs: Default::default(),
        health: health_rx,
        events: broadcast::channel(16).0,
        passive: passive_tx,
        weights: weights_rx.clone(),
        metrics: Arc::new(Metrics::new(&routes)),
        ingest_token: Some(Secret::new("bench")),
        incidents: Arc::new(SnapshotIncidents),
        drift: None,
        drills: None,
        figures: Default::default(),
        guards: Default::default(),
        shutdown: shutdown.clone(),
        vantages: None,
        xds: Default::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server_shutdown = shutdown.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, web::router(state))
            .with_graceful_shutdown(server_shutdown.cancelled_owned())
            .await
    });

    // Where a status request spends its time (in-process, one reader).
    {
        let store = store.clone();
        let routes = routes.clone();
        let a = a.clone();
        let declared = declared_extras(&config, now);
        tokio::task::spawn_blocking(move || {
            use probeok::store::Granularity;
            use probeok::web::api::{self, Figures};
            let r = store.reader().expect("reader");
            let until = now + D::milliseconds(1);
            let time = |what: &str, f: &mut dyn FnMut()| {
                let mut v = Vec::new();
                for _ in 0..7 {
                    let t = Instant::now();
                    f();
                    v.push(t.elapsed().as_secs_f64() * 1e3);
                }
                println!("  status part {what}: median {:.1} ms", median(v).0);
            };
            time("latency rollups (5 min, 1 h)", &mut || {
                r.summaries_by_route(
                    Granularity::FiveMinutes,
                    now - D::hours(1),
                    until,
                    api::LATENCY_KINDS,
                )
                .expect("q");
            });
            time("raw samples (1 h)", &mut || {
                r.recent_samples(now - D::hours(1), api::LATENCY_KINDS, api::TPS_KINDS)
                    .expect("q");
            });
            time("counts 24h", &mut || {
                r.counts_by_route(now - D::days(1), until, api::UPTIME_KINDS)
                    .expect("q");
            });
            time("counts 30d", &mut || {
                r.counts_by_route(now - D::days(30), until, api::UPTIME_KINDS)
                    .expect("q");
            });
            let figures = Figures::load(&r, now).expect("figures");
            time("compose JSON", &mut || {
                std::hint::black_box(api::status_bytes(&routes, &a, &figures, now).expect("json"));
            });
            // With a status page per provider mapping every route (two components each, one
            // open incident): what the providers' word adds to composing the answer.
            let costs = api::probe_costs(&routes, &probeok::config::CapabilityConfig::default());
            let overall = api::overall(&routes, &a);
            let readings = Default::default();
            let breakers = std::collections::HashMap::new();
            let filter = api::StatusFilter::default();
            time("compose JSON with status pages", &mut || {
                let extras = api::Extras {
                    breakers: &breakers,
                    budget: None,
                    filter: &filter,
                    role: probeok::cluster::Role::Leader,
                    overall,
                    costs: &costs,
                    sync: Vec::new(),
                    declared: Some(api::DeclaredExtras {
                        map: declared.0.clone(),
                        view: declared.1.clone(),
                        pages: declared.2.clone(),
                    }),
                    ratelimit: &readings,
                    long_prompt: false,
                };
                std::hint::black_box(
                    api::status_bytes_with(&routes, &a, &figures, now, extras).expect("json"),
                );
            });
            time("TOTAL cold (cache miss: every scan + compose)", &mut || {
                let f = Figures::load(&r, now).expect("figures");
                std::hint::black_box(api::status_bytes(&routes, &a, &f, now).expect("json"));
            });
        })
        .await
        .expect("parts");
    }

    // /api/v1/status over HTTP.
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/api/v1/status");
    let mut status_ms = Vec::new();
    let mut size = 0;
    for i in 0..21 {
        let t = Instant::now();
        let body = http
            .get(&url)
            .send()
            .await
            .expect("status")
            .bytes()
            .await
            .expect("body");
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if i > 0 {
            status_ms.push(ms);
        }
        size = body.len();
    }
    let (m, lo, hi) = median(status_ms);
    println!(
        "GET /api/v1/status over HTTP (1,000 routes, {size} B; store figures reused for {} s): median {m:.1} ms (min {lo:.1}, max {hi:.1})",
        probeok::web::api::FIGURES_TTL.as_secs()
    );

    // SSE fan-out. The subscribers live in a process of their own (this bench run again),
    // so that each side holds one descriptor per subscriber: 10,000 fit under a hard limit
    // of 20,000. Both sides read the system clock, so a latency is the time from the change
    // here to an event's last byte read there.
    let subscribers = subscribers();
    let v0 = weights_rx.borrow().version;
    let mut child = Subscribers::start(addr, subscribers, v0).await;
    let mut rounds = Vec::new();
    let mut version = v0;
    for round in 0..5 {
        version += 1;
        child.arm(version).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let start = std::time::SystemTime::now();
        health_tx.send_replace(Arc::new(if round % 2 == 0 { b.clone() } else { a.clone() }));
        let mut lat: Vec<f64> = child
            .received()
            .await
            .into_iter()
            .map(|at| at.duration_since(start).unwrap_or_default().as_secs_f64() * 1e3)
            .collect();
        assert_eq!(lat.len(), subscribers, "every subscriber gets the event");
        lat.sort_by(f64::total_cmp);
        let p50 = lat[lat.len() / 2];
        let p99 = lat[lat.len() * 99 / 100];
        let max = lat[lat.len() - 1];
        println!(
            "sse round {round}: {} received; p50 {p50:.1} ms, p99 {p99:.1} ms, last {max:.1} ms",
            lat.len()
        );
        rounds.push((p50, max));
    }
    let (m50, ..) = median(rounds.iter().map(|r| r.0).collect());
    let (mmax, ..) = median(rounds.iter().map(|r| r.1).collect());
    println!("SSE fan-out to {subscribers} subscribers: median over rounds of p50 {m50:.1} ms, of the last subscriber {mmax:.1} ms");
    drop(child);

    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    let _ = store.close().await;
}
