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
                        format!(
                            "must be a number between 0 and {MAX_LIMIT:e}, got {}",
                            l.amount
                        ),
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
    fn clients_parse_with_and_without_limits() {
        let c = parse(
            "[[proxy.client]]\nid = \"team-a\"\nkey_env = \"TEAM_A_KEY\"\nlimit = { amount = 50.0, per = \"day\" }\n[[proxy.client]]\nid = \"b\"\nkey_env = \"B_KEY\"\n",
        )
        .unwrap();
        assert_eq!(
            c.proxy.clients,
            vec![
                ClientConfig {
                    id: "team-a".into(),
                    key_env: "TEAM_A_KEY".into(),
                    limit: Some(SpendLimit {
                        amount: 50.0,
                        per: Per::Day
                    }),
                },
                ClientConfig {
                    id: "b".into(),
                    key_env: "B_KEY".into(),
                    limit: None,
                },
            ]
        );
        assert!(parse("").unwrap().proxy.clients.is_empty());
    }

    #[test]
    fn bad_clients_are_located_errors() {
        let e = parse(
            "[[proxy.client]]\nid = \"Team A\"\nkey_env = \"sk-123\"\nlimit = { amount = -1.0, per = \"day\" }\n[[proxy.client]]\nid = \"b\"\nkey_env = \"B_KEY\"\nlimit = { amount = 1.0, per = \"week\" }\n[[proxy.client]]\nid = \"b\"\nkey_env = \"B_KEY\"\n",
        )
        .unwrap_err();
        for want in [
            "proxy.client[0].id: must be 1-64 characters",
            "proxy.client[0].key_env: must name an environment variable",
            "proxy.client[0].limit.amount: must be a number between 0",
            "proxy.client[1].limit.per: must be \"hour\", \"day\" or \"month\", got \"week\"",
            "proxy.client[2].id: client \"b\" is listed twice",
            "proxy.client[2].key_env: $B_KEY is already another client's key",
        ] {
            assert!(e.contains(want), "{want:?} missing from:\n{e}");
        }
        assert!(e.contains("t.toml:"), "{e}");
        let e = parse("[[proxy.client]]\nid = \"a\"\nkey_env = \"A\"\nlimit = { amount = 1.0 }\n")
            .unwrap_err();
        assert!(e.contains("per"), "{e}");
        let e = parse("[[proxy.client]]\nid = \"a\"\nkey_env = \"A\"\nkey = \"sk\"\n").unwrap_err();
        assert!(e.contains("key"), "{e}");
    }
}
