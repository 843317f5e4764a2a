//! The scheduler under a paused tokio clock, against a recording test double of the prober.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures_util::future::BoxFuture;
use probeok::clock::SystemClock;
use probeok::probe::{OutcomeKind, ProbeOutcome};
use probeok::route::{ProbeSettings, ProviderKind, Route, RouteId, Tier};
use probeok::scheduler::{run, Prober, SchedulerEvent, SchedulerOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn route(i: usize, interval: Duration, jitter: f64, throughput_every: Duration) -> Arc<Route> {
    let model = format!("m{i:03}");
    Arc::new(Route {
        id: RouteId::new("p", "r", &model),
        provider: "p".into(),
        region: "r".into(),
        model,
        kind: ProviderKind::Openai,
        base_url: "http://127.0.0.1:1/v1".into(),
        api_key_env: None,
        serves: "chat".into(),
        tier: Tier::Primary,
        weight: 100,
        price: None,
        capabilities: vec![],
        context_window: None,
        embedding: None,
        residency: None,
        slo: 0.999,
        probe: ProbeSettings {
            interval,
            first_byte_timeout: SECS(5),
            stall_timeout: SECS(10),
            timeout: SECS(120),
            jitter,
            stream: true,
            max_tokens: 16,
            throughput_every,
            throughput_prompt: "Count from 1 to 40".into(),
            throughput_max_tokens: 128,
            system: "Reply with exactly: PROBE_OK".into(),
            user: "health check".into(),
            expect: "PROBE_OK".into(),
            confirm_after: None,
        },
    })
}

#[derive(Debug, Clone)]
struct Call {
    route: RouteId,
    kind: OutcomeKind,
    at: Instant,
}

/// Records every call and how many run at once, and takes a set time per kind.
struct Recorder {
    probe_takes: Duration,
    throughput_takes: Duration,
    calls: Mutex<Vec<Call>>,
    per_route: Mutex<HashMap<RouteId, usize>>,
    max_per_route: AtomicUsize,
    running: AtomicUsize,
    max_running: AtomicUsize,
}

impl Recorder {
    fn new(probe_takes: Duration, throughput_takes: Duration) -> Arc<Self> {
        Arc::new(Self {
            probe_takes,
            throughput_takes,
            calls: Mutex::new(Vec::new()),
            per_route: Mutex::new(HashMap::new()),
            max_per_route: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
        })
    }

    fn calls(&self, kind: OutcomeKind) -> HashMap<RouteId, Vec<Instant>> {
        let mut by_route: HashMap<RouteId, Vec<Instant>> = HashMap::new();
        for c in self.calls.lock().unwrap().iter().filter(|c| c.kind == kind) {
            by_route.entry(c.route.clone()).or_default().push(c.at);
        }
        by_route
    }
}

impl Prober for Recorder {
    fn probe<'a>(&'a self, route: &'a Route, kind: OutcomeKind) -> BoxFuture<'a, ProbeOutcome> {
        Box::pin(async move {
            let at = Instant::now();
            self.calls.lock().unwrap().push(Call {
                route: route.id.clone(),
                kind,
                at,
            });
            {
                let mut per = self.per_route.lock().unwrap();
                let n = per.entry(route.id.clone()).or_default();
                *n += 1;
                self.max_per_route.fetch_max(*n, Ordering::SeqCst);
            }
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_running.fetch_max(now, Ordering::SeqCst);
            let takes = match kind {
                OutcomeKind::Throughput => self.throughput_takes,
                _ => self.probe_takes,
            };
            tokio::time::sleep(takes).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            *self.per_route.lock().unwrap().get_mut(&route.id).unwrap() -= 1;
            ProbeOutcome {
                route: route.id.clone(),
                kind,
                started_at: Utc::now(),
                success: true,
                attributed_to: None,
                verified: Some(true),
                ttfb_ms: Some(1.0),
                ttft_ms: Some(2.0),
                total_ms: takes.as_secs_f64() * 1000.0,
                output_tokens: Some(3),
                tokens_estimated: false,
                tokens_per_second: None,
                model_reported: None,
                system_fingerprint: None,
                http_status: Some(200),
                error: None,
                answer: Some("PROBE_OK".into()),
                first_answer_ms: None,
                max_tokens_exhausted: false,
                ratelimit: None,
            }
        })
    }
}

struct Run {
    start: Instant,
    events: Vec<(Instant, SchedulerEvent)>,
    /// From cancel to `run` returning.
    stop_took: Duration,
}

/// Runs the scheduler for `for_` of (paused, auto-advancing) time, then shuts it down.
async fn drive(
    routes: Vec<Arc<Route>>,
    prober: Arc<Recorder>,
    opts: SchedulerOptions,
    for_: Duration,
) -> Run {
    let (tx, mut rx) = mpsc::channel(16);
    let collector = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(e) = rx.recv().await {
            got.push((Instant::now(), e));
        }
        got
    });
    let shutdown = CancellationToken::new();
    let start = Instant::now();
    let sched = tokio::spawn(run(
        routes,
        prober,
        Arc::new(SystemClock),
        tx,
        opts,
        shutdown.clone(),
    ));
    tokio::time::sleep(for_).await;
    shutdown.cancel();
    let cancelled = Instant::now();
    sched.await.unwrap();
    let stop_took = cancelled.elapsed();
    Run {
        start,
        events: collector.await.unwrap(),
        stop_took,
    }
}

fn secs_since(start: Instant, t: Instant) -> f64 {
    (t - start).as_secs_f64()
}

#[tokio::test(start_paused = true)]
async fn first_fires_are_spread_then_on_interval_without_drift() {
    let interval = SECS(30);
    let routes: Vec<_> = (0..20)
        .map(|i| route(i, interval, 0.1, Duration::ZERO))
        .collect();
    let prober = Recorder::new(Duration::from_millis(1200), Duration::ZERO);
    let r = drive(
        routes,
        prober.clone(),
        SchedulerOptions::default(),
        SECS(20 * 30 + 5),
    )
    .await;

    let calls = prober.calls(OutcomeKind::Probe);
    assert_eq!(calls.len(), 20);
    let firsts: Vec<f64> = calls.values().map(|v| secs_since(r.start, v[0])).collect();
    let lo = firsts.iter().cloned().fold(f64::MAX, f64::min);
    let hi = firsts.iter().cloned().fold(f64::MIN, f64::max);
    assert!(
        hi < 30.0,
        "first fires within the first interval: {firsts:?}"
    );
    assert!(
        hi - lo >= 0.8 * 30.0,
        "spread covers most of it: {firsts:?}"
    );
    // Not a herd: no two routes in the same second.
    let mut buckets: Vec<u64> = firsts.iter().map(|f| *f as u64).collect();
    buckets.sort();
    buckets.dedup();
    assert_eq!(buckets.len(), 20, "{firsts:?}");

    for (id, fires) in &calls {
        assert!(fires.len() >= 20, "{id}: {} fires", fires.len());
        let first = fires[0];
        for (k, pair) in fires.windows(2).enumerate() {
            let gap = (pair[1] - pair[0]).as_secs_f64();
            assert!(
                (27.0 - 0.01..=33.0 + 0.01).contains(&gap),
                "{id} gap {k}: {gap}"
            );
        }
        // No drift: the k-th fire stays within the jitter of first + k·interval.
        for (k, t) in fires.iter().enumerate() {
            let planned = secs_since(first, *t) - 30.0 * k as f64;
            assert!(
                planned.abs() <= 3.0 + 0.01,
                "{id} fire {k} off grid by {planned}"
            );
        }
        // Jitter is applied: the gaps are not all equal.
        let gaps: Vec<u64> = fires
            .windows(2)
            .map(|p| (p[1] - p[0]).as_millis() as u64)
            .collect();
        assert!(gaps.iter().any(|g| *g != gaps[0]), "{id}: {gaps:?}");
    }

    let outcomes = r
        .events
        .iter()
        .filter(|(_, e)| matches!(e, SchedulerEvent::Outcome(_)))
        .count();
    let fired: usize = calls.values().map(Vec::len).sum();
    assert_eq!(outcomes, fired, "every probe's outcome is delivered");
    assert!(!r
        .events
        .iter()
        .any(|(_, e)| matches!(e, SchedulerEvent::Skipped { .. })));
    let heartbeats: Vec<f64> = r
        .events
        .iter()
        .filter(|(_, e)| matches!(e, SchedulerEvent::Heartbeat { .. }))
        .map(|(t, _)| secs_since(r.start, *t))
        .collect();
    assert_eq!(heartbeats.len(), 61, "{heartbeats:?}");
    assert_eq!(heartbeats[0], 0.0);
    assert!(heartbeats
        .windows(2)
        .all(|p| (p[1] - p[0] - 10.0).abs() < 0.01));
}

#[tokio::test(start_paused = true)]
async fn an_overrun_is_skipped_not_stacked() {
    let routes: Vec<_> = (0..3)
        .map(|i| route(i, SECS(10), 0.0, Duration::ZERO))
        .collect();
    // Each probe takes 2.5 intervals.
    let prober = Recorder::new(SECS(25), Duration::ZERO);
    let r = drive(
        routes,
        prober.clone(),
        SchedulerOptions::default(),
        SECS(95),
    )
    .await;

    assert_eq!(prober.max_per_route.load(Ordering::SeqCst), 1, "stacked");
    let calls = prober.calls(OutcomeKind::Probe);
    for (id, fires) in &calls {
        // Ticks at 0,10,20,30,…: 10 and 20 find it busy; 30 fires again.
        let gaps: Vec<f64> = fires
            .windows(2)
            .map(|p| (p[1] - p[0]).as_secs_f64())
            .collect();
        assert!(
            gaps.iter().all(|g| (*g - 30.0).abs() < 0.01),
            "{id}: {gaps:?}"
        );
        let skipped = r
            .events
            .iter()
            .filter(|(_, e)| {
                matches!(e, SchedulerEvent::Skipped { route, kind: OutcomeKind::Probe, .. } if route == id)
            })
            .count();
        // Every route sees six busy ticks in 95 s (two after each of its first three fires).
        assert_eq!(skipped, 6, "{id}");
    }
}

#[tokio::test(start_paused = true)]
async fn max_concurrency_is_respected() {
    let routes: Vec<_> = (0..50)
        .map(|i| route(i, SECS(10), 0.1, Duration::ZERO))
        .collect();
    let prober = Recorder::new(SECS(5), Duration::ZERO);
    let opts = SchedulerOptions {
        max_concurrency: 4,
        ..SchedulerOptions::default()
    };
    let r = drive(routes, prober.clone(), opts, SECS(120)).await;
    assert_eq!(prober.max_running.load(Ordering::SeqCst), 4);
    assert_eq!(prober.max_per_route.load(Ordering::SeqCst), 1);
    // Demand is far above 4 at a time: routes waiting for a permit count as busy.
    assert!(r
        .events
        .iter()
        .any(|(_, e)| matches!(e, SchedulerEvent::Skipped { .. })));
}

#[tokio::test(start_paused = true)]
async fn throughput_probes_fire_every_throughput_every_between_probes() {
    let routes: Vec<_> = (0..4).map(|i| route(i, SECS(30), 0.1, SECS(300))).collect();
    let prober = Recorder::new(Duration::from_millis(1500), SECS(4));
    let r = drive(
        routes,
        prober.clone(),
        SchedulerOptions::default(),
        SECS(1230),
    )
    .await;

    let tp = prober.calls(OutcomeKind::Throughput);
    let probes = prober.calls(OutcomeKind::Probe);
    assert_eq!(tp.len(), 4);
    let mut firsts = Vec::new();
    for (id, fires) in &tp {
        assert!(fires.len() >= 4, "{id}: {}", fires.len());
        firsts.push(secs_since(r.start, fires[0]));
        assert!(secs_since(r.start, fires[0]) < 300.0 + 15.0);
        for pair in fires.windows(2) {
            let gap = (pair[1] - pair[0]).as_secs_f64();
            assert!((297.0 - 0.01..=303.0 + 0.01).contains(&gap), "{id}: {gap}");
        }
        // Placed between the route's probes, so none was skipped for overlap.
        assert!(probes[id].len() >= 40);
    }
    firsts.sort_by(f64::total_cmp);
    assert!(
        firsts.windows(2).all(|p| p[1] - p[0] > 5.0),
        "spread: {firsts:?}"
    );
    assert_eq!(prober.max_per_route.load(Ordering::SeqCst), 1);
    assert!(!r
        .events
        .iter()
        .any(|(_, e)| matches!(e, SchedulerEvent::Skipped { .. })));
}

#[tokio::test(start_paused = true)]
async fn shutdown_returns_promptly_and_delivers_running_probes() {
    // Idle (route 0 ran 0–3 s, route 1 fires at 6 s): returns at once.
    let routes: Vec<_> = (0..5)
        .map(|i| route(i, SECS(30), 0.1, Duration::ZERO))
        .collect();
    let prober = Recorder::new(SECS(3), Duration::ZERO);
    let r = drive(routes, prober.clone(), SchedulerOptions::default(), SECS(5)).await;
    assert!(r.stop_took < Duration::from_millis(10), "{:?}", r.stop_took);

    // Mid-probe: waits for the running probe (3 s at most), starts nothing new, loses nothing.
    let routes: Vec<_> = (0..5)
        .map(|i| route(i, SECS(30), 0.0, Duration::ZERO))
        .collect();
    let prober = Recorder::new(SECS(3), Duration::ZERO);
    // Route 2 fires at 12 s and is running at 13 s.
    let r = drive(
        routes,
        prober.clone(),
        SchedulerOptions::default(),
        SECS(13),
    )
    .await;
    assert!(
        r.stop_took <= SECS(2) + Duration::from_millis(10),
        "{:?}",
        r.stop_took
    );
    let fired = prober.calls.lock().unwrap().len();
    assert_eq!(fired, 3);
    let outcomes = r
        .events
        .iter()
        .filter(|(_, e)| matches!(e, SchedulerEvent::Outcome(_)))
        .count();
    assert_eq!(outcomes, fired);
}

#[tokio::test(start_paused = true)]
async fn a_prober_that_ignores_its_timeout_is_recorded_as_a_timeout() {
    let mut slow = (*route(0, SECS(60), 0.0, Duration::ZERO)).clone();
    slow.probe.timeout = SECS(10);
    let prober = Recorder::new(SECS(200), Duration::ZERO);
    let r = drive(
        vec![Arc::new(slow)],
        prober,
        SchedulerOptions::default(),
        SECS(30),
    )
    .await;
    let (at, outcome) = r
        .events
        .iter()
        .find_map(|(t, e)| match e {
            SchedulerEvent::Outcome(o) => Some((*t, o.clone())),
            _ => None,
        })
        .expect("an outcome");
    // timeout (10 s) + the scheduler's grace (5 s).
    assert!((secs_since(r.start, at) - 15.0).abs() < 0.01);
    assert!(!outcome.success);
    assert_eq!(
        outcome.error.map(|e| e.kind()),
        Some("timeout"),
        "{:?}",
        outcome.total_ms
    );
}

#[tokio::test(start_paused = true)]
async fn a_dropped_receiver_stops_the_scheduler() {
    let (tx, rx) = mpsc::channel(4);
    drop(rx);
    let routes = vec![route(0, SECS(30), 0.1, Duration::ZERO)];
    let prober = Recorder::new(SECS(1), Duration::ZERO);
    tokio::time::timeout(
        SECS(1),
        run(
            routes,
            prober,
            Arc::new(SystemClock),
            tx,
            SchedulerOptions::default(),
            CancellationToken::new(),
        ),
    )
    .await
    .expect("returns without a listener");
}
