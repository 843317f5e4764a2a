//! `[[envoy.cluster]]` and `[haproxy]`: proxies in front of self-hosted model servers that
//! follow the weights — Envoy through REST xDS (`POST /v3/discovery:endpoints`), HAProxy
//! through its agent-check (see `docs/operations.md`, "Envoy and HAProxy").

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use super::raw::{RawEnvoy, RawHaproxy};
use super::validate::Checker;
use super::Config;
use crate::route::{Route, RouteId};

/// `[envoy]`: the clusters the monitor assigns endpoints to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyConfig {
    /// `[[envoy.cluster]]`, in file order.
    pub clusters: Vec<EnvoyCluster>,
}

/// One Envoy cluster of type EDS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyCluster {
    /// Envoy's cluster name: the resource name in its DiscoveryRequest.
    pub name: String,
    /// Route globs; each matching route's base_url host:port is one endpoint.
    pub routes: Vec<String>,
}

/// `[haproxy]`: the agent-check responder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HaproxyConfig {
    /// Where HAProxy's agent checks connect; unset: no responder.
    pub agent_listen: Option<SocketAddr>,
}

/// One endpoint of an Envoy cluster: a route and the address of its model server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyEndpoint {
    pub route: RouteId,
    pub addr: SocketAddr,
}

impl EnvoyCluster {
    /// The routes this cluster's globs match, in config order, with their server's address;
    /// a route whose base_url has no IP-literal host is left out (`check-config` refuses it).
    pub fn endpoints(&self, routes: &[Route]) -> Vec<EnvoyEndpoint> {
        routes
            .iter()
            .filter(|r| self.matches(&r.id))
            .filter_map(|r| {
                Some(EnvoyEndpoint {
                    route: r.id.clone(),
                    addr: endpoint_addr(&r.base_url).ok()?,
                })
            })
            .collect()
    }

    fn matches(&self, route: &RouteId) -> bool {
        self.routes
            .iter()
            .any(|g| crate::glob::glob_match(g, route.as_str()))
    }
}

/// The `IP:port` of a base_url (the scheme's port when none is written), or why it has none:
/// Envoy's EDS takes IP addresses only, never names.
pub fn endpoint_addr(base_url: &str) -> Result<SocketAddr, String> {
    let url = reqwest::Url::parse(base_url).map_err(|e| format!("not a URL ({e})"))?;
    let host = url.host_str().ok_or("no host")?;
    let ip: IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| {
            format!("host {host:?} is not an IP address (Envoy's EDS takes IP addresses only)")
        })?;
    let port = url
        .port_or_known_default()
        .ok_or_else(|| format!("no port for scheme {:?}", url.scheme()))?;
    Ok(SocketAddr::new(ip, port))
}

pub(super) fn envoy(raw: RawEnvoy) -> EnvoyConfig {
    EnvoyConfig {
        clusters: raw
            .cluster
            .into_iter()
            .map(|c| EnvoyCluster {
                name: c.name,
                routes: c.routes,
            })
            .collect(),
    }
}

pub(super) fn haproxy(ck: &mut Checker<'_>, raw: RawHaproxy) -> HaproxyConfig {
    let agent_listen = raw
        .agent_listen
        .and_then(|s| match s.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                ck.fail(
                    "haproxy.agent_listen",
                    format!("invalid address {s:?}: expected IP:PORT, e.g. \"127.0.0.1:9403\""),
                );
                None
            }
        });
    HaproxyConfig { agent_listen }
}

/// Cluster names unique and non-empty; every glob matching a route; every matched route's
/// host an IP literal; no two endpoints of a cluster at one address; the agent's address its own.
pub(super) fn check(ck: &mut Checker<'_>, c: &Config) {
    let routes = c.routes();
    let mut names = BTreeSet::new();
    for (i, cl) in c.envoy.clusters.iter().enumerate() {
        let at = format!("envoy.cluster[{i}]");
        if cl.name.trim().is_empty() {
            ck.error(format!("{at}.name"), "must not be empty");
        } else if !names.insert(cl.name.as_str()) {
            ck.error(
                format!("{at}.name"),
                format!("{:?} is already a cluster", cl.name),
            );
        }
        if cl.routes.is_empty() {
            ck.error(format!("{at}.routes"), "must list at least one route glob");
        }
        for g in &cl.routes {
            if !routes
                .iter()
                .any(|r| crate::glob::glob_match(g, r.id.as_str()))
            {
                ck.error(
                    format!("{at}.routes"),
                    format!("{g:?} matches no configured route"),
                );
            }
        }
        let mut seen = BTreeSet::new();
        for r in routes.iter().filter(|r| cl.matches(&r.id)) {
            match endpoint_addr(&r.base_url) {
                Err(why) => ck.error(
                    format!("{at}.routes"),
                    format!("route {}: base_url {:?}: {why}", r.id, r.base_url),
                ),
                Ok(addr) if !seen.insert(addr) => ck.error(
                    format!("{at}.routes"),
                    format!(
                        "route {}: {addr} is already an endpoint of this cluster",
                        r.id
                    ),
                ),
                Ok(_) => {}
            }
        }
    }
    if let Some(a) = c.haproxy.agent_listen {
        if a == c.server.listen || (c.proxy.enabled && a == c.proxy.listen) {
            ck.error(
                "haproxy.agent_listen",
                format!(
                    "{a} is already server.listen or proxy.listen: the agent needs its own address"
                ),
            );
        }
    }
}
