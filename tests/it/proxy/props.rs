//! Property tests of the proxy's request validation through the real proxy on 127.0.0.1:0,
//! in front of a fake OpenAI-compatible upstream that counts its calls: any body, JSON or not,
//! is either a valid request (served, the upstream called) or a 4xx JSON error in OpenAI's
//! shape with no upstream call; never a 5xx, never a dropped connection.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::{fake, json, openai, Captured, Reply, Requests, Script};
use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig};
use probeok::proxy::{self, Proxy, ProxyOptions, WeightsView};
use probeok::route::Tier;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use serde_json::{json as j, Map, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Cases per property: each is a real HTTP request, so fewer than the pure properties run.
const CASES: u32 = 96;

struct Rig {
    rt: tokio::runtime::Runtime,
    base: String,
    http: reqwest::Client,
    upstream: Requests,
    shutdown: CancellationToken,
    _server: common::Server,
    /// The weights the proxy follows: kept open for the test's length.
    _weights: watch::Sender<Arc<WeightsView>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The upstream answers every call: a stream when one is asked for, else a plain body.
fn answer(c: &Captured) -> Reply {
    if c.json()["stream"] == true {
        Reply::now(
            Script::new()
                .send_all(openai::stream(&["hi"], "stop", Some(3)))
                .sse(),
        )
    } else {
        Reply::now(json(StatusCode::OK, openai::body("hi", "stop", Some(3))))
    }
}

fn rig() -> Rig {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (server, upstream, base, shutdown, weights) = rt.block_on(async {
        let (server, upstream) = fake("/chat/completions", answer).await;
        let mut config = Config::default();
        config.providers.push(ProviderConfig {
            id: "p0".into(),
            api_key_env: Some("PROBEOK_TEST_PROPS_KEY".into()),
            regions: vec![RegionConfig {
                id: "r".into(),
                base_url: server.base_url(),
            }],
            ..ProviderConfig::default()
        });
        config.routes.push(RouteConfig {
            provider: "p0".into(),
            region: "r".into(),
            model: "up-0".into(),
            serves: "chat".into(),
            tier: Tier::Primary,
            weight: 100,
            ..RouteConfig::default()
        });
        config
            .env
            .set("PROBEOK_TEST_PROPS_KEY", "sk-upstream-props-0123456789");
        config.proxy.enabled = true;
        config.proxy.total_timeout = Duration::from_secs(10);
        let (wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
        let (ptx, mut prx) = mpsc::channel(256);
        // The passive outcomes of served requests, drained so the proxy never waits on them.
        tokio::spawn(async move { while prx.recv().await.is_some() {} });
        let p = Proxy::with_options(&config, wrx, ptx, ProxyOptions::default()).expect("proxy");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        tokio::spawn(proxy::serve(listener, p, shutdown.clone()));
        (server, upstream, format!("http://{addr}"), shutdown, wtx)
    });
    Rig {
        rt,
        base,
        http: reqwest::Client::new(),
        upstream,
        shutdown,
        _server: server,
        _weights: weights,
    }
}

impl Rig {
    /// Posts `body`; holds the property for its answer. `Ok(true)`: served.
    fn check(&self, body: Vec<u8>, feature: Option<String>) -> Result<bool, TestCaseError> {
        let before = self.upstream.all().len();
        let (status, content_type, text) = self.rt.block_on(async {
            let mut req = self
                .http
                .post(format!("{}/v1/chat/completions", self.base))
                .header("content-type", "application/json")
                .body(body.clone());
            if let Some(f) = &feature {
                req = req.header("x-probeok-feature", f);
            }
            let r = req
                .send()
                .await
                .expect("the proxy answers (no dropped connection)");
            let status = r.status();
            let content_type = r
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            (status, content_type, r.text().await.expect("a whole body"))
        });
        let calls = self.upstream.all().len() - before;
        let shown = String::from_utf8_lossy(&body);
        prop_assert!(!status.is_server_error(), "{status} for {shown}: {text}");
        if status.is_client_error() {
            prop_assert_eq!(
                calls,
                0,
                "an invalid request reached the upstream: {}",
                shown
            );
            prop_assert!(
                content_type.starts_with("application/json"),
                "{}",
                content_type
            );
            let v: Value = serde_json::from_str(&text).expect("a JSON error");
            prop_assert!(v["error"]["code"].is_string(), "{}", text);
            prop_assert!(v["error"]["message"].is_string(), "{}", text);
        } else {
            prop_assert!(status.is_success(), "{status} for {shown}");
            prop_assert!(calls >= 1, "served without an upstream call: {}", shown);
        }
        Ok(status.is_success())
    }
}

/// Any JSON value, numbers of every kind included.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec((key(), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// The fields the proxy reads, and others.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "model", "messages", "role", "content", "stream", "max_tokens",
            "max_completion_tokens", "n", "temperature", "top_p", "presence_penalty",
            "frequency_penalty", "tools", "response_format", "stream_options", "type",
            "include_usage",
        ])
        .prop_map(str::to_owned),
        1 => "[a-z_]{1,10}",
    ]
}

/// A valid request with some fields replaced by anything.
fn mutated_request() -> impl Strategy<Value = Value> {
    let model = prop_oneof![
        4 => Just(Value::from("chat")),
        1 => "\\PC{0,8}".prop_map(Value::from),
        1 => any_json(),
    ];
    let messages = prop_oneof![
        4 => Just(j!([{"role": "user", "content": "hi"}])),
        1 => prop::collection::vec(
            (prop::sample::select(vec!["user", "system", "assistant", "tool"]), any_json())
                .prop_map(|(role, content)| j!({"role": role, "content": content})),
            0..3
        )
        .prop_map(Value::from),
        1 => any_json(),
    ];
    (
        model,
        messages,
        prop::collection::vec((key(), any_json()), 0..3),
    )
        .prop_map(|(model, messages, extra)| {
            let mut req = j!({"model": model, "messages": messages});
            for (k, v) in extra {
                if k != "model" && k != "messages" {
                    req[k] = v;
                }
            }
            req
        })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => mutated_request().prop_map(|v| v.to_string().into_bytes()),
        2 => any_json().prop_map(|v| v.to_string().into_bytes()),
        // Cut JSON, and bytes that are not JSON at all.
        1 => (mutated_request(), any::<usize>()).prop_map(|(v, at)| {
            let s = v.to_string().into_bytes();
            s[..at % (s.len() + 1)].to_vec()
        }),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

fn feature() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => Just(None),
        1 => "[a-z0-9_-]{0,12}".prop_map(Some),
        1 => "[ -~]{0,70}".prop_map(Some),
    ]
}

#[test]
fn any_body_is_served_or_refused_with_a_4xx_before_any_upstream_call() {
    let rig = rig();
    // The rig itself: a valid request is served, an invalid one refused.
    rig.check(
        j!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
            .into_bytes(),
        None,
    )
    .expect("a valid request is served");
    assert_eq!(rig.upstream.all().len(), 1);
    rig.check(b"{\"model\": 3}".to_vec(), None)
        .expect("an invalid request is refused");
    assert_eq!(rig.upstream.all().len(), 1);

    let served = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(RunnerConfig::with_cases(CASES));
    runner
        .run(&(body(), feature()), |(body, feature)| {
            served.set(served.get() + u32::from(rig.check(body, feature)?));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    // Both sides of the property were exercised.
    assert!(
        served.get() > 0 && served.get() < CASES,
        "{} of {CASES} served",
        served.get()
    );
}
