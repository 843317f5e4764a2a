//! The on-call channels (Slack, Teams, Telegram, PagerDuty, Opsgenie) end to end: health
//! events through the alert engine and its persisted outbox to fake services that check the
//! documented request shapes and answer as the services do (`common::oncall`).

use crate::common;

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::alerts::{http, incident, qwen, rig, t0, transition, Rig};
use common::oncall::{self, Fake, Service};
use probeok::alert::{AlertService, Lang, Notifier, Severity};
use probeok::clock::{Clock, ManualClock};
use probeok::config::{
    ChannelOptions, ChatWebhookConfig, Config, Mention, OpsgenieConfig, PagerDutyConfig,
    TelegramConfig,
};
use probeok::health::{HealthEvent, State as S};
use probeok::store::{Store, StoreOptions};

const SERVICES: [Service; 5] = [
    Service::Slack,
    Service::Teams,
    Service::Telegram,
    Service::PagerDuty,
    Service::Opsgenie,
];

/// The five fakes, served.
struct Fakes(Vec<(Arc<Fake>, std::net::SocketAddr)>);

impl Fakes {
    async fn start() -> Self {
        let mut out = Vec::new();
        for s in SERVICES {
            let f = Fake::new(s);
            let (addr, _h) = oncall::serve(f.clone()).await;
            out.push((f, addr));
        }
        Self(out)
    }

    fn get(&self, s: Service) -> &Arc<Fake> {
        &self.0.iter().find(|(f, _)| f.service == s).unwrap().0
    }

    fn base(&self, s: Service) -> Option<String> {
        let addr = self.0.iter().find(|(f, _)| f.service == s).unwrap().1;
        Some(format!("http://{addr}"))
    }

    fn all(&self) -> impl Iterator<Item = &Arc<Fake>> {
        self.0.iter().map(|(f, _)| f)
    }

    /// Adds one table of each kind, pointed at the fakes, to `c`.
    fn configure(&self, c: &mut Config) {
        let o = ChannelOptions {
            min_severity: Severity::Warning,
            lang: Lang::En,
            ..ChannelOptions::default()
        };
        c.alert.slack.push(ChatWebhookConfig {
            webhook_env: "SLACK_WEBHOOK_URL".into(),
            api_base: self.base(Service::Slack),
            mention: Some(Mention {
                user_ids: vec!["U024BE7LH".into(), "SAZ94GDB8".into()],
                all: true,
                min_severity: Severity::Critical,
                ..Mention::default()
            }),
            options: o.clone(),
        });
        c.alert.teams.push(ChatWebhookConfig {
            webhook_env: "TEAMS_WEBHOOK_URL".into(),
            api_base: self.base(Service::Teams),
            mention: None,
            options: o.clone(),
        });
        c.alert.telegram.push(TelegramConfig {
            token_env: "TELEGRAM_BOT_TOKEN".into(),
            chat_id: oncall::TELEGRAM_CHAT.into(),
            api_base: self.base(Service::Telegram),
            options: o.clone(),
        });
        c.alert.pagerduty.push(PagerDutyConfig {
            routing_key_env: "PAGERDUTY_ROUTING_KEY".into(),
            api_base: self.base(Service::PagerDuty),
            options: o.clone(),
        });
        c.alert.opsgenie.push(OpsgenieConfig {
            api_key_env: "OPSGENIE_API_KEY".into(),
            region: "eu".into(),
            api_base: self.base(Service::Opsgenie),
            options: o,
        });
    }
}

fn vars() -> HashMap<String, String> {
    [
        ("SLACK_WEBHOOK_URL", oncall::SLACK_URL),
        ("TEAMS_WEBHOOK_URL", oncall::TEAMS_URL),
        ("TELEGRAM_BOT_TOKEN", oncall::TELEGRAM_TOKEN),
        ("PAGERDUTY_ROUTING_KEY", oncall::PD_ROUTING_KEY),
        ("OPSGENIE_API_KEY", oncall::OPSGENIE_KEY),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn channels(c: &Config) -> Vec<Arc<dyn Notifier>> {
    probeok::alert::build_channels(c, &vars(), http()).unwrap()
}

async fn setup(clock: Arc<ManualClock>) -> (Fakes, Rig) {
    let fakes = Fakes::start().await;
    let mut cfg = Config::default();
    fakes.configure(&mut cfg);
    let rig = rig(channels(&cfg), clock, |c| fakes.configure(c)).await;
    (fakes, rig)
}

/// NORMAL → `to` of route `i` at `t` in an incident opened then.
fn fire(i: usize, to: S, t: chrono::DateTime<chrono::Utc>) -> HealthEvent {
    let r = qwen(i);
    let inc = incident(&r, t, None, to);
    transition(&r, S::Normal, to, t, Some(&inc))
}

/// Back to NORMAL at `t` of route `i`'s incident opened at `opened`.
fn resolve(
    i: usize,
    peak: S,
    opened: chrono::DateTime<chrono::Utc>,
    t: chrono::DateTime<chrono::Utc>,
) -> HealthEvent {
    let r = qwen(i);
    let inc = incident(&r, opened, Some(t), peak);
    transition(&r, peak, S::Normal, t, Some(&inc))
}

/// Everything a test's tracing writes, for the no-secret checks.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let w = logs.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || w.clone())
            .finish();
        (logs.clone(), tracing::subscriber::set_default(sub))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn assert_no_secret(what: &str, text: &str) {
    for s in oncall::secrets() {
        assert!(!text.contains(s), "{what} holds a secret ({s}): {text}");
    }
}

#[tokio::test]
async fn a_degraded_route_reaches_each_channel_once_with_a_link() {
    let clock = Arc::new(ManualClock::new(t0()));
    let (fakes, rig) = setup(clock.clone()).await;
    let (logs, _g) = Logs::capture();
    rig.push(vec![fire(3, S::Degraded, t0())]).await;
    let r = rig.service.deliver().await.unwrap();
    assert_eq!(r.delivered, 5, "{r:?}");
    let link = "http://status.example.com/routes/qwen%2Fcn-beijing%2Fqwen-max-03";
    for f in fakes.all() {
        assert!(
            f.malformed().is_empty(),
            "{:?}: {:?}",
            f.service,
            f.malformed()
        );
        let got = f.got();
        assert_eq!(got.len(), 1, "{:?}", f.service);
        assert!(
            got[0].body.to_string().contains(link),
            "{:?}: {}",
            f.service,
            got[0].body
        );
    }
    // Each service's own shape.
    let slack = &fakes.get(Service::Slack).got()[0].body;
    assert!(slack["text"].as_str().unwrap().contains("qwen-max-03"));
    assert_eq!(slack["blocks"][0]["type"], "header");
    // A warning mentions nobody (the mention is from critical up).
    assert!(!slack.to_string().contains("<!here>"));
    let teams = &fakes.get(Service::Teams).got()[0].body;
    assert_eq!(teams["attachments"][0]["content"]["type"], "AdaptiveCard");
    let tg = &fakes.get(Service::Telegram).got()[0].body;
    assert!(tg["text"].as_str().unwrap().starts_with("<b>"));
    let pd = &fakes.get(Service::PagerDuty).got()[0].body;
    assert_eq!(pd["event_action"], "trigger");
    assert_eq!(pd["payload"]["severity"], "warning");
    let og = &fakes.get(Service::Opsgenie).got();
    assert_eq!(og[0].path, "/v2/alerts");
    assert_eq!(og[0].body["priority"], "P3");
    assert!(og[0].body["message"].as_str().unwrap().chars().count() <= 130);

    // A critical one mentions the Slack user, the user group and @here.
    rig.push(vec![fire(4, S::Critical, t0())]).await;
    rig.service.deliver().await.unwrap();
    let slack = &fakes.get(Service::Slack).got()[1].body;
    let text = slack["text"].as_str().unwrap();
    assert!(
        text.contains("<@U024BE7LH>")
            && text.contains("<!subteam^SAZ94GDB8>")
            && text.contains("<!here>"),
        "{text}"
    );
    assert_eq!(fakes.get(Service::Opsgenie).got()[1].body["priority"], "P1");
    assert_eq!(
        fakes.get(Service::PagerDuty).got()[1].body["payload"]["severity"],
        "critical"
    );
    assert_no_secret("logs", &logs.text());
}

#[tokio::test]
async fn a_rate_limit_wait_is_honoured_and_the_message_arrives_once() {
    let clock = Arc::new(ManualClock::new(t0()));
    let (fakes, rig) = setup(clock.clone()).await;
    let (logs, _g) = Logs::capture();
    for f in fakes.all() {
        f.throttle.store(1, Ordering::SeqCst);
        f.retry_after_s.store(120, Ordering::SeqCst);
    }
    rig.push(vec![fire(1, S::Degraded, t0())]).await;
    let r = rig.service.deliver().await.unwrap();
    assert_eq!((r.delivered, r.failed), (0, 5), "{r:?}");
    // The backoff alone would retry within 5 s; the services asked for 120.
    clock.advance(Duration::from_secs(119));
    assert_eq!(rig.service.deliver().await.unwrap().delivered, 0);
    clock.advance(Duration::from_secs(2));
    assert_eq!(rig.service.deliver().await.unwrap().delivered, 5);
    clock.advance(Duration::from_secs(3600));
    assert_eq!(rig.service.deliver().await.unwrap().delivered, 0);
    for f in fakes.all() {
        assert_eq!(f.got().len(), 1, "{:?}", f.service);
    }
    for row in rig.outbox() {
        assert_eq!(
            (row.status.as_str(), row.attempts),
            ("delivered", 2),
            "{row:?}"
        );
        assert_no_secret("outbox error", row.last_error.as_deref().unwrap_or(""));
    }
    assert_no_secret("logs", &logs.text());
}

#[tokio::test]
async fn a_permanent_refusal_is_recorded_failed_with_the_services_reason() {
    let clock = Arc::new(ManualClock::new(t0()));
    let (fakes, rig) = setup(clock.clone()).await;
    let (logs, _g) = Logs::capture();
    for f in fakes.all() {
        f.refuse.store(1, Ordering::SeqCst);
    }
    rig.push(vec![fire(2, S::Degraded, t0())]).await;
    let r = rig.service.deliver().await.unwrap();
    assert_eq!((r.delivered, r.failed), (0, 5), "{r:?}");
    let reasons: HashMap<String, String> = rig
        .outbox()
        .into_iter()
        .map(|r| {
            assert_eq!(r.status, "dropped", "{r:?}");
            (r.channel, r.last_error.unwrap_or_default())
        })
        .collect();
    for (ch, reason) in [
        ("slack[0]", "HTTP 404: channel_not_found"),
        ("teams[0]", "WorkflowNotFound"),
        ("telegram[0]", "HTTP 403: Forbidden: bot was kicked"),
        ("pagerduty[0]", "invalid event: Length of 'routing_key'"),
        ("opsgenie[0]", "HTTP 422: Request body is not processable"),
    ] {
        assert!(reasons[ch].contains(reason), "{ch}: {}", reasons[ch]);
        assert_no_secret("outbox error", &reasons[ch]);
        assert_eq!(rig.service.metrics().get(ch, "failed"), 1);
    }
    // Not tried again.
    clock.advance(Duration::from_secs(3600));
    assert_eq!(rig.service.deliver().await.unwrap().failed, 0);
    for f in fakes.all() {
        assert!(f.got().is_empty());
    }
    assert_no_secret("logs", &logs.text());
}

#[tokio::test]
async fn resolved_messages_arrive_and_incident_tools_close_by_the_trigger_key() {
    let clock = Arc::new(ManualClock::new(t0()));
    let (fakes, rig) = setup(clock.clone()).await;
    rig.push(vec![fire(5, S::Critical, t0())]).await;
    rig.service.deliver().await.unwrap();
    clock.advance(Duration::from_secs(600));
    rig.push(vec![resolve(5, S::Critical, t0(), clock.now())])
        .await;
    assert_eq!(rig.service.deliver().await.unwrap().delivered, 5);
    for f in fakes.all() {
        assert_eq!(f.got().len(), 2, "{:?}", f.service);
        assert!(f.malformed().is_empty(), "{:?}", f.malformed());
    }
    let slack = fakes.get(Service::Slack).got();
    assert!(
        slack[1].body["text"].as_str().unwrap().contains("RESOLVED"),
        "{}",
        slack[1].body
    );
    let pd = fakes.get(Service::PagerDuty).got();
    assert_eq!(pd[0].body["event_action"], "trigger");
    assert_eq!(pd[1].body["event_action"], "resolve");
    assert_eq!(pd[0].body["dedup_key"], pd[1].body["dedup_key"]);
    let og = fakes.get(Service::Opsgenie).got();
    let alias = og[0].body["alias"].as_str().unwrap();
    assert_eq!(og[1].path, format!("/v2/alerts/{alias}/close"));
    assert_eq!(og[1].query.as_deref(), Some("identifierType=alias"));
}

#[tokio::test]
async fn a_restarted_or_other_monitor_resolves_with_the_key_it_triggered_with() {
    let clock = Arc::new(ManualClock::new(t0()));
    let (fakes, rig) = setup(clock.clone()).await;
    rig.push(vec![fire(6, S::Degraded, t0())]).await;
    rig.service.deliver().await.unwrap();
    let mut cfg = (*rig.service.config()).clone();
    let db = rig.db.clone();
    drop(rig.service);

    // The monitor restarts over the same store: the resolution is written by one instance…
    clock.advance(Duration::from_secs(300));
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let again = AlertService::new(Arc::new(cfg.clone()), store, clock.clone(), channels(&cfg));
    let mut g = again.grouper();
    g.push(resolve(6, S::Degraded, t0(), clock.now()), clock.now());
    assert!(
        again
            .enqueue(g.flush(clock.now()), clock.now())
            .await
            .unwrap()
            > 0
    );
    drop(again);
    // …and sent by another (the pair's other member taking over), built afresh.
    cfg.alert.slack.clear();
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let other = AlertService::new(Arc::new(cfg.clone()), store, clock.clone(), channels(&cfg));
    let r = other.deliver().await.unwrap();
    assert_eq!(r.delivered, 4, "{r:?}");
    let pd = fakes.get(Service::PagerDuty).got();
    assert_eq!(pd.len(), 2);
    assert_eq!(pd[1].body["event_action"], "resolve");
    assert_eq!(pd[0].body["dedup_key"], pd[1].body["dedup_key"]);
    let og = fakes.get(Service::Opsgenie).got();
    assert_eq!(
        og[1].path,
        format!("/v2/alerts/{}/close", og[0].body["alias"].as_str().unwrap())
    );
}

#[tokio::test]
async fn a_20_route_provider_outage_is_one_message_and_one_trigger_per_channel() {
    let clock = Arc::new(ManualClock::new(t0()));
    let (fakes, rig) = setup(clock.clone()).await;
    let events: Vec<HealthEvent> = (0..20).map(|i| fire(i, S::Critical, t0())).collect();
    rig.push(events).await;
    rig.service.deliver().await.unwrap();
    clock.advance(Duration::from_secs(900));
    let now = clock.now();
    rig.push(
        (0..20)
            .map(|i| resolve(i, S::Critical, t0(), now))
            .collect(),
    )
    .await;
    rig.service.deliver().await.unwrap();
    for f in fakes.all() {
        let got = f.got();
        println!(
            "{:?}: {} message(s) for a 20-route outage (firing + resolved)",
            f.service,
            got.len()
        );
        assert_eq!(got.len(), 2, "{:?}", f.service);
        assert!(
            got[0].body.to_string().contains("20"),
            "{:?}: {}",
            f.service,
            got[0].body
        );
    }
    let pd = fakes.get(Service::PagerDuty).got();
    assert_eq!(pd[0].body["event_action"], "trigger");
    assert_eq!(pd[1].body["event_action"], "resolve");
    assert_eq!(pd[0].body["dedup_key"], pd[1].body["dedup_key"]);
}

#[tokio::test]
async fn a_provider_group_is_resolved_at_incident_tools_when_its_last_route_recovers() {
    let clock = Arc::new(ManualClock::new(t0()));
    let (fakes, rig) = setup(clock.clone()).await;
    // Ten routes fail a minute before the ten others: the group's trigger is keyed by one
    // of the first ten, and those recover first.
    let early = t0() - chrono::Duration::minutes(1);
    let opened = |i: usize| if i < 10 { early } else { t0() };
    rig.push((0..20).map(|i| fire(i, S::Critical, opened(i))).collect())
        .await;
    rig.service.deliver().await.unwrap();
    let pd = fakes.get(Service::PagerDuty);
    let og = fakes.get(Service::Opsgenie);
    assert_eq!(pd.got().len(), 1, "one trigger");
    assert_eq!(og.got().len(), 1, "one alert");

    clock.advance(Duration::from_secs(300));
    let now = clock.now();
    rig.push(
        (0..10)
            .map(|i| resolve(i, S::Critical, opened(i), now))
            .collect(),
    )
    .await;
    rig.service.deliver().await.unwrap();
    // The chat channels say which routes recovered; the incident stays open where it pages.
    for f in fakes.all() {
        let n = f.got().len();
        match f.service {
            Service::PagerDuty | Service::Opsgenie => {
                assert_eq!(n, 1, "{:?}: ten routes still fail", f.service)
            }
            _ => assert_eq!(n, 2, "{:?}: the recovery of ten routes", f.service),
        }
    }

    clock.advance(Duration::from_secs(600));
    let now = clock.now();
    rig.push(
        (10..20)
            .map(|i| resolve(i, S::Critical, opened(i), now))
            .collect(),
    )
    .await;
    rig.service.deliver().await.unwrap();
    let got = pd.got();
    assert_eq!(
        got.len(),
        2,
        "{:?}",
        got.iter().map(|g| &g.body).collect::<Vec<_>>()
    );
    assert_eq!(got[1].body["event_action"], "resolve");
    assert_eq!(got[0].body["dedup_key"], got[1].body["dedup_key"]);
    let got = og.got();
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[1].path,
        format!(
            "/v2/alerts/{}/close",
            got[0].body["alias"].as_str().unwrap()
        )
    );
    for f in fakes.all() {
        assert!(
            f.malformed().is_empty(),
            "{:?}: {:?}",
            f.service,
            f.malformed()
        );
    }
}

#[tokio::test]
async fn alert_test_reaches_each_channel_and_leaves_no_incident_open() {
    let fakes = Fakes::start().await;
    let mut cfg = Config::default();
    fakes.configure(&mut cfg);
    let mut env = probeok::secret::Env::given();
    for (k, v) in vars() {
        env.set(k, v);
    }
    cfg.env = env;
    let results = probeok::alert::send_test(&cfg, None, t0()).await.unwrap();
    let names: Vec<&str> = results.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "slack[0]",
            "teams[0]",
            "telegram[0]",
            "pagerduty[0]",
            "opsgenie[0]"
        ]
    );
    for (name, r) in &results {
        assert!(r.is_ok(), "{name}: {r:?}");
        assert_no_secret("answer", &format!("{r:?}"));
    }
    for f in fakes.all() {
        assert!(!f.got().is_empty(), "{:?}", f.service);
    }
    let pd = fakes.get(Service::PagerDuty).got();
    let actions: Vec<&str> = pd
        .iter()
        .map(|g| g.body["event_action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["trigger", "resolve"]);
    assert_eq!(pd[0].body["payload"]["severity"], "info");
    let og = fakes.get(Service::Opsgenie).got();
    assert_eq!(og.len(), 2);
    assert!(og[1].path.ends_with("/close"));

    // A missing variable names the channel and the variable, never a value.
    cfg.env.remove("PAGERDUTY_ROUTING_KEY");
    let e = probeok::alert::send_test(&cfg, None, t0())
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("pagerduty[0]") && e.to_string().contains("PAGERDUTY_ROUTING_KEY"),
        "{e}"
    );
}

#[tokio::test]
async fn every_channel_counter_exists_at_zero_from_the_start() {
    let clock = Arc::new(ManualClock::new(t0()));
    let (_fakes, rig) = setup(clock).await;
    let snap = rig.service.metrics().snapshot();
    for ch in [
        "slack[0]",
        "teams[0]",
        "telegram[0]",
        "pagerduty[0]",
        "opsgenie[0]",
    ] {
        for result in ["delivered", "failed", "dropped", "suppressed"] {
            assert!(
                snap.iter()
                    .any(|(c, r, n)| c == ch && *r == result && *n == 0),
                "{ch} {result}: {snap:?}"
            );
        }
    }
}

#[test]
fn the_tables_parse_and_a_bad_one_is_located() {
    let base = r#"[[provider]]
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
    let good = format!(
        r#"{base}[[alert.slack]]
webhook_env = "SLACK_WEBHOOK_URL"
mention = {{ user_ids = ["U024BE7LH", "SAZ94GDB8"], all = true }}
[[alert.teams]]
webhook_env = "TEAMS_WEBHOOK_URL"
[[alert.telegram]]
token_env = "TELEGRAM_BOT_TOKEN"
chat_id = "-1001234567890"
[[alert.pagerduty]]
routing_key_env = "PAGERDUTY_ROUTING_KEY"
min_severity = "critical"
[[alert.opsgenie]]
api_key_env = "OPSGENIE_API_KEY"
region = "eu"
lang = "en"
"#
    );
    let c = Config::parse(&good, "p.toml").unwrap().config;
    assert_eq!(c.alert.len(), 5);
    assert_eq!(c.alert.opsgenie[0].region, "eu");
    assert_eq!(
        c.alert.pagerduty[0].options.min_severity,
        Severity::Critical
    );

    let bad = format!(
        r#"{base}[[alert.opsgenie]]
api_key_env = "OPSGENIE_API_KEY"
region = "mars"
[[alert.telegram]]
token_env = "123456:secret"
chat_id = "general"
"#
    );
    let errs = match Config::parse(&bad, "p.toml") {
        Ok(_) => panic!("loaded"),
        Err(e) => e.0.iter().map(ToString::to_string).collect::<Vec<_>>(),
    };
    let all = errs.join("\n");
    assert!(
        all.contains("p.toml:13:10: alert.opsgenie[0].region: unknown region \"mars\""),
        "{all}"
    );
    assert!(all.contains("alert.telegram[0].token_env"), "{all}");
    assert!(
        all.contains("alert.telegram[0].chat_id: invalid chat id"),
        "{all}"
    );
    assert!(!all.contains("123456:secret"), "{all}");
}

/// The figures: delivery latency from the transition per channel over 20 transitions, against
/// the local fakes (run with `--nocapture` to see them).
#[tokio::test]
async fn delivery_latency_per_channel_over_20_transitions() {
    let clock = Arc::new(ManualClock::new(t0()));
    let (fakes, rig) = setup(clock.clone()).await;
    let mut lat: HashMap<Service, Vec<Duration>> = HashMap::new();
    for i in 0..20 {
        clock.advance(Duration::from_secs(60));
        let start = std::time::Instant::now();
        rig.push(vec![fire(i, S::Degraded, clock.now())]).await;
        rig.service.deliver().await.unwrap();
        for f in fakes.all() {
            let got = f.got();
            assert_eq!(got.len(), i + 1, "{:?}", f.service);
            lat.entry(f.service).or_default().push(got[i].at - start);
        }
    }
    for s in SERVICES {
        let mut v = lat.remove(&s).unwrap();
        v.sort();
        let p = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
        println!(
            "{s:?}: p50 {:?} p99 {:?} over 20 transitions",
            p(0.5),
            p(0.99)
        );
    }
}

/// Alerts with a state of their own (a route fault, a burn rate, a silent job) are triggered
/// under their firing message's key; their resolution closes that same incident at the
/// incident tools, not one under another name that was never opened.
#[tokio::test]
async fn a_route_fault_is_resolved_at_incident_tools_under_the_key_it_triggered() {
    let clock = Arc::new(ManualClock::new(t0()));
    let (fakes, rig) = setup(clock.clone()).await;
    let route = qwen(3);
    let fault = |status: Option<u16>, at| HealthEvent::RouteFault {
        route: route.clone(),
        status,
        at,
    };
    rig.push(vec![fault(Some(401), t0())]).await;
    rig.service.deliver().await.unwrap();
    clock.advance(Duration::from_secs(300));
    rig.push(vec![fault(None, clock.now())]).await;
    rig.service.deliver().await.unwrap();
    let pd = fakes.get(Service::PagerDuty).got();
    assert_eq!(pd.len(), 2, "{pd:?}");
    assert_eq!(pd[0].body["event_action"], "trigger");
    assert_eq!(pd[1].body["event_action"], "resolve");
    assert_eq!(pd[0].body["dedup_key"], pd[1].body["dedup_key"]);
    let og = fakes.get(Service::Opsgenie).got();
    assert_eq!(og.len(), 2, "{og:?}");
    assert_eq!(
        og[1].path,
        format!("/v2/alerts/{}/close", og[0].body["alias"].as_str().unwrap())
    );
}
