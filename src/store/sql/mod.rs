//! The store's SQL layer: one connection type over two engines (SQLite through `rusqlite`,
//! PostgreSQL through `tokio-postgres`), with the shape of rusqlite's API — `execute`,
//! `query_row`, `prepare_cached` + `query_map`, `transaction`, `row.get::<_, T>(i)`,
//! [`params!`] — so store modules read the same whichever engine is underneath.
//!
//! - `value.rs`: the values both engines share and the Rust types they convert to and from.
//! - `dialect.rs`: placeholder rewriting and the engine enum.
//! - `pg.rs`: PostgreSQL URLs (never printed), sessions, the readers' pool.
//!
//! Statements are written once with `?N` placeholders in portable SQL (`ON CONFLICT`,
//! `RETURNING`, `CASE`, `CAST(SUM(x) AS BIGINT)`); the few real differences branch on
//! [`Connection::engine`].

pub(crate) mod dialect;
pub(crate) mod pg;

pub use pg::IDLE_IN_TRANSACTION;
pub(crate) mod value;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use dialect::Engine;
pub use pg::{PgPool, PgSession, PgUrl};
pub use value::{FromSql, ToSql, Value, ValueRef};

/// Errors of the SQL layer; the store wraps them in `StoreError::Sql`.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgres: {}", pg_message(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("could not connect to PostgreSQL: {0}")]
    Connect(String),
    #[error("query returned no rows")]
    NoRows,
    #[error("column {column}: {message}")]
    Convert { column: usize, message: String },
    #[error("parameter: {0}")]
    Param(String),
    #[error("no database connection free within {0:?}")]
    PoolTimeout(Duration),
    #[error("connection is closed")]
    Closed,
}

impl SqlError {
    /// The connection itself is gone (the server restarted, the network broke): worth
    /// reconnecting, unlike an error of the statement.
    pub fn is_connection(&self) -> bool {
        match self {
            SqlError::Postgres(e) => {
                e.is_closed()
                    || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
                    // Connection exceptions and operator intervention (a restart, a kill).
                    || e.code()
                        .is_some_and(|c| c.code().starts_with("08") || c.code().starts_with("57P"))
            }
            SqlError::Connect(_) | SqlError::Closed => true,
            _ => false,
        }
    }
}

/// "db error" alone says nothing: show the server's message (never a parameter value).
pub(crate) fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{}: {} ({})", db.severity(), db.message(), db.code().code());
            if let Some(d) = db.detail() {
                s.push_str(": ");
                s.push_str(d);
            }
            s
        }
        None => match std::error::Error::source(e) {
            Some(src) => format!("{e}: {src}"),
            None => e.to_string(),
        },
    }
}

/// Result of the SQL layer.
pub type Result<T, E = SqlError> = std::result::Result<T, E>;

/// `params![a, b, c]`: positional parameters of any [`ToSql`] types.
macro_rules! params {
    () => {
        &[] as &[&dyn $crate::store::sql::ToSql]
    };
    ($($p:expr),+ $(,)?) => {
        &[$(&$p as &dyn $crate::store::sql::ToSql),+] as &[&dyn $crate::store::sql::ToSql]
    };
}
pub(crate) use params;

/// Positional parameters: `params![…]`, an array of one type, or `[]`.
pub trait Params {
    fn values(&self) -> Result<Vec<ValueRef<'_>>>;
}

impl Params for &[&dyn ToSql] {
    fn values(&self) -> Result<Vec<ValueRef<'_>>> {
        self.iter().map(|p| p.to_value()).collect()
    }
}

impl Params for [&dyn ToSql; 0] {
    fn values(&self) -> Result<Vec<ValueRef<'_>>> {
        Ok(Vec::new())
    }
}

macro_rules! array_params {
    ($($n:literal)*) => {$(
        impl<T: ToSql> Params for [T; $n] {
            fn values(&self) -> Result<Vec<ValueRef<'_>>> {
                self.iter().map(|p| p.to_value()).collect()
            }
        }
    )*};
}
array_params!(1 2 3 4 5 6 7 8);

/// Values already converted: the rows of a multi-row statement ([`Connection::execute_rows`]).
impl Params for &[ValueRef<'_>] {
    fn values(&self) -> Result<Vec<ValueRef<'_>>> {
        Ok(self.to_vec())
    }
}

/// How many rows each statement of a multi-row write carries: powers of two up to `cap`
/// (largest first), so a write of any size uses few distinct statements and the prepared
/// statement cache stays small. `cap` is rounded down to a power of two.
pub fn row_chunks(rows: usize, cap: usize) -> impl Iterator<Item = usize> {
    let cap = if cap <= 1 {
        1
    } else {
        1 << (usize::BITS - 1 - cap.leading_zeros())
    };
    let mut left = rows;
    std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        let n = if left >= cap {
            cap
        } else {
            1 << (usize::BITS - 1 - left.leading_zeros())
        };
        left -= n;
        Some(n)
    })
}

/// `(?1, ?2, …), (…)`: `rows` tuples of `cols` numbered placeholders, for `VALUES`.
pub fn value_tuples(rows: usize, cols: usize) -> String {
    let mut s = String::with_capacity(rows * cols * 5);
    for r in 0..rows {
        if r > 0 {
            s.push_str(", ");
        }
        s.push('(');
        for c in 0..cols {
            if c > 0 {
                s.push_str(", ");
            }
            s.push('?');
            s.push_str(&(r * cols + c + 1).to_string());
        }
        s.push(')');
    }
    s
}

/// `Option` from `Err(NoRows)`, as rusqlite's `OptionalExtension`.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(SqlError::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// One connection to either engine.
pub struct Connection {
    inner: Inner,
    /// Rows read through this connection are added here (the store's count of rows read).
    rows: Option<Arc<AtomicU64>>,
}

enum Inner {
    Sqlite(rusqlite::Connection),
    Postgres(PgSession),
    /// A connection handed back (a pooled reader's, once returned).
    Closed,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let engine = match &self.inner {
            Inner::Sqlite(_) => "sqlite",
            Inner::Postgres(_) => "postgres",
            Inner::Closed => "closed",
        };
        f.debug_struct("Connection")
            .field("engine", &engine)
            .finish_non_exhaustive()
    }
}

impl Connection {
    pub fn from_sqlite(conn: rusqlite::Connection) -> Connection {
        Connection {
            inner: Inner::Sqlite(conn),
            rows: None,
        }
    }

    pub fn from_postgres(session: PgSession) -> Connection {
        Connection {
            inner: Inner::Postgres(session),
            rows: None,
        }
    }

    /// Counts the rows this connection reads into `rows`.
    pub(crate) fn counting(mut self, rows: Arc<AtomicU64>) -> Connection {
        self.rows = Some(rows);
        self
    }

    /// Adds `n` to the rows read: values unpacked from one stored row are rows of work too.
    pub(crate) fn count_rows(&self, n: usize) {
        if let Some(rows) = &self.rows {
            rows.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// A plain SQLite connection (no pragmas; the store configures its own).
    pub fn open_sqlite(path: &Path) -> Result<Connection> {
        Ok(Connection::from_sqlite(rusqlite::Connection::open(path)?))
    }

    /// A plain read-write PostgreSQL session.
    pub fn open_postgres(url: &PgUrl) -> Result<Connection> {
        Ok(Connection::from_postgres(PgSession::connect(url, false)?))
    }

    pub(crate) fn closed() -> Connection {
        Connection {
            inner: Inner::Closed,
            rows: None,
        }
    }

    /// The SQLite connection, for returning it to its pool.
    pub(crate) fn into_sqlite(self) -> Option<rusqlite::Connection> {
        match self.inner {
            Inner::Sqlite(c) => Some(c),
            _ => None,
        }
    }

    /// The session, for returning it to its pool.
    pub(crate) fn into_postgres(self) -> Option<PgSession> {
        match self.inner {
            Inner::Postgres(s) => Some(s),
            _ => None,
        }
    }

    pub fn engine(&self) -> Engine {
        match self.inner {
            Inner::Sqlite(_) => Engine::Sqlite,
            // A closed connection errors on every use; which engine it was no longer matters.
            Inner::Postgres(_) | Inner::Closed => Engine::Postgres,
        }
    }

    /// The SQLite connection underneath (SQLite-only pragmas and checks).
    pub fn as_sqlite(&self) -> Option<&rusqlite::Connection> {
        match &self.inner {
            Inner::Sqlite(c) => Some(c),
            _ => None,
        }
    }

    /// False once a PostgreSQL session has lost its server.
    pub fn is_alive(&self) -> bool {
        match &self.inner {
            Inner::Sqlite(_) => true,
            Inner::Postgres(s) => !s.is_closed(),
            Inner::Closed => false,
        }
    }

    /// Runs several `;`-separated statements without parameters.
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.inner {
            Inner::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Inner::Postgres(s) => Ok(pg::wait(s.client.batch_execute(sql))?),
            Inner::Closed => Err(SqlError::Closed),
        }
    }

    pub fn prepare_cached(&self, sql: &str) -> Result<Statement<'_>> {
        match &self.inner {
            Inner::Sqlite(c) => Ok(Statement {
                inner: StmtInner::Sqlite(c.prepare_cached(sql)?),
                rows: self.rows.as_deref(),
            }),
            Inner::Postgres(s) => Ok(Statement {
                inner: StmtInner::Postgres {
                    session: s,
                    stmt: s.prepare(sql)?,
                },
                rows: self.rows.as_deref(),
            }),
            Inner::Closed => Err(SqlError::Closed),
        }
    }

    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    pub fn query_row<T, P, F>(&self, sql: &str, params: P, f: F) -> Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    /// Runs `sql(n)` — a statement over `n` rows of `cols` values each, numbered `?1…` in row
    /// order — over every row of `values`, in the chunks of [`row_chunks`]: one round trip per
    /// chunk instead of one per row. The number of rows changed.
    pub fn execute_rows(
        &self,
        sql: impl Fn(usize) -> String,
        cols: usize,
        values: &[ValueRef<'_>],
        cap: usize,
    ) -> Result<usize> {
        let cols = cols.max(1);
        debug_assert_eq!(values.len() % cols, 0);
        let mut changed = 0;
        let mut at = 0;
        for n in row_chunks(values.len() / cols, cap) {
            let chunk = &values[at..at + n * cols];
            at += n * cols;
            changed += self.prepare_cached(&sql(n))?.execute(chunk)?;
        }
        Ok(changed)
    }

    /// Starts a transaction that holds the write lock from its start (SQLite's `BEGIN
    /// IMMEDIATE`); rolled back when dropped without [`Transaction::commit`].
    pub fn transaction(&self) -> Result<Transaction<'_>> {
        match self.engine() {
            Engine::Sqlite => self.execute_batch("BEGIN IMMEDIATE")?,
            Engine::Postgres => self.execute_batch("BEGIN")?,
        }
        Ok(Transaction {
            conn: self,
            done: false,
        })
    }
}

/// An open transaction; derefs to its connection.
pub struct Transaction<'c> {
    conn: &'c Connection,
    done: bool,
}

impl Transaction<'_> {
    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        let r = self.conn.execute_batch("COMMIT");
        if r.is_err() {
            // A failed COMMIT may leave the transaction open (SQLite: busy).
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        r
    }
}

impl std::ops::Deref for Transaction<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// A prepared (and cached) statement.
pub struct Statement<'c> {
    inner: StmtInner<'c>,
    rows: Option<&'c AtomicU64>,
}

enum StmtInner<'c> {
    Sqlite(rusqlite::CachedStatement<'c>),
    Postgres {
        session: &'c PgSession,
        stmt: tokio_postgres::Statement,
    },
}

fn pg_params<'a>(values: &'a [ValueRef<'a>]) -> Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)> {
    values
        .iter()
        .map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect()
}

impl Statement<'_> {
    /// Runs the statement; the number of rows it changed.
    pub fn execute<P: Params>(&mut self, params: P) -> Result<usize> {
        let values = params.values()?;
        match &mut self.inner {
            StmtInner::Sqlite(s) => Ok(s.execute(rusqlite::params_from_iter(values.iter()))?),
            StmtInner::Postgres { session, stmt } => {
                let n = pg::wait(session.client.execute(stmt, &pg_params(&values)))?;
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            }
        }
    }

    /// Every row mapped by `f` (read eagerly; callers collect them anyway).
    pub fn query_map<T, P, F>(&mut self, params: P, mut f: F) -> Result<MappedRows<T>>
    where
        P: Params,
        F: FnMut(&Row<'_>) -> Result<T>,
    {
        let values = params.values()?;
        let mut out = Vec::new();
        match &mut self.inner {
            StmtInner::Sqlite(s) => {
                let mut rows = s.query(rusqlite::params_from_iter(values.iter()))?;
                while let Some(r) = rows.next()? {
                    out.push(f(&Row {
                        inner: RowInner::Sqlite(r),
                    }));
                }
            }
            StmtInner::Postgres { session, stmt } => {
                for r in pg::wait(session.client.query(stmt, &pg_params(&values)))? {
                    out.push(f(&Row {
                        inner: RowInner::Postgres(&r),
                    }));
                }
            }
        }
        self.count(out.len());
        Ok(out.into_iter())
    }

    fn count(&self, n: usize) {
        if let Some(rows) = self.rows {
            rows.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// The first row mapped by `f`; [`SqlError::NoRows`] without one.
    pub fn query_row<T, P, F>(&mut self, params: P, f: F) -> Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> Result<T>,
    {
        let values = params.values()?;
        let counted = self.rows;
        let found = move || {
            if let Some(rows) = counted {
                rows.fetch_add(1, Ordering::Relaxed);
            }
        };
        match &mut self.inner {
            StmtInner::Sqlite(s) => {
                let mut rows = s.query(rusqlite::params_from_iter(values.iter()))?;
                match rows.next()? {
                    Some(r) => {
                        found();
                        f(&Row {
                            inner: RowInner::Sqlite(r),
                        })
                    }
                    None => Err(SqlError::NoRows),
                }
            }
            StmtInner::Postgres { session, stmt } => {
                let rows = pg::wait(session.client.query(stmt, &pg_params(&values)))?;
                match rows.first() {
                    Some(r) => {
                        found();
                        f(&Row {
                            inner: RowInner::Postgres(r),
                        })
                    }
                    None => Err(SqlError::NoRows),
                }
            }
        }
    }
}

/// What [`Statement::query_map`] returns: each row's mapping.
pub type MappedRows<T> = std::vec::IntoIter<Result<T>>;

/// One result row.
pub struct Row<'a> {
    inner: RowInner<'a>,
}

enum RowInner<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    Postgres(&'a tokio_postgres::Row),
}

/// A column position (rusqlite's `get::<_, T>` takes an index type first).
pub trait RowIndex {
    fn index(self) -> usize;
}

impl RowIndex for usize {
    fn index(self) -> usize {
        self
    }
}

impl Row<'_> {
    pub fn get<I: RowIndex, T: FromSql>(&self, i: I) -> Result<T> {
        let i = i.index();
        let v = match &self.inner {
            RowInner::Sqlite(r) => value::sqlite_value(r, i)?,
            RowInner::Postgres(r) => value::pg_value(r, i)?,
        };
        T::from_value(v).map_err(|message| SqlError::Convert { column: i, message })
    }

    /// How many columns the row has.
    pub fn len(&self) -> usize {
        match &self.inner {
            RowInner::Sqlite(r) => r.as_ref().column_count(),
            RowInner::Postgres(r) => r.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_split_into_powers_of_two() {
        assert_eq!(row_chunks(0, 128).collect::<Vec<_>>(), Vec::<usize>::new());
        assert_eq!(row_chunks(1, 128).collect::<Vec<_>>(), vec![1]);
        assert_eq!(row_chunks(100, 128).collect::<Vec<_>>(), vec![64, 32, 4]);
        assert_eq!(
            row_chunks(300, 100).collect::<Vec<_>>(),
            vec![64, 64, 64, 64, 32, 8, 4]
        );
        assert_eq!(row_chunks(5, 0).collect::<Vec<_>>(), vec![1; 5]);
        for n in 0..700 {
            assert_eq!(row_chunks(n, 256).sum::<usize>(), n);
        }
    }

    #[test]
    fn tuples_number_placeholders_in_row_order() {
        assert_eq!(value_tuples(1, 2), "(?1, ?2)");
        assert_eq!(value_tuples(2, 3), "(?1, ?2, ?3), (?4, ?5, ?6)");
    }
}
