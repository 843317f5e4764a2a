//! `GET /api/v1/drift`: the current drift findings with their evidence, and every (route,
//! set)'s latest runs — the drift runner's [`crate::drift::DriftSnapshot`] as JSON
//! (`{generated_at, findings:[{id, route, set, kind, severity, failure_mode, detected_at,
//! summary, evidence:{test, p_value, before, after, runs, length, model, examples}}], sets:[…]}`).

use axum::extract::{FromRef, State};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::openapi::json_response;
use super::{ApiError, AppState};
use crate::drift::{DriftRx, DriftSnapshot};

/// The drift runner's findings, when one runs in this process.
#[derive(Clone)]
pub struct DriftFeed(pub Option<DriftRx>);

impl FromRef<AppState> for DriftFeed {
    fn from_ref(s: &AppState) -> Self {
        Self(s.drift.clone())
    }
}

/// The endpoint alone on a router of its own, over a runner's findings (for tools and tests
/// that run drift without a monitor).
pub fn router(rx: DriftRx) -> Router {
    Router::new()
        .route("/api/v1/drift", get(drift))
        .with_state(DriftFeed(Some(rx)))
}

/// `GET /api/v1/drift`; 503 `not_running` in a process without a drift runner.
pub async fn drift(State(feed): State<DriftFeed>) -> Result<Json<DriftSnapshot>, ApiError> {
    let rx = feed.0.as_ref().ok_or(ApiError::NotRunning("drift"))?;
    let snapshot = rx.borrow().clone();
    Ok(Json((*snapshot).clone()))
}

pub(super) fn doc() -> Value {
    json!({"summary": "Drift findings with evidence, and every (route, set)'s latest regression runs",
        "operationId": "drift",
        "responses": {"200": json_response("Drift findings", "Drift"),
            "503": super::openapi::error_response("No drift runner in this process (not_running)")}})
}
