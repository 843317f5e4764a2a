//! SQLite storage: every outcome raw, rollups for long history, heartbeats and skipped probes.
//!
//! - One **writer thread** owns the only write connection. Async callers send commands on a
//!   bounded channel ([`Writer`]); the thread drains what is queued (up to [`BATCH_CAP`]
//!   outcomes), applies it in one transaction, commits, then acknowledges each sender. An
//!   acknowledged write is committed; async code never blocks on SQLite.
//! - **Rollups** (5-minute, hourly, daily per route and outcome kind) are updated in the same
//!   transaction as the raw rows, so they can never disagree with them. Percentiles come from
//!   mergeable histograms ([`histogram`]), so 30 days of p95 never scans raw rows.
//! - **Readers** ([`Reader`]) open their own read-only connections (WAL lets them run beside
//!   the writer); their API is synchronous, call it from `spawn_blocking`.
//! - **Schema** lives in `migrations/`, applied in order at open ([`migrate()`]).
//!
//! Files: `migrate.rs` (schema versions), `writer.rs` (the thread and its batching),
//! `outcomes.rs` (routes + raw outcomes), `rollups.rs` (rollups, [`Rollup`]),
//! `jobs.rs` (heartbeats, skipped probes, retention), `health.rs` (detection's route states,
//! transitions and incidents), `drift.rs` (regression set runs), `requests.rs` (the proxy's metering and idempotency keys),
//! `contracts.rs` (degradation contracts: async-queue jobs, cached answers),
//! `drills.rs` (drills and the reads behind their reports),
//! `stats.rs` (bulk reads over every route for the
//! published views), `histogram.rs`, `alerts.rs` (the alert
//! outbox, firing alerts, silences).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod alerts;
mod contracts;
mod drift;
pub mod drills;
mod health;
pub mod histogram;
mod jobs;
pub mod migrate;
mod outcomes;
mod requests;
mod rollups;
mod stats;
mod switch;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot};

pub use contracts::{CachedAnswer, ContractOp, JobRecord, JobStatus, OWNER_SHARE_FULL};
pub use health::StoredHealth;
pub use histogram::LatencyHistogram;
pub use jobs::RetentionReport;
pub use migrate::{latest_version, migrate, migrate_to, user_version};
pub use requests::{AttemptRecord, IdempotentAnswer, RequestFilter, RequestRecord};
pub use rollups::{Granularity, Rollup};
pub use stats::{quantile, Counts, DailyCounts, Samples, MAX_SAMPLE_ROWS};
pub use writer::{Writer, RETENTION_BATCH};

use crate::outcome::OutcomeKind;
use crate::route::RouteId;

/// Most outcomes committed in one transaction. Larger batches amortise the commit further but
/// hold the write lock longer and delay the first acknowledgement of the batch.
pub const BATCH_CAP: usize = 512;

/// Commands waiting for the writer. When full, senders wait (backpressure) without blocking
/// a thread.
const QUEUE_CAPACITY: usize = 4096;

/// How long a connection waits for a lock held by another connection before `SQLITE_BUSY`.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Every kind, for filters that want all of them.
pub const ALL_KINDS: &[OutcomeKind] = &[
    OutcomeKind::Probe,
    OutcomeKind::Throughput,
    OutcomeKind::Passive,
];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("migration {version} ({name}) failed: {source}")]
    Migration {
        version: u32,
        name: String,
        source: rusqlite::Error,
    },
    /// The file was written by a newer probeok; refusing beats corrupting it.
    #[error("database schema version {found} is newer than this build knows ({known})")]
    SchemaTooNew { found: u32, known: u32 },
    /// The file is not in WAL mode after asking for it (e.g. a filesystem without shared memory).
    #[error("could not enable WAL journal mode (got {0:?})")]
    NotWal(String),
    /// The writer thread has stopped (after `close`, or it died).
    #[error("store is closed")]
    Closed,
    /// An outcome the store refuses to keep (e.g. a NaN latency): a bug upstream.
    #[error("invalid outcome: {0}")]
    Invalid(String),
    /// A stored value that cannot be read back.
    #[error("corrupt stored value: {0}")]
    Corrupt(String),
    #[error("could not start the writer thread: {0}")]
    Spawn(std::io::Error),
}

/// Knobs the store needs from the config.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// `[slo] latency_threshold`: a success slower than this is not "good".
    pub latency_threshold: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            latency_threshold: Duration::from_secs(10),
        }
    }
}

/// A handle on an open store; clones share the one writer thread.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Writer,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating the file, not its directory) and migrates the database, then starts the
    /// writer thread. Blocking file I/O: call it at startup or from `spawn_blocking`.
    pub fn open(path: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        let mut conn = Connection::open(path)?;
        configure(&conn)?;
        migrate(&mut conn)?;
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let thread = std::thread::Builder::new()
            .name("probeok-store-writer".into())
            .spawn(move || writer::run(conn, rx, opts))
            .map_err(StoreError::Spawn)?;
        Ok(Store {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                writer: Writer::new(tx),
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// A cheap handle for sending writes; clone it freely.
    pub fn writer(&self) -> Writer {
        self.inner.writer.clone()
    }

    /// A new read-only connection (blocking to open; use it from `spawn_blocking`).
    pub fn reader(&self) -> Result<Reader, StoreError> {
        Reader::open(&self.inner.path)
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Commits everything queued, then stops the writer thread and waits for it. Every writer
    /// handle (of every clone) answers [`StoreError::Closed`] afterwards. Closing twice is fine.
    pub async fn close(self) -> Result<(), StoreError> {
        let (ack, done) = oneshot::channel();
        if self
            .inner
            .writer
            .send(writer::Command::Shutdown { ack })
            .await
            .is_ok()
        {
            // The thread flushes the queue before answering; a dropped ack means it already stopped.
            let _ = done.await;
        }
        let handle = self
            .inner
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(handle) = handle {
            tokio::task::spawn_blocking(move || handle.join())
                .await
                .map_err(|_| StoreError::Closed)?
                .map_err(|_| StoreError::Closed)?;
        }
        Ok(())
    }
}

/// Pragmas every connection gets. WAL lets readers run beside the writer; `synchronous=NORMAL`
/// in WAL mode is durable against process crashes (an OS crash may lose the last commits,
/// never corrupt the file); the busy timeout turns brief lock contention into a short wait
/// instead of an error.
pub(crate) fn configure(conn: &Connection) -> Result<(), StoreError> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::NotWal(mode));
    }
    conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")?;
    Ok(())
}

/// A read-only connection. Not `Sync`: give each blocking task its own (they are cheap).
pub struct Reader {
    conn: Connection,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Reader {
    fn open(path: &Path) -> Result<Reader, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)?;
        configure(&conn)?;
        Ok(Reader { conn })
    }

    /// The route's interned id, `None` when nothing was ever stored for it.
    fn route_id(&self, route: &RouteId) -> Result<Option<i64>, StoreError> {
        outcomes::lookup_route(&self.conn, route)
    }
}

pub(crate) fn to_ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub(crate) fn from_ms(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("timestamp {ms} ms out of range")))
}

/// `kind IN (…)` for a filter; kinds are a closed enum, so inlining their codes is safe.
/// An empty filter means every kind.
pub(crate) fn kind_filter_sql(column: &str, kinds: &[OutcomeKind]) -> String {
    if kinds.is_empty() {
        return String::from("1");
    }
    let list: Vec<String> = kinds.iter().map(|k| format!("'{}'", k.as_str())).collect();
    format!("{column} IN ({})", list.join(", "))
}

pub(crate) fn parse_kind(s: &str) -> Result<OutcomeKind, StoreError> {
    OutcomeKind::parse(s).ok_or_else(|| StoreError::Corrupt(format!("outcome kind {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pragma(conn: &Connection, name: &str) -> String {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| {
            r.get::<_, rusqlite::types::Value>(0)
        })
        .map(|v| format!("{v:?}"))
        .unwrap()
    }

    #[tokio::test]
    async fn every_connection_gets_the_pragmas() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("p.db"), StoreOptions::default()).unwrap();
        let reader = store.reader().unwrap();
        assert_eq!(pragma(&reader.conn, "journal_mode"), r#"Text("wal")"#);
        assert_eq!(pragma(&reader.conn, "synchronous"), "Integer(1)"); // NORMAL
        assert_eq!(pragma(&reader.conn, "foreign_keys"), "Integer(1)");
        assert_eq!(pragma(&reader.conn, "busy_timeout"), "Integer(5000)");
        // Readers cannot write by mistake.
        assert!(reader
            .conn
            .execute("INSERT INTO heartbeats (job, at_ms) VALUES ('x', 1)", [])
            .is_err());
        drop(reader);
        store.close().await.unwrap();
    }

    #[test]
    fn in_memory_databases_are_refused_for_lack_of_wal() {
        let conn = Connection::open_in_memory().unwrap();
        assert!(matches!(configure(&conn), Err(StoreError::NotWal(_))));
    }
}
