//! The TOML config (docs/configuration.md): `[server] [storage] [probe] [detection] [egress]
//! [[provider]] [[provider.region]] [[route]] [slo] [alerting] [[alert.dingtalk]]
//! [[alert.feishu]] [[alert.email]] [[alert.webhook]] [[alert.wecom]] [[alert.slack]] [[alert.teams]]
//! [[alert.telegram]] [[alert.pagerduty]] [[alert.opsgenie]] [[maintenance]] [drift] [proxy] [proxy.breaker]
//! [switch] [budget] [[contract]] [heartbeat] [drill] [cluster] [tracing] [[vantage]] [quorum] [agent]
//! [[shadow]] [[envoy.cluster]] [haproxy] [subscriptions] [[sync]] [catalog]
//! [capability]`. Other sections are rejected as unknown
//! keys until the issue that builds their behaviour adds them.
//!
//! Loading has two stages. Stage one is serde (`deny_unknown_fields`): it stops at the first
//! syntax error, wrong type, unknown or missing key. Stage two converts and validates the
//! values and reports *every* problem. Each [`Diagnostic`] is located through `toml_edit`
//! spans as `FILE:LINE:COL: key.path: message`; array indices in key paths are 0-based
//! (`route[0]` is the first `[[route]]`), and columns point at the value (for an absent key, at
//! its table's header). No message ever contains a secret: only variable names.
//!
//! Every section struct implements `Default` with the documented defaults, so a config can also be built
//! in code (the demo) and checked with [`Config::validate`].

mod capability;
mod catalog;
mod clients;
mod convert;
mod diag;
mod embeddings;
mod keys;
mod profile;
mod raw;
mod routers;
mod shadow;
mod source_map;
pub mod status_page;
mod sync;
mod validate;
mod vantage;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, NaiveTime, Utc};

use crate::lang::Lang;
use crate::route::{Capability, Price, ProbeSettings, ProviderKind, Route, RouteId, Tier};
use crate::secret::Env;
use crate::severity::Severity;

pub use capability::{CapabilityConfig, LongPromptConfig};
pub use catalog::CatalogConfig;
pub use clients::{ClientConfig, Per, SpendLimit};
pub(crate) use convert::parse_located;
pub use diag::{ConfigErrors, Diagnostic};
pub use keys::{known_keys, KeysError};
pub use profile::RequestProfile;
pub use routers::{endpoint_addr, EnvoyCluster, EnvoyConfig, EnvoyEndpoint, HaproxyConfig};
pub use shadow::ShadowConfig;
pub use source_map::SourceMap;
pub use status_page::{StatusPageConfig, StatusPageKind};
pub use sync::{SyncConfig, SyncKind};
pub(crate) use validate::Checker;
pub use vantage::{AgentConfig, QuorumConfig, VantageConfig, VantageError};

/// A validated config (or one built in code: see [`Config::validate`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// The file label used in diagnostics: the path as the user gave it.
    pub source: PathBuf,
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub probe: ProbeConfig,
    pub detection: DetectionConfig,
    pub egress: EgressConfig,
    /// `[[provider]]`, in file order.
    pub providers: Vec<ProviderConfig>,
    /// `[[route]]`, in file order; see [`Config::routes`] for the resolved form.
    pub routes: Vec<RouteConfig>,
    pub slo: SloConfig,
    /// `[alerting]`: grouping and the runbook link.
    pub alerting: AlertingConfig,
    /// `[[alert.*]]`: where alerts go.
    pub alert: AlertChannelsConfig,
    /// `[[maintenance]]`: planned windows that suppress alerts (probing goes on).
    pub maintenance: Vec<MaintenanceConfig>,
    pub drift: DriftConfig,
    /// `[proxy]`: the bundled routing proxy (off unless `enabled`).
    pub proxy: ProxyConfig,
    /// `[switch]`: the switch controller.
    pub switch: SwitchConfig,
    /// `[budget]`: the hourly extra-cost budget of non-primary serving.
    pub budget: ExtraCostConfig,
    /// `[[contract]]`: what a feature's requests get while their model is DEGRADED or CRITICAL.
    pub contracts: Vec<ContractConfig>,
    /// `[heartbeat]`: when a silent scheduled job counts as stalled; the dead-man's switch.
    pub heartbeat: HeartbeatConfig,
    /// `[drill]`: when planned traffic moves may start, and for how long at most.
    pub drill: DrillConfig,
    /// `[cluster]`: several monitors on one PostgreSQL database, one of them leading.
    pub cluster: ClusterConfig,
    /// `[tracing]`: OpenTelemetry traces of proxied requests and probes.
    pub tracing: TracingConfig,
    /// `[[vantage]]`: the remote places (agents) that probe routes besides this monitor.
    pub vantages: Vec<VantageConfig>,
    /// `[quorum]`: how many vantages must share a state for the route to take it.
    pub quorum: QuorumConfig,
    /// `[agent]`: what `probeok agent` keeps while the monitor is away.
    pub agent: AgentConfig,
    /// `[[shadow]]`: routes that get a sampled copy of a logical model's traffic.
    pub shadows: Vec<ShadowConfig>,
    /// `[[envoy.cluster]]`: Envoy clusters whose endpoints follow the weights (REST xDS).
    pub envoy: EnvoyConfig,
    /// `[haproxy]`: the agent-check responder HAProxy servers ask about their route.
    pub haproxy: HaproxyConfig,
    /// `[subscriptions]`: status page visitors told of incidents by email or webhook.
    pub subscriptions: SubscriptionsConfig,
    /// `[[sync]]`: new-api / one-api gateways whose channels the leader keeps in step.
    pub sync: Vec<SyncConfig>,
    /// `[catalog]` and `route.retires`: the providers' model lists, read by the leader.
    pub catalog: CatalogConfig,
    /// `[capability]`: how often declared `tools` / `json_schema` capabilities are probed.
    pub capability: CapabilityConfig,
    /// Positions in the source, so diagnostics found after loading are located too.
    /// `SourceMap::default()` for a config built in code.
    pub source_map: SourceMap,
    /// Where the variables the config names (`*_env` keys) are read: the process environment
    /// unless the code that runs the config gives other values.
    pub env: Env,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            source: PathBuf::from("(built-in)"),
            server: ServerConfig::default(),
            storage: StorageConfig::default(),
            probe: ProbeConfig::default(),
            detection: DetectionConfig::default(),
            egress: EgressConfig::default(),
            providers: Vec::new(),
            routes: Vec::new(),
            slo: SloConfig::default(),
            alerting: AlertingConfig::default(),
            alert: AlertChannelsConfig::default(),
            maintenance: Vec::new(),
            drift: DriftConfig::default(),
            proxy: ProxyConfig::default(),
            switch: SwitchConfig::default(),
            budget: ExtraCostConfig::default(),
            contracts: Vec::new(),
            heartbeat: HeartbeatConfig::default(),
            drill: DrillConfig::default(),
            cluster: ClusterConfig::default(),
            tracing: TracingConfig::default(),
            vantages: Vec::new(),
            quorum: QuorumConfig::default(),
            agent: AgentConfig::default(),
            shadows: Vec::new(),
            envoy: EnvoyConfig::default(),
            haproxy: HaproxyConfig::default(),
            subscriptions: SubscriptionsConfig::default(),
            sync: Vec::new(),
            catalog: CatalogConfig::default(),
            capability: CapabilityConfig::default(),
            source_map: SourceMap::default(),
            env: Env::process(),
        }
    }
}

/// `[server]`: the monitor's own HTTP endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Status page, API and metrics.
    pub listen: SocketAddr,
    /// Base of links in alerts. When absent from the file: `http://{listen}`.
    pub public_url: String,
    /// Admin endpoints are off while this variable is unset.
    pub admin_token_env: String,
    /// Bearer token for passive results from remote proxies and agents.
    pub ingest_token_env: String,
    pub title: String,
    /// The vantage id of this monitor's own scheduler (`[a-z0-9_-]+`, default `local`).
    pub vantage: String,
    /// Open connections the listener admits at once (SSE subscribers hold one each); past
    /// it, new connections wait in the kernel's accept queue.
    pub max_connections: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9400)),
            public_url: "http://127.0.0.1:9400".into(),
            admin_token_env: "PROBEOK_ADMIN_TOKEN".into(),
            ingest_token_env: "PROBEOK_INGEST_TOKEN".into(),
            title: "LLM provider status".into(),
            vantage: crate::vantage::LOCAL.into(),
            max_connections: crate::listen::MAX_CONNECTIONS as u32,
        }
    }
}

/// `[storage]`: the SQLite file and how long history is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageConfig {
    /// As written (a relative path is relative to the working directory).
    pub path: PathBuf,
    /// The environment variable that may hold a `postgres://` URL: when it does, the whole
    /// store is PostgreSQL and `path` is ignored.
    pub url_env: Option<String>,
    /// Raw results; also the baseline lookback.
    pub retention_days: u32,
    /// Hourly and daily rollups (5-minute ones are kept 48 h regardless).
    pub rollup_retention_days: u32,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("probeok.db"),
            url_env: None,
            retention_days: 14,
            rollup_retention_days: 400,
        }
    }
}

/// `[probe]`: defaults for every route; a route may override `interval`, `timeout`,
/// `first_byte_timeout`, `stall_timeout`, `max_tokens` and `confirm_after`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    pub interval: Duration,
    /// No response byte by then: `timeout_before_first_byte` (a failure).
    pub first_byte_timeout: Duration,
    /// After the first answer token, a stream silent this long is `stalled`.
    pub stall_timeout: Duration,
    /// The whole call; a slow but complete answer is a slow success.
    pub timeout: Duration,
    /// ± fraction of `interval`, in [0, 0.5], so probes of many routes do not fire in step.
    pub jitter: f64,
    pub stream: bool,
    /// Enough for `PROBE_OK` yet valid for reasoning models (never 1).
    pub max_tokens: u32,
    /// How often the longer throughput probe runs (tokens/s from a 2-token answer is noise).
    pub throughput_every: Duration,
    pub throughput_prompt: String,
    pub throughput_max_tokens: u32,
    pub system: String,
    pub user: String,
    /// Compared with the answer after trimming whitespace (drift signal).
    pub expect: String,
    /// Confirmation probes after an abnormal one (see [`ConfirmAfter`]).
    pub confirm_after: ConfirmAfter,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            first_byte_timeout: Duration::from_secs(5),
            stall_timeout: Duration::from_secs(10),
            // 30s would equal the interval: such probes overrun and are skipped, so
            // every default config warned. 20s leaves a third of the interval spare.
            timeout: Duration::from_secs(20),
            jitter: 0.1,
            stream: true,
            max_tokens: 16,
            throughput_every: Duration::from_secs(300),
            throughput_prompt:
                "Count from 1 to 40, separated by single spaces. Reply with the numbers only."
                    .into(),
            throughput_max_tokens: 128,
            system: "Reply with exactly: PROBE_OK".into(),
            user: "health check".into(),
            expect: "PROBE_OK".into(),
            confirm_after: ConfirmAfter::Fraction(6),
        }
    }
}

// ---- Confirmation probes (`[probe] confirm_after`, per route too) ----

/// How soon after an abnormal probe the route is probed again, to confirm it before the next
/// tick of its regular grid: a fixed duration, a fraction of the route's interval
/// (`"interval/6"`, the default), or `"off"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmAfter {
    Off,
    After(Duration),
    /// `interval / N`, N ≥ 2 (`interval/1` would be the grid itself).
    Fraction(u32),
}

impl ConfirmAfter {
    /// Parses `"off"`, `"interval/N"` or a duration (`"5s"`); the error is a sentence.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("off") {
            return Ok(Self::Off);
        }
        if let Some(n) = t.strip_prefix("interval/") {
            return match n.trim().parse::<u32>() {
                Ok(n) if n >= 2 => Ok(Self::Fraction(n)),
                _ => Err(format!(
                    "invalid fraction {s:?}: write \"interval/N\" with a whole N of at least 2"
                )),
            };
        }
        match humantime::parse_duration(t) {
            Ok(d) if !d.is_zero() => Ok(Self::After(d)),
            Ok(_) => Err("must be positive (write \"off\" to disable confirmations)".into()),
            Err(e) => Err(format!(
                "invalid value {s:?}: {e} (write a duration like \"5s\", \"interval/6\" or \"off\")"
            )),
        }
    }

    /// The delay for a route probed every `interval`; `None` when off.
    pub fn resolve(self, interval: Duration) -> Option<Duration> {
        match self {
            Self::Off => None,
            Self::After(d) => Some(d),
            Self::Fraction(n) => Some(interval / n.max(1)),
        }
    }
}

#[cfg(test)]
mod confirm_after_tests {
    use super::*;

    fn config(probe: &str, route: &str) -> Result<Config, ConfigErrors> {
        let src = format!(
            "[probe]\ninterval = \"30s\"\n{probe}\n\n[[provider]]\nid = \"p\"\nkind = \"openai\"\n  \
             [[provider.region]]\n  id = \"r\"\n  base_url = \"http://127.0.0.1:9/v1\"\n\n\
             [[route]]\nprovider = \"p\"\nregion = \"r\"\nmodel = \"m\"\nserves = \"chat\"\n{route}\n"
        );
        Config::parse(&src, "t.toml").map(|l| l.config)
    }

    #[test]
    fn parses_fractions_durations_and_off() {
        assert_eq!(
            ConfirmAfter::parse("interval/6"),
            Ok(ConfirmAfter::Fraction(6))
        );
        assert_eq!(
            ConfirmAfter::parse("4s"),
            Ok(ConfirmAfter::After(Duration::from_secs(4)))
        );
        assert_eq!(ConfirmAfter::parse("off"), Ok(ConfirmAfter::Off));
        for bad in ["interval/1", "interval/0", "interval/x", "0s", "soon"] {
            assert!(ConfirmAfter::parse(bad).is_err(), "{bad}");
        }
        let d = Duration::from_secs(30);
        assert_eq!(
            ConfirmAfter::Fraction(6).resolve(d),
            Some(Duration::from_secs(5))
        );
        assert_eq!(ConfirmAfter::Off.resolve(d), None);
    }

    #[test]
    fn defaults_to_a_sixth_of_the_interval_and_a_route_overrides_it() {
        let c = config("", "interval = \"60s\"").unwrap();
        assert_eq!(
            c.routes()[0].probe.confirm_after,
            Some(Duration::from_secs(10))
        );
        let c = config("confirm_after = \"3s\"", "confirm_after = \"off\"").unwrap();
        assert_eq!(
            c.probe.confirm_after,
            ConfirmAfter::After(Duration::from_secs(3))
        );
        assert_eq!(c.routes()[0].probe.confirm_after, None);
        let e = config("confirm_after = \"interval/1\"", "")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.toml:3:") && e.contains("probe.confirm_after"),
            "{e}"
        );
        let e = config("", "confirm_after = \"soon\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("route[0].confirm_after"), "{e}");
    }
}

// ---- end of confirmation probes ----

/// How baselines are bucketed by time of day (in [`DetectionConfig::timezone`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Buckets {
    /// One all-day baseline.
    None,
    /// One baseline per hour of the day.
    Hour,
    /// Peak windows `[start, end)`, sorted as written, non-overlapping, none crossing midnight;
    /// each window has its own baseline and the rest of the day shares one.
    Windows(Vec<(NaiveTime, NaiveTime)>),
}

/// `[detection]`: baselines and the state machine's thresholds.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectionConfig {
    /// Latency anomaly: > mean + max(sigma·stddev, latency_floor_ratio·mean, latency_floor).
    pub sigma: f64,
    /// Keeps a near-zero stddev (a very steady route) from making every probe abnormal.
    pub latency_floor_ratio: f64,
    pub latency_floor: Duration,
    /// Most recent successful probes per bucket.
    pub baseline_window: u32,
    /// Below this a route stays UNKNOWN or uses the all-day baseline.
    pub min_samples: u32,
    pub buckets: Buckets,
    pub timezone: chrono_tz::Tz,
    /// Consecutive abnormal probes before DEGRADED.
    pub degraded_after: u32,
    /// Over `error_window` (probes and passive outcomes).
    pub critical_error_rate: f64,
    pub error_window: Duration,
    /// The error rate judges nothing below this many outcomes in the window…
    pub min_error_samples: u32,
    /// …nor with fewer failures than this.
    pub min_failures: u32,
    /// DEGRADED with the error rate above threshold this long → CRITICAL.
    pub critical_after: Duration,
    /// Or DEGRADED this long with no normal observation in between → CRITICAL.
    pub critical_degraded_for: Duration,
    /// Back to NORMAL only after this long of normal observations…
    pub recover_after: Duration,
    /// …with the error rate below this (hysteresis: at most `critical_error_rate`).
    pub recover_error_rate: f64,
    /// Tokens/s below this fraction of the baseline is abnormal.
    pub tps_floor: f64,
}

impl Default for DetectionConfig {
    fn default() -> Self {
        Self {
            sigma: 2.0,
            latency_floor_ratio: 0.2,
            latency_floor: Duration::from_millis(100),
            baseline_window: 100,
            min_samples: 20,
            buckets: Buckets::Hour,
            timezone: chrono_tz::Asia::Shanghai,
            degraded_after: 3,
            critical_error_rate: 0.05,
            error_window: Duration::from_secs(300),
            min_error_samples: 20,
            min_failures: 3,
            critical_after: Duration::from_secs(60),
            critical_degraded_for: Duration::from_secs(120),
            recover_after: Duration::from_secs(300),
            recover_error_rate: 0.01,
            tps_floor: 0.3,
        }
    }
}

/// `[egress]`: telling "the provider is down" from "our own network is down".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EgressConfig {
    /// A non-LLM URL; when it fails too and ≥ 2 providers fail, blame our egress. Off if unset.
    pub control_url: Option<String>,
}

/// `[[provider]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    /// `[a-z0-9_-]+`, unique.
    pub id: String,
    /// Defaults to `openai` (any OpenAI-compatible API), by far the common case.
    pub kind: ProviderKind,
    /// The variable holding the API key; the key itself is never in the config.
    pub api_key_env: Option<String>,
    /// `[[provider.region]]`, at least one.
    pub regions: Vec<RegionConfig>,
    /// `[[provider.status_page]]`: the provider's own status pages.
    pub status_pages: Vec<StatusPageConfig>,
    /// Proxy requests in flight to all of this provider's routes together, at most (providers
    /// cap concurrency per API key); `None`: no limit of probeok's.
    pub max_in_flight: Option<u32>,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self {
            id: String::new(),
            kind: ProviderKind::Openai,
            api_key_env: None,
            regions: Vec::new(),
            status_pages: Vec::new(),
            max_in_flight: None,
        }
    }
}

/// `[[provider.region]]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegionConfig {
    /// `[a-z0-9_-]+`, unique within its provider.
    pub id: String,
    /// http(s) with a host, as written (see [`Route::base_url`] for the normalised form).
    pub base_url: String,
}

/// `[[route]]`: one provider × region × upstream model.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    pub provider: String,
    pub region: String,
    /// The upstream model name; may contain `/`.
    pub model: String,
    /// The logical model clients ask the proxy for; routes sharing it are interchangeable.
    pub serves: String,
    /// Defaults to `primary`.
    pub tier: Tier,
    /// Base traffic share, 0..=100; defaults to 100 (equal shares).
    pub weight: u8,
    pub price: Option<Price>,
    /// Defaults to `["stream"]`: every OpenAI-compatible chat API streams, and so do probes.
    pub capabilities: Vec<Capability>,
    pub context_window: Option<u32>,
    /// Optional tag a request may require (`x-probeok-residency`).
    pub residency: Option<String>,
    pub interval: Option<Duration>,
    pub timeout: Option<Duration>,
    pub first_byte_timeout: Option<Duration>,
    pub stall_timeout: Option<Duration>,
    pub max_tokens: Option<u32>,
    /// Availability target; `[slo] availability` when absent.
    pub slo: Option<f64>,
    /// Overrides `[probe] confirm_after` for this route.
    pub confirm_after: Option<ConfirmAfter>,
    /// `request = {…}`: the profile applied to the proxy requests this route serves.
    pub request: Option<RequestProfile>,
    /// Proxy requests in flight to this route, at most (a stream holds its place to its
    /// end); `None`: no limit of probeok's.
    pub max_in_flight: Option<u32>,
    /// `chat` (the default) or `embeddings`.
    pub kind: crate::route::RouteKind,
    /// The vector length an embeddings route answers (required for them).
    pub dimensions: Option<u32>,
}

impl Default for RouteConfig {
    fn default() -> Self {
        Self {
            provider: String::new(),
            region: String::new(),
            model: String::new(),
            serves: String::new(),
            tier: Tier::Primary,
            weight: 100,
            price: None,
            capabilities: vec![Capability::Stream],
            context_window: None,
            residency: None,
            interval: None,
            timeout: None,
            first_byte_timeout: None,
            stall_timeout: None,
            max_tokens: None,
            slo: None,
            confirm_after: None,
            request: None,
            max_in_flight: None,
            kind: crate::route::RouteKind::Chat,
            dimensions: None,
        }
    }
}

/// `[slo]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SloConfig {
    /// Default per-route target over a rolling 30-day window, in (0, 1).
    pub availability: f64,
    /// An outcome is good when it succeeded within this.
    pub latency_threshold: Duration,
}

impl Default for SloConfig {
    fn default() -> Self {
        Self {
            availability: 0.999,
            latency_threshold: Duration::from_secs(10),
        }
    }
}

/// `[alerting]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertingConfig {
    /// What fires within this long of the first event goes out as one message (0: at once).
    pub group_wait: Duration,
    /// Linked in every message, `{failure_mode}` filled in (`unavailable`, `degraded`, …).
    pub runbook_url: Option<String>,
}

impl Default for AlertingConfig {
    fn default() -> Self {
        Self {
            group_wait: Duration::from_secs(30),
            runbook_url: None,
        }
    }
}

/// `[proxy]`: the OpenAI-compatible routing proxy (docs/http-api.md).
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    /// Off by default: a real config opts in (the built-in demo turns it on).
    pub enabled: bool,
    pub listen: SocketAddr,
    /// Streams: the first SSE `data:` event must arrive within this, else the next candidate.
    /// A route's own `first_byte_timeout` overrides it for that route.
    pub first_byte_timeout: Duration,
    /// The whole request, split over the remaining candidates (per-candidate budget).
    pub total_timeout: Duration,
    /// Upstream attempts per request, at most.
    pub max_attempts: u32,
    /// Total backoff waiting per request for retries of the same route (`proxy::breaker`).
    pub max_retry_wait: Duration,
    /// A committed stream with no byte for this long is interrupted (`provider_interrupted`).
    pub stream_idle_timeout: Duration,
    /// The longest a committed stream may last (an answer that never ends holds its place in
    /// flight and the client forever); longer ones are interrupted (`provider_interrupted`).
    pub max_stream_duration: Duration,
    /// Request bodies above this many bytes are refused with 413, unread.
    pub max_body: u64,
    /// How long an idempotency key's answer is kept (`proxy::idempotency`).
    pub idempotency_ttl: Duration,
    /// How long a repeat of a key still running waits for its answer before 409.
    pub idempotency_wait: Duration,
    /// Live idempotency keys one client (one client key) may hold; beyond, 429.
    pub idempotency_keys_per_client: u32,
    /// Cached answers (`cached_response`) one client may hold; beyond, its oldest is replaced.
    pub cached_answers_per_client: u32,
    /// Comma-separated client keys; while the variable is unset, clients need no key.
    pub client_keys_env: String,
    /// A proxy on a non-loopback address with no client keys spends the provider keys for
    /// anyone who can reach it: refused unless this is set (then warned at every start).
    pub allow_unauthenticated: bool,
    /// Open client connections the proxy's listener serves at once; past it, new connections
    /// wait in the kernel's accept queue.
    pub max_connections: u32,
    /// Threads serving the proxy, each with its own runtime, accepting socket and upstream
    /// connection pool (`proxy::server`). Default: the machine's cores.
    pub workers: u32,
    pub breaker: BreakerConfig,
    /// `[[proxy.client]]`: named clients with their own keys and spend limits.
    pub clients: Vec<ClientConfig>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 9401)),
            first_byte_timeout: Duration::from_secs(2),
            total_timeout: Duration::from_secs(540),
            max_attempts: 5,
            max_retry_wait: Duration::from_secs(30),
            stream_idle_timeout: Duration::from_secs(30),
            max_stream_duration: Duration::from_secs(30 * 60),
            max_body: 10 * 1024 * 1024,
            idempotency_ttl: Duration::from_secs(24 * 3600),
            idempotency_wait: Duration::from_secs(10),
            idempotency_keys_per_client: 10_000,
            cached_answers_per_client: 1_000,
            client_keys_env: "PROBEOK_CLIENT_KEYS".into(),
            allow_unauthenticated: false,
            max_connections: crate::listen::MAX_CONNECTIONS as u32,
            workers: default_workers(),
            breaker: BreakerConfig::default(),
            clients: Vec::new(),
        }
    }
}

/// The most `[proxy] workers` accepted: more threads than this only add wake-ups.
pub const MAX_WORKERS: u32 = 1024;

/// One proxy worker per core the process may run on (at least one).
pub fn default_workers() -> u32 {
    std::thread::available_parallelism()
        .map_or(1, |n| u32::try_from(n.get()).unwrap_or(MAX_WORKERS))
        .clamp(1, MAX_WORKERS)
}

/// `[switch]`: when the switch controller moves a logical model's traffic from its primaries
/// to a backup, and how it comes back (docs/configuration.md).
#[derive(Debug, Clone, PartialEq)]
pub struct SwitchConfig {
    /// No other move for this long after a switch or a completed return.
    pub min_dwell: Duration,
    /// Switches per rolling hour, at most; then the controller holds and alerts.
    pub max_switches_per_hour: u32,
    /// The earliest return, counted from the switch (or from an aborted canary).
    pub return_after: Duration,
    /// The primary must have been NORMAL without a break this long before a return.
    pub return_healthy_for: Duration,
    /// The primary's share during the return, stage by stage, increasing, ending at 1.0.
    pub canary: Vec<f64>,
    /// How long each canary stage lasts.
    pub canary_stage: Duration,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        Self {
            min_dwell: Duration::from_secs(300),
            max_switches_per_hour: 3,
            return_after: Duration::from_secs(1800),
            return_healthy_for: Duration::from_secs(300),
            canary: vec![0.05, 0.25, 1.0],
            canary_stage: Duration::from_secs(120),
        }
    }
}

/// `[budget]`: the extra cost of serving from non-primary routes, per clock hour.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtraCostConfig {
    /// In the routes' price currency.
    pub max_extra_cost_per_hour: f64,
    /// Past this share of the budget no new switch happens (and it is alerted).
    pub degrade_at: f64,
}

impl Default for ExtraCostConfig {
    fn default() -> Self {
        Self {
            max_extra_cost_per_hour: 300.0,
            degrade_at: 0.8,
        }
    }
}

/// `[[contract]]`: a feature's degradation contract. Requests name their
/// feature with `x-probeok-feature`; a contract with `feature = "default"` covers the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct ContractConfig {
    pub feature: String,
    /// While the request's logical model is DEGRADED.
    pub degraded: Option<Behaviour>,
    /// While it is CRITICAL; when absent, `degraded` applies here too. A SWITCHED model gets no
    /// contract: the switch controller already serves it from a backup, disclosed.
    pub critical: Option<Behaviour>,
    /// Shown to the product's users; travels in the answer (body, and percent-encoded header).
    pub user_message: Option<String>,
    /// `Retry-After` of a `reject` (and the hint of a queued job). Default 60 s.
    pub retry_after: Duration,
}

/// The name of the contract that covers requests without a contract of their own.
pub const DEFAULT_FEATURE: &str = "default";

impl ContractConfig {
    /// The behaviour for a model that is `critical` (CRITICAL/SWITCHED) or else DEGRADED.
    pub fn behaviour(&self, critical: bool) -> Option<&Behaviour> {
        if critical {
            self.critical.as_ref().or(self.degraded.as_ref())
        } else {
            self.degraded.as_ref()
        }
    }
}

/// What a contract does with a request to a degraded model.
#[derive(Debug, Clone, PartialEq)]
pub enum Behaviour {
    /// Serve it from another logical model, said openly, if that one is usable and capable.
    FallbackModel(String),
    /// Answer 202 with a job id; the job runs once the model is healthy, or expires.
    AsyncQueue { ttl: Duration },
    /// The last good answer to the same normalized request, if younger than `max_age`.
    CachedResponse { max_age: Duration },
    /// 503 with this message and `Retry-After`.
    Reject { message: String },
}

impl Behaviour {
    /// The config key: `fallback_model`, `async_queue`, `cached_response`, `reject`.
    pub fn name(&self) -> &'static str {
        match self {
            Behaviour::FallbackModel(_) => "fallback_model",
            Behaviour::AsyncQueue { .. } => "async_queue",
            Behaviour::CachedResponse { .. } => "cached_response",
            Behaviour::Reject { .. } => "reject",
        }
    }
}

/// `[heartbeat]`: every scheduled job beats; one silent this long fails `/readyz`, shows on
/// the status page and raises a `critical` alert.
#[derive(Debug, Clone, PartialEq)]
pub struct HeartbeatConfig {
    pub stale_after: Duration,
    /// An external dead-man's switch (healthchecks-style) pinged after each healthy cycle.
    pub ping_url_env: Option<String>,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self {
            stale_after: Duration::from_secs(180),
            ping_url_env: None,
        }
    }
}

/// `[cluster]`: monitors sharing one PostgreSQL database elect one leader (see
/// `docs/operations.md`); ignored with SQLite, where the monitor always leads.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// A leader whose lease session is silent this long steps down and is replaced.
    pub lease: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(10),
        }
    }
}

/// `[tracing]`: spans of proxied requests, their attempts and probes, exported over OTLP/HTTP.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// The variable holding the collector's base URL (`http://collector:4318`); unset: no
    /// export.
    pub otlp_endpoint_env: String,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// Head sampling of requests that arrive without a trace of their own (0..=1); a
    /// caller's `traceparent` decides for its own requests.
    pub sample_ratio: f64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint_env: "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            service_name: "probeok".to_owned(),
            sample_ratio: 1.0,
        }
    }
}

/// `[subscriptions]`: visitors of the status page subscribe to public incidents by email or
/// webhook (off by default).
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionsConfig {
    pub enabled: bool,
    /// Subscriptions by email (sent through the first `[[alert.email]]` SMTP setting).
    pub email: bool,
    pub webhook: bool,
    /// Subscribers kept at most, confirmed or not.
    pub max_subscribers: u64,
    /// A webhook URL resolving to a loopback, private or link-local address is refused unless true.
    pub allow_private_webhooks: bool,
}

impl Default for SubscriptionsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            email: true,
            webhook: true,
            max_subscribers: 10_000,
            allow_private_webhooks: false,
        }
    }
}

/// `[drill]`: planned, time-limited traffic moves.
#[derive(Debug, Clone, PartialEq)]
pub struct DrillConfig {
    /// Local `[start, end)` windows in `detection.timezone` when drills may start without
    /// `force`; a window may cross midnight. Empty: outside `detection.buckets` peak windows
    /// when those are set, else any time.
    pub off_peak: Vec<(NaiveTime, NaiveTime)>,
    /// The longest drill allowed.
    pub max_duration: Duration,
}

impl Default for DrillConfig {
    fn default() -> Self {
        Self {
            off_peak: Vec::new(),
            max_duration: Duration::from_secs(4 * 3600),
        }
    }
}

/// What a drift finding does besides alerting (`[drift] on_drift`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDrift {
    /// Alert (severity `warning`) and mark the route `behavior_changed`; weights unchanged.
    #[default]
    Alert,
    /// Also lower the route's weight in the feed: first move traffic, then investigate.
    Deweight,
}

/// `[drift]`: offline regression sets (`probes/*.toml`) that catch silent model changes.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftConfig {
    /// The folder of regression sets, as written; relative to the config file's directory
    /// (see [`Config::drift_sets_dir`]).
    pub sets: PathBuf,
    pub on_drift: OnDrift,
    /// `[drift]` was in the file: then a missing folder is an error, not "no sets".
    pub explicit: bool,
    /// Whether regression sets run at all. Always true from a file; a config built in code
    /// turns it off with [`DriftConfig::no_sets`] (the built-in demo: its simulator answers
    /// the shipped sets' prompts generically, so every backup would fail the quality gate).
    pub run_sets: bool,
}

impl Default for DriftConfig {
    fn default() -> Self {
        Self {
            sets: PathBuf::from("probes"),
            on_drift: OnDrift::Alert,
            explicit: false,
            run_sets: true,
        }
    }
}

impl DriftConfig {
    /// No regression sets run: the runner publishes an empty snapshot (no findings, every
    /// route eligible) and keeps no heartbeat job.
    pub fn no_sets() -> Self {
        Self {
            run_sets: false,
            ..Self::default()
        }
    }
}

/// `[proxy.breaker]`: per-route circuit breaker (behaviour in `proxy::breaker`).
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// Opens when failures / requests over `window` exceed this, in (0, 1].
    pub failure_ratio: f64,
    pub window: Duration,
    /// No judgement below this many requests in the window.
    pub min_requests: u32,
    /// Open this long; doubled on each failed half-open try, up to 10 minutes.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_ratio: 0.5,
            window: Duration::from_secs(60),
            min_requests: 20,
            open_for: Duration::from_secs(30),
        }
    }
}

/// What every channel has: which severities it gets, in which language, and reminders.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelOptions {
    /// Messages below this severity are not sent to the channel (default `warning`).
    pub min_severity: Severity,
    pub lang: Lang,
    /// A resolved message when the incident closes (default on).
    pub send_resolved: bool,
    /// Reminders while an alert still fires; off when `None` (the default).
    pub repeat_interval: Option<Duration>,
    // --- Alert routing -------------------------------------------------------------------
    /// `routes = ["qwen/*"]`: globs over route ids; the channel gets only alerts about matching
    /// routes. Empty (the default): every route, and the cross-route alerts (egress, stale
    /// heartbeats), which a filtered channel gets only when a glob is `"*"`.
    pub routes: Vec<String>,
}

impl Default for ChannelOptions {
    fn default() -> Self {
        Self {
            min_severity: Severity::Warning,
            lang: Lang::Zh,
            send_resolved: true,
            repeat_interval: None,
            routes: Vec::new(),
        }
    }
}

// --- Alert mentions and the WeCom robot ------------------------------------------------------

/// `mention = { mobiles = [...], user_ids = [...], all = false, min_severity = "critical" }` on
/// a chat robot: who is @-mentioned on messages from `min_severity` up. Never on resolved
/// messages unless `resolved = true`; never on `alert test`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mention {
    /// Phone numbers (DingTalk `atMobiles`, WeCom `mentioned_mobile_list`).
    pub mobiles: Vec<String>,
    /// The app's user ids (DingTalk `atUserIds`, Feishu `<at id=…>`, WeCom `<@userid>`).
    pub user_ids: Vec<String>,
    /// Everyone in the group.
    pub all: bool,
    /// Default `critical`.
    pub min_severity: Severity,
    /// Mention on resolved messages too (default off).
    pub resolved: bool,
}

impl Default for Mention {
    fn default() -> Self {
        Self {
            mobiles: Vec::new(),
            user_ids: Vec::new(),
            all: false,
            min_severity: Severity::Critical,
            resolved: false,
        }
    }
}

/// `[[alert.wecom]]`: a WeCom (企业微信) group robot; its URL carries the key, no signing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WecomConfig {
    pub webhook_env: String,
    pub mention: Option<Mention>,
    pub options: ChannelOptions,
}

/// `[[alert.dingtalk]]` (and `[[alert.feishu]]`, same keys): a custom robot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RobotConfig {
    /// The variable holding the full robot URL (with its access token).
    pub webhook_env: String,
    /// The variable holding the signing secret; unsigned when `None`.
    pub secret_env: Option<String>,
    pub options: ChannelOptions,
    /// Who is @-mentioned, and from which severity.
    pub mention: Option<Mention>,
}

/// `[[alert.email]]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EmailConfig {
    /// The variable holding `smtps://user:pass@host:465`, `smtp://…?tls=required` (STARTTLS)
    /// or plain `smtp://` (loopback hosts only).
    pub smtp_url_env: String,
    pub from: String,
    pub to: Vec<String>,
    pub options: ChannelOptions,
}

/// `[[alert.webhook]]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WebhookConfig {
    pub url_env: String,
    /// When set: `X-Probeok-Signature: sha256=<hex HMAC of the body>`.
    pub secret_env: Option<String>,
    /// Most messages a minute the receiver accepts (`None`: no limit); what exceeds it is
    /// folded into one summary.
    pub max_per_minute: Option<u32>,
    pub options: ChannelOptions,
}

/// `[[alert.slack]]` and `[[alert.teams]]`: an incoming webhook whose URL is the secret.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatWebhookConfig {
    /// The variable holding the full webhook URL.
    pub webhook_env: String,
    /// Sends to this scheme, host and port instead of the webhook URL's (its path and query
    /// kept): an egress proxy, or a test receiver.
    pub api_base: Option<String>,
    /// Slack only: who is mentioned (`user_ids` `U…` as `<@U…>`, `S…` as `<!subteam^S…>`,
    /// `all` as `<!here>`), and from which severity.
    pub mention: Option<Mention>,
    pub options: ChannelOptions,
}

/// `[[alert.telegram]]`: a bot posting into one chat.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TelegramConfig {
    /// The variable holding the bot token (`123456:ABC…`).
    pub token_env: String,
    /// The chat: a numeric id (`-1001234567890`) or `@channelusername`.
    pub chat_id: String,
    /// Default `https://api.telegram.org`.
    pub api_base: Option<String>,
    pub options: ChannelOptions,
}

/// `[[alert.pagerduty]]`: an Events API v2 integration of a PagerDuty service.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PagerDutyConfig {
    /// The variable holding the integration's routing key.
    pub routing_key_env: String,
    /// Default `https://events.pagerduty.com` (`https://events.eu.pagerduty.com` for EU
    /// accounts).
    pub api_base: Option<String>,
    pub options: ChannelOptions,
}

/// `[[alert.opsgenie]]`: an Opsgenie API integration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpsgenieConfig {
    /// The variable holding the integration's API key (sent as `Authorization: GenieKey …`).
    pub api_key_env: String,
    /// `us` (default, `https://api.opsgenie.com`) or `eu` (`https://api.eu.opsgenie.com`).
    pub region: String,
    /// Overrides the region's host.
    pub api_base: Option<String>,
    pub options: ChannelOptions,
}

/// Every `[[alert.*]]` table, each kind in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlertChannelsConfig {
    pub dingtalk: Vec<RobotConfig>,
    pub feishu: Vec<RobotConfig>,
    pub email: Vec<EmailConfig>,
    pub webhook: Vec<WebhookConfig>,
    pub wecom: Vec<WecomConfig>,
    pub slack: Vec<ChatWebhookConfig>,
    pub teams: Vec<ChatWebhookConfig>,
    pub telegram: Vec<TelegramConfig>,
    pub pagerduty: Vec<PagerDutyConfig>,
    pub opsgenie: Vec<OpsgenieConfig>,
}

impl AlertChannelsConfig {
    /// How many channels there are in all.
    pub fn len(&self) -> usize {
        self.dingtalk.len()
            + self.feishu.len()
            + self.email.len()
            + self.webhook.len()
            + self.wecom.len()
            + self.slack.len()
            + self.teams.len()
            + self.telegram.len()
            + self.pagerduty.len()
            + self.opsgenie.len()
    }

    /// `(name, options)` of every channel, in the order they are built and numbered by
    /// `probeok alert test --channel N`: dingtalk, feishu, email, webhook, wecom, slack,
    /// teams, telegram, pagerduty, opsgenie.
    pub fn options(&self) -> Vec<(String, &ChannelOptions)> {
        fn named<'a>(
            kind: &'a str,
            opts: impl Iterator<Item = &'a ChannelOptions> + 'a,
        ) -> impl Iterator<Item = (String, &'a ChannelOptions)> + 'a {
            opts.enumerate()
                .map(move |(i, o)| (format!("{kind}[{i}]"), o))
        }
        named("dingtalk", self.dingtalk.iter().map(|c| &c.options))
            .chain(named("feishu", self.feishu.iter().map(|c| &c.options)))
            .chain(named("email", self.email.iter().map(|c| &c.options)))
            .chain(named("webhook", self.webhook.iter().map(|c| &c.options)))
            .chain(named("wecom", self.wecom.iter().map(|c| &c.options)))
            .chain(named("slack", self.slack.iter().map(|c| &c.options)))
            .chain(named("teams", self.teams.iter().map(|c| &c.options)))
            .chain(named("telegram", self.telegram.iter().map(|c| &c.options)))
            .chain(named(
                "pagerduty",
                self.pagerduty.iter().map(|c| &c.options),
            ))
            .chain(named("opsgenie", self.opsgenie.iter().map(|c| &c.options)))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `[[maintenance]]`: alerts for matching routes are suppressed inside the window.
#[derive(Debug, Clone, PartialEq)]
pub struct MaintenanceConfig {
    /// Globs over route ids (`*` any run of characters, `?` one character).
    pub routes: Vec<String>,
    pub start: DateTime<Utc>,
    pub duration: Duration,
    /// Repeats every this long from `start` when set.
    pub every: Option<Duration>,
}

/// A proxy that answers clients without a key on a non-loopback address
/// ([`Config::open_proxy`]).
#[derive(Debug, Clone, PartialEq)]
pub enum OpenProxy {
    /// Not allowed: `check-config` and `serve` refuse the config.
    Refused(Diagnostic),
    /// `[proxy] allow_unauthenticated = true`: a warning at every start.
    Allowed(Diagnostic),
}

/// A config that passed validation, with the warnings it raised (e.g. probes that overrun).
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Vec<Diagnostic>,
}

impl Config {
    /// Reads and validates the file at `path`; diagnostics name the file as `path` is written.
    pub fn load(path: &Path) -> Result<Loaded, ConfigErrors> {
        let label = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(src) => Self::parse(&src, &label),
            Err(e) => Err(ConfigErrors(vec![Diagnostic {
                file: label,
                line: 0,
                col: 0,
                path: String::new(),
                message: format!("cannot read: {e}"),
            }])),
        }
    }

    /// Parses and validates `src`; `label` names the file in diagnostics.
    pub fn parse(src: &str, label: &str) -> Result<Loaded, ConfigErrors> {
        convert::parse(src, label)
    }

    /// Checks a config built in code with the same rules as a loaded one (positions are
    /// located when the config came from a file). Returns the warnings.
    pub fn validate(&self) -> Result<Vec<Diagnostic>, ConfigErrors> {
        let map = self.source_map.parsed();
        let mut checker = validate::Checker::new(&self.source.display().to_string(), &map);
        checker.check(self);
        checker.finish()
    }

    /// The contract for a request's `x-probeok-feature` (absent or unknown: the `default`
    /// contract, if any).
    pub fn contract_for(&self, feature: Option<&str>) -> Option<&ContractConfig> {
        feature
            .and_then(|f| self.contracts.iter().find(|c| c.feature == f))
            .or_else(|| self.contracts.iter().find(|c| c.feature == DEFAULT_FEATURE))
    }

    /// The resolved routes, in file order: id `provider/region/model`, the provider's kind and
    /// key variable, the region's base URL without a trailing slash, `[probe]` merged with the
    /// route's overrides, and the route's SLO or `[slo] availability`. A route naming an unknown
    /// provider or region (only possible in an unvalidated config) is left out.
    pub fn routes(&self) -> Vec<Route> {
        self.routes
            .iter()
            .filter_map(|r| {
                let provider = self.providers.iter().find(|p| p.id == r.provider)?;
                let region = provider.regions.iter().find(|g| g.id == r.region)?;
                Some(Route {
                    id: RouteId::new(&r.provider, &r.region, &r.model),
                    provider: r.provider.clone(),
                    region: r.region.clone(),
                    model: r.model.clone(),
                    kind: provider.kind,
                    base_url: region.base_url.trim_end_matches('/').to_owned(),
                    api_key_env: provider.api_key_env.clone(),
                    serves: r.serves.clone(),
                    tier: r.tier,
                    weight: r.weight,
                    price: r.price.clone(),
                    capabilities: r.capabilities.clone(),
                    context_window: r.context_window,
                    residency: r.residency.clone(),
                    slo: r.slo.unwrap_or(self.slo.availability),
                    probe: self.probe_settings(r),
                    embedding: match r.kind {
                        crate::route::RouteKind::Chat => None,
                        crate::route::RouteKind::Embeddings => r.dimensions,
                    },
                })
            })
            .collect()
    }

    /// The regression sets folder: `[drift] sets`, relative to the config file's directory
    /// (a config built in code: relative to the working directory).
    pub fn drift_sets_dir(&self) -> PathBuf {
        // `join` keeps an absolute `sets` as it is; "(built-in)" has an empty parent.
        self.source
            .parent()
            .unwrap_or_else(|| Path::new(""))
            .join(&self.drift.sets)
    }

    /// `[probe]` merged with one route's overrides.
    pub fn probe_settings(&self, route: &RouteConfig) -> ProbeSettings {
        let p = &self.probe;
        let interval = route.interval.unwrap_or(p.interval);
        ProbeSettings {
            interval,
            first_byte_timeout: route.first_byte_timeout.unwrap_or(p.first_byte_timeout),
            stall_timeout: route.stall_timeout.unwrap_or(p.stall_timeout),
            timeout: route.timeout.unwrap_or(p.timeout),
            jitter: p.jitter,
            stream: p.stream,
            max_tokens: route.max_tokens.unwrap_or(p.max_tokens),
            // An embeddings route has no tokens per second to measure.
            throughput_every: match route.kind {
                crate::route::RouteKind::Chat => p.throughput_every,
                crate::route::RouteKind::Embeddings => Duration::ZERO,
            },
            throughput_prompt: p.throughput_prompt.clone(),
            throughput_max_tokens: p.throughput_max_tokens,
            system: p.system.clone(),
            user: p.user.clone(),
            expect: p.expect.clone(),
            confirm_after: route
                .confirm_after
                .unwrap_or(p.confirm_after)
                .resolve(interval),
        }
    }

    /// One diagnostic per variable that is unset or empty — a provider's `api_key_env`, an alert
    /// channel's `webhook_env`/`secret_env`/`smtp_url_env`/`url_env` — located at that key. `serve` treats them as errors, `check-config` as warnings.
    /// Only the variable's name is ever mentioned.
    pub fn missing_secrets(&self) -> Vec<Diagnostic> {
        let file = self.source.display().to_string();
        let map = self.source_map.parsed();
        let mut out = self.missing_provider_keys(&file, &map);
        for (path, var) in self.alert_secret_vars() {
            if self.env.secret(&var).is_some() {
                continue;
            }
            let (line, col) = map.locate(&path);
            out.push(Diagnostic {
                file: file.clone(),
                line,
                col,
                message: format!(
                    "environment variable {var} is not set (or empty): alert channel {} cannot send",
                    path.rsplit_once('.').map_or(path.as_str(), |(p, _)| p)
                ),
                path,
            });
        }
        for (i, s) in self.sync.iter().enumerate() {
            if self.env.secret(&s.token_env).is_some() {
                continue;
            }
            let path = format!("sync[{i}].token_env");
            let (line, col) = map.locate(&path);
            out.push(Diagnostic {
                file: file.clone(),
                line,
                col,
                message: format!(
                    "environment variable {} is not set (or empty): {} at sync[{i}] cannot be written",
                    s.token_env,
                    s.kind.as_str()
                ),
                path,
            });
        }
        out
    }

    /// Whether the proxy would answer anyone: enabled, on a non-loopback `proxy.listen`, and
    /// `client_keys_set` false. `Refused` unless `[proxy] allow_unauthenticated` says so, then
    /// `Allowed` (a warning). Both located at `proxy.listen`.
    pub fn open_proxy(&self, client_keys_set: bool) -> Option<OpenProxy> {
        let p = &self.proxy;
        if !p.enabled || client_keys_set || p.listen.ip().is_loopback() {
            return None;
        }
        let path = "proxy.listen".to_owned();
        let (line, col) = self.source_map.locate(&path);
        let mut d = Diagnostic {
            file: self.source.display().to_string(),
            line,
            col,
            path,
            message: String::new(),
        };
        if p.allow_unauthenticated {
            d.message = format!(
                "the proxy on {} answers anyone without a client key ({} is not set) and spends \
                 the provider keys for them: allowed by proxy.allow_unauthenticated",
                p.listen, p.client_keys_env
            );
            Some(OpenProxy::Allowed(d))
        } else {
            d.message = format!(
                "the proxy on non-loopback {} has no client keys ({} is not set): anyone who \
                 reaches it spends the provider keys. Set client keys, listen on 127.0.0.1, \
                 or set proxy.allow_unauthenticated = true",
                p.listen, p.client_keys_env
            );
            Some(OpenProxy::Refused(d))
        }
    }

    /// [`Self::open_proxy`] with the client keys variable as it is now (set and naming at
    /// least one key).
    pub fn open_proxy_now(&self) -> Option<OpenProxy> {
        let set = self
            .env
            .secret(&self.proxy.client_keys_env)
            .is_some_and(|v| v.expose().split(',').any(|k| !k.trim().is_empty()))
            || (self.proxy.clients.iter()).any(|c| {
                self.env
                    .secret(&c.key_env)
                    .is_some_and(|v| !v.expose().is_empty())
            });
        self.open_proxy(set)
    }

    /// `(key path, variable)` of every variable an alert channel reads.
    fn alert_secret_vars(&self) -> Vec<(String, String)> {
        let a = &self.alert;
        let mut out = Vec::new();
        for (kind, robots) in [("dingtalk", &a.dingtalk), ("feishu", &a.feishu)] {
            for (i, r) in robots.iter().enumerate() {
                out.push((
                    format!("alert.{kind}[{i}].webhook_env"),
                    r.webhook_env.clone(),
                ));
                if let Some(s) = &r.secret_env {
                    out.push((format!("alert.{kind}[{i}].secret_env"), s.clone()));
                }
            }
        }
        for (i, e) in a.email.iter().enumerate() {
            out.push((
                format!("alert.email[{i}].smtp_url_env"),
                e.smtp_url_env.clone(),
            ));
        }
        for (i, w) in a.webhook.iter().enumerate() {
            out.push((format!("alert.webhook[{i}].url_env"), w.url_env.clone()));
            if let Some(s) = &w.secret_env {
                out.push((format!("alert.webhook[{i}].secret_env"), s.clone()));
            }
        }
        for (i, w) in a.wecom.iter().enumerate() {
            out.push((
                format!("alert.wecom[{i}].webhook_env"),
                w.webhook_env.clone(),
            ));
        }
        for (kind, hooks) in [("slack", &a.slack), ("teams", &a.teams)] {
            for (i, w) in hooks.iter().enumerate() {
                out.push((
                    format!("alert.{kind}[{i}].webhook_env"),
                    w.webhook_env.clone(),
                ));
            }
        }
        for (i, t) in a.telegram.iter().enumerate() {
            out.push((
                format!("alert.telegram[{i}].token_env"),
                t.token_env.clone(),
            ));
        }
        for (i, p) in a.pagerduty.iter().enumerate() {
            out.push((
                format!("alert.pagerduty[{i}].routing_key_env"),
                p.routing_key_env.clone(),
            ));
        }
        for (i, o) in a.opsgenie.iter().enumerate() {
            out.push((
                format!("alert.opsgenie[{i}].api_key_env"),
                o.api_key_env.clone(),
            ));
        }
        out
    }

    fn missing_provider_keys(&self, file: &str, map: &SourceMap) -> Vec<Diagnostic> {
        self.providers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let var = p.api_key_env.as_deref()?;
                if self.env.secret(var).is_some() {
                    return None;
                }
                let path = format!("provider[{i}].api_key_env");
                let (line, col) = map.locate(&path);
                Some(Diagnostic {
                    file: file.to_owned(),
                    line,
                    col,
                    path,
                    message: format!(
                        "environment variable {var} is not set (or empty): provider \"{}\" has no API key",
                        p.id
                    ),
                })
            })
            .collect()
    }
}
