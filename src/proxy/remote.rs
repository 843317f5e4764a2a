//! The standalone proxy's link to a remote monitor (`probeok proxy --weights-from URL`).
//!
//! - [`follow`]: subscribes to `{URL}/api/v1/weights/stream` (SSE, `event: weights`, `id:
//!   <version>`, comment heartbeats every 15 s). Every byte received marks the feed alive
//!   ([`FeedStatus::seen`]); each `weights` event replaces the proxy's view. On any end or
//!   error — and after a silence of `stale_after`, which means a dead connection — it
//!   reconnects with full-jitter backoff (250 ms doubling up to 30 s), sending `Last-Event-ID`.
//!   The last known weights stay in force meanwhile; before the first event the configured
//!   weights apply. Several proxies can follow one monitor: each is just one SSE client.
//! - [`ingest`]: the proxy's passive outcomes go to `{URL}/api/v1/ingest` as JSON arrays
//!   (`ProbeOutcome`'s own serde form) of at most [`INGEST_BATCH`], at least every second, with
//!   the bearer token from `server.ingest_token_env`. A bounded buffer ([`INGEST_BUFFER`])
//!   holds them while the monitor is away; beyond it the oldest are dropped and counted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::header::{ACCEPT, AUTHORIZATION};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::breaker::backoff;
use super::weights::{FeedStatus, WeightsView};
use crate::gather::Gather;
use crate::probe::ProbeOutcome;
use crate::secret::Secret;

/// No event and no heartbeat for this long: the feed is stale (3 missed heartbeats).
pub const STALE_AFTER: Duration = Duration::from_secs(45);
const RECONNECT_MIN: Duration = Duration::from_millis(250);
const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// Outcomes per ingest request, at most.
pub const INGEST_BATCH: usize = 256;
/// Outcomes held while the monitor is unreachable, at most.
pub const INGEST_BUFFER: usize = 10_000;
const INGEST_EVERY: Duration = Duration::from_secs(1);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .user_agent(concat!("probeok-proxy/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default()
}

/// Follows the monitor's weights feed until `shutdown`.
pub fn follow(
    base: String,
    weights: watch::Sender<Arc<WeightsView>>,
    status: Arc<FeedStatus>,
    stale_after: Duration,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let http = client();
        let url = format!("{}/api/v1/weights/stream", base.trim_end_matches('/'));
        let mut last_id: Option<String> = None;
        let mut failures = 0u32;
        loop {
            let mut req = http.get(&url).header(ACCEPT, "text/event-stream");
            if let Some(id) = &last_id {
                req = req.header("Last-Event-ID", id.as_str());
            }
            let sent = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = tokio::time::timeout(stale_after, req.send()) => r,
            };
            match sent {
                Ok(Ok(resp)) if resp.status().is_success() => {
                    status.seen();
                    let alive = status.clone();
                    let mut events = sse_parse::EventStream::new(
                        resp.bytes_stream().inspect(move |_| alive.seen()),
                    );
                    loop {
                        let next = tokio::select! {
                            _ = shutdown.cancelled() => return,
                            n = tokio::time::timeout(stale_after, events.next()) => n,
                        };
                        match next {
                            Ok(Some(Ok(ev))) if ev.event == "weights" => {
                                match WeightsView::from_json(ev.data.as_bytes()) {
                                    Ok(view) => {
                                        failures = 0;
                                        if !ev.id.is_empty() {
                                            last_id = Some(ev.id.clone());
                                        }
                                        tracing::debug!(version = %view.version, "weights from the monitor");
                                        weights.send_replace(Arc::new(view));
                                    }
                                    Err(e) => {
                                        tracing::warn!(error = %e, "unreadable weights event; keeping the last weights")
                                    }
                                }
                            }
                            Ok(Some(Ok(_))) => {}
                            Ok(Some(Err(e))) => {
                                tracing::warn!(error = %e, "weights feed broke; reconnecting");
                                break;
                            }
                            Ok(None) => {
                                tracing::warn!("weights feed ended; reconnecting");
                                break;
                            }
                            Err(_) => {
                                tracing::warn!("weights feed silent; reconnecting");
                                break;
                            }
                        }
                    }
                }
                Ok(Ok(resp)) => {
                    tracing::warn!(status = %resp.status(), "weights feed refused; retrying")
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "weights feed unreachable; retrying"),
                Err(_) => tracing::warn!("weights feed did not answer; retrying"),
            }
            let wait = RECONNECT_MIN
                + backoff(
                    failures,
                    RECONNECT_MIN,
                    RECONNECT_MAX,
                    &mut rand::thread_rng(),
                );
            failures = failures.saturating_add(1);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    })
}

/// How [`ingest_with`] batches and buffers.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// Outcomes per request, at most.
    pub batch: usize,
    /// Outcomes held while the monitor is unreachable, at most (the oldest go first).
    pub buffer: usize,
    /// A partial batch is sent this often; after a failed send, the next try waits for it.
    pub every: Duration,
}

impl Default for IngestOptions {
    fn default() -> Self {
        Self {
            batch: INGEST_BATCH,
            buffer: INGEST_BUFFER,
            every: INGEST_EVERY,
        }
    }
}

/// Sends passive outcomes to the monitor in batches until `outcomes` closes (then one last
/// flush). Returns the task and the dropped count.
pub fn ingest(
    base: String,
    token: Option<Secret>,
    outcomes: mpsc::Receiver<ProbeOutcome>,
) -> (JoinHandle<()>, Arc<AtomicU64>) {
    ingest_with(base, token, outcomes, IngestOptions::default())
}

/// [`ingest`] with explicit batching. A full batch is sent at once while the monitor takes
/// them; once a send failed, nothing is tried before the next tick (never eagerly: a monitor
/// that is down gets one attempt per `every`, not one per outcome).
pub fn ingest_with(
    base: String,
    token: Option<Secret>,
    mut outcomes: mpsc::Receiver<ProbeOutcome>,
    opts: IngestOptions,
) -> (JoinHandle<()>, Arc<AtomicU64>) {
    let dropped = Arc::new(AtomicU64::new(0));
    let counted = dropped.clone();
    let batch_max = opts.batch.max(1);
    let capacity = opts.buffer.max(1);
    let task = tokio::spawn(async move {
        let http = client();
        let url = format!("{}/api/v1/ingest", base.trim_end_matches('/'));
        let mut buffer: VecDeque<ProbeOutcome> = VecDeque::new();
        let mut tick = tokio::time::interval(opts.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut open = true;
        // The last send failed: wait for the next tick.
        let mut failing = false;
        // Woken once per gathering: the proxy sends one outcome per request.
        let mut gather = Gather::new(crate::gather::PAUSE);
        let mut taken = Vec::new();
        while open || !buffer.is_empty() {
            let flush = tokio::select! {
                n = gather.take(&mut outcomes, &mut taken, batch_max), if open => {
                    if n == 0 {
                        open = false;
                    }
                    for o in taken.drain(..) {
                        if buffer.len() >= capacity {
                            buffer.pop_front();
                            let n = counted.fetch_add(1, Ordering::Relaxed) + 1;
                            if n.is_power_of_two() {
                                tracing::warn!(dropped = n, "passive outcomes dropped: the monitor is not taking them");
                            }
                        }
                        buffer.push_back(o);
                    }
                    !open || (buffer.len() >= batch_max && !failing)
                }
                _ = tick.tick() => {
                    failing = false;
                    true
                }
            };
            if !flush {
                continue;
            }
            while !buffer.is_empty() {
                let n = buffer.len().min(batch_max);
                let batch: Vec<&ProbeOutcome> = buffer.iter().take(n).collect();
                let mut req = http
                    .post(&url)
                    .json(&batch)
                    .timeout(Duration::from_secs(10));
                if let Some(t) = &token {
                    req = req.header(AUTHORIZATION, format!("Bearer {}", t.expose()));
                }
                match req.send().await {
                    Ok(r) if r.status().is_success() => {
                        buffer.drain(..n);
                    }
                    Ok(r) => {
                        tracing::warn!(status = %r.status(), "the monitor refused passive outcomes");
                        failing = true;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot send passive outcomes to the monitor");
                        failing = true;
                        break;
                    }
                }
            }
            if !open && !buffer.is_empty() {
                // Closing and the monitor is away: what is left is lost, counted.
                counted.fetch_add(buffer.len() as u64, Ordering::Relaxed);
                buffer.clear();
            }
        }
    });
    (task, dropped)
}
