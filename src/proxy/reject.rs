//! Every answer the proxy gives of its own (not an upstream's): one [`Reject`] per reason, in
//! OpenAI's error envelope `{"error":{"message","type","code"}}` so the OpenAI SDKs raise
//! their usual errors (see `docs/http-api.md`).
//!
//! The status, the envelope's `type` and `code`, and headers such as `Retry-After` are decided
//! in one `match` ([`Reject::parts`]); the message is the variant's `Display`. Contract
//! answers (`feature_degraded`, `queue_full`) also carry their `"probeok"` block.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// Why the proxy answered with an error itself.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Reject {
    /// No path of the proxy matched.
    #[error("no such path: the proxy serves POST /v1/chat/completions, POST /v1/embeddings and GET /v1/models")]
    NotFound,
    /// Client auth is on and the bearer key is missing or unknown.
    #[error("missing or unknown API key for this proxy (Authorization: Bearer <key>)")]
    Unauthorized,
    #[error("the request body is larger than {max_body} bytes")]
    TooLarge { max_body: u64 },
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    #[error("the request body must be a JSON object")]
    NotAnObject,
    #[error("the request body is not valid JSON: {0}")]
    InvalidJson(String),
    /// A field OpenAI would refuse (`missing_model`, `missing_messages`, `invalid_type`).
    #[error("{message}")]
    InvalidField { code: &'static str, message: String },
    /// A chat request to an embeddings model, or an embeddings request to a chat model.
    #[error("the model `{model}` serves {serves}: send it to POST {endpoint}")]
    WrongEndpoint {
        model: String,
        serves: &'static str,
        endpoint: &'static str,
    },
    #[error("x-probeok-feature must be 1-64 characters of A-Z a-z 0-9 _ . -")]
    InvalidFeature,
    #[error("Idempotency-Key must be 1-255 visible ASCII characters")]
    InvalidIdempotencyKey,
    #[error("a request with this Idempotency-Key is still running; retry later")]
    IdempotencyInProgress,
    #[error("this Idempotency-Key was used with a different request body")]
    IdempotencyKeyReused,
    /// The store is unavailable (read-only mode) or could not be read: an idempotent request
    /// cannot be deduplicated, so it is not sent at all.
    #[error("the proxy's database is unavailable, so this Idempotency-Key cannot be checked; retry later")]
    StoreUnavailable,
    /// The client holds its share of live idempotency keys.
    #[error("this client already holds {max} live Idempotency-Keys; retry later or without one")]
    ClientIdempotencyFull { max: u64 },
    #[error("the model `{model}` does not exist: GET /v1/models lists the models served here")]
    ModelNotFound { model: String },
    /// No route of the model has what the request needs (`missing`: what they lacked).
    #[error("no route of `{model}` can serve this request (lacking: {})", missing.join(", "))]
    NoCapableRoute {
        model: String,
        missing: Vec<&'static str>,
    },
    /// Every route rests after a 429; `retry_after` is the soonest end of a rest.
    #[error("every route of `{model}` is rate limited; retry later")]
    AllRateLimited {
        model: String,
        retry_after: Duration,
    },
    /// Every candidate was at an in-flight limit of the config (`max_in_flight` of the route
    /// or of its provider); `limits` in the order met, `probeok` their JSON.
    #[error("every route of `{model}` is at an in-flight limit ({}); retry later", limits.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    InFlightLimit {
        model: String,
        limits: Vec<super::inflight::Limited>,
        probeok: Value,
    },
    /// The client's spend limit cannot cover this request's maximum cost this period.
    #[error("client `{client}` has reached its spend limit for this {per}; it resets in {} s", retry_after.as_secs())]
    SpendLimitReached {
        client: String,
        per: &'static str,
        retry_after: Duration,
    },
    /// An admin endpoint without the right admin token.
    #[error("missing or wrong admin token (Authorization: Bearer <admin token>)")]
    AdminUnauthorized,
    /// The admin token variable is unset: admin endpoints are off.
    #[error("admin endpoints are off: the admin token variable is not set")]
    AdminDisabled,
    /// The spend ledger cannot be reached: a client with a limit cannot be booked.
    #[error("the client's spend cannot be checked right now; retry later")]
    SpendUnavailable,
    #[error("no primary route of `{model}` is usable and this hour's extra-cost budget for backups is spent; retry later")]
    BudgetExhausted { model: String },
    #[error(
        "every route of `{model}` refused the proxy's credentials; the operator has been told"
    )]
    UpstreamAuth { model: String },
    #[error("no route of `{model}` answered in time")]
    UpstreamTimeout { model: String },
    /// Every candidate failed; `last` is the last failure's reason code.
    #[error("no route of `{model}` could answer ({attempts} attempts, last: {last}); retry later")]
    UpstreamUnavailable {
        model: String,
        attempts: usize,
        last: String,
    },
    /// A `reject` contract answered (the contract's own message).
    #[error("{message}")]
    FeatureDegraded {
        message: String,
        retry_after: Duration,
        probeok: Value,
    },
    /// An `async_queue` contract applied but the queue is full.
    #[error("the queue for degraded requests is full ({max} jobs); retry later")]
    QueueFull {
        max: u64,
        retry_after: Duration,
        probeok: Value,
    },
    /// An `async_queue` contract applied but this client already has its share of the queue.
    #[error("this client already has {max} jobs waiting in the queue for degraded requests; retry later")]
    ClientQueueFull {
        max: u64,
        retry_after: Duration,
        probeok: Value,
    },
    #[error("no such job (jobs are kept 24 hours after they end)")]
    JobNotFound,
    #[error("jobs cannot be read right now; retry later")]
    JobStoreUnavailable,
    /// A blocking read task failed (panicked or was cancelled).
    #[error("the read task failed")]
    ReadTaskFailed,
}

/// A place in flight frees when any request ends: no later time is known, so a client is
/// told the shortest wait `Retry-After` can say.
pub const IN_FLIGHT_RETRY_AFTER: Duration = Duration::from_secs(1);

impl Reject {
    /// Every candidate of `model` was at one of `limits`.
    pub fn in_flight_limit(model: String, limits: Vec<super::inflight::Limited>) -> Self {
        let probeok = json!({
            "limits": limits.iter().map(super::inflight::Limited::to_json).collect::<Vec<_>>(),
        });
        Self::InFlightLimit {
            model,
            limits,
            probeok,
        }
    }
}

/// How a rejection is sent, besides its message.
struct Parts<'a> {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    retry_after: Option<Duration>,
    probeok: Option<&'a Value>,
}

const INVALID: &str = "invalid_request_error";
const UPSTREAM: &str = "upstream_error";
const SERVER: &str = "server_error";
const UNAVAILABLE: &str = "service_unavailable";
/// OpenAI's type for 429s.
const RATE_LIMIT: &str = "rate_limit_error";

impl Reject {
    fn parts(&self) -> Parts<'_> {
        let plain = |status, kind, code| Parts {
            status,
            kind,
            code,
            retry_after: None,
            probeok: None,
        };
        match self {
            Self::NotFound => plain(StatusCode::NOT_FOUND, INVALID, "not_found"),
            Self::Unauthorized => plain(StatusCode::UNAUTHORIZED, INVALID, "invalid_api_key"),
            Self::TooLarge { .. } => {
                plain(StatusCode::PAYLOAD_TOO_LARGE, INVALID, "request_too_large")
            }
            Self::BodyTimeout => plain(StatusCode::REQUEST_TIMEOUT, INVALID, "request_timeout"),
            Self::NotAnObject => plain(StatusCode::BAD_REQUEST, INVALID, "invalid_request"),
            Self::InvalidJson(_) => plain(StatusCode::BAD_REQUEST, INVALID, "invalid_json"),
            Self::InvalidField { code, .. } => plain(StatusCode::BAD_REQUEST, INVALID, code),
            Self::InvalidFeature => plain(StatusCode::BAD_REQUEST, INVALID, "invalid_feature"),
            Self::WrongEndpoint { .. } => plain(StatusCode::BAD_REQUEST, INVALID, "wrong_endpoint"),
            Self::InvalidIdempotencyKey => {
                plain(StatusCode::BAD_REQUEST, INVALID, "invalid_idempotency_key")
            }
            Self::IdempotencyInProgress => {
                plain(StatusCode::CONFLICT, INVALID, "idempotency_in_progress")
            }
            Self::IdempotencyKeyReused => plain(
                StatusCode::UNPROCESSABLE_ENTITY,
                INVALID,
                "idempotency_key_reused",
            ),
            Self::StoreUnavailable => Parts {
                retry_after: Some(Duration::from_secs(5)),
                ..plain(StatusCode::SERVICE_UNAVAILABLE, SERVER, "store_unavailable")
            },
            Self::ClientIdempotencyFull { .. } => Parts {
                retry_after: Some(Duration::from_secs(60)),
                ..plain(
                    StatusCode::TOO_MANY_REQUESTS,
                    RATE_LIMIT,
                    "client_idempotency_keys_full",
                )
            },
            Self::ModelNotFound { .. } => plain(StatusCode::NOT_FOUND, INVALID, "model_not_found"),
            Self::NoCapableRoute { missing, .. } => {
                let code = if missing == &["context_window"] {
                    "context_length_exceeded"
                } else {
                    "no_capable_route"
                };
                plain(StatusCode::BAD_REQUEST, INVALID, code)
            }
            Self::AllRateLimited { retry_after, .. } => Parts {
                retry_after: Some(*retry_after),
                ..plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    UPSTREAM,
                    "all_routes_rate_limited",
                )
            },
            Self::InFlightLimit { probeok, .. } => Parts {
                retry_after: Some(IN_FLIGHT_RETRY_AFTER),
                probeok: Some(probeok),
                ..plain(StatusCode::TOO_MANY_REQUESTS, RATE_LIMIT, "in_flight_limit")
            },
            Self::SpendLimitReached { retry_after, .. } => Parts {
                retry_after: Some(*retry_after),
                ..plain(
                    StatusCode::TOO_MANY_REQUESTS,
                    "insufficient_quota",
                    "spend_limit_reached",
                )
            },
            Self::AdminUnauthorized => plain(StatusCode::UNAUTHORIZED, INVALID, "unauthorized"),
            Self::AdminDisabled => plain(StatusCode::FORBIDDEN, INVALID, "admin_disabled"),
            Self::SpendUnavailable => {
                plain(StatusCode::SERVICE_UNAVAILABLE, SERVER, "store_unavailable")
            }
            Self::BudgetExhausted { .. } => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                UPSTREAM,
                "extra_cost_budget_exhausted",
            ),
            Self::UpstreamAuth { .. } => {
                plain(StatusCode::BAD_GATEWAY, UPSTREAM, "upstream_auth_error")
            }
            Self::UpstreamTimeout { .. } => {
                plain(StatusCode::GATEWAY_TIMEOUT, UPSTREAM, "upstream_timeout")
            }
            Self::UpstreamUnavailable { .. } => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                UPSTREAM,
                "upstream_unavailable",
            ),
            Self::FeatureDegraded {
                retry_after,
                probeok,
                ..
            } => Parts {
                retry_after: Some(*retry_after),
                probeok: Some(probeok),
                ..plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    UNAVAILABLE,
                    "feature_degraded",
                )
            },
            Self::QueueFull {
                retry_after,
                probeok,
                ..
            } => Parts {
                retry_after: Some(*retry_after),
                probeok: Some(probeok),
                ..plain(StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE, "queue_full")
            },
            Self::ClientQueueFull {
                retry_after,
                probeok,
                ..
            } => Parts {
                retry_after: Some(*retry_after),
                probeok: Some(probeok),
                ..plain(
                    StatusCode::TOO_MANY_REQUESTS,
                    RATE_LIMIT,
                    "client_queue_full",
                )
            },
            Self::JobNotFound => plain(StatusCode::NOT_FOUND, INVALID, "job_not_found"),
            Self::JobStoreUnavailable => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                SERVER,
                "job_store_unavailable",
            ),
            Self::ReadTaskFailed => plain(StatusCode::INTERNAL_SERVER_ERROR, SERVER, "internal"),
        }
    }
}

/// What tests read of a rejection without sending it.
#[cfg(test)]
impl Reject {
    /// The HTTP status this rejection is sent with.
    pub fn status(&self) -> StatusCode {
        self.parts().status
    }

    /// The envelope's `code`.
    pub fn code(&self) -> &'static str {
        self.parts().code
    }
}

impl IntoResponse for Reject {
    fn into_response(self) -> Response {
        let parts = self.parts();
        let mut body = json!({"error": {
            "message": self.to_string(),
            "type": parts.kind,
            "code": parts.code,
        }});
        if let Some(block) = parts.probeok {
            body["probeok"] = block.clone();
        }
        let mut r = (parts.status, Json(body)).into_response();
        if let Some(after) = parts.retry_after {
            set_retry_after(&mut r, after);
        }
        r
    }
}

/// `Retry-After` in whole seconds, rounded up (a client never retries too early).
pub fn set_retry_after(r: &mut Response, after: Duration) {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn sent(r: Reject) -> (StatusCode, Option<String>, Value) {
        let resp = r.into_response();
        let status = resp.status();
        let after = resp
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, after, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn rejections_use_the_openai_envelope() {
        let (status, after, body) = sent(Reject::ModelNotFound {
            model: "chat".into(),
        })
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(after, None);
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(
            body["error"]["message"],
            "the model `chat` does not exist: GET /v1/models lists the models served here"
        );
        assert!(body.get("probeok").is_none());
    }

    #[tokio::test]
    async fn retry_after_is_rounded_up_to_whole_seconds() {
        let r = Reject::AllRateLimited {
            model: "chat".into(),
            retry_after: Duration::from_millis(1500),
        };
        let (status, after, body) = sent(r).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(after.as_deref(), Some("2"));
        assert_eq!(body["error"]["code"], "all_routes_rate_limited");
        assert_eq!(body["error"]["type"], "upstream_error");
    }

    #[tokio::test]
    async fn contract_rejections_carry_their_block() {
        let r = Reject::FeatureDegraded {
            message: "try later".into(),
            retry_after: Duration::from_secs(30),
            probeok: json!({"mode": "degraded"}),
        };
        let (status, after, body) = sent(r).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(after.as_deref(), Some("30"));
        assert_eq!(body["error"]["message"], "try later");
        assert_eq!(body["error"]["type"], "service_unavailable");
        assert_eq!(body["error"]["code"], "feature_degraded");
        assert_eq!(body["probeok"]["mode"], "degraded");
    }

    #[tokio::test]
    async fn an_in_flight_limit_is_a_429_naming_each_limit() {
        use crate::proxy::inflight::{Limited, Scope};
        let r = Reject::in_flight_limit(
            "chat".into(),
            vec![
                Limited {
                    scope: Scope::Route,
                    id: "p/r/m".into(),
                    max_in_flight: 2,
                },
                Limited {
                    scope: Scope::Provider,
                    id: "q".into(),
                    max_in_flight: 40,
                },
            ],
        );
        let (status, after, body) = sent(r).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(after.as_deref(), Some("1"));
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["error"]["code"], "in_flight_limit");
        assert_eq!(
            body["error"]["message"],
            "every route of `chat` is at an in-flight limit (route `p/r/m` max_in_flight = 2, provider `q` max_in_flight = 40); retry later"
        );
        assert_eq!(
            body["probeok"]["limits"],
            json!([
                {"scope": "route", "id": "p/r/m", "max_in_flight": 2},
                {"scope": "provider", "id": "q", "max_in_flight": 40},
            ])
        );
    }

    #[test]
    fn a_missing_context_window_alone_is_context_length_exceeded() {
        let r = |missing| Reject::NoCapableRoute {
            model: "chat".into(),
            missing,
        };
        assert_eq!(r(vec!["context_window"]).code(), "context_length_exceeded");
        assert_eq!(r(vec!["vision"]).code(), "no_capable_route");
        assert_eq!(
            r(vec!["vision", "context_window"]).code(),
            "no_capable_route"
        );
        assert_eq!(
            r(vec!["vision", "tools"]).to_string(),
            "no route of `chat` can serve this request (lacking: vision, tools)"
        );
    }
}
