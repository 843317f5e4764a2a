//! A value read from the store by a task of its own, never by a request.
//!
//! The pages' long reads (the day bars of the days before today, the 30-day windows' counts)
//! cost more than a page's whole budget at 1,000 routes, and change only with late outcomes.
//! A keeper reads such a value when the service starts, then whenever the value says it is
//! due (a period, a new hour or day on the service's clock, so that an injected clock drives
//! it). Requests take the last value read, or none while the first read runs, and add what
//! changed since on their own (a short read).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use chrono::{DateTime, Duration as TimeDelta, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::store::{Store, StoreError};

/// How often a keeper looks at the clock for a due read.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// After a failed read, the next try.
const RETRY_AFTER: TimeDelta = TimeDelta::seconds(30);

/// A keeper's read runs at this nice value (0 is the process's own, 19 the lowest).
const KEEPER_NICE: i32 = 10;

/// A value a keeper reads.
pub trait Keep: Send + Sync + Sized + 'static {
    /// What it is, for the log.
    const WHAT: &'static str;

    /// Reads the value as of `now` (blocking).
    fn read(store: &Store, now: DateTime<Utc>) -> Result<Self, StoreError>;

    /// Whether a new read is due at `now`.
    fn due(&self, now: DateTime<Utc>) -> bool;
}

/// The last value read, shared by every request; see the module doc.
#[derive(Debug)]
pub struct Kept<T> {
    current: RwLock<Option<Arc<T>>>,
    /// Reads done so far (for whoever waits for one).
    reads: watch::Sender<u64>,
    started: AtomicBool,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Self {
            current: RwLock::new(None),
            reads: watch::Sender::new(0),
            started: AtomicBool::new(false),
        }
    }
}

impl<T: Keep> Kept<T> {
    /// The value last read; `None` while the first read runs.
    pub fn get(&self) -> Option<Arc<T>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reads the value as of `now`, on this thread (the keeper's read; also for whoever
    /// measures it).
    pub fn read(&self, store: &Store, now: DateTime<Utc>) -> Result<(), StoreError> {
        self.set(T::read(store, now)?);
        Ok(())
    }

    fn set(&self, value: T) {
        let old = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(Arc::new(value));
        drop(old);
        self.reads.send_modify(|n| *n += 1);
    }

    /// Starts the keeper unless it runs: at the service's start (so that the first request
    /// finds the value read), else at the first request. It ends with `until`, or when the
    /// value's owner is gone.
    pub fn start(
        self: &Arc<Self>,
        store: &Store,
        clock: &Arc<dyn Clock>,
        until: &CancellationToken,
    ) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let (store, clock, until) = (store.clone(), clock.clone(), until.clone());
        let kept = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::select! {
                () = keep(kept, store, clock) => {}
                () = until.cancelled() => {}
            }
        });
    }

    /// Waits until the keeper has finished a read after `after` reads (see [`Self::reads`]).
    pub async fn read_after(&self, after: u64) {
        let mut rx = self.reads.subscribe();
        // The sender lives as long as `self`: the wait ends with a read.
        let _ = rx.wait_for(|n| *n > after).await;
    }

    /// How many reads the keeper finished.
    pub fn reads(&self) -> u64 {
        *self.reads.borrow()
    }
}

/// The keeper: a read now, then one whenever [`Keep::due`] says so.
async fn keep<T: Keep>(kept: Weak<Kept<T>>, store: Store, clock: Arc<dyn Clock>) {
    // When the next read is due if the last one failed.
    let mut retry_at: Option<DateTime<Utc>> = None;
    loop {
        let due = {
            let Some(k) = kept.upgrade() else { return };
            let now = clock.now();
            match (&retry_at, k.get()) {
                (Some(at), _) => now >= *at,
                (None, Some(v)) => v.due(now),
                (None, None) => true,
            }
        };
        if due {
            let now = clock.now();
            let Some(k) = kept.upgrade() else { return };
            let s = store.clone();
            let failed = match give_way(move || k.read(&s, now)).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(e) => Some(e),
            };
            match failed {
                None => {
                    retry_at = None;
                    // The value it replaces frees megabytes of small blocks at 10,000 routes.
                    tokio::task::spawn_blocking(crate::malloc::trim);
                }
                Some(error) => {
                    tracing::warn!(%error, "reading the {} failed", T::WHAT);
                    retry_at = Some(now + RETRY_AFTER);
                }
            }
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// Runs a keeper's read on a thread of its own at a lower scheduling priority
/// ([`KEEPER_NICE`]): on 2 cores the first page request after a start otherwise shares the
/// machine with both keepers' first reads and waits three times as long. Under load from
/// other programs the read takes longer instead; the pages say meanwhile what is missing.
async fn give_way<R: Send + 'static>(
    read: impl FnOnce() -> R + Send + 'static,
) -> Result<R, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("probeok-keeper".into())
        .spawn(move || {
            lower_priority();
            let _ = tx.send(read());
        })
        .map_err(|e| format!("cannot start the read: {e}"))?;
    rx.await
        .map_err(|_| "the read ended without an answer".to_owned())
}

/// Lowers the calling thread's priority (Linux: a thread has a nice value of its own).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: `setpriority` takes no pointer; with `PRIO_PROCESS` and `who` 0 it changes the
    // calling thread's nice value only. A failure leaves the priority as it was.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, KEEPER_NICE);
    }
}
