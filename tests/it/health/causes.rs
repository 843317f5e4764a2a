//! Shared causes end to end on a paused clock: the real scheduler (grid, confirmation pacer)
//! probes every route through a simulated upstream, and the real health service judges what
//! comes back — so the figures are those of the product's own loop: how soon a provider-wide
//! outage is judged, how many confirmation probes it costs, and who is never dragged along.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use common::app::{config, Spec};
use futures_util::future::BoxFuture;
use probeok::alert::tally::Tally;
use probeok::alert::{self, AlertService, Severity};
use probeok::clock::Clock;
use probeok::config::Config;
use probeok::health::service::{HealthOptions, HealthService};
use probeok::health::{HealthEvent, HealthSnapshot, State, Transition};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::{Route, RouteId};
use probeok::scheduler::{run_with_confirmations, Prober, SchedulerEvent, SchedulerOptions};
use probeok::store::{Store, StoreOptions};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const INTERVAL: Duration = Duration::from_secs(30);
/// Four healthy rounds first: every route NORMAL (`min_samples` lowered to 3).
const ONSET: Duration = Duration::from_secs(127);

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 6, 30, 0).unwrap()
}

struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        t0() + chrono::Duration::from_std(self.0.elapsed()).unwrap()
    }
}

type Trouble = Box<dyn Fn(&RouteId, Duration) -> Option<ProbeError> + Send + Sync>;

/// The upstream: healthy answers (100 ms, `PROBE_OK`) unless `trouble` says how a call to
/// this route at this time fails; every call recorded with its tokio time.
struct Sim {
    start: Instant,
    clock: Arc<TokioClock>,
    trouble: Trouble,
    calls: Mutex<Vec<(RouteId, OutcomeKind, Duration)>>,
}

fn refused() -> ProbeError {
    ProbeError::Connect {
        message: "error sending request: client error (Connect): tcp connect error: Connection refused (os error 111)".into(),
    }
}

fn http(status: u16) -> ProbeError {
    ProbeError::Http {
        status,
        message: "upstream overloaded".into(),
    }
}

impl Prober for Sim {
    fn probe<'a>(&'a self, route: &'a Route, kind: OutcomeKind) -> BoxFuture<'a, ProbeOutcome> {
        Box::pin(async move {
            let elapsed = self.start.elapsed();
            self.calls
                .lock()
                .unwrap()
                .push((route.id.clone(), kind, elapsed));
            let started_at = self.clock.now();
            let throughput = kind == OutcomeKind::Throughput;
            let error = (self.trouble)(&route.id, elapsed);
            let took = match (&error, throughput) {
                (Some(_), _) => Duration::from_millis(2),
                (None, false) => Duration::from_millis(100),
                (None, true) => Duration::from_millis(1_680),
            };
            tokio::time::sleep(took).await;
            let ok = error.is_none();
            let ms = took.as_secs_f64() * 1000.0;
            let tokens = if throughput { 80 } else { 3 };
            ProbeOutcome {
                route: route.id.clone(),
                kind,
                started_at,
                success: ok,
                attributed_to: None,
                verified: ok.then_some(true),
                ttfb_ms: ok.then_some(50.0),
                ttft_ms: ok.then_some(80.0),
                first_answer_ms: ok.then_some(80.0),
                total_ms: ms,
                output_tokens: ok.then_some(tokens),
                tokens_estimated: false,
                tokens_per_second: (ok && throughput).then_some(50.0),
                model_reported: None,
                system_fingerprint: None,
                http_status: match &error {
                    None => Some(200),
                    Some(e) => e.status(),
                },
                answer: ok.then(|| "PROBE_OK".into()),
                error,
                max_tokens_exhausted: false,
                ratelimit: None,
            }
        })
    }
}

/// What one run of the service saw.
struct Run {
    /// Transitions with their tokio time since the sim's start.
    transitions: Vec<(Duration, Transition)>,
    last: Arc<HealthSnapshot>,
}

impl Run {
    fn first(&self, route: &RouteId, at_least: State) -> Option<Duration> {
        self.transitions
            .iter()
            .find(|(_, t)| t.route == *route && t.to >= at_least)
            .map(|(d, _)| *d)
    }
}

/// `regions` × `models` routes of provider `acme` (`model-{m % 20}` the logical models).
fn fleet(dir: &std::path::Path, regions: usize, models: usize) -> Config {
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let specs: Vec<Spec<'static>> = (0..regions)
        .flat_map(|r| (0..models).map(move |m| (r, m)))
        .map(|(r, m)| {
            Spec::new("acme", leak(format!("r{r}")), leak(format!("m{m}")))
                .serves(leak(format!("model-{}", m % 20)))
                .weight(50)
        })
        .collect();
    let mut cfg = config(&specs, &dir.join("c.db"));
    cfg.detection.min_samples = 3;
    cfg
}

/// Runs the scheduler and the health service over `store` until `until` (the sim's time).
async fn run(cfg: &Config, store: &Store, sim: Arc<Sim>, until: Duration) -> Run {
    run_with(cfg, store, sim, until, None).await
}

/// The alert engine beside detection: its burn-rate windows kept from the outcomes as the
/// service's recorder keeps them.
struct Alerts {
    service: Arc<AlertService>,
    tally: Arc<Tally>,
}

async fn run_with(
    cfg: &Config,
    store: &Store,
    sim: Arc<Sim>,
    until: Duration,
    alerts: Option<Alerts>,
) -> Run {
    let (events, mut events_rx) = broadcast::channel(1 << 17);
    let alert_rx = events.subscribe();
    let mut service = HealthService::restore(
        cfg,
        HealthOptions::default(),
        store,
        sim.clock.clone(),
        events,
    )
    .await
    .unwrap();
    let confirms = service.confirmations();
    let rx = service.subscribe();
    let (inputs_tx, inputs) = mpsc::channel(4096);
    let shutdown = CancellationToken::new();
    let health = tokio::spawn(service.run(inputs, shutdown.clone()));
    let (sched_tx, mut sched_rx) = mpsc::channel(4096);
    let routes: Vec<Arc<Route>> = cfg.routes().into_iter().map(Arc::new).collect();
    let sched = tokio::spawn(run_with_confirmations(
        routes,
        sim.clone(),
        sim.clock.clone(),
        sched_tx,
        SchedulerOptions {
            max_confirmations: cfg.detection.degraded_after,
            ..SchedulerOptions::default()
        },
        confirms,
        shutdown.clone(),
    ));
    let tally = alerts.as_ref().map(|a| a.tally.clone());
    let alerting = alerts.map(|a| tokio::spawn(alert::run(a.service, alert_rx, shutdown.clone())));
    // The recorder's part: outcomes from the scheduler to detection, in order.
    let forward = tokio::spawn(async move {
        while let Some(e) = sched_rx.recv().await {
            if let SchedulerEvent::Outcome(o) = e {
                if let Some(t) = &tally {
                    t.record(&o);
                }
                if inputs_tx.send(o).await.is_err() {
                    break;
                }
            }
        }
    });
    let start = sim.start;
    let collect = tokio::spawn(async move {
        let mut out = Vec::new();
        loop {
            match events_rx.recv().await {
                Ok(HealthEvent::Transition { transition, .. }) => {
                    out.push((start.elapsed(), *transition));
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => panic!("lost {n} events"),
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
        out
    });
    tokio::time::sleep_until(start + until).await;
    shutdown.cancel();
    sched.await.unwrap();
    forward.await.unwrap();
    health.await.unwrap();
    if let Some(a) = alerting {
        a.await.unwrap();
    }
    let transitions = collect.await.unwrap();
    let last = rx.borrow().clone();
    Run { transitions, last }
}

fn sim(trouble: Trouble) -> Arc<Sim> {
    let start = Instant::now();
    Arc::new(Sim {
        start,
        clock: Arc::new(TokioClock(start)),
        trouble,
        calls: Mutex::new(Vec::new()),
    })
}

/// Confirmations from `from` on: `PROBE_OK` calls less than 20 s after the same route's
/// previous one (grid probes are an interval apart; throughput probes, half an interval after
/// the grid, are another kind).
fn confirmations(sim: &Sim, from: Duration) -> Vec<Duration> {
    let mut last: HashMap<RouteId, Duration> = HashMap::new();
    let mut out = Vec::new();
    for (route, kind, at) in sim.calls.lock().unwrap().iter() {
        if *kind != OutcomeKind::Probe {
            continue;
        }
        if let Some(prev) = last.insert(route.clone(), *at) {
            if *at >= from && *at - prev < Duration::from_secs(20) {
                out.push(*at);
            }
        }
    }
    out
}

/// The most of `times` in any one-second window.
fn peak_per_second(times: &[Duration]) -> usize {
    let mut t: Vec<Duration> = times.to_vec();
    t.sort();
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..t.len() {
        while t[hi] - t[lo] >= Duration::from_secs(1) {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(start_paused = true)]
async fn a_provider_refusing_connections_is_judged_within_one_and_a_half_intervals_for_a_handful_of_confirmations(
) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fleet(dir.path(), 1, 2_000);
    let store = Store::open(&cfg.storage.path, StoreOptions::default()).unwrap();
    // Every route but m0 is refused from the onset; m0 keeps answering (another backend).
    let spared = RouteId::new("acme", "r0", "m0");
    let s = sim(Box::new(move |route, at| {
        (at >= ONSET && *route != RouteId::new("acme", "r0", "m0")).then(refused)
    }));
    let r = run(&cfg, &store, s.clone(), ONSET + Duration::from_secs(80)).await;

    assert!(
        r.transitions
            .iter()
            .all(|(at, t)| *at >= ONSET || t.to <= State::Normal),
        "nothing left NORMAL before the onset"
    );
    let mut took: Vec<Duration> = Vec::new();
    for route in cfg.routes().iter().map(|r| &r.id) {
        if *route == spared {
            continue;
        }
        let at = r
            .first(route, State::Degraded)
            .expect("every refused route DEGRADED");
        took.push(at - ONSET);
    }
    took.sort();
    let (p50, p95, p99, max) = (
        quantile(&took, 0.5),
        quantile(&took, 0.95),
        quantile(&took, 0.99),
        *took.last().unwrap(),
    );
    let confirms = confirmations(&s, ONSET);
    eprintln!(
        "2,000 routes refused: DEGRADED p50 {p50:?}, p95 {p95:?}, p99 {p99:?}, all {max:?} after \
         the onset; {} confirmation probes, at most {} in one second",
        confirms.len(),
        peak_per_second(&confirms)
    );
    assert!(max <= INTERVAL * 3 / 2, "the last route took {max:?}");
    assert!(confirms.len() <= 20, "{} confirmations", confirms.len());
    assert!(peak_per_second(&confirms) <= 20);

    // Judged on the group's evidence, and saying so.
    let shared: Vec<&Transition> = r
        .transitions
        .iter()
        .map(|(_, t)| t)
        .filter(|t| t.reason.code == "shared_cause")
        .collect();
    assert!(
        shared.len() >= 1_900,
        "{} judged on the group",
        shared.len()
    );
    let text = &shared.last().unwrap().reason.text;
    assert!(
        text.starts_with("connection refused at 127.0.0.1:9 for ")
            && text.contains(" routes, confirmed on "),
        "{text}"
    );
    // Shown with its cause while in it; the spared route never moved.
    for s in &r.last.routes {
        if s.route == spared {
            assert_eq!(s.state, State::Normal);
            assert_eq!(s.cause, None);
        } else {
            assert!(s.state >= State::Degraded, "{} is {:?}", s.route, s.state);
            assert_eq!(s.cause.as_deref(), Some("acme/r0:connection_refused"));
        }
    }
    assert!(r.first(&spared, State::Warning).is_none());
    store.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn one_models_503s_move_that_models_routes_only_and_at_the_schedules_rate() {
    let dir = tempfile::tempdir().unwrap();
    // 100 regions × 20 models: m3 fails everywhere (100 routes), everything else answers.
    let cfg = fleet(dir.path(), 100, 20);
    let store = Store::open(&cfg.storage.path, StoreOptions::default()).unwrap();
    let failing = |r: &RouteId| r.split().2 == "m3";
    let s = sim(Box::new(move |route, at| {
        (at >= ONSET && failing(route)).then(|| http(503))
    }));
    let r = run(&cfg, &store, s.clone(), ONSET + Duration::from_secs(80)).await;
    let mut judged = 0;
    for route in cfg.routes().iter().map(|r| &r.id) {
        if failing(route) {
            let at = r.first(route, State::Degraded).expect("DEGRADED");
            assert!(
                at - ONSET <= INTERVAL * 3 / 2,
                "{route} took {:?}",
                at - ONSET
            );
            judged += 1;
        } else {
            assert!(
                r.first(route, State::Warning).is_none(),
                "{route} left NORMAL"
            );
        }
    }
    assert_eq!(judged, 100);
    // The request rate against the provider: the schedule's (2,000 routes every 30 s) in any
    // 10-second window, and at most 1.5 times that through the outage.
    let calls: Vec<Duration> = s.calls.lock().unwrap().iter().map(|(_, _, t)| *t).collect();
    let per_window = |from: Duration| {
        calls
            .iter()
            .filter(|t| **t >= from && **t < from + Duration::from_secs(10))
            .count()
    };
    let schedule = 2_000.0 / 3.0;
    let peak = (0..8)
        .map(|k| per_window(ONSET + Duration::from_secs(10 * k)))
        .max()
        .unwrap();
    eprintln!(
        "one model's 100 routes at 503: peak {:.2}× the schedule's request rate",
        peak as f64 / schedule
    );
    assert!(peak as f64 <= 1.5 * schedule, "{peak} calls in 10 s");
    store.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn one_region_down_moves_its_routes_and_no_other_regions() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fleet(dir.path(), 2, 200);
    let store = Store::open(&cfg.storage.path, StoreOptions::default()).unwrap();
    let down = |r: &RouteId| r.split().1 == "r1";
    let s = sim(Box::new(move |route, at| {
        (at >= ONSET && down(route)).then(refused)
    }));
    let r = run(&cfg, &store, s, ONSET + Duration::from_secs(80)).await;
    for route in cfg.routes().iter().map(|r| &r.id) {
        if down(route) {
            let at = r.first(route, State::Degraded).expect("DEGRADED");
            assert!(at - ONSET <= INTERVAL * 3 / 2);
        } else {
            assert!(r.first(route, State::Warning).is_none(), "{route} moved");
        }
    }
    let causes: Vec<Option<&str>> = r.last.routes.iter().map(|s| s.cause.as_deref()).collect();
    assert!(causes[..200].iter().all(Option::is_none));
    assert!(causes[200..]
        .iter()
        .all(|c| *c == Some("acme/r1:connection_refused")));
    store.close().await.unwrap();
}

/// After the endpoint answers again each route leaves the group with its own first success
/// and recovers after its own `recover_after` of normal probes: one success heals nobody else.
#[tokio::test(start_paused = true)]
async fn a_group_heals_route_by_route() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fleet(dir.path(), 1, 200);
    let recover_after = cfg.detection.recover_after;
    let store = Store::open(&cfg.storage.path, StoreOptions::default()).unwrap();
    let back = ONSET + Duration::from_secs(90);
    let s = sim(Box::new(move |_, at| {
        (at >= ONSET && at < back).then(refused)
    }));
    // Failures must also leave the error window before the rate allows recovery.
    let end = back + cfg.detection.error_window + recover_after + INTERVAL * 2;
    let r = run(&cfg, &store, s.clone(), end).await;
    let mut recovered = Vec::new();
    for route in cfg.routes().iter().map(|r| &r.id) {
        let degraded = r.first(route, State::Degraded).expect("DEGRADED");
        let normal = r
            .transitions
            .iter()
            .find(|(at, t)| *at > degraded && t.route == *route && t.to == State::Normal)
            .map(|(at, _)| *at)
            .expect("recovered");
        // Its own first success after the outage, then `recover_after` of them.
        let first_ok = s
            .calls
            .lock()
            .unwrap()
            .iter()
            .find(|(id, _, at)| id == route && *at >= back)
            .map(|(_, _, at)| *at)
            .unwrap();
        assert!(
            normal >= first_ok + recover_after,
            "{route} recovered {:?} after its first success",
            normal - first_ok
        );
        recovered.push(normal);
    }
    recovered.sort();
    let spread = *recovered.last().unwrap() - recovered[0];
    assert!(
        spread >= INTERVAL / 2,
        "routes recovered within {spread:?} of each other: healed together"
    );
    assert!(r.last.routes.iter().all(|s| s.cause.is_none()));
    store.close().await.unwrap();
}

/// A monitor restarted in the middle of a group's outage resumes it: no route is decided
/// again on one probe, none leaves DEGRADED while the outage lasts.
#[tokio::test(start_paused = true)]
async fn a_restart_during_a_groups_outage_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fleet(dir.path(), 1, 300);
    let store = Store::open(&cfg.storage.path, StoreOptions::default()).unwrap();
    let s = sim(Box::new(move |_, at| (at >= ONSET).then(refused)));
    let first = run(&cfg, &store, s.clone(), ONSET + Duration::from_secs(60)).await;
    assert!(first.last.routes.iter().all(|r| r.state >= State::Degraded));
    let restart = s.start.elapsed();
    let second = run(&cfg, &store, s.clone(), restart + Duration::from_secs(90)).await;
    assert!(
        second
            .transitions
            .iter()
            .all(|(_, t)| t.to >= State::Degraded),
        "after the restart a route moved below DEGRADED"
    );
    assert!(second
        .last
        .routes
        .iter()
        .all(|r| r.state >= State::Degraded));
    assert!(second
        .last
        .routes
        .iter()
        .all(|r| r.cause.as_deref() == Some("acme/r0:connection_refused")));
    store.close().await.unwrap();
}

/// An address nothing listens on: deliveries fail at once and every message stays in the
/// outbox, where it is counted (a receiver under a paused clock would race its own timeout).
fn refusing() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The whole outage as the on-call hears it: 2,000 routes refused for four minutes go
/// DEGRADED, then CRITICAL, burn their error budget and recover route by route — and each
/// channel is handed three messages: the outage, its worsening and its end.
#[tokio::test(start_paused = true)]
async fn a_provider_wide_outage_is_three_messages_per_channel_burn_rates_included() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = fleet(dir.path(), 1, 2_000);
    // Back to NORMAL sooner than the default five minutes: a shorter run, the same story.
    cfg.detection.recover_after = Duration::from_secs(120);
    let store = Store::open(&cfg.storage.path, StoreOptions::default()).unwrap();
    let back = ONSET + Duration::from_secs(4 * 60);
    let spared = RouteId::new("acme", "r0", "m0");
    let s = sim(Box::new(move |route, at| {
        (at >= ONSET && at < back && *route != RouteId::new("acme", "r0", "m0")).then(refused)
    }));
    let channels = vec![
        common::alerts::webhook("webhook[0]", refusing(), None, Severity::Warning),
        common::oncall::pagerduty_channel(refusing()),
    ];
    let ids: Vec<RouteId> = cfg.routes().into_iter().map(|r| r.id).collect();
    let tally = Arc::new(Tally::new(&ids, cfg.slo.latency_threshold));
    let service = Arc::new(
        AlertService::new(
            Arc::new(cfg.clone()),
            store.clone(),
            s.clock.clone(),
            channels,
        )
        .with_tally(tally.clone()),
    );
    let r = run_with(
        &cfg,
        &store,
        s.clone(),
        back + Duration::from_secs(8 * 60),
        Some(Alerts { service, tally }),
    )
    .await;

    // The outage happened as the product judges it: every refused route CRITICAL, then back.
    for route in ids.iter().filter(|r| **r != spared) {
        assert!(
            r.first(route, State::Critical).is_some(),
            "{route} never CRITICAL"
        );
    }
    assert!(
        r.last.routes.iter().all(|s| s.state == State::Normal),
        "all recovered"
    );

    let rows = store.reader().unwrap().outbox_all().unwrap();
    let mut per_channel: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
    for row in &rows {
        let m: serde_json::Value = serde_json::from_str(&row.message).unwrap();
        per_channel.entry(row.channel.clone()).or_default().push(m);
    }
    for (channel, messages) in &per_channel {
        let said: Vec<String> = messages
            .iter()
            .map(|m| {
                format!(
                    "{} {} {} ({} routes)",
                    m["status"],
                    m["severity"],
                    m["subject"]["type"],
                    m["items"].as_array().map_or(0, Vec::len)
                )
            })
            .collect();
        eprintln!("{channel}: {said:?}");
        assert!(messages.len() <= 3, "{channel} was handed {said:?}");
        assert!(
            messages.iter().all(|m| m["subject"]["type"] != "burn_rate"
                && m["subject"]["kind"] != "burn_rate"),
            "{channel}: a burn-rate page of its own: {said:?}"
        );
        let first = &messages[0];
        assert_eq!(first["status"], "firing", "{said:?}");
        let last = messages.last().unwrap();
        assert_eq!(
            last["status"], "resolved",
            "{channel} heard the end: {said:?}"
        );
        let worst = messages
            .iter()
            .filter(|m| m["severity"] == "critical")
            .count();
        assert!(worst >= 1, "{channel} heard it become critical: {said:?}");
    }
    assert_eq!(per_channel.len(), 2, "both channels heard of it");
    // The end names every route that was out, whichever message first named it.
    let end = per_channel["webhook[0]"].last().unwrap();
    let named = end["items"].as_array().unwrap().len();
    assert_eq!(
        named,
        ids.len() - 1,
        "the resolution names every refused route"
    );
    store.close().await.unwrap();
}
