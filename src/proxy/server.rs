//! The proxy's HTTP surface: [`router`] (`POST /v1/chat/completions`, `GET /v1/models`,
//! `GET /v1/jobs/{id}`, `GET /readyz`) and [`serve`], which runs it on a listener with a header read timeout,
//! a head limit, bounded connections and graceful shutdown.

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
use super::{degrade, failover, jobs, readonly, select, Proxy};

pub use crate::listen::HEADER_READ_TIMEOUT;

/// The proxy's HTTP surface.
pub fn router(proxy: Proxy) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/jobs/{id}", get(jobs::get_job))
        .route("/readyz", get(readonly::readyz))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            proxy.clone(),
            readonly::disclose,
        ))
        .with_state(proxy)
}

/// Serves the proxy on `listener` until `shutdown` ([`crate::listen::serve`]: header read
/// timeout, 431 past a 32 KiB head, bounded connections, graceful shutdown).
pub async fn serve(
    listener: TcpListener,
    proxy: Proxy,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let limits = crate::listen::Limits {
        header_read_timeout: proxy.inner.header_read_timeout,
        ..Default::default()
    };
    crate::listen::serve(listener, router(proxy), limits, shutdown, "proxy").await
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
