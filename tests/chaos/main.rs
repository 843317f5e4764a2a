//! The chaos run: the whole fleet as separate processes on one machine — two monitors on
//! PostgreSQL, two agents, three proxies, the simulator as the providers, a webhook receiver
//! and clients sending steady traffic — while faults from a seeded random schedule hit it one
//! after another: `kill -9` and restart of any process, `SIGSTOP`/`SIGCONT` of an agent or a
//! monitor (a hang that looks like a partition), the database cut off for 10–30 s, a provider
//! region answering 503. At the end the invariants are checked over the whole history and
//! printed (`check`), with the seed, so a failing schedule can be replayed:
//!
//! ```sh
//! scripts/chaos --minutes 30 --seed 7
//! ```
//!
//! `scripts/test` runs it for 2 minutes on a fixed seed. Settings come from
//! `PROBEOK_CHAOS_MINUTES` and `PROBEOK_CHAOS_SEED` (what `scripts/chaos` sets). It needs the
//! PostgreSQL server of `PROBEOK_TEST_PG_URL`; the database outage is the test's own database
//! refusing connections with its sessions ended, which is what the processes see of a
//! stopped server.

#[path = "../common/mod.rs"]
mod common;

mod check;
mod procs;
mod tap;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use check::{Delivery, Sample};
use common::cluster::{connect, server_url, Db};
use probeok::sim::{self, Scenario, SimConfig, SimRoute};
use procs::{Kind, Proc};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A PostgreSQL outage: stopped at, started again at (seconds into the run; None while down).
type Outage = (f64, Option<f64>);

fn setting<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn http(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder().timeout(timeout).build().unwrap()
}

/// Cuts the test's database off (new sessions refused, open ones ended) or lets it back.
async fn set_reachable(db: &Db, reachable: bool) {
    let admin = connect(&server_url()).await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS {reachable}",
            db.name
        ))
        .await
        .unwrap();
    if !reachable {
        admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                &[&db.name],
            )
            .await
            .unwrap();
    }
}

/// Records every outcome the agent's outbox lets go (the monitor answered for it) in a table
/// of its own, so the run can check each of them was stored.
fn watch_outbox(p: &Proc) {
    let path = p.data.as_ref().expect("an agent's outbox");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        let made = conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS chaos_acked (body TEXT NOT NULL);
             CREATE TRIGGER IF NOT EXISTS chaos_acked AFTER DELETE ON outbox
             BEGIN INSERT INTO chaos_acked VALUES (old.body); END;",
        );
        if made.is_ok() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{}: no outbox to watch: {made:?}",
            p.name
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn outbox_rows(p: &Proc, sql: &str) -> Vec<String> {
    let conn = rusqlite::Connection::open(p.data.as_ref().unwrap()).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    let rows = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

#[derive(Default)]
struct Traffic {
    plain: AtomicU64,
    plain_ok: AtomicU64,
    idem: AtomicU64,
    idem_ok: AtomicU64,
    team: AtomicU64,
    team_ok: AtomicU64,
    team_limited: AtomicU64,
    /// Requests without an idempotency key that did not get a 200: by what they got
    /// (`HTTP 503`, `no answer`) and by the minute of the run they were sent in.
    plain_failed: Mutex<BTreeMap<(String, u64), u64>>,
    started: std::sync::OnceLock<Instant>,
    /// The first failed answer in full (its `x-probeok-*` headers and body).
    first_failure: Mutex<Option<String>>,
}

/// One client request through the proxies, as a client behind a load balancer sends it: a
/// replica that does not answer at all is skipped for the next one. A request with an
/// idempotency key is also retried, with its key, when the answer says to try again.
async fn request(http: &reqwest::Client, proxies: &[String], n: u64, traffic: &Traffic) {
    let (key, idem) = match n % 10 {
        0 => (procs::TEAM_KEY, false),
        1 | 2 => (procs::CLIENT_KEY, true),
        _ => (procs::CLIENT_KEY, false),
    };
    let content = if idem {
        format!("answer chaos-idem-{n}")
    } else {
        format!("answer {n}")
    };
    let body = serde_json::json!({
        "model": "chat",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": content}],
    });
    let sent_at = traffic
        .started
        .get()
        .map_or(0, |t| t.elapsed().as_secs() / 60);
    let mut status = None;
    // The proxy's own word on a failure: its error code, or the fallback reason it gave.
    let mut why = String::new();
    for attempt in 0..6u64 {
        let proxy = &proxies[((n + attempt) % proxies.len() as u64) as usize];
        let mut req = http
            .post(format!("{proxy}/v1/chat/completions"))
            .bearer_auth(key)
            .json(&body);
        if idem {
            req = req.header("Idempotency-Key", format!("chaos-idem-{n}"));
        }
        match req.send().await {
            Ok(r) => {
                let s = r.status().as_u16();
                let reason = r
                    .headers()
                    .get("x-probeok-fallback-reason")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let probeok_headers: Vec<String> = r
                    .headers()
                    .iter()
                    .filter(|(k, _)| k.as_str().starts_with("x-probeok"))
                    .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("?")))
                    .collect();
                let body = r.bytes().await.unwrap_or_default();
                if s != 200 && s != 429 {
                    let mut first = traffic.first_failure.lock().unwrap();
                    if first.is_none() {
                        *first = Some(format!(
                            "HTTP {s} {probeok_headers:?} {}",
                            String::from_utf8_lossy(&body)
                        ));
                    }
                }
                if s != 200 {
                    let code = serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
                    why = [code, reason]
                        .into_iter()
                        .flatten()
                        .collect::<Vec<_>>()
                        .join(", ");
                }
                status = Some(s);
                let again = idem && (s >= 500 || s == 409);
                if !again {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(_) => continue,
        }
    }
    let ok = status == Some(200);
    let counted = |all: &AtomicU64, good: &AtomicU64| {
        all.fetch_add(1, Ordering::Relaxed);
        if ok {
            good.fetch_add(1, Ordering::Relaxed);
        }
    };
    match (key == procs::TEAM_KEY, idem) {
        (true, _) => {
            counted(&traffic.team, &traffic.team_ok);
            if status == Some(429) {
                traffic.team_limited.fetch_add(1, Ordering::Relaxed);
            }
        }
        (false, true) => counted(&traffic.idem, &traffic.idem_ok),
        (false, false) => {
            counted(&traffic.plain, &traffic.plain_ok);
            if !ok {
                let what =
                    status.map_or_else(|| "no answer".to_owned(), |s| format!("HTTP {s} ({why})"));
                *traffic
                    .plain_failed
                    .lock()
                    .unwrap()
                    .entry((what, sent_at))
                    .or_default() += 1;
            }
        }
    }
}

async fn sample(
    http: &reqwest::Client,
    monitors: &[String],
    proxies: &[String],
    at: f64,
) -> Sample {
    let mut s = Sample {
        at,
        ..Sample::default()
    };
    for m in monitors {
        let role = match http.get(format!("{m}/readyz")).send().await {
            Ok(r) => r
                .json::<serde_json::Value>()
                .await
                .ok()
                .and_then(|v| v["role"].as_str().map(str::to_owned)),
            Err(_) => None,
        };
        s.roles.push(role);
        if let Ok(r) = http.get(format!("{m}/api/v1/weights")).send().await {
            s.feed_ok |= r.status().is_success();
        }
    }
    for p in proxies {
        let Ok(r) = http
            .get(format!("{p}/api/v1/admin/clients"))
            .bearer_auth(procs::ADMIN_TOKEN)
            .send()
            .await
        else {
            continue;
        };
        let Ok(v) = r.json::<serde_json::Value>().await else {
            continue;
        };
        let team = v["clients"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["id"] == "team");
        if let Some(c) = team {
            let f = |k: &str| c[k].as_f64().unwrap_or(0.0);
            s.team = Some((f("spent"), f("reserved"), f("limit")));
            break;
        }
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_chaos_run_keeps_every_invariant() {
    let minutes: f64 = setting("PROBEOK_CHAOS_MINUTES", 2.0);
    let seed: u64 = setting("PROBEOK_CHAOS_SEED", 7);
    println!("chaos run: seed {seed}, {minutes} minutes (replay: scripts/chaos --minutes {minutes} --seed {seed})");
    let db = Db::create().await;
    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();

    // The providers: one route flaps on the simulator's own script (20× faster than real
    // time), the rest are healthy until the schedule breaks them.
    let routes = ["r1", "r2"]
        .iter()
        .flat_map(|region| {
            ["sim-large", "sim-small"].map(|model| SimRoute {
                provider: "sim".into(),
                region: (*region).into(),
                model: model.into(),
                scenario: if *region == "r1" && model == "sim-large" {
                    Scenario::Flapping
                } else {
                    Scenario::Healthy
                },
            })
        })
        .collect();
    let sim_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim_addr = sim_listener.local_addr().unwrap();
    let sim_config = SimConfig {
        routes,
        time_scale: 20.0,
        seed,
    };
    tokio::spawn(sim::serve(sim_listener, sim_config, shutdown.clone()));
    let (tap, tap_addr) = tap::serve(sim_addr).await;

    // The webhook receiver: every delivery, in order.
    let deliveries: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let sink = deliveries.clone();
    let hook = common::spawn(Router::new().route(
        "/hook",
        post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                let key = headers
                    .get("x-probeok-delivery")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let body = serde_json::from_slice(&body).unwrap_or_default();
                sink.lock().unwrap().push(Delivery { key, body });
                "ok"
            }
        }),
    ))
    .await;

    let mut fleet = procs::fleet(
        dir.path(),
        &db.url,
        tap_addr,
        &format!("http://{}/hook", hook.addr),
    );
    let probe = http(Duration::from_millis(800));
    for kind in [Kind::Monitor, Kind::Agent, Kind::Proxy] {
        for p in fleet.iter_mut().filter(|p| p.kind == kind) {
            p.spawn();
        }
        for p in fleet.iter().filter(|p| p.kind == kind) {
            procs::until_up(&probe, p, Duration::from_secs(60)).await;
            if kind == Kind::Agent {
                watch_outbox(p);
            }
        }
    }
    let monitors: Vec<String> = fleet
        .iter()
        .filter(|p| p.kind == Kind::Monitor)
        .map(|p| p.base.clone())
        .collect();
    let proxies: Vec<String> = fleet
        .iter()
        .filter(|p| p.kind == Kind::Proxy)
        .map(|p| p.base.clone())
        .collect();

    // Steady traffic: ten requests a second, at most 64 in flight.
    let traffic = Arc::new(Traffic::default());
    let stop_clients = Arc::new(AtomicBool::new(false));
    let clients = {
        let (traffic, stop, proxies) = (traffic.clone(), stop_clients.clone(), proxies.clone());
        tokio::spawn(async move {
            let client = http(Duration::from_secs(30));
            let slots = Arc::new(tokio::sync::Semaphore::new(64));
            let mut tasks = tokio::task::JoinSet::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    continue;
                };
                n += 1;
                let (client, proxies, traffic) = (client.clone(), proxies.clone(), traffic.clone());
                tasks.spawn(async move {
                    request(&client, &proxies, n, &traffic).await;
                    drop(slot);
                });
            }
            while tasks.join_next().await.is_some() {}
        })
    };

    // The sampler: once a second.
    let started = Instant::now();
    let _ = traffic.started.set(started);
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let db_down: Arc<Mutex<Vec<Outage>>> = Arc::default();
    let sampler = {
        let (samples, db_down, stop) = (samples.clone(), db_down.clone(), stop_clients.clone());
        let (monitors, proxies) = (monitors.clone(), proxies.clone());
        tokio::spawn(async move {
            let client = http(Duration::from_millis(700));
            let grace = (procs::LEASE_S + 5) as f64;
            while !stop.load(Ordering::Relaxed) {
                let at = started.elapsed().as_secs_f64();
                let mut s = sample(&client, &monitors, &proxies, at).await;
                s.db_excused = db_down
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|(from, to)| *from <= at && to.is_none_or(|to| at <= to + grace));
                samples.lock().unwrap().push(s);
                tokio::time::sleep_until(started + Duration::from_secs_f64(at.floor() + 1.0)).await;
            }
        })
    };

    // The faults, one after another, from the seed.
    let mut rng = StdRng::seed_from_u64(seed);
    let end = started + Duration::from_secs_f64(minutes * 60.0);
    let mut faults: BTreeMap<&str, u32> = BTreeMap::new();
    let secs = |rng: &mut StdRng, lo: f64, hi: f64| Duration::from_secs_f64(rng.gen_range(lo..hi));
    // The first four faults are one of each kind, in the seed's order, so even a short run
    // meets them all; then any kind, by weight.
    let mut first: Vec<u32> = vec![0, 35, 60, 80];
    first.shuffle(&mut rng);
    while Instant::now() + Duration::from_secs(20) < end {
        tokio::time::sleep(secs(&mut rng, 3.0, 8.0)).await;
        let at = started.elapsed().as_secs_f64();
        let pick = first.pop().unwrap_or_else(|| rng.gen_range(0..100));
        match pick {
            0..=34 => {
                let i = rng.gen_range(0..fleet.len());
                fleet[i].kill9();
                tokio::time::sleep(secs(&mut rng, 0.5, 3.0)).await;
                fleet[i].spawn();
                println!("{at:6.1}s kill -9 {} and restart", fleet[i].name);
                *faults.entry("kill -9 and restart").or_default() += 1;
            }
            35..=59 => {
                let i = rng.gen_range(0..4); // the monitors and the agents come first
                let d = secs(&mut rng, 5.0, 15.0);
                fleet[i].stop();
                tokio::time::sleep(d).await;
                fleet[i].cont();
                println!(
                    "{at:6.1}s SIGSTOP {} for {:.1}s",
                    fleet[i].name,
                    d.as_secs_f64()
                );
                *faults.entry("SIGSTOP/SIGCONT").or_default() += 1;
            }
            60..=79 => {
                let d = secs(&mut rng, 10.0, 30.0);
                db_down.lock().unwrap().push((at, None));
                set_reachable(&db, false).await;
                tokio::time::sleep(d).await;
                set_reachable(&db, true).await;
                db_down.lock().unwrap().last_mut().unwrap().1 =
                    Some(started.elapsed().as_secs_f64());
                println!("{at:6.1}s database cut off for {:.1}s", d.as_secs_f64());
                *faults.entry("database cut off").or_default() += 1;
            }
            _ => {
                let d = secs(&mut rng, 10.0, 25.0);
                let region = if rng.gen_bool(0.5) { "r1" } else { "r2" };
                tap.fail_region(region, std::time::Instant::now() + d);
                tokio::time::sleep(d).await;
                println!(
                    "{at:6.1}s provider region {region} answers 503 for {:.1}s",
                    d.as_secs_f64()
                );
                *faults.entry("provider region 503").or_default() += 1;
            }
        }
    }
    tokio::time::sleep_until(end).await;
    tap.heal();

    stop_clients.store(true, Ordering::Relaxed);
    clients.await.unwrap();
    sampler.await.unwrap();

    // Let the fleet settle: every agent's outbox drained, and the channel told of every
    // route that is NORMAL again — a resolution lost with a leader's memory is sent once its
    // incident has been closed `LOST_AFTER`, at the engine's next evaluation.
    let lost = probeok::alert::LOST_AFTER.to_std().unwrap_or_default();
    let settle = Instant::now() + lost + probeok::alert::EVALUATE_EVERY + Duration::from_secs(30);
    let agents: Vec<&Proc> = fleet.iter().filter(|p| p.kind == Kind::Agent).collect();
    while agents
        .iter()
        .any(|a| !outbox_rows(a, "SELECT body FROM outbox").is_empty())
        && Instant::now() < settle
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let probe = http(Duration::from_secs(2));
    let normal_at_end = loop {
        let mut normal = BTreeSet::new();
        for m in &monitors {
            let Ok(r) = probe.get(format!("{m}/api/v1/status")).send().await else {
                continue;
            };
            let Ok(v) = r.json::<serde_json::Value>().await else {
                continue;
            };
            if v["role"] != "leader" {
                continue;
            }
            for route in v["routes"].as_array().into_iter().flatten() {
                if route["state"] == "NORMAL" {
                    normal.insert(route["id"].as_str().unwrap_or_default().to_owned());
                }
            }
        }
        let open = check::left_open(&deliveries.lock().unwrap(), &normal);
        if open.is_empty() || Instant::now() >= settle {
            break normal;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    // The invariants.
    let mut broken: Vec<String> = Vec::new();
    let acked: Vec<String> = agents
        .iter()
        .flat_map(|a| outbox_rows(a, "SELECT body FROM chaos_acked"))
        .filter_map(|b| {
            serde_json::from_str::<serde_json::Value>(&b)
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_owned))
        })
        .collect();
    let stored: HashSet<String> = connect(&db.url)
        .await
        .query("SELECT uid FROM vantage_outcomes", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    let lost: Vec<&String> = acked.iter().filter(|id| !stored.contains(*id)).collect();
    let samples = samples.lock().unwrap().clone();
    let leadership = check::leadership(&samples);
    let feed_gap = check::feed_gap(&samples);
    let overspent = check::overspent(&samples);
    let deliveries = deliveries.lock().unwrap().clone();
    let twice = check::delivered_twice(&deliveries);
    let open = check::left_open(&deliveries, &normal_at_end);
    let idem_twice = tap.answered_twice();
    let panics = check::panics(fleet.iter().map(|p| (p.name.as_str(), p.log_text())));
    let t = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let plain_share = t(&traffic.plain_ok) as f64 / t(&traffic.plain).max(1) as f64;

    println!("\nfaults injected:");
    for (kind, n) in &faults {
        println!("  {kind}: {n}");
    }
    let mut verdict = |ok: bool, what: String| {
        println!("  [{}] {what}", if ok { "ok" } else { "BROKEN" });
        if !ok {
            broken.push(what);
        }
    };
    println!("invariants:");
    verdict(
        lost.is_empty() && !acked.is_empty(),
        format!(
            "every outcome an agent's outbox let go is stored once: {} let go, {} missing{}",
            acked.len(),
            lost.len(),
            lost.first()
                .map(|id| format!(" (first: {id})"))
                .unwrap_or_default()
        ),
    );
    verdict(
        twice.is_empty(),
        format!(
            "no alert delivered twice: {} deliveries, {} keys twice {:?}",
            deliveries.len(),
            twice.len(),
            twice.iter().take(3).collect::<Vec<_>>()
        ),
    );
    verdict(
        open.is_empty(),
        format!("no incident left open on the channel for a route NORMAL at the end: {open:?}"),
    );
    verdict(
        idem_twice.is_empty(),
        format!(
            "no Idempotency-Key answered by an upstream twice: {} keys answered, twice: {:?}",
            tap.keys_answered(),
            idem_twice.iter().take(3).collect::<Vec<_>>()
        ),
    );
    verdict(
        overspent.is_empty() && samples.iter().any(|s| s.team.is_some()),
        format!(
            "the spend-limited client never past its limit of {}: {} samples over",
            procs::TEAM_LIMIT,
            overspent.len()
        ),
    );
    verdict(
        leadership.two_leaders.is_empty(),
        format!(
            "never two leaders at once: {} samples with two",
            leadership.two_leaders.len()
        ),
    );
    verdict(
        leadership.longest_none <= (procs::LEASE_S + 5) as f64,
        format!(
            "no leader for at most lease + 5 s outside database outages: longest {:.1} s from {:.1} s (with outages {:.1} s)",
            leadership.longest_none, leadership.longest_none_from, leadership.longest_none_any
        ),
    );
    verdict(
        feed_gap <= (procs::LEASE_S + 5) as f64,
        format!("the weights feed answered from some member: longest gap {feed_gap:.1} s"),
    );
    verdict(
        plain_share >= 0.99,
        format!(
            "requests without an Idempotency-Key answered 200: {} of {} ({:.2} %)",
            t(&traffic.plain_ok),
            t(&traffic.plain),
            plain_share * 100.0
        ),
    );
    verdict(
        panics.is_empty(),
        format!("no panic in any process's log: {panics:?}"),
    );
    println!(
        "traffic: idempotent {} of {} answered 200; the spend-limited client {} of {} (429 spend limit: {})",
        t(&traffic.idem_ok),
        t(&traffic.idem),
        t(&traffic.team_ok),
        t(&traffic.team),
        t(&traffic.team_limited)
    );

    let failed = traffic.plain_failed.lock().unwrap().clone();
    if !failed.is_empty() {
        println!(
            "requests without an Idempotency-Key that failed, by answer and minute of the run:"
        );
        for ((what, minute), n) in &failed {
            println!("  {what} in minute {minute}: {n}");
        }
    }
    if let Some(first) = traffic.first_failure.lock().unwrap().as_ref() {
        println!("the first failed answer: {first}");
    }
    if leadership.longest_none > 0.0 {
        let from = leadership.longest_none_from;
        let seen: Vec<_> = samples
            .iter()
            .filter(|s| s.at >= from && s.at < from + leadership.longest_none)
            .map(|s| (s.at.round(), s.roles.clone()))
            .collect();
        println!("the monitors' roles while none led (None: no answer within 700 ms): {seen:?}");
    }

    shutdown.cancel();
    drop(fleet);
    db.drop_now().await;
    if !broken.is_empty() {
        println!(
            "the processes' configs and logs are kept in {}",
            dir.keep().display()
        );
    }
    assert!(
        broken.is_empty(),
        "seed {seed}: {} invariant(s) broken: {broken:#?}",
        broken.len()
    );
}
