//! The demo with a past: its first start writes 30 days of simulated history through the
//! store, so the first page a new user sees has day bars, uptime and incidents on nearly every
//! one of the last 30 days, marked as the demo's history (en/zh); a restart writes none.

use std::sync::Arc;
use std::time::Duration;

use probeok::app;
use probeok::clock::SystemClock;
use probeok::demo::history;
use tokio_util::sync::CancellationToken;

/// Per route line of `/`: its id and the classes of its 90 day bars, oldest first.
fn day_bars(page: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for row in page.split("<tr><td class=\"rt\"><a href=\"").skip(1) {
        let id_start = row.find('>').unwrap() + 1;
        let id = row[id_start..row[id_start..].find('<').unwrap() + id_start].to_owned();
        let bar_start = row.find("<span class=\"bar\"").expect("a day bar");
        let bar = &row[bar_start..bar_start + row[bar_start..].find("</span>").unwrap()];
        let mut days = Vec::new();
        for run in bar.split("<i class=\"").skip(1) {
            let class_end = run.find('"').unwrap();
            let (class, span) = run[..class_end].split_once(" s").unwrap();
            for _ in 0..span.parse::<usize>().unwrap() {
                days.push(class.to_owned());
            }
        }
        out.push((id, days));
    }
    out
}

/// Rows of `table`; for `outcomes`, every outcome stored, raw or in a packed hour (the running
/// service packs the history's closed hours in the background).
fn count(db: &std::path::Path, table: &str) -> i64 {
    let c = rusqlite::Connection::open(db).unwrap();
    let n: i64 = c
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap();
    if table != "outcomes" {
        return n;
    }
    let packed: i64 = c
        .query_row(
            "SELECT COALESCE(SUM(count), 0) FROM outcome_hours",
            [],
            |r| r.get(0),
        )
        .unwrap();
    n + packed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_first_page_has_a_month_of_history_and_a_restart_writes_none() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    let shutdown = CancellationToken::new();
    let demo = probeok::demo::start(shutdown.child_token()).await.unwrap();
    let mut config = demo.config.clone();
    config.storage.path = db.clone();
    // The page is what is looked at here; the demo's proxy port may be taken on this machine.
    config.proxy.enabled = false;
    let routes = config.routes();

    let now = chrono::Utc::now();
    let written = history::write_to_file(&config, now)
        .await
        .unwrap()
        .expect("a fresh database gets the history");
    eprintln!("demo history: {written:?}");
    assert_eq!((written.to - written.from).num_days(), 30);
    // A few minutes of probing per hour for every route: tens of thousands of outcomes, and
    // the scenarios' faults left incidents behind.
    assert!(written.outcomes > 100_000, "{written:?}");
    assert!(written.incidents >= 5, "{written:?}");
    let outcomes = count(&db, "outcomes");
    assert_eq!(outcomes, written.outcomes as i64);
    let incidents = count(&db, "incidents");
    assert!(incidents >= 5, "{incidents} incidents stored");
    // Each incident is stored as it ended: a route has at most one open incident (the one
    // the history may end in, which the live service then carries on).
    let c = rusqlite::Connection::open(&db).unwrap();
    let doubly_open: i64 = c
        .query_row(
            "SELECT count(*) FROM (SELECT route_id FROM incidents WHERE closed_at_ms IS NULL
             GROUP BY route_id HAVING count(*) > 1)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(doubly_open, 0, "routes with more than one open incident");
    // A fault of the history is probed through, not sampled: its incident spends the bad
    // time of the whole fault (six minutes of failures), more than the three minutes a
    // healthy hour's sample holds.
    let threshold_ms = config.slo.latency_threshold.as_secs_f64() * 1000.0;
    let mut stmt = c
        .prepare(
            "SELECT r.name, i.closed_at_ms - i.opened_at_ms,
                    (SELECT count(*) FROM outcomes o WHERE o.route_id = i.route_id
                        AND o.kind = 'probe' AND o.started_at_ms >= i.opened_at_ms
                        AND o.started_at_ms < i.closed_at_ms
                        AND (o.success = 0 OR o.total_ms > ?1))
             FROM incidents i JOIN routes r ON r.id = i.route_id
             WHERE i.closed_at_ms IS NOT NULL",
        )
        .unwrap();
    let spent: Vec<(String, i64, i64)> = stmt
        .query_map([threshold_ms], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    drop(stmt);
    let bad_seconds = |(route, _, bad): &(String, i64, i64)| {
        let interval = routes
            .iter()
            .find(|r| r.id.to_string() == *route)
            .unwrap()
            .probe
            .interval;
        *bad as f64 * interval.as_secs_f64()
    };
    let most = spent.iter().map(bad_seconds).fold(0.0, f64::max);
    assert!(
        most >= 200.0,
        "the worst incident spent {most} s of bad time: {spent:?}"
    );
    drop(c);

    // The service opens on it: the first page shows the history.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::start(
        config.clone(),
        listener,
        Arc::new(SystemClock),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let base = format!("http://{}", running.addr);
    // Right after the start the page may say its past days and uptimes are still being read
    // (by tasks of their own, within moments): the first page after that.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let page = reqwest::get(format!("{base}/"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if !page.contains("id=\"warming\"") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still warming after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for lang in ["en", "zh"] {
        let page = reqwest::get(format!("{base}/?lang={lang}"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(page.contains("id=\"demo-history\""), "marked: {lang}");
        let mark = if lang == "en" {
            "Demo history</strong> · the 30 days before"
        } else {
            "演示历史</strong> · "
        };
        assert!(page.contains(mark), "{mark} on the {lang} page");
        // And says it is sampled, so an hour-long incident that spent minutes is explained.
        let sampled = if lang == "en" { "sampled" } else { "抽样" };
        assert!(page.contains(sampled), "{sampled} on the {lang} page");
        let bars = day_bars(&page);
        assert_eq!(bars.len(), routes.len(), "every route has its line");
        for (id, days) in &bars {
            assert_eq!(days.len(), 90, "{id}");
            let with_history = days[60..].iter().filter(|c| *c != "d-none").count();
            assert!(
                with_history >= 25,
                "{id}: history on {with_history} of the last 30 days: {days:?}"
            );
            assert!(
                days[..59].iter().all(|c| c == "d-none"),
                "{id}: nothing before the history: {days:?}"
            );
        }
        // Uptime over 30 days is a figure, not "no data".
        assert!(
            !page.contains("<td class=\"n\">no data</td><td class=\"n\">no data</td>"),
            "uptime figures on every line"
        );
    }
    // The incidents page lists the history's incidents, resolved.
    let incidents_page = reqwest::get(format!("{base}/incidents?lang=en"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(incidents_page.contains("id=\"demo-history\""));
    assert!(
        !incidents_page.contains("No incidents."),
        "incidents listed"
    );
    shutdown.cancel();
    tokio::time::timeout(app::DRAIN_TIMEOUT + Duration::from_secs(5), running.done)
        .await
        .expect("the service stops")
        .unwrap()
        .unwrap();

    // A restart finds the marker and writes nothing: every table keeps its rows.
    const TABLES: &[&str] = &[
        "outcomes",
        "rollups",
        "transitions",
        "incidents",
        "route_health",
    ];
    let before: Vec<i64> = TABLES.iter().map(|t| count(&db, t)).collect();
    assert!(before[0] >= outcomes, "the live run only added rows");
    let again = history::write_to_file(&config, chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(again, None, "a restart writes no history");
    let after: Vec<i64> = TABLES.iter().map(|t| count(&db, t)).collect();
    assert_eq!(before, after, "rows of {TABLES:?}");
}
