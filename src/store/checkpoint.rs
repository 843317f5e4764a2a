//! SQLite WAL checkpoints on their own thread and connection, off the writer's commits.
//!
//! By default SQLite checkpoints inside the commit that takes the WAL past 1,000 pages: that
//! commit copies the pages back into the database and syncs it, a few milliseconds that the
//! request or the probe waiting for that commit pays (an `Idempotency-Key` claim waits for
//! two commits). Here the writer only appends to the WAL; after its commits a checkpointer
//! copies what it can without waiting for anyone (`PASSIVE`), at most every [`EVERY`]. The
//! writer still checkpoints by itself past [`WRITER_LIMIT`] pages, should this thread ever
//! fall behind, so the WAL stays bounded either way.

use std::path::Path;
use std::sync::mpsc::{self, SyncSender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::StoreError;

/// At most one checkpoint per this long: the commits in between are copied together, and a
/// page that many commits touch (an index's, a rollup's) is copied back once, not each time.
pub const EVERY: Duration = Duration::from_secs(1);
/// The WAL pages past which the writer checkpoints in its own commit after all.
pub const WRITER_LIMIT: u32 = 10_000;

/// The checkpointer of one database; dropping it ends the thread (after a last checkpoint).
pub struct Checkpointer {
    wake: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Opens its own connection to `path` and starts the thread. The writer's connection
    /// gets [`WRITER_LIMIT`] as its own threshold.
    pub fn start(path: &Path, writer: &rusqlite::Connection) -> Result<Self, StoreError> {
        writer.pragma_update(None, "wal_autocheckpoint", WRITER_LIMIT)?;
        let conn = rusqlite::Connection::open(path)?;
        super::configure(&conn)?;
        let (wake, rx) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("probeok-store-checkpoint".into())
            .spawn(move || run(&conn, &rx))
            .map_err(StoreError::Spawn)?;
        Ok(Self {
            wake: Some(wake),
            thread: Some(thread),
        })
    }

    /// The writer committed: a checkpoint is due (never blocks).
    pub fn committed(&self) {
        if let Some(w) = &self.wake {
            let _ = w.try_send(());
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.wake = None;
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn run(conn: &rusqlite::Connection, rx: &mpsc::Receiver<()>) {
    let mut last: Option<Instant> = None;
    while rx.recv().is_ok() {
        // Pace: what commits while waiting is copied by the same checkpoint. The wait parks
        // rather than receives, so those commits do not wake the thread; closing unparks it.
        if let Some(at) = last {
            let due = at + EVERY;
            while let Some(left) = due.checked_duration_since(Instant::now()) {
                if left.is_zero() {
                    break;
                }
                std::thread::park_timeout(left);
                if matches!(rx.try_recv(), Err(TryRecvError::Disconnected)) {
                    break;
                }
            }
        }
        checkpoint(conn);
        last = Some(Instant::now());
    }
    checkpoint(conn);
}

/// One passive checkpoint: what no reader still needs goes back into the database.
fn checkpoint(conn: &rusqlite::Connection) {
    let r = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((
            row.get::<_, i64>(0)?,
            row.get::<_, i64>(1)?,
            row.get::<_, i64>(2)?,
        ))
    });
    match r {
        Ok((_busy, wal, copied)) => tracing::trace!(wal, copied, "checkpoint"),
        Err(e) => tracing::warn!(error = %e, "WAL checkpoint failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db_bytes(path: &Path) -> u64 {
        std::fs::metadata(path).map_or(0, |m| m.len())
    }

    #[test]
    fn commits_are_copied_back_by_the_checkpointer_not_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let writer = rusqlite::Connection::open(&path).unwrap();
        crate::store::configure(&writer).unwrap();
        writer.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        let cp = Checkpointer::start(&path, &writer).unwrap();
        let limit: u32 = writer
            .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
            .unwrap();
        assert_eq!(limit, WRITER_LIMIT);
        // About 2,000 pages of commits: past SQLite's own threshold of 1,000 pages, where
        // the writer would have copied them into the database file itself.
        for _ in 0..500 {
            writer
                .execute("INSERT INTO t VALUES (zeroblob(16000))", [])
                .unwrap();
        }
        assert!(
            db_bytes(&path) < 1 << 20,
            "the writer checkpointed in a commit: {} bytes",
            db_bytes(&path)
        );
        cp.committed();
        // The checkpointer's thread copies them: poll with a deadline.
        let deadline = Instant::now() + Duration::from_secs(30);
        while db_bytes(&path) < 8_000_000 {
            assert!(Instant::now() < deadline, "no checkpoint ran");
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(cp);
    }
}
