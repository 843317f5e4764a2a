//! The hops the streaming bench puts between its clients and its upstream, each its own
//! process: `probeok proxy`, an nginx hop, and the gateways users choose between (Portkey's,
//! LiteLLM's), each pointed at the upstream the way its own documentation says. Starting one
//! waits (bounded) for it to listen; dropping one stops it (bounded too).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A hop's process and how a client reaches it.
pub struct Hop {
    pub name: &'static str,
    pub url: String,
    /// Headers every request to it carries.
    pub headers: Vec<(String, String)>,
    child: Child,
}

impl Hop {
    /// The process and its descendants (nginx's workers; whatever a gateway forks).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.child.id()];
        let mut i = 0;
        while i < pids.len() {
            pids.extend(children_of(pids[i]));
            i += 1;
        }
        pids
    }
}

impl Drop for Hop {
    /// SIGTERM first (nginx's master then stops its workers, which SIGKILL would leave
    /// running); a hop still there after 10 s, waiting on connections, is killed with all
    /// its descendants so that a stalled gateway cannot hang the bench.
    fn drop(&mut self) {
        let pids = self.pids();
        signal(&pids[..1], libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        signal(&pids, libc::SIGKILL);
        let _ = self.child.wait();
    }
}

fn signal(pids: &[u32], sig: libc::c_int) {
    for p in pids {
        if let Ok(pid) = libc::pid_t::try_from(*p) {
            // SAFETY: kill has no memory preconditions; the pids are our child and its own.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                let rest = &s[s.rfind(')').map_or(0, |i| i + 2)..];
                rest.split_whitespace().nth(1) == Some(&pid.to_string())
            })
        })
        .collect()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// Waits for `child` to listen on `port`, at most `limit`; an error names the log to read.
async fn listening(
    name: &'static str,
    mut child: Child,
    port: u16,
    limit: Duration,
    log: &Path,
) -> Result<Hop, String> {
    let deadline = Instant::now() + limit;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(Hop {
                name,
                url: format!("http://127.0.0.1:{port}/v1/chat/completions"),
                headers: Vec::new(),
                child,
            });
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{name} exited ({status}); see {}", log.display()));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{name} did not listen within {} s; see {}",
                limit.as_secs(),
                log.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn spawn(cmd: &mut Command, log: &Path) -> Result<Child, String> {
    let out = std::fs::File::create(log).map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .spawn()
        .map_err(|e| format!("{}: {e}", cmd.get_program().to_string_lossy()))
}

pub async fn probeok(
    bin: &Path,
    dir: &Path,
    up: std::net::SocketAddr,
    n: usize,
    workers: Option<usize>,
    name: &'static str,
) -> Result<Hop, String> {
    let port = free_port();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{web}\"\n[storage]\npath = \"{db}\"\n\
         [proxy]\nlisten = \"127.0.0.1:{port}\"\nmax_connections = {conns}\n{workers}\
         [[provider]]\nid = \"bench\"\n  [[provider.region]]\n  id = \"local\"\n  base_url = \"http://{up}/v1\"\n\
         [[route]]\nprovider = \"bench\"\nregion = \"local\"\nmodel = \"m\"\nserves = \"bench\"\n",
        web = free_port(),
        db = dir.join("probeok.db").display(),
        conns = n + 256,
        workers = workers.map_or(String::new(), |w| format!("workers = {w}\n")),
    );
    let path = dir.join("probeok.toml");
    std::fs::write(&path, config).map_err(|e| e.to_string())?;
    let log = dir.join("probeok.log");
    let child = spawn(
        Command::new(bin)
            .args(["proxy", "--config"])
            .arg(&path)
            .env("RUST_LOG", "warn"),
        &log,
    )?;
    listening(name, child, port, Duration::from_secs(30), &log).await
}

pub async fn nginx(
    nginx: &Path,
    dir: &Path,
    up: std::net::SocketAddr,
    n: usize,
) -> Result<Hop, String> {
    let port = free_port();
    let d = dir.join("nginx");
    std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
    let conns = 2 * n + 1024;
    let conf = format!(
        "worker_processes 1;\nworker_rlimit_nofile {files};\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
         events {{ worker_connections {conns}; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
           upstream up {{ server {up}; keepalive 256; }}\n\
           server {{\n    listen 127.0.0.1:{port} backlog=8192;\n    location / {{\n      proxy_pass http://up;\n\
               proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
               proxy_read_timeout 300s;\n    }}\n  }}\n}}\n",
        files = conns + 1024,
        d = d.display(),
    );
    let path = d.join("nginx.conf");
    std::fs::write(&path, conf).map_err(|e| e.to_string())?;
    let log = d.join("stderr");
    let child = spawn(
        Command::new(nginx)
            .arg("-p")
            .arg(&d)
            .arg("-c")
            .arg(&path)
            .args(["-g", "daemon off;"]),
        &log,
    )?;
    listening("nginx", child, port, Duration::from_secs(30), &log).await
}

/// Portkey's gateway (`node build/start-server.js`), headless, in production mode. It is told
/// where the upstream is per request, by its documented `x-portkey-provider` and
/// `x-portkey-custom-host` headers.
pub async fn portkey(js: &Path, dir: &Path, up: std::net::SocketAddr) -> Result<Hop, String> {
    let port = free_port();
    let log = dir.join("portkey.log");
    let child = spawn(
        Command::new("node")
            .arg(js)
            .arg(format!("--port={port}"))
            .arg("--headless")
            .env("NODE_ENV", "production"),
        &log,
    )?;
    let mut hop = listening("Portkey", child, port, Duration::from_secs(60), &log).await?;
    hop.headers = vec![
        ("x-portkey-provider".into(), "openai".into()),
        ("x-portkey-custom-host".into(), format!("http://{up}/v1")),
        ("authorization".into(), "Bearer sk-bench".into()),
    ];
    Ok(hop)
}

/// LiteLLM's proxy (`litellm --config`): the bench's model name mapped to an `openai/`
/// model at the upstream's `api_base`, one worker and no database (as `scripts/bench-peers`
/// runs it), a master key because it refuses to start without one, and its bundled model
/// cost map so that nothing reaches the network.
pub async fn litellm(bin: &Path, dir: &Path, up: std::net::SocketAddr) -> Result<Hop, String> {
    let port = free_port();
    let key = format!("sk-bench-{:x}", rand::random::<u128>());
    let config = format!(
        "model_list:\n  - model_name: bench\n    litellm_params:\n      model: openai/m\n      \
         api_base: http://{up}/v1\n      api_key: sk-bench\n\
         litellm_settings:\n  telemetry: false\n\
         general_settings:\n  master_key: {key}\n"
    );
    let path = dir.join("litellm.yaml");
    std::fs::write(&path, config).map_err(|e| e.to_string())?;
    let log = dir.join("litellm.log");
    let child = spawn(
        Command::new(bin)
            .arg("--config")
            .arg(&path)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--num_workers", "1"])
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .env("LITELLM_LOG", "ERROR"),
        &log,
    )?;
    // Its start imports a large Python tree: slow on a busy machine.
    let mut hop = listening("LiteLLM", child, port, Duration::from_secs(180), &log).await?;
    hop.headers = vec![("authorization".into(), format!("Bearer {key}"))];
    Ok(hop)
}
