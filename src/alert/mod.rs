//! Alerts: health events in, messages to DingTalk, Feishu/Lark, WeCom, email and webhooks out —
//! never lost, never spammed, readable at 4 a.m.
//!
//! The flow, inside [`run`] (one task):
//!
//! 1. [`group`]: transitions and findings collected for `[alerting] group_wait`, then turned
//!    into [`Message`]s — a provider-wide failure is one message listing its routes, an egress
//!    finding inhibits the per-route messages it explains, a flapping route is summarised.
//! 2. [`maintenance`]: `[[maintenance]]` windows and silences (admin API) drop what they cover.
//! 3. [`outbox`]: every message is written, per channel whose `min_severity` it reaches, to a
//!    SQLite outbox under a dedup key, *then* delivered with exponential backoff and jitter
//!    (at least once; a restart resumes what is pending; past [`outbox::MAX_AGE`] it is
//!    dropped with a log line and a counter).
//! 4. Channels ([`Notifier`]): [`dingtalk`], [`feishu`], [`email`], [`webhook`], [`wecom`],
//!    and for on-call teams elsewhere [`slack`], [`teams`], [`telegram`], [`pagerduty`],
//!    [`opsgenie`] (their shared pieces in [`oncall`]; which trigger a resolution may resolve in
//!    [`announced`]), each built by `from_config(&table, &ChannelEnv)`. Robots are signed at *send* time
//!    (signatures expire) and their HTTP-200 error bodies are failures. [`routing`] decides
//!    per channel which routes it owns (a group is regrouped over them) and who is mentioned.
//!
//! Beside it, once a minute: SLO burn-rate alerts ([`burn`], from the store's rollups) and
//! reminders (`repeat_interval`). Which alerts are firing lives in the store (`alert_state`),
//! so a resolved message still goes out after a restart.
//!
//! [`render`] writes the text (zh and en): what happened, since when, the evidence against the
//! baseline, the failure mode, affected logical models, traffic, the route page and runbook.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub(crate) mod announced;
pub mod burn;
pub mod dingtalk;
pub mod email;
pub(crate) mod engine;
pub mod feishu;
pub mod group;
pub(crate) mod maintenance;
pub mod oncall;
pub mod opsgenie;
pub mod outbox;
pub mod pagerduty;
pub mod render;
pub(crate) mod routing;
pub(crate) mod silences;
pub mod slack;
pub mod subscribers;
pub mod tally;
pub mod teams;
pub mod telegram;
// Stored message texts, each parsed once however many routes' rows share it.
pub(crate) mod texts;
pub mod webhook;
pub mod wecom;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::config::{ChannelOptions, Config};
use crate::health::{FailureMode, State};
use crate::route::RouteId;

pub use crate::lang::Lang;
pub use crate::severity::Severity;
pub use engine::{run, AlertService, EVALUATE_EVERY, LOST_AFTER};

/// Firing, resolved, a reminder of something still firing, or `alert test`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Firing,
    Resolved,
    Reminder,
    Test,
}

/// What a message is about.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Subject {
    /// One route (`items` has one entry).
    Route,
    /// Several routes of one provider at once (`items` lists them).
    Provider { provider: String },
    /// Our own egress fails, not the providers (`items` lists the routes it explains).
    Egress { providers: Vec<String> },
    /// Probes fine while real traffic fails: the requests, not the provider.
    RequestSide,
    /// A route changing state again and again, summarised.
    Flapping { transitions: u32, window_s: u64 },
    /// The SLO error budget burns too fast.
    BurnRate(burn::BurnAlert),
    /// A scheduled job stopped beating.
    Heartbeat { job: String, silent_s: u64 },
    /// A drift finding of the regression sets on one route (`related` names it).
    Drift(DriftAlert),
    /// The switch controller moved a logical model's traffic, or could not
    /// (`crate::switch`; `note` has the record's sentence).
    Switch { serves: String, action: String },
    /// An upstream 401/403/404 on one route (`related` names it): our key, account or model
    /// name is wrong there. `status` is the upstream's; `None` on the resolved message.
    RouteFault { route: RouteId, status: Option<u16> },
    /// The hourly extra-cost budget passed `degrade_at` (`crate::extra_cost`).
    ExtraCost { used: f64, limit: f64 },
    /// A remote vantage (`probeok agent`) stopped pushing and left the quorum (`related`
    /// names its routes).
    VantageStale { vantage: String },
    /// A new-api / one-api gateway refuses probeok's channel writes (`note` has its answer).
    SyncFailed { kind: String, gateway: String },
    /// A provider's status page declares trouble our probes do not see (`related` names the
    /// routes; `note` has the page's link).
    ProviderDeclared { provider: String, what: String },
    /// A route's rate limit stayed under 10 % on real traffic for 5 minutes (`related` names
    /// the route; `note` has the figures).
    #[serde(rename = "ratelimit_low")]
    RateLimitLow { route: RouteId, limit: String },
    /// A routed model left its provider region's model list (`crate::catalog`; `related`
    /// names the routes that use it).
    ModelWithdrawn { region: String, model: String },
    /// A route's model retires on `retires` (`route.retires`), `days_left` days from now.
    ModelRetiring {
        route: RouteId,
        retires: chrono::NaiveDate,
        days_left: i64,
    },
    /// Alerts of one kind about several routes of one provider, gathered into one message
    /// (`kind`: `burn_rate`, `route_fault` or `drift`; `related` names the routes): one
    /// page per outage, not one per route ([`group::batch`]).
    Grouped {
        provider: String,
        kind: String,
        members: Vec<Member>,
    },
    /// Messages a rate-limited channel could not take in time, folded into one
    /// ([`outbox`]): `total` of them, the first few `shown`.
    Folded {
        total: u32,
        firing: u32,
        resolved: u32,
        per_minute: u32,
        shown: Vec<Message>,
    },
    /// `probeok alert test`.
    Test,
}

/// One route's alert inside a [`Subject::Grouped`] message, under its own firing-state key
/// (`burn:<route>`, `route_fault:<route>`, `drift:<finding>`), so each route resolves alone
/// and the message's incident closes with its last route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub key: String,
    pub subject: Subject,
}

impl Member {
    /// The route the member is about.
    pub fn route(&self) -> Option<&RouteId> {
        match &self.subject {
            Subject::BurnRate(b) => Some(&b.route),
            Subject::RouteFault { route, .. } => Some(route),
            Subject::Drift(d) => Some(&d.route),
            _ => None,
        }
    }
}

/// A drift finding's evidence, bounded and language-neutral (see [`DriftAlert::from_finding`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriftAlert {
    pub route: RouteId,
    pub set: String,
    /// `pass_rate_drop`, `length_shift`, `validity_drop` or `model_changed`.
    pub kind: String,
    /// `fisher_exact_one_sided`, `mann_whitney_u_two_sided` or `none`.
    pub test: String,
    pub p_value: Option<f64>,
    /// Passed / judged cases of the route's own earlier runs, and of the runs judged.
    pub before_passed: u64,
    pub before_total: u64,
    pub after_passed: u64,
    pub after_total: u64,
    pub before_model: Option<String>,
    pub after_model: Option<String>,
    /// At most [`DriftAlert::MAX_EXAMPLES`], each answer cut to [`DriftAlert::MAX_EXAMPLE_CHARS`].
    pub examples: Vec<DriftExampleLine>,
}

/// One case's answer before and after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriftExampleLine {
    pub case: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

impl DriftAlert {
    pub const MAX_EXAMPLES: usize = 2;
    pub const MAX_EXAMPLE_CHARS: usize = 200;

    pub fn from_finding(f: &crate::drift::DriftFinding) -> Self {
        let cut = |s: &Option<String>| {
            s.as_deref()
                .map(|s| crate::probe::outcome::truncate_chars(s, Self::MAX_EXAMPLE_CHARS))
        };
        let e = &f.evidence;
        Self {
            route: f.route.clone(),
            set: f.set.clone(),
            kind: f.kind.as_str().to_owned(),
            test: e.test.clone(),
            p_value: e.p_value,
            before_passed: e.before.passed,
            before_total: e.before.total,
            after_passed: e.after.passed,
            after_total: e.after.total,
            before_model: e.model.as_ref().and_then(|m| m.before_model.clone()),
            after_model: e.model.as_ref().and_then(|m| m.after_model.clone()),
            examples: e
                .examples
                .iter()
                .take(Self::MAX_EXAMPLES)
                .map(|x| DriftExampleLine {
                    case: x.case.clone(),
                    before: cut(&x.before),
                    after: cut(&x.after),
                })
                .collect(),
        }
    }
}

/// One route inside a message, with everything a reader needs to act.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteItem {
    pub route: RouteId,
    /// The logical models (`serves`) the route carries, with its tier (`chat-main (primary)`).
    pub serves: Vec<String>,
    pub from: State,
    pub to: State,
    /// When the route entered `to`.
    pub at: DateTime<Utc>,
    pub reason_code: String,
    pub reason_text: String,
    pub failure_mode: Option<FailureMode>,
    /// One line of numbers against the baseline (bucket, mean ± σ, threshold, error rate).
    pub evidence: Option<EvidenceLine>,
    pub incident_id: Option<String>,
    pub opened_at: Option<DateTime<Utc>>,
    pub closed_at: Option<DateTime<Utc>>,
    pub peak: Option<State>,
    /// Whether traffic was moved off the route: `None` while no switch controller reports it.
    pub shifted: Option<bool>,
    /// Every state the route went through inside one grouping window, oldest first, when it
    /// changed more than once (`NORMAL, WARNING, DEGRADED`); empty after a single change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<State>,
    /// The shared cause the route's incident was judged with (`provider/region:class`): a
    /// channel told of a cause hears of its later routes only when they make it worse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

impl RouteItem {
    /// `NORMAL → WARNING → DEGRADED`: the path inside the window, else `from → to`.
    pub fn states(&self) -> Vec<State> {
        if self.path.len() >= 2 {
            self.path.clone()
        } else {
            vec![self.from, self.to]
        }
    }
}

/// The numbers a transition was decided on, kept small and language-neutral.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceLine {
    pub bucket: Option<String>,
    pub baseline_mean_ms: Option<f64>,
    pub baseline_stddev_ms: Option<f64>,
    pub baseline_samples: Option<usize>,
    pub threshold_ms: Option<f64>,
    pub observed_ms: Option<f64>,
    pub error: Option<String>,
    pub http_status: Option<u16>,
    pub error_total: u32,
    pub error_failures: u32,
    pub error_window_s: u64,
}

/// A message before it is written for a channel: stored as JSON in the outbox, rendered in the
/// channel's language at send time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Stable across restarts for the same alert; the outbox dedup key is `key#channel`.
    pub key: String,
    pub severity: Severity,
    pub status: Status,
    pub subject: Subject,
    pub at: DateTime<Utc>,
    pub items: Vec<RouteItem>,
    /// Routes concerned without a state change of their own (egress, request-side findings).
    #[serde(default)]
    pub related: Vec<RouteId>,
    /// A finding's or summary's own sentence.
    pub note: Option<String>,
    /// On a resolution for an incident tool (PagerDuty, Opsgenie): the keys it resolves, each
    /// a trigger no route still firing stands for ([`announced`]). `None` elsewhere, and on a
    /// resolution that closes by its own key (egress, heartbeats, burn rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolves: Option<Vec<String>>,
}

impl Message {
    /// Route ids the message is about (for silences and maintenance).
    pub fn routes(&self) -> Vec<&RouteId> {
        self.items
            .iter()
            .map(|i| &i.route)
            .chain(self.related.iter())
            .collect()
    }

    /// How many distinct routes the message is about: the number a reader sees first, so a
    /// route that changed state twice inside one window counts once.
    pub fn route_count(&self) -> usize {
        let mut ids = self.routes();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }
}

/// What a receiver answered to one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub status: u16,
    /// The receiver's body, cut to a few hundred characters.
    pub body: String,
}

/// Why a delivery failed. Never holds a webhook URL, token or secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AlertError {
    /// No answer: connect, TLS, timeout (the URL is stripped).
    #[error("transport: {0}")]
    Transport(String),
    /// An answer that is not a success (HTTP status, or DingTalk/Feishu error code in a 200).
    #[error("rejected: HTTP {status}: {body}")]
    Rejected { status: u16, body: String },
    /// The receiver asked us to slow down (WeCom `45009`): retried no sooner than
    /// `retry_after_s` seconds, whatever the backoff says.
    #[error("throttled: HTTP {status}: {body}")]
    Throttled {
        status: u16,
        body: String,
        retry_after_s: u64,
    },
    /// A refusal that no retry will change (Slack `channel_not_found`, PagerDuty's 400 for an
    /// invalid event): recorded with the receiver's reason and not tried again.
    #[error("refused: HTTP {status}: {body}")]
    Refused { status: u16, body: String },
    /// The channel cannot be used as configured (a bad SMTP URL, a missing variable).
    #[error("config: {0}")]
    Config(String),
    #[error("store: {0}")]
    Store(String),
}

impl AlertError {
    /// The least wait before the next attempt the receiver asked for, if it did.
    pub fn retry_after(&self) -> Option<chrono::Duration> {
        match self {
            AlertError::Throttled { retry_after_s, .. } => Some(chrono::Duration::seconds(
                i64::try_from(*retry_after_s).unwrap_or(3600),
            )),
            _ => None,
        }
    }

    /// Whether retrying cannot help (see [`AlertError::Refused`]).
    pub fn is_permanent(&self) -> bool {
        matches!(self, AlertError::Refused { .. })
    }
}

impl From<crate::store::StoreError> for AlertError {
    fn from(e: crate::store::StoreError) -> Self {
        AlertError::Store(e.to_string())
    }
}

/// Links and display settings every rendering needs.
#[derive(Debug, Clone)]
pub struct RenderCtx {
    /// `server.public_url` without a trailing slash.
    pub public_url: String,
    pub runbook_url: Option<String>,
    /// Times are shown in this zone too (`[detection] timezone`).
    pub timezone: chrono_tz::Tz,
}

impl RenderCtx {
    pub fn from_config(c: &Config) -> Self {
        Self {
            public_url: c.server.public_url.trim_end_matches('/').to_owned(),
            runbook_url: c.alerting.runbook_url.clone(),
            timezone: c.detection.timezone,
        }
    }
}

/// A place messages go. Implementations render, sign (at send time, with `now`) and post; a
/// success is only what the receiver confirms (`errcode == 0`, `code == 0`, 2xx, `250`).
pub trait Notifier: Send + Sync {
    /// `dingtalk[0]`, `email[1]`, …: the config table it came from (no URL, no secret).
    fn name(&self) -> &str;
    fn options(&self) -> &ChannelOptions;
    /// Most messages per minute the receiver accepts (DingTalk: 20); `None` for no limit.
    fn per_minute(&self) -> Option<u32> {
        None
    }
    /// Most messages per second the receiver accepts (Feishu: 5); `None` for no limit.
    fn per_second(&self) -> Option<u32> {
        None
    }
    fn send<'a>(
        &'a self,
        message: &'a Message,
        ctx: &'a RenderCtx,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Receipt, AlertError>>;
    /// Whether `message` needs a second delivery carrying the mention (WeCom: its markdown
    /// cannot mention phone numbers). It gets its own outbox row, `…#mention`.
    /// Whether the receiver is an incident tool that resolves by the key it was triggered
    /// with (PagerDuty, Opsgenie): its resolutions carry [`Message::resolves`], and one
    /// that resolves nothing (a group with routes still failing) is not sent to it.
    fn resolves_by_key(&self) -> bool {
        false
    }
    fn mention_part(&self, _message: &Message) -> bool {
        false
    }
    /// Sends the mention part of `message` (only called when [`Notifier::mention_part`]).
    fn send_mention<'a>(
        &'a self,
        _message: &'a Message,
        _ctx: &'a RenderCtx,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Receipt, AlertError>> {
        Box::pin(async {
            Err(AlertError::Config(
                "this channel has no separate mention message".into(),
            ))
        })
    }
}

/// Whether a channel takes a message: severity at least `min_severity`; resolved messages only
/// with `send_resolved`.
pub fn accepts(options: &ChannelOptions, m: &Message) -> bool {
    if m.status == Status::Test {
        return true;
    }
    if m.status == Status::Resolved && !options.send_resolved {
        return false;
    }
    m.severity >= options.min_severity
}

/// Where a channel's variables are read: the process environment in the service, a map in
/// tests (so no test has to change the environment of the whole process).
pub trait Vars: Send + Sync {
    /// The variable's value; unset or empty is `None`.
    fn get(&self, var: &str) -> Option<crate::secret::Secret>;
}

/// The process environment.
pub struct ProcessEnv;

impl Vars for ProcessEnv {
    fn get(&self, var: &str) -> Option<crate::secret::Secret> {
        crate::secret::Secret::from_env(var)
    }
}

impl Vars for crate::secret::Env {
    fn get(&self, var: &str) -> Option<crate::secret::Secret> {
        self.secret(var)
    }
}

impl Vars for std::collections::HashMap<String, String> {
    fn get(&self, var: &str) -> Option<crate::secret::Secret> {
        self.get(var)
            .filter(|v| !v.is_empty())
            .map(|v| crate::secret::Secret::new(v.clone()))
    }
}

/// What building one channel needs besides its config table: its name (`dingtalk[0]`), where
/// its variables come from and the HTTP client the webhook-style channels share. Every
/// channel is built the same way: `Channel::from_config(&table, &env)`.
pub struct ChannelEnv<'a> {
    pub name: String,
    pub vars: &'a dyn Vars,
    pub http: reqwest::Client,
}

impl ChannelEnv<'_> {
    /// Reads a variable the channel needs; the error names the channel and the variable only.
    pub fn secret(&self, var: &str) -> Result<crate::secret::Secret, AlertError> {
        self.vars.get(var).ok_or_else(|| {
            AlertError::Config(format!(
                "{}: environment variable {var} is not set (or empty)",
                self.name
            ))
        })
    }

    /// An optional variable (a signing secret): none when no variable is named, an error when
    /// one is named but unset.
    pub fn secret_opt(
        &self,
        var: Option<&String>,
    ) -> Result<Option<crate::secret::Secret>, AlertError> {
        var.map(|v| self.secret(v)).transpose()
    }
}

/// Builds every configured channel from the config's environment, reading its variables now.
/// Errors name the channel and the variable, never a value.
pub fn channels(c: &Config) -> Result<Vec<Arc<dyn Notifier>>, AlertError> {
    build_channels(c, &c.env, http_client()?)
}

/// Builds every configured channel, in the order `probeok alert test --channel N` counts them:
/// dingtalk, feishu, email, webhook, wecom, slack, teams, telegram, pagerduty, opsgenie.
pub fn build_channels(
    c: &Config,
    vars: &dyn Vars,
    http: reqwest::Client,
) -> Result<Vec<Arc<dyn Notifier>>, AlertError> {
    let env = |name: String| ChannelEnv {
        name,
        vars,
        http: http.clone(),
    };
    let a = &c.alert;
    let mut out: Vec<Arc<dyn Notifier>> = Vec::new();
    for (i, r) in a.dingtalk.iter().enumerate() {
        let e = env(format!("dingtalk[{i}]"));
        out.push(Arc::new(dingtalk::DingTalk::from_config(r, &e)?));
    }
    for (i, r) in a.feishu.iter().enumerate() {
        let e = env(format!("feishu[{i}]"));
        out.push(Arc::new(feishu::Feishu::from_config(r, &e)?));
    }
    for (i, r) in a.email.iter().enumerate() {
        let e = env(format!("email[{i}]"));
        out.push(Arc::new(email::Email::from_config(r, &e)?));
    }
    for (i, r) in a.webhook.iter().enumerate() {
        let e = env(format!("webhook[{i}]"));
        out.push(Arc::new(webhook::Webhook::from_config(r, &e)?));
    }
    for (i, r) in a.wecom.iter().enumerate() {
        let e = env(format!("wecom[{i}]"));
        out.push(Arc::new(wecom::Wecom::from_config(r, &e)?));
    }
    for (i, r) in a.slack.iter().enumerate() {
        let e = env(format!("slack[{i}]"));
        out.push(Arc::new(slack::Slack::from_config(r, &e)?));
    }
    for (i, r) in a.teams.iter().enumerate() {
        let e = env(format!("teams[{i}]"));
        out.push(Arc::new(teams::Teams::from_config(r, &e)?));
    }
    for (i, r) in a.telegram.iter().enumerate() {
        let e = env(format!("telegram[{i}]"));
        out.push(Arc::new(telegram::Telegram::from_config(r, &e)?));
    }
    for (i, r) in a.pagerduty.iter().enumerate() {
        let e = env(format!("pagerduty[{i}]"));
        out.push(Arc::new(pagerduty::PagerDuty::from_config(r, &e)?));
    }
    for (i, r) in a.opsgenie.iter().enumerate() {
        let e = env(format!("opsgenie[{i}]"));
        out.push(Arc::new(opsgenie::Opsgenie::from_config(r, &e)?));
    }
    Ok(out)
}

/// The HTTP client every webhook-style channel shares.
pub fn http_client() -> Result<reqwest::Client, AlertError> {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()
        .map_err(|e| AlertError::Config(format!("http client: {}", e.without_url())))
}

/// Posts JSON and returns the status and body; transport errors lose their URL.
pub(crate) async fn post_json(
    http: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    headers: &[(&str, String)],
) -> Result<(u16, String), AlertError> {
    let mut req = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| AlertError::Transport(e.without_url().to_string()))?;
    let status = resp.status().as_u16();
    let text = resp
        .text()
        .await
        .map_err(|e| AlertError::Transport(e.without_url().to_string()))?;
    Ok((status, cut(&text, 300)))
}

/// At most `n` characters, with `…` when cut.
pub(crate) fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(n).collect();
        out.push('…');
        out
    }
}

/// `probeok_alerts_total{channel,result}`: `delivered`, `failed` (one failed attempt),
/// `dropped` (past the maximum age), `suppressed` (maintenance or silence), `folded` (past the
/// channel's rate, sent inside one summary; or resolved before it was sent); and
/// `probeok_alert_outbox_evicted_total`, rows deleted to keep the outbox within its row bound.
#[derive(Debug, Default)]
pub struct AlertMetrics {
    counts: Mutex<BTreeMap<(String, &'static str), u64>>,
    evicted: std::sync::atomic::AtomicU64,
}

impl AlertMetrics {
    /// Counts outbox rows deleted for the row bound.
    pub fn evicted(&self, n: u64) {
        (self.evicted).fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Outbox rows deleted for the row bound so far.
    pub fn evicted_total(&self) -> u64 {
        self.evicted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every result a channel can count: exported from the start, at 0 until it happens.
    pub const RESULTS: [&'static str; 5] =
        ["delivered", "failed", "dropped", "suppressed", "folded"];

    /// Makes `channel`'s counters exist at 0, so `rate()` and dashboards see the channel
    /// before its first message.
    pub fn declare(&self, channel: &str) {
        let mut m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for r in Self::RESULTS {
            m.entry((channel.to_owned(), r)).or_default();
        }
    }

    pub fn add(&self, channel: &str, result: &'static str) {
        let mut m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((channel.to_owned(), result)).or_default() += 1;
    }

    pub fn get(&self, channel: &str, result: &'static str) -> u64 {
        let m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&(channel.to_owned(), result)).copied().unwrap_or(0)
    }

    /// Every `(channel, result) → count`, for `/metrics`.
    pub fn snapshot(&self) -> Vec<(String, &'static str, u64)> {
        let m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|((c, r), n)| (c.clone(), *r, *n)).collect()
    }
}

/// The test message `probeok alert test` sends.
pub fn test_message(now: DateTime<Utc>) -> Message {
    Message {
        key: format!("test@{}", now.timestamp_millis()),
        severity: Severity::Info,
        status: Status::Test,
        subject: Subject::Test,
        at: now,
        items: Vec::new(),
        related: Vec::new(),
        note: None,
        resolves: None,
    }
}

/// `probeok alert test`: sends the test message to each channel (or channel `only`, 0-based
/// over all channels in the order dingtalk, feishu, email, webhook, wecom, slack, teams,
/// telegram, pagerduty, opsgenie) and returns each
/// channel's name and what its receiver answered.
pub async fn send_test(
    c: &Config,
    only: Option<usize>,
    now: DateTime<Utc>,
) -> Result<Vec<(String, Result<Receipt, AlertError>)>, AlertError> {
    let channels = channels(c)?;
    if let Some(n) = only {
        if n >= channels.len() {
            return Err(AlertError::Config(format!(
                "--channel {n}: there are {} channel(s) (0-based)",
                channels.len()
            )));
        }
    }
    let ctx = RenderCtx::from_config(c);
    let message = test_message(now);
    let mut out = Vec::new();
    for (i, ch) in channels.iter().enumerate() {
        if only.is_some_and(|n| n != i) {
            continue;
        }
        let r = ch.send(&message, &ctx, now).await;
        out.push((ch.name().to_owned(), r));
    }
    Ok(out)
}

/// HMAC-SHA256 of `message` under `key`.
pub(crate) fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    use hmac::{Hmac, Mac};
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = match Hmac::<sha2::Sha256>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => return Vec::new(),
    };
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}
