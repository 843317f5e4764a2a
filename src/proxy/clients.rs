//! Named clients (`[[proxy.client]]`) and their spend limits — the billing abacus on the
//! request path:
//!
//! 1. intake finds the client by its key ([`Clients::identify`]: only SHA-256 digests are
//!    kept, compared in constant time);
//! 2. before any upstream call a client with a limit reserves the request's maximum cost
//!    ([`Clients::reserve`], the estimate from [`max_cost_micros`]) in the shared ledger
//!    ([`crate::spend::Spend`]); a refusal is a 429 `spend_limit_reached` with
//!    `Retry-After` until the period resets, and no upstream call;
//! 3. when the request ends the reservation is settled to what every attempt used
//!    ([`ClientHold::settle`], from [`attempts_micros`]) and the rest released. A request that
//!    ends without settling (its task cancelled) is charged its whole reservation: the upstream
//!    may have kept generating.
//!
//! When the ledger cannot be reached a client with a limit cannot be booked, so its request is
//! refused (503 `store_unavailable`) rather than risk an overdraw.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;

use super::record::{AttemptOutcome, Tried};
use super::reject::Reject;
use crate::config::{ClientConfig, SpendLimit};
use crate::route::{Price, Route, RouteId};
use crate::secret::Env;
use crate::spend::{self, Spend};
use crate::store::{Hold, LedgerRow};

/// One named client.
#[derive(Debug)]
pub(crate) struct NamedClient {
    pub id: String,
    pub limit: Option<SpendLimit>,
}

impl NamedClient {
    pub fn ledger_key(&self) -> String {
        format!("client:{}", self.id)
    }
}

/// A client's spend this period, for `GET /api/v1/admin/clients`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientReport {
    pub id: String,
    /// `hour`, `day`, `month`; `null` without a limit.
    pub period: Option<&'static str>,
    pub period_start: Option<String>,
    pub limit: Option<f64>,
    pub spent: f64,
    pub reserved: f64,
    pub remaining: Option<f64>,
}

/// The named clients of the proxy and the ledger their limits book in.
pub(crate) struct Clients {
    named: Vec<Arc<NamedClient>>,
    digests: Vec<[u8; 32]>,
    spend: Option<Spend>,
    /// Spent this period per client as last seen in the ledger (`probeok_client_spend`).
    seen: Mutex<HashMap<String, f64>>,
}

impl Clients {
    /// The clients whose key variable is set in `env` now (the others cannot authenticate:
    /// warned). `spend`: the store's ledger (without one, limits cannot be kept: every
    /// request of a client with a limit is refused).
    pub fn new(config: &[ClientConfig], env: &Env, spend: Option<Spend>) -> Self {
        let mut named = Vec::new();
        let mut digests = Vec::new();
        for c in config {
            match env
                .secret(&c.key_env)
                .filter(|k| !k.expose().trim().is_empty())
            {
                Some(key) => {
                    digests.push(crate::secret::digest(key.expose().trim()));
                    named.push(Arc::new(NamedClient {
                        id: c.id.clone(),
                        limit: c.limit,
                    }));
                }
                None => {
                    tracing::warn!(client = %c.id, var = %c.key_env, "proxy client key variable is not set: this client cannot authenticate")
                }
            }
        }
        Self {
            named,
            digests,
            spend,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Any named client can authenticate (client auth is on).
    pub fn any(&self) -> bool {
        !self.named.is_empty()
    }

    /// The named client whose key this is.
    pub fn identify(&self, key: &str) -> Option<Arc<NamedClient>> {
        crate::secret::which_digest(key, &self.digests).and_then(|i| self.named.get(i).cloned())
    }

    fn note(&self, id: &str, row: &LedgerRow) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.insert(id.to_owned(), spend::from_micros(row.spent_micros));
    }

    /// Spent this period per client, as this proxy last saw it in the ledger.
    pub fn spent(&self) -> Vec<(String, f64)> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, f64)> = (self.named.iter())
            .filter(|c| c.limit.is_some())
            .map(|c| (c.id.clone(), seen.get(&c.id).copied().unwrap_or(0.0)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Books `micros` for `client` (nothing for a client without a limit).
    pub async fn reserve(
        self: &Arc<Self>,
        client: &NamedClient,
        micros: i64,
    ) -> Result<Option<ClientHold>, Reject> {
        let Some(limit) = client.limit else {
            return Ok(None);
        };
        let Some(spend) = &self.spend else {
            return Err(Reject::SpendUnavailable);
        };
        let limit_micros = spend::to_micros_floor(limit.amount);
        match spend
            .reserve(&client.ledger_key(), limit.per, micros, limit_micros)
            .await
        {
            Ok(Ok((hold, row))) => {
                self.note(&client.id, &row);
                Ok(Some(ClientHold {
                    clients: self.clone(),
                    client: client.id.clone(),
                    hold: Some((spend.clone(), hold)),
                }))
            }
            Ok(Err(refusal)) => {
                self.note(&client.id, &refusal.row);
                Err(Reject::SpendLimitReached {
                    client: client.id.clone(),
                    per: limit.per.as_str(),
                    retry_after: refusal.retry_after,
                })
            }
            Err(e) => {
                tracing::warn!(client = %client.id, error = %e, "cannot book the client's spend: refusing the request");
                Err(Reject::SpendUnavailable)
            }
        }
    }

    /// Every configured client's spend this period (blocking: call it from
    /// `spawn_blocking`).
    pub fn report_blocking(&self, config: &[ClientConfig]) -> Vec<ClientReport> {
        let out = report_blocking(config, self.spend.as_ref());
        for r in &out {
            if r.limit.is_some() {
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                seen.insert(r.id.clone(), r.spent);
            }
        }
        out
    }
}

/// Every client of `config` with its spend this period in `spend`'s ledger (blocking). A
/// client whose ledger cannot be read shows zeros and `remaining: null`.
pub fn report_blocking(config: &[ClientConfig], spend: Option<&Spend>) -> Vec<ClientReport> {
    let mut out = Vec::new();
    for c in config {
        let mut r = ClientReport {
            id: c.id.clone(),
            period: None,
            period_start: None,
            limit: None,
            spent: 0.0,
            reserved: 0.0,
            remaining: None,
        };
        if let (Some(limit), Some(spend)) = (c.limit, spend) {
            let now = spend.now();
            r.period = Some(limit.per.as_str());
            r.period_start = Some(crate::clock::rfc3339(spend::period_start(limit.per, now)));
            r.limit = Some(limit.amount);
            match spend.usage_blocking(&format!("client:{}", c.id), limit.per) {
                Ok(row) => {
                    let reserved = row.reserved_micros.max(0);
                    r.spent = spend::from_micros(row.spent_micros);
                    r.reserved = spend::from_micros(reserved);
                    let left = spend::to_micros_floor(limit.amount) - row.spent_micros - reserved;
                    r.remaining = Some(spend::from_micros(left.max(0)));
                }
                Err(e) => {
                    tracing::warn!(client = %c.id, error = %e, "cannot read the client's spend")
                }
            }
        } else if let Some(limit) = c.limit {
            r.period = Some(limit.per.as_str());
            r.limit = Some(limit.amount);
        }
        out.push(r);
    }
    out
}

/// A client's booking for one request; settle it when the request ends.
pub(crate) struct ClientHold {
    clients: Arc<Clients>,
    client: String,
    hold: Option<(Spend, Hold)>,
}

impl ClientHold {
    /// Charges `micros` and releases the rest, off the request's path (the booking stays in
    /// the ledger until the store has it, so a late settlement errs on the safe side).
    pub fn settle(mut self, micros: i64) {
        self.close(Some(micros));
    }

    fn close(&mut self, micros: Option<i64>) {
        let Some((spend, hold)) = self.hold.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime (shutting down): the reservation expires and is released.
            return;
        };
        let charge = micros.unwrap_or(hold.micros);
        let clients = self.clients.clone();
        let client = std::mem::take(&mut self.client);
        rt.spawn(async move {
            match spend.settle(hold, charge).await {
                Ok(row) => clients.note(&client, &row),
                Err(e) => tracing::warn!(%client, error = %e, "could not settle the client's spend: it stays booked until it expires"),
            }
        });
    }
}

impl Drop for ClientHold {
    fn drop(&mut self) {
        // Not settled (the request's task was cancelled): the upstream may have kept
        // generating, so the whole reservation counts.
        self.close(None);
    }
}

/// The most a request may cost: its prompt tokens (estimated from the body) at the input
/// price plus `max_tokens` (or `max_completion_tokens`, else `default_max_tokens`) at the
/// output price, on the dearest of `routes` it may be sent to (those serving `models`).
pub(crate) fn max_cost_micros(
    request: &Value,
    routes: &[Arc<Route>],
    models: &[&str],
    default_max_tokens: u64,
) -> i64 {
    let prompt = super::select::estimate_prompt_tokens(request);
    let max_tokens = (request.get("max_tokens"))
        .or_else(|| request.get("max_completion_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(default_max_tokens);
    (routes.iter())
        .filter(|r| models.contains(&r.serves.as_str()))
        .filter_map(|r| r.price.as_ref())
        .map(|p| spend::micros_of(p, prompt, max_tokens))
        .max()
        .unwrap_or(0)
}

/// What the request's attempts used, in micro-units: each attempt's usage at its route's
/// price. An attempt without reported prompt tokens that did generate (a stream interrupted or
/// left by the client) counts the estimated prompt; an attempt that failed before any answer
/// counts what it reported, usually nothing.
pub(crate) fn attempts_micros(
    attempts: &[Tried],
    prices: impl Fn(&RouteId) -> Option<Price>,
    estimated_prompt: u64,
) -> i64 {
    attempts
        .iter()
        .filter(|a| a.outcome != AttemptOutcome::Skipped)
        .filter_map(|a| {
            let price = prices(&a.route)?;
            let generated = a.usage.completion_tokens.unwrap_or(0);
            let prompt =
                a.usage
                    .prompt_tokens
                    .unwrap_or(if generated > 0 || a.outcome.answered() {
                        estimated_prompt
                    } else {
                        0
                    });
            Some(spend::micros_of(&price, prompt, generated))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extra_cost::tests::route;
    use crate::route::Tier;
    use serde_json::json;

    #[test]
    fn the_estimate_prices_the_dearest_candidate_at_its_max_tokens() {
        let routes: Vec<Arc<Route>> = [
            route("a/x/m", Tier::Primary, 1.0, 2.0),
            route("b/x/m", Tier::Backup, 4.0, 8.0),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let body = json!({"model": "chat", "max_tokens": 100,
            "messages": [{"role": "user", "content": "hello"}]});
        let prompt = super::super::select::estimate_prompt_tokens(&body);
        assert!(prompt > 0);
        assert_eq!(
            max_cost_micros(&body, &routes, &["chat"], 4096),
            (prompt * 4 + 100 * 8) as i64
        );
        // Without max_tokens: the default cap.
        let body = json!({"model": "chat", "messages": [{"role": "user", "content": "hello"}]});
        assert_eq!(
            max_cost_micros(&body, &routes, &["chat"], 4096),
            (prompt * 4 + 4096 * 8) as i64
        );
        assert_eq!(max_cost_micros(&body, &routes, &["other"], 4096), 0);
    }

    #[test]
    fn named_clients_are_found_by_key_digest() {
        let env = Env::given().with("A_KEY", "sk-a").with("B_KEY", "sk-b");
        let cfg = |id: &str, var: &str| ClientConfig {
            id: id.into(),
            key_env: var.into(),
            limit: None,
        };
        let c = Clients::new(
            &[cfg("a", "A_KEY"), cfg("b", "B_KEY"), cfg("c", "UNSET")],
            &env,
            None,
        );
        assert!(c.any());
        assert_eq!(c.identify("sk-b").unwrap().id, "b");
        assert_eq!(c.identify("sk-a").unwrap().id, "a");
        assert!(c.identify("sk-c").is_none());
        assert!(c.identify("").is_none());
    }
}
