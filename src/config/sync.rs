//! `[[sync]]`: gateways whose channels follow the weights — new-api and one-api, written by the
//! monitor's leader through their admin channel API (see `docs/routers.md`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use super::raw::RawSync;
use super::validate::Checker;
use super::Config;
use crate::route::RouteId;

/// Which gateway: both speak the same channel API; new-api also wants `New-Api-User`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum SyncKind {
    #[serde(rename = "new-api")]
    NewApi,
    #[serde(rename = "one-api")]
    OneApi,
}

impl SyncKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncKind::NewApi => "new-api",
            SyncKind::OneApi => "one-api",
        }
    }
}

/// One gateway whose channels are kept in step with their routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncConfig {
    pub kind: SyncKind,
    /// The gateway's base URL (`http://new-api:3000`); its admin API is under `/api/`.
    pub url: String,
    /// The variable holding an admin access token, sent as `Authorization: Bearer`.
    pub token_env: String,
    /// The token's user id, sent as `New-Api-User` (new-api refuses admin calls without it).
    pub user_id: Option<u64>,
    /// Route → channel id, in route order.
    pub channels: BTreeMap<String, u64>,
}

pub(super) fn syncs(ck: &mut Checker<'_>, raw: Vec<RawSync>) -> Vec<SyncConfig> {
    raw.into_iter()
        .enumerate()
        .map(|(i, s)| {
            let user_id = s.user_id.and_then(|u| match u64::try_from(u) {
                Ok(u) if u > 0 => Some(u),
                _ => {
                    ck.fail(
                        format!("sync[{i}].user_id"),
                        format!("must be a user id (1 or more), not {u}"),
                    );
                    None
                }
            });
            let mut channels = BTreeMap::new();
            for (route, id) in s.channels {
                match u64::try_from(id) {
                    Ok(id) if id > 0 => {
                        channels.insert(route, id);
                    }
                    _ => ck.fail(
                        format!("sync[{i}].channels"),
                        format!("route {route:?}: channel id must be 1 or more, not {id}"),
                    ),
                }
            }
            SyncConfig {
                kind: s.kind,
                url: s.url,
                token_env: s.token_env,
                user_id,
                channels,
            }
        })
        .collect()
}

/// URLs, token variable names, new-api's user id, every mapped route configured, no channel
/// mapped twice in one gateway.
pub(super) fn check(ck: &mut Checker<'_>, c: &Config) {
    let routes: BTreeSet<RouteId> = c.routes().into_iter().map(|r| r.id).collect();
    for (i, s) in c.sync.iter().enumerate() {
        let at = format!("sync[{i}]");
        ck.url(&format!("{at}.url"), &s.url, true);
        ck.env_name(&format!("{at}.token_env"), &s.token_env);
        if s.kind == SyncKind::NewApi && s.user_id.is_none() {
            ck.error(
                format!("{at}.user_id"),
                "new-api needs the token's user id (sent as New-Api-User; its admin API refuses calls without it)",
            );
        }
        if s.channels.is_empty() {
            ck.error(
                format!("{at}.channels"),
                "must map at least one route to a channel id",
            );
        }
        let mut ids = BTreeMap::new();
        for (route, id) in &s.channels {
            match RouteId::parse(route) {
                Some(r) if routes.contains(&r) => {}
                _ => ck.error(
                    format!("{at}.channels"),
                    format!("{route:?} is not a configured route (provider/region/model)"),
                ),
            }
            if let Some(other) = ids.insert(*id, route) {
                ck.error(
                    format!("{at}.channels"),
                    format!("channel {id} is mapped twice ({other:?} and {route:?})"),
                );
            }
        }
    }
}
