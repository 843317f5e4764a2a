//! `[[vantage]]`, `[quorum]`, `[agent]` and `[server] vantage`: probing from many places.
//! The monitor's own scheduler is the vantage `server.vantage` and probes every route; each
//! `[[vantage]]` is a remote agent probing the routes its globs name.

use std::collections::BTreeSet;
use std::time::Duration;

use super::convert::duration;
use super::raw::{RawAgent, RawQuorum, RawVantage};
use super::validate::Checker;
use super::Config;
use crate::route::RouteId;

/// A bad `--vantage` for `probeok agent`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VantageError {
    #[error("vantage {0:?} is not a [[vantage]] of the config (known: {1})")]
    Unknown(String, String),
}

/// One remote vantage.
#[derive(Debug, Clone, PartialEq)]
pub struct VantageConfig {
    pub id: String,
    /// Globs over route ids ([`crate::glob`]); empty means every route.
    pub routes: Vec<String>,
    /// No push for this long: the vantage is stale and leaves the quorum.
    pub stale_after: Duration,
}

impl VantageConfig {
    pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(120);

    /// Does this vantage probe `route`?
    pub fn assigned(&self, route: &RouteId) -> bool {
        self.routes.is_empty()
            || self
                .routes
                .iter()
                .any(|g| crate::glob::glob_match(g, route.as_str()))
    }
}

/// `[quorum]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumConfig {
    /// A route takes the worst state at least this many fresh vantages share (all of them
    /// when fewer are fresh).
    pub min_vantages: u32,
}

impl Default for QuorumConfig {
    fn default() -> Self {
        Self { min_vantages: 2 }
    }
}

/// `[agent]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// Outcomes an agent keeps while the monitor is away; beyond it the oldest are dropped.
    pub max_backlog: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            max_backlog: 100_000,
        }
    }
}

impl Config {
    /// The remote vantage `id`, or why not.
    pub fn vantage(&self, id: &str) -> Result<&VantageConfig, VantageError> {
        self.vantages.iter().find(|v| v.id == id).ok_or_else(|| {
            let known: Vec<&str> = self.vantages.iter().map(|v| v.id.as_str()).collect();
            let known = if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            };
            VantageError::Unknown(id.to_owned(), known)
        })
    }

    /// The remote vantages that probe `route`, in config order.
    pub fn vantages_of<'a>(
        &'a self,
        route: &'a RouteId,
    ) -> impl Iterator<Item = &'a VantageConfig> {
        self.vantages.iter().filter(move |v| v.assigned(route))
    }
}

pub(super) fn vantages(ck: &mut Checker<'_>, raw: Vec<RawVantage>) -> Vec<VantageConfig> {
    raw.into_iter()
        .enumerate()
        .map(|(i, v)| VantageConfig {
            stale_after: duration(
                ck,
                &format!("vantage[{i}].stale_after"),
                v.stale_after,
                VantageConfig::DEFAULT_STALE_AFTER,
            ),
            id: v.id,
            routes: v.routes.unwrap_or_default(),
        })
        .collect()
}

pub(super) fn quorum(ck: &mut Checker<'_>, raw: RawQuorum) -> QuorumConfig {
    let d = QuorumConfig::default();
    let min_vantages = match raw.min_vantages {
        None => d.min_vantages,
        Some(n) if (1..=1000).contains(&n) => n as u32,
        Some(n) => {
            ck.fail(
                "quorum.min_vantages",
                format!("must be between 1 and 1000, got {n}"),
            );
            d.min_vantages
        }
    };
    QuorumConfig { min_vantages }
}

pub(super) fn agent(ck: &mut Checker<'_>, raw: RawAgent) -> AgentConfig {
    let d = AgentConfig::default();
    let max_backlog = match raw.max_backlog {
        None => d.max_backlog,
        Some(n) if (1..=100_000_000).contains(&n) => n as u64,
        Some(n) => {
            ck.fail(
                "agent.max_backlog",
                format!("must be between 1 and 100000000, got {n}"),
            );
            d.max_backlog
        }
    };
    AgentConfig { max_backlog }
}

const ID_RULE: &str = "must be 1-64 characters of a-z, 0-9, \"_\", \"-\"";

pub(super) fn check(ck: &mut Checker<'_>, c: &Config) {
    if !crate::vantage::valid_id(&c.server.vantage) {
        ck.error("server.vantage", ID_RULE);
    }
    let routes: Vec<RouteId> = c.routes().into_iter().map(|r| r.id).collect();
    let mut seen = BTreeSet::new();
    for (i, v) in c.vantages.iter().enumerate() {
        let at = format!("vantage[{i}]");
        if !crate::vantage::valid_id(&v.id) {
            ck.error(format!("{at}.id"), ID_RULE);
        } else if v.id == c.server.vantage {
            ck.error(
                format!("{at}.id"),
                format!(
                    "{:?} is this monitor's own vantage (server.vantage); a [[vantage]] is a remote agent",
                    v.id
                ),
            );
        } else if !seen.insert(v.id.as_str()) {
            ck.error(
                format!("{at}.id"),
                format!("vantage {:?} is listed twice", v.id),
            );
        }
        if v.stale_after.is_zero() {
            ck.error(format!("{at}.stale_after"), "must be greater than 0");
        }
        for (j, g) in v.routes.iter().enumerate() {
            if !routes
                .iter()
                .any(|r| crate::glob::glob_match(g, r.as_str()))
            {
                ck.error(
                    format!("{at}.routes[{j}]"),
                    format!("{g:?} matches no configured route"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[[provider]]
id = "qwen"
kind = "openai"
  [[provider.region]]
  id = "cn"
  base_url = "http://127.0.0.1:1/v1"
[[route]]
provider = "qwen"
region = "cn"
model = "m"
serves = "chat"
"#;

    fn parse(extra: &str) -> Result<Config, String> {
        Config::parse(&format!("{BASE}\n{extra}"), "t.toml")
            .map(|l| l.config)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_one_local_vantage() {
        let c = parse("").unwrap();
        assert_eq!(c.server.vantage, "local");
        assert!(c.vantages.is_empty());
        assert_eq!(c.quorum.min_vantages, 2);
        assert_eq!(c.agent.max_backlog, 100_000);
    }

    #[test]
    fn vantages_parse_with_globs_and_staleness() {
        let c = parse(
            "[server]\nvantage = \"cn-hangzhou\"\n[[vantage]]\nid = \"cn-beijing\"\nroutes = [\"qwen/*\"]\nstale_after = \"30s\"\n[quorum]\nmin_vantages = 3\n[agent]\nmax_backlog = 10\n",
        )
        .unwrap();
        let v = c.vantage("cn-beijing").unwrap();
        assert_eq!(v.stale_after, Duration::from_secs(30));
        assert!(v.assigned(&RouteId::new("qwen", "cn", "m")));
        assert!(!v.assigned(&RouteId::new("ds", "cn", "m")));
        assert_eq!(c.vantages_of(&RouteId::new("qwen", "cn", "m")).count(), 1);
        assert_eq!(c.quorum.min_vantages, 3);
        assert_eq!(c.agent.max_backlog, 10);
        assert!(matches!(
            c.vantage("nowhere"),
            Err(VantageError::Unknown(..))
        ));
    }

    #[test]
    fn bad_vantages_are_located_errors() {
        let e = parse(
            "[server]\nvantage = \"Bad Id\"\n[[vantage]]\nid = \"x\"\nroutes = [\"nope/*\"]\nstale_after = \"0s\"\n[[vantage]]\nid = \"x\"\n[quorum]\nmin_vantages = 0\n[agent]\nmax_backlog = -1\n",
        )
        .unwrap_err();
        for want in [
            "server.vantage: must be 1-64 characters",
            "vantage[0].routes[0]: \"nope/*\" matches no configured route",
            "vantage[0].stale_after: must be greater than 0",
            "vantage[1].id: vantage \"x\" is listed twice",
            "quorum.min_vantages: must be between 1 and 1000",
            "agent.max_backlog: must be between 1",
        ] {
            assert!(e.contains(want), "{want:?} missing from:\n{e}");
        }
        assert!(e.contains("t.toml:"), "{e}");
        let e = parse("[[vantage]]\nid = \"local\"\n").unwrap_err();
        assert!(e.contains("this monitor's own vantage"), "{e}");
    }
}
