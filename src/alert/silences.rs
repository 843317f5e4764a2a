//! The silences admin API, merged into the monitor's router:
//!
//! - `POST /api/v1/admin/silences` `{"routes":["qwen/*"], "duration":"2h" | "ends_at":"…",
//!   "starts_at"?: "…", "comment": "…", "created_by"?: "…"}` → 201 with the silence;
//! - `GET /api/v1/admin/silences` → `{"silences":[…]}` (active and future ones);
//! - `DELETE /api/v1/admin/silences/{id}` → 204, or 404.
//!
//! Every call needs `Authorization: Bearer <token>` with the token from the variable named by
//! `server.admin_token_env` (compared in constant time); while it is unset the endpoints answer
//! 403 `admin_disabled`. Silences suppress alerts only: probing and storage go on.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use super::maintenance::Silence;
use crate::store::alerts::AlertOp;
use crate::web::{api_error, AppState};

/// Longest a silence may last.
pub const MAX_SILENCE: chrono::Duration = chrono::Duration::days(30);

/// The routes to merge into the monitor's router.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/admin/silences", get(list).post(create))
        .route("/api/v1/admin/silences/{id}", delete(remove))
}

/// Checks the admin bearer token (see [`crate::web::authorize_admin`]).
pub fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), Box<Response>> {
    crate::web::authorize_admin(&state.config.current().server.admin_token_env, headers)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSilence {
    routes: Vec<String>,
    #[serde(default)]
    starts_at: Option<DateTime<Utc>>,
    #[serde(default)]
    ends_at: Option<DateTime<Utc>>,
    #[serde(default)]
    duration: Option<String>,
    #[serde(default)]
    comment: String,
    #[serde(default)]
    created_by: Option<String>,
}

async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(r) = authorize(&state, &headers) {
        return *r;
    }
    let req: NewSilence = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return api_error(StatusCode::BAD_REQUEST, "invalid_json", &e.to_string()),
    };
    let now = state.clock.now();
    let starts_at = req.starts_at.unwrap_or(now);
    let ends_at = match (req.ends_at, req.duration.as_deref()) {
        (Some(end), None) => end,
        (None, Some(d)) => match humantime::parse_duration(d)
            .ok()
            .and_then(|d| chrono::Duration::from_std(d).ok())
        {
            Some(d) => starts_at + d,
            None => {
                return api_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_duration",
                    "duration must look like \"30m\" or \"2h\"",
                )
            }
        },
        _ => {
            return api_error(
                StatusCode::BAD_REQUEST,
                "invalid_silence",
                "give exactly one of ends_at and duration",
            )
        }
    };
    if req.routes.is_empty() || req.routes.iter().any(|r| r.trim().is_empty()) {
        return api_error(
            StatusCode::BAD_REQUEST,
            "invalid_silence",
            "routes must list at least one non-empty route id or glob",
        );
    }
    if ends_at <= starts_at || ends_at <= now {
        return api_error(
            StatusCode::BAD_REQUEST,
            "invalid_silence",
            "the silence must end after it starts and in the future",
        );
    }
    if ends_at - starts_at > MAX_SILENCE {
        return api_error(
            StatusCode::BAD_REQUEST,
            "invalid_silence",
            "a silence lasts at most 30 days",
        );
    }
    let silence = Silence {
        id: format!(
            "sil-{}",
            super::render::key_digest(&format!("{now:?}{:?}{}", req.routes, rand::random::<u64>()))
        ),
        routes: req.routes,
        starts_at,
        ends_at,
        comment: req.comment,
        created_by: req.created_by.unwrap_or_else(|| "admin".to_owned()),
        created_at: now,
    };
    match state
        .store
        .writer()
        .alert(AlertOp::PutSilence(silence.clone()))
        .await
    {
        Ok(_) => {
            tracing::info!(id = %silence.id, routes = ?silence.routes, until = %silence.ends_at, "silence created");
            (StatusCode::CREATED, Json(silence)).into_response()
        }
        Err(e) => api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "store_error",
            &e.to_string(),
        ),
    }
}

async fn list(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&state, &headers) {
        return *r;
    }
    let store = state.store.clone();
    let now = state.clock.now();
    match tokio::task::spawn_blocking(move || store.reader()?.silences()).await {
        Ok(Ok(all)) => {
            let live: Vec<Silence> = all.into_iter().filter(|s| s.ends_at > now).collect();
            Json(json!({"silences": live})).into_response()
        }
        Ok(Err(e)) => api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "store_error",
            &e.to_string(),
        ),
        Err(e) => api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            &e.to_string(),
        ),
    }
}

async fn remove(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = authorize(&state, &headers) {
        return *r;
    }
    match state
        .store
        .writer()
        .alert(AlertOp::DeleteSilence(id.clone()))
        .await
    {
        Ok(0) => api_error(StatusCode::NOT_FOUND, "not_found", "no such silence"),
        Ok(_) => {
            tracing::info!(%id, "silence deleted");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "store_error",
            &e.to_string(),
        ),
    }
}
