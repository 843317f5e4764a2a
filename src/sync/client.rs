//! The gateways' admin channel API, as new-api and one-api serve it: `GET /api/channel/{id}`
//! answers the channel (without its key) in the `{success, message, data}` envelope;
//! `PUT /api/channel/` takes the whole channel back. Admin calls carry the access token as
//! `Authorization: Bearer …`; new-api also wants `New-Api-User: <the token's user id>`.
//! Refusals come as HTTP 401/403 or as HTTP 200 with `success: false`.

use std::time::Duration;

use serde_json::Value;

use super::plan::Channel;
use crate::secret::Secret;

/// Largest answer read from a gateway (a channel with its model list is a few KiB).
const MAX_BODY: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(10);
/// The gateway's message is kept at most this long in logs, alerts and the status.
const MAX_MESSAGE: usize = 300;

/// Why a call to the gateway did not do what it was asked. Never holds the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    /// HTTP 401/403, or `success: false`: the gateway refused (its message).
    #[error("refused (HTTP {status}): {message}")]
    Refused { status: u16, message: String },
    /// Another HTTP status, or an answer that is not the envelope.
    #[error("unexpected answer (HTTP {status}): {what}")]
    Unexpected { status: u16, what: String },
    /// No answer: connect, timeout, a body past the bound.
    #[error("no answer: {0}")]
    Network(String),
    /// The token's variable is not set (its name only).
    #[error("environment variable {0} is not set")]
    NoToken(String),
}

/// One gateway's admin API.
#[derive(Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    base: String,
    token: Secret,
    user_id: Option<u64>,
}

/// A channel as read: the whole JSON object (written back as it is but for the two fields)
/// and those two fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadChannel {
    pub json: serde_json::Map<String, Value>,
    pub fields: Channel,
}

/// The HTTP client every gateway call shares: bounded in time, no redirects followed (the
/// token is never sent anywhere but the configured URL).
pub fn http_client() -> Result<reqwest::Client, SyncError> {
    reqwest::Client::builder()
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| SyncError::Network(e.to_string()))
}

impl GatewayClient {
    /// A client for `base` with the token as it is now (read again for every pass, so a
    /// rotated token takes effect without a restart).
    pub fn new(http: reqwest::Client, base: &str, token: Secret, user_id: Option<u64>) -> Self {
        Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
            user_id,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(self.token.expose());
        if let Some(u) = self.user_id {
            r = r.header("New-Api-User", u.to_string());
        }
        r
    }

    /// `GET /api/channel/{id}`.
    pub async fn get(&self, id: u64) -> Result<ReadChannel, SyncError> {
        let data = envelope(
            self.request(reqwest::Method::GET, &format!("/api/channel/{id}"))
                .send()
                .await,
        )
        .await?;
        let Value::Object(json) = data else {
            return Err(SyncError::Unexpected {
                status: 200,
                what: "data is not a channel object".into(),
            });
        };
        let int = |k: &str| json.get(k).and_then(Value::as_i64);
        let fields = Channel {
            status: int("status").ok_or_else(|| SyncError::Unexpected {
                status: 200,
                what: "the channel has no integer status".into(),
            })?,
            // new-api and one-api keep weight as a nullable unsigned integer.
            weight: int("weight").unwrap_or(0),
        };
        Ok(ReadChannel { json, fields })
    }

    /// `PUT /api/channel/` with the channel read, `status` and `weight` replaced.
    pub async fn put(&self, read: &ReadChannel, to: Channel) -> Result<(), SyncError> {
        let mut body = read.json.clone();
        body.insert("status".into(), Value::from(to.status));
        body.insert("weight".into(), Value::from(to.weight));
        envelope(
            self.request(reqwest::Method::PUT, "/api/channel/")
                .json(&body)
                .send()
                .await,
        )
        .await
        .map(|_| ())
    }
}

/// The `data` of a `success: true` envelope, or why there is none.
async fn envelope(sent: reqwest::Result<reqwest::Response>) -> Result<Value, SyncError> {
    let mut resp = sent.map_err(|e| SyncError::Network(plain(e)))?;
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| SyncError::Network(plain(e)))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(SyncError::Network(format!(
                "answer larger than {MAX_BODY} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let message = parsed
        .as_ref()
        .and_then(|v| v.get("message"))
        .and_then(Value::as_str)
        .map(short)
        .unwrap_or_default();
    if status == 401 || status == 403 {
        return Err(SyncError::Refused { status, message });
    }
    if status != 200 {
        return Err(SyncError::Unexpected {
            status,
            what: if message.is_empty() {
                "no envelope".into()
            } else {
                message
            },
        });
    }
    let Some(mut v) = parsed else {
        return Err(SyncError::Unexpected {
            status,
            what: "not JSON".into(),
        });
    };
    match v.get("success").and_then(Value::as_bool) {
        Some(true) => Ok(v.get_mut("data").map(Value::take).unwrap_or(Value::Null)),
        Some(false) => Err(SyncError::Refused { status, message }),
        None => Err(SyncError::Unexpected {
            status,
            what: "no success field".into(),
        }),
    }
}

/// A transport error without its URL's query (none is sent, but no secret ever travels in a
/// URL here either way).
fn plain(e: reqwest::Error) -> String {
    short(&e.without_url().to_string())
}

fn short(s: &str) -> String {
    if s.chars().count() <= MAX_MESSAGE {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(MAX_MESSAGE).collect();
    out.push('…');
    out
}
