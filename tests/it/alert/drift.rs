//! Drift findings reach the alert engine: the forwarder turns a drift snapshot change into
//! `HealthEvent::DriftFinding` events, the grouper makes a `warning` (or `info` for
//! `model_changed`) message keyed by the finding, and it renders in zh and en with the
//! evidence (pass rates, p-value, bounded example answers).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::app::*;
use probeok::alert::render::render;
use probeok::alert::{Lang, RenderCtx, Severity, Status, Subject};
use probeok::clock::ManualClock;
use probeok::drift::DriftKind;
use probeok::health::HealthEvent;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

const QWEN: &str = "qwen/cn-beijing/qwen-max";
const ROUTES: &[Spec<'static>] = &[Spec::new("qwen", "cn-beijing", "qwen-max").serves("chat-main")];

async fn next(rx: &mut broadcast::Receiver<HealthEvent>) -> HealthEvent {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("an event in time")
        .expect("the channel is open")
}

#[tokio::test]
async fn drift_findings_opened_and_closed_become_alerts_with_evidence() {
    let now = at("2026-03-04T12:00:00Z");
    let shutdown = CancellationToken::new();
    let (drift_tx, drift_rx) = watch::channel(Arc::new(drift_snapshot(Vec::new(), &[])));
    let (events, mut rx) = broadcast::channel(16);
    let task = probeok::drift::events::spawn(
        drift_rx,
        events,
        Arc::new(ManualClock::new(now)),
        shutdown.clone(),
    );

    let drop = drift_finding(QWEN, DriftKind::PassRateDrop);
    let model = drift_finding(QWEN, DriftKind::ModelChanged);
    drift_tx.send_replace(Arc::new(drift_snapshot(
        vec![drop.clone(), model.clone()],
        &[],
    )));
    let opened = [next(&mut rx).await, next(&mut rx).await];
    drift_tx.send_replace(Arc::new(drift_snapshot(vec![model.clone()], &[])));
    let closed = next(&mut rx).await;
    assert!(
        matches!(&closed, HealthEvent::DriftFinding { finding, opened: false, .. } if finding.id == drop.id)
    );

    let config = config(ROUTES, std::path::Path::new("unused.db"));
    let mut grouper = probeok::alert::group::Grouper::new(Duration::ZERO, &config.routes());
    for ev in opened {
        grouper.push(ev, now);
    }
    let drafts = grouper.flush(now);
    assert_eq!(drafts.len(), 2);
    let warning = &drafts[0].message;
    assert_eq!(warning.severity, Severity::Warning);
    assert_eq!(warning.status, Status::Firing);
    assert!(matches!(warning.subject, Subject::Drift(_)));
    assert_eq!(warning.related, vec![id(QWEN)]);
    let info = &drafts[1].message;
    assert_eq!(info.severity, Severity::Info);

    let ctx = RenderCtx::from_config(&config);
    let en = render(warning, Lang::En, &ctx);
    assert!(
        en.subject.starts_with("[probeok][WARNING]"),
        "{}",
        en.subject
    );
    assert!(
        en.title
            .contains("behaviour changed on regression set format"),
        "{}",
        en.title
    );
    assert!(en.text.contains("100% (20/20)"), "{}", en.text);
    assert!(en.text.contains("40% (4/10)"), "{}", en.text);
    assert!(en.text.contains("1.20e-4"), "{}", en.text);
    assert!(en.text.contains("case0") && en.text.contains("case1"));
    assert!(!en.text.contains("case2"), "examples are bounded");
    assert!(en.text.len() < 3000, "answers are cut: {}", en.text.len());
    let zh = render(warning, Lang::Zh, &ctx);
    assert!(
        zh.title.contains("回归集 format 上行为变化"),
        "{}",
        zh.title
    );
    assert!(zh.text.contains("通过率"), "{}", zh.text);
    let en_info = render(info, Lang::En, &ctx);
    assert!(
        en_info.title.contains("reported model changed"),
        "{}",
        en_info.title
    );

    // Closing resolves what was announced, under the same firing key.
    grouper.push(closed, now);
    let resolved = grouper.flush(now);
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0].message.status, Status::Resolved);
    assert_eq!(resolved[0].key, drafts[0].key);

    shutdown.cancel();
    task.await.unwrap();
}
