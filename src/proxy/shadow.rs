//! Shadow traffic (`[[shadow]]`): a sampled copy of a logical model's requests goes to a route
//! that gets no real traffic, after the client's answer is complete (for a stream: once it
//! ended), and the two answers are compared ([`compare`]). The copy is off the client's path
//! in every way:
//!
//! - a bounded queue and a bounded number of copies in flight: a full queue drops the copy
//!   (counted `queue_full`), never waits;
//! - each shadow's own hourly cost budget, reserved before sending (estimated prompt tokens and
//!   `max_tokens` at the route's price) and settled to the usage: spent means skipped
//!   (`budget`);
//! - never for a request with an `Idempotency-Key`, nor for a contract's own answer; never
//!   retried; never cached, metered, fed to detection or to any breaker: the shadow answer is
//!   read, measured and discarded.
//!
//! The comparisons live in memory, per shadow, for a day ([`compare::History`]); they are
//! reported by the monitor's `GET /api/v1/shadow` and on the shadow route's page.

pub(crate) mod compare;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use super::attempt::{Attempt, Committed, Limits, Outgoing, Upstream};
use super::structured::Expect;
use super::{failover, profile, select};
use crate::clock::Clock;
use crate::config::{Config, RequestProfile, ShadowConfig};
use crate::probe::wire::{Step, StreamDecoder};
use crate::route::{Price, Route, RouteId};
use compare::{Comparison, History, Side, Skip};

/// Copies waiting to be sent, at most (beyond: dropped and counted).
pub const QUEUE: usize = 64;
/// Copies in flight at once, at most.
pub const CONCURRENCY: usize = 4;

/// The shadow queue's bounds.
#[derive(Debug, Clone, Copy)]
pub struct ShadowLimits {
    pub queue: usize,
    pub concurrency: usize,
}

impl Default for ShadowLimits {
    fn default() -> Self {
        Self {
            queue: QUEUE,
            concurrency: CONCURRENCY,
        }
    }
}

/// One `[[shadow]]` with its route, its history and its spending this hour.
struct Entry {
    cfg: ShadowConfig,
    route: Arc<Route>,
    profile: Option<RequestProfile>,
    history: Mutex<History>,
    /// (hour since the epoch, spent in it).
    spend: Mutex<(i64, f64)>,
}

impl Entry {
    fn estimate(&self, request: &Value) -> f64 {
        let prompt = select::estimate_prompt_tokens(request);
        let max = (request.get("max_tokens"))
            .or_else(|| request.get("max_completion_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(failover::DEFAULT_MAX_TOKENS);
        cost(self.route.price.as_ref(), prompt, max)
    }

    /// Reserves `estimate` from this hour's budget; `false`: it cannot cover it.
    fn reserve(&self, estimate: f64, now: DateTime<Utc>) -> bool {
        let hour = now.timestamp().div_euclid(3600);
        let mut s = self.spend.lock().unwrap_or_else(|e| e.into_inner());
        if s.0 != hour {
            *s = (hour, 0.0);
        }
        if s.1 + estimate > self.cfg.max_cost_per_hour {
            return false;
        }
        s.1 += estimate;
        true
    }

    /// The reservation (made in the hour `reserved_in`) replaced by what the copy cost; a copy
    /// that outlived its hour is charged to the hour it ended in.
    fn settle(&self, reserved_in: i64, reserved: f64, actual: f64, now: DateTime<Utc>) {
        let hour = now.timestamp().div_euclid(3600);
        let mut s = self.spend.lock().unwrap_or_else(|e| e.into_inner());
        if s.0 == reserved_in {
            s.1 = (s.1 - reserved + actual).max(0.0);
        } else if s.0 == hour {
            s.1 += actual;
        } else {
            *s = (hour, actual);
        }
    }

    fn spent(&self, now: DateTime<Utc>) -> f64 {
        let s = self.spend.lock().unwrap_or_else(|e| e.into_inner());
        if s.0 == now.timestamp().div_euclid(3600) {
            s.1
        } else {
            0.0
        }
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn cost(price: Option<&Price>, prompt: u64, completion: u64) -> f64 {
    price.map_or(0.0, |p| {
        (prompt as f64 * p.input_per_mtok + completion as f64 * p.output_per_mtok) / 1e6
    })
}

/// A request sampled for copying, until its real answer is complete.
pub(crate) struct Pending {
    entries: Vec<usize>,
    request: Arc<Value>,
    stream: bool,
    pub expect: Expect,
    /// A stream's content as the client received it (for the validity check).
    pub content: String,
}

/// One copy on its way to a shadow route.
struct Job {
    entry: usize,
    request: Arc<Value>,
    stream: bool,
    expect: Expect,
    primary: Side,
    reserved: f64,
    /// The hour (since the epoch) the reservation was made in.
    reserved_in: i64,
}

/// What the sender needs, shared with the worker.
struct Sender {
    entries: Vec<Entry>,
    upstream: Arc<Upstream>,
    clock: Arc<dyn Clock>,
    limits: Limits,
}

/// Every shadow of the proxy, its queue and its worker.
pub(crate) struct Shadows {
    shared: Arc<Sender>,
    tx: mpsc::Sender<Job>,
}

impl Shadows {
    /// The shadows of `config` (none: `None`), with their worker started (inside a runtime).
    pub fn start(
        config: &Config,
        routes: &[Arc<Route>],
        upstream: Arc<Upstream>,
        clock: Arc<dyn Clock>,
        bounds: ShadowLimits,
    ) -> Option<Self> {
        let entries: Vec<Entry> = (config.shadows.iter())
            .filter_map(|cfg| {
                let route = routes.iter().find(|r| r.id.as_str() == cfg.route)?.clone();
                let profile = (config.routes.iter())
                    .find(|r| RouteId::new(&r.provider, &r.region, &r.model) == route.id)
                    .and_then(|r| r.request.clone());
                Some(Entry {
                    cfg: cfg.clone(),
                    route,
                    profile,
                    history: Mutex::default(),
                    spend: Mutex::new((0, 0.0)),
                })
            })
            .collect();
        if entries.is_empty() {
            return None;
        }
        let p = &config.proxy;
        let shared = Arc::new(Sender {
            entries,
            upstream,
            clock,
            limits: Limits {
                budget: p.total_timeout,
                first_byte_timeout: p.first_byte_timeout,
                stream_idle_timeout: p.stream_idle_timeout,
                max_stream_duration: p.max_stream_duration,
            },
        });
        let (tx, rx) = mpsc::channel(bounds.queue.max(1));
        let sem = Arc::new(Semaphore::new(bounds.concurrency.max(1)));
        tokio::spawn(work(shared.clone(), rx, sem));
        Some(Self { shared, tx })
    }

    /// The request sampled for the shadows of `model`, if any picks it. A request with an
    /// `Idempotency-Key` is counted as skipped instead.
    pub fn sample(
        &self,
        model: &str,
        idempotency_key: bool,
        request: &Value,
        stream: bool,
    ) -> Option<Pending> {
        let now = self.shared.clock.now();
        let mut entries = Vec::new();
        for (i, e) in self.shared.entries.iter().enumerate() {
            if e.cfg.serves != model || rand::random::<f64>() >= e.cfg.ratio {
                continue;
            }
            if idempotency_key {
                e.history().skipped(Skip::IdempotencyKey, now);
            } else {
                entries.push(i);
            }
        }
        (!entries.is_empty()).then(|| Pending {
            entries,
            request: Arc::new(request.clone()),
            stream,
            expect: Expect::of(request),
            content: String::new(),
        })
    }

    /// The real answer is complete: the copies go to the queue (or are counted as skipped).
    pub fn offer(&self, pending: Pending, primary: Option<Side>) {
        let now = self.shared.clock.now();
        for i in pending.entries {
            let e = &self.shared.entries[i];
            let Some(primary) = primary.clone() else {
                e.history().skipped(Skip::ClientGone, now);
                continue;
            };
            let estimate = e.estimate(&pending.request);
            if !e.reserve(estimate, now) {
                e.history().skipped(Skip::ExtraCost, now);
                continue;
            }
            let job = Job {
                entry: i,
                request: pending.request.clone(),
                stream: pending.stream,
                expect: pending.expect.clone(),
                primary,
                reserved: estimate,
                reserved_in: now.timestamp().div_euclid(3600),
            };
            match self.tx.try_send(job) {
                Ok(()) => e.history().copied(now),
                Err(_) => {
                    e.settle(now.timestamp().div_euclid(3600), estimate, 0.0, now);
                    e.history().skipped(Skip::QueueFull, now);
                }
            }
        }
    }

    /// `/api/v1/shadow`'s list: per shadow, the last hour and the last day.
    pub fn report(&self) -> Vec<Value> {
        let now = self.shared.clock.now();
        (self.shared.entries.iter())
            .map(|e| {
                let h = e.history();
                json!({
                    "serves": e.cfg.serves,
                    "route": e.cfg.route,
                    "ratio": e.cfg.ratio,
                    "max_cost_per_hour": e.cfg.max_cost_per_hour,
                    "spent_this_hour": e.spent(now),
                    "currency": e.route.price.as_ref().map(|p| p.currency.clone()),
                    "last_hour": h.report(now, chrono::Duration::hours(1)),
                    "last_day": h.report(now, chrono::Duration::days(1)),
                })
            })
            .collect()
    }
}

/// Takes a place first, then a copy: at most `concurrency` in flight and `queue` waiting.
async fn work(shared: Arc<Sender>, mut rx: mpsc::Receiver<Job>, sem: Arc<Semaphore>) {
    loop {
        let Ok(permit) = sem.clone().acquire_owned().await else {
            return;
        };
        let Some(job) = rx.recv().await else { return };
        let shared = shared.clone();
        tokio::spawn(async move {
            shared.send(job).await;
            drop(permit);
        });
    }
}

impl Sender {
    /// Sends one copy (once: never retried), measures the answer and discards it.
    async fn send(&self, job: Job) {
        let Some(e) = self.entries.get(job.entry) else {
            return;
        };
        let body = (e.profile.as_ref())
            .and_then(|p| profile::apply(p, e.route.kind, &job.request))
            .unwrap_or_else(|| (*job.request).clone());
        let request_id = format!("shadow_{:032x}", rand::random::<u128>());
        let outgoing = Outgoing {
            body: &body,
            stream: job.stream,
            request_id: &request_id,
            trace: None,
        };
        let result = (self.upstream)
            .attempt(&e.route, &outgoing, self.limits, self.clock.now())
            .await;
        let prompt_estimate = select::estimate_prompt_tokens(&body);
        let (shadow, prompt) = match result {
            Attempt::Answer {
                body,
                outcome,
                usage,
            } => {
                let content = compare::answer_content(&body);
                let side = Side {
                    success: outcome.success,
                    latency_ms: outcome.total_ms,
                    ttft_ms: outcome.ttft_ms,
                    output_tokens: (usage.completion_tokens)
                        .or(outcome.output_tokens.map(u64::from)),
                    valid: compare::validity(&job.expect, content.as_deref()),
                };
                (side, usage.prompt_tokens)
            }
            Attempt::ClientError { outcome, .. } | Attempt::Failed { outcome, .. } => {
                let side = Side {
                    success: false,
                    latency_ms: outcome.total_ms,
                    ..Side::default()
                };
                (side, Some(0))
            }
            Attempt::Committed(c) => (drain(*c, &job.expect).await, None),
        };
        let now = self.clock.now();
        let completion = shadow.output_tokens.unwrap_or(0);
        let actual = cost(
            e.route.price.as_ref(),
            prompt.unwrap_or(prompt_estimate),
            completion,
        );
        e.settle(job.reserved_in, job.reserved, actual, now);
        e.history().compared(Comparison {
            at: now,
            primary: job.primary,
            shadow,
        });
    }
}

/// Reads a committed shadow stream to its end (bounded by the stream watchdog's limits).
async fn drain(mut c: Committed, expect: &Expect) -> Side {
    let mut failed = c.client_fault.take().is_some();
    let mut done = c.first_step == Step::Done;
    while !done && !failed {
        match c.events.next().await {
            Some(Ok(ev)) => match c.decoder.feed(&ev) {
                Ok(step) => {
                    done = step == Step::Done;
                    if c.timing.ttft.is_none() && c.decoder.collected().has_content() {
                        c.timing.ttft = Some(Instant::now());
                    }
                }
                Err(_) => failed = true,
            },
            Some(Err(_)) => failed = true,
            None => break,
        }
    }
    let success = !failed && c.decoder.finish().is_ok();
    let ms = |t: Instant| (t - c.timing.start).as_secs_f64() * 1000.0;
    let collected = c.decoder.collected();
    Side {
        success,
        latency_ms: ms(Instant::now()),
        ttft_ms: c.timing.ttft.map(ms),
        output_tokens: collected.output_tokens().map(|(n, _)| u64::from(n)),
        valid: compare::validity(expect, Some(&collected.text)),
    }
}

/// The primary's side of a non-streamed answer.
pub(crate) fn plain_side(
    success: bool,
    latency: Duration,
    ttft_ms: Option<f64>,
    output_tokens: Option<u64>,
    expect: &Expect,
    answer: Option<&[u8]>,
) -> Side {
    let content = answer.and_then(compare::answer_content);
    Side {
        success,
        latency_ms: latency.as_secs_f64() * 1000.0,
        ttft_ms,
        output_tokens,
        valid: compare::validity(expect, content.as_deref()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn entry(max_cost_per_hour: f64) -> Entry {
        let config = Config::default();
        let rc = crate::config::RouteConfig::default();
        Entry {
            cfg: ShadowConfig {
                serves: "chat".into(),
                route: "p/r/m".into(),
                ratio: 1.0,
                max_cost_per_hour,
            },
            route: Arc::new(Route {
                id: RouteId::new("p", "r", "m"),
                provider: "p".into(),
                region: "r".into(),
                model: "m".into(),
                kind: crate::route::ProviderKind::Openai,
                base_url: "http://127.0.0.1:1".into(),
                api_key_env: None,
                serves: "chat".into(),
                tier: crate::route::Tier::Primary,
                weight: 100,
                price: Some(Price {
                    input_per_mtok: 0.0,
                    output_per_mtok: 1e6,
                    currency: "USD".into(),
                }),
                capabilities: Vec::new(),
                context_window: None,
                embedding: None,
                residency: None,
                slo: 0.999,
                probe: config.probe_settings(&rc),
            }),
            profile: None,
            history: Mutex::default(),
            spend: Mutex::new((0, 0.0)),
        }
    }

    #[test]
    fn the_budget_reserves_the_maximum_settles_the_real_cost_and_turns_with_the_hour() {
        let e = entry(3.0);
        // One output token costs 1.0 here: a copy with max_tokens 2 reserves 2.0.
        let ask = serde_json::json!({"max_tokens": 2, "messages": []});
        assert!((e.estimate(&ask) - 2.0).abs() < 1e-9);
        let t = Utc.with_ymd_and_hms(2026, 1, 1, 10, 30, 0).unwrap();
        let hour = t.timestamp().div_euclid(3600);
        assert!(e.reserve(2.0, t));
        assert!(!e.reserve(2.0, t), "2 + 2 > 3");
        e.settle(hour, 2.0, 1.0, t);
        assert!((e.spent(t) - 1.0).abs() < 1e-9);
        assert!(e.reserve(2.0, t), "1 + 2 <= 3");
        // The next hour starts afresh; a copy reserved in the last hour is charged to it.
        let next = t + chrono::Duration::hours(1);
        assert_eq!(e.spent(next), 0.0);
        assert!(e.reserve(2.0, next));
        e.settle(hour, 2.0, 0.5, next);
        assert!((e.spent(next) - 2.5).abs() < 1e-9);
    }
}
