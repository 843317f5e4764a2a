//! No channel is handed more than its receiver accepts: a DingTalk robot (20 a minute) handed
//! a flood gets at most 20 messages in the minute, the excess folded into one summary, and
//! the next incident's first message within one rate window; a message whose incident
//! resolved before it could be sent is left to its resolution. Time is a `ManualClock`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::alerts::{dingtalk, incident, rig, serve, t0, transition, Fake, Kind};
use probeok::alert::Severity;
use probeok::clock::{Clock, ManualClock};
use probeok::health::{HealthEvent, State as S};
use probeok::route::RouteId;

/// Route `i` of its own provider goes CRITICAL at `t`: a message of its own.
fn lone(i: usize, t: chrono::DateTime<chrono::Utc>) -> HealthEvent {
    let r = RouteId::new(&format!("p{i:03}"), "cn-beijing", "m");
    let inc = incident(&r, t, None, S::Critical);
    transition(&r, S::Normal, S::Critical, t, Some(&inc))
}

fn md(g: &common::alerts::Got) -> String {
    g.body["markdown"]["text"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_flood_of_200_is_20_messages_in_the_minute_and_the_next_incident_is_not_held_up() {
    let clock = Arc::new(ManualClock::new(t0()));
    let ding = Fake::new(Kind::DingTalk, Some("SECtest"), clock.clone());
    let (addr, _h) = serve(ding.clone(), None).await;
    let ch = dingtalk("dingtalk[0]", addr, Some("SECtest"), Severity::Warning);
    let rig = rig(vec![ch], clock.clone(), |_| {}).await;
    assert_eq!(
        rig.push((0..200).map(|i| lone(i, t0())).collect()).await,
        200
    );
    rig.service.deliver().await.unwrap();
    let got = ding.got();
    assert_eq!(got.len(), 20, "19 alerts and one summary");
    let summary = md(&got[19]);
    assert!(
        summary.contains("181 条告警合并为一条") && summary.contains("每分钟最多接收 20 条"),
        "{summary}"
    );
    assert!(summary.contains("… 另有 171 条"), "{summary}");
    assert!(rig.outbox().iter().all(|r| r.status != "pending"));
    assert_eq!(rig.service.metrics().get("dingtalk[0]", "folded"), 181);

    // A second incident ten seconds later waits for the window, and only for it.
    clock.advance(Duration::from_secs(10));
    let r = RouteId::new("deepseek", "cn-beijing", "deepseek-ai/DeepSeek-V3");
    let inc = incident(&r, clock.now(), None, S::Critical);
    rig.push(vec![transition(
        &r,
        S::Normal,
        S::Critical,
        clock.now(),
        Some(&inc),
    )])
    .await;
    rig.service.deliver().await.unwrap();
    assert_eq!(ding.got().len(), 20, "the minute is full");
    clock.set(t0() + chrono::Duration::seconds(60));
    rig.service.deliver().await.unwrap();
    let got = ding.got();
    assert_eq!(
        got.len(),
        21,
        "sent once the window frees, 60 s after the flood"
    );
    assert!(md(&got[20]).contains("DeepSeek-V3"), "{}", md(&got[20]));
}

#[tokio::test]
async fn a_message_resolved_before_it_was_sent_is_folded_into_its_resolution() {
    let clock = Arc::new(ManualClock::new(t0()));
    let ding = Fake::new(Kind::DingTalk, Some("SECtest"), clock.clone());
    let (addr, _h) = serve(ding.clone(), None).await;
    let ch = dingtalk("dingtalk[0]", addr, Some("SECtest"), Severity::Warning);
    let rig = rig(vec![ch], clock.clone(), |_| {}).await;
    // Twenty alerts fill the robot's minute exactly.
    rig.push((0..20).map(|i| lone(i, t0())).collect()).await;
    rig.service.deliver().await.unwrap();
    assert_eq!(ding.got().len(), 20);

    let r = RouteId::new("deepseek", "cn-beijing", "deepseek-ai/DeepSeek-V3");
    let opened = t0() + chrono::Duration::seconds(10);
    clock.set(opened);
    let inc = incident(&r, opened, None, S::Critical);
    rig.push(vec![transition(
        &r,
        S::Normal,
        S::Critical,
        opened,
        Some(&inc),
    )])
    .await;
    rig.service.deliver().await.unwrap();
    let closed = t0() + chrono::Duration::seconds(40);
    clock.set(closed);
    let inc = incident(&r, opened, Some(closed), S::Critical);
    rig.push(vec![transition(
        &r,
        S::Critical,
        S::Normal,
        closed,
        Some(&inc),
    )])
    .await;
    rig.service.deliver().await.unwrap();
    assert_eq!(ding.got().len(), 20, "both wait for the window");

    clock.set(t0() + chrono::Duration::seconds(60));
    rig.service.deliver().await.unwrap();
    let got = ding.got();
    assert_eq!(
        got.len(),
        21,
        "the resolution alone, not the stale firing before it"
    );
    let text = md(&got[20]);
    assert!(
        text.contains("已恢复") && text.contains("DeepSeek-V3"),
        "{text}"
    );
    assert_eq!(rig.service.metrics().get("dingtalk[0]", "folded"), 1);
    assert!(rig.outbox().iter().all(|r| r.status != "pending"));
}

/// `max_per_minute` on a webhook: read, paced and folded like a robot's limit; 0 is a located
/// error.
#[tokio::test]
async fn a_webhook_max_per_minute_is_read_and_folds_what_exceeds_it() {
    let base = r#"
[[provider]]
id = "qwen"
  [[provider.region]]
  id = "cn-beijing"
  base_url = "https://dashscope.aliyuncs.com/compatible-mode/v1"
[[route]]
provider = "qwen"
region = "cn-beijing"
model = "qwen-max"
serves = "chat-main"
[[alert.webhook]]
url_env = "ALERT_WEBHOOK_URL"
"#;
    let c = probeok::config::Config::parse(&format!("{base}max_per_minute = 3\n"), "p.toml")
        .unwrap()
        .config;
    assert_eq!(c.alert.webhook[0].max_per_minute, Some(3));
    let c = probeok::config::Config::parse(base, "p.toml")
        .unwrap()
        .config;
    assert_eq!(c.alert.webhook[0].max_per_minute, None);
    let e = probeok::config::Config::parse(&format!("{base}max_per_minute = 0\n"), "p.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("p.toml:") && e.contains("alert.webhook[0].max_per_minute: 0:"),
        "{e}"
    );

    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _h) = serve(hook.clone(), None).await;
    let vars = common::alerts::env_vars(&[("URL", Some(format!("http://{addr}/hook")))]);
    let cfg = probeok::config::WebhookConfig {
        url_env: "URL".into(),
        secret_env: None,
        max_per_minute: Some(3),
        options: common::alerts::opts(Severity::Warning, probeok::alert::Lang::En),
    };
    let ch = probeok::alert::webhook::Webhook::from_config(
        &cfg,
        &common::alerts::channel_env("webhook[0]", &vars),
    )
    .unwrap();
    let rig = rig(vec![Arc::new(ch)], clock.clone(), |_| {}).await;
    rig.push((0..10).map(|i| lone(i, t0())).collect()).await;
    rig.service.deliver().await.unwrap();
    let got = hook.got();
    assert_eq!(got.len(), 3, "two alerts and the summary of eight");
    assert_eq!(got[2].body["subject"]["type"], "folded");
    assert_eq!(got[2].body["subject"]["total"], 8);
    let title = got[2].body["title"].as_str().unwrap();
    assert!(
        title.contains("8 alerts folded into one: this channel takes 3 messages a minute"),
        "{title}"
    );
}

/// Feishu takes 5 a second and 100 a minute: a flood of 150 goes out 5 a second, and what the
/// minute has no room for is the 100th message, one summary.
#[tokio::test]
async fn feishu_gets_five_a_second_and_a_hundred_a_minute() {
    let clock = Arc::new(ManualClock::new(t0()));
    let feishu = Fake::new(Kind::Feishu, Some("SECtest"), clock.clone());
    let (addr, _h) = serve(feishu.clone(), None).await;
    let ch = common::alerts::feishu("feishu[0]", addr, Some("SECtest"));
    let rig = rig(vec![ch], clock.clone(), |_| {}).await;
    rig.push((0..150).map(|i| lone(i, t0())).collect()).await;
    let mut per_second = Vec::new();
    for _ in 0..30 {
        let before = feishu.got().len();
        rig.service.deliver().await.unwrap();
        per_second.push(feishu.got().len() - before);
        clock.advance(Duration::from_secs(1));
    }
    assert!(per_second.iter().all(|n| *n <= 5), "{per_second:?}");
    let got = feishu.got();
    assert_eq!(got.len(), 100, "{per_second:?}");
    let last = got[99].body.to_string();
    assert!(last.contains("51 alerts folded into one"), "{last}");
    assert!(rig.outbox().iter().all(|r| r.status != "pending"));
}

/// A flood larger than one read of the outbox is still one summary: the robot's minute ends
/// the flood, and the next incident goes out when it frees.
#[tokio::test]
async fn a_flood_of_1200_is_still_20_messages_and_one_summary() {
    let clock = Arc::new(ManualClock::new(t0()));
    let ding = Fake::new(Kind::DingTalk, Some("SECtest"), clock.clone());
    let (addr, _h) = serve(ding.clone(), None).await;
    let ch = dingtalk("dingtalk[0]", addr, Some("SECtest"), Severity::Warning);
    let rig = rig(vec![ch], clock.clone(), |_| {}).await;
    rig.push((0..1200).map(|i| lone(i, t0())).collect()).await;
    rig.service.deliver().await.unwrap();
    let got = ding.got();
    assert_eq!(got.len(), 20);
    assert!(
        md(&got[19]).contains("1181 条告警合并为一条"),
        "{}",
        md(&got[19])
    );
    assert!(rig.outbox().iter().all(|r| r.status != "pending"));
    let r = RouteId::new("deepseek", "cn-beijing", "deepseek-ai/DeepSeek-V3");
    clock.advance(Duration::from_secs(5));
    let inc = incident(&r, clock.now(), None, S::Critical);
    rig.push(vec![transition(
        &r,
        S::Normal,
        S::Critical,
        clock.now(),
        Some(&inc),
    )])
    .await;
    clock.set(t0() + chrono::Duration::seconds(60));
    rig.service.deliver().await.unwrap();
    let got = ding.got();
    assert_eq!(got.len(), 21);
    assert!(md(&got[20]).contains("DeepSeek-V3"));
}
