//! The read side of the JSON API: `/api/v1/status`, `/api/v1/routes/{id}/probes`,
//! `/api/v1/incidents`. Store reads run in `spawn_blocking` on their own [`Reader`](crate::store::Reader).
//!
//! Where each status figure comes from:
//! - `state`, `since`, `reason`, `failure_mode`, `baseline`: the health snapshot.
//! - `latency_ms` (p50/p95/p99): the last hour of 5-minute rollups of **probe** outcomes
//!   (the fixed prompt; real traffic has every prompt size), histogram estimates.
//! - `ttfb_ms`: raw successful **probe** outcomes of the last hour (rollups keep only a TTFB
//!   sum), nearest-rank percentiles.
//! - `tokens_per_second`: raw successful **throughput and passive** outcomes of the last hour
//!   (the 2–5 token `PROBE_OK` answer gives no tokens/s figure).
//! - `uptime` (24h/7d/30d): success ratio of the **synthetic** outcomes (probe + throughput),
//!   from hourly/daily rollups. Passive outcomes are left out on purpose: a client's bad
//!   requests would count against the provider, and the public page shows synthetic evidence.
//! - `slo`: the error budget of [`crate::slo`] over 30 days of **probe** outcomes (hourly and
//!   daily rollups; `count − good` bad outcomes, each standing for the route's probe
//!   interval): `bad_seconds`, `budget_seconds` (`(1 − target) × 30 days`) and
//!   `error_budget_remaining` (`1 − bad / budget`: 1 untouched, 0 spent, negative overspent;
//!   `null` without outcomes). "Good" is a success within `[slo] latency_threshold`.
//! - `breaker` (`closed` | `half_open` | `open`): the in-process proxy's circuit breaker of the
//!   route; absent when no proxy runs here.
//! - `observed` (`1h`, `24h`): what the proxies' real traffic showed of the route (success,
//!   429 and 5xx ratios, refusals, TTFT/TPOT, structured-output validity, cost per success),
//!   from `store::observed`'s rollups; `null` for a window without traffic.
//! - `overall`: `outage` when some logical model has no usable route (weights'
//!   `all_unhealthy`), `degraded` when any route is DEGRADED or worse or any model is served
//!   off its primaries, else `operational`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Duration as TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::refresh::Fit;
use super::{rfc3339, ApiError, AppState};
use crate::health::{HealthSnapshot, Incident, State as RouteState};
use crate::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use crate::route::{Route, RouteId, Tier};
use crate::slo::{self, ErrorBudget};
use crate::store::{Counts, Store, StoreError};
use crate::weights;

/// Latency, TTFB and tokens/s cover this much recent time.
pub const RECENT: TimeDelta = TimeDelta::hours(1);
/// Latency percentiles come from these outcomes.
pub const LATENCY_KINDS: &[OutcomeKind] = &[OutcomeKind::Probe];
/// Tokens/s percentiles come from these outcomes.
pub const TPS_KINDS: &[OutcomeKind] = &[OutcomeKind::Throughput, OutcomeKind::Passive];
/// Uptime and the SLO count these outcomes.
pub const UPTIME_KINDS: &[OutcomeKind] = &[OutcomeKind::Probe, OutcomeKind::Throughput];
/// `/api/v1/routes/{id}/probes` lists these (synthetic evidence only, never real traffic).
pub const PROBE_KINDS: &[OutcomeKind] = &[OutcomeKind::Probe, OutcomeKind::Throughput];

/// `?limit=` default and ceiling for lists.
pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 1000;

pub mod capabilities;
mod figures;
mod filter;
mod lead;
mod observed;
use figures::round;
pub use figures::{Figures, Percentiles, RouteMap};
pub use filter::{StatusFilter, StatusQuery};
pub use lead::{lead_summary, leads};
pub use observed::{Observed, ObservedFigures, ObservedView};

#[derive(Debug, Serialize)]
struct ReasonView<'a> {
    code: &'a str,
    text: &'a str,
}

#[derive(Debug, Serialize)]
struct BaselineView<'a> {
    bucket: &'a str,
    samples: usize,
    mean_ms: f64,
    stddev_ms: f64,
    p95_ms: f64,
}

#[derive(Debug, Serialize)]
struct Uptime {
    #[serde(rename = "24h")]
    h24: Option<f64>,
    #[serde(rename = "7d")]
    d7: Option<f64>,
    #[serde(rename = "30d")]
    d30: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Slo {
    target: f64,
    error_budget_remaining: Option<f64>,
    bad_seconds: f64,
    budget_seconds: f64,
}

#[derive(Debug, Serialize)]
struct IncidentRef<'a> {
    id: &'a str,
    opened_at: String,
    peak: RouteState,
}

/// Which latency signal moved, each against its baseline (`code`: `ttft_above_baseline`,
/// `tps_below_baseline`, `ttft_and_tps_off_baseline`, or null while it does not tell yet).
#[derive(Debug, Serialize)]
struct SplitView<'a> {
    code: Option<&'static str>,
    ttft: Option<&'a crate::health::TtftCheck>,
    tps: Option<&'a crate::health::TpsCheck>,
}

#[derive(Debug, Serialize)]
struct RouteView<'a> {
    id: &'a RouteId,
    provider: &'a str,
    region: &'a str,
    model: &'a str,
    serves: &'a str,
    tier: Tier,
    /// `chat` or `embeddings`.
    kind: &'static str,
    state: RouteState,
    since: Option<String>,
    reason: Option<ReasonView<'a>>,
    failure_mode: Option<&'static str>,
    latency_ms: Percentiles,
    ttfb_ms: Percentiles,
    tokens_per_second: Percentiles,
    baseline: Option<BaselineView<'a>>,
    uptime: Uptime,
    slo: Slo,
    /// What probing the route costs per month (`crate::probe::cost`).
    probe_cost: &'a crate::probe::cost::ProbeCostView,
    behavior_changed: bool,
    /// While WARNING or worse: the first token and tokens/s against their baselines.
    split: Option<SplitView<'a>>,
    incident: Option<IncidentRef<'a>>,
    /// The shared cause the route is judged with while two routes or more share it
    /// (`provider/region:class`); `null` otherwise.
    cause: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    breaker: Option<&'static str>,
    /// Real traffic's observables over 1 h and 24 h.
    observed: Observed,
    /// What the provider's status page declares for the route, when a page maps it.
    #[serde(skip_serializing_if = "Option::is_none")]
    declared: Option<crate::declared::judge::RouteDeclared>,
    /// The latest rate-limit headroom per limit (`crate::health::headroom`); absent when the
    /// route's answers never announced one.
    #[serde(skip_serializing_if = "Option::is_none")]
    ratelimit: Option<&'a BTreeMap<&'static str, crate::health::headroom::Reading>>,
    /// Each declared `tools` / `json_schema` capability: its latest probe and 7-day success.
    capabilities: BTreeMap<&'static str, capabilities::CapabilityView>,
    /// The long prompt's latest TTFT beside its baseline (`[capability] long_prompt`); null
    /// when off or for an embeddings route.
    long_prompt: Option<capabilities::LongPromptView>,
}

#[derive(Debug, Serialize)]
struct StatusView<'a> {
    generated_at: String,
    overall: &'static str,
    /// This monitor's role in its cluster: `leader` (always, with SQLite) or `follower`.
    role: &'static str,
    routes: Vec<RouteView<'a>>,
    /// The hourly extra-cost budget, when the switch controller runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    budget: Option<crate::extra_cost::ExtraCostSnapshot>,
    /// `[[sync]]` gateways: kind, url, last_ok, last_error (never the token); empty without one.
    sync: Vec<crate::sync::GatewayStatus>,
    /// `[[provider.status_page]]` pages: provider, kind, url, last_ok, last_error.
    status_pages: Vec<crate::declared::PageStatus>,
}

/// A route's error budget from its probe counts over `window` (rollups): `count − good` bad
/// outcomes, each standing for the route's probe interval. No outcome is no bad time.
pub fn route_budget(route: &Route, counts: Option<&Counts>, window: Duration) -> ErrorBudget {
    let bad = counts.map_or(0, |c| c.count.saturating_sub(c.good));
    ErrorBudget::new(bad, route.probe.interval, route.slo, window)
}

/// The route's budget over the last 30 days, `None` without a probe outcome in them.
pub fn budget_30d(route: &Route, figures: &Figures) -> Option<ErrorBudget> {
    let counts = figures.slo_30d.get(&route.id).filter(|c| c.count > 0);
    counts.map(|c| route_budget(route, Some(c), slo::WINDOW))
}

/// The status's `overall`: `outage`, `degraded` or `operational` (see the module doc).
pub fn overall(routes: &[Route], health: &HealthSnapshot) -> &'static str {
    let models = weights::compute(&weights::Inputs::new(routes, health));
    if models.values().any(|m| m.serving.all_unhealthy) {
        return "outage";
    }
    let configured: std::collections::HashSet<&RouteId> = routes.iter().map(|r| &r.id).collect();
    let bad_route = health
        .routes
        .iter()
        .any(|s| s.state >= RouteState::Degraded && configured.contains(&s.route));
    let off_primary = models
        .values()
        .any(|m| m.serving.tier != Some(Tier::Primary));
    if bad_route || off_primary {
        "degraded"
    } else {
        "operational"
    }
}

/// What a status answer shows besides the routes, the snapshot and the figures.
pub struct Extras<'a> {
    /// The in-process proxy's breaker states (route → `closed` …).
    pub breakers: &'a HashMap<RouteId, &'static str>,
    pub budget: Option<crate::extra_cost::ExtraCostSnapshot>,
    pub filter: &'a StatusFilter,
    pub role: crate::cluster::Role,
    /// [`overall`] of the snapshot, and each route's probe cost in the routes' order: the
    /// handler derives them once per snapshot and per routes ([`super::memo`]).
    pub overall: &'static str,
    pub costs: &'a [crate::probe::cost::ProbeCostView],
    /// The `[[sync]]` gateways' state.
    pub sync: Vec<crate::sync::GatewayStatus>,
    /// What the providers' status pages declare, when any is configured.
    pub declared: Option<DeclaredExtras>,
    /// Each route's rate-limit readings (`super::headroom`).
    pub ratelimit: &'a super::headroom::Readings,
    /// `[capability] long_prompt` is set: each chat route shows its long prompt's figures
    /// (else `long_prompt` is null).
    pub long_prompt: bool,
}

/// The status pages' part of a status answer.
pub struct DeclaredExtras {
    pub map: crate::declared::lead::Mapping,
    pub view: Arc<crate::declared::judge::Declared>,
    pub pages: Arc<Vec<crate::declared::PageStatus>>,
}

impl DeclaredExtras {
    /// From the metrics' board, when status pages are configured.
    pub fn of(config: &crate::config::Config, metrics: &super::Metrics) -> Option<Self> {
        let board = metrics.declared()?;
        let pages = board.pages();
        (!pages.is_empty()).then(|| Self {
            map: crate::declared::lead::Mapping::from_config(config),
            view: board.view(),
            pages,
        })
    }
}

/// Each route's probe cost (its capability probes and long prompt included), in the routes'
/// order.
pub fn probe_costs(
    routes: &[Route],
    capability: &crate::config::CapabilityConfig,
) -> Vec<crate::probe::cost::ProbeCostView> {
    routes
        .iter()
        .map(|r| crate::probe::cost::ProbeCostView::of_route(r, capability))
        .collect()
}

/// The `/api/v1/status` document for one health snapshot and the store's figures.
pub fn status_json(
    routes: &[Route],
    health: &HealthSnapshot,
    figures: &Figures,
    now: DateTime<Utc>,
) -> Value {
    serde_json::from_slice(&status_bytes(routes, health, figures, now).unwrap_or_default())
        .unwrap_or(Value::Null)
}

/// The same document, serialised straight to bytes (what the handler sends).
pub fn status_bytes(
    routes: &[Route],
    health: &HealthSnapshot,
    figures: &Figures,
    now: DateTime<Utc>,
) -> Result<Vec<u8>, serde_json::Error> {
    let costs = probe_costs(routes, &crate::config::CapabilityConfig::default());
    let extras = Extras {
        breakers: &HashMap::new(),
        budget: None,
        filter: &StatusFilter::default(),
        role: crate::cluster::Role::Leader,
        overall: overall(routes, health),
        costs: &costs,
        sync: Vec::new(),
        declared: None,
        ratelimit: &Default::default(),
        long_prompt: false,
    };
    status_bytes_with(routes, health, figures, now, extras)
}

/// [`status_bytes`] with everything the handler knows besides.
pub fn status_bytes_with(
    routes: &[Route],
    health: &HealthSnapshot,
    figures: &Figures,
    now: DateTime<Utc>,
    extras: Extras<'_>,
) -> Result<Vec<u8>, serde_json::Error> {
    // About 900 bytes a route: sized once instead of doubled (and copied) twenty times.
    let mut out = Vec::with_capacity(4096 + routes.len() * 1024);
    serde_json::to_writer(&mut out, &status_view(routes, health, figures, now, extras))?;
    Ok(out)
}

fn status_view<'a>(
    routes: &'a [Route],
    health: &'a HealthSnapshot,
    figures: &Figures,
    now: DateTime<Utc>,
    extras: Extras<'a>,
) -> StatusView<'a> {
    let Extras {
        breakers,
        budget,
        filter,
        role,
        overall,
        costs,
        sync,
        declared,
        ratelimit,
        long_prompt,
    } = extras;
    let by_id: HashMap<&RouteId, &crate::health::RouteStatus, rustc_hash::FxBuildHasher> =
        health.routes.iter().map(|s| (&s.route, s)).collect();
    let views = routes
        .iter()
        .zip(costs)
        .filter(|(r, _)| {
            let state = by_id.get(&r.id).map_or(RouteState::Unknown, |s| s.state);
            filter.keeps(r, state)
        })
        .map(|(r, cost)| {
            let s = by_id.get(&r.id).copied();
            let percentiles =
                |m: &RouteMap<Percentiles>| m.get(&r.id).copied().unwrap_or_default().rounded();
            let ratio = |m: &RouteMap<Counts>| {
                m.get(&r.id)
                    .and_then(Counts::success_ratio)
                    .map(|v| round(v, 6))
            };
            RouteView {
                id: &r.id,
                provider: &r.provider,
                region: &r.region,
                model: &r.model,
                serves: &r.serves,
                tier: r.tier,
                kind: r.route_kind().as_str(),
                state: s.map_or(RouteState::Unknown, |s| s.state),
                since: s.map(|s| rfc3339(s.since)),
                reason: s.and_then(|s| s.reason.as_ref()).map(|x| ReasonView {
                    code: &x.code,
                    text: &x.text,
                }),
                failure_mode: s.and_then(|s| s.failure_mode).map(|f| f.as_str()),
                latency_ms: percentiles(&figures.latency),
                ttfb_ms: percentiles(&figures.ttfb),
                tokens_per_second: percentiles(&figures.tps),
                baseline: s.and_then(|s| s.baseline.as_ref()).map(|b| BaselineView {
                    bucket: &b.bucket,
                    samples: b.samples,
                    mean_ms: round(b.mean_ms, 1),
                    stddev_ms: round(b.stddev_ms, 1),
                    p95_ms: round(b.p95_ms, 1),
                }),
                uptime: Uptime {
                    h24: ratio(&figures.uptime_24h),
                    d7: ratio(&figures.uptime_7d),
                    d30: ratio(&figures.uptime_30d),
                },
                slo: {
                    let b = route_budget(r, figures.slo_30d.get(&r.id), slo::WINDOW);
                    Slo {
                        target: r.slo,
                        error_budget_remaining: budget_30d(r, figures)
                            .map(|b| b.error_budget_remaining),
                        bad_seconds: b.bad_seconds,
                        budget_seconds: b.budget_seconds,
                    }
                },
                probe_cost: cost,
                behavior_changed: s.is_some_and(|s| s.behavior_changed),
                split: s.and_then(|s| s.open_split()).map(|x| SplitView {
                    code: x.code(),
                    ttft: x.ttft.as_ref(),
                    tps: x.tps.as_ref(),
                }),
                incident: s.and_then(|s| s.incident.as_ref()).map(|i| IncidentRef {
                    id: &i.id,
                    opened_at: rfc3339(i.opened_at),
                    peak: i.peak,
                }),
                cause: s.and_then(|s| s.cause.as_deref()),
                breaker: breakers.get(&r.id).copied(),
                observed: Observed::of(r, &figures.observed),
                declared: declared
                    .as_ref()
                    .and_then(|d| crate::declared::judge::route_view(&d.map, &d.view, &r.id)),
                ratelimit: ratelimit.get(&r.id).filter(|m| !m.is_empty()),
                capabilities: figures.capabilities.route(r),
                long_prompt: long_prompt
                    .then(|| figures.capabilities.long_prompt(r))
                    .flatten(),
            }
        })
        .collect();
    StatusView {
        generated_at: rfc3339(now),
        overall,
        role: role.as_str(),
        routes: views,
        budget,
        sync,
        status_pages: declared
            .as_ref()
            .map(|d| d.pages.as_ref().clone())
            .unwrap_or_default(),
    }
}

/// How long store figures are reused between status requests. The health part of the answer
/// is always fresh; the store part (windows of an hour and more) may be this old, and up to
/// [`super::refresh::STALE_MAX`] while a newer read runs (see [`super::refresh`]).
pub const FIGURES_TTL: Duration = super::refresh::FRESH;

/// The last [`Figures`] read, shared by concurrent status requests (one read at a time: a
/// burst of requests costs one set of scans, not one each), refreshed off their path.
#[derive(Debug, Default)]
pub struct FiguresCache {
    last: super::refresh::Refreshing<Figures>,
    /// The HTML pages' extra figures (day bars, incidents), reused the same way
    /// (see [`super::pages::PageData`]).
    pub(super) pages: super::refresh::Refreshing<super::pages::PageData>,
    /// The day bars of the days before today, kept by a task of their own
    /// (see [`super::pages::past`]).
    pub(super) past: Arc<super::pages::PastBars>,
    /// The long windows' counts (uptime 24 h to 30 days, error budgets), kept likewise
    /// (see [`super::windows`]).
    pub(super) windows: Arc<super::windows::SharedWindows>,
    /// `overall` of the latest health snapshot, and the routes' probe costs.
    /// (It depends on the routes too: a reload keeps the snapshot until the next one, so the
    /// routes it was derived for are kept beside it.)
    overall: super::memo::Memo<HealthSnapshot, (std::sync::Weak<Vec<Route>>, &'static str)>,
    probe_costs: super::memo::Memo<Vec<Route>, Vec<crate::probe::cost::ProbeCostView>>,
}

impl FiguresCache {
    /// Figures at most [`FIGURES_TTL`] old, or a little older while a read runs. The long
    /// windows are the keeper's ([`super::windows`]); while its first read runs, this reads
    /// them itself (an answer has no room to say they are missing).
    pub async fn get(
        &self,
        store: &Store,
        clock: &Arc<dyn crate::clock::Clock>,
    ) -> Result<Arc<Figures>, ApiError> {
        self.start_windows(store, clock);
        let windows = self.windows.clone();
        let store = store.clone();
        let load = Arc::new(move |now, _| {
            let reader = store.reader()?;
            match windows.get() {
                Some(kept) => Figures::load_kept(&reader, now, Some(&kept)),
                None => Figures::load(&reader, now),
            }
        });
        let fit = |f: &Figures| if f.warming { Fit::Refuse } else { Fit::Use };
        Ok(self.last.get_where(clock, load, fit).await?)
    }

    /// Figures as [`Self::get`], but never waiting for the long windows: while the keeper's
    /// first read runs they are `warming` (empty), for a page that says so. Nor for the first
    /// read after a start: until it ends the figures are [`Figures::pending`].
    pub async fn get_warming(
        &self,
        store: &Store,
        clock: &Arc<dyn crate::clock::Clock>,
    ) -> Result<Arc<Figures>, ApiError> {
        self.start_windows(store, clock);
        let windows = self.windows.clone();
        let load = {
            let (store, windows) = (store.clone(), windows.clone());
            Arc::new(move |now, _| {
                Figures::load_kept(&store.reader()?, now, windows.get().as_deref())
            })
        };
        // Figures read while warming are served once more after the first read ended, while
        // figures with the windows are read.
        let fit = move |f: &Figures| fit_warming(f.warming, &windows);
        Ok(self
            .last
            .get_once_read(clock, load, fit)
            .await?
            .unwrap_or_else(|| Arc::new(Figures::pending())))
    }

    /// Waits until the status figures were first read (a page right after a start answers
    /// without them until then: [`Figures::pending`]).
    pub async fn first_read(&self) {
        self.last.first_read().await;
    }

    /// The kept long windows.
    pub fn windows(&self) -> &Arc<super::windows::SharedWindows> {
        &self.windows
    }

    /// The router starts the keeper at the service's start; a cache used without one starts
    /// it at its first use.
    fn start_windows(&self, store: &Store, clock: &Arc<dyn crate::clock::Clock>) {
        self.windows
            .start(store, clock, &tokio_util::sync::CancellationToken::new());
    }
}

/// Detection's snapshot with drift's findings merged in: a route with an open drift finding
/// (not just a model change) is `behavior_changed`, and its failure mode `behavior_changed`
/// unless detection names a failure mode of its own (an outage or a slowdown says more about
/// what to do first; the detector's judgement is never overwritten).
pub fn with_drift(
    health: Arc<HealthSnapshot>,
    drift: &crate::drift::DriftSnapshot,
) -> Arc<HealthSnapshot> {
    if !health
        .routes
        .iter()
        .any(|r| drift.behavior_changed(&r.route))
    {
        return health;
    }
    let mut merged = (*health).clone();
    for r in &mut merged.routes {
        if drift.behavior_changed(&r.route) {
            r.behavior_changed = true;
            r.failure_mode
                .get_or_insert(crate::health::FailureMode::BehaviorChanged);
        }
    }
    Arc::new(merged)
}

/// `GET /api/v1/status` (`?serves=`, `?provider=`, `?state=`: [`StatusQuery`]).
pub async fn status(
    State(state): State<AppState>,
    q: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    let filter = StatusFilter::parse(&q).map_err(|e| ApiError::bad_request("bad_query", e))?;
    let mut health = state.health.borrow().clone();
    if let Some(drift) = &state.drift {
        let drift = drift.borrow().clone();
        health = with_drift(health, &drift);
    }
    let now = state.clock.now();
    let figures = state.figures.get(&state.store, &state.clock).await?;
    let routes = state.routes.clone();
    let breakers: HashMap<RouteId, &'static str> = state
        .metrics
        .proxy()
        .map(|p| p.breakers())
        .unwrap_or_default()
        .into_iter()
        .map(|b| (b.route, b.state.as_str()))
        .collect();
    let budget = state.metrics.budget().map(|b| b.snapshot());
    let role = state.metrics.role();
    let sync = state.metrics.sync();
    let declared = DeclaredExtras::of(&state.config.current(), &state.metrics);
    let capability = state.config.current().capability.clone();
    let long_prompt = capability.long_prompt.is_some();
    let ratelimit = state.metrics.headroom();
    let vantages = state
        .vantages
        .as_ref()
        .map(|v| v.view.borrow().clone())
        .filter(|v| !v.routes.is_empty());
    let cache = state.figures.clone();
    let body = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, ApiError> {
        let kept = cache
            .overall
            .get(&health, |h| (Arc::downgrade(&routes), overall(&routes, h)));
        let overall = match &*kept {
            (r, o) if std::ptr::eq(r.as_ptr(), Arc::as_ptr(&routes)) => *o,
            _ => overall(&routes, &health),
        };
        let costs = cache
            .probe_costs
            .get(&routes, |r| probe_costs(r, &capability));
        let extras = Extras {
            breakers: &breakers,
            budget,
            filter: &filter,
            role,
            overall,
            costs: &costs,
            sync,
            declared,
            ratelimit: &ratelimit,
            long_prompt,
        };
        let bytes = status_bytes_with(&routes, &health, &figures, now, extras)
            .map_err(|e| ApiError::Internal(format!("serialising status: {e}")))?;
        let Some(view) = vantages else {
            return Ok(bytes);
        };
        let mut doc: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::Internal(format!("serialising status: {e}")))?;
        super::vantages::annotate(&mut doc, &view, &health);
        serde_json::to_vec(&doc).map_err(|e| ApiError::Internal(format!("serialising status: {e}")))
    })
    .await??;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

#[derive(Debug, Deserialize)]
pub struct LimitQuery {
    limit: Option<String>,
}

/// `?limit=N`: default [`DEFAULT_LIMIT`], clamped to [`MAX_LIMIT`], 400 when not a number.
fn limit(q: Result<Query<LimitQuery>, QueryRejection>) -> Result<usize, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    match q.limit {
        None => Ok(DEFAULT_LIMIT),
        Some(s) => s
            .trim()
            .parse::<usize>()
            .map(|n| n.clamp(1, MAX_LIMIT))
            .map_err(|_| {
                ApiError::bad_request("bad_query", format!("limit must be a number, got {s:?}"))
            }),
    }
}

/// `GET /api/v1/routes/{id}/probes`: the wildcard carries `{id}/probes`; the id may arrive
/// with its slashes raw or percent-encoded (axum decodes it).
pub async fn route_tail(
    State(state): State<AppState>,
    Path(rest): Path<String>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Some(id) = rest.strip_suffix("/probes") else {
        return Err(ApiError::NotFound("no such path".into()));
    };
    let route = RouteId::parse(id)
        .filter(|id| state.routes.iter().any(|r| &r.id == id))
        .ok_or_else(|| ApiError::NotFound(format!("unknown route {id:?}")))?;
    let limit = limit(q)?;
    let store = state.store.clone();
    let r = route.clone();
    let outcomes = tokio::task::spawn_blocking(move || {
        store.reader()?.recent_outcomes_of(&r, PROBE_KINDS, limit)
    })
    .await??;
    Ok(Json(json!({
        "route": route,
        "probes": outcomes.iter().map(outcome_json).collect::<Vec<_>>(),
    })))
}

/// One stored outcome as the API shows it (no answer text: evidence stays in drift reports).
pub fn outcome_json(o: &ProbeOutcome) -> Value {
    json!({
        "started_at": rfc3339(o.started_at),
        "kind": o.kind.as_str(),
        "success": o.success,
        "verified": o.verified,
        "ttfb_ms": o.ttfb_ms,
        "ttft_ms": o.ttft_ms,
        "first_answer_ms": o.first_answer_ms,
        "total_ms": o.total_ms,
        "output_tokens": o.output_tokens,
        "tokens_per_second": o.tokens_per_second,
        "model_reported": o.model_reported,
        "max_tokens_exhausted": o.max_tokens_exhausted,
        "http_status": o.http_status,
        "error": o.error.as_ref().map(ProbeError::to_json),
    })
}

// `/api/v1/incidents` and where it reads from.
mod incidents;
pub use incidents::*;

/// What a page makes of a value read `warming` (without the long windows): while the windows
/// are still being read it is as good as any; once they are there, it is served while the
/// value with them is read (a page never waits for it).
pub(super) fn fit_warming(warming: bool, windows: &super::windows::SharedWindows) -> Fit {
    match (warming, windows.get().is_some()) {
        (true, true) => Fit::Refresh,
        _ => Fit::Use,
    }
}
