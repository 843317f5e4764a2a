//! The health service (detection's I/O shell) on real SQLite files: outcomes in, snapshots,
//! events and stored transitions out; version stability; passive traffic driving ticks;
//! restart; the egress control probe against a real HTTP server.
//!
//! Time: most tests pause tokio's clock and read "now" from it ([`TokioClock`]), so the
//! service's 1-second ticks and the detector's timestamps move together, only when the test
//! advances them. They never await a store write while the service runs: with a paused clock,
//! a runtime idle on another thread's I/O jumps to the next timer.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::{DateTime, TimeZone, Utc};
use probeok::clock::{Clock, ManualClock};
use probeok::config::Config;
use probeok::health::findings::FindingKind;
use probeok::health::service::{HealthOptions, HealthService, HEARTBEAT_JOB};
use probeok::health::{FailureMode, HealthEvent, HealthRx, RouteHealth, RouteStatus, State};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;
use probeok::store::{Store, StoreOptions};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// 14:30 in Asia/Shanghai (the default timezone).
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 6, 30, 0).unwrap()
}

/// `t0` plus the paused tokio clock's progress since the clock was made.
struct TokioClock {
    start: tokio::time::Instant,
}

impl TokioClock {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            start: tokio::time::Instant::now(),
        })
    }
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        t0() + chrono::Duration::from_std(self.start.elapsed()).unwrap()
    }
}

fn rid(p: &str, region: &str) -> RouteId {
    RouteId::new(p, region, "m")
}

/// A config with these `(provider, region)` routes (model `m`) and an optional control URL.
fn config(db: &std::path::Path, routes: &[(&str, &str)], control: Option<&str>) -> Config {
    let mut src = format!(
        "[storage]\npath = \"{}\"\n\n[probe]\ninterval = \"30s\"\nfirst_byte_timeout = \"2s\"\n\n",
        db.display()
    );
    if let Some(url) = control {
        src.push_str(&format!("[egress]\ncontrol_url = \"{url}\"\n\n"));
    }
    let mut providers: Vec<&str> = routes.iter().map(|(p, _)| *p).collect();
    providers.dedup();
    for p in providers {
        src.push_str(&format!("[[provider]]\nid = \"{p}\"\nkind = \"openai\"\n"));
        for (_, r) in routes.iter().filter(|(q, _)| *q == p) {
            src.push_str(&format!(
                "  [[provider.region]]\n  id = \"{r}\"\n  base_url = \"http://127.0.0.1:9/v1\"\n"
            ));
        }
    }
    for (p, r) in routes {
        src.push_str(&format!(
            "[[route]]\nprovider = \"{p}\"\nregion = \"{r}\"\nmodel = \"m\"\nserves = \"chat\"\n\
             tier = \"primary\"\nweight = 100\n"
        ));
    }
    Config::parse(&src, "test.toml").unwrap().config
}

fn probe(route: &RouteId, when: DateTime<Utc>, total_ms: f64) -> ProbeOutcome {
    ProbeOutcome {
        route: route.clone(),
        kind: OutcomeKind::Probe,
        started_at: when,
        success: true,
        attributed_to: None,
        verified: Some(true),
        ttfb_ms: Some(150.0),
        ttft_ms: Some(total_ms * 0.8),
        total_ms,
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
}

fn failed(mut o: ProbeOutcome) -> ProbeOutcome {
    o.success = false;
    o.verified = None;
    o.http_status = Some(503);
    o.error = Some(ProbeError::Http {
        status: 503,
        message: "overloaded".into(),
    });
    o.answer = None;
    o
}

fn passive_503(route: &RouteId, when: DateTime<Utc>) -> ProbeOutcome {
    let mut o = failed(probe(route, when, 80.0));
    o.kind = OutcomeKind::Passive;
    o
}

/// 30 healthy probes (1.0 s / 1.2 s) 30 s apart before t0, stored as the recorder would
/// have: the restored baseline is ready.
async fn seed(store: &Store, route: &RouteId) {
    let outcomes = (0..30)
        .map(|i| {
            let when = t0() - chrono::Duration::seconds(30 * (30 - i));
            probe(route, when, if i % 2 == 0 { 1000.0 } else { 1200.0 })
        })
        .collect();
    store.writer().record_many(outcomes).await.unwrap();
}

/// A started service and the ends a consumer holds.
struct Svc {
    tx: Option<mpsc::Sender<ProbeOutcome>>,
    rx: HealthRx,
    events: broadcast::Receiver<HealthEvent>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Svc {
    async fn start(
        config: &Config,
        store: &Store,
        clock: Arc<dyn Clock>,
        opts: HealthOptions,
    ) -> Svc {
        let (events_tx, events) = broadcast::channel(256);
        let service = HealthService::restore(config, opts, store, clock, events_tx)
            .await
            .unwrap();
        let rx = service.subscribe();
        let (tx, inputs) = mpsc::channel(1024);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(service.run(inputs, shutdown.clone()));
        // Let it start its timers now, as a service does at startup.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        Svc {
            tx: Some(tx),
            rx,
            events,
            shutdown,
            task,
        }
    }

    /// Sends one outcome and lets the service judge it before returning.
    async fn send(&self, o: ProbeOutcome) {
        self.tx.as_ref().unwrap().send(o).await.unwrap();
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }

    fn route(&self, id: &RouteId) -> RouteStatus {
        self.rx.borrow().route(id).unwrap().clone()
    }

    /// Waits (bounded) until the snapshot shows `id` in `state`.
    async fn reaches(&mut self, id: &RouteId, state: State) -> RouteStatus {
        let snap = tokio::time::timeout(
            Duration::from_secs(20),
            self.rx.wait_for(|s| s.route(id).unwrap().state == state),
        )
        .await
        .unwrap_or_else(|_| panic!("{id} never reached {state}"))
        .unwrap();
        snap.route(id).unwrap().clone()
    }

    /// The transitions announced so far, as (route, from, to, has incident).
    fn transitions(&mut self) -> Vec<(RouteId, State, State, bool)> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            if let HealthEvent::Transition {
                transition,
                incident,
            } = e
            {
                out.push((
                    transition.route.clone(),
                    transition.from,
                    transition.to,
                    incident.is_some(),
                ));
            }
        }
        out
    }

    /// Closes its input, cancels it and waits until it has saved everything.
    async fn stop(mut self) {
        drop(self.tx.take());
        self.shutdown.cancel();
        self.task.await.unwrap();
    }
}

fn opts() -> HealthOptions {
    HealthOptions::default()
}

/// Probes in: WARNING then DEGRADED in the snapshot with reason code and failure mode; every
/// transition on the broadcast and in the store with its evidence; the incident stored.
#[tokio::test(start_paused = true)]
async fn probes_drive_warning_then_degraded_and_everything_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let r = rid("qwen", "cn");
    let cfg = config(&db, &[("qwen", "cn")], None);
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    seed(&store, &r).await;
    let clock = TokioClock::new();
    let mut svc = Svc::start(&cfg, &store, clock.clone(), opts()).await;
    assert_eq!(svc.route(&r).state, State::Unknown);
    assert!(
        svc.route(&r).baseline.is_some(),
        "baseline rebuilt from the store"
    );

    svc.send(probe(&r, clock.now(), 1100.0)).await;
    let normal = svc.reaches(&r, State::Normal).await;
    assert_eq!(normal.reason.unwrap().code, "baseline_ready");

    tokio::time::advance(Duration::from_secs(30)).await;
    svc.send(failed(probe(&r, clock.now(), 80.0))).await;
    let warning = svc.reaches(&r, State::Warning).await;
    assert_eq!(warning.reason.as_ref().unwrap().code, "probe_failed");
    assert_eq!(warning.failure_mode, Some(FailureMode::Unavailable));
    assert!(warning.incident.is_none());

    for _ in 0..2 {
        tokio::time::advance(Duration::from_secs(30)).await;
        svc.send(failed(probe(&r, clock.now(), 80.0))).await;
    }
    let degraded = svc.reaches(&r, State::Degraded).await;
    assert_eq!(degraded.reason.as_ref().unwrap().code, "probe_failed");
    assert_eq!(degraded.failure_mode, Some(FailureMode::Unavailable));
    assert_eq!(degraded.success_ratio, Some(0.25));
    let incident = degraded.incident.clone().unwrap();
    assert_eq!(incident.peak, State::Degraded);
    assert_eq!(degraded.since, t0() + chrono::Duration::seconds(90));

    assert_eq!(
        svc.transitions(),
        [
            (r.clone(), State::Unknown, State::Normal, false),
            (r.clone(), State::Normal, State::Warning, false),
            (r.clone(), State::Warning, State::Degraded, true),
        ]
    );
    svc.stop().await;

    let reader = store.reader().unwrap();
    let ts = reader.transitions(&r, t0(), 10).unwrap();
    assert_eq!(ts.len(), 3);
    let d = &ts[0];
    assert_eq!((d.from, d.to), (State::Warning, State::Degraded));
    assert_eq!(d.incident_id.as_deref(), Some(incident.id.as_str()));
    let observed = d.evidence.observed.as_ref().unwrap();
    assert!(!observed.success);
    assert_eq!(observed.http_status, Some(503));
    assert_eq!(d.evidence.consecutive_abnormal, 3);
    assert!(d
        .evidence
        .thresholds
        .iter()
        .any(|t| t.name == "consecutive_abnormal" && t.limit == 3.0));
    let stored = reader.incident(&incident.id).unwrap().unwrap();
    assert_eq!(stored.closed_at, None);
    assert_eq!(stored.peak, State::Degraded);
    assert_eq!(stored.transitions, vec![d.clone()]);
    let states = reader.route_health_all::<RouteHealth>().unwrap();
    assert_eq!(states[0].health.state(), State::Degraded);
    assert!(reader
        .heartbeats()
        .unwrap()
        .iter()
        .any(|(job, _)| job == HEARTBEAT_JOB));
    drop(reader);
    store.close().await.unwrap();
}

/// A hundred healthy probes on a NORMAL route publish no new snapshot (weights versions,
/// ETags and SSE are computed from it); the next failure does.
#[tokio::test(start_paused = true)]
async fn healthy_probes_after_normal_publish_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    let r = rid("qwen", "cn");
    let cfg = config(&db, &[("qwen", "cn")], None);
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    seed(&store, &r).await;
    let clock = TokioClock::new();
    // Baseline figures move with every probe; they alone refresh the snapshot every 30 s by
    // default. Stretched here to see that nothing else does.
    let opts = HealthOptions {
        baselines_every: Duration::from_secs(86_400),
        ..opts()
    };
    let mut svc = Svc::start(&cfg, &store, clock.clone(), opts).await;
    svc.send(probe(&r, clock.now(), 1100.0)).await;
    svc.reaches(&r, State::Normal).await;
    svc.rx.borrow_and_update();

    for i in 0..100 {
        tokio::time::advance(Duration::from_secs(30)).await;
        let x = if i % 2 == 0 { 1050.0 } else { 1150.0 };
        svc.send(probe(&r, clock.now(), x)).await;
    }
    assert!(
        !svc.rx.has_changed().unwrap(),
        "a snapshot was published for healthy probes: {:?}",
        svc.rx.borrow().routes
    );
    assert_eq!(svc.route(&r).state, State::Normal);
    assert_eq!(svc.route(&r).success_ratio, Some(1.0));

    tokio::time::advance(Duration::from_secs(30)).await;
    svc.send(failed(probe(&r, clock.now(), 80.0))).await;
    assert!(svc.rx.has_changed().unwrap());
    assert_eq!(svc.route(&r).state, State::Warning);
    svc.stop().await;
    store.close().await.unwrap();
}

/// Real traffic at 10 outcomes/s, all 503: the 1-second ticks take the route to DEGRADED in
/// under 5 s, long before a third probe could.
#[tokio::test(start_paused = true)]
async fn passive_503s_at_10_per_second_reach_degraded_within_5_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let r = rid("qwen", "cn");
    let cfg = config(&db, &[("qwen", "cn")], None);
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let clock = TokioClock::new();
    let mut svc = Svc::start(&cfg, &store, clock.clone(), opts()).await;

    for _ in 0..60 {
        svc.send(passive_503(&r, clock.now())).await;
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    let degraded = svc.reaches(&r, State::Degraded).await;
    let after = (degraded.since - t0()).to_std().unwrap();
    assert!(after < Duration::from_secs(5), "DEGRADED after {after:?}");
    assert_eq!(degraded.reason.as_ref().unwrap().code, "error_rate_high");
    assert_eq!(degraded.failure_mode, Some(FailureMode::Unavailable));
    assert!(degraded.incident.is_some());
    let states: Vec<State> = svc.transitions().into_iter().map(|t| t.2).collect();
    assert_eq!(states[..2], [State::Warning, State::Degraded]);
    svc.stop().await;

    let reader = store.reader().unwrap();
    let ts = reader.transitions(&r, t0(), 10).unwrap();
    let d = ts.iter().find(|t| t.to == State::Degraded).unwrap();
    assert!(d.evidence.observed.is_none(), "a tick, not an outcome");
    assert!(d.evidence.error_rate.fast_failures >= 20);
    drop(reader);
    store.close().await.unwrap();
}

/// Stop, reopen the store, start again: the same state, open incident and error window. Then
/// an hour of downtime: the stale incident stays open until the route's next probes resolve
/// it (no escalation for the time nobody was watching).
#[tokio::test(start_paused = true)]
async fn restart_restores_state_incident_and_window_and_the_route_later_resolves() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.db");
    let r = rid("qwen", "cn");
    let cfg = config(&db, &[("qwen", "cn")], None);
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    seed(&store, &r).await;
    let clock = TokioClock::new();
    let mut svc = Svc::start(&cfg, &store, clock.clone(), opts()).await;
    let mut sent = vec![probe(&r, clock.now(), 1100.0)];
    svc.send(sent[0].clone()).await;
    svc.reaches(&r, State::Normal).await;
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(30)).await;
        let o = failed(probe(&r, clock.now(), 80.0));
        sent.push(o.clone());
        svc.send(o).await;
    }
    let before = svc.reaches(&r, State::Degraded).await;
    assert_eq!(before.success_ratio, Some(0.25));
    svc.stop().await;
    // What the recorder would have stored meanwhile (not awaited while the service ran: see
    // the module docs).
    store.writer().record_many(sent).await.unwrap();
    store.close().await.unwrap();

    // Reopened at once: identical, error window included (1 success of 4 in it).
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let svc = Svc::start(&cfg, &store, clock.clone(), opts()).await;
    let after = svc.route(&r);
    assert_eq!(after, before);
    svc.stop().await;
    store.close().await.unwrap();

    // An hour later: still the open incident, then five minutes of normal probes resolve it.
    tokio::time::advance(Duration::from_secs(3600)).await;
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let mut svc = Svc::start(&cfg, &store, clock.clone(), opts()).await;
    let stale = svc.route(&r);
    assert_eq!(stale.state, State::Degraded);
    assert_eq!(stale.incident, before.incident);
    // Ticks before the first probe: the hour nobody watched is not "DEGRADED without one
    // normal observation" (that would page CRITICAL for a stale incident).
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert_eq!(svc.route(&r).state, State::Degraded);
    let start = clock.now();
    for _ in 0..12 {
        tokio::time::advance(Duration::from_secs(30)).await;
        svc.send(probe(&r, clock.now(), 1100.0)).await;
        assert_ne!(
            svc.route(&r).state,
            State::Critical,
            "escalated on stale state"
        );
    }
    let normal = svc.reaches(&r, State::Normal).await;
    assert!(normal.incident.is_none());
    let took = (normal.since - start).to_std().unwrap();
    assert!(
        took >= Duration::from_secs(300) && took <= Duration::from_secs(360),
        "resolved after {took:?}"
    );
    assert_eq!(
        svc.transitions()
            .iter()
            .map(|t| (t.1, t.2))
            .collect::<Vec<_>>(),
        [(State::Degraded, State::Normal)]
    );
    svc.stop().await;

    let reader = store.reader().unwrap();
    let id = before.incident.unwrap().id;
    let closed = reader.incident(&id).unwrap().unwrap();
    assert_eq!(closed.closed_at, Some(normal.since));
    assert_eq!(closed.peak, State::Degraded);
    assert_eq!(
        closed.transitions.iter().map(|t| t.to).collect::<Vec<_>>(),
        [State::Degraded, State::Normal]
    );
    drop(reader);
    store.close().await.unwrap();
}

/// Two providers failing while the control URL (a real HTTP server answering 503) fails too:
/// one egress finding and no route escalated to DEGRADED. When one provider recovers, the
/// other one failing is that provider's incident.
#[tokio::test]
async fn egress_finding_then_a_provider_incident() {
    let (control, hits) =
        common::fake("/", |_| common::Reply::now(StatusCode::SERVICE_UNAVAILABLE)).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("e.db");
    let (a, b, c) = (rid("a", "r1"), rid("b", "r1"), rid("c", "r1"));
    let url = format!("{}/", control.base_url());
    let cfg = config(&db, &[("a", "r1"), ("b", "r1"), ("c", "r1")], Some(&url));
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    // Real time here (a real socket); "now" does not need to move.
    let clock: Arc<ManualClock> = Arc::new(ManualClock::new(t0()));
    let mut svc = Svc::start(&cfg, &store, clock.clone(), opts()).await;
    let fail = |r: &RouteId| failed(probe(r, t0(), 80.0));

    svc.send(fail(&a)).await;
    svc.send(fail(&b)).await;
    let snap = tokio::time::timeout(
        Duration::from_secs(10),
        svc.rx.wait_for(|s| !s.findings.is_empty()),
    )
    .await
    .expect("an egress finding")
    .unwrap()
    .clone();
    assert!(!hits.all().is_empty(), "the control URL was probed");
    assert_eq!(snap.findings.len(), 1);
    let f = &snap.findings[0];
    assert_eq!(f.kind, FindingKind::Egress);
    assert_eq!(f.code, "egress");
    assert_eq!(f.providers, ["a", "b"]);

    // Two more failures each: marked, not escalated.
    for _ in 0..2 {
        svc.send(fail(&a)).await;
        svc.send(fail(&b)).await;
    }
    // A third provider failing: judged after the ones above (one queue, in order).
    svc.send(fail(&c)).await;
    svc.reaches(&c, State::Warning).await;
    let snap = svc.rx.borrow().clone();
    for r in [&a, &b, &c] {
        assert_eq!(snap.route(r).unwrap().state, State::Warning, "{r}");
        assert!(snap.route(r).unwrap().incident.is_none());
    }
    assert_eq!(snap.findings.len(), 1);
    assert_eq!(snap.findings[0].routes, [a.clone(), b.clone(), c.clone()]);

    // b and c recover; a alone keeps failing: the finding closes, and a is escalated.
    svc.send(probe(&b, t0(), 1100.0)).await;
    svc.send(probe(&c, t0(), 1100.0)).await;
    tokio::time::timeout(
        Duration::from_secs(10),
        svc.rx.wait_for(|s| s.findings.is_empty()),
    )
    .await
    .expect("the egress finding closes")
    .unwrap();
    svc.send(fail(&a)).await;
    svc.send(fail(&a)).await;
    let degraded = svc.reaches(&a, State::Degraded).await;
    assert_eq!(degraded.failure_mode, Some(FailureMode::Unavailable));
    assert!(degraded.incident.is_some(), "a provider incident");
    assert!(svc.rx.borrow().findings.is_empty());

    let mut opened = 0;
    let mut closed = 0;
    while let Ok(e) = svc.events.try_recv() {
        match e {
            HealthEvent::FindingOpened { finding, .. } => {
                assert_eq!(finding.kind, FindingKind::Egress);
                opened += 1;
            }
            HealthEvent::FindingClosed { .. } => closed += 1,
            HealthEvent::Transition { .. }
            | HealthEvent::DriftFinding { .. }
            | HealthEvent::Switch { .. }
            | HealthEvent::RouteFault { .. }
            | HealthEvent::BudgetCrossed { .. }
            | HealthEvent::SyncFailed { .. }
            | HealthEvent::ProviderDeclared { .. }
            | HealthEvent::RateLimitLow { .. }
            | HealthEvent::ModelWithdrawn { .. }
            | HealthEvent::ModelRetiring { .. } => {}
        }
    }
    assert_eq!((opened, closed), (1, 1));
    svc.stop().await;
    store.close().await.unwrap();
}

/// The weights of model `chat` from the service's current snapshot, in config order.
fn chat_weights(cfg: &Config, svc: &Svc) -> Vec<(u8, String)> {
    let routes = cfg.routes();
    let snap = svc.rx.borrow().clone();
    let models = probeok::weights::compute(&probeok::weights::Inputs::new(&routes, &snap));
    models["chat"]
        .entries
        .iter()
        .map(|e| (e.weight, e.reason.clone()))
        .collect()
}

/// One 529 on a fresh primary is below the detector's floors: its weight stays at its
/// configured share. Once the error window holds `min_error_samples` outcomes with
/// `min_failures` failures, the weight follows the success ratio (and says why).
#[tokio::test(start_paused = true)]
async fn one_failed_call_keeps_the_share_until_the_window_is_over_the_floors() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let (a, b) = (rid("qwen", "bj"), rid("qwen", "sh"));
    let cfg = config(&db, &[("qwen", "bj"), ("qwen", "sh")], None);
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let clock = TokioClock::new();
    let svc = Svc::start(&cfg, &store, clock.clone(), opts()).await;

    let mut o = passive_503(&a, clock.now());
    o.http_status = Some(529);
    o.error = Some(ProbeError::Http {
        status: 529,
        message: "overloaded_error".into(),
    });
    svc.send(o).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let s = svc.route(&a);
    assert_eq!(s.success_ratio, Some(0.0), "the ratio is still published");
    assert!(!s.success_judged, "one outcome is below the floors");
    assert_eq!(
        chat_weights(&cfg, &svc),
        vec![(50, "unjudged".into()), (50, "unjudged".into())]
    );

    // 16 successes and 3 more failures: 20 outcomes, 4 failures, success 0.8.
    for i in 0..19 {
        tokio::time::advance(Duration::from_millis(100)).await;
        let mut o = probe(&a, clock.now(), 1000.0);
        o.kind = OutcomeKind::Passive;
        svc.send(if i < 3 { failed(o) } else { o }).await;
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    let s = svc.route(&a);
    assert_eq!(s.success_ratio, Some(0.8));
    assert!(
        s.success_judged,
        "20 outcomes with 4 failures are over the floors"
    );
    let w = chat_weights(&cfg, &svc);
    assert!(
        w[0].0 < 50 && w[0].1 != "unjudged" && w[0].1 != "healthy",
        "{w:?} {s:?}"
    );
    if matches!(s.state, State::Unknown | State::Normal) {
        // 100 × 0.8 against 100: 44 / 56.
        assert_eq!(w[0], (44, "success_ratio_low".into()), "{s:?}");
    }
    assert_eq!(u32::from(w[0].0) + u32::from(w[1].0), 100);
    assert_eq!(
        svc.route(&b).success_ratio,
        None,
        "the other route saw nothing"
    );
    svc.stop().await;
}

/// 3,000 healthy probes per route, 30 s apart, before t0: history enough that rebuilding
/// the baselines takes a moment.
async fn seed_long(store: &Store, routes: &[RouteId]) {
    for r in routes {
        let outcomes = (0..3000u32)
            .map(|i| {
                let when = t0() - chrono::Duration::seconds(30 * i64::from(3000 - i));
                probe(r, when, 900.0 + f64::from(i % 7) * 50.0)
            })
            .collect();
        store.writer().record_many(outcomes).await.unwrap();
    }
}

/// Three routes with a day of probes each (`seed_long`) in a store of their own in `dir`.
async fn long_history(dir: &tempfile::TempDir) -> (Config, Vec<RouteId>, Store) {
    let db = dir.path().join("h.db");
    let pairs = [("qwen", "cn"), ("qwen", "us"), ("deepseek", "cn")];
    let cfg = config(&db, &pairs, None);
    let routes: Vec<RouteId> = pairs.iter().map(|(p, r)| rid(p, r)).collect();
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    seed_long(&store, &routes).await;
    (cfg, routes, store)
}

/// Baselines every 20 ms, and a start that waits up to a minute for them.
fn waiting_opts() -> HealthOptions {
    HealthOptions {
        baselines_every: Duration::from_millis(20),
        warm_wait: Duration::from_secs(60),
        ..HealthOptions::default()
    }
}

/// Waits (with a deadline) until every route shows a baseline.
fn settle_baselines(svc: &Svc, routes: &[RouteId]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while shown_baselines(svc, routes).iter().any(Option::is_none) {
        assert!(std::time::Instant::now() < deadline, "no baselines shown");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each route's baseline as the snapshot shows it: (bucket, samples, mean, σ).
fn shown_baselines(svc: &Svc, routes: &[RouteId]) -> Vec<Option<(String, usize, f64, f64)>> {
    routes
        .iter()
        .map(|r| {
            svc.route(r)
                .baseline
                .map(|b| (b.bucket, b.samples, b.mean_ms, b.stddev_ms))
        })
        .collect()
}

/// The start waits for baselines only `warm_wait`: with none at all the service starts at
/// once, the baselines warm in the background, and once warm they are what a start that
/// waited for them has — the outcome judged meanwhile included, learned once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baselines_warm_in_the_background_to_what_a_waiting_start_has() {
    // Each start on its own copy of the history: a stop saves the baselines, and the second
    // start would restore the first one's instead of warming from the history.
    let (dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (cfg, routes, store) = long_history(&dir).await;
    let (other_cfg, _, other_store) = long_history(&other_dir).await;
    let clock = Arc::new(ManualClock::new(t0()));
    let fast = |warm_wait| HealthOptions {
        baselines_every: Duration::from_millis(20),
        warm_wait,
        ..opts()
    };
    let baselines = |svc: &Svc| shown_baselines(svc, &routes);
    let one_more = |r: &RouteId| probe(r, t0() + chrono::Duration::seconds(1), 1000.0);

    // A start that waits for every baseline, then one probe more.
    let waited_opts = fast(Duration::from_secs(60));
    let waited = Svc::start(&cfg, &store, clock.clone(), waited_opts.clone()).await;
    assert_eq!(
        waited_opts.warm.get(),
        (3, 3),
        "all rebuilt before the start returned"
    );
    waited.send(one_more(&routes[2])).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let expected = baselines(&waited);
    assert!(expected.iter().all(Option::is_some), "{expected:?}");
    waited.stop().await;

    // A start that waits for none: probing and judging from the first moment. The last
    // route warms last: its probe is judged on an empty baseline and replayed into the
    // rebuilt one.
    let background = fast(Duration::ZERO);
    let svc = Svc::start(&other_cfg, &other_store, clock.clone(), background.clone()).await;
    svc.send(one_more(&routes[2])).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while baselines(&svc) != expected || background.warm.get() != (3, 3) {
        assert!(
            std::time::Instant::now() < deadline,
            "never warmed to the same baselines: {:?} vs {expected:?} ({:?})",
            baselines(&svc),
            background.warm
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    svc.stop().await;
}

/// A stop saves every baseline; the next start restores them from those few rows a route
/// instead of replaying the history, and judges by the same baselines a start from the raw
/// history had — the probes stored after the save replayed into them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_restores_baselines_from_their_saved_state_not_from_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, routes, store) = long_history(&dir).await;
    let clock = Arc::new(ManualClock::new(t0()));
    let opts = waiting_opts;
    let baselines = |svc: &Svc| shown_baselines(svc, &routes);
    let settle = |svc: &Svc| settle_baselines(svc, &routes);

    // The first start has nothing saved: it replays every stored outcome.
    let before = store.rows_read();
    let first = Svc::start(&cfg, &store, clock.clone(), opts()).await;
    let first_rows = store.rows_read() - before;
    assert!(
        first_rows >= 9000,
        "the history was replayed: {first_rows} rows read"
    );
    settle(&first);
    let from_raw = baselines(&first);
    first.stop().await;

    // Stored while the monitor was down: replayed after the saved state.
    let later: Vec<ProbeOutcome> = (1..=5)
        .map(|i| probe(&routes[0], t0() + chrono::Duration::seconds(30 * i), 1000.0))
        .collect();
    store.writer().record_many(later.clone()).await.unwrap();

    let before = store.rows_read();
    let second = Svc::start(&cfg, &store, clock.clone(), opts()).await;
    let second_rows = store.rows_read() - before;
    // Per route a head and the 24 hourly buckets, its state, and the five stored after.
    assert!(
        second_rows <= 3 * 26 + 3 + 5 + 20,
        "the start read {second_rows} rows, not bounded by routes and buckets"
    );
    settle(&second);
    let restored = baselines(&second);
    second.stop().await;

    let mut rebuilt_all = Vec::new();
    let mut all = store
        .reader()
        .unwrap()
        .outcomes_since(
            &routes[0],
            t0() - chrono::Duration::days(30),
            probeok::store::ALL_KINDS,
        )
        .unwrap();
    all.sort_by_key(|o| o.started_at);
    let raw = probeok::health::Baseline::rebuild(routes[0].clone(), &cfg.detection, &all);
    rebuilt_all.push(
        raw.snapshot(t0() + chrono::Duration::seconds(150))
            .map(|b| (b.bucket, b.samples, b.mean_ms, b.stddev_ms)),
    );
    assert_eq!(restored[1..], from_raw[1..], "untouched routes: as saved");
    assert_eq!(
        restored[0], rebuilt_all[0],
        "the route with probes after the save: as rebuilt from every raw outcome"
    );
    assert_ne!(restored[0], from_raw[0], "the later probes were learned");
}

/// Raw outcomes are kept `retention_days`; the baselines are not bound to them. After a stop
/// saved them, retention deletes all but the last hour of raw history, and the next start
/// shows the same baselines (the whole window, restored), not ones rebuilt from the hour left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_raw_outcomes_and_the_saved_baselines_keep_their_window() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, routes, store) = long_history(&dir).await;
    let clock = Arc::new(ManualClock::new(t0()));
    let opts = waiting_opts;
    let baselines = |svc: &Svc| shown_baselines(svc, &routes);
    let settle = |svc: &Svc| settle_baselines(svc, &routes);
    let raw = |r: &RouteId| {
        store
            .reader()
            .unwrap()
            .outcomes_since(
                r,
                t0() - chrono::Duration::days(30),
                probeok::store::ALL_KINDS,
            )
            .unwrap()
    };

    let first = Svc::start(&cfg, &store, clock.clone(), opts()).await;
    settle(&first);
    let learned = baselines(&first);
    first.stop().await;

    // One day of retention, 23 hours on: everything older than an hour before t0 expires.
    let report = store
        .writer()
        .retention(t0() + chrono::Duration::hours(23), 1, 400)
        .await
        .unwrap();
    let cutoff = t0() - chrono::Duration::hours(1);
    for r in &routes {
        let left = raw(r);
        assert_eq!(
            left.len(),
            120,
            "{r}: the last hour of raw outcomes is kept"
        );
        assert!(
            left.iter().all(|o| o.started_at >= cutoff),
            "{r}: nothing expired is left"
        );
    }
    assert_eq!(report.outcomes, 3 * 2880, "every expired outcome deleted");
    // The uptime figures come from rollups, which retention keeps longer.
    let counts = store
        .reader()
        .unwrap()
        .counts_by_route(
            t0() - chrono::Duration::days(2),
            t0() + chrono::Duration::hours(1),
            probeok::store::ALL_KINDS,
        )
        .unwrap();
    for r in &routes {
        assert_eq!(
            counts[r].count, 3000,
            "{r}: the rollups still count every probe"
        );
    }

    let second = Svc::start(&cfg, &store, clock.clone(), opts()).await;
    settle(&second);
    let restored = baselines(&second);
    second.stop().await;
    assert_eq!(
        restored, learned,
        "the saved baselines keep the whole window"
    );

    // What the hour left would give: a thinner baseline than the one shown.
    let mut left = raw(&routes[0]);
    left.sort_by_key(|o| o.started_at);
    let thin = probeok::health::Baseline::rebuild(routes[0].clone(), &cfg.detection, &left);
    let thin = thin
        .snapshot(t0())
        .map(|b| (b.bucket, b.samples, b.mean_ms, b.stddev_ms));
    assert_ne!(thin, learned[0], "the raw hour alone is not the window");
}
