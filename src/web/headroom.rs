//! Rate-limit headroom on the monitor's surfaces: `probeok_route_ratelimit_remaining_ratio
//! {route,limit}` on `/metrics`, read at scrape time from detection's board
//! ([`crate::health::headroom`]) by a `prometheus-client` collector, and each route's
//! `ratelimit` object in `/api/v1/status`.
//!
//! Series are bounded by the config: the board keeps configured routes only, four limits each,
//! and a route has series only for the limits its answers announced.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::health::headroom::Reading;
use crate::health::Headroom;
use crate::route::RouteId;

/// Every route's readings by limit name, as the status document shows them.
pub type Readings = HashMap<RouteId, BTreeMap<&'static str, Reading>>;

/// Where the registry and the status API find detection's board once it is attached.
#[derive(Debug, Clone, Default)]
pub struct HeadroomSlot(Arc<OnceLock<Headroom>>);

impl HeadroomSlot {
    /// Attaches the board; a second call is ignored (one detection per process).
    pub fn attach(&self, board: Headroom) {
        let _ = self.0.set(board);
    }

    /// Every route's latest readings; empty before a board is attached.
    pub fn readings(&self) -> Readings {
        self.0.get().map(Headroom::all).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    route: String,
    limit: &'static str,
}

impl Collector for HeadroomSlot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let readings = self.readings();
        let mut family = encoder.encode_descriptor(
            "route_ratelimit_remaining_ratio",
            "Share of the route's rate limit left (remaining / limit) as its latest answer announced it, by limit",
            None,
            MetricType::Gauge,
        )?;
        let mut routes: Vec<_> = readings.iter().collect();
        routes.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        for (route, limits) in routes {
            for (limit, r) in limits {
                let labels = Labels {
                    route: route.as_str().to_owned(),
                    limit,
                };
                ConstGauge::new(r.ratio).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::headroom::Source;
    use crate::ratelimit::{Quota, RateLimits};

    /// What the headroom adds per route, with all four limits announced: its `/metrics`
    /// series and its `ratelimit` object in `/api/v1/status`.
    #[test]
    fn a_routes_four_limits_cost_under_half_a_kilobyte_each_way() {
        let n = 1000;
        let board = Headroom::default();
        let at = chrono::DateTime::UNIX_EPOCH;
        let limits = RateLimits {
            requests: Quota::new(12, 500),
            tokens: Quota::new(90_000, 150_000),
            input_tokens: Quota::new(4_000, 80_000),
            output_tokens: Quota::new(16_000, 16_000),
        };
        for i in 0..n {
            let route = RouteId::new("anthropic", "us-east-1", &format!("claude-{i:05}"));
            board.observe(&route, &limits, Source::Traffic, at);
        }
        let slot = HeadroomSlot::default();
        slot.attach(board);
        let mut registry = prometheus_client::registry::Registry::with_prefix("probeok");
        registry.register_collector(Box::new(slot.clone()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert_eq!(
            text.matches("probeok_route_ratelimit_remaining_ratio{")
                .count(),
            4 * n
        );
        let metrics_per_route = text.len() / n;
        let status_per_route = serde_json::to_vec(&slot.readings()).unwrap().len() / n;
        eprintln!("per route: {metrics_per_route} B of metrics, {status_per_route} B of status");
        assert!(metrics_per_route < 512, "{metrics_per_route}");
        assert!(status_per_route < 512, "{status_per_route}");
    }
}
