//! The long-prompt probe: prefill time grows with context, so a route can answer a 20-token
//! `PROBE_OK` fast and an 8,000-token prompt slowly. With `[capability] long_prompt = {
//! tokens, every }` every chat route is sent [`prompt::text`] (about `tokens` tokens, a code
//! word to retrieve at its end) every `every`, streamed through the chat probe's own client
//! ([`crate::probe::ProbeClient::chat`]: the same dialects, SSE reading and TTFT clock).
//!
//! - [`prompt`]: the deterministic prompt and the answer check (pure);
//! - [`judge`]: the route's own TTFT baseline and when a result is `long_prompt_slow` or
//!   `capability_lost: long_prompt` (pure);
//! - [`run`]: the leader's task — spread over the interval, a bounded few at a time
//!   ([`in_flight`]), every result stored as a `long_prompt` row of the capability table (its
//!   latency the TTFT), the open findings published on a `watch` channel beside the
//!   capability probes'.
//!
//! `long_prompt_slow` is a warning: no failure mode, no state, no weight moves.

pub mod judge;
pub mod prompt;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::capability::judge::{chat_answers, Verdict};
use crate::clock::Clock;
use crate::config::LongPromptConfig;
use crate::drift::DriftFinding;
use crate::health::HealthRx;
use crate::probe::{ChatMessage, ChatRequest, ProbeClient, ProbeSetupError, Role};
use crate::route::{Route, RouteId};
use crate::secret::Env;
use crate::store::capabilities::{CapabilityOp, CapabilityRow};
use crate::store::Store;

use judge::{Answer, Judged};

/// The fewest long prompts in flight at once.
pub const MIN_IN_FLIGHT: usize = 2;
/// The most: each holds a provider busy with thousands of tokens.
pub const MAX_IN_FLIGHT: usize = 16;
/// What one long prompt is assumed to take when sizing the bound.
const PROBE_TIME: Duration = Duration::from_secs(30);
/// The least a long prompt is given to answer: prefill of a long context takes seconds where
/// the short probe's timeout is tuned for milliseconds.
pub const MIN_TIMEOUT: Duration = Duration::from_secs(120);
/// A reason kept in a row or a finding is at most this long.
const MAX_REASON: usize = 160;

/// How many of `routes` long prompts may be in flight at once so each route is probed every
/// `every` even when each takes [`PROBE_TIME`].
pub fn in_flight(routes: usize, every: Duration) -> usize {
    crate::capability::cadence::bound(routes, every, PROBE_TIME, MIN_IN_FLIGHT, MAX_IN_FLIGHT)
}

/// Whether `route` gets the long prompt: chat routes only (an embeddings route answers no
/// conversation).
pub fn probed(route: &Route) -> bool {
    route.embedding.is_none()
}

/// What the task needs.
pub struct LongPromptDriver {
    pub routes: Arc<Vec<Route>>,
    pub config: LongPromptConfig,
    /// Where the key variables are read.
    pub env: Env,
    /// Where results are kept and the baselines resumed from; `None` keeps none.
    pub store: Option<Store>,
    /// How long results are kept (as raw outcomes).
    pub retention: Duration,
    pub clock: Arc<dyn Clock>,
    /// Detection's snapshot: failures while chat fails are the outage's.
    pub health: HealthRx,
}

/// One probe's result.
pub struct Done {
    item: usize,
    started: Instant,
    at: chrono::DateTime<chrono::Utc>,
    answer: Answer,
    /// TTFT of an answer, total time of a failure.
    latency_ms: u64,
}

/// The long prompts of one leader term. [`run`] drives it on the cadence; tests drive it
/// probe by probe ([`LongProber::probe`], [`LongProber::pass`]).
pub struct LongProber {
    d: LongPromptDriver,
    routes: Vec<Arc<Route>>,
    client: ProbeClient,
    text: Arc<String>,
    judge: judge::Judge,
    findings: watch::Sender<Arc<Vec<DriftFinding>>>,
}

impl LongProber {
    /// Builds the prober and resumes each route's baseline from the store.
    pub async fn new(
        d: LongPromptDriver,
        findings: watch::Sender<Arc<Vec<DriftFinding>>>,
    ) -> Result<Self, ProbeSetupError> {
        let routes: Vec<Arc<Route>> = d
            .routes
            .iter()
            .filter(|r| probed(r))
            .map(|r| Arc::new(r.clone()))
            .collect();
        let plain: Vec<Route> = routes.iter().map(|r| (**r).clone()).collect();
        let client = ProbeClient::with_env(&plain, d.clock.clone(), &d.env)?;
        let mut judge = judge::Judge::default();
        if let Some(store) = d.store.clone() {
            let stored = tokio::task::spawn_blocking(move || {
                store
                    .reader()
                    .and_then(|r| r.capability_recent_good(judge::NAME, judge::WINDOW))
            })
            .await;
            match stored {
                Ok(Ok(rows)) => {
                    for (route, v) in rows {
                        if let Some(r) = routes.iter().find(|r| r.id.as_str() == route) {
                            let good: Vec<f64> = v.iter().map(|&ms| ms as f64).collect();
                            judge.resume(&r.id, &good);
                        }
                    }
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "long prompt: baselines not resumed"),
                Err(e) => tracing::warn!(error = %e, "long prompt: baselines not resumed"),
            }
        }
        let text = Arc::new(prompt::text(d.config.tokens));
        Ok(Self {
            d,
            routes,
            client,
            text,
            judge,
            findings,
        })
    }

    /// The routes probed, in order.
    pub fn routes(&self) -> Vec<RouteId> {
        self.routes.iter().map(|r| r.id.clone()).collect()
    }

    /// The route's baseline TTFT (ms) now, once formed.
    pub fn baseline(&self, route: &RouteId) -> Option<f64> {
        self.judge.baseline(route)
    }

    fn send(&self, i: usize) -> impl std::future::Future<Output = Done> + Send + 'static {
        let route = self.routes[i].clone();
        let client = self.client.clone();
        let text = self.text.clone();
        async move {
            let timeout = route.probe.timeout.max(MIN_TIMEOUT);
            let request = ChatRequest {
                messages: vec![ChatMessage::new(Role::User, text.as_str())],
                max_tokens: prompt::MAX_TOKENS,
                temperature: 0.0,
                stream: true,
                timeout,
                first_byte_timeout: timeout,
            };
            let started = Instant::now();
            let o = client.chat(&route, &request).await;
            let (answer, latency) = match o.error {
                None => {
                    let ttft = o.ttft_ms.unwrap_or(o.total_ms);
                    (
                        Answer::Answered {
                            ttft_ms: ttft,
                            correct: prompt::answered(&o.text),
                        },
                        ttft,
                    )
                }
                Some(e) => (Answer::Failed(short(&e.to_string())), o.total_ms),
            };
            Done {
                item: i,
                started,
                at: o.started_at,
                answer,
                latency_ms: latency.max(0.0).round() as u64,
            }
        }
    }

    async fn take(&mut self, done: &Done) -> Verdict {
        let route = self.routes[done.item].clone();
        let chat_ok = chat_answers(self.d.health.borrow().route(&route.id));
        let judged = self
            .judge
            .observe(&route.id, &done.answer, chat_ok, done.at);
        if let Some(note) = &judged.note {
            tracing::info!(route = %route.id, note = %note, chat_ok, "long prompt: not a good result");
        }
        self.record(&route, done, &judged).await;
        let open = self.judge.findings();
        self.findings.send_if_modified(|cur| {
            let changed = cur.as_slice() != open.as_slice();
            if changed {
                *cur = Arc::new(open);
            }
            changed
        });
        judged.verdict
    }

    /// Probes route `i` once and judges it.
    pub async fn probe(&mut self, i: usize) -> Verdict {
        let done = self.send(i).await;
        self.take(&done).await
    }

    /// Probes every route once, in order.
    pub async fn pass(&mut self) -> Vec<Verdict> {
        let mut out = Vec::with_capacity(self.routes.len());
        for i in 0..self.routes.len() {
            out.push(self.probe(i).await);
        }
        out
    }

    /// Queues the result in the store without waiting for its commit.
    async fn record(&self, route: &Route, done: &Done, judged: &Judged) {
        let Some(store) = &self.d.store else { return };
        let keep_since = chrono::Duration::from_std(self.d.retention)
            .ok()
            .and_then(|r| done.at.checked_sub_signed(r))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let op = CapabilityOp {
            row: CapabilityRow {
                route: route.id.to_string(),
                capability: judge::NAME.to_owned(),
                at: done.at,
                ok: matches!(done.answer, Answer::Answered { correct: true, .. }),
                latency_ms: done.latency_ms,
                error: judged.note.as_deref().map(short),
            },
            keep_since,
        };
        match store.writer().queue_capability(op).await {
            Ok(queued) => {
                tokio::spawn(async move {
                    if let Err(e) = queued.committed().await {
                        tracing::warn!(error = %e, "long prompt: result not stored");
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "long prompt: result not stored"),
        }
    }
}

fn short(s: &str) -> String {
    let mut out: String = s.chars().take(MAX_REASON).collect();
    if s.chars().count() > MAX_REASON {
        out.push('…');
    }
    out
}

impl crate::capability::cadence::Cadenced for LongProber {
    type Done = Done;

    fn send(&self, i: usize) -> impl std::future::Future<Output = Done> + Send + 'static {
        LongProber::send(self, i)
    }

    fn take(&mut self, done: &Done) -> impl std::future::Future<Output = Verdict> + Send {
        LongProber::take(self, done)
    }

    fn slot(done: &Done) -> (usize, Instant) {
        (done.item, done.started)
    }
}

/// Sends the long prompt to every chat route at `long_prompt.every`, the first round spread
/// evenly over one interval, at most [`in_flight`] at a time; a first slow or wrong result is
/// probed again after [`judge::RECHECK`]. Without `d` (the key absent) it sends nothing and
/// waits for `shutdown`.
pub async fn run(
    d: Option<LongPromptDriver>,
    findings: watch::Sender<Arc<Vec<DriftFinding>>>,
    shutdown: CancellationToken,
) {
    let Some(d) = d else {
        shutdown.cancelled().await;
        return;
    };
    let every = d.config.every;
    let p = match LongProber::new(d, findings).await {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "long prompt: not run");
            shutdown.cancelled().await;
            return;
        }
    };
    let n = p.routes.len();
    if n == 0 {
        shutdown.cancelled().await;
        return;
    }
    crate::capability::cadence::run(p, n, every, in_flight(n, every), shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_stays_small() {
        let day = Duration::from_secs(86_400);
        assert_eq!(in_flight(10, day), MIN_IN_FLIGHT);
        // 20,000 routes daily at 30 s each: 7 at once.
        assert_eq!(in_flight(20_000, day), 7);
        assert_eq!(in_flight(200_000, Duration::from_secs(3600)), MAX_IN_FLIGHT);
    }
}
