//! The proxy's HTTP surface: [`router`] (`POST /v1/chat/completions`, `POST /v1/embeddings`,
//! `GET /v1/models`,
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

/// Serves the proxy on `listener` until `shutdown` ([`crate::listen::serve`]: header read
/// timeout, 431 past a 32 KiB head, bounded connections, graceful shutdown).
pub async fn serve(
    listener: TcpListener,
    proxy: Proxy,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let limits = crate::listen::Limits {
        header_read_timeout: proxy.inner.header_read_timeout,
        max_connections: usize::try_from(proxy.inner.config.max_connections).unwrap_or(usize::MAX),
    };
    let meter = proxy.inner.meter.clone();
    let served = crate::listen::serve(listener, router(proxy), limits, shutdown, "proxy").await;
    // Every request has ended: what they metered reaches the store before it closes.
    if let Some(meter) = meter {
        meter.close().await;
    }
    served
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
