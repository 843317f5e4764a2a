//! Every alert about a route groups as the state alerts do: a provider's routes burning their
//! error budget are one page (and one resolution, one incident at PagerDuty), its routes
//! answering 401 one message per channel, and a burn rate on a route whose state alert
//! already pages folds into it. Receivers are real HTTP servers; time is a `ManualClock`.

use crate::common;

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde_json::Value;

use common::alerts::{critical, dingtalk, qwen, rig, serve, t0, webhook, Fake, Kind, Rig};
use common::app::outcome;
use common::oncall::{self, Service};
use probeok::alert::Severity;
use probeok::clock::{Clock, ManualClock};
use probeok::config::{Config, RouteConfig};
use probeok::health::HealthEvent;
use probeok::probe::OutcomeKind;

/// The routes of provider qwen the rig knows: `n` of them.
fn qwen_routes(c: &mut Config, n: usize) {
    c.routes.retain(|r| r.provider != "qwen");
    for i in 0..n {
        c.routes.push(RouteConfig {
            provider: "qwen".into(),
            region: "cn-beijing".into(),
            model: format!("qwen-max-{i:02}"),
            serves: "chat-main".into(),
            ..RouteConfig::default()
        });
    }
}

/// An hour of failed probes, one a minute, on each of qwen's first `n` routes, up to `t`.
async fn burn_hour(rig: &Rig, n: usize, t: DateTime<Utc>) {
    let mut all = Vec::new();
    for i in 0..n {
        for m in 1..=60 {
            let r = qwen(i);
            all.push(outcome(
                r.as_str(),
                OutcomeKind::Probe,
                t - Duration::minutes(m),
                false,
                900.0,
            ));
        }
    }
    rig.service.store.writer().record_many(all).await.unwrap();
}

/// Delivers what is due now, then minute after minute until nothing is left pending (a
/// rate-limited channel's queue drains): returns the minutes it took.
async fn drain(rig: &Rig, clock: &ManualClock) -> i64 {
    let mut minutes = 0;
    loop {
        rig.service.deliver().await.unwrap();
        if rig.outbox().iter().all(|r| r.status != "pending") || minutes > 24 * 60 {
            return minutes;
        }
        clock.advance(std::time::Duration::from_secs(60));
        minutes += 1;
    }
}

fn grouped_members(body: &Value) -> usize {
    body["subject"]["members"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_hundred_routes_burning_their_budget_are_one_page_and_one_resolution() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (hook_addr, _h1) = serve(hook.clone(), None).await;
    let pd = oncall::Fake::new(Service::PagerDuty);
    let (pd_addr, _h2) = oncall::serve(pd.clone()).await;
    let channels = vec![
        webhook("webhook[0]", hook_addr, None, Severity::Warning),
        common::oncall::pagerduty_channel(pd_addr),
    ];
    let rig = rig(channels, clock.clone(), |c| qwen_routes(c, 100)).await;
    burn_hour(&rig, 100, t0()).await;

    rig.service.evaluate(t0()).await.unwrap();
    rig.service.deliver().await.unwrap();
    let got = hook.got();
    assert_eq!(got.len(), 1, "one page, not one per route");
    let page = &got[0].body;
    assert_eq!(page["status"], "firing");
    assert_eq!(page["severity"], "critical");
    assert_eq!(page["subject"]["type"], "grouped");
    assert_eq!(page["subject"]["kind"], "burn_rate");
    assert_eq!(grouped_members(page), 100);
    let title = page["title"].as_str().unwrap();
    assert!(
        title.contains("qwen: 100 routes burn their error budget"),
        "{title}"
    );
    let text = page["text"].as_str().unwrap();
    assert!(
        text.contains("qwen-max-00") && text.contains("and 90 more routes"),
        "{text}"
    );
    assert!(text.contains("Error budget left"), "{text}");
    let triggers = pd.got();
    assert_eq!(triggers.len(), 1, "{triggers:?}");
    assert_eq!(triggers[0].body["event_action"], "trigger");
    assert_eq!(triggers[0].body["payload"]["severity"], "critical");

    // Still burning a minute later: nothing new.
    clock.advance(std::time::Duration::from_secs(60));
    rig.service.evaluate(clock.now()).await.unwrap();
    rig.service.deliver().await.unwrap();
    assert_eq!(hook.got().len(), 1);
    assert_eq!(pd.got().len(), 1);

    // Seven hours on, every window is clean: one resolution, closing the one incident.
    clock.set(t0() + Duration::hours(7));
    rig.service.evaluate(clock.now()).await.unwrap();
    rig.service.deliver().await.unwrap();
    let got = hook.got();
    assert_eq!(got.len(), 2, "one resolution");
    assert_eq!(got[1].body["status"], "resolved");
    assert_eq!(grouped_members(&got[1].body), 100);
    let pd_got = pd.got();
    assert_eq!(pd_got.len(), 2, "{pd_got:?}");
    assert_eq!(pd_got[1].body["event_action"], "resolve");
    assert_eq!(pd_got[0].body["dedup_key"], pd_got[1].body["dedup_key"]);
    assert!(pd.malformed().is_empty(), "{:?}", pd.malformed());
}

/// Routes recovering one evaluation apart: the incident tool's trigger closes with the last.
#[tokio::test]
async fn a_grouped_page_resolves_at_pagerduty_when_its_last_route_stops_burning() {
    let clock = Arc::new(ManualClock::new(t0()));
    let pd = oncall::Fake::new(Service::PagerDuty);
    let (pd_addr, _h) = oncall::serve(pd.clone()).await;
    let rig = rig(
        vec![common::oncall::pagerduty_channel(pd_addr)],
        clock.clone(),
        |c| qwen_routes(c, 3),
    )
    .await;
    burn_hour(&rig, 3, t0()).await;
    rig.service.evaluate(t0()).await.unwrap();
    // Route 0 keeps failing long after the others recovered.
    let mut more = Vec::new();
    for m in 0..(7 * 60) {
        let at = t0() + Duration::minutes(m);
        more.push(outcome(
            qwen(0).as_str(),
            OutcomeKind::Probe,
            at,
            false,
            900.0,
        ));
    }
    rig.service.store.writer().record_many(more).await.unwrap();
    clock.set(t0() + Duration::hours(7));
    rig.service.evaluate(clock.now()).await.unwrap();
    rig.service.deliver().await.unwrap();
    assert_eq!(
        pd.got().len(),
        1,
        "routes 1 and 2 recovered, route 0 holds the page"
    );
    clock.set(t0() + Duration::hours(15));
    rig.service.evaluate(clock.now()).await.unwrap();
    rig.service.deliver().await.unwrap();
    let got = pd.got();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[1].body["event_action"], "resolve");
    assert_eq!(got[0].body["dedup_key"], got[1].body["dedup_key"]);
}

/// A burn rate on routes whose state alert already pages adds nothing of its own: the page
/// names only the routes nobody was told about, and their resolution only those.
#[tokio::test]
async fn a_burn_rate_on_routes_already_paging_folds_into_their_state_alert() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _h) = serve(hook.clone(), None).await;
    let channels = vec![webhook("webhook[0]", addr, None, Severity::Warning)];
    let rig = rig(channels, clock.clone(), |c| qwen_routes(c, 30)).await;
    // Routes 0..20 are CRITICAL, announced as one provider message.
    let events: Vec<HealthEvent> = (0..20).map(|i| critical(i, t0())).collect();
    rig.push(events).await;
    burn_hour(&rig, 30, t0()).await;
    rig.service.evaluate(t0()).await.unwrap();
    rig.service.deliver().await.unwrap();
    let got = hook.got();
    assert_eq!(got.len(), 2, "the state message and one burn page");
    assert_eq!(got[0].body["subject"]["type"], "provider");
    assert_eq!(got[1].body["subject"]["kind"], "burn_rate");
    assert_eq!(grouped_members(&got[1].body), 10, "only routes 20..30");
    let text = got[1].body["text"].as_str().unwrap();
    assert!(
        text.contains("qwen-max-20") && !text.contains("qwen-max-00"),
        "{text}"
    );
    clock.set(t0() + Duration::hours(7));
    rig.service.evaluate(clock.now()).await.unwrap();
    rig.service.deliver().await.unwrap();
    let got = hook.got();
    assert_eq!(got.len(), 3);
    assert_eq!(got[2].body["status"], "resolved");
    assert_eq!(grouped_members(&got[2].body), 10);
}

/// A fast burn can cross its threshold before the state alert about the same failures has left
/// its grouping window: the page waits for it, then folds into it.
#[tokio::test]
async fn a_burn_rate_waits_for_a_state_alert_still_being_gathered() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _h) = serve(hook.clone(), None).await;
    let channels = vec![webhook("webhook[0]", addr, None, Severity::Warning)];
    let rig = rig(channels, clock.clone(), |c| qwen_routes(c, 10)).await;
    // Detection put routes 0..10 in an incident (stored); their alert is still being gathered.
    let detection = probeok::config::DetectionConfig::default();
    let events: Vec<HealthEvent> = (0..10).map(|i| critical(i, t0())).collect();
    for e in &events {
        let HealthEvent::Transition {
            transition,
            incident,
        } = e
        else {
            unreachable!()
        };
        let health = probeok::health::RouteHealth::new(transition.route.clone(), &detection, t0());
        rig.service
            .store
            .writer()
            .record_transition(transition, incident.as_deref(), &health)
            .await
            .unwrap();
    }
    burn_hour(&rig, 10, t0()).await;
    rig.service.evaluate(t0()).await.unwrap();
    rig.service.deliver().await.unwrap();
    assert!(hook.got().is_empty(), "{:?}", hook.got());
    // The state alert goes out; from then on the burn rates fold into it.
    rig.push(events).await;
    rig.service.deliver().await.unwrap();
    assert_eq!(hook.got().len(), 1);
    clock.advance(std::time::Duration::from_secs(60));
    rig.service.evaluate(clock.now()).await.unwrap();
    rig.service.deliver().await.unwrap();
    let got = hook.got();
    assert_eq!(
        got.len(),
        1,
        "{:?}",
        got.iter().map(|g| &g.body["title"]).collect::<Vec<_>>()
    );
    assert_eq!(got[0].body["subject"]["type"], "provider");
}

#[tokio::test]
async fn twenty_routes_answering_401_are_one_message_per_channel() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (hook_addr, _h1) = serve(hook.clone(), None).await;
    let ding = Fake::new(Kind::DingTalk, Some("SECtest"), clock.clone());
    let (ding_addr, _h2) = serve(ding.clone(), None).await;
    let pd = oncall::Fake::new(Service::PagerDuty);
    let (pd_addr, _h3) = oncall::serve(pd.clone()).await;
    let channels = vec![
        webhook("webhook[0]", hook_addr, None, Severity::Warning),
        dingtalk("dingtalk[0]", ding_addr, Some("SECtest"), Severity::Warning),
        common::oncall::pagerduty_channel(pd_addr),
    ];
    let rig = rig(channels, clock.clone(), |_| {}).await;
    let fault = |i: usize, status: Option<u16>, at| HealthEvent::RouteFault {
        route: qwen(i),
        status,
        at,
    };
    rig.push((0..20).map(|i| fault(i, Some(401), t0())).collect())
        .await;
    rig.service.deliver().await.unwrap();
    assert_eq!(hook.got().len(), 1);
    assert_eq!(ding.got().len(), 1);
    assert_eq!(pd.got().len(), 1);
    assert_eq!(grouped_members(&hook.got()[0].body), 20);
    let md = ding.got()[0].body["markdown"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(md.contains("qwen：20 条线路上游返回 HTTP 401"), "{md}");
    // Seen again by a restarted detection: already announced, nothing new.
    rig.push((0..20).map(|i| fault(i, Some(401), t0())).collect())
        .await;
    rig.service.deliver().await.unwrap();
    assert_eq!(hook.got().len(), 1);
    // The key is fixed: one resolution each, PagerDuty's under the trigger's key.
    clock.advance(std::time::Duration::from_secs(600));
    rig.push((0..20).map(|i| fault(i, None, clock.now())).collect())
        .await;
    rig.service.deliver().await.unwrap();
    assert_eq!(hook.got().len(), 2);
    assert_eq!(ding.got().len(), 2);
    let got = pd.got();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].body["event_action"], "resolve");
    assert_eq!(got[0].body["dedup_key"], got[1].body["dedup_key"]);
}

/// The operator's outage, measured: 100 routes of one provider go CRITICAL, burn their budget
/// and recover. Prints the messages each channel received and how long the robot's queue took.
#[tokio::test]
async fn messages_per_channel_for_a_hundred_route_outage() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (hook_addr, _h1) = serve(hook.clone(), None).await;
    let ding = Fake::new(Kind::DingTalk, Some("SECtest"), clock.clone());
    let (ding_addr, _h2) = serve(ding.clone(), None).await;
    let pd = oncall::Fake::new(Service::PagerDuty);
    let (pd_addr, _h3) = oncall::serve(pd.clone()).await;
    let channels = vec![
        webhook("webhook[0]", hook_addr, None, Severity::Warning),
        dingtalk("dingtalk[0]", ding_addr, Some("SECtest"), Severity::Warning),
        common::oncall::pagerduty_channel(pd_addr),
    ];
    let rig = rig(channels, clock.clone(), |c| qwen_routes(c, 100)).await;
    let events: Vec<HealthEvent> = (0..100).map(|i| critical(i, t0())).collect();
    rig.push(events).await;
    burn_hour(&rig, 100, t0()).await;
    rig.service.evaluate(t0()).await.unwrap();
    let firing_minutes = drain(&rig, &clock).await;
    // The routes recover (their incidents close), then the budget windows clear.
    let t = clock.now();
    let back: Vec<HealthEvent> = (0..100)
        .map(|i| {
            let r = qwen(i);
            let opened = t0() - Duration::minutes(1);
            let inc =
                common::alerts::incident(&r, opened, Some(t), probeok::health::State::Critical);
            common::alerts::transition(
                &r,
                probeok::health::State::Critical,
                probeok::health::State::Normal,
                t,
                Some(&inc),
            )
        })
        .collect();
    rig.push(back).await;
    drain(&rig, &clock).await;
    clock.set(t0() + Duration::hours(7));
    rig.service.evaluate(clock.now()).await.unwrap();
    drain(&rig, &clock).await;
    let (w, d, p) = (hook.got().len(), ding.got().len(), pd.got().len());
    println!(
        "100-route outage: webhook {w} messages, dingtalk {d} messages (firing side drained in {firing_minutes} min), pagerduty {p} events"
    );
    assert_eq!(
        (w, d, p),
        (2, 2, 2),
        "firing and resolution of the one state alert"
    );
}
