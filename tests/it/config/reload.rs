//! Hot reload: `POST /api/v1/admin/reload` against the service in-process (config file on
//! disk, 127.0.0.1:0), and SIGHUP against the real binary.
//!
//! A good file applies its live sections at once (the page title, `[heartbeat] stale_after`,
//! a `[[contract]]` seen through the live channel the proxy reads) and names what needs a
//! restart; a bad one is refused with located diagnostics and the running config stays in
//! effect; the admin token is required; the built-in demo has no file (409).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use probeok::app::{self, StartOptions};
use probeok::clock::SystemClock;
use probeok::config::Config;

fn file(db: &Path, listen: SocketAddr, title: &str, token_env: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "{listen}"
title = "{title}"
admin_token_env = "{token_env}"

[storage]
path = "{db}"

{extra}

[[provider]]
id = "sim"
kind = "openai"
  [[provider.region]]
  id = "r1"
  base_url = "http://127.0.0.1:9/v1"

[[route]]
provider = "sim"
region = "r1"
model = "m1"
serves = "chat"
tier = "primary"
weight = 100
"#,
        db = db.display(),
    )
}

const CONTRACT: &str = r#"
[[contract]]
feature = "streaming_chat"
degraded = { cached_response = "5m" }
critical = { reject = "AI features are temporarily unavailable, please retry later" }
user_message = "Responses may be slower"
retry_after = "60s"
"#;

struct Served {
    base: String,
    running: app::Running,
    shutdown: CancellationToken,
}

async fn serve(path: Option<&Path>, config: Config) -> Served {
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let options = StartOptions {
        config_file: path.map(Path::to_path_buf),
        ..StartOptions::default()
    };
    let running = app::start_with(
        config,
        listener,
        Arc::new(SystemClock),
        shutdown.clone(),
        options,
    )
    .await
    .unwrap();
    Served {
        base: format!("http://{}", running.addr),
        running,
        shutdown,
    }
}

async fn reload(base: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new().post(format!("{base}/api/v1/admin/reload"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn page(base: &str) -> String {
    reqwest::get(format!("{base}/?lang=en"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn metrics(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_config_applies_live_sections_and_names_what_needs_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.db");
    let path = dir.path().join("probeok.toml");
    let listen: SocketAddr = "127.0.0.1:9400".parse().unwrap();
    std::fs::write(
        &path,
        file(&db, listen, "Before", "T_RELOAD_ADMIN_GOOD", ""),
    )
    .unwrap();
    let mut config = Config::load(&path).unwrap().config;
    config.env.set("T_RELOAD_ADMIN_GOOD", "s3cret");
    let s = serve(Some(&path), config).await;
    assert!(page(&s.base).await.contains("Before"));
    let mut live = s.running.config.receiver();
    live.borrow_and_update();

    // No token, a wrong token: refused, nothing reloaded.
    let (status, body) = reload(&s.base, None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = reload(&s.base, Some("wrong")).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized");

    let extra = format!("[heartbeat]\nstale_after = \"10m\"\n{CONTRACT}");
    let moved: SocketAddr = "127.0.0.1:9401".parse().unwrap();
    std::fs::write(
        &path,
        file(&db, moved, "After", "T_RELOAD_ADMIN_GOOD", &extra),
    )
    .unwrap();
    let (status, body) = reload(&s.base, Some("s3cret")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reloaded"], true);
    assert_eq!(
        body["applied"],
        // `public_url` defaults to `http://{listen}`, so it moved with the listener.
        serde_json::json!(["server.title", "server.public_url", "contract", "heartbeat"])
    );
    assert_eq!(
        body["restart_required"],
        serde_json::json!(["server.listen"])
    );
    assert!(
        body["warnings"][0]
            .as_str()
            .unwrap()
            .contains("server.listen"),
        "{body}"
    );

    // In effect now: the page title, stale_after, and the contract on the live channel (the
    // proxy's `ProxyOptions.live`); the listener stays where it was.
    assert!(page(&s.base).await.contains("After"));
    assert!(live.has_changed().unwrap());
    let now = live.borrow_and_update().clone();
    let contract = now.contract_for(Some("streaming_chat")).unwrap();
    assert_eq!(
        contract.user_message.as_deref(),
        Some("Responses may be slower")
    );
    assert_eq!(now.heartbeat.stale_after, Duration::from_secs(600));
    assert_eq!(now.server.listen, listen, "a restart applies the listener");

    let m = metrics(&s.base).await;
    assert!(
        m.contains("probeok_config_reloads_total{result=\"success\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("probeok_config_reloads_total{result=\"failure\"} 0"),
        "{m}"
    );
    assert!(m.contains("probeok_config_last_reload_successful 1"), "{m}");

    // The same file again: nothing to apply.
    let (status, body) = reload(&s.base, Some("s3cret")).await;
    assert_eq!(status, 200);
    assert_eq!(body["applied"], serde_json::json!([]));
    assert_eq!(
        body["restart_required"],
        serde_json::json!(["server.listen"])
    );

    s.shutdown.cancel();
    s.running.done.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_is_refused_with_located_diagnostics_and_the_old_one_kept() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.db");
    let path = dir.path().join("probeok.toml");
    let listen: SocketAddr = "127.0.0.1:9400".parse().unwrap();
    std::fs::write(&path, file(&db, listen, "Kept", "T_RELOAD_ADMIN_BAD", "")).unwrap();
    let mut config = Config::load(&path).unwrap().config;
    config.env.set("T_RELOAD_ADMIN_BAD", "s3cret");
    let s = serve(Some(&path), config).await;

    // Two problems: stale_after of zero, a contract whose fallback model nobody serves.
    let bad = "[heartbeat]\nstale_after = \"0s\"\n\n[[contract]]\nfeature = \"x\"\ndegraded = { fallback_model = \"nope\" }\n";
    std::fs::write(
        &path,
        file(&db, listen, "Broken", "T_RELOAD_ADMIN_BAD", bad),
    )
    .unwrap();
    // Two at once: serialised, both refused the same way.
    let (a, b) = tokio::join!(
        reload(&s.base, Some("s3cret")),
        reload(&s.base, Some("s3cret"))
    );
    assert_eq!(a, b);
    let (status, body) = a;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_config");
    let diags = body["error"]["diagnostics"].as_array().unwrap();
    let keys: Vec<&str> = diags.iter().map(|d| d["key"].as_str().unwrap()).collect();
    assert!(keys.contains(&"heartbeat.stale_after"), "{body}");
    assert!(
        keys.iter().any(|k| k.starts_with("contract[0].degraded")),
        "{body}"
    );
    for d in diags {
        assert!(d["line"].as_u64().unwrap() > 0, "located: {d}");
        let text = d["text"].as_str().unwrap();
        assert!(text.contains("probeok.toml:"), "{text}");
    }

    // The old config is still in effect.
    let p = page(&s.base).await;
    assert!(p.contains("Kept") && !p.contains("Broken"));
    assert_eq!(s.running.config.current().server.title, "Kept");
    assert!(s.running.config.current().contracts.is_empty());
    let m = metrics(&s.base).await;
    assert!(
        m.contains("probeok_config_reloads_total{result=\"failure\"} 2"),
        "{m}"
    );
    assert!(m.contains("probeok_config_last_reload_successful 0"), "{m}");

    // Fixed: accepted.
    std::fs::write(&path, file(&db, listen, "Fixed", "T_RELOAD_ADMIN_BAD", "")).unwrap();
    let (status, body) = reload(&s.base, Some("s3cret")).await;
    assert_eq!(status, 200, "{body}");
    assert!(page(&s.base).await.contains("Fixed"));

    s.shutdown.cancel();
    s.running.done.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_config_file_reload_answers_409() {
    let dir = tempfile::tempdir().unwrap();
    let src = file(
        &dir.path().join("r.db"),
        "127.0.0.1:9400".parse().unwrap(),
        "Built in",
        "T_RELOAD_ADMIN_DEMO",
        "",
    );
    let mut config = Config::parse(&src, "(built-in)").unwrap().config;
    config.env.set("T_RELOAD_ADMIN_DEMO", "s3cret");
    let s = serve(None, config).await;
    let (status, body) = reload(&s.base, Some("s3cret")).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "no_config_file");
    s.shutdown.cancel();
    s.running.done.await.unwrap().unwrap();
}

/// Kills the child when the test ends, pass or fail.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_running_binary() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("r.db");
    let path = dir.path().join("probeok.toml");
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    std::fs::write(&path, file(&db, listen, "Before HUP", "T_UNSET_ADMIN", "")).unwrap();
    let child = Child(
        Command::new(env!("CARGO_BIN_EXE_probeok"))
            .args(["serve", "--config"])
            .arg(&path)
            .env_remove("PROBEOK_CONFIG")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://{listen}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = reqwest::get(format!("{base}/?lang=en")).await {
            assert!(r.text().await.unwrap().contains("Before HUP"));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the binary never served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    std::fs::write(&path, file(&db, listen, "After HUP", "T_UNSET_ADMIN", "")).unwrap();
    let pid = child.0.id().to_string();
    let hup = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(hup.success());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let p = page(&base).await;
        if p.contains("After HUP") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "SIGHUP did not reload"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = metrics(&base).await;
    assert!(
        m.contains("probeok_config_reloads_total{result=\"success\"} 1"),
        "{m}"
    );
}
