//! Closed hours of raw outcomes packed into one row per route and hour: every reader answers
//! the same before and after packing (latencies to the microsecond), a late outcome for a
//! packed hour is read at once and merged at the next packing, retention removes an hour once
//! all of it has expired, a store written before the packed layout upgrades and packs its
//! history without losing a row, and a row that cannot be read back holds up only its own
//! hour. On PostgreSQL a day whose hours are all packed has its partition dropped.

use crate::common::pg::TestDb;

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;
use probeok::store::sql::{Connection, Engine};
use probeok::store::{migrate_to, Reader, Store, StoreOptions, ALL_KINDS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn opts() -> StoreOptions {
    StoreOptions {
        latency_threshold: Duration::from_secs(2),
    }
}

fn route(n: usize) -> RouteId {
    RouteId::new("qwen", &format!("region-{n}"), "qwen-plus")
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 6, 10, 0, 0, 0).unwrap()
}

/// Outcomes as the product writes them: probes every 30 s with sub-millisecond latencies, a
/// throughput probe now and then, passive outcomes (several may start in the same
/// millisecond), failures of each kind.
fn history(rng: &mut StdRng, r: &RouteId, from: DateTime<Utc>, hours: i64) -> Vec<ProbeOutcome> {
    let mut out = Vec::new();
    for i in 0..hours * 120 {
        let at = from + chrono::Duration::milliseconds(i * 30_000 + rng.gen_range(0..900));
        let total_ms = 150.0 + rng.gen::<f64>().powi(3) * 4_000.0 + rng.gen_range(0.0..1.0);
        let mut o = ProbeOutcome {
            route: r.clone(),
            kind: OutcomeKind::Probe,
            started_at: at,
            success: true,
            attributed_to: None,
            verified: Some(rng.gen_ratio(19, 20)),
            ttfb_ms: Some(total_ms / 3.0),
            ttft_ms: Some(total_ms / 2.0),
            first_answer_ms: Some(total_ms / 2.0),
            total_ms,
            output_tokens: Some(3),
            tokens_estimated: rng.gen_ratio(1, 10),
            tokens_per_second: None,
            model_reported: Some(
                if i < hours * 60 {
                    "qwen-plus-0125"
                } else {
                    "qwen-plus-0428"
                }
                .into(),
            ),
            system_fingerprint: rng.gen_ratio(1, 2).then(|| "fp_7a1c".to_string()),
            http_status: Some(200),
            error: None,
            answer: Some("PROBE_OK".into()),
            max_tokens_exhausted: false,
            ratelimit: None,
        };
        if rng.gen_ratio(1, 8) {
            o.success = false;
            o.verified = None;
            o.answer = None;
            o.ttft_ms = None;
            o.first_answer_ms = None;
            o.error = Some(match rng.gen_range(0..4) {
                0 => ProbeError::TimeoutBeforeFirstByte,
                1 => ProbeError::Http {
                    status: 503,
                    message: "overloaded".into(),
                },
                2 => ProbeError::RateLimited {
                    retry_after_ms: Some(1500),
                    message: "slow down".into(),
                },
                _ => ProbeError::Truncated,
            });
            o.http_status = o.error.as_ref().and_then(ProbeError::status);
        }
        if i % 240 == 7 {
            o.kind = OutcomeKind::Throughput;
            o.output_tokens = Some(120);
            o.tokens_per_second = Some(rng.gen_range(5.0..120.0));
        }
        out.push(o.clone());
        if i % 50 == 3 {
            // Two proxied requests in the same millisecond as the probe.
            for _ in 0..2 {
                let mut p = o.clone();
                p.kind = OutcomeKind::Passive;
                p.verified = None;
                p.total_ms += rng.gen_range(0.0..50.0);
                out.push(p);
            }
        }
    }
    out
}

/// What every reader of raw outcomes answers for `r`, latencies rounded to the microsecond.
fn answers(reader: &Reader, r: &RouteId) -> Vec<String> {
    let h = |n: i64| t0() + chrono::Duration::minutes(n * 60 + 17);
    let mut out = Vec::new();
    let mut push = |what: &str, os: Vec<ProbeOutcome>| {
        out.push(format!("{what}: {}", os.len()));
        out.extend(os.into_iter().map(|o| shown(&o)));
    };
    push("recent 50", reader.recent_outcomes(r, 50).unwrap());
    push("recent 900", reader.recent_outcomes(r, 900).unwrap());
    push(
        "recent throughput",
        reader
            .recent_outcomes_of(r, &[OutcomeKind::Throughput], 3)
            .unwrap(),
    );
    push("since", reader.outcomes_since(r, h(1), ALL_KINDS).unwrap());
    push(
        "since, probes",
        reader
            .outcomes_since(r, h(2), &[OutcomeKind::Probe])
            .unwrap(),
    );
    push(
        "between",
        reader
            .outcomes_between(r, h(0), h(3), &[OutcomeKind::Passive])
            .unwrap(),
    );
    let bad = reader
        .bad_outcomes_between(r, h(1), h(4), &[OutcomeKind::Probe], 1_000.0)
        .unwrap();
    out.push(format!("bad: {bad}"));
    let d = reader
        .drill_outcomes(r, OutcomeKind::Probe, h(2), h(5))
        .unwrap();
    let lat: Vec<String> = d.latencies_ms.iter().map(|v| format!("{v:.3}")).collect();
    out.push(format!(
        "drill: {} {} {} {}",
        d.total,
        d.successes,
        d.validation_failures,
        lat.join(",")
    ));
    out
}

/// An outcome as JSON with its latencies rounded to the microsecond.
fn shown(o: &ProbeOutcome) -> String {
    let us = |v: f64| format!("{v:.3}");
    let mut o = o.clone();
    let lat = format!(
        "{} {:?} {:?} {:?} {:?}",
        us(o.total_ms),
        o.ttfb_ms.map(us),
        o.ttft_ms.map(us),
        o.first_answer_ms.map(us),
        o.tokens_per_second.map(us)
    );
    o.total_ms = 0.0;
    o.ttfb_ms = None;
    o.ttft_ms = None;
    o.first_answer_ms = None;
    o.tokens_per_second = None;
    format!("{} {lat}", serde_json::to_string(&o).unwrap())
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

async fn record_all(store: &Store, os: Vec<ProbeOutcome>) {
    for chunk in os.chunks(500) {
        store.writer().record_many(chunk.to_vec()).await.unwrap();
    }
}

/// A SQLite store written at the schema before packed hours (raw rows only: the layout every
/// release before wrote), upgraded by opening it with this build.
#[tokio::test]
async fn packing_closed_hours_leaves_every_reader_answer_as_it_was() {
    let db = TestDb::new(Engine::Sqlite);
    migrate_to(&mut db.connect(), 27).unwrap(); // the schema before 0030_outcome_hours
    let store = db.open(opts());
    let mut rng = StdRng::seed_from_u64(7);
    let routes: Vec<RouteId> = (0..3).map(route).collect();
    let mut written = 0;
    for r in &routes {
        let os = history(&mut rng, r, t0(), 6);
        written += os.len() as i64;
        record_all(&store, os).await;
    }
    let reader = store.reader().unwrap();
    let before: Vec<Vec<String>> = routes.iter().map(|r| answers(&reader, r)).collect();
    let conn = db.connect();
    assert_eq!(count(&conn, "SELECT count(*) FROM outcomes"), written);

    // At 06:40 the hours 00:00–05:00 have been over an hour: packed; 05:00–06:00 stays raw.
    let packed = store
        .writer()
        .pack(t0() + chrono::Duration::minutes(6 * 60 + 40))
        .await
        .unwrap();
    let raw_left = count(&conn, "SELECT count(*) FROM outcomes");
    assert_eq!(packed as i64 + raw_left, written);
    assert_eq!(
        count(&conn, "SELECT count(*) FROM outcome_hours"),
        3 * 5,
        "one row per route and packed hour"
    );
    assert_eq!(
        count(&conn, "SELECT COALESCE(SUM(count), 0) FROM outcome_hours"),
        packed as i64
    );
    let hour5 = (t0() + chrono::Duration::hours(5)).timestamp_millis();
    assert_eq!(
        count(
            &conn,
            &format!("SELECT count(*) FROM outcomes WHERE started_at_ms < {hour5}")
        ),
        0
    );
    for (r, want) in routes.iter().zip(&before) {
        assert_eq!(&answers(&reader, r), want, "{r}");
    }

    // A late outcome for a packed hour is read at once, and merged at the next packing.
    let mut late = history(
        &mut rng,
        &routes[0],
        t0() + chrono::Duration::minutes(90),
        1,
    )
    .remove(0);
    late.total_ms = 4_321.5;
    store.writer().record(late.clone()).await.unwrap();
    let with_late = answers(&reader, &routes[0]);
    assert_ne!(with_late, before[0]);
    assert!(
        with_late.iter().any(|l| l.contains("4321.500")),
        "the late outcome is read"
    );
    let merged = store
        .writer()
        .pack(t0() + chrono::Duration::minutes(6 * 60 + 40))
        .await
        .unwrap();
    assert_eq!(merged, 1);
    assert_eq!(count(&conn, "SELECT count(*) FROM outcome_hours"), 3 * 5);
    assert_eq!(answers(&reader, &routes[0]), with_late);
    // Nothing left to pack.
    assert_eq!(
        store
            .writer()
            .pack(t0() + chrono::Duration::minutes(6 * 60 + 40))
            .await
            .unwrap(),
        0
    );

    // Retention: 14 days after 02:30 the hours that ended by then go; 02:00–03:00 stays
    // whole until all of it has expired.
    let report = store
        .writer()
        .retention_batched(
            t0() + chrono::Duration::minutes(14 * 24 * 60 + 150),
            14,
            400,
            2,
        )
        .await
        .unwrap();
    assert_eq!(
        count(&conn, "SELECT count(*) FROM outcome_hours"),
        3 * 3,
        "hours 00:00 and 01:00 of each route went"
    );
    let kept_from = (t0() + chrono::Duration::hours(2)).timestamp_millis();
    for r in &routes {
        let all = reader.outcomes_since(r, t0(), ALL_KINDS).unwrap();
        assert!(all
            .iter()
            .all(|o| o.started_at.timestamp_millis() >= kept_from));
        assert_eq!(
            all.len(),
            reader
                .outcomes_since(r, t0() + chrono::Duration::hours(2), ALL_KINDS)
                .unwrap()
                .len()
        );
    }
    let left: i64 = count(&conn, "SELECT COALESCE(SUM(count), 0) FROM outcome_hours")
        + count(&conn, "SELECT count(*) FROM outcomes");
    assert_eq!(report.outcomes as i64 + left, written + 1);
    drop(reader);
    store.close().await.unwrap();
}

/// A row that cannot be read back (a text where a count or a latency belongs) keeps its hour
/// raw; every other hour, older and newer, of its route and of the
/// others, is packed, and a later run passes over it again instead of stopping at it.
#[tokio::test]
async fn an_unreadable_row_keeps_its_hour_raw_and_packing_goes_on() {
    let db = TestDb::new(Engine::Sqlite);
    let store = db.open(opts());
    let mut rng = StdRng::seed_from_u64(11);
    let routes: Vec<RouteId> = (0..3).map(route).collect();
    let mut written = 0;
    for r in &routes {
        let os = history(&mut rng, r, t0(), 5);
        written += os.len() as i64;
        record_all(&store, os).await;
    }
    let conn = db.connect();
    let hour = |h: i64| (t0() + chrono::Duration::hours(h)).timestamp_millis();
    let route_id = |n: usize| -> i64 {
        conn.query_row(
            &format!("SELECT id FROM routes WHERE name = '{}'", route(n)),
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    let damage = |set: &str, route: i64, h: i64| {
        let sql = format!(
            "UPDATE outcomes SET {set} WHERE id = (SELECT min(id) FROM outcomes
             WHERE route_id = {route} AND started_at_ms >= {} AND started_at_ms < {})",
            hour(h),
            hour(h + 1)
        );
        assert_eq!(conn.execute(&sql, []).unwrap(), 1);
    };
    // The oldest hour of all, and one in the middle of another route's.
    let (r0, r1) = (route_id(0), route_id(1));
    damage("output_tokens = 'three'", r0, 0);
    damage("total_ms = 'fast'", r1, 2);
    let in_hour = |route: i64, h: i64| {
        count(
            &conn,
            &format!(
                "SELECT count(*) FROM outcomes WHERE route_id = {route}
                 AND started_at_ms >= {} AND started_at_ms < {}",
                hour(h),
                hour(h + 1)
            ),
        )
    };
    let kept = [in_hour(r0, 0), in_hour(r1, 2)];

    // At 05:40 the hours 00:00–04:00 are due: 3 routes × 4 hours, 2 of them unreadable.
    let at = t0() + chrono::Duration::minutes(5 * 60 + 40);
    let packed = store.writer().pack(at).await.unwrap();
    assert_eq!(
        count(&conn, "SELECT count(*) FROM outcome_hours"),
        3 * 4 - 2,
        "every readable hour is packed"
    );
    assert_eq!(
        count(&conn, "SELECT COALESCE(SUM(count), 0) FROM outcome_hours"),
        packed as i64
    );
    assert_eq!(
        [in_hour(r0, 0), in_hour(r1, 2)],
        kept,
        "the unreadable hours stay raw"
    );
    assert_eq!(
        count(&conn, "SELECT count(*) FROM outcomes") + packed as i64,
        written,
        "no row lost"
    );
    let unpacked = format!(
        "SELECT count(*) FROM outcomes WHERE started_at_ms < {}
         AND NOT (route_id = {r0} AND started_at_ms < {})
         AND NOT (route_id = {r1} AND started_at_ms >= {} AND started_at_ms < {})",
        hour(4),
        hour(1),
        hour(2),
        hour(3)
    );
    assert_eq!(count(&conn, &unpacked), 0, "a due hour was left raw");

    // The next run passes over them again, packs nothing, and ends.
    assert_eq!(store.writer().pack(at).await.unwrap(), 0);
    assert_eq!(
        count(&conn, "SELECT count(*) FROM outcome_hours"),
        3 * 4 - 2
    );
    store.close().await.unwrap();
}

/// On PostgreSQL closed hours are packed as on SQLite, and a day left without raw rows has
/// its partition dropped hours after it ended (its pages hold only deleted rows); a late
/// outcome for it makes the partition again, is read at once and packed at the next run. The
/// hours a SQLite store brought along are read too.
#[tokio::test]
async fn postgres_packs_closed_hours_and_drops_the_emptied_day_partitions() {
    let lite = TestDb::new(Engine::Sqlite);
    let store = lite.open(opts());
    let mut rng = StdRng::seed_from_u64(11);
    let brought = route(0);
    record_all(&store, history(&mut rng, &brought, t0(), 3)).await;
    assert!(
        store
            .writer()
            .pack(t0() + chrono::Duration::hours(4))
            .await
            .unwrap()
            > 0
    );
    let want = answers(&store.reader().unwrap(), &brought);
    store.close().await.unwrap();

    let pg = TestDb::new(Engine::Postgres);
    pg.open(opts()).close().await.unwrap();
    probeok::store::copy::copy_sqlite_to_postgres(&lite.connect(), &pg.connect(), false, |_, _| {})
        .unwrap();
    let store = pg.open(opts());
    let reader = store.reader().unwrap();
    assert_eq!(answers(&reader, &brought), want);

    // 30 hours of two routes: all of 10 June and 11 June until 06:00.
    let routes = [route(1), route(2)];
    let mut written = 0;
    for r in &routes {
        let os = history(&mut rng, r, t0(), 30);
        written += os.len() as i64;
        record_all(&store, os).await;
    }
    let before: Vec<Vec<String>> = routes.iter().map(|r| answers(&reader, r)).collect();
    let conn = pg.connect();
    let partitions = || {
        let mut names: Vec<String> = conn
            .prepare_cached(
                "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'outcomes'::regclass AND c.relname <> 'outcomes_unpartitioned'",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        names.sort();
        names
    };
    let packed_rows = || {
        count(
            &conn,
            "SELECT CAST(COALESCE(SUM(count), 0) AS BIGINT) FROM outcome_hours",
        )
    };
    let brought_rows = packed_rows();
    assert_eq!(partitions(), ["outcomes_20260610", "outcomes_20260611"]);

    // At 06:40 on 11 June every hour before 05:00 is packed; 10 June's partition, empty now,
    // stays until a day after the day ended.
    let packed = store
        .writer()
        .pack(t0() + chrono::Duration::minutes(30 * 60 + 40))
        .await
        .unwrap();
    assert_eq!(packed_rows() - brought_rows, packed as i64);
    assert_eq!(
        count(&conn, "SELECT count(*) FROM outcomes") + packed as i64,
        written
    );
    assert_eq!(count(&conn, "SELECT count(*) FROM outcomes_20260610"), 0);
    assert_eq!(partitions(), ["outcomes_20260610", "outcomes_20260611"]);
    for (r, want) in routes.iter().zip(&before) {
        assert_eq!(&answers(&reader, r), want, "{r}");
    }

    // Just past 01:00 on 12 June (packing up to midnight): the last hours are packed, and 10
    // June's partition is dropped; 11 June's waits its day.
    let at = t0() + chrono::Duration::minutes(49 * 60 + 10);
    store.writer().pack(at).await.unwrap();
    assert_eq!(count(&conn, "SELECT count(*) FROM outcomes"), 0);
    assert_eq!(packed_rows() - brought_rows, written);
    assert_eq!(partitions(), ["outcomes_20260611"]);
    for (r, want) in routes.iter().zip(&before) {
        assert_eq!(&answers(&reader, r), want, "{r}");
    }

    // A late outcome for 10 June: its partition is made again, the outcome read at once,
    // then merged into its hour and the partition dropped again.
    let mut late = history(&mut rng, &routes[0], t0() + chrono::Duration::hours(3), 1).remove(0);
    late.total_ms = 4_321.5;
    store.writer().record(late).await.unwrap();
    assert_eq!(partitions(), ["outcomes_20260610", "outcomes_20260611"]);
    let with_late = answers(&reader, &routes[0]);
    assert!(with_late.iter().any(|l| l.contains("4321.500")));
    assert_eq!(store.writer().pack(at).await.unwrap(), 1);
    assert_eq!(partitions(), ["outcomes_20260611"]);
    assert_eq!(answers(&reader, &routes[0]), with_late);
    assert_eq!(answers(&reader, &brought), want);
    drop(reader);
    store.close().await.unwrap();
}
