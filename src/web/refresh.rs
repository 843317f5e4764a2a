//! A value read from the store for many requests, refreshed off their path.
//!
//! Younger than [`FRESH`], it is served as it is. Older, but younger than [`STALE_MAX`], it
//! is still served at once while one background task reads the new one: at 10,000 routes a
//! read of the status figures takes longer than the answer's own budget, and a reader who
//! got figures five seconds old a moment ago is not worse off with ten. Older than that, or
//! before the first read, the request waits for the read. There is one read at a time
//! whatever the number of requests.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::store::StoreError;

/// Why a value could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The blocking read panicked or was cancelled.
    #[error("figures read failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// How long a value is served without reading the store again.
pub const FRESH: Duration = Duration::from_secs(5);
/// Past this age a request waits for a new read instead of taking the old value.
pub const STALE_MAX: Duration = Duration::from_secs(60);

struct Slot<T> {
    value: Option<(Instant, Arc<T>)>,
    /// A background read is running (at most one).
    refreshing: bool,
}

/// See the module doc. `T` is built by a blocking load that may reuse the previous value.
pub struct Refreshing<T> {
    slot: Arc<Mutex<Slot<T>>>,
}

impl<T> Default for Refreshing<T> {
    fn default() -> Self {
        Self {
            slot: Arc::new(Mutex::new(Slot {
                value: None,
                refreshing: false,
            })),
        }
    }
}

impl<T> std::fmt::Debug for Refreshing<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Refreshing")
    }
}

impl<T: Send + Sync + 'static> Refreshing<T> {
    /// The value, reading it with `load` (on a blocking thread, given the previous value) when
    /// it is missing or too old; see the module doc.
    pub async fn get<F>(&self, load: F) -> Result<Arc<T>, RefreshError>
    where
        F: FnOnce(Option<Arc<T>>) -> Result<T, StoreError> + Send + 'static,
    {
        let mut slot = self.slot.lock().await;
        let previous = slot.value.as_ref().map(|(_, v)| v.clone());
        if let Some((at, value)) = &slot.value {
            let age = at.elapsed();
            if age < FRESH {
                return Ok(value.clone());
            }
            if age < STALE_MAX {
                let value = value.clone();
                if !slot.refreshing {
                    slot.refreshing = true;
                    let shared = self.slot.clone();
                    tokio::spawn(async move {
                        let read = run(load, previous).await;
                        let mut slot = shared.lock().await;
                        slot.refreshing = false;
                        match read {
                            Ok(v) => slot.value = Some((Instant::now(), Arc::new(v))),
                            // The old value stays until STALE_MAX; then a request reads and
                            // answers the error itself.
                            Err(e) => tracing::warn!(error = %e, "refreshing figures failed"),
                        }
                    });
                }
                return Ok(value);
            }
        }
        let value = Arc::new(run(load, previous).await?);
        slot.value = Some((Instant::now(), value.clone()));
        Ok(value)
    }
}

async fn run<T: Send + Sync + 'static, F>(
    load: F,
    previous: Option<Arc<T>>,
) -> Result<T, RefreshError>
where
    F: FnOnce(Option<Arc<T>>) -> Result<T, StoreError> + Send + 'static,
{
    Ok(tokio::task::spawn_blocking(move || load(previous)).await??)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A load that counts its calls and returns the call's number.
    fn counter(calls: &Arc<AtomicU32>) -> impl FnOnce(Option<Arc<u32>>) -> Result<u32, StoreError> {
        let calls = calls.clone();
        move |_| Ok(calls.fetch_add(1, Ordering::SeqCst) + 1)
    }

    async fn settle(calls: &Arc<AtomicU32>, want: u32) {
        for _ in 0..1000 {
            if calls.load(Ordering::SeqCst) >= want {
                break;
            }
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn fresh_is_served_stale_is_served_while_one_read_runs_too_old_waits() {
        let cache = Refreshing::<u32>::default();
        let calls = Arc::new(AtomicU32::new(0));
        assert_eq!(
            *cache.get(counter(&calls)).await.unwrap(),
            1,
            "first read waits"
        );
        tokio::time::advance(FRESH / 2).await;
        assert_eq!(
            *cache.get(counter(&calls)).await.unwrap(),
            1,
            "fresh: no read"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        tokio::time::advance(FRESH).await;
        // Stale: the old value at once, and one read in the background however many ask.
        assert_eq!(*cache.get(counter(&calls)).await.unwrap(), 1);
        assert_eq!(*cache.get(counter(&calls)).await.unwrap(), 1);
        settle(&calls, 2).await;
        // The background task stores its value once it holds the lock again.
        let mut got = 0;
        for _ in 0..1000 {
            got = *cache.get(counter(&calls)).await.unwrap();
            if got == 2 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(got, 2, "the refreshed value replaces the stale one");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one background read");

        tokio::time::advance(STALE_MAX + FRESH).await;
        assert_eq!(
            *cache.get(counter(&calls)).await.unwrap(),
            3,
            "too old: waits"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_load_gets_the_previous_value_and_errors_reach_the_waiting_request() {
        let cache = Refreshing::<u32>::default();
        let err = cache
            .get(|_| Err(StoreError::Invalid("down".into())))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("down"), "{err}");
        cache
            .get(|prev| Ok(prev.map_or(10, |p| *p + 1)))
            .await
            .unwrap();
        tokio::time::advance(STALE_MAX).await;
        let v = cache
            .get(|prev| Ok(prev.map_or(10, |p| *p + 1)))
            .await
            .unwrap();
        assert_eq!(*v, 11, "the load saw the previous value");
    }
}
