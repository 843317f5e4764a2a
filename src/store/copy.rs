//! Moving a SQLite store into PostgreSQL (`probeok migrate-store`): every table, in the order
//! the migrations created them (so a referenced row is always there first), in batches of
//! multi-row inserts inside one transaction (all or nothing), then the identity sequences
//! moved past the copied ids, then the row counts of both sides compared table by table.

use std::time::Instant;

use super::sql::{Connection, Engine, ToSql, Value};
use super::StoreError;

/// Tables the target's triggers fill as the others are copied (their counts are still
/// compared).
const DERIVED: &[&str] = &["idempotency_owners"];

/// Rows per insert statement (bounded again by PostgreSQL's 65,535 parameters per statement).
const BATCH_ROWS: usize = 1000;
const MAX_PARAMS: usize = 60_000;

/// One table's rows on both sides after the copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCount {
    pub table: String,
    pub source: u64,
    pub target: u64,
}

/// What a copy did.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyReport {
    pub tables: Vec<TableCount>,
    pub seconds: f64,
}

impl CopyReport {
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|t| t.target).sum()
    }

    pub fn counts_match(&self) -> bool {
        self.tables.iter().all(|t| t.source == t.target)
    }

    /// One line per table (`table  sqlite rows  postgres rows`), then the total.
    pub fn text(&self) -> String {
        let width = self
            .tables
            .iter()
            .map(|t| t.table.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let mut out = format!("{:width$}  {:>12}  {:>12}\n", "table", "sqlite", "postgres");
        for t in &self.tables {
            let mark = if t.source == t.target {
                ""
            } else {
                "  MISMATCH"
            };
            out.push_str(&format!(
                "{:width$}  {:>12}  {:>12}{mark}\n",
                t.table, t.source, t.target
            ));
        }
        out.push_str(&format!(
            "{} rows in {} tables copied in {:.1} s; counts {}\n",
            self.rows(),
            self.tables.len(),
            self.seconds,
            if self.counts_match() {
                "match"
            } else {
                "DO NOT match"
            }
        ));
        out
    }
}

/// Why a copy could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the source must be a SQLite store and the target a PostgreSQL one")]
    Engines,
    #[error("the target is not empty ({table} has {rows} rows); pass --replace to empty it first")]
    NotEmpty { table: String, rows: u64 },
    #[error("table {table} has column {column} in SQLite but not in PostgreSQL: are both at the same schema version?")]
    MissingColumn { table: String, column: String },
    #[error(
        "table {0} exists in SQLite but not in PostgreSQL: are both at the same schema version?"
    )]
    MissingTable(String),
}

impl From<super::sql::SqlError> for CopyError {
    fn from(e: super::sql::SqlError) -> Self {
        CopyError::Store(e.into())
    }
}

/// The source's tables, in creation order.
fn tables(source: &Connection) -> Result<Vec<String>, CopyError> {
    let mut stmt = source.prepare_cached(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'
         ORDER BY rowid",
    )?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn columns(source: &Connection, table: &str) -> Result<Vec<String>, CopyError> {
    // Table names come from sqlite_master, not from the user; quoted all the same.
    let mut stmt =
        source.prepare_cached(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn target_columns(target: &Connection, table: &str) -> Result<Vec<String>, CopyError> {
    let mut stmt = target.prepare_cached(
        "SELECT column_name FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = ?1",
    )?;
    let rows = stmt.query_map([table], |r| r.get::<_, String>(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn count(conn: &Connection, table: &str) -> Result<u64, CopyError> {
    let n: i64 = conn.query_row(&format!("SELECT count(*) FROM \"{table}\""), [], |r| {
        r.get(0)
    })?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Copies every table of `source` (SQLite, migrated) into `target` (PostgreSQL, migrated to
/// the same version). A target holding rows is refused unless `replace`, which empties it.
pub fn copy_sqlite_to_postgres(
    source: &Connection,
    target: &Connection,
    replace: bool,
    mut progress: impl FnMut(&str, u64),
) -> Result<CopyReport, CopyError> {
    if source.engine() != Engine::Sqlite || target.engine() != Engine::Postgres {
        return Err(CopyError::Engines);
    }
    let started = Instant::now();
    let names = tables(source)?;
    let mut plan = Vec::new();
    for table in &names {
        let cols = columns(source, table)?;
        let have = target_columns(target, table)?;
        if have.is_empty() {
            return Err(CopyError::MissingTable(table.clone()));
        }
        if let Some(c) = cols.iter().find(|c| !have.contains(c)) {
            return Err(CopyError::MissingColumn {
                table: table.clone(),
                column: c.clone(),
            });
        }
        plan.push((table.clone(), cols));
    }
    let tx = target.transaction()?;
    if replace {
        let list: Vec<String> = names.iter().map(|t| format!("\"{t}\"")).collect();
        tx.execute_batch(&format!("TRUNCATE {} CASCADE", list.join(", ")))?;
    } else {
        for table in &names {
            let rows = count(&tx, table)?;
            if rows > 0 {
                return Err(CopyError::NotEmpty {
                    table: table.clone(),
                    rows,
                });
            }
        }
    }
    let Some(sqlite) = source.as_sqlite() else {
        return Err(CopyError::Engines);
    };
    for (table, cols) in &plan {
        if DERIVED.contains(&table.as_str()) {
            continue;
        }
        if table == "outcomes" {
            // Each day of raw outcomes goes to its partition, made before its rows.
            let mut stmt = sqlite
                .prepare("SELECT DISTINCT started_at_ms / 86400000 FROM outcomes")
                .map_err(StoreError::from)?;
            let days = stmt
                .query_map([], |r| r.get::<_, i64>(0))
                .map_err(StoreError::from)?
                .collect::<Result<Vec<i64>, _>>()
                .map_err(StoreError::from)?;
            super::outcome_days::ensure_all(&tx, &days)?;
        }
        let list = cols
            .iter()
            .map(|c| format!("\"{c}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let per_batch = BATCH_ROWS.min(MAX_PARAMS / cols.len().max(1)).max(1);
        let mut stmt = sqlite
            .prepare(&format!("SELECT {list} FROM \"{table}\""))
            .map_err(StoreError::from)?;
        let mut rows = stmt.query([]).map_err(StoreError::from)?;
        let mut batch: Vec<Value> = Vec::with_capacity(per_batch * cols.len());
        let mut copied = 0u64;
        loop {
            let row = rows.next().map_err(StoreError::from)?;
            if let Some(r) = row {
                for i in 0..cols.len() {
                    batch.push(sqlite_owned(r.get_ref(i).map_err(StoreError::from)?));
                }
            }
            let full = batch.len() >= per_batch * cols.len();
            if (full || row.is_none()) && !batch.is_empty() {
                let n = batch.len() / cols.len();
                insert(&tx, table, &list, cols.len(), &batch)?;
                copied += n as u64;
                progress(table, copied);
                batch.clear();
            }
            if row.is_none() {
                break;
            }
        }
    }
    // New rows after the copy must not collide with copied ids.
    let identities: Vec<(String, String)> = {
        let mut stmt = tx.prepare_cached(
            "SELECT table_name, column_name FROM information_schema.columns
             WHERE table_schema = current_schema() AND is_identity = 'YES'",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        rows.collect::<Result<_, _>>()?
    };
    for (table, column) in identities {
        tx.query_row(
            &format!(
                "SELECT setval(pg_get_serial_sequence('\"{table}\"', '{column}'),
                     CAST(COALESCE(MAX(\"{column}\"), 0) + 1 AS BIGINT), false) FROM \"{table}\""
            ),
            [],
            |_| Ok(()),
        )?;
    }
    tx.commit()?;
    let mut counts = Vec::new();
    for table in &names {
        counts.push(TableCount {
            table: table.clone(),
            source: count(source, table)?,
            target: count(target, table)?,
        });
    }
    Ok(CopyReport {
        tables: counts,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn sqlite_owned(v: rusqlite::types::ValueRef<'_>) -> Value {
    use rusqlite::types::ValueRef as V;
    match v {
        V::Null => Value::Null,
        V::Integer(i) => Value::Integer(i),
        V::Real(f) => Value::Real(f),
        V::Text(t) => match std::str::from_utf8(t) {
            Ok(s) => Value::Text(s.to_owned()),
            Err(_) => Value::Blob(t.to_vec()),
        },
        V::Blob(b) => Value::Blob(b.to_vec()),
    }
}

/// One multi-row insert of `values` (row after row, `width` columns each).
fn insert(
    tx: &Connection,
    table: &str,
    list: &str,
    width: usize,
    values: &[Value],
) -> Result<(), CopyError> {
    let rows = values.len() / width;
    let mut sql = format!("INSERT INTO \"{table}\" ({list}) VALUES ");
    for r in 0..rows {
        if r > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for c in 0..width {
            if c > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!("?{}", r * width + c + 1));
        }
        sql.push(')');
    }
    let params: Vec<&dyn ToSql> = values.iter().map(|v| v as &dyn ToSql).collect();
    // Full batches share one statement text, so the prepared statement is reused.
    tx.execute(&sql, params.as_slice())?;
    Ok(())
}
