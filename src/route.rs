//! What is probed and routed to: a route is one provider × region × upstream model, with the
//! effective probe settings after `[probe]` defaults and the route's own overrides are merged.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A map by route id, hashed with FxHash: route ids come from the config and the store,
/// never from a request, and SipHash over them showed in the hot paths that look routes up
/// (a status read at 10,000 routes, every proxied request).
pub type RouteMap<V> = std::collections::HashMap<RouteId, V, rustc_hash::FxBuildHasher>;

/// `provider/region/model`. Model names may themselves contain `/`
/// (`deepseek-ai/DeepSeek-V3`), so parse with [`RouteId::split`], never a plain `split('/')`.
///
/// Shared text: a route's id is held by the scheduler, detection, the snapshots, the alert
/// tally, the figures and the metrics, and copies of it cost a pointer each, not a string each.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RouteId(std::sync::Arc<str>);

impl RouteId {
    pub fn new(provider: &str, region: &str, model: &str) -> Self {
        Self(format!("{provider}/{region}/{model}").into())
    }

    /// Parses an id as it appears in URLs and ingest payloads (already percent-decoded).
    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.splitn(3, '/');
        let (p, r, m) = (parts.next()?, parts.next()?, parts.next()?);
        if p.is_empty() || r.is_empty() || m.is_empty() {
            return None;
        }
        Some(Self(s.into()))
    }

    /// (provider, region, model).
    pub fn split(&self) -> (&str, &str, &str) {
        let mut parts = self.0.splitn(3, '/');
        let p = parts.next().unwrap_or_default();
        let r = parts.next().unwrap_or_default();
        let m = parts.next().unwrap_or_default();
        (p, r, m)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RouteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which wire protocol a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Any OpenAI-compatible API: `POST {base_url}/chat/completions`.
    Openai,
    /// Anthropic Messages API: `POST {base_url}/v1/messages`.
    Anthropic,
}

/// What a route answers: chat completions (the default) or embeddings. An embeddings route
/// is probed with `POST {base_url}/embeddings` instead of the chat probe, and its vectors are
/// compared with the route's stored reference (a model swapped under the same name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteKind {
    #[default]
    Chat,
    Embeddings,
}

impl RouteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::Chat => "chat",
            RouteKind::Embeddings => "embeddings",
        }
    }
}

/// Traffic share goes to primaries; backups when no primary is usable; fallbacks last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Primary,
    Backup,
    Fallback,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Primary => "primary",
            Tier::Backup => "backup",
            Tier::Fallback => "fallback",
        }
    }
}

/// What a route can do; the proxy never sends a request to a route lacking what it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    Stream,
    Tools,
    JsonSchema,
    Vision,
}

/// Prices per million tokens, in one currency per config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    pub currency: String,
}

/// The probe settings in force for one route (`[probe]` merged with the route's overrides).
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSettings {
    pub interval: Duration,
    /// No response byte (headers) by then: `timeout_before_first_byte`. After the headers and
    /// before the first answer token only `timeout` bounds the wait: a provider that queues the
    /// request is slow, not down.
    pub first_byte_timeout: Duration,
    /// After the first answer token, a stream silent this long is `stalled`.
    pub stall_timeout: Duration,
    /// The whole call. A slow but complete answer inside it is a slow success.
    pub timeout: Duration,
    /// ± fraction of `interval`, in [0, 0.5].
    pub jitter: f64,
    pub stream: bool,
    pub max_tokens: u32,
    pub throughput_every: Duration,
    pub throughput_prompt: String,
    pub throughput_max_tokens: u32,
    pub system: String,
    pub user: String,
    pub expect: String,
    /// Confirmation probes after an abnormal one, this long after it; `None`: off.
    pub confirm_after: Option<Duration>,
}

/// One probed and routable route, fully resolved from the config.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub id: RouteId,
    pub provider: String,
    pub region: String,
    pub model: String,
    pub kind: ProviderKind,
    /// Without a trailing slash.
    pub base_url: String,
    /// The name of the environment variable holding the key; the key itself never lives here.
    pub api_key_env: Option<String>,
    pub serves: String,
    pub tier: Tier,
    /// 0..=100.
    pub weight: u8,
    pub price: Option<Price>,
    pub capabilities: Vec<Capability>,
    pub context_window: Option<u32>,
    pub residency: Option<String>,
    /// Availability target over a rolling 30 days (route override or `[slo] availability`).
    pub slo: f64,
    pub probe: ProbeSettings,
    /// An embeddings route (`kind = "embeddings"`): the vector length it answers. `None`: a
    /// chat route.
    pub embedding: Option<u32>,
}

impl Route {
    pub fn route_kind(&self) -> RouteKind {
        match self.embedding {
            Some(_) => RouteKind::Embeddings,
            None => RouteKind::Chat,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_id_keeps_slashes_in_model_names() {
        let id = RouteId::new("deepseek", "cn", "deepseek-ai/DeepSeek-V3");
        assert_eq!(id.as_str(), "deepseek/cn/deepseek-ai/DeepSeek-V3");
        assert_eq!(id.split(), ("deepseek", "cn", "deepseek-ai/DeepSeek-V3"));
        assert_eq!(RouteId::parse(id.as_str()), Some(id));
        assert_eq!(RouteId::parse("a/b"), None);
        assert_eq!(RouteId::parse("a//c"), None);
    }
}
