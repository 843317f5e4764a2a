//! Probing from many places, end to end: the monitor (`probeok serve`) and its agents
//! (`probeok agent`) are separate processes talking HTTP, each agent reaching its own fake
//! upstream (as a real agent in another place reaches another edge of the provider).
//!
//! - Three vantages: one failing alone leaves the route NORMAL with a `vantage_local`
//!   finding naming it; two failing take it to DEGRADED/CRITICAL; healed, NORMAL again.
//! - A stale vantage: marked stale, out of the quorum, one `vantage_stale` alert.
//! - The monitor down: the agent keeps its backlog and delivers it after the monitor
//!   returns; a monitor that stores but never answers, and an agent killed -9 before its
//!   acknowledgement, give duplicates the monitor recognises — none stored twice, none lost.
//! - Ingest rejects an unknown vantage, an unassigned route and a future timestamp per item.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use common::{fake, Reply, Server};
use serde_json::{json, Value};

const TOKEN: &str = "ingest-s3cret";
const ROUTE: &str = "qwen/cn/qwen-max";

/// A child process, killed (SIGKILL) when dropped.
struct Proc {
    child: tokio::process::Child,
}

impl Proc {
    fn kill9(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

use common::free_port;

struct Setup<'a> {
    port: u16,
    db: &'a Path,
    upstream: &'a str,
    /// `[[vantage]]` tables and anything else appended.
    extra: &'a str,
}

fn config_text(s: &Setup<'_>) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
vantage = "hz"

[storage]
path = "{db}"

[probe]
interval = "400ms"
timeout = "350ms"
first_byte_timeout = "300ms"
throughput_every = "1h"
jitter = 0.0

[detection]
min_samples = 3
degraded_after = 2
recover_after = "1s"
# Recovery reads the whole window: short, so a healed outage clears in seconds.
error_window = "20s"

[[provider]]
id = "qwen"
kind = "openai"
api_key_env = "T_VANTAGE_KEY"
  [[provider.region]]
  id = "cn"
  base_url = "{upstream}/v1"

[[route]]
provider = "qwen"
region = "cn"
model = "qwen-max"
serves = "chat"

[[route]]
provider = "deepseek"
region = "cn"
model = "deepseek-chat"
serves = "chat"
tier = "backup"

[[provider]]
id = "deepseek"
kind = "openai"
api_key_env = "T_VANTAGE_KEY"
  [[provider.region]]
  id = "cn"
  base_url = "{upstream}/v1"
{extra}
"#,
        port = s.port,
        db = s.db.display(),
        upstream = s.upstream,
        extra = s.extra,
    )
}

fn write_config(dir: &Path, name: &str, s: &Setup<'_>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, config_text(s)).unwrap();
    path
}

fn bin() -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_probeok"));
    c.env("T_VANTAGE_KEY", "sk-test")
        .env("PROBEOK_INGEST_TOKEN", TOKEN)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    c
}

async fn serve(config: &Path, envs: &[(&str, String)]) -> Proc {
    let mut c = bin();
    c.arg("serve").arg("--config").arg(config);
    for (k, v) in envs {
        c.env(k, v);
    }
    Proc {
        child: c.spawn().unwrap(),
    }
}

async fn agent(config: &Path, vantage: &str, server: &str, data: &Path, listen: u16) -> Proc {
    let mut c = bin();
    c.arg("agent")
        .arg("--config")
        .arg(config)
        .args(["--vantage", vantage, "--server", server])
        .arg("--data")
        .arg(data)
        .args(["--listen", &format!("127.0.0.1:{listen}")]);
    Proc {
        child: c.spawn().unwrap(),
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

async fn status(base: &str) -> Option<Value> {
    let r = http()
        .get(format!("{base}/api/v1/status"))
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

fn route<'a>(doc: &'a Value, id: &str) -> &'a Value {
    doc["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .unwrap()
}

/// Polls `/api/v1/status` until `ok` holds on the route, or panics after `within` with the
/// last document; `each` sees every document on the way.
async fn until(
    base: &str,
    within: Duration,
    what: &str,
    mut each: impl FnMut(&Value),
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    let mut last = Value::Null;
    loop {
        if let Some(doc) = status(base).await {
            let r = route(&doc, ROUTE).clone();
            each(&r);
            if ok(&r) {
                return r;
            }
            last = r;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; last: {last:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn vstate<'a>(r: &'a Value, v: &str) -> &'a str {
    r["vantages"][v]["state"].as_str().unwrap_or("")
}

fn bad(s: &str) -> bool {
    s == "DEGRADED" || s == "CRITICAL"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_vantages_judge_by_quorum() {
    let dir = tempfile::tempdir().unwrap();
    let (hz_fail, bj_fail, sh_fail) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (hz_up, bj_up, sh_up) = (
        common::probe_ok_unless(hz_fail.clone()).await,
        common::probe_ok_unless(bj_fail.clone()).await,
        common::probe_ok_unless(sh_fail.clone()).await,
    );
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let vantages = r#"
[[vantage]]
id = "bj"
routes = ["qwen/*"]
stale_after = "10s"
[[vantage]]
id = "sh"
routes = ["qwen/*"]
stale_after = "10s"
[quorum]
min_vantages = 2
"#;
    let db = dir.path().join("monitor.db");
    let mon_cfg = write_config(
        dir.path(),
        "monitor.toml",
        &Setup {
            port,
            db: &db,
            upstream: &hz_up.base_url(),
            extra: vantages,
        },
    );
    // Each agent's config names its own edge of the provider.
    let mut agents = Vec::new();
    for (id, up) in [("bj", &bj_up), ("sh", &sh_up)] {
        let cfg = write_config(
            dir.path(),
            &format!("{id}.toml"),
            &Setup {
                port,
                db: &dir.path().join(format!("{id}-unused.db")),
                upstream: &up.base_url(),
                extra: vantages,
            },
        );
        agents.push(
            agent(
                &cfg,
                id,
                &base,
                &dir.path().join(format!("agent-{id}.db")),
                // Its own port is not read here: any free one, chosen at bind time (a port
                // picked beforehand can be taken by another test before the agent binds it).
                0,
            )
            .await,
        );
    }
    let _monitor = serve(&mon_cfg, &[]).await;

    let healthy = until(
        &base,
        Duration::from_secs(40),
        "all vantages NORMAL",
        |_| {},
        |r| r["state"] == "NORMAL" && ["hz", "bj", "sh"].iter().all(|v| vstate(r, v) == "NORMAL"),
    )
    .await;
    assert_eq!(healthy["vantage_local"], Value::Null, "{healthy:#}");
    assert_eq!(healthy["vantages"]["bj"]["stale"], false);
    assert!(
        healthy["vantages"]["bj"]["last_seen"].is_string(),
        "{healthy:#}"
    );
    // The route agents do not probe is judged by this monitor alone, as on one box.
    let doc = status(&base).await.unwrap();
    assert!(route(&doc, "deepseek/cn/deepseek-chat")
        .get("vantages")
        .is_none());

    // One vantage fails alone: its own state goes bad, the route stays NORMAL, and the
    // finding names that vantage.
    bj_fail.store(true, Ordering::SeqCst);
    let local = until(
        &base,
        Duration::from_secs(30),
        "bj failing alone gives vantage_local",
        |r| {
            assert_eq!(
                r["state"], "NORMAL",
                "one vantage must not move the route: {r:#}"
            )
        },
        |r| bad(vstate(r, "bj")) && r["vantage_local"]["vantages"] == json!(["bj"]),
    )
    .await;
    let text = local["vantage_local"]["text"].as_str().unwrap();
    assert!(text.contains("bj sees qwen/cn/qwen-max failing"), "{text}");
    // What people see: a dot per vantage on `/`, the vantages on the route page, the
    // vantage label on the probe metrics.
    let get =
        |path: String| async move { http().get(path).send().await.unwrap().text().await.unwrap() };
    let page = get(format!("{base}/?lang=en")).await;
    for v in ["hz", "bj", "sh"] {
        assert!(
            page.contains(&format!("title=\"{v}: ")),
            "no dot for {v} on /"
        );
    }
    assert!(
        page.contains("class=\"vdot st-degraded\" title=\"bj: ")
            || page.contains("class=\"vdot st-critical\" title=\"bj: ")
    );
    let route_page = get(format!("{base}/routes/qwen%2Fcn%2Fqwen-max?lang=en")).await;
    assert!(
        route_page.contains("id=\"vantages\""),
        "no vantage table on the route page"
    );
    assert!(
        route_page.contains("bj sees qwen/cn/qwen-max failing"),
        "no vantage_local on the route page"
    );
    let metrics = get(format!("{base}/metrics")).await;
    assert!(
        metrics.contains(
            r#"probeok_probe_success{provider="qwen",region="cn",model="qwen-max",vantage="bj"} 0"#
        ),
        "{metrics}"
    );
    // One family for every vantage: the monitor's own probes under `[server] vantage`.
    assert!(
        metrics.contains(
            r#"probeok_probe_success{provider="qwen",region="cn",model="qwen-max",vantage="hz"} "#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"probeok_probes_total{provider="qwen",region="cn",model="qwen-max",vantage="bj",result="#),
        "{metrics}"
    );
    assert!(!metrics.contains("probeok_probe_vantage"), "{metrics}");
    let incidents: Value = http()
        .get(format!("{base}/api/v1/incidents"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        incidents["incidents"].as_array().map(Vec::len),
        Some(0),
        "a vantage failing alone is no incident of the provider: {incidents:#}"
    );

    // A second vantage sees it too: the provider's outage.
    sh_fail.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    let judged = until(
        &base,
        Duration::from_secs(30),
        "two vantages failing degrade the route",
        |_| {},
        |r| bad(r["state"].as_str().unwrap_or("")),
    )
    .await;
    eprintln!(
        "figure: a two-vantage outage judged {} in {:.1} s (probe interval 400 ms, degraded_after 2)",
        judged["state"],
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(judged["vantage_local"], Value::Null, "{judged:#}");
    assert!(
        judged["reason"]["text"]
            .as_str()
            .unwrap()
            .contains("vantages (bj, sh)"),
        "{judged:#}"
    );

    // Healed everywhere: NORMAL again.
    bj_fail.store(false, Ordering::SeqCst);
    sh_fail.store(false, Ordering::SeqCst);
    until(
        &base,
        Duration::from_secs(60),
        "healed",
        |_| {},
        |r| r["state"] == "NORMAL",
    )
    .await;
    drop(agents);
    let _ = hz_fail;
}

/// Collects every message a webhook receives.
async fn hook() -> (Server, Arc<std::sync::Mutex<Vec<Value>>>) {
    let got = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = got.clone();
    let (server, _) = fake("/hook", move |c| {
        seen.lock().unwrap().push(c.json());
        Reply::now(StatusCode::OK)
    })
    .await;
    (server, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_vantage_leaves_the_quorum_with_one_alert() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, failing) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(true)),
    );
    let (hz_up, bj_up) = (
        common::probe_ok_unless(ok).await,
        common::probe_ok_unless(failing).await,
    );
    let (receiver, got) = hook().await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    // A quorum of one: any vantage's trouble is the route's, until it goes stale.
    let extra = r#"
[[vantage]]
id = "bj"
routes = ["qwen/*"]
stale_after = "3s"
[quorum]
min_vantages = 1
[alerting]
group_wait = "0s"
[[alert.webhook]]
url_env = "T_VANTAGE_HOOK"
"#;
    let db = dir.path().join("monitor.db");
    let mon_cfg = write_config(
        dir.path(),
        "monitor.toml",
        &Setup {
            port,
            db: &db,
            upstream: &hz_up.base_url(),
            extra,
        },
    );
    let bj_cfg = write_config(
        dir.path(),
        "bj.toml",
        &Setup {
            port,
            db: &dir.path().join("unused.db"),
            upstream: &bj_up.base_url(),
            extra,
        },
    );
    let mut bj = agent(&bj_cfg, "bj", &base, &dir.path().join("bj.db"), 0).await;
    let _monitor = serve(
        &mon_cfg,
        &[("T_VANTAGE_HOOK", format!("{}/hook", receiver.base_url()))],
    )
    .await;
    until(
        &base,
        Duration::from_secs(40),
        "bj failing carries the route with a quorum of one",
        |_| {},
        |r| bad(r["state"].as_str().unwrap_or("")) && vstate(r, "hz") == "NORMAL",
    )
    .await;

    bj.kill9();
    let stale = until(
        &base,
        Duration::from_secs(30),
        "bj stale, out of the quorum",
        |_| {},
        |r| r["vantages"]["bj"]["stale"] == true && r["state"] == "NORMAL",
    )
    .await;
    assert!(
        bad(vstate(&stale, "bj")),
        "its last view is still shown: {stale:#}"
    );
    // One alert, however long it stays stale. A push the monitor took before the kill but
    // judged after the silence (a loaded machine) is a push: it may end that silence and
    // open another, which is alerted again. So: one firing per silence, each later one after
    // a resolution, and a redelivery of the same key is the same alert.
    let stale_msgs = || -> Vec<(String, String)> {
        got.lock()
            .unwrap()
            .iter()
            .filter_map(|m| {
                let key = m["key"].as_str()?;
                key.starts_with("vantage_stale:bj").then(|| {
                    (
                        key.to_owned(),
                        m["status"].as_str().unwrap_or("").to_owned(),
                    )
                })
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !stale_msgs().iter().any(|(_, s)| s == "firing") {
        assert!(
            Instant::now() < deadline,
            "no vantage_stale alert: {:#?}",
            got.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    // The status of each distinct message, in the order they came.
    let all = stale_msgs();
    let mut seen = BTreeSet::new();
    let statuses: Vec<&str> = all
        .iter()
        .filter(|(key, _)| seen.insert(key))
        .map(|(_, status)| status.as_str())
        .collect();
    assert_eq!(statuses.first(), Some(&"firing"), "{all:#?}");
    assert_eq!(statuses.last(), Some(&"firing"), "still stale: {all:#?}");
    for pair in statuses.windows(2) {
        assert_ne!(
            pair[0], pair[1],
            "an alert repeated within one silence: {all:#?}"
        );
    }
    let msgs: Vec<Value> = got.lock().unwrap().clone();
    let m = msgs
        .iter()
        .rev()
        .find(|m| {
            m["key"]
                .as_str()
                .unwrap_or("")
                .starts_with("vantage_stale:bj@")
        })
        .unwrap();
    assert_eq!(m["severity"], "warning", "{m:#}");
    assert!(
        m["note"].as_str().unwrap().contains("vantage bj is silent"),
        "{m:#}"
    );
}

/// The `vantage_outcomes` ids stored for `vantage`, read from the monitor's file.
fn stored_ids(db: &Path, vantage: &str) -> Vec<String> {
    let conn = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let mut stmt = conn
        .prepare("SELECT uid FROM vantage_outcomes WHERE vantage = ?1 ORDER BY id")
        .unwrap();
    stmt.query_map([vantage], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Every id `prefix-n` of one agent run: the numbers per prefix must be 1..=max with none
/// missing (nothing lost) and none twice (nothing doubled).
fn check_sequences(ids: &[String]) -> BTreeMap<String, u64> {
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "an outcome stored twice");
    let mut runs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for id in ids {
        let (prefix, n) = id.rsplit_once('-').unwrap();
        runs.entry(prefix.to_owned())
            .or_default()
            .push(n.parse().unwrap());
    }
    runs.into_iter()
        .map(|(prefix, mut ns)| {
            ns.sort_unstable();
            let max = *ns.last().unwrap();
            assert_eq!(
                ns,
                (1..=max).collect::<Vec<_>>(),
                "outcomes of run {prefix} missing"
            );
            (prefix, max)
        })
        .collect()
}

async fn agent_metric(port: u16, name: &str) -> Option<f64> {
    let text = http()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn wait_metric(port: u16, name: &str, within: Duration, ok: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = agent_metric(port, name).await {
            if ok(v) {
                return v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{name} not as expected within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_survives_a_monitor_outage_and_arrives_once() {
    let dir = tempfile::tempdir().unwrap();
    let up = common::probe_ok_unless(Arc::new(AtomicBool::new(false))).await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let extra = "[[vantage]]\nid = \"bj\"\nstale_after = \"1m\"\n";
    let db = dir.path().join("monitor.db");
    let setup = Setup {
        port,
        db: &db,
        upstream: &up.base_url(),
        extra,
    };
    let mon_cfg = write_config(dir.path(), "monitor.toml", &setup);
    let bj_cfg = write_config(dir.path(), "bj.toml", &setup);
    let outbox = dir.path().join("bj.db");

    // A backlog of 10,000 outcomes from an earlier outage waits in the agent's outbox.
    {
        let mut o = probeok::agent::outbox::Outbox::open(&outbox, 100_000).unwrap();
        let now = chrono::Utc::now();
        let bodies: Vec<String> = (1..=10_000i64)
            .map(|n| {
                json!({
                    "vantage": "bj", "id": format!("bj-backlog-{n}"), "route": ROUTE,
                    "kind": "probe", "started_at": now - chrono::Duration::seconds(3600 - n / 4),
                    "success": true, "total_ms": 120.0, "ttfb_ms": 40.0,
                })
                .to_string()
            })
            .collect();
        o.push(&bodies).unwrap();
        assert_eq!(o.len().unwrap(), 10_000);
    }
    let mut monitor = serve(&mon_cfg, &[]).await;
    until(
        &base,
        Duration::from_secs(30),
        "monitor up",
        |_| {},
        |_| true,
    )
    .await;
    let metrics_port = free_port();
    let t0 = Instant::now();
    let _bj = agent(&bj_cfg, "bj", &base, &outbox, metrics_port).await;
    wait_metric(
        metrics_port,
        "probeok_agent_pushed_total",
        Duration::from_secs(120),
        |v| v >= 10_000.0,
    )
    .await;
    let delivered = t0.elapsed();
    let ids = stored_ids(&db, "bj");
    let backlog: Vec<&String> = ids
        .iter()
        .filter(|i| i.starts_with("bj-backlog-"))
        .collect();
    assert_eq!(backlog.len(), 10_000);
    eprintln!(
        "figure: a backlog of 10,000 outcomes delivered in {:.1} s (agent start included); stored 10,000, none twice",
        delivered.as_secs_f64()
    );

    // The monitor goes down hard; the agent keeps probing into its outbox.
    monitor.kill9();
    let _ = monitor.child.wait().await;
    wait_metric(
        metrics_port,
        "probeok_agent_push_errors_total",
        Duration::from_secs(20),
        |v| v >= 2.0,
    )
    .await;
    let waiting = wait_metric(
        metrics_port,
        "probeok_agent_backlog",
        Duration::from_secs(20),
        |v| v >= 5.0,
    )
    .await;
    let down_at = chrono::Utc::now();
    // Back, on the same store.
    let _monitor = serve(&mon_cfg, &[]).await;
    wait_metric(
        metrics_port,
        "probeok_agent_backlog",
        Duration::from_secs(60),
        |v| v == 0.0,
    )
    .await;
    let ids = stored_ids(&db, "bj");
    let runs = check_sequences(
        &ids.iter()
            .filter(|i| !i.starts_with("bj-backlog-"))
            .cloned()
            .collect::<Vec<_>>(),
    );
    assert_eq!(runs.len(), 1, "{runs:?}");
    let probes = *runs.values().next().unwrap();
    assert!(
        probes as f64 >= waiting,
        "the {waiting} outcomes that waited arrived ({probes} stored)"
    );
    // Outcomes measured while the monitor was down are there, with their own times.
    let conn =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let during: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM vantage_outcomes WHERE vantage = 'bj' AND uid NOT LIKE 'bj-backlog-%'
             AND started_at_ms <= ?1",
            [down_at.timestamp_millis()],
            |r| r.get(0),
        )
        .unwrap();
    assert!(during as f64 >= waiting, "{during} < {waiting}");
}

/// A monitor front that passes pushes through but, for the first `cut` of them, drops the
/// answer after the monitor stored the batch: the agent never learns they were taken.
async fn lossy_front(monitor: String, cut: u64) -> (Server, Arc<AtomicU64>) {
    let duplicates = Arc::new(AtomicU64::new(0));
    let dups = duplicates.clone();
    let seen = Arc::new(AtomicU64::new(0));
    let handler = move |headers: axum::http::HeaderMap, body: Bytes| {
        let monitor = monitor.clone();
        let seen = seen.clone();
        let dups = dups.clone();
        async move {
            let mut req = http().post(format!("{monitor}/api/v1/ingest")).body(body);
            for name in ["authorization", "content-type"] {
                if let Some(v) = headers.get(name) {
                    req = req.header(name, v);
                }
            }
            let Ok(resp) = req.send().await else {
                return StatusCode::BAD_GATEWAY.into_response();
            };
            let status = resp.status();
            let answer: Value = resp.json().await.unwrap_or(Value::Null);
            dups.fetch_add(answer["duplicates"].as_u64().unwrap_or(0), Ordering::SeqCst);
            if seen.fetch_add(1, Ordering::SeqCst) < cut {
                // Headers out, then the connection breaks before the answer's body.
                let broken = futures_util::stream::once(async {
                    Err::<Bytes, std::io::Error>(std::io::Error::other("cut"))
                });
                return Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from_stream(broken))
                    .unwrap();
            }
            (status, axum::Json(answer)).into_response()
        }
    };
    let server = common::spawn(Router::new().route("/api/v1/ingest", post(handler))).await;
    (server, duplicates)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_acknowledgements_and_a_killed_agent_double_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let up = common::probe_ok_unless(Arc::new(AtomicBool::new(false))).await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let extra = "[[vantage]]\nid = \"bj\"\nstale_after = \"1m\"\n";
    let db = dir.path().join("monitor.db");
    let setup = Setup {
        port,
        db: &db,
        upstream: &up.base_url(),
        extra,
    };
    let mon_cfg = write_config(dir.path(), "monitor.toml", &setup);
    let bj_cfg = write_config(dir.path(), "bj.toml", &setup);
    let outbox = dir.path().join("bj.db");
    let _monitor = serve(&mon_cfg, &[]).await;
    until(
        &base,
        Duration::from_secs(30),
        "monitor up",
        |_| {},
        |_| true,
    )
    .await;
    let (front, duplicates) = lossy_front(base.clone(), 3).await;

    let metrics_port = free_port();
    let mut bj = agent(&bj_cfg, "bj", &front.base_url(), &outbox, metrics_port).await;
    // Three answers lost: the agent sends those batches again and the monitor says duplicate.
    let deadline = Instant::now() + Duration::from_secs(40);
    while duplicates.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no duplicate was ever answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Killed -9 mid-flight: whatever it had not settled waits in its file.
    bj.kill9();
    let _ = bj.child.wait().await;
    let before = stored_ids(&db, "bj").len();
    let _bj = agent(&bj_cfg, "bj", &front.base_url(), &outbox, metrics_port).await;
    wait_metric(
        metrics_port,
        "probeok_agent_pushed_total",
        Duration::from_secs(30),
        |v| v >= 3.0,
    )
    .await;
    wait_metric(
        metrics_port,
        "probeok_agent_backlog",
        Duration::from_secs(30),
        |v| v == 0.0,
    )
    .await;
    let ids = stored_ids(&db, "bj");
    assert!(
        ids.len() > before,
        "the restarted agent delivers ({before} → {})",
        ids.len()
    );
    let runs = check_sequences(&ids);
    assert_eq!(runs.len(), 2, "two runs of the agent: {runs:?}");
    eprintln!(
        "lost answers: {} duplicates recognised, {} outcomes stored once over 2 agent runs",
        duplicates.load(Ordering::SeqCst),
        ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_answers_agents_item_by_item() {
    let dir = tempfile::tempdir().unwrap();
    let up = common::probe_ok_unless(Arc::new(AtomicBool::new(false))).await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let extra = "[[vantage]]\nid = \"bj\"\nroutes = [\"qwen/*\"]\n";
    let db = dir.path().join("monitor.db");
    let mon_cfg = write_config(
        dir.path(),
        "monitor.toml",
        &Setup {
            port,
            db: &db,
            upstream: &up.base_url(),
            extra,
        },
    );
    let _monitor = serve(&mon_cfg, &[]).await;
    until(
        &base,
        Duration::from_secs(30),
        "monitor up",
        |_| {},
        |_| true,
    )
    .await;
    let now = chrono::Utc::now();
    let item = |vantage: &str, id: &str, route: &str, at: chrono::DateTime<chrono::Utc>| {
        json!({"vantage": vantage, "id": id, "route": route, "kind": "probe",
               "started_at": at, "success": true, "total_ms": 100.0})
    };
    let body = json!([
        item("bj", "bj-1", ROUTE, now),
        item("nowhere", "x-1", ROUTE, now),
        item("bj", "bj-2", "deepseek/cn/deepseek-chat", now),
        item("bj", "bj-3", ROUTE, now + chrono::Duration::minutes(6)),
        item("bj", "bj-1", ROUTE, now),
        item("bj", "bj-4", ROUTE, now + chrono::Duration::minutes(4)),
    ]);
    let post = |body: Value| {
        http()
            .post(format!("{base}/api/v1/ingest"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
    };
    let r = post(body).await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["accepted"], 2, "{v:#}");
    assert_eq!(v["duplicates"], 1, "{v:#}");
    let rejected: Vec<(u64, &str)> = v["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["index"].as_u64().unwrap(), r["code"].as_str().unwrap()))
        .collect();
    assert_eq!(
        rejected,
        [
            (1, "unknown_vantage"),
            (2, "route_not_assigned"),
            (3, "future_timestamp")
        ],
        "{v:#}"
    );
    // Sent again whole (an answer lost): nothing new.
    let again = post(json!([
        item("bj", "bj-1", ROUTE, now),
        item("bj", "bj-4", ROUTE, now)
    ]))
    .await
    .unwrap()
    .json::<Value>()
    .await
    .unwrap();
    assert_eq!(
        (again["accepted"].as_u64(), again["duplicates"].as_u64()),
        (Some(0), Some(2))
    );
    assert_eq!(stored_ids(&db, "bj"), ["bj-1", "bj-4"]);
    // Passive items from remote proxies are answered as before.
    let passive =
        post(json!([{"route": ROUTE, "started_at": now, "success": true, "total_ms": 90.0}]))
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap();
    assert_eq!(passive["accepted"], 1, "{passive:#}");

    // Figure: ten agents pushing at once.
    let agents = 10;
    let batches = 10;
    let per = 500;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for a in 0..agents {
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            for b in 0..batches {
                let now = chrono::Utc::now();
                let items: Vec<Value> = (0..per)
                    .map(|i| {
                        json!({"vantage": "bj", "id": format!("load-{a}-{b}-{i}"), "route": ROUTE,
                               "kind": "probe", "started_at": now, "success": true, "total_ms": 100.0})
                    })
                    .collect();
                let r = http()
                    .post(format!("{base}/api/v1/ingest"))
                    .bearer_auth(TOKEN)
                    .json(&items)
                    .send()
                    .await
                    .unwrap();
                let status = r.status();
                let body = r.text().await.unwrap();
                assert_eq!(status, 200, "{body}");
                let v: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(v["accepted"], per, "{v}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let took = t0.elapsed().as_secs_f64();
    let n = agents * batches * per;
    eprintln!(
        "figure: ingest of {n} outcomes from {agents} concurrent agents in {took:.2} s = {:.0} outcomes/s",
        n as f64 / took
    );
    assert_eq!(stored_ids(&db, "bj").len(), n + 2);
}
