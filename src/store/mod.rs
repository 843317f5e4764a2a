//! Storage: every outcome raw, rollups for long history, heartbeats and skipped probes — in a
//! SQLite file by default, or in a PostgreSQL database when `[storage] url_env` names a
//! variable holding a `postgres://` URL ([`StoreLocation`]). One store, two engines: the same
//! schema, queries and behaviour on both (`sql/` is the layer between them).
//!
//! - One **writer thread** owns the only write connection. Async callers send commands on a
//!   bounded channel ([`Writer`]); the thread drains what is queued (up to [`BATCH_CAP`]
//!   outcomes), applies it in one transaction, commits, then acknowledges each sender. An
//!   acknowledged write is committed; async code never blocks on the database. On PostgreSQL
//!   each writer transaction takes an advisory lock first (several processes may share the
//!   database), and a lost session is reopened with backoff ([`Reachability`]).
//! - **Rollups** (5-minute, hourly, daily per route and outcome kind) are updated in the same
//!   transaction as the raw rows, so they can never disagree with them. Percentiles come from
//!   mergeable histograms ([`histogram`]), so 30 days of p95 never scans raw rows.
//! - **Readers** ([`Reader`]) have their own read-only connections, given back when the
//!   reader drops (SQLite: kept open, up to 8 idle, WAL lets them run beside the writer;
//!   PostgreSQL: a bounded pool of sessions); their API is synchronous, call it from
//!   `spawn_blocking`.
//! - **Schema** lives in `migrations/sqlite/` and `migrations/postgres/` (the same versions),
//!   applied in order at open ([`migrate()`]).
//!
//! Files: `sql/` (the connection over both engines: values, dialect, PostgreSQL sessions),
//! `migrate.rs` (schema versions), `writer.rs` (the thread and its batching),
//! `outcomes.rs` (routes + raw outcomes), `outcome_hours.rs` (closed hours of raw outcomes,
//! packed one row per route and hour, in the layout of `pack.rs`; read beside the raw rows),
//! `outcome_days.rs` (PostgreSQL's day partitions), `rollups.rs` (rollups, [`Rollup`]),
//! `jobs.rs` (heartbeats, skipped probes, retention), `health.rs` (detection's route states,
//! transitions and incidents), `baselines.rs` (detection's baselines as saved state, read at
//! start instead of the raw history), `drift.rs` (regression set runs), `requests.rs` (the proxy's
//! metering and idempotency keys), `contracts.rs` (degradation contracts: async-queue jobs,
//! cached answers), `drills.rs` (drills and the reads behind their reports),
//! `vantage.rs` (outcomes from remote vantages, each agent-made id once),
//! `stats.rs` (bulk reads over every route for the published views), `histogram.rs`,
//! `alerts.rs` (the alert outbox, firing alerts, silences), `spend.rs` (the spend ledger:
//! reservations and settlements of client limits and the hourly budget), `copy.rs` (`migrate-store`:
//! SQLite into PostgreSQL).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod alerts;
pub mod baselines;
pub mod capabilities;
pub mod catalog;
mod checkpoint;
mod contracts;
pub mod copy;
pub mod declared;
mod drift;
pub mod drills;
pub mod embeddings;
pub mod gateways;
mod health;
pub mod histogram;
mod jobs;
pub mod migrate;
mod mode;
pub(crate) mod observed;
mod outcome_days;
mod outcome_hours;
mod outcomes;
mod pack;
mod requests;
mod rollups;
pub(crate) mod spend;
pub mod sql;
mod stats;
pub mod subscribers;
mod switch;
mod vantage;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::OpenFlags;
use sql::{Connection, Engine, PgPool, PgUrl, SqlError};
use tokio::sync::{mpsc, oneshot};

pub use contracts::{CachedAnswer, ContractOp, JobRecord, JobStatus, OWNER_SHARE_FULL};
pub use health::StoredHealth;
pub use histogram::LatencyHistogram;
pub use jobs::RetentionReport;
pub use migrate::{force_version, latest_version, migrate, migrate_to, user_version};
pub use mode::{StoreHealth, StoreMode};
pub use observed::{ObservedBucket, ObservedRow, Span};
pub use requests::{
    claim, AttemptRecord, IdempotencyEntry, IdempotencyOp, IdempotentAnswer, RequestFilter,
    RequestRecord,
};
pub use rollups::{Granularity, Rollup};
pub use spend::{Booking, Hold, LedgerAnswer, LedgerOp, LedgerRow, SpendLedger};
pub use stats::{quantile, Counts, DailyCounts, Samples, Window, MAX_SAMPLE_ROWS};
pub use vantage::VantageWrite;
pub use writer::{Queued, Writer, RETENTION_BATCH};

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
    /// An error of either engine (`SqlError::Sqlite`, `SqlError::Postgres`, …).
    #[error(transparent)]
    Sql(#[from] SqlError),
    #[error("migration {version} ({name}) failed: {source}")]
    Migration {
        version: u32,
        name: String,
        source: SqlError,
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
    /// `[storage] url_env` names a variable that does not hold a usable URL.
    #[error("{0}")]
    Location(String),
}

impl StoreError {
    /// The database connection was lost (not a fault of the statement).
    pub fn is_connection(&self) -> bool {
        matches!(self, StoreError::Sql(e) if e.is_connection())
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sql(SqlError::Sqlite(e))
    }
}

/// Where the store lives: a SQLite file, or a PostgreSQL database (`[storage] url_env`).
#[derive(Debug, Clone)]
pub enum StoreLocation {
    Sqlite(PathBuf),
    Postgres(PgUrl),
}

impl StoreLocation {
    /// `url_env`'s value when it holds a `postgres://` URL, else the SQLite file at `path`.
    /// `env` reads a variable (the process environment in production).
    pub fn resolve(
        path: &Path,
        url_env: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<StoreLocation, StoreError> {
        if let Some(var) = url_env {
            if let Some(value) = env(var) {
                if let Some(url) = PgUrl::parse(&value) {
                    return url
                        .map(StoreLocation::Postgres)
                        .map_err(|e| StoreError::Location(format!("${var}: {e}")));
                }
            }
        }
        Ok(StoreLocation::Sqlite(path.to_owned()))
    }

    pub fn engine(&self) -> Engine {
        match self {
            StoreLocation::Sqlite(_) => Engine::Sqlite,
            StoreLocation::Postgres(_) => Engine::Postgres,
        }
    }

    /// The file, or `host:port/database`: safe to log (never a password).
    pub fn describe(&self) -> String {
        match self {
            StoreLocation::Sqlite(p) => p.display().to_string(),
            StoreLocation::Postgres(u) => u.describe(),
        }
    }

    /// A new read-write connection, configured and not migrated.
    pub fn connect(&self) -> Result<Connection, StoreError> {
        match self {
            StoreLocation::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path)?;
                configure(&conn)?;
                Ok(Connection::from_sqlite(conn))
            }
            StoreLocation::Postgres(url) => Ok(Connection::open_postgres(url)?),
        }
    }
}

/// Whether the database answered the writer's last attempt, and its last connection error:
/// `/readyz` reports it.
#[derive(Debug, Default)]
pub struct Reachability {
    down: AtomicBool,
    last_error: Mutex<Option<String>>,
}

impl Reachability {
    pub fn reachable(&self) -> bool {
        !self.down.load(Ordering::Relaxed)
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set(&self, error: Option<String>) {
        self.down.store(error.is_some(), Ordering::Relaxed);
        if let Some(e) = error {
            *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        }
    }
}

/// Most PostgreSQL sessions readers hold at once; a reader finding all busy waits for one.
pub const MAX_PG_READERS: usize = 16;

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
    location: StoreLocation,
    /// PostgreSQL: the readers' sessions.
    pool: Option<Arc<PgPool>>,
    /// SQLite: read connections kept open between readers.
    sqlite_readers: Arc<SqliteReaders>,
    reachability: Arc<Reachability>,
    /// Whether the database answers, as the proxy's read-only mode sees it.
    health: Arc<StoreHealth>,
    writer: Writer,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Rows the readers have read since the open ([`Store::rows_read`]).
    rows_read: Arc<AtomicU64>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("location", &self.inner.location.describe())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating the file, not its directory) and migrates the database, then starts the
    /// writer thread. Blocking file I/O: call it at startup or from `spawn_blocking`.
    pub fn open(path: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        Store::open_at(&StoreLocation::Sqlite(path.to_owned()), opts)
    }

    /// Opens the store wherever it lives (SQLite file or PostgreSQL database), migrating it.
    /// Blocking network or file I/O: call it at startup or from `spawn_blocking`.
    pub fn open_at(location: &StoreLocation, opts: StoreOptions) -> Result<Store, StoreError> {
        let mut conn = location.connect()?;
        migrate(&mut conn)?;
        let pool = match location {
            StoreLocation::Sqlite(_) => None,
            StoreLocation::Postgres(url) => Some(Arc::new(PgPool::new(
                url.clone(),
                MAX_PG_READERS,
                BUSY_TIMEOUT,
            ))),
        };
        let reachability = Arc::new(Reachability::default());
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let thread = {
            let location = location.clone();
            let reachability = reachability.clone();
            std::thread::Builder::new()
                .name("probeok-store-writer".into())
                .spawn(move || writer::run(conn, location, reachability, rx, opts))
                .map_err(StoreError::Spawn)?
        };
        Ok(Store {
            inner: Arc::new(Inner {
                location: location.clone(),
                pool,
                sqlite_readers: Arc::default(),
                reachability,
                health: Arc::default(),
                writer: Writer::new(tx),
                thread: Mutex::new(Some(thread)),
                rows_read: Arc::default(),
            }),
        })
    }

    /// Gives back what the store holds only to go faster: the page caches of the read
    /// connections at rest. Blocking; for a periodic trim (`malloc::trim_every`).
    pub fn release_memory(&self) {
        self.inner.sqlite_readers.release_memory();
    }

    /// Rows the readers have read since the store was opened: what a start costs is in
    /// rows, whatever the machine's speed.
    pub fn rows_read(&self) -> u64 {
        self.inner.rows_read.load(Ordering::Relaxed)
    }

    /// A cheap handle for sending writes; clone it freely.
    pub fn writer(&self) -> Writer {
        self.inner.writer.clone()
    }

    /// A read-only connection (blocking to open; use it from `spawn_blocking`). Connections
    /// go back to a small pool when the reader is dropped: opening one reads the schema
    /// again, which costs more than most of the reads the proxy and the pages make.
    pub fn reader(&self) -> Result<Reader, StoreError> {
        let rows = self.inner.rows_read.clone();
        match (&self.inner.location, &self.inner.pool) {
            (_, Some(pool)) => Ok(Reader {
                conn: Connection::from_postgres(pool.take()?).counting(rows),
                home: Home::Postgres(pool.clone()),
            }),
            (StoreLocation::Sqlite(path), None) => {
                let conn = match self.inner.sqlite_readers.take() {
                    Some(c) => c,
                    None => Reader::open(path)?,
                };
                Ok(Reader {
                    conn: Connection::from_sqlite(conn).counting(rows),
                    home: Home::Sqlite(self.inner.sqlite_readers.clone()),
                })
            }
            (StoreLocation::Postgres(url), None) => Ok(Reader {
                conn: Connection::from_postgres(sql::PgSession::connect(url, true)?).counting(rows),
                home: Home::None,
            }),
        }
    }

    /// The SQLite file (for a PostgreSQL store, the path it would have had is meaningless:
    /// an empty path).
    pub fn path(&self) -> &Path {
        match &self.inner.location {
            StoreLocation::Sqlite(p) => p,
            StoreLocation::Postgres(_) => Path::new(""),
        }
    }

    pub fn location(&self) -> &StoreLocation {
        &self.inner.location
    }

    pub fn engine(&self) -> Engine {
        self.inner.location.engine()
    }

    /// The spend ledger on this store's database, with its own connections.
    pub fn spend_ledger(&self) -> SpendLedger {
        SpendLedger::new(&self.inner.location)
    }

    /// Whether the writer reached the database on its last attempt, and the last
    /// connection error (for `/readyz`).
    pub fn reachability(&self) -> &Reachability {
        &self.inner.reachability
    }

    /// Whether the database answers (real failures of store calls and a periodic check, see
    /// [`StoreHealth`]): what read-only mode reads on the request path, without a round trip.
    pub fn health(&self) -> &Arc<StoreHealth> {
        &self.inner.health
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
pub(crate) fn configure(conn: &rusqlite::Connection) -> Result<(), StoreError> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::NotWal(mode));
    }
    conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")?;
    Ok(())
}

/// A read-only connection. Not `Sync`: give each blocking task its own (they are cheap: a
/// SQLite connection or a PostgreSQL session from the store's pool, given back when the
/// reader drops).
pub struct Reader {
    conn: Connection,
    home: Home,
}

/// Where a reader's connection goes back to when it drops.
enum Home {
    /// Nowhere: closed (a PostgreSQL session of a store without a pool).
    None,
    Postgres(Arc<PgPool>),
    Sqlite(Arc<SqliteReaders>),
}

impl Drop for Reader {
    fn drop(&mut self) {
        let conn = std::mem::replace(&mut self.conn, Connection::closed());
        match &self.home {
            Home::Postgres(pool) => {
                if let Some(session) = conn.into_postgres() {
                    pool.put(session);
                }
            }
            Home::Sqlite(idle) => {
                if let Some(conn) = conn.into_sqlite() {
                    idle.put(conn);
                }
            }
            Home::None => {}
        }
    }
}

/// SQLite read connections at rest, [`MAX_IDLE_SQLITE_READERS`] at most.
#[derive(Default)]
struct SqliteReaders {
    idle: Mutex<Vec<rusqlite::Connection>>,
}

/// Idle SQLite read connections kept; more readers at once open more, closed on return.
const MAX_IDLE_SQLITE_READERS: usize = 8;

impl SqliteReaders {
    fn take(&self) -> Option<rusqlite::Connection> {
        self.idle.lock().ok()?.pop()
    }

    /// Keeps `conn` unless the pool is full or it is inside a transaction (a reader that
    /// failed halfway must not pin an old snapshot of the database for the next one).
    fn put(&self, conn: rusqlite::Connection) {
        if !conn.is_autocommit() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < MAX_IDLE_SQLITE_READERS {
                idle.push(conn);
            }
        }
    }
}

impl SqliteReaders {
    /// Frees the page caches of the connections at rest (up to 2 MB each). While the writer
    /// commits, a reader's cache is stale by its next use anyway; without this, the readers
    /// at the bottom of the pool keep theirs for as long as the process runs.
    fn release_memory(&self) {
        if let Ok(idle) = self.idle.lock() {
            for conn in idle.iter() {
                let _ = conn.execute_batch("PRAGMA shrink_memory");
            }
        }
    }
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Reader {
    fn open(path: &Path) -> Result<rusqlite::Connection, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = rusqlite::Connection::open_with_flags(path, flags)?;
        configure(&conn)?;
        Ok(conn)
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
        return String::from("1 = 1");
    }
    let list: Vec<String> = kinds.iter().map(|k| format!("'{}'", k.as_str())).collect();
    format!("{column} IN ({})", list.join(", "))
}

/// A kind read in place, for scans over many rows.
impl sql::FromSql for OutcomeKind {
    fn from_value(v: sql::ValueRef<'_>) -> Result<Self, String> {
        match v {
            sql::ValueRef::Text(s) => {
                OutcomeKind::parse(s).ok_or_else(|| format!("outcome kind {s:?}"))
            }
            v => Err(format!("{} where an outcome kind was expected", v.class())),
        }
    }
}

pub(crate) fn parse_kind(s: &str) -> Result<OutcomeKind, StoreError> {
    OutcomeKind::parse(s).ok_or_else(|| StoreError::Corrupt(format!("outcome kind {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pragma(conn: &Connection, name: &str) -> String {
        conn.as_sqlite()
            .unwrap()
            .query_row(&format!("PRAGMA {name}"), [], |r| {
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
            .as_sqlite()
            .unwrap()
            .execute("INSERT INTO heartbeats (job, at_ms) VALUES ('x', 1)", [])
            .is_err());
        drop(reader);
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn idle_readers_give_back_their_page_caches() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("p.db"), StoreOptions::default()).unwrap();
        let reader = store.reader().unwrap();
        let tables: i64 = reader
            .conn
            .as_sqlite()
            .unwrap()
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        assert!(tables > 10);
        drop(reader);
        let cache_used = || {
            let idle = store.inner.sqlite_readers.idle.lock().unwrap();
            let (mut current, mut highest) = (0, 0);
            // SAFETY: the handle is live while the pool's lock holds the connection.
            let rc = unsafe {
                rusqlite::ffi::sqlite3_db_status(
                    idle[0].handle(),
                    rusqlite::ffi::SQLITE_DBSTATUS_CACHE_USED,
                    &mut current,
                    &mut highest,
                    0,
                )
            };
            assert_eq!(rc, rusqlite::ffi::SQLITE_OK);
            current
        };
        let before = cache_used();
        store.release_memory();
        let after = cache_used();
        assert!(after < before, "cache {before} bytes before, {after} after");
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn sqlite_readers_are_kept_and_reused_but_not_inside_a_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("p.db"), StoreOptions::default()).unwrap();
        let idle = || store.inner.sqlite_readers.idle.lock().unwrap().len();
        let (a, b) = (store.reader().unwrap(), store.reader().unwrap());
        assert_eq!(idle(), 0);
        // A mark only these two connections carry (temporary tables live with a connection).
        for r in [&a, &b] {
            let c = r.conn.as_sqlite().unwrap();
            c.execute_batch("CREATE TEMP TABLE mark (x)").unwrap();
        }
        drop((a, b));
        assert_eq!(idle(), 2, "both kept");
        let again = store.reader().unwrap();
        assert_eq!(idle(), 1);
        let marked: i64 = again
            .conn
            .as_sqlite()
            .unwrap()
            .query_row(
                "SELECT count(*) FROM temp.sqlite_master WHERE name = 'mark'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(marked, 1, "a kept connection is handed out again");
        // One left inside a read transaction would pin an old snapshot: it is closed instead.
        again
            .conn
            .as_sqlite()
            .unwrap()
            .execute_batch("BEGIN")
            .unwrap();
        drop(again);
        assert_eq!(idle(), 1);
        // Never more than the bound at rest.
        let many: Vec<Reader> = (0..MAX_IDLE_SQLITE_READERS + 3)
            .map(|_| store.reader().unwrap())
            .collect();
        drop(many);
        assert_eq!(idle(), MAX_IDLE_SQLITE_READERS);
        store.close().await.unwrap();
    }

    #[test]
    fn url_env_selects_postgres_only_for_a_postgres_url() {
        let path = Path::new("probeok.db");
        let env = |value: &'static str| move |name: &str| (name == "DB").then(|| value.to_owned());
        let at = |url_env: Option<&str>, value: &'static str| {
            StoreLocation::resolve(path, url_env, env(value))
        };
        assert!(matches!(
            at(None, "postgres://h/db"),
            Ok(StoreLocation::Sqlite(_))
        ));
        assert!(matches!(
            at(Some("OTHER"), "postgres://h/db"),
            Ok(StoreLocation::Sqlite(_))
        ));
        assert!(matches!(at(Some("DB"), ""), Ok(StoreLocation::Sqlite(_))));
        let pg = at(
            Some("DB"),
            "postgresql://probeok:pw@db.internal:6432/probeok",
        )
        .unwrap();
        assert_eq!(pg.engine(), Engine::Postgres);
        assert_eq!(pg.describe(), "db.internal:6432/probeok");
        assert!(!format!("{pg:?}").contains("pw"));
        let bad = at(Some("DB"), "postgres://u:pw@h:port/db")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("$DB") && !bad.contains("pw"), "{bad}");
    }

    #[test]
    fn in_memory_databases_are_refused_for_lack_of_wal() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        assert!(matches!(configure(&conn), Err(StoreError::NotWal(_))));
    }
}
