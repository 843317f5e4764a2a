//! Envoy's endpoint discovery over REST (xDS v3): `POST /v3/discovery:endpoints`, which an
//! Envoy cluster of type EDS polls every `refresh_delay` when its `eds_config` says
//! `api_config_source: {api_type: REST, transport_api_version: V3}`.
//!
//! The request is a proto3-JSON `DiscoveryRequest` (envoy/service/discovery/v3/discovery.proto);
//! of it only `version_info`, `resource_names` and `type_url` matter here, the rest (Envoy's
//! node, about 80 KB of it) is skipped unread. The answer is a `DiscoveryResponse` whose
//! `resources` are one `ClusterLoadAssignment` (envoy/config/endpoint/v3/endpoint.proto) per
//! requested `[[envoy.cluster]]`: an `LbEndpoint` per route at its base_url's IP and port,
//! `load_balancing_weight` its route's weight, and `health_status: UNHEALTHY` for a route at
//! weight 0 (whose `load_balancing_weight` stays 1: the proto requires at least 1).
//! `version_info` is the weights version; a request that already has it gets 304, which Envoy
//! takes as "keep what you have". Every cluster's resource is serialised once per weights
//! version and shared by every poll.
//!
//! Errors are the API's JSON errors: 413 past [`MAX_BODY`], 400 `bad_json` / `bad_type_url`,
//! 404 `unknown_cluster` (Envoy logs a failed fetch and keeps its last endpoints).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::memo::Memo;
use super::{ApiError, AppState};
use crate::config::EnvoyCluster;
use crate::route::Route;
use crate::weights::WeightsSnapshot;

/// Where Envoy's REST EDS posts (the `google.api.http` rule of `FetchEndpoints`).
pub const PATH: &str = "/v3/discovery:endpoints";
/// The type of every resource answered.
pub const TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// The largest DiscoveryRequest accepted: Envoy's node metadata alone is about 80 KB, and
/// grows with each release's list of extensions.
pub const MAX_BODY: usize = 256 * 1024;

/// What the handler keeps between polls: each cluster's answer for one weights version.
#[derive(Debug, Default)]
pub struct XdsCache {
    memo: Memo<WeightsSnapshot, Assignments>,
}

/// One weights version's `ClusterLoadAssignment`s, serialised, by cluster name.
#[derive(Debug)]
pub struct Assignments {
    pub version: String,
    pub clusters: BTreeMap<String, String>,
}

impl Assignments {
    /// The assignments of `clusters` under `weights` (pure).
    pub fn build(weights: &WeightsSnapshot, clusters: &[EnvoyCluster], routes: &[Route]) -> Self {
        let clusters = clusters
            .iter()
            .map(|c| {
                let endpoints: Vec<Value> = c
                    .endpoints(routes)
                    .into_iter()
                    .map(|e| {
                        let weight = weights.weight(&e.route).unwrap_or(0);
                        json!({
                            "endpoint": {"address": {"socket_address": {
                                "address": e.addr.ip().to_string(),
                                "port_value": e.addr.port(),
                            }}},
                            "health_status": if weight == 0 { "UNHEALTHY" } else { "HEALTHY" },
                            "load_balancing_weight": weight.max(1),
                            "metadata": {"filter_metadata": {"probeok": {"route": e.route.as_str()}}},
                        })
                    })
                    .collect();
                let cla = json!({
                    "@type": TYPE_URL,
                    "cluster_name": c.name,
                    "endpoints": [{"lb_endpoints": endpoints}],
                });
                (c.name.clone(), cla.to_string())
            })
            .collect();
        Self {
            version: weights.version.to_string(),
            clusters,
        }
    }

    /// The `DiscoveryResponse` body for `names` (every cluster when empty, as the protocol
    /// says), or the first name that is not a cluster.
    pub fn response(&self, names: &[String]) -> Result<String, String> {
        let mut resources = Vec::with_capacity(names.len().max(1));
        if names.is_empty() {
            resources.extend(self.clusters.values().map(String::as_str));
        }
        for n in names {
            resources.push(self.clusters.get(n).ok_or_else(|| n.clone())?);
        }
        Ok(format!(
            r#"{{"version_info":"{}","type_url":"{TYPE_URL}","resources":[{}]}}"#,
            self.version,
            resources.join(",")
        ))
    }
}

/// The fields of a DiscoveryRequest this endpoint reads; the others are skipped unread.
#[derive(Debug, Deserialize)]
struct DiscoveryRequest {
    #[serde(default)]
    version_info: String,
    #[serde(default)]
    resource_names: Vec<String>,
    #[serde(default)]
    type_url: String,
}

/// `POST /v3/discovery:endpoints`.
pub async fn endpoints(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| ApiError::from_body(&e, MAX_BODY))?;
    let request: DiscoveryRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "bad_json",
            format!("expected a DiscoveryRequest in proto3 JSON: {e}"),
        )
    })?;
    if !request.type_url.is_empty() && request.type_url != TYPE_URL {
        return Err(ApiError::bad_request(
            "bad_type_url",
            format!(
                "this endpoint serves {TYPE_URL}, not {:?}",
                request.type_url
            ),
        ));
    }
    let weights: Arc<WeightsSnapshot> = state.weights.borrow().clone();
    let config = state.config.current();
    let answers = state.xds.memo.get(&weights, |w| {
        Assignments::build(w, &config.envoy.clusters, &state.routes)
    });
    // Check the names before the version: an unknown cluster is an error at any version.
    let body = answers.response(&request.resource_names).map_err(|name| {
        let known: Vec<&str> = answers.clusters.keys().map(String::as_str).collect();
        ApiError::refused(
            StatusCode::NOT_FOUND,
            "unknown_cluster",
            format!("{name:?} is not an [[envoy.cluster]] (configured: {known:?})"),
        )
    })?;
    if request.version_info == answers.version {
        return Ok(StatusCode::NOT_MODIFIED.into_response());
    }
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response())
}

/// The OpenAPI operation.
pub(super) fn doc() -> Value {
    use super::openapi::error_response;
    json!({"summary": "Envoy endpoint discovery (REST xDS v3): a ClusterLoadAssignment per requested [[envoy.cluster]]",
        "operationId": "xdsEndpoints",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {
            "type": "object", "description": "envoy.service.discovery.v3.DiscoveryRequest (proto3 JSON)",
            "properties": {"version_info": {"type": "string"},
                "resource_names": {"type": "array", "items": {"type": "string"}},
                "type_url": {"type": "string"}, "node": {"type": "object"}}}}}},
        "responses": {
            "200": {"description": "envoy.service.discovery.v3.DiscoveryResponse: version_info is the weights version",
                "content": {"application/json": {"schema": {"type": "object", "required": ["version_info", "type_url", "resources"],
                    "properties": {"version_info": {"type": "string"}, "type_url": {"type": "string"},
                        "resources": {"type": "array", "items": {"type": "object"}}}}}}},
            "304": {"description": "version_info is already the current weights version"},
            "400": error_response("Not a DiscoveryRequest (bad_json) or another resource type (bad_type_url)"),
            "404": error_response("A requested cluster is not configured (unknown_cluster)"),
            "413": error_response("The body is larger than 256 KiB (payload_too_large)")}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_name_list_is_every_cluster_and_an_unknown_name_is_named() {
        let a = Assignments {
            version: "7".into(),
            clusters: BTreeMap::from([("a".into(), "{}".into()), ("b".into(), "[]".into())]),
        };
        let all: Value = serde_json::from_str(&a.response(&[]).unwrap()).unwrap();
        assert_eq!(all["version_info"], "7");
        assert_eq!(all["resources"].as_array().unwrap().len(), 2);
        let one: Value = serde_json::from_str(&a.response(&["b".into()]).unwrap()).unwrap();
        assert_eq!(one["resources"], json!([[]]));
        assert_eq!(a.response(&["b".into(), "c".into()]), Err("c".into()));
    }
}
