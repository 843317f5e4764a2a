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
