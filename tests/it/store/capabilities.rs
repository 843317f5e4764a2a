//! The capability probes' table (`capability_results`), on both engines: results written in
//! order, the latest per route and capability, 7-day tallies, and rows past retention trimmed
//! by later writes.

use crate::common::pg;
use crate::on_both_engines;

use chrono::{DateTime, TimeDelta, Utc};
use pg::TestDb;
use probeok::store::capabilities::{CapabilityOp, CapabilityRow, CapabilityTally};
use probeok::store::StoreOptions;

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).unwrap()
}

fn row(route: &str, cap: &str, at: DateTime<Utc>, error: Option<&str>) -> CapabilityRow {
    CapabilityRow {
        route: route.into(),
        capability: cap.into(),
        at,
        ok: error.is_none(),
        latency_ms: 420,
        error: error.map(str::to_owned),
    }
}

on_both_engines! {
#[tokio::test]
async fn capability_results_keep_the_latest_tallies_and_retention(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let gpt = "openai/us/gpt-4o";
    let claude = "anthropic/us/claude-sonnet-4-5";
    let keep = |at: DateTime<Utc>| at - TimeDelta::days(14);
    let mut rows = Vec::new();
    // 20 days of the tools probe on gpt-4o every day, failing on the last day.
    for d in 0..20 {
        let at = t0() + TimeDelta::days(d);
        let error = (d == 19).then_some("tool call arguments are not JSON: {\"token\": PROBE");
        rows.push(row(gpt, "tools", at, error));
    }
    rows.push(row(gpt, "json_schema", t0() + TimeDelta::days(19), None));
    rows.push(row(claude, "tools", t0() + TimeDelta::days(18), None));
    for r in rows {
        let at = r.at;
        w.capability(CapabilityOp { row: r, keep_since: keep(at) }).await.unwrap();
    }
    let reader = store.reader().unwrap();
    let latest = reader.capability_latest().unwrap();
    assert_eq!(
        latest,
        vec![
            row(claude, "tools", t0() + TimeDelta::days(18), None),
            row(gpt, "json_schema", t0() + TimeDelta::days(19), None),
            row(
                gpt,
                "tools",
                t0() + TimeDelta::days(19),
                Some("tool call arguments are not JSON: {\"token\": PROBE")
            ),
        ]
    );
    // The last 7 days (days 13..=19): 6 of 7 tools probes succeeded.
    let since = t0() + TimeDelta::days(19) - TimeDelta::days(7) + TimeDelta::hours(1);
    let tallies = reader.capability_tallies(since).unwrap();
    assert_eq!(
        tallies,
        vec![
            CapabilityTally { route: claude.into(), capability: "tools".into(), ok: 1, total: 1 },
            CapabilityTally { route: gpt.into(), capability: "json_schema".into(), ok: 1, total: 1 },
            CapabilityTally { route: gpt.into(), capability: "tools".into(), ok: 6, total: 7 },
        ]
    );
    // Kept for 14 days: the rows of days 0..5 went as later rows were written.
    let all = reader.capability_tallies(t0() - TimeDelta::days(1)).unwrap();
    let tools = all.iter().find(|t| t.route == gpt && t.capability == "tools").unwrap();
    assert_eq!(tools.total, 15, "{all:?}");
}
}

on_both_engines! {
#[tokio::test]
async fn the_long_prompt_baseline_reads_the_last_good_ttfts(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let gpt = "openai/us/gpt-4o";
    let claude = "anthropic/us/claude-sonnet-4-5";
    let keep = t0() - TimeDelta::days(30);
    // Ten daily long prompts on gpt-4o (TTFT 1000 + day ms); day 8 slow (ok with a note), day
    // 9 wrong (not ok); two on claude; a tools probe that is not a long prompt.
    for d in 0..10i64 {
        let mut r = row(gpt, "long_prompt", t0() + TimeDelta::days(d), None);
        r.latency_ms = 1_000 + u64::try_from(d).unwrap();
        if d == 8 {
            r.error = Some("ttft 5000 ms > 2000 ms".into());
        }
        if d == 9 {
            r.ok = false;
            r.error = Some("the answer lacks the code word".into());
        }
        w.capability(CapabilityOp { row: r, keep_since: keep }).await.unwrap();
    }
    for d in 0..2i64 {
        let mut r = row(claude, "long_prompt", t0() + TimeDelta::days(d), None);
        r.latency_ms = 700;
        w.capability(CapabilityOp { row: r, keep_since: keep }).await.unwrap();
    }
    w.capability(CapabilityOp { row: row(claude, "tools", t0(), None), keep_since: keep })
        .await
        .unwrap();
    let reader = store.reader().unwrap();
    let got = reader.capability_recent_good("long_prompt", 7).unwrap();
    assert_eq!(
        got,
        vec![
            (claude.to_owned(), vec![700, 700]),
            (gpt.to_owned(), vec![1_001, 1_002, 1_003, 1_004, 1_005, 1_006, 1_007]),
        ]
    );
}
}
