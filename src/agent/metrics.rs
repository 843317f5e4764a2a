//! The agent's own `/metrics` (OpenMetrics) and `/healthz`: how far behind it is, when it last
//! delivered, how often delivering failed.
//!
//! - `probeok_agent_backlog` — outcomes in the outbox waiting for the monitor.
//! - `probeok_agent_dropped_total` — outcomes dropped over `[agent] max_backlog`.
//! - `probeok_agent_pushed_total` — outcomes the monitor answered for.
//! - `probeok_agent_push_errors_total` — pushes that failed (unreachable, non-200).
//! - `probeok_agent_last_push_timestamp_seconds` — the last successful push (0: none yet).
//! - `probeok_agent_probes_total{route,result}` — probes run here (`ok` / `failed`).

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::outcome::ProbeOutcome;

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    task: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    route: String,
    result: &'static str,
}

/// See the module docs.
pub struct AgentMetrics {
    registry: Registry,
    backlog: Gauge<i64, AtomicI64>,
    dropped: Counter<u64, AtomicU64>,
    pushed: Counter<u64, AtomicU64>,
    push_errors: Counter<u64, AtomicU64>,
    last_push: Gauge<f64, AtomicU64>,
    probes: Family<ProbeLabels, Counter>,
    /// `probeok_task_failures_total{task}` (the monitor's name for it), from the agent's
    /// supervisor at scrape time.
    tasks: Family<TaskLabels, Counter>,
    task_source: std::sync::OnceLock<crate::supervise::Supervisor>,
}

impl std::fmt::Debug for AgentMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentMetrics").finish_non_exhaustive()
    }
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentMetrics {
    pub fn new() -> Self {
        // `probeok_agent_…` for the agent's own series; the task failures keep the name they
        // have on the monitor, so one alert rule covers both.
        let mut registry = Registry::with_prefix("probeok");
        let backlog = Gauge::<i64, AtomicI64>::default();
        let dropped = Counter::<u64, AtomicU64>::default();
        let pushed = Counter::<u64, AtomicU64>::default();
        let push_errors = Counter::<u64, AtomicU64>::default();
        let last_push = Gauge::<f64, AtomicU64>::default();
        let probes = Family::<ProbeLabels, Counter>::default();
        registry.register(
            "agent_backlog",
            "Outcomes waiting for the monitor",
            backlog.clone(),
        );
        registry.register(
            "agent_dropped",
            "Outcomes dropped over [agent] max_backlog",
            dropped.clone(),
        );
        registry.register(
            "agent_pushed",
            "Outcomes the monitor answered for",
            pushed.clone(),
        );
        registry.register(
            "agent_push_errors",
            "Pushes to the monitor that failed",
            push_errors.clone(),
        );
        registry.register(
            "agent_last_push_timestamp_seconds",
            "Unix time of the last successful push (0: none yet)",
            last_push.clone(),
        );
        registry.register(
            "agent_probes",
            "Probes run from this vantage",
            probes.clone(),
        );
        let tasks = Family::<TaskLabels, Counter>::default();
        // Every supervised task from the start, so the first failure is an increase.
        for task in crate::supervise::AGENT_TASKS {
            let _ = tasks.get_or_create(&TaskLabels { task });
        }
        registry.register(
            "task_failures",
            "Long-lived tasks that panicked or ended before shutdown, by task (the process then exits non-zero)",
            tasks.clone(),
        );
        Self {
            registry,
            backlog,
            dropped,
            pushed,
            push_errors,
            last_push,
            probes,
            tasks,
            task_source: std::sync::OnceLock::new(),
        }
    }

    /// Reads the task failures from this supervisor from now on.
    pub fn follow_tasks(&self, source: crate::supervise::Supervisor) {
        let _ = self.task_source.set(source);
    }

    /// The outbox's size and its all-time dropped count.
    pub fn set_backlog(&self, len: u64, dropped_total: u64) {
        self.backlog.set(i64::try_from(len).unwrap_or(i64::MAX));
        let seen = self.dropped.get();
        if dropped_total > seen {
            self.dropped.inc_by(dropped_total - seen);
        }
    }

    pub fn backlog(&self) -> u64 {
        u64::try_from(self.backlog.get()).unwrap_or(0)
    }

    pub fn pushed(&self, n: u64, at: chrono::DateTime<chrono::Utc>) {
        self.pushed.inc_by(n);
        self.last_push.set(at.timestamp_millis() as f64 / 1000.0);
    }

    pub fn pushed_total(&self) -> u64 {
        self.pushed.get()
    }

    pub fn push_failed(&self) {
        self.push_errors.inc();
    }

    pub fn push_errors(&self) -> u64 {
        self.push_errors.get()
    }

    pub fn observe_outcome(&self, o: &ProbeOutcome) {
        let result = if o.success { "ok" } else { "failed" };
        self.probes
            .get_or_create(&ProbeLabels {
                route: o.route.to_string(),
                result,
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        if let Some(source) = self.task_source.get() {
            for (task, n) in source.counts() {
                let c = self.tasks.get_or_create(&TaskLabels { task });
                c.inc_by(n.saturating_sub(c.get()));
            }
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// `/healthz` and `/metrics`.
pub fn router(metrics: Arc<AgentMetrics>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(render))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state(metrics)
}

async fn render(State(m): State<Arc<AgentMetrics>>) -> Response {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], m.encode()).into_response()
}
