//! `probeok migrate-store`: a SQLite store with rows in many tables copied into PostgreSQL by
//! the binary, verified by counts, read back through the store, and written to afterwards
//! (the copied ids do not collide with new ones); a non-empty target is refused unless
//! `--replace`.

use crate::common::pg;

use std::process::Command;

use chrono::{DateTime, Duration, Utc};
use probeok::probe::outcome::{OutcomeKind, ProbeOutcome};
use probeok::records::switch::{Action, SwitchRecord};
use probeok::route::RouteId;
use probeok::store::alerts::{AlertOp, NewEntry};
use probeok::store::{
    AttemptRecord, Granularity, RequestFilter, RequestRecord, Store, StoreLocation, StoreOptions,
};

const VAR: &str = "PROBEOK_MIGRATE_TARGET_URL";

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).unwrap()
}

fn outcome(route: &RouteId, i: i64) -> ProbeOutcome {
    ProbeOutcome {
        route: route.clone(),
        kind: if i % 3 == 0 {
            OutcomeKind::Passive
        } else {
            OutcomeKind::Probe
        },
        started_at: t0() + Duration::seconds(i * 30),
        success: i % 7 != 0,
        attributed_to: None,
        verified: Some(i % 7 != 0),
        ttfb_ms: Some(80.0 + i as f64),
        ttft_ms: None,
        total_ms: 300.0 + (i % 50) as f64 * 10.25,
        output_tokens: Some(3),
        tokens_estimated: false,
        tokens_per_second: Some(40.0),
        model_reported: Some("m-2026".into()),
        system_fingerprint: None,
        http_status: Some(200),
        error: None,
        answer: Some("PROBE_OK".into()),
        first_answer_ms: Some(140.5),
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("probeok.toml");
    std::fs::write(
        &path,
        r#"
[[provider]]
id = "sim"
kind = "openai"
api_key_env = "PROBEOK_TEST_UNSET_KEY"
  [[provider.region]]
  id = "r1"
  base_url = "http://127.0.0.1:1/v1"

[[route]]
provider = "sim"
region = "r1"
model = "sim-large"
serves = "chat"
tier = "primary"
weight = 100
"#,
    )
    .unwrap();
    path
}

fn migrate(
    config: &std::path::Path,
    from: &std::path::Path,
    url: &str,
    replace: bool,
) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_probeok"));
    cmd.env_remove("PROBEOK_CONFIG")
        .env("RUST_LOG", "warn")
        .env(VAR, url)
        .args(["migrate-store", "--config"])
        .arg(config)
        .arg("--from")
        .arg(from)
        .args(["--to-env", VAR]);
    if replace {
        cmd.arg("--replace");
    }
    cmd.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_store_moves_into_postgres_with_every_row_counted() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("probeok.db");
    let routes = [
        RouteId::new("sim", "r1", "sim-large"),
        RouteId::new("sim", "r2", "sim-large"),
    ];
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let w = store.writer();
    let batch: Vec<ProbeOutcome> = (0..2500)
        .map(|i| outcome(&routes[(i % 2) as usize], i))
        .collect();
    w.record_many(batch).await.unwrap();
    w.record_skip(&routes[0], OutcomeKind::Probe, t0())
        .await
        .unwrap();
    w.heartbeat("scheduler", t0()).await.unwrap();
    let entries = (0..3)
        .map(|i| NewEntry {
            dedup_key: format!("k{i}#ops"),
            channel: "ops".into(),
            message: "{}".into(),
            created_at: t0(),
        })
        .collect();
    w.alert(AlertOp::Enqueue {
        entries,
        firing: vec![],
        resolved: vec![],
    })
    .await
    .unwrap();
    let request = RequestRecord {
        request_id: "req-1".into(),
        serves: "chat".into(),
        started_at: t0(),
        route: Some(routes[0].to_string()),
        outcome: "ok".into(),
        status: 200,
        stream: false,
        fallback_reason: None,
        prompt_tokens: Some(10),
        completion_tokens: Some(2),
        cost: Some(0.001),
        currency: Some("USD".into()),
        latency_ms: 320.0,
        attempts: vec![AttemptRecord {
            n: 1,
            route: routes[0].to_string(),
            reason: None,
            status_class: "2xx".into(),
            status: Some(200),
            ttfb_ms: Some(90.0),
            latency_ms: 320.0,
            prompt_tokens: Some(10),
            completion_tokens: Some(2),
            cost: Some(0.001),
            outcome: "ok".into(),
        }],
        contract: None,
        trace_id: None,
        client: None,
    };
    w.record_request(request.clone()).await.unwrap();
    let switch = SwitchRecord {
        serves: "chat".into(),
        action: Action::Blocked,
        at: t0(),
        trigger: "budget".into(),
        from: vec![routes[0].clone()],
        to: vec![],
        automatic: true,
        dwell_until: None,
        ratio: None,
        episode: None,
        text: "refused".into(),
    };
    w.record_switch(switch).await.unwrap();
    let until = t0() + Duration::days(1);
    let before = store
        .reader()
        .unwrap()
        .summary(&routes[0], Granularity::Hour, t0(), until, &[])
        .unwrap();
    store.close().await.unwrap();

    let target = pg::fresh_database();
    let cfg = config(dir.path());
    let out = migrate(&cfg, &db, target.url.expose(), false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("counts match"), "{stdout}");
    let line = |table: &str| -> Vec<u64> {
        let l = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(table))
            .unwrap_or_else(|| panic!("{table}: {stdout}"));
        l.split_whitespace()
            .skip(1)
            .map(|n| n.parse().unwrap())
            .collect()
    };
    assert_eq!(line("outcomes"), [2500, 2500]);
    assert_eq!(line("routes"), [2, 2]);
    assert_eq!(line("alert_outbox"), [3, 3]);
    assert_eq!(line("proxy_attempts"), [1, 1]);
    assert_eq!(line("switch_events"), [1, 1]);
    assert!(line("rollups")[0] > 0);
    assert!(!stdout.contains(target.url.expose()) && !stderr.contains(target.url.expose()));

    // The PostgreSQL store reads what SQLite held, and takes new rows after the copied ids.
    let pg = Store::open_at(
        &StoreLocation::Postgres(target.url.clone()),
        StoreOptions::default(),
    )
    .unwrap();
    let r = pg.reader().unwrap();
    assert_eq!(
        r.summary(&routes[0], Granularity::Hour, t0(), until, &[])
            .unwrap(),
        before
    );
    assert_eq!(
        r.recent_outcomes(&routes[1], 1).unwrap()[0],
        outcome(&routes[1], 2499)
    );
    assert_eq!(
        r.proxy_requests(&RequestFilter {
            limit: 5,
            ..Default::default()
        })
        .unwrap(),
        vec![request.clone()]
    );
    let new_route = RouteId::new("sim", "r3", "sim-large");
    pg.writer().record(outcome(&new_route, 1)).await.unwrap();
    pg.writer()
        .record_request(RequestRecord {
            request_id: "req-2".into(),
            ..request
        })
        .await
        .unwrap();
    assert_eq!(r.recent_outcomes(&new_route, 5).unwrap().len(), 1);
    drop(r);
    pg.close().await.unwrap();

    // Again: the target has rows now.
    let again = migrate(&cfg, &db, target.url.expose(), false);
    assert_ne!(again.status.code(), Some(0));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("not empty") && err.contains("--replace"),
        "{err}"
    );
    let replaced = migrate(&cfg, &db, target.url.expose(), true);
    let stdout = String::from_utf8_lossy(&replaced.stdout);
    assert_eq!(
        replaced.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&replaced.stderr)
    );
    assert!(stdout.contains("counts match"), "{stdout}");
    assert_eq!(line_of(&stdout, "routes"), [2, 2], "replaced, not added to");

    // Not a PostgreSQL URL: refused, naming the variable only.
    let bad = migrate(&cfg, &db, "probeok.db", false);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains(VAR));
}

fn line_of(stdout: &str, table: &str) -> Vec<u64> {
    let l = stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(table))
        .unwrap();
    l.split_whitespace()
        .skip(1)
        .map(|n| n.parse().unwrap())
        .collect()
}
