//! Delivering the outbox to the monitor: the oldest rows first, in batches under the
//! monitor's ingest bounds, with the ingest token. A batch leaves the outbox only after a
//! 200 answer (every item in it accepted, a duplicate, or rejected for good); on anything
//! else — unreachable, a timeout, 5xx, a dropped connection — the same batch is sent again
//! after a backoff that doubles up to [`PushOptions::max_backoff`], each wait drawn between
//! half and all of it (jitter: agents cut off together do not come back in step). A
//! rejected token (401/404) is retried too, slowly: the operator fixes it, nothing is lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::metrics::AgentMetrics;
use super::outbox::Outbox;
use crate::clock::Clock;
use crate::secret::Secret;

/// Items per push (the monitor takes at most 1000).
pub const MAX_BATCH_ITEMS: usize = 500;
/// Bytes per push (the monitor takes at most 1 MiB).
pub const MAX_BATCH_BYTES: usize = 900 * 1024;

/// The pusher's pacing.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// The first wait after a failure.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// One push's whole request.
    pub timeout: Duration,
    /// An empty outbox is looked at again this often even without a new outcome.
    pub idle: Duration,
}

impl Default for PushOptions {
    fn default() -> Self {
        Self {
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(60),
            timeout: Duration::from_secs(30),
            idle: Duration::from_secs(1),
        }
    }
}

/// `{server}/api/v1/ingest`, or why `server` is not a base URL.
pub fn ingest_url(server: &str) -> Result<reqwest::Url, String> {
    let base = reqwest::Url::parse(server.trim_end_matches('/'))
        .map_err(|e| format!("--server {server:?}: {e}"))?;
    if !matches!(base.scheme(), "http" | "https") {
        return Err(format!("--server {server:?}: expected an http(s) URL"));
    }
    base.join(&format!(
        "{}/api/v1/ingest",
        base.path().trim_end_matches('/')
    ))
    .map_err(|e| format!("--server {server:?}: {e}"))
}

/// The next wait after `failures` failures in a row: `min · 2^(failures-1)` capped at
/// `max`, drawn in its upper half.
pub fn backoff(opts: &PushOptions, failures: u32, rng: &mut impl Rng) -> Duration {
    let exp = 1u32 << failures.saturating_sub(1).min(20);
    let full = opts.min_backoff.saturating_mul(exp).min(opts.max_backoff);
    let half = full / 2;
    half + full.mul_f64(rng.gen_range(0.0..=0.5))
}

/// Everything the push loop needs.
pub struct Pusher {
    pub url: reqwest::Url,
    pub token: Secret,
    pub outbox: Arc<Mutex<Outbox>>,
    pub metrics: Arc<AgentMetrics>,
    pub wake: Arc<Notify>,
    pub clock: Arc<dyn Clock>,
    pub opts: PushOptions,
}

enum Attempt {
    Delivered,
    Empty,
    Failed(String),
    /// 413: the batch was too large for this monitor.
    TooLarge,
}

/// Pushes until `shutdown`.
pub async fn run(p: Pusher, shutdown: CancellationToken) {
    let http = match reqwest::Client::builder().timeout(p.opts.timeout).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "agent: cannot build the HTTP client; nothing is pushed");
            return;
        }
    };
    let mut failures = 0u32;
    let mut max_items = MAX_BATCH_ITEMS;
    loop {
        if shutdown.is_cancelled() {
            break;
        }
        let wait = match attempt(&p, &http, max_items).await {
            Attempt::Delivered => {
                failures = 0;
                max_items = MAX_BATCH_ITEMS;
                continue;
            }
            Attempt::Empty => p.opts.idle,
            Attempt::TooLarge => {
                max_items = (max_items / 2).max(1);
                continue;
            }
            Attempt::Failed(why) => {
                failures = failures.saturating_add(1);
                p.metrics.push_failed();
                let wait = backoff(&p.opts, failures, &mut rand::thread_rng());
                tracing::warn!(error = %why, failures, wait_ms = wait.as_millis() as u64, "agent: push failed; the outbox keeps the outcomes");
                wait
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
            // New outcomes end an idle wait, never a backoff.
            _ = p.wake.notified(), if failures == 0 => {}
        }
    }
}

async fn attempt(p: &Pusher, http: &reqwest::Client, max_items: usize) -> Attempt {
    let ob = p.outbox.clone();
    let batch = tokio::task::spawn_blocking(move || {
        ob.lock()
            .unwrap_or_else(|e| e.into_inner())
            .peek(max_items, MAX_BATCH_BYTES)
    })
    .await;
    let batch = match batch {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Attempt::Failed(e.to_string()),
        Err(e) => return Attempt::Failed(e.to_string()),
    };
    let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
        return Attempt::Empty;
    };
    let (first, last) = (first.seq, last.seq);
    let mut body = String::with_capacity(batch.iter().map(|q| q.body.len() + 1).sum::<usize>() + 2);
    body.push('[');
    for (i, q) in batch.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&q.body);
    }
    body.push(']');
    let sent = http
        .post(p.url.clone())
        .bearer_auth(p.token.expose())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => return Attempt::Failed(e.to_string()),
    };
    let status = resp.status();
    if status == reqwest::StatusCode::PAYLOAD_TOO_LARGE && batch.len() > 1 {
        return Attempt::TooLarge;
    }
    if !status.is_success() {
        return Attempt::Failed(format!("the monitor answered {status}"));
    }
    // The answer must be read whole: a connection dropped mid-answer is not an answer.
    let answer: serde_json::Value = match resp.json().await {
        Ok(v) => v,
        Err(e) => return Attempt::Failed(format!("unreadable answer: {e}")),
    };
    if let Some(rejected) = answer["rejected"].as_array().filter(|r| !r.is_empty()) {
        tracing::warn!(
            rejected = rejected.len(),
            first = %rejected[0],
            "agent: the monitor rejected outcomes (they are not sent again)"
        );
    }
    let ob = p.outbox.clone();
    let settled = tokio::task::spawn_blocking(move || {
        let mut o = ob.lock().unwrap_or_else(|e| e.into_inner());
        o.settle(first, last)?;
        Ok::<_, super::outbox::OutboxError>((o.len()?, o.dropped()?))
    })
    .await;
    match settled {
        Ok(Ok((len, dropped))) => {
            p.metrics.set_backlog(len, dropped);
            p.metrics.pushed(batch.len() as u64, p.clock.now());
            Attempt::Delivered
        }
        Ok(Err(e)) => Attempt::Failed(e.to_string()),
        Err(e) => Attempt::Failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let opts = PushOptions {
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(8),
            ..PushOptions::default()
        };
        let mut rng = rand::thread_rng();
        for _ in 0..100 {
            let w1 = backoff(&opts, 1, &mut rng);
            assert!(
                w1 >= Duration::from_millis(500) && w1 <= Duration::from_secs(1),
                "{w1:?}"
            );
            let w3 = backoff(&opts, 3, &mut rng);
            assert!(
                w3 >= Duration::from_secs(2) && w3 <= Duration::from_secs(4),
                "{w3:?}"
            );
            let w9 = backoff(&opts, 99, &mut rng);
            assert!(
                w9 >= Duration::from_secs(4) && w9 <= Duration::from_secs(8),
                "{w9:?}"
            );
        }
    }

    #[test]
    fn the_ingest_url_hangs_under_the_server() {
        assert_eq!(
            ingest_url("http://127.0.0.1:9400").unwrap().as_str(),
            "http://127.0.0.1:9400/api/v1/ingest"
        );
        assert_eq!(
            ingest_url("https://mon.example.com/probeok/")
                .unwrap()
                .as_str(),
            "https://mon.example.com/probeok/api/v1/ingest"
        );
        assert!(ingest_url("ftp://x").is_err());
        assert!(ingest_url("not a url").is_err());
    }
}
