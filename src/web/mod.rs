//! The monitor's HTTP surface on `server.listen`: the router, what handlers share
//! ([`AppState`]), the JSON error shape ([`ApiError`]) and liveness/readiness.
//!
//! Every endpoint is one entry of [`table`] (method, path, handler, OpenAPI operation): the
//! router is built from it alone and `/api/openapi.json`'s paths are generated from it, so
//! nothing is served undocumented. One file per feature:
//!
//! - [`api`]: `/api/v1/status`, `/api/v1/routes/{id}/probes`, `/api/v1/incidents`.
//! - [`ingest`]: `POST /api/v1/ingest` (passive outcomes, bearer token).
//! - [`feed`]: the weights feed — `/api/v1/weights` (ETag, long-poll) and its SSE stream.
//! - [`xds`]: `POST /v3/discovery:endpoints`, Envoy's endpoint discovery (REST xDS v3).
//! - [`drift`]: `/api/v1/drift`; [`switches`]: `/api/v1/switches`; [`requests`]:
//!   `/api/v1/requests` (the proxy's metering); [`shadow`]: `/api/v1/shadow` (shadow routes
//!   compared with the real answers); [`catalog`]: `/api/v1/catalog` (the providers' model
//!   lists).
//! - [`drills`]: `/api/v1/drills` and the drills admin API; [`silences`]: the silences admin
//!   API; [`reload`]: `POST /api/v1/admin/reload`.
//! - [`metrics`]: `/metrics` (OpenMetrics via `prometheus-client`).
//! - [`openapi`]: `/api/openapi.json` and the check of a table against a document.
//! - [`refresh`]: store figures shared by requests and refreshed off their path.
//! - [`pages`]: the public HTML pages `/`, `/routes/{id}`, `/incidents` (askama templates in
//!   `templates/`, words in [`i18n`]) and `/static/style.css`.
//!
//! See `docs/http-api.md` for the contract of each endpoint.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub(crate) mod atom;
pub(crate) mod badges;
pub(crate) mod catalog;
pub(crate) mod clients;
pub mod drift;
pub mod drills;
pub(crate) mod embeddings;
pub(crate) mod feed;
pub mod guards;
pub(crate) mod headroom;
pub mod i18n;
pub(crate) mod ingest;
pub mod kept;
pub(crate) mod memo;
pub(crate) mod metrics;
pub mod openapi;
pub mod pages;
pub(crate) mod refresh;
pub(crate) mod reload;
pub mod requests;
pub mod shadow;
pub(crate) mod silences;
pub mod subscribe;
pub(crate) mod switches;
pub mod table;
pub mod vantages;
pub mod windows;
pub mod xds;

use std::sync::Arc;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::health::{HealthEvent, HealthRx};
use crate::probe::ProbeOutcome;
use crate::reload::LiveConfig;
use crate::route::Route;
use crate::secret::Secret;
use crate::store::{Store, StoreError};
use crate::weights::WeightsRx;

pub use api::{FiguresCache, IncidentQuery, IncidentSource, SnapshotIncidents, StoreIncidents};
pub use metrics::Metrics;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// The config in effect, following reloads: read [`LiveConfig::current`] once per request.
    pub config: LiveConfig,
    /// The resolved routes, in config order.
    pub routes: Arc<Vec<Route>>,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    /// The jobs that must keep beating for the service to be ready, and since when it runs.
    pub jobs: Arc<crate::heartbeat::Jobs>,
    /// Detection's latest judgement of every route.
    pub health: HealthRx,
    /// Transitions and findings as they happen.
    pub events: broadcast::Sender<HealthEvent>,
    /// Passive outcomes (ingest, proxy) go to detection and the store through here.
    pub passive: mpsc::Sender<ProbeOutcome>,
    /// The published weights (see [`crate::weights::spawn_publisher`]).
    pub weights: WeightsRx,
    /// The metric families `/metrics` renders; the recorder feeds it every outcome.
    pub metrics: Arc<Metrics>,
    /// `POST /api/v1/ingest`'s bearer token (from `server.ingest_token_env`); `None` turns
    /// the endpoint off (404 `ingest_disabled`).
    pub ingest_token: Option<Secret>,
    /// Where `/api/v1/incidents` reads incidents from.
    pub incidents: Arc<dyn IncidentSource>,
    /// Drift's findings, when a drift runner runs: `/api/v1/status` shows a route with an open
    /// drift finding as `behavior_changed`; `/api/v1/drift` lists them.
    pub drift: Option<crate::drift::DriftRx>,
    /// The drills, when they run in this process (`/api/v1/drills`, the drills admin API).
    pub drills: Option<crate::drill::DrillService>,
    /// The store figures `/api/v1/status` reuses for a few seconds.
    pub figures: Arc<FiguresCache>,
    /// The bound on public reads and the cached `/readyz` answer ([`guards`]).
    pub guards: Arc<guards::Guards>,
    /// Cancelled at shutdown: long-polls and SSE streams end on it so graceful shutdown is
    /// never held open by a subscriber.
    pub shutdown: CancellationToken,
    /// Agents' outcomes to detection and its per-vantage view, when detection runs here.
    pub vantages: Option<crate::health::VantageLink>,
    /// Envoy's endpoint assignments, serialised once per weights version.
    pub xds: Arc<xds::XdsCache>,
}

/// Checks `Authorization: Bearer <token>` against the variable `server.admin_token_env` names
/// in the config's environment (read now, so a rotated token takes effect at once). Both sides are hashed first, so the
/// comparison takes the same time whatever the lengths. Unset variable: 403 `admin_disabled`;
/// a missing or wrong token: 401 with `WWW-Authenticate: Bearer`.
pub fn check_admin(config: &crate::config::Config, headers: &HeaderMap) -> Result<(), ApiError> {
    crate::secret::check_bearer_env(&config.env, &config.server.admin_token_env, headers)
        .map_err(ApiError::from)
}

impl From<crate::secret::AuthError> for ApiError {
    fn from(e: crate::secret::AuthError) -> Self {
        match e {
            crate::secret::AuthError::Disabled => ApiError::AdminDisabled,
            crate::secret::AuthError::Unauthorized => ApiError::Unauthorized,
        }
    }
}

/// One endpoint of the router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub method: Method,
    /// As axum matches it.
    pub path: &'static str,
    /// As `/api/openapi.json` names it (differs where a wildcard stands for `{id}/…`).
    pub doc_path: &'static str,
}

/// Every endpoint the router serves, in table order.
pub fn endpoints() -> Vec<Endpoint> {
    table::table().into_iter().map(|e| e.endpoint).collect()
}

/// The monitor's router: [`table::table`] and the JSON 404 for every other path.
pub fn router(state: AppState) -> Router {
    // The status page's past days and the figures' long windows are read from the start,
    // not by the first visitor.
    state
        .figures
        .past()
        .start(&state.store, &state.clock, &state.shutdown);
    state
        .figures
        .windows()
        .start(&state.store, &state.clock, &state.shutdown);
    table::router(table::table(), state)
}

/// The process is up and serving HTTP.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// How long `/readyz` waits for the store's writability check.
const READYZ_STORE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The store takes writes, keeps up with the probes (its lag is at most
/// [`crate::lag::MAX_READY_LAG`]) and no scheduled job has been silent for `[heartbeat]
/// stale_after` (a job that never beat counts from the service's start). 503 names each problem, and the
/// stale jobs with how long they have been silent.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let guards = state.guards.clone();
    let now = state.clock.now();
    let r = guards.ready(now, || check_ready(state)).await;
    (r.status, Json(r.body)).into_response()
}

/// `/readyz`'s checks, run at most once per [`guards::READY_TTL`].
async fn check_ready(state: AppState) -> guards::Ready {
    let mut problems = Vec::new();
    // A writer reconnecting to an unreachable database holds its queue; say so instead of
    // waiting for it.
    match tokio::time::timeout(READYZ_STORE_WAIT, state.store.writer().check_writable()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(format!("store not writable: {e}")),
        Err(_) => {
            let why = state.store.reachability().last_error().unwrap_or_default();
            problems.push(format!(
                "store not writable: no answer within {}s (database {}: {why})",
                READYZ_STORE_WAIT.as_secs(),
                if state.store.reachability().reachable() {
                    "busy"
                } else {
                    "unreachable"
                },
            ));
        }
    }
    let now = state.clock.now();
    if let Some(lag) = state.metrics.store_lag() {
        if lag.behind(now) {
            problems.push(format!(
                "store behind the probes: the oldest outcome waiting has waited {:.0} s (more than {} s)",
                lag.seconds(now),
                crate::lag::MAX_READY_LAG.as_secs()
            ));
        }
    }
    let store = state.store.clone();
    let beats = tokio::task::spawn_blocking(move || store.reader()?.heartbeats()).await;
    let stale_after = state.config.current().heartbeat.stale_after;
    let mut stale_jobs = Vec::new();
    match beats {
        Ok(Ok(beats)) => {
            for s in state.jobs.stale(&beats, now, stale_after) {
                problems.push(s.describe());
                stale_jobs.push(json!({
                    "job": s.job,
                    "silent_s": s.silent.as_secs(),
                    "last_beat": s.last_beat.map(rfc3339),
                }));
            }
        }
        Ok(Err(e)) => problems.push(format!("cannot read heartbeats: {e}")),
        Err(e) => problems.push(format!("cannot read heartbeats: {e}")),
    }
    let role = state.metrics.role().as_str();
    // Baselines still warming from the history: probing and error detection run, latency
    // judgement follows route by route. Said, not a reason to take the monitor out.
    let warming = state
        .metrics
        .warming()
        .map(|(done, total)| json!({"baselines": {"warm": done, "routes": total}}));
    let (status, mut body) = if problems.is_empty() {
        (StatusCode::OK, json!({"status": "ready", "role": role}))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({
                "status": "not_ready",
                "role": role,
                "problems": problems,
                "stale_jobs": stale_jobs,
                "stale_after_s": stale_after.as_secs(),
            }),
        )
    };
    // Only while warming, on both answers alike.
    if let Some(w) = warming {
        body["warming"] = w;
    }
    guards::Ready { status, body }
}

pub async fn not_found() -> Response {
    api_error(StatusCode::NOT_FOUND, "not_found", "no such path")
}

/// The API's error shape: `{"error":{"code","message"}}` (see `docs/http-api.md`).
pub fn api_error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

/// What a JSON endpoint can fail with; rendered as `{"error":{"code","message"}}`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 404 `not_found`.
    #[error("{0}")]
    NotFound(String),
    /// 400 with a specific code (`bad_query`, `bad_json`, …).
    #[error("{message}")]
    BadRequest { code: &'static str, message: String },
    /// 401 `unauthorized`: no or a wrong bearer token.
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// 403 `admin_disabled`: the admin token variable is unset.
    #[error("admin endpoints are off: the admin token variable is not set")]
    AdminDisabled,
    /// A feature refused the request with its own status and code (a drill outside the
    /// off-peak windows: 409 `outside_off_peak`; no config file to reload: 409
    /// `no_config_file`; …).
    #[error("{message}")]
    Refused {
        status: StatusCode,
        code: &'static str,
        message: String,
    },
    /// 422 `invalid_config`, with every diagnostic of the refused file.
    #[error("{message}")]
    InvalidConfig {
        message: String,
        diagnostics: Vec<serde_json::Value>,
    },
    /// 503 `not_running`: the feature behind the endpoint does not run in this process.
    #[error("{0} does not run in this process")]
    NotRunning(&'static str),
    /// 404 `ingest_disabled`: `server.ingest_token_env` names an unset variable.
    #[error("ingest is disabled: the ingest token variable is not set")]
    IngestDisabled,
    /// 413 with `payload_too_large` or `too_many_items`.
    #[error("{message}")]
    TooLarge { code: &'static str, message: String },
    /// 503 `shutting_down`.
    #[error("the service is shutting down")]
    ShuttingDown,
    /// 500 `store_error`; the detail is logged, not sent.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// 500 `internal`; the detail is logged, not sent.
    #[error("internal: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::BadRequest {
            code,
            message: message.into(),
        }
    }

    pub fn refused(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self::Refused {
            status,
            code,
            message: message.into(),
        }
    }

    /// A body that could not be read: 413 `payload_too_large` past `limit` bytes, else 400
    /// `bad_body`.
    pub fn from_body(e: &BytesRejection, limit: usize) -> Self {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::TooLarge {
                code: "payload_too_large",
                message: format!("the body is larger than {limit} bytes"),
            }
        } else {
            Self::bad_request("bad_body", e.body_text())
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::NotFound(_) | Self::IngestDisabled => StatusCode::NOT_FOUND,
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::AdminDisabled => StatusCode::FORBIDDEN,
            Self::Refused { status, .. } => *status,
            Self::InvalidConfig { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ShuttingDown | Self::NotRunning(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Store(_) | Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::BadRequest { code, .. }
            | Self::TooLarge { code, .. }
            | Self::Refused { code, .. } => code,
            Self::Unauthorized => "unauthorized",
            Self::AdminDisabled => "admin_disabled",
            Self::InvalidConfig { .. } => "invalid_config",
            Self::NotRunning(_) => "not_running",
            Self::IngestDisabled => "ingest_disabled",
            Self::ShuttingDown => "shutting_down",
            Self::Store(_) => "store_error",
            Self::Internal(_) => "internal",
        }
    }
}

impl From<refresh::RefreshError> for ApiError {
    fn from(e: refresh::RefreshError) -> Self {
        match e {
            refresh::RefreshError::Store(e) => e.into(),
            refresh::RefreshError::Task(e) => e.into(),
        }
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> Self {
        Self::Internal(format!("blocking task failed: {e}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // Internal details stay in the log (logged once, here, where the error is handled).
        let message = match &self {
            Self::Store(_) | Self::Internal(_) => {
                tracing::error!(error = %self, "request failed");
                "internal error; see the server log".to_owned()
            }
            other => other.to_string(),
        };
        let mut response = match &self {
            Self::InvalidConfig { diagnostics, .. } => (
                status,
                Json(json!({"error": {
                    "code": self.code(),
                    "message": message,
                    "diagnostics": diagnostics,
                }})),
            )
                .into_response(),
            _ => api_error(status, self.code(), &message),
        };
        if matches!(self, Self::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

pub use crate::clock::rfc3339;
