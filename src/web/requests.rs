//! `GET /api/v1/requests?limit=N&route=&reason=&since=`: the proxy's metered requests with
//! their attempts, newest first, read straight from the store.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRef, Query, State};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use super::openapi::error_response;
use super::{ApiError, AppState};
use crate::clock::{Clock, SystemClock};
use crate::store::{RequestFilter, Store};

/// `?limit=`: default and ceiling.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;
/// The endpoint's path.
pub const PATH: &str = "/api/v1/requests";

/// What the handler reads: the store, and the clock `since=1h` counts back from.
#[derive(Clone)]
pub struct RequestsState {
    pub store: Store,
    pub clock: Arc<dyn Clock>,
}

impl FromRef<AppState> for RequestsState {
    fn from_ref(s: &AppState) -> Self {
        Self {
            store: s.store.clone(),
            clock: s.clock.clone(),
        }
    }
}

/// The endpoint alone on a router of its own, over `store` (for tools and tests that have a
/// store but no monitor).
pub fn router(store: Store) -> Router {
    Router::new()
        .route(PATH, get(list))
        .with_state(RequestsState {
            store,
            clock: Arc::new(SystemClock),
        })
}

#[derive(Debug, Deserialize)]
pub struct RequestsQuery {
    limit: Option<usize>,
    route: Option<String>,
    reason: Option<String>,
    /// RFC 3339, or a duration back from now (`1h`, `30m`).
    since: Option<String>,
}

fn parse_since(s: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc));
    }
    let d = humantime::parse_duration(s).ok()?;
    now.checked_sub_signed(chrono::Duration::from_std(d).ok()?)
}

pub async fn list(
    State(s): State<RequestsState>,
    query: Result<Query<RequestsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = query.map_err(|_| {
        ApiError::bad_request(
            "invalid_query",
            "limit must be a number; route, reason and since are strings",
        )
    })?;
    let since = match q.since.as_deref() {
        None => None,
        Some(raw) => Some(parse_since(raw, s.clock.now()).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_since",
                "since is an RFC 3339 time or a duration like 1h",
            )
        })?),
    };
    let filter = RequestFilter {
        limit: q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT),
        route: q.route.filter(|s| !s.is_empty()),
        reason: q.reason.filter(|s| !s.is_empty()),
        since,
    };
    let store = s.store.clone();
    let requests =
        tokio::task::spawn_blocking(move || store.reader()?.proxy_requests(&filter)).await??;
    Ok(Json(json!({ "requests": requests })))
}

pub(super) fn doc() -> Value {
    json!({"summary": "Recent proxy requests with their attempts (metering), newest first",
        "operationId": "requests",
        "parameters": [
            {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}},
            {"name": "route", "in": "query", "schema": {"type": "string"}},
            {"name": "reason", "in": "query", "description": "Why an attempt moved on (e.g. timeout_before_first_byte)", "schema": {"type": "string"}},
            {"name": "since", "in": "query", "description": "RFC 3339 time or a duration like 1h", "schema": {"type": "string"}}],
        "responses": {"200": {"description": "Metered requests",
            "content": {"application/json": {"schema": {"type": "object", "required": ["requests"],
                "properties": {"requests": {"type": "array", "items": {"type": "object"}}}}}}},
            "400": error_response("Bad query"),
            "500": error_response("Store failure")}})
}
