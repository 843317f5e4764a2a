//! What the provider's word means for our routes, pure: each route's declared state
//! (`declared` in `/api/v1/status`) and when to raise `provider_declared` — the provider
//! declares trouble on components we use while our own probes find those routes fine.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::lead::Mapping;
use crate::health::HealthSnapshot;
use crate::route::RouteId;
use crate::state::State;
use crate::store::declared::{DeclaredComponent, DeclaredIncident};

/// What the status pages currently declare: every component state and the unresolved
/// incidents.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Declared {
    pub components: Vec<DeclaredComponent>,
    pub open: Vec<DeclaredIncident>,
}

/// One route as its provider's status page declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteDeclared {
    /// The worst state among the page components that map the route (`operational`,
    /// `under_maintenance`, `degraded_performance`, `partial_outage`, `major_outage`), or
    /// `incident` when only an open incident (a feed has no component states) concerns it.
    pub status: String,
    /// The newest open incident that concerns the route.
    pub incident: Option<String>,
    /// Since when: the incident's declaration, or the component's state.
    pub since: Option<String>,
    pub url: Option<String>,
}

impl RouteDeclared {
    /// The provider admits trouble on this route (maintenance is planned, not trouble).
    pub fn troubled(&self) -> bool {
        self.incident.is_some() || rank(&self.status) >= 2
    }
}

/// How bad a component state is: unknown words count as degraded.
fn rank(status: &str) -> u8 {
    match status {
        "operational" => 0,
        "under_maintenance" => 1,
        "partial_outage" => 3,
        "major_outage" => 4,
        _ => 2,
    }
}

/// `route` as the pages declare it; `None` when no page maps it.
pub fn route_view(map: &Mapping, d: &Declared, route: &RouteId) -> Option<RouteDeclared> {
    if !map.covers(route) {
        return None;
    }
    // The provider first: a cheap test that spares the globs of every other provider's pages
    // (a status answer asks this of every route).
    let provider = route.split().0;
    let worst = d
        .components
        .iter()
        .filter(|c| c.provider == provider)
        .filter(|c| map.maps(&c.page, Some(&c.component), route))
        .max_by_key(|c| (rank(&c.status), std::cmp::Reverse(c.since)));
    let incident = d
        .open
        .iter()
        .filter(|i| i.provider == provider)
        .filter(|i| map.concerns(i, route))
        .max_by_key(|i| i.declared_at);
    let status = match (worst, incident) {
        (Some(c), _) if rank(&c.status) > 0 || incident.is_none() => c.status.clone(),
        (_, Some(_)) => "incident".to_owned(),
        (None, None) => "operational".to_owned(),
        (Some(c), None) => c.status.clone(),
    };
    let since = incident
        .map(|i| i.declared_at)
        .or(worst.filter(|c| rank(&c.status) > 0).map(|c| c.since));
    Some(RouteDeclared {
        status,
        incident: incident.map(|i| i.name.clone()),
        since: since.map(crate::clock::rfc3339),
        url: incident.and_then(|i| i.url.clone()),
    })
}

/// A `provider_declared` alert to raise or resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raise {
    /// `provider_declared:<page>#<incident id or component>`.
    pub key: String,
    pub provider: String,
    /// The incident's name, or `<component>: <state>`.
    pub what: String,
    pub url: Option<String>,
    pub routes: Vec<RouteId>,
    /// `false`: the provider no longer declares it.
    pub firing: bool,
}

/// The firing-state key prefix of `provider_declared` alerts.
pub const KEY_PREFIX: &str = "provider_declared:";

/// Remembers what was raised, and what was first seen while our own probes already found
/// the routes in trouble (never raised: we knew first).
#[derive(Debug, Clone, Default)]
pub struct Alerter {
    fired: BTreeMap<String, (String, Vec<RouteId>)>,
    known: BTreeSet<String>,
}

impl Alerter {
    /// Starts from the alerts still firing (read back from the alert store), so one the
    /// provider resolved while this monitor was away is resolved now, not left open.
    pub fn resume(firing_keys: impl IntoIterator<Item = String>) -> Self {
        let fired = firing_keys
            .into_iter()
            .filter(|k| k.starts_with(KEY_PREFIX))
            .map(|k| (k, (String::new(), Vec::new())))
            .collect();
        Self {
            fired,
            known: BTreeSet::new(),
        }
    }

    /// What to raise and resolve now. `pages` are the pages with `alert` on; `routes` every
    /// configured route.
    pub fn step(
        &mut self,
        map: &Mapping,
        d: &Declared,
        pages: &BTreeSet<String>,
        routes: &[RouteId],
        health: &HealthSnapshot,
    ) -> Vec<Raise> {
        let mut now: BTreeMap<String, (String, String, Option<String>, Vec<RouteId>)> =
            BTreeMap::new();
        for i in d.open.iter().filter(|i| pages.contains(&i.page)) {
            let affected: Vec<RouteId> = routes
                .iter()
                .filter(|r| map.concerns(i, r))
                .cloned()
                .collect();
            let key = format!("{KEY_PREFIX}{}#{}", i.page, i.id);
            now.insert(
                key,
                (i.provider.clone(), i.name.clone(), i.url.clone(), affected),
            );
        }
        for c in d.components.iter().filter(|c| pages.contains(&c.page)) {
            if rank(&c.status) < 2 {
                continue;
            }
            // An open incident naming the component already speaks for it.
            let spoken = d
                .open
                .iter()
                .any(|i| i.page == c.page && i.components.contains(&c.component));
            if spoken {
                continue;
            }
            let affected: Vec<RouteId> = routes
                .iter()
                .filter(|r| map.maps(&c.page, Some(&c.component), r))
                .cloned()
                .collect();
            let key = format!("{KEY_PREFIX}{}#{}", c.page, c.component);
            let what = format!("{}: {}", c.component, c.status.replace('_', " "));
            now.insert(key, (c.provider.clone(), what, None, affected));
        }
        let mut out = Vec::new();
        for (key, (provider, what, url, affected)) in &now {
            if affected.is_empty() || self.fired.contains_key(key) || self.known.contains(key) {
                continue;
            }
            if all_fine(health, affected) {
                self.fired
                    .insert(key.clone(), (provider.clone(), affected.clone()));
                out.push(Raise {
                    key: key.clone(),
                    provider: provider.clone(),
                    what: what.clone(),
                    url: url.clone(),
                    routes: affected.clone(),
                    firing: true,
                });
            } else {
                self.known.insert(key.clone());
            }
        }
        let gone: Vec<String> = self
            .fired
            .keys()
            .filter(|k| !now.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some((provider, routes)) = self.fired.remove(&key) {
                out.push(Raise {
                    what: key
                        .rsplit_once('#')
                        .map(|(_, w)| w.to_owned())
                        .unwrap_or_default(),
                    key,
                    provider,
                    url: None,
                    routes,
                    firing: false,
                });
            }
        }
        self.known.retain(|k| now.contains_key(k));
        out
    }
}

/// Every affected route with a judged state is NORMAL, and at least one is.
fn all_fine(health: &HealthSnapshot, affected: &[RouteId]) -> bool {
    let mut normal = false;
    for r in affected {
        match health.route(r).map(|s| s.state) {
            Some(State::Normal) => normal = true,
            Some(State::Unknown) | None => {}
            Some(_) => return false,
        }
    }
    normal
}
