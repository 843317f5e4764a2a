//! Applying a degradation contract (the I/O shell around the pure [`super::contract`]).
//!
//! Every contract answer says so: `x-probeok-mode` (`fallback` for a fallback model, else
//! `degraded`), `x-probeok-user-message` (percent-encoded UTF-8) when the contract has one,
//! and a top-level `"probeok": {mode, feature, contract, user_message}` (the OpenAI SDKs keep
//! unknown fields), completed by [`super::notice`] as every non-normal answer is — in a JSON
//! body or a stream's first chunk. When a behaviour cannot be used, the request is served as without a
//! contract and `x-probeok-contract` says why (`fallback_model_unusable`,
//! `async_queue_unavailable`); a `cached_response` miss says `x-probeok-cache: miss`.
//! Contract answers still get `x-request-id`, `x-probeok-route` (`none` when no upstream was
//! called) and `x-probeok-attempts`, and are metered with the behaviour in
//! `proxy_requests.contract`.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::time::Instant;

use super::contract::{self, Decision};
use super::intake::Intake;
use super::record::Outcome;
use super::reject::{set_retry_after, Reject};
use super::request::{Answer, Mode, RequestCtx};
use super::select;
use super::weights::WeightsView;
use super::{cache, failover, jobs, Proxy};
use crate::config::Behaviour;

/// Applies the request's contract, if one applies now: `Some` is the answer; `None` means
/// "serve it the normal way" (with whatever the contract added to the disclosure).
pub(super) async fn apply(
    proxy: &Proxy,
    ctx: &mut RequestCtx,
    req: &Intake,
    view: &WeightsView,
) -> Option<Result<Answer, Reject>> {
    let p = &proxy.inner;
    let live = p.live.borrow().clone();
    let chosen = live.contract_for(req.feature.as_deref());
    let feature = contract::reported_feature(req.feature.as_deref());
    // Only a contract needs the owner (a digest of the client's key).
    let owner = chosen.map_or_else(String::new, |_| contract::owner_of(&req.client_key));
    let now = p.clock.now();
    // A contract with `cached_response` remembers every successful answer, healthy or not.
    if let (Some(c), Some(_)) = (chosen, &p.cache) {
        if contract::cache_max_age(c).is_some() {
            let longest = contract::longest_cache_age(&live.contracts).unwrap_or_default();
            ctx.cache = Some(cache::Slot {
                key: contract::cache_key(&req.request, req.needs.stream, feature, &owner),
                owner: owner.clone(),
                feature: feature.to_owned(),
                stream: req.needs.stream,
                purge_before: now - chrono::Duration::from_std(longest).unwrap_or_default(),
            });
        }
    }
    // No contract, nothing to track: the common path takes no lock.
    chosen?;
    let severity = contract::severity(view, &req.model);
    let since = (p.contract_since)
        .track(&req.model, severity.is_some(), now)
        .unwrap_or(now);
    let d = contract::decide(chosen, severity)?;
    if let Some(m) = &d.user_message {
        ctx.d
            .extra
            .push(("x-probeok-user-message", contract::encode_user_message(m)));
    }
    let applying = Applying {
        proxy,
        req,
        view,
        feature,
        owner,
        now,
        since,
        d: &d,
    };
    match &d.behaviour {
        Behaviour::Reject { message } => {
            applying.used(ctx, Some(Outcome::Rejected));
            Some(Err(Reject::FeatureDegraded {
                message: message.clone(),
                retry_after: d.retry_after,
                probeok: applying.block("degraded"),
            }))
        }
        Behaviour::CachedResponse { max_age } => applying.cached(ctx, *max_age).await.map(Ok),
        Behaviour::FallbackModel(fallback) => applying.fallback(ctx, fallback).await,
        Behaviour::AsyncQueue { ttl } => applying.queue(ctx, *ttl).await,
    }
}

/// One contract decision being applied to one request.
struct Applying<'a> {
    proxy: &'a Proxy,
    req: &'a Intake,
    view: &'a WeightsView,
    /// The feature as reported (`default` when the request named none).
    feature: &'a str,
    /// `sha256(client key)`.
    owner: String,
    now: DateTime<Utc>,
    /// Since when the model's contract has applied.
    since: DateTime<Utc>,
    d: &'a Decision,
}

impl Applying<'_> {
    /// The `"probeok"` object of this contract's answers.
    fn block(&self, mode: &str) -> Value {
        let name = self.d.behaviour.name();
        contract::block(mode, self.feature, name, self.d.user_message.as_deref())
    }

    /// Records that the contract answered: the disclosure, metering and the counter.
    /// `outcome`: the contract answered itself (`None`: its fallback model serves).
    fn used(&self, ctx: &mut RequestCtx, outcome: Option<Outcome>) {
        let name = self.d.behaviour.name();
        ctx.contract = Some(name);
        ctx.serves = self.req.model.clone();
        if let Some(outcome) = outcome {
            ctx.outcome = outcome;
            ctx.d.mode = Some(Mode::Degraded);
            ctx.d.degraded_since.get_or_insert(self.since);
        }
        let counters = &self.proxy.inner.counters;
        counters.contract_use(&self.d.contract_feature, name);
    }

    /// `cached_response`: the last successful answer within `max_age`, with its `Age`.
    async fn cached(&self, ctx: &mut RequestCtx, max_age: Duration) -> Option<Answer> {
        let hit = match (&ctx.cache, &self.proxy.inner.cache) {
            (Some(slot), Some(cache)) => cache.lookup(&slot.key, self.now, max_age).await,
            _ => None,
        };
        let Some(hit) = hit else {
            ctx.d.extra.push(("x-probeok-cache", "miss".to_owned()));
            return None;
        };
        // Never remember a replayed answer as if it were new.
        ctx.cache = None;
        let age = (self.now - hit.stored_at).num_seconds().max(0);
        let (content_type, body) = if hit.stream {
            // The notice puts these keys into the replay's first chunk.
            ctx.probeok = Some(self.block("degraded"));
            ("text/event-stream", hit.body)
        } else {
            let block = self.block("degraded");
            let body = contract::with_block(&hit.body, &block).unwrap_or(hit.body);
            ("application/json", body)
        };
        let mut r = Response::new(Body::from(body));
        *r.status_mut() = StatusCode::from_u16(hit.status).unwrap_or(StatusCode::OK);
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        h.insert(header::AGE, HeaderValue::from(age));
        if hit.stream {
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        }
        ctx.d.extra.push(("x-probeok-cache", "hit".to_owned()));
        self.used(ctx, Some(Outcome::Cached));
        Some(Answer::Plain(r))
    }

    /// `fallback_model`: the request served by another logical model, when that one is usable.
    async fn fallback(
        &self,
        ctx: &mut RequestCtx,
        fallback: &str,
    ) -> Option<Result<Answer, Reject>> {
        let req = self.req;
        if !fallback_usable(self.proxy, fallback, req, self.view) {
            tracing::info!(model = %req.model, fallback = %fallback, "contract fallback model unusable (degraded, down or incapable); serving the original model");
            ctx.d
                .extra
                .push(("x-probeok-contract", "fallback_model_unusable".to_owned()));
            return None;
        }
        // The fallback's own contract never applies (no loops): straight to its routes.
        ctx.cache = None;
        ctx.d.fallback_reason = Some(contract::FALLBACK_REASON.to_owned());
        ctx.d.extra.push(("x-probeok-model", fallback.to_owned()));
        ctx.probeok = Some(self.block("fallback"));
        self.used(ctx, None);
        let served = failover::route(
            self.proxy,
            ctx,
            &req.request,
            fallback,
            &req.needs,
            self.view,
        );
        Some(served.await)
    }

    /// `async_queue`: the request stored as a job, answered 202 with where to poll.
    async fn queue(&self, ctx: &mut RequestCtx, ttl: Duration) -> Option<Result<Answer, Reject>> {
        let unavailable = |ctx: &mut RequestCtx| {
            ctx.d
                .extra
                .push(("x-probeok-contract", "async_queue_unavailable".to_owned()));
        };
        let Some(queue) = &self.proxy.inner.jobs else {
            unavailable(ctx);
            return None;
        };
        let req = self.req;
        let new = jobs::NewJob {
            owner: self.owner.clone(),
            feature: self.feature.to_owned(),
            model: req.model.clone(),
            residency: req.residency.clone(),
            stream_requested: req.needs.stream,
            request: req.raw.to_vec(),
            ttl,
            now: self.now,
        };
        let retry_after = self.d.retry_after;
        match queue.create(new).await {
            jobs::Created::Queued(job) => {
                let mut body = jobs::job_json(&job, retry_after);
                body["probeok"] = self.block("degraded");
                let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
                // Kept for an Idempotency-Key: a retry gets the same job, not a new one.
                ctx.answer = Some(bytes.clone());
                let mut r = Response::new(Body::from(bytes));
                *r.status_mut() = StatusCode::ACCEPTED;
                let h = r.headers_mut();
                h.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                if let Ok(v) = HeaderValue::from_str(&jobs::poll_path(&job.id)) {
                    h.insert(header::LOCATION, v);
                }
                set_retry_after(&mut r, retry_after);
                self.used(ctx, Some(Outcome::Queued));
                Some(Ok(Answer::Plain(r)))
            }
            jobs::Created::Full => {
                self.used(ctx, Some(Outcome::Rejected));
                Some(Err(Reject::QueueFull {
                    max: jobs::MAX_QUEUED,
                    retry_after,
                    probeok: self.block("degraded"),
                }))
            }
            jobs::Created::ClientFull => {
                self.used(ctx, Some(Outcome::Rejected));
                Some(Err(Reject::ClientQueueFull {
                    max: jobs::MAX_QUEUED_PER_CLIENT,
                    retry_after,
                    probeok: self.block("degraded"),
                }))
            }
            jobs::Created::Unavailable => {
                unavailable(ctx);
                None
            }
        }
    }
}

/// The fallback model is usable: not DEGRADED/CRITICAL itself, and it has a usable route able
/// to serve this request (same needs: capabilities, context, residency).
fn fallback_usable(proxy: &Proxy, fallback: &str, req: &Intake, view: &WeightsView) -> bool {
    if contract::severity(view, fallback).is_some() {
        return false;
    }
    let p = &proxy.inner;
    let now = Instant::now();
    let mut rng = rand::thread_rng();
    match select::plan(
        fallback,
        &req.needs,
        &p.routes,
        view,
        |id| p.rests.is_resting(id, now),
        &mut rng,
    ) {
        Ok(plan) => !plan.degraded && !plan.candidates.is_empty(),
        Err(_) => false,
    }
}
