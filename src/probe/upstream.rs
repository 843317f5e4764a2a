//! Reading an upstream's error (a non-2xx body, or an error object inside a 200 answer) into a
//! [`ProbeError`] classification. Pure functions over bytes, headers and an explicit `now`.

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;
use serde_json::Value;

use super::outcome::{scrub, ProbeError};

/// What an upstream said about its own error, already scrubbed.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct UpstreamError {
    pub message: String,
    /// `error.code` as text (OpenAI, DashScope: `data_inspection_failed`).
    pub code: Option<String>,
    /// `error.type` (OpenAI `invalid_request_error`, Anthropic `overloaded_error`).
    pub kind: Option<String>,
    /// A numeric status carried inside the error object, if any.
    pub status: Option<u16>,
}

/// Codes and types that providers use for content-policy rejections (OpenAI/Azure
/// `content_filter`, `content_policy_violation`; DashScope `data_inspection_failed`; Azure's
/// inner `ResponsibleAIPolicyViolation`; Zhipu-style `contentFilter`). Matched as substrings of
/// the lower-cased code or type, never of the free-text message, so an ordinary 400 that merely
/// mentions "content" is not mistaken for a refusal.
const CONTENT_POLICY_MARKERS: &[&str] = &[
    "content_filter",
    "contentfilter",
    "content_policy",
    "data_inspection_failed",
    "responsibleaipolicyviolation",
];

impl UpstreamError {
    pub fn is_content_policy(&self) -> bool {
        [self.code.as_deref(), self.kind.as_deref()]
            .into_iter()
            .flatten()
            .map(str::to_ascii_lowercase)
            .any(|s| CONTENT_POLICY_MARKERS.iter().any(|m| s.contains(m)))
    }
}

/// Reads an error body: the JSON envelopes of OpenAI-compatible APIs and Anthropic, a few
/// looser shapes (`{"error": "text"}`, `{"message", "code"}`), or plain text (gateway HTML).
pub(crate) fn parse_error_body(body: &[u8]) -> UpstreamError {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if let Some(e) = error_in(&v) {
            return e;
        }
        // JSON without a recognisable error: keep a bounded look at it.
        return UpstreamError {
            message: scrub(&v.to_string()),
            ..UpstreamError::default()
        };
    }
    UpstreamError {
        message: scrub(&String::from_utf8_lossy(body)),
        ..UpstreamError::default()
    }
}

/// The error object of a JSON value, if it carries one: `{"error": {...}}`, `{"error": "..."}`,
/// Anthropic's `{"type": "error", "error": {...}}`, or a top-level `{"message", "code"}` with
/// no `choices`/`content` (DashScope's native shape).
pub(crate) fn error_in(v: &Value) -> Option<UpstreamError> {
    let obj = v.as_object()?;
    match obj.get("error") {
        Some(Value::Object(e)) => return Some(from_error_object(e)),
        Some(Value::String(s)) => {
            return Some(UpstreamError {
                message: scrub(s),
                status: status_field(obj.get("status")).or_else(|| status_field(obj.get("code"))),
                ..UpstreamError::default()
            })
        }
        _ => {}
    }
    let looks_like_answer = obj.contains_key("choices") || obj.contains_key("content");
    if !looks_like_answer && obj.contains_key("message") && obj.contains_key("code") {
        return Some(from_error_object(obj));
    }
    None
}

fn from_error_object(e: &serde_json::Map<String, Value>) -> UpstreamError {
    let text = |k: &str| match e.get(k) {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let code = text("code");
    let kind = text("type");
    let status = status_field(e.get("status"))
        .or_else(|| status_field(e.get("code")))
        .or_else(|| kind.as_deref().and_then(status_for_type))
        .or_else(|| code.as_deref().and_then(status_for_type));
    let message = text("message")
        .or_else(|| code.clone())
        .or_else(|| kind.clone())
        .unwrap_or_default();
    UpstreamError {
        message: scrub(&message),
        code,
        kind,
        status,
    }
}

/// A status number, as a JSON number or numeric string, only when it is a real HTTP status.
fn status_field(v: Option<&Value>) -> Option<u16> {
    let n = match v? {
        Value::Number(n) => n.as_u64()?,
        Value::String(s) => s.trim().parse::<u64>().ok()?,
        _ => return None,
    };
    u16::try_from(n).ok().filter(|s| (400..=599).contains(s))
}

/// Anthropic documents a status for each error type (and OpenAI shares some names), so an
/// error event inside a 200 stream can still be classified by the status it stands for.
fn status_for_type(kind: &str) -> Option<u16> {
    Some(match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" | "rate_limit_exceeded" | "rate_limited" => 429,
        "api_error" | "server_error" | "internal_error" => 500,
        "service_unavailable" => 503,
        "timeout_error" | "timeout" => 504,
        "overloaded_error" | "overloaded" => 529,
        _ => return None,
    })
}

/// A non-2xx answer: 429 → `RateLimited` (with `Retry-After`), a content-policy 4xx →
/// `Refused`, anything else → `Http` with the upstream's own (scrubbed) message.
pub(crate) fn classify_status(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    now: DateTime<Utc>,
) -> ProbeError {
    let e = parse_error_body(body);
    if status == 429 {
        return ProbeError::RateLimited {
            retry_after_ms: retry_after_ms(headers, now),
            message: e.message,
        };
    }
    if (400..500).contains(&status) && e.is_content_policy() {
        return ProbeError::Refused { message: e.message };
    }
    ProbeError::Http {
        status,
        message: e.message,
    }
}

/// An error object found inside a 200 answer (an SSE error event or an error body). It is never
/// a success, and it is classified by what the provider declared: with a status (or a type
/// that stands for one) it is `Http` (or `RateLimited` for 429), a content-policy code is
/// `Refused`. A declared error that names neither still says the upstream failed: `Http` 502.
/// `Malformed` is kept for bytes that do not parse.
pub(crate) fn classify_embedded(e: UpstreamError) -> ProbeError {
    if e.is_content_policy() {
        return ProbeError::Refused { message: e.message };
    }
    match e.status {
        Some(429) => ProbeError::RateLimited {
            retry_after_ms: None,
            message: e.message,
        },
        Some(status) => ProbeError::Http {
            status,
            message: e.message,
        },
        None => ProbeError::Http {
            status: DECLARED_ERROR_STATUS,
            message: e.message,
        },
    }
}

/// The status given to an error declared inside a 200 answer that names no status of its own.
pub(crate) const DECLARED_ERROR_STATUS: u16 = 502;

/// How long the upstream asks us to wait. `retry-after-ms` (OpenAI, Azure) wins when present,
/// then `Retry-After` as delta-seconds (fractions tolerated) or an HTTP-date relative to `now`
/// (a date in the past means "now": 0), then OpenAI's `x-ratelimit-reset-*` ([`ratelimit_reset_ms`]).
pub(crate) fn retry_after_ms(headers: &HeaderMap, now: DateTime<Utc>) -> Option<u64> {
    retry_after_header_ms(headers, now).or_else(|| ratelimit_reset_ms(headers))
}

/// OpenAI's `x-ratelimit-reset-requests` / `x-ratelimit-reset-tokens` (`1s`, `6m0s`, `20ms`):
/// when the matching `x-ratelimit-remaining-*` says which limit is spent, its reset; otherwise
/// the later of the two (the rest must outlast whichever limit was hit).
pub(crate) fn ratelimit_reset_ms(headers: &HeaderMap) -> Option<u64> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let limits = ["requests", "tokens"].map(|l| {
        let reset = header(&format!("x-ratelimit-reset-{l}")).and_then(parse_go_duration_ms);
        let spent = header(&format!("x-ratelimit-remaining-{l}"))
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n == 0);
        (reset, spent)
    });
    let spent = limits
        .iter()
        .filter(|(_, spent)| *spent)
        .filter_map(|(r, _)| *r)
        .max();
    spent.or_else(|| limits.iter().filter_map(|(r, _)| *r).max())
}

/// A Go-style duration (`6m0s`, `1.5s`, `20ms`, `1h2m`), or bare seconds; `None` when it is
/// neither. Bounded: anything past a day is a day (a bogus header must not read as forever).
pub(crate) fn parse_go_duration_ms(s: &str) -> Option<u64> {
    const DAY_MS: f64 = 86_400_000.0;
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0)
            .then(|| (secs * 1000.0).min(DAY_MS).round() as u64);
    }
    let mut rest = s;
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "h" => 3_600_000.0,
            "m" => 60_000.0,
            "s" => 1000.0,
            "ms" => 1.0,
            "us" | "µs" => 0.001,
            "ns" => 0.000_001,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * factor;
    }
    (!s.is_empty() && total.is_finite()).then(|| total.min(DAY_MS).round() as u64)
}

fn retry_after_header_ms(headers: &HeaderMap, now: DateTime<Utc>) -> Option<u64> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            // Bounded above by the finite check; float → int casts saturate.
            return Some(ms.round() as u64);
        }
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| (secs * 1000.0).round() as u64);
    }
    let at = DateTime::<Utc>::from(httpdate::parse_http_date(value).ok()?);
    Some(u64::try_from((at - now).num_milliseconds()).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-29T08:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn retry_after_seconds_date_and_ms() {
        assert_eq!(
            retry_after_ms(&headers(&[("retry-after", "2")]), now()),
            Some(2000)
        );
        assert_eq!(
            retry_after_ms(&headers(&[("retry-after", "1.5")]), now()),
            Some(1500)
        );
        assert_eq!(
            retry_after_ms(
                &headers(&[("retry-after", "Sun, 29 Nov 2026 08:00:07 GMT")]),
                now()
            ),
            Some(7000)
        );
        assert_eq!(
            retry_after_ms(
                &headers(&[("retry-after", "Sun, 29 Nov 2026 07:00:00 GMT")]),
                now()
            ),
            Some(0)
        );
        assert_eq!(
            retry_after_ms(
                &headers(&[("retry-after", "2"), ("retry-after-ms", "250")]),
                now()
            ),
            Some(250)
        );
        assert_eq!(
            retry_after_ms(&headers(&[("retry-after", "soon")]), now()),
            None
        );
        assert_eq!(retry_after_ms(&HeaderMap::new(), now()), None);
    }

    #[test]
    fn go_durations_of_ratelimit_resets() {
        for (s, ms) in [
            ("1s", Some(1000)),
            ("6m0s", Some(360_000)),
            ("20ms", Some(20)),
            ("1.5s", Some(1500)),
            ("1h2m3s", Some(3_723_000)),
            ("2", Some(2000)),
            ("0s", Some(0)),
            ("100h", Some(86_400_000)),
            ("", None),
            ("soon", None),
            ("5x", None),
            ("s", None),
        ] {
            assert_eq!(parse_go_duration_ms(s), ms, "{s:?}");
        }
    }

    #[test]
    fn ratelimit_resets_count_as_retry_after_when_it_is_absent() {
        // The spent limit's reset wins.
        let h = headers(&[
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-remaining-tokens", "1200"),
        ]);
        assert_eq!(retry_after_ms(&h, now()), Some(1000));
        // Without remaining counts: the later reset.
        let h = headers(&[
            ("x-ratelimit-reset-requests", "20ms"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        assert_eq!(retry_after_ms(&h, now()), Some(360_000));
        // Retry-After, when present, is what the upstream asked for.
        let h = headers(&[("retry-after", "3"), ("x-ratelimit-reset-tokens", "6m0s")]);
        assert_eq!(retry_after_ms(&h, now()), Some(3000));
    }

    #[test]
    fn content_policy_400s_are_refusals() {
        let dashscope = br#"{"error":{"code":"data_inspection_failed","message":"Input data may contain inappropriate content.","type":"data_inspection_failed"}}"#;
        assert!(matches!(
            classify_status(400, &HeaderMap::new(), dashscope, now()),
            ProbeError::Refused { .. }
        ));
        let azure = br#"{"error":{"code":"content_filter","message":"filtered"}}"#;
        assert!(matches!(
            classify_status(400, &HeaderMap::new(), azure, now()),
            ProbeError::Refused { .. }
        ));
        let plain = br#"{"error":{"code":"invalid_value","message":"bad content field"}}"#;
        assert_eq!(
            classify_status(400, &HeaderMap::new(), plain, now()),
            ProbeError::Http {
                status: 400,
                message: "bad content field".into()
            }
        );
    }

    #[test]
    fn error_messages_are_scrubbed_and_text_bodies_kept() {
        let body = br#"{"error":{"message":"Incorrect API key provided: sk-abcdefghijklmnop1234","type":"invalid_request_error"}}"#;
        let e = classify_status(401, &HeaderMap::new(), body, now());
        assert_eq!(e.status(), Some(401));
        assert!(!e.message().unwrap_or_default().contains("sk-abc"), "{e:?}");
        let e = classify_status(502, &HeaderMap::new(), b"<html>Bad Gateway</html>", now());
        assert_eq!(e.message(), Some("<html>Bad Gateway</html>"));
    }

    #[test]
    fn embedded_errors_use_their_status_or_type() {
        let anthropic = serde_json::json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}});
        assert_eq!(
            classify_embedded(error_in(&anthropic).unwrap()),
            ProbeError::Http {
                status: 529,
                message: "Overloaded".into()
            }
        );
        let openai = serde_json::json!({"error":{"message":"boom","code":503}});
        assert_eq!(
            classify_embedded(error_in(&openai).unwrap()).status(),
            Some(503)
        );
        // A declared error that names no status is still the upstream failing, not bytes
        // that do not parse.
        let unknown = serde_json::json!({"error":{"message":"something"}});
        assert_eq!(
            classify_embedded(error_in(&unknown).unwrap()),
            ProbeError::Http {
                status: DECLARED_ERROR_STATUS,
                message: "something".into()
            }
        );
        // OpenRouter's mid-stream error: a string code naming the kind.
        let openrouter = serde_json::json!({"id":"gen-1","object":"chat.completion.chunk",
            "error":{"code":"server_error","message":"Provider disconnected unexpectedly"},
            "choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]});
        assert_eq!(
            classify_embedded(error_in(&openrouter).unwrap()).status(),
            Some(500)
        );
        let throttled =
            serde_json::json!({"error":{"code":"rate_limit_exceeded","message":"slow down"}});
        assert!(matches!(
            classify_embedded(error_in(&throttled).unwrap()),
            ProbeError::RateLimited { .. }
        ));
        let answer = serde_json::json!({"choices":[], "message":"x", "code":"y"});
        assert_eq!(error_in(&answer), None);
    }
}
