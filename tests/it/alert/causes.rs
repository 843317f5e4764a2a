//! Routes judged on one shared cause are one outage on every channel: a channel told of the
//! cause hears of its later routes only when they make it worse, and of its end once — when
//! the cause's last route is back, or five minutes after the first was, if a straggler keeps
//! failing. Receivers are real HTTP servers; time is a `ManualClock`.

use crate::common;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;

use common::alerts::{incident, qwen, rig, serve, t0, transition, webhook, Fake, Kind, Rig};
use probeok::alert::Severity;
use probeok::clock::{Clock, ManualClock};
use probeok::health::{HealthEvent, Incident, State};

const CAUSE: &str = "qwen/cn-beijing:connection_refused";

/// Route `i`'s incident, opened at `t0`, in the cause (or not).
fn inc(i: usize, cause: Option<&str>) -> Incident {
    let mut x = incident(&qwen(i), t0(), None, State::Degraded);
    x.cause = cause.map(str::to_owned);
    x
}

fn went(i: usize, to: State, at: DateTime<Utc>, cause: Option<&str>) -> HealthEvent {
    let from = if to == State::Critical {
        State::Degraded
    } else {
        State::Normal
    };
    transition(&qwen(i), from, to, at, Some(&inc(i, cause)))
}

fn back(i: usize, at: DateTime<Utc>, cause: Option<&str>) -> HealthEvent {
    let mut x = inc(i, cause);
    x.closed_at = Some(at);
    x.peak = State::Critical;
    transition(&qwen(i), State::Critical, State::Normal, at, Some(&x))
}

fn names(m: &Value) -> usize {
    m["routes"].as_array().map_or(0, Vec::len)
}

async fn said(rig: &Rig, hook: &Fake) -> Vec<Value> {
    rig.service.deliver().await.unwrap();
    hook.got().into_iter().map(|g| g.body).collect()
}

#[tokio::test]
async fn a_causes_later_routes_add_to_its_page_and_its_end_is_one_message() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _h) = serve(hook.clone(), None).await;
    let channels = vec![webhook("webhook[0]", addr, None, Severity::Warning)];
    let rig = rig(channels, clock.clone(), |_| {}).await;

    // Ten routes of the cause: the outage's first message.
    rig.push(
        (0..10)
            .map(|i| went(i, State::Degraded, t0(), Some(CAUSE)))
            .collect(),
    )
    .await;
    let got = said(&rig, &hook).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["severity"], "warning");
    // Ten more join it: nothing new for the on-call.
    clock.advance(std::time::Duration::from_secs(30));
    rig.push(
        (10..20)
            .map(|i| went(i, State::Degraded, clock.now(), Some(CAUSE)))
            .collect(),
    )
    .await;
    assert_eq!(said(&rig, &hook).await.len(), 1, "joiners add to the page");
    // The cause gets worse: one message, at its new severity.
    clock.advance(std::time::Duration::from_secs(60));
    rig.push(
        (0..20)
            .map(|i| went(i, State::Critical, clock.now(), Some(CAUSE)))
            .collect(),
    )
    .await;
    let got = said(&rig, &hook).await;
    let critical: Vec<&Value> = got.iter().filter(|m| m["severity"] == "critical").collect();
    assert_eq!(critical.len(), 1, "{got:?}");
    let before_end = got.len();

    // Routes come back in three batches; the last keeps failing for a while.
    clock.advance(std::time::Duration::from_secs(300));
    rig.push((0..12).map(|i| back(i, clock.now(), Some(CAUSE))).collect())
        .await;
    clock.advance(std::time::Duration::from_secs(30));
    rig.push(
        (12..19)
            .map(|i| back(i, clock.now(), Some(CAUSE)))
            .collect(),
    )
    .await;
    rig.service.evaluate(clock.now()).await.unwrap();
    assert_eq!(
        said(&rig, &hook).await.len(),
        before_end,
        "held while route 19 still fails"
    );
    // Five minutes after the first came back, the news of the 19 goes out.
    clock.advance(std::time::Duration::from_secs(300));
    rig.service.evaluate(clock.now()).await.unwrap();
    let got = said(&rig, &hook).await;
    assert_eq!(got.len(), before_end + 1, "{:?}", &got[before_end..]);
    let end = &got[before_end];
    assert_eq!(end["status"], "resolved");
    assert_eq!(names(end), 19, "{end}");
    // And the straggler's own end, later.
    clock.advance(std::time::Duration::from_secs(60));
    rig.push(vec![back(19, clock.now(), Some(CAUSE))]).await;
    let got = said(&rig, &hook).await;
    assert_eq!(got.len(), before_end + 2);
    assert_eq!(names(&got[before_end + 1]), 1);
    // Nothing is left firing: no reminder, no lost resolution to send later.
    clock.advance(std::time::Duration::from_secs(3600));
    rig.service.evaluate(clock.now()).await.unwrap();
    assert_eq!(said(&rig, &hook).await.len(), before_end + 2);
    let firing = rig.service.store.reader().unwrap().alert_firing().unwrap();
    assert!(
        firing.is_empty(),
        "{:?}",
        firing.iter().map(|f| &f.key).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_cause_whose_routes_all_come_back_ends_in_one_message_naming_them_all() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _h) = serve(hook.clone(), None).await;
    let rig = rig(
        vec![webhook("webhook[0]", addr, None, Severity::Warning)],
        clock.clone(),
        |_| {},
    )
    .await;
    rig.push(
        (0..20)
            .map(|i| went(i, State::Critical, t0(), Some(CAUSE)))
            .collect(),
    )
    .await;
    assert_eq!(said(&rig, &hook).await.len(), 1);
    for batch in [0..7, 7..14, 14..20] {
        clock.advance(std::time::Duration::from_secs(30));
        rig.push(batch.map(|i| back(i, clock.now(), Some(CAUSE))).collect())
            .await;
    }
    let got = said(&rig, &hook).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[1]["status"], "resolved");
    assert_eq!(names(&got[1]), 20);
}
