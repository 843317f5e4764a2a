//! Detection's tables on real databases (a SQLite file and a PostgreSQL database, every test
//! on both): migration 3 on top of a version-2 database, route states, transitions and
//! incidents round-trip, and a transition with its incident and the route's state land in one
//! transaction (all or nothing).

use crate::common::pg;
use crate::on_both_engines;

use chrono::{DateTime, TimeZone, Utc};
use pg::TestDb;
use probeok::config::DetectionConfig;
use probeok::health::{Baseline, Detector, RouteHealth, State, Transition};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;
use probeok::store::sql::Engine;
use probeok::store::{latest_version, migrate_to, user_version, StoreOptions};

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 6, 30, 0).unwrap()
}

fn at(s: i64) -> DateTime<Utc> {
    t0() + chrono::Duration::seconds(s)
}

fn route() -> RouteId {
    RouteId::new("qwen", "cn-beijing", "qwen/max")
}

fn probe(route: &RouteId, when: DateTime<Utc>, ok: bool) -> ProbeOutcome {
    ProbeOutcome {
        route: route.clone(),
        kind: OutcomeKind::Probe,
        started_at: when,
        success: ok,
        attributed_to: None,
        verified: ok.then_some(true),
        ttfb_ms: Some(150.0),
        ttft_ms: Some(300.0),
        total_ms: 1100.0,
        output_tokens: Some(3),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: Some(if ok { 200 } else { 503 }),
        error: (!ok).then(|| ProbeError::Http {
            status: 503,
            message: "overloaded".into(),
        }),
        answer: ok.then(|| "PROBE_OK".into()),
        first_answer_ms: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

/// Drives the pure detector through an outage and its recovery: every transition with the
/// route's state right after it (what the service stores).
fn outage_and_recovery() -> Vec<(Transition, RouteHealth)> {
    let cfg = DetectionConfig::default();
    let det = Detector::new(&cfg);
    let r = route();
    let mut h = det.route(r.clone(), at(0));
    let mut b = Baseline::new(r.clone(), &cfg);
    let mut out = Vec::new();
    let mut feed = |h: &mut RouteHealth, o: ProbeOutcome, now| {
        if let Some(t) = det.ingest(h, &mut b, &o, now) {
            out.push((t, h.clone()));
        }
    };
    for s in [0, 30, 60] {
        feed(&mut h, probe(&r, at(s), false), at(s));
    }
    for s in (90..=1200).step_by(30) {
        feed(&mut h, probe(&r, at(s), true), at(s));
    }
    out
}

on_both_engines! {
#[tokio::test]
async fn migration_3_applies_on_top_of_a_version_2_database(db: &TestDb) {
    assert!(latest_version() >= 3);
    {
        let mut conn = db.connect();
        migrate_to(&mut conn, 2).unwrap();
        conn.execute(
            "INSERT INTO routes (id, name) VALUES (7, ?1)",
            [route().as_str()],
        )
        .unwrap();
    }
    let store = db.open(StoreOptions::default());
    let (t, h) = outage_and_recovery().remove(0);
    store
        .writer()
        .record_transition(&t, None, &h)
        .await
        .unwrap();
    store.close().await.unwrap();

    let conn = db.connect();
    assert_eq!(user_version(&conn).unwrap(), latest_version());
    // The route kept its interned id from the older release.
    let route_id: i64 = conn
        .query_row("SELECT route_id FROM transitions", [], |r| r.get(0))
        .unwrap();
    assert_eq!(route_id, 7);
    for table in ["route_health", "transitions", "incidents"] {
        let sql = match db.engine {
            Engine::Sqlite => "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            Engine::Postgres => "SELECT count(*) FROM pg_tables WHERE tablename = ?1",
        };
        let n: i64 = conn.query_row(sql, [table], |r| r.get(0)).unwrap();
        assert_eq!(n, 1, "{table}");
    }
}
}

on_both_engines! {
#[tokio::test]
async fn states_transitions_and_incidents_round_trip(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let steps = outage_and_recovery();
    let kinds: Vec<(State, State)> = steps.iter().map(|(t, _)| (t.from, t.to)).collect();
    assert_eq!(
        kinds,
        [
            (State::Unknown, State::Warning),
            (State::Warning, State::Degraded),
            (State::Degraded, State::Unknown),
            (State::Unknown, State::Normal),
        ]
    );
    for (t, h) in &steps {
        let id = t.incident_id.as_deref();
        let incident = id.and_then(|id| {
            h.incident()
                .filter(|i| i.id == id)
                .or(h.last_closed().filter(|i| i.id == id))
        });
        w.record_transition(t, incident, h).await.unwrap();
    }
    let last = steps.last().unwrap().1.clone();
    w.save_health(std::slice::from_ref(&last), at(1200))
        .await
        .unwrap();
    store.close().await.unwrap();

    // Reopened: everything reads back exactly.
    let store = db.open(StoreOptions::default());
    let reader = store.reader().unwrap();
    let states = reader.route_health_all::<RouteHealth>().unwrap();
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].route, route());
    assert_eq!(states[0].health, last);
    assert_eq!(states[0].updated_at, at(1200));

    let ts = reader.transitions(&route(), at(0), 10).unwrap();
    let expected: Vec<Transition> = steps.iter().rev().map(|(t, _)| t.clone()).collect();
    assert_eq!(ts, expected, "newest first, evidence included");
    assert_eq!(reader.transitions(&route(), at(0), 1).unwrap().len(), 1);
    assert!(reader
        .transitions(&RouteId::new("x", "y", "z"), at(0), 10)
        .unwrap()
        .is_empty());

    let closed = last.last_closed().unwrap().clone();
    let incidents = reader.incidents(Some(&route()), at(0), 10).unwrap();
    assert_eq!(incidents.len(), 1);
    let i = &incidents[0];
    assert_eq!(i.id, closed.id);
    assert_eq!(i.peak, State::Degraded);
    assert_eq!(i.closed_at, closed.closed_at);
    assert_eq!(i.failure_mode, closed.failure_mode);
    // Its transitions come from their table: the opening and the closing one, oldest first.
    assert_eq!(i.transitions, closed.transitions);
    assert_eq!(i.transitions.len(), 2);
    assert_eq!(reader.incident(&closed.id).unwrap().as_ref(), Some(i));
    assert_eq!(reader.incident("nope").unwrap(), None);
    assert_eq!(reader.incidents(None, at(0), 10).unwrap(), incidents);
    // Closed before `since`: not listed.
    let after = closed.closed_at.unwrap() + chrono::Duration::seconds(1);
    assert!(reader.incidents(None, after, 10).unwrap().is_empty());
    drop(reader);
    store.close().await.unwrap();
}
}

on_both_engines! {
#[tokio::test]
async fn a_transition_its_incident_and_the_state_commit_together(db: &TestDb) {
    let steps = outage_and_recovery();
    let (degraded, h) = &steps[1];
    let incident = h.incident().unwrap();

    // Together: the transition that opened the incident and the incident itself.
    let store = db.open(StoreOptions::default());
    store
        .writer()
        .record_transition(degraded, Some(incident), h)
        .await
        .unwrap();
    {
        let reader = store.reader().unwrap();
        let stored = reader.incident(&incident.id).unwrap().unwrap();
        assert_eq!(stored.closed_at, None);
        assert_eq!(stored.transitions, vec![degraded.clone()]);
        assert_eq!(
            reader.route_health_all::<RouteHealth>().unwrap()[0].health,
            *h
        );
    }
    store.close().await.unwrap();

    // All or nothing: when the incident cannot be written, neither the transition nor the
    // state is — and a write queued beside it in the same batch still commits.
    let db = TestDb::new(db.engine);
    db.open(StoreOptions::default()).close().await.unwrap();
    db.connect()
        .execute_batch(match db.engine {
            Engine::Sqlite => {
                "CREATE TRIGGER no_incidents BEFORE INSERT ON incidents
                 BEGIN SELECT RAISE(ABORT, 'incidents refused'); END;"
            }
            Engine::Postgres => "ALTER TABLE incidents ADD CONSTRAINT no_incidents CHECK (false)",
        })
        .unwrap();
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let other = RouteId::new("deepseek", "cn", "v3");
    let fresh = Detector::new(&DetectionConfig::default()).route(other.clone(), at(0));
    let (failed, saved) = tokio::join!(
        w.record_transition(degraded, Some(incident), h),
        w.save_health(std::slice::from_ref(&fresh), at(5)),
    );
    assert!(failed.is_err(), "the incident insert must fail");
    saved.unwrap();
    let reader = store.reader().unwrap();
    assert!(reader.transitions(&route(), at(0), 10).unwrap().is_empty());
    assert!(reader.incident(&incident.id).unwrap().is_none());
    let states = reader.route_health_all::<RouteHealth>().unwrap();
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].route, other);
    drop(reader);
    store.close().await.unwrap();
}
}
