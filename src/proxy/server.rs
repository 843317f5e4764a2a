//! The proxy's HTTP surface: [`router`] (`POST /v1/chat/completions`, `POST /v1/embeddings`,
//! `GET /v1/models`,
//! `GET /v1/jobs/{id}`, `GET /readyz`) and [`serve`], which runs it on `[proxy] workers`
//! threads, each a single-threaded runtime with its own socket ([`bind`]: `SO_REUSEPORT`) and
//! upstream pool, with a header read timeout, a head limit, connections bounded across the
//! workers and graceful shutdown.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::intake::{self, Claim};
use super::reject::Reject;
use super::request::{finish, request_id, Answer, RequestCtx};
use super::{degrade, failover, jobs, readonly, select, Proxy};
use crate::listen;

pub use crate::listen::HEADER_READ_TIMEOUT;

/// The proxy's HTTP surface.
pub fn router(proxy: Proxy) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/embeddings", post(super::embeddings::embeddings))
        .route("/v1/models", get(models))
        .route("/v1/jobs/{id}", get(jobs::get_job))
        .route("/readyz", get(readonly::readyz))
        .route("/api/v1/admin/clients", get(admin_clients))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            proxy.clone(),
            readonly::disclose,
        ))
        .with_state(proxy)
}

/// Where the proxy's workers accept connections.
pub enum Listeners {
    /// One socket for every worker (a listener handed over already bound; each worker
    /// accepts on its own copy of the descriptor).
    Shared(TcpListener),
    /// A socket per worker on the same address (`SO_REUSEPORT`: the kernel spreads new
    /// connections over them), from [`bind`].
    PerWorker(Vec<std::net::TcpListener>),
}

impl From<TcpListener> for Listeners {
    fn from(listener: TcpListener) -> Self {
        Self::Shared(listener)
    }
}

/// Binds `addr` for `workers` workers: one socket each with `SO_REUSEPORT` (one plain socket
/// for one worker). Call it inside a Tokio runtime. The address is first bound once without
/// the option, so that a port another process serves (even another probeok with its own
/// `SO_REUSEPORT` sockets) is refused as in use instead of shared with it.
pub fn bind(addr: std::net::SocketAddr, workers: usize) -> std::io::Result<Listeners> {
    const BACKLOG: u32 = 1024;
    let socket = |reuseport: bool, addr: std::net::SocketAddr| {
        let s = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        s.set_reuseaddr(true)?;
        if reuseport {
            s.set_reuseport(true)?;
        }
        s.bind(addr)?;
        Ok::<_, std::io::Error>(s)
    };
    if workers <= 1 {
        let listener = socket(false, addr)?.listen(BACKLOG)?;
        return Ok(Listeners::Shared(listener));
    }
    // In use? (A bound socket that never listened leaves nothing behind when dropped.)
    let probe = socket(false, addr)?;
    let addr = probe.local_addr()?;
    drop(probe);
    let mut sockets = Vec::with_capacity(workers);
    for _ in 0..workers {
        let listener = socket(true, addr)?.listen(BACKLOG)?;
        sockets.push(listener.into_std()?);
    }
    Ok(Listeners::PerWorker(sockets))
}

impl Listeners {
    /// The address served.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        match self {
            Self::Shared(l) => l.local_addr(),
            Self::PerWorker(ls) => ls
                .first()
                .ok_or_else(|| std::io::Error::other("no socket"))?
                .local_addr(),
        }
    }

    /// One socket for each of `workers` workers.
    fn split(self, workers: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
        match self {
            Self::PerWorker(ls) => Ok(ls),
            Self::Shared(l) => {
                let l = l.into_std()?;
                let mut all = Vec::with_capacity(workers);
                for _ in 1..workers {
                    all.push(l.try_clone()?);
                }
                all.push(l);
                Ok(all)
            }
        }
    }
}

/// Serves the proxy on `listeners` until `shutdown` ([`crate::listen::serve`]: header read
/// timeout, 431 past a 32 KiB head, graceful shutdown), with `[proxy] workers` threads, each
/// running a single-threaded runtime with its own socket and upstream pool: a request is
/// read, forwarded and answered on one thread, with no hand-over between threads. What the
/// workers share (weights, breakers, limits, budgets, metering) is in [`Proxy`];
/// `max_connections` bounds them together.
///
/// Inside a single-threaded runtime (an embedder's, or a test's whose clock may be paused)
/// the proxy serves on that runtime instead: threads of its own would not share its clock.
pub async fn serve(
    listeners: impl Into<Listeners>,
    proxy: Proxy,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listeners = listeners.into();
    let max_connections = usize::try_from(proxy.inner.config.max_connections).unwrap_or(usize::MAX);
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    let timeout = proxy.inner.header_read_timeout;
    let meter = proxy.inner.meter.clone();
    let on_caller = tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::CurrentThread;
    let served = if on_caller {
        let one = proxy.for_worker(0).map_err(std::io::Error::other)?;
        let sockets = listeners.split(1)?;
        let mut served = Ok(());
        let mut running = tokio::task::JoinSet::new();
        for socket in sockets {
            let listener = TcpListener::from_std(socket)?;
            let app = router(one.clone());
            let (slots, shutdown) = (slots.clone(), shutdown.clone());
            running.spawn(listen::serve_with_slots(
                listener, app, timeout, slots, shutdown, "proxy",
            ));
        }
        while let Some(done) = running.join_next().await {
            served = served.and(done.map_err(std::io::Error::other)?);
        }
        served
    } else {
        let workers = usize::try_from(proxy.inner.config.workers)
            .unwrap_or(1)
            .max(1);
        let sockets = listeners.split(workers)?;
        // Dropping this future (a caller's drain timeout) stops the workers at once.
        let stop = CancellationToken::new();
        let _stop_on_drop = stop.clone().drop_guard();
        let mut ended = Vec::with_capacity(sockets.len());
        for (i, socket) in sockets.into_iter().enumerate() {
            let worker = Worker {
                proxy: proxy.for_worker(i).map_err(std::io::Error::other)?,
                socket,
                slots: slots.clone(),
                timeout,
                shutdown: shutdown.clone(),
                stop: stop.clone(),
            };
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::Builder::new()
                .name(format!("probeok-proxy-{i}"))
                .spawn(move || {
                    let _ = tx.send(worker.run());
                })?;
            ended.push(rx);
        }
        let mut served = Ok(());
        for rx in ended {
            let result = rx
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other("a proxy worker panicked")));
            served = served.and(result);
        }
        served
    };
    // Every request has ended: what they metered reaches the store before it closes.
    if let Some(meter) = meter {
        meter.close().await;
    }
    served
}

/// One worker: its thread's runtime, socket and handle of the proxy.
struct Worker {
    proxy: Proxy,
    socket: std::net::TcpListener,
    slots: Arc<Semaphore>,
    timeout: std::time::Duration,
    shutdown: CancellationToken,
    stop: CancellationToken,
}

/// How long a stopped worker's runtime stays up for the work its requests left behind.
const WORKER_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

impl Worker {
    fn run(self) -> std::io::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let Self {
            proxy,
            socket,
            slots,
            timeout,
            shutdown,
            stop,
        } = self;
        rt.block_on(async move {
            let listener = TcpListener::from_std(socket)?;
            let app = router(proxy);
            let serving =
                listen::serve_with_slots(listener, app, timeout, slots, shutdown, "proxy");
            let served = tokio::select! {
                served = serving => served,
                () = stop.cancelled() => return Ok(()),
            };
            // A finished request may leave work on this runtime (settling a client's spend,
            // storing an idempotent answer, the store's reply to it): it gets to end, until
            // the caller stops waiting. With the router gone, the upstream pool's
            // connections close too.
            let until = tokio::time::Instant::now() + WORKER_DRAIN;
            let metrics = tokio::runtime::Handle::current().metrics();
            while metrics.num_alive_tasks() > 0 && tokio::time::Instant::now() < until {
                tokio::select! {
                    () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
                    () = stop.cancelled() => break,
                }
            }
            served
        })
    }
}

async fn not_found() -> Response {
    Reject::NotFound.into_response()
}

/// `GET /v1/models`: the logical models served here.
async fn models(State(proxy): State<Proxy>) -> Response {
    let data: Vec<Value> = select::logical_models(&proxy.inner.routes)
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "probeok"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /api/v1/admin/clients` (admin token): every client's spend this period.
async fn admin_clients(State(proxy): State<Proxy>, headers: HeaderMap) -> Response {
    let (env, var) = &proxy.inner.admin_token;
    match crate::secret::check_bearer_env(env, var, &headers) {
        Ok(()) => {}
        Err(crate::secret::AuthError::Disabled) => return Reject::AdminDisabled.into_response(),
        Err(crate::secret::AuthError::Unauthorized) => {
            return Reject::AdminUnauthorized.into_response()
        }
    }
    let p = proxy.clone();
    match tokio::task::spawn_blocking(move || p.client_report_blocking()).await {
        Ok(clients) => Json(json!({ "clients": clients })).into_response(),
        Err(_) => Reject::ReadTaskFailed.into_response(),
    }
}

/// `POST /v1/chat/completions`.
async fn chat_completions(State(proxy): State<Proxy>, headers: HeaderMap, body: Body) -> Response {
    let mut ctx = RequestCtx::new(request_id(&headers), proxy.inner.clock.now());
    ctx.trace = proxy.inner.tracer.begin(&headers).map(Box::new);
    let answer = handle(&proxy, &headers, body, &mut ctx)
        .await
        .unwrap_or_else(Answer::from);
    finish(&proxy, ctx, answer).await
}

/// Intake, the idempotency key, the degradation contract, then the candidates.
async fn handle(
    proxy: &Proxy,
    headers: &HeaderMap,
    body: Body,
    ctx: &mut RequestCtx,
) -> Result<Answer, Reject> {
    let p = &proxy.inner;
    let intake = intake::read(p, headers, body).await?;
    if p.embedding_models.contains(&intake.model) {
        return Err(Reject::WrongEndpoint {
            model: intake.model,
            serves: "embeddings",
            endpoint: "/v1/embeddings",
        });
    }
    ctx.stream = intake.needs.stream;
    ctx.client = super::attribution::client_tag(&intake.client_key);
    if let Some(shadows) = &p.shadows {
        let keyed = headers.contains_key("idempotency-key");
        ctx.shadow = (shadows.sample(&intake.model, keyed, &intake.request, intake.needs.stream))
            .map(Box::new);
    }
    match intake::claim(p, headers, &intake).await? {
        Claim::None => {}
        Claim::Proceed(guard) => ctx.guard = Some(guard),
        Claim::Replay(r) => {
            ctx.replay = true;
            return Ok(Answer::Plain(r));
        }
    }
    if let Some(client) = &intake.client {
        ctx.client_id = Some(client.id.clone());
        book_client(proxy, ctx, client, &intake).await?;
    }
    let view = p.weights.borrow().clone();
    // The live config's contract for this feature, if the model is DEGRADED or CRITICAL now.
    if let Some(answer) = degrade::apply(proxy, ctx, &intake, &view).await {
        return answer;
    }
    failover::route(
        proxy,
        ctx,
        &intake.request,
        &intake.model,
        &intake.needs,
        &view,
    )
    .await
}

/// A client with a spend limit books the request's maximum cost before any upstream call
/// (see `clients`): over its limit the request ends here, metered as rejected.
async fn book_client(
    proxy: &Proxy,
    ctx: &mut RequestCtx,
    client: &super::clients::NamedClient,
    intake: &intake::Intake,
) -> Result<(), Reject> {
    let p = &proxy.inner;
    if client.limit.is_none() || !p.routes.iter().any(|r| r.serves == intake.model) {
        // Nothing to book, or an unknown model (answered 404 further on).
        return Ok(());
    }
    // In read-only mode no new reservation can be written: the client is held to what it
    // already holds, at once, rather than after a connection attempt to a database known
    // to be gone.
    if proxy.store_health().is_some_and(|h| !h.available()) {
        return Err(Reject::SpendUnavailable);
    }
    // A degradation contract may send the request to its fallback model instead.
    let live = p.live.borrow().clone();
    let mut models = vec![intake.model.as_str()];
    let fallbacks: Vec<String> = (live.contracts.iter())
        .flat_map(|c| [c.degraded.as_ref(), c.critical.as_ref()])
        .filter_map(|b| match b {
            Some(crate::config::Behaviour::FallbackModel(m)) => Some(m.clone()),
            _ => None,
        })
        .collect();
    models.extend(fallbacks.iter().map(String::as_str));
    let micros = super::clients::max_cost_micros(
        &intake.request,
        &p.routes,
        &models,
        failover::DEFAULT_MAX_TOKENS,
    );
    ctx.serves(&intake.model);
    let hold = p.clients.reserve(client, micros).await?;
    let prompt = select::estimate_prompt_tokens(&intake.request);
    ctx.spend = hold.map(|h| (h, prompt));
    Ok(())
}
