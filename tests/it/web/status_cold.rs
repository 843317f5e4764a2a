//! The status page's days before today and its long windows (uptimes over 24 hours, 7 and 30
//! days, the error budgets) are kept by tasks of their own, not read by requests; the first
//! page after a start answers with the states at once and starts the last hour's figures'
//! read (it says they are being read). A page request after the warm-up, with that read, reads the same few store rows a route whatever the length of the
//! history (counted by the store itself, [`probeok::store::Store::rows_read`], not timed), the
//! kept windows sum to what reading them whole gives, and a late outcome for a past day —
//! written by another monitor on the same database — shows in its day's bar and in the
//! uptimes once the refresh period has passed on the service's clock, not before.

use std::time::{Duration, Instant};

use chrono::TimeDelta;
use probeok::clock::Clock;
use probeok::probe::OutcomeKind;
use probeok::store::{Store, StoreOptions};
use probeok::web::i18n::Lang;
use probeok::web::pages::PAST_DAYS_EVERY;
use probeok::web::windows::{self, Span, WINDOWS_EVERY};

use crate::common::app::*;

const ROUTES: [Spec<'static>; 3] = [
    Spec::new("acme", "us", "m1"),
    Spec::new("acme", "us", "m2"),
    Spec::new("acme", "eu", "m3"),
];

fn now() -> chrono::DateTime<chrono::Utc> {
    at("2026-05-20T12:00:00Z")
}

/// A served harness whose routes have `days` days of history (two probes a day), and a
/// probe each in the current hour.
async fn with_history(days: i64) -> (Harness, Served) {
    let h = history(days).await;
    let s = h.serve().await;
    (h, s)
}

/// The harness of [`with_history`], not served yet.
async fn history(days: i64) -> Harness {
    let h = Harness::new(&ROUTES, now()).await;
    let mut batch = Vec::new();
    for s in &ROUTES {
        batch.push(outcome(&s.id(), OutcomeKind::Probe, now(), true, 800.0));
        for d in 0..days {
            for hour in [3, 15] {
                let t = now() - TimeDelta::days(d) - TimeDelta::hours(hour);
                batch.push(outcome(&s.id(), OutcomeKind::Probe, t, true, 800.0));
            }
        }
    }
    h.record(batch).await;
    h
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

/// The store rows the first `/` after the keepers' first reads reads, with the status
/// figures' read it starts; the page after that read.
async fn rows_of_a_request(days: i64) -> (u64, String) {
    let h = history(days).await;
    let s = h.serve_unread().await;
    let before = h.store.rows_read();
    // The first page answers at once with the states, and says the rest is being read.
    let first = page(&s).await;
    assert!(
        first.contains(Lang::En.text().latest_warming),
        "the first page did not say its figures are being read"
    );
    h.state.figures.first_read().await;
    let rows = h.store.rows_read() - before;
    (rows, page(&s).await)
}

#[tokio::test]
async fn a_page_request_reads_the_same_few_rows_for_2_and_90_days_of_history() {
    let (rows_2, _) = rows_of_a_request(2).await;
    let (rows_90, body) = rows_of_a_request(90).await;
    // 90 days of bars are drawn (one run of 90 normal days) ...
    assert!(
        body.contains("<i class=\"d-normal s90\"></i>"),
        "the 90 days' bars are missing"
    );
    assert!(
        !body.contains("id=\"warming\""),
        "still warming after the read"
    );
    // ... yet the request read no row of the days before today's hour: not the windows'
    // (24 hours to 30 days, the month), not the bars'.
    assert!(rows_90 > 0);
    assert_eq!(
        rows_90, rows_2,
        "a request's rows grew with the history: {rows_2} at 2 days, {rows_90} at 90"
    );
    let per_route = rows_90 as f64 / ROUTES.len() as f64;
    // A row a route for each figure of the current hour (its hourly, 5-minute and daily
    // rollups, its raw probe, the month's hour) and the route names each bulk read looks up:
    // 10 a route here, where reading the windows whole reads a row a route for each of
    // their days.
    assert!(
        per_route <= 12.0,
        "a request read {rows_90} rows: {per_route:.1} a route"
    );
}

/// Outcomes of both uptime kinds, some failing, on every hour of the last 40 days around the
/// windows' edges, and in the current hour.
fn rich(now: chrono::DateTime<chrono::Utc>) -> Vec<probeok::probe::ProbeOutcome> {
    let mut all = Vec::new();
    for (i, s) in ROUTES.iter().enumerate() {
        for h in 0..40 * 24 {
            let t = now - TimeDelta::hours(h) - TimeDelta::minutes(7 * i as i64 + 3);
            let kind = if h % 3 == 0 {
                OutcomeKind::Throughput
            } else {
                OutcomeKind::Probe
            };
            all.push(outcome(&s.id(), kind, t, (h + i as i64) % 7 != 0, 800.0));
        }
    }
    all
}

/// The windows a request combines from the kept counts, and the same windows read whole.
fn kept_and_direct(
    h: &Harness,
) -> (
    Vec<probeok::route::RouteMap<probeok::store::Counts>>,
    Vec<probeok::route::RouteMap<probeok::store::Counts>>,
) {
    let now = h.clock.now();
    let reader = h.store.reader().unwrap();
    let kept = h
        .state
        .figures
        .windows()
        .get()
        .expect("the windows were read");
    let combined = kept.at(&reader, now, &Span::ALL).unwrap();
    let direct = windows::direct(&reader, now, &Span::ALL).unwrap();
    (combined, direct)
}

#[tokio::test]
async fn the_kept_windows_sum_to_the_windows_read_whole() {
    let start = at("2026-05-31T22:34:56Z");
    let h = Harness::new(&ROUTES, start).await;
    h.record(rich(start)).await;
    let _served = h.serve().await;
    // Within the keeper's hour, after its read, at the next hours, past midnight into a new
    // month: each time with outcomes of the current hour the keeper has not read.
    for t in [
        "2026-05-31T22:34:56Z",
        "2026-05-31T22:41:00Z",
        "2026-05-31T23:02:00Z",
        "2026-06-01T00:00:30Z",
        "2026-06-01T01:15:00Z",
    ] {
        h.clock.set(at(t));
        // A new hour: the keeper reads it within moments.
        let hour = probeok::store::Granularity::Hour.bucket_start(at(t));
        let deadline = Instant::now() + Duration::from_secs(20);
        while h.state.figures.windows().get().unwrap().hour() != hour {
            assert!(
                Instant::now() < deadline,
                "{t}: the keeper never read the hour"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let fresh: Vec<_> = ROUTES
            .iter()
            .flat_map(|s| {
                [
                    outcome(&s.id(), OutcomeKind::Probe, at(t), false, 900.0),
                    outcome(&s.id(), OutcomeKind::Throughput, at(t), true, 900.0),
                ]
            })
            .collect();
        h.record(fresh).await;
        let (combined, direct) = kept_and_direct(&h);
        for (span, (c, d)) in Span::ALL.iter().zip(combined.iter().zip(&direct)) {
            assert!(!d.is_empty(), "{t} {span:?}: no counts");
            assert_eq!(c, d, "{t}: the kept {span:?} window differs from the whole");
        }
    }
    // The month the incidents page accounts, as it read it.
    let now = h.clock.now();
    let reader = h.store.reader().unwrap();
    let month = reader
        .counts_by_route(
            at("2026-06-01T00:00:00Z"),
            now + TimeDelta::milliseconds(1),
            &[OutcomeKind::Probe],
        )
        .unwrap();
    let (combined, _) = kept_and_direct(&h);
    assert_eq!(
        combined[4]
            .clone()
            .into_iter()
            .collect::<std::collections::HashMap<_, _>>(),
        month
    );
}

#[tokio::test]
async fn a_late_outcome_shows_in_the_uptimes_after_the_refresh_period_not_before() {
    let (h, s) = with_history(10).await;
    let id = ROUTES[0].id();
    let uptime_30d = |s: &Served| {
        let url = s.url("/api/v1/status");
        let id = id.clone();
        async move {
            let v: serde_json::Value = reqwest::get(url).await.unwrap().json().await.unwrap();
            v["routes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["id"] == id.as_str())
                .map(|r| r["uptime"]["30d"].clone())
                .unwrap()
        }
    };
    let before = uptime_30d(&s).await;
    assert!(before.is_number(), "{before}");

    // Another monitor on the same database records failures of three days ago, late.
    let path = h.state.config.current().storage.path.clone();
    let other = Store::open(&path, StoreOptions::default()).unwrap();
    let late: Vec<_> = (0..8)
        .map(|i| {
            let t = now() - TimeDelta::days(3) + TimeDelta::minutes(i);
            outcome(&id, OutcomeKind::Probe, t, false, 800.0)
        })
        .collect();
    other.writer().record_many(late).await.unwrap();
    let reads = h.state.figures.windows().reads();
    // Within the refresh period a request combines the kept counts as they were read: the
    // whole window has the failures, what a request computes has not.
    let (combined, direct) = kept_and_direct(&h);
    let r = probeok::route::RouteId::parse(&id).unwrap();
    assert_eq!(combined[2][&r].count + 8, direct[2][&r].count);
    assert_eq!(h.state.figures.windows().reads(), reads, "a request read");

    h.clock
        .advance((WINDOWS_EVERY + TimeDelta::seconds(1)).to_std().unwrap());
    h.state.figures.windows().read_after(reads).await;
    let (combined, direct) = kept_and_direct(&h);
    assert_eq!(
        combined, direct,
        "the late failures are not in the kept windows"
    );
    // The answer shows them once its own few seconds of caching passed.
    let deadline = Instant::now() + Duration::from_secs(20);
    while uptime_30d(&s).await == before {
        assert!(Instant::now() < deadline, "the late failures never showed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
