//! The monitor's HTTP surface on `server.listen`: the router, what handlers share
//! ([`AppState`]), the JSON error shape ([`ApiError`]) and liveness/readiness.
//!
//! - [`api`]: `/api/v1/status`, `/api/v1/routes/{id}/probes`, `/api/v1/incidents`.
//! - [`ingest`]: `POST /api/v1/ingest` (passive outcomes, bearer token).
//! - [`feed`]: the weights feed — `/api/v1/weights` (ETag, long-poll) and its SSE stream.
//! - [`metrics`]: `/metrics` (OpenMetrics via `prometheus-client`).
//! - [`openapi`]: `/api/openapi.json`, checked against [`endpoints`] by a test.
//! - [`pages`]: the public HTML pages `/`, `/routes/{id}`, `/incidents` (askama templates in
//!   `templates/`, words in [`i18n`]) and `/static/style.css`.
//!
//! Every endpoint is listed once in [`endpoints`] (method, axum path, documented path), so the
//! router and the OpenAPI document cannot drift apart unnoticed.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub mod feed;
pub mod i18n;
pub mod ingest;
pub mod metrics;
pub mod openapi;
pub mod pages;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::health::{HealthEvent, HealthRx};
use crate::probe::ProbeOutcome;
use crate::reload::LiveConfig;
use crate::route::Route;
use crate::secret::{AuthError, Secret};
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
    /// drift finding as `behavior_changed`.
    pub drift: Option<crate::drift::DriftRx>,
    /// The store figures `/api/v1/status` reuses for a few seconds.
    pub figures: Arc<FiguresCache>,
    /// Cancelled at shutdown: long-polls and SSE streams end on it so graceful shutdown is
    /// never held open by a subscriber.
    pub shutdown: CancellationToken,
}

/// Checks `Authorization: Bearer <token>` against the variable `admin_token_env` names
/// ([`crate::secret::check_bearer_env`]: read now, digests compared in constant time). Unset
/// variable: 403 `admin_disabled`; a missing or wrong token: 401 with
/// `WWW-Authenticate: Bearer`.
pub fn authorize_admin(admin_token_env: &str, headers: &HeaderMap) -> Result<(), Box<Response>> {
    match crate::secret::check_bearer_env(admin_token_env, headers) {
        Ok(()) => Ok(()),
        Err(AuthError::Disabled) => Err(Box::new(api_error(
            StatusCode::FORBIDDEN,
            "admin_disabled",
            "admin endpoints are off: the admin token variable is not set",
        ))),
        Err(AuthError::Unauthorized) => {
            let mut r = api_error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            Err(Box::new(r))
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

fn ep(method: Method, path: &'static str) -> Endpoint {
    Endpoint {
        method,
        path,
        doc_path: path,
    }
}

/// Every endpoint with its handler. Route ids contain `/` (`qwen/cn/deepseek-ai/V3`), so the
/// per-route endpoints use one wildcard and split the tail (`{id}/probes`) themselves.
fn table() -> Vec<(Endpoint, MethodRouter<AppState>)> {
    vec![
        (ep(Method::GET, "/healthz"), get(healthz)),
        (ep(Method::GET, "/readyz"), get(readyz)),
        (ep(Method::GET, "/metrics"), get(metrics::handler)),
        (ep(Method::GET, "/api/openapi.json"), get(openapi::handler)),
        (ep(Method::GET, "/api/v1/status"), get(api::status)),
        (
            Endpoint {
                method: Method::GET,
                path: "/api/v1/routes/{*rest}",
                doc_path: "/api/v1/routes/{id}/probes",
            },
            get(api::route_tail),
        ),
        (ep(Method::GET, "/api/v1/incidents"), get(api::incidents)),
        (ep(Method::GET, "/api/v1/weights"), get(feed::weights)),
        (ep(Method::GET, "/api/v1/weights/stream"), get(feed::stream)),
        (ep(Method::POST, "/api/v1/ingest"), post(ingest::handler)),
        // Re-reads the config file (`AppState.config`'s reloader; 409 without one).
        (
            ep(Method::POST, "/api/v1/admin/reload"),
            post(crate::reload::handler),
        ),
        // The HTML pages (text/html; described in the OpenAPI document under the tag `pages`).
        (ep(Method::GET, "/"), get(pages::status)),
        (
            Endpoint {
                method: Method::GET,
                path: "/routes/{*rest}",
                doc_path: "/routes/{id}",
            },
            get(pages::route),
        ),
        (ep(Method::GET, "/incidents"), get(pages::incidents)),
        (ep(Method::GET, "/static/style.css"), get(pages::stylesheet)),
    ]
}

/// The endpoints of the router fragments [`router`] merges: the admin silences
/// ([`crate::alert::silences::router`]) and `GET /api/v1/drift` ([`crate::drift::api`], merged
/// when `AppState::drift` is set). Listed here so the OpenAPI test sees them too.
fn merged() -> Vec<Endpoint> {
    vec![
        ep(Method::GET, "/api/v1/drift"),
        ep(Method::GET, "/api/v1/requests"),
        ep(Method::GET, "/api/v1/admin/silences"),
        ep(Method::POST, "/api/v1/admin/silences"),
        ep(Method::DELETE, "/api/v1/admin/silences/{id}"),
    ]
}

/// Every endpoint the router serves (its own table and the merged fragments).
pub fn endpoints() -> Vec<Endpoint> {
    table()
        .into_iter()
        .map(|(e, _)| e)
        .chain(merged())
        .collect()
}

pub fn router(state: AppState) -> Router {
    let drift = state.drift.clone().map(crate::drift::api::router);
    let requests = crate::proxy::requests_router(state.store.clone());
    let router = table()
        .into_iter()
        .fold(Router::new(), |r, (e, handler)| r.route(e.path, handler))
        .merge(crate::alert::silences::router())
        .fallback(not_found)
        .with_state(state)
        .merge(requests);
    match drift {
        Some(d) => router.merge(d),
        None => router,
    }
}

/// The process is up and serving HTTP.
async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// The store takes writes and no scheduled job has been silent for `[heartbeat] stale_after`
/// (a job that never beat counts from the service's start). 503 names each problem, and the
/// stale jobs with how long they have been silent.
async fn readyz(State(state): State<AppState>) -> Response {
    let mut problems = Vec::new();
    if let Err(e) = state.store.writer().check_writable().await {
        problems.push(format!("store not writable: {e}"));
    }
    let store = state.store.clone();
    let beats = tokio::task::spawn_blocking(move || store.reader()?.heartbeats()).await;
    let now = state.clock.now();
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
    if problems.is_empty() {
        Json(json!({"status": "ready"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "not_ready",
                "problems": problems,
                "stale_jobs": stale_jobs,
                "stale_after_s": stale_after.as_secs(),
            })),
        )
            .into_response()
    }
}

async fn not_found() -> Response {
    api_error(StatusCode::NOT_FOUND, "not_found", "no such path")
}

/// SPEC's error shape: `{"error":{"code","message"}}`.
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

    pub fn status(&self) -> StatusCode {
        match self {
            Self::NotFound(_) | Self::IngestDisabled => StatusCode::NOT_FOUND,
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::Store(_) | Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::BadRequest { code, .. } | Self::TooLarge { code, .. } => code,
            Self::Unauthorized => "unauthorized",
            Self::IngestDisabled => "ingest_disabled",
            Self::ShuttingDown => "shutting_down",
            Self::Store(_) => "store_error",
            Self::Internal(_) => "internal",
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
        let mut response = api_error(status, self.code(), &message);
        if matches!(self, Self::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

pub use crate::clock::rfc3339;
