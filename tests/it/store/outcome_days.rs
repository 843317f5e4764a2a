//! Raw outcomes on PostgreSQL, one partition per UTC day: a store written before the layout
//! upgrades with every row where it was, new days get partitions of their own, and retention
//! drops an expired day whole while the rows from before are deleted by key.

use crate::common::pg::TestDb;

use chrono::{DateTime, Utc};
use probeok::probe::outcome::{OutcomeKind, ProbeOutcome};
use probeok::route::RouteId;
use probeok::store::sql::{Connection, Engine};
use probeok::store::{migrate_to, Granularity, StoreOptions};

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn probe(route: &RouteId, started_at: DateTime<Utc>) -> ProbeOutcome {
    ProbeOutcome {
        route: route.clone(),
        kind: OutcomeKind::Probe,
        started_at,
        success: true,
        attributed_to: None,
        verified: Some(true),
        ttfb_ms: Some(200.0),
        ttft_ms: Some(250.0),
        total_ms: 300.0,
        first_answer_ms: Some(250.0),
        output_tokens: Some(3),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: Some(200),
        error: None,
        answer: Some("PROBE_OK".into()),
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

/// The partition each stored outcome is in, with its start, oldest first.
fn placed(conn: &Connection) -> Vec<(String, i64)> {
    conn.prepare_cached(
        "SELECT tableoid::regclass::text, started_at_ms FROM outcomes ORDER BY started_at_ms",
    )
    .unwrap()
    .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

fn exists(conn: &Connection, table: &str) -> bool {
    conn.query_row(
        "SELECT CASE WHEN to_regclass(?1) IS NULL THEN 0 ELSE 1 END",
        [table],
        |r| r.get::<_, i64>(0),
    )
    .unwrap()
        == 1
}

#[tokio::test]
async fn postgres_outcomes_upgrade_into_day_partitions_and_expire_a_day_at_a_time() {
    let db = TestDb::new(Engine::Postgres);
    let r = RouteId::new("qwen", "cn", "qwen-plus");
    let ms = |s: &str| at(s).timestamp_millis();
    // What the release before the day partitions left: three outcomes over two days.
    {
        let mut conn = db.connect();
        migrate_to(&mut conn, 26).unwrap(); // the schema before 0029_outcome_days
        conn.execute_batch(&format!(
            "INSERT INTO routes (id, name) VALUES (1, 'qwen/cn/qwen-plus');
             INSERT INTO outcomes (route_id, kind, started_at_ms, success, total_ms,
                 tokens_estimated, answer)
             VALUES (1, 'probe', {}, 1, 301, 0, 'PROBE_OK'),
                    (1, 'probe', {}, 1, 302, 0, 'PROBE_OK'),
                    (1, 'probe', {}, 0, 303, 0, NULL);",
            ms("2026-03-01T10:00:00Z"),
            ms("2026-03-02T10:00:00Z"),
            ms("2026-03-02T11:00:00Z"),
        ))
        .unwrap();
    }
    let store = db.open(StoreOptions::default());
    let conn = db.connect();
    let unpartitioned = "outcomes_unpartitioned".to_owned();
    assert_eq!(
        placed(&conn),
        vec![
            (unpartitioned.clone(), ms("2026-03-01T10:00:00Z")),
            (unpartitioned.clone(), ms("2026-03-02T10:00:00Z")),
            (unpartitioned.clone(), ms("2026-03-02T11:00:00Z")),
        ],
        "the stored rows stay where they were"
    );
    let reader = store.reader().unwrap();
    let old = reader.recent_outcomes(&r, 10).unwrap();
    assert_eq!(
        old.iter().map(|o| o.total_ms).collect::<Vec<_>>(),
        [303.0, 302.0, 301.0],
        "and read back as before"
    );

    // New outcomes: the rest of the last stored day with the stored rows, later days each in
    // a partition of its own.
    let writer = store.writer();
    for t in [
        "2026-03-02T20:00:00Z",
        "2026-03-03T01:00:00Z",
        "2026-03-04T01:00:00Z",
    ] {
        writer.record(probe(&r, at(t))).await.unwrap();
    }
    assert_eq!(
        placed(&conn)[3..],
        [
            (unpartitioned.clone(), ms("2026-03-02T20:00:00Z")),
            ("outcomes_20260303".to_owned(), ms("2026-03-03T01:00:00Z")),
            ("outcomes_20260304".to_owned(), ms("2026-03-04T01:00:00Z")),
        ]
    );
    let distinct: i64 = conn
        .query_row("SELECT count(DISTINCT id) FROM outcomes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(distinct, 6, "new ids continue after the stored ones");

    // Two days kept, at noon on the 5th: the rows from before are deleted by key; the 3rd's
    // partition holds a row past the cutoff, but its day has not wholly expired.
    let report = writer
        .retention_batched(at("2026-03-05T12:00:00Z"), 2, 400, 2)
        .await
        .unwrap();
    assert_eq!(report.outcomes, 4);
    assert_eq!(
        placed(&conn),
        [
            ("outcomes_20260303".to_owned(), ms("2026-03-03T01:00:00Z")),
            ("outcomes_20260304".to_owned(), ms("2026-03-04T01:00:00Z")),
        ]
    );
    // Past the 3rd's end plus two days: the 3rd goes whole, its table with it.
    let report = writer
        .retention(at("2026-03-06T00:30:00Z"), 2, 400)
        .await
        .unwrap();
    assert_eq!(report.outcomes, 1);
    assert!(!exists(&conn, "outcomes_20260303"));
    assert!(exists(&conn, "outcomes_20260304"));

    // A late outcome for the dropped day makes its partition again (retention takes it next).
    writer
        .record(probe(&r, at("2026-03-03T02:00:00Z")))
        .await
        .unwrap();
    assert!(exists(&conn, "outcomes_20260303"));
    assert_eq!(reader.recent_outcomes(&r, 10).unwrap().len(), 2);
    // The uptime figures, from rollups, kept every outcome.
    let hourly = reader
        .rollups(
            &r,
            Granularity::Hour,
            at("2026-03-01T00:00:00Z"),
            at("2026-03-05T00:00:00Z"),
            &[],
        )
        .unwrap();
    assert_eq!(hourly.iter().map(|h| h.count).sum::<u64>(), 4);
    store.close().await.unwrap();
}
