//! The status page's days before today are kept by a task of their own, not read by requests:
//! a page request after the warm-up reads the same store rows whatever the length of the
//! history (counted by the store itself, [`probeok::store::Store::rows_read`], not timed), and
//! a late outcome for a past day — written by another monitor on the same database — shows in
//! its day's bar once the refresh period has passed on the service's clock.

use std::time::{Duration, Instant};

use chrono::TimeDelta;
use probeok::probe::OutcomeKind;
use probeok::store::{Store, StoreOptions};
use probeok::web::pages::PAST_DAYS_EVERY;

use crate::common::app::*;

const ROUTES: [Spec<'static>; 3] = [
    Spec::new("acme", "us", "m1"),
    Spec::new("acme", "us", "m2"),
    Spec::new("acme", "eu", "m3"),
];

fn now() -> chrono::DateTime<chrono::Utc> {
    at("2026-05-20T12:00:00Z")
}

/// A served harness whose routes have `days` days of history (two probes a day).
async fn with_history(days: i64) -> (Harness, Served) {
    let h = Harness::new(&ROUTES, now()).await;
    let mut batch = Vec::new();
    for s in &ROUTES {
        for d in 0..days {
            for hour in [3, 15] {
                let t = now() - TimeDelta::days(d) - TimeDelta::hours(hour);
                batch.push(outcome(&s.id(), OutcomeKind::Probe, t, true, 800.0));
            }
        }
    }
    h.record(batch).await;
    let s = h.serve().await;
    (h, s)
}

async fn get(s: &Served, path: &str) -> String {
    let r = reqwest::get(s.url(path)).await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

async fn page(s: &Served) -> String {
    get(s, "/?lang=en").await
}

/// The first route's page: one bar per day, each with its date.
async fn route_page(s: &Served) -> String {
    get(s, "/routes/acme%2Fus%2Fm1?lang=en").await
}

/// The store rows the first `/` after the warm-up reads.
async fn rows_of_a_request(h: &Harness, s: &Served) -> (u64, String) {
    h.state.figures.past().read_after(0).await;
    let before = h.store.rows_read();
    let body = page(s).await;
    (h.store.rows_read() - before, body)
}

#[tokio::test]
async fn a_page_request_reads_the_same_rows_for_35_and_90_days_of_history() {
    let (h35, s35) = with_history(35).await;
    let (rows_35, _) = rows_of_a_request(&h35, &s35).await;
    let (h90, s90) = with_history(90).await;
    let (rows_90, body) = rows_of_a_request(&h90, &s90).await;
    // 90 days of bars are drawn (one run of 90 normal days) ...
    assert!(
        body.contains("<i class=\"d-normal s90\"></i>"),
        "the 90 days' bars are missing"
    );
    assert!(
        !body.contains("id=\"warming\""),
        "still warming after the read"
    );
    // ... yet the request read no row of the days before the month's and 30 days' windows.
    assert!(rows_90 > 0);
    assert_eq!(
        rows_90, rows_35,
        "a request's rows grew with the history: {rows_35} at 35 days, {rows_90} at 90"
    );
}

#[tokio::test]
async fn a_late_outcome_of_another_monitor_shows_in_its_day_after_the_refresh_period() {
    let (h, s) = with_history(10).await;
    h.state.figures.past().read_after(0).await;
    let day = (now() - TimeDelta::days(5)).format("%Y-%m-%d").to_string();
    let bar = format!("class=\"d-critical\" title=\"{day} ");
    assert!(!route_page(&s).await.contains(&bar));

    // Another monitor on the same database records failures of five days ago, late.
    let path = h.state.config.current().storage.path.clone();
    let other = Store::open(&path, StoreOptions::default()).unwrap();
    let late: Vec<_> = (0..8)
        .map(|i| {
            let t = now() - TimeDelta::days(5) + TimeDelta::minutes(i);
            outcome(&ROUTES[0].id(), OutcomeKind::Probe, t, false, 800.0)
        })
        .collect();
    other.writer().record_many(late).await.unwrap();
    let reads = h.state.figures.past().reads();
    // Within the refresh period the kept days are shown as they were read.
    assert!(
        !route_page(&s).await.contains(&bar),
        "a request read the past days"
    );
    assert_eq!(h.state.figures.past().reads(), reads);

    h.clock
        .advance((PAST_DAYS_EVERY + TimeDelta::seconds(1)).to_std().unwrap());
    h.state.figures.past().read_after(reads).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let body = route_page(&s).await;
        if body.contains(&bar) {
            break;
        }
        assert!(Instant::now() < deadline, "the late day never showed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn yesterday_keeps_its_bar_across_midnight() {
    let (h, s) = with_history(3).await;
    h.state.figures.past().read_after(0).await;
    let yesterday = now().format("%Y-%m-%d").to_string();
    let reads = h.state.figures.past().reads();
    h.clock.set(at("2026-05-21T00:00:05Z"));
    // Whether the keeper has read the new day yet or not, the day that just ended is drawn:
    // from the request's own read of the days since the keeper's, else from the keeper's.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let body = route_page(&s).await;
        assert!(
            body.contains(&format!("class=\"d-normal\" title=\"{yesterday} ")),
            "the day that just ended lost its bar"
        );
        if h.state.figures.past().reads() > reads {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the keeper never read the new day"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(route_page(&s)
        .await
        .contains(&format!("class=\"d-normal\" title=\"{yesterday} ")));
}
