//! In-flight limits: how many proxy requests each route and each provider has at once, and
//! the user's caps on them (`[[route]] max_in_flight`, `[[provider]] max_in_flight`; a
//! provider's count is all its routes' requests together, as providers cap concurrency per
//! API key). Without a cap a count only feeds `probeok_proxy_in_flight`; nothing of probeok's
//! bounds it below the listener's `proxy.max_connections`.
//!
//! A place is taken before an attempt and given back when the [`Held`] is dropped: after a
//! non-streamed answer, or when a committed stream's body is dropped — at its end, or when the
//! client goes away mid-stream (hyper drops the body then). A full route or provider is not a
//! failure: the candidate loop moves on, no breaker or health signal hears of it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde_json::{json, Value};

use crate::config::Config;
use crate::route::{Route, RouteId, RouteMap};

/// Which cap refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Route,
    Provider,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Route => "route",
            Self::Provider => "provider",
        }
    }
}

/// A cap a request met: the route's or its provider's, with its id and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    pub scope: Scope,
    /// The route id (`provider/region/model`) or the provider id.
    pub id: String,
    pub max_in_flight: u32,
}

impl Limited {
    pub fn to_json(&self) -> Value {
        json!({"scope": self.scope.as_str(), "id": self.id, "max_in_flight": self.max_in_flight})
    }
}

impl std::fmt::Display for Limited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} `{}` max_in_flight = {}",
            self.scope.as_str(),
            self.id,
            self.max_in_flight
        )
    }
}

/// One count and its cap.
#[derive(Debug)]
struct Count {
    now: AtomicU32,
    max: Option<u32>,
}

impl Count {
    fn new(max: Option<u32>) -> Arc<Self> {
        Arc::new(Self {
            now: AtomicU32::new(0),
            max,
        })
    }

    /// One more, unless that would pass the cap.
    fn take(&self) -> bool {
        match self.max {
            None => {
                self.now.fetch_add(1, Ordering::AcqRel);
                true
            }
            Some(max) => self
                .now
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < max).then_some(n + 1)
                })
                .is_ok(),
        }
    }

    fn give(&self) {
        self.now.fetch_sub(1, Ordering::AcqRel);
    }

    fn get(&self) -> u32 {
        self.now.load(Ordering::Acquire)
    }
}

/// A request's places at its route and provider, given back on drop.
#[derive(Debug)]
pub(crate) struct Held {
    route: Option<Arc<Count>>,
    provider: Option<Arc<Count>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        for c in [self.route.take(), self.provider.take()]
            .into_iter()
            .flatten()
        {
            c.give();
        }
    }
}

/// Every route's and provider's count, fixed at start (routes and caps restart the proxy).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    routes: RouteMap<(Arc<Count>, Option<Arc<Count>>)>,
    providers: FxHashMap<String, Arc<Count>>,
}

impl InFlight {
    /// Counts for `routes` with the caps `config` sets.
    pub(crate) fn new(config: &Config, routes: &[Arc<Route>]) -> Self {
        let providers: FxHashMap<String, Arc<Count>> = (config.providers.iter())
            .map(|p| (p.id.clone(), Count::new(p.max_in_flight)))
            .collect();
        let caps: RouteMap<Option<u32>> = (config.routes.iter())
            .map(|r| {
                let id = RouteId::new(&r.provider, &r.region, &r.model);
                (id, r.max_in_flight)
            })
            .collect();
        let routes = (routes.iter())
            .map(|r| {
                let max = caps.get(&r.id).copied().flatten();
                let provider = providers.get(&r.provider).cloned();
                (r.id.clone(), (Count::new(max), provider))
            })
            .collect();
        Self { routes, providers }
    }

    /// A place at `route` and at its provider, or the cap that refused it (the route's first).
    pub(crate) fn admit(&self, route: &RouteId) -> Result<Held, Limited> {
        let Some((count, provider)) = self.routes.get(route) else {
            return Ok(Held {
                route: None,
                provider: None,
            });
        };
        if !count.take() {
            return Err(Limited {
                scope: Scope::Route,
                id: route.as_str().to_owned(),
                max_in_flight: count.max.unwrap_or(0),
            });
        }
        let mut held = Held {
            route: Some(count.clone()),
            provider: None,
        };
        if let Some(p) = provider {
            if !p.take() {
                // Dropping `held` gives the route's place back.
                return Err(Limited {
                    scope: Scope::Provider,
                    id: route.split().0.to_owned(),
                    max_in_flight: p.max.unwrap_or(0),
                });
            }
            held.provider = Some(p.clone());
        }
        Ok(held)
    }

    /// Requests in flight per route, sorted by route.
    pub(crate) fn routes(&self) -> Vec<(RouteId, u32)> {
        let mut out: Vec<(RouteId, u32)> = (self.routes.iter())
            .map(|(id, (c, _))| (id.clone(), c.get()))
            .collect();
        out.sort();
        out
    }

    /// Requests in flight per provider (all its routes), sorted by provider.
    pub(crate) fn providers(&self) -> Vec<(String, u32)> {
        let mut out: Vec<(String, u32)> = (self.providers.iter())
            .map(|(id, c)| (id.clone(), c.get()))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ProviderConfig, RegionConfig, RouteConfig};

    fn config(route_caps: &[Option<u32>], provider_cap: Option<u32>) -> Config {
        let mut c = Config::default();
        c.providers.push(ProviderConfig {
            id: "p".into(),
            max_in_flight: provider_cap,
            regions: vec![RegionConfig {
                id: "r".into(),
                base_url: "http://127.0.0.1:1".into(),
            }],
            ..ProviderConfig::default()
        });
        for (i, cap) in route_caps.iter().enumerate() {
            c.routes.push(RouteConfig {
                provider: "p".into(),
                region: "r".into(),
                model: format!("m{i}"),
                serves: "chat".into(),
                max_in_flight: *cap,
                ..RouteConfig::default()
            });
        }
        c
    }

    fn build(c: &Config) -> (InFlight, Vec<RouteId>) {
        let routes: Vec<Arc<Route>> = c.routes().into_iter().map(Arc::new).collect();
        let ids = routes.iter().map(|r| r.id.clone()).collect();
        (InFlight::new(c, &routes), ids)
    }

    #[test]
    fn a_route_cap_refuses_past_its_value_and_a_dropped_place_comes_back() {
        let (f, ids) = build(&config(&[Some(2)], None));
        let a = f.admit(&ids[0]).expect("first");
        let _b = f.admit(&ids[0]).expect("second");
        let refused = f.admit(&ids[0]).expect_err("third");
        assert_eq!(refused.scope, Scope::Route);
        assert_eq!(refused.id, "p/r/m0");
        assert_eq!(refused.max_in_flight, 2);
        assert_eq!(f.routes(), vec![(ids[0].clone(), 2)]);
        drop(a);
        assert!(f.admit(&ids[0]).is_ok());
    }

    #[test]
    fn a_provider_cap_counts_all_its_routes_and_a_refusal_takes_no_route_place() {
        let (f, ids) = build(&config(&[None, None], Some(2)));
        let _a = f.admit(&ids[0]).expect("first");
        let _b = f.admit(&ids[1]).expect("second");
        let refused = f.admit(&ids[0]).expect_err("third");
        assert_eq!(refused.scope, Scope::Provider);
        assert_eq!(refused.id, "p");
        assert_eq!(refused.max_in_flight, 2);
        assert_eq!(
            f.routes(),
            vec![(ids[0].clone(), 1), (ids[1].clone(), 1)],
            "the refused request gave its route place back"
        );
        assert_eq!(f.providers(), vec![("p".to_owned(), 2)]);
    }

    #[test]
    fn without_caps_every_request_is_admitted_and_counted() {
        let (f, ids) = build(&config(&[None], None));
        let held: Vec<Held> = (0..10_000).map(|_| f.admit(&ids[0]).unwrap()).collect();
        assert_eq!(f.routes()[0].1, 10_000);
        drop(held);
        assert_eq!(f.routes()[0].1, 0);
        assert_eq!(f.providers()[0].1, 0);
    }
}
