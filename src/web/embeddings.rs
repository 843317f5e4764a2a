//! `POST /api/v1/admin/routes/{route}/embedding-reference` (admin bearer token): after an
//! intended change of an embeddings route's model, its latest good vector becomes the
//! reference later probes are compared with (`crate::embed`); a route with no vector yet is
//! left for its next good vector to set it. The `embedding_changed` finding closes at the
//! route's next probe.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::{json, Value};

use super::openapi::{admin_responses, error_response, json_response};
use super::{ApiError, AppState};
use crate::embed::Replaced;
use crate::route::RouteId;

const SUFFIX: &str = "/embedding-reference";

pub async fn replace(
    State(state): State<AppState>,
    Path(rest): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let config = state.config.current();
    super::check_admin(&config, &headers)?;
    let Some(id) = rest.strip_suffix(SUFFIX) else {
        return Err(ApiError::NotFound("no such path".into()));
    };
    let route = RouteId::parse(id)
        .filter(|id| state.routes.iter().any(|r| &r.id == id))
        .ok_or_else(|| ApiError::NotFound(format!("unknown route {id:?}")))?;
    if !config.embedding_routes().contains_key(&route) {
        return Err(ApiError::refused(
            StatusCode::CONFLICT,
            "not_embeddings",
            format!("route {route} is not an embeddings route (kind = \"embeddings\")"),
        ));
    }
    let replaced = crate::embed::replace_reference(&state.store, &route).await?;
    tracing::info!(route = %route, ?replaced, "embeddings: reference replaced by an admin");
    Ok(Json(json!({
        "route": route,
        "reference": match replaced {
            Replaced::Latest => "latest",
            Replaced::Cleared => "next",
        },
    })))
}

pub(super) fn doc() -> Value {
    json!({"summary": "Make an embeddings route's latest good vector its reference (after an intended model change); without one, its next good vector becomes it",
        "operationId": "replaceEmbeddingReference",
        "security": [{"adminToken": []}],
        "parameters": [
            {"name": "id", "in": "path", "required": true,
             "description": "Route id provider/region/model; slashes raw or percent-encoded",
             "schema": {"type": "string"}}
        ],
        "responses": admin_responses(json!({"200": json_response("Replaced", "EmbeddingReference"),
            "404": error_response("Unknown route"),
            "409": error_response("Not an embeddings route")}))})
}
