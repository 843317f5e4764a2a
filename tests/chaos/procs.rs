//! The fleet as separate processes: two monitors (`probeok serve`) sharing one PostgreSQL
//! database and its lease, two agents (`probeok agent`) pushing to them, three proxies
//! (`probeok proxy --weights-from`) on the same database. Every process probes or forwards
//! through the tap under a path of its own. Logs are appended across restarts, so a panic
//! anywhere in the run stays in them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const LEASE_S: u64 = 3;
pub const DB_VAR: &str = "CHAOS_DATABASE_URL";
pub const ADMIN_TOKEN: &str = "chaos-admin";
pub const INGEST_TOKEN: &str = "chaos-ingest";
pub const CLIENT_KEY: &str = "chaos-client";
pub const TEAM_KEY: &str = "chaos-team";
/// The spend-limited client's limit per day, in the routes' currency.
pub const TEAM_LIMIT: f64 = 0.01;
pub const AGENTS: [&str; 2] = ["ax", "ay"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Monitor,
    Agent,
    Proxy,
}

pub struct Proc {
    pub name: String,
    pub kind: Kind,
    /// The process's own listener (the monitor's server, the agent's metrics, the proxy).
    pub base: String,
    pub log: PathBuf,
    /// An agent's outbox file.
    pub data: Option<PathBuf>,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    child: Option<Child>,
    pub stopped: bool,
}

impl Proc {
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_probeok"));
        cmd.args(&self.args)
            .env_remove("PROBEOK_CONFIG")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("start probeok"));
        self.stopped = false;
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            self.cont();
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on our own child's pid; no memory is touched.
            unsafe {
                libc::kill(c.id() as libc::pid_t, sig);
            }
        }
    }

    pub fn stop(&mut self) {
        self.signal(libc::SIGSTOP);
        self.stopped = true;
    }

    pub fn cont(&mut self) {
        if self.stopped {
            self.signal(libc::SIGCONT);
            self.stopped = false;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The config every process reads; `who` names its path through the tap.
fn config(dir: &Path, who: &str, listen: u16, tap: SocketAddr, proxy: Option<u16>) -> PathBuf {
    let path = dir.join(format!("{who}.toml"));
    let vantages: String = AGENTS
        .iter()
        .map(|a| format!("[[vantage]]\nid = \"{a}\"\nstale_after = \"15s\"\n"))
        .collect();
    let proxy = match proxy {
        Some(port) => format!(
            r#"
[proxy]
listen = "127.0.0.1:{port}"
client_keys_env = "CHAOS_CLIENT_KEYS"
first_byte_timeout = "2s"
total_timeout = "20s"

[[proxy.client]]
id = "team"
key_env = "CHAOS_TEAM_KEY"
limit = {{ amount = {TEAM_LIMIT}, per = "day" }}
"#
        ),
        None => String::new(),
    };
    let routes: String = ["r1", "r2"]
        .iter()
        .flat_map(|region| {
            ["sim-large", "sim-small"].map(|model| {
                format!(
                    "[[route]]\nprovider = \"sim\"\nregion = \"{region}\"\nmodel = \"{model}\"\nserves = \"chat\"\nweight = 100\nprice = {{ input_per_mtok = 2.0, output_per_mtok = 8.0, currency = \"CNY\" }}\n"
                )
            })
        })
        .collect();
    std::fs::create_dir_all(dir.join("no-sets")).unwrap();
    let body = format!(
        r#"
[server]
listen = "127.0.0.1:{listen}"

[storage]
path = "{db}"
url_env = "{DB_VAR}"

[cluster]
lease = "{LEASE_S}s"

[probe]
interval = "2s"
timeout = "1900ms"
first_byte_timeout = "1500ms"
throughput_every = "1h"

[detection]
recover_after = "10s"

[drift]
sets = "{sets}"

{vantages}
[[alert.webhook]]
url_env = "CHAOS_WEBHOOK_URL"
lang = "en"
{proxy}
[[provider]]
id = "sim"
kind = "openai"
api_key_env = "CHAOS_PROVIDER_KEY"
  [[provider.region]]
  id = "r1"
  base_url = "http://{tap}/{who}/sim/r1/v1"
  [[provider.region]]
  id = "r2"
  base_url = "http://{tap}/{who}/sim/r2/v1"

{routes}"#,
        db = dir.join(format!("{who}.db")).display(),
        sets = dir.join("no-sets").display(),
    );
    std::fs::write(&path, body).unwrap();
    path
}

/// The seven processes, not started yet.
pub fn fleet(dir: &Path, db_url: &str, tap: SocketAddr, webhook: &str) -> Vec<Proc> {
    let envs = vec![
        (DB_VAR.to_owned(), db_url.to_owned()),
        ("CHAOS_WEBHOOK_URL".to_owned(), webhook.to_owned()),
        ("CHAOS_PROVIDER_KEY".to_owned(), "sk-chaos".to_owned()),
        ("CHAOS_CLIENT_KEYS".to_owned(), CLIENT_KEY.to_owned()),
        ("CHAOS_TEAM_KEY".to_owned(), TEAM_KEY.to_owned()),
        ("PROBEOK_ADMIN_TOKEN".to_owned(), ADMIN_TOKEN.to_owned()),
        ("PROBEOK_INGEST_TOKEN".to_owned(), INGEST_TOKEN.to_owned()),
    ];
    let proc = |name: &str, kind, port: u16, args: Vec<String>, data: Option<PathBuf>| Proc {
        name: name.to_owned(),
        kind,
        base: format!("http://127.0.0.1:{port}"),
        log: dir.join(format!("{name}.log")),
        data,
        args,
        envs: envs.clone(),
        child: None,
        stopped: false,
    };
    let mut out = Vec::new();
    let mut monitors = Vec::new();
    for name in ["ma", "mb"] {
        let port = free_port();
        let cfg = config(dir, name, port, tap, None);
        monitors.push(format!("http://127.0.0.1:{port}"));
        let args = vec!["serve".into(), "--config".into(), cfg.display().to_string()];
        out.push(proc(name, Kind::Monitor, port, args, None));
    }
    for (i, name) in AGENTS.iter().enumerate() {
        let port = free_port();
        let cfg = config(dir, name, free_port(), tap, None);
        let data = dir.join(format!("{name}-outbox.db"));
        let args = vec![
            "agent".into(),
            "--config".into(),
            cfg.display().to_string(),
            "--vantage".into(),
            (*name).into(),
            "--server".into(),
            monitors[i].clone(),
            "--data".into(),
            data.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
        ];
        out.push(proc(name, Kind::Agent, port, args, Some(data)));
    }
    for (i, name) in ["p1", "p2", "p3"].iter().enumerate() {
        let port = free_port();
        let cfg = config(dir, name, free_port(), tap, Some(port));
        let args = vec![
            "proxy".into(),
            "--config".into(),
            cfg.display().to_string(),
            "--weights-from".into(),
            monitors[i % 2].clone(),
        ];
        out.push(proc(name, Kind::Proxy, port, args, None));
    }
    out
}

/// Waits until the process answers HTTP on its listener (any status).
pub async fn until_up(http: &reqwest::Client, p: &Proc, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    let path = match p.kind {
        Kind::Agent => "/metrics",
        Kind::Proxy => "/readyz",
        Kind::Monitor => "/healthz",
    };
    loop {
        if http.get(format!("{}{path}", p.base)).send().await.is_ok() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} did not answer within {within:?}:\n{}",
            p.name,
            p.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
