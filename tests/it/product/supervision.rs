//! No task dies quietly: a long-lived task of `probeok serve`, `probeok agent` or `probeok
//! proxy` that panics
//! stops the process with a non-zero code, its name and the panic message in the log, so a
//! service manager restarts it. The panic is injected with the debug builds' hook
//! (`PROBEOK_FAULT_PANIC=<task>`) into the real binary.

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

fn config(dir: &Path, upstream: &str) -> std::path::PathBuf {
    let path = dir.join("probeok.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[server]
listen = "127.0.0.1:{port}"

[storage]
path = "{db}"

[proxy]
listen = "127.0.0.1:{proxy_port}"

[probe]
interval = "1s"
jitter = 0.0

[[provider]]
id = "qwen"
kind = "openai"
api_key_env = "T_SUPERVISE_KEY"
  [[provider.region]]
  id = "cn"
  base_url = "{upstream}/v1"

[[route]]
provider = "qwen"
region = "cn"
model = "qwen-max"
serves = "chat"

[[vantage]]
id = "edge"
routes = ["qwen/*"]
"#,
            port = common::free_port(),
            proxy_port = common::free_port(),
            db = dir.join("monitor.db").display(),
        ),
    )
    .unwrap();
    path
}

/// Runs the binary with `args` and a fault injected into `task`; its exit code and stderr.
async fn run_with_fault(args: &[&str], config: &Path, task: &str) -> (Option<i32>, String) {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_probeok"))
        .args(args)
        .arg("--config")
        .arg(config)
        .env("T_SUPERVISE_KEY", "sk-test")
        .env("PROBEOK_INGEST_TOKEN", "t")
        .env("PROBEOK_FAULT_PANIC", task)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{args:?} with {task} panicking did not exit within 60 s"))
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_task_stops_serve_agent_and_proxy_with_a_non_zero_code_and_its_name_logged() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = common::probe_ok_unless(Default::default()).await;
    let cfg = config(dir.path(), &upstream.base_url());

    for task in ["detection", "scheduler", "web"] {
        let (code, log) = run_with_fault(&["serve"], &cfg, task).await;
        assert!(
            code.is_some_and(|c| c != 0),
            "serve with {task} panicking exited {code:?}:\n{log}"
        );
        assert!(
            log.contains("a supervised task failed")
                && log.contains(&format!("fault injected into {task}")),
            "the log names {task} and the panic:\n{log}"
        );
    }

    let data = dir.path().join("agent.db");
    let (code, log) = run_with_fault(
        &[
            "agent",
            "--vantage",
            "edge",
            "--server",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--data",
            data.to_str().unwrap(),
        ],
        &cfg,
        "agent_pusher",
    )
    .await;
    assert!(
        code.is_some_and(|c| c != 0),
        "agent exited {code:?}:\n{log}"
    );
    assert!(
        log.contains("a supervised task failed")
            && log.contains("fault injected into agent_pusher"),
        "{log}"
    );

    for task in ["proxy", "budget"] {
        let (code, log) = run_with_fault(&["proxy"], &cfg, task).await;
        assert_eq!(code, Some(2), "proxy with {task} panicking:\n{log}");
        assert!(
            log.contains("a supervised task failed")
                && log.contains(&format!("fault injected into {task}")),
            "the log names {task} and the panic:\n{log}"
        );
    }
}
