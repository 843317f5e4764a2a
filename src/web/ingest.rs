//! `POST /api/v1/ingest`: passive outcomes from remote proxies and agents.
//!
//! - **Auth**: `Authorization: Bearer <token>`, the token read at startup from the variable
//!   named by `server.ingest_token_env`, compared as SHA-256 digests in constant time. Missing or
//!   wrong → 401. With the variable unset the endpoint is off: 404 `ingest_disabled` (the
//!   same answer whatever the request, so nothing is learnt by probing it).
//! - **Bounds**: at most [`MAX_BODY`] bytes (413 `payload_too_large`), at most [`MAX_ITEMS`]
//!   items (413 `too_many_items`). Auth is checked before the body is read.
//! - **Body**: a JSON array of `{route, started_at, success, total_ms, ttfb_ms?, ttft_ms?,
//!   first_answer_ms?, output_tokens?, tokens_estimated?, tokens_per_second?, model_reported?, http_status?,
//!   error?: {kind, status?, message?, retry_after_ms?}, ratelimit?: {requests?, tokens?,
//!   input_tokens?, output_tokens?: {remaining, limit}}}`. Unknown fields are ignored; `kind`
//!   is always `passive`. Each item is validated on its own (route configured, numbers finite
//!   and ≥ 0, `started_at` not more than [`MAX_FUTURE`] ahead nor [`MAX_AGE`] old, error kind
//!   known); a bad item is rejected with its index and the rest go on.
//! - **Delivery**: accepted items are sent to `AppState::passive` in order, awaiting each send
//!   (a full queue slows the client down instead of dropping data).
//! - **Vantages**: an item with a `vantage` is an agent's outcome (`probeok agent`): it also
//!   carries a unique `id` and its `kind` (`probe` or `throughput`). It is rejected when the
//!   vantage is not a `[[vantage]]` of the config (`unknown_vantage`), the route is not
//!   assigned to it (`route_not_assigned`) or it started more than [`MAX_FUTURE`] ahead
//!   (`future_timestamp`). Accepted ones are stored once per id (`vantage_outcomes`) before
//!   the answer, and only new ones go on to detection: a resend after a lost answer is a
//!   duplicate, never a second observation.
//! - **Answer**: 200 `{"accepted": N, "duplicates": N, "rejected": [{"index", "code",
//!   "error"}]}`. Every item answered (accepted, duplicate or rejected) is settled: an agent
//!   drops it from its outbox.

use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::Json;
use chrono::{DateTime, Duration as TimeDelta, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{ApiError, AppState};
use crate::probe::outcome::{scrub, truncate_chars, OutcomeKind, ProbeError, ProbeOutcome};
use crate::route::RouteId;
use crate::secret::Secret;
use crate::vantage::VantageOutcome;

/// Largest accepted body.
pub const MAX_BODY: usize = 1024 * 1024;
/// Most items in one request.
pub const MAX_ITEMS: usize = 1000;
/// How far in the future `started_at` may be (clock skew).
pub const MAX_FUTURE: Duration = Duration::from_secs(300);
/// How old `started_at` may be (an agent that buffered through an outage).
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

const ERROR_KINDS: &[&str] = &[
    "connect",
    "timeout_before_first_byte",
    "stalled",
    "timeout",
    "http",
    "rate_limited",
    "refused",
    "malformed",
    "truncated",
];

#[derive(Debug, Deserialize)]
struct Item {
    route: String,
    started_at: DateTime<Utc>,
    success: bool,
    total_ms: f64,
    ttfb_ms: Option<f64>,
    ttft_ms: Option<f64>,
    /// The first answer token, when the sender tells it from the first reasoning token.
    #[serde(default)]
    first_answer_ms: Option<f64>,
    output_tokens: Option<u32>,
    #[serde(default)]
    tokens_estimated: bool,
    tokens_per_second: Option<f64>,
    model_reported: Option<String>,
    http_status: Option<u16>,
    error: Option<ItemError>,
    /// The sending proxy attributed this failure to its client's own request.
    #[serde(default)]
    attributed_to: Option<String>,
    /// The rate-limit headroom the upstream's answer announced (`crate::ratelimit`).
    #[serde(default)]
    ratelimit: Option<crate::ratelimit::RateLimits>,
}

/// What an agent's item adds to a passive one.
#[derive(Debug, Deserialize)]
struct VantageFields {
    vantage: String,
    id: String,
    #[serde(default = "probe_kind")]
    kind: String,
    verified: Option<bool>,
    #[serde(default)]
    max_tokens_exhausted: bool,
    system_fingerprint: Option<String>,
}

fn probe_kind() -> String {
    "probe".into()
}

/// A rejected item: a stable code and a sentence.
struct Reject {
    code: &'static str,
    error: String,
}

impl From<String> for Reject {
    fn from(error: String) -> Self {
        Reject {
            code: "invalid_item",
            error,
        }
    }
}

#[derive(Debug, Deserialize)]
struct ItemError {
    kind: String,
    status: Option<u16>,
    message: Option<String>,
    retry_after_ms: Option<u64>,
}

/// Is the `Authorization` header `Bearer <expected>`? Digests compared in constant time
/// ([`crate::secret::matches_any`]): neither the token's content nor its length leaks.
fn authorized(headers: &HeaderMap, expected: &Secret) -> bool {
    crate::secret::bearer(headers)
        .is_some_and(|given| crate::secret::matches_any(given, [expected]))
}

/// One item → an outcome, or why not.
fn validate(state: &AppState, item: Item, now: DateTime<Utc>) -> Result<ProbeOutcome, String> {
    let route = RouteId::parse(&item.route)
        .filter(|id| state.routes.iter().any(|r| &r.id == id))
        .ok_or_else(|| format!("unknown route {:?}", truncate_chars(&item.route, 200)))?;
    let numbers = [
        ("total_ms", Some(item.total_ms)),
        ("ttfb_ms", item.ttfb_ms),
        ("ttft_ms", item.ttft_ms),
        ("first_answer_ms", item.first_answer_ms),
        ("tokens_per_second", item.tokens_per_second),
    ];
    for (name, v) in numbers {
        if let Some(v) = v {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be a finite number >= 0"));
            }
        }
    }
    let future = TimeDelta::from_std(MAX_FUTURE).unwrap_or_default();
    let age = TimeDelta::from_std(MAX_AGE).unwrap_or_default();
    if item.started_at > now + future {
        return Err("started_at is in the future".into());
    }
    if item.started_at < now - age {
        return Err("started_at is more than 24 h old".into());
    }
    let error = match item.error {
        None => None,
        Some(e) if !ERROR_KINDS.contains(&e.kind.as_str()) => {
            return Err(format!(
                "error.kind must be one of {}",
                ERROR_KINDS.join(", ")
            ))
        }
        Some(e) => Some(ProbeError::from_parts(
            &e.kind,
            e.status,
            e.message.as_deref().map(scrub),
            e.retry_after_ms,
        )),
    };
    if item.success && error.is_some() {
        return Err("a successful outcome cannot carry an error".into());
    }
    // A failure reported by status alone gets the error its status implies.
    let error = match (error, item.success, item.http_status) {
        (None, false, Some(429)) => Some(ProbeError::from_parts("rate_limited", None, None, None)),
        (None, false, Some(status)) => {
            Some(ProbeError::from_parts("http", Some(status), None, None))
        }
        (None, false, None) => {
            return Err("a failed outcome needs an error or an http_status".into())
        }
        (error, _, _) => error,
    };
    Ok(ProbeOutcome {
        route,
        kind: OutcomeKind::Passive,
        started_at: item.started_at,
        success: item.success,
        attributed_to: (item.attributed_to)
            .filter(|_| !item.success)
            .map(|c| truncate_chars(&c, 64)),
        verified: None,
        ttfb_ms: item.ttfb_ms,
        ttft_ms: item.ttft_ms,
        total_ms: item.total_ms,
        output_tokens: item.output_tokens,
        tokens_estimated: item.tokens_estimated,
        tokens_per_second: item.tokens_per_second,
        model_reported: item.model_reported.map(|m| truncate_chars(&m, 200)),
        system_fingerprint: None,
        http_status: item.http_status,
        error,
        answer: None,
        first_answer_ms: item.first_answer_ms,
        max_tokens_exhausted: false,
        // Held to the rules the headers are read by: a limit of 0 dropped, remaining clamped.
        ratelimit: item.ratelimit.as_ref().and_then(|r| r.sanitized()),
    })
}

/// `POST /api/v1/ingest`.
pub async fn handler(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let Some(token) = state.ingest_token.as_ref() else {
        return Err(ApiError::IngestDisabled);
    };
    if !authorized(&headers, token) {
        return Err(ApiError::Unauthorized);
    }
    let too_large = || ApiError::TooLarge {
        code: "payload_too_large",
        message: format!("the body exceeds {MAX_BODY} bytes"),
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let bytes = to_bytes(body, MAX_BODY).await.map_err(|_| too_large())?;
    let items: Vec<Value> = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request("bad_json", format!("expected a JSON array: {e}")))?;
    if items.len() > MAX_ITEMS {
        return Err(ApiError::TooLarge {
            code: "too_many_items",
            message: format!("{} items; at most {MAX_ITEMS} per request", items.len()),
        });
    }
    let now = state.clock.now();
    let mut accepted = 0usize;
    let mut rejected = Vec::new();
    let mut agents = Vec::new();
    for (index, raw) in items.into_iter().enumerate() {
        let vantage = raw.get("vantage").is_some();
        let outcome = if vantage {
            validate_vantage(&state, raw, now).map(Accepted::Vantage)
        } else {
            serde_json::from_value::<Item>(raw)
                .map_err(|e| Reject::from(e.to_string()))
                .and_then(|item| validate(&state, item, now).map_err(Reject::from))
                .map(Accepted::Passive)
        };
        match outcome {
            Ok(Accepted::Passive(outcome)) => {
                state
                    .passive
                    .send(outcome)
                    .await
                    .map_err(|_| ApiError::ShuttingDown)?;
                accepted += 1;
            }
            Ok(Accepted::Vantage(v)) => agents.push(v),
            Err(r) => rejected.push(json!({"index": index, "code": r.code, "error": r.error})),
        }
    }
    let mut duplicates = 0usize;
    if !agents.is_empty() {
        let keep = state.config.current().storage.retention_days;
        let keep_since = now - TimeDelta::days(keep.into());
        let written = state
            .store
            .writer()
            .record_vantage(agents.clone(), now, keep_since)
            .await?;
        duplicates = written.duplicates();
        accepted += written.inserted();
        for (v, new) in agents.into_iter().zip(written.new) {
            if !new {
                continue;
            }
            state
                .metrics
                .observe_vantage_outcome(&v.vantage, &v.outcome);
            if let Some(link) = &state.vantages {
                link.inputs
                    .send(v)
                    .await
                    .map_err(|_| ApiError::ShuttingDown)?;
            }
        }
    }
    state.metrics.observe_ingest(accepted, rejected.len());
    if !rejected.is_empty() {
        tracing::debug!(accepted, rejected = rejected.len(), "ingest rejected items");
    }
    Ok(Json(
        json!({"accepted": accepted, "duplicates": duplicates, "rejected": rejected}),
    ))
}

enum Accepted {
    Passive(ProbeOutcome),
    Vantage(VantageOutcome),
}

/// An agent's item → its outcome, or why not.
fn validate_vantage(
    state: &AppState,
    raw: Value,
    now: DateTime<Utc>,
) -> Result<VantageOutcome, Reject> {
    let extra: VantageFields =
        serde_json::from_value(raw.clone()).map_err(|e| Reject::from(e.to_string()))?;
    let item: Item = serde_json::from_value(raw).map_err(|e| Reject::from(e.to_string()))?;
    let config = state.config.current();
    let vantage = config.vantage(&extra.vantage).map_err(|_| Reject {
        code: "unknown_vantage",
        error: format!(
            "vantage {:?} is not a [[vantage]] of this monitor",
            truncate_chars(&extra.vantage, 64)
        ),
    })?;
    if !crate::vantage::valid_outcome_id(&extra.id) {
        return Err(Reject::from(format!(
            "id must be 1-{} printable characters without spaces",
            crate::vantage::MAX_OUTCOME_ID_LEN
        )));
    }
    let kind = match OutcomeKind::parse(&extra.kind) {
        Some(k @ (OutcomeKind::Probe | OutcomeKind::Throughput)) => k,
        _ => return Err(Reject::from("kind must be probe or throughput".to_owned())),
    };
    if let Some(route) = RouteId::parse(&item.route) {
        if state.routes.iter().any(|r| r.id == route) && !vantage.assigned(&route) {
            return Err(Reject {
                code: "route_not_assigned",
                error: format!(
                    "route {route} is not assigned to vantage {} (its routes: {})",
                    vantage.id,
                    vantage.routes.join(", ")
                ),
            });
        }
    }
    let future = TimeDelta::from_std(MAX_FUTURE).unwrap_or_default();
    if item.started_at > now + future {
        return Err(Reject {
            code: "future_timestamp",
            error: format!(
                "started_at {} is more than {} s ahead of the monitor's clock",
                crate::clock::rfc3339(item.started_at),
                MAX_FUTURE.as_secs()
            ),
        });
    }
    let mut outcome = validate(state, item, now)?;
    outcome.kind = kind;
    outcome.verified = extra.verified;
    outcome.max_tokens_exhausted = extra.max_tokens_exhausted;
    outcome.system_fingerprint = extra.system_fingerprint.map(|s| truncate_chars(&s, 200));
    Ok(VantageOutcome {
        vantage: vantage.id.clone(),
        id: extra.id,
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn bearer_tokens_compare_exactly() {
        let mut h = HeaderMap::new();
        let s3cret = Secret::new("s3cret");
        assert!(!authorized(&h, &s3cret));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret"),
        );
        assert!(authorized(&h, &s3cret));
        assert!(!authorized(&h, &Secret::new("s3cre")));
        assert!(!authorized(&h, &Secret::new("s3cret!")));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic s3cret"),
        );
        assert!(!authorized(&h, &s3cret));
    }
}
