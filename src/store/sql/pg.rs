//! PostgreSQL sessions: the connection URL (a secret: only its host and database are ever
//! shown), connecting, and the bounded pool readers borrow sessions from.
//!
//! The store's API is synchronous (a writer thread, readers on `spawn_blocking`), so the
//! asynchronous `tokio-postgres` client is driven by blocking on its futures. Its connection
//! tasks run on one small runtime of their own, which is what lets a blocking call wait on
//! them from any thread, including one that is itself inside an async runtime.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls, Statement};

use super::SqlError;

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Prepared statements kept per session; the store has a few dozen distinct queries.
const STATEMENT_CACHE: usize = 256;

/// A `postgres://` (or `postgresql://`) URL. It may hold a password: it never prints, only
/// [`PgUrl::describe`] (host and database) does.
#[derive(Clone)]
pub struct PgUrl {
    url: String,
    /// Boxed: a `Config` is large, and a URL travels inside small enums.
    config: Box<tokio_postgres::Config>,
}

impl PgUrl {
    /// `None` when `s` is not a PostgreSQL URL (the store is then SQLite); `Err` when it is
    /// one but does not parse (the message never repeats the URL).
    pub fn parse(s: &str) -> Option<Result<PgUrl, String>> {
        let s = s.trim();
        if !(s.starts_with("postgres://") || s.starts_with("postgresql://")) {
            return None;
        }
        Some(
            s.parse::<tokio_postgres::Config>()
                .map(|config| PgUrl {
                    url: s.to_owned(),
                    config: Box::new(config),
                })
                .map_err(|e| format!("not a valid PostgreSQL URL: {e}")),
        )
    }

    /// `host:port/database`, safe to log.
    pub fn describe(&self) -> String {
        let host = match self.config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            #[cfg(unix)]
            Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
            None => "localhost".to_owned(),
        };
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        let db = self
            .config
            .get_dbname()
            .or(self.config.get_user())
            .unwrap_or("postgres");
        format!("{host}:{port}/{db}")
    }

    /// The URL itself, with its password: for connecting only.
    pub fn expose(&self) -> &str {
        &self.url
    }

    /// The same server with another database (tests and `migrate-store` create databases).
    /// The database name.
    pub fn database(&self) -> &str {
        self.config
            .get_dbname()
            .or(self.config.get_user())
            .unwrap_or("postgres")
    }

    pub fn with_database(&self, db: &str) -> PgUrl {
        let mut config = self.config.clone();
        config.dbname(db);
        let base = match self.url.find("://").map(|i| i + 3) {
            Some(start) => {
                let rest = &self.url[start..];
                let end = rest.find(['/', '?']).map_or(self.url.len(), |i| start + i);
                let query = self.url[end..].find('?').map(|q| &self.url[end + q..]);
                format!("{}/{}{}", &self.url[..end], db, query.unwrap_or(""))
            }
            None => self.url.clone(),
        };
        PgUrl { url: base, config }
    }
}

impl std::fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgUrl({})", self.describe())
    }
}

impl std::fmt::Display for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

fn runtime() -> Result<&'static tokio::runtime::Runtime, SqlError> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("probeok-pg")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| SqlError::Connect(format!("could not start the PostgreSQL runtime: {e}")))
}

/// Blocks this thread on a client future. The future only exchanges messages with the
/// connection task on the runtime above, so it needs no runtime of its own. It runs outside
/// tokio's cooperative budget: called from a tokio task whose budget is spent (a store call
/// made from async code), every tokio channel would answer "not yet" and wake itself at
/// once, and this thread would spin forever instead of waiting.
pub(crate) fn wait<F: Future>(f: F) -> F::Output {
    futures_executor::block_on(tokio::task::unconstrained(f))
}

/// How long a session may sit inside a transaction without a statement before the server
/// ends it (and rolls back, releasing its locks).
pub const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(5);

/// One PostgreSQL session with its prepared statements.
pub struct PgSession {
    pub(crate) client: Client,
    cache: RefCell<HashMap<String, Statement>>,
}

impl PgSession {
    /// Connects; `read_only` sessions refuse writes (as SQLite readers are opened read-only).
    pub fn connect(url: &PgUrl, read_only: bool) -> Result<PgSession, SqlError> {
        let mut config = (*url.config).clone();
        config.connect_timeout(CONNECT_TIMEOUT);
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(30));
        config.application_name("probeok");
        let (tx, rx) = tokio::sync::oneshot::channel();
        let target = url.describe();
        runtime()?.spawn(async move {
            match config.connect(NoTls).await {
                Ok((client, connection)) => {
                    if tx.send(Ok(client)).is_ok() {
                        if let Err(e) = connection.await {
                            tracing::warn!(database = %target, error = %super::pg_message(&e), "PostgreSQL connection ended");
                        }
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
        let client = wait(rx)
            .map_err(|_| SqlError::Connect("the connection task stopped".into()))?
            // Any failure to open a session is a connection failure (a refused socket, or a
            // server that takes no connections to this database right now).
            .map_err(|e| SqlError::Connect(super::pg_message(&e)))?;
        // A member that hangs in the middle of a write (stopped, frozen, starved) would hold
        // its row locks for as long as it hangs, and every other member's writes to the same
        // rows (the shared rollups, the spend ledger) would wait for it. The server ends a
        // session left idle inside a transaction; the store's own transactions never pause.
        let mut setup = format!(
            "SET idle_in_transaction_session_timeout = {}",
            IDLE_IN_TRANSACTION.as_millis()
        );
        if read_only {
            setup.push_str("; SET default_transaction_read_only = on");
        }
        wait(client.batch_execute(&setup))?;
        Ok(PgSession {
            client,
            cache: RefCell::new(HashMap::new()),
        })
    }

    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The prepared statement for `sql` (written with `?N` placeholders).
    pub(crate) fn prepare(&self, sql: &str) -> Result<Statement, SqlError> {
        if let Some(s) = self.cache.borrow().get(sql) {
            return Ok(s.clone());
        }
        let stmt = wait(self.client.prepare(&super::dialect::to_postgres(sql)))?;
        let mut cache = self.cache.borrow_mut();
        if cache.len() >= STATEMENT_CACHE {
            cache.clear();
        }
        cache.insert(sql.to_owned(), stmt.clone());
        Ok(stmt)
    }
}

/// Sessions for readers: at most `max` open, idle ones kept for the next reader. A reader
/// that finds every session busy waits (it runs on a blocking thread) up to `wait`.
pub struct PgPool {
    url: PgUrl,
    max: usize,
    wait: Duration,
    state: Mutex<PoolState>,
    freed: Condvar,
}

struct PoolState {
    idle: Vec<PgSession>,
    open: usize,
}

impl PgPool {
    pub fn new(url: PgUrl, max: usize, wait: Duration) -> PgPool {
        PgPool {
            url,
            max: max.max(1),
            wait,
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
        }
    }

    pub fn url(&self) -> &PgUrl {
        &self.url
    }

    pub fn take(&self) -> Result<PgSession, SqlError> {
        let deadline = Instant::now() + self.wait;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(s) = state.idle.pop() {
                if s.is_closed() {
                    state.open -= 1;
                    continue;
                }
                return Ok(s);
            }
            if state.open < self.max {
                state.open += 1;
                drop(state);
                return PgSession::connect(&self.url, true).inspect_err(|_| {
                    let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    state.open -= 1;
                    self.freed.notify_one();
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SqlError::PoolTimeout(self.wait));
            }
            state = self
                .freed
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    pub fn put(&self, s: PgSession) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_closed() {
            state.open -= 1;
        } else {
            state.idle.push(s);
        }
        self.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[test]
    fn urls_never_show_their_password() {
        let u = PgUrl::parse("postgres://probeok:s3cret@db.internal:6432/probeok?sslmode=disable")
            .unwrap()
            .unwrap();
        assert_eq!(u.describe(), "db.internal:6432/probeok");
        assert!(!format!("{u} {u:?}").contains("s3cret"));
        let other = u.with_database("probeok_t1");
        assert_eq!(
            other.expose(),
            "postgres://probeok:s3cret@db.internal:6432/probeok_t1?sslmode=disable"
        );
        assert_eq!(other.describe(), "db.internal:6432/probeok_t1");
        assert!(PgUrl::parse("probeok.db").is_none());
        let bad = PgUrl::parse("postgres://u:pw@host:notaport/db").unwrap();
        assert!(!bad.unwrap_err().contains("pw"));
    }

    #[test]
    fn waiting_from_a_task_whose_budget_is_spent_still_ends() {
        let (done_tx, done) = std::sync::mpsc::channel();
        // On a thread of its own: a wait that spins never answers, and the deadline fails.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                while tokio::task::coop::has_budget_remaining() {
                    tx.send(()).unwrap();
                    // Ready at once: each take spends budget without yielding.
                    rx.recv().now_or_never().unwrap();
                }
                let (answer, answered) = tokio::sync::oneshot::channel();
                answer.send(7).unwrap();
                let _ = done_tx.send(wait(answered).unwrap());
            });
        });
        assert_eq!(
            done.recv_timeout(std::time::Duration::from_secs(30)),
            Ok(7),
            "wait spun on a spent budget"
        );
    }
}
