//! The one writer: a dedicated thread owning the only write connection.
//!
//! Async callers send a [`Command`] with a oneshot for the answer. The thread takes the first
//! queued command, drains whatever else is already queued (up to [`BATCH_CAP`] outcomes),
//! applies it all in one `BEGIN IMMEDIATE` transaction, commits, and only then answers each
//! sender — so an `Ok` means committed. If a batch fails, its commands are retried one per
//! transaction, so one bad command cannot fail its neighbours.
//!
//! On PostgreSQL several processes may write the same database (a monitor pair, proxies).
//! Each writer transaction takes one advisory lock first, so writers take turns as SQLite's
//! write lock makes them, and reads in the same round trip which writer last wrote rollups
//! (`store_meta`): when it was another one, the buckets in memory are dropped and re-read.
//! Round trips are what a PostgreSQL batch costs, so a batch's outcomes go in multi-row
//! inserts, its buckets are loaded and upserted several per statement. A lost connection is
//! reopened with backoff and the batch retried; [`super::Reachability`] says whether the
//! database answered.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};

use super::sql::{Connection, Engine};
use super::{Reachability, StoreLocation};

use super::health::{self, HealthWrite};
use super::jobs::{self, Target};
use super::rollups::RollupCache;
use super::{outcome_days, outcome_hours, outcomes};
use super::{to_ms, StoreError, StoreOptions, BATCH_CAP};
use crate::outcome::{OutcomeKind, ProbeOutcome};
use crate::route::RouteId;

mod upkeep;
pub use upkeep::RETENTION_BATCH;

/// The advisory lock every PostgreSQL writer transaction takes ("probeok" and 2 in its bytes).
const PG_WRITER_LOCK: i64 = 0x7072_6f62_656f_6b02;

/// The `store_meta` key naming the writer that last wrote rollups (PostgreSQL): while it is
/// this writer, the buckets it holds in memory are the stored rows and need no re-reading.
const ROLLUP_WRITER_KEY: &str = "rollup_writer";

/// How long the writer keeps reconnecting before it fails the batch it holds (the next batch
/// tries again); the pauses between attempts double up to [`RECONNECT_MAX_PAUSE`].
const RECONNECT_WINDOW: Duration = Duration::from_secs(15);
const RECONNECT_MAX_PAUSE: Duration = Duration::from_secs(2);

pub(crate) type Ack<T> = oneshot::Sender<Result<T, StoreError>>;

pub(crate) enum Command {
    Record {
        outcomes: Vec<ProbeOutcome>,
        ack: Ack<()>,
    },
    Skip {
        route: RouteId,
        kind: OutcomeKind,
        at: DateTime<Utc>,
        ack: Ack<()>,
    },
    Heartbeat {
        job: String,
        at: DateTime<Utc>,
        ack: Ack<()>,
    },
    Retention {
        target: Target,
        cutoff_ms: i64,
        limit: usize,
        ack: Ack<u64>,
    },
    /// One step of packing closed hours (`outcome_hours`).
    Pack {
        before_ms: i64,
        limit: usize,
        /// A run's first step: the hours passed over before are tried again.
        first: bool,
        ack: Ack<u64>,
    },
    CheckWritable {
        ack: Ack<()>,
    },
    /// One `store_meta` key: a fact about the database itself.
    Meta {
        key: String,
        value: String,
        ack: Ack<()>,
    },
    /// Detection's state, transitions and incidents (see `health.rs`), atomically.
    Health {
        write: HealthWrite,
        ack: Ack<()>,
    },
    /// A write to the alert tables (`store/alerts.rs`).
    Alert {
        op: super::alerts::AlertOp,
        ack: Ack<u64>,
    },
    /// One regression set run (`store/drift.rs`).
    DriftRun {
        run: Box<crate::records::drift::SetRun>,
        ack: Ack<()>,
    },
    /// Metered proxy requests (`store/requests.rs`), all or none. Shared, so that the
    /// sender keeps them to send again while the database is unreachable, without a copy.
    ProxyRequests {
        records: Arc<[super::requests::RequestRecord]>,
        ack: Ack<()>,
    },
    /// An idempotency key's answer (`store/requests.rs`).
    Idempotent {
        answer: Box<super::requests::IdempotentAnswer>,
        now: DateTime<Utc>,
        ack: Ack<()>,
    },
    /// An idempotency key claimed or released (`store/requests.rs`).
    Idempotency {
        op: super::requests::IdempotencyOp,
        ack: Ack<u64>,
    },
    /// One switch controller record (`store/switch.rs`).
    Switch {
        record: Box<crate::records::switch::SwitchRecord>,
        ack: Ack<()>,
    },
    /// A write to the degradation contracts' tables (`store/contracts.rs`).
    Contract {
        op: super::contracts::ContractOp,
        ack: Ack<u64>,
    },
    /// A write to the subscriber tables (`store/subscribers.rs`).
    Subscriber {
        op: super::subscribers::SubscriberOp,
        ack: Ack<u64>,
    },
    /// A write to the channels probeok disabled (`store/gateways.rs`).
    Gateway {
        op: super::gateways::GatewayOp,
        ack: Ack<u64>,
    },
    /// One status page read into the declared tables (`store/declared.rs`).
    Declared {
        op: super::declared::DeclaredOp,
        ack: Ack<u64>,
    },
    /// A write to the model catalog (`store/catalog.rs`).
    Catalog {
        op: super::catalog::CatalogOp,
        ack: Ack<u64>,
    },
    /// One capability probe's result (`store/capabilities.rs`).
    Capability {
        op: super::capabilities::CapabilityOp,
        ack: Ack<u64>,
    },
    /// A write to the embeddings routes' vectors (`store/embeddings.rs`).
    Embedding {
        op: super::embeddings::EmbeddingOp,
        ack: Ack<u64>,
    },
    /// Baselines' changed parts (`store/baselines.rs`).
    Baselines {
        saved: Vec<super::baselines::SavedBaseline>,
        ack: Ack<u64>,
    },
    /// A write to the `drills` table (`store/drills.rs`).
    Drill {
        op: super::drills::DrillOp,
        ack: Ack<u64>,
    },
    /// Outcomes from remote vantages (`store/vantage.rs`); answers how many were new.
    Vantage {
        items: Vec<crate::vantage::VantageOutcome>,
        now: DateTime<Utc>,
        cutoff_ms: i64,
        /// Per item: was it new.
        ack: Ack<Vec<bool>>,
    },
    /// Observed rollup rows from real traffic (`store/observed.rs`).
    Observed {
        rows: Vec<super::observed::ObservedRow>,
        now: DateTime<Utc>,
        ack: Ack<()>,
    },
    /// Commit what is queued, then stop.
    Shutdown {
        ack: oneshot::Sender<()>,
    },
}

impl Command {
    /// How much of the batch cap it uses.
    fn weight(&self) -> usize {
        match self {
            Command::Record { outcomes, .. } => outcomes.len().max(1),
            Command::Vantage { items, .. } => items.len().max(1),
            Command::ProxyRequests { records, .. } => records.len().max(1),
            _ => 1,
        }
    }

    /// Answers the sender; a sender that stopped waiting is not an error. `masks` holds the
    /// per-item answers of committed `Vantage` commands, in order.
    fn answer(self, result: Result<u64, StoreError>, masks: &mut VecDeque<Vec<bool>>) {
        match self {
            Command::Vantage { ack, .. } => {
                let _ = ack.send(result.map(|_| masks.pop_front().unwrap_or_default()));
            }
            Command::Record { ack, .. }
            | Command::Skip { ack, .. }
            | Command::Heartbeat { ack, .. }
            | Command::Health { ack, .. }
            | Command::CheckWritable { ack }
            | Command::Meta { ack, .. }
            | Command::DriftRun { ack, .. }
            | Command::ProxyRequests { ack, .. }
            | Command::Idempotent { ack, .. }
            | Command::Switch { ack, .. }
            | Command::Observed { ack, .. } => {
                let _ = ack.send(result.map(|_| ()));
            }
            Command::Retention { ack, .. }
            | Command::Pack { ack, .. }
            | Command::Alert { ack, .. }
            | Command::Contract { ack, .. }
            | Command::Idempotency { ack, .. }
            | Command::Drill { ack, .. }
            | Command::Subscriber { ack, .. }
            | Command::Gateway { ack, .. }
            | Command::Declared { ack, .. }
            | Command::Catalog { ack, .. }
            | Command::Capability { ack, .. }
            | Command::Embedding { ack, .. }
            | Command::Baselines { ack, .. } => {
                let _ = ack.send(result);
            }
            Command::Shutdown { ack } => {
                let _ = ack.send(());
            }
        }
    }
}

/// A write in the writer's queue.
#[derive(Debug)]
pub struct Queued<T>(oneshot::Receiver<Result<T, StoreError>>);

impl<T> Queued<T> {
    /// Resolves after the write's COMMIT (or its failure).
    pub async fn committed(self) -> Result<T, StoreError> {
        self.0.await.map_err(|_| StoreError::Closed)?
    }
}

/// Sends writes to the writer thread. Every method resolves once its write is committed (or
/// failed), except those named `queue_*`, which resolve once it is queued and hand back a
/// [`Queued`] to wait for the commit with; dropping the future does not cancel a write
/// already queued.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Command>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl Writer {
    pub(crate) fn new(tx: mpsc::Sender<Command>) -> Self {
        Self { tx }
    }

    pub(crate) async fn send(&self, c: Command) -> Result<(), StoreError> {
        self.tx.send(c).await.map_err(|_| StoreError::Closed)
    }

    pub(crate) async fn request<T>(
        &self,
        make: impl FnOnce(Ack<T>) -> Command,
    ) -> Result<T, StoreError> {
        self.queue(make).await?.committed().await
    }

    /// Queues a write; resolves once it is queued.
    pub(crate) async fn queue<T>(
        &self,
        make: impl FnOnce(Ack<T>) -> Command,
    ) -> Result<Queued<T>, StoreError> {
        let (ack, answer) = oneshot::channel();
        self.send(make(ack)).await?;
        Ok(Queued(answer))
    }

    /// Stores one outcome and updates its rollups; resolves after COMMIT.
    pub async fn record(&self, o: ProbeOutcome) -> Result<(), StoreError> {
        self.record_many(vec![o]).await
    }

    /// Stores several outcomes in one transaction (all or none).
    pub async fn record_many(&self, o: Vec<ProbeOutcome>) -> Result<(), StoreError> {
        if o.is_empty() {
            return Ok(());
        }
        for one in &o {
            outcomes::validate(one)?;
        }
        self.request(|ack| Command::Record { outcomes: o, ack })
            .await
    }

    /// Records that the scheduler skipped a probe (the previous one was still running).
    pub async fn record_skip(
        &self,
        route: &RouteId,
        kind: OutcomeKind,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let route = route.clone();
        self.request(|ack| Command::Skip {
            route,
            kind,
            at,
            ack,
        })
        .await
    }

    /// Sets `job`'s last heartbeat.
    pub async fn heartbeat(&self, job: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        let job = job.to_owned();
        self.request(|ack| Command::Heartbeat { job, at, ack })
            .await
    }

    /// One write to the alert tables, in its own transaction with whatever else is queued;
    /// answers the op's count (see [`super::alerts::AlertOp`]).
    pub async fn alert(&self, op: super::alerts::AlertOp) -> Result<u64, StoreError> {
        self.request(|ack| Command::Alert { op, ack }).await
    }

    /// Sets a `store_meta` key (read back with [`super::Reader::meta`]).
    pub async fn set_meta(&self, key: &str, value: &str) -> Result<(), StoreError> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.request(|ack| Command::Meta { key, value, ack }).await
    }

    /// A tiny real write through the queue and a commit: the store is writable and the writer
    /// is keeping up (for `/readyz`).
    pub async fn check_writable(&self) -> Result<(), StoreError> {
        self.request(|ack| Command::CheckWritable { ack }).await
    }
}

/// The writer thread's body: runs until `Shutdown` or until every sender is gone, committing
/// whatever was queued before it returns.
pub(crate) fn run(
    mut conn: Connection,
    location: StoreLocation,
    reachability: Arc<Reachability>,
    mut rx: mpsc::Receiver<Command>,
    opts: StoreOptions,
) {
    let mut state = State {
        threshold_ms: opts.latency_threshold.as_secs_f64() * 1000.0,
        route_ids: HashMap::new(),
        rollups: RollupCache::default(),
        days: outcome_days::Days::default(),
        masks: VecDeque::new(),
        pack_skipped: Vec::new(),
        token: writer_token(),
        location,
        reachability,
    };
    // SQLite: WAL checkpoints on their own thread, not inside these commits.
    let checkpoints = match (&state.location, conn.as_sqlite()) {
        (StoreLocation::Sqlite(path), Some(c)) => super::checkpoint::Checkpointer::start(path, c)
            .map_err(|e| tracing::warn!(error = %e, "checkpoints stay in the writer's commits"))
            .ok(),
        _ => None,
    };
    let mut shutdowns = Vec::new();
    loop {
        // Once closing, take only what is already queued.
        let first = if shutdowns.is_empty() {
            rx.blocking_recv()
        } else {
            rx.try_recv().ok()
        };
        let Some(first) = first else { break };
        let mut batch = Vec::new();
        let mut weight = 0;
        let mut next = Some(first);
        while let Some(c) = next.take() {
            if let Command::Shutdown { .. } = c {
                // Refuse new sends; what is buffered still drains below.
                rx.close();
                shutdowns.push(c);
            } else {
                weight += c.weight();
                batch.push(c);
            }
            if weight < BATCH_CAP {
                next = rx.try_recv().ok();
            }
        }
        state.process(&mut conn, batch);
        if let Some(c) = &checkpoints {
            c.committed();
        }
    }
    drop(checkpoints);
    // Lets SQLite refresh its planner statistics, as recommended before closing.
    if conn.engine() == Engine::Sqlite {
        let _ = conn.execute_batch("PRAGMA optimize");
    }
    drop(conn);
    for c in shutdowns {
        c.answer(Ok(0), &mut VecDeque::new());
    }
}

/// A writer's identity among the processes sharing a database: process id and a random
/// number, so two writers (two processes, or two stores of one) never look alike.
fn writer_token() -> String {
    format!("{}-{:016x}", std::process::id(), rand::random::<u64>())
}

struct State {
    threshold_ms: f64,
    /// Interned route ids; may hold ids from the open transaction, so cleared on failure.
    route_ids: HashMap<RouteId, i64>,
    rollups: RollupCache,
    /// The days that have an outcomes partition (PostgreSQL).
    days: outcome_days::Days,
    /// Per-item answers of the committed `Vantage` commands not yet answered.
    masks: VecDeque<Vec<bool>>,
    /// The hours the current packing run passed over (see [`outcome_hours::Skipped`]).
    pack_skipped: Vec<outcome_hours::Skipped>,
    /// Unique to this writer: what it writes under [`ROLLUP_WRITER_KEY`].
    token: String,
    location: StoreLocation,
    reachability: Arc<Reachability>,
}

impl State {
    /// Replaces a lost connection, retrying with backoff for up to [`RECONNECT_WINDOW`].
    fn reconnect(&mut self, conn: &mut Connection) -> Result<(), StoreError> {
        let deadline = Instant::now() + RECONNECT_WINDOW;
        let mut pause = Duration::from_millis(100);
        loop {
            match self.location.connect() {
                Ok(c) => {
                    *conn = c;
                    self.forget();
                    tracing::info!(database = %self.location.describe(), "store reconnected");
                    self.reachability.set(None);
                    return Ok(());
                }
                Err(e) => {
                    self.reachability.set(Some(e.to_string()));
                    if Instant::now() + pause > deadline {
                        return Err(e);
                    }
                    tracing::warn!(database = %self.location.describe(), error = %e, "store unreachable; retrying");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(RECONNECT_MAX_PAUSE);
                }
            }
        }
    }

    /// [`State::apply`], reconnecting first when the connection is gone and once more when
    /// the batch failed because it went away.
    fn apply_connected(
        &mut self,
        conn: &mut Connection,
        cmds: &[Command],
    ) -> Result<Vec<u64>, StoreError> {
        if !conn.is_alive() {
            self.reconnect(conn)?;
        }
        match self.apply(conn, cmds) {
            Err(e) if e.is_connection() => {
                self.forget();
                self.reachability.set(Some(e.to_string()));
                self.reconnect(conn)?;
                self.apply(conn, cmds)
            }
            other => {
                if other.is_ok() && !self.reachability.reachable() {
                    self.reachability.set(None);
                }
                other
            }
        }
    }

    fn process(&mut self, conn: &mut Connection, batch: Vec<Command>) {
        if batch.is_empty() {
            return;
        }
        match self.apply_connected(conn, &batch) {
            Ok(replies) => {
                for (c, r) in batch.into_iter().zip(replies) {
                    c.answer(Ok(r), &mut self.masks);
                }
            }
            Err(e) if batch.len() == 1 => {
                self.forget();
                if let Some(c) = batch.into_iter().next() {
                    c.answer(Err(e), &mut self.masks);
                }
            }
            Err(e) => {
                self.forget();
                tracing::warn!(error = %e, commands = batch.len(), "store batch failed; retrying one command per transaction");
                for c in batch {
                    match self.apply_connected(conn, std::slice::from_ref(&c)) {
                        Ok(r) => c.answer(Ok(r.first().copied().unwrap_or(0)), &mut self.masks),
                        Err(e) => {
                            self.forget();
                            c.answer(Err(e), &mut self.masks);
                        }
                    }
                }
            }
        }
    }

    /// After a rollback the caches may hold uncommitted state.
    fn forget(&mut self) {
        self.route_ids.clear();
        self.rollups.clear();
        self.masks.clear();
        self.days.forget();
    }

    fn route_id(&mut self, conn: &Connection, route: &RouteId) -> Result<i64, StoreError> {
        if let Some(id) = self.route_ids.get(route) {
            return Ok(*id);
        }
        let id = outcomes::intern_route(conn, route)?;
        self.route_ids.insert(route.clone(), id);
        Ok(id)
    }

    /// Applies commands in one transaction; the replies (rows deleted for retention, else 0)
    /// only once it committed.
    fn apply(&mut self, conn: &mut Connection, cmds: &[Command]) -> Result<Vec<u64>, StoreError> {
        let tx = conn.transaction()?;
        // On PostgreSQL: whether another process wrote rollups since this writer last did.
        let mut foreign_rollups = false;
        if tx.engine() == Engine::Postgres {
            let last: Option<String> = tx.query_row(
                "SELECT pg_advisory_xact_lock(?1),
                     (SELECT value FROM store_meta WHERE key = 'rollup_writer')",
                [PG_WRITER_LOCK],
                |r| r.get(1),
            )?;
            if last.as_deref() != Some(self.token.as_str()) {
                // Its buckets in memory may be behind the rows: read them again.
                self.rollups.clear();
                foreign_rollups = true;
            }
        }
        // Every bucket this batch's outcomes touch, loaded in a few statements up front.
        let mut recorded = Vec::new();
        for c in cmds {
            if let Command::Record { outcomes: os, .. } = c {
                for o in os {
                    recorded.push((self.route_id(&tx, &o.route)?, o));
                }
            }
        }
        self.rollups
            .preload(&tx, recorded.iter().map(|(id, o)| (*id, *o)))?;
        let now_ms = Utc::now().timestamp_millis();
        self.days.ensure(
            &tx,
            now_ms,
            recorded.iter().map(|(_, o)| to_ms(o.started_at)),
        )?;
        // Outcomes of consecutive `Record`s are inserted together, before the next other
        // command, so rows keep their order relative to every other write of the batch.
        let mut pending: Vec<(i64, &ProbeOutcome)> = Vec::new();
        let mut rollups_written = 0;
        let mut replies = Vec::with_capacity(cmds.len());
        for c in cmds {
            if !matches!(c, Command::Record { .. }) && !pending.is_empty() {
                outcomes::insert_many(&tx, &pending)?;
                pending.clear();
            }
            let reply = match c {
                Command::Record { outcomes: os, .. } => {
                    for o in os {
                        let id = self.route_id(&tx, &o.route)?;
                        pending.push((id, o));
                        self.rollups.add(&tx, id, o, self.threshold_ms)?;
                    }
                    0
                }
                Command::Skip {
                    route, kind, at, ..
                } => {
                    let id = self.route_id(&tx, route)?;
                    jobs::insert_skip(&tx, id, *kind, *at)?;
                    0
                }
                Command::Heartbeat { job, at, .. } => {
                    jobs::upsert_heartbeat(&tx, job, *at)?;
                    0
                }
                Command::DriftRun { run, .. } => {
                    super::drift::insert_run(&tx, run)?;
                    0
                }
                Command::ProxyRequests { records, .. } => {
                    super::requests::insert_requests(&tx, records)?;
                    0
                }
                Command::Idempotent { answer, now, .. } => {
                    super::requests::upsert_idempotent(&tx, answer, *now)?;
                    0
                }
                Command::Idempotency { op, .. } => super::requests::apply_idempotency(&tx, op)?,
                Command::Switch { record, .. } => {
                    super::switch::insert(&tx, record)?;
                    0
                }
                Command::CheckWritable { .. } => {
                    jobs::touch_meta(&tx, "last_writable_check", &Utc::now().to_rfc3339())?;
                    0
                }
                Command::Meta { key, value, .. } => {
                    jobs::touch_meta(&tx, key, value)?;
                    0
                }
                Command::Retention {
                    target,
                    cutoff_ms,
                    limit,
                    ..
                } => {
                    if let Target::Rollups(g) = target {
                        // Cached buckets must reach their rows before the delete sees them,
                        // and deleted ones must not be written back later.
                        rollups_written += self.rollups.flush(&tx)?;
                        let n = jobs::delete_old(&tx, *target, *cutoff_ms, *limit)?;
                        self.rollups.evict_before(*g, *cutoff_ms);
                        rollups_written += usize::from(n > 0);
                        n
                    } else {
                        jobs::delete_old(&tx, *target, *cutoff_ms, *limit)?
                    }
                }
                Command::Pack {
                    before_ms,
                    limit,
                    first,
                    ..
                } => {
                    if *first {
                        self.pack_skipped.clear();
                    }
                    let (n, skipped) =
                        outcome_hours::pack_step(&tx, *before_ms, *limit, &self.pack_skipped)?;
                    self.pack_skipped.extend(skipped);
                    n
                }
                Command::Health { write, .. } => {
                    health::apply(&tx, write, |route| self.route_id(&tx, route))?;
                    0
                }
                Command::Alert { op, .. } => super::alerts::apply(&tx, op)?,
                Command::Contract { op, .. } => super::contracts::apply(&tx, op)?,
                Command::Drill { op, .. } => super::drills::apply(&tx, op)?,
                Command::Subscriber { op, .. } => super::subscribers::apply(&tx, op)?,
                Command::Gateway { op, .. } => super::gateways::apply(&tx, op)?,
                Command::Declared { op, .. } => super::declared::apply(&tx, op)?,
                Command::Catalog { op, .. } => super::catalog::apply(&tx, op)?,
                Command::Capability { op, .. } => super::capabilities::apply(&tx, op)?,
                Command::Embedding { op, .. } => super::embeddings::apply(&tx, op)?,
                Command::Baselines { saved, .. } => super::baselines::save(&tx, saved)?,
                Command::Vantage {
                    items,
                    now,
                    cutoff_ms,
                    ..
                } => {
                    let mut mask = Vec::with_capacity(items.len());
                    for v in items {
                        let id = self.route_id(&tx, &v.outcome.route)?;
                        mask.push(super::vantage::insert(&tx, id, v, *now)?);
                    }
                    super::vantage::delete_old(&tx, *cutoff_ms)?;
                    self.masks.push_back(mask);
                    0
                }
                Command::Observed { rows, now, .. } => {
                    super::observed::upsert(&tx, rows, *now)?;
                    0
                }
                Command::Shutdown { .. } => 0,
            };
            replies.push(reply);
        }
        outcomes::insert_many(&tx, &pending)?;
        rollups_written += self.rollups.flush(&tx)?;
        if foreign_rollups && rollups_written > 0 {
            // From now on this writer's buckets in memory are the rows, until another writes.
            jobs::touch_meta(&tx, ROLLUP_WRITER_KEY, &self.token)?;
        }
        tx.commit()?;
        self.rollups.committed();
        Ok(replies)
    }
}
