//! A real client: the official `openai` Python SDK, unchanged but for `base_url`, streams and
//! non-streams through the proxy and gets the right text and headers; an interrupted stream
//! raises the SDK's `APIError` with `provider_interrupted`, an unknown model `NotFoundError`;
//! a degraded (fallback-tier) answer still parses, streamed and not, with its `probeok` object
//! readable through `model_extra` and `to_dict()`.
//!
//! Python comes from `$PROBEOK_VENV/bin/python` (default `.venv/bin/python` at the repo root;
//! `scripts/test` creates it with `pip install openai`).

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::{fake, json, openai, Reply, Script};
use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig};
use probeok::proxy::{self, Proxy, WeightsView};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

fn python() -> PathBuf {
    let venv = std::env::var_os("PROBEOK_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv"));
    venv.join("bin").join("python")
}

#[tokio::test]
async fn the_official_openai_sdk_works_through_the_proxy() {
    let py = python();
    assert!(
        py.exists(),
        "{} is missing: run scripts/test (it creates the venv and installs openai), or set PROBEOK_VENV",
        py.display()
    );
    let (upstream, _reqs) = fake("/chat/completions", |req| {
        let body = req.json();
        assert_eq!(body["model"], "up-model", "the route's own model name");
        if body["messages"][0]["content"] == "interrupt" {
            return Reply::now(Script::new().send(openai::content("half")).sse());
        }
        if body["stream"] == true {
            Reply::now(
                Script::new()
                    .every(
                        Duration::from_millis(5),
                        openai::stream(&["Hello", ", ", "world"], "stop", None),
                    )
                    .sse(),
            )
        } else {
            Reply::now(json(
                StatusCode::OK,
                openai::body("Hello, world", "stop", Some(3)),
            ))
        }
    })
    .await;

    let mut config = Config::default();
    config.providers.push(ProviderConfig {
        id: "fake".into(),
        regions: vec![RegionConfig {
            id: "r1".into(),
            base_url: upstream.base_url(),
        }],
        ..ProviderConfig::default()
    });
    config.routes.push(RouteConfig {
        provider: "fake".into(),
        region: "r1".into(),
        model: "up-model".into(),
        serves: "chat-main".into(),
        ..RouteConfig::default()
    });
    config.proxy.enabled = true;
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, _prx) = mpsc::channel(64);
    let p = Proxy::new(&config, wrx, ptx).expect("proxy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p, shutdown.clone()));

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/openai_client.py");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&py)
            .arg(&script)
            .arg(format!("http://{addr}/v1"))
            .arg("chat-main")
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .output(),
    )
    .await
    .expect("the SDK script finishes")
    .expect("python runs");
    shutdown.cancel();
    assert!(
        out.status.success(),
        "sdk script failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON from the script");

    assert_eq!(v["plain"]["text"], "Hello, world");
    assert_eq!(v["plain"]["finish_reason"], "stop");
    assert_eq!(v["stream"]["text"], "Hello, world");
    for part in ["plain", "stream"] {
        let h = &v[part]["headers"];
        assert_eq!(h["x-probeok-route"], "fake/r1/up-model", "{part}");
        assert_eq!(h["x-probeok-attempts"], "1", "{part}");
        assert_eq!(h["x-probeok-mode"], "normal", "{part}");
        assert!(
            h["x-request-id"]
                .as_str()
                .is_some_and(|s| s.starts_with("req_")),
            "{part}"
        );
        assert_eq!(h["x-probeok-fallback-reason"], Value::Null, "{part}");
    }
    assert_eq!(v["interrupted"]["raised"], "APIError", "{v}");
    assert_eq!(v["interrupted"]["code"], "provider_interrupted");
    assert_eq!(v["interrupted"]["type"], "upstream_error");
    assert_eq!(v["unknown"]["status"], 404);
    assert_eq!(v["unknown"]["code"], "model_not_found");
}

#[tokio::test]
async fn the_sdk_parses_degraded_answers_and_keeps_the_probeok_object() {
    let py = python();
    assert!(py.exists(), "{} is missing", py.display());
    let (down, _) = fake("/chat/completions", |_| {
        Reply::now(json(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"error": {"message": "down", "type": "server_error", "code": null}}),
        ))
    })
    .await;
    let (good, _) = fake("/chat/completions", |req| {
        if req.json()["stream"] == true {
            Reply::now(
                Script::new()
                    .every(
                        Duration::from_millis(5),
                        openai::stream(&["Hello", ", ", "world"], "stop", None),
                    )
                    .sse(),
            )
        } else {
            Reply::now(json(
                StatusCode::OK,
                openai::body("Hello, world", "stop", Some(3)),
            ))
        }
    })
    .await;
    let mut config = Config::default();
    config.providers.push(ProviderConfig {
        id: "fake".into(),
        regions: vec![
            RegionConfig {
                id: "down".into(),
                base_url: down.base_url(),
            },
            RegionConfig {
                id: "good".into(),
                base_url: good.base_url(),
            },
        ],
        ..ProviderConfig::default()
    });
    for (region, tier) in [
        ("down", probeok::route::Tier::Primary),
        ("good", probeok::route::Tier::Fallback),
    ] {
        config.routes.push(RouteConfig {
            provider: "fake".into(),
            region: region.into(),
            model: "up-model".into(),
            serves: "chat-main".into(),
            tier,
            ..RouteConfig::default()
        });
    }
    config.proxy.enabled = true;
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, _prx) = mpsc::channel(64);
    let p = Proxy::new(&config, wrx, ptx).expect("proxy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p, shutdown.clone()));

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/openai_degraded.py");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&py)
            .arg(&script)
            .arg(format!("http://{addr}/v1"))
            .arg("chat-main")
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .output(),
    )
    .await
    .expect("the SDK script finishes")
    .expect("python runs");
    shutdown.cancel();
    assert!(
        out.status.success(),
        "sdk script failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON from the script");
    assert_eq!(v["plain"]["text"], "Hello, world");
    assert_eq!(v["plain"]["mode"], "fallback");
    let expected = serde_json::json!({"mode": "fallback", "degraded_reason": "http_503",
        "degraded_since": null, "route": "fake/good/up-model", "quality_hint": "reduced"});
    assert_eq!(v["plain"]["model_extra"], expected);
    assert_eq!(v["plain"]["to_dict"], expected);
    assert_eq!(v["stream"]["text"], "Hello, world");
    assert_eq!(v["stream"]["first"], expected);
    assert!(
        v["stream"]["later"]
            .as_array()
            .is_some_and(|l| !l.is_empty() && l.iter().all(Value::is_null)),
        "{v}"
    );
}
