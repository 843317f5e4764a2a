//! `POST /v1/embeddings` in OpenAI's documented shape: `model` (a logical model whose routes
//! are embeddings routes), `input` a string or a non-empty array of strings (a batch), and
//! optionally `encoding_format` (`float` | `base64`), `dimensions` and `user`, forwarded as
//! they are with the route's own model name.
//!
//! The request goes through the chat path's machinery — the client's key, the body bound and
//! read timeout, a named client's spend booked first, the candidates from the weights,
//! breakers, in-flight limits, failover, metering with the answer's `usage.prompt_tokens` and
//! the route's input price, every attempt a passive outcome — minus what only chat has
//! (streams, degradation contracts, idempotency keys, shadow copies). The config keeps every
//! route of an embeddings model on one upstream model and one vector length, so a failover
//! never hands the client vectors of another space. Bad input is refused with 400 before any
//! upstream call; a chat model here (or an embeddings model at `/v1/chat/completions`) is 400
//! `wrong_endpoint`.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;

use super::intake;
use super::record::Usage;
use super::reject::Reject;
use super::request::{finish, request_id, Answer, RequestCtx};
use super::select::Needs;
use super::{failover, Proxy};
use crate::probe::ProbeError;

/// OpenAI's bound on one batch.
pub const MAX_INPUTS: usize = 2048;

/// `POST /v1/embeddings`.
pub(super) async fn embeddings(
    State(proxy): State<Proxy>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut ctx = RequestCtx::new(request_id(&headers), proxy.inner.clock.now());
    ctx.trace = proxy.inner.tracer.begin(&headers).map(Box::new);
    let answer = handle(&proxy, &headers, body, &mut ctx)
        .await
        .unwrap_or_else(Answer::from);
    finish(&proxy, ctx, answer).await
}

async fn handle(
    proxy: &Proxy,
    headers: &HeaderMap,
    body: Body,
    ctx: &mut RequestCtx,
) -> Result<Answer, Reject> {
    let p = &proxy.inner;
    let (client_key, client) = intake::identify(p, headers)?;
    let raw = intake::read_body(p, headers, body).await?;
    let request = match serde_json::from_slice(&raw) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return Err(Reject::NotAnObject),
        Err(e) => return Err(Reject::InvalidJson(e.to_string())),
    };
    validate(&request)?;
    let model = request["model"].as_str().unwrap_or_default().to_owned();
    ctx.client = super::attribution::client_tag(&client_key);
    let served = p.routes.iter().any(|r| r.serves == model);
    if served && !p.embedding_models.contains(&model) {
        return Err(Reject::WrongEndpoint {
            model,
            serves: "chat completions",
            endpoint: "/v1/chat/completions",
        });
    }
    if let Some(client) = &client {
        ctx.client_id = Some(client.id.clone());
        if client.limit.is_some() && served {
            if proxy.store_health().is_some_and(|h| !h.available()) {
                return Err(Reject::SpendUnavailable);
            }
            // Embeddings have no output tokens: the most a request costs is its input.
            let micros = super::clients::max_cost_micros(&request, &p.routes, &[&model], 0);
            ctx.serves(&model);
            let hold = p.clients.reserve(client, micros).await?;
            let prompt = super::select::estimate_prompt_tokens(&request);
            ctx.spend = hold.map(|h| (h, prompt));
        }
    }
    let residency = headers
        .get("x-probeok-residency")
        .and_then(|v| v.to_str().ok());
    let needs = Needs::from_request(&request, residency);
    let view = p.weights.borrow().clone();
    failover::route(proxy, ctx, &request, &model, &needs, &view).await
}

/// What OpenAI would refuse, checked before any upstream call (pure).
pub(crate) fn validate(request: &Value) -> Result<(), Reject> {
    let invalid = |code, message: &str| Reject::InvalidField {
        code,
        message: message.to_owned(),
    };
    match request.get("model") {
        Some(Value::String(m)) if !m.is_empty() => {}
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(invalid(
                "missing_model",
                "`model` (a logical model name) is required",
            ))
        }
        Some(_) => return Err(invalid("invalid_type", "`model` must be a string")),
    }
    match request.get("input") {
        Some(Value::String(s)) if !s.is_empty() => {}
        Some(Value::Array(items)) if !items.is_empty() => {
            if items.len() > MAX_INPUTS {
                return Err(Reject::InvalidField {
                    code: "too_many_inputs",
                    message: format!("`input` holds at most {MAX_INPUTS} strings"),
                });
            }
            if !items
                .iter()
                .all(|v| v.as_str().is_some_and(|s| !s.is_empty()))
            {
                return Err(invalid(
                    "invalid_input",
                    "`input` must be a non-empty string or an array of non-empty strings",
                ));
            }
        }
        None | Some(Value::Null) => {
            return Err(invalid(
                "missing_input",
                "`input` (a string or an array of strings) is required",
            ))
        }
        Some(_) => {
            return Err(invalid(
                "invalid_input",
                "`input` must be a non-empty string or an array of non-empty strings",
            ))
        }
    }
    match request.get("encoding_format") {
        None | Some(Value::Null) => {}
        Some(Value::String(f)) if f == "float" || f == "base64" => {}
        Some(_) => {
            return Err(invalid(
                "invalid_type",
                "`encoding_format` must be \"float\" or \"base64\"",
            ))
        }
    }
    match request.get("dimensions") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64().is_some_and(|n| n > 0) => {}
        Some(_) => {
            return Err(invalid(
                "invalid_type",
                "`dimensions` must be a positive integer",
            ))
        }
    }
    if request
        .get("user")
        .is_some_and(|u| !u.is_string() && !u.is_null())
    {
        return Err(invalid("invalid_type", "`user` must be a string"));
    }
    Ok(())
}

/// A 2xx embeddings answer: its usage, or why it is not an embeddings answer (then the
/// attempt fails over like any malformed answer).
pub(crate) fn read_answer(body: &[u8]) -> Result<Usage, ProbeError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ProbeError::Malformed {
        message: format!("not an embeddings answer: {e}"),
    })?;
    if !v.get("data").is_some_and(Value::is_array) {
        return Err(ProbeError::Malformed {
            message: "an embeddings answer without a `data` array".into(),
        });
    }
    Ok(Usage::of(&v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn documented_requests_pass_and_others_are_refused_with_a_code() {
        for ok in [
            json!({"model": "e", "input": "hello"}),
            json!({"model": "e", "input": ["a", "b"], "encoding_format": "float"}),
            json!({"model": "e", "input": "x", "dimensions": 256, "user": "u1"}),
        ] {
            assert_eq!(validate(&ok), Ok(()), "{ok}");
        }
        let code = |v: Value| match validate(&v) {
            Err(Reject::InvalidField { code, .. }) => code,
            other => panic!("{v}: {other:?}"),
        };
        assert_eq!(code(json!({"input": "x"})), "missing_model");
        assert_eq!(code(json!({"model": 3, "input": "x"})), "invalid_type");
        assert_eq!(code(json!({"model": "e"})), "missing_input");
        assert_eq!(code(json!({"model": "e", "input": []})), "invalid_input");
        assert_eq!(
            code(json!({"model": "e", "input": ["a", 1]})),
            "invalid_input"
        );
        assert_eq!(code(json!({"model": "e", "input": ""})), "invalid_input");
        assert_eq!(
            code(json!({"model": "e", "input": vec!["a"; MAX_INPUTS + 1]})),
            "too_many_inputs"
        );
        assert_eq!(
            code(json!({"model": "e", "input": "x", "encoding_format": "int8"})),
            "invalid_type"
        );
        assert_eq!(
            code(json!({"model": "e", "input": "x", "dimensions": 0})),
            "invalid_type"
        );
    }

    #[test]
    fn an_answer_is_read_for_its_usage() {
        let u = read_answer(br#"{"object":"list","data":[{"embedding":[0.1]}],"usage":{"prompt_tokens":7,"total_tokens":7}}"#).unwrap();
        assert_eq!(u.prompt_tokens, Some(7));
        assert_eq!(read_answer(b"{}").unwrap_err().kind(), "malformed");
        assert_eq!(read_answer(b"nope").unwrap_err().kind(), "malformed");
    }
}
