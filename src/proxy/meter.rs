//! Metering: one [`RequestRecord`] per request with its attempts, written through the store's
//! writer by a background task fed over a bounded queue ([`Meter`]) — the request path only
//! does a `try_send`, never waits for the database. A full queue drops the record, counted
//! and logged. Readable at `GET /api/v1/requests` (`web::requests`, admin token).
//!
//! The first record of a batch waits [`LINGER`] for others, so requests that arrive one at a
//! time share a commit instead of paying one each (a commit of one record cost half as much
//! CPU again as writing it); the wait is a timer, so the records that come meanwhile do not
//! wake the task. [`Meter::close`], called once the server has drained, writes what is queued
//! without waiting.
//!
//! A batch is one writer command, written in one transaction. While the database is
//! unreachable (read-only mode) the queue is the buffer: the batch being written is kept and
//! sent again every [`RETRY_PAUSE`] (the store is marked unavailable), the others wait behind
//! it, and once the database returns they are written in batches again. Only a record the
//! store refuses for another reason is dropped (logged).
//!
//! [`ProxyCounters`] keeps `probeok_proxy_requests_total{serves,route,outcome}` and
//! `probeok_proxy_failovers_total{reason}` and `probeok_contract_uses_total{feature,contract}`
//! (`feature` is the contract's own, from the config) in memory; [`ProxyCounters::snapshot`] is what the
//! metrics exporter reads. Label sets are bounded: `serves` and `route` come from the config,
//! `outcome` and `reason` from closed sets (`http_NNN` at most a few hundred); a hard cap
//! ([`MAX_LABEL_SETS`]) folds anything beyond into `other`.

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::route::Price;
use crate::store::{RequestRecord, StoreError, StoreHealth, Writer};

/// Records waiting for the writer (also the read-only mode buffer).
pub const METER_QUEUE: usize = 4096;
/// Records handed to the writer at once.
const FLUSH_BATCH: usize = 256;
/// How long a batch's first record waits for more before the batch is written. Short, because
/// the commit of a batch is a burst of CPU the requests of the moment share the cores with:
/// one request at a time behind a 10 ms wait had a p99 of 0.7–1.1 ms added, 0.46–0.51 ms at 2.
pub const LINGER: Duration = Duration::from_millis(2);
/// How long closing waits for the queued records to be written.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// The pause before writing a record again after the database was unreachable.
pub const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Distinct label sets per counter family, at most.
pub const MAX_LABEL_SETS: usize = 4096;

/// The cost of `prompt` + `completion` tokens at `price` (per million tokens).
pub fn cost(price: Option<&Price>, prompt: Option<u64>, completion: Option<u64>) -> Option<f64> {
    let p = price?;
    if prompt.is_none() && completion.is_none() {
        return None;
    }
    let tokens = |n: Option<u64>, per: f64| n.unwrap_or(0) as f64 * per / 1_000_000.0;
    Some(tokens(prompt, p.input_per_mtok) + tokens(completion, p.output_per_mtok))
}

/// Where metered records go: a bounded queue drained into the store.
#[derive(Debug, Clone)]
pub struct Meter {
    tx: mpsc::Sender<RequestRecord>,
    dropped: Arc<AtomicU64>,
    /// Cancelled by [`Meter::close`]: stop lingering, write what is queued, end.
    closing: CancellationToken,
    /// Cancelled by the task once everything it took is written (or refused).
    written: CancellationToken,
}

impl Meter {
    /// Starts the task that writes records through `writer`; it ends once every `Meter` clone
    /// is dropped and the queue is drained. Connection failures mark `health` unavailable and
    /// are retried; the store's return is noticed by them or by the proxy's check.
    pub fn spawn(
        writer: Writer,
        health: Arc<StoreHealth>,
        clock: Arc<dyn Clock>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        Self::spawn_lingering(writer, health, clock, LINGER)
    }

    fn spawn_lingering(
        writer: Writer,
        health: Arc<StoreHealth>,
        clock: Arc<dyn Clock>,
        linger: Duration,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<RequestRecord>(METER_QUEUE);
        let (closing, written) = (CancellationToken::new(), CancellationToken::new());
        let (close, done) = (closing.clone(), written.clone());
        let task = tokio::spawn(async move {
            let _done = done.drop_guard();
            let mut batch = Vec::with_capacity(FLUSH_BATCH);
            loop {
                let more = tokio::select! {
                    n = rx.recv_many(&mut batch, FLUSH_BATCH) => n > 0,
                    () = close.cancelled(), if !rx.is_closed() => {
                        // Refuse new records; the queued ones are still received.
                        rx.close();
                        continue;
                    }
                };
                if !more {
                    break;
                }
                // The linger is a timer, not a wait on the queue: the records that arrive
                // meanwhile are queued without waking this task, one wake-up a batch instead
                // of one a request. A full batch (a queue that was not empty) does not linger.
                if batch.len() < FLUSH_BATCH {
                    tokio::select! {
                        () = tokio::time::sleep(linger) => {}
                        () = close.cancelled() => {}
                    }
                    while batch.len() < FLUSH_BATCH {
                        match rx.try_recv() {
                            Ok(r) => batch.push(r),
                            Err(_) => break,
                        }
                    }
                }
                let records: Arc<[RequestRecord]> = batch.drain(..).collect();
                // One command for the batch: one transaction, one answer. A record the store
                // refuses fails its whole transaction, so then each is written on its own and
                // only the refused one is lost.
                let refused = match write(&writer, &health, &*clock, records.clone()).await {
                    Err(_) if records.len() > 1 => {
                        let mut refused = Vec::new();
                        for r in records.iter() {
                            let one = write(&writer, &health, &*clock, Arc::new([r.clone()]));
                            refused.extend(one.await.err());
                        }
                        refused
                    }
                    other => other.err().into_iter().collect(),
                };
                for e in refused {
                    tracing::error!(error = %e, "cannot store a metered proxy request");
                }
            }
        });
        (
            Self {
                tx,
                dropped: Arc::new(AtomicU64::new(0)),
                closing,
                written,
            },
            task,
        )
    }

    /// Stops taking records and resolves once the queued ones are written (at most
    /// [`CLOSE_WAIT`]: a store that is down keeps them queued): after the server has drained
    /// and before the store closes. Records sent after this are counted as dropped.
    pub async fn close(&self) {
        self.closing.cancel();
        if tokio::time::timeout(CLOSE_WAIT, self.written.cancelled())
            .await
            .is_err()
        {
            tracing::warn!(
                waiting = self.waiting(),
                "metering records not written at shutdown"
            );
        }
    }

    /// Queues one record; never waits.
    pub fn send(&self, record: RequestRecord) {
        if self.tx.try_send(record).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(dropped = n, "metering records dropped (store queue full)");
            }
        }
    }

    /// Records queued and not yet written (the read-only mode buffer's fill).
    pub fn waiting(&self) -> usize {
        METER_QUEUE - self.tx.capacity()
    }

    /// Records dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Writes `records` in one transaction, sending them again every [`RETRY_PAUSE`] while the
/// database is unreachable (`health` marks it so); the error when the store refused them.
async fn write(
    writer: &Writer,
    health: &StoreHealth,
    clock: &dyn Clock,
    records: Arc<[RequestRecord]>,
) -> Result<(), StoreError> {
    loop {
        match writer.record_requests(records.clone()).await {
            Ok(()) => {
                health.recovered();
                return Ok(());
            }
            Err(e) if health.failed(&e, clock.now()) => tokio::time::sleep(RETRY_PAUSE).await,
            Err(e) => return Err(e),
        }
    }
}

/// One counter's labels and value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestCount {
    pub serves: String,
    pub route: String,
    pub outcome: String,
    pub value: u64,
}

/// What the metrics exporter reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CountersSnapshot {
    /// `probeok_proxy_requests_total{serves,route,outcome}`, sorted.
    pub requests: Vec<RequestCount>,
    /// `probeok_proxy_failovers_total{reason}`, sorted by reason.
    pub failovers: Vec<(String, u64)>,
    /// `probeok_contract_uses_total{feature,contract}`, sorted.
    pub contract_uses: Vec<((String, String), u64)>,
    /// Metering records dropped (queue full).
    pub meter_dropped: u64,
    /// Passive outcomes dropped (queue full, or the remote monitor unreachable).
    pub passive_dropped: u64,
    /// Route observations dropped (queue full).
    pub observed_dropped: u64,
}

/// `serves` → `route` → `outcome` → count, with the number of label sets: nested so that
/// counting an existing label set allocates nothing. FxHash: every key comes from the config
/// or a closed set (never from a request), and SipHash showed in every request's profile.
#[derive(Debug, Default)]
struct RequestCounts {
    by_serves: FxHashMap<String, FxHashMap<String, FxHashMap<String, u64>>>,
    label_sets: usize,
}

impl RequestCounts {
    fn get_mut(&mut self, serves: &str, route: &str, outcome: &str) -> Option<&mut u64> {
        self.by_serves
            .get_mut(serves)?
            .get_mut(route)?
            .get_mut(outcome)
    }

    fn add(&mut self, serves: &str, route: &str, outcome: &str) {
        if let Some(n) = self.get_mut(serves, route, outcome) {
            *n += 1;
            return;
        }
        let (serves, route) = if self.label_sets >= MAX_LABEL_SETS {
            ("other", "other")
        } else {
            (serves, route)
        };
        if let Some(n) = self.get_mut(serves, route, outcome) {
            *n += 1;
            return;
        }
        self.label_sets += 1;
        let routes = self.by_serves.entry(serves.to_owned()).or_default();
        let outcomes = routes.entry(route.to_owned()).or_default();
        outcomes.insert(outcome.to_owned(), 1);
    }
}

/// The proxy's counters.
#[derive(Debug, Default)]
pub struct ProxyCounters {
    requests: Mutex<RequestCounts>,
    failovers: Mutex<FxHashMap<String, u64>>,
    contract_uses: Mutex<FxHashMap<(String, String), u64>>,
}

impl ProxyCounters {
    pub fn request(&self, serves: &str, route: &str, outcome: &str) {
        let mut counts = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        counts.add(serves, route, outcome);
    }

    pub fn failover(&self, reason: &str) {
        let mut map = self.failovers.lock().unwrap_or_else(|e| e.into_inner());
        let key = if map.len() >= MAX_LABEL_SETS && !map.contains_key(reason) {
            "other".to_owned()
        } else {
            reason.to_owned()
        };
        *map.entry(key).or_insert(0) += 1;
    }

    /// A degradation contract answered: `feature` is the contract's (bounded by the config),
    /// `contract` its behaviour.
    pub fn contract_use(&self, feature: &str, contract: &str) {
        let mut map = self.contract_uses.lock().unwrap_or_else(|e| e.into_inner());
        let mut key = (feature.to_owned(), contract.to_owned());
        if map.len() >= MAX_LABEL_SETS && !map.contains_key(&key) {
            key.0 = "other".to_owned();
        }
        *map.entry(key).or_insert(0) += 1;
    }

    /// The counters as they are now (drop counts are filled in by the proxy).
    pub fn snapshot(&self) -> CountersSnapshot {
        let mut requests: Vec<RequestCount> = Vec::new();
        {
            let counts = self.requests.lock().unwrap_or_else(|e| e.into_inner());
            for (serves, routes) in &counts.by_serves {
                for (route, outcomes) in routes {
                    for (outcome, v) in outcomes {
                        requests.push(RequestCount {
                            serves: serves.clone(),
                            route: route.clone(),
                            outcome: outcome.clone(),
                            value: *v,
                        });
                    }
                }
            }
        }
        requests.sort_by(|a, b| {
            (&a.serves, &a.route, &a.outcome).cmp(&(&b.serves, &b.route, &b.outcome))
        });
        let mut failovers: Vec<(String, u64)> = self
            .failovers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        failovers.sort();
        let mut contract_uses: Vec<((String, String), u64)> = self
            .contract_uses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        contract_uses.sort();
        CountersSnapshot {
            requests,
            failovers,
            contract_uses,
            meter_dropped: 0,
            passive_dropped: 0,
            observed_dropped: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::store::{AttemptRecord, RequestFilter, Store};

    fn record(id: &str) -> RequestRecord {
        RequestRecord {
            request_id: id.into(),
            serves: "chat".into(),
            started_at: chrono::Utc::now(),
            outcome: "ok".into(),
            status: 200,
            ..RequestRecord::default()
        }
    }

    fn stored(store: &Store) -> Vec<String> {
        let filter = RequestFilter {
            limit: 100,
            ..RequestFilter::default()
        };
        let reader = store.reader().unwrap();
        let mut ids: Vec<_> = (reader.proxy_requests(&filter).unwrap().into_iter())
            .map(|r| r.request_id)
            .collect();
        ids.sort();
        ids
    }

    #[tokio::test]
    async fn a_batch_lingers_for_company_and_closing_writes_it_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("m.db"), Default::default()).unwrap();
        // A linger no test outlives: only `close` can end it.
        let (meter, task) = Meter::spawn_lingering(
            store.writer(),
            store.health().clone(),
            Arc::new(SystemClock),
            Duration::from_secs(3600),
        );
        meter.send(record("a"));
        meter.send(record("b"));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while meter.waiting() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the task never took them"
            );
            tokio::task::yield_now().await;
        }
        // Taken from the queue, held for company: not in the store yet.
        assert!(stored(&store).is_empty());
        meter.close().await;
        assert_eq!(stored(&store), ["a", "b"]);
        task.await.unwrap();
        meter.send(record("late"));
        assert_eq!(
            meter.dropped(),
            1,
            "a record after closing is counted, not lost silently"
        );
    }

    #[tokio::test]
    async fn a_refused_record_is_the_only_one_of_its_batch_lost() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("m.db"), Default::default()).unwrap();
        let (meter, task) = Meter::spawn_lingering(
            store.writer(),
            store.health().clone(),
            Arc::new(SystemClock),
            Duration::from_secs(3600),
        );
        // Two attempts numbered alike break the attempts' key: the store refuses the record,
        // and with it the transaction of the batch it is in.
        let attempt = AttemptRecord {
            n: 1,
            route: "p/r/m".into(),
            reason: None,
            status_class: "2xx".into(),
            status: Some(200),
            ttfb_ms: None,
            latency_ms: 1.0,
            prompt_tokens: None,
            completion_tokens: None,
            cost: None,
            outcome: "ok".into(),
        };
        let mut bad = record("bad");
        bad.attempts = vec![attempt.clone(), attempt];
        meter.send(record("a"));
        meter.send(bad);
        meter.send(record("c"));
        meter.close().await;
        task.await.unwrap();
        assert_eq!(stored(&store), ["a", "c"]);
        assert_eq!(meter.dropped(), 0, "refused is not dropped from the queue");
    }

    #[test]
    fn cost_follows_the_price() {
        let price = Price {
            input_per_mtok: 2.0,
            output_per_mtok: 8.0,
            currency: "CNY".into(),
        };
        let c = cost(Some(&price), Some(1_000_000), Some(500_000)).unwrap();
        assert!((c - 6.0).abs() < 1e-9);
        assert_eq!(cost(None, Some(1), Some(1)), None);
        assert_eq!(cost(Some(&price), None, None), None);
    }

    #[test]
    fn counters_are_bounded() {
        let c = ProxyCounters::default();
        for i in 0..(MAX_LABEL_SETS + 10) {
            c.failover(&format!("r{i}"));
        }
        let s = c.snapshot();
        assert_eq!(s.failovers.len(), MAX_LABEL_SETS + 1);
        assert!(s.failovers.iter().any(|(k, v)| k == "other" && *v == 10));
        c.request("chat", "a/b/c", "ok");
        c.request("chat", "a/b/c", "ok");
        assert_eq!(c.snapshot().requests[0].value, 2);
        for i in 0..(MAX_LABEL_SETS + 10) {
            c.request("chat", &format!("r/{i}/m"), "ok");
        }
        c.request("chat", "a/b/c", "ok");
        let s = c.snapshot();
        assert_eq!(s.requests.len(), MAX_LABEL_SETS + 1);
        let other = s.requests.iter().find(|r| r.serves == "other").unwrap();
        assert_eq!((other.route.as_str(), other.value), ("other", 11));
        let kept = s.requests.iter().find(|r| r.route == "a/b/c").unwrap();
        assert_eq!(kept.value, 3);
    }
}
