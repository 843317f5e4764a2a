//! A value read from the store for many requests, refreshed off their path.
//!
//! Younger than [`FRESH`], it is served as it is. Older, but younger than [`STALE_MAX`], it
//! is still served at once while one background task reads the new one: at 10,000 routes a
//! read of the status figures takes longer than the answer's own budget, and a reader who
//! got figures five seconds old a moment ago is not worse off with ten. Older than that, or
//! before the first read, the request waits for the read — unless it can do without the
//! value until that read ends ([`Refreshing::get_once_read`]: a page that says so, right
//! after a start or after a quiet spell). There is one read at a time whatever the number of
//! requests.
//!
//! A value whose read is slow stays fresh longer: at least [`COST_RATIO`] times as long as
//! its last read took (up to [`KEEP_EVERY`]), so that pollers never keep a core reading.
//! At 10,000 routes the status figures take over a second to read; read every 5 s for a
//! poller, they took a quarter of a core, and the read competed with the answers.
//!
//! While the value is asked for (at least once per [`KEEP_WARM`]), a keeper reads it again
//! every [`KEEP_EVERY`], so that a page looked at every minute or two never waits for a
//! read: one read every half minute instead of each visit paying one. Nobody asking for
//! [`KEEP_WARM`] stops the keeper; the next request then waits for a read as the first did.

use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::clock::Clock;
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
/// How often the keeper reads the value again while it is asked for (under [`STALE_MAX`]).
pub const KEEP_EVERY: Duration = Duration::from_secs(30);
/// How long after the last request the keeper goes on reading.
pub const KEEP_WARM: Duration = Duration::from_secs(600);
/// A value stays fresh for at least this many times its read's duration: reads take at most
/// a twentieth of a core however often the value is asked for.
pub const COST_RATIO: u32 = 20;

/// How long a value whose read took `took` is served without a new read.
pub fn fresh_for(took: Duration) -> Duration {
    took.saturating_mul(COST_RATIO).clamp(FRESH, KEEP_EVERY)
}

/// What a caller makes of the value held, fresh or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// As it is, while fresh.
    Use,
    /// Served at once, as a stale value is, while one read runs.
    Refresh,
    /// Not at all: the caller waits for a read, as if there were no value.
    Refuse,
}

/// A blocking read of the value at a time, given the previous value.
pub type Load<T> =
    Arc<dyn Fn(DateTime<Utc>, Option<Arc<T>>) -> Result<T, StoreError> + Send + Sync>;

struct Slot<T> {
    value: Option<(Instant, Arc<T>)>,
    /// How long the value's read took (on the service's clock).
    took: Duration,
    /// A read is running (at most one).
    refreshing: bool,
    /// When a request last asked, and how it reads (the keeper uses the latest).
    asked: Option<(Instant, Load<T>, Arc<dyn Clock>)>,
    keeper: bool,
    /// The last background read failed: requests wait for their own read again.
    failed: bool,
    /// Reads that ended with a value, so far (for whoever waits for the first).
    reads: tokio::sync::watch::Sender<u64>,
}

impl<T> Slot<T> {
    /// A read's value, whoever read it; answers the value it replaces.
    fn set(&mut self, value: Arc<T>, took: Duration) -> Option<(Instant, Arc<T>)> {
        self.took = took;
        self.failed = false;
        self.reads.send_modify(|n| *n += 1);
        self.value.replace((Instant::now(), value))
    }
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
                took: Duration::ZERO,
                refreshing: false,
                asked: None,
                keeper: false,
                failed: false,
                reads: tokio::sync::watch::Sender::new(0),
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
    /// The value, reading it with `load` (on a blocking thread, at `clock`'s now, given the
    /// previous value) when it is missing or too old; see the module doc.
    #[cfg(test)]
    pub async fn get(&self, clock: &Arc<dyn Clock>, load: Load<T>) -> Result<Arc<T>, RefreshError> {
        self.get_where(clock, load, |_| Fit::Use).await
    }

    /// As [`Self::get`], with what this caller makes of the value held ([`Fit`]): a value read
    /// while part of it was not yet known may be refused, or served once more while a read
    /// that knows it runs.
    pub async fn get_where(
        &self,
        clock: &Arc<dyn Clock>,
        load: Load<T>,
        fit: impl Fn(&T) -> Fit,
    ) -> Result<Arc<T>, RefreshError> {
        let mut slot = self.slot.lock().await;
        self.ask(&mut slot, &load, clock);
        let previous = slot.value.as_ref().map(|(_, v)| v.clone());
        let fit = slot.value.as_ref().map_or(Fit::Refuse, |(_, v)| fit(v));
        if let Some((at, value)) = slot.value.as_ref().filter(|_| fit != Fit::Refuse) {
            let age = at.elapsed();
            if fit == Fit::Use && age < fresh_for(slot.took) {
                return Ok(value.clone());
            }
            if age < STALE_MAX {
                let value = value.clone();
                self.refresh_once(&mut slot, load, clock, previous);
                return Ok(value);
            }
        }
        let (value, took) = run(load, clock, clock.now(), previous).await?;
        let value = Arc::new(value);
        drop(slot.set(value.clone(), took));
        Ok(value)
    }

    /// Waits until a first read has ended with a value.
    pub async fn first_read(&self) {
        let mut reads = self.slot.lock().await.reads.subscribe();
        // The sender lives as long as `self`: the wait ends with a read.
        let _ = reads.wait_for(|n| *n > 0).await;
    }

    /// As [`Self::get_where`], but `None` at once whenever a request would wait for a read
    /// (before the first read ends, right after a start, or with a value older than
    /// [`STALE_MAX`], after a quiet spell), that read started in the background: for a page
    /// that can say its figures are still being read rather than make its visitor wait for
    /// them. After a background read that failed, a request waits for a read again (and gets
    /// its error).
    pub async fn get_once_read(
        &self,
        clock: &Arc<dyn Clock>,
        load: Load<T>,
        fit: impl Fn(&T) -> Fit,
    ) -> Result<Option<Arc<T>>, RefreshError> {
        {
            let mut slot = self.slot.lock().await;
            let missing = slot
                .value
                .as_ref()
                .is_none_or(|(at, _)| at.elapsed() >= STALE_MAX);
            if missing && !slot.failed {
                let previous = slot.value.as_ref().map(|(_, v)| v.clone());
                self.ask(&mut slot, &load, clock);
                self.refresh_once(&mut slot, load, clock, previous);
                return Ok(None);
            }
        }
        self.get_where(clock, load, fit).await.map(Some)
    }

    /// Starts a read in the background unless one runs.
    fn refresh_once(
        &self,
        slot: &mut Slot<T>,
        load: Load<T>,
        clock: &Arc<dyn Clock>,
        previous: Option<Arc<T>>,
    ) {
        if !slot.refreshing {
            slot.refreshing = true;
            let read = refresh(
                self.slot.clone(),
                load,
                clock.clone(),
                clock.now(),
                previous,
            );
            tokio::spawn(read);
        }
    }

    /// Notes a request and how it reads, for the keeper; starts the keeper.
    fn ask(&self, slot: &mut Slot<T>, load: &Load<T>, clock: &Arc<dyn Clock>) {
        slot.asked = Some((Instant::now(), load.clone(), clock.clone()));
        if !slot.keeper {
            slot.keeper = true;
            tokio::spawn(keep(Arc::downgrade(&self.slot)));
        }
    }
}

/// One background read; the slot's `refreshing` was set by the caller.
async fn refresh<T: Send + Sync + 'static>(
    slot: Arc<Mutex<Slot<T>>>,
    load: Load<T>,
    clock: Arc<dyn Clock>,
    now: DateTime<Utc>,
    previous: Option<Arc<T>>,
) {
    let read = run(load, &clock, now, previous).await;
    let mut slot = slot.lock().await;
    slot.refreshing = false;
    match read {
        Ok((v, took)) => {
            let old = slot.set(Arc::new(v), took);
            drop(slot);
            drop(old);
            // A read at 10,000 routes, and the value it replaces, free tens of megabytes of
            // small blocks at once: give them back now, not at the next minute's trim.
            tokio::task::spawn_blocking(crate::malloc::trim);
        }
        // The old value stays until STALE_MAX; then a request reads and answers the error.
        Err(e) => {
            slot.failed = true;
            tracing::warn!(error = %e, "refreshing figures failed");
        }
    }
}

/// The keeper (see the module doc). It holds the slot weakly: the value's owner going away
/// ends it at its next wake-up.
async fn keep<T: Send + Sync + 'static>(slot: Weak<Mutex<Slot<T>>>) {
    loop {
        tokio::time::sleep(KEEP_EVERY).await;
        let Some(shared) = slot.upgrade() else { return };
        let mut s = shared.lock().await;
        let Some((asked, load, clock)) = s.asked.clone() else {
            s.keeper = false;
            return;
        };
        if asked.elapsed() >= KEEP_WARM {
            s.keeper = false;
            return;
        }
        let due = s
            .value
            .as_ref()
            .is_none_or(|(at, _)| at.elapsed() >= KEEP_EVERY);
        if s.refreshing || !due {
            continue;
        }
        s.refreshing = true;
        let previous = s.value.as_ref().map(|(_, v)| v.clone());
        drop(s);
        let now = clock.now();
        refresh(shared, load, clock, now, previous).await;
    }
}

/// One read as of `now`, and how long it took on the clock.
async fn run<T: Send + Sync + 'static>(
    load: Load<T>,
    clock: &Arc<dyn Clock>,
    now: DateTime<Utc>,
    previous: Option<Arc<T>>,
) -> Result<(T, Duration), RefreshError> {
    let clock = clock.clone();
    Ok(tokio::task::spawn_blocking(move || {
        let start = clock.now();
        let value = load(now, previous)?;
        let took = (clock.now() - start).to_std().unwrap_or_default();
        Ok::<_, StoreError>((value, took))
    })
    .await??)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Rig {
        clock: Arc<ManualClock>,
        dyn_clock: Arc<dyn Clock>,
        calls: Arc<AtomicU32>,
        cache: Refreshing<DateTime<Utc>>,
    }

    impl Rig {
        fn new() -> Self {
            let start = DateTime::parse_from_rfc3339("2026-05-20T12:00:00Z").unwrap();
            let clock = Arc::new(ManualClock::new(start.into()));
            Self {
                dyn_clock: clock.clone(),
                clock,
                calls: Arc::default(),
                cache: Refreshing::default(),
            }
        }

        /// A load that counts its calls and answers the time it read at.
        fn load(&self) -> Load<DateTime<Utc>> {
            let calls = self.calls.clone();
            Arc::new(move |now, _| {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(now)
            })
        }

        fn calls(&self) -> u32 {
            self.calls.load(Ordering::SeqCst)
        }

        /// A request: the value, and whether the request itself waited for a read.
        async fn get(&self) -> (DateTime<Utc>, bool) {
            let before = self.calls();
            let v = *self.cache.get(&self.dyn_clock, self.load()).await.unwrap();
            (v, self.calls() > before)
        }

        /// Lets `secs` seconds pass on both clocks. Paused time does not jump ahead while a
        /// blocking read runs, so background reads finish within the second they start.
        async fn pass(&self, secs: u64) {
            for _ in 0..secs {
                self.clock.advance(Duration::from_secs(1));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn fresh_is_served_stale_is_served_while_one_read_runs() {
        let rig = Rig::new();
        let (first, waited) = rig.get().await;
        assert!(waited, "the first request waits for a read");
        rig.pass(2).await;
        assert_eq!(rig.get().await, (first, false), "fresh: no read");
        rig.pass(4).await;
        // Stale: the old value at once, and one read in the background however many ask.
        assert_eq!(rig.get().await, (first, false));
        assert_eq!(rig.get().await, (first, false));
        rig.pass(1).await;
        assert_eq!(rig.calls(), 2, "one background read");
        let (v, waited) = rig.get().await;
        assert!(!waited);
        assert_eq!(
            v,
            first + chrono::Duration::seconds(6),
            "the refreshed value replaces the stale one"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_read_keeps_its_value_fresh_in_proportion() {
        let rig = Rig::new();
        // A read that takes 1 s on the service's clock: fresh for 20 s, not 5.
        let clock = rig.clock.clone();
        let calls = rig.calls.clone();
        let slow: Load<DateTime<Utc>> = Arc::new(move |now, _| {
            calls.fetch_add(1, Ordering::SeqCst);
            clock.advance(Duration::from_secs(1));
            Ok(now)
        });
        let get = || rig.cache.get(&rig.dyn_clock, slow.clone());
        let first = *get().await.unwrap();
        rig.pass(15).await;
        assert_eq!(*get().await.unwrap(), first);
        assert_eq!(rig.calls(), 1, "read again before 20 × its duration");
        rig.pass(6).await;
        assert_eq!(*get().await.unwrap(), first, "stale: served at once");
        rig.pass(1).await;
        assert_eq!(
            rig.calls(),
            2,
            "past 20 × its duration: one background read"
        );
        assert_eq!(fresh_for(Duration::from_millis(10)), FRESH);
        assert_eq!(fresh_for(Duration::from_secs(1)), Duration::from_secs(20));
        assert_eq!(fresh_for(Duration::from_secs(9)), KEEP_EVERY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_asked_for_is_kept_warm_and_one_nobody_asks_for_is_not() {
        let rig = Rig::new();
        rig.get().await;
        // A page looked at every 90 s: never older than STALE_MAX, and no visit waits.
        for _ in 0..6 {
            rig.pass(90).await;
            let (v, waited) = rig.get().await;
            assert!(!waited, "a visit waited for a read");
            let age = rig.clock.now() - v;
            assert!(age.to_std().unwrap() < STALE_MAX, "served {age} old");
        }
        let kept = rig.calls();
        assert!(
            kept > 6 * 2,
            "the keeper read every {KEEP_EVERY:?}: {kept} reads"
        );
        // Nobody asks: the keeper stops after KEEP_WARM.
        rig.pass(KEEP_WARM.as_secs() + 2 * KEEP_EVERY.as_secs())
            .await;
        let stopped = rig.calls();
        rig.pass(600).await;
        assert_eq!(rig.calls(), stopped, "reads went on with nobody asking");
        let (v, waited) = rig.get().await;
        assert!(waited, "a value nobody kept is read again");
        assert_eq!(v, rig.clock.now());
    }

    #[tokio::test(start_paused = true)]
    async fn the_load_gets_the_previous_value_and_errors_reach_the_waiting_request() {
        let cache = Refreshing::<u32>::default();
        let clock: Arc<dyn Clock> = Arc::new(crate::clock::SystemClock);
        let err = cache
            .get(
                &clock,
                Arc::new(|_, _| Err(StoreError::Invalid("down".into()))),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("down"), "{err}");
        let next: Load<u32> = Arc::new(|_, prev| Ok(prev.map_or(10, |p| *p + 1)));
        assert_eq!(*cache.get(&clock, next.clone()).await.unwrap(), 10);
        // The keeper's read, half a minute later, was given the previous value.
        tokio::time::sleep(KEEP_EVERY + Duration::from_secs(1)).await;
        assert_eq!(*cache.get(&clock, next).await.unwrap(), 11);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fresh_value_the_caller_cannot_use_is_read_again() {
        let rig = Rig::new();
        let (first, _) = rig.get().await;
        rig.clock.advance(Duration::from_secs(1));
        let fit = |v: &DateTime<Utc>| if *v == first { Fit::Refuse } else { Fit::Use };
        let refused = *rig
            .cache
            .get_where(&rig.dyn_clock, rig.load(), fit)
            .await
            .unwrap();
        assert_eq!(rig.calls(), 2, "the refused value was served");
        assert_eq!(refused, first + chrono::Duration::seconds(1));
        assert_eq!(rig.get().await, (refused, false), "the new value is kept");
        // Fresh, but to be read again: served at once, one read in the background.
        let again = |_: &DateTime<Utc>| Fit::Refresh;
        let served = *rig
            .cache
            .get_where(&rig.dyn_clock, rig.load(), again)
            .await
            .unwrap();
        assert_eq!(served, refused, "the value to refresh was not served");
        rig.pass(1).await;
        assert_eq!(rig.calls(), 3, "no read in the background");
    }

    #[tokio::test(start_paused = true)]
    async fn a_page_gets_none_until_a_read_ends_after_a_start_or_a_quiet_spell_and_waits_after_a_failure(
    ) {
        let rig = Rig::new();
        let use_it = |_: &DateTime<Utc>| Fit::Use;
        let once = || rig.cache.get_once_read(&rig.dyn_clock, rig.load(), use_it);
        assert_eq!(
            once().await.unwrap(),
            None,
            "the first request does not wait"
        );
        assert_eq!(
            once().await.unwrap(),
            None,
            "nor does one while the read runs"
        );
        rig.cache.first_read().await;
        assert_eq!(rig.calls(), 1, "one read in the background for both");
        let read = once().await.unwrap().expect("the first read's value");
        assert_eq!(*read, rig.clock.now());
        assert_eq!(rig.calls(), 1, "served as read");

        // After a quiet spell (the keeper stopped, the value past STALE_MAX) a request does
        // not wait either: one read runs in the background, and its value is served next.
        rig.pass((KEEP_WARM + STALE_MAX).as_secs()).await;
        let (calls, asked_at) = (rig.calls(), rig.clock.now());
        assert_eq!(once().await.unwrap(), None, "the request after the spell");
        assert_eq!(once().await.unwrap(), None, "and one while its read runs");
        rig.pass(1).await;
        assert_eq!(rig.calls(), calls + 1, "one read for both");
        let read = once().await.unwrap().expect("the new read's value");
        assert_eq!(*read, asked_at, "read as of the request after the spell");

        // A store that fails its first read: the next request waits and gets the error.
        let broken = Refreshing::<u32>::default();
        let fail: Load<u32> = Arc::new(|_, _| Err(StoreError::Invalid("down".into())));
        let get = || broken.get_once_read(&rig.dyn_clock, fail.clone(), |_| Fit::Use);
        assert!(get().await.unwrap().is_none());
        rig.pass(1).await;
        let err = get().await.unwrap_err();
        assert!(err.to_string().contains("down"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_keeper_ends_with_the_value_owner() {
        let rig = Rig::new();
        rig.get().await;
        let weak = Arc::downgrade(&rig.cache.slot);
        drop(rig.cache);
        tokio::time::sleep(KEEP_EVERY * 2).await;
        assert!(weak.upgrade().is_none(), "the keeper holds the slot");
        assert_eq!(rig.calls.load(Ordering::SeqCst), 1);
    }
}
