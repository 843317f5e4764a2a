//! `POST /api/v1/admin/reload` (admin bearer token): re-reads the config file as SIGHUP does
//! ([`crate::reload::Reloader`]). 200 with the report of what applied and what needs a
//! restart; 409 `no_config_file` for the built-in demo; 422 `invalid_config` with every
//! diagnostic, the running config kept.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use super::openapi::{admin_responses, error_response, json_response};
use super::{ApiError, AppState};
use crate::config::Diagnostic;
use crate::reload::{ReloadError, Report};

pub async fn reload(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Report>, ApiError> {
    super::check_admin(&state.config.current(), &headers)?;
    match state.config.reload().await {
        Ok(report) => Ok(Json(report)),
        Err(ReloadError::NoConfigFile) => Err(ApiError::refused(
            axum::http::StatusCode::CONFLICT,
            "no_config_file",
            "the service runs the built-in demo: there is no config file to reload",
        )),
        Err(ReloadError::Invalid(diags)) => Err(ApiError::InvalidConfig {
            message: ReloadError::Invalid(diags.clone()).to_string(),
            diagnostics: diags.iter().map(diagnostic_json).collect(),
        }),
        Err(e @ ReloadError::Internal(_)) => Err(ApiError::Internal(e.to_string())),
    }
}

fn diagnostic_json(d: &Diagnostic) -> Value {
    json!({
        "file": d.file,
        "line": d.line,
        "col": d.col,
        "key": d.path,
        "message": d.message,
        "text": d.to_string(),
    })
}

pub(super) fn doc() -> Value {
    json!({"summary": "Re-read the config file (as SIGHUP): live sections apply now, the rest is named for a restart; an invalid file is refused and the running config kept",
        "operationId": "reloadConfig",
        "security": [{"adminToken": []}],
        "responses": admin_responses(json!({"200": json_response("Reloaded", "Reloaded"),
            "409": error_response("No config file (the built-in demo)"),
            "422": json_response("Invalid config; nothing changed", "InvalidConfig")}))})
}
