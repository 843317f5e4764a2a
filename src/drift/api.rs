//! `GET /api/v1/drift`: the current drift findings with their evidence, and every (route,
//! set)'s latest runs. A router fragment with its own state, merged into the web router.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};

use super::{DriftRx, DriftSnapshot};

/// The fragment: `GET /api/v1/drift` → the [`DriftSnapshot`] as JSON
/// (`{generated_at, findings:[{id, route, set, kind, severity, failure_mode, detected_at,
/// summary, evidence:{test, p_value, before, after, runs, length, model, examples}}], sets:[…]}`).
pub fn router(rx: DriftRx) -> Router {
    Router::new()
        .route("/api/v1/drift", get(drift))
        .with_state(rx)
}

async fn drift(State(rx): State<DriftRx>) -> Json<DriftSnapshot> {
    let snapshot = rx.borrow().clone();
    Json((*snapshot).clone())
}
