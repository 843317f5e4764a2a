//! `GET /api/v1/admin/clients` (admin bearer token; 403 `admin_disabled` while the token
//! variable is unset): every `[[proxy.client]]` with its spend this period, read from the
//! store's spend ledger — the fleet's numbers, whichever proxies booked them.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::openapi::{admin_responses, error_response};
use super::{ApiError, AppState};
use crate::spend::Spend;

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let config = state.config.current();
    super::check_admin(&config, &headers)?;
    let store = state.store.clone();
    let clock = state.clock.clone();
    let clients = tokio::task::spawn_blocking(move || {
        let spend = Spend::new(
            store.spend_ledger(),
            clock,
            crate::proxy::hold_for(&config.proxy),
        );
        crate::proxy::clients::report_blocking(&config.proxy.clients, Some(&spend))
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(json!({ "clients": clients })))
}

pub(super) fn doc() -> Value {
    let client = json!({"type": "object", "required": ["id", "spent", "reserved"], "properties": {
        "id": {"type": "string"},
        "period": {"type": "string", "nullable": true, "enum": ["hour", "day", "month"]},
        "period_start": {"type": "string", "nullable": true, "format": "date-time"},
        "limit": {"type": "number", "nullable": true},
        "spent": {"type": "number"},
        "reserved": {"type": "number"},
        "remaining": {"type": "number", "nullable": true}}});
    json!({"summary": "Every proxy client's spend this period (the fleet's, from the store)",
        "operationId": "listClients",
        "security": [{"adminToken": []}],
        "responses": admin_responses(json!({"200": {"description": "Clients",
            "content": {"application/json": {"schema": {"type": "object", "required": ["clients"],
                "properties": {"clients": {"type": "array", "items": client}}}}}},
            "500": error_response("The read failed")}))})
}
