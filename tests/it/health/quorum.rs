//! The quorum with memory, through the health service on real SQLite files: routes agents
//! probe too move only on the single-vantage machine's hysteresis over their vantages'
//! verdicts — no flapping as one place alternates or a third place comes and goes — and a
//! restart resumes each route's stored state instead of re-deciding it on the first report.
//! The built-in demo's routes, fed what its simulator acts out for its first five minutes,
//! move at most twice a minute.
//!
//! Time: tokio's clock is paused and "now" is read from it ([`TokioClock`]), so the service's
//! 1-second ticks and the outcomes' timestamps move together, only when a test advances them.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use probeok::clock::Clock;
use probeok::config::Config;
use probeok::health::service::{HealthOptions, HealthService};
use probeok::health::{HealthEvent, HealthRx, State};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;
use probeok::store::{Store, StoreOptions};
use probeok::vantage::VantageOutcome;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// 14:30 in Asia/Shanghai (the default timezone).
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 6, 30, 0).unwrap()
}

/// `base` plus the paused tokio clock's progress since the clock was made.
struct TokioClock {
    base: DateTime<Utc>,
    start: tokio::time::Instant,
}

impl TokioClock {
    fn new(base: DateTime<Utc>) -> Arc<Self> {
        Arc::new(Self {
            base,
            start: tokio::time::Instant::now(),
        })
    }
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        self.base + chrono::Duration::from_std(self.start.elapsed()).unwrap()
    }
}

fn rid(model: &str) -> RouteId {
    RouteId::new("qwen", "cn", model)
}

/// Routes `qwen/cn/<model>` probed by this monitor (`local`) and agents `a` and `b`.
fn config(db: &std::path::Path, models: &[&str], b_stale_after: &str) -> Config {
    let mut src = format!(
        "[storage]\npath = \"{}\"\n\n[probe]\ninterval = \"10s\"\n\n\
         [detection]\nmin_samples = 3\n\n\
         [[provider]]\nid = \"qwen\"\nkind = \"openai\"\n  [[provider.region]]\n  id = \"cn\"\n  \
         base_url = \"http://127.0.0.1:9/v1\"\n",
        db.display()
    );
    for m in models {
        src.push_str(&format!(
            "[[route]]\nprovider = \"qwen\"\nregion = \"cn\"\nmodel = \"{m}\"\nserves = \"chat\"\n"
        ));
    }
    src.push_str(&format!(
        "[[vantage]]\nid = \"a\"\n\n[[vantage]]\nid = \"b\"\nstale_after = \"{b_stale_after}\"\n"
    ));
    Config::parse(&src, "test.toml").unwrap().config
}

fn probe(route: &RouteId, when: DateTime<Utc>, ok: bool) -> ProbeOutcome {
    ProbeOutcome {
        route: route.clone(),
        kind: OutcomeKind::Probe,
        started_at: when,
        success: ok,
        attributed_to: None,
        verified: ok.then_some(true),
        ttfb_ms: Some(150.0),
        ttft_ms: Some(800.0),
        total_ms: if ok { 1000.0 } else { 80.0 },
        output_tokens: Some(3),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: Some(if ok { 200 } else { 503 }),
        error: (!ok).then(|| ProbeError::Http {
            status: 503,
            message: "overloaded".into(),
        }),
        answer: ok.then(|| "PROBE_OK".into()),
        first_answer_ms: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

/// A started service, its agents' input and the ends a consumer holds.
struct Svc {
    tx: Option<mpsc::Sender<ProbeOutcome>>,
    agents: mpsc::Sender<VantageOutcome>,
    rx: HealthRx,
    events: broadcast::Receiver<HealthEvent>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    clock: Arc<TokioClock>,
    pushed: u64,
    /// Every transition announced so far: (route, from, to, at).
    seen: Vec<(RouteId, State, State, DateTime<Utc>)>,
    /// Every event announced so far, with when it was received.
    events_seen: Vec<(HealthEvent, DateTime<Utc>)>,
}

impl Svc {
    async fn start(config: &Config, store: &Store, base: DateTime<Utc>) -> Svc {
        let clock = TokioClock::new(base);
        let (events_tx, events) = broadcast::channel(4096);
        let mut service = HealthService::restore(
            config,
            HealthOptions::default(),
            store,
            clock.clone(),
            events_tx,
        )
        .await
        .unwrap();
        let link = service.vantages();
        let rx = service.subscribe();
        let (tx, inputs) = mpsc::channel(1024);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(service.run(inputs, shutdown.clone()));
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        Svc {
            tx: Some(tx),
            agents: link.inputs,
            rx,
            events,
            shutdown,
            task,
            clock,
            pushed: 0,
            seen: Vec::new(),
            events_seen: Vec::new(),
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// One probe of `route` from `vantage` (`local` is this monitor), judged before returning.
    async fn report(&mut self, vantage: &str, route: &RouteId, ok: bool) {
        let o = probe(route, self.now(), ok);
        if vantage == "local" {
            self.tx.as_ref().unwrap().send(o).await.unwrap();
        } else {
            self.pushed += 1;
            let v = VantageOutcome {
                vantage: vantage.to_owned(),
                id: format!("{vantage}-{}", self.pushed),
                outcome: o,
            };
            self.agents.send(v).await.unwrap();
        }
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }

    /// One second of time, with the service's tick in it; collects the transitions.
    async fn second(&mut self) {
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        while let Ok(e) = self.events.try_recv() {
            if let HealthEvent::Transition { transition: t, .. } = &e {
                self.seen.push((t.route.clone(), t.from, t.to, t.at));
            }
            self.events_seen.push((e, self.clock.now()));
        }
    }

    fn state(&self, id: &RouteId) -> State {
        self.rx.borrow().route(id).unwrap().state
    }

    fn moves(&self, id: &RouteId) -> Vec<(State, State, DateTime<Utc>)> {
        (self.seen.iter())
            .filter(|(r, ..)| r == id)
            .map(|(_, f, t, at)| (*f, *t, *at))
            .collect()
    }

    async fn stop(mut self) {
        drop(self.tx.take());
        self.shutdown.cancel();
        self.task.await.unwrap();
    }
}

/// Three vantages; `a` fails every other probe while this monitor and `b` see the route
/// healthy: the route is judged once (UNKNOWN → NORMAL) and never leaves NORMAL/WARNING,
/// with at most two changes in ten minutes.
#[tokio::test(start_paused = true)]
async fn one_vantage_alternating_does_not_move_the_route() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    let r = rid("m");
    let cfg = config(&db, &["m"], "2m");
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let mut svc = Svc::start(&cfg, &store, t0()).await;
    let mut a_ok = false;
    for s in 0..600 {
        match s % 10 {
            0 => svc.report("local", &r, true).await,
            3 => {
                a_ok = !a_ok;
                svc.report("a", &r, a_ok).await;
            }
            6 => svc.report("b", &r, true).await,
            _ => {}
        }
        svc.second().await;
        let st = svc.state(&r);
        assert!(
            matches!(st, State::Unknown | State::Normal | State::Warning),
            "{s} s: the route is {st}: {:?}",
            svc.moves(&r)
        );
    }
    let moves = svc.moves(&r);
    assert!(moves.len() <= 2, "{moves:?}");
    assert!(
        moves.iter().all(|(_, to, _)| *to <= State::Warning),
        "{moves:?}"
    );
    assert_eq!(svc.state(&r), State::Normal, "{moves:?}");
    svc.stop().await;
}

/// This monitor and agent `a` both see the route failing; agent `b` sees it healthy but
/// pushes only every other minute and goes stale between (its `stale_after` is 30 s). The
/// route becomes DEGRADED once and never comes back to a better state while both still fail.
#[tokio::test(start_paused = true)]
async fn two_failing_vantages_hold_the_route_while_a_third_comes_and_goes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    let r = rid("m");
    let cfg = config(&db, &["m"], "30s");
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let mut svc = Svc::start(&cfg, &store, t0()).await;
    let b_present = |s: u64| (s / 60) % 2 == 0;
    for s in 0..600u64 {
        // Healthy for the first minute, then failing from here and from `a`.
        let failing = s >= 60;
        match s % 10 {
            0 => svc.report("local", &r, !failing).await,
            3 => svc.report("a", &r, !failing).await,
            6 if b_present(s) => svc.report("b", &r, true).await,
            _ => {}
        }
        svc.second().await;
    }
    let moves = svc.moves(&r);
    let degraded: Vec<_> = (moves.iter())
        .filter(|(_, to, _)| *to == State::Degraded)
        .collect();
    assert_eq!(degraded.len(), 1, "DEGRADED once: {moves:?}");
    let at = degraded[0].2;
    assert!(
        (moves.iter())
            .filter(|(.., when)| *when > at)
            .all(|(_, to, _)| *to >= State::Degraded),
        "no better state while two places fail: {moves:?}"
    );
    assert!(moves.len() <= 4, "{moves:?}");
    assert!(svc.state(&r) >= State::Degraded);
    svc.stop().await;
}

/// Three routes stored DEGRADED; the monitor restarts, its own probes find them healthy at
/// once, its agents report only after 30 s. No route changes state in those 30 s; once the
/// agents agree, each heals once, and not before `recover_after` (5 min) of their reports.
#[tokio::test(start_paused = true)]
async fn a_restart_resumes_the_stored_states() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    let routes = [rid("m1"), rid("m2"), rid("m3")];
    let cfg = config(&db, &["m1", "m2", "m3"], "2m");
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let mut svc = Svc::start(&cfg, &store, t0()).await;
    let mut s = 0;
    while !routes.iter().all(|r| svc.state(r) == State::Degraded) {
        assert!(s < 300, "not DEGRADED after {s} s: {:?}", svc.seen);
        if s % 5 == 0 {
            for r in &routes {
                for v in ["local", "a", "b"] {
                    svc.report(v, r, false).await;
                }
            }
        }
        svc.second().await;
        s += 1;
    }
    let stopped_at = svc.now();
    svc.stop().await;

    let restart = stopped_at + chrono::Duration::seconds(60);
    let mut svc = Svc::start(&cfg, &store, restart).await;
    for r in &routes {
        assert_eq!(svc.state(r), State::Degraded, "restored");
    }
    for s in 0..30 {
        if s % 5 == 0 {
            for r in &routes {
                svc.report("local", r, true).await;
            }
        }
        svc.second().await;
    }
    assert!(svc.seen.is_empty(), "no change in 30 s: {:?}", svc.seen);
    for r in &routes {
        assert_eq!(svc.state(r), State::Degraded);
    }
    // The agents report from here, healthy too.
    let agents_from = svc.now();
    for s in 30..420 {
        if s % 5 == 0 {
            for r in &routes {
                for v in ["local", "a", "b"] {
                    svc.report(v, r, true).await;
                }
            }
        }
        svc.second().await;
    }
    for r in &routes {
        let moves = svc.moves(r);
        assert_eq!(moves.len(), 1, "{r}: {moves:?}");
        assert_eq!(moves[0].1, State::Normal, "{r}: {moves:?}");
        assert!(
            moves[0].2 >= agents_from + chrono::Duration::seconds(300),
            "{r}: healed before recover_after of its vantages' reports: {moves:?}"
        );
    }
    svc.stop().await;
}

/// The messages a webhook channel added to `config` would have been sent for the events `svc`
/// announced: the alert engine's own grouping (`[alerting] group_wait`), firing state and
/// outbox, over the same store; counted in the outbox, not delivered.
async fn webhook_messages(config: &Config, store: &Store, svc: &Svc) -> usize {
    let mut config = config.clone();
    config.alert.webhook.push(probeok::config::WebhookConfig {
        url_env: "DEMO_HOOK".into(),
        secret_env: None,
        max_per_minute: None,
        options: Default::default(),
    });
    let vars: std::collections::HashMap<String, String> =
        [("DEMO_HOOK".to_owned(), "http://127.0.0.1:9/hook".to_owned())].into();
    let channels = probeok::alert::build_channels(&config, &vars, reqwest::Client::new()).unwrap();
    let alerts = probeok::alert::AlertService::new(
        Arc::new(config),
        store.clone(),
        svc.clock.clone(),
        channels,
    );
    let mut grouper = alerts.grouper();
    for (event, at) in &svc.events_seen {
        if let Some(due) = grouper.deadline().filter(|due| due <= at) {
            alerts.enqueue(grouper.flush(due), due).await.unwrap();
        }
        grouper.push(event.clone(), *at);
    }
    if let Some(due) = grouper.deadline() {
        alerts.enqueue(grouper.flush(due), due).await.unwrap();
    }
    let rows = store.reader().unwrap().outbox_all().unwrap();
    rows.iter().filter(|r| r.channel == "webhook[0]").count()
}

/// What the demo's simulator would answer `route` at `s` seconds after the demo started, as
/// the vantage there records it (the agent's path to its cut region fails to connect).
fn demo_outcome(
    route: &probeok::route::Route,
    kind: OutcomeKind,
    agent: bool,
    s: u64,
    at: DateTime<Utc>,
    rng: &mut rand::rngs::StdRng,
) -> ProbeOutcome {
    use probeok::demo::edge::{EdgeOutage, EDGE_REGION};
    let id = &route.id;
    let (provider, region, model) = id.split();
    let scenario = probeok::demo::scenario_for(provider, region, model);
    let elapsed = Duration::from_secs_f64(s as f64 * probeok::demo::DEMO_TIME_SCALE);
    let b = probeok::sim::scenario::behaviour(scenario, elapsed, true, rng);
    let mut o = probeok::sim::history::outcome(route, kind, at, &b, rng);
    let cut = (provider, region) == EDGE_REGION;
    if agent && cut && EdgeOutage::DEMO.is_down(Duration::from_secs(s)) {
        o = probe(id, at, false);
        o.kind = kind;
        o.http_status = None;
        o.error = Some(ProbeError::Connect {
            message: "connection reset by the agent's network".into(),
        });
    }
    o
}

/// The built-in demo for its first five minutes after its first start (its month of history
/// written, as `probeok serve` does): every route probed by this monitor and the demo's
/// agent at the demo's intervals, each answered as the demo's simulator acts its scenario out
/// at the demo's time scale (the agent's own path to one region cut from the second minute).
/// No route changes state more than twice in any minute. Prints the transitions per route
/// per hour, the figure compared before and after the quorum had memory.
#[tokio::test(start_paused = true)]
async fn the_demo_moves_no_route_more_than_twice_a_minute() {
    use rand::SeedableRng;
    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();
    let demo = probeok::demo::start(shutdown.child_token()).await.unwrap();
    let mut config = demo.config.clone();
    config.storage.path = dir.path().join("demo.db");
    probeok::demo::history::write_to_file(&config, t0())
        .await
        .unwrap()
        .expect("a fresh database gets the history");
    let store = Store::open(&config.storage.path, StoreOptions::default()).unwrap();
    let mut svc = Svc::start(&config, &store, t0()).await;
    let routes = config.routes();
    let mut rng = rand::rngs::StdRng::seed_from_u64(53);
    let minutes: u64 = std::env::var("QUORUM_DEMO_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(5);
    for s in 0..minutes * 60 {
        for (i, route) in routes.iter().enumerate() {
            let every = route.probe.interval.as_secs().max(1);
            let tp = route.probe.throughput_every.as_secs().max(1);
            // The two vantages' schedulers are not in step: the agent probes 2 s later.
            for (vantage, offset) in [("local", 0), ("demo-edge", 2)] {
                let t = s + i as u64 % every;
                let kind = if t % every == offset {
                    OutcomeKind::Probe
                } else if t % tp == offset + every / 2 {
                    OutcomeKind::Throughput
                } else {
                    continue;
                };
                let o = demo_outcome(route, kind, vantage != "local", s, svc.now(), &mut rng);
                if vantage == "local" {
                    svc.tx.as_ref().unwrap().send(o).await.unwrap();
                } else {
                    svc.pushed += 1;
                    let v = VantageOutcome {
                        vantage: vantage.to_owned(),
                        id: format!("edge-{}", svc.pushed),
                        outcome: o,
                    };
                    svc.agents.send(v).await.unwrap();
                }
            }
        }
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        svc.second().await;
    }
    let hours = minutes as f64 / 60.0;
    let total = svc.seen.len();
    println!(
        "demo, first {minutes} min: {total} transitions over {} routes: {:.1} per route per hour",
        routes.len(),
        total as f64 / routes.len() as f64 / hours
    );
    println!(
        "demo, first {minutes} min: {} alert messages to a webhook channel",
        webhook_messages(&config, &store, &svc).await
    );
    for route in &routes {
        let moves = svc.moves(&route.id);
        for (k, (_, _, at)) in moves.iter().enumerate() {
            let within = (moves[k..].iter())
                .filter(|(.., later)| *later - *at < chrono::Duration::seconds(60))
                .count();
            assert!(
                within <= 2,
                "{}: {within} changes within a minute of {at}: {moves:?}",
                route.id
            );
        }
    }
    svc.stop().await;
    shutdown.cancel();
}
