//! The spend ledger (`migrations/*/0013_spend.sql`): money booked before a request is sent
//! and settled when its usage is known, in one place every proxy of a fleet shares.
//!
//! A *ledger key* names what is limited (a client's spend limit, the fleet's hourly extra-cost
//! budget); each key has one row per period (`period_start`) with `spent` and `reserved` in
//! integer micro-units (exact sums on both engines). [`SpendLedger::reserve`] is one
//! transaction: it locks the period's row (a no-op `UPDATE`, so both engines take the row's
//! write lock the same way), releases that period's expired reservations, and books the
//! estimate with one conditional `UPDATE … WHERE spent + reserved + estimate <= limit`. Every
//! transaction that changes a period's money locks its ledger row first, so concurrent
//! reservations, settlements and reaps of one key are serialised by the database — within one
//! process, across processes, and across machines on PostgreSQL — and never deadlock.
//!
//! A reservation carries an id and an expiry: one whose proxy died mid-request is released by
//! the next transaction on its period. A settlement that comes after its reservation expired
//! still charges what was used.
//!
//! Unlike the rest of the store this does not go through the writer thread: a reservation is
//! a question the request waits on, answered by its own connections (a few PostgreSQL
//! sessions, or a SQLite connection whose `BEGIN IMMEDIATE` waits for the writer's
//! transactions). Blocking: call it from `spawn_blocking`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use rand::RngCore;

use super::sql::{params, Connection, OptionalExtension};
use super::{from_ms, to_ms, StoreError, StoreLocation};

/// Connections one process keeps for reservations (PostgreSQL; SQLite serialises writers
/// anyway, so it keeps one).
pub const SPEND_CONNECTIONS: usize = 4;

/// A booked amount, to settle or release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub id: String,
    pub key: String,
    pub period_start: DateTime<Utc>,
    pub micros: i64,
}

/// One period of one ledger key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LedgerRow {
    pub spent_micros: i64,
    pub reserved_micros: i64,
    /// Reservations refused in this period.
    pub refused: u64,
}

/// What [`SpendLedger::reserve`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Booking {
    Reserved {
        hold: Hold,
        row: LedgerRow,
    },
    /// `spent + reserved + estimate` would pass the limit; the row as it stood.
    Refused {
        row: LedgerRow,
    },
}

/// One step of a batch ([`SpendLedger::apply`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerOp {
    Reserve {
        key: String,
        period_start: DateTime<Utc>,
        micros: i64,
        limit_micros: i64,
        expires_at: DateTime<Utc>,
    },
    Settle {
        hold: Hold,
        actual_micros: i64,
    },
}

impl LedgerOp {
    fn row(&self) -> (&str, i64) {
        match self {
            LedgerOp::Reserve {
                key, period_start, ..
            } => (key, to_ms(*period_start)),
            LedgerOp::Settle { hold, .. } => (&hold.key, to_ms(hold.period_start)),
        }
    }
}

/// What one op of a batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerAnswer {
    Booked(Booking),
    Settled(LedgerRow),
}

/// The ledger's connections (see the module docs).
pub struct SpendLedger {
    location: StoreLocation,
    conns: Vec<Mutex<Option<Connection>>>,
    next: AtomicUsize,
}

impl std::fmt::Debug for SpendLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpendLedger")
            .field("location", &self.location.describe())
            .finish_non_exhaustive()
    }
}

fn new_id() -> String {
    let mut b = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl SpendLedger {
    /// A ledger on a store that is already migrated; connections open on first use.
    pub fn new(location: &StoreLocation) -> SpendLedger {
        let n = match location {
            StoreLocation::Sqlite(_) => 1,
            StoreLocation::Postgres(_) => SPEND_CONNECTIONS,
        };
        SpendLedger {
            location: location.clone(),
            conns: (0..n).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Runs `f` on one of the connections (opened, or reopened after a lost session, here).
    fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let mut slot = self.conns[i].lock().unwrap_or_else(|e| e.into_inner());
        if !slot.as_ref().is_some_and(Connection::is_alive) {
            *slot = Some(self.location.connect()?);
        }
        let conn = slot.as_ref().ok_or(StoreError::Closed)?;
        let r = f(conn);
        if matches!(&r, Err(e) if e.is_connection()) {
            *slot = None;
        }
        r
    }

    /// Books `micros` on `key`'s period if `spent + reserved + micros <= limit_micros`; the
    /// reservation expires at `expires_at`. Expired reservations of the period are released
    /// first (see the module docs).
    pub fn reserve(
        &self,
        key: &str,
        period_start: DateTime<Utc>,
        micros: i64,
        limit_micros: i64,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<Booking, StoreError> {
        let op = LedgerOp::Reserve {
            key: key.to_owned(),
            period_start,
            micros,
            limit_micros,
            expires_at,
        };
        match self.apply(&[op], now)?.pop() {
            Some(LedgerAnswer::Booked(b)) => Ok(b),
            _ => Err(StoreError::Corrupt("the ledger gave no booking".into())),
        }
    }

    /// Charges `actual_micros` to the hold's period and frees its booking (already freed when
    /// it expired: the charge still counts).
    pub fn settle(&self, hold: &Hold, actual_micros: i64) -> Result<LedgerRow, StoreError> {
        let op = LedgerOp::Settle {
            hold: hold.clone(),
            actual_micros,
        };
        match self.apply(&[op], Utc::now())?.pop() {
            Some(LedgerAnswer::Settled(row)) => Ok(row),
            _ => Err(StoreError::Corrupt("the ledger gave no settlement".into())),
        }
    }

    /// Several reservations and settlements in one transaction (one commit for all: what
    /// many concurrent requests book at once costs one disk flush, not one each). The
    /// periods' rows are locked first, in key order, so two batches touching the same rows
    /// queue instead of deadlocking; then each op runs in the order given, each reservation
    /// checked against what the ops before it booked.
    pub fn apply(
        &self,
        ops: &[LedgerOp],
        now: DateTime<Utc>,
    ) -> Result<Vec<LedgerAnswer>, StoreError> {
        let mut rows: Vec<(&str, i64)> = ops.iter().map(LedgerOp::row).collect();
        rows.sort_unstable();
        rows.dedup();
        self.with(|conn| {
            let tx = conn.transaction()?;
            for (key, period) in &rows {
                lock_row(&tx, key, *period)?;
                reap(&tx, key, *period, to_ms(now))?;
            }
            let mut out = Vec::with_capacity(ops.len());
            for op in ops {
                out.push(match op {
                    LedgerOp::Reserve {
                        key,
                        period_start,
                        micros,
                        limit_micros,
                        expires_at,
                    } => LedgerAnswer::Booked(book(
                        &tx,
                        key,
                        *period_start,
                        (*micros).max(0),
                        *limit_micros,
                        *expires_at,
                    )?),
                    LedgerOp::Settle {
                        hold,
                        actual_micros,
                    } => LedgerAnswer::Settled(charge(&tx, hold, *actual_micros)?),
                });
            }
            tx.commit()?;
            Ok(out)
        })
    }

    /// Frees the hold without charging anything (no upstream usage).
    pub fn release(&self, hold: &Hold) -> Result<LedgerRow, StoreError> {
        self.settle(hold, 0)
    }

    /// `key`'s period as it stands, its expired reservations released first.
    pub fn row(
        &self,
        key: &str,
        period_start: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<LedgerRow, StoreError> {
        let period = to_ms(period_start);
        self.with(|conn| {
            let tx = conn.transaction()?;
            let exists = tx
                .query_row(
                    "SELECT 1 FROM spend_ledger WHERE ledger_key = ?1 AND period_start_ms = ?2",
                    params![key, period],
                    |r| r.get::<_, i64>(0),
                )
                .optional()?
                .is_some();
            if !exists {
                return Ok(LedgerRow::default());
            }
            lock_row(&tx, key, period)?;
            reap(&tx, key, period, to_ms(now))?;
            let row = read_row(&tx, key, period)?;
            tx.commit()?;
            Ok(row)
        })
    }

    /// Deletes ledger rows of periods that started before `before` and reservations that
    /// expired before it (old periods are closed: nothing reads them again).
    pub fn prune(&self, before: DateTime<Utc>) -> Result<usize, StoreError> {
        let t = to_ms(before);
        self.with(|conn| {
            let tx = conn.transaction()?;
            let mut n = tx.execute(
                "DELETE FROM spend_ledger WHERE period_start_ms < ?1",
                params![t],
            )?;
            n += tx.execute(
                "DELETE FROM spend_reservations WHERE expires_at_ms < ?1 AND period_start_ms < ?1",
                params![t],
            )?;
            tx.commit()?;
            Ok(n)
        })
    }

    /// Open reservations of `key` (for tests and the admin view's sanity).
    pub fn open_holds(&self, key: &str) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
        self.with(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id, expires_at_ms FROM spend_reservations WHERE ledger_key = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map(params![key], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (id, at) = row?;
                out.push((id, from_ms(at)?));
            }
            Ok(out)
        })
    }
}

/// The conditional booking (the period's row is locked).
fn book(
    tx: &Connection,
    key: &str,
    period_start: DateTime<Utc>,
    micros: i64,
    limit_micros: i64,
    expires_at: DateTime<Utc>,
) -> Result<Booking, StoreError> {
    let period = to_ms(period_start);
    let booked = tx.execute(
        "UPDATE spend_ledger SET reserved_micros = reserved_micros + ?3
         WHERE ledger_key = ?1 AND period_start_ms = ?2
           AND spent_micros + reserved_micros + ?3 <= ?4",
        params![key, period, micros, limit_micros],
    )?;
    if booked == 1 {
        let id = new_id();
        tx.execute(
            "INSERT INTO spend_reservations
               (id, ledger_key, period_start_ms, amount_micros, expires_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, key, period, micros, to_ms(expires_at)],
        )?;
        Ok(Booking::Reserved {
            hold: Hold {
                id,
                key: key.to_owned(),
                period_start,
                micros,
            },
            row: read_row(tx, key, period)?,
        })
    } else {
        tx.execute(
            "UPDATE spend_ledger SET refused = refused + 1
             WHERE ledger_key = ?1 AND period_start_ms = ?2",
            params![key, period],
        )?;
        Ok(Booking::Refused {
            row: read_row(tx, key, period)?,
        })
    }
}

/// The settlement (the period's row is locked). A hold reaped after its expiry books nothing
/// any more; what it used still counts.
fn charge(tx: &Connection, hold: &Hold, actual_micros: i64) -> Result<LedgerRow, StoreError> {
    let period = to_ms(hold.period_start);
    let booked: Option<i64> = tx
        .query_row(
            "DELETE FROM spend_reservations WHERE id = ?1 RETURNING amount_micros",
            params![hold.id],
            |r| r.get(0),
        )
        .optional()?;
    tx.execute(
        "UPDATE spend_ledger SET spent_micros = spent_micros + ?3,
                reserved_micros = reserved_micros - ?4
         WHERE ledger_key = ?1 AND period_start_ms = ?2",
        params![hold.key, period, actual_micros.max(0), booked.unwrap_or(0)],
    )?;
    read_row(tx, &hold.key, period)
}

/// Creates the period's row if missing, then takes its write lock (the no-op `UPDATE`): every
/// money-changing transaction of the period starts here, so they queue on one row.
fn lock_row(conn: &Connection, key: &str, period: i64) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO spend_ledger (ledger_key, period_start_ms, spent_micros, reserved_micros, refused)
         VALUES (?1, ?2, 0, 0, 0) ON CONFLICT DO NOTHING",
        params![key, period],
    )?;
    conn.execute(
        "UPDATE spend_ledger SET refused = refused WHERE ledger_key = ?1 AND period_start_ms = ?2",
        params![key, period],
    )?;
    Ok(())
}

/// Releases the period's reservations that expired by `now` (under the row's lock).
fn reap(conn: &Connection, key: &str, period: i64, now: i64) -> Result<(), StoreError> {
    let freed: Vec<(String, i64)> = conn
        .prepare_cached(
            "DELETE FROM spend_reservations
             WHERE ledger_key = ?1 AND period_start_ms = ?2 AND expires_at_ms <= ?3
             RETURNING id, amount_micros",
        )?
        .query_map(params![key, period, now], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    if freed.is_empty() {
        return Ok(());
    }
    let total: i64 = freed.iter().map(|(_, a)| a).sum();
    tracing::warn!(
        ledger = key,
        reservations = freed.len(),
        micros = total,
        "released expired spend reservations (their proxy never settled them)"
    );
    conn.execute(
        "UPDATE spend_ledger SET reserved_micros = reserved_micros - ?3
         WHERE ledger_key = ?1 AND period_start_ms = ?2",
        params![key, period, total],
    )?;
    Ok(())
}

fn read_row(conn: &Connection, key: &str, period: i64) -> Result<LedgerRow, StoreError> {
    Ok(conn.query_row(
        "SELECT spent_micros, reserved_micros, refused FROM spend_ledger
         WHERE ledger_key = ?1 AND period_start_ms = ?2",
        params![key, period],
        |r| {
            Ok(LedgerRow {
                spent_micros: r.get(0)?,
                reserved_micros: r.get(1)?,
                refused: u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
            })
        },
    )?)
}
