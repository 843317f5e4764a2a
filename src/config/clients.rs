//! `[[proxy.client]]`: the proxy's named clients — each with its own key (read from the
//! environment variable `key_env`) and, optionally, a spend limit per hour, day or month in
//! the routes' price currency. Clients without a limit only authenticate; `client_keys_env`
//! keeps working beside them for anonymous keys.

use std::collections::BTreeSet;

use super::raw::RawClient;
use super::validate::Checker;
use super::Config;

/// The period a spend limit covers (UTC calendar periods).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Per {
    Hour,
    Day,
    Month,
}

impl Per {
    pub fn as_str(self) -> &'static str {
        match self {
            Per::Hour => "hour",
            Per::Day => "day",
            Per::Month => "month",
        }
    }

    pub fn parse(s: &str) -> Option<Per> {
        match s {
            "hour" => Some(Per::Hour),
            "day" => Some(Per::Day),
            "month" => Some(Per::Month),
            _ => None,
        }
    }
}

/// A client's spend limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpendLimit {
    /// In the routes' price currency, per period.
    pub amount: f64,
    pub per: Per,
}

/// One `[[proxy.client]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientConfig {
    /// Shown in metering, metrics and the admin API.
    pub id: String,
    /// The variable holding the client's proxy key.
    pub key_env: String,
    pub limit: Option<SpendLimit>,
}

/// The largest limit accepted: micro-units of it must fit comfortably in an i64.
pub const MAX_LIMIT: f64 = 1e12;

pub(super) fn clients(ck: &mut Checker<'_>, raw: Vec<RawClient>) -> Vec<ClientConfig> {
    raw.into_iter()
        .enumerate()
        .map(|(i, c)| {
            let limit = c.limit.and_then(|l| {
                let at = format!("proxy.client[{i}].limit");
                let Some(per) = Per::parse(&l.per) else {
                    ck.fail(
                        format!("{at}.per"),
                        format!("must be \"hour\", \"day\" or \"month\", got {:?}", l.per),
                    );
                    return None;
                };
                if !l.amount.is_finite() || l.amount < 0.0 || l.amount > MAX_LIMIT {
                    ck.fail(
                        format!("{at}.amount"),
                        format!("must be a number between 0 and {MAX_LIMIT:e}, got {}", l.amount),
                    );
                    return None;
                }
                Some(SpendLimit {
                    amount: l.amount,
                    per,
                })
            });
            ClientConfig {
                id: c.id,
                key_env: c.key_env,
                limit,
            }
        })
        .collect()
}

pub(super) fn check(ck: &mut Checker<'_>, c: &Config) {
    let mut seen = BTreeSet::new();
    let mut vars = BTreeSet::new();
    for (i, client) in c.proxy.clients.iter().enumerate() {
        let at = format!("proxy.client[{i}]");
        if !crate::vantage::valid_id(&client.id) {
            ck.error(
                format!("{at}.id"),
                "must be 1-64 characters of a-z, 0-9, \"_\", \"-\"",
            );
        } else if !seen.insert(client.id.as_str()) {
            ck.error(
                format!("{at}.id"),
                format!("client {:?} is listed twice", client.id),
            );
        }
        ck.env_name(&format!("{at}.key_env"), &client.key_env);
        if !vars.insert(client.key_env.as_str()) {
            ck.error(
                format!("{at}.key_env"),
                format!(
                    "${} is already another client's key: each client needs its own",
                    client.key_env
                ),
            );
        }
    }
    if c.proxy.clients.iter().any(|k| k.limit.is_some()) {
        let currencies: BTreeSet<String> = (c.routes().into_iter())
            .filter_map(|r| r.price.map(|p| p.currency))
            .collect();
        if currencies.len() > 1 {
            ck.warn(
                "proxy.client",
                format!(
                    "spend limits add the routes' prices as they are, but the routes price in several currencies ({})",
                    currencies.into_iter().collect::<Vec<_>>().join(", ")
                ),
            );
        }
    }
}
