//! `/metrics`: OpenMetrics text through `prometheus-client`, ending in `# EOF`.
//!
//! Families (listed in `docs/http-api.md`):
//! - from probe outcomes (synthetic kinds only — probe and throughput), each labelled with
//!   the `vantage` that measured it: this monitor's own ([`Metrics::observe_outcome`], the
//!   `[server] vantage`) or an agent's ([`Metrics::observe_vantage_outcome`]):
//!   `probeok_probe_success{provider,region,model,vantage}` (0/1, last probe),
//!   `probeok_probe_duration_seconds` (count and sum per route and vantage; its buckets per
//!   provider in `probeok_provider_probe_duration_seconds{provider,vantage}`) and
//!   `probeok_probe_ttfb_seconds{provider,vantage}` (histograms of successful probes; why per
//!   provider: `docs/http-api.md`), `probeok_probe_output_tokens_per_second` (last
//!   figure), `probeok_probes_total{provider,region,model,vantage,result}` (`result` is
//!   `success` or the error kind, a closed set);
//! - set at scrape time from the health and weights snapshots: `probeok_route_state{…}`
//!   (0 UNKNOWN … 5 SWITCHED), `probeok_route_weight{serves,provider,region,model}`;
//! - `probeok_slo_error_budget_remaining{provider,region,model}`: the rolling 30 days' error
//!   budget left, the one figure of [`crate::slo`] (as on the route page and in
//!   `/api/v1/status`), set at scrape time from the cached store figures for the routes with
//!   outcomes in the window ([`Metrics::set_error_budgets`]);
//! - `probeok_route_observed_success_ratio`, `…_validity_ratio`, `…_tpot_p95_seconds`
//!   `{provider,region,model}`: the proxies' real traffic over the last hour, set at scrape
//!   time from the same cached figures, only for routes with such traffic;
//! - `probeok_ingest_items_total{result}` (accepted/rejected), `probeok_build_info{version}`,
//!   `probeok_store_lag_seconds` (the recorder's [`crate::lag::StoreLag`], at scrape time);
//!   `probeok_store_rows_read_total` (the store's count, at scrape time);
//! - `probeok_route_ratelimit_remaining_ratio{route,limit}`: each route's rate-limit headroom
//!   as its latest answer announced it, read from detection's board at scrape time
//!   ([`super::headroom`]);
//! - the in-process proxy's breakers and counters, once [`Metrics::attach_proxy`] was called
//!   (see `proxy::export`).
//!
//! Label values come only from the config (outcomes of unconfigured routes are ignored), never
//! from request input, so the series count is bounded by the config. Later families (proxy,
//! alerts) are added as fields here and registered in [`Metrics::new`].

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use super::{ApiError, AppState};
use crate::alert::AlertMetrics;
use crate::health::{HealthSnapshot, State as RouteState};
use crate::probe::outcome::{OutcomeKind, ProbeOutcome};
use crate::route::{Route, RouteId};
use crate::weights::WeightsSnapshot;

/// The `probeok_route_observed_*` families: name (without the prefix) and help.
const OBSERVED_FAMILIES: [(&str, &str); 3] = [
    (
        "route_observed_success_ratio",
        "Share of the proxies' attempts at the route that got a complete answer, last hour",
    ),
    (
        "route_observed_validity_ratio",
        "Share of structured answers (json_object, json_schema, tool calls) that were valid, last hour",
    ),
    (
        "route_observed_tpot_p95_seconds",
        "95th percentile of the time per output token of streamed answers, last hour",
    ),
];

/// What `/metrics` answers with.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

// The label sets of the families.
mod labels;
use labels::{
    AlertLabels, BuildLabels, IngestLabels, ProbeLabels, ProbeResultLabels, ProviderLabels,
    ReloadLabels, RouteLabels, TaskLabels, WeightLabels,
};

// The boards other tasks keep and `/metrics`, the status and `/readyz` read.
mod boards;

type HistogramFamily = Family<ProbeLabels, Histogram, fn() -> Histogram>;
type ProviderHistogramFamily = Family<ProviderLabels, Histogram, fn() -> Histogram>;

/// Per route only the count and sum (the `+Inf` bucket): a route's mean and rate; its
/// percentiles are on `/api/v1/status`, from the store. The buckets are kept once per
/// provider, where a distribution is worth its series: at 10,000 routes, per-route buckets
/// were 2.6 KB a route and most of the scrape.
fn route_histogram() -> Histogram {
    Histogram::new(std::iter::empty())
}

fn duration_histogram() -> Histogram {
    Histogram::new([0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0])
}

fn ttfb_histogram() -> Histogram {
    Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0])
}

/// The registry and handles on its families. Shared (`Arc`) between the recorder and `/metrics`.
pub struct Metrics {
    registry: Registry,
    /// Each route's labels, made once: every family's series of the route shares their text.
    routes: HashMap<RouteId, (RouteLabels, Arc<str>)>,
    /// In config order, for the scrape-time gauges.
    order: Vec<RouteId>,
    /// This monitor's own vantage: the `vantage` label of its scheduler's probes.
    vantage: Arc<str>,
    probe_success: Family<ProbeLabels, Gauge>,
    probe_duration: HistogramFamily,
    /// Per provider only: at 10,000 routes a second per-route family did not fit a kilobyte.
    probe_ttfb: ProviderHistogramFamily,
    provider_duration: ProviderHistogramFamily,
    probe_tps: Family<ProbeLabels, Gauge<f64, AtomicU64>>,
    probes: Family<ProbeResultLabels, Counter>,
    route_state: Family<RouteLabels, Gauge>,
    route_weight: Family<WeightLabels, Gauge>,
    slo_budget: Family<RouteLabels, Gauge<f64, AtomicU64>>,
    /// Real traffic over the last hour: success ratio, structured-output validity ratio,
    /// TPOT p95 (see [`Metrics::set_observed`]).
    observed: [Family<RouteLabels, Gauge<f64, AtomicU64>>; 3],
    ingest_items: Family<IngestLabels, Counter>,
    /// `probeok_alerts_total{channel,result}`, brought up to the alert engine's counts at
    /// scrape time (channels come from the config, results are a fixed set).
    alerts: Family<AlertLabels, Counter>,
    alert_source: OnceLock<Arc<AlertMetrics>>,
    /// `probeok_task_failures_total{task}`, from the process's supervisor at scrape time.
    tasks: Family<TaskLabels, Counter>,
    /// Routes per shared cause, set at scrape time from the health snapshot.
    cause_routes: Family<boards::CauseLabels, Gauge>,
    task_source: OnceLock<crate::supervise::Supervisor>,
    /// `probeok_alert_outbox_evicted_total`, from the same source.
    alert_evicted: Counter,
    proxy: crate::proxy::export::ProxySlot,
    /// `probeok_budget_extra_cost{kind}` and `probeok_budget_used_ratio`, read from the
    /// hourly extra-cost budget at scrape time.
    budget_cost: Family<ExtraCostLabels, Gauge<f64, AtomicU64>>,
    budget_used: Gauge<f64, AtomicU64>,
    budget: OnceLock<Arc<crate::extra_cost::ExtraCost>>,
    /// The switch controller's current phases, for the status page.
    switch: OnceLock<crate::switch::SwitchRx>,
    /// Config reloads (`crate::reload`), as Prometheus counts its own.
    reloads: Family<ReloadLabels, Counter>,
    reload_ok: Gauge,
    reload_ok_at: Gauge<f64, AtomicU64>,
    /// The active drills, for the status page.
    drills: OnceLock<crate::drill::DrillRx>,
    /// `probeok_store_lag_seconds`, read at scrape time (and by `/readyz`).
    store_lag: OnceLock<Arc<crate::lag::StoreLag>>,
    store_lag_gauge: Gauge<f64, AtomicU64>,
    /// `probeok_store_rows_read_total`, brought up to the store's count at scrape time.
    store_rows_read: Counter,
    /// `probeok_cluster_leader`: 1 while this member leads (always, with SQLite).
    cluster_leader: Gauge,
    /// The member's role in its cluster; `None`: a lone monitor, always the leader.
    role: OnceLock<crate::cluster::RoleRx>,
    /// `[[sync]]` gateways' state, for `/api/v1/status`.
    sync: OnceLock<crate::sync::SyncBoard>,
    /// `[[provider.status_page]]`: what providers declare, for `/api/v1/status` and the pages.
    declared: OnceLock<crate::declared::DeclaredBoard>,
    /// How far detection's baselines have warmed from the history, for `/readyz`.
    warm: OnceLock<crate::health::service::WarmProgress>,
    /// `probeok_incident_lead_seconds`, observed by the status pages' task.
    incident_lead: Histogram,
    /// `probeok_trace_spans_dropped_total`, read from the tracer at scrape time.
    trace: crate::trace::TraceStats,
    /// `probeok_route_ratelimit_remaining_ratio`, read from detection's board at scrape time
    /// (and by `/api/v1/status`).
    headroom: super::headroom::HeadroomSlot,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ExtraCostLabels {
    /// `spent` (settled this hour), `reserved` (running requests) or `limit`.
    kind: &'static str,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("routes", &self.order.len())
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// The metrics of a monitor whose own vantage is the default one.
    pub fn new(routes: &[Route]) -> Self {
        Self::for_vantage(routes, crate::vantage::LOCAL)
    }

    /// The metrics of a monitor whose own probes run from `vantage` (`[server] vantage`).
    pub fn for_vantage(routes: &[Route], vantage: &str) -> Self {
        let mut registry = Registry::with_prefix("probeok");
        let probe_success = Family::<ProbeLabels, Gauge>::default();
        let probe_duration: HistogramFamily = Family::new_with_constructor(route_histogram);
        let probe_ttfb: ProviderHistogramFamily = Family::new_with_constructor(ttfb_histogram);
        let provider_duration: ProviderHistogramFamily =
            Family::new_with_constructor(duration_histogram);
        let probe_tps = Family::<ProbeLabels, Gauge<f64, AtomicU64>>::default();
        let probes = Family::<ProbeResultLabels, Counter>::default();
        let route_state = Family::<RouteLabels, Gauge>::default();
        let route_weight = Family::<WeightLabels, Gauge>::default();
        let slo_budget = Family::<RouteLabels, Gauge<f64, AtomicU64>>::default();
        let observed: [Family<RouteLabels, Gauge<f64, AtomicU64>>; 3] = Default::default();
        for (family, (name, help)) in observed.iter().zip(OBSERVED_FAMILIES) {
            registry.register(name, help, family.clone());
        }
        let ingest_items = Family::<IngestLabels, Counter>::default();
        // Both results exist from the start, so `rate()` sees the first rejection.
        for result in ["accepted", "rejected"] {
            let _ = ingest_items.get_or_create(&IngestLabels { result });
        }
        let alerts = Family::<AlertLabels, Counter>::default();
        let tasks = Family::<TaskLabels, Counter>::default();
        // Every supervised task from the start, so the first failure is an increase.
        for task in crate::supervise::MONITOR_TASKS {
            let _ = tasks.get_or_create(&TaskLabels { task });
        }
        registry.register(
            "task_failures",
            "Long-lived tasks that panicked or ended before shutdown, by task (the process then exits non-zero)",
            tasks.clone(),
        );
        let cause_routes = Family::<boards::CauseLabels, Gauge>::default();
        registry.register(
            "cause_routes",
            "Routes judged together on one shared cause (failure class at one endpoint), while two or more share it",
            cause_routes.clone(),
        );
        let budget_cost = Family::<ExtraCostLabels, Gauge<f64, AtomicU64>>::default();
        let budget_used = Gauge::<f64, AtomicU64>::default();
        let reloads = Family::<ReloadLabels, Counter>::default();
        // Both series exist from the start, so `increase()` sees the first failure.
        for result in ["success", "failure"] {
            let _ = reloads.get_or_create(&ReloadLabels { result });
        }
        let reload_ok = Gauge::default();
        let cluster_leader = Gauge::default();
        cluster_leader.set(1);
        registry.register(
            "cluster_leader",
            "1 while this monitor leads its cluster (always with SQLite), 0 while it follows",
            cluster_leader.clone(),
        );
        let reload_ok_at = Gauge::<f64, AtomicU64>::default();
        let incident_lead = crate::declared::lead_histogram();
        registry.register(
            "incident_lead_seconds",
            "Our detection's lead over the provider's status page declaration of the same incident, seconds (negative: the provider declared first)",
            incident_lead.clone(),
        );
        let store_lag_gauge = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "store_lag_seconds",
            "How long the oldest outcome handed to the store has waited for its commit (0 when none waits)",
            store_lag_gauge.clone(),
        );
        let store_rows_read = Counter::default();
        registry.register(
            "store_rows_read",
            "Rows the store's readers have read since the start (what a start or a page costs the database)",
            store_rows_read.clone(),
        );
        registry.register(
            "config_reloads",
            "Config reloads (SIGHUP, POST /api/v1/admin/reload) by result (success, failure)",
            reloads.clone(),
        );
        registry.register(
            "config_last_reload_successful",
            "1 when the last config reload (or the start) succeeded, else 0",
            reload_ok.clone(),
        );
        registry.register(
            "config_last_reload_success_timestamp_seconds",
            "When the config was last loaded successfully (the start counts), Unix seconds",
            reload_ok_at.clone(),
        );
        registry.register(
            "budget_extra_cost",
            "Extra cost of non-primary serving this clock hour, in the routes' price currency",
            budget_cost.clone(),
        );
        registry.register(
            "budget_used_ratio",
            "(spent + reserved) / max_extra_cost_per_hour this clock hour",
            budget_used.clone(),
        );
        registry.register(
            "probe_success",
            "1 when the route's last probe succeeded, else 0",
            probe_success.clone(),
        );
        registry.register(
            "probe_duration_seconds",
            "Total duration of successful probes (count and sum per route; buckets per provider in probeok_provider_probe_duration_seconds)",
            probe_duration.clone(),
        );
        registry.register(
            "probe_ttfb_seconds",
            "Time to first response byte of successful probes, every route of the provider",
            probe_ttfb.clone(),
        );
        registry.register(
            "provider_probe_duration_seconds",
            "Total duration of successful probes, every route of the provider",
            provider_duration.clone(),
        );

        registry.register(
            "probe_output_tokens_per_second",
            "Output tokens per second of the route's last throughput measurement",
            probe_tps.clone(),
        );
        registry.register("probes", "Probes by result", probes.clone());
        registry.register(
            "route_state",
            "Route state: 0 UNKNOWN, 1 NORMAL, 2 WARNING, 3 DEGRADED, 4 CRITICAL, 5 SWITCHED",
            route_state.clone(),
        );
        registry.register(
            "route_weight",
            "Published traffic weight (0-100) within the logical model",
            route_weight.clone(),
        );
        registry.register(
            "slo_error_budget_remaining",
            "Error budget left over the rolling 30 days: 1 - bad time / ((1 - target) x 30 d); negative when overspent",
            slo_budget.clone(),
        );
        registry.register(
            "ingest_items",
            "Passive outcomes received on /api/v1/ingest",
            ingest_items.clone(),
        );
        registry.register(
            "alerts",
            "Alert deliveries by channel and result (delivered, failed, dropped, suppressed)",
            alerts.clone(),
        );
        let alert_evicted = Counter::default();
        registry.register(
            "alert_outbox_evicted",
            "Alert outbox rows deleted to keep the outbox within its row bound",
            alert_evicted.clone(),
        );
        registry.register(
            "build",
            "Build information",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        let proxy = crate::proxy::export::ProxySlot::default();
        registry.register_collector(Box::new(proxy.clone()));
        let trace = crate::trace::TraceStats::default();
        registry.register_collector(Box::new(trace.clone()));
        let headroom = super::headroom::HeadroomSlot::default();
        registry.register_collector(Box::new(headroom.clone()));
        let labels = |r: &Route| RouteLabels {
            provider: r.provider.as_str().into(),
            region: r.region.as_str().into(),
            model: r.model.as_str().into(),
        };
        Self {
            registry,
            routes: routes
                .iter()
                .map(|r| (r.id.clone(), (labels(r), r.serves.as_str().into())))
                .collect(),
            order: routes.iter().map(|r| r.id.clone()).collect(),
            vantage: vantage.into(),
            probe_success,
            probe_duration,
            probe_ttfb,
            provider_duration,
            probe_tps,
            probes,
            route_state,
            route_weight,
            slo_budget,
            observed,
            ingest_items,
            alerts,
            alert_source: OnceLock::new(),
            tasks,
            cause_routes,
            task_source: OnceLock::new(),
            alert_evicted,
            proxy,
            budget_cost,
            budget_used,
            budget: OnceLock::new(),
            switch: OnceLock::new(),
            reloads,
            reload_ok,
            reload_ok_at,
            drills: OnceLock::new(),
            store_lag: OnceLock::new(),
            store_lag_gauge,
            store_rows_read,
            cluster_leader,
            role: OnceLock::new(),
            sync: OnceLock::new(),
            declared: OnceLock::new(),
            warm: OnceLock::new(),
            incident_lead,
            trace,
            headroom,
        }
    }

    /// The recorder's lag behind the probes: exported, and read by `/readyz`. The first call
    /// wins.
    pub fn attach_store_lag(&self, lag: Arc<crate::lag::StoreLag>) {
        let _ = self.store_lag.set(lag);
    }

    /// The attached store lag, if the recorder runs in this process.
    pub fn store_lag(&self) -> Option<&Arc<crate::lag::StoreLag>> {
        self.store_lag.get()
    }

    /// The member's role, for `/metrics`, `/readyz` and `/api/v1/status`. The first call wins.
    pub fn attach_role(&self, role: crate::cluster::RoleRx) {
        let _ = self.role.set(role);
    }

    /// This member's role now: the leader unless a cluster says otherwise.
    pub fn role(&self) -> crate::cluster::Role {
        self.role
            .get()
            .map_or(crate::cluster::Role::Leader, |r| *r.borrow())
    }

    /// One config load: the start (not counted as a reload) or a reload.
    pub fn observe_reload(&self, ok: bool, at: chrono::DateTime<chrono::Utc>) {
        self.reload_ok.set(i64::from(ok));
        if ok {
            self.reload_ok_at.set(at.timestamp_millis() as f64 / 1000.0);
        }
    }

    /// Counts a reload (not the start).
    pub fn count_reload(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// The switch controller's phases, shown on the status page. The first call wins.
    pub fn attach_switch(&self, status: crate::switch::SwitchRx) {
        let _ = self.switch.set(status);
    }

    /// The active drills, shown on the status page. The first call wins.
    pub fn attach_drills(&self, drills: crate::drill::DrillRx) {
        let _ = self.drills.set(drills);
    }

    /// The active drills, if the drill service runs.
    pub fn drills(&self) -> Option<Arc<Vec<crate::drill::Drill>>> {
        self.drills.get().map(|rx| rx.borrow().clone())
    }

    /// The latest switch phases, if the controller runs.
    pub fn switch(&self) -> Option<Arc<crate::switch::SwitchStatus>> {
        self.switch.get().map(|rx| rx.borrow().clone())
    }

    /// The hourly extra-cost budget: exported on `/metrics` and in `/api/v1/status`.
    /// The first call wins.
    pub fn attach_budget(&self, budget: Arc<crate::extra_cost::ExtraCost>) {
        let _ = self.budget.set(budget);
    }

    /// The attached budget, if any.
    pub fn budget(&self) -> Option<&Arc<crate::extra_cost::ExtraCost>> {
        self.budget.get()
    }

    /// Exports the alert engine's counters as `probeok_alerts_total` (read at scrape time).
    /// The first call wins; later ones are ignored.
    /// Exports the supervisor's failure counts.
    pub fn follow_tasks(&self, source: crate::supervise::Supervisor) {
        let _ = self.task_source.set(source);
    }

    pub fn follow_alerts(&self, source: Arc<AlertMetrics>) {
        let _ = self.alert_source.set(source);
    }

    /// The in-process proxy: its breakers and counters appear on `/metrics` and its breakers
    /// on `/api/v1/status`.
    pub fn attach_proxy(&self, stats: crate::proxy::ProxyStats) {
        self.proxy.attach(stats);
    }

    /// The tracer whose dropped spans `/metrics` counts (the first call wins).
    pub fn attach_tracer(&self, tracer: crate::trace::Tracer) {
        self.trace.attach(tracer);
    }

    /// The attached proxy, if any.
    pub fn proxy(&self) -> Option<&crate::proxy::ProxyStats> {
        self.proxy.get()
    }

    /// Counts one of this monitor's own outcomes in (its vantage is `[server] vantage`).
    /// Passive outcomes and unconfigured routes are ignored.
    pub fn observe_outcome(&self, o: &ProbeOutcome) {
        self.observe_probe(self.vantage.clone(), o);
    }

    /// One outcome from a remote vantage (stored for the first time): the same families,
    /// under its vantage.
    pub fn observe_vantage_outcome(&self, vantage: &str, o: &ProbeOutcome) {
        self.observe_probe(vantage.into(), o);
    }

    fn observe_probe(&self, vantage: Arc<str>, o: &ProbeOutcome) {
        if o.kind == OutcomeKind::Passive {
            return;
        }
        let Some((route, _)) = self.routes.get(&o.route) else {
            return;
        };
        let labels = ProbeLabels {
            provider: route.provider.clone(),
            region: route.region.clone(),
            model: route.model.clone(),
            vantage,
        };
        self.probe_success
            .get_or_create(&labels)
            .set(i64::from(o.success));
        let result = match (&o.error, o.success) {
            (_, true) => "success",
            (Some(e), false) => e.kind(),
            (None, false) => "failure",
        };
        self.probes
            .get_or_create(&ProbeResultLabels {
                provider: labels.provider.clone(),
                region: labels.region.clone(),
                model: labels.model.clone(),
                vantage: labels.vantage.clone(),
                result,
            })
            .inc();
        if o.success {
            let provider = ProviderLabels {
                provider: labels.provider.clone(),
                vantage: labels.vantage.clone(),
            };
            self.probe_duration
                .get_or_create(&labels)
                .observe(o.total_ms / 1000.0);
            self.provider_duration
                .get_or_create(&provider)
                .observe(o.total_ms / 1000.0);
            if let Some(ttfb) = o.ttfb_ms {
                self.probe_ttfb
                    .get_or_create(&provider)
                    .observe(ttfb / 1000.0);
            }
        }
        if let Some(tps) = o.tokens_per_second {
            self.probe_tps.get_or_create(&labels).set(tps);
        }
    }

    /// Sets `probeok_slo_error_budget_remaining` from the store figures (the same
    /// computation as the route page and `/api/v1/status`). A route without outcomes in the
    /// window has no budget figure and keeps no series.
    pub fn set_error_budgets(&self, routes: &[Route], figures: &super::api::Figures) {
        for r in routes {
            let Some((labels, _)) = self.routes.get(&r.id) else {
                continue;
            };
            match super::api::budget_30d(r, figures) {
                Some(b) => {
                    self.slo_budget
                        .get_or_create(labels)
                        .set(b.error_budget_remaining);
                }
                None => {
                    self.slo_budget.remove(labels);
                }
            }
        }
    }

    /// Sets the `probeok_route_observed_*` gauges from the store figures (real traffic over the
    /// last hour, as `observed."1h"` in `/api/v1/status`). A figure without traffic keeps no
    /// series, so idle routes cost nothing.
    pub fn set_observed(&self, routes: &[Route], figures: &super::api::Figures) {
        for r in routes {
            let Some((labels, _)) = self.routes.get(&r.id) else {
                continue;
            };
            let view =
                (figures.observed.h1.get(r.id.as_str())).and_then(super::api::ObservedView::of);
            let values = [
                view.as_ref().and_then(|v| v.success_ratio),
                view.as_ref().and_then(|v| v.structured.validity_ratio),
                view.as_ref()
                    .and_then(|v| v.tpot_ms.p95)
                    .map(|ms| ms / 1000.0),
            ];
            for (family, value) in self.observed.iter().zip(values) {
                match value {
                    Some(v) => {
                        family.get_or_create(labels).set(v);
                    }
                    None => {
                        family.remove(labels);
                    }
                }
            }
        }
    }

    /// Counts an ingest request's items.
    pub fn observe_ingest(&self, accepted: usize, rejected: usize) {
        for (result, n) in [("accepted", accepted), ("rejected", rejected)] {
            if n > 0 {
                self.ingest_items
                    .get_or_create(&IngestLabels { result })
                    .inc_by(n as u64);
            }
        }
    }

    /// Sets the scrape-time gauges from the snapshots, then encodes everything.
    pub fn render(
        &self,
        health: &HealthSnapshot,
        weights: &WeightsSnapshot,
    ) -> Result<String, std::fmt::Error> {
        let states: HashMap<&RouteId, RouteState> =
            health.routes.iter().map(|s| (&s.route, s.state)).collect();
        let weight_of: HashMap<&RouteId, u8> = weights
            .models
            .values()
            .flat_map(|m| &m.entries)
            .map(|e| (&e.route, e.weight))
            .collect();
        self.cluster_leader.set(i64::from(self.role().is_leader()));
        self.set_causes(health);
        for id in &self.order {
            let Some((labels, serves)) = self.routes.get(id) else {
                continue;
            };
            let state = states.get(id).copied().unwrap_or(RouteState::Unknown);
            self.route_state
                .get_or_create(labels)
                .set(state_value(state));
            let weight = weight_of.get(id).copied().unwrap_or(0);
            self.route_weight
                .get_or_create(&WeightLabels {
                    serves: serves.clone(),
                    provider: labels.provider.clone(),
                    region: labels.region.clone(),
                    model: labels.model.clone(),
                })
                .set(i64::from(weight));
        }
        if let Some(source) = self.alert_source.get() {
            for (channel, result, n) in source.snapshot() {
                let c = self.alerts.get_or_create(&AlertLabels { channel, result });
                // The source only grows; bring the exported counter up to it.
                c.inc_by(n.saturating_sub(c.get()));
            }
            let e = &self.alert_evicted;
            e.inc_by(source.evicted_total().saturating_sub(e.get()));
        }
        if let Some(source) = self.task_source.get() {
            for (task, n) in source.counts() {
                let c = self.tasks.get_or_create(&TaskLabels { task });
                c.inc_by(n.saturating_sub(c.get()));
            }
        }
        if let Some(b) = self.budget.get() {
            let snap = b.snapshot();
            for (kind, v) in [
                ("spent", snap.spent),
                ("reserved", snap.reserved),
                ("limit", snap.max_extra_cost_per_hour),
            ] {
                self.budget_cost
                    .get_or_create(&ExtraCostLabels { kind })
                    .set(v);
            }
            self.budget_used.set(snap.used_ratio);
        }
        let mut out = String::with_capacity(4096 + self.order.len() * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The states' numbering on `/metrics` (`probeok_route_state`).
pub fn state_value(state: RouteState) -> i64 {
    match state {
        RouteState::Unknown => 0,
        RouteState::Normal => 1,
        RouteState::Warning => 2,
        RouteState::Degraded => 3,
        RouteState::Critical => 4,
        RouteState::Switched => 5,
    }
}

/// `GET /metrics`.
pub async fn handler(State(state): State<AppState>) -> Result<Response, ApiError> {
    let health = state.health.borrow().clone();
    let weights = state.weights.borrow().clone();
    if let Some(lag) = state.metrics.store_lag.get() {
        state
            .metrics
            .store_lag_gauge
            .set(lag.seconds(state.clock.now()));
    }
    let rows = state.store.rows_read();
    let counted = state.metrics.store_rows_read.get();
    state
        .metrics
        .store_rows_read
        .inc_by(rows.saturating_sub(counted));
    let figures = state.figures.get(&state.store, &state.clock).await?;
    state.metrics.set_error_budgets(&state.routes, &figures);
    state.metrics.set_observed(&state.routes, &figures);
    let body = state
        .metrics
        .render(&health, &weights)
        .map_err(|e| ApiError::Internal(format!("encoding metrics: {e}")))?;
    Ok(([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response())
}
impl crate::reload::ReloadObserver for Metrics {
    fn observe_reload(&self, ok: bool, at: chrono::DateTime<chrono::Utc>) {
        Metrics::observe_reload(self, ok, at);
    }

    fn count_reload(&self, ok: bool) {
        Metrics::count_reload(self, ok);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::outcome::ProbeError;

    /// `n` routes of one provider, as an operator with many routes names them.
    fn routes(n: usize) -> Vec<Route> {
        let mut src = String::from(
            "[[provider]]\nid = \"openai\"\nkind = \"openai\"\n  [[provider.region]]\n  id = \"us-east-1\"\n  base_url = \"http://127.0.0.1:9/v1\"\n",
        );
        for i in 0..n {
            src += &format!(
                "[[route]]\nprovider = \"openai\"\nregion = \"us-east-1\"\nmodel = \"gpt-4o-mini-{i:05}\"\nserves = \"model-{:03}\"\n",
                i % 100
            );
        }
        crate::config::Config::parse(&src, "t.toml")
            .unwrap()
            .config
            .routes()
    }

    fn outcome(route: &RouteId, ok: bool) -> ProbeOutcome {
        ProbeOutcome {
            route: route.clone(),
            kind: OutcomeKind::Probe,
            started_at: chrono::Utc::now(),
            success: ok,
            attributed_to: None,
            verified: Some(ok),
            ttfb_ms: Some(120.0),
            ttft_ms: Some(200.0),
            first_answer_ms: Some(200.0),
            total_ms: 850.0,
            output_tokens: Some(3),
            tokens_estimated: false,
            tokens_per_second: Some(40.0),
            model_reported: None,
            system_fingerprint: None,
            http_status: Some(if ok { 200 } else { 503 }),
            error: (!ok).then(|| ProbeError::Http {
                status: 503,
                message: "busy".into(),
            }),
            answer: None,
            max_tokens_exhausted: false,
            ratelimit: None,
        }
    }

    #[test]
    fn a_route_costs_about_a_kilobyte_of_metrics() {
        let n = 1000;
        let routes = routes(n);
        let m = Metrics::new(&routes);
        let ids: Vec<RouteId> = routes.iter().map(|r| r.id.clone()).collect();
        for id in &ids {
            m.observe_outcome(&outcome(id, true));
            m.observe_outcome(&outcome(id, false));
        }
        let now = chrono::Utc::now();
        let health = HealthSnapshot::initial(&ids, now);
        let weights = crate::weights::Weights::new(Arc::new(routes), Default::default(), &health);
        let text = m.render(&health, &weights.current()).unwrap();
        let per_route = text.len() / n;
        // 1 KB before the probe families carried `vantage`; the label adds ~100 bytes.
        assert!(per_route <= 1100, "{per_route} bytes per route");
        // The provider's distribution is there, once.
        assert_eq!(
            text.matches("probeok_provider_probe_duration_seconds_bucket{")
                .count(),
            11
        );
        assert!(!text.contains("probeok_probe_duration_seconds_bucket{le=\"0.1\""));
    }

    #[test]
    fn every_vantage_shares_the_probe_families() {
        let routes = routes(2);
        let m = Metrics::for_vantage(&routes, "cn-hangzhou");
        let id = routes[0].id.clone();
        m.observe_outcome(&outcome(&id, true));
        m.observe_vantage_outcome("cn-beijing", &outcome(&id, false));
        let now = chrono::Utc::now();
        let health = HealthSnapshot::initial(std::slice::from_ref(&id), now);
        let weights = crate::weights::Weights::new(Arc::new(routes), Default::default(), &health);
        let text = m.render(&health, &weights.current()).unwrap();
        let route = r#"provider="openai",region="us-east-1",model="gpt-4o-mini-00000""#;
        for line in [
            format!(r#"probeok_probe_success{{{route},vantage="cn-hangzhou"}} 1"#),
            format!(r#"probeok_probe_success{{{route},vantage="cn-beijing"}} 0"#),
            format!(r#"probeok_probes_total{{{route},vantage="cn-beijing",result="http"}} 1"#),
            format!(r#"probeok_probes_total{{{route},vantage="cn-hangzhou",result="success"}} 1"#),
            format!(r#"probeok_probe_duration_seconds_count{{{route},vantage="cn-hangzhou"}} 1"#),
            r#"probeok_probe_ttfb_seconds_count{provider="openai",vantage="cn-hangzhou"} 1"#
                .to_owned(),
        ] {
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
        assert!(!text.contains("probeok_probe_vantage"), "{text}");
        // A failed probe adds no latency: the remote vantage has no duration series.
        assert!(!text.contains(r#"probeok_probe_duration_seconds_count{provider="openai",region="us-east-1",model="gpt-4o-mini-00000",vantage="cn-beijing"}"#));
    }
}
