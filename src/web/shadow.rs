//! `GET /api/v1/shadow`: per `[[shadow]]`, how the shadow route's answers compared with the
//! real ones over the last hour and day (copies, skips by reason, success on both sides,
//! latency and TTFT medians, output length ratio, structured-output validity). It is about real
//! traffic, so it takes the admin token; it shows figures only, never content.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::openapi::{admin_responses, error_response};
use super::{check_admin, ApiError, AppState};
use crate::clock::rfc3339;

/// The endpoint's path.
pub const PATH: &str = "/api/v1/shadow";

/// `GET /api/v1/shadow`; 503 `not_running` in a process without the proxy.
pub async fn report(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    check_admin(&state.config.current(), &headers)?;
    let proxy = state
        .metrics
        .proxy()
        .ok_or(ApiError::NotRunning("the proxy"))?;
    Ok(Json(json!({
        "generated_at": rfc3339(state.clock.now()),
        "shadows": proxy.shadow_report(),
    })))
}

pub(super) fn doc() -> Value {
    let pair = json!({"type": "object", "properties": {
        "primary": {"type": "number", "nullable": true}, "shadow": {"type": "number", "nullable": true}}});
    let window = json!({"type": "object", "properties": {
        "copied": {"type": "integer"},
        "compared": {"type": "integer"},
        "skipped": {"type": "object", "properties": {
            "idempotency_key": {"type": "integer"}, "queue_full": {"type": "integer"},
            "budget": {"type": "integer"}, "client_gone": {"type": "integer"}}},
        "success": {"type": "object", "properties": {
            "both": {"type": "integer"}, "either": {"type": "integer"},
            "primary": {"type": "integer"}, "shadow": {"type": "integer"}}},
        "success_ratio": pair,
        "latency_ms_p50": pair,
        "ttft_ms_p50": pair,
        "output_length_ratio": {"type": "number", "nullable": true},
        "validity": {"type": "object", "properties": {
            "checked": {"type": "integer"},
            "primary": {"type": "number", "nullable": true}, "shadow": {"type": "number", "nullable": true}}}}});
    json!({"summary": "Shadow routes compared with the real answers (last hour, last day)",
        "operationId": "shadow",
        "security": [{"adminToken": []}],
        "responses": admin_responses(json!({"200": {"description": "One entry per [[shadow]]",
            "content": {"application/json": {"schema": {"type": "object", "required": ["generated_at", "shadows"],
                "properties": {"generated_at": {"type": "string"},
                    "shadows": {"type": "array", "items": {"type": "object", "properties": {
                        "serves": {"type": "string"}, "route": {"type": "string"},
                        "ratio": {"type": "number"}, "max_cost_per_hour": {"type": "number"},
                        "spent_this_hour": {"type": "number"}, "currency": {"type": "string", "nullable": true},
                        "last_hour": window, "last_day": window}}}}}}}},
            "503": error_response("No proxy in this process (not_running)")}))})
}
