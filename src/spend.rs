//! The one interface the request path books money through: [`Spend`] over the store's
//! [`SpendLedger`] — `reserve` before an upstream call, `settle` to the real usage, `release`
//! what was not used. Periods are UTC calendar hours, days and months ([`period_start`],
//! [`period_end`], pure); amounts are integer micro-units of the price currency
//! ([`micros_of`]): a route's price per million tokens times tokens *is* micro-units, so
//! estimates and charges add exactly on every engine.
//!
//! What concurrent requests of one process book at once goes to the ledger together: one
//! task drains the queue (up to [`BATCH`]) into one transaction ([`SpendLedger::apply`]), so
//! a client's hot ledger row costs one commit per batch, not one per request, and every
//! booking is still checked one by one against the limit.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Datelike, DurationRound, TimeDelta, TimeZone, Utc};

use crate::clock::Clock;
use crate::config::Per;
use crate::route::Price;
use crate::store::{Booking, Hold, LedgerAnswer, LedgerOp, LedgerRow, SpendLedger, StoreError};

/// Bookings and settlements one process sends to the ledger in one transaction, at most.
pub const BATCH: usize = 64;
/// Bookings waiting for the ledger (then callers wait: backpressure).
const QUEUE: usize = 4096;

type Job = (
    LedgerOp,
    tokio::sync::oneshot::Sender<Result<LedgerAnswer, SpendError>>,
);

/// The store could not answer: nothing was booked (the caller refuses rather than risk an
/// overdraw).
#[derive(Debug, thiserror::Error)]
pub enum SpendError {
    #[error("the spend ledger is unavailable: {0}")]
    Unavailable(String),
}

impl From<StoreError> for SpendError {
    fn from(e: StoreError) -> Self {
        SpendError::Unavailable(e.to_string())
    }
}

/// Micro-units per currency unit.
pub const MICROS: f64 = 1e6;

/// Currency units as micro-units, rounded up (a limit or an estimate is never understated by
/// rounding).
pub fn to_micros_ceil(amount: f64) -> i64 {
    if !amount.is_finite() || amount <= 0.0 {
        return 0;
    }
    (amount * MICROS).ceil().min(i64::MAX as f64) as i64
}

/// Currency units as micro-units, rounded down (a limit is never overstated by rounding).
pub fn to_micros_floor(amount: f64) -> i64 {
    if !amount.is_finite() || amount <= 0.0 {
        return 0;
    }
    (amount * MICROS).floor().min(i64::MAX as f64) as i64
}

/// Micro-units as currency units.
pub fn from_micros(m: i64) -> f64 {
    m as f64 / MICROS
}

/// The cost of `input` prompt and `output` completion tokens at `price`, in micro-units
/// (rounded up: a fraction of a micro-unit is charged whole).
pub fn micros_of(price: &Price, input: u64, output: u64) -> i64 {
    let m = input as f64 * price.input_per_mtok.max(0.0)
        + output as f64 * price.output_per_mtok.max(0.0);
    if m.is_finite() && m > 0.0 {
        m.ceil().min(i64::MAX as f64) as i64
    } else {
        0
    }
}

/// The start of the period `now` falls in (UTC).
pub fn period_start(per: Per, now: DateTime<Utc>) -> DateTime<Utc> {
    match per {
        Per::Hour => now.duration_trunc(TimeDelta::hours(1)).unwrap_or(now),
        Per::Day => now.duration_trunc(TimeDelta::days(1)).unwrap_or(now),
        Per::Month => Utc
            .with_ymd_and_hms(now.year(), now.month(), 1, 0, 0, 0)
            .single()
            .unwrap_or(now),
    }
}

/// The start of the next period: when a refused client may try again.
pub fn period_end(per: Per, now: DateTime<Utc>) -> DateTime<Utc> {
    let start = period_start(per, now);
    match per {
        Per::Hour => start + TimeDelta::hours(1),
        Per::Day => start + TimeDelta::days(1),
        Per::Month => {
            let (y, m) = if start.month() == 12 {
                (start.year() + 1, 1)
            } else {
                (start.year(), start.month() + 1)
            };
            Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0)
                .single()
                .unwrap_or(start + TimeDelta::days(31))
        }
    }
}

/// A refusal: the limit cannot cover the estimate this period.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// Until the period resets.
    pub retry_after: Duration,
    pub row: LedgerRow,
}

/// Booking through the shared ledger (see the module docs); clone it freely.
#[derive(Clone)]
pub struct Spend {
    ledger: Arc<SpendLedger>,
    clock: Arc<dyn Clock>,
    /// How long a reservation may stay unsettled before anyone may release it: longer than
    /// any request can run, so a live request's money is never freed under it.
    hold_for: Duration,
    /// The batching task's queue, started on first use.
    queue: Arc<std::sync::OnceLock<tokio::sync::mpsc::Sender<Job>>>,
}

impl std::fmt::Debug for Spend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spend")
            .field("hold_for", &self.hold_for)
            .finish_non_exhaustive()
    }
}

impl Spend {
    pub fn new(ledger: SpendLedger, clock: Arc<dyn Clock>, hold_for: Duration) -> Spend {
        Spend {
            ledger: Arc::new(ledger),
            clock,
            hold_for,
            queue: Arc::default(),
        }
    }

    /// Runs `op` in the next batch.
    async fn submit(&self, op: LedgerOp) -> Result<LedgerAnswer, SpendError> {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
            tokio::spawn(batches(self.ledger.clone(), self.clock.clone(), rx));
            tx
        });
        let (tx, rx) = tokio::sync::oneshot::channel();
        let gone = || SpendError::Unavailable("the ledger's batching task stopped".into());
        queue.send((op, tx)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&SpendLedger) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, SpendError> {
        let ledger = self.ledger.clone();
        tokio::task::spawn_blocking(move || f(&ledger))
            .await
            .map_err(|e| SpendError::Unavailable(e.to_string()))?
            .map_err(SpendError::from)
    }

    /// Books `micros` on `key` for the current `per` period within `limit_micros`.
    pub async fn reserve(
        &self,
        key: &str,
        per: Per,
        micros: i64,
        limit_micros: i64,
    ) -> Result<Result<(Hold, LedgerRow), Refusal>, SpendError> {
        let now = self.clock.now();
        let start = period_start(per, now);
        let expires = now + TimeDelta::from_std(self.hold_for).unwrap_or(TimeDelta::hours(1));
        let op = LedgerOp::Reserve {
            key: key.to_owned(),
            period_start: start,
            micros,
            limit_micros,
            expires_at: expires,
        };
        let LedgerAnswer::Booked(booking) = self.submit(op).await? else {
            return Err(SpendError::Unavailable("the ledger gave no booking".into()));
        };
        Ok(match booking {
            Booking::Reserved { hold, row } => Ok((hold, row)),
            Booking::Refused { row } => Err(Refusal {
                retry_after: (period_end(per, now) - now)
                    .to_std()
                    .unwrap_or(Duration::from_secs(1))
                    .max(Duration::from_secs(1)),
                row,
            }),
        })
    }

    /// Charges `actual_micros` and frees the rest of the hold.
    pub async fn settle(&self, hold: Hold, actual_micros: i64) -> Result<LedgerRow, SpendError> {
        let op = LedgerOp::Settle {
            hold,
            actual_micros,
        };
        match self.submit(op).await? {
            LedgerAnswer::Settled(row) => Ok(row),
            LedgerAnswer::Booked(_) => Err(SpendError::Unavailable(
                "the ledger gave no settlement".into(),
            )),
        }
    }

    /// Frees the whole hold (nothing was used).
    pub async fn release(&self, hold: Hold) -> Result<LedgerRow, SpendError> {
        self.settle(hold, 0).await
    }

    /// `key`'s current `per` period.
    pub async fn usage(&self, key: &str, per: Per) -> Result<LedgerRow, SpendError> {
        let now = self.clock.now();
        let start = period_start(per, now);
        let key = key.to_owned();
        self.blocking(move |l| l.row(&key, start, now)).await
    }

    /// The same, blocking (for a caller already off the async threads).
    pub fn usage_blocking(&self, key: &str, per: Per) -> Result<LedgerRow, SpendError> {
        let now = self.clock.now();
        Ok(self.ledger.row(key, period_start(per, now), now)?)
    }
}

/// The batching task: what is queued when it wakes goes in one transaction; ends when every
/// [`Spend`] is gone.
async fn batches(
    ledger: Arc<SpendLedger>,
    clock: Arc<dyn Clock>,
    mut rx: tokio::sync::mpsc::Receiver<Job>,
) {
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < BATCH {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let ops: Vec<LedgerOp> = jobs.iter().map(|(op, _)| op.clone()).collect();
        let (l, now) = (ledger.clone(), clock.now());
        let done = tokio::task::spawn_blocking(move || l.apply(&ops, now)).await;
        match done {
            Ok(Ok(answers)) if answers.len() == jobs.len() => {
                for ((_, tx), a) in jobs.into_iter().zip(answers) {
                    let _ = tx.send(Ok(a));
                }
            }
            other => {
                let why = match other {
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => e.to_string(),
                    Ok(Ok(_)) => "the ledger answered a batch short".into(),
                };
                for (_, tx) in jobs {
                    let _ = tx.send(Err(SpendError::Unavailable(why.clone())));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn periods_are_utc_calendar_hours_days_and_months() {
        let now = t("2024-12-31T23:59:59.999Z");
        assert_eq!(period_start(Per::Hour, now), t("2024-12-31T23:00:00Z"));
        assert_eq!(period_end(Per::Hour, now), t("2025-01-01T00:00:00Z"));
        assert_eq!(period_start(Per::Day, now), t("2024-12-31T00:00:00Z"));
        assert_eq!(period_end(Per::Day, now), t("2025-01-01T00:00:00Z"));
        assert_eq!(period_start(Per::Month, now), t("2024-12-01T00:00:00Z"));
        assert_eq!(period_end(Per::Month, now), t("2025-01-01T00:00:00Z"));
        // The boundary itself belongs to the new period.
        let b = t("2024-02-01T00:00:00Z");
        assert_eq!(period_start(Per::Month, b), b);
        assert_eq!(period_end(Per::Month, b), t("2024-03-01T00:00:00Z"));
        assert_eq!(period_start(Per::Hour, b), b);
        // February of a leap year.
        assert_eq!(
            period_end(Per::Day, t("2024-02-29T12:00:00Z")),
            t("2024-03-01T00:00:00Z")
        );
    }

    #[test]
    fn periods_roll_with_a_manual_clock() {
        let clock = ManualClock::new(t("2024-05-01T10:59:59Z"));
        let first = period_start(Per::Hour, clock.now());
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            period_start(Per::Hour, clock.now()) - first,
            TimeDelta::hours(1)
        );
        assert_eq!(
            period_start(Per::Day, clock.now()),
            period_start(Per::Day, first)
        );
    }

    #[test]
    fn prices_per_million_tokens_are_micro_units_per_token() {
        let price = Price {
            input_per_mtok: 2.0,
            output_per_mtok: 8.0,
            currency: "CNY".into(),
        };
        // 1000 × 2 + 500 × 8 micro-units = 0.006 CNY.
        assert_eq!(micros_of(&price, 1000, 500), 6000);
        assert_eq!(from_micros(micros_of(&price, 1000, 500)), 0.006);
        let odd = Price {
            input_per_mtok: 0.35,
            output_per_mtok: 0.0,
            currency: "CNY".into(),
        };
        assert_eq!(micros_of(&odd, 3, 0), 2, "1.05 micro-units charge 2");
        assert_eq!(to_micros_ceil(0.1), 100_000);
        assert_eq!(to_micros_floor(50.0), 50_000_000);
        assert_eq!(to_micros_ceil(f64::NAN), 0);
        assert_eq!(to_micros_floor(-1.0), 0);
    }
}
