//! What keeps a flood of outside reads from starving the service:
//!
//! - The public read endpoints (pages, the status and history API, badges, the incident feed)
//!   run under one bound: at most [`PUBLIC_READS`] at once. A read that finds the bound taken
//!   waits up to [`READ_WAIT`] for a place, else gets 503 `overloaded` with `Retry-After: 1`.
//!   Their store reads then never crowd out the writer, the alert engine or detection.
//!   The weights feed is not bounded here: routers long-poll it, and it is served from memory.
//! - `/readyz` checks the store by writing to it; its answer is reused for [`READY_TTL`], so
//!   a probe storm costs at most one check a second (concurrent callers wait for the one
//!   check under way).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::AppState;

/// Public reads served at once, at most.
pub const PUBLIC_READS: usize = 16;
/// How long a public read waits for a place before it is refused.
pub const READ_WAIT: Duration = Duration::from_millis(500);
/// How long one `/readyz` answer is reused.
pub const READY_TTL: Duration = Duration::from_secs(1);

/// One `/readyz` answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Ready {
    pub status: StatusCode,
    pub body: Value,
}

/// The bounds of one monitor.
#[derive(Debug)]
pub struct Guards {
    reads: Arc<Semaphore>,
    wait: Duration,
    /// The last answer, when it was made, and the service's clock then.
    ready: tokio::sync::Mutex<Option<(Instant, DateTime<Utc>, Ready)>>,
}

impl Default for Guards {
    fn default() -> Self {
        Self::new(PUBLIC_READS, READ_WAIT)
    }
}

impl Guards {
    /// `permits` public reads at once, each waiting up to `wait` for a place.
    pub fn new(permits: usize, wait: Duration) -> Self {
        Self {
            reads: Arc::new(Semaphore::new(permits.max(1))),
            wait,
            ready: tokio::sync::Mutex::new(None),
        }
    }

    /// Takes one place of the public reads, as a read being served does (`None`: all taken).
    pub fn try_hold(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.reads.clone().try_acquire_owned().ok()
    }

    /// The readiness answer: the cached one while younger than [`READY_TTL`] — by the
    /// monotonic clock and by the service's clock `now` alike (heartbeats are judged on the
    /// latter) — else `check`'s (one check at a time; callers meanwhile wait for it and share
    /// its answer).
    pub async fn ready<F, Fut>(&self, now: DateTime<Utc>, check: F) -> Ready
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Ready>,
    {
        let mut cached = self.ready.lock().await;
        if let Some((at, then, r)) = cached.as_ref() {
            let ttl = chrono::Duration::from_std(READY_TTL).unwrap_or_default();
            let moved = now.signed_duration_since(*then);
            if at.elapsed() < READY_TTL && moved >= chrono::Duration::zero() && moved < ttl {
                return r.clone();
            }
        }
        let r = check().await;
        *cached = Some((Instant::now(), now, r.clone()));
        r
    }
}

/// The middleware of the public read endpoints (see the module docs).
pub async fn bounded_read(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let g = &state.guards;
    let permit = match g.reads.clone().try_acquire_owned() {
        Ok(p) => Some(p),
        Err(_) => tokio::time::timeout(g.wait, g.reads.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok),
    };
    let Some(_permit) = permit else {
        let mut r = super::api_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "too many reads at once; retry in a second",
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    };
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use serde_json::json;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn readiness_is_checked_at_most_once_a_second() {
        let g = Guards::default();
        let checks = AtomicU32::new(0);
        let check = || async {
            checks.fetch_add(1, Ordering::SeqCst);
            Ready {
                status: StatusCode::OK,
                body: json!({"status": "ready"}),
            }
        };
        let now = DateTime::from_timestamp(1_767_225_600, 0).unwrap();
        for _ in 0..100 {
            assert_eq!(g.ready(now, check).await.status, StatusCode::OK);
        }
        assert_eq!(checks.load(Ordering::SeqCst), 1);
        tokio::time::advance(READY_TTL).await;
        g.ready(now, check).await;
        assert_eq!(checks.load(Ordering::SeqCst), 2);
        // The service's clock moving on (a test clock, a jump) ends the answer's life too.
        g.ready(now + chrono::Duration::seconds(150), check).await;
        assert_eq!(checks.load(Ordering::SeqCst), 3);
    }
}
