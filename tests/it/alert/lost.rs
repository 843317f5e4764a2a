//! A resolution that never reached the engine — held in the grouping buffer of a leader that
//! died, or of a process killed before its flush — is sent once the store shows the incident
//! closed for a while: the on-call is never left with an open page for an incident that ended.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use probeok::alert::Severity;
use probeok::clock::{Clock, ManualClock};
use probeok::health::State as S;

use common::alerts::*;

#[tokio::test]
async fn a_lost_resolution_is_sent_once_the_incident_has_been_closed_a_while() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _) = serve(hook.clone(), None).await;
    let channel = webhook("webhook[0]", addr, None, Severity::Warning);
    let rig = rig(vec![channel], clock.clone(), |_| {}).await;
    let route = qwen(1);
    // Route 1 goes CRITICAL in an incident opened a minute earlier: one page.
    assert_eq!(rig.push(vec![critical(1, t0())]).await, 1);
    // Sent at once (a page still queued when its resolution comes is left to the resolution).
    assert_eq!(rig.service.deliver().await.unwrap().delivered, 1);
    let firing = || {
        rig.service
            .store
            .reader()
            .unwrap()
            .alert_firing_keys()
            .unwrap()
    };
    assert_eq!(firing().len(), 1, "{:?}", firing());

    // Detection closes the incident and stores it, but the resolution never reaches the
    // engine (the leader holding it died).
    let opened = t0() - chrono::Duration::minutes(1);
    let closed_at = t0() + chrono::Duration::minutes(2);
    let closed = incident(&route, opened, Some(closed_at), S::Critical);
    rig.service
        .store
        .writer()
        .upsert_incident(&closed)
        .await
        .unwrap();

    // Four minutes after the close it may still be on its way: nothing yet.
    clock.set(closed_at + chrono::Duration::minutes(4));
    rig.service.evaluate(clock.now()).await.unwrap();
    assert_eq!(rig.outbox().len(), 1, "only the page");
    assert_eq!(firing().len(), 1);

    // Five minutes after: it was lost; the resolution goes out, once.
    clock.set(closed_at + chrono::Duration::minutes(5));
    rig.service.evaluate(clock.now()).await.unwrap();
    assert!(firing().is_empty(), "{:?}", firing());
    let outbox = rig.outbox();
    assert_eq!(outbox.len(), 2, "{outbox:?}");
    assert!(
        outbox[1].message.contains("\"status\":\"resolved\""),
        "{}",
        outbox[1].message
    );
    assert!(outbox[1].message.contains(route.as_str()));
    clock.advance(Duration::from_secs(3600));
    rig.service.evaluate(clock.now()).await.unwrap();
    assert_eq!(rig.outbox().len(), 2, "sent once");
    let r = rig.service.deliver().await.unwrap();
    assert_eq!(r.delivered, 1, "{r:?}");
    let got = hook.got();
    assert!(
        got[1].body.to_string().contains("resolved"),
        "{}",
        got[1].body
    );
}

#[tokio::test]
async fn an_open_incident_or_a_resolution_already_sent_is_left_alone() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _) = serve(hook.clone(), None).await;
    let channel = webhook("webhook[0]", addr, None, Severity::Warning);
    let rig = rig(vec![channel], clock.clone(), |_| {}).await;
    rig.push(vec![critical(1, t0()), critical(2, t0())]).await;
    let opened = t0() - chrono::Duration::minutes(1);
    // Route 1's incident is still open in the store.
    rig.service
        .store
        .writer()
        .upsert_incident(&incident(&qwen(1), opened, None, S::Critical))
        .await
        .unwrap();
    // Route 2's closed, and its resolution came the normal way.
    let closed_at = t0() + chrono::Duration::minutes(2);
    let closed = incident(&qwen(2), opened, Some(closed_at), S::Critical);
    rig.service
        .store
        .writer()
        .upsert_incident(&closed)
        .await
        .unwrap();
    let before = rig.outbox().len();
    rig.push(vec![transition(
        &qwen(2),
        S::Critical,
        S::Normal,
        closed_at,
        Some(&closed),
    )])
    .await;
    let after_resolution = rig.outbox().len();
    assert_eq!(after_resolution, before + 1);

    clock.set(closed_at + chrono::Duration::hours(1));
    rig.service.evaluate(clock.now()).await.unwrap();
    assert_eq!(rig.outbox().len(), after_resolution, "nothing more");
    let firing = rig
        .service
        .store
        .reader()
        .unwrap()
        .alert_firing_keys()
        .unwrap();
    assert_eq!(firing.len(), 1, "route 1 still fires: {firing:?}");
}
