//! Alerts end to end against fake receivers that are real HTTP servers on 127.0.0.1:0 and
//! verify signatures the way DingTalk and Feishu do (and answer their real bodies), a webhook
//! receiver that checks the HMAC header, and a tiny SMTP server speaking a real SMTP dialogue.
//! Time is a `ManualClock`: retries "an hour later" are an `advance`, not a sleep.

use crate::common;
use crate::on_both_engines;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};

use probeok::alert::email::Email;
use probeok::alert::group::{Draft, Grouper};
use probeok::alert::{AlertService, Lang, Severity};
use probeok::clock::{Clock, ManualClock};
use probeok::config::{Config, EmailConfig, MaintenanceConfig};
use probeok::health::{Finding, FindingKind, HealthEvent, State as S};
use probeok::route::RouteId;
use probeok::store::StoreOptions;

use common::alerts::*;
use common::pg::TestDb;

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn signed_and_unsigned_messages_arrive_and_verify() {
    let clock = Arc::new(ManualClock::new(t0()));
    let ds = Fake::new(Kind::DingTalk, Some("SECtest"), clock.clone());
    let du = Fake::new(Kind::DingTalk, None, clock.clone());
    let fs = Fake::new(Kind::Feishu, Some("this is secret"), clock.clone());
    let fu = Fake::new(Kind::Feishu, None, clock.clone());
    let ws = Fake::new(Kind::Webhook, Some("whsec"), clock.clone());
    let wu = Fake::new(Kind::Webhook, None, clock.clone());
    let mut chans = Vec::new();
    for (name, f, secret) in [
        ("dingtalk[0]", &ds, Some("SECtest")),
        ("dingtalk[1]", &du, None),
    ] {
        chans.push(dingtalk(
            name,
            serve(f.clone(), None).await.0,
            secret,
            Severity::Warning,
        ));
    }
    chans.push(feishu(
        "feishu[0]",
        serve(fs.clone(), None).await.0,
        Some("this is secret"),
    ));
    chans.push(feishu("feishu[1]", serve(fu.clone(), None).await.0, None));
    chans.push(webhook(
        "webhook[0]",
        serve(ws.clone(), None).await.0,
        Some("whsec"),
        Severity::Warning,
    ));
    chans.push(webhook(
        "webhook[1]",
        serve(wu.clone(), None).await.0,
        None,
        Severity::Warning,
    ));
    let rig = rig(chans, clock.clone(), |_| {}).await;

    assert_eq!(rig.push(vec![critical(3, t0())]).await, 6);
    let round = rig.service.deliver().await.unwrap();
    assert_eq!((round.delivered, round.failed), (6, 0), "{round:?}");
    for f in [&ds, &du, &fs, &fu, &ws, &wu] {
        assert_eq!(f.got().len(), 1, "{:?}", f.kind);
        assert_eq!(f.bad_signatures.load(Ordering::SeqCst), 0);
    }
    assert_eq!(ds.got()[0].ts, Some(t0().timestamp_millis()));
    assert_eq!(fs.got()[0].ts, Some(t0().timestamp()));
    // Readable: zh on DingTalk, en on Feishu and the webhook, with the route link and runbook.
    let md = ds.got()[0].body["markdown"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        md.contains("发生了什么") && md.contains("qwen/cn-beijing/qwen-max-03"),
        "{md}"
    );
    assert!(
        md.contains("http://status.example.com/routes/qwen%2Fcn-beijing%2Fqwen-max-03"),
        "{md}"
    );
    assert!(
        md.contains("https://wiki.example.com/llm-runbook#unavailable"),
        "{md}"
    );
    assert!(
        md.contains("10:00-11:00") && md.contains("1.1 s ± 0.3 s"),
        "{md}"
    );
    assert!(
        md.contains("chat-main (primary)") && md.contains("未切换"),
        "{md}"
    );
    let card = fs.got()[0].body["card"].to_string();
    assert!(
        card.contains("[CRITICAL] qwen/cn-beijing/qwen-max-03 unavailable"),
        "{card}"
    );
    assert!(
        card.contains("What happened") && card.contains("not shifted"),
        "{card}"
    );
    let w = &ws.got()[0];
    assert_eq!(w.body["severity"], "critical");
    assert_eq!(w.delivery.as_deref(), w.body["key"].as_str());
    // Every row is delivered.
    assert!(rig
        .outbox()
        .iter()
        .all(|r| r.status == "delivered" && r.attempts == 1));
}

#[tokio::test]
async fn errcode_310000_is_retried_and_an_hour_later_signed_afresh() {
    let clock = Arc::new(ManualClock::new(t0()));
    let ding = Fake::new(Kind::DingTalk, Some("SECtest"), clock.clone());
    let (addr, _h) = serve(ding.clone(), None).await;
    let rig = rig(
        vec![dingtalk(
            "dingtalk[0]",
            addr,
            Some("SECtest"),
            Severity::Warning,
        )],
        clock.clone(),
        |_| {},
    )
    .await;
    ding.reject.store(1, Ordering::SeqCst); // "keywords not in content", HTTP 200

    rig.push(vec![critical(1, t0())]).await;
    let r = rig.service.deliver().await.unwrap();
    assert_eq!((r.delivered, r.failed), (0, 1));
    assert_eq!(rig.service.metrics().get("dingtalk[0]", "delivered"), 0);
    assert_eq!(rig.service.metrics().get("dingtalk[0]", "failed"), 1);
    let row = &rig.outbox()[0];
    assert_eq!((row.status.as_str(), row.attempts), ("pending", 1));
    assert!(row.last_error.as_deref().unwrap().contains("310000"));
    assert!(!row.last_error.as_deref().unwrap().contains("access_token"));
    // Not due yet: nothing is sent.
    assert_eq!(rig.service.deliver().await.unwrap().delivered, 0);

    // An hour later the first signature would be stale; the retry signs again.
    clock.advance(Duration::from_secs(3600));
    let r = rig.service.deliver().await.unwrap();
    assert_eq!(r.delivered, 1, "{r:?}");
    assert_eq!(ding.bad_signatures.load(Ordering::SeqCst), 0);
    let got = ding.got();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].ts,
        Some((t0() + chrono::Duration::hours(1)).timestamp_millis())
    );
    assert_eq!(rig.outbox()[0].status, "delivered");
}

#[tokio::test]
async fn a_receiver_down_for_a_while_gets_everything_once_when_back() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, Some("whsec"), clock.clone());
    let (addr, h) = serve(hook.clone(), None).await;
    h.abort();
    let _ = h.await;
    let rig = rig(
        vec![webhook("webhook[0]", addr, Some("whsec"), Severity::Info)],
        clock.clone(),
        |_| {},
    )
    .await;

    // Five alerts on five routes of two providers, pushed twice (the second time is a no-op).
    let events = |t| {
        vec![
            critical(1, t),
            transition(
                &RouteId::new("deepseek", "cn-beijing", "deepseek-ai/DeepSeek-V3"),
                S::Normal,
                S::Warning,
                t,
                None,
            ),
        ]
    };
    let mut expected = 0;
    for k in 0..5 {
        let t = t0() + chrono::Duration::minutes(k);
        expected += rig.push(events(t)).await;
        rig.push(events(t)).await;
    }
    assert_eq!(expected, 10);
    assert_eq!(rig.outbox().len(), 10);
    // Down for 20 minutes: every round fails, one attempt per round for the channel.
    for _ in 0..20 {
        rig.service.deliver().await.unwrap();
        clock.advance(Duration::from_secs(60));
    }
    assert!(hook.got().is_empty());
    assert!(rig.service.metrics().get("webhook[0]", "failed") >= 3);
    // Back on the same port.
    let (_, _h2) = serve(hook.clone(), Some(addr)).await;
    clock.advance(Duration::from_secs(600));
    let mut delivered = 0;
    for _ in 0..5 {
        delivered += rig.service.deliver().await.unwrap().delivered;
        clock.advance(Duration::from_secs(600));
    }
    assert_eq!(delivered, 10);
    let mut keys: Vec<String> = hook
        .got()
        .iter()
        .map(|g| g.delivery.clone().unwrap())
        .collect();
    assert_eq!(keys.len(), 10);
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 10, "each dedup key once");
    assert_eq!(hook.bad_signatures.load(Ordering::SeqCst), 0);
}

on_both_engines! {
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_loses_nothing_and_repeats_nothing_delivered(db: &TestDb) {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _h) = serve(hook.clone(), None).await;
    let chan = || webhook("webhook[0]", addr, None, Severity::Warning);
    let rig = rig_on(db, vec![chan()], clock.clone(), |_| {}).await;
    // Four messages (one route each) are delivered…
    for k in 0..4 {
        rig.push(vec![critical(
            k,
            t0() + chrono::Duration::seconds(k as i64),
        )])
        .await;
    }
    assert_eq!(rig.service.deliver().await.unwrap().delivered, 4);
    // Four more while the receiver is failing…
    hook.reject.store(100, Ordering::SeqCst);
    for k in 4..8 {
        rig.push(vec![critical(
            k,
            t0() + chrono::Duration::seconds(k as i64),
        )])
        .await;
    }
    assert_eq!(rig.service.deliver().await.unwrap().failed, 1);
    // …and a restart: the process goes away, the store is reopened.
    let Rig { _dir, service, .. } = rig;
    let cfg = service.config();
    let old = service.store.clone();
    drop(service);
    old.close().await.unwrap();
    hook.reject.store(0, Ordering::SeqCst);
    let store = db.open(StoreOptions::default());
    let service = Arc::new(AlertService::new(cfg, store, clock.clone(), vec![chan()]));
    clock.advance(Duration::from_secs(3600));
    let r = service.deliver().await.unwrap();
    assert_eq!(r.delivered, 4, "{r:?}");
    let mut keys: Vec<String> = hook
        .got()
        .iter()
        .map(|g| g.delivery.clone().unwrap())
        .collect();
    assert_eq!(keys.len(), 8);
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 8, "nothing delivered twice");
    // And nothing more to send.
    clock.advance(Duration::from_secs(3600));
    assert_eq!(service.deliver().await.unwrap(), Default::default());
}
}

on_both_engines! {
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolved_after_a_restart_with_duration_and_peak(db: &TestDb) {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _h) = serve(hook.clone(), None).await;
    let chan = || webhook("webhook[0]", addr, None, Severity::Warning);
    let rig = rig_on(db, vec![chan()], clock.clone(), |_| {}).await;
    let r = qwen(7);
    let opened = t0();
    let inc = incident(&r, opened, None, S::Critical);
    rig.push(vec![transition(
        &r,
        S::Degraded,
        S::Critical,
        opened,
        Some(&inc),
    )])
    .await;
    rig.service.deliver().await.unwrap();
    // Restart.
    let Rig { _dir, service, .. } = rig;
    let cfg = service.config();
    let old = service.store.clone();
    drop(service);
    old.close().await.unwrap();
    let store = db.open(StoreOptions::default());
    let service = Arc::new(AlertService::new(cfg, store, clock.clone(), vec![chan()]));
    clock.advance(Duration::from_secs(42 * 60));
    let closed = clock.now();
    let inc = incident(&r, opened, Some(closed), S::Critical);
    let mut g = service.grouper();
    g.push(
        transition(&r, S::Critical, S::Normal, closed, Some(&inc)),
        closed,
    );
    service.enqueue(g.flush(closed), closed).await.unwrap();
    service.deliver().await.unwrap();
    let got = hook.got();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].body["status"], "resolved");
    assert_eq!(got[1].body["severity"], "critical");
    let text = got[1].body["text"].as_str().unwrap();
    assert!(
        text.contains("Duration: 42m0s") && text.contains("Peak: CRITICAL"),
        "{text}"
    );
    // A second close of the same incident sends nothing more.
    let mut g = service.grouper();
    g.push(
        transition(&r, S::Critical, S::Normal, closed, Some(&inc)),
        closed,
    );
    assert_eq!(service.enqueue(g.flush(closed), closed).await.unwrap(), 0);
    // And a WARNING → NORMAL (no incident) says nothing.
    let mut g = service.grouper();
    g.push(transition(&r, S::Warning, S::Normal, closed, None), closed);
    assert!(g.flush(closed).is_empty());
}
}

#[tokio::test]
async fn twenty_routes_of_one_provider_are_one_message_and_egress_inhibits() {
    let clock = Arc::new(ManualClock::new(t0()));
    let ding = Fake::new(Kind::DingTalk, Some("SECtest"), clock.clone());
    let (addr, _h) = serve(ding.clone(), None).await;
    let rig = rig(
        vec![dingtalk(
            "dingtalk[0]",
            addr,
            Some("SECtest"),
            Severity::Warning,
        )],
        clock.clone(),
        |_| {},
    )
    .await;
    let events: Vec<HealthEvent> = (0..20).map(|i| critical(i, t0())).collect();
    assert_eq!(rig.push(events).await, 1);
    rig.service.deliver().await.unwrap();
    let got = ding.got();
    assert_eq!(got.len(), 1);
    let md = got[0].body["markdown"]["text"].as_str().unwrap();
    assert!(md.contains("qwen：20 条线路不可用"), "{md}");
    assert!(
        md.contains("qwen-max-00") && md.contains("qwen-max-19"),
        "{md}"
    );

    // Egress: the finding's message goes out, the per-route messages it explains do not.
    let routes: Vec<RouteId> = vec![
        qwen(5),
        RouteId::new("deepseek", "cn-beijing", "deepseek-ai/DeepSeek-V3"),
    ];
    let egress = Finding {
        kind: FindingKind::Egress,
        routes: routes.clone(),
        providers: vec!["deepseek".into(), "qwen".into()],
        code: "egress".into(),
        text: "2 routes of 2 providers fail together and the control URL fails too".into(),
    };
    let t = t0() + chrono::Duration::minutes(5);
    clock.set(t);
    let mut g = rig.service.grouper();
    g.push(
        HealthEvent::FindingOpened {
            finding: egress.clone(),
            at: t,
        },
        t,
    );
    let r6 = RouteId::new("deepseek", "cn-beijing", "deepseek-ai/DeepSeek-V3");
    let inc = incident(&r6, t, None, S::Degraded);
    g.push(transition(&r6, S::Warning, S::Degraded, t, Some(&inc)), t);
    let drafts: Vec<Draft> = g.flush(t);
    assert_eq!(drafts.len(), 1, "{drafts:#?}");
    assert!(matches!(
        drafts[0].message.subject,
        probeok::alert::Subject::Egress { .. }
    ));
    // While it holds, later route transitions it explains stay inhibited.
    g.push(transition(&r6, S::Degraded, S::Critical, t, Some(&inc)), t);
    assert!(g.flush(t).is_empty());
    rig.service.enqueue(drafts, t).await.unwrap();
    rig.service.deliver().await.unwrap();
    assert_eq!(ding.got().len(), 2);
    let md = ding.got()[1].body["markdown"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        md.contains("本机出口网络故障") && md.contains("DeepSeek-V3"),
        "{md}"
    );
    // It closes: a resolved egress message.
    g.push(
        HealthEvent::FindingClosed {
            finding: egress,
            at: t,
        },
        t,
    );
    let d = g.flush(t);
    assert_eq!(rig.service.enqueue(d, t).await.unwrap(), 1);
}

/// A provider-wide message names every route it groups and every route keeps its own firing
/// row: the message is stored once, so the stored text grows with the routes, not with their
/// square; reminders go out once per message, a restart reads it back shared, and resolving
/// every route deletes it.
#[tokio::test]
async fn a_grouped_message_is_stored_once_however_many_routes_it_names() {
    let mut stored = Vec::new();
    for n in [50usize, 200] {
        let clock = Arc::new(ManualClock::new(t0()));
        let hook = Fake::new(Kind::Webhook, None, clock.clone());
        let (addr, _h) = serve(hook.clone(), None).await;
        let chan = || -> Arc<dyn probeok::alert::Notifier> {
            let vars = env_vars(&[("URL", Some(format!("http://{addr}/hook")))]);
            let c = probeok::config::WebhookConfig {
                url_env: "URL".into(),
                secret_env: None,
                max_per_minute: None,
                options: probeok::config::ChannelOptions {
                    repeat_interval: Some(Duration::from_secs(3600)),
                    ..opts(Severity::Warning, Lang::En)
                },
            };
            Arc::new(
                probeok::alert::webhook::Webhook::from_config(&c, &channel_env("hook", &vars))
                    .unwrap(),
            )
        };
        let rig = rig(vec![chan()], clock.clone(), |_| {}).await;
        let events: Vec<HealthEvent> = (0..n).map(|i| critical(i, t0())).collect();
        assert_eq!(rig.push(events).await, 1, "one message for {n} routes");
        let r = rig.service.store.reader().unwrap();
        let firing = r.alert_firing().unwrap();
        assert_eq!(firing.len(), n);
        assert!(firing
            .iter()
            .all(|f| Arc::ptr_eq(&f.message, &firing[0].message)));
        let (bytes, messages) = r.alert_message_bytes().unwrap();
        assert_eq!(messages, 1);
        stored.push(bytes);
        drop(r);

        // An hour on: one reminder for the message, not one per route.
        clock.advance(Duration::from_secs(3600 + 60));
        rig.service.evaluate(clock.now()).await.unwrap();
        let reminders = rig
            .outbox()
            .into_iter()
            .filter(|e| e.dedup_key.contains("#remind1#"))
            .count();
        assert_eq!(reminders, 1);

        // After a restart the rows still share one text, and every route resolves.
        let Rig {
            _dir, db, service, ..
        } = rig;
        let cfg = service.config();
        let old = service.store.clone();
        drop(service);
        old.close().await.unwrap();
        let store = probeok::store::Store::open(&db, StoreOptions::default()).unwrap();
        let service = Arc::new(AlertService::new(cfg, store, clock.clone(), vec![chan()]));
        let firing = service.store.reader().unwrap().alert_firing().unwrap();
        assert_eq!(firing.len(), n);
        assert!(firing
            .iter()
            .all(|f| Arc::ptr_eq(&f.message, &firing[0].message)));
        let closed = clock.now();
        let mut g = service.grouper();
        for i in 0..n {
            let r = qwen(i);
            let inc = incident(
                &r,
                t0() - chrono::Duration::minutes(1),
                Some(closed),
                S::Critical,
            );
            g.push(
                transition(&r, S::Critical, S::Normal, closed, Some(&inc)),
                closed,
            );
        }
        assert_eq!(service.enqueue(g.flush(closed), closed).await.unwrap(), 1);
        let r = service.store.reader().unwrap();
        assert!(r.alert_firing().unwrap().is_empty());
        assert_eq!(r.alert_message_bytes().unwrap(), (0, 0));
        drop(r);
        service.store.clone().close().await.unwrap();
    }
    // Four times the routes: about four times the text (a copy per row would be sixteen).
    let ratio = stored[1] as f64 / stored[0] as f64;
    assert!((3.0..5.0).contains(&ratio), "{stored:?}");
}

#[tokio::test]
async fn flapping_is_summarised() {
    let mut g = Grouper::new(Duration::ZERO, &[]);
    let r = qwen(1);
    let mut sent = 0;
    let mut flapping = 0;
    for k in 0..20 {
        let t = t0() + chrono::Duration::minutes(k);
        let (from, to) = if k % 2 == 0 {
            (S::Normal, S::Warning)
        } else {
            (S::Warning, S::Normal)
        };
        g.push(transition(&r, from, to, t, None), t);
        for d in g.flush(t) {
            match d.message.subject {
                probeok::alert::Subject::Flapping { .. } => flapping += 1,
                _ => sent += 1,
            }
        }
    }
    // The first few WARNINGs go out; then one summary per 30 minutes instead.
    assert!(sent <= 3, "{sent}");
    assert_eq!(flapping, 1);
}

/// Routes of one provider that flap together (a provider's flaky edge) are one summary.
#[tokio::test]
async fn flapping_routes_of_one_provider_are_one_summary() {
    let mut g = Grouper::new(Duration::ZERO, &[]);
    let mut summaries = Vec::new();
    for k in 0..20 {
        let t = t0() + chrono::Duration::minutes(k);
        let (from, to) = if k % 2 == 0 {
            (S::Normal, S::Warning)
        } else {
            (S::Warning, S::Normal)
        };
        for i in 0..5 {
            g.push(transition(&qwen(i), from, to, t, None), t);
        }
        summaries.extend(
            g.flush(t)
                .into_iter()
                .filter(|d| matches!(d.message.subject, probeok::alert::Subject::Flapping { .. })),
        );
    }
    assert_eq!(summaries.len(), 1);
    let m = &summaries[0].message;
    assert_eq!(m.items.len(), 5);
    let ctx = probeok::alert::RenderCtx::from_config(&Config::default());
    let r = probeok::alert::render::render(m, Lang::En, &ctx);
    assert!(
        r.title
            .contains("qwen: 5 routes are flapping (up to 7 state changes in 30m"),
        "{}",
        r.title
    );
}

#[tokio::test]
async fn maintenance_and_silences_suppress() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _h) = serve(hook.clone(), None).await;
    let token_var = "PROBEOK_TEST_ALERTS_ADMIN_TOKEN";
    let rig = rig(
        vec![webhook("webhook[0]", addr, None, Severity::Info)],
        clock.clone(),
        |c| {
            c.server.admin_token_env = token_var.into();
            c.env.set(token_var, "admin-secret");
            c.maintenance.push(MaintenanceConfig {
                routes: vec!["qwen/*/qwen-max-0?".into()],
                start: t0() - chrono::Duration::minutes(10),
                duration: Duration::from_secs(3600),
                every: None,
            });
        },
    )
    .await;
    // In the window: qwen-max-01 is suppressed, qwen-max-12 is not.
    assert_eq!(rig.push(vec![critical(1, t0())]).await, 0);
    assert_eq!(rig.push(vec![critical(12, t0())]).await, 1);
    assert!(rig.service.metrics().get("webhook[0]", "suppressed") >= 1);

    // A silence through the admin API (bearer token, constant-time compared).
    let config = rig.service.config();
    let (health_tx, health) = tokio::sync::watch::channel(Arc::new(
        probeok::health::HealthSnapshot::initial(&[], t0()),
    ));
    let _keep = health_tx;
    let (events, _) = tokio::sync::broadcast::channel(4);
    let (passive, _rx) = tokio::sync::mpsc::channel(4);
    let routes = Arc::new(config.routes());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let weights = probeok::weights::spawn_publisher(
        probeok::weights::Feeds::new(routes.clone(), health.clone()),
        shutdown.clone(),
    );
    let state = probeok::web::AppState {
        metrics: Arc::new(probeok::web::Metrics::new(&routes)),
        routes,
        config: config.into(),
        store: rig.service.store.clone(),
        clock: clock.clone(),
        jobs: Default::default(),
        health,
        events,
        passive,
        weights,
        ingest_token: None,
        incidents: Arc::new(probeok::web::SnapshotIncidents),
        drift: None,
        drills: None,
        figures: Default::default(),
        guards: Default::default(),
        shutdown,
        vantages: None,
        xds: Default::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let web = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, probeok::web::router(state)).await;
    });
    let url = format!("http://{web}/api/v1/admin/silences");
    let client = reqwest::Client::new();
    let body = json!({"routes": ["qwen/*/qwen-max-1?"], "duration": "2h", "comment": "provider maintenance"});
    let r = client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = client
        .post(&url)
        .bearer_auth("wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client
        .post(&url)
        .bearer_auth("admin-secret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let silence: Value = r.json().await.unwrap();
    let id = silence["id"].as_str().unwrap().to_owned();
    let list: Value = client
        .get(&url)
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["silences"].as_array().unwrap().len(), 1);

    assert_eq!(
        rig.push(vec![critical(13, t0() + chrono::Duration::seconds(1))])
            .await,
        0
    );
    // Probing and storage are untouched: the silence only holds alerts back. Deleted, it is gone.
    let r = client
        .delete(format!("{url}/{id}"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = client
        .delete(format!("{url}/{id}"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        rig.push(vec![critical(14, t0() + chrono::Duration::seconds(2))])
            .await,
        1
    );
    // After the maintenance window, route 01 alerts again.
    clock.advance(Duration::from_secs(3600));
    assert_eq!(rig.push(vec![critical(1, clock.now())]).await, 1);
}

#[tokio::test]
async fn severities_filter_per_channel() {
    let clock = Arc::new(ManualClock::new(t0()));
    let all = Fake::new(Kind::Webhook, None, clock.clone());
    let crit = Fake::new(Kind::Webhook, None, clock.clone());
    let a = serve(all.clone(), None).await.0;
    let c = serve(crit.clone(), None).await.0;
    let rig = rig(
        vec![
            webhook("webhook[0]", a, None, Severity::Info),
            webhook("webhook[1]", c, None, Severity::Critical),
        ],
        clock.clone(),
        |_| {},
    )
    .await;
    let r = qwen(2);
    let inc = incident(&r, t0(), None, S::Degraded);
    rig.push(vec![transition(&r, S::Normal, S::Warning, t0(), None)])
        .await;
    rig.push(vec![transition(
        &r,
        S::Warning,
        S::Degraded,
        t0(),
        Some(&inc),
    )])
    .await;
    rig.push(vec![transition(
        &r,
        S::Degraded,
        S::Critical,
        t0(),
        Some(&inc),
    )])
    .await;
    rig.service.deliver().await.unwrap();
    let sev = |f: &Arc<Fake>| -> Vec<String> {
        f.got()
            .iter()
            .map(|g| g.body["severity"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(sev(&all), ["info", "warning", "critical"]);
    assert_eq!(sev(&crit), ["critical"]);
}

#[tokio::test]
async fn email_goes_through_a_real_smtp_dialogue() {
    let (addr, mails) = smtp_server().await;
    let vars = env_vars(&[("SMTP_URL", Some(format!("smtp://{addr}")))]);
    let c = EmailConfig {
        smtp_url_env: "SMTP_URL".into(),
        from: "probeok@example.com".into(),
        to: vec!["oncall@example.com".into()],
        options: opts(Severity::Warning, Lang::En),
    };
    let email = Email::from_config(&c, &channel_env("email[0]", &vars)).unwrap();
    let clock = Arc::new(ManualClock::new(t0()));
    let rig = rig(vec![Arc::new(email)], clock.clone(), |_| {}).await;
    rig.push(vec![critical(0, t0())]).await;
    let r = rig.service.deliver().await.unwrap();
    assert_eq!(r.delivered, 1, "{r:?} {:?}", rig.outbox());
    let mails = mails.lock().unwrap().clone();
    assert_eq!(mails.len(), 1);
    let m = &mails[0];
    assert!(
        m.contains("Subject: [probeok][CRITICAL] qwen/cn-beijing/qwen-max-00 unavailable"),
        "{m}"
    );
    assert!(m.contains("text/plain") && m.contains("text/html"), "{m}");
}

#[tokio::test]
async fn the_engine_task_sends_a_transition_and_shuts_down_cleanly() {
    let clock = Arc::new(ManualClock::new(t0()));
    let ding = Fake::new(Kind::DingTalk, Some("SECtest"), clock.clone());
    let (addr, _h) = serve(ding.clone(), None).await;
    let rig = rig(
        vec![dingtalk(
            "dingtalk[0]",
            addr,
            Some("SECtest"),
            Severity::Warning,
        )],
        clock.clone(),
        |_| {},
    )
    .await;
    let (tx, rx) = tokio::sync::broadcast::channel(2);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(probeok::alert::run(
        rig.service.clone(),
        rx,
        shutdown.clone(),
    ));
    // Overflow the channel once: the engine logs the lag and goes on.
    for i in 0..4 {
        tx.send(critical(i, t0())).unwrap();
    }
    tx.send(critical(9, t0())).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ding.got().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!ding.got().is_empty());
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn alert_test_prints_what_each_receiver_answered() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let ok = Fake::new(Kind::DingTalk, Some("SECok"), clock.clone());
    let bad = Fake::new(Kind::Feishu, Some("right"), clock.clone());
    let a = serve(ok.clone(), None).await.0;
    let b = serve(bad.clone(), None).await.0;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(
        &file,
        r#"
[storage]
path = "x.db"
[[provider]]
id = "qwen"
api_key_env = "PROBEOK_ALERT_TEST_KEY"
  [[provider.region]]
  id = "cn"
  base_url = "http://127.0.0.1:9/v1"
[[route]]
provider = "qwen"
region = "cn"
model = "qwen-max"
serves = "chat"
[alerting]
group_wait = "0s"
[[alert.dingtalk]]
webhook_env = "T_DING_URL"
secret_env = "T_DING_SECRET"
lang = "en"
[[alert.feishu]]
webhook_env = "T_FEISHU_URL"
secret_env = "T_FEISHU_SECRET"
"#,
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_probeok"))
        .args(["alert", "test", "--config"])
        .arg(&file)
        .env("PROBEOK_ALERT_TEST_KEY", "k")
        .env(
            "T_DING_URL",
            format!("http://{a}/robot/send?access_token=secret-token-123"),
        )
        .env("T_DING_SECRET", "SECok")
        .env(
            "T_FEISHU_URL",
            format!("http://{b}/open-apis/bot/v2/hook/x"),
        )
        .env("T_FEISHU_SECRET", "FeishuWrongSecretX")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("dingtalk[0]") && stdout.contains("ok") && stdout.contains("\"errcode\":0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("feishu[0]") && stdout.contains("failed") && stdout.contains("19021"),
        "{stdout}"
    );
    for secret in ["secret-token-123", "SECok", "FeishuWrongSecretX"] {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{secret} leaked:\n{stdout}\n{stderr}"
        );
    }
    assert_eq!(ok.got().len(), 1);
}

#[test]
fn config_sections_parse_with_spec_defaults_and_located_errors() {
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
"#;
    let ok = format!(
        r#"{base}
[alerting]
runbook_url = "https://wiki.example.com/llm-runbook#{{failure_mode}}"

[[alert.dingtalk]]
webhook_env = "DINGTALK_WEBHOOK"
secret_env = "DINGTALK_SECRET"
min_severity = "critical"
lang = "en"
repeat_interval = "4h"

[[alert.feishu]]
webhook_env = "FEISHU_WEBHOOK"

[[alert.email]]
smtp_url_env = "SMTP_URL"
from = "probeok@example.com"
to = ["oncall@example.com"]

[[alert.webhook]]
url_env = "ALERT_WEBHOOK_URL"

[[maintenance]]
routes = ["qwen/*"]
start = "2026-12-01T02:00:00+08:00"
duration = "2h"
every = "7d"
"#
    );
    let c = Config::parse(&ok, "p.toml").unwrap().config;
    assert_eq!(c.alerting.group_wait, Duration::from_secs(30));
    let d = &c.alert.dingtalk[0].options;
    assert_eq!(
        (d.min_severity, d.lang, d.send_resolved),
        (Severity::Critical, Lang::En, true)
    );
    assert_eq!(d.repeat_interval, Some(Duration::from_secs(4 * 3600)));
    let f = &c.alert.feishu[0].options;
    assert_eq!(
        (f.min_severity, f.lang, f.repeat_interval),
        (Severity::Warning, Lang::Zh, None)
    );
    assert_eq!(c.alert.len(), 4);
    assert_eq!(
        c.maintenance[0].start.to_rfc3339(),
        "2026-11-30T18:00:00+00:00"
    );
    // Missing variables are named by key and variable, never by value.
    let missing = c.missing_secrets();
    assert!(
        missing
            .iter()
            .any(|m| m.path == "alert.dingtalk[0].webhook_env"),
        "{missing:?}"
    );

    let bad = format!(
        r#"{base}
[alerting]
group_wait = "soon"
[[alert.dingtalk]]
webhook_env = "https://oapi.dingtalk.com/robot/send?access_token=x"
min_severity = "loud"
lang = "fr"
[[alert.email]]
smtp_url_env = "SMTP_URL"
from = "nobody"
to = []
[[maintenance]]
routes = []
start = "tomorrow"
duration = "2h"
every = "1h"
"#
    );
    let errs = Config::parse(&bad, "p.toml").unwrap_err().to_string();
    for want in [
        "alerting.group_wait: invalid duration",
        "alert.dingtalk[0].webhook_env: must name an environment variable",
        "alert.dingtalk[0].min_severity: unknown severity \"loud\"",
        "alert.dingtalk[0].lang: unknown language \"fr\"",
        "alert.email[0].from: invalid address",
        "alert.email[0].to: no recipients",
        "maintenance[0].routes: no routes",
        "maintenance[0].start: invalid time",
        "maintenance[0].every: every (1h) is shorter than duration (2h)",
    ] {
        assert!(errs.contains(want), "missing {want:?} in:\n{errs}");
    }
    assert!(!errs.contains("access_token=x"), "{errs}");
    // Every line is located.
    assert!(errs.lines().all(|l| l.starts_with("p.toml:")), "{errs}");
    // Unknown keys are still errors.
    let unknown = format!("{base}\n[[alert.webhook]]\nurl_env = \"X\"\nsecrte_env = \"Y\"\n");
    let e = Config::parse(&unknown, "p.toml").unwrap_err().to_string();
    assert!(e.contains("unknown key"), "{e}");
}

/// A transition that arrives while the database is away is announced once it is back: the
/// engine keeps the grouped message and writes it with a later flush, instead of dropping it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_transition_during_a_database_outage_is_sent_once_it_is_back() {
    let db = TestDb::new(probeok::store::sql::Engine::Postgres);
    let name = db.pg_name().unwrap().to_owned();
    let clock = Arc::new(ManualClock::new(t0()));
    let ding = Fake::new(Kind::DingTalk, Some("SECtest"), clock.clone());
    let (addr, _h) = serve(ding.clone(), None).await;
    let channel = dingtalk("dingtalk[0]", addr, Some("SECtest"), Severity::Warning);
    let rig = rig_on(&db, vec![channel], clock.clone(), |c| {
        c.alerting.group_wait = Duration::ZERO;
    })
    .await;
    let (tx, rx) = tokio::sync::broadcast::channel(16);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(probeok::alert::run(
        rig.service.clone(),
        rx,
        shutdown.clone(),
    ));
    // The database refuses connections and ends every session: what a stopped server looks like.
    let admin = common::pg::admin();
    let set = |allow: bool| {
        admin
            .execute_batch(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS {allow}"))
            .unwrap();
        if !allow {
            admin
                .execute_batch(&format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                ))
                .unwrap();
        }
    };
    set(false);
    tx.send(critical(0, t0())).unwrap();
    // Time for the engine to try (group_wait 0: at once) and fail; the assertion that matters
    // below does not depend on it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(ding.got().is_empty());
    set(true);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while ding.got().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = ding.got();
    assert_eq!(got.len(), 1, "{got:?}");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
}
