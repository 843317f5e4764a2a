//! `GET /api/v1/requests?limit=N&route=&reason=&since=`: the proxy's metered requests with
//! their attempts, newest first, read straight from the store. This is real client traffic
//! (request ids, features, costs), so it takes the admin token.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRef, Query, State};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use axum::http::HeaderMap;

use super::openapi::{admin_responses, error_response};
use super::{ApiError, AppState};
use crate::clock::{Clock, SystemClock};
use crate::reload::LiveConfig;
use crate::secret::Secret;
use crate::store::{RequestFilter, Store};

/// `?limit=`: default and ceiling.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;
/// The endpoint's path.
pub const PATH: &str = "/api/v1/requests";

/// The furthest back `since=` may reach (a duration or a time older than this is 400).
pub const MAX_LOOKBACK: chrono::Duration = chrono::Duration::days(10 * 366);

/// Where the admin token the endpoint asks for comes from.
#[derive(Clone)]
pub enum AdminToken {
    /// The variable `server.admin_token_env` names, read per request so a rotated token
    /// takes effect at once.
    Config(LiveConfig),
    /// A token given by the caller; `None` turns the endpoint off (403 `admin_disabled`).
    Given(Option<Secret>),
}

impl AdminToken {
    fn check(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        match self {
            Self::Config(config) => super::check_admin(&config.current(), headers),
            Self::Given(token) => Ok(crate::secret::check_bearer(token.as_ref(), headers)?),
        }
    }
}

/// What the handler reads: the store, the clock `since=1h` counts back from, the admin token.
#[derive(Clone)]
pub struct RequestsState {
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub admin: AdminToken,
}

impl FromRef<AppState> for RequestsState {
    fn from_ref(s: &AppState) -> Self {
        Self {
            store: s.store.clone(),
            clock: s.clock.clone(),
            admin: AdminToken::Config(s.config.clone()),
        }
    }
}

/// The endpoint alone on a router of its own, over `store`, guarded by `admin_token` (for
/// tools and tests that have a store but no monitor).
pub fn router(store: Store, admin_token: Secret) -> Router {
    Router::new()
        .route(PATH, get(list))
        .with_state(RequestsState {
            store,
            clock: Arc::new(SystemClock),
            admin: AdminToken::Given(Some(admin_token)),
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

/// `since=`: an RFC 3339 time or a duration back from `now`, no further back than
/// [`MAX_LOOKBACK`]; `None` for anything else (an overflowing duration included).
fn parse_since(s: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let earliest = now.checked_sub_signed(MAX_LOOKBACK)?;
    let t = match DateTime::parse_from_rfc3339(s) {
        Ok(t) => t.with_timezone(&Utc),
        Err(_) => {
            let d = humantime::parse_duration(s).ok()?;
            now.checked_sub_signed(chrono::Duration::from_std(d).ok()?)?
        }
    };
    (t >= earliest).then_some(t)
}

pub async fn list(
    State(s): State<RequestsState>,
    headers: HeaderMap,
    query: Result<Query<RequestsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    s.admin.check(&headers)?;
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
                "since is an RFC 3339 time or a duration like 1h, at most 10 years back",
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
        "security": [{"adminToken": []}],
        "parameters": [
            {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}},
            {"name": "route", "in": "query", "schema": {"type": "string"}},
            {"name": "reason", "in": "query", "description": "Why an attempt moved on (e.g. timeout_before_first_byte)", "schema": {"type": "string"}},
            {"name": "since", "in": "query", "description": "RFC 3339 time or a duration like 1h", "schema": {"type": "string"}}],
        "responses": admin_responses(json!({"200": {"description": "Metered requests",
            "content": {"application/json": {"schema": {"type": "object", "required": ["requests"],
                "properties": {"requests": {"type": "array", "items": {"type": "object"}}}}}}},
            "400": error_response("Bad query"),
            "500": error_response("Store failure")}))})
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use chrono::TimeZone;
    use proptest::prelude::*;
    use tower::ServiceExt;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 0).unwrap()
    }

    #[test]
    fn since_is_range_checked() {
        assert_eq!(
            parse_since("1h", now()),
            Some(Utc.with_ymd_and_hms(2025, 6, 1, 11, 0, 0).unwrap())
        );
        assert!(parse_since("2025-05-01T00:00:00Z", now()).is_some());
        assert!(parse_since("2999-01-01T00:00:00Z", now()).is_some());
        for bad in ["1000000y", "11y", "1900-01-01T00:00:00Z", "x", "", "-1h"] {
            assert_eq!(parse_since(bad, now()), None, "{bad}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn since_never_panics(s in ".{0,40}", n in any::<u64>(), unit in "(ns|ms|s|m|h|d|w|M|y)") {
            let _ = parse_since(&s, now());
            let _ = parse_since(&format!("{n}{unit}"), now());
        }
    }

    async fn get(app: Router, uri: &str, token: Option<&str>) -> (StatusCode, Value) {
        let mut req = Request::get(uri);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let res = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn real_traffic_takes_the_admin_token_and_bad_since_is_400() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db"), Default::default()).unwrap();
        let app = router(store, Secret::new("adm"));
        let (status, _) = get(app.clone(), PATH, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _) = get(app.clone(), PATH, Some("wrong")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, body) = get(app.clone(), PATH, Some("adm")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["requests"], json!([]));
        let (status, body) = get(app.clone(), &format!("{PATH}?since=1000000y"), Some("adm")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["code"], "invalid_since");

        let off = Router::new()
            .route(PATH, get_route())
            .with_state(RequestsState {
                store: Store::open(&dir.path().join("u.db"), Default::default()).unwrap(),
                clock: Arc::new(SystemClock),
                admin: AdminToken::Given(None),
            });
        let (status, body) = get(off, PATH, Some("adm")).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(body["error"]["code"], "admin_disabled");
    }

    fn get_route() -> axum::routing::MethodRouter<RequestsState> {
        axum::routing::get(list)
    }
}
