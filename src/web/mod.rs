//! The monitor's HTTP surface on `server.listen`. For now: liveness and readiness; the status
//! page, JSON API, weights feed and metrics join this router as they are built.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use tokio::sync::{broadcast, mpsc};

use crate::clock::Clock;
use crate::config::Config;
use crate::health::{HealthEvent, HealthRx};
use crate::probe::ProbeOutcome;
use crate::route::Route;
use crate::store::Store;

/// A job whose heartbeat is older than this makes `/readyz` fail.
pub const HEARTBEAT_STALE_AFTER: Duration = Duration::from_secs(180);

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    /// The resolved routes, in config order.
    pub routes: Arc<Vec<Route>>,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    /// The jobs that must keep beating for the service to be ready.
    pub jobs: Arc<Vec<&'static str>>,
    /// Detection's latest judgement of every route.
    pub health: HealthRx,
    /// Transitions and findings as they happen.
    pub events: broadcast::Sender<HealthEvent>,
    /// Passive outcomes (ingest, proxy) go to detection and the store through here.
    pub passive: mpsc::Sender<ProbeOutcome>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(state)
}

/// The process is up and serving HTTP.
async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// The store takes writes and every scheduled job has beaten recently.
async fn readyz(State(state): State<AppState>) -> Response {
    let mut problems = Vec::new();
    if let Err(e) = state.store.writer().check_writable().await {
        problems.push(format!("store not writable: {e}"));
    }
    let store = state.store.clone();
    let beats = tokio::task::spawn_blocking(move || store.reader()?.heartbeats()).await;
    let now = state.clock.now();
    match beats {
        Ok(Ok(beats)) => {
            for job in state.jobs.iter() {
                match beats.iter().find(|(name, _)| name == job) {
                    None => problems.push(format!("job {job} has not reported yet")),
                    Some((_, at)) => {
                        let age = (now - *at).to_std().unwrap_or_default();
                        if age > HEARTBEAT_STALE_AFTER {
                            problems.push(format!("job {job} silent for {}s", age.as_secs()));
                        }
                    }
                }
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
            Json(json!({"status": "not_ready", "problems": problems})),
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
