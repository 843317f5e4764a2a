//! What a request must pass before any upstream call, in this order: the client's key
//! ([`ClientKeys`]), the body's size and arrival time, JSON that OpenAI would accept
//! ([`validate`]), the `x-probeok-feature` header, and its `Idempotency-Key` ([`claim`]).
//!
//! Bad input is refused with 400 before any upstream call; bodies over `max_body` get 413
//! (a declared length over it is refused unread); a body that does not arrive within the
//! body read timeout gets 408.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;

use super::reject::Reject;
use super::select::Needs;
use super::{contract, idempotency, Inner};
use crate::secret::{Env, Secret};
use crate::store::IdempotentAnswer;

/// The keys clients must present (`client_keys_env`, comma-separated); off when unset.
pub(crate) struct ClientKeys(Option<Vec<Secret>>);

impl ClientKeys {
    /// The keys in the variable `var` of `env`, read now.
    pub fn from_env(env: &Env, var: &str) -> Self {
        Self(env.secret(var).map(|all| {
            all.expose()
                .split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(Secret::new)
                .collect()
        }))
    }

    /// These keys (none: client auth off).
    pub fn given(keys: Vec<Secret>) -> Self {
        Self(Some(keys).filter(|k| !k.is_empty()))
    }

    /// The client's key (empty when client auth is off). Digests are compared in constant
    /// time (so neither the content nor the length of a key leaks through timing), and every
    /// key is compared, matched or not.
    pub fn check(&self, headers: &HeaderMap) -> Result<String, Reject> {
        let Some(keys) = &self.0 else {
            return Ok(String::new());
        };
        let given = crate::secret::bearer(headers).ok_or(Reject::Unauthorized)?;
        if crate::secret::matches_any(given, keys.iter()) {
            Ok(given.to_owned())
        } else {
            Err(Reject::Unauthorized)
        }
    }
}

/// The caller's key (empty when client auth is off) and the named client it belongs to, if
/// any. With named clients (`[[proxy.client]]`) client auth is on; `client_keys_env`'s keys
/// are accepted beside theirs as anonymous keys. Both lists are compared whole.
pub(crate) fn identify(
    p: &Inner,
    headers: &HeaderMap,
) -> Result<(String, Option<std::sync::Arc<super::clients::NamedClient>>), Reject> {
    if !p.clients.any() {
        return p.client_keys.check(headers).map(|k| (k, None));
    }
    let given = crate::secret::bearer(headers).ok_or(Reject::Unauthorized)?;
    let named = p.clients.identify(given);
    let anonymous = p.client_keys.check(headers).is_ok_and(|k| !k.is_empty());
    match named {
        Some(c) => Ok((given.to_owned(), Some(c))),
        None if anonymous => Ok((given.to_owned(), None)),
        None => Err(Reject::Unauthorized),
    }
}

/// A request that passed intake.
pub(crate) struct Intake {
    /// The client's key (empty when client auth is off): scopes idempotency keys and jobs.
    pub client_key: String,
    /// The named client, when the key is one's.
    pub client: Option<std::sync::Arc<super::clients::NamedClient>>,
    /// The body as received.
    pub raw: Bytes,
    /// The body, parsed and validated.
    pub request: Value,
    /// The logical model asked for.
    pub model: String,
    /// `x-probeok-feature`, validated.
    pub feature: Option<String>,
    /// `x-probeok-residency`.
    pub residency: Option<String>,
    pub needs: Needs,
}

/// Checks the client and reads its request (see the module docs).
pub(crate) async fn read(p: &Inner, headers: &HeaderMap, body: Body) -> Result<Intake, Reject> {
    let (client_key, client) = identify(p, headers)?;
    let raw = read_body(p, headers, body).await?;
    let request = match serde_json::from_slice(&raw) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return Err(Reject::NotAnObject),
        Err(e) => return Err(Reject::InvalidJson(e.to_string())),
    };
    validate(&request)?;
    let feature =
        contract::feature_of(headers).map_err(|contract::BadFeature| Reject::InvalidFeature)?;
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let residency = headers
        .get("x-probeok-residency")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let needs = Needs::from_request(&request, residency.as_deref());
    Ok(Intake {
        client_key,
        client,
        raw,
        request,
        model,
        feature,
        residency,
        needs,
    })
}

/// The whole body, within `max_body` and the body read timeout.
pub(super) async fn read_body(p: &Inner, headers: &HeaderMap, body: Body) -> Result<Bytes, Reject> {
    let too_large = Reject::TooLarge {
        max_body: p.config.max_body,
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > p.config.max_body) {
        return Err(too_large);
    }
    let limit = usize::try_from(p.config.max_body).unwrap_or(usize::MAX);
    match tokio::time::timeout(p.body_read_timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => Err(Reject::BodyTimeout),
        Ok(Err(_)) => Err(too_large),
        Ok(Ok(raw)) => Ok(raw),
    }
}

/// Field types OpenAI would reject, checked before any upstream call.
pub(crate) fn validate(request: &Value) -> Result<(), Reject> {
    let invalid = |code, message: String| Reject::InvalidField { code, message };
    match request.get("model") {
        Some(Value::String(m)) if !m.is_empty() => {}
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(invalid(
                "missing_model",
                "`model` (a logical model name) is required".to_owned(),
            ))
        }
        Some(_) => {
            return Err(invalid(
                "invalid_type",
                "`model` must be a string".to_owned(),
            ))
        }
    }
    let Some(messages) = request
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
    else {
        return Err(invalid(
            "missing_messages",
            "`messages` must be a non-empty array".to_owned(),
        ));
    };
    for (i, m) in messages.iter().enumerate() {
        if !m.get("role").is_some_and(Value::is_string) {
            return Err(invalid(
                "invalid_type",
                format!("`messages[{i}]` must be an object with a string `role`"),
            ));
        }
    }
    // One pass over the members, not a map lookup per checked name: of several wrong ones
    // the first in `TYPED` is reported.
    let wrong = request
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| !v.is_null())
        .filter_map(|(k, v)| {
            let i = TYPED.iter().position(|(name, _, _)| name == k)?;
            (!(TYPED[i].1)(v)).then_some(i)
        })
        .min();
    match wrong {
        Some(i) => {
            let (key, _, what) = TYPED[i];
            Err(invalid("invalid_type", format!("`{key}` must be {what}")))
        }
        None => Ok(()),
    }
}

/// The members whose type is checked when present and not `null`: name, check, what it must be.
type TypeCheck = (&'static str, fn(&Value) -> bool, &'static str);
const TYPED: [TypeCheck; 11] = [
    ("stream", Value::is_boolean, "a boolean"),
    ("max_tokens", Value::is_u64, "a non-negative integer"),
    (
        "max_completion_tokens",
        Value::is_u64,
        "a non-negative integer",
    ),
    ("n", Value::is_u64, "a non-negative integer"),
    ("temperature", Value::is_number, "a number"),
    ("top_p", Value::is_number, "a number"),
    ("presence_penalty", Value::is_number, "a number"),
    ("frequency_penalty", Value::is_number, "a number"),
    ("tools", Value::is_array, "an array"),
    ("response_format", Value::is_object, "an object"),
    ("stream_options", Value::is_object, "an object"),
];

/// What the request's `Idempotency-Key` means for it.
pub(crate) enum Claim {
    /// No key (or no store): served as usual.
    None,
    /// First use: served, and the answer stored through the guard.
    Proceed(idempotency::Guard),
    /// Answered before: the stored answer, exactly.
    Replay(Response),
}

/// Looks up the request's `Idempotency-Key`, scoped to the client's key.
pub(crate) async fn claim(
    p: &Inner,
    headers: &HeaderMap,
    intake: &Intake,
) -> Result<Claim, Reject> {
    let Some(idem) = &p.idempotency else {
        return Ok(Claim::None);
    };
    let key = idempotency::key_of(headers)
        .map_err(|idempotency::BadKey| Reject::InvalidIdempotencyKey)?;
    let Some(key) = key else {
        return Ok(Claim::None);
    };
    match idem
        .lookup(&intake.client_key, &key, &intake.raw, p.clock.now())
        .await
    {
        idempotency::Lookup::Proceed(guard) => Ok(Claim::Proceed(guard)),
        idempotency::Lookup::Replay(a) => Ok(Claim::Replay(replay(a))),
        idempotency::Lookup::InProgress => Err(Reject::IdempotencyInProgress),
        idempotency::Lookup::Mismatch => Err(Reject::IdempotencyKeyReused),
        idempotency::Lookup::ClientFull { max } => Err(Reject::ClientIdempotencyFull { max }),
        idempotency::Lookup::Unavailable => Err(Reject::StoreUnavailable),
    }
}

/// A stored answer as it was sent, marked `x-probeok-idempotent-replay: true`.
fn replay(a: IdempotentAnswer) -> Response {
    let mut r = Response::new(Body::from(a.body));
    *r.status_mut() = StatusCode::from_u16(a.status).unwrap_or(StatusCode::OK);
    for (k, v) in &a.headers {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::from_str(v)) {
            r.headers_mut().insert(k, v);
        }
    }
    r.headers_mut().insert(
        "x-probeok-idempotent-replay",
        HeaderValue::from_static("true"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn code(v: Value) -> Option<&'static str> {
        validate(&v).err().map(|r| r.code())
    }

    #[test]
    fn requests_are_checked_like_openai_would() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(code(json!({"model": "chat", "messages": msgs})), None);
        assert_eq!(code(json!({"messages": msgs})), Some("missing_model"));
        assert_eq!(
            code(json!({"model": "", "messages": msgs})),
            Some("missing_model")
        );
        assert_eq!(
            code(json!({"model": 3, "messages": msgs})),
            Some("invalid_type")
        );
        assert_eq!(
            code(json!({"model": "chat", "messages": []})),
            Some("missing_messages")
        );
        assert_eq!(
            code(json!({"model": "chat", "messages": [{"content": "x"}]})),
            Some("invalid_type")
        );
        for (k, v) in [
            ("stream", json!("yes")),
            ("max_tokens", json!(-1)),
            ("temperature", json!("hot")),
            ("tools", json!({})),
            ("response_format", json!("json")),
        ] {
            let mut req = json!({"model": "chat", "messages": msgs});
            req[k] = v;
            assert_eq!(code(req), Some("invalid_type"), "{k}");
        }
        let err = validate(&json!({"model": "chat", "messages": msgs, "n": 1.5})).unwrap_err();
        assert_eq!(err.to_string(), "`n` must be a non-negative integer");
        // Of several wrong members the same one is named whatever their order in the body.
        let err = validate(&json!({"tools": 1, "temperature": "hot", "model": "chat", "messages": msgs, "stream": 1, "top_p": null})).unwrap_err();
        assert_eq!(err.to_string(), "`stream` must be a boolean");
        let err =
            validate(&json!({"tools": 1, "model": "chat", "messages": msgs, "temperature": "hot"}))
                .unwrap_err();
        assert_eq!(err.to_string(), "`temperature` must be a number");
        assert_eq!(
            code(json!({"model": "chat", "messages": msgs, "top_p": null, "tools": null})),
            None
        );
    }

    #[test]
    fn client_keys_are_bearer_tokens_from_the_list() {
        let keys = ClientKeys(Some(vec![Secret::new("k1"), Secret::new("k2")]));
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_static(v));
            h
        };
        assert_eq!(keys.check(&with("Bearer k2")).unwrap(), "k2");
        assert_eq!(keys.check(&with("Bearer k3")), Err(Reject::Unauthorized));
        assert_eq!(keys.check(&with("k1")), Err(Reject::Unauthorized));
        assert_eq!(keys.check(&HeaderMap::new()), Err(Reject::Unauthorized));
        assert_eq!(ClientKeys(None).check(&HeaderMap::new()).unwrap(), "");
    }
}
