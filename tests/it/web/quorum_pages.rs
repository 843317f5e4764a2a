//! The status page names what the quorum means, in both languages: a vantage's finding names
//! its route(s) and vantage(s) (never as providers), with the right plural; an active
//! incident without a failure mode leaves no dangling separator; the quorum's reasons read in
//! Chinese on the Chinese page.

use crate::common;

use common::app::{at, id, normal, snapshot, Harness};
use probeok::health::{Finding, FindingKind, IncidentSummary, Reason, State};

const A: &str = "qwen/cn/qwen-max";
const B: &str = "qwen/cn/qwen-turbo";
const C: &str = "openai/us-east/gpt-4o";

const ROUTES: &[common::app::Spec<'static>] = &[
    common::app::Spec::new("qwen", "cn", "qwen-max")
        .serves("chat-main")
        .weight(50),
    common::app::Spec::new("qwen", "cn", "qwen-turbo")
        .serves("chat-lite")
        .weight(50),
    common::app::Spec::new("openai", "us-east", "gpt-4o")
        .serves("chat-main")
        .backup()
        .weight(50),
];

fn now() -> chrono::DateTime<chrono::Utc> {
    at("2026-12-05T08:20:00Z")
}

/// The page in `lang` with these findings, `C` DEGRADED in an incident with no failure mode
/// (reason `reason_code`/`reason_text`), the others NORMAL by quorum.
async fn page(lang: &str, findings: Vec<Finding>) -> String {
    let h = Harness::new(ROUTES, now()).await;
    let since = at("2026-12-05T08:00:00Z");
    let mut a = normal(A, since);
    a.reason = Some(Reason::new(
        "quorum_normal",
        "2 of 2 vantages (local, demo-edge) see NORMAL",
    ));
    let mut c = normal(C, since);
    c.state = State::Degraded;
    c.judged = State::Degraded;
    c.success_ratio = Some(0.4);
    c.reason = Some(Reason::new(
        "quorum",
        "2 of 3 vantages (local, demo-edge) see DEGRADED",
    ));
    c.incident = Some(IncidentSummary {
        id: format!("{C}@2026-12-05T08:13:00Z"),
        opened_at: at("2026-12-05T08:13:00Z"),
        peak: State::Degraded,
        failure_mode: None,
    });
    let mut snap = snapshot(now(), vec![a, normal(B, since), c]);
    snap.findings = findings;
    h.publish(snap);
    let s = h.serve().await;
    let body = reqwest::get(s.url(&format!("/?lang={lang}")))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    h.shutdown.cancel();
    body
}

fn local(routes: &[&str], vantages: &[&str]) -> Finding {
    Finding {
        kind: FindingKind::VantageLocal,
        routes: routes.iter().map(|r| id(r)).collect(),
        providers: vantages.iter().map(|v| (*v).to_owned()).collect(),
        code: "vantage_local".into(),
        text: String::new(),
    }
}

#[tokio::test]
async fn a_vantage_finding_names_its_route_and_vantage_in_english() {
    let body = page("en", vec![local(&[A], &["demo-edge"])]).await;
    assert!(
        body.contains(&format!("(vantage demo-edge; route {A})")),
        "{body}"
    );
    assert!(!body.contains("providers: demo-edge"), "{body}");
    assert!(!body.contains("1 routes"), "{body}");
    let body = page("en", vec![local(&[A, B], &["demo-edge", "cn-beijing"])]).await;
    assert!(
        body.contains(&format!(
            "(vantages demo-edge, cn-beijing; routes {A}, {B})"
        )),
        "{body}"
    );
}

#[tokio::test]
async fn a_vantage_finding_names_its_route_and_vantage_in_chinese() {
    let body = page("zh", vec![local(&[A], &["demo-edge"])]).await;
    assert!(
        body.contains(&format!("（探测点：demo-edge；线路：{A}）")),
        "{body}"
    );
    assert!(!body.contains("供应商：demo-edge"), "{body}");
    let body = page("zh", vec![local(&[A, B], &["demo-edge", "cn-beijing"])]).await;
    assert!(
        body.contains(&format!(
            "（探测点：demo-edge、cn-beijing；线路：{A}、{B}）"
        )),
        "{body}"
    );
}

#[tokio::test]
async fn an_incident_without_a_failure_mode_leaves_no_dangling_separator() {
    for lang in ["en", "zh"] {
        let body = page(lang, Vec::new()).await;
        assert!(body.contains(C), "{body}");
        assert!(!body.contains("— ·"), "{lang}: {body}");
        assert!(!body.contains("—  ·"), "{lang}: {body}");
    }
}

#[tokio::test]
async fn the_quorums_reasons_read_in_both_languages() {
    let body = page("en", Vec::new()).await;
    assert!(
        body.contains("2 of 3 vantages (local, demo-edge) see DEGRADED"),
        "{body}"
    );
    let body = page("zh", Vec::new()).await;
    assert!(
        !body.contains("vantages (local"),
        "no English quorum sentence: {body}"
    );
    assert!(
        body.contains("3 个探测点中有 2 个（local、demo-edge）看到该线路异常"),
        "{body}"
    );
}
