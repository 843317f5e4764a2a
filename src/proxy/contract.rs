//! Degradation contracts (`[[contract]]`, see `docs/configuration.md`): which contract
//! behaviour applies to a request, and the pieces every contract answer shares. Pure: no I/O.
//!
//! - The request names its feature with `x-probeok-feature` (1–64 of `[A-Za-z0-9_.-]`, else
//!   400); the contract is `Config::contract_for(feature)` (else the `default` contract).
//! - A logical model's state is the best state among its primary routes in the weights view.
//!   DEGRADED → the contract's `degraded` behaviour, CRITICAL → its `critical` one (or
//!   `degraded` when none). A model whose primaries are SWITCHED is already served by a backup,
//!   disclosed, so no contract applies; nor while it is NORMAL, WARNING or UNKNOWN.
//! - `cached_response` answers are keyed by [`cache_key`]: a SHA-256 over the normalized
//!   request, the stream flag, the feature and the client-key hash.
//! - `user_message` travels percent-encoded (UTF-8) in `x-probeok-user-message` (headers stay
//!   ASCII) and as a top-level `"probeok"` object in JSON bodies ([`block`]).

use std::time::Duration;

use axum::http::HeaderMap;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::weights::WeightsView;
use crate::config::{Behaviour, ContractConfig, DEFAULT_FEATURE};
use crate::route::Tier;

/// The request header naming the feature.
pub const FEATURE_HEADER: &str = "x-probeok-feature";
/// The longest feature name accepted.
pub const MAX_FEATURE_LEN: usize = 64;
/// `fallback_model` disclosed in `x-probeok-fallback-reason`.
pub const FALLBACK_REASON: &str = "contract_fallback_model";

/// A malformed `x-probeok-feature`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadFeature;

/// Whether `s` is a valid feature name: 1–64 of `[A-Za-z0-9_.-]` (all ASCII, so bytes are
/// characters).
pub fn valid_feature(s: &str) -> bool {
    (1..=MAX_FEATURE_LEN).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The request's feature (`None` when the header is absent).
pub fn feature_of(headers: &HeaderMap) -> Result<Option<String>, BadFeature> {
    let Some(v) = headers.get(FEATURE_HEADER) else {
        return Ok(None);
    };
    let s = v.to_str().map_err(|_| BadFeature)?;
    valid_feature(s)
        .then(|| Some(s.to_owned()))
        .ok_or(BadFeature)
}

/// How far a logical model is degraded, when a contract may apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Degraded,
    Critical,
}

/// Rank of a route state, best first.
fn rank(state: &str) -> u8 {
    match state {
        "NORMAL" => 0,
        "WARNING" => 2,
        "DEGRADED" => 3,
        "CRITICAL" => 4,
        _ => 1, // UNKNOWN and anything newer: not judged bad
    }
}

/// The model's state for contracts: the best state among its primary routes in `view`.
/// `None` when no contract applies (healthy enough, SWITCHED, or no primaries in the view).
pub fn severity(view: &WeightsView, serves: &str) -> Option<Severity> {
    let model = view.models.get(serves)?;
    let primaries: Vec<&str> = model
        .routes
        .iter()
        .filter(|r| r.tier == Tier::Primary)
        .map(|r| r.state.as_str())
        .collect();
    // The switch controller marks every primary SWITCHED: a backup serves, disclosed.
    if primaries.contains(&"SWITCHED") {
        return None;
    }
    match primaries.into_iter().map(rank).min()? {
        3 => Some(Severity::Degraded),
        4 => Some(Severity::Critical),
        _ => None,
    }
}

/// What a request gets from its contract now.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The contract's own feature (`default` for the default contract): bounded by the config,
    /// used for metric labels.
    pub contract_feature: String,
    pub behaviour: Behaviour,
    pub severity: Severity,
    pub user_message: Option<String>,
    pub retry_after: Duration,
}

/// The behaviour for `contract` (if any) at `severity` (if any).
pub fn decide(contract: Option<&ContractConfig>, severity: Option<Severity>) -> Option<Decision> {
    let contract = contract?;
    let severity = severity?;
    let behaviour = contract.behaviour(severity == Severity::Critical)?;
    Some(Decision {
        contract_feature: contract.feature.clone(),
        behaviour: behaviour.clone(),
        severity,
        user_message: contract.user_message.clone(),
        retry_after: contract.retry_after,
    })
}

/// The max age of `contract`'s `cached_response` (either state): its successful answers are
/// remembered while the model is healthy, to be served while it is not.
pub fn cache_max_age(contract: &ContractConfig) -> Option<Duration> {
    [&contract.degraded, &contract.critical]
        .into_iter()
        .flatten()
        .filter_map(|b| match b {
            Behaviour::CachedResponse { max_age } => Some(*max_age),
            _ => None,
        })
        .max()
}

/// The longest `cached_response` max age of all contracts: older cached answers are purged.
pub fn longest_cache_age(contracts: &[ContractConfig]) -> Option<Duration> {
    contracts.iter().filter_map(cache_max_age).max()
}

/// Who owns a job or a cached answer: `sha256(client key)` in hex (the key is never stored).
pub fn owner_of(client_key: &str) -> String {
    hex(&Sha256::digest(client_key.as_bytes()))
}

/// Lower-case hex of a digest (one allocation: this runs on every request).
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

/// Request fields that do not change the answer, left out of the cache key.
const NOT_IN_KEY: &[&str] = &[
    "user",
    "metadata",
    "stream",
    "stream_options",
    "store",
    "service_tier",
];

/// The `cached_response` key: SHA-256 over the canonical JSON of the request without the
/// fields that do not change the answer (every other field counts, so an unknown sampling
/// parameter can only split the cache, never merge two different requests), the stream flag
/// (stream and non-stream answers are kept apart), the feature and the client's hash.
pub fn cache_key(request: &Value, stream: bool, feature: &str, owner: &str) -> String {
    let mut normalized = request.clone();
    if let Some(obj) = normalized.as_object_mut() {
        for k in NOT_IN_KEY {
            obj.remove(*k);
        }
    }
    // serde_json's map is a BTreeMap here: `to_string` writes keys sorted, i.e. canonical.
    let mut h = Sha256::new();
    h.update(b"probeok-cache-v1\n");
    h.update(feature.as_bytes());
    h.update(b"\n");
    h.update(owner.as_bytes());
    h.update(if stream { "\nstream\n" } else { "\nplain\n" });
    h.update(normalized.to_string().as_bytes());
    hex(&h.finalize())
}

/// What `encodeURIComponent` leaves alone (RFC 3986 unreserved plus `!*'()`), so a browser
/// decodes the header with `decodeURIComponent`.
const USER_MESSAGE_SET: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'!')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// `x-probeok-user-message`: the message percent-encoded as UTF-8, plain ASCII.
pub fn encode_user_message(message: &str) -> String {
    utf8_percent_encode(message, USER_MESSAGE_SET).to_string()
}

/// The feature a request is reported under: its own, else `default`.
pub fn reported_feature(feature: Option<&str>) -> &str {
    feature.unwrap_or(DEFAULT_FEATURE)
}

/// The top-level `"probeok"` object of a contract answer's JSON body.
pub fn block(mode: &str, feature: &str, contract: &str, user_message: Option<&str>) -> Value {
    json!({
        "mode": mode,
        "feature": feature,
        "contract": contract,
        "user_message": user_message,
    })
}

/// `body` with the `"probeok"` object added (a JSON object body), else `None`.
pub fn with_block(body: &[u8], probeok: &Value) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    v.as_object_mut()?
        .insert("probeok".to_owned(), probeok.clone());
    serde_json::to_vec(&v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::weights::{ModelWeights, RouteWeight};
    use crate::route::RouteId;

    #[test]
    fn digests_are_lower_case_hex() {
        assert_eq!(hex(&[0x00, 0xab, 0x0f, 0xf0]), "00ab0ff0");
        assert_eq!(owner_of("").len(), 64);
    }

    fn view(routes: &[(&str, Tier, &str)]) -> WeightsView {
        let mut v = WeightsView::default();
        v.models.insert(
            "chat".into(),
            ModelWeights {
                routes: routes
                    .iter()
                    .map(|(id, tier, state)| RouteWeight {
                        route: RouteId::parse(id).unwrap(),
                        provider: String::new(),
                        region: String::new(),
                        model: String::new(),
                        tier: *tier,
                        weight: 0,
                        state: (*state).to_owned(),
                        reason: Value::Null,
                    })
                    .collect(),
                all_unhealthy: false,
            },
        );
        v
    }

    fn contract() -> ContractConfig {
        ContractConfig {
            feature: "default".into(),
            degraded: Some(Behaviour::CachedResponse {
                max_age: Duration::from_secs(300),
            }),
            critical: Some(Behaviour::Reject {
                message: "down".into(),
            }),
            user_message: Some("slower".into()),
            retry_after: Duration::from_secs(60),
        }
    }

    #[test]
    fn features_are_validated() {
        for ok in ["default", "a", "chat.v2_beta-1", &"x".repeat(64)] {
            assert!(valid_feature(ok), "{ok}");
        }
        for bad in ["", "has space", "ünï", "a/b", &"x".repeat(65), "a\tb"] {
            assert!(!valid_feature(bad), "{bad:?}");
        }
        let mut h = HeaderMap::new();
        assert_eq!(feature_of(&h), Ok(None));
        h.insert(FEATURE_HEADER, "chat".parse().unwrap());
        assert_eq!(feature_of(&h), Ok(Some("chat".into())));
        h.insert(FEATURE_HEADER, "no way".parse().unwrap());
        assert_eq!(feature_of(&h), Err(BadFeature));
    }

    #[test]
    fn a_models_state_is_its_best_primarys() {
        use Tier::*;
        let s = |routes: &[(&str, Tier, &str)]| severity(&view(routes), "chat");
        assert_eq!(
            s(&[("a/r/m", Primary, "DEGRADED")]),
            Some(Severity::Degraded)
        );
        assert_eq!(
            s(&[("a/r/m", Primary, "CRITICAL")]),
            Some(Severity::Critical)
        );
        assert_eq!(
            s(&[
                ("a/r/m", Primary, "CRITICAL"),
                ("b/r/m", Primary, "DEGRADED")
            ]),
            Some(Severity::Degraded)
        );
        assert_eq!(
            s(&[("a/r/m", Primary, "CRITICAL"), ("b/r/m", Primary, "NORMAL")]),
            None
        );
        // Backups do not count; SWITCHED means a backup already serves.
        assert_eq!(
            s(&[("a/r/m", Primary, "CRITICAL"), ("b/r/m", Backup, "NORMAL")]),
            Some(Severity::Critical)
        );
        assert_eq!(s(&[("a/r/m", Primary, "SWITCHED")]), None);
        for healthy in ["NORMAL", "WARNING", "UNKNOWN"] {
            assert_eq!(s(&[("a/r/m", Primary, healthy)]), None, "{healthy}");
        }
        assert_eq!(s(&[("b/r/m", Backup, "CRITICAL")]), None, "no primaries");
        assert_eq!(severity(&view(&[]), "other"), None, "unknown model");
    }

    #[test]
    fn the_behaviour_follows_the_severity() {
        let c = contract();
        assert_eq!(decide(Some(&c), None), None);
        assert_eq!(decide(None, Some(Severity::Critical)), None);
        let d = decide(Some(&c), Some(Severity::Degraded)).unwrap();
        assert_eq!(d.behaviour.name(), "cached_response");
        assert_eq!(d.contract_feature, "default");
        let d = decide(Some(&c), Some(Severity::Critical)).unwrap();
        assert_eq!(d.behaviour.name(), "reject");
        // Without a critical behaviour, the degraded one covers CRITICAL too.
        let only = ContractConfig {
            critical: None,
            ..contract()
        };
        let d = decide(Some(&only), Some(Severity::Critical)).unwrap();
        assert_eq!(d.behaviour.name(), "cached_response");
        let none = ContractConfig {
            degraded: None,
            ..contract()
        };
        assert_eq!(decide(Some(&none), Some(Severity::Degraded)), None);
        assert_eq!(cache_max_age(&c), Some(Duration::from_secs(300)));
        assert_eq!(cache_max_age(&none), None);
        assert_eq!(
            longest_cache_age(&[none, c]),
            Some(Duration::from_secs(300))
        );
    }

    #[test]
    fn cache_keys_ignore_what_does_not_change_the_answer() {
        let a = json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.2, "user": "u1", "metadata": {"x": 1}});
        let b = json!({"temperature": 0.2, "messages": [{"content": "hi", "role": "user"}],
            "model": "chat", "user": "u2", "stream_options": {"include_usage": true}});
        let k = |v: &Value, stream, feature, owner| cache_key(v, stream, feature, owner);
        assert_eq!(k(&a, false, "f", "o"), k(&b, false, "f", "o"));
        assert_ne!(
            k(&a, false, "f", "o"),
            k(&a, true, "f", "o"),
            "stream apart"
        );
        assert_ne!(
            k(&a, false, "f", "o"),
            k(&a, false, "g", "o"),
            "per feature"
        );
        assert_ne!(k(&a, false, "f", "o"), k(&a, false, "f", "p"), "per client");
        let hotter = json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.9});
        assert_ne!(k(&a, false, "f", "o"), k(&hotter, false, "f", "o"));
        assert_eq!(k(&a, false, "f", "o").len(), 64);
    }

    #[test]
    fn user_messages_travel_as_ascii() {
        assert_eq!(
            encode_user_message("Responses may be slower (backup)"),
            "Responses%20may%20be%20slower%20(backup)"
        );
        assert_eq!(encode_user_message("稍慢"), "%E7%A8%8D%E6%85%A2");
        let b = block("degraded", "chat", "reject", Some("稍慢"));
        let body = with_block(br#"{"id":"x"}"#, &b).unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["probeok"]["user_message"], "稍慢");
        assert_eq!(v["id"], "x");
        assert!(with_block(b"[1]", &b).is_none());
    }
}
