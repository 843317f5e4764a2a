//! The proxy's own view of the weights feed (`GET /api/v1/weights`, see `docs/http-api.md`):
//! `{version, generated_at, models: {"<serves>": [{route, provider, region, model, tier, weight,
//! state, reason}]}}`, with an optional `all_unhealthy` per model.
//!
//! Deliberately independent of the monitor's types: the proxy follows whatever speaks this JSON
//! (the in-process publisher serialised, or a remote monitor), and is fed through a
//! `tokio::sync::watch::Receiver<Arc<WeightsView>>`. Unknown fields are ignored, so a newer
//! monitor does not break an older proxy.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize};

use crate::route::{ProviderKind, Route, RouteId, Tier};

/// What the proxy knows about every logical model's routes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WeightsView {
    /// Opaque; a number or a string in the feed, kept as text.
    #[serde(deserialize_with = "version_text")]
    pub version: String,
    #[serde(default)]
    pub generated_at: Option<String>,
    #[serde(default)]
    pub models: BTreeMap<String, ModelWeights>,
}

/// One logical model's routes. The feed sends a plain array; an object
/// `{"routes": […], "all_unhealthy": bool}` is accepted too.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ModelWeights {
    pub routes: Vec<RouteWeight>,
    /// Every route's weight is 0: the least bad route is tried, answers say `degraded`.
    /// Derived from the weights when the feed does not say.
    pub all_unhealthy: bool,
}

impl<'de> Deserialize<'de> for ModelWeights {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            List(Vec<RouteWeight>),
            Object {
                routes: Vec<RouteWeight>,
                #[serde(default)]
                all_unhealthy: Option<bool>,
            },
        }
        let (routes, flag) = match Wire::deserialize(d)? {
            Wire::List(routes) => (routes, None),
            Wire::Object {
                routes,
                all_unhealthy,
            } => (routes, all_unhealthy),
        };
        let derived = routes.iter().all(|r| r.weight == 0);
        Ok(ModelWeights {
            all_unhealthy: flag.unwrap_or(derived),
            routes,
        })
    }
}

/// One route's share and state, as published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteWeight {
    pub route: RouteId,
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub region: String,
    #[serde(default)]
    pub model: String,
    pub tier: Tier,
    /// 0..=100; a share of the model's primary traffic.
    pub weight: u8,
    /// `UNKNOWN NORMAL WARNING DEGRADED CRITICAL SWITCHED`.
    #[serde(default = "unknown_state")]
    pub state: String,
    /// `{"code","text"}` in the feed; kept as it came (only for logs).
    #[serde(default)]
    pub reason: serde_json::Value,
}

fn unknown_state() -> String {
    "UNKNOWN".to_owned()
}

fn version_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    })
}

impl RouteWeight {
    /// How bad the route's state is, 0 (best) to 4; the order used when nothing is healthy.
    pub fn badness(&self) -> u8 {
        match self.state.as_str() {
            "NORMAL" => 0,
            "UNKNOWN" => 1,
            "WARNING" => 2,
            "DEGRADED" => 3,
            _ => 4, // CRITICAL, SWITCHED, anything new
        }
    }

    /// Whether the route may carry traffic at all: it has a share, or its state is not
    /// CRITICAL/SWITCHED (backups have weight 0 while a primary is usable, yet are usable).
    pub fn usable(&self) -> bool {
        self.weight > 0 || !matches!(self.state.as_str(), "CRITICAL" | "SWITCHED")
    }
}

impl WeightsView {
    /// The starting point before any feed: the configured weights of each model's best tier
    /// (primaries; backups when a model has no weighted primary, then fallbacks), the other
    /// tiers at 0, every route usable (state `UNKNOWN`). Only `openai` routes, the only ones
    /// the proxy sends traffic to.
    pub fn from_config(routes: &[Route]) -> Self {
        let openai: Vec<&Route> = routes
            .iter()
            .filter(|r| r.kind == ProviderKind::Openai)
            .collect();
        let share_tier = |serves: &str| {
            openai
                .iter()
                .filter(|r| r.serves == serves && r.weight > 0)
                .map(|r| r.tier)
                .min()
        };
        let mut models: BTreeMap<String, ModelWeights> = BTreeMap::new();
        for r in &openai {
            models
                .entry(r.serves.clone())
                .or_default()
                .routes
                .push(RouteWeight {
                    route: r.id.clone(),
                    provider: r.provider.clone(),
                    region: r.region.clone(),
                    model: r.model.clone(),
                    tier: r.tier,
                    weight: if Some(r.tier) == share_tier(&r.serves) {
                        r.weight
                    } else {
                        0
                    },
                    state: unknown_state(),
                    reason: serde_json::json!({"code": "configured", "text": "configured weights, before any feed"}),
                });
        }
        for m in models.values_mut() {
            m.all_unhealthy = m.routes.iter().all(|r| r.weight == 0);
        }
        Self {
            version: "config".to_owned(),
            generated_at: None,
            models,
        }
    }

    /// Parses the feed's JSON.
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The entry for one route of one model, if the feed has it.
    pub fn route(&self, serves: &str, id: &RouteId) -> Option<&RouteWeight> {
        self.models
            .get(serves)?
            .routes
            .iter()
            .find(|r| &r.route == id)
    }
}

/// The channel type the proxy follows.
pub type WeightsRx = tokio::sync::watch::Receiver<Arc<WeightsView>>;

/// How fresh a remote weights feed is: every event and every heartbeat comment counts as a
/// sign of life. Silent for `stale_after` (or never heard from since start) → stale, and the
/// proxy's answers say `x-probeok-mode: degraded` with the time it went stale.
#[derive(Debug)]
pub struct FeedStatus {
    stale_after: std::time::Duration,
    last: std::sync::Mutex<(tokio::time::Instant, Option<chrono::DateTime<chrono::Utc>>)>,
}

impl FeedStatus {
    /// Counts from now: a feed never heard from turns stale after `stale_after`.
    pub fn new(stale_after: std::time::Duration) -> Self {
        Self {
            stale_after,
            last: std::sync::Mutex::new((tokio::time::Instant::now(), None)),
        }
    }

    /// A sign of life (an event, a heartbeat, any bytes of the stream).
    pub fn seen(&self) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        *last = (tokio::time::Instant::now(), None);
    }

    /// Since when the feed has been stale (wall time), `None` while fresh.
    pub fn stale_since(
        &self,
        now: tokio::time::Instant,
        wall: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if now.saturating_duration_since(last.0) < self.stale_after {
            return None;
        }
        Some(*last.1.get_or_insert(wall))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_shape_and_object_form() {
        let json = br#"{"version":"v7","generated_at":"2026-01-01T00:00:00Z","models":{
            "chat-main":[
              {"route":"qwen/cn/qwen-max","provider":"qwen","region":"cn","model":"qwen-max","tier":"primary","weight":100,"state":"NORMAL","reason":{"code":"healthy","text":"ok"}},
              {"route":"ds/cn/ds-chat","provider":"ds","region":"cn","model":"ds-chat","tier":"backup","weight":0,"state":"CRITICAL","reason":{"code":"x","text":"y"},"extra":1}],
            "chat-lite":{"routes":[{"route":"a/b/c","tier":"primary","weight":0,"state":"DEGRADED"}],"all_unhealthy":true}}}"#;
        let v = WeightsView::from_json(json).unwrap();
        assert_eq!(v.version, "v7");
        let main = &v.models["chat-main"];
        assert!(!main.all_unhealthy);
        assert!(main.routes[0].usable());
        assert!(!main.routes[1].usable());
        assert!(v.models["chat-lite"].all_unhealthy);
        let numeric = WeightsView::from_json(br#"{"version":3,"models":{}}"#).unwrap();
        assert_eq!(numeric.version, "3");
    }
}
