//! Upstreams behind an HTTP proxy: `probeok proxy` reaches each upstream the way the
//! environment says (`HTTP_PROXY` and `NO_PROXY`, as curl and every other client on the machine
//! read them). It runs as its own process with those variables, in front of one fake playing
//! the HTTP proxy and one fake upstream reached directly.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::upstream::{fake, free_port, json, openai, Reply};

const KEYS_VAR: &str = "PROBEOK_ENV_TEST_CLIENT_KEYS";

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn each_upstream_is_reached_the_way_the_environment_says() {
    let answer = |text: &'static str| {
        move |_: &_| Reply::now(json(StatusCode::OK, openai::body(text, "stop", Some(3))))
    };
    // Playing the HTTP proxy: a request for `http://upstream.test/...` arrives here whole.
    let (forward, via) = fake("/v1/chat/completions", answer("through the proxy")).await;
    let (near, direct) = fake("/v1/chat/completions", answer("straight")).await;

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("probeok.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[storage]
path = "{db}"

[proxy]
listen = "127.0.0.1:{port}"
client_keys_env = "{KEYS_VAR}"

[[provider]]
id = "far"
kind = "openai"
  [[provider.region]]
  id = "r1"
  base_url = "http://upstream.test/v1"

[[provider]]
id = "near"
kind = "openai"
  [[provider.region]]
  id = "r1"
  base_url = "{near}/v1"

[[route]]
provider = "far"
region = "r1"
model = "far-model"
serves = "far"
tier = "primary"

[[route]]
provider = "near"
region = "r1"
model = "near-model"
serves = "near"
tier = "primary"
"#,
            db = dir.path().join("probeok.db").display(),
            near = near.base_url(),
        ),
    )
    .unwrap();
    let log = dir.path().join("proxy.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_probeok"));
    for var in [
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "http_proxy",
    ] {
        cmd.env_remove(var);
    }
    let child = cmd
        .args(["proxy", "--config"])
        .arg(&config)
        .env_remove("PROBEOK_CONFIG")
        .env("HTTP_PROXY", forward.base_url())
        .env("NO_PROXY", "localhost,127.0.0.1")
        .env(KEYS_VAR, "key-a")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start probeok proxy");
    let _running = Running(child);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http.get(format!("{base}/readyz")).send().await, Ok(r) if r.status().is_success())
    {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(Instant::now() < deadline, "the proxy did not start:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let ask = |model: &'static str| {
        http.post(format!("{base}/v1/chat/completions"))
            .bearer_auth("key-a")
            .json(&serde_json::json!({
                "model": model,
                "messages": [{"role": "user", "content": "hello"}],
            }))
            .send()
    };
    let content = |v: &serde_json::Value| v["choices"][0]["message"]["content"].clone();

    let far = ask("far").await.unwrap();
    assert_eq!(far.status(), StatusCode::OK);
    let far: serde_json::Value = far.json().await.unwrap();
    assert_eq!(content(&far), "through the proxy");
    let seen = via.last();
    assert_eq!(
        seen.header("host"),
        Some("upstream.test"),
        "asked for by name"
    );
    assert_eq!(seen.json()["model"], "far-model");

    let near_answer = ask("near").await.unwrap();
    assert_eq!(near_answer.status(), StatusCode::OK);
    let near_answer: serde_json::Value = near_answer.json().await.unwrap();
    assert_eq!(content(&near_answer), "straight");
    assert_eq!(
        via.all().len(),
        1,
        "NO_PROXY's hosts never go through the proxy"
    );
    let host = direct.last().header("host").map(str::to_owned);
    assert_eq!(host, Some(near.addr.to_string()));
}
