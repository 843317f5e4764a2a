//! The store on real databases — a SQLite file and a PostgreSQL database, every test on
//! both: migrations, the batching writer under concurrency, rollups against the raw rows
//! they summarise (across a restart), retention, and "acknowledged = committed".

use crate::common::pg;
use crate::on_both_engines;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use pg::TestDb;
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;
use probeok::store::histogram::{bucket_bounds, bucket_index};
use probeok::store::sql::Engine;
use probeok::store::{
    force_version, latest_version, migrate_to, user_version, Granularity, Rollup, Store,
    StoreError, StoreOptions, ALL_KINDS,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn route(n: usize) -> RouteId {
    RouteId::new("prov", &format!("region-{n}"), "vendor/model-x")
}

fn opts() -> StoreOptions {
    StoreOptions {
        latency_threshold: Duration::from_secs(2),
    }
}

/// A plain outcome; tests tweak fields.
fn outcome(
    route: RouteId,
    kind: OutcomeKind,
    started_at: DateTime<Utc>,
    total_ms: f64,
) -> ProbeOutcome {
    ProbeOutcome {
        route,
        kind,
        started_at,
        success: true,
        attributed_to: None,
        verified: Some(true),
        ttfb_ms: Some(total_ms / 3.0),
        ttft_ms: Some(total_ms / 2.0),
        total_ms,
        output_tokens: Some(3),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: Some("model-x-2026-01".into()),
        system_fingerprint: None,
        http_status: Some(200),
        error: None,
        answer: Some("PROBE_OK".into()),
        first_answer_ms: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

/// A varied, realistic outcome: mostly fast successes, a slow tail, some failures of each kind.
fn random_outcome(rng: &mut StdRng, route: RouteId, started_at: DateTime<Utc>) -> ProbeOutcome {
    let kind = match rng.gen_range(0..10) {
        0..=5 => OutcomeKind::Probe,
        6..=7 => OutcomeKind::Throughput,
        _ => OutcomeKind::Passive,
    };
    // Sub-millisecond precision, as the probe client measures.
    let mut total_ms = 150.0 + rng.gen::<f64>().powi(3) * 4_000.0 + rng.gen_range(0.0..1.0);
    if rng.gen_ratio(1, 40) {
        total_ms += 20_000.0;
    }
    if rng.gen_ratio(1, 200) {
        total_ms = rng.gen_range(0.5..9.0); // underflow bucket
    }
    let mut o = outcome(route, kind, started_at, total_ms);
    o.tokens_per_second = (kind != OutcomeKind::Probe).then(|| rng.gen_range(5.0..120.0));
    o.verified = match kind {
        OutcomeKind::Passive => None,
        _ => Some(rng.gen_ratio(9, 10)),
    };
    if rng.gen_ratio(1, 8) {
        o.success = false;
        o.verified = None;
        o.answer = None;
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
    if rng.gen_ratio(1, 5) {
        o.ttfb_ms = None;
    }
    o
}

/// `started_at` as stored: millisecond precision.
fn stored(mut o: ProbeOutcome) -> ProbeOutcome {
    o.started_at = DateTime::from_timestamp_millis(o.started_at.timestamp_millis()).unwrap();
    o
}

fn raw_count(db: &TestDb) -> i64 {
    db.connect()
        .query_row("SELECT count(*) FROM outcomes", [], |r| r.get(0))
        .unwrap()
}

/// Every table, column and index, as the engine describes them.
fn schema(db: &TestDb) -> Vec<String> {
    let sql = match db.engine {
        Engine::Sqlite => {
            "SELECT sql FROM sqlite_master
             WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_stat%' ORDER BY name"
        }
        Engine::Postgres => {
            "SELECT 'CREATE TABLE ' || table_name || ' ' || column_name || ' ' || data_type
             FROM information_schema.columns WHERE table_schema = 'public'
             UNION ALL SELECT indexdef FROM pg_indexes WHERE schemaname = 'public'
             ORDER BY 1"
        }
    };
    let conn = db.connect();
    let mut stmt = conn.prepare_cached(sql).unwrap();
    let rows = stmt.query_map([], |r| r.get(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

/// Whether a table exists.
fn has_table(db: &TestDb, conn: &probeok::store::sql::Connection, name: &str) -> bool {
    let sql = match db.engine {
        Engine::Sqlite => "SELECT count(*) FROM sqlite_master WHERE name = ?1",
        Engine::Postgres => "SELECT count(*) FROM pg_tables WHERE tablename = ?1",
    };
    conn.query_row(sql, [name], |r| r.get::<_, i64>(0)).unwrap() == 1
}

on_both_engines! {
#[tokio::test]
async fn migrations_apply_to_an_empty_database_and_reopening_is_idempotent(db: &TestDb) {
    let store = db.open(opts());
    assert_eq!(store.engine(), db.engine);
    if db.engine == Engine::Sqlite {
        assert_eq!(store.path(), db.path());
    }
    store.close().await.unwrap();

    let conn = db.connect();
    assert_eq!(user_version(&conn).unwrap(), latest_version());
    if db.engine == Engine::Sqlite {
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }
    drop(conn);
    let before = schema(db);
    for name in ["outcomes", "rollups", "heartbeats", "probe_skips", "routes"] {
        assert!(
            before
                .iter()
                .any(|s| s.contains(&format!("CREATE TABLE {name}"))),
            "{name} missing"
        );
    }

    // Twice more: no error, same version, same schema.
    for _ in 0..2 {
        let store = db.open(opts());
        store.writer().check_writable().await.unwrap();
        store.close().await.unwrap();
    }
    let conn = db.connect();
    assert_eq!(user_version(&conn).unwrap(), latest_version());
    assert_eq!(schema(db), before);
}
}

on_both_engines! {
#[tokio::test]
async fn a_database_from_each_older_migration_upgrades_and_keeps_its_rows(first: &TestDb) {
    assert!(
        latest_version() >= 2,
        "the upgrade path needs two migrations"
    );
    for n in 1..latest_version() {
        let fresh;
        let db = if n == 1 {
            first
        } else {
            fresh = TestDb::new(first.engine);
            &fresh
        };
        {
            let mut conn = db.connect();
            migrate_to(&mut conn, n).unwrap();
            assert_eq!(user_version(&conn).unwrap(), n);
            if db.is_postgres() && n >= 27 {
                // From 0029_outcome_days on, a release's writer made the day's partition first.
                conn.execute_batch(
                    "CREATE TABLE outcomes_20260101 PARTITION OF outcomes
                         FOR VALUES FROM (1767225600000) TO (1767312000000)",
                )
                .unwrap();
            }
            // What an older release left behind.
            conn.execute_batch(
                "INSERT INTO routes (id, name) VALUES (1, 'prov/region-0/vendor/model-x');
                 INSERT INTO outcomes (route_id, kind, started_at_ms, success, total_ms,
                     tokens_estimated, answer)
                 VALUES (1, 'probe', 1767225600000, 1, 321.5, 0, 'PROBE_OK');",
            )
            .unwrap();
            assert_eq!(has_table(db, &conn, "probe_skips"), n >= 2);
        }
        let store = db.open(opts());
        let r = route(0);
        let t = at("2026-01-01T00:10:00Z");
        store
            .writer()
            .record_skip(&r, OutcomeKind::Probe, t)
            .await
            .unwrap();
        let reader = store.reader().unwrap();
        assert_eq!(reader.skips(&r, t).unwrap(), 1);
        let old = reader.recent_outcomes(&r, 10).unwrap();
        assert_eq!(old.len(), 1);
        assert_eq!(old[0].total_ms, 321.5);
        assert_eq!(old[0].started_at, at("2026-01-01T00:00:00Z"));
        drop(reader);
        store.close().await.unwrap();
        let conn = db.connect();
        assert_eq!(user_version(&conn).unwrap(), latest_version());
    }
}
}

on_both_engines! {
#[tokio::test]
async fn a_database_from_a_newer_build_is_refused(db: &TestDb) {
    db.open(opts()).close().await.unwrap();
    force_version(&db.connect(), latest_version() + 1).unwrap();
    assert!(matches!(
        db.try_open(opts()),
        Err(StoreError::SchemaTooNew { .. })
    ));
}
}

on_both_engines! {
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_from_many_tasks_all_land(db: &TestDb) {
    let store = db.open(opts());
    let t0 = at("2026-03-01T00:00:00Z");
    let mut tasks = Vec::new();
    for task in 0..50usize {
        let writer = store.writer();
        tasks.push(tokio::spawn(async move {
            for i in 0..200i64 {
                let t = t0 + chrono::Duration::seconds(i * 30);
                let o = outcome(route(task % 7), OutcomeKind::Probe, t, 100.0 + i as f64);
                writer.record(o).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(raw_count(db), 10_000);
    let reader = store.reader().unwrap();
    for g in Granularity::ALL {
        let total: u64 = (0..7)
            .map(|r| {
                reader
                    .summary(&route(r), g, t0, t0 + chrono::Duration::days(2), ALL_KINDS)
                    .unwrap()
                    .count
            })
            .sum();
        assert_eq!(total, 10_000, "{g:?}");
    }
    drop(reader);
    store.close().await.unwrap();
}
}

/// What a bucket should hold, computed straight from raw rows.
#[derive(Default)]
struct Expected {
    count: u64,
    successes: u64,
    good: u64,
    verified: u64,
    latency_sum_us: u64,
    ttfb_sum_us: u64,
    ttfb_count: u64,
    tps_sum: f64,
    tps_count: u64,
    latencies: Vec<f64>,
}

impl Expected {
    fn add(&mut self, o: &ProbeOutcome, threshold_ms: f64) {
        self.count += 1;
        self.verified += u64::from(o.verified == Some(true));
        if let Some(t) = o.tokens_per_second {
            self.tps_sum += t;
            self.tps_count += 1;
        }
        if o.success {
            self.successes += 1;
            self.good += u64::from(o.total_ms <= threshold_ms);
            self.latency_sum_us += (o.total_ms * 1000.0).round() as u64;
            if let Some(t) = o.ttfb_ms {
                self.ttfb_sum_us += (t * 1000.0).round() as u64;
                self.ttfb_count += 1;
            }
            self.latencies.push(o.total_ms);
        }
    }

    fn check(&mut self, got: &Rollup, what: &str) {
        assert_eq!(got.count, self.count, "{what}: count");
        assert_eq!(got.successes, self.successes, "{what}: successes");
        assert_eq!(got.good, self.good, "{what}: good");
        assert_eq!(got.verified, self.verified, "{what}: verified");
        assert_eq!(
            got.latency_sum_us, self.latency_sum_us,
            "{what}: latency sum"
        );
        assert_eq!(got.ttfb_sum_us, self.ttfb_sum_us, "{what}: ttfb sum");
        assert_eq!(got.ttfb_count, self.ttfb_count, "{what}: ttfb count");
        assert_eq!(got.tps_count, self.tps_count, "{what}: tps count");
        assert!(
            (got.tps_sum - self.tps_sum).abs() <= 1e-9 * self.tps_sum.max(1.0),
            "{what}: tps sum {} vs {}",
            got.tps_sum,
            self.tps_sum
        );
        self.latencies.sort_by(f64::total_cmp);
        for q in [0.5, 0.95, 0.99] {
            let est = got.percentile(q);
            if self.latencies.is_empty() {
                assert_eq!(est, None, "{what}");
                continue;
            }
            let n = self.latencies.len();
            let exact = self.latencies[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
            let est = est.unwrap();
            let (lo, hi) = bucket_bounds(bucket_index(exact));
            assert!(
                lo * (1.0 - 1e-9) <= est && est <= hi * (1.0 + 1e-9),
                "{what}: p{q}: estimate {est} outside [{lo}, {hi}) of exact {exact}"
            );
        }
    }
}

on_both_engines! {
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rollups_agree_with_raw_rows_across_a_restart(db: &TestDb) {
    let t0 = at("2026-03-01T22:13:00Z");
    let mut rng = StdRng::seed_from_u64(7);
    // ~3 days of outcomes over 3 routes, some arriving late (out of order).
    let mut all: Vec<ProbeOutcome> = (0..6000)
        .map(|i| {
            let jitter = rng.gen_range(0..20_000);
            let t = t0 + chrono::Duration::milliseconds(i * 40_000 + jitter);
            let r = route(rng.gen_range(0..3));
            random_outcome(&mut rng, r, t)
        })
        .collect();
    for i in (0..all.len()).step_by(37) {
        let j = rng.gen_range(0..all.len());
        all.swap(i, j);
    }
    let (first, second) = all.split_at(3500);

    let write = |store: Store, part: Vec<ProbeOutcome>| async move {
        // Concurrent writers, some single records, some batches.
        let mut tasks = Vec::new();
        for (n, chunk) in part.chunks(250).enumerate() {
            let writer = store.writer();
            let chunk = chunk.to_vec();
            tasks.push(tokio::spawn(async move {
                if n % 2 == 0 {
                    writer.record_many(chunk).await.unwrap();
                } else {
                    for o in chunk {
                        writer.record(o).await.unwrap();
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        store
    };
    let store = write(db.open(opts()), first.to_vec()).await;
    // Closing mid-stream leaves buckets half filled; the reopened writer must continue them.
    store.close().await.unwrap();
    let store = write(db.open(opts()), second.to_vec()).await;

    let reader = store.reader().unwrap();
    let threshold_ms = 2000.0;
    let since = t0 - chrono::Duration::days(1);
    let until = t0 + chrono::Duration::days(5);
    let mut checked = 0;
    for r in 0..3 {
        let r = route(r);
        for &kind in ALL_KINDS {
            let raw = reader.outcomes_since(&r, since, &[kind]).unwrap();
            assert!(raw.windows(2).all(|w| w[0].started_at <= w[1].started_at));
            for g in Granularity::ALL {
                let mut expected: BTreeMap<DateTime<Utc>, Expected> = BTreeMap::new();
                for o in &raw {
                    expected
                        .entry(g.bucket_start(o.started_at))
                        .or_default()
                        .add(o, threshold_ms);
                }
                let got = reader.rollups(&r, g, since, until, &[kind]).unwrap();
                assert_eq!(got.len(), expected.len(), "{r} {kind:?} {g:?}: buckets");
                for (rollup, (start, exp)) in got.iter().zip(expected.iter_mut()) {
                    assert_eq!(rollup.bucket_start, *start);
                    assert_eq!(rollup.kind, Some(kind));
                    assert_eq!(rollup.granularity, g);
                    exp.check(rollup, &format!("{r} {kind:?} {g:?} {start}"));
                    checked += 1;
                }
                // The whole range merged, at every granularity, equals the raw rows.
                let mut total = Expected::default();
                raw.iter().for_each(|o| total.add(o, threshold_ms));
                let summary = reader.summary(&r, g, since, until, &[kind]).unwrap();
                total.check(&summary, &format!("{r} {kind:?} {g:?} summary"));
            }
        }
        // Merged over all kinds, over one day's window from hourly rollups.
        let day = at("2026-03-02T00:00:00Z");
        let next = at("2026-03-03T00:00:00Z");
        let mut exp = Expected::default();
        reader
            .outcomes_since(&r, day, &[])
            .unwrap()
            .iter()
            .filter(|o| o.started_at < next)
            .for_each(|o| exp.add(o, threshold_ms));
        let hourly = reader
            .summary(&r, Granularity::Hour, day, next, &[])
            .unwrap();
        assert_eq!(hourly.kind, None);
        exp.check(&hourly, &format!("{r} day from hours"));
        let daily = reader
            .summary(&r, Granularity::Day, day, next, &[])
            .unwrap();
        assert_eq!(
            (daily.count, daily.latency_sum_us, daily.histogram.clone()),
            (
                hourly.count,
                hourly.latency_sum_us,
                hourly.histogram.clone()
            )
        );
        assert!(hourly.mean_ms().unwrap() > 0.0);
        assert!(hourly.good_ratio().unwrap() <= hourly.success_ratio().unwrap());
    }
    assert!(checked > 500, "only {checked} buckets checked");
    assert_eq!(raw_count(db), 6000);
    drop(reader);
    store.close().await.unwrap();
}
}

on_both_engines! {
#[tokio::test]
async fn retention_deletes_only_what_is_old(db: &TestDb) {
    let store = db.open(opts());
    let writer = store.writer();
    let now = at("2026-06-10T12:02:30Z");
    let hours = |h: i64| now - chrono::Duration::hours(h);
    let days = |d: i64| now - chrono::Duration::days(d);
    // retention_days = 14, rollup_retention_days = 400.
    let ages = [
        hours(1),
        hours(47),
        hours(49),
        days(13),
        days(15),
        days(30),
        days(399),
        days(401),
        days(500),
    ];
    for (i, &t) in ages.iter().enumerate() {
        for r in 0..2 {
            let kind = if i % 2 == 0 {
                OutcomeKind::Probe
            } else {
                OutcomeKind::Passive
            };
            writer
                .record(outcome(route(r), kind, t, 200.0))
                .await
                .unwrap();
            writer.record_skip(&route(r), kind, t).await.unwrap();
        }
    }
    writer.heartbeat("scheduler", days(900)).await.unwrap();

    let report = writer.retention_batched(now, 14, 400, 3).await.unwrap();
    // Raw rows and skips older than 14 days: 15d, 30d, 399d, 401d, 500d, × 2 routes.
    assert_eq!(report.outcomes, 10);
    assert_eq!(report.skips, 10);
    // 5-minute buckets older than 48 h: every age from 49 h on, × 2 routes.
    assert_eq!(report.rollups_five_minutes, 14);
    // Hourly and daily buckets older than 400 days: 401d and 500d, × 2 routes.
    assert_eq!(report.rollups_hour, 4);
    assert_eq!(report.rollups_day, 4);
    assert!(report.steps > 5, "small steps: {}", report.steps);

    let reader = store.reader().unwrap();
    for r in 0..2 {
        let r = route(r);
        let left: Vec<DateTime<Utc>> = reader
            .recent_outcomes(&r, 100)
            .unwrap()
            .into_iter()
            .map(|o| o.started_at)
            .collect();
        assert_eq!(left, vec![hours(1), hours(47), hours(49), days(13)]);
        assert_eq!(reader.skips(&r, days(10_000)).unwrap(), 4);
        let five = reader
            .rollups(&r, Granularity::FiveMinutes, days(1000), now, &[])
            .unwrap();
        assert_eq!(five.len(), 2);
        for g in [Granularity::Hour, Granularity::Day] {
            let kept: Vec<_> = reader
                .rollups(&r, g, days(1000), now + chrono::Duration::days(1), &[])
                .unwrap()
                .into_iter()
                .map(|x| x.bucket_start)
                .collect();
            let mut want: Vec<_> = ages[..7].iter().rev().map(|&t| g.bucket_start(t)).collect();
            want.dedup(); // 47 h and 49 h ago share a day
            assert_eq!(kept, want, "{g:?}");
        }
    }
    assert_eq!(
        reader.heartbeats().unwrap().len(),
        1,
        "heartbeats are not history"
    );

    // Nothing left to delete; writes keep working and land in their buckets.
    let again = writer.retention(now, 14, 400).await.unwrap();
    assert_eq!(again.total(), 0);
    writer
        .record(outcome(route(0), OutcomeKind::Probe, hours(1), 300.0))
        .await
        .unwrap();
    let s = reader
        .summary(
            &route(0),
            Granularity::Hour,
            hours(2),
            now,
            &[OutcomeKind::Probe],
        )
        .unwrap();
    assert_eq!(s.count, 2);
    assert_eq!(s.latency_sum_us, 500_000);
    drop(reader);
    store.close().await.unwrap();
}
}

on_both_engines! {
#[tokio::test]
async fn a_resolved_record_is_readable_at_once_from_a_fresh_reader(db: &TestDb) {
    let store = db.open(opts());
    let writer = store.writer();
    let r = route(1);
    let t = at("2026-03-01T10:00:00.123456789Z");
    let full = ProbeOutcome {
        route: r.clone(),
        kind: OutcomeKind::Throughput,
        started_at: t,
        success: false,
        attributed_to: None,
        verified: Some(false),
        ttfb_ms: Some(12.25),
        ttft_ms: Some(40.5),
        total_ms: 1234.567,
        output_tokens: Some(97),
        tokens_estimated: true,
        tokens_per_second: Some(55.5),
        model_reported: Some("vendor/model-x-0301".into()),
        system_fingerprint: Some("fp_abc".into()),
        http_status: Some(429),
        error: Some(ProbeError::RateLimited {
            retry_after_ms: Some(30_000),
            message: "too many requests".into(),
        }),
        answer: Some("1 2 3".into()),
        first_answer_ms: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    };
    let bare = ProbeOutcome {
        route: r.clone(),
        kind: OutcomeKind::Passive,
        started_at: t + chrono::Duration::seconds(1),
        success: false,
        attributed_to: None,
        verified: None,
        ttfb_ms: None,
        ttft_ms: None,
        total_ms: 0.0,
        output_tokens: None,
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: None,
        error: Some(ProbeError::Connect {
            message: "connection refused".into(),
        }),
        answer: None,
        first_answer_ms: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    };
    for o in [full.clone(), bare.clone()] {
        writer.record(o.clone()).await.unwrap();
        // A reader opened after the ack sees the row: acknowledged means committed.
        let latest = store.reader().unwrap().recent_outcomes(&r, 1).unwrap();
        assert_eq!(latest, vec![stored(o)]);
    }
    let reader = store.reader().unwrap();
    assert_eq!(
        reader.outcomes_since(&r, t, &[]).unwrap(),
        vec![stored(full.clone()), stored(bare.clone())]
    );
    assert_eq!(
        reader
            .outcomes_since(&r, t, &[OutcomeKind::Passive])
            .unwrap(),
        vec![stored(bare)]
    );
    assert!(reader.recent_outcomes(&route(9), 5).unwrap().is_empty());
    assert_eq!(reader.skips(&route(9), t).unwrap(), 0);
    assert!(reader
        .rollups(&route(9), Granularity::Hour, t, t, &[])
        .unwrap()
        .is_empty());
    drop(reader);
    store.close().await.unwrap();
}
}

on_both_engines! {
#[tokio::test]
async fn heartbeats_skips_and_writability(db: &TestDb) {
    let store = db.open(opts());
    let writer = store.writer();
    let t = at("2026-03-01T10:00:00Z");
    writer.heartbeat("scheduler", t).await.unwrap();
    writer.heartbeat("retention", t).await.unwrap();
    writer
        .heartbeat("scheduler", t + chrono::Duration::seconds(30))
        .await
        .unwrap();
    for s in 0..5 {
        writer
            .record_skip(
                &route(0),
                OutcomeKind::Probe,
                t + chrono::Duration::minutes(s),
            )
            .await
            .unwrap();
    }
    writer.check_writable().await.unwrap();
    let reader = store.reader().unwrap();
    assert_eq!(
        reader.heartbeats().unwrap(),
        vec![
            ("retention".to_owned(), t),
            ("scheduler".to_owned(), t + chrono::Duration::seconds(30)),
        ]
    );
    assert_eq!(reader.skips(&route(0), t).unwrap(), 5);
    assert_eq!(
        reader
            .skips(&route(0), t + chrono::Duration::minutes(3))
            .unwrap(),
        2
    );
    drop(reader);
    store.clone().close().await.unwrap();
    // Every handle sees the close; closing again is harmless.
    assert!(matches!(
        writer.check_writable().await,
        Err(StoreError::Closed)
    ));
    assert!(matches!(
        writer.heartbeat("x", t).await,
        Err(StoreError::Closed)
    ));
    store.close().await.unwrap();
}
}

on_both_engines! {
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn close_commits_what_was_queued_and_nothing_acknowledged_is_lost(db: &TestDb) {
    let store = db.open(opts());
    let t0 = Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap();
    // One write acknowledged before the close, so the count below never depends on how far
    // the spawned writers got on a loaded machine.
    store
        .writer()
        .record(outcome(
            route(0),
            OutcomeKind::Probe,
            t0 - chrono::Duration::seconds(1),
            50.0,
        ))
        .await
        .unwrap();
    let mut ok = 1;
    let mut tasks = Vec::new();
    for i in 0..2000i64 {
        let writer = store.writer();
        tasks.push(tokio::spawn(async move {
            let o = outcome(
                route(0),
                OutcomeKind::Probe,
                t0 + chrono::Duration::seconds(i),
                50.0,
            );
            writer.record(o).await
        }));
    }
    tokio::task::yield_now().await;
    store.close().await.unwrap();
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => ok += 1,
            Err(StoreError::Closed) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(ok > 0);
    assert_eq!(raw_count(db), ok);
}
}

on_both_engines! {
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_failing_write_does_not_fail_its_batch_or_skew_rollups(db: &TestDb) {
    let store = db.open(opts());
    // A trigger (a constraint on PostgreSQL) stands in for any per-row failure (constraint,
    // I/O) inside a batch.
    db.connect()
        .execute_batch(match db.engine {
            Engine::Sqlite => {
                "CREATE TRIGGER poison BEFORE INSERT ON outcomes WHEN NEW.answer = 'poison'
                 BEGIN SELECT RAISE(ABORT, 'poisoned'); END;"
            }
            Engine::Postgres => {
                "ALTER TABLE outcomes ADD CONSTRAINT poison
                 CHECK (answer IS DISTINCT FROM 'poison')"
            }
        })
        .unwrap();
    let t0 = at("2026-03-01T00:00:00Z");
    let mut tasks = Vec::new();
    for i in 0..400i64 {
        let writer = store.writer();
        tasks.push(tokio::spawn(async move {
            let mut o = outcome(
                route(0),
                OutcomeKind::Probe,
                t0 + chrono::Duration::seconds(i),
                100.0,
            );
            if i % 50 == 7 {
                o.answer = Some("poison".into());
            }
            (i % 50 == 7, writer.record(o).await)
        }));
    }
    for t in tasks {
        let (poisoned, result) = t.await.unwrap();
        assert_eq!(result.is_err(), poisoned, "{result:?}");
    }
    // Invalid values are refused before they reach SQLite.
    let nan = outcome(route(0), OutcomeKind::Probe, t0, f64::NAN);
    assert!(matches!(
        store.writer().record(nan).await,
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(raw_count(db), 392);
    let s = store
        .reader()
        .unwrap()
        .summary(
            &route(0),
            Granularity::FiveMinutes,
            t0,
            t0 + chrono::Duration::hours(1),
            &[],
        )
        .unwrap();
    assert_eq!(s.count, 392);
    assert_eq!(s.latency_sum_us, 392 * 100_000);
    store.close().await.unwrap();
}
}

/// Polls `f` until it holds, for at most 20 s.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sessions_lost_are_reopened_and_an_unreachable_database_is_reported() {
    let db = TestDb::new(Engine::Postgres);
    let name = db.pg_name().unwrap().to_owned();
    let store = db.open(opts());
    let t0 = at("2026-03-01T00:00:00Z");
    let w = store.writer();
    w.record(outcome(route(0), OutcomeKind::Probe, t0, 100.0))
        .await
        .unwrap();
    let admin = pg::admin();
    let kill = |admin: &probeok::store::sql::Connection| {
        let mut stmt = admin
            .prepare_cached(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = ?1 AND pid <> pg_backend_pid()",
            )
            .unwrap();
        for r in stmt.query_map([name.as_str()], |_| Ok(())).unwrap() {
            r.unwrap();
        }
    };
    // The server ends every session (a restart, a failover): the next write reconnects.
    kill(&admin);
    w.record(outcome(
        route(0),
        OutcomeKind::Probe,
        t0 + chrono::Duration::seconds(30),
        100.0,
    ))
    .await
    .unwrap();
    assert!(store.reachability().reachable());
    let reads = || {
        store
            .reader()
            .and_then(|r| r.recent_outcomes(&route(0), 10))
            .is_ok_and(|v| v.len() == 2)
    };
    eventually("readers get live sessions again", reads).await;

    // Unreachable for a while: the write waits, the store says why, and it lands once the
    // database is back.
    admin
        .execute_batch(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
        .unwrap();
    kill(&admin);
    let pending = tokio::spawn({
        let w = w.clone();
        async move {
            w.record(outcome(
                route(0),
                OutcomeKind::Probe,
                t0 + chrono::Duration::seconds(60),
                100.0,
            ))
            .await
        }
    });
    eventually("the store reports the database unreachable", || {
        !store.reachability().reachable()
    })
    .await;
    let why = store.reachability().last_error().unwrap();
    // It names the engine, whichever failure came last (a lost session or a refused connect).
    assert!(why.to_lowercase().contains("postgres"), "{why}");
    assert!(
        !why.contains("127.0.0.1:") || !why.contains('@'),
        "no URL in {why}"
    );
    admin
        .execute_batch(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        .unwrap();
    pending.await.unwrap().unwrap();
    assert!(store.reachability().reachable());
    store.close().await.unwrap();
}

/// A member that hangs in the middle of a write (`SIGSTOP`, a frozen VM) holds its locks until
/// the server ends its session: the store's sessions ask the server to end one that sits idle
/// inside a transaction, so another member's writes wait seconds, not as long as it hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_session_hung_inside_a_transaction_does_not_block_the_other_writers() {
    let db = TestDb::new(Engine::Postgres);
    let store = db.open(opts());
    let t0 = at("2026-03-01T00:00:00Z");
    let w = store.writer();
    w.record(outcome(route(0), OutcomeKind::Probe, t0, 100.0))
        .await
        .unwrap();
    // Another member's store session, stopped right after taking a lock the writer needs.
    let hung = db.connect();
    hung.execute_batch("BEGIN; LOCK TABLE outcomes IN SHARE ROW EXCLUSIVE MODE")
        .unwrap();
    let started = std::time::Instant::now();
    let write = w.record(outcome(
        route(0),
        OutcomeKind::Probe,
        t0 + chrono::Duration::seconds(30),
        100.0,
    ));
    tokio::time::timeout(Duration::from_secs(60), write)
        .await
        .expect("the write waited for the hung session for a minute")
        .unwrap();
    let waited = started.elapsed();
    eprintln!("the write waited {waited:?} for a session hung inside a transaction");
    assert!(
        waited >= probeok::store::sql::IDLE_IN_TRANSACTION - Duration::from_millis(500),
        "{waited:?}: the lock was not held, so nothing was shown"
    );
    // The hung session was ended, its transaction rolled back.
    assert!(hung.execute_batch("SELECT 1").is_err());
    store.close().await.unwrap();
}

/// Two processes writing one PostgreSQL database (a monitor pair, a proxy): each writer keeps
/// the buckets it fills in memory, so each must notice the other's writes to the same
/// buckets, or its next upsert would put back its own stale counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_on_one_postgresql_database_keep_the_shared_rollups_exact() {
    let db = TestDb::new(Engine::Postgres);
    let a = db.open(opts());
    let b = db.open(opts());
    let r = route(0);
    let t0 = at("2026-03-01T10:00:00Z");
    let mut n = 0i64;
    let mut expected = 0u64;
    // Alternating batches of different sizes, every one in the same 5-minute bucket.
    for (store, count) in [
        (&a, 10),
        (&b, 7),
        (&a, 5),
        (&b, 3),
        (&a, 1),
        (&a, 2),
        (&b, 4),
    ] {
        let batch: Vec<ProbeOutcome> = (0..count)
            .map(|_| {
                n += 1;
                let mut o = outcome(
                    r.clone(),
                    OutcomeKind::Probe,
                    t0 + chrono::Duration::seconds(n),
                    100.0 + n as f64,
                );
                o.success = n % 4 != 0;
                o
            })
            .collect();
        expected += count;
        store.writer().record_many(batch).await.unwrap();
    }
    let reader = b.reader().unwrap();
    let raw = reader.recent_outcomes(&r, 1000).unwrap();
    assert_eq!(raw.len() as u64, expected);
    let successes = raw.iter().filter(|o| o.success).count() as u64;
    for g in Granularity::ALL {
        let s = reader
            .summary(&r, g, t0, t0 + chrono::Duration::hours(1), ALL_KINDS)
            .unwrap();
        assert_eq!((s.count, s.successes), (expected, successes), "{g:?}");
        let latency: f64 = raw.iter().filter(|o| o.success).map(|o| o.total_ms).sum();
        assert!((s.latency_sum_ms() - latency).abs() < 0.01, "{g:?}");
    }
    drop(reader);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Metered requests are found by time through an index ordered by time, failed requests'
/// trace ids through one that holds traced rows only, attempts by their reason through one
/// that holds only attempts the request moved on from: a plain request's metering rows pay for
/// no index entry of those two.
#[tokio::test]
async fn metered_requests_are_found_by_time_through_their_indexes() {
    let db = TestDb::new(Engine::Sqlite);
    db.open(opts()).close().await.unwrap();
    let conn = rusqlite::Connection::open(db.path()).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL
             AND tbl_name = 'proxy_requests' ORDER BY name",
        )
        .unwrap();
    let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
    let indexes: Vec<String> = rows.map(Result::unwrap).collect();
    assert_eq!(indexes, ["proxy_requests_at", "proxy_requests_traced"]);
    for (sql, index) in [
        (
            "SELECT id FROM proxy_requests WHERE started_at_ms < 5
             ORDER BY started_at_ms LIMIT 10",
            "proxy_requests_at",
        ),
        (
            "SELECT id FROM proxy_requests WHERE started_at_ms >= 1
             ORDER BY started_at_ms DESC, id DESC LIMIT 50",
            "proxy_requests_at",
        ),
        (
            "SELECT trace_id FROM proxy_requests WHERE trace_id IS NOT NULL
             AND started_at_ms >= 1 AND started_at_ms <= 9
             ORDER BY started_at_ms DESC, id DESC LIMIT 50",
            "proxy_requests_traced",
        ),
        (
            "SELECT request_pk FROM proxy_attempts WHERE reason = 'http_503'",
            "proxy_attempts_reason",
        ),
    ] {
        let mut plan = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = plan.query_map([], |r| r.get::<_, String>(3)).unwrap();
        let steps = rows.map(Result::unwrap).collect::<Vec<_>>().join("; ");
        assert!(steps.contains(&format!("INDEX {index}")), "{sql}: {steps}");
        assert!(!steps.contains("TEMP B-TREE"), "{sql}: {steps}");
    }
}

/// A monitor at steady state — every day as many rows written as expire — keeps a file of
/// a constant size: the pages retention frees are reused by the next day's rows, so the
/// file does not grow with the days it has run.
#[tokio::test]
async fn at_steady_state_the_sqlite_file_stops_growing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("steady.db");
    let store = Store::open(&path, opts()).unwrap();
    let writer = store.writer();
    let start = at("2026-06-01T00:00:00Z");
    let pages = || {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let n = |p: &str| conn.query_row(p, [], |r| r.get::<_, i64>(0)).unwrap();
        (n("PRAGMA page_count"), n("PRAGMA freelist_count"))
    };
    let mut sizes = Vec::new();
    for day in 0..8i64 {
        // 20 routes probed every 5 minutes: 5,760 outcomes a day.
        let outcomes: Vec<_> = (0..288i64)
            .flat_map(|i| {
                let when = start + chrono::Duration::days(day) + chrono::Duration::minutes(5 * i);
                (0..20).map(move |r| outcome(route(r), OutcomeKind::Probe, when, 300.0))
            })
            .collect();
        writer.record_many(outcomes).await.unwrap();
        // Two days of raw outcomes and of rollups kept (rollups kept longer would grow the
        // file by their own, smaller, daily share), pruned at the end of each day.
        let end = start + chrono::Duration::days(day + 1);
        writer.retention(end, 2, 2).await.unwrap();
        sizes.push(pages());
    }
    let (steady, _) = sizes[3];
    let (last, free) = sizes[7];
    assert!(
        last <= steady + steady / 20,
        "the file grew from {steady} to {last} pages at steady state: {sizes:?}"
    );
    assert!(
        free < steady / 2,
        "freed pages are reused, not piled up: {sizes:?}"
    );
}
