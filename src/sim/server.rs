//! The axum side: acts out a [`Behaviour`] over real HTTP. Nothing here decides *what*
//! happens (that is [`behaviour`]); it decides only *how* it looks on the wire.
//!
//! No task is spawned per request: a response body is a stream owned by hyper, so a client
//! that disconnects drops it (and its timers) at once, and every wait also watches the
//! shutdown token so graceful shutdown never waits on a hung or stalled request.

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use axum::{Json, Router};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::openai::{self, ChatRequest, Completion, Usage};
use super::scenario::{behaviour, Fault};
use super::{SimConfig, SimRoute};

/// While waiting longer than this for the next byte, send a keep-alive (an SSE comment, or
/// whitespace before a JSON body), as gateways do for queued requests. A stall sends none.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(1);

/// A non-streaming answer taking longer than this after its headers would be due gets its
/// headers early and whitespace keep-alives, instead of holding the headers back.
const LONG_WAIT: Duration = Duration::from_secs(2);

pub(super) struct Sim {
    routes: Vec<SimRoute>,
    regions: HashSet<(String, String)>,
    time_scale: f64,
    started: Instant,
    rng: Mutex<StdRng>,
    shutdown: CancellationToken,
    next_id: AtomicU64,
    in_flight: AtomicUsize,
}

impl Sim {
    pub(super) fn new(config: SimConfig, shutdown: CancellationToken) -> Self {
        let time_scale = if config.time_scale.is_finite() && config.time_scale > 0.0 {
            config.time_scale
        } else {
            1.0
        };
        Self {
            regions: config
                .routes
                .iter()
                .map(|r| (r.provider.clone(), r.region.clone()))
                .collect(),
            routes: config.routes,
            time_scale,
            started: Instant::now(),
            rng: Mutex::new(StdRng::seed_from_u64(config.seed)),
            shutdown,
            next_id: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// Pretends the server started `by` (wall time) earlier, to land inside a scenario's window.
    pub(super) fn rewind(mut self, by: Duration) -> Self {
        self.started = self.started.checked_sub(by).unwrap_or(self.started);
        self
    }

    fn route(&self, provider: &str, region: &str, model: &str) -> Option<&SimRoute> {
        self.routes
            .iter()
            .find(|r| r.provider == provider && r.region == region && r.model == model)
    }

    /// Scenario time: wall time since start, compressed by `time_scale`.
    fn scenario_elapsed(&self, at: Instant) -> Duration {
        (at - self.started).mul_f64(self.time_scale)
    }

    /// A per-request generator drawn from the seeded one, so the lock is held for one draw.
    fn request_rng(&self) -> StdRng {
        // A poisoned lock still holds a usable generator.
        let seed = self.rng.lock().unwrap_or_else(|e| e.into_inner()).gen();
        StdRng::seed_from_u64(seed)
    }

    /// Sleeps until `at`; false when shutdown came first.
    async fn sleep_until(&self, at: Instant) -> bool {
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep_until(at) => true,
        }
    }
}

/// Counts a request from arrival until its response body is dropped (sent or abandoned).
struct InFlight(Arc<Sim>);

impl InFlight {
    fn new(sim: &Arc<Sim>) -> Self {
        sim.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(sim.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(super) fn router(sim: Arc<Sim>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/{provider}/{region}/v1/chat/completions", post(chat))
        .route("/{provider}/{region}/v1/models", get(models))
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                openai::error_body("Unknown path.", "invalid_request_error", Some("not_found")),
            )
        })
        .with_state(sim)
}

pub(super) async fn serve(
    listener: TcpListener,
    sim: Arc<Sim>,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let app = router(sim).into_make_service_with_connect_info::<ConnHandle>();
    axum::serve(SimListener(listener), app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

fn error(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

fn shutting_down() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        openai::error_body("The simulator is shutting down.", "server_error", None),
    )
}

/// What is served, for a human or a test poking at the simulator.
async fn index(State(sim): State<Arc<Sim>>) -> Json<Value> {
    let routes: Vec<Value> = sim
        .routes
        .iter()
        .map(|r| {
            json!({
                "provider": r.provider,
                "region": r.region,
                "model": r.model,
                "scenario": r.scenario.as_str(),
                "path": format!("/{}/{}/v1", r.provider, r.region),
            })
        })
        .collect();
    Json(json!({
        "time_scale": sim.time_scale,
        "scenario_elapsed_s": sim.scenario_elapsed(Instant::now()).as_secs_f64(),
        "in_flight": sim.in_flight.load(Ordering::Relaxed),
        "routes": routes,
    }))
}

async fn models(
    State(sim): State<Arc<Sim>>,
    Path((provider, region)): Path<(String, String)>,
) -> Response {
    if !sim.regions.contains(&(provider.clone(), region.clone())) {
        return unknown_region(&provider, &region);
    }
    let data: Vec<Value> = sim
        .routes
        .iter()
        .filter(|r| r.provider == provider && r.region == region)
        .map(|r| json!({"id": r.model, "object": "model", "created": 1_700_000_000, "owned_by": r.provider}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

fn unknown_region(provider: &str, region: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        openai::error_body(
            &format!("No simulated provider {provider:?} in region {region:?}."),
            "invalid_request_error",
            Some("not_found"),
        ),
    )
}

async fn chat(
    State(sim): State<Arc<Sim>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    Path((provider, region)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let arrived = Instant::now();
    let guard = InFlight::new(&sim);
    let req: ChatRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                openai::error_body(
                    &format!("Invalid request body: {e}"),
                    "invalid_request_error",
                    None,
                ),
            )
        }
    };
    if !sim.regions.contains(&(provider.clone(), region.clone())) {
        return unknown_region(&provider, &region);
    }
    let Some(route) = sim.route(&provider, &region, &req.model) else {
        return error(
            StatusCode::NOT_FOUND,
            openai::error_body(
                &format!(
                    "The model `{}` does not exist or you do not have access to it.",
                    req.model
                ),
                "invalid_request_error",
                Some("model_not_found"),
            ),
        );
    };

    let mut rng = sim.request_rng();
    // Each route carries the scenario it suffers, so it is always the scenario's target;
    // bystanders are configured as `healthy`.
    let b = behaviour(
        route.scenario,
        sim.scenario_elapsed(arrived),
        true,
        &mut rng,
    );
    let headers_at = arrived + b.headers_after;
    let stall = match b.fault {
        Some(Fault::NoHeaders) => {
            // Accepted, never answered. A client that gives up drops this future.
            sim.shutdown.cancelled().await;
            conn.reset();
            return shutting_down();
        }
        Some(Fault::Reset) => {
            if !sim.sleep_until(headers_at).await {
                return shutting_down();
            }
            conn.reset();
            // Never written: the connection errors first.
            return StatusCode::BAD_GATEWAY.into_response();
        }
        Some(Fault::Status(status)) => {
            if !sim.sleep_until(headers_at).await {
                return shutting_down();
            }
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return error(code, openai::status_error(status));
        }
        Some(Fault::Stall { chunks }) => Some(usize::from(chunks)),
        None => None,
    };

    let mut tokens = openai::answer_tokens(req.prompt(), b.version, &route.model, &mut rng);
    let mut finish = "stop";
    if let Some(max) = req.max_tokens() {
        let max = max.max(1) as usize;
        if tokens.len() > max {
            tokens.truncate(max);
            finish = "length";
        }
    }
    let usage = Usage {
        prompt: req.prompt_tokens(),
        completion: tokens.len() as u32,
    };
    let id = sim.next_id.fetch_add(1, Ordering::Relaxed);
    let completion = Completion {
        id: format!("chatcmpl-sim{id:08}"),
        created: chrono::Utc::now().timestamp(),
        model: openai::reported_model(&route.model, b.version),
        fingerprint: openai::fingerprint(b.version),
        include_usage: req.include_usage(),
    };
    let token_at = |i: usize| {
        arrived + b.first_token_after + Duration::from_secs_f64(i as f64 / b.tokens_per_second)
    };
    let total_at = arrived + b.total(tokens.len());

    if req.stream {
        if !sim.sleep_until(headers_at).await {
            return shutting_down();
        }
        let mut frames = VecDeque::new();
        frames.push_back((headers_at, completion.role_chunk()));
        let sent = stall.unwrap_or(tokens.len()).min(tokens.len());
        for (i, t) in tokens.iter().take(sent).enumerate() {
            frames.push_back((token_at(i), completion.content_chunk(t)));
        }
        if stall.is_none() {
            let mut tail = completion.finish_chunk(finish);
            if completion.include_usage {
                tail.push_str(&completion.usage_chunk(usage));
            }
            tail.push_str(Completion::done());
            frames.push_back((total_at, tail));
        }
        let script = Script {
            frames,
            hang: stall.is_some(),
            keepalive: b.keepalive.then_some(": keep-alive\n\n"),
            shutdown: sim.shutdown.clone(),
            _guard: guard,
        };
        return streamed(
            script,
            "text/event-stream",
            &[(header::CACHE_CONTROL, "no-cache")],
        );
    }

    // Non-streaming: the whole answer at once, when it is ready.
    let body = completion.full(&tokens.concat(), finish, usage).to_string();
    if stall.is_none() && total_at <= headers_at + LONG_WAIT {
        if !sim.sleep_until(total_at).await {
            return shutting_down();
        }
        return ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    }
    if !sim.sleep_until(headers_at).await {
        return shutting_down();
    }
    let mut frames = VecDeque::new();
    if stall.is_none() {
        frames.push_back((total_at, body));
    }
    let script = Script {
        frames,
        hang: stall.is_some(),
        keepalive: Some("\n"),
        shutdown: sim.shutdown.clone(),
        _guard: guard,
    };
    streamed(script, "application/json", &[])
}

/// A response body played out on a timetable.
struct Script {
    /// (when, bytes), in order.
    frames: VecDeque<(Instant, String)>,
    /// After the last frame, go silent (a stall) instead of ending.
    hang: bool,
    /// Sent while waiting long for the next frame; `None`: silence.
    keepalive: Option<&'static str>,
    shutdown: CancellationToken,
    _guard: InFlight,
}

fn streamed(
    script: Script,
    content_type: &'static str,
    extra: &[(header::HeaderName, &'static str)],
) -> Response {
    let stream = play(script);
    let mut resp = Body::from_stream(stream).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    for (name, value) in extra {
        headers.insert(name.clone(), header::HeaderValue::from_static(value));
    }
    resp
}

/// The script as a byte stream: each frame at its time, keep-alives in long waits, and an
/// end (or silence, for a stall) after the last frame. Shutdown ends it wherever it is.
fn play(script: Script) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> {
    futures_util::stream::unfold(script, |mut s| async move {
        let Some(&(at, _)) = s.frames.front() else {
            if s.hang {
                s.shutdown.cancelled().await;
            }
            // Shutdown ends a stall or a stream mid-way: the client sees it cut.
            return None;
        };
        if let Some(keepalive) = s
            .keepalive
            .filter(|_| at > Instant::now() + KEEPALIVE_EVERY)
        {
            tokio::select! {
                _ = s.shutdown.cancelled() => return None,
                _ = tokio::time::sleep(KEEPALIVE_EVERY) => {}
            }
            let ka = Bytes::from_static(keepalive.as_bytes());
            return Some((Ok::<_, Infallible>(ka), s));
        }
        tokio::select! {
            _ = s.shutdown.cancelled() => return None,
            _ = tokio::time::sleep_until(at) => {}
        }
        let (_, bytes) = s.frames.pop_front()?;
        Some((Ok(Bytes::from(bytes)), s))
    })
}

/// Lets a handler reset its own connection (region failover's "connection reset").
#[derive(Clone)]
struct ConnHandle(Arc<AtomicBool>);

impl ConnHandle {
    fn reset(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, SimListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, SimListener>) -> Self {
        ConnHandle(stream.io().reset.clone())
    }
}

/// A TCP listener whose connections can be reset from inside a handler.
struct SimListener(TcpListener);

impl axum::serve::Listener for SimListener {
    type Io = SimIo;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (inner, addr) = axum::serve::Listener::accept(&mut self.0).await;
        // SSE chunks should leave at once, not wait for Nagle.
        let _ = inner.set_nodelay(true);
        let io = SimIo {
            inner,
            reset: Arc::new(AtomicBool::new(false)),
        };
        (io, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// Once `reset` is set, every IO call fails and the socket is closed with SO_LINGER 0, so
/// the peer sees a TCP reset rather than an orderly close.
struct SimIo {
    inner: TcpStream,
    reset: Arc<AtomicBool>,
}

impl SimIo {
    fn check(&self) -> io::Result<()> {
        if self.reset.load(Ordering::Relaxed) {
            let _ = self.inner.set_zero_linger();
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        Ok(())
    }
}

impl AsyncRead for SimIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check()?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check()?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check()?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check()?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::scenario::Scenario;

    struct Running {
        base: String,
        sim: Arc<Sim>,
        shutdown: CancellationToken,
        server: tokio::task::JoinHandle<io::Result<()>>,
    }

    async fn start(scenario: Scenario, minutes_in: u64) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let config = SimConfig {
            routes: vec![SimRoute {
                provider: "p".into(),
                region: "r".into(),
                model: "m".into(),
                scenario,
            }],
            time_scale: 1.0,
            seed: 3,
        };
        let sim = Arc::new(
            Sim::new(config, shutdown.clone()).rewind(Duration::from_secs(minutes_in * 60)),
        );
        let server = tokio::spawn(serve(listener, sim.clone(), shutdown.clone()));
        Running {
            base: crate::sim::base_url(addr, "p", "r"),
            sim,
            shutdown,
            server,
        }
    }

    fn probe(stream: bool) -> Value {
        json!({"model": "m", "stream": stream, "messages": [
            {"role": "system", "content": "Reply with exactly: PROBE_OK"},
            {"role": "user", "content": "health check"}]})
    }

    async fn stop(r: Running) {
        r.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(2), r.server)
            .await
            .expect("server stops promptly")
            .unwrap()
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn long_waits_carry_keepalives_and_stalls_stay_silent() {
        use futures_util::StreamExt;
        let shutdown = CancellationToken::new();
        let sim = Arc::new(Sim::new(
            SimConfig {
                routes: vec![],
                time_scale: 1.0,
                seed: 0,
            },
            shutdown.clone(),
        ));
        let t0 = Instant::now();
        let script = Script {
            frames: VecDeque::from([
                (t0, "role".to_owned()),
                (t0 + Duration::from_millis(3500), "token".to_owned()),
            ]),
            hang: true,
            keepalive: Some(": keep-alive\n\n"),
            shutdown: shutdown.clone(),
            _guard: InFlight::new(&sim),
        };
        let mut body = Box::pin(play(script));
        let mut got = Vec::new();
        for _ in 0..5 {
            let b = body.next().await.unwrap().unwrap();
            got.push((Instant::now() - t0, String::from_utf8(b.to_vec()).unwrap()));
        }
        let names: Vec<&str> = got.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "role",
                ": keep-alive\n\n",
                ": keep-alive\n\n",
                ": keep-alive\n\n",
                "token"
            ]
        );
        assert_eq!(got[4].0, Duration::from_millis(3500));
        // After the last frame of a stall: nothing, however long we wait.
        let silent = tokio::time::timeout(Duration::from_secs(600), body.next()).await;
        assert!(silent.is_err());
        shutdown.cancel();
        assert!(body.next().await.is_none());
        drop(body);
        assert_eq!(sim.in_flight.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_stall_sends_headers_then_silence_until_shutdown() {
        let r = start(Scenario::Stall, 6).await;
        let mut resp = reqwest::Client::new()
            .post(format!("{}/chat/completions", r.base))
            .json(&probe(true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut got = String::new();
        // The role chunk and at most one content chunk arrive, then nothing.
        while let Ok(Ok(Some(c))) =
            tokio::time::timeout(Duration::from_millis(1500), resp.chunk()).await
        {
            got.push_str(std::str::from_utf8(&c).unwrap());
        }
        assert!(got.contains("\"role\":\"assistant\""), "{got}");
        assert!(!got.contains("[DONE]") && !got.contains("finish_reason\":\"stop"));
        assert!(got.matches("data: ").count() <= 2, "{got}");
        // Shutdown cuts the stalled stream instead of waiting for it.
        let sim = r.sim.clone();
        stop(r).await;
        let rest = tokio::time::timeout(Duration::from_secs(2), resp.chunk()).await;
        assert!(matches!(rest, Ok(Ok(None)) | Ok(Err(_))), "{rest:?}");
        drop(resp);
        assert_eq!(sim.in_flight.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_hung_request_is_released_when_the_client_gives_up() {
        let r = start(Scenario::PartialOutage, 10).await;
        let err = reqwest::Client::new()
            .post(format!("{}/chat/completions", r.base))
            .json(&probe(true))
            .timeout(Duration::from_millis(400))
            .send()
            .await
            .unwrap_err();
        assert!(err.is_timeout(), "{err}");
        // The handler future is dropped with the connection: nothing left running.
        let deadline = Instant::now() + Duration::from_secs(2);
        while r.sim.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(r.sim.in_flight.load(Ordering::Relaxed), 0);
        stop(r).await;
    }

    #[tokio::test]
    async fn a_failing_region_answers_502_503_and_resets_connections() {
        let r = start(Scenario::RegionFailover, 6).await;
        let url = format!("{}/chat/completions", r.base);
        // A fresh connection each time (a reset kills the one it happens on), all at once.
        let calls = (0..40).map(|_| async {
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            client
                .post(&url)
                .json(&probe(false))
                .send()
                .await
                .map(|r| r.status().as_u16())
        });
        let results = futures_util::future::join_all(calls).await;
        let resets = results.iter().filter(|r| r.is_err()).count();
        let statuses: Vec<u16> = results.into_iter().filter_map(Result::ok).collect();
        assert!(
            statuses.contains(&502) && statuses.contains(&503),
            "{statuses:?}"
        );
        assert!(resets > 0, "{statuses:?}");
        let ok = statuses.iter().filter(|s| **s == 200).count();
        assert!(ok < 25, "{statuses:?}");
        stop(r).await;
    }

    #[tokio::test]
    async fn a_drifted_version_answers_differently() {
        let r = start(Scenario::VersionDrift, 15).await;
        let v: Value = reqwest::Client::new()
            .post(format!("{}/chat/completions", r.base))
            .json(&probe(false))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let answer = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(
            answer == "PROBE_OK." || answer == "Sure! PROBE_OK",
            "{answer}"
        );
        assert_eq!(v["model"], "m-0915");
        assert_eq!(v["system_fingerprint"], "fp_sim_9e7d4f");
        stop(r).await;
    }
}
