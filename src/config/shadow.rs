//! `[[shadow]]`: a route that gets a sampled copy of a logical model's proxy traffic, off the
//! client's path, before it gets any real traffic (see `docs/operations.md`, "bringing a new
//! route in").

use std::collections::BTreeSet;

use super::raw::RawShadow;
use super::validate::Checker;
use super::Config;
use crate::route::{ProviderKind, RouteId};

/// One shadow.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowConfig {
    /// The logical model whose requests are copied.
    pub serves: String,
    /// The route (`provider/region/model`) that gets the copies and no real traffic.
    pub route: String,
    /// The share of requests copied, in (0, 1].
    pub ratio: f64,
    /// The copies' cost per hour at most (the route's price and currency); spent: skipped.
    pub max_cost_per_hour: f64,
}

impl ShadowConfig {
    pub const DEFAULT_MAX_COST_PER_HOUR: f64 = 1.0;
}

impl Config {
    /// The routes named by a `[[shadow]]`: they get copies only, never the real traffic of
    /// their logical model.
    pub fn shadow_routes(&self) -> BTreeSet<RouteId> {
        self.shadows
            .iter()
            .filter_map(|s| RouteId::parse(&s.route))
            .collect()
    }
}

pub(super) fn shadows(raw: Vec<RawShadow>) -> Vec<ShadowConfig> {
    raw.into_iter()
        .map(|s| ShadowConfig {
            serves: s.serves,
            route: s.route,
            ratio: s.ratio,
            max_cost_per_hour: s
                .max_cost_per_hour
                .unwrap_or(ShadowConfig::DEFAULT_MAX_COST_PER_HOUR),
        })
        .collect()
}

/// Unknown models and routes, ratios outside (0, 1], a route shadowing its own model's
/// traffic twice, a route the proxy cannot call.
pub(super) fn check(ck: &mut Checker<'_>, c: &Config) {
    let models: BTreeSet<&str> = c.routes.iter().map(|r| r.serves.as_str()).collect();
    let routes = c.routes();
    let mut seen = BTreeSet::new();
    for (i, s) in c.shadows.iter().enumerate() {
        let at = format!("shadow[{i}]");
        if !models.contains(s.serves.as_str()) {
            ck.error(
                format!("{at}.serves"),
                format!("{:?} is not a logical model: no route serves it", s.serves),
            );
        }
        match routes.iter().find(|r| r.id.as_str() == s.route) {
            None => ck.error(
                format!("{at}.route"),
                format!(
                    "{:?} is not a configured route (write provider/region/model)",
                    s.route
                ),
            ),
            Some(r) if r.kind != ProviderKind::Openai => ck.error(
                format!("{at}.route"),
                format!(
                    "{:?} is not an openai route: the proxy sends traffic to openai routes only",
                    s.route
                ),
            ),
            Some(r) if r.price.is_none() => ck.warn(
                format!("{at}.route"),
                format!(
                    "{:?} has no price: its copies cost nothing as far as max_cost_per_hour knows",
                    s.route
                ),
            ),
            Some(_) => {}
        }
        if !(s.ratio > 0.0 && s.ratio <= 1.0) {
            ck.error(
                format!("{at}.ratio"),
                format!("must be in (0, 1], e.g. 0.05, got {}", s.ratio),
            );
        }
        if !(s.max_cost_per_hour.is_finite() && s.max_cost_per_hour >= 0.0) {
            ck.error(
                format!("{at}.max_cost_per_hour"),
                format!("must be 0 or more, got {}", s.max_cost_per_hour),
            );
        }
        if !seen.insert((s.serves.as_str(), s.route.as_str())) {
            ck.error(
                format!("{at}.route"),
                format!("{:?} already shadows {:?}", s.route, s.serves),
            );
        }
    }
}
