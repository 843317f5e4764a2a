//! The drills' HTTP endpoints ([`crate::drill::DrillService`] does the work):
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
//! Admin calls need the admin bearer token. Errors are the API's
//! `{"error":{"code","message"}}` (see `docs/http-api.md`); bodies are bounded ([`MAX_BODY`]).
//! A process without drills answers 503 `not_running`.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{rfc3339, ApiError, AppState};
use crate::drill::plan::{self, Refusal, Rule, StartRequest};
use crate::drill::service::DrillError;
use crate::drill::{DrillService, DrillView};
use crate::route::RouteId;

/// Largest request body accepted (bytes).
pub const MAX_BODY: usize = 16 * 1024;
/// `GET /api/v1/drills?limit=`: default and ceiling.
pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 500;

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        ApiError::refused(
            StatusCode::from_u16(r.status).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY),
            r.code,
            r.message,
        )
    }
}

impl From<DrillError> for ApiError {
    fn from(e: DrillError) -> Self {
        match e {
            DrillError::Refused(r) => r.into(),
            DrillError::Store(e) => ApiError::Store(e),
            DrillError::Join(e) => e.into(),
        }
    }
}

fn service(state: &AppState) -> Result<&DrillService, ApiError> {
    state.drills.as_ref().ok_or(ApiError::NotRunning("drills"))
}

/// An admin request's checks in order: drills running, the bearer token, the body, its JSON
/// (`{}` when empty and `empty_ok`).
fn admin_request<T: serde::de::DeserializeOwned>(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    empty_ok: bool,
) -> Result<(DrillService, T), ApiError> {
    let s = service(state)?;
    super::check_admin(&s.config(), headers)?;
    let body = body.map_err(|e| ApiError::from_body(&e, MAX_BODY))?;
    Ok((s.clone(), parse(&body, empty_ok)?))
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8], empty_ok: bool) -> Result<T, ApiError> {
    let body = if empty_ok && body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request("bad_json", format!("the body is not a valid request: {e}"))
    })
}

pub async fn start(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (s, req): (_, StartRequest) = admin_request(&state, &headers, body, false)?;
    let d = s.start(&req).await?;
    Ok((StatusCode::CREATED, Json(DrillView::new(d, s.now()))).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopRequest {
    route: Option<String>,
    by: Option<String>,
}

pub async fn stop(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let (s, req): (_, StopRequest) = admin_request(&state, &headers, body, true)?;
    let who = plan::who(req.by.as_deref(), "by")?;
    let route = match req
        .route
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
    {
        None => None,
        Some(raw) => Some(
            RouteId::parse(raw)
                .filter(|id| s.routes().iter().any(|r| r.id == *id))
                .ok_or_else(|| {
                    ApiError::refused(
                        StatusCode::NOT_FOUND,
                        "unknown_route",
                        format!("no configured route {raw:?}"),
                    )
                })?,
        ),
    };
    let ended = s.stop(route.as_ref(), who).await?;
    if let (true, Some(route)) = (ended.is_empty(), &route) {
        return Err(ApiError::refused(
            StatusCode::NOT_FOUND,
            "no_active_drill",
            format!("no drill is running on {}", route.as_str()),
        ));
    }
    let now = s.now();
    let drills: Vec<DrillView> = ended.into_iter().map(|d| DrillView::new(d, now)).collect();
    Ok(Json(json!({ "drills": drills })))
}

#[derive(Debug, Default, Deserialize)]
pub struct ByQuery {
    by: Option<String>,
}

fn parse_id(raw: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::NotFound(format!("no drill {raw:?} (ids are positive integers)")))
}

pub async fn remove(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    q: Result<Query<ByQuery>, QueryRejection>,
) -> Result<Json<DrillView>, ApiError> {
    let s = service(&state)?;
    super::check_admin(&s.config(), &headers)?;
    let id = parse_id(&raw)?;
    let by = q.map(|Query(q)| q.by).unwrap_or_default();
    let who = plan::who(by.as_deref(), "by")?;
    match s.stop_id(id, who).await? {
        Some(d) => Ok(Json(DrillView::new(d, s.now()))),
        None => Err(ApiError::NotFound(format!("no drill {id}"))),
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    limit: Option<usize>,
}

pub async fn list(
    State(state): State<AppState>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let s = service(&state)?;
    let Query(q) =
        q.map_err(|_| ApiError::bad_request("bad_query", "limit must be a positive number"))?;
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let drills = s.recent(limit).await?;
    let now = s.now();
    let off_peak = s.off_peak();
    let views: Vec<DrillView> = drills.into_iter().map(|d| DrillView::new(d, now)).collect();
    let active: Vec<&DrillView> = views.iter().filter(|v| v.drill.active()).collect();
    Ok(Json(json!({
        "generated_at": rfc3339(now),
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
    })))
}

pub async fn one(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let s = service(&state)?;
    let id = parse_id(&raw)?;
    let now = s.now();
    match s.report(id).await? {
        Some((drill, report)) => Ok(Json(json!({
            "drill": DrillView::new(drill, now),
            "report": report,
        }))),
        None => Err(ApiError::NotFound(format!("no drill {id}"))),
    }
}

fn err(d: &str) -> Value {
    super::openapi::error_response(d)
}

fn ok(d: &str, schema: &str) -> Value {
    super::openapi::json_response(d, schema)
}

fn id_param() -> Value {
    json!({"name": "id", "in": "path", "required": true, "schema": {"type": "integer", "minimum": 1}})
}

fn not_running(mut responses: Value) -> Value {
    responses["503"] = err("No drills in this process (not_running)");
    responses
}

fn admin(responses: Value) -> Value {
    not_running(super::openapi::admin_responses(responses))
}

pub(super) fn start_doc() -> Value {
    json!({
        "summary": "Start a drill: move traffic off a route for a while, gradually when asked",
        "operationId": "startDrill", "tags": ["drills"],
        "security": [{"adminToken": []}],
        "requestBody": {"required": true, "description": format!("At most {MAX_BODY} bytes"),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewDrill"}}}},
        "responses": admin(json!({"201": ok("Started", "Drill"),
            "400": err("Not a valid JSON request"),
            "404": err("Unknown route (unknown_route)"),
            "409": err("A drill already runs on the route (drill_active), or outside the off-peak windows without force (outside_off_peak)"),
            "413": err("Body too large"),
            "422": err("Invalid weight, duration, ramp, reason or started_by; the model has no other route")}))})
}

pub(super) fn stop_doc() -> Value {
    json!({
        "summary": "Stop the active drills on a route (every active drill without one)",
        "operationId": "stopDrills", "tags": ["drills"],
        "security": [{"adminToken": []}],
        "requestBody": {"required": false, "content": {"application/json": {"schema": {"type": "object",
            "properties": {"route": {"type": "string"}, "by": {"type": "string", "maxLength": plan::MAX_WHO}}}}}},
        "responses": admin(json!({"200": {"description": "The drills ended", "content": {"application/json": {"schema": {
                "type": "object", "properties": {"drills": {"type": "array", "items": {"$ref": "#/components/schemas/Drill"}}}}}}},
            "400": err("Not a valid JSON request"),
            "404": err("Unknown route, or no drill running on it")}))})
}

pub(super) fn remove_doc() -> Value {
    json!({
        "summary": "Stop one drill now", "operationId": "stopDrill", "tags": ["drills"],
        "security": [{"adminToken": []}],
        "parameters": [id_param(), {"name": "by", "in": "query", "required": false, "schema": {"type": "string"}}],
        "responses": admin(json!({"200": ok("The drill, ended", "Drill"),
            "404": err("No such drill"),
            "409": err("Already ended (already_ended)")}))})
}

pub(super) fn list_doc() -> Value {
    json!({
        "summary": "Recent and active drills, and when drills may start",
        "operationId": "listDrills", "tags": ["drills"],
        "parameters": [{"name": "limit", "in": "query", "required": false,
            "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}}],
        "responses": not_running(json!({"200": ok("Drills", "Drills"), "400": err("Bad query")}))})
}

pub(super) fn one_doc() -> Value {
    json!({
        "summary": "One drill with its report (figures so far while it runs)",
        "operationId": "getDrill", "tags": ["drills"],
        "parameters": [id_param()],
        "responses": not_running(json!({"200": {"description": "The drill and its report", "content": {"application/json": {"schema": {
                "type": "object", "required": ["drill", "report"],
                "properties": {"drill": {"$ref": "#/components/schemas/Drill"},
                               "report": {"$ref": "#/components/schemas/DrillReport"}}}}}},
            "404": err("No such drill")}))})
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
