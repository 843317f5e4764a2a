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
