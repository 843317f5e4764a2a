//! Whether the database answers, as the request path sees it: [`StoreHealth`].
//!
//! A proxy keeps serving model calls while its database is gone (read-only mode). It must know
//! that without asking the database on every request, so this is a value in memory, set from
//! what store calls really did — a connection failure of a read or a write marks it
//! unavailable — and from a cheap periodic check that also notices the return
//! ([`Reader::ping`] while healthy, a real write while not). Only connection failures count:
//! a bad row or a constraint is not an outage.
//!
//! Other rules read [`StoreHealth::mode`] too: a client with a spend limit, say, is held to
//! what its reservations already cover while the mode is [`StoreMode::Unavailable`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use super::{Reader, StoreError};

/// What the request path may rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// The database answers.
    Available,
    /// It does not: serve on what is in memory, buffer writes, refuse what needs the store.
    Unavailable,
}

impl StoreMode {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreMode::Available => "available",
            StoreMode::Unavailable => "unavailable",
        }
    }
}

/// The store's availability: one atomic read on the request path.
#[derive(Debug, Default)]
pub struct StoreHealth {
    down: AtomicBool,
    /// Why and since when, while down.
    outage: Mutex<Option<(String, DateTime<Utc>)>>,
}

impl StoreHealth {
    pub fn mode(&self) -> StoreMode {
        if self.down.load(Ordering::Relaxed) {
            StoreMode::Unavailable
        } else {
            StoreMode::Available
        }
    }

    pub fn available(&self) -> bool {
        self.mode() == StoreMode::Available
    }

    /// A store call failed: a connection failure marks the store unavailable (answers whether
    /// it did). The first failure's reason and time are kept until the store returns.
    pub fn failed(&self, e: &StoreError, now: DateTime<Utc>) -> bool {
        if !e.is_connection() {
            return false;
        }
        self.mark_down(e.to_string(), now);
        true
    }

    /// Marks the store unavailable for `reason` (a check that timed out, say).
    pub fn mark_down(&self, reason: String, now: DateTime<Utc>) {
        let mut outage = self.outage.lock().unwrap_or_else(|e| e.into_inner());
        if outage.is_none() {
            tracing::warn!(error = %reason, "the store is unreachable: serving in read-only mode");
            *outage = Some((reason, now));
        }
        self.down.store(true, Ordering::Relaxed);
    }

    /// The store answered again.
    pub fn recovered(&self) {
        if !self.down.load(Ordering::Relaxed) {
            return;
        }
        let mut outage = self.outage.lock().unwrap_or_else(|e| e.into_inner());
        if outage.take().is_some() {
            tracing::info!("the store answers again: read-only mode ends");
        }
        self.down.store(false, Ordering::Relaxed);
    }

    /// Why the store is unavailable and since when (`None` while it answers).
    pub fn outage(&self) -> Option<(String, DateTime<Utc>)> {
        self.outage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Reader {
    /// The cheapest round trip that proves the database answers.
    pub fn ping(&self) -> Result<(), StoreError> {
        let one: i64 = self.conn.query_row("SELECT 1", [], |r| r.get(0))?;
        debug_assert_eq!(one, 1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sql::SqlError;

    #[test]
    fn only_connection_failures_mark_the_store_down() {
        let h = StoreHealth::default();
        let t0 = DateTime::from_timestamp(1_767_225_600, 0).unwrap();
        assert!(!h.failed(&StoreError::Invalid("bad row".into()), t0));
        assert!(h.available());
        assert!(h.failed(&StoreError::Sql(SqlError::Connect("refused".into())), t0));
        assert_eq!(h.mode(), StoreMode::Unavailable);
        let later = t0 + chrono::Duration::seconds(5);
        h.mark_down("again".into(), later);
        let (reason, since) = h.outage().unwrap();
        assert!(reason.contains("refused"), "{reason}");
        assert_eq!(since, t0, "the first failure says since when");
        h.recovered();
        assert!(h.available());
        assert!(h.outage().is_none());
    }
}
