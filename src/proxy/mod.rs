//! The bundled OpenAI-compatible routing proxy (SPEC.md, "HTTP API of the proxy"):
//! `POST /v1/chat/completions` (streaming and not) and `GET /v1/models`, following the weights
//! feed through a watch channel and reporting every attempt as a passive outcome.
//!
//! - [`weights`]: the proxy's own view of the weights feed (`WeightsView`), independent of the
//!   monitor's types.
//! - [`select`]: the pure candidate choice (needs filter, weighted order, tiers, degraded mode).
//! - [`attempt`]: one attempt — per-candidate budget, stream watchdog, failover classes,
//!   429 rests, passive outcomes.
//! - [`stream`]: forwarding a committed stream; `provider_interrupted` after the commit point.
//!
//! Every answer carries `x-probeok-route`, `x-probeok-attempts`, `x-probeok-mode`
//! (`normal` | `degraded` | `fallback`), `x-probeok-fallback-reason` when another candidate
//! than the first choice answered (or a non-primary was chosen), `x-probeok-degraded-since`
//! when degraded, and `x-request-id` (the client's, or a generated one). Errors use OpenAI's
//! envelope `{"error":{"message","type","code"}}`. Upstream keys come from each provider's
//! `api_key_env`, are added by the proxy and never returned; the client's `Authorization` is
//! checked against `client_keys_env` (when set) and never forwarded.
//!
//! Graceful shutdown stops accepting and waits for in-flight requests; committed streams run to
//! their end, bounded by the service's drain timeout.

pub mod attempt;
pub mod select;
pub mod stream;
pub mod weights;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::{Budget, Reservation};
use crate::clock::{Clock, SystemClock};
use crate::config::{Config, ProxyConfig};
use crate::probe::{ProbeError, ProbeOutcome};
use crate::route::{Route, RouteId, Tier};
use crate::secret::Secret;

use attempt::{
    class_of, reason_code, Attempt, Class, Limits, Outgoing, PassiveSink, Rests, Upstream,
};
use select::{Needs, Rejection};
pub use weights::{WeightsRx, WeightsView};

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// The proxy's state: cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

struct Inner {
    config: ProxyConfig,
    routes: Vec<Arc<Route>>,
    weights: WeightsRx,
    upstream: Upstream,
    rests: Rests,
    passive: PassiveSink,
    /// `None`: no client auth (the variable is unset).
    client_keys: Option<Vec<Secret>>,
    /// Routes whose own `first_byte_timeout` overrides the proxy's stream watchdog.
    first_byte_overrides: HashMap<RouteId, Duration>,
    /// Logical model → since when it has been served degraded (all weights 0).
    degraded_since: Mutex<HashMap<String, DateTime<Utc>>>,
    clock: Arc<dyn Clock>,
    /// The hourly extra-cost budget (layer 5), once the app sets it: requests to non-primary
    /// routes reserve their estimated maximum extra cost first.
    budget: std::sync::OnceLock<Arc<Budget>>,
}

impl Proxy {
    /// Builds the proxy from a validated config: `[proxy]` and the resolved routes (only
    /// `openai` ones will carry traffic). Provider keys and client keys are read from the
    /// environment now.
    pub fn new(
        config: &Config,
        weights: WeightsRx,
        passive: mpsc::Sender<ProbeOutcome>,
    ) -> Result<Self, ProxyError> {
        Self::with_clock(config, weights, passive, Arc::new(SystemClock))
    }

    pub fn with_clock(
        full: &Config,
        weights: WeightsRx,
        passive: mpsc::Sender<ProbeOutcome>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ProxyError> {
        let config = &full.proxy;
        let routes: Vec<Arc<Route>> = full.routes().into_iter().map(Arc::new).collect();
        let first_byte_overrides = full
            .routes
            .iter()
            .filter_map(|r| {
                let fbt = r.first_byte_timeout?;
                Some((RouteId::new(&r.provider, &r.region, &r.model), fbt))
            })
            .collect();
        let upstream = Upstream::new(&routes).map_err(|e| ProxyError::Client(e.to_string()))?;
        let client_keys = Secret::from_env(&config.client_keys_env).map(|all| {
            all.expose()
                .split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(Secret::new)
                .collect()
        });
        Ok(Self {
            inner: Arc::new(Inner {
                config: config.clone(),
                routes,
                weights,
                upstream,
                rests: Rests::default(),
                passive: PassiveSink::new(passive),
                client_keys,
                first_byte_overrides,
                degraded_since: Mutex::new(HashMap::new()),
                clock,
                budget: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Accounts non-primary serving against `budget` from now on (once; a second call is
    /// ignored).
    pub fn set_budget(&self, budget: Arc<Budget>) {
        let _ = self.inner.budget.set(budget);
    }

    /// Passive outcomes dropped because the queue was full.
    pub fn passive_dropped(&self) -> u64 {
        self.inner.passive.dropped()
    }
}

/// The proxy's HTTP surface.
pub fn router(proxy: Proxy) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .fallback(not_found)
        .with_state(proxy)
}

/// Serves the proxy on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    proxy: Proxy,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(proxy))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// OpenAI's error envelope.
fn error_body(status: StatusCode, kind: &str, code: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"message": message, "type": kind, "code": code}})),
    )
        .into_response()
}

async fn not_found() -> Response {
    error_body(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        "no such path: the proxy serves POST /v1/chat/completions and GET /v1/models",
    )
}

async fn models(State(proxy): State<Proxy>) -> Response {
    let data: Vec<Value> = select::logical_models(&proxy.inner.routes)
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "probeok"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// What the answer's `x-probeok-*` headers say.
struct Disclosure {
    request_id: String,
    route: Option<RouteId>,
    attempts: usize,
    degraded_since: Option<DateTime<Utc>>,
    fallback_reason: Option<String>,
}

impl Disclosure {
    fn apply(&self, mut response: Response) -> Response {
        let h = response.headers_mut();
        let mut set = |name: &'static str, value: &str| {
            if let Ok(v) = HeaderValue::from_str(value) {
                h.insert(HeaderName::from_static(name), v);
            }
        };
        set(
            "x-probeok-route",
            self.route.as_ref().map_or("none", RouteId::as_str),
        );
        set("x-probeok-attempts", &self.attempts.to_string());
        let mode = if self.degraded_since.is_some() {
            "degraded"
        } else if self.fallback_reason.is_some() {
            "fallback"
        } else {
            "normal"
        };
        set("x-probeok-mode", mode);
        if let Some(r) = &self.fallback_reason {
            set("x-probeok-fallback-reason", r);
        }
        if let Some(since) = self.degraded_since {
            set(
                "x-probeok-degraded-since",
                &since.to_rfc3339_opts(SecondsFormat::Secs, true),
            );
        }
        set("x-request-id", &self.request_id);
        response
    }
}

fn request_id(headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.chars().all(|c| c.is_ascii_graphic()))
        .map_or_else(
            || format!("req_{:032x}", rand::random::<u128>()),
            str::to_owned,
        )
}

fn authorized(keys: &[Secret], headers: &HeaderMap) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
    else {
        return false;
    };
    keys.iter()
        .any(|k| constant_time_eq(k.expose().as_bytes(), given.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn chat_completions(State(proxy): State<Proxy>, headers: HeaderMap, body: Body) -> Response {
    let mut d = Disclosure {
        request_id: request_id(&headers),
        route: None,
        attempts: 0,
        degraded_since: None,
        fallback_reason: None,
    };
    let response = handle(&proxy, &headers, body, &mut d).await;
    d.apply(response)
}

async fn handle(proxy: &Proxy, headers: &HeaderMap, body: Body, d: &mut Disclosure) -> Response {
    let p = &proxy.inner;
    if let Some(keys) = &p.client_keys {
        if !authorized(keys, headers) {
            return error_body(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "invalid_api_key",
                "missing or unknown API key for this proxy (Authorization: Bearer <key>)",
            );
        }
    }
    let limit = usize::try_from(p.config.max_body).unwrap_or(usize::MAX);
    let Ok(raw) = axum::body::to_bytes(body, limit).await else {
        return error_body(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            &format!(
                "the request body is larger than {} bytes",
                p.config.max_body
            ),
        );
    };
    let bad = |code: &str, message: &str| {
        error_body(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message,
        )
    };
    let request: Value = match serde_json::from_slice(&raw) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return bad("invalid_request", "the request body must be a JSON object"),
        Err(e) => {
            return bad(
                "invalid_json",
                &format!("the request body is not valid JSON: {e}"),
            )
        }
    };
    let Some(model) = request
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return bad(
            "missing_model",
            "`model` (a logical model name) is required",
        );
    };
    if request
        .get("messages")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
    {
        return bad("missing_messages", "`messages` must be a non-empty array");
    }
    let residency = headers
        .get("x-probeok-residency")
        .and_then(|v| v.to_str().ok());
    let needs = Needs::from_request(&request, residency);

    let view = p.weights.borrow().clone();
    let now = Instant::now();
    let planned = {
        let mut rng = rand::thread_rng();
        select::plan(
            &model,
            &needs,
            &p.routes,
            &view,
            |id| p.rests.is_resting(id, now),
            &mut rng,
        )
    };
    let plan = match planned {
        Ok(plan) => plan,
        Err(Rejection::UnknownModel) => {
            return error_body(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                &format!(
                "the model `{model}` does not exist: GET /v1/models lists the models served here"
            ),
            )
        }
        Err(Rejection::NoCapableRoute { missing }) => {
            let code = if missing == ["context_window"] {
                "context_length_exceeded"
            } else {
                "no_capable_route"
            };
            return bad(
                code,
                &format!(
                    "no route of `{model}` can serve this request (lacking: {})",
                    missing.join(", ")
                ),
            );
        }
        Err(Rejection::AllResting) => {
            let ids: Vec<RouteId> = p
                .routes
                .iter()
                .filter(|r| r.serves == model)
                .map(|r| r.id.clone())
                .collect();
            let wait = p
                .rests
                .soonest_end(&ids, now)
                .unwrap_or(Duration::from_secs(1));
            let mut r = error_body(
                StatusCode::SERVICE_UNAVAILABLE,
                "upstream_error",
                "all_routes_rate_limited",
                &format!("every route of `{model}` is rate limited; retry later"),
            );
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return r;
        }
    };
    d.degraded_since = {
        let mut map = p.degraded_since.lock().unwrap_or_else(|e| e.into_inner());
        if plan.degraded {
            Some(*map.entry(model.clone()).or_insert_with(|| p.clock.now()))
        } else {
            map.remove(&model);
            None
        }
    };
    if !plan.resting.is_empty() {
        d.fallback_reason = Some("rate_limited".to_owned());
    }

    let outgoing = Outgoing {
        body: &request,
        stream: needs.stream,
        request_id: &d.request_id,
    };
    let total_deadline = now + p.config.total_timeout;
    let max = usize::try_from(p.config.max_attempts).unwrap_or(usize::MAX);
    let candidates: Vec<Arc<Route>> = plan.candidates.into_iter().take(max).collect();
    let mut failures: Vec<ProbeError> = Vec::new();
    // Layer 5: what a non-primary attempt may cost extra, estimated at its maximum.
    let prompt_tokens = select::estimate_prompt_tokens(&request);
    let max_tokens = request
        .get("max_tokens")
        .or_else(|| request.get("max_completion_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_MAX_TOKENS);
    let mut budget_refused = false;
    for (i, route) in candidates.iter().enumerate() {
        let remaining = total_deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            break;
        }
        let left = u32::try_from(candidates.len() - i).unwrap_or(u32::MAX);
        let limits = Limits {
            budget: remaining / left,
            first_byte_timeout: p
                .first_byte_overrides
                .get(&route.id)
                .copied()
                .unwrap_or(p.config.first_byte_timeout),
            stream_idle_timeout: p.config.stream_idle_timeout,
        };
        let reservation: Option<Reservation> = match p.budget.get() {
            Some(b) if route.tier != Tier::Primary => {
                match b.reserve(&route.id, prompt_tokens, max_tokens) {
                    Ok(r) => r,
                    Err(refused) => {
                        tracing::warn!(route = %route.id, %refused, "not sent to a non-primary route: the extra-cost budget cannot cover it");
                        budget_refused = true;
                        d.fallback_reason
                            .get_or_insert_with(|| "extra_cost_budget".to_owned());
                        continue;
                    }
                }
            }
            _ => None,
        };
        d.attempts += 1;
        d.route = Some(route.id.clone());
        if d.fallback_reason.is_none() && route.tier != Tier::Primary && !plan.degraded {
            d.fallback_reason = Some("no_primary_usable".to_owned());
        }
        let started_at = p.clock.now();
        match p
            .upstream
            .attempt(route, &outgoing, limits, started_at)
            .await
        {
            Attempt::Answer { body, outcome } => {
                if let Some(r) = reservation {
                    let (input, output) = usage(&body)
                        .unwrap_or((prompt_tokens, u64::from(outcome.output_tokens.unwrap_or(0))));
                    r.settle(input, output);
                }
                p.passive.send(outcome);
                let mut r = Response::new(Body::from(body));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                return r;
            }
            Attempt::ClientError {
                status,
                content_type,
                body,
                outcome,
            } => {
                if let Some(r) = reservation {
                    r.release();
                }
                p.passive.send(outcome);
                let mut r = Response::new(Body::from(body));
                *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
                r.headers_mut().insert(header::CONTENT_TYPE, content_type);
                return r;
            }
            Attempt::Committed(c) => {
                let mut r = Response::new(Body::from_stream(stream::body(
                    *c,
                    p.passive.clone(),
                    reservation.map(|r| (r, prompt_tokens)),
                )));
                let h = r.headers_mut();
                h.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/event-stream"),
                );
                h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                h.insert("x-accel-buffering", HeaderValue::from_static("no"));
                return r;
            }
            Attempt::Failed { error, outcome } => {
                if let Some(r) = reservation {
                    r.release();
                }
                p.passive.send(outcome);
                let class = class_of(&error);
                if let ProbeError::RateLimited { retry_after_ms, .. } = &error {
                    let rest = retry_after_ms.map_or(attempt::DEFAULT_REST, Duration::from_millis);
                    p.rests.rest(&route.id, rest, Instant::now());
                }
                if class == Class::RouteFault {
                    tracing::warn!(route = %route.id, error = %error, "route fault (key, account or model name): trying the next candidate");
                } else {
                    tracing::info!(route = %route.id, error = %error, attempt = i + 1, "attempt failed: trying the next candidate");
                }
                // The first reason the request left its first choice is the one disclosed.
                d.fallback_reason.get_or_insert_with(|| reason_code(&error));
                failures.push(error);
            }
        }
    }
    if failures.is_empty() && budget_refused {
        return error_body(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream_error",
            "extra_cost_budget_exhausted",
            &format!("no primary route of `{model}` is usable and this hour's extra-cost budget for backups is spent; retry later"),
        );
    }
    exhausted(&model, &failures)
}

/// `max_tokens` assumed for the budget estimate when a request sets none.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// `usage.{prompt_tokens, completion_tokens}` of a non-streamed answer.
fn usage(body: &[u8]) -> Option<(u64, u64)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let u = v.get("usage")?;
    Some((
        u.get("prompt_tokens")?.as_u64()?,
        u.get("completion_tokens")?.as_u64()?,
    ))
}

/// Every candidate failed (or the time ran out).
fn exhausted(model: &str, failures: &[ProbeError]) -> Response {
    let all = |f: fn(&ProbeError) -> bool| !failures.is_empty() && failures.iter().all(f);
    if all(|e| matches!(e.status(), Some(401 | 403))) {
        return error_body(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "upstream_auth_error",
            &format!("every route of `{model}` refused the proxy's credentials; the operator has been told"),
        );
    }
    if all(|e| {
        matches!(
            e,
            ProbeError::TimeoutBeforeFirstByte | ProbeError::Timeout | ProbeError::Stalled
        )
    }) || failures.is_empty()
    {
        return error_body(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_error",
            "upstream_timeout",
            &format!("no route of `{model}` answered in time"),
        );
    }
    let last = failures.last().map(reason_code).unwrap_or_default();
    error_body(
        StatusCode::SERVICE_UNAVAILABLE,
        "upstream_error",
        "upstream_unavailable",
        &format!(
            "no route of `{model}` could answer ({} attempts, last: {last}); retry later",
            failures.len()
        ),
    )
}
