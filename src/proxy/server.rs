//! The proxy's HTTP surface: [`router`] (`POST /v1/chat/completions`, `GET /v1/models`,
//! `GET /v1/jobs/{id}`) and [`serve`], which runs it on a listener with a header read timeout
//! and graceful shutdown.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::intake::{self, Claim};
use super::reject::Reject;
use super::request::{finish, request_id, Answer, RequestCtx};
use super::{degrade, failover, jobs, select, Proxy};

/// A request's head (request line and headers) must arrive within this, or the connection is
/// closed: a slow-loris client cannot hold a connection open by trickling its headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// After an accept error other than a peer's reset (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The proxy's HTTP surface.
pub fn router(proxy: Proxy) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/jobs/{id}", get(jobs::get_job))
        .fallback(not_found)
        .with_state(proxy)
}

/// Serves the proxy on `listener` until `shutdown`: HTTP/1.1 (keep-alive) and HTTP/2, with a
/// header read timeout on HTTP/1 connections (axum's own `serve` sets none). At shutdown it
/// stops accepting, closes idle connections and waits for in-flight requests.
pub async fn serve(
    listener: TcpListener,
    proxy: Proxy,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto;
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let header_read_timeout = proxy.inner.header_read_timeout;
    let service = TowerToHyperService::new(router(proxy));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::ConnectionReset
                ) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "proxy cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service.clone())
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "proxy connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
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

/// `POST /v1/chat/completions`.
async fn chat_completions(State(proxy): State<Proxy>, headers: HeaderMap, body: Body) -> Response {
    let mut ctx = RequestCtx::new(request_id(&headers), proxy.inner.clock.now());
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
    ctx.stream = intake.needs.stream;
    match intake::claim(p, headers, &intake).await? {
        Claim::None => {}
        Claim::Proceed(guard) => ctx.guard = Some(guard),
        Claim::Replay(r) => {
            ctx.replay = true;
            return Ok(Answer::Plain(r));
        }
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
