//! An incident tool closes what it opened even when the monitor dies in between: `probeok
//! serve` (a separate process) triggers PagerDuty and opens an Opsgenie alert for a failing
//! route, is killed with SIGKILL, and the monitor started again on the same database resolves
//! and closes them under the keys it triggered with, read from the stored outbox rows.

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::oncall::{self, Fake, Service};

fn config(port: u16, db: &Path, upstream: &str, pd: &str, og: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"

[storage]
path = "{db}"

[probe]
interval = "300ms"
timeout = "250ms"
first_byte_timeout = "200ms"
throughput_every = "1h"
jitter = 0.0

[detection]
min_samples = 3
degraded_after = 2
recover_after = "1s"
error_window = "10s"

[alerting]
group_wait = "0s"

[[alert.pagerduty]]
routing_key_env = "T_PD_KEY"
api_base = "{pd}"

[[alert.opsgenie]]
api_key_env = "T_OG_KEY"
api_base = "{og}"

[[provider]]
id = "qwen"
kind = "openai"
api_key_env = "T_KILL_KEY"
  [[provider.region]]
  id = "cn"
  base_url = "{upstream}/v1"

[[route]]
provider = "qwen"
region = "cn"
model = "qwen-max"
serves = "chat"
"#,
        db = db.display(),
    )
}

fn serve(config: &Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_probeok"))
        .arg("serve")
        .arg("--config")
        .arg(config)
        .env("T_KILL_KEY", "sk-test")
        .env("T_PD_KEY", oncall::PD_ROUTING_KEY)
        .env("T_OG_KEY", oncall::OPSGENIE_KEY)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Waits until `fake` has received what `ok` asks of its requests, or panics after `within`.
async fn until(fake: &Fake, within: Duration, what: &str, ok: impl Fn(&[oncall::Got]) -> bool) {
    let deadline = Instant::now() + within;
    loop {
        let got = fake.got();
        if ok(&got) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; got {:#?}",
            got.iter().map(|g| (&g.path, &g.body)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn pd_actions(got: &[oncall::Got], action: &str) -> Vec<String> {
    got.iter()
        .filter(|g| g.body["event_action"] == action)
        .map(|g| g.body["dedup_key"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_killed_between_trigger_and_resolve_resolves_under_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let failing = Arc::new(AtomicBool::new(true));
    let upstream = common::probe_ok_unless(failing.clone()).await;
    let pd = Fake::new(Service::PagerDuty);
    let og = Fake::new(Service::Opsgenie);
    let (pd_addr, _pd) = oncall::serve(pd.clone()).await;
    let (og_addr, _og) = oncall::serve(og.clone()).await;
    let path = dir.path().join("monitor.toml");
    std::fs::write(
        &path,
        config(
            common::free_port(),
            &dir.path().join("monitor.db"),
            &upstream.base_url(),
            &format!("http://{pd_addr}"),
            &format!("http://{og_addr}"),
        ),
    )
    .unwrap();

    let mut first = serve(&path);
    until(&pd, Duration::from_secs(60), "a PagerDuty trigger", |g| {
        !pd_actions(g, "trigger").is_empty()
    })
    .await;
    until(&og, Duration::from_secs(30), "an Opsgenie alert", |g| {
        g.iter().any(|g| g.path == "/v2/alerts")
    })
    .await;
    first.start_kill().unwrap();
    let status = first.wait().await.unwrap();
    assert_eq!(status.code(), None, "killed by a signal, not an exit");

    // The provider heals while nothing watches it; the monitor comes back on its database.
    failing.store(false, Ordering::SeqCst);
    let _second = serve(&path);
    until(&pd, Duration::from_secs(60), "a PagerDuty resolve", |g| {
        !pd_actions(g, "resolve").is_empty()
    })
    .await;
    until(&og, Duration::from_secs(30), "an Opsgenie close", |g| {
        g.iter().any(|g| g.path.ends_with("/close"))
    })
    .await;

    let got = pd.got();
    let triggers = pd_actions(&got, "trigger");
    let resolves = pd_actions(&got, "resolve");
    // A trigger the killed process sent but had not yet marked sent may go again after the
    // restart: under the same key, which PagerDuty deduplicates.
    assert!(
        triggers.iter().all(|k| *k == triggers[0]),
        "one incident key: {triggers:?}"
    );
    assert_eq!(
        resolves,
        vec![triggers[0].clone()],
        "resolved under it, once"
    );
    assert!(pd.malformed().is_empty(), "{:?}", pd.malformed());

    let got = og.got();
    let aliases: Vec<&str> = got
        .iter()
        .filter(|g| g.path == "/v2/alerts")
        .map(|g| g.body["alias"].as_str().unwrap())
        .collect();
    assert!(aliases.iter().all(|a| *a == aliases[0]), "{aliases:?}");
    let closes: Vec<&str> = got
        .iter()
        .filter(|g| g.path.ends_with("/close"))
        .map(|g| g.path.as_str())
        .collect();
    assert_eq!(closes, vec![format!("/v2/alerts/{}/close", aliases[0])]);
    assert!(og.malformed().is_empty(), "{:?}", og.malformed());
}
