//! Alert messages count routes, not state changes: a route that goes WARNING → DEGRADED inside
//! one `group_wait` is one route at its latest state (with its path in one line), in grouped,
//! resolved and reminder messages, in every channel and both languages. The receivers are the
//! real-HTTP fakes (and the SMTP dialogue) of `common::alerts`.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use probeok::alert::dingtalk::DingTalk;
use probeok::alert::email::Email;
use probeok::alert::feishu::Feishu;
use probeok::alert::webhook::Webhook;
use probeok::alert::{ChannelEnv, Lang, Notifier, Severity};
use probeok::clock::ManualClock;
use probeok::config::{ChannelOptions, EmailConfig, RobotConfig, WebhookConfig};
use probeok::health::{HealthEvent, State as S};

use common::alerts::*;

/// One fake receiver of each kind, and a channel of each kind in each language pointing at it.
struct Receivers {
    ding: Arc<Fake>,
    feishu: Arc<Fake>,
    hook: Arc<Fake>,
    mails: Arc<Mutex<Vec<String>>>,
    channels: Vec<Arc<dyn Notifier>>,
}

fn options(lang: Lang) -> ChannelOptions {
    ChannelOptions {
        min_severity: Severity::Info,
        lang,
        repeat_interval: Some(Duration::from_secs(3600)),
        ..ChannelOptions::default()
    }
}

async fn receivers(clock: &Arc<ManualClock>) -> Receivers {
    let ding = Fake::new(Kind::DingTalk, Some("SECcount"), clock.clone());
    let feishu = Fake::new(Kind::Feishu, Some("feishu-secret"), clock.clone());
    let hook = Fake::new(Kind::Webhook, Some("hook-secret"), clock.clone());
    let d = serve(ding.clone(), None).await.0;
    let f = serve(feishu.clone(), None).await.0;
    let h = serve(hook.clone(), None).await.0;
    let (smtp, mails) = smtp_server().await;
    let mut channels: Vec<Arc<dyn Notifier>> = Vec::new();
    for (i, lang) in [Lang::Zh, Lang::En].into_iter().enumerate() {
        channels.extend(kinds(i, lang, d, f, h, smtp));
    }
    Receivers {
        ding,
        feishu,
        hook,
        mails,
        channels,
    }
}

fn kinds(
    i: usize,
    lang: Lang,
    d: SocketAddr,
    f: SocketAddr,
    h: SocketAddr,
    smtp: SocketAddr,
) -> Vec<Arc<dyn Notifier>> {
    let vars: HashMap<String, String> = [
        ("DING", format!("http://{d}/robot/send?access_token=t")),
        ("DING_SECRET", "SECcount".into()),
        ("FEISHU", format!("http://{f}/open-apis/bot/v2/hook/x")),
        ("FEISHU_SECRET", "feishu-secret".into()),
        ("HOOK", format!("http://{h}/hook")),
        ("HOOK_SECRET", "hook-secret".into()),
        ("SMTP", format!("smtp://{smtp}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let env = |kind: &str| ChannelEnv {
        name: format!("{kind}[{i}]"),
        vars: &vars,
        http: http(),
    };
    let robot = |url: &str, secret: &str| RobotConfig {
        webhook_env: url.into(),
        secret_env: Some(secret.into()),
        options: options(lang),
        ..RobotConfig::default()
    };
    vec![
        Arc::new(DingTalk::from_config(&robot("DING", "DING_SECRET"), &env("dingtalk")).unwrap()),
        Arc::new(Feishu::from_config(&robot("FEISHU", "FEISHU_SECRET"), &env("feishu")).unwrap()),
        Arc::new(
            Email::from_config(
                &EmailConfig {
                    smtp_url_env: "SMTP".into(),
                    from: "probeok@example.com".into(),
                    to: vec!["oncall@example.com".into()],
                    options: options(lang),
                },
                &env("email"),
            )
            .unwrap(),
        ),
        Arc::new(
            Webhook::from_config(
                &WebhookConfig {
                    url_env: "HOOK".into(),
                    secret_env: Some("HOOK_SECRET".into()),
                    max_per_minute: None,
                    options: options(lang),
                },
                &env("webhook"),
            )
            .unwrap(),
        ),
    ]
}

/// The text of every delivered message, per channel kind and language: `(zh, en)`.
struct Bodies {
    ding: (String, String),
    feishu: (String, String),
    email: (String, String),
    hook: (Value, Value),
}

fn bodies(r: &Receivers, from: usize) -> Bodies {
    let ding = r.ding.got();
    let feishu = r.feishu.got();
    let hook = r.hook.got();
    let mails = r.mails.lock().unwrap().clone();
    assert_eq!(ding.len(), from + 2, "one message per DingTalk channel");
    assert_eq!(feishu.len(), from + 2, "one message per Feishu channel");
    assert_eq!(hook.len(), from + 2, "one message per webhook channel");
    assert_eq!(mails.len(), from + 2, "one mail per email channel");
    let md = |g: &Got| g.body["markdown"]["text"].as_str().unwrap().to_owned();
    let card = |g: &Got| {
        format!(
            "{}\n{}",
            g.body["card"]["header"]["title"]["content"]
                .as_str()
                .unwrap(),
            g.body["card"]["elements"][0]["text"]["content"]
                .as_str()
                .unwrap()
        )
    };
    // Channels are delivered in order: zh first, then en.
    Bodies {
        ding: (md(&ding[from]), md(&ding[from + 1])),
        feishu: (card(&feishu[from]), card(&feishu[from + 1])),
        email: (decode_mail(&mails[from]), decode_mail(&mails[from + 1])),
        hook: (hook[from].body.clone(), hook[from + 1].body.clone()),
    }
}

/// A mail's subject and plain-text part, undoing the transfer encodings lettre chose.
fn decode_mail(raw: &str) -> String {
    let subject = raw
        .lines()
        .skip_while(|l| !l.starts_with("Subject:"))
        .take_while(|l| l.starts_with("Subject:") || l.starts_with(' '))
        .map(|l| l.trim_start_matches("Subject:").trim())
        .map(|w| {
            // `=?utf-8?b?…?=` encoded words.
            match w
                .strip_prefix("=?utf-8?b?")
                .and_then(|w| w.strip_suffix("?="))
            {
                Some(b) => String::from_utf8(
                    base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b).unwrap(),
                )
                .unwrap(),
                None => w.to_owned(),
            }
        })
        .collect::<String>();
    let part = raw.split("Content-Type: text/plain").nth(1).unwrap_or("");
    let (headers, body) = part.split_once("\r\n\r\n").unwrap_or(("", ""));
    let body = body.split("\r\n--").next().unwrap_or("");
    let text = if headers.contains("base64") {
        let b64: String = body.split_whitespace().collect();
        String::from_utf8(
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64).unwrap(),
        )
        .unwrap()
    } else {
        quoted_printable(body)
    };
    format!("{subject}\n{text}")
}

fn quoted_printable(s: &str) -> String {
    let s = s.replace("=\r\n", "");
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'=' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn warning_then_degraded(i: usize, t: chrono::DateTime<chrono::Utc>) -> Vec<HealthEvent> {
    let r = qwen(i);
    let inc = incident(&r, t, None, S::Degraded);
    vec![
        transition(&r, S::Normal, S::Warning, t, None),
        transition(
            &r,
            S::Warning,
            S::Degraded,
            t + chrono::Duration::seconds(10),
            Some(&inc),
        ),
    ]
}

fn degraded(i: usize, t: chrono::DateTime<chrono::Utc>) -> HealthEvent {
    let r = qwen(i);
    let inc = incident(&r, t, None, S::Degraded);
    transition(&r, S::Normal, S::Degraded, t, Some(&inc))
}

/// Lines of a markdown body that list `route` as a bullet.
fn bullets(md: &str, model: &str) -> usize {
    md.lines()
        .filter(|l| l.starts_with("- ") && l.contains(model))
        .count()
}

#[tokio::test]
async fn one_route_warning_then_degraded_in_one_window_is_one_route() {
    let clock = Arc::new(ManualClock::new(t0()));
    let r = receivers(&clock).await;
    let rig = rig(r.channels.clone(), clock.clone(), |c| {
        c.alerting.group_wait = Duration::from_secs(30);
    })
    .await;
    // Both changes arrive inside one group_wait: the grouper gathers them into one flush.
    let mut g = rig.service.grouper();
    for e in warning_then_degraded(0, t0()) {
        g.push(e, t0());
    }
    let flush_at = g.deadline().unwrap();
    assert_eq!(flush_at, t0() + chrono::Duration::seconds(30));
    clock.set(flush_at);
    let drafts = g.flush(flush_at);
    assert_eq!(drafts.len(), 1, "{drafts:#?}");
    assert_eq!(rig.service.enqueue(drafts, flush_at).await.unwrap(), 8);
    rig.service.deliver().await.unwrap();

    let b = bodies(&r, 0);
    let route = "qwen/cn-beijing/qwen-max-00";
    for (lang, text) in [
        ("zh dingtalk", &b.ding.0),
        ("zh feishu", &b.feishu.0),
        ("zh email", &b.email.0),
    ] {
        assert!(!text.contains("2 条线路"), "{lang}: {text}");
        assert!(
            text.contains(&format!("[警告 WARNING] {route} 不可用")),
            "{lang}: {text}"
        );
        assert!(
            text.contains("正常(NORMAL) → 警告(WARNING) → 降级(DEGRADED)"),
            "{lang}: {text}"
        );
    }
    for (lang, text) in [
        ("en dingtalk", &b.ding.1),
        ("en feishu", &b.feishu.1),
        ("en email", &b.email.1),
    ] {
        assert!(!text.contains("2 routes"), "{lang}: {text}");
        assert!(
            text.contains(&format!("[WARNING] {route} unavailable")),
            "{lang}: {text}"
        );
        assert!(
            text.contains("NORMAL → WARNING → DEGRADED"),
            "{lang}: {text}"
        );
    }
    assert!(
        b.email
            .1
            .contains(&format!("[probeok][WARNING] {route} unavailable")),
        "{}",
        b.email.1
    );
    for (lang, hook) in [("zh", &b.hook.0), ("en", &b.hook.1)] {
        let routes = hook["routes"].as_array().unwrap();
        assert_eq!(routes.len(), 1, "{lang}: {hook}");
        assert_eq!(routes[0]["to"], "DEGRADED", "{lang}: {hook}");
        assert_eq!(
            routes[0]["path"],
            serde_json::json!(["NORMAL", "WARNING", "DEGRADED"]),
            "{lang}: {hook}"
        );
        assert_eq!(hook["severity"], "warning", "{lang}: {hook}");
    }
    assert!(b.hook.1["text"]
        .as_str()
        .unwrap()
        .contains("NORMAL → WARNING → DEGRADED"));
}

#[tokio::test]
async fn three_routes_one_changing_twice_are_three_routes_firing_resolved_and_reminded() {
    let clock = Arc::new(ManualClock::new(t0()));
    let r = receivers(&clock).await;
    let rig = rig(r.channels.clone(), clock.clone(), |_| {}).await;
    let mut events = warning_then_degraded(0, t0());
    events.push(degraded(1, t0()));
    events.push(degraded(2, t0()));
    assert_eq!(rig.push(events).await, 8);
    rig.service.deliver().await.unwrap();

    let b = bodies(&r, 0);
    for (lang, text) in [("zh dingtalk", &b.ding.0), ("zh feishu", &b.feishu.0)] {
        assert!(text.contains("qwen：3 条线路"), "{lang}: {text}");
        assert_eq!(bullets(text, "qwen-max-00"), 1, "{lang}: {text}");
        assert!(
            text.contains("正常(NORMAL) → 警告(WARNING) → 降级(DEGRADED)"),
            "{lang}: {text}"
        );
    }
    assert!(b.email.0.contains("qwen：3 条线路"), "{}", b.email.0);
    for (lang, text) in [
        ("en dingtalk", &b.ding.1),
        ("en feishu", &b.feishu.1),
        ("en email", &b.email.1),
    ] {
        assert!(text.contains("qwen: 3 routes"), "{lang}: {text}");
        assert!(!text.contains("4 routes"), "{lang}: {text}");
    }
    assert_eq!(bullets(&b.ding.1, "qwen-max-00"), 1, "{}", b.ding.1);
    for hook in [&b.hook.0, &b.hook.1] {
        assert_eq!(hook["routes"].as_array().unwrap().len(), 3, "{hook}");
    }
    assert!(b.hook.1["title"]
        .as_str()
        .unwrap()
        .contains("qwen: 3 routes"));

    // A reminder an hour later still counts routes.
    let t = t0() + chrono::Duration::minutes(61);
    clock.set(t);
    assert_eq!(rig.service.evaluate(t).await.unwrap(), 8);
    rig.service.deliver().await.unwrap();
    let b = bodies(&r, 2);
    assert!(
        b.ding.0.contains("qwen：3 条线路") && b.ding.0.contains("仍在告警"),
        "{}",
        b.ding.0
    );
    assert!(
        b.feishu.1.contains("qwen: 3 routes") && b.feishu.1.contains("still firing"),
        "{}",
        b.feishu.1
    );
    assert!(
        b.email.1.contains("[REMINDER] qwen: 3 routes"),
        "{}",
        b.email.1
    );
    assert_eq!(b.hook.1["routes"].as_array().unwrap().len(), 3);

    // They resolve in one window; route 0's close is reported twice (→ NORMAL, → UNKNOWN).
    let closed = t + chrono::Duration::minutes(1);
    clock.set(closed);
    let mut events = Vec::new();
    for i in 0..3 {
        let route = qwen(i);
        let inc = incident(&route, t0(), Some(closed), S::Degraded);
        events.push(transition(
            &route,
            S::Degraded,
            S::Normal,
            closed,
            Some(&inc),
        ));
        if i == 0 {
            events.push(transition(
                &route,
                S::Normal,
                S::Unknown,
                closed,
                Some(&inc),
            ));
        }
    }
    assert_eq!(rig.push(events).await, 8);
    rig.service.deliver().await.unwrap();
    let b = bodies(&r, 4);
    assert!(b.ding.0.contains("[已恢复] qwen：3 条线路"), "{}", b.ding.0);
    assert_eq!(bullets(&b.ding.0, "qwen-max-00"), 1, "{}", b.ding.0);
    assert!(
        b.feishu.1.contains("[RESOLVED] qwen: 3 routes"),
        "{}",
        b.feishu.1
    );
    assert!(
        b.email.1.contains("[probeok][RESOLVED] qwen: 3 routes"),
        "{}",
        b.email.1
    );
    assert_eq!(b.hook.0["routes"].as_array().unwrap().len(), 3);
    assert_eq!(b.hook.1["status"], "resolved");
}
