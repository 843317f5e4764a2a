//! The binary as a user runs it: exit codes, one clear line per error, `probe --json` output.

use std::process::Command;

use probeok::sim::{self, Scenario, SimConfig};
use tokio_util::sync::CancellationToken;

fn probeok() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_probeok"));
    cmd.env_remove("PROBEOK_CONFIG").env("RUST_LOG", "warn");
    cmd
}

fn write(dir: &tempfile::TempDir, name: &str, body: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, body).unwrap();
    path
}

fn route_toml(base_url: &str) -> String {
    format!(
        r#"
[[provider]]
id = "sim"
kind = "openai"
api_key_env = "PROBEOK_TEST_UNSET_KEY"
  [[provider.region]]
  id = "r1"
  base_url = "{base_url}"

[[route]]
provider = "sim"
region = "r1"
model = "sim-large"
serves = "chat"
tier = "primary"
weight = 100
"#
    )
}

#[test]
fn check_config_prints_routes_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "ok.toml", &route_toml("http://127.0.0.1:1/v1"));
    let out = probeok()
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("sim/r1/sim-large"), "{stdout}");
    assert!(stdout.contains("1 route(s)"), "{stdout}");
    // The unset key is a warning for check-config, naming the variable only.
    assert!(stderr.contains("warning:"), "{stderr}");
    assert!(stderr.contains("PROBEOK_TEST_UNSET_KEY"), "{stderr}");
}

#[test]
fn check_config_reports_located_errors_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let body = route_toml("http://127.0.0.1:1/v1")
        .replace("provider = \"sim\"\nregion", "provider = \"smi\"\nregion");
    let path = write(&dir, "bad.toml", &body);
    let out = probeok()
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("route[0].provider"))
        .unwrap_or_else(|| panic!("no located error in {stderr}"));
    assert!(line.starts_with(&format!("{}:", path.display())), "{line}");
    assert!(line.contains("unknown provider \"smi\""), "{line}");
}

#[test]
fn serve_refuses_to_start_without_its_api_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "ok.toml", &route_toml("http://127.0.0.1:1/v1"));
    let out = probeok()
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("PROBEOK_TEST_UNSET_KEY"), "{stderr}");
}

fn open_proxy_toml(extra: &str) -> String {
    format!(
        "[proxy]\nenabled = true\nlisten = \"0.0.0.0:0\"\nclient_keys_env = \"PROBEOK_TEST_OPEN_PROXY_KEYS\"\n{extra}\n{}",
        route_toml("http://127.0.0.1:1/v1")
    )
}

#[test]
fn a_keyless_proxy_on_a_public_address_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let open = write(&dir, "open.toml", &open_proxy_toml(""));
    let check = |path: &std::path::Path, keys: Option<&str>| {
        let mut cmd = probeok();
        cmd.args(["check-config", "--config"]).arg(path);
        match keys {
            Some(k) => cmd.env("PROBEOK_TEST_OPEN_PROXY_KEYS", k),
            None => cmd.env_remove("PROBEOK_TEST_OPEN_PROXY_KEYS"),
        };
        cmd.output().unwrap()
    };
    let out = check(&open, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("proxy.listen"))
        .unwrap_or_else(|| panic!("no located refusal in {stderr}"));
    assert!(line.starts_with(&format!("{}:", open.display())), "{line}");
    assert!(line.contains("allow_unauthenticated"), "{line}");
    assert!(line.contains("PROBEOK_TEST_OPEN_PROXY_KEYS"), "{line}");
    // Blank keys are no keys.
    assert_eq!(check(&open, Some(" , ")).status.code(), Some(1));
    // With client keys it is fine.
    let out = check(&open, Some("client-a"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Allowed explicitly: accepted, with a warning.
    let allowed = write(
        &dir,
        "allowed.toml",
        &open_proxy_toml("allow_unauthenticated = true"),
    );
    let out = check(&allowed, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("warning:") && l.contains("answers anyone")),
        "{stderr}"
    );

    // serve refuses it too, before it listens anywhere.
    let out = probeok()
        .args(["serve", "--config"])
        .arg(&open)
        .env("PROBEOK_TEST_UNSET_KEY", "sk-test")
        .env_remove("PROBEOK_TEST_OPEN_PROXY_KEYS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("allow_unauthenticated"), "{stderr}");
}

#[test]
fn bad_arguments_exit_1_and_help_exits_0() {
    let out = probeok().arg("no-such-command").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let out = probeok()
        .args(["simulate", "--scenario", "meteor"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown scenario \"meteor\""));
    let out = probeok().arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_json_prints_one_object_per_route() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(sim::serve(
        listener,
        SimConfig::standalone(Scenario::Healthy),
        shutdown.clone(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "sim.toml",
        &route_toml(&sim::base_url(addr, "sim", "r1"))
            .replace("api_key_env = \"PROBEOK_TEST_UNSET_KEY\"\n", ""),
    );
    let out = tokio::task::spawn_blocking(move || {
        probeok()
            .args(["probe", "--json", "--config"])
            .arg(&path)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    shutdown.cancel();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    for key in [
        "route",
        "provider",
        "region",
        "model",
        "success",
        "verified",
        "ttfb_ms",
        "ttft_ms",
        "total_ms",
        "output_tokens",
        "tokens_per_second",
        "model_reported",
        "error",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {v}");
    }
    assert_eq!(v["route"], "sim/r1/sim-large");
    assert_eq!(v["success"], true, "{v}");
    assert_eq!(v["verified"], true, "{v}");
    assert!(v["error"].is_null());
    let (ttfb, ttft, total) = (
        v["ttfb_ms"].as_f64().unwrap(),
        v["ttft_ms"].as_f64().unwrap(),
        v["total_ms"].as_f64().unwrap(),
    );
    assert!(ttfb <= ttft && ttft <= total, "{v}");
}

/// The cost table against a hand computation (in `probe::cost`'s unit test): the default probe
/// at 30 s, a throughput probe every 5 min and confirmations at 3% make 4,224,096 tokens a
/// month, ¥23.63 at ¥2 / ¥8 per million input / output tokens.
#[test]
fn check_config_prints_the_probe_cost_per_route_and_in_total() {
    let dir = tempfile::tempdir().unwrap();
    let mut toml = route_toml("http://127.0.0.1:1/v1");
    toml.push_str("price = { input_per_mtok = 2.0, output_per_mtok = 8.0, currency = \"CNY\" }\n");
    toml.push_str(
        "\n[[route]]\nprovider = \"sim\"\nregion = \"r1\"\nmodel = \"sim-small\"\nserves = \"chat\"\n\
         tier = \"backup\"\nweight = 100\n",
    );
    let path = write(&dir, "cost.toml", &toml);
    let out = probeok()
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("probe cost per month"), "{stdout}");
    assert!(stdout.contains("confirmation probes at 3%"), "{stdout}");
    let table = stdout
        .split("probe cost per month")
        .nth(1)
        .unwrap_or_default();
    let line = |id: &str| {
        table
            .lines()
            .find(|l| l.trim_start().starts_with(id))
            .unwrap_or_else(|| panic!("no cost line for {id}: {stdout}"))
            .to_owned()
    };
    let large = line("sim/r1/sim-large ");
    let cols: Vec<&str> = large.split_whitespace().collect();
    // probes + throughput + confirmations, probe tokens, throughput, confirm, capabilities
    // (none declared), long prompt (off), sets, total, cost
    assert_eq!(
        cols[1..],
        ["97632", "2851200", "1287360", "85536", "0", "0", "0", "4224096", "23.63", "CNY"],
        "{large}"
    );
    assert!(line("sim/r1/sim-small ").contains("no price"), "{stdout}");
    assert!(
        stdout.contains("total: 8448192 tokens, 23.63 CNY per month"),
        "{stdout}"
    );
}

/// `probeok check-config … | head`: a reader that closes the pipe early ends the command
/// quietly with success (as `grep` does), never with a panic and a backtrace.
#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let mut body = route_toml("http://127.0.0.1:1/v1");
    // Enough routes that the report is far larger than a pipe's buffer (64 KiB on Linux).
    for i in 0..3000 {
        body.push_str(&format!(
            "\n[[route]]\nprovider = \"sim\"\nregion = \"r1\"\nmodel = \"model-with-a-long-name-{i:05}\"\nserves = \"chat\"\ntier = \"backup\"\n"
        ));
    }
    let path = write(&dir, "big.toml", &body);
    let mut child = probeok()
        .args(["check-config", "--config"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 64];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout); // `head` is done: the pipe closes.
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert_eq!(status.code(), Some(0), "{stderr}");
}
