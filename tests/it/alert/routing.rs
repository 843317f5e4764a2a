//! Alert routing and mentions: channels with `routes` get only their routes' alerts (a
//! provider-wide outage grouped per channel), CRITICAL messages mention the on-call on DingTalk
//! (the `at` object and the numbers in the text, signed as always) and WeCom (markdown, then a
//! `text` message with `mentioned_mobile_list`), a WeCom robot answering 45009 once still gets
//! the message exactly once, and `probeok alert test` / `check-config` know the WeCom channel.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use probeok::alert::dingtalk::DingTalk;
use probeok::alert::webhook::Webhook;
use probeok::alert::wecom::Wecom;
use probeok::alert::{ChannelEnv, Lang, Notifier, Severity};
use probeok::clock::ManualClock;
use probeok::config::{ChannelOptions, Config, Mention, RobotConfig, WebhookConfig, WecomConfig};
use probeok::health::{Finding, FindingKind, HealthEvent, State as S};
use probeok::route::RouteId;

use common::alerts::*;

fn vars(pairs: &[(&str, String)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn env<'a>(name: &str, vars: &'a HashMap<String, String>) -> ChannelEnv<'a> {
    ChannelEnv {
        name: name.into(),
        vars,
        http: http(),
    }
}

fn options(min: Severity, routes: &[&str]) -> ChannelOptions {
    ChannelOptions {
        min_severity: min,
        lang: Lang::Zh,
        routes: routes.iter().map(|r| (*r).to_owned()).collect(),
        ..ChannelOptions::default()
    }
}

fn on_call() -> Mention {
    Mention {
        mobiles: vec!["13800138000".into()],
        user_ids: vec!["manager42".into()],
        ..Mention::default()
    }
}

/// A signed DingTalk channel to `addr` owning `routes`, mentioning `mention`.
fn ding(
    name: &str,
    addr: SocketAddr,
    routes: &[&str],
    min: Severity,
    mention: Option<Mention>,
) -> Arc<dyn Notifier> {
    let v = vars(&[
        ("URL", format!("http://{addr}/robot/send?access_token=t")),
        ("SECRET", "SECroute".into()),
    ]);
    let c = RobotConfig {
        webhook_env: "URL".into(),
        secret_env: Some("SECRET".into()),
        options: options(min, routes),
        mention,
    };
    Arc::new(DingTalk::from_config(&c, &env(name, &v)).unwrap())
}

fn wecom(addr: SocketAddr, mention: Option<Mention>) -> Arc<dyn Notifier> {
    let v = vars(&[(
        "WECOM",
        format!("http://{addr}/cgi-bin/webhook/send?key=wecom-key"),
    )]);
    let c = WecomConfig {
        webhook_env: "WECOM".into(),
        mention,
        options: options(Severity::Warning, &[]),
    };
    Arc::new(Wecom::from_config(&c, &env("wecom[0]", &v)).unwrap())
}

fn deepseek() -> RouteId {
    RouteId::new("deepseek", "cn-beijing", "deepseek-ai/DeepSeek-V3")
}

fn deepseek_critical(t: chrono::DateTime<chrono::Utc>) -> HealthEvent {
    let r = deepseek();
    let inc = incident(&r, t, None, S::Critical);
    transition(&r, S::Degraded, S::Critical, t, Some(&inc))
}

fn markdown(g: &Got) -> String {
    g.body["markdown"]["text"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn channels_get_only_their_routes_and_an_outage_is_grouped_per_channel() {
    let clock = Arc::new(ManualClock::new(t0()));
    let low = Fake::new(Kind::DingTalk, Some("SECroute"), clock.clone());
    let high = Fake::new(Kind::DingTalk, Some("SECroute"), clock.clone());
    let all = Fake::new(Kind::Webhook, None, clock.clone());
    let a = serve(low.clone(), None).await.0;
    let b = serve(high.clone(), None).await.0;
    let h = serve(all.clone(), None).await.0;
    let v = vars(&[("HOOK", format!("http://{h}/hook"))]);
    let hook: Arc<dyn Notifier> = Arc::new(
        Webhook::from_config(
            &WebhookConfig {
                url_env: "HOOK".into(),
                secret_env: None,
                max_per_minute: None,
                options: ChannelOptions {
                    lang: Lang::En,
                    ..options(Severity::Warning, &[])
                },
            },
            &env("webhook[0]", &v),
        )
        .unwrap(),
    );
    let rig = rig(
        vec![
            ding(
                "dingtalk[0]",
                a,
                &["qwen/*/qwen-max-0?"],
                Severity::Warning,
                None,
            ),
            ding(
                "dingtalk[1]",
                b,
                &["qwen/*/qwen-max-1?", "deepseek/*"],
                Severity::Warning,
                None,
            ),
            hook,
        ],
        clock.clone(),
        |_| {},
    )
    .await;
    // Every qwen route and the deepseek route fail together.
    let mut events: Vec<HealthEvent> = (0..20).map(|i| critical(i, t0())).collect();
    events.push(deepseek_critical(t0()));
    // dingtalk[0]: one qwen group; dingtalk[1]: one qwen group and the deepseek route;
    // the unfiltered webhook: both.
    assert_eq!(rig.push(events).await, 5);
    rig.service.deliver().await.unwrap();

    let got = low.got();
    assert_eq!(got.len(), 1, "{got:#?}");
    let md = markdown(&got[0]);
    assert!(md.contains("qwen：10 条线路不可用"), "{md}");
    for i in 0..10 {
        assert!(md.contains(&format!("qwen-max-{i:02}")), "{md}");
    }
    for i in 10..20 {
        assert!(!md.contains(&format!("qwen-max-{i:02}")), "{md}");
    }
    assert!(!md.contains("DeepSeek"), "{md}");

    let got = high.got();
    assert_eq!(got.len(), 2, "{got:#?}");
    let texts: Vec<String> = got.iter().map(markdown).collect();
    let group = texts.iter().find(|t| t.contains("qwen：")).unwrap();
    assert!(group.contains("qwen：10 条线路不可用"), "{group}");
    assert!(group.contains("qwen-max-10") && group.contains("qwen-max-19"));
    assert!(!group.contains("qwen-max-09"), "{group}");
    assert!(texts
        .iter()
        .any(|t| t.contains("deepseek/cn-beijing/deepseek-ai/DeepSeek-V3 不可用")));
    for f in [&low, &high] {
        assert_eq!(f.bad_signatures.load(Ordering::SeqCst), 0);
    }

    let got = all.got();
    assert_eq!(got.len(), 2);
    let titles: Vec<&str> = got
        .iter()
        .map(|g| g.body["title"].as_str().unwrap())
        .collect();
    assert!(
        titles.iter().any(|t| t.contains("qwen: 20 routes")),
        "{titles:?}"
    );

    // Cross-route: our own egress goes to the unfiltered channel only.
    let t = t0() + chrono::Duration::minutes(5);
    clock.set(t);
    let egress = Finding {
        kind: FindingKind::Egress,
        routes: vec![qwen(1), deepseek()],
        providers: vec!["deepseek".into(), "qwen".into()],
        code: "egress".into(),
        text: "2 routes of 2 providers fail together and the control URL fails too".into(),
    };
    assert_eq!(
        rig.push(vec![HealthEvent::FindingOpened {
            finding: egress,
            at: t
        }])
        .await,
        1
    );
    rig.service.deliver().await.unwrap();
    assert_eq!(
        (low.got().len(), high.got().len(), all.got().len()),
        (1, 2, 3)
    );
}

#[tokio::test]
async fn a_critical_mentions_the_on_call_and_a_warning_does_not() {
    let clock = Arc::new(ManualClock::new(t0()));
    let fake = Fake::new(Kind::DingTalk, Some("SECroute"), clock.clone());
    let addr = serve(fake.clone(), None).await.0;
    let rig = rig(
        vec![ding(
            "dingtalk[0]",
            addr,
            &["qwen/*"],
            Severity::Warning,
            Some(on_call()),
        )],
        clock.clone(),
        |_| {},
    )
    .await;
    let r = qwen(3);
    let inc = incident(&r, t0(), None, S::Critical);
    // A WARNING-severity message (DEGRADED): no mention.
    rig.push(vec![transition(
        &r,
        S::Warning,
        S::Degraded,
        t0(),
        Some(&inc),
    )])
    .await;
    rig.service.deliver().await.unwrap();
    let got = fake.got();
    assert_eq!(got.len(), 1);
    assert!(got[0].body.get("at").is_none(), "{}", got[0].body);
    assert!(!markdown(&got[0]).contains("@13800138000"));

    // CRITICAL: the at object, and the number and id in the text, signed as always.
    let t = t0() + chrono::Duration::minutes(1);
    clock.set(t);
    rig.push(vec![transition(
        &r,
        S::Degraded,
        S::Critical,
        t,
        Some(&inc),
    )])
    .await;
    rig.service.deliver().await.unwrap();
    let got = fake.got();
    assert_eq!(got.len(), 2);
    let body = &got[1].body;
    assert_eq!(body["at"]["atMobiles"], serde_json::json!(["13800138000"]));
    assert_eq!(body["at"]["atUserIds"], serde_json::json!(["manager42"]));
    assert_eq!(body["at"]["isAtAll"], false);
    let md = markdown(&got[1]);
    assert!(
        md.contains("@13800138000") && md.contains("@manager42"),
        "{md}"
    );
    assert!(md.contains("严重"), "{md}");
    assert!(got[1].ts.is_some(), "signed");
    assert_eq!(fake.bad_signatures.load(Ordering::SeqCst), 0);

    // Resolved: no mention (not asked for).
    let closed = t + chrono::Duration::minutes(5);
    clock.set(closed);
    let inc = incident(&r, t0(), Some(closed), S::Critical);
    rig.push(vec![transition(
        &r,
        S::Critical,
        S::Normal,
        closed,
        Some(&inc),
    )])
    .await;
    rig.service.deliver().await.unwrap();
    let got = fake.got();
    assert_eq!(got.len(), 3);
    assert!(markdown(&got[2]).contains("已恢复"));
    assert!(got[2].body.get("at").is_none(), "{}", got[2].body);
}

#[tokio::test]
async fn wecom_gets_the_message_exactly_once_through_a_45009_with_its_mention() {
    let clock = Arc::new(ManualClock::new(t0()));
    let fake = Fake::new(Kind::Wecom, None, clock.clone());
    let addr = serve(fake.clone(), None).await.0;
    let rig = rig(vec![wecom(addr, Some(on_call()))], clock.clone(), |_| {}).await;
    // A 20-route outage: the biggest message, to check the 4,096-byte markdown limit.
    let events: Vec<HealthEvent> = (0..20).map(|i| critical(i, t0())).collect();
    // The message and its mention part.
    assert_eq!(rig.push(events).await, 2);

    fake.reject.store(1, Ordering::SeqCst); // {"errcode":45009,"errmsg":"api freq out of limit"}
    let r = rig.service.deliver().await.unwrap();
    assert_eq!((r.delivered, r.failed), (0, 1), "{r:?}");
    assert!(fake.got().is_empty());
    // Not retried before the robot's minute is over.
    clock.advance(Duration::from_secs(30));
    let r = rig.service.deliver().await.unwrap();
    assert_eq!(r.delivered + r.failed, 0, "{r:?}");
    clock.advance(Duration::from_secs(31));
    let r = rig.service.deliver().await.unwrap();
    assert_eq!(r.delivered, 2, "{r:?}");
    for _ in 0..3 {
        clock.advance(Duration::from_secs(600));
        rig.service.deliver().await.unwrap();
    }

    let got = fake.got();
    assert_eq!(got.len(), 2, "exactly once, then its mention: {got:#?}");
    let md = &got[0].body;
    assert_eq!(md["msgtype"], "markdown");
    let content = md["markdown"]["content"].as_str().unwrap();
    assert!(content.len() <= 4096, "{}", content.len());
    assert!(content.contains("qwen：20 条线路不可用"), "{content}");
    assert!(content.ends_with("<@manager42>"), "{content}");
    let text = &got[1].body;
    assert_eq!(text["msgtype"], "text");
    assert_eq!(
        text["text"]["mentioned_mobile_list"],
        serde_json::json!(["13800138000"])
    );
    assert!(text["text"]["content"]
        .as_str()
        .unwrap()
        .contains("qwen：20 条线路不可用"));
    let rows = rig.outbox();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r.status == "delivered"), "{rows:?}");
    assert!(rows[1].dedup_key.ends_with("#wecom[0]#mention"), "{rows:?}");
}

#[tokio::test]
async fn alert_test_reaches_wecom_and_check_config_lists_each_channels_routes() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let fake = Fake::new(Kind::Wecom, None, clock.clone());
    let addr = serve(fake.clone(), None).await.0;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(
        &file,
        r#"
[storage]
path = "x.db"
[[provider]]
id = "qwen"
api_key_env = "PROBEOK_ROUTING_TEST_KEY"
  [[provider.region]]
  id = "cn"
  base_url = "http://127.0.0.1:9/v1"
[[provider]]
id = "deepseek"
api_key_env = "PROBEOK_ROUTING_TEST_KEY"
  [[provider.region]]
  id = "cn"
  base_url = "http://127.0.0.1:9/v1"
[[route]]
provider = "qwen"
region = "cn"
model = "qwen-max"
serves = "chat"
[[route]]
provider = "deepseek"
region = "cn"
model = "deepseek-chat"
serves = "chat"
[[alert.dingtalk]]
webhook_env = "T_ROUTING_DING"
routes = ["deepseek/*"]
mention = { mobiles = ["13800138000"], min_severity = "critical" }
[[alert.wecom]]
webhook_env = "T_ROUTING_WECOM"
routes = ["qwen/*", "*"]
mention = { user_ids = ["zhangsan"], all = true }
"#,
    )
    .unwrap();
    let run = |args: &[&str]| {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_probeok"));
        c.args(args)
            .arg("--config")
            .arg(&file)
            .env("PROBEOK_ROUTING_TEST_KEY", "k")
            .env(
                "T_ROUTING_DING",
                "http://127.0.0.1:9/robot/send?access_token=x",
            )
            .env(
                "T_ROUTING_WECOM",
                format!("http://{addr}/cgi-bin/webhook/send?key=wecom-key"),
            );
        c
    };
    let out = run(&["alert", "test", "--channel", "1"])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("wecom[0]") && stdout.contains("ok") && stdout.contains("\"errcode\":0"),
        "{stdout}"
    );
    assert!(!stdout.contains("wecom-key") && !stderr.contains("wecom-key"));
    let got = fake.got();
    assert_eq!(got.len(), 1, "a test message mentions nobody: {got:#?}");
    assert_eq!(got[0].body["msgtype"], "markdown");
    assert!(got[0].body["markdown"]["content"]
        .as_str()
        .unwrap()
        .contains("probeok 测试消息"));

    let out = run(&["check-config"]).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("dingtalk[0] (routes deepseek/*; from warning; mentions 1 mobile(s) from critical): 1 route(s)\n    deepseek/cn/deepseek-chat\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("wecom[0] (routes qwen/*, *; from warning; mentions 1 user id(s) + everyone from critical): 2 route(s), and cross-route alerts"),
        "{stdout}"
    );
}

#[test]
fn routing_and_mention_keys_parse_and_bad_ones_are_located_errors() {
    let base = r#"
[[provider]]
id = "qwen"
  [[provider.region]]
  id = "cn"
  base_url = "https://dashscope.aliyuncs.com/compatible-mode/v1"
[[route]]
provider = "qwen"
region = "cn"
model = "qwen-max"
serves = "chat"
"#;
    let ok = format!(
        r#"{base}
[[alert.dingtalk]]
webhook_env = "D"
routes = ["qwen/*"]
mention = {{ mobiles = ["+8613800138000"], user_ids = ["u1"], all = true, min_severity = "warning", resolved = true }}
[[alert.wecom]]
webhook_env = "W"
lang = "en"
[[alert.email]]
smtp_url_env = "SMTP_URL"
from = "probeok@example.com"
to = ["oncall@example.com"]
routes = ["qwen/cn/*"]
"#
    );
    let loaded = Config::parse(&ok, "p.toml").unwrap();
    let c = loaded.config;
    let m = c.alert.dingtalk[0].mention.as_ref().unwrap();
    assert_eq!(m.mobiles, ["+8613800138000"]);
    assert!(m.all && m.resolved);
    assert_eq!(m.min_severity, Severity::Warning);
    assert_eq!(c.alert.dingtalk[0].options.routes, ["qwen/*"]);
    assert_eq!(c.alert.wecom.len(), 1);
    assert_eq!(c.alert.wecom[0].options.lang, Lang::En);
    assert!(c.alert.wecom[0].options.routes.is_empty());
    assert!(c.alert.wecom[0].mention.is_none());
    assert_eq!(c.alert.email[0].options.routes, ["qwen/cn/*"]);
    assert_eq!(c.alert.len(), 3);
    assert!(c
        .missing_secrets()
        .iter()
        .any(|d| d.path == "alert.wecom[0].webhook_env"),);
    // Defaults: critical, not on resolved.
    let d = Mention::default();
    assert_eq!(
        (d.min_severity, d.resolved, d.all),
        (Severity::Critical, false, false)
    );

    let warn = format!("{base}\n[[alert.webhook]]\nurl_env = \"H\"\nroutes = [\"qwne/*\"]\n");
    let w = Config::parse(&warn, "p.toml").unwrap().warnings;
    assert!(
        w.iter().any(|d| d.path == "alert.webhook[0].routes[0]"
            && d.message.contains("matches no configured route")),
        "{w:?}"
    );

    let bad = format!(
        r#"{base}
[[alert.dingtalk]]
webhook_env = "D"
routes = ["", "qwen /*"]
mention = {{ mobiles = ["138-0013-8000"], user_ids = ["<script>"], min_severity = "loud" }}
[[alert.feishu]]
webhook_env = "F"
mention = {{ mobiles = ["13800138000"] }}
[[alert.wecom]]
webhook_env = "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=leaked"
mention = {{ }}
"#
    );
    let errs = Config::parse(&bad, "p.toml").unwrap_err().to_string();
    for want in [
        "alert.dingtalk[0].routes[0]: must not be empty",
        "alert.dingtalk[0].routes[1]: glob \"qwen /*\" has whitespace",
        "alert.dingtalk[0].mention.mobiles[0]: invalid mobile \"138-0013-8000\"",
        "alert.dingtalk[0].mention.user_ids[0]: invalid user id \"<script>\"",
        "alert.dingtalk[0].mention.min_severity: unknown severity \"loud\"",
        "alert.feishu[0].mention.mobiles[0]: Feishu bots mention by user id only",
        "alert.wecom[0].webhook_env: must name an environment variable",
        "alert.wecom[0].mention: names nobody",
    ] {
        assert!(errs.contains(want), "missing {want:?} in:\n{errs}");
    }
    assert!(!errs.contains("key=leaked"), "{errs}");
    assert!(errs.lines().all(|l| l.starts_with("p.toml:")), "{errs}");
    let unknown = format!("{base}\n[[alert.email]]\nsmtp_url_env = \"S\"\nfrom = \"a@b.c\"\nto = [\"a@b.c\"]\nmention = {{ all = true }}\n");
    let e = Config::parse(&unknown, "p.toml").unwrap_err().to_string();
    assert!(
        e.contains("unknown key") || e.contains("unknown field"),
        "{e}"
    );
}
