//! The proxy's normal path for one logical model ([`route`]): plan the candidates, then
//! attempt them in order. The candidate loop is a small state machine (`Failover`) with one
//! method per attempt result:
//!
//! - an answer (`answered`) or the client's own fault
//!   (`client_fault`) is returned as it is;
//! - a stream past its commit point (`committed`) is forwarded, never failed over;
//! - a failure (`failed`) moves on: transient faults and the route's own faults
//!   (key, account, model name) alike; transient ones (not 429s, which rest the route) may be
//!   retried on the same route with full-jitter backoff once every candidate was tried,
//!   within `max_attempts` and `max_retry_wait` of total waiting.
//!
//! Routes with an open breaker go last (tried only when everything else failed) and the
//! answer says `x-probeok-fallback-reason: breaker_open`. A route at its in-flight limit, or
//! whose provider is at its own ([`super::inflight`]), is skipped (`in_flight_limit`) without
//! a word to its breaker or its health; when every candidate was skipped so, the client gets
//! 429 naming the limits. A non-primary route first reserves its estimated maximum extra
//! cost from the hourly budget. Contracts are decided before this; the job worker calls
//! [`route`] directly (no contract applies to a job's run).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::time::Instant;

use super::attempt::{class_of, reason_code, Attempt, Class, Committed, Limits, Outgoing};
use super::breaker::{self, Verdict};
use super::inflight::{Held, Limited};
use super::record::{AttemptOutcome, Detour, Outcome, Tried, Usage};
use super::reject::Reject;
use super::request::{Answer, OutcomeSlot, RequestCtx};
use super::select::{self, Needs, Plan, Rejection};
use super::weights::WeightsView;
use super::{stream, Inner, Proxy};
use crate::extra_cost::Reservation;
use crate::probe::{ProbeError, ProbeOutcome};
use crate::route::{Route, RouteId, Tier};

/// `max_tokens` assumed for the budget estimate when a request sets none.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Serves `request` from the routes of `model` (see the module docs).
pub(crate) async fn route(
    proxy: &Proxy,
    ctx: &mut RequestCtx,
    request: &Value,
    model: &str,
    needs: &Needs,
    view: &WeightsView,
) -> Result<Answer, Reject> {
    let p = &proxy.inner;
    let now = Instant::now();
    let plan = plan(p, ctx, model, needs, view, now)?;
    disclose_plan(p, ctx, model, &plan);
    let degraded = plan.degraded;
    let candidates = breakers_last(p, ctx, plan.candidates, now);
    ctx.expect = super::structured::Expect::of(request);
    let mut run = Failover::new(proxy, ctx, request, needs.stream, candidates, degraded, now);
    while let Some((route, remaining)) = run.next_route().await {
        let Some(slot) = run.admit(&route).await else {
            continue;
        };
        if let Some(answer) = run.attempt(route, slot, remaining).await {
            return Ok(answer);
        }
    }
    Err(run.give_up(model))
}

/// The ordered candidates, or why there are none. Requests of an unknown model or that no
/// route can serve are not metered; the others are, under the model asked for.
fn plan(
    p: &Inner,
    ctx: &mut RequestCtx,
    model: &str,
    needs: &Needs,
    view: &WeightsView,
    now: Instant,
) -> Result<Plan, Reject> {
    let planned = {
        let mut rng = rand::thread_rng();
        select::plan(
            model,
            needs,
            &p.routes,
            view,
            |id| p.rests.is_resting(id, now),
            &mut rng,
        )
    };
    let model = model.to_owned();
    match planned {
        Ok(plan) => {
            ctx.serves(&model);
            Ok(plan)
        }
        Err(Rejection::UnknownModel) => Err(Reject::ModelNotFound { model }),
        Err(Rejection::NoCapableRoute { missing }) => {
            Err(Reject::NoCapableRoute { model, missing })
        }
        Err(Rejection::AllResting) => {
            ctx.serves(&model);
            let ids: Vec<RouteId> = (p.routes.iter())
                .filter(|r| r.serves == model)
                .map(|r| r.id.clone())
                .collect();
            let retry_after = p
                .rests
                .soonest_end(&ids, now)
                .unwrap_or(Duration::from_secs(1));
            Err(Reject::AllRateLimited { model, retry_after })
        }
    }
}

/// Since when the model has been served degraded (or the remote feed stale), and routes left
/// out because they rest after a 429.
fn disclose_plan(p: &Inner, ctx: &mut RequestCtx, model: &str, plan: &Plan) {
    let feed_stale = (p.feed.as_ref()).and_then(|f| f.stale_since(Instant::now(), p.clock.now()));
    ctx.d.degraded_since = (p.degraded_since)
        .track(model, plan.degraded, p.clock.now())
        .or(feed_stale);
    ctx.d.degraded_reason = if plan.degraded {
        Some("all_routes_unhealthy")
    } else if ctx.d.degraded_since.is_some() {
        Some("weights_feed_stale")
    } else {
        None
    };
    if !plan.resting.is_empty() {
        ctx.d.fallback_reason = Some(Detour::RateLimited.as_str().to_owned());
    }
}

/// Routes with an open breaker moved to the end (each noted as a skipped attempt).
fn breakers_last(
    p: &Inner,
    ctx: &mut RequestCtx,
    candidates: Vec<Arc<Route>>,
    now: Instant,
) -> Vec<Arc<Route>> {
    let first_open = (candidates.first()).is_some_and(|r| p.breakers.refuses(&r.id, now));
    let (mut closed, open): (Vec<Arc<Route>>, Vec<Arc<Route>>) = candidates
        .into_iter()
        .partition(|r| !p.breakers.refuses(&r.id, now));
    for r in &open {
        ctx.attempts
            .push(Tried::skipped(&r.id, Detour::BreakerOpen));
        p.counters.failover(Detour::BreakerOpen.as_str());
    }
    // Disclosed when a breaker moved the request off its first choice.
    if first_open {
        ctx.d.fallback(Detour::BreakerOpen.as_str());
    }
    closed.extend(open);
    closed
}

/// What an admitted attempt holds: its places in flight and its budget reservation.
struct Slot {
    held: Held,
    reservation: Option<Reservation>,
}

/// The candidate loop of one request.
struct Failover<'a> {
    proxy: &'a Proxy,
    ctx: &'a mut RequestCtx,
    request: &'a Value,
    stream: bool,
    /// Every weight of the model is 0 (no `no_primary_usable` then: nothing is).
    degraded: bool,
    queue: VecDeque<Arc<Route>>,
    /// Routes that failed transiently, for same-route retries once every candidate was tried.
    retry_pool: Vec<Arc<Route>>,
    max_attempts: usize,
    deadline: Instant,
    waited: Duration,
    retries: u32,
    /// The in-flight limits candidates were skipped at, in the order met.
    limited: Vec<Limited>,
    /// A non-primary route was skipped: the extra-cost budget could not cover it.
    budget_refused: bool,
    failures: Vec<ProbeError>,
    /// The budget's estimate of the request: prompt tokens and at most this many output.
    prompt_tokens: u64,
    max_tokens: u64,
}

impl<'a> Failover<'a> {
    fn new(
        proxy: &'a Proxy,
        ctx: &'a mut RequestCtx,
        request: &'a Value,
        stream: bool,
        mut candidates: Vec<Arc<Route>>,
        degraded: bool,
        now: Instant,
    ) -> Self {
        let config = &proxy.inner.config;
        let max_attempts = usize::try_from(config.max_attempts).unwrap_or(usize::MAX);
        candidates.truncate(max_attempts);
        let max_tokens = (request.get("max_tokens"))
            .or_else(|| request.get("max_completion_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_MAX_TOKENS);
        Self {
            proxy,
            ctx,
            request,
            stream,
            degraded,
            queue: candidates.into(),
            retry_pool: Vec::new(),
            max_attempts,
            deadline: now + config.total_timeout,
            waited: Duration::ZERO,
            retries: 0,
            limited: Vec::new(),
            budget_refused: false,
            failures: Vec::new(),
            prompt_tokens: select::estimate_prompt_tokens(request),
            max_tokens,
        }
    }

    fn inner(&self) -> &'a Inner {
        &self.proxy.inner
    }

    /// The next route to try and the time left, or `None` when the attempts, the time or the
    /// routes ran out.
    async fn next_route(&mut self) -> Option<(Arc<Route>, Duration)> {
        if self.ctx.d.attempts >= self.max_attempts {
            return None;
        }
        let route = match self.queue.pop_front() {
            Some(r) => r,
            None => self.retry().await?,
        };
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        (!remaining.is_zero()).then_some((route, remaining))
    }

    /// A route that failed transiently, after a full-jitter backoff (never eagerly), within
    /// `max_retry_wait` in total and the request's deadline.
    async fn retry(&mut self) -> Option<Arc<Route>> {
        let p = self.inner();
        let t = Instant::now();
        (self.retry_pool)
            .retain(|r| !p.breakers.refuses(&r.id, t) && !p.rests.is_resting(&r.id, t));
        if self.retry_pool.is_empty() {
            return None;
        }
        let r = self.retry_pool[self.retries as usize % self.retry_pool.len()].clone();
        let max_wait = p.config.max_retry_wait;
        let wait = {
            let mut rng = rand::thread_rng();
            breaker::backoff(self.retries, breaker::BACKOFF_BASE, max_wait, &mut rng)
        };
        if max_wait.is_zero() || self.waited + wait > max_wait || t + wait >= self.deadline {
            return None;
        }
        tokio::time::sleep(wait).await;
        self.waited += wait;
        self.retries += 1;
        Some(r)
    }

    /// Takes the request's places at the route and its provider (a full one is skipped, not
    /// waited for: a limit is not the route's failure) and, for a non-primary route, its
    /// extra-cost reservation. `None`: skipped.
    async fn admit(&mut self, route: &Arc<Route>) -> Option<Slot> {
        let p = self.inner();
        let held = match p.in_flight.admit(&route.id) {
            Ok(held) => held,
            Err(limited) => {
                let why = Detour::InFlightLimit;
                self.ctx.attempts.push(Tried::skipped(&route.id, why));
                p.counters.failover(why.as_str());
                self.ctx.d.fallback(why.as_str());
                if !self.limited.contains(&limited) {
                    self.limited.push(limited);
                }
                return None;
            }
        };
        let reservation = match p.budget.get() {
            Some(b) if route.tier != Tier::Primary => {
                match (b.reserve_shared(&route.id, self.prompt_tokens, self.max_tokens)).await {
                    Ok(r) => r,
                    Err(refused) => {
                        tracing::warn!(route = %route.id, %refused, "not sent to a non-primary route: the extra-cost budget cannot cover it");
                        self.budget_refused = true;
                        self.ctx.d.fallback(Detour::ExtraCostBudget.as_str());
                        return None;
                    }
                }
            }
            _ => None,
        };
        Some(Slot { held, reservation })
    }

    /// One attempt at `route`: `Some` is the request's answer, `None` moves on.
    async fn attempt(
        &mut self,
        route: Arc<Route>,
        slot: Slot,
        remaining: Duration,
    ) -> Option<Answer> {
        let p = self.inner();
        let left = u32::try_from(self.queue.len() + 1).unwrap_or(u32::MAX);
        let limits = Limits {
            budget: remaining / left,
            first_byte_timeout: (p.first_byte_overrides.get(&route.id).copied())
                .unwrap_or(p.config.first_byte_timeout),
            stream_idle_timeout: p.config.stream_idle_timeout,
            max_stream_duration: p.config.max_stream_duration,
        };
        // An open route here is a last resort; a half-open one takes a trial slot.
        let _ = p.breakers.admit(&route.id, Instant::now());
        self.ctx.d.attempts += 1;
        self.ctx.d.route = Some(route.id.clone());
        self.ctx.price = route.price.clone();
        self.ctx.d.reduced = route.tier == Tier::Fallback;
        if self.ctx.d.fallback_reason.is_none() && route.tier != Tier::Primary && !self.degraded {
            self.ctx.d.fallback_reason = Some(Detour::NoPrimaryUsable.as_str().to_owned());
        }
        let trace = super::trace::next_attempt(self.ctx);
        // The route's own profile, for this route only: the next candidate gets the client's
        // request as it came.
        let profiled = (p.profiles.get(&route.id))
            .and_then(|pr| super::profile::apply(pr, route.kind, self.request));
        self.ctx.d.profile = profiled.is_some().then(|| route.id.clone());
        let outgoing = Outgoing {
            body: profiled.as_ref().unwrap_or(self.request),
            stream: self.stream,
            request_id: &self.ctx.d.request_id,
            trace: trace.as_ref(),
        };
        let started_at = p.clock.now();
        let result = (self.proxy.local.upstream)
            .attempt(&route, &outgoing, limits, started_at)
            .await;
        let Slot { held, reservation } = slot;
        match result {
            Attempt::Answer {
                body,
                usage,
                outcome,
            } => Some(self.answered(&route, reservation, body, usage, outcome)),
            Attempt::ClientError {
                status,
                content_type,
                body,
                outcome,
            } => {
                let r = self.client_fault(&route, reservation, status, content_type, body, outcome);
                Some(r)
            }
            Attempt::Committed(c) => Some(self.committed(route, held, reservation, *c)),
            Attempt::Failed { error, outcome } => {
                self.failed(&route, reservation, error, outcome);
                None
            }
        }
    }

    /// A complete non-streamed answer (a refusal too: the request's answer, not the route's
    /// fault). Its usage settles the reservation and is metered.
    fn answered(
        &mut self,
        route: &Route,
        reservation: Option<Reservation>,
        body: Bytes,
        usage: Usage,
        outcome: ProbeOutcome,
    ) -> Answer {
        let p = self.inner();
        if let Some(r) = reservation {
            let estimate = (
                self.prompt_tokens,
                u64::from(outcome.output_tokens.unwrap_or(0)),
            );
            let (input, output) = usage.both().unwrap_or(estimate);
            r.settle(input, output);
        }
        let verdict = if outcome.success {
            p.ledger
                .record(&route.id, &self.ctx.client, None, Instant::now());
            Verdict::Success
        } else {
            Verdict::Neutral
        };
        p.breakers.record(&route.id, Instant::now(), verdict);
        let mut tried = Tried::sent(&outcome, None, AttemptOutcome::Ok);
        tried.usage.prompt_tokens = usage.prompt_tokens;
        tried.usage.completion_tokens = usage.completion_tokens.or(tried.usage.completion_tokens);
        tried.price(route.price.as_ref());
        self.ctx.attempts.push(tried);
        p.passive.send(outcome);
        self.ctx.outcome = Outcome::Ok;
        self.ctx.answer = Some(body.clone());
        let mut r = Response::new(Body::from(body));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Answer::Plain(r)
    }

    /// The request's own fault, returned as the upstream gave it (never tried elsewhere).
    fn client_fault(
        &mut self,
        route: &Route,
        reservation: Option<Reservation>,
        status: u16,
        content_type: HeaderValue,
        body: Bytes,
        outcome: ProbeOutcome,
    ) -> Answer {
        let p = self.inner();
        if let Some(r) = reservation {
            r.release();
        }
        p.breakers
            .record(&route.id, Instant::now(), Verdict::Neutral);
        let tried = Tried::sent(&outcome, None, AttemptOutcome::ClientError);
        self.ctx.attempts.push(tried);
        p.passive.send(outcome);
        self.ctx.outcome = Outcome::ClientError;
        self.ctx.answer = Some(body.clone());
        let mut r = Response::new(Body::from(body));
        *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        r.headers_mut().insert(header::CONTENT_TYPE, content_type);
        Answer::Plain(r)
    }

    /// A stream past its commit point: forwarded to its end, holding its places in flight
    /// until the body is dropped (its end, or the client leaving); the reservation is settled
    /// when it ends.
    fn committed(
        &mut self,
        route: Arc<Route>,
        held: Held,
        reservation: Option<Reservation>,
        c: Committed,
    ) -> Answer {
        self.ctx.attempts.push(Tried::committed(&route.id));
        let slot: OutcomeSlot = Arc::new(Mutex::new(None));
        let on_end = {
            let slot = slot.clone();
            Box::new(move |o: &ProbeOutcome, streamed: stream::Streamed| {
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((o.clone(), streamed));
            })
        };
        let charge = reservation.map(|r| (r, self.prompt_tokens));
        let p = self.inner();
        let whose = (p.ledger.clone(), self.ctx.client.clone());
        let inner = stream::body(c, p.passive.clone(), on_end, charge, whose);
        let body = inner
            .map(move |chunk| {
                let _held = &held;
                chunk
            })
            .boxed();
        Answer::Stream { body, slot, route }
    }

    /// The attempt failed: noted, and the request moves on to the next candidate.
    fn failed(
        &mut self,
        route: &Arc<Route>,
        reservation: Option<Reservation>,
        error: ProbeError,
        mut outcome: ProbeOutcome,
    ) {
        let p = self.inner();
        if let Some(r) = reservation {
            r.release();
        }
        let class = class_of(&error);
        let rate_limited = matches!(error, ProbeError::RateLimited { .. });
        let own = (p.ledger).record(&route.id, &self.ctx.client, Some(&error), Instant::now());
        if own {
            outcome.attributed_to = Some(self.ctx.client.clone());
        }
        // 429s rest the route until Retry-After; they do not also count as failures; nor
        // does a failure that is the request's own.
        let verdict = if rate_limited || own {
            Verdict::Neutral
        } else {
            Verdict::Failure
        };
        p.breakers.record(&route.id, Instant::now(), verdict);
        let reason = reason_code(&error);
        let tried = Tried::sent(&outcome, Some(reason.clone()), AttemptOutcome::Failed);
        self.ctx.attempts.push(tried);
        p.counters.failover(&reason);
        p.passive.send(outcome);
        if let ProbeError::RateLimited { retry_after_ms, .. } = &error {
            let rest = retry_after_ms.map_or(super::attempt::DEFAULT_REST, Duration::from_millis);
            p.rests.rest(&route.id, rest, Instant::now());
        }
        let attempt = self.ctx.d.attempts;
        if class == Class::RouteFault {
            tracing::warn!(route = %route.id, error = %error, class = class.as_str(), "route fault (key, account or model name): trying the next candidate");
        } else {
            tracing::info!(route = %route.id, error = %error, class = class.as_str(), attempt, "attempt failed: trying the next candidate");
        }
        if class == Class::Transient
            && !rate_limited
            && !self.retry_pool.iter().any(|r| r.id == route.id)
        {
            self.retry_pool.push(route.clone());
        }
        self.ctx.d.fallback(&reason);
        self.failures.push(error);
    }

    /// No candidate answered: why, in one rejection.
    fn give_up(self, model: &str) -> Reject {
        self.ctx.outcome = Outcome::Failed;
        let model = model.to_owned();
        let failures = &self.failures;
        if failures.is_empty() && !self.limited.is_empty() {
            // Nothing was sent: refused, as a request no route could take now.
            self.ctx.outcome = Outcome::Rejected;
            return Reject::in_flight_limit(model, self.limited);
        }
        if failures.is_empty() && self.budget_refused {
            return Reject::BudgetExhausted { model };
        }
        exhausted(model, failures)
    }
}

/// Every candidate failed (or the time ran out).
fn exhausted(model: String, failures: &[ProbeError]) -> Reject {
    let all = |f: fn(&ProbeError) -> bool| !failures.is_empty() && failures.iter().all(f);
    if all(|e| matches!(e.status(), Some(401 | 403))) {
        return Reject::UpstreamAuth { model };
    }
    let timed_out = |e: &ProbeError| {
        matches!(
            e,
            ProbeError::TimeoutBeforeFirstByte | ProbeError::Timeout | ProbeError::Stalled
        )
    };
    if failures.is_empty() || all(timed_out) {
        return Reject::UpstreamTimeout { model };
    }
    Reject::UpstreamUnavailable {
        model,
        attempts: failures.len(),
        last: failures.last().map(reason_code).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16) -> ProbeError {
        ProbeError::Http {
            status,
            message: String::new(),
        }
    }

    #[test]
    fn exhaustion_says_why_every_candidate_failed() {
        let m = || "chat".to_owned();
        assert_eq!(
            exhausted(m(), &[http(401), http(403)]).code(),
            "upstream_auth_error"
        );
        assert_eq!(exhausted(m(), &[]).code(), "upstream_timeout");
        assert_eq!(
            exhausted(
                m(),
                &[ProbeError::Stalled, ProbeError::TimeoutBeforeFirstByte]
            )
            .code(),
            "upstream_timeout"
        );
        let r = exhausted(m(), &[http(401), ProbeError::Timeout, http(503)]);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            r.to_string(),
            "no route of `chat` could answer (3 attempts, last: http_503); retry later"
        );
    }
}
