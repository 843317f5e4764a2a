//! Many long streams at once through the proxy: a fake OpenAI-compatible upstream streams SSE
//! chunks at a steady rate (20 a second for 30 s by default), and N clients (5,000 by default)
//! hold one stream each — straight to the upstream (the baseline), through `probeok proxy`
//! (its own process, SQLite metering on, as deployed), through an nginx hop with
//! `proxy_buffering off` when nginx is there, and through Portkey's gateway and LiteLLM's
//! proxy when named (`--portkey`, `--litellm`). Per column: the hop's RSS per open stream (its
//! peak RSS over the run less its idle RSS, over N), its CPU per chunk forwarded (user +
//! system time over the chunks the clients received: over the whole run, each stream's start
//! and end included, and while every stream is open), the time to the first
//! chunk and each chunk's transit time (upstream write → client read: what the hop adds to
//! the gaps between chunks) as p50/p99/max with the hop's addition over the baseline, and
//! streams lost (anything but every chunk and `[DONE]`).
//!
//! `--streams` may list several levels (`100,500,1000`): each is run in turn, every hop
//! started afresh for it, and a hop that does not hold a level (a stream lost, or its added
//! time to first chunk p99 or added transit p99 over `--hold-ms`, 1,000 by default) is not run
//! at the levels after it; a last table shows each hop at the highest level it held.
//! `--workers 1,2` runs one probeok column per `[proxy] workers` count (by default one, with
//! the default count). One level: the exit code says whether
//! a stream was lost; several: whether the baseline lost one.
//!
//! The upstream and the clients share this process (each chunk carries its send time, read
//! on the same clock); the machine is shared with the hop, so on few cores the figures
//! include the load generator's contention. The soft RLIMIT_NOFILE is raised to the hard one.
//! Every stream is bounded (its whole run plus 60 s), and so are a hop's start and stop.
//!
//! `scripts/bench-streams` installs nginx if missing (and the gateways with `--peers`) and
//! runs this; by hand: `cargo bench --bench streams -- [--streams N[,N...]] [--rate R]
//! [--secs S] [--ramp S] [--hold-ms MS] [--workers N[,N...]] [--nginx PATH|none]
//! [--bin PROBEOK|none] [--before PROBEOK] [--portkey START_SERVER_JS] [--litellm LITELLM_BIN]`
//! (the `probeok` cargo builds with the bench unless `--bin` or `BENCH_BIN` names another;
//! `--before` adds a column for an earlier build, run first at each level).

#[path = "streams/hops.rs"]
mod hops;

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::post;
use axum::Router;

/// Every timestamp is microseconds since this.
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Content chunks every client has read so far.
static RECEIVED: AtomicU64 = AtomicU64::new(0);

fn now_us() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

#[derive(Debug, Clone)]
struct Opts {
    /// The levels of concurrency, run in turn.
    levels: Vec<usize>,
    /// Of the level being run.
    streams: usize,
    /// Chunks a second per stream.
    rate: f64,
    secs: f64,
    /// Streams are opened evenly over this many seconds.
    ramp: f64,
    /// Added time to first chunk and transit p99 (ms) a hop must stay under to hold a level.
    hold_ms: f64,
    /// probeok's `[proxy] workers`, a column each (None: its default).
    workers: Vec<Option<usize>>,
    bin: Option<PathBuf>,
    /// Another probeok binary (an earlier build), a column of its own beside `bin`'s, at its
    /// default workers (a build from before `[proxy] workers` has no such key).
    before: Option<PathBuf>,
    nginx: Option<PathBuf>,
    portkey: Option<PathBuf>,
    litellm: Option<PathBuf>,
}

impl Opts {
    fn parse() -> Self {
        let mut o = Opts {
            levels: vec![5000],
            streams: 5000,
            rate: 20.0,
            secs: 30.0,
            ramp: 5.0,
            hold_ms: 1000.0,
            workers: vec![None],
            // `cargo bench` builds the binary beside the bench, optimised alike.
            bin: Some(std::env::var_os("BENCH_BIN").map_or_else(
                || PathBuf::from(env!("CARGO_BIN_EXE_probeok")),
                PathBuf::from,
            )),
            before: None,
            nginx: Some(PathBuf::from("/usr/sbin/nginx")),
            portkey: None,
            litellm: None,
        };
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut i = 0;
        while i < args.len() {
            let v = args.get(i + 1).cloned().unwrap_or_default();
            let num =
                |v: &str| -> f64 { v.parse().unwrap_or_else(|_| panic!("not a number: {v}")) };
            match args[i].as_str() {
                "--streams" => o.levels = v.split(',').map(|n| num(n) as usize).collect(),
                "--rate" => o.rate = num(&v),
                "--secs" => o.secs = num(&v),
                "--ramp" => o.ramp = num(&v),
                "--hold-ms" => o.hold_ms = num(&v),
                "--workers" => o.workers = v.split(',').map(|n| Some(num(n) as usize)).collect(),
                "--bin" => o.bin = (v != "none").then(|| PathBuf::from(v)),
                "--before" => o.before = Some(PathBuf::from(v)),
                "--portkey" => o.portkey = Some(PathBuf::from(v)),
                "--litellm" => o.litellm = Some(PathBuf::from(v)),
                "--nginx" => o.nginx = (v != "none").then(|| PathBuf::from(v)),
                // `cargo bench` adds `--bench`.
                _ => {
                    i += 1;
                    continue;
                }
            }
            i += 2;
        }
        assert!(
            !o.levels.is_empty() && o.levels.iter().all(|&n| n > 0),
            "--streams wants one or more counts above 0"
        );
        o.streams = o.levels[0];
        o
    }

    fn chunks(&self) -> usize {
        ((self.rate * self.secs).round() as usize).max(1)
    }
}

const HEAD: &str = r#"data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":"t"#;
const TAIL: &str = "\"},\"finish_reason\":null}]}\n\n";
const END: &str = concat!(
    "data: {\"id\":\"chatcmpl-b\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"chatcmpl-b\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":100,\"total_tokens\":112}}\n\n",
    "data: [DONE]\n\n",
);

/// The fake upstream: `chunks` content chunks `period` apart (on a fixed schedule: no drift),
/// each carrying its send time, then the finish, the usage and `[DONE]`.
async fn upstream(chunks: usize, period: Duration) -> std::net::SocketAddr {
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |req: Bytes| async move {
            // A warm-up stream is one chunk long.
            let chunks = if req.windows(6).any(|w| w == b"\"warm\"") {
                1
            } else {
                chunks
            };
            let start = tokio::time::Instant::now();
            let body = futures_util::stream::unfold(0usize, move |i| async move {
                if i > chunks {
                    return None;
                }
                if i == chunks {
                    return Some((
                        Ok::<_, Infallible>(Bytes::from_static(END.as_bytes())),
                        i + 1,
                    ));
                }
                tokio::time::sleep_until(start + period * i as u32).await;
                let chunk = format!("{HEAD}{:016}{TAIL}", now_us());
                Some((Ok(Bytes::from(chunk)), i + 1))
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(body))
                .expect("response")
        }),
    );
    let listener = bind().await;
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn bind() -> tokio::net::TcpListener {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_reuseaddr(true).expect("reuseaddr");
    socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
    socket.listen(8192).expect("listen")
}

/// What one stream saw.
#[derive(Default)]
struct Seen {
    /// Request sent → first chunk read, µs.
    first_us: u64,
    /// Each content chunk's transit, µs.
    transit_us: Vec<u32>,
    chunks: usize,
    done: bool,
}

async fn one_stream(
    http: reqwest::Client,
    url: String,
    headers: Arc<Vec<(String, String)>>,
    say: &str,
) -> Result<Seen, String> {
    let body = format!(
        r#"{{"model":"bench","stream":true,"messages":[{{"role":"user","content":"{say}"}}]}}"#
    );
    let sent = now_us();
    let mut req = http.post(url).header("content-type", "application/json");
    for (k, v) in headers.iter() {
        req = req.header(k, v);
    }
    let mut r = req.body(body).send().await.map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!("status {}", r.status()));
    }
    let mut seen = Seen::default();
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    while let Some(chunk) = r.chunk().await.map_err(|e| e.to_string())? {
        let at = now_us();
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event = &buf[..end];
            if event.ends_with(b"[DONE]") {
                seen.done = true;
            } else if let Some(p) = event.windows(12).position(|w| w == b"\"content\":\"t") {
                let digits = &event[p + 12..(p + 28).min(event.len())];
                let t: u64 = std::str::from_utf8(digits)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or("a chunk without its time")?;
                if seen.chunks == 0 {
                    seen.first_us = at.saturating_sub(sent);
                }
                seen.chunks += 1;
                RECEIVED.fetch_add(1, Ordering::Relaxed);
                seen.transit_us.push(at.saturating_sub(t) as u32);
            }
            buf.drain(..end + 2);
        }
    }
    Ok(seen)
}

fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// User + system CPU seconds of `pids`.
fn cpu_secs(pids: &[u32]) -> f64 {
    let ticks: u64 = (pids.iter())
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .map(|s| {
            let rest = &s[s.rfind(')').map_or(0, |i| i + 2)..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            // After the name: state is field 3 of the line; utime and stime are 14 and 15.
            f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
                + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        })
        .sum();
    ticks as f64 / ticks_per_sec()
}

/// Resident set size of `pids` together, bytes.
fn rss(pids: &[u32]) -> u64 {
    (pids.iter())
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .filter_map(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?.to_owned();
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .sum()
}

/// One column's figures.
#[derive(Clone)]
struct Column {
    name: &'static str,
    /// Its heading.
    label: String,
    rss_per_stream: Option<f64>,
    cpu_per_chunk_us: Option<f64>,
    /// While every stream is open: chunks only, no stream's start or end.
    steady_cpu_per_chunk_us: Option<f64>,
    first_ms: [f64; 3],
    transit_ms: [f64; 3],
    lost: usize,
    chunks: u64,
    first_error: Option<String>,
}

impl Column {
    /// A hop that could not be measured: every stream counts as lost.
    fn failed(name: &'static str, opts: &Opts, why: String) -> Self {
        Column {
            name,
            label: name.to_owned(),
            rss_per_stream: None,
            cpu_per_chunk_us: None,
            steady_cpu_per_chunk_us: None,
            first_ms: [f64::NAN; 3],
            transit_ms: [f64::NAN; 3],
            lost: opts.streams,
            chunks: 0,
            first_error: Some(why),
        }
    }

    /// No stream lost, and time to first chunk p99 and transit p99 each less than `hold_ms`
    /// over the baseline's.
    fn holds(&self, base: &Column, hold_ms: f64) -> bool {
        self.lost == 0
            && self.first_ms[1] - base.first_ms[1] < hold_ms
            && self.transit_ms[1] - base.transit_ms[1] < hold_ms
    }
}

fn pct(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

fn summary(mut v: Vec<u32>) -> [f64; 3] {
    v.sort_unstable();
    [
        pct(&v, 0.5),
        pct(&v, 0.99),
        v.last().map_or(f64::NAN, |m| f64::from(*m) / 1000.0),
    ]
}

/// N streams to `url` (or to the hop's), opened evenly over the ramp; the hop's processes
/// measured meanwhile.
async fn run(opts: &Opts, url: &str, hop: Option<&hops::Hop>) -> Column {
    let name = hop.map_or("direct", |h| h.name);
    let url = hop.map_or(url, |h| &h.url).to_owned();
    let headers = Arc::new(hop.map(|h| h.headers.clone()).unwrap_or_default());
    // Bounded, so that a hop that stalls loses its streams instead of holding the bench.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .connect_timeout(Duration::from_secs(30))
        .timeout(Duration::from_secs_f64(opts.secs + opts.ramp + 60.0))
        .build()
        .expect("client");
    // One stream first, so that the idle figure is of a process that has served.
    if let Err(e) = one_stream(http.clone(), url.clone(), headers.clone(), "warm").await {
        return Column::failed(name, opts, format!("the warm-up stream failed: {e}"));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pids = hop.map(|h| h.pids()).unwrap_or_default();
    let pids = &pids[..];
    let idle_rss = rss(pids);
    let cpu0 = cpu_secs(pids);
    let peak = Arc::new(AtomicU64::new(idle_rss));
    let sampler = {
        let (peak, pids) = (peak.clone(), pids.to_vec());
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss(&pids), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let start = tokio::time::Instant::now();
    // The window in which every stream is open (when the streams outlast the ramp by 2 s).
    let steady = {
        let pids = pids.to_vec();
        let (from, to) = (opts.ramp + 0.5, opts.secs - 0.5);
        tokio::spawn(async move {
            if to - from < 1.0 || pids.is_empty() {
                return None;
            }
            tokio::time::sleep_until(start + Duration::from_secs_f64(from)).await;
            let (c0, n0) = (cpu_secs(&pids), RECEIVED.load(Ordering::Relaxed));
            tokio::time::sleep_until(start + Duration::from_secs_f64(to)).await;
            let (c1, n1) = (cpu_secs(&pids), RECEIVED.load(Ordering::Relaxed));
            Some((c1 - c0) * 1e6 / (n1 - n0).max(1) as f64)
        })
    };
    let gap = Duration::from_secs_f64(opts.ramp / opts.streams as f64);
    let tasks: Vec<_> = (0..opts.streams)
        .map(|i| {
            let (http, url, headers) = (http.clone(), url.clone(), headers.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(start + gap * i as u32).await;
                one_stream(http, url, headers, "hi").await
            })
        })
        .collect();
    let (mut firsts, mut transits) = (Vec::new(), Vec::new());
    let (mut lost, mut chunks, mut first_error) = (0, 0u64, None);
    for t in tasks {
        match t.await.expect("stream task") {
            Ok(s) if s.done && s.chunks == opts.chunks() => {
                firsts.push(s.first_us.min(u64::from(u32::MAX)) as u32);
                chunks += s.chunks as u64;
                transits.extend(s.transit_us);
            }
            Ok(s) => {
                lost += 1;
                chunks += s.chunks as u64;
                first_error.get_or_insert(format!(
                    "{} of {} chunks, done: {}",
                    s.chunks,
                    opts.chunks(),
                    s.done
                ));
            }
            Err(e) => {
                lost += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    sampler.abort();
    let cpu = cpu_secs(pids) - cpu0;
    let measured = !pids.is_empty();
    Column {
        name,
        label: name.to_owned(),
        rss_per_stream: measured.then(|| {
            peak.load(Ordering::Relaxed).saturating_sub(idle_rss) as f64 / opts.streams as f64
        }),
        cpu_per_chunk_us: measured.then(|| cpu * 1e6 / chunks.max(1) as f64),
        steady_cpu_per_chunk_us: steady.await.ok().flatten(),
        first_ms: summary(firsts),
        transit_ms: summary(transits),
        lost,
        chunks,
        first_error,
    }
}

/// One table: each column beside its own baseline (the direct column of its level).
fn print(title: &str, cols: &[(&Column, &Column)], notes: &[String]) {
    println!("{title}; load {}", load());
    println!(
        "| | {} |",
        (cols.iter())
            .map(|(c, _)| c.label.clone())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("| --- |{}", " --- |".repeat(cols.len()));
    let row = |label: &str, f: &dyn Fn(&Column, &Column) -> String| {
        println!(
            "| {label} | {} |",
            (cols.iter())
                .map(|(c, b)| f(c, b))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    };
    let opt = |v: Option<f64>, unit: &str, scale: f64| {
        v.map_or("—".to_owned(), |v| format!("{:.1} {unit}", v / scale))
    };
    row("RSS per open stream", &|c, _| {
        opt(c.rss_per_stream, "KiB", 1024.0)
    });
    row("CPU per chunk, whole run", &|c, _| {
        opt(c.cpu_per_chunk_us, "µs", 1.0)
    });
    row("CPU per chunk, all streams open", &|c, _| {
        opt(c.steady_cpu_per_chunk_us, "µs", 1.0)
    });
    for (i, q) in ["p50", "p99", "max"].iter().enumerate() {
        row(&format!("time to first chunk {q}"), &|c, b| {
            added(c.first_ms[i], b.first_ms[i], std::ptr::eq(c, b))
        });
    }
    for (i, q) in ["p50", "p99", "max"].iter().enumerate() {
        row(&format!("chunk transit {q}"), &|c, b| {
            added(c.transit_ms[i], b.transit_ms[i], std::ptr::eq(c, b))
        });
    }
    row("chunks received", &|c, _| c.chunks.to_string());
    row("streams lost", &|c, _| c.lost.to_string());
    for (c, _) in cols {
        if let Some(e) = &c.first_error {
            println!("{}: first lost stream: {e}", c.label);
        }
    }
    for s in notes {
        println!("{s}");
    }
    println!();
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `value (+added)` against the baseline.
fn added(v: f64, base: f64, is_base: bool) -> String {
    if v.is_nan() {
        "—".to_owned()
    } else if is_base {
        format!("{v:.2} ms")
    } else {
        format!("{v:.2} ms ({:+.2})", v - base)
    }
}

/// A hop the bench can put in front of the upstream, and where its program is.
enum Kind {
    Probeok {
        bin: PathBuf,
        workers: Option<usize>,
        name: &'static str,
    },
    Nginx(PathBuf),
    Portkey(PathBuf),
    Litellm(PathBuf),
}

impl Kind {
    fn name(&self) -> &'static str {
        match self {
            Kind::Probeok { name, .. } => name,
            Kind::Nginx(_) => "nginx",
            Kind::Portkey(_) => "Portkey",
            Kind::Litellm(_) => "LiteLLM",
        }
    }

    async fn start(
        &self,
        dir: &std::path::Path,
        up: std::net::SocketAddr,
        n: usize,
    ) -> Result<hops::Hop, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        match self {
            Kind::Probeok { bin, workers, name } => {
                hops::probeok(bin, dir, up, n, *workers, name).await
            }
            Kind::Nginx(bin) => hops::nginx(bin, dir, up, n).await,
            Kind::Portkey(js) => hops::portkey(js, dir, up).await,
            Kind::Litellm(bin) => hops::litellm(bin, dir, up).await,
        }
    }
}

fn main() {
    EPOCH.get_or_init(Instant::now);
    let opts = Opts::parse();
    let most = opts.levels.iter().copied().max().unwrap_or(0);
    match rlimit::Resource::NOFILE.get() {
        Ok((_, hard)) => {
            if let Err(e) = rlimit::Resource::NOFILE.set(hard, hard) {
                eprintln!("could not raise RLIMIT_NOFILE to {hard}: {e}");
            }
            // Each stream holds a client and an upstream descriptor here, two in the hop.
            if hard < 2 * most as u64 + 1024 {
                eprintln!("RLIMIT_NOFILE's hard limit ({hard}) is low for {most} streams");
            }
        }
        Err(e) => eprintln!("cannot read RLIMIT_NOFILE: {e}"),
    }
    let mut kinds = Vec::new();
    let mut skipped = Vec::new();
    kinds.extend(opts.before.clone().map(|bin| Kind::Probeok {
        bin,
        workers: None,
        name: "probeok, before",
    }));
    match &opts.bin {
        Some(bin) => kinds.extend(opts.workers.iter().map(|&workers| Kind::Probeok {
            bin: bin.clone(),
            workers,
            // A handful of names for the run's whole life.
            name: workers.map_or("probeok", |w| {
                Box::leak(format!("probeok, workers = {w}").into_boxed_str())
            }),
        })),
        None => skipped.push("probeok: skipped (--bin none)".to_owned()),
    }
    match opts.nginx.as_deref().filter(|p| p.exists()) {
        Some(nginx) => kinds.push(Kind::Nginx(nginx.to_owned())),
        None => skipped.push(format!(
            "nginx: skipped ({} not found; scripts/bench-streams installs it)",
            opts.nginx
                .as_deref()
                .map_or("--nginx none".into(), |p| p.display().to_string())
        )),
    }
    kinds.extend(opts.portkey.clone().map(Kind::Portkey));
    kinds.extend(opts.litellm.clone().map(Kind::Litellm));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let period = Duration::from_secs_f64(1.0 / opts.rate);
        let up = upstream(opts.chunks(), period).await;
        let direct = format!("http://{up}/v1/chat/completions");
        let several = opts.levels.len() > 1;
        // Per hop: the level at which it stopped holding, and its column (with its
        // baseline) at the highest level it held.
        let mut fell: Vec<Option<usize>> = kinds.iter().map(|_| None).collect();
        let mut best: Vec<Option<(Column, Column)>> = kinds.iter().map(|_| None).collect();
        let (mut lost, mut base_lost) = (0, 0);
        for &n in &opts.levels {
            let opts = Opts {
                streams: n,
                ..opts.clone()
            };
            let base = run(&opts, &direct, None).await;
            base_lost += base.lost;
            let mut cols = Vec::new();
            let mut notes = skipped.clone();
            for (k, kind) in kinds.iter().enumerate() {
                if let Some(at) = fell[k] {
                    notes.push(format!(
                        "{}: not run (did not hold {at} streams)",
                        kind.name()
                    ));
                    continue;
                }
                let sub = dir.path().join(format!("{n}-{}", kind.name()));
                let col = match kind.start(&sub, up, n).await {
                    Ok(hop) => run(&opts, &direct, Some(&hop)).await,
                    Err(e) => Column::failed(kind.name(), &opts, e),
                };
                lost += col.lost;
                if col.holds(&base, opts.hold_ms) {
                    let mut held = col.clone();
                    held.label = format!("{} at {n}", col.name);
                    best[k] = Some((held, base.clone()));
                } else {
                    fell[k] = Some(n);
                }
                cols.push(col);
            }
            let title = format!(
                "{} streams x {} chunks ({} a second for {} s), opened over {} s; {} cores",
                n,
                opts.chunks(),
                opts.rate,
                opts.secs,
                opts.ramp,
                std::thread::available_parallelism().map_or(0, |n| n.get()),
            );
            let pairs: Vec<_> = std::iter::once((&base, &base))
                .chain(cols.iter().map(|c| (c, &base)))
                .collect();
            print(&title, &pairs, &notes);
        }
        if several {
            let pairs: Vec<_> = best.iter().flatten().map(|(c, b)| (c, b)).collect();
            let notes: Vec<_> = (kinds.iter().zip(&best))
                .filter(|(_, b)| b.is_none())
                .map(|(k, _)| format!("{}: held none of the levels", k.name()))
                .collect();
            print(
                &format!(
                    "Each hop at the highest level it held (no stream lost, added time to first \
                     chunk p99 and transit p99 each under {} ms), beside that level's direct \
                     column",
                    opts.hold_ms
                ),
                &pairs,
                &notes,
            );
        }
        let failed = if several { base_lost } else { lost + base_lost };
        if failed > 0 {
            eprintln!("{failed} streams lost");
            std::process::exit(1);
        }
    });
}
