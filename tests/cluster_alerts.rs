//! A route that fails across a takeover of the monitor pair is alerted once and resolved once:
//! two `probeok serve` processes on one PostgreSQL database, the leader killed (-9) while the
//! route is failing, the other member taking over the incident, the outbox and the alert state
//! from the database. Needs `PROBEOK_TEST_PG_URL` (`scripts/test` starts a server).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::cluster::Db;
use common::{fake, Reply, Server};
use serde_json::Value;

const URL_VAR: &str = "PROBEOK_PAIR_DATABASE_URL";
const HOOK_VAR: &str = "PROBEOK_PAIR_HOOK";

use common::free_port;

/// Every message the webhook channel delivers, in order.
async fn hook() -> (Server, Arc<Mutex<Vec<Value>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = got.clone();
    let (server, _) = fake("/hook", move |c| {
        seen.lock().unwrap().push(c.json());
        Reply::now(StatusCode::OK)
    })
    .await;
    (server, got)
}

fn write_config(dir: &Path, name: &str, port: u16, upstream: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::create_dir_all(dir.join("no-sets")).unwrap();
    let body = format!(
        r#"
[server]
listen = "127.0.0.1:{port}"

[storage]
path = "{ignored}"
url_env = "{URL_VAR}"

[cluster]
lease = "3s"

[probe]
interval = "500ms"
timeout = "450ms"
first_byte_timeout = "400ms"
throughput_every = "1h"
jitter = 0.0

[detection]
min_samples = 3
degraded_after = 2
recover_after = "1s"
error_window = "10s"

[alerting]
group_wait = "0s"

[[alert.webhook]]
url_env = "{HOOK_VAR}"

[drift]
sets = "{sets}"

[[provider]]
id = "qwen"
kind = "openai"
  [[provider.region]]
  id = "cn"
  base_url = "{upstream}/v1"

[[route]]
provider = "qwen"
region = "cn"
model = "qwen-max"
serves = "chat"
"#,
        ignored = dir.join(format!("{name}-unused.db")).display(),
        sets = dir.join("no-sets").display(),
    );
    std::fs::write(&path, body).unwrap();
    path
}

struct Member {
    child: Child,
    base: String,
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(config: &Path, port: u16, url: &str, hook: &str, log: &Path) -> Member {
    let log = std::fs::File::create(log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_probeok"))
        .args(["serve", "--config"])
        .arg(config)
        .env_remove("PROBEOK_CONFIG")
        .env(URL_VAR, url)
        .env(HOOK_VAR, hook)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start probeok serve");
    Member {
        child,
        base: format!("http://127.0.0.1:{port}"),
    }
}

async fn get(http: &reqwest::Client, url: String) -> Option<Value> {
    http.get(url).send().await.ok()?.json().await.ok()
}

/// Polls `f` every 100 ms until it is true, failing with `what` after `within`.
async fn until<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < within, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn role_is(http: &reqwest::Client, m: &Member, want: &str) -> bool {
    get(http, format!("{}/readyz", m.base))
        .await
        .is_some_and(|v| v["role"] == want)
}

async fn route_state(http: &reqwest::Client, m: &Member) -> Option<String> {
    let v = get(http, format!("{}/api/v1/status", m.base)).await?;
    v["routes"]
        .as_array()?
        .iter()
        .find(|r| r["id"] == "qwen/cn/qwen-max")
        .and_then(|r| r["state"].as_str().map(str::to_owned))
}

/// How many messages arrived under each alert key (a key names the incident and what the
/// message says of it: `…@<incident>:DEGRADED`, `…@<incident>:resolved`).
fn tally(got: &Mutex<Vec<Value>>) -> BTreeMap<String, usize> {
    let mut t = BTreeMap::new();
    for m in got.lock().unwrap().iter() {
        *t.entry(m["key"].as_str().unwrap_or("").to_owned())
            .or_insert(0) += 1;
    }
    t
}

/// The incidents with a DEGRADED (or worse) message, and those with a resolved one.
fn incidents(t: &BTreeMap<String, usize>) -> (Vec<String>, Vec<String>) {
    let of = |suffix: &[&str]| -> Vec<String> {
        t.keys()
            .filter_map(|k| k.rsplit_once(':'))
            .filter(|(_, what)| suffix.contains(what))
            .map(|(incident, _)| incident.to_owned())
            .collect()
    };
    (of(&["DEGRADED", "CRITICAL"]), of(&["resolved"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_failing_across_a_takeover_is_alerted_once_and_resolved_once() {
    let db = Db::create().await;
    let dir = tempfile::tempdir().unwrap();
    let failing = Arc::new(AtomicBool::new(false));
    let up = common::probe_ok_unless(failing.clone()).await;
    let (receiver, got) = hook().await;
    let hook_url = format!("{}/hook", receiver.base_url());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();

    let (pa, pb) = (free_port(), free_port());
    let ca = write_config(dir.path(), "a", pa, &up.base_url());
    let cb = write_config(dir.path(), "b", pb, &up.base_url());
    let a = start(&ca, pa, &db.url, &hook_url, &dir.path().join("a.log"));
    until(Duration::from_secs(20), "a leads", || {
        role_is(&http, &a, "leader")
    })
    .await;
    let b = start(&cb, pb, &db.url, &hook_url, &dir.path().join("b.log"));
    until(Duration::from_secs(20), "b follows", || {
        role_is(&http, &b, "follower")
    })
    .await;
    until(Duration::from_secs(20), "the route is NORMAL", || async {
        route_state(&http, &a).await.as_deref() == Some("NORMAL")
    })
    .await;

    // The route fails; the leader opens the incident and alerts.
    failing.store(true, Ordering::SeqCst);
    until(
        Duration::from_secs(20),
        "the outage alert of the route",
        || async { !incidents(&tally(&got)).0.is_empty() },
    )
    .await;

    // The leader dies while the route is still failing; b takes over the incident.
    drop(a);
    until(Duration::from_secs(3 + 5), "b takes over", || {
        role_is(&http, &b, "leader")
    })
    .await;
    // Still failing under the new leader for a while: nothing fires a second time.
    tokio::time::sleep(Duration::from_secs(3)).await;
    failing.store(false, Ordering::SeqCst);
    until(
        Duration::from_secs(30),
        "the route heals under b",
        || async { route_state(&http, &b).await.as_deref() == Some("NORMAL") },
    )
    .await;
    until(Duration::from_secs(30), "the incident resolved", || async {
        !incidents(&tally(&got)).1.is_empty()
    })
    .await;
    // Let any late duplicate arrive before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = tally(&got);
    let all = || format!("{:#?}", got.lock().unwrap());
    let (opened, resolved) = incidents(&t);
    assert_eq!(
        opened.len(),
        1,
        "one outage alert across the takeover: {}",
        all()
    );
    assert_eq!(
        resolved,
        opened,
        "the same incident resolved once: {}",
        all()
    );
    assert!(
        t.values().all(|n| *n == 1),
        "no message sent twice across the takeover: {t:?}"
    );
    drop(b);
    db.drop_now().await;
}
