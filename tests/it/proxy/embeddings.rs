//! `POST /v1/embeddings` through the proxy against fake OpenAI-compatible embeddings
//! endpoints (real HTTP on 127.0.0.1:0, OpenAI's documented shapes): a string and a batch,
//! failover from a failing primary to the route of the same model and dimensions only (the
//! config refuses any other in the same logical model), each request metered with the
//! answer's `usage.prompt_tokens` at the route's input price; chat and embeddings models at
//! the wrong endpoint and malformed requests refused with a 4xx JSON error before any upstream
//! call.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::embeddings::{embed_fake, EmbedFake, Mode, DIMENSIONS};
use common::{fake, json, openai, Reply};
use probeok::config::Config;
use probeok::proxy::{self, Proxy, ProxyOptions, WeightsView};
use probeok::store::{RequestFilter, RequestRecord, Store, StoreOptions};
use serde_json::{json as j, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

struct Px {
    base: String,
    http: reqwest::Client,
    store: Store,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
    _passive: mpsc::Receiver<probeok::probe::ProbeOutcome>,
}

/// `embed-v3`: a primary and a backup of `text-embedding-v3`; `embed-v4`: another model on
/// its own; `chat-main`: a chat route.
fn config(primary: &EmbedFake, backup: &EmbedFake, other: &EmbedFake, chat: &str) -> Config {
    let route = |provider: &str, model: &str, serves: &str, tier: &str| {
        format!(
            "[[route]]\nprovider = \"{provider}\"\nregion = \"r0\"\nmodel = \"{model}\"\nserves = \"{serves}\"\ntier = \"{tier}\"\nkind = \"embeddings\"\ndimensions = {DIMENSIONS}\nprice = {{ input_per_mtok = 0.13, output_per_mtok = 0.0, currency = \"USD\" }}\n"
        )
    };
    let provider = |id: &str, base: &str| {
        format!("[[provider]]\nid = \"{id}\"\nkind = \"openai\"\n  [[provider.region]]\n  id = \"r0\"\n  base_url = \"{base}\"\n")
    };
    let src = format!(
        "[proxy]\nenabled = true\nmax_body = \"4KiB\"\n\n{}{}{}{}{}{}{}[[route]]\nprovider = \"chat\"\nregion = \"r0\"\nmodel = \"gpt-4o\"\nserves = \"chat-main\"\nprice = {{ input_per_mtok = 2.5, output_per_mtok = 10.0, currency = \"USD\" }}\n",
        provider("a", &primary.base_v1()),
        provider("b", &backup.base_v1()),
        provider("c", &other.base_v1()),
        provider("chat", chat),
        route("a", "text-embedding-v3", "embed-v3", "primary"),
        route("b", "text-embedding-v3", "embed-v3", "backup"),
        route("c", "text-embedding-v4", "embed-v4", "primary"),
    );
    Config::parse(&src, "proxy-embeddings.toml").unwrap().config
}

async fn start(config: &Config) -> Px {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("p.db"), StoreOptions::default()).unwrap();
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, prx) = mpsc::channel(4096);
    let p = Proxy::with_options(
        config,
        wrx,
        ptx,
        ProxyOptions {
            store: Some(store.clone()),
            ..ProxyOptions::default()
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p, shutdown.clone()));
    Px {
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        store,
        shutdown,
        _dir: dir,
        _passive: prx,
    }
}

async fn post(
    px: &Px,
    path: &str,
    body: impl Into<reqwest::Body>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = px
        .http
        .post(format!("{}{path}", px.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let v = r.json().await.unwrap_or(Value::Null);
    (status, headers, v)
}

async fn metered(store: &Store, n: usize) -> Vec<RequestRecord> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = store.clone();
        let rows = tokio::task::spawn_blocking(move || {
            s.reader().unwrap().proxy_requests(&RequestFilter {
                limit: 100,
                ..Default::default()
            })
        })
        .await
        .unwrap()
        .unwrap();
        if rows.len() >= n {
            return rows;
        }
        assert!(Instant::now() < deadline, "metered {} of {n}", rows.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn embeddings_fail_over_within_their_model_only_and_are_metered() {
    let (primary, backup, other) = (embed_fake().await, embed_fake().await, embed_fake().await);
    let (chat, chats) = fake("/v1/chat/completions", |_| {
        Reply::now(json(
            axum::http::StatusCode::OK,
            openai::body("hi", "stop", Some(1)),
        ))
    })
    .await;
    primary.set(Mode::Unavailable);
    let px = start(&config(
        &primary,
        &backup,
        &other,
        &format!("{}/v1", chat.base_url()),
    ))
    .await;

    // A string: the primary answers 503, the backup of the same model answers.
    let body = j!({"model": "embed-v3", "input": "hello world", "encoding_format": "float"});
    let (status, h, v) = post(&px, "/v1/embeddings", body.to_string()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(h["x-probeok-route"], "b/r0/text-embedding-v3");
    assert_eq!(h["x-probeok-attempts"], "2");
    assert_eq!(h["x-probeok-fallback-reason"], "http_503");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"].as_array().unwrap().len(), 1);
    assert_eq!(
        v["data"][0]["embedding"].as_array().unwrap().len(),
        DIMENSIONS as usize
    );
    // Each route received its own upstream model name and the client's fields.
    let sent = backup.requests.last().json();
    assert_eq!(sent["model"], "text-embedding-v3");
    assert_eq!(sent["input"], "hello world");
    assert_eq!(sent["encoding_format"], "float");
    assert_eq!(primary.calls(), 1);

    // A batch.
    let batch = j!({"model": "embed-v3", "input": ["a b", "c d e"]});
    let (status, _, v) = post(&px, "/v1/embeddings", batch.to_string()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    // Never another model, never a chat route.
    assert_eq!((other.calls(), chats.all().len()), (0, 0));

    // Metered: the answer's prompt tokens at the route's input price.
    let rows = metered(&px.store, 2).await;
    let mut rows: Vec<_> = rows
        .into_iter()
        .filter(|r| r.serves == "embed-v3")
        .collect();
    rows.sort_by_key(|r| r.prompt_tokens);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (r, tokens) in rows.iter().zip([2_u64, 5]) {
        assert_eq!(r.outcome, "ok");
        assert_eq!(r.route.as_deref(), Some("b/r0/text-embedding-v3"));
        assert_eq!(r.prompt_tokens, Some(tokens));
        assert_eq!(r.currency.as_deref(), Some("USD"));
        let cost = r.cost.unwrap();
        assert!((cost - tokens as f64 * 0.13 / 1e6).abs() < 1e-12, "{cost}");
    }
    assert_eq!(rows[0].attempts.len(), 2, "{:?}", rows[0].attempts);

    // The wrong endpoint for each kind of model: 400, no upstream call.
    let (calls_before, chats_before) = (primary.calls() + backup.calls(), chats.all().len());
    let chat_req = j!({"model": "embed-v3", "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, v) = post(&px, "/v1/chat/completions", chat_req.to_string()).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("wrong_endpoint")),
        "{v}"
    );
    let embed_req = j!({"model": "chat-main", "input": "hi"});
    let (status, _, v) = post(&px, "/v1/embeddings", embed_req.to_string()).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("wrong_endpoint")),
        "{v}"
    );
    assert_eq!(primary.calls() + backup.calls(), calls_before);
    assert_eq!(chats.all().len(), chats_before);
    px.shutdown.cancel();
}

#[tokio::test]
async fn malformed_embeddings_requests_get_a_4xx_json_error_and_no_upstream_call() {
    let (primary, backup, other) = (embed_fake().await, embed_fake().await, embed_fake().await);
    let px = start(&config(&primary, &backup, &other, "http://127.0.0.1:9/v1")).await;
    let cases: Vec<(String, u16, &str)> = vec![
        ("{not json".into(), 400, "invalid_json"),
        ("[1, 2]".into(), 400, "invalid_request"),
        (j!({"input": "x"}).to_string(), 400, "missing_model"),
        (j!({"model": "embed-v3"}).to_string(), 400, "missing_input"),
        (
            j!({"model": "embed-v3", "input": []}).to_string(),
            400,
            "invalid_input",
        ),
        (
            j!({"model": "embed-v3", "input": ["a", 7]}).to_string(),
            400,
            "invalid_input",
        ),
        (
            j!({"model": "embed-v3", "input": {"text": "a"}}).to_string(),
            400,
            "invalid_input",
        ),
        (
            j!({"model": "embed-v3", "input": "a", "encoding_format": "int8"}).to_string(),
            400,
            "invalid_type",
        ),
        (
            j!({"model": "embed-v3", "input": "a", "dimensions": -1}).to_string(),
            400,
            "invalid_type",
        ),
        (
            j!({"model": "nope", "input": "a"}).to_string(),
            404,
            "model_not_found",
        ),
        // Over `max_body` (4 KiB): refused unread.
        (
            j!({"model": "embed-v3", "input": "x".repeat(8 * 1024)}).to_string(),
            413,
            "request_too_large",
        ),
    ];
    for (body, want, code) in cases {
        let (status, _, v) = post(&px, "/v1/embeddings", body.clone()).await;
        assert_eq!(status, want, "{body}: {v}");
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    assert_eq!(primary.calls() + backup.calls() + other.calls(), 0);
    px.shutdown.cancel();
}
