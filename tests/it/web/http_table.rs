//! The monitor's HTTP table is the only source of its routes and of `/api/openapi.json`'s
//! paths: every entry is served by the real router and described in the document, the
//! document describes nothing else, and the check reports a table and a document that
//! disagree.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::routing::get;
use common::app::*;
use probeok::web::openapi;
use probeok::web::table::{self, Entry};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const QWEN: &str = "qwen/cn-beijing/qwen-max";

const ROUTES: &[Spec<'static>] = &[
    Spec::new("qwen", "cn-beijing", "qwen-max")
        .serves("chat-main")
        .weight(80),
    Spec::new("deepseek", "cn", "v3")
        .serves("chat-main")
        .backup()
        .weight(20),
];

fn now() -> chrono::DateTime<chrono::Utc> {
    at("2026-03-04T12:00:00Z")
}

/// A harness with every feature of the monitor attached: drift, drills, the switch status.
async fn full_harness() -> Harness {
    let mut h = Harness::new(ROUTES, now()).await;
    // A receiver keeps the last value after its sender is gone.
    let (_, drift_rx) = tokio::sync::watch::channel(Arc::new(drift_snapshot(Vec::new(), &[])));
    h.state.drift = Some(drift_rx);
    let drills = probeok::drill::DrillService::restore(
        h.state.config.clone(),
        h.state.routes.clone(),
        h.store.clone(),
        h.clock.clone(),
    )
    .await
    .unwrap();
    h.state.drills = Some(drills);
    let budget = probeok::extra_cost::ExtraCost::new(
        probeok::config::ExtraCostConfig::default(),
        &h.state.routes,
        h.state.clock.clone(),
        None,
    );
    let status = probeok::switch::SwitchStatus {
        generated_at: now(),
        models: Vec::new(),
        budget: budget.snapshot(),
    };
    let (_, switch_rx) = tokio::sync::watch::channel(Arc::new(status));
    h.state.metrics.attach_switch(switch_rx);
    h
}

/// A concrete path for a documented one.
fn concrete(doc_path: &str) -> String {
    if doc_path.starts_with("/api/v1/routes/") || doc_path.starts_with("/routes/") {
        doc_path.replace("{id}", QWEN)
    } else {
        doc_path.replace("{id}", "1")
    }
}

fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.to_ascii_uppercase(), path.clone()))
        })
        .collect()
}

#[tokio::test]
async fn every_entry_is_served_by_the_real_router_and_described() {
    let h = full_harness().await;
    let s = h.serve().await;
    let client = reqwest::Client::new();
    let entries = table::table();
    assert!(entries.len() >= 25, "{} entries", entries.len());
    for e in &entries {
        let path = concrete(e.endpoint.doc_path);
        let r = client
            .request(e.endpoint.method.clone(), s.url(&path))
            .send()
            .await
            .unwrap();
        let status = r.status();
        assert_ne!(
            status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{} {path}",
            e.endpoint.method
        );
        if e.endpoint.path.ends_with("/stream") {
            assert_eq!(status, StatusCode::OK);
            continue;
        }
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_ne!(
            body["error"]["message"], "no such path",
            "{} {path} fell through to the fallback",
            e.endpoint.method
        );
        // Every feature runs here: none answers that it does not.
        assert_ne!(
            body["error"]["code"], "not_running",
            "{} {path}",
            e.endpoint.method
        );
    }

    // The served document parses as OpenAPI 3 and describes exactly the table's endpoints.
    let doc: Value = reqwest::get(s.url("/api/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let _: openapiv3::OpenAPI = serde_json::from_value(doc.clone()).expect("valid OpenAPI 3");
    let from_table: BTreeSet<(String, String)> = entries
        .iter()
        .map(|e| {
            (
                e.endpoint.method.to_string(),
                e.endpoint.doc_path.to_owned(),
            )
        })
        .collect();
    assert_eq!(
        from_table.len(),
        entries.len(),
        "an endpoint is listed twice"
    );
    assert_eq!(operations(&doc), from_table);
    assert_eq!(openapi::check(&entries, &doc), Vec::<String>::new());
    // What used to be served without being listed is in the table now.
    assert!(from_table.contains(&("GET".into(), "/api/v1/switches".into())));
    let switches = client.get(s.url("/api/v1/switches")).send().await.unwrap();
    assert_eq!(switches.status(), StatusCode::OK);
    let switches: Value = switches.json().await.unwrap();
    assert_eq!(switches["records"], json!([]));
}

#[tokio::test]
async fn a_path_outside_the_table_is_the_json_404() {
    let h = Harness::new(ROUTES, now()).await;
    let s = h.serve().await;
    let r = reqwest::get(s.url("/api/v1/nothing-here")).await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    // A known path with another method is 405, not the fallback.
    let r = reqwest::Client::new()
        .request(Method::PUT, s.url("/api/v1/status"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn features_not_running_answer_503_not_running() {
    // The plain harness has no drift runner, no drills and no switch controller.
    let h = Harness::new(ROUTES, now()).await;
    let s = h.serve().await;
    for path in ["/api/v1/drift", "/api/v1/drills", "/api/v1/switches"] {
        let r = reqwest::get(s.url(path)).await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_running", "{path}");
    }
}

fn extra(doc: Value) -> Entry {
    Entry::new(Method::GET, "/api/v1/extra", get(|| async { "extra" }), doc)
}

#[test]
fn an_undocumented_entry_is_reported() {
    let mut entries = table::table();
    entries.push(extra(json!({})));
    let problems = openapi::check(&entries, &openapi::document_for(&entries));
    assert_eq!(
        problems,
        vec!["GET /api/v1/extra has no summary or no responses in the OpenAPI document"]
    );
}

#[test]
fn an_entry_missing_from_the_document_is_reported() {
    let mut entries = table::table();
    entries.push(extra(
        json!({"summary": "Extra", "responses": {"200": {"description": "ok"}}}),
    ));
    // The monitor's own document, which has no such path.
    let problems = openapi::check(&entries, &openapi::document());
    assert_eq!(
        problems,
        vec!["GET /api/v1/extra is not in the OpenAPI document"]
    );
}

#[test]
fn a_documented_path_no_entry_serves_is_reported() {
    let entries = table::table();
    let mut doc = openapi::document_for(&entries);
    doc["paths"]["/api/v1/ghost"] =
        json!({"delete": {"summary": "Ghost", "responses": {"204": {"description": "gone"}}}});
    assert_eq!(
        openapi::check(&entries, &doc),
        vec!["DELETE /api/v1/ghost is documented but not served"]
    );
    assert_eq!(
        openapi::check(&entries, &openapi::document()),
        Vec::<String>::new()
    );
}
