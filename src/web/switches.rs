//! `GET /api/v1/switches?limit=N`: the switch controller now and its records —
//! `{generated_at, models:[{serves, primaries, phase, backup?, since?, stage?, ratio?,
//! dwell_until, switches_last_hour}], budget:{…}, records:[…newest first]}`.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::openapi::error_response;
use super::{ApiError, AppState};
use crate::switch::{SwitchRecord, SwitchStatus};

/// `?limit=`: default and ceiling.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    limit: Option<usize>,
}

#[derive(Serialize)]
pub struct Switches {
    #[serde(flatten)]
    status: SwitchStatus,
    records: Vec<SwitchRecord>,
}

/// The controller's status comes from what `/metrics` follows (attached at start); 503
/// `not_running` without one.
pub async fn list(
    State(state): State<AppState>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Switches>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    let status = state
        .metrics
        .switch()
        .ok_or(ApiError::NotRunning("the switch controller"))?;
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let store = state.store.clone();
    let records =
        tokio::task::spawn_blocking(move || store.reader()?.switch_records(limit)).await??;
    let status = (*status).clone();
    Ok(Json(Switches { status, records }))
}

pub(super) fn doc() -> Value {
    json!({"summary": "Every logical model's switch phase, the extra-cost budget, and the switch records, newest first",
        "operationId": "switches",
        "parameters": [{"name": "limit", "in": "query", "required": false,
            "description": format!("How many records (default {DEFAULT_LIMIT}, at most {MAX_LIMIT})"),
            "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}}],
        "responses": {"200": {"description": "Switch status and records",
            "content": {"application/json": {"schema": {"type": "object",
                "required": ["generated_at", "models", "budget", "records"],
                "properties": {
                    "generated_at": {"type": "string", "format": "date-time"},
                    "models": {"type": "array", "items": {"type": "object", "properties": {
                        "serves": {"type": "string"},
                        "primaries": {"type": "array", "items": {"type": "string"}},
                        "phase": {"type": "string", "enum": ["primary", "probing", "switched", "canary"]},
                        "backup": {"type": "string"},
                        "dwell_until": {"type": "string", "format": "date-time", "nullable": true},
                        "switches_last_hour": {"type": "integer"}}}},
                    "budget": {"type": "object"},
                    "records": {"type": "array", "items": {"type": "object"}}}}}}},
            "400": error_response("Bad limit"),
            "500": error_response("Store failure"),
            "503": error_response("No switch controller in this process (not_running)")}})
}
