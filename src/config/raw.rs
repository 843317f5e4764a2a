//! Stage one: the file as serde sees it. Loosely typed on purpose — durations, time zones,
//! addresses and integers stay raw here, so that bad values become stage-two diagnostics
//! (all reported at once) instead of serde's first-error-only stop. Serde still rejects syntax
//! errors, wrong types, unknown keys, missing keys and unknown enum values (tiers, kinds,
//! capabilities), each located by its span.
//!
//! Every `Option` is "not in the file": the public section's `Default` supplies the value.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use crate::route::{Capability, Price, ProviderKind, Tier};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub storage: RawStorage,
    #[serde(default)]
    pub probe: RawProbe,
    #[serde(default)]
    pub detection: RawDetection,
    #[serde(default)]
    pub egress: RawEgress,
    #[serde(default, rename = "provider")]
    pub providers: Vec<RawProvider>,
    #[serde(default, rename = "route")]
    pub routes: Vec<RawRoute>,
    #[serde(default)]
    pub slo: RawSlo,
    #[serde(default)]
    pub alerting: RawAlerting,
    #[serde(default)]
    pub alert: RawAlert,
    #[serde(default)]
    pub maintenance: Vec<RawMaintenance>,
    pub drift: Option<RawDrift>,
    #[serde(default)]
    pub proxy: RawProxy,
    #[serde(default)]
    pub switch: RawSwitch,
    #[serde(default)]
    pub budget: RawBudget,
    #[serde(default, rename = "contract")]
    pub contracts: Vec<RawContract>,
    #[serde(default)]
    pub heartbeat: RawHeartbeat,
    #[serde(default)]
    pub drill: RawDrill,
    #[serde(default)]
    pub cluster: RawCluster,
    #[serde(default)]
    pub tracing: RawTracing,
    #[serde(default, rename = "vantage")]
    pub vantages: Vec<RawVantage>,
    #[serde(default)]
    pub quorum: RawQuorum,
    #[serde(default)]
    pub agent: RawAgent,
    #[serde(default, rename = "shadow")]
    pub shadows: Vec<RawShadow>,
    #[serde(default)]
    pub envoy: RawEnvoy,
    #[serde(default)]
    pub haproxy: RawHaproxy,
    #[serde(default)]
    pub subscriptions: RawSubscriptions,
    #[serde(default)]
    pub sync: Vec<RawSync>,
    #[serde(default)]
    pub catalog: RawCatalog,
    #[serde(default)]
    pub capability: RawCapability,
}

/// `[capability]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCapability {
    pub every: Option<String>,
    pub long_prompt: Option<RawLongPrompt>,
}

/// `[capability] long_prompt = { tokens, every }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLongPrompt {
    pub tokens: Option<i64>,
    pub every: Option<String>,
}

/// `[catalog]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCatalog {
    pub every: Option<String>,
}

/// `[[sync]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSync {
    pub kind: super::sync::SyncKind,
    pub url: String,
    pub token_env: String,
    pub user_id: Option<i64>,
    pub channels: std::collections::BTreeMap<String, i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnvoy {
    #[serde(default)]
    pub cluster: Vec<RawEnvoyCluster>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnvoyCluster {
    pub name: String,
    pub routes: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHaproxy {
    pub agent_listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSubscriptions {
    pub enabled: Option<bool>,
    pub email: Option<bool>,
    pub webhook: Option<bool>,
    pub max_subscribers: Option<i64>,
    pub allow_private_webhooks: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShadow {
    pub serves: String,
    pub route: String,
    pub ratio: f64,
    pub max_cost_per_hour: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProfile {
    pub system_prefix: Option<String>,
    pub set: Option<toml::Table>,
    pub drop: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVantage {
    pub id: String,
    pub routes: Option<Vec<String>>,
    pub stale_after: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    pub lease: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuorum {
    pub min_vantages: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTracing {
    pub otlp_endpoint_env: Option<String>,
    pub service_name: Option<String>,
    pub sample_ratio: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAgent {
    pub max_backlog: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawContract {
    pub feature: String,
    pub degraded: Option<RawBehaviour>,
    pub critical: Option<RawBehaviour>,
    pub user_message: Option<String>,
    pub retry_after: Option<String>,
}

/// Exactly one key is expected; stage two says so when there are none or several.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBehaviour {
    pub fallback_model: Option<String>,
    pub async_queue: Option<String>,
    pub cached_response: Option<String>,
    pub reject: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeartbeat {
    pub stale_after: Option<String>,
    pub ping_url_env: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDrill {
    pub off_peak: Option<Vec<Vec<String>>>,
    pub max_duration: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSwitch {
    pub min_dwell: Option<String>,
    pub max_switches_per_hour: Option<i64>,
    pub return_after: Option<String>,
    pub return_healthy_for: Option<String>,
    pub canary: Option<Vec<f64>>,
    pub canary_stage: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudget {
    pub max_extra_cost_per_hour: Option<f64>,
    pub degrade_at: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub listen: Option<String>,
    pub public_url: Option<String>,
    pub admin_token_env: Option<String>,
    pub ingest_token_env: Option<String>,
    pub title: Option<String>,
    pub vantage: Option<String>,
    pub max_connections: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStorage {
    pub path: Option<String>,
    pub url_env: Option<String>,
    pub retention_days: Option<i64>,
    pub rollup_retention_days: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProbe {
    pub interval: Option<String>,
    pub first_byte_timeout: Option<String>,
    pub stall_timeout: Option<String>,
    pub timeout: Option<String>,
    pub jitter: Option<f64>,
    pub stream: Option<bool>,
    pub max_tokens: Option<i64>,
    pub throughput_every: Option<String>,
    pub throughput_prompt: Option<String>,
    pub throughput_max_tokens: Option<i64>,
    pub system: Option<String>,
    pub user: Option<String>,
    pub expect: Option<String>,
    // Confirmation probes.
    pub confirm_after: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDetection {
    pub sigma: Option<f64>,
    pub latency_floor_ratio: Option<f64>,
    pub latency_floor: Option<String>,
    pub baseline_window: Option<i64>,
    pub min_samples: Option<i64>,
    pub buckets: Option<RawBuckets>,
    pub timezone: Option<String>,
    pub degraded_after: Option<i64>,
    pub critical_error_rate: Option<f64>,
    pub error_window: Option<String>,
    pub min_error_samples: Option<i64>,
    pub min_failures: Option<i64>,
    pub critical_after: Option<String>,
    pub critical_degraded_for: Option<String>,
    pub recover_after: Option<String>,
    pub recover_error_rate: Option<f64>,
    pub tps_floor: Option<f64>,
}

/// `"none"` | `"hour"` (any other word is a stage-two error) | `[["HH:MM","HH:MM"], …]`
/// (windows of any length here, so a malformed one is reported with its index).
#[derive(Debug)]
pub(super) enum RawBuckets {
    Mode(String),
    Windows(Vec<Vec<String>>),
}

impl<'de> Deserialize<'de> for RawBuckets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawBuckets;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#""none", "hour" or an array of ["HH:MM", "HH:MM"] windows"#)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawBuckets, E> {
                Ok(RawBuckets::Mode(v.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawBuckets, A::Error> {
                let mut windows = Vec::new();
                while let Some(w) = seq.next_element::<Vec<String>>()? {
                    windows.push(w);
                }
                Ok(RawBuckets::Windows(windows))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEgress {
    pub control_url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProvider {
    pub id: String,
    pub kind: Option<ProviderKind>,
    pub api_key_env: Option<String>,
    pub max_in_flight: Option<i64>,
    #[serde(default, rename = "region")]
    pub regions: Vec<RawRegion>,
    #[serde(default, rename = "status_page")]
    pub status_pages: Vec<RawStatusPage>,
}

/// `[[provider.status_page]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStatusPage {
    pub kind: super::status_page::StatusPageKind,
    pub url: String,
    #[serde(default)]
    pub components: std::collections::BTreeMap<String, Vec<String>>,
    pub every: Option<String>,
    pub alert: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegion {
    pub id: String,
    pub base_url: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub provider: String,
    pub region: String,
    pub model: String,
    pub serves: String,
    pub tier: Option<Tier>,
    pub weight: Option<i64>,
    pub price: Option<Price>,
    pub capabilities: Option<Vec<Capability>>,
    pub context_window: Option<i64>,
    pub residency: Option<String>,
    pub interval: Option<String>,
    pub timeout: Option<String>,
    pub first_byte_timeout: Option<String>,
    pub stall_timeout: Option<String>,
    pub max_tokens: Option<i64>,
    pub slo: Option<f64>,
    // Confirmation probes.
    pub confirm_after: Option<String>,
    pub request: Option<RawProfile>,
    pub max_in_flight: Option<i64>,
    /// The day the provider retires the model (`crate::catalog`).
    pub retires: Option<String>,
    /// `chat` | `embeddings` (`crate::embed`).
    pub kind: Option<crate::route::RouteKind>,
    pub dimensions: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSlo {
    pub availability: Option<f64>,
    pub latency_threshold: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAlerting {
    pub group_wait: Option<String>,
    pub runbook_url: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProxy {
    pub enabled: Option<bool>,
    pub listen: Option<String>,
    pub first_byte_timeout: Option<String>,
    pub total_timeout: Option<String>,
    pub max_attempts: Option<i64>,
    pub max_retry_wait: Option<String>,
    pub stream_idle_timeout: Option<String>,
    pub max_stream_duration: Option<String>,
    pub max_body: Option<String>,
    pub idempotency_ttl: Option<String>,
    pub idempotency_wait: Option<String>,
    pub idempotency_keys_per_client: Option<i64>,
    pub cached_answers_per_client: Option<i64>,
    pub client_keys_env: Option<String>,
    pub allow_unauthenticated: Option<bool>,
    pub max_connections: Option<i64>,
    pub workers: Option<i64>,
    #[serde(default)]
    pub breaker: RawBreaker,
    #[serde(default)]
    pub client: Vec<RawClient>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClient {
    pub id: String,
    pub key_env: String,
    pub limit: Option<RawLimit>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    pub amount: f64,
    pub per: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAlert {
    #[serde(default)]
    pub dingtalk: Vec<RawRobot>,
    #[serde(default)]
    pub feishu: Vec<RawRobot>,
    #[serde(default)]
    pub email: Vec<RawEmail>,
    #[serde(default)]
    pub webhook: Vec<RawWebhook>,
    #[serde(default)]
    pub wecom: Vec<RawWecom>,
    #[serde(default)]
    pub slack: Vec<RawChatWebhook>,
    #[serde(default)]
    pub teams: Vec<RawChatWebhook>,
    #[serde(default)]
    pub telegram: Vec<RawTelegram>,
    #[serde(default)]
    pub pagerduty: Vec<RawPagerDuty>,
    #[serde(default)]
    pub opsgenie: Vec<RawOpsgenie>,
}

/// `[[alert.slack]]` and `[[alert.teams]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChatWebhook {
    pub webhook_env: String,
    pub api_base: Option<String>,
    pub mention: Option<RawMention>,
    // Every channel's options, spelled out: serde's `flatten` ignores `deny_unknown_fields`.
    pub min_severity: Option<String>,
    pub lang: Option<String>,
    pub send_resolved: Option<bool>,
    pub repeat_interval: Option<String>,
    pub routes: Option<Vec<String>>,
}

/// `[[alert.telegram]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelegram {
    pub token_env: String,
    pub chat_id: String,
    pub api_base: Option<String>,
    // Every channel's options, spelled out: serde's `flatten` ignores `deny_unknown_fields`.
    pub min_severity: Option<String>,
    pub lang: Option<String>,
    pub send_resolved: Option<bool>,
    pub repeat_interval: Option<String>,
    pub routes: Option<Vec<String>>,
}

/// `[[alert.pagerduty]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPagerDuty {
    pub routing_key_env: String,
    pub api_base: Option<String>,
    // Every channel's options, spelled out: serde's `flatten` ignores `deny_unknown_fields`.
    pub min_severity: Option<String>,
    pub lang: Option<String>,
    pub send_resolved: Option<bool>,
    pub repeat_interval: Option<String>,
    pub routes: Option<Vec<String>>,
}

/// `[[alert.opsgenie]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOpsgenie {
    pub api_key_env: String,
    pub region: Option<String>,
    pub api_base: Option<String>,
    // Every channel's options, spelled out: serde's `flatten` ignores `deny_unknown_fields`.
    pub min_severity: Option<String>,
    pub lang: Option<String>,
    pub send_resolved: Option<bool>,
    pub repeat_interval: Option<String>,
    pub routes: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRobot {
    pub webhook_env: String,
    pub secret_env: Option<String>,
    pub mention: Option<RawMention>,
    // Every channel's options, spelled out: serde's `flatten` ignores `deny_unknown_fields`.
    // Words stay strings so a bad one is a located stage-two error.
    pub min_severity: Option<String>,
    pub lang: Option<String>,
    pub send_resolved: Option<bool>,
    pub repeat_interval: Option<String>,
    pub routes: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEmail {
    pub smtp_url_env: String,
    pub from: String,
    pub to: Vec<String>,
    // Every channel's options, spelled out: serde's `flatten` ignores `deny_unknown_fields`.
    // Words stay strings so a bad one is a located stage-two error.
    pub min_severity: Option<String>,
    pub lang: Option<String>,
    pub send_resolved: Option<bool>,
    pub repeat_interval: Option<String>,
    pub routes: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWebhook {
    pub url_env: String,
    pub secret_env: Option<String>,
    pub max_per_minute: Option<i64>,
    // Every channel's options, spelled out: serde's `flatten` ignores `deny_unknown_fields`.
    // Words stay strings so a bad one is a located stage-two error.
    pub min_severity: Option<String>,
    pub lang: Option<String>,
    pub send_resolved: Option<bool>,
    pub repeat_interval: Option<String>,
    pub routes: Option<Vec<String>>,
}

/// `[[alert.wecom]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWecom {
    pub webhook_env: String,
    pub mention: Option<RawMention>,
    // Every channel's options, spelled out: serde's `flatten` ignores `deny_unknown_fields`.
    pub min_severity: Option<String>,
    pub lang: Option<String>,
    pub send_resolved: Option<bool>,
    pub repeat_interval: Option<String>,
    pub routes: Option<Vec<String>>,
}

/// A chat robot's `mention = { … }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMention {
    #[serde(default)]
    pub mobiles: Vec<String>,
    #[serde(default)]
    pub user_ids: Vec<String>,
    pub all: Option<bool>,
    pub min_severity: Option<String>,
    pub resolved: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMaintenance {
    pub routes: Vec<String>,
    pub start: String,
    pub duration: String,
    pub every: Option<String>,
}

/// The options every channel has, borrowed from whichever raw channel table.
pub(super) struct RawOptions<'a> {
    pub min_severity: &'a Option<String>,
    pub lang: &'a Option<String>,
    pub send_resolved: Option<bool>,
    pub repeat_interval: &'a Option<String>,
    pub routes: &'a Option<Vec<String>>,
}

macro_rules! options_of {
    ($t:ty) => {
        impl $t {
            pub(super) fn options(&self) -> RawOptions<'_> {
                RawOptions {
                    min_severity: &self.min_severity,
                    lang: &self.lang,
                    send_resolved: self.send_resolved,
                    repeat_interval: &self.repeat_interval,
                    routes: &self.routes,
                }
            }
        }
    };
}
options_of!(RawRobot);
options_of!(RawEmail);
options_of!(RawWebhook);
options_of!(RawWecom);
options_of!(RawChatWebhook);
options_of!(RawTelegram);
options_of!(RawPagerDuty);
options_of!(RawOpsgenie);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDrift {
    pub sets: Option<String>,
    pub on_drift: Option<crate::config::OnDrift>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBreaker {
    pub failure_ratio: Option<f64>,
    pub window: Option<String>,
    pub min_requests: Option<i64>,
    pub open_for: Option<String>,
}
