//! The embeddings probe: one fixed text to `POST {base_url}/embeddings` in OpenAI's documented
//! shape (`{"model","input","encoding_format":"float"}`), answered with
//! `{"object":"list","data":[{"embedding":[…]}],"model","usage"}`.
//!
//! The call is not streamed, so its outcome has a first byte and a total and nothing else:
//! no first token, no tokens per second, no answer text to verify. A vector of another length
//! than the route's `dimensions` is a failure (`malformed`): an index built on the route could
//! not take it. Whether the vector still comes from the same model is judged above the
//! probe (`crate::embed`), against the route's stored reference.

use reqwest::header::{ACCEPT, AUTHORIZATION};
use serde::Deserialize;
use tokio::time::Instant;

use super::client::{secret_header, ProbeClient};
use super::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use super::sse::{self, BodyFault};
use super::upstream::classify_status;
use crate::route::Route;

/// The fixed text every embeddings probe sends: short, plain, the same forever (its vector is
/// the route's fingerprint). About 5 tokens with OpenAI's tokenizers, 4 by our estimate.
pub const EMBED_TEXT: &str = "probeok embedding reference text";

/// An answer larger than this is not an embedding of one short text.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// One embeddings probe: its outcome, and the vector when the answer was a good one.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedProbe {
    pub outcome: ProbeOutcome,
    pub vector: Option<Vec<f32>>,
}

/// What an embeddings answer holds for us.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedAnswer {
    pub vector: Vec<f32>,
    pub model: Option<String>,
    pub prompt_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Wire {
    data: Vec<WireItem>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireItem {
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
}

/// Reads an embeddings answer's first vector and checks its length (pure).
pub fn parse_answer(body: &[u8], dimensions: u32) -> Result<EmbedAnswer, ProbeError> {
    let wire: Wire = serde_json::from_slice(body).map_err(|e| ProbeError::Malformed {
        message: format!("not an embeddings answer: {e}"),
    })?;
    let Some(first) = wire.data.into_iter().next() else {
        return Err(ProbeError::Malformed {
            message: "an embeddings answer without data".into(),
        });
    };
    let got = first.embedding.len();
    if u32::try_from(got).ok() != Some(dimensions) {
        return Err(ProbeError::Malformed {
            message: format!(
                "a vector of {got} dimensions, the route is configured for {dimensions}"
            ),
        });
    }
    if first.embedding.iter().any(|x| !x.is_finite()) {
        return Err(ProbeError::Malformed {
            message: "a vector with a non-finite value".into(),
        });
    }
    Ok(EmbedAnswer {
        vector: first.embedding,
        model: wire.model,
        prompt_tokens: wire.usage.and_then(|u| u.prompt_tokens),
    })
}

impl ProbeClient {
    /// Probes an embeddings route once with [`EMBED_TEXT`]. Never fails: every failure is a
    /// classified outcome (`kind` `probe`).
    pub async fn embed(&self, route: &Route, dimensions: u32) -> EmbedProbe {
        let Some((http, key, clock)) = self.provider_http(&route.provider) else {
            return EmbedProbe {
                outcome: outcome(
                    route,
                    chrono::Utc::now(),
                    None,
                    0.0,
                    None,
                    Err(ProbeError::Connect {
                        message: format!(
                            "no HTTP client for provider {}: the route was not given to ProbeClient::new",
                            route.provider
                        ),
                    }),
                ),
                vector: None,
            };
        };
        let started_at = clock.now();
        let start = Instant::now();
        let s = &route.probe;
        let ms = |t: Instant| t.saturating_duration_since(start).as_secs_f64() * 1000.0;
        let body = serde_json::json!({
            "model": route.model,
            "input": EMBED_TEXT,
            "encoding_format": "float",
        });
        let base = route.base_url.trim_end_matches('/');
        let mut request = http
            .post(format!("{base}/embeddings"))
            .header(ACCEPT, "application/json")
            .json(&body);
        if let Some(key) = key {
            request = request.header(
                AUTHORIZATION,
                secret_header(&format!("Bearer {}", key.expose())),
            );
        }
        let deadline = start + s.timeout;
        let first_byte_deadline = (start + s.first_byte_timeout).min(deadline);
        let done = |ttfb: Option<f64>, status: Option<u16>, r: Result<EmbedAnswer, ProbeError>| {
            let total = ms(Instant::now());
            let (result, vector, model) = match r {
                Ok(a) => (Ok(()), Some(a.vector), a.model),
                Err(e) => (Err(e), None, None),
            };
            let mut o = outcome(route, started_at, ttfb, total, status, result);
            o.model_reported = model;
            EmbedProbe { outcome: o, vector }
        };
        let response = match tokio::time::timeout_at(first_byte_deadline, request.send()).await {
            Err(_) => return done(None, None, Err(ProbeError::TimeoutBeforeFirstByte)),
            Ok(Err(e)) => {
                return done(
                    None,
                    None,
                    Err(ProbeError::Connect {
                        message: sse::describe_reqwest(e),
                    }),
                )
            }
            Ok(Ok(r)) => r,
        };
        let headers_at = Instant::now();
        let ttfb = Some(ms(headers_at));
        let status = response.status();
        let code = Some(status.as_u16());
        let headers = response.headers().clone();
        // Non-streamed: the body may take the rest of `timeout`.
        let bytes = sse::guarded_bytes(response.bytes_stream(), headers_at, s.timeout, deadline);
        if !status.is_success() {
            let (body, _, _) = sse::read_body(bytes, MAX_ERROR_BODY_BYTES).await;
            let error = classify_status(status.as_u16(), &headers, &body, clock.now());
            return done(ttfb, code, Err(error));
        }
        let (body, fault, too_large) = sse::read_body(bytes, MAX_BODY_BYTES).await;
        let read = match fault {
            Some(BodyFault::Timeout | BodyFault::Stalled) => Err(ProbeError::Timeout),
            Some(BodyFault::Cut(_)) => Err(ProbeError::Truncated),
            None if too_large => Err(ProbeError::Malformed {
                message: format!("body larger than {MAX_BODY_BYTES} bytes"),
            }),
            None => parse_answer(&body, dimensions),
        };
        let mut probe = done(ttfb, code, read);
        probe.outcome.ratelimit = crate::ratelimit::RateLimits::from_headers(&headers);
        probe
    }
}

/// The outcome of an embeddings call: timings to the first byte and the end, nothing a
/// non-streamed vector does not have.
fn outcome(
    route: &Route,
    started_at: chrono::DateTime<chrono::Utc>,
    ttfb_ms: Option<f64>,
    total_ms: f64,
    http_status: Option<u16>,
    result: Result<(), ProbeError>,
) -> ProbeOutcome {
    ProbeOutcome {
        route: route.id.clone(),
        kind: OutcomeKind::Probe,
        started_at,
        success: result.is_ok(),
        attributed_to: None,
        verified: None,
        ttfb_ms: ttfb_ms.map(|t| t.min(total_ms)),
        ttft_ms: None,
        first_answer_ms: None,
        total_ms,
        output_tokens: None,
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status,
        error: result.err(),
        answer: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_of_the_configured_length_is_read() {
        let body = br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-0.25,1.0]}],"model":"m","usage":{"prompt_tokens":9,"total_tokens":9}}"#;
        let a = parse_answer(body, 3).unwrap();
        assert_eq!(a.vector, vec![0.5, -0.25, 1.0]);
        assert_eq!(a.model.as_deref(), Some("m"));
        assert_eq!(a.prompt_tokens, Some(9));
    }

    #[test]
    fn a_wrong_length_or_shape_is_malformed() {
        let body =
            br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,1.0]}]}"#;
        let e = parse_answer(body, 3).unwrap_err();
        assert_eq!(e.kind(), "malformed");
        assert!(e.message().unwrap().contains("2 dimensions"), "{e}");
        assert_eq!(
            parse_answer(br#"{"data":[]}"#, 3).unwrap_err().kind(),
            "malformed"
        );
        assert_eq!(parse_answer(b"<html>", 3).unwrap_err().kind(), "malformed");
    }
}
