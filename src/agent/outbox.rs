//! The agent's outbox: every outcome is written here before anything is sent, so neither an
//! unreachable monitor nor a killed agent loses one. A row leaves only when the monitor has
//! answered for it (accepted, duplicate or rejected); an unanswered batch is sent again with
//! the same ids, which the monitor recognises.
//!
//! Bounded by `[agent] max_backlog`: past it the oldest rows are dropped, and the count of
//! dropped outcomes is kept in the file (it survives a restart, as the backlog does).
//! Synchronous (SQLite); the agent calls it from `spawn_blocking`.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("agent outbox: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("agent outbox: cannot encode an outcome: {0}")]
    Json(#[from] serde_json::Error),
}

/// One queued outcome: its place in the queue and its ingest item (JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct Queued {
    pub seq: i64,
    pub body: String,
}

/// See the module docs.
pub struct Outbox {
    conn: Connection,
    max_backlog: u64,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("max_backlog", &self.max_backlog)
            .finish_non_exhaustive()
    }
}

impl Outbox {
    /// Opens (or creates) the outbox file.
    pub fn open(path: &Path, max_backlog: u64) -> Result<Self, OutboxError> {
        let conn = Connection::open(path)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             PRAGMA busy_timeout = 5000;
             CREATE TABLE IF NOT EXISTS outbox (
                 seq  INTEGER PRIMARY KEY AUTOINCREMENT,
                 body TEXT NOT NULL
             );
             CREATE TABLE IF NOT EXISTS outbox_meta (
                 key   TEXT PRIMARY KEY,
                 value INTEGER NOT NULL
             );",
        )?;
        Ok(Self {
            conn,
            max_backlog: max_backlog.max(1),
        })
    }

    /// Queues `bodies` in order (one transaction), then drops the oldest rows beyond the
    /// bound; answers how many were dropped.
    pub fn push(&mut self, bodies: &[String]) -> Result<u64, OutboxError> {
        let tx = self.conn.transaction()?;
        {
            let mut insert = tx.prepare_cached("INSERT INTO outbox (body) VALUES (?1)")?;
            for b in bodies {
                insert.execute([b])?;
            }
        }
        let len: i64 = tx.query_row("SELECT COUNT(*) FROM outbox", [], |r| r.get(0))?;
        let over = (len as u64).saturating_sub(self.max_backlog);
        if over > 0 {
            tx.execute(
                "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox ORDER BY seq LIMIT ?1)",
                [over as i64],
            )?;
            tx.execute(
                "INSERT INTO outbox_meta (key, value) VALUES ('dropped', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = value + excluded.value",
                [over as i64],
            )?;
        }
        tx.commit()?;
        Ok(over)
    }

    /// The oldest queued rows: at most `max_items`, and no more than `max_bytes` of bodies
    /// (at least one row when any is queued).
    pub fn peek(&self, max_items: usize, max_bytes: usize) -> Result<Vec<Queued>, OutboxError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT seq, body FROM outbox ORDER BY seq LIMIT ?1")?;
        let rows = stmt.query_map([max_items as i64], |r| {
            Ok(Queued {
                seq: r.get(0)?,
                body: r.get(1)?,
            })
        })?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for row in rows {
            let q = row?;
            bytes += q.body.len() + 1;
            if !out.is_empty() && bytes > max_bytes {
                break;
            }
            out.push(q);
        }
        Ok(out)
    }

    /// Removes rows the monitor answered for (every row up to and including `last_seq` that
    /// was in the batch: rows are only ever taken from the front).
    pub fn settle(&mut self, first_seq: i64, last_seq: i64) -> Result<u64, OutboxError> {
        let n = self.conn.execute(
            "DELETE FROM outbox WHERE seq >= ?1 AND seq <= ?2",
            params![first_seq, last_seq],
        )?;
        Ok(n as u64)
    }

    /// Rows waiting.
    pub fn len(&self) -> Result<u64, OutboxError> {
        let n: i64 = self
            .conn
            .query_row("SELECT COUNT(*) FROM outbox", [], |r| r.get(0))?;
        Ok(n as u64)
    }

    pub fn is_empty(&self) -> Result<bool, OutboxError> {
        Ok(self.len()? == 0)
    }

    /// Outcomes dropped over the bound since the file was created.
    pub fn dropped(&self) -> Result<u64, OutboxError> {
        let n: Option<i64> = self
            .conn
            .query_row(
                "SELECT value FROM outbox_meta WHERE key = 'dropped'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        Ok(n.unwrap_or(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bodies(range: std::ops::Range<u32>) -> Vec<String> {
        range.map(|i| format!("{{\"n\":{i}}}")).collect()
    }

    #[test]
    fn rows_leave_only_when_settled_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let mut o = Outbox::open(&path, 100).unwrap();
        o.push(&bodies(0..10)).unwrap();
        let batch = o.peek(4, 1 << 20).unwrap();
        assert_eq!(batch.len(), 4);
        assert_eq!(batch[0].body, "{\"n\":0}");
        // Not settled (the answer was lost): the same rows come again.
        assert_eq!(o.peek(4, 1 << 20).unwrap(), batch);
        o.settle(batch[0].seq, batch[3].seq).unwrap();
        drop(o);
        let o = Outbox::open(&path, 100).unwrap();
        assert_eq!(o.len().unwrap(), 6);
        assert_eq!(o.peek(1, 1 << 20).unwrap()[0].body, "{\"n\":4}");
    }

    #[test]
    fn the_oldest_are_dropped_past_the_bound_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = Outbox::open(&dir.path().join("a.db"), 5).unwrap();
        assert_eq!(o.push(&bodies(0..3)).unwrap(), 0);
        assert_eq!(o.push(&bodies(3..8)).unwrap(), 3);
        assert_eq!(o.len().unwrap(), 5);
        assert_eq!(o.dropped().unwrap(), 3);
        assert_eq!(o.peek(1, 1 << 20).unwrap()[0].body, "{\"n\":3}");
        o.push(&bodies(8..9)).unwrap();
        assert_eq!(o.dropped().unwrap(), 4);
    }

    #[test]
    fn a_batch_is_bounded_in_bytes_but_never_empty() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = Outbox::open(&dir.path().join("a.db"), 100).unwrap();
        o.push(&["x".repeat(100), "y".repeat(100)]).unwrap();
        assert_eq!(o.peek(10, 150).unwrap().len(), 1);
        assert_eq!(o.peek(10, 10).unwrap().len(), 1);
        assert_eq!(o.peek(10, 1000).unwrap().len(), 2);
    }
}
