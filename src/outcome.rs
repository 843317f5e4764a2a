//! What one probe (or one passive request) measured. The error is a classification, not a
//! string, because the detector and the proxy match on it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::route::RouteId;

/// Where an outcome came from. Only `Probe` outcomes build latency baselines: they use a fixed
/// prompt, while real traffic has every prompt size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    /// The tiny fixed `PROBE_OK` prompt.
    Probe,
    /// The longer, verifiable "count from 1 to 40" answer that measures tokens/s.
    Throughput,
    /// A real request seen by a proxy or a remote agent.
    Passive,
}

impl OutcomeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Probe => "probe",
            OutcomeKind::Throughput => "throughput",
            OutcomeKind::Passive => "passive",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "probe" => Some(Self::Probe),
            "throughput" => Some(Self::Throughput),
            "passive" => Some(Self::Passive),
            _ => None,
        }
    }
}

/// Why a call failed. Messages are the upstream's own words, already trimmed, bounded and
/// scrubbed of anything key-like (see [`scrub`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProbeError {
    /// Connect, DNS or TLS failure: no HTTP exchange happened.
    #[error("connect: {message}")]
    Connect { message: String },
    /// No response byte within `first_byte_timeout`.
    #[error("no response byte within the first-byte timeout")]
    TimeoutBeforeFirstByte,
    /// A started stream went silent for longer than `first_byte_timeout`.
    #[error("stream stalled")]
    Stalled,
    /// The whole call exceeded `timeout` while data was still arriving.
    #[error("call exceeded its timeout")]
    Timeout,
    /// A non-success status other than 429 (and other than a content-policy refusal).
    #[error("HTTP {status}: {message}")]
    Http { status: u16, message: String },
    /// 429, with the upstream's `Retry-After` when it sent one.
    #[error("rate limited (retry after {retry_after_ms:?} ms): {message}")]
    RateLimited {
        retry_after_ms: Option<u64>,
        message: String,
    },
    /// Content policy: `finish_reason: content_filter` or the provider's refusal error.
    #[error("refused by content policy: {message}")]
    Refused { message: String },
    /// A body or chunk that is not what the protocol says.
    #[error("malformed response: {message}")]
    Malformed { message: String },
    /// A stream that ended without a finish reason / `[DONE]` / `message_stop`.
    #[error("stream ended without a finish")]
    Truncated,
}

impl ProbeError {
    /// The stable code stored and shown: `connect`, `timeout_before_first_byte`, `stalled`,
    /// `timeout`, `http`, `rate_limited`, `refused`, `malformed`, `truncated`.
    pub fn kind(&self) -> &'static str {
        match self {
            ProbeError::Connect { .. } => "connect",
            ProbeError::TimeoutBeforeFirstByte => "timeout_before_first_byte",
            ProbeError::Stalled => "stalled",
            ProbeError::Timeout => "timeout",
            ProbeError::Http { .. } => "http",
            ProbeError::RateLimited { .. } => "rate_limited",
            ProbeError::Refused { .. } => "refused",
            ProbeError::Malformed { .. } => "malformed",
            ProbeError::Truncated => "truncated",
        }
    }

    /// The HTTP status when one is part of the classification.
    pub fn status(&self) -> Option<u16> {
        match self {
            ProbeError::Http { status, .. } => Some(*status),
            ProbeError::RateLimited { .. } => Some(429),
            _ => None,
        }
    }

    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            ProbeError::RateLimited { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }

    pub fn message(&self) -> Option<&str> {
        match self {
            ProbeError::Connect { message }
            | ProbeError::Http { message, .. }
            | ProbeError::RateLimited { message, .. }
            | ProbeError::Refused { message }
            | ProbeError::Malformed { message } => Some(message),
            _ => None,
        }
    }

    /// Rebuilds an error from its stored columns (the inverse of `kind`/`status`/`message`/
    /// `retry_after_ms`). Unknown kinds come back as `Malformed` so old rows never vanish.
    pub fn from_parts(
        kind: &str,
        status: Option<u16>,
        message: Option<String>,
        retry_after_ms: Option<u64>,
    ) -> Self {
        let message = message.unwrap_or_default();
        match kind {
            "connect" => ProbeError::Connect { message },
            "timeout_before_first_byte" => ProbeError::TimeoutBeforeFirstByte,
            "stalled" => ProbeError::Stalled,
            "timeout" => ProbeError::Timeout,
            "http" => ProbeError::Http {
                status: status.unwrap_or(0),
                message,
            },
            "rate_limited" => ProbeError::RateLimited {
                retry_after_ms,
                message,
            },
            "refused" => ProbeError::Refused { message },
            "truncated" => ProbeError::Truncated,
            _ => ProbeError::Malformed { message },
        }
    }

    /// The JSON shape `probe --json` prints: `{"kind","status","message","retry_after_ms"}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "kind": self.kind(),
            "status": self.status(),
            "message": self.message(),
            "retry_after_ms": self.retry_after_ms(),
        })
    }
}

/// One measured call. Times are milliseconds from the start of the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeOutcome {
    pub route: RouteId,
    pub kind: OutcomeKind,
    /// Wall-clock start of the call.
    pub started_at: DateTime<Utc>,
    /// Transport and protocol succeeded (a wrong answer is still a success, `verified=false`).
    pub success: bool,
    /// Set by the proxy on a passive failure it attributes to the request itself (this
    /// client's requests fail on the route while other clients' succeed): the client's tag,
    /// never its key. Neither the breaker nor the detector counts such a failure against the
    /// route; it feeds the route's `request_side` finding instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributed_to: Option<String>,
    /// The trimmed answer equalled `expect` (or, for throughput probes, 1..40 in order).
    /// `None` when there was no complete answer to check, or for passive outcomes.
    pub verified: Option<bool>,
    /// Response headers received.
    pub ttfb_ms: Option<f64>,
    /// First generated token received (reasoning included).
    pub ttft_ms: Option<f64>,
    /// First *answer* token received: later than `ttft_ms` on a reasoning model, equal
    /// otherwise; `None` when no answer arrived.
    #[serde(default)]
    pub first_answer_ms: Option<f64>,
    pub total_ms: f64,
    pub output_tokens: Option<u32>,
    /// `output_tokens` was counted by us, not reported by the API's usage.
    pub tokens_estimated: bool,
    /// Output tokens over the time after the first token; `None` below 8 tokens (noise).
    pub tokens_per_second: Option<f64>,
    pub model_reported: Option<String>,
    pub system_fingerprint: Option<String>,
    /// The final HTTP status, when a response arrived.
    pub http_status: Option<u16>,
    pub error: Option<ProbeError>,
    /// The answer, trimmed and bounded to [`MAX_ANSWER_CHARS`]: evidence for drift findings.
    pub answer: Option<String>,
    /// The call ended because `max_tokens` ran out (`finish_reason: "length"`, Anthropic
    /// `stop_reason: "max_tokens"`) before any answer token: a reasoning model spent the
    /// budget thinking. Our configuration, not a changed answer.
    #[serde(default)]
    pub max_tokens_exhausted: bool,
    /// The account's rate-limit headroom the answer's headers announced
    /// ([`crate::ratelimit`]); `None` when it named none. Kept in memory only, never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratelimit: Option<crate::ratelimit::RateLimits>,
}

/// Fewer output tokens than this give no tokens/s figure: 2–5 tokens over a few ms is noise.
pub const MIN_TOKENS_FOR_TPS: u32 = 8;

/// Stored answers are evidence, not transcripts.
pub const MAX_ANSWER_CHARS: usize = 512;

/// Stored error messages are bounded too.
pub const MAX_MESSAGE_CHARS: usize = 300;

/// Trims, bounds and scrubs an upstream message before it is stored or shown: provider error
/// bodies can echo API keys (`sk-…`, bearer tokens) or prompts.
pub fn scrub(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_MESSAGE_CHARS));
    for (i, word) in message.split_whitespace().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(if looks_secret(word) {
            "[redacted]"
        } else {
            word
        });
        if out.chars().count() >= MAX_MESSAGE_CHARS {
            break;
        }
    }
    truncate_chars(&out, MAX_MESSAGE_CHARS)
}

/// Cuts at a character boundary, marking the cut.
pub fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((idx, _)) => format!("{}…", &s[..idx]),
        None => s.to_owned(),
    }
}

fn looks_secret(word: &str) -> bool {
    let w = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '_');
    let lower = w.to_ascii_lowercase();
    if [
        "sk-",
        "sk_",
        "key-",
        "bearer",
        "access_token=",
        "api_key=",
        "token=",
    ]
    .iter()
    .any(|p| lower.starts_with(p) && w.len() > p.len() + 4)
    {
        return true;
    }
    if lower.contains("access_token=") || lower.contains("api_key=") || lower.contains("key=") {
        return true;
    }
    // A long unbroken run of letters and digits is a key more often than a word.
    w.len() >= 32
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && w.chars().any(|c| c.is_ascii_digit())
        && w.chars().any(|c| c.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_removes_key_like_words_and_bounds_length() {
        let s =
            scrub("Incorrect API key provided: sk-abcdef1234567890abcdef. See https://x?key=abc");
        assert!(!s.contains("sk-abcdef"), "{s}");
        assert!(!s.contains("key=abc"), "{s}");
        assert!(s.starts_with("Incorrect API key provided:"));
        let long = "word ".repeat(500);
        assert!(scrub(&long).chars().count() <= MAX_MESSAGE_CHARS + 1);
    }

    #[test]
    fn error_parts_round_trip() {
        let errors = [
            ProbeError::Connect {
                message: "refused".into(),
            },
            ProbeError::TimeoutBeforeFirstByte,
            ProbeError::Stalled,
            ProbeError::Timeout,
            ProbeError::Http {
                status: 503,
                message: "busy".into(),
            },
            ProbeError::RateLimited {
                retry_after_ms: Some(2000),
                message: "slow".into(),
            },
            ProbeError::Refused {
                message: "policy".into(),
            },
            ProbeError::Malformed {
                message: "bad json".into(),
            },
            ProbeError::Truncated,
        ];
        for e in errors {
            let back = ProbeError::from_parts(
                e.kind(),
                e.status(),
                e.message().map(str::to_owned),
                e.retry_after_ms(),
            );
            assert_eq!(e, back);
        }
    }
}
