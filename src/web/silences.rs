//! The silences admin API (admin bearer token; 403 `admin_disabled` while the token variable
//! is unset):
//!
//! - `POST /api/v1/admin/silences` ([`crate::alert::silences::NewSilence`]) → 201 with the
//!   silence;
//! - `GET /api/v1/admin/silences` → `{"silences":[…]}` (active and future ones);
//! - `DELETE /api/v1/admin/silences/{id}` → 204, or 404.

use axum::body::{to_bytes, Body};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::openapi::{admin_responses, error_response, json_response};
use super::{ApiError, AppState};
use crate::alert::maintenance::Silence;
use crate::alert::silences::NewSilence;
use crate::store::alerts::AlertOp;

/// Largest request body accepted (bytes).
pub const MAX_BODY: usize = 16 * 1024;

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    super::check_admin(&state.config.current(), headers)
}

/// The token is checked before a byte of the body is read: an unauthenticated client cannot
/// make the monitor read (or wait for) anything.
pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let too_large = || ApiError::TooLarge {
        code: "payload_too_large",
        message: format!("the body is larger than {MAX_BODY} bytes"),
    };
    let declared = (headers.get(header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let body = to_bytes(body, MAX_BODY).await.map_err(|_| too_large())?;
    let req: NewSilence = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request("invalid_json", e.to_string()))?;
    let silence = req
        .build(state.clock.now())
        .map_err(|e| ApiError::bad_request(e.code(), e.to_string()))?;
    state
        .store
        .writer()
        .alert(AlertOp::PutSilence(silence.clone()))
        .await?;
    tracing::info!(id = %silence.id, routes = ?silence.routes, until = %silence.ends_at, "silence created");
    Ok((StatusCode::CREATED, Json(silence)).into_response())
}

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    authorize(&state, &headers)?;
    let store = state.store.clone();
    let now = state.clock.now();
    let all = tokio::task::spawn_blocking(move || store.reader()?.silences()).await??;
    let live: Vec<Silence> = all.into_iter().filter(|s| s.ends_at > now).collect();
    Ok(Json(json!({ "silences": live })))
}

pub async fn remove(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    authorize(&state, &headers)?;
    match state
        .store
        .writer()
        .alert(AlertOp::DeleteSilence(id.clone()))
        .await?
    {
        0 => Err(ApiError::NotFound("no such silence".into())),
        _ => {
            tracing::info!(%id, "silence deleted");
            Ok(StatusCode::NO_CONTENT)
        }
    }
}

pub(super) fn list_doc() -> Value {
    json!({"summary": "Silences not yet ended", "operationId": "listSilences",
        "security": [{"adminToken": []}],
        "responses": admin_responses(json!({"200": json_response("Silences", "Silences")}))})
}

pub(super) fn create_doc() -> Value {
    json!({"summary": "Silence alerts for routes matching globs, for a while", "operationId": "createSilence",
        "security": [{"adminToken": []}],
        "requestBody": {"required": true, "description": format!("At most {MAX_BODY} bytes"),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewSilence"}}}},
        "responses": admin_responses(json!({"201": json_response("Created", "Silence"),
            "400": error_response("Invalid silence"),
            "413": error_response("Body too large")}))})
}

pub(super) fn remove_doc() -> Value {
    json!({"summary": "End a silence now", "operationId": "deleteSilence",
        "security": [{"adminToken": []}],
        "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
        "responses": admin_responses(json!({"204": {"description": "Deleted"},
            "404": error_response("No such silence")}))})
}
