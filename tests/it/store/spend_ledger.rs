//! The spend ledger on both engines: concurrent reservations never pass the limit, settlements
//! charge the real usage and free the rest, an abandoned reservation is released once it
//! expires, and each period is its own row.

use crate::common::pg;
use crate::on_both_engines;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use pg::TestDb;
use probeok::clock::{Clock, ManualClock};
use probeok::config::Per;
use probeok::spend::{period_start, Spend};
use probeok::store::{Booking, SpendLedger, StoreOptions};

fn t0() -> DateTime<Utc> {
    "2026-03-01T10:15:00Z".parse().unwrap()
}

fn reserve(l: &SpendLedger, key: &str, micros: i64, limit: i64, now: DateTime<Utc>) -> Booking {
    let start = period_start(Per::Hour, now);
    l.reserve(key, start, micros, limit, now, now + TimeDelta::minutes(5))
        .unwrap()
}

on_both_engines! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_reservations_never_pass_the_limit(db: &TestDb) {
        let store = db.open(StoreOptions::default());
        let clock = Arc::new(ManualClock::new(t0()));
        let spend = Spend::new(store.spend_ledger(), clock.clone(), Duration::from_secs(300));
        // 60 requests of 0.05 each against a limit of 1.00: 20 fit.
        let mut tasks = Vec::new();
        for _ in 0..60 {
            let spend = spend.clone();
            tasks.push(tokio::spawn(async move {
                spend.reserve("client:a", Per::Day, 50_000, 1_000_000).await.unwrap()
            }));
        }
        let mut holds = Vec::new();
        let mut refused = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok((hold, row)) => {
                    assert!(row.spent_micros + row.reserved_micros <= 1_000_000, "{row:?}");
                    holds.push(hold);
                }
                Err(r) => {
                    refused += 1;
                    // Until the end of the UTC day.
                    let left = (chrono::DateTime::parse_from_rfc3339("2026-03-02T00:00:00Z").unwrap()
                        .with_timezone(&Utc) - t0()).to_std().unwrap();
                    assert_eq!(r.retry_after, left);
                }
            }
        }
        assert_eq!((holds.len(), refused), (20, 40));
        let row = spend.usage("client:a", Per::Day).await.unwrap();
        assert_eq!((row.spent_micros, row.reserved_micros, row.refused), (0, 1_000_000, 40));
        // Settle each to less than booked: the rest is free again.
        for h in holds {
            spend.settle(h, 30_000).await.unwrap();
        }
        let row = spend.usage("client:a", Per::Day).await.unwrap();
        assert_eq!((row.spent_micros, row.reserved_micros), (600_000, 0));
        // 0.40 left: 8 more of 0.05, then refused.
        let mut more = 0;
        while spend.reserve("client:a", Per::Day, 50_000, 1_000_000).await.unwrap().is_ok() {
            more += 1;
        }
        assert_eq!(more, 8);
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn release_frees_everything_and_settle_charges_the_usage(db: &TestDb) {
        let store = db.open(StoreOptions::default());
        let l = store.spend_ledger();
        let now = t0();
        let Booking::Reserved { hold, row } = reserve(&l, "k", 700, 1000, now) else {
            panic!("refused")
        };
        assert_eq!((row.spent_micros, row.reserved_micros), (0, 700));
        assert!(matches!(reserve(&l, "k", 301, 1000, now), Booking::Refused { .. }));
        let row = l.release(&hold).unwrap();
        assert_eq!((row.spent_micros, row.reserved_micros), (0, 0));
        let Booking::Reserved { hold, .. } = reserve(&l, "k", 1000, 1000, now) else {
            panic!("refused")
        };
        // Usage above the estimate is still charged as used (the limit is a booking rule;
        // the ledger never forgets money that was spent).
        let row = l.settle(&hold, 1000).unwrap();
        assert_eq!((row.spent_micros, row.reserved_micros), (1000, 0));
        assert!(matches!(reserve(&l, "k", 1, 1000, now), Booking::Refused { .. }));
        // Another key and another hour are their own rows.
        assert!(matches!(reserve(&l, "other", 1000, 1000, now), Booking::Reserved { .. }));
        let next_hour = now + TimeDelta::hours(1);
        assert!(matches!(reserve(&l, "k", 1000, 1000, next_hour), Booking::Reserved { .. }));
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn an_abandoned_reservation_is_released_when_it_expires(db: &TestDb) {
        let store = db.open(StoreOptions::default());
        let clock = Arc::new(ManualClock::new(t0()));
        // This "proxy" books and dies without settling.
        {
            let dead = Spend::new(store.spend_ledger(), clock.clone(), Duration::from_secs(600));
            let (_hold, _) = dead.reserve("client:a", Per::Hour, 900, 1000).await.unwrap().unwrap();
        }
        let live = Spend::new(store.spend_ledger(), clock.clone(), Duration::from_secs(600));
        assert!(live.reserve("client:a", Per::Hour, 200, 1000).await.unwrap().is_err());
        clock.advance(Duration::from_secs(599));
        assert_eq!(live.usage("client:a", Per::Hour).await.unwrap().reserved_micros, 900);
        clock.advance(Duration::from_secs(1));
        // Whoever looks next releases it.
        assert_eq!(live.usage("client:a", Per::Hour).await.unwrap().reserved_micros, 0);
        let (hold, row) = live.reserve("client:a", Per::Hour, 200, 1000).await.unwrap().unwrap();
        assert_eq!(row.reserved_micros, 200);
        let ledger = store.spend_ledger();
        assert_eq!(ledger.open_holds("client:a").unwrap().len(), 1);
        // A late settlement of an expired hold still charges what was used, once.
        clock.advance(Duration::from_secs(601));
        assert_eq!(live.usage("client:a", Per::Hour).await.unwrap().reserved_micros, 0);
        let row = live.settle(hold, 150).await.unwrap();
        assert_eq!((row.spent_micros, row.reserved_micros), (150, 0));
        assert!(ledger.open_holds("client:a").unwrap().is_empty());
        // Old periods are pruned.
        assert!(ledger.prune(clock.now() + TimeDelta::hours(2)).unwrap() >= 1);
        assert_eq!(live.usage("client:a", Per::Hour).await.unwrap().spent_micros, 0);
        store.close().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_stores_on_one_database_share_one_limit(db: &TestDb) {
        // Two processes' worth of connections (each store its own ledger) on one database.
        let a = db.open(StoreOptions::default());
        let b = db.open(StoreOptions::default());
        let clock = Arc::new(ManualClock::new(t0()));
        let sa = Spend::new(a.spend_ledger(), clock.clone(), Duration::from_secs(300));
        let sb = Spend::new(b.spend_ledger(), clock.clone(), Duration::from_secs(300));
        let mut tasks = Vec::new();
        for i in 0..40 {
            let s = if i % 2 == 0 { sa.clone() } else { sb.clone() };
            tasks.push(tokio::spawn(async move {
                s.reserve("budget:extra_cost", Per::Hour, 100, 1_050).await.unwrap().is_ok()
            }));
        }
        let mut ok = 0;
        for t in tasks {
            ok += usize::from(t.await.unwrap());
        }
        assert_eq!(ok, 10);
        assert_eq!(sa.usage("budget:extra_cost", Per::Hour).await.unwrap().reserved_micros, 1_000);
        a.close().await.unwrap();
        b.close().await.unwrap();
    }
}
