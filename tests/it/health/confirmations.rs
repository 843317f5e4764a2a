//! Confirmation probes end to end on a paused tokio clock: the real scheduler probes routes
//! whose upstream acts out the simulator's behaviours (`sim::scenario::Behaviour`: headers,
//! first token, tokens/s, faults), outcomes go through the detector as the health service
//! feeds them, and the confirmations it asks for go back to the scheduler.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use futures_util::future::BoxFuture;
use probeok::clock::Clock;
use probeok::config::DetectionConfig;
use probeok::health::{confirm, Baseline, Detector, RouteHealth, State, Transition};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::{ProbeSettings, ProviderKind, Route, RouteId, Tier};
use probeok::scheduler::{
    run_with_confirmations, Confirm, Prober, SchedulerEvent, SchedulerOptions,
};
use probeok::sim::scenario::{Behaviour, Fault, Version};
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_secs(30);

/// 14:30 in Asia/Shanghai (the default timezone).
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 6, 30, 0).unwrap()
}

/// `t0` plus the paused tokio clock's progress since the clock was made.
struct TokioClock {
    start: Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        t0() + chrono::Duration::from_std(self.start.elapsed()).unwrap()
    }
}

fn route_id(i: usize) -> RouteId {
    RouteId::new("p", "r", &format!("m{i:03}"))
}

fn route(i: usize) -> Arc<Route> {
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
            interval: INTERVAL,
            first_byte_timeout: Duration::from_secs(5),
            stall_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(60),
            jitter: 0.0,
            stream: true,
            max_tokens: 16,
            throughput_every: Duration::from_secs(300),
            throughput_prompt: "Count from 1 to 40".into(),
            throughput_max_tokens: 128,
            system: "Reply with exactly: PROBE_OK".into(),
            user: "health check".into(),
            expect: "PROBE_OK".into(),
            // `interval/6`, the default.
            confirm_after: Some(INTERVAL / 6),
        },
    })
}

/// What goes wrong from `onset` (tokio time since the start) on.
#[derive(Clone, Copy, PartialEq)]
enum Trouble {
    None,
    /// 503 after 40 ms.
    HardOutage,
    /// One 503 for the first probe after the onset, healthy again after.
    Blip,
    /// Requests hang until `release`, then all get a 503 at that instant (and fast 503s
    /// after it).
    HangThen503 {
        release: Duration,
    },
    /// 503 after 40 ms for every route but the first until `until`; the first fails one
    /// probe, at `blip` or later.
    OutageThenBlip {
        until: Duration,
        blip: Duration,
    },
    /// First token at 13 s, tokens/s normal.
    Queueing,
    /// First token on time, 8 tokens/s.
    Throttling,
}

fn healthy(rng: &mut impl Rng) -> Behaviour {
    let first = 1000.0 * (1.0 + rng.gen_range(-0.05..0.05));
    Behaviour {
        headers_after: Duration::from_millis(150),
        first_token_after: Duration::from_secs_f64(first / 1000.0),
        tokens_per_second: 50.0 * (1.0 + rng.gen_range(-0.05..0.05)),
        fault: None,
        version: Version::Current,
        keepalive: true,
    }
}

/// A simulated upstream: acts out one behaviour per call on tokio's clock and records calls.
struct Upstream {
    start: Instant,
    onset: Duration,
    trouble: Trouble,
    clock: Arc<TokioClock>,
    rng: Mutex<rand::rngs::StdRng>,
    calls: Mutex<Vec<(RouteId, OutcomeKind, Duration)>>,
    blipped: Mutex<bool>,
    in_flight: Mutex<HashMap<RouteId, usize>>,
    max_in_flight: Mutex<usize>,
}

impl Upstream {
    fn behaviour(&self, route: &RouteId, elapsed: Duration) -> Behaviour {
        let mut b = healthy(&mut *self.rng.lock().unwrap());
        if elapsed < self.onset {
            return b;
        }
        let fail = |b: &mut Behaviour, after: Duration| {
            b.headers_after = after;
            b.first_token_after = after;
            b.fault = Some(Fault::Status(503));
        };
        match self.trouble {
            Trouble::None => {}
            Trouble::HardOutage => fail(&mut b, Duration::from_millis(40)),
            Trouble::Blip => {
                let mut done = self.blipped.lock().unwrap();
                if !*done {
                    *done = true;
                    fail(&mut b, Duration::from_millis(40));
                }
            }
            Trouble::OutageThenBlip { until, blip } => {
                if *route != route_id(0) {
                    if elapsed < until {
                        fail(&mut b, Duration::from_millis(40));
                    }
                } else if elapsed >= blip {
                    let mut done = self.blipped.lock().unwrap();
                    if !*done {
                        *done = true;
                        fail(&mut b, Duration::from_millis(40));
                    }
                }
            }
            Trouble::HangThen503 { release } => {
                let wait = release.saturating_sub(elapsed);
                fail(&mut b, wait.max(Duration::from_millis(40)));
            }
            Trouble::Queueing => b.first_token_after = Duration::from_secs(13),
            Trouble::Throttling => b.tokens_per_second = 8.0,
        }
        b
    }
}

impl Prober for Upstream {
    fn probe<'a>(&'a self, route: &'a Route, kind: OutcomeKind) -> BoxFuture<'a, ProbeOutcome> {
        Box::pin(async move {
            let elapsed = self.start.elapsed();
            self.calls
                .lock()
                .unwrap()
                .push((route.id.clone(), kind, elapsed));
            {
                let mut f = self.in_flight.lock().unwrap();
                let n = f.entry(route.id.clone()).or_default();
                *n += 1;
                let mut m = self.max_in_flight.lock().unwrap();
                *m = (*m).max(*n);
            }
            let started_at = self.clock.now();
            let b = self.behaviour(&route.id, elapsed);
            let tokens = if kind == OutcomeKind::Throughput {
                80
            } else {
                3
            };
            let outcome = if b.fails() {
                tokio::time::sleep(b.headers_after).await;
                ProbeOutcome {
                    route: route.id.clone(),
                    kind,
                    started_at,
                    success: false,
                    attributed_to: None,
                    verified: None,
                    ttfb_ms: Some(b.headers_after.as_secs_f64() * 1000.0),
                    ttft_ms: None,
                    total_ms: b.headers_after.as_secs_f64() * 1000.0,
                    output_tokens: None,
                    tokens_estimated: false,
                    tokens_per_second: None,
                    model_reported: None,
                    system_fingerprint: None,
                    http_status: Some(503),
                    error: Some(ProbeError::Http {
                        status: 503,
                        message: "overloaded".into(),
                    }),
                    answer: None,
                    first_answer_ms: None,
                    max_tokens_exhausted: false,
                    ratelimit: None,
                }
            } else {
                let total = b.total(tokens);
                tokio::time::sleep(total).await;
                ProbeOutcome {
                    route: route.id.clone(),
                    kind,
                    started_at,
                    success: true,
                    attributed_to: None,
                    verified: Some(true),
                    ttfb_ms: Some(b.headers_after.as_secs_f64() * 1000.0),
                    ttft_ms: Some(b.first_token_after.as_secs_f64() * 1000.0),
                    total_ms: total.as_secs_f64() * 1000.0,
                    output_tokens: Some(tokens as u32),
                    tokens_estimated: false,
                    tokens_per_second: (tokens >= 8).then_some(b.tokens_per_second),
                    model_reported: None,
                    system_fingerprint: None,
                    http_status: Some(200),
                    error: None,
                    answer: Some("PROBE_OK".into()),
                    first_answer_ms: None,
                    max_tokens_exhausted: false,
                    ratelimit: None,
                }
            };
            *self.in_flight.lock().unwrap().get_mut(&route.id).unwrap() -= 1;
            outcome
        })
    }
}

/// A route with a learned day: probes (first token ~1 s, ~1.04 s total) and throughput
/// probes (~50 tokens/s), NORMAL at t0.
fn warmed(det: &Detector, cfg: &DetectionConfig, id: &RouteId) -> (RouteHealth, Baseline) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let start = t0() - chrono::Duration::hours(2);
    let mut h = det.route(id.clone(), start);
    let mut b = Baseline::new(id.clone(), cfg);
    for i in 0..240 {
        let when = start + chrono::Duration::seconds(30 * i);
        let hb = healthy(&mut rng);
        let kind = if i % 10 == 5 {
            OutcomeKind::Throughput
        } else {
            OutcomeKind::Probe
        };
        let tokens = if kind == OutcomeKind::Throughput {
            80
        } else {
            3
        };
        let o = ProbeOutcome {
            route: id.clone(),
            kind,
            started_at: when,
            success: true,
            attributed_to: None,
            verified: Some(true),
            ttfb_ms: Some(150.0),
            ttft_ms: Some(hb.first_token_after.as_secs_f64() * 1000.0),
            total_ms: hb.total(tokens).as_secs_f64() * 1000.0,
            output_tokens: Some(tokens as u32),
            tokens_estimated: false,
            tokens_per_second: (tokens >= 8).then_some(hb.tokens_per_second),
            model_reported: None,
            system_fingerprint: None,
            http_status: Some(200),
            error: None,
            answer: Some("PROBE_OK".into()),
            first_answer_ms: None,
            max_tokens_exhausted: false,
            ratelimit: None,
        };
        det.ingest(&mut h, &mut b, &o, when);
    }
    assert_eq!(h.state(), State::Normal);
    (h, b)
}

/// What a run saw: transitions with their tokio time, and every call to the upstream.
struct Run {
    transitions: Vec<(Duration, Transition)>,
    calls: Vec<(RouteId, OutcomeKind, Duration)>,
    max_in_flight: usize,
}

impl Run {
    fn first(&self, route: &RouteId, to: State) -> Option<&(Duration, Transition)> {
        self.transitions
            .iter()
            .find(|(_, t)| t.route == *route && t.to == to)
    }
}

/// Runs `n` routes for `length` with `trouble` from `onset`, feeding outcomes through the
/// detector (and a tick every second) as the health service does.
async fn run(n: usize, trouble: Trouble, onset: Duration, length: Duration) -> Run {
    let start = Instant::now();
    let clock = Arc::new(TokioClock { start });
    let cfg = DetectionConfig::default();
    let det = Detector::new(&cfg);
    let routes: Vec<Arc<Route>> = (0..n).map(route).collect();
    let mut state: HashMap<RouteId, (RouteHealth, Baseline)> = routes
        .iter()
        .map(|r| (r.id.clone(), warmed(&det, &cfg, &r.id)))
        .collect();
    let upstream = Arc::new(Upstream {
        start,
        onset,
        trouble,
        clock: clock.clone(),
        rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(11)),
        calls: Mutex::new(Vec::new()),
        blipped: Mutex::new(false),
        in_flight: Mutex::new(HashMap::new()),
        max_in_flight: Mutex::new(0),
    });
    let (events_tx, mut events) = mpsc::channel(1024);
    let (confirm_tx, confirm_rx) = mpsc::channel(1024);
    let shutdown = CancellationToken::new();
    let opts = SchedulerOptions {
        max_concurrency: 256,
        max_confirmations: cfg.degraded_after,
        ..SchedulerOptions::default()
    };
    let sched = tokio::spawn(run_with_confirmations(
        routes,
        upstream.clone(),
        clock.clone(),
        events_tx,
        opts,
        confirm_rx,
        shutdown.clone(),
    ));
    let mut transitions = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let deadline = tokio::time::sleep(length);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            _ = tick.tick() => {
                let now = clock.now();
                for (h, _) in state.values_mut() {
                    if let Some(t) = det.tick(h, now) {
                        transitions.push((start.elapsed(), t));
                    }
                }
            }
            e = events.recv() => match e {
                Some(SchedulerEvent::Outcome(o)) => {
                    let now = clock.now();
                    let (h, b) = state.get_mut(&o.route).unwrap();
                    if let Some(t) = det.ingest(h, b, &o, now) {
                        transitions.push((start.elapsed(), t));
                    }
                    if let Some(kind) = confirm::confirmation(h, &o, &cfg) {
                        // As the health service asks: a full queue drops the request
                        // rather than wait on a scheduler that may be waiting on us.
                        let _ = confirm_tx.try_send(Confirm { route: o.route.clone(), kind });
                    }
                }
                Some(_) => {}
                None => break,
            },
        }
    }
    shutdown.cancel();
    sched.await.unwrap();
    let calls = upstream.calls.lock().unwrap().clone();
    let max_in_flight = *upstream.max_in_flight.lock().unwrap();
    Run {
        transitions,
        calls,
        max_in_flight,
    }
}

/// A hard outage reaches DEGRADED within 1.5 intervals of its onset wherever the onset falls
/// in the probe interval, and CRITICAL only by the existing rules (here two minutes DEGRADED
/// without a normal observation: probes alone are too few for the error rate to judge).
#[tokio::test(start_paused = true)]
async fn hard_outage_is_degraded_within_one_and_a_half_intervals() {
    let id = route(0).id.clone();
    for phase in [1, 8, 15, 22, 29] {
        let onset = Duration::from_secs(60 + phase);
        let r = run(1, Trouble::HardOutage, onset, Duration::from_secs(400)).await;
        let (td, d) = r.first(&id, State::Degraded).expect("DEGRADED");
        let took = *td - onset;
        assert!(
            took <= INTERVAL * 3 / 2,
            "onset +{phase} s: DEGRADED after {took:?}"
        );
        assert_eq!(d.reason.code, "probe_failed");
        let (tc, c) = r.first(&id, State::Critical).expect("CRITICAL");
        assert_eq!(c.reason.code, "degraded_too_long");
        let dwell = *tc - *td;
        assert!(
            (Duration::from_secs(120)..Duration::from_secs(122)).contains(&dwell),
            "{dwell:?}"
        );
        assert_eq!(r.max_in_flight, 1);
        // Once DEGRADED the route is back on its grid: no confirmation after it.
        let after: Vec<_> = r
            .calls
            .iter()
            .filter(|(_, _, at)| *at > *td + Duration::from_secs(1))
            .collect();
        let grid_like = after
            .windows(2)
            .all(|w| w[1].2 - w[0].2 >= Duration::from_secs(14));
        assert!(grid_like, "{after:?}");
    }
}

/// One failed probe, then healthy confirmations: WARNING and back, never DEGRADED; the
/// healthy route before it cost no extra probe.
#[tokio::test(start_paused = true)]
async fn a_single_abnormal_probe_never_leaves_warning() {
    let id = route(0).id.clone();
    let onset = Duration::from_secs(100);
    let r = run(1, Trouble::Blip, onset, Duration::from_secs(300)).await;
    let states: Vec<State> = r.transitions.iter().map(|(_, t)| t.to).collect();
    assert_eq!(states, vec![State::Warning, State::Normal], "{states:?}");
    let (tw, _) = r.first(&id, State::Warning).unwrap();
    let (tn, _) = r.first(&id, State::Normal).unwrap();
    // The confirmation, 5 s after the failure, ended it.
    assert!(*tn - *tw < Duration::from_secs(7), "{:?}", *tn - *tw);
    let probes = |from: Duration, to: Duration| {
        r.calls
            .iter()
            .filter(|(_, k, at)| *k == OutcomeKind::Probe && (from..to).contains(at))
            .count()
    };
    // Before the onset: exactly the grid (one per 30 s).
    assert_eq!(probes(Duration::ZERO, onset), 4);
    // The failed grid probe plus one confirmation.
    assert_eq!(probes(onset, onset + INTERVAL), 2);
}

/// A healthy day costs nothing extra: no call off the grid.
#[tokio::test(start_paused = true)]
async fn healthy_routes_get_no_confirmations() {
    let r = run(3, Trouble::None, Duration::MAX, Duration::from_secs(3600)).await;
    assert!(r.transitions.is_empty(), "{:?}", r.transitions);
    let probes = r
        .calls
        .iter()
        .filter(|(_, k, _)| *k == OutcomeKind::Probe)
        .count();
    assert_eq!(probes, 3 * 120);
}

/// 100 routes of one provider failing at the same instant: their confirmations are spread
/// over the confirmation window by the global pacing, not fired at once, and no route ever
/// has two probes in flight.
#[tokio::test(start_paused = true)]
async fn confirmations_of_a_provider_wide_outage_are_spread() {
    let release = Duration::from_secs(90);
    let r = run(
        100,
        Trouble::HangThen503 { release },
        Duration::from_secs(60),
        Duration::from_secs(130),
    )
    .await;
    assert_eq!(r.max_in_flight, 1);
    let after: Vec<Duration> = r
        .calls
        .iter()
        .filter(|(_, _, at)| *at > release && *at < release + Duration::from_secs(20))
        .map(|(_, _, at)| *at)
        .collect();
    // Confirmations: the calls at or after `release + confirm_after` that are not grid ticks
    // (grid ticks of 100 routes are 0.3 s apart: at most one in any 100 ms).
    let window = INTERVAL / 6;
    let confirmations = after.iter().filter(|at| **at >= release + window).count();
    assert!(
        confirmations >= 40,
        "{confirmations} calls after the window"
    );
    let most_in_100ms = after
        .iter()
        .map(|a| {
            after
                .iter()
                .filter(|b| **b >= *a && **b < *a + Duration::from_millis(100))
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(most_in_100ms <= 4, "{most_in_100ms} calls within 100 ms");
    let first = after
        .iter()
        .filter(|at| **at >= release + window)
        .min()
        .copied()
        .unwrap();
    let last = after
        .iter()
        .filter(|at| **at >= release + window)
        .max()
        .copied()
        .unwrap();
    assert!(first - release >= window, "{:?}", first - release);
    assert!(last - first >= Duration::from_secs(2), "{:?}", last - first);
    // Without the grid, every route failing at once would have confirmed in one instant.
    let degraded = r
        .transitions
        .iter()
        .filter(|(_, t)| t.to == State::Degraded)
        .count();
    assert!(degraded >= 90, "{degraded} routes DEGRADED");
}

/// Queueing (first token 13 s, tokens/s fine) and throttling (8 tokens/s, first token on
/// time) look alike from a `PROBE_OK` probe; the throughput confirmation tells them apart.
#[tokio::test(start_paused = true)]
async fn queueing_and_throttling_have_their_own_reasons() {
    let id = route(0).id.clone();
    let onset = Duration::from_secs(61);
    let q = run(1, Trouble::Queueing, onset, Duration::from_secs(240)).await;
    let (tw, w) = q.first(&id, State::Warning).unwrap();
    assert_eq!(w.reason.code, "latency_above_baseline", "{}", w.reason.text);
    // The confirmation after the abnormal latency is a throughput probe.
    let next = q
        .calls
        .iter()
        .find(|(_, _, at)| *at > *tw)
        .map(|(_, k, _)| *k);
    assert_eq!(next, Some(OutcomeKind::Throughput));
    let (td, d) = q.first(&id, State::Degraded).unwrap();
    assert_eq!(d.reason.code, "ttft_above_baseline", "{}", d.reason.text);
    assert!(d.reason.text.contains("queueing"), "{}", d.reason.text);
    assert!(*td - onset <= INTERVAL * 3, "{:?}", *td - onset);

    // Throttling: the PROBE_OK probes barely move; the throughput grid finds it, throughput
    // confirmations confirm it.
    let t = run(1, Trouble::Throttling, onset, Duration::from_secs(700)).await;
    let (tw, _) = t.first(&id, State::Warning).unwrap();
    let (td, d) = t.first(&id, State::Degraded).unwrap();
    assert_eq!(d.reason.code, "tps_below_baseline", "{}", d.reason.text);
    assert!(d.reason.text.contains("8.0 tokens/s"), "{}", d.reason.text);
    // Two throughput confirmations of ~11 s each, 5 s apart, instead of ten minutes of
    // throughput grid.
    assert!(*td - *tw <= INTERVAL * 3 / 2, "{:?}", *td - *tw);
    let confirmations = t
        .calls
        .iter()
        .filter(|(_, k, at)| *k == OutcomeKind::Throughput && *at > *tw && *at < *td)
        .count();
    assert_eq!(confirmations, 2);
}

/// The probes off each route's grid (its first probe, then every 30 s: no jitter): the
/// confirmations, with their time.
fn confirmations(calls: &[(RouteId, OutcomeKind, Duration)]) -> Vec<(RouteId, Duration)> {
    let mut grid: HashMap<&RouteId, Duration> = HashMap::new();
    let mut found = Vec::new();
    for (id, _, at) in calls.iter().filter(|(_, k, _)| *k == OutcomeKind::Probe) {
        let first = *grid.entry(id).or_insert(*at);
        let off = (*at - first).as_millis() % INTERVAL.as_millis();
        if off > 10 && off < INTERVAL.as_millis() - 10 {
            found.push((id.clone(), *at));
        }
    }
    found
}

/// 2,000 routes failing at once ask for far more confirmations than the pacing (20 a second)
/// can start before their next grid probes. Only the slots that can be used are booked: the
/// confirmations go on through the whole outage instead of stopping once the first wave has
/// booked the pacer minutes ahead, and a route of another model failing after the outage is
/// confirmed as promptly as on a quiet day.
#[tokio::test(start_paused = true)]
async fn a_large_outage_does_not_book_the_confirmations_of_later_failures() {
    let onset = Duration::from_secs(60);
    let until = Duration::from_secs(180);
    let blip = Duration::from_secs(200);
    let r = run(
        2_001,
        Trouble::OutageThenBlip { until, blip },
        onset,
        Duration::from_secs(300),
    )
    .await;
    let found = confirmations(&r.calls);
    // Every 10 s of the outage after its first confirmations: close to the pacing's 200.
    let per_10s: Vec<usize> = (60..180)
        .step_by(10)
        .map(|from| {
            let (a, b) = (Duration::from_secs(from), Duration::from_secs(from + 10));
            found.iter().filter(|(_, at)| (a..b).contains(at)).count()
        })
        .collect();
    eprintln!("confirmations per 10 s from the onset: {per_10s:?}");
    // Never more than the pacing allows; never none while routes still wait for a verdict
    // (every route is DEGRADED three grid probes after the onset, by 150 s).
    assert!(per_10s.iter().all(|n| *n <= 201), "{per_10s:?}");
    assert!(per_10s[1..9].iter().all(|n| *n >= 50), "{per_10s:?}");
    // The lone failure after the outage (of a route that was not in it): its confirmation
    // follows `confirm_after` later.
    let id = route_id(0);
    let failed = r
        .calls
        .iter()
        .find(|(c, k, at)| *c == id && *k == OutcomeKind::Probe && *at >= blip)
        .map(|(_, _, at)| *at)
        .expect("the first route's probe after the blip");
    let confirmed = found
        .iter()
        .find(|(c, at)| *c == id && *at > failed)
        .map(|(_, at)| *at)
        .expect("a confirmation of the lone failure");
    let took = confirmed - failed;
    assert!(
        took <= INTERVAL / 6 + Duration::from_secs(1),
        "confirmed {took:?} after the failure"
    );
    assert_eq!(r.max_in_flight, 1);
}
