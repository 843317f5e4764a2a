//! `GET /api/v1/catalog`: the providers' model lists as the leader last read them — per
//! provider region every model with when it was first and last listed, whether a route uses
//! it (and which), whether it is withdrawn or new. Public like `/api/v1/status`: it names
//! models and routes, never a base URL, a key or traffic.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};

use super::openapi::error_response;
use super::{ApiError, AppState};
use crate::catalog::plan::{self, NEW_FOR, WITHDRAWN_AFTER};
use crate::clock::rfc3339;
use crate::store::catalog::ModelRow;

pub const PATH: &str = "/api/v1/catalog";

#[derive(Debug, Serialize)]
pub struct CatalogView {
    pub generated_at: String,
    pub regions: Vec<RegionView>,
}

#[derive(Debug, Serialize)]
pub struct RegionView {
    /// `provider/region` of the region's first route.
    pub region: String,
    /// `openai` or `anthropic`: which list it is read from.
    pub kind: &'static str,
    pub models: Vec<ModelView>,
}

#[derive(Debug, Serialize)]
pub struct ModelView {
    pub model: String,
    /// Never listed (a routed model the list does not name): both `null`.
    pub first_seen: Option<String>,
    pub last_seen: Option<String>,
    /// In the last successful answer.
    pub listed: bool,
    /// Successful answers in a row that lacked it.
    pub missing: u32,
    /// First seen within the last 7 days.
    pub new: bool,
    pub routed: bool,
    /// A routed model missing from two answers in a row (`model_withdrawn` fires).
    pub withdrawn: bool,
    pub routes: Vec<String>,
    /// The earliest `retires` date of its routes, when configured.
    pub retires: Option<String>,
}

pub async fn list(State(state): State<AppState>) -> Result<Json<CatalogView>, ApiError> {
    let store = state.store.clone();
    let rows = tokio::task::spawn_blocking(move || store.reader()?.catalog_models()).await??;
    let now = state.clock.now();
    let config = state.config.current();
    let mut by_region: BTreeMap<String, Vec<ModelRow>> = BTreeMap::new();
    for (region, row) in rows {
        by_region.entry(region).or_default().push(row);
    }
    let regions = plan::regions(&state.routes)
        .into_iter()
        .map(|g| {
            let rows = by_region.remove(&g.key).unwrap_or_default();
            let mut models: Vec<ModelView> = rows
                .into_iter()
                .map(|r| {
                    let routes = g.routed.get(&r.model).cloned().unwrap_or_default();
                    let routed = !routes.is_empty();
                    ModelView {
                        first_seen: Some(rfc3339(r.first_seen)),
                        last_seen: Some(rfc3339(r.last_seen)),
                        listed: r.missing == 0,
                        missing: r.missing,
                        new: now - r.first_seen < NEW_FOR,
                        routed,
                        withdrawn: routed && r.missing >= WITHDRAWN_AFTER,
                        retires: retires(&config.catalog.retires, &routes),
                        routes: routes.iter().map(ToString::to_string).collect(),
                        model: r.model,
                    }
                })
                .collect();
            for (model, routes) in &g.routed {
                if !models.iter().any(|m| &m.model == model) {
                    models.push(ModelView {
                        model: model.clone(),
                        first_seen: None,
                        last_seen: None,
                        listed: false,
                        missing: 0,
                        new: false,
                        routed: true,
                        withdrawn: false,
                        retires: retires(&config.catalog.retires, routes),
                        routes: routes.iter().map(ToString::to_string).collect(),
                    });
                }
            }
            models.sort_by(|a, b| a.model.cmp(&b.model));
            RegionView {
                region: g.name,
                kind: match g.kind {
                    crate::route::ProviderKind::Openai => "openai",
                    crate::route::ProviderKind::Anthropic => "anthropic",
                },
                models,
            }
        })
        .collect();
    Ok(Json(CatalogView {
        generated_at: rfc3339(now),
        regions,
    }))
}

fn retires(
    dates: &BTreeMap<crate::route::RouteId, chrono::NaiveDate>,
    routes: &[crate::route::RouteId],
) -> Option<String> {
    routes
        .iter()
        .filter_map(|r| dates.get(r))
        .min()
        .map(|d| d.format("%Y-%m-%d").to_string())
}

pub(super) fn doc() -> Value {
    let time = json!({"type": "string", "format": "date-time", "nullable": true});
    let model = json!({"type": "object",
        "required": ["model", "first_seen", "last_seen", "listed", "missing", "new", "routed", "withdrawn", "routes", "retires"],
        "properties": {
            "model": {"type": "string"},
            "first_seen": time,
            "last_seen": time,
            "listed": {"type": "boolean"},
            "missing": {"type": "integer", "minimum": 0},
            "new": {"type": "boolean"},
            "routed": {"type": "boolean"},
            "withdrawn": {"type": "boolean"},
            "routes": {"type": "array", "items": {"type": "string"}},
            "retires": {"type": "string", "format": "date", "nullable": true}}});
    let region = json!({"type": "object",
        "required": ["region", "kind", "models"],
        "properties": {
            "region": {"type": "string", "description": "provider/region of the region's first route"},
            "kind": {"type": "string", "enum": ["openai", "anthropic"]},
            "models": {"type": "array", "items": model}}});
    json!({"summary": "The providers' model lists per provider region: every model with first and last seen, whether routed and by which routes, withdrawn or new",
        "operationId": "catalog",
        "responses": {"200": {"description": "The model catalog",
            "content": {"application/json": {"schema": {"type": "object",
                "required": ["generated_at", "regions"],
                "properties": {
                    "generated_at": {"type": "string", "format": "date-time"},
                    "regions": {"type": "array", "items": region}}}}}},
            "500": error_response("Store failure")}})
}
