//! Shared by the web integration tests: a config of N routes, an `AppState` around a real
//! store with hand-fed health and weights channels, the router served on 127.0.0.1:0, and
//! builders for outcomes and route statuses.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use probeok::clock::ManualClock;
use probeok::config::Config;
use probeok::health::{HealthSnapshot, Reason, RouteStatus, State};
use probeok::probe::{OutcomeKind, ProbeOutcome};
use probeok::route::RouteId;
use probeok::secret::Secret;
use probeok::store::{Store, StoreOptions};
use probeok::web::{self, AppState, Metrics, SnapshotIncidents};
use probeok::weights;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

/// One route of a test config, built by name instead of by position:
/// `Spec::new("qwen", "cn", "qwen-max").serves("chat-main").backup().weight(80)`.
/// Unless said otherwise a route serves its own model name, as a primary, at weight 100.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec<'a> {
    pub provider: &'a str,
    pub region: &'a str,
    pub model: &'a str,
    pub serves: &'a str,
    pub tier: &'a str,
    pub weight: u8,
}

impl<'a> Spec<'a> {
    pub const fn new(provider: &'a str, region: &'a str, model: &'a str) -> Self {
        Spec {
            provider,
            region,
            model,
            serves: model,
            tier: "primary",
            weight: 100,
        }
    }

    /// The logical model the route serves.
    pub const fn serves(mut self, serves: &'a str) -> Self {
        self.serves = serves;
        self
    }

    pub const fn tier(mut self, tier: &'a str) -> Self {
        self.tier = tier;
        self
    }

    pub const fn backup(self) -> Self {
        self.tier("backup")
    }

    pub const fn fallback(self) -> Self {
        self.tier("fallback")
    }

    pub const fn weight(mut self, weight: u8) -> Self {
        self.weight = weight;
        self
    }

    /// `provider/region/model`.
    pub fn id(&self) -> String {
        format!("{}/{}/{}", self.provider, self.region, self.model)
    }
}

pub fn config(routes: &[Spec<'_>], db: &Path) -> Config {
    let mut src = format!("[storage]\npath = \"{}\"\n\n", db.display());
    let mut providers: Vec<(&str, Vec<&str>)> = Vec::new();
    for Spec {
        provider: p,
        region: r,
        ..
    } in routes
    {
        match providers.iter_mut().find(|(id, _)| id == p) {
            Some((_, regions)) if !regions.contains(r) => regions.push(r),
            Some(_) => {}
            None => providers.push((p, vec![r])),
        }
    }
    for (p, regions) in &providers {
        src += &format!("[[provider]]\nid = \"{p}\"\nkind = \"openai\"\n");
        for r in regions {
            src += &format!(
                "  [[provider.region]]\n  id = \"{r}\"\n  base_url = \"http://127.0.0.1:9/v1\"\n"
            );
        }
    }
    for s in routes {
        src += &format!(
            "[[route]]\nprovider = \"{}\"\nregion = \"{}\"\nmodel = \"{}\"\nserves = \"{}\"\ntier = \"{}\"\nweight = {}\n",
            s.provider, s.region, s.model, s.serves, s.tier, s.weight
        );
    }
    Config::parse(&src, "test.toml")
        .expect("valid test config")
        .config
}

pub fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

pub fn id(s: &str) -> RouteId {
    RouteId::parse(s).unwrap()
}

/// A healthy route status.
pub fn normal(route: &str, since: DateTime<Utc>) -> RouteStatus {
    RouteStatus {
        route: id(route),
        state: State::Normal,
        judged: State::Normal,
        since,
        reason: None,
        failure_mode: None,
        baseline: None,
        success_ratio: Some(1.0),
        // A route with a long history: its error window is over the detector's floors.
        success_judged: true,
        behavior_changed: false,
        incident: None,
        split: Default::default(),
        cause: None,
    }
}

pub fn with_state(mut s: RouteStatus, state: State, code: &str) -> RouteStatus {
    s.state = state;
    s.judged = state;
    s.reason = Some(Reason::new(code, format!("{code} (test)")));
    s
}

pub fn snapshot(at: DateTime<Utc>, routes: Vec<RouteStatus>) -> HealthSnapshot {
    HealthSnapshot {
        generated_at: at,
        routes,
        findings: Vec::new(),
    }
}

pub fn outcome(
    route: &str,
    kind: OutcomeKind,
    at: DateTime<Utc>,
    ok: bool,
    ms: f64,
) -> ProbeOutcome {
    ProbeOutcome {
        route: id(route),
        kind,
        started_at: at,
        success: ok,
        attributed_to: None,
        verified: ok.then_some(true),
        ttfb_ms: ok.then_some(ms / 4.0),
        ttft_ms: ok.then_some(ms / 2.0),
        total_ms: ms,
        output_tokens: Some(40),
        tokens_estimated: false,
        tokens_per_second: None,
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

/// An `AppState` on a real store, with the health channel in the test's hands.
pub struct Harness {
    pub state: AppState,
    pub health_tx: watch::Sender<Arc<HealthSnapshot>>,
    pub passive_rx: mpsc::Receiver<ProbeOutcome>,
    pub store: Store,
    pub clock: Arc<ManualClock>,
    pub shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

pub struct HarnessOptions {
    pub ingest_token: Option<&'static str>,
    pub passive_capacity: usize,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        Self {
            ingest_token: Some("test-ingest-token"),
            passive_capacity: 4096,
        }
    }
}

impl Harness {
    pub async fn new(routes: &[Spec<'_>], now: DateTime<Utc>) -> Self {
        Self::with(routes, now, HarnessOptions::default()).await
    }

    pub async fn with(routes: &[Spec<'_>], now: DateTime<Utc>, opts: HarnessOptions) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("web.db");
        let config = config(routes, &db);
        let routes = config.routes();
        let store = Store::open(&db, StoreOptions::default()).unwrap();
        let clock = Arc::new(ManualClock::new(now));
        let ids: Vec<RouteId> = routes.iter().map(|r| r.id.clone()).collect();
        let (health_tx, health_rx) = watch::channel(Arc::new(HealthSnapshot::initial(&ids, now)));
        let shutdown = CancellationToken::new();
        let routes = Arc::new(routes);
        let weights = weights::spawn_publisher(
            weights::Feeds::new(routes.clone(), health_rx.clone()),
            shutdown.clone(),
        );
        let (passive_tx, passive_rx) = mpsc::channel(opts.passive_capacity);
        let state = AppState {
            config: Arc::new(config).into(),
            metrics: Arc::new(Metrics::new(&routes)),
            routes,
            store: store.clone(),
            clock: clock.clone(),
            jobs: Default::default(),
            health: health_rx,
            events: broadcast::channel(16).0,
            passive: passive_tx,
            weights,
            ingest_token: opts.ingest_token.map(Secret::new),
            incidents: Arc::new(SnapshotIncidents),
            drift: None,
            drills: None,
            figures: Default::default(),
            guards: Default::default(),
            shutdown: shutdown.clone(),
            vantages: None,
            xds: Default::default(),
        };
        Self {
            state,
            health_tx,
            passive_rx,
            store,
            clock,
            shutdown,
            _dir: dir,
        }
    }

    pub fn publish(&self, snapshot: HealthSnapshot) {
        self.health_tx.send_replace(Arc::new(snapshot));
    }

    pub async fn record(&self, outcomes: Vec<ProbeOutcome>) {
        self.store.writer().record_many(outcomes).await.unwrap();
    }

    /// Serves the router on 127.0.0.1:0 with graceful shutdown on the harness token, as a
    /// visitor finds it a moment after the start: the days before today, the long windows
    /// and the status figures are read.
    pub async fn serve(&self) -> Served {
        let served = self.serve_unread().await;
        // A first visitor's page starts the figures' first read (and does not wait for it).
        let figures = &self.state.figures;
        figures
            .get_warming(&self.store, &self.state.clock)
            .await
            .unwrap();
        figures.first_read().await;
        served
    }

    /// As [`Self::serve`], the status figures not read yet: the first page starts their read.
    pub async fn serve_unread(&self) -> Served {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = web::router(self.state.clone());
        // The days before today and the long windows, read by their keepers at the start.
        self.state.figures.past().read_after(0).await;
        self.state.figures.windows().read_after(0).await;
        let shutdown = self.shutdown.clone();
        let handle = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
                .unwrap();
        });
        Served { addr, handle }
    }
}

pub struct Served {
    pub addr: SocketAddr,
    pub handle: tokio::task::JoinHandle<()>,
}

impl Served {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

/// A drift finding on `route` with evidence (pass rate 20/20 → 4/10, two example answers).
pub fn drift_finding(route: &str, kind: probeok::drift::DriftKind) -> probeok::drift::DriftFinding {
    use probeok::drift::*;
    let t = at("2026-03-04T11:00:00Z");
    let sample = |passed, total| RateSample {
        runs: 2,
        passed,
        total,
        rate: Some(passed as f64 / total as f64),
    };
    DriftFinding {
        id: DriftFinding::key(&id(route), "format", kind),
        route: id(route),
        set: "format".into(),
        kind,
        severity: if kind == DriftKind::ModelChanged {
            Severity::Info
        } else {
            Severity::Warning
        },
        failure_mode: (kind != DriftKind::ModelChanged)
            .then_some(probeok::health::FailureMode::BehaviorChanged),
        detected_at: t,
        summary: format!("{route}: format pass rate fell from 100% to 40%"),
        evidence: Evidence {
            test: "fisher_exact_one_sided".into(),
            p_value: Some(0.00012),
            before: sample(20, 20),
            after: sample(4, 10),
            runs: Vec::new(),
            length: None,
            model: None,
            examples: (0..5)
                .map(|i| Example {
                    case: format!("case{i}"),
                    failures: Vec::new(),
                    before: Some("PROBE_OK".into()),
                    after: Some(format!("Sure! Here is the answer: {}", "x".repeat(500))),
                })
                .collect(),
        },
    }
}

/// A drift snapshot with these findings, and `failing` routes whose latest two runs of set
/// `format` both had failing cases (the quality gate's input).
pub fn drift_snapshot(
    findings: Vec<probeok::drift::DriftFinding>,
    failing: &[&str],
) -> probeok::drift::DriftSnapshot {
    use probeok::drift::*;
    let t = at("2026-03-04T11:00:00Z");
    let run = |i: i64| RunSummary {
        started_at: t + chrono::Duration::hours(i),
        passed: 3,
        answered: 5,
        errors: 0,
        failed: vec!["json: json_schema".into(), "list: regex".into()],
        model: None,
    };
    DriftSnapshot {
        generated_at: t,
        findings,
        sets: failing
            .iter()
            .map(|r| SetStatus {
                route: id(r),
                set: "format".into(),
                runs: vec![run(0), run(1)],
            })
            .collect(),
    }
}
