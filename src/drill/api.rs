//! The drills' HTTP fragment, merged into the monitor's router:
//!
//! - `POST /api/v1/admin/drills` `{"route", "weight"?: 0, "duration": "15m", "reason",
//!   "ramp"?: [5, 25, 100], "force"?: false, "started_by"?}` → 201 with the drill;
//! - `POST /api/v1/admin/drills/stop` `{"route"?, "by"?}` → 200 `{"drills":[ended…]}` (every
//!   active drill when no route is given);
//! - `DELETE /api/v1/admin/drills/{id}` (`?by=`) → 200 with the ended drill;
//! - `GET /api/v1/drills?limit=N` → `{generated_at, off_peak, active:[…], drills:[…newest
//!   first]}` and `GET /api/v1/drills/{id}` → `{drill, report}` — public and read-only, like
//!   the rest of `/api/v1`.
//!
//! Admin calls need the admin bearer token ([`crate::web::authorize_admin`]). Errors are
//! SPEC's `{"error":{"code","message"}}`; bodies are bounded ([`MAX_BODY`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use chrono::TimeDelta;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::plan::{self, Refusal, Rule, Stage, StartRequest};
use super::report::{self, BackupInputs, Inputs, Report};
use super::service::{DrillError, DrillService};
use super::Drill;
use crate::probe::OutcomeKind;
use crate::route::{Route, RouteId};
use crate::store::{Granularity, StoreError};
use crate::web::api_error;

/// Largest request body accepted (bytes).
pub const MAX_BODY: usize = 16 * 1024;
/// `GET /api/v1/drills?limit=`: default and ceiling.
pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 500;

#[derive(Clone)]
struct ApiState {
    service: DrillService,
    routes: Arc<Vec<Route>>,
}

/// The fragment (see the module docs).
pub fn router(service: DrillService, routes: Arc<Vec<Route>>) -> Router {
    Router::new()
        .route("/api/v1/admin/drills", post(start))
        .route("/api/v1/admin/drills/stop", post(stop))
        .route("/api/v1/admin/drills/{id}", delete(remove))
        .route("/api/v1/drills", get(list))
        .route("/api/v1/drills/{id}", get(one))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(ApiState { service, routes })
}

/// A drill as the API shows it: the record, whether it runs, and its stage now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrillView {
    #[serde(flatten)]
    pub drill: Drill,
    /// `active` or `ended`.
    pub status: String,
    pub stage: Option<Stage>,
}

impl DrillView {
    pub fn new(drill: Drill, now: chrono::DateTime<chrono::Utc>) -> Self {
        Self {
            status: if drill.active() { "active" } else { "ended" }.to_owned(),
            stage: drill.stage(now),
            drill,
        }
    }
}

fn refused(r: &Refusal) -> Response {
    api_error(
        StatusCode::from_u16(r.status).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY),
        r.code,
        &r.message,
    )
}

fn failed(e: DrillError) -> Response {
    match e {
        DrillError::Refused(r) => refused(&r),
        e => {
            tracing::error!(error = %e, "drill request failed");
            api_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "store_error",
                "internal error; see the server log",
            )
        }
    }
}

fn body_error(e: &BytesRejection) -> Response {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        api_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            &format!("the body is larger than {MAX_BODY} bytes"),
        )
    } else {
        api_error(StatusCode::BAD_REQUEST, "bad_body", &e.body_text())
    }
}

/// An admin request's checks in order: the bearer token, the body, its JSON (`{}` when empty
/// and `empty_ok`).
fn admin_request<T: serde::de::DeserializeOwned>(
    s: &ApiState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    empty_ok: bool,
) -> Result<T, Box<Response>> {
    crate::web::authorize_admin(&s.service.config().server.admin_token_env, headers)?;
    let body = body.map_err(|e| Box::new(body_error(&e)))?;
    parse(&body, empty_ok)
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8], empty_ok: bool) -> Result<T, Box<Response>> {
    let body = if empty_ok && body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| {
        Box::new(api_error(
            StatusCode::BAD_REQUEST,
            "bad_json",
            &format!("the body is not a valid request: {e}"),
        ))
    })
}

async fn start(
    State(s): State<ApiState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let req: StartRequest = match admin_request(&s, &headers, body, false) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    match s.service.start(&req).await {
        Ok(d) => (
            StatusCode::CREATED,
            Json(DrillView::new(d, s.service.now())),
        )
            .into_response(),
        Err(e) => failed(e),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StopRequest {
    route: Option<String>,
    by: Option<String>,
}

async fn stop(
    State(s): State<ApiState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let req: StopRequest = match admin_request(&s, &headers, body, true) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let who = match plan::who(req.by.as_deref(), "by") {
        Ok(w) => w,
        Err(r) => return refused(&r),
    };
    let route = match req
        .route
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
    {
        None => None,
        Some(raw) => match RouteId::parse(raw).filter(|id| s.routes.iter().any(|r| r.id == *id)) {
            Some(id) => Some(id),
            None => {
                return api_error(
                    StatusCode::NOT_FOUND,
                    "unknown_route",
                    &format!("no configured route {raw:?}"),
                )
            }
        },
    };
    match s.service.stop(route.as_ref(), who).await {
        Ok(ended) if ended.is_empty() && route.is_some() => api_error(
            StatusCode::NOT_FOUND,
            "no_active_drill",
            &format!(
                "no drill is running on {}",
                route.as_ref().map(RouteId::as_str).unwrap_or_default()
            ),
        ),
        Ok(ended) => {
            let now = s.service.now();
            let drills: Vec<DrillView> =
                ended.into_iter().map(|d| DrillView::new(d, now)).collect();
            Json(json!({ "drills": drills })).into_response()
        }
        Err(e) => failed(e),
    }
}

#[derive(Debug, Default, Deserialize)]
struct ByQuery {
    by: Option<String>,
}

fn parse_id(raw: &str) -> Result<i64, Box<Response>> {
    raw.parse::<i64>().ok().filter(|id| *id > 0).ok_or_else(|| {
        Box::new(api_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no drill {raw:?} (ids are positive integers)"),
        ))
    })
}

async fn remove(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    q: Result<Query<ByQuery>, QueryRejection>,
) -> Response {
    if let Err(r) =
        crate::web::authorize_admin(&s.service.config().server.admin_token_env, &headers)
    {
        return *r;
    }
    let id = match parse_id(&raw) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let by = q.map(|Query(q)| q.by).unwrap_or_default();
    let who = match plan::who(by.as_deref(), "by") {
        Ok(w) => w,
        Err(r) => return refused(&r),
    };
    match s.service.stop_id(id, who).await {
        Ok(Some(d)) => Json(DrillView::new(d, s.service.now())).into_response(),
        Ok(None) => api_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no drill {id}"),
        ),
        Err(e) => failed(e),
    }
}

#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    limit: Option<usize>,
}

async fn list(State(s): State<ApiState>, q: Result<Query<ListQuery>, QueryRejection>) -> Response {
    let Ok(Query(q)) = q else {
        return api_error(
            StatusCode::BAD_REQUEST,
            "bad_query",
            "limit must be a positive number",
        );
    };
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let store = s.service.store().clone();
    let read = tokio::task::spawn_blocking(move || store.reader()?.drills(limit)).await;
    let drills = match read {
        Ok(Ok(d)) => d,
        Ok(Err(e)) => return failed(e.into()),
        Err(e) => return failed(e.into()),
    };
    let now = s.service.now();
    let off_peak = s.service.off_peak();
    let views: Vec<DrillView> = drills.into_iter().map(|d| DrillView::new(d, now)).collect();
    let active: Vec<&DrillView> = views.iter().filter(|v| v.drill.active()).collect();
    Json(json!({
        "generated_at": crate::clock::rfc3339(now),
        "off_peak": {
            "rule": match off_peak.rule {
                Rule::Configured => "configured",
                Rule::OutsidePeak => "outside_peak",
                Rule::Anytime => "anytime",
            },
            "windows": off_peak.windows.iter()
                .map(|(a, b)| [a.format("%H:%M").to_string(), b.format("%H:%M").to_string()])
                .collect::<Vec<_>>(),
            "timezone": off_peak.tz.name(),
            "description": off_peak.describe(),
            "now_allowed": off_peak.allows(now),
        },
        "active": active,
        "drills": views,
    }))
    .into_response()
}

async fn one(State(s): State<ApiState>, Path(raw): Path<String>) -> Response {
    let id = match parse_id(&raw) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let now = s.service.now();
    let tz = s.service.config().detection.timezone;
    let store = s.service.store().clone();
    let routes = s.routes.clone();
    let read =
        tokio::task::spawn_blocking(move || -> Result<Option<(Drill, Report)>, StoreError> {
            let reader = store.reader()?;
            let Some(drill) = reader.drill(id)? else {
                return Ok(None);
            };
            let (from, to) = drill.window(now);
            let mut backups: Vec<RouteId> = drill.receivers.clone();
            if backups.is_empty() {
                // Not noted yet (or nothing carried traffic): the model's other routes.
                backups = routes
                    .iter()
                    .filter(|r| r.serves == drill.serves && r.id != drill.route)
                    .map(|r| r.id.clone())
                    .collect();
            }
            let baseline_until = Granularity::Hour.bucket_start(from);
            let inputs = Inputs {
                requests: reader.drill_requests(&drill.serves, from, to)?,
                drilled: reader.drill_outcomes(&drill.route, OutcomeKind::Probe, from, to)?,
                backups: backups
                    .iter()
                    .map(|b| {
                        Ok(BackupInputs {
                            route: b.clone(),
                            probes: reader.drill_outcomes(b, OutcomeKind::Probe, from, to)?,
                            history: reader.rollups(
                                b,
                                Granularity::Hour,
                                baseline_until - TimeDelta::days(report::BASELINE_DAYS),
                                baseline_until,
                                &[OutcomeKind::Probe],
                            )?,
                            regression: reader.drift_run_totals(b, from, to)?,
                            regression_history: reader.drift_run_totals(
                                b,
                                from - TimeDelta::days(report::HISTORY_DAYS),
                                from,
                            )?,
                        })
                    })
                    .collect::<Result<_, StoreError>>()?,
                drill: drill.clone(),
                now,
                tz,
            };
            Ok(Some((drill, report::build(&inputs))))
        })
        .await;
    match read {
        Ok(Ok(Some((drill, report)))) => Json(json!({
            "drill": DrillView::new(drill, now),
            "report": report,
        }))
        .into_response(),
        Ok(Ok(None)) => api_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no drill {id}"),
        ),
        Ok(Err(e)) => failed(e.into()),
        Err(e) => failed(e.into()),
    }
}

/// The endpoints of [`router`] (method, documented path): `crate::app` merges the fragment,
/// so `web::endpoints` does not list them; `tests/drills.rs` checks each is documented and
/// served.
pub const ENDPOINTS: &[(&str, &str)] = &[
    ("POST", "/api/v1/admin/drills"),
    ("POST", "/api/v1/admin/drills/stop"),
    ("DELETE", "/api/v1/admin/drills/{id}"),
    ("GET", "/api/v1/drills"),
    ("GET", "/api/v1/drills/{id}"),
];

/// The drill endpoints' OpenAPI paths (merged into `/api/openapi.json`).
pub fn openapi_paths() -> serde_json::Value {
    let err = |d: &str| json!({"description": d, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let ok = |d: &str, schema: &str| json!({"description": d, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}});
    let id = json!({"name": "id", "in": "path", "required": true, "schema": {"type": "integer", "minimum": 1}});
    json!({
        "/api/v1/admin/drills": {"post": {
            "summary": "Start a drill: move traffic off a route for a while, gradually when asked",
            "operationId": "startDrill", "tags": ["drills"],
            "security": [{"adminToken": []}],
            "requestBody": {"required": true, "description": format!("At most {MAX_BODY} bytes"),
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewDrill"}}}},
            "responses": {"201": ok("Started", "Drill"),
                "400": err("Not a valid JSON request"),
                "401": err("Missing or wrong token"),
                "403": err("Admin endpoints off (token variable unset)"),
                "404": err("Unknown route (unknown_route)"),
                "409": err("A drill already runs on the route (drill_active), or outside the off-peak windows without force (outside_off_peak)"),
                "413": err("Body too large"),
                "422": err("Invalid weight, duration, ramp, reason or started_by; the model has no other route")}}},
        "/api/v1/admin/drills/stop": {"post": {
            "summary": "Stop the active drills on a route (every active drill without one)",
            "operationId": "stopDrills", "tags": ["drills"],
            "security": [{"adminToken": []}],
            "requestBody": {"required": false, "content": {"application/json": {"schema": {"type": "object",
                "properties": {"route": {"type": "string"}, "by": {"type": "string", "maxLength": plan::MAX_WHO}}}}}},
            "responses": {"200": {"description": "The drills ended", "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"drills": {"type": "array", "items": {"$ref": "#/components/schemas/Drill"}}}}}}},
                "400": err("Not a valid JSON request"),
                "401": err("Missing or wrong token"),
                "403": err("Admin endpoints off (token variable unset)"),
                "404": err("Unknown route, or no drill running on it")}}},
        "/api/v1/admin/drills/{id}": {"delete": {
            "summary": "Stop one drill now", "operationId": "stopDrill", "tags": ["drills"],
            "security": [{"adminToken": []}],
            "parameters": [id, {"name": "by", "in": "query", "required": false, "schema": {"type": "string"}}],
            "responses": {"200": ok("The drill, ended", "Drill"),
                "401": err("Missing or wrong token"),
                "403": err("Admin endpoints off (token variable unset)"),
                "404": err("No such drill"),
                "409": err("Already ended (already_ended)")}}},
        "/api/v1/drills": {"get": {
            "summary": "Recent and active drills, and when drills may start",
            "operationId": "listDrills", "tags": ["drills"],
            "parameters": [{"name": "limit", "in": "query", "required": false,
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}}],
            "responses": {"200": ok("Drills", "Drills"), "400": err("Bad query")}}},
        "/api/v1/drills/{id}": {"get": {
            "summary": "One drill with its report (figures so far while it runs)",
            "operationId": "getDrill", "tags": ["drills"],
            "parameters": [id],
            "responses": {"200": {"description": "The drill and its report", "content": {"application/json": {"schema": {
                    "type": "object", "required": ["drill", "report"],
                    "properties": {"drill": {"$ref": "#/components/schemas/Drill"},
                                   "report": {"$ref": "#/components/schemas/DrillReport"}}}}}},
                "404": err("No such drill")}}}
    })
}

/// The drill schemas (merged into `/api/openapi.json`).
pub fn openapi_schemas() -> serde_json::Value {
    let latency = json!({"type": "object", "properties": {
        "p50": {"type": "number", "nullable": true}, "p95": {"type": "number", "nullable": true}}});
    let figures = json!({
        "route": {"type": "string"}, "probes": {"type": "integer"}, "successes": {"type": "integer"},
        "success_rate": {"type": "number", "nullable": true},
        "validation_failures": {"type": "integer", "description": "Answers that came back wrong (verified = false)"},
        "latency_ms": latency});
    let pass_rate = json!({"type": "object", "properties": {"runs": {"type": "integer"},
        "passed": {"type": "integer"}, "cases": {"type": "integer"}, "rate": {"type": "number", "nullable": true}}});
    let mut backup = figures.clone();
    if let Some(o) = backup.as_object_mut() {
        o.insert(
            "baseline".into(),
            json!({"type": "object", "properties": {
            "source": {"type": "string", "example": "same_hour_of_day_7d"},
            "hours": {"type": "array", "items": {"type": "integer"}},
            "samples": {"type": "integer"}, "latency_ms": latency}}),
        );
        o.insert(
            "p95_vs_baseline".into(),
            json!({"type": "number", "nullable": true}),
        );
        o.insert(
            "regression".into(),
            json!({"type": "array", "items": {"type": "object", "properties": {
            "set": {"type": "string"}, "during": pass_rate, "history": pass_rate,
            "p_value": {"type": "number", "nullable": true}}}}),
        );
    }
    json!({
        "NewDrill": {"type": "object", "required": ["route", "duration", "reason"], "properties": {
            "route": {"type": "string", "description": "provider/region/model"},
            "weight": {"type": "integer", "minimum": 0, "maximum": 100, "default": 0,
                "description": "The route's weight at 100% of the ramp"},
            "duration": {"type": "string", "example": "15m", "description": "Above 0, at most [drill] max_duration"},
            "reason": {"type": "string", "maxLength": plan::MAX_REASON},
            "ramp": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 100},
                "maxItems": plan::MAX_STAGES, "example": [5, 25, 100],
                "description": "Strictly increasing percentages ending at 100, one per equal stage; absent: [100]"},
            "force": {"type": "boolean", "default": false, "description": "Start outside the off-peak windows"},
            "started_by": {"type": "string", "maxLength": plan::MAX_WHO}}},
        "Drill": {"type": "object", "required": ["id", "route", "serves", "weight", "ramp", "reason", "started_at", "ends_at", "status"], "properties": {
            "id": {"type": "integer"}, "route": {"type": "string"}, "serves": {"type": "string"},
            "weight": {"type": "integer"}, "ramp": {"type": "array", "items": {"type": "integer"}},
            "reason": {"type": "string"}, "started_by": {"type": "string", "nullable": true},
            "forced": {"type": "boolean"},
            "started_at": {"type": "string", "format": "date-time"},
            "ends_at": {"type": "string", "format": "date-time"},
            "ended_at": {"type": "string", "format": "date-time", "nullable": true},
            "ended_by": {"type": "string", "enum": ["auto", "stop"], "nullable": true},
            "stopped_by": {"type": "string", "nullable": true},
            "receivers": {"type": "array", "items": {"type": "string"}, "description": "Routes that took its traffic"},
            "status": {"type": "string", "enum": ["active", "ended"]},
            "stage": {"type": "object", "nullable": true, "properties": {
                "index": {"type": "integer"}, "of": {"type": "integer"}, "percent": {"type": "integer"},
                "from": {"type": "string", "format": "date-time"}, "until": {"type": "string", "format": "date-time"}}}}},
        "Drills": {"type": "object", "required": ["generated_at", "off_peak", "active", "drills"], "properties": {
            "generated_at": {"type": "string", "format": "date-time"},
            "off_peak": {"type": "object", "properties": {
                "rule": {"type": "string", "enum": ["configured", "outside_peak", "anytime"]},
                "windows": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
                "timezone": {"type": "string"}, "description": {"type": "string"}, "now_allowed": {"type": "boolean"}}},
            "active": {"type": "array", "items": {"$ref": "#/components/schemas/Drill"}},
            "drills": {"type": "array", "items": {"$ref": "#/components/schemas/Drill"}}}},
        "DrillReport": {"type": "object", "properties": {
            "drill": {"type": "integer"}, "route": {"type": "string"}, "serves": {"type": "string"},
            "window": {"type": "object", "properties": {"from": {"type": "string", "format": "date-time"},
                "to": {"type": "string", "format": "date-time"}, "running": {"type": "boolean"}}},
            "requests": {"type": "object", "properties": {"total": {"type": "integer"}, "ok": {"type": "integer"},
                "success_rate": {"type": "number", "nullable": true}, "fallbacks": {"type": "integer"},
                "contracts": {"type": "object", "additionalProperties": {"type": "integer"}},
                "by_route": {"type": "object", "additionalProperties": {"type": "integer"}}}},
            "drilled": {"type": "object", "properties": figures},
            "backups": {"type": "array", "items": {"type": "object", "properties": backup}},
            "verdict": {"type": "object", "properties": {
                "level": {"type": "string", "enum": ["pass", "warn", "fail", "inconclusive"]},
                "line": {"type": "string"}, "findings": {"type": "array", "items": {"type": "string"}}}}}}
    })
}
