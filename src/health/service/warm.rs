//! Baselines loaded in the background at start. A route's baseline is restored from its saved
//! parts (`store::baselines`, a few rows a route) and the outcomes stored after the newest one
//! it learned are replayed into it; a route without a saved state (a database from before the
//! saved state, or detection settings changed) replays its whole stored history instead — with
//! weeks of history at thousands of routes tens of millions of rows, minutes to hours. So the
//! start waits only a short while ([`HealthOptions::warm_wait`]: saved states and small
//! histories are warm before the first probe), and the rest warms route by route while the
//! service runs:
//!
//! - a route still warming is judged on an empty baseline: errors and timeouts move it as
//!   ever, latency does not (a restored NORMAL stays NORMAL; an UNKNOWN route waits);
//! - what it observes meanwhile is kept (bounded) and replayed into the rebuilt baseline when
//!   it arrives, so no outcome is learned twice or lost;
//! - the progress is shared ([`WarmProgress`]) for `/readyz`.
//!
//! [`HealthOptions::warm_wait`]: super::HealthOptions::warm_wait

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;

use super::super::baseline::saved::Parts;
use super::super::Baseline;
use crate::config::DetectionConfig;
use crate::probe::ProbeOutcome;
use crate::route::RouteId;
use crate::store::{Reader, Store, StoreError, ALL_KINDS};

/// The vantage key of the monitor's own baselines in the saved state.
pub(super) const OWN: &str = "";

/// Rebuilt baselines waiting for the service.
const WARM_QUEUE: usize = 64;
/// Outcomes kept per warming route for the replay; past it the oldest are not replayed.
const MAX_PENDING: usize = 512;
/// Reads of one route's history before its baseline starts from nothing.
const READ_TRIES: u32 = 3;

/// How far the background rebuild has come: one handle shared by detection (which counts)
/// and `/readyz` (which reads); each restore starts it again.
#[derive(Clone, Default)]
pub struct WarmProgress(Arc<Counts>);

#[derive(Default)]
struct Counts {
    done: AtomicUsize,
    total: AtomicUsize,
}

impl std::fmt::Debug for WarmProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (done, total) = self.get();
        write!(f, "WarmProgress({done}/{total})")
    }
}

/// One handle is one count: equal when shared.
impl PartialEq for WarmProgress {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for WarmProgress {}

impl WarmProgress {
    /// (baselines rebuilt, routes).
    pub fn get(&self) -> (usize, usize) {
        (
            self.0.done.load(Ordering::Acquire),
            self.0.total.load(Ordering::Acquire),
        )
    }

    fn start(&self, total: usize) {
        self.0.done.store(0, Ordering::Release);
        self.0.total.store(total, Ordering::Release);
    }

    /// Every baseline is rebuilt.
    pub fn warm(&self) -> bool {
        let (done, total) = self.get();
        done >= total
    }

    pub(super) fn one_done(&self) {
        self.0.done.fetch_add(1, Ordering::AcqRel);
    }
}

/// One route's rebuilt baseline and the newest outcome it learned.
pub(super) struct Warmed {
    pub index: usize,
    pub baseline: Baseline,
    pub newest: Option<DateTime<Utc>>,
}

/// Starts loading every route's baseline (its saved state and the outcomes after it, or the
/// outcomes since `since`), in `ids` order, on a blocking thread. Ends early when the receiver
/// is gone.
pub(super) fn spawn(
    store: Store,
    ids: Vec<RouteId>,
    cfg: DetectionConfig,
    since: DateTime<Utc>,
    progress: &WarmProgress,
) -> mpsc::Receiver<Warmed> {
    progress.start(ids.len());
    let (tx, rx) = mpsc::channel(WARM_QUEUE);
    tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let reader = match store.reader() {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the history to rebuild baselines; they learn from new probes only");
                None
            }
        };
        let (mut restored, mut rebuilt) = (0usize, 0usize);
        for (index, id) in ids.into_iter().enumerate() {
            // A database blip should not leave a route without its history: a few tries.
            let mut loaded = None;
            for attempt in 1..=READ_TRIES {
                match reader.as_ref().map(|r| load(r, &id, &cfg, since)) {
                    Some(Ok(l)) => {
                        loaded = Some(l);
                        break;
                    }
                    Some(Err(e)) if attempt < READ_TRIES => {
                        tracing::debug!(route = %id, error = %e, "reading the route's history failed; trying again");
                        std::thread::sleep(std::time::Duration::from_secs(1));
                    }
                    Some(Err(e)) => {
                        tracing::warn!(route = %id, error = %e, "cannot read the route's history; its baseline learns from new probes only");
                    }
                    None => break,
                }
            }
            let (baseline, was_saved) = loaded.unwrap_or_else(|| (Baseline::new(id, &cfg), false));
            if was_saved {
                restored += 1;
            } else {
                rebuilt += 1;
            }
            let newest = baseline.newest();
            if tx
                .blocking_send(Warmed {
                    index,
                    baseline,
                    newest,
                })
                .is_err()
            {
                return;
            }
        }
        tracing::info!(
            seconds = started.elapsed().as_secs_f64(),
            restored,
            rebuilt,
            "baselines loaded: restored from their saved state, or rebuilt from the raw history"
        );
    });
    rx
}

/// A route's baseline: its saved state with the outcomes after it replayed (`true`), else
/// rebuilt from the outcomes since `since`.
fn load(
    reader: &Reader,
    id: &RouteId,
    cfg: &DetectionConfig,
    since: DateTime<Utc>,
) -> Result<(Baseline, bool), StoreError> {
    load_at(reader, id, OWN, cfg, since, |from| {
        reader.outcomes_since(id, from, ALL_KINDS)
    })
}

/// [`load`] for the baseline of `id` at `vantage`, whose outcomes since a time `read` gives.
pub(super) fn load_at(
    reader: &Reader,
    id: &RouteId,
    vantage: &str,
    cfg: &DetectionConfig,
    since: DateTime<Utc>,
    read: impl Fn(DateTime<Utc>) -> Result<Vec<ProbeOutcome>, StoreError>,
) -> Result<(Baseline, bool), StoreError> {
    if let Some(saved) = reader.saved_baseline(id.as_str(), vantage)? {
        let parts = Parts {
            head: saved.head,
            buckets: saved.buckets,
        };
        match Baseline::restore(id.clone(), cfg, &saved.shape, saved.newest, &parts) {
            Ok(mut b) => {
                let after = saved.newest.map_or(since, |n| {
                    (n + chrono::Duration::milliseconds(1)).max(since)
                });
                for o in read(after)? {
                    b.record(&o);
                }
                return Ok((b, true));
            }
            Err(e) => {
                tracing::info!(route = %id, vantage, reason = %e, "saved baseline not used; rebuilding it from the raw history");
            }
        }
    }
    Ok((Baseline::rebuild(id.clone(), cfg, &read(since)?), false))
}

/// What the rebuild delivers within `wait` of real time (measured on the wall clock, not
/// tokio's, which a test may have paused), and the receiver for the rest.
pub(super) async fn wait(
    mut rx: mpsc::Receiver<Warmed>,
    wait: std::time::Duration,
) -> Result<(mpsc::Receiver<Warmed>, Vec<Warmed>), tokio::task::JoinError> {
    tokio::task::spawn_blocking(move || {
        let until = std::time::Instant::now() + wait;
        let mut got = Vec::new();
        loop {
            match rx.try_recv() {
                Ok(w) => got.push(w),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    if std::time::Instant::now() >= until {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        }
        (rx, got)
    })
    .await
}

/// The service's side of a warm-up still running.
pub(super) struct Warming {
    pub rx: mpsc::Receiver<Warmed>,
    /// Per route still warming: what it observed since the start, oldest first.
    pending: HashMap<usize, VecDeque<ProbeOutcome>>,
    /// Routes already warm.
    warm: Vec<bool>,
    pub progress: WarmProgress,
}

impl Warming {
    pub fn new(rx: mpsc::Receiver<Warmed>, warm: Vec<bool>, progress: WarmProgress) -> Self {
        Self {
            rx,
            pending: HashMap::new(),
            warm,
            progress,
        }
    }

    /// Whether route `i`'s baseline is loaded (a warming one is not saved: it is partial).
    pub fn is_warm(&self, i: usize) -> bool {
        self.warm.get(i).copied().unwrap_or(true)
    }

    /// Keeps `o` for the replay when route `i` is still warming.
    pub fn observe(&mut self, i: usize, o: &ProbeOutcome) {
        if self.warm.get(i).copied().unwrap_or(true) {
            return;
        }
        let q = self.pending.entry(i).or_default();
        if q.len() >= MAX_PENDING {
            q.pop_front();
        }
        q.push_back(o.clone());
    }

    /// The rebuilt baseline with what route `i` observed since the start replayed into it
    /// (only what the rebuild did not read).
    pub fn finish(&mut self, w: Warmed) -> (usize, Baseline) {
        let Warmed {
            index,
            mut baseline,
            newest,
        } = w;
        if let Some(slot) = self.warm.get_mut(index) {
            *slot = true;
        }
        for o in self.pending.remove(&index).unwrap_or_default() {
            if newest.is_none_or(|n| o.started_at > n) {
                baseline.record(&o);
            }
        }
        self.progress.one_done();
        (index, baseline)
    }
}

/// The next rebuilt baseline; pending forever without a warm-up. `None`: the rebuild ended.
pub(super) async fn next(warming: &mut Option<Warming>) -> Option<Warmed> {
    match warming {
        Some(w) => w.rx.recv().await,
        None => std::future::pending().await,
    }
}

impl super::HealthService {
    /// A baseline rebuilt in the background takes the place of the one the route learned
    /// since the start (what it learned is replayed into it).
    pub(super) fn install(&mut self, w: Option<Warmed>) {
        let Some(warming) = &mut self.warming else {
            return;
        };
        let Some(w) = w else {
            self.warming = None;
            return;
        };
        let (i, baseline) = warming.finish(w);
        if warming.progress.warm() {
            tracing::info!("baselines: every route is warm");
            self.warming = None;
        }
        if let Some(r) = self.routes.get_mut(i) {
            r.health.baseline_ready = baseline.ready();
            r.baseline = baseline;
            self.wheel.touch(i);
            let now = self.clock.now();
            self.refresh(i, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::baseline::tests::probe;
    use chrono::TimeZone;

    fn at(s: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap() + chrono::Duration::seconds(s)
    }

    #[test]
    fn what_a_warming_route_observed_is_replayed_once_and_only_past_the_rebuild() {
        let route = RouteId::new("p", "r", "m");
        let cfg = DetectionConfig::default();
        let history: Vec<ProbeOutcome> = (0..10).map(|i| probe(at(30 * i), 1000.0)).collect();
        let rebuilt = Baseline::rebuild(route.clone(), &cfg, &history);
        assert_eq!(rebuilt.samples(), 10);
        let (_tx, rx) = mpsc::channel(1);
        let progress = WarmProgress::default();
        progress.start(2);
        let mut w = Warming::new(rx, vec![false, true], progress.clone());
        // Route 0 warms: it saw the last stored probe again (the rebuild read it too) and
        // one newer. Route 1 is warm: nothing is kept for it.
        w.observe(0, &history[9]);
        w.observe(0, &probe(at(300), 1000.0));
        w.observe(1, &probe(at(300), 1000.0));
        assert!(!w.pending.contains_key(&1));
        let (i, b) = w.finish(Warmed {
            index: 0,
            baseline: rebuilt,
            newest: Some(at(270)),
        });
        assert_eq!(i, 0);
        assert_eq!(
            b.samples(),
            11,
            "the newer one learned, the re-read one not twice"
        );
        assert_eq!(progress.get(), (1, 2));
        // Observed past the bound: the oldest are not replayed.
        for k in 0..(MAX_PENDING as i64 + 5) {
            w.warm[0] = false;
            w.observe(0, &probe(at(1000 + k), 1000.0));
        }
        assert_eq!(w.pending[&0].len(), MAX_PENDING);
    }
}
