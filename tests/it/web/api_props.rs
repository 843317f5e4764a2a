//! Property tests of every query parser of the monitor's HTTP surface, through the whole
//! service on 127.0.0.1:0: any value of `since`, `window`, `lang`, `q`, `limit`, `wait`, `by`,
//! `route`, `reason` (and parameters no endpoint knows), any route id in a path, raw or
//! percent-encoded, is answered — a 4xx for what is invalid, JSON on the API — and never
//! with a 5xx or a dropped connection.

use crate::common;

use std::sync::Arc;

use probeok::app;
use probeok::clock::ManualClock;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// Cases per endpoint family: each is a real HTTP request.
const CASES: u32 = 256;
const TOKEN_VAR: &str = "PROBEOK_TEST_API_PROPS_ADMIN";
const TOKEN: &str = "props-admin-token";
const QWEN: &str = "qwen/cn-beijing/qwen-max";
const DS: &str = "deepseek/cn/deepseek-ai/DeepSeek-V3";

const ROUTES: &[common::app::Spec<'static>] = &[
    common::app::Spec::new("qwen", "cn-beijing", "qwen-max")
        .serves("chat-main")
        .weight(80),
    common::app::Spec::new("deepseek", "cn", "deepseek-ai/DeepSeek-V3")
        .serves("chat-main")
        .backup()
        .weight(20),
];

/// `(method, path template, the parameters it reads)`. `{id}` is a route id, `{n}` a
/// numeric id, `{serves}` a logical model, `{badge}` a badge name.
const ENDPOINTS: &[(&str, &str, &[&str])] = &[
    ("GET", "/api/v1/status", &[]),
    ("GET", "/api/v1/routes/{id}/probes", &["limit"]),
    ("GET", "/api/v1/routes/{id}", &[]),
    ("GET", "/api/v1/incidents", &["limit", "route", "since"]),
    ("GET", "/api/v1/weights", &["wait"]),
    ("GET", "/api/v1/drift", &[]),
    ("GET", "/api/v1/switches", &["limit"]),
    (
        "GET",
        "/api/v1/requests",
        &["limit", "route", "reason", "since"],
    ),
    ("GET", "/api/v1/drills", &["limit"]),
    ("GET", "/api/v1/drills/{n}", &[]),
    ("GET", "/api/v1/admin/silences", &[]),
    ("DELETE", "/api/v1/admin/drills/{n}", &["by"]),
    ("DELETE", "/api/v1/admin/silences/{n}", &[]),
    ("GET", "/", &["lang", "q"]),
    ("GET", "/routes/{id}", &["lang"]),
    ("GET", "/incidents", &["lang"]),
    ("GET", "/incidents.atom", &["lang"]),
    ("GET", "/badges/{id}/{badge}", &["window", "lang"]),
    (
        "GET",
        "/badges/model/{serves}/state.svg",
        &["window", "lang"],
    ),
    ("GET", "/api/openapi.json", &[]),
    ("GET", "/metrics", &[]),
    ("GET", "/healthz", &[]),
];

struct Service {
    rt: tokio::runtime::Runtime,
    base: String,
    http: reqwest::Client,
    shutdown: CancellationToken,
    running: Option<app::Running>,
    _dir: tempfile::TempDir,
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(running) = self.running.take() {
            let _ = self.rt.block_on(running.done);
        }
    }
}

fn service() -> Service {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = common::app::config(ROUTES, &dir.path().join("props.db"));
    config.server.admin_token_env = TOKEN_VAR.into();
    config.env.set(TOKEN_VAR, TOKEN);
    let clock = Arc::new(ManualClock::new(common::app::at("2026-03-04T12:00:00Z")));
    let shutdown = CancellationToken::new();
    let running = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        app::start(config, listener, clock, shutdown.clone())
            .await
            .expect("the service starts")
    });
    Service {
        base: format!("http://{}", running.addr),
        rt,
        http: reqwest::Client::new(),
        shutdown,
        running: Some(running),
        _dir: dir,
    }
}

/// Percent-encodes everything but unreserved characters (and `/` when `keep_slash`).
fn encode(s: &str, keep_slash: bool) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            b'/' if keep_slash => "/".to_owned(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A query value: mostly near what the parameter takes (durations with any number and unit,
/// times, numbers, language codes), sometimes anything.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        (any::<u64>(), "(ns|us|ms|s|m|min|h|d|w|M|y|years)?", any::<bool>())
            .prop_map(|(n, u, neg)| format!("{}{n}{u}", if neg { "-" } else { "" })),
        (0u32..=99_999, 0u32..=99, 0u32..=99, 0u32..=99, 0u32..=99).prop_map(
            |(y, mo, d, h, mi)| format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:00Z")
        ),
        "2026-0[1-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,12})?([+-][0-9]{2}:[0-9]{2}|Z)?",
        any::<i128>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| f.to_string()),
        prop::sample::select(vec![
            "zh", "en", "zh-CN", "en-US", "ZH", "fr", "", " ", "1d", "7d", "30d", "90d",
            "state", "uptime", "max", "0", "-0", "1e999", "NaN", "inf",
        ])
        .prop_map(str::to_owned),
        "[a-z0-9/*?._-]{0,24}",
        "\\PC{0,24}",
    ]
}

/// A route id for a path: a configured one, one near it, or anything.
fn route_id() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(vec![QWEN, DS]).prop_map(str::to_owned),
        1 => "[a-z]{0,6}(/[a-z0-9.-]{0,6}){0,4}",
        1 => "\\PC{0,20}",
    ]
}

/// One request: an endpoint, its path's parts, its parameters (known and unknown), and
/// whether the query is sent raw (as typed, not encoded: `%zz`, `%ff`, lone `&` and `=`).
#[derive(Debug, Clone)]
struct Req {
    endpoint: usize,
    id: String,
    n: String,
    serves: String,
    badge: String,
    params: Vec<(String, String)>,
    raw: Option<String>,
}

fn request() -> impl Strategy<Value = Req> {
    let param = (
        prop_oneof![
            4 => prop::sample::select(vec![
                "since", "window", "lang", "q", "limit", "wait", "by", "route", "reason",
            ])
            .prop_map(str::to_owned),
            1 => "[a-z_]{1,8}",
        ],
        value(),
    );
    (
        0..ENDPOINTS.len(),
        route_id(),
        prop_oneof![any::<i64>().prop_map(|n| n.to_string()), "\\PC{0,12}",],
        prop_oneof![Just("chat-main".to_owned()), "\\PC{0,12}"],
        prop_oneof![
            prop::sample::select(vec!["state.svg", "uptime.svg", "latency.svg"])
                .prop_map(str::to_owned),
            "\\PC{0,12}",
        ],
        prop::collection::vec(param, 0..4),
        prop::option::weighted(0.15, "[a-z0-9%&=+._~-]{0,30}"),
    )
        .prop_map(|(endpoint, id, n, serves, badge, params, raw)| Req {
            endpoint,
            id,
            n,
            serves,
            badge,
            params,
            raw,
        })
}

impl Service {
    fn check(&self, r: &Req) -> Result<(), TestCaseError> {
        let (method, template, known) = ENDPOINTS[r.endpoint];
        let path = template
            .replace("{id}", &encode(&r.id, true))
            .replace("{n}", &encode(&r.n, false))
            .replace("{serves}", &encode(&r.serves, false))
            .replace("{badge}", &encode(&r.badge, false));
        // Every parameter the endpoint reads at least once in a while, plus the drawn ones.
        let mut params = r.params.clone();
        if let Some(first) = known.first() {
            if let Some((_, v)) = r.params.first() {
                params.push(((*first).to_owned(), v.clone()));
            }
        }
        let query = match &r.raw {
            Some(raw) => raw.clone(),
            None => params
                .iter()
                .map(|(k, v)| format!("{}={}", encode(k, false), encode(v, false)))
                .collect::<Vec<_>>()
                .join("&"),
        };
        let url = if query.is_empty() {
            format!("{}{path}", self.base)
        } else {
            format!("{}{path}?{query}", self.base)
        };
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let (status, content_type, body) = self.rt.block_on(async {
            let r = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{method} {url}: no answer: {e}"));
            let status = r.status();
            let content_type = r
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            (status, content_type, r.bytes().await.expect("a whole body"))
        });
        let text = String::from_utf8_lossy(&body);
        prop_assert!(
            !status.is_server_error(),
            "{} {} → {}: {}",
            method,
            url,
            status,
            text
        );
        if status.is_client_error() && path.starts_with("/api/") {
            prop_assert!(
                content_type.starts_with("application/json"),
                "{} {} → {} as {}",
                method,
                url,
                status,
                content_type
            );
            let v: Value = serde_json::from_slice(&body).expect("a JSON error");
            prop_assert!(
                v["error"]["code"].is_string(),
                "{} {} → {}",
                method,
                url,
                text
            );
        }
        Ok(())
    }
}

#[test]
fn every_query_and_path_value_is_answered_without_a_5xx() {
    let s = service();
    // The harness reaches the parsers: a known-bad value is refused, a good one answered.
    let bad = Req {
        endpoint: ENDPOINTS
            .iter()
            .position(|e| e.1 == "/api/v1/requests")
            .expect("listed"),
        id: String::new(),
        n: String::new(),
        serves: String::new(),
        badge: String::new(),
        params: vec![("since".into(), "1000000y".into())],
        raw: None,
    };
    let status = s.rt.block_on(async {
        s.http
            .get(format!("{}/api/v1/requests?since=1000000y", s.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .status()
    });
    assert_eq!(status, 400);
    s.check(&bad).expect("a 400, not a 5xx");

    let mut runner = TestRunner::new(RunnerConfig::with_cases(CASES * 4));
    runner
        .run(&request(), |r| s.check(&r))
        .unwrap_or_else(|e| panic!("{e}"));
}
