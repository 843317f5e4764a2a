//! Sending one capability probe: `POST {base_url}/chat/completions` (OpenAI-compatible,
//! `Authorization: Bearer`) or `POST {base_url}/v1/messages` (Anthropic, `x-api-key` and
//! `anthropic-version`), not streamed, bounded in time and bytes; the answer checked by
//! [`super::wire::check`].

use std::time::Duration;

use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION};

use super::wire;
use super::Probed;
use crate::route::{ProviderKind, Route};
use crate::secret::Secret;

/// Largest answer read: a forced tool call or a two-field object is a few hundred bytes.
pub const MAX_BODY: usize = 256 << 10;
/// The provider's text is kept at most this long in a failure's reason.
const MAX_MESSAGE: usize = 160;
const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Why the HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the capability probes' HTTP client: {0}")]
pub struct ClientError(String);

/// The client every capability probe shares: no redirects (the key goes only to the
/// configured base URL); each request carries its route's timeout.
pub fn http_client() -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .user_agent(concat!("probeok/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| ClientError(e.without_url().to_string()))
}

/// Probes `cap` on `route` once: `Ok` when the answer shows it, else a short reason (never
/// the key).
pub async fn probe(
    http: &reqwest::Client,
    route: &Route,
    key: Option<&Secret>,
    cap: Probed,
    timeout: Duration,
) -> Result<(), String> {
    let base = route.base_url.trim_end_matches('/');
    let body = wire::request_body(route.kind, cap, &route.model);
    let mut req = match route.kind {
        ProviderKind::Openai => {
            let mut r = http.post(format!("{base}/chat/completions"));
            if let Some(k) = key {
                r = r.header(AUTHORIZATION, sensitive(&format!("Bearer {}", k.expose())));
            }
            r
        }
        ProviderKind::Anthropic => {
            let mut r = http
                .post(format!("{base}/v1/messages"))
                .header("anthropic-version", ANTHROPIC_VERSION);
            if let Some(k) = key {
                r = r.header("x-api-key", sensitive(k.expose()));
            }
            r
        }
    };
    req = req
        .header(ACCEPT, "application/json")
        .timeout(timeout)
        .json(&body);
    let net = |e: reqwest::Error| {
        if e.is_timeout() {
            "timeout".to_owned()
        } else {
            format!("no answer: {}", short(&e.without_url().to_string()))
        }
    };
    let mut resp = req.send().await.map_err(net)?;
    let status = resp.status().as_u16();
    let mut bytes = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(net)? {
        if bytes.len() + chunk.len() > MAX_BODY {
            return Err(format!("answer larger than {MAX_BODY} bytes"));
        }
        bytes.extend_from_slice(&chunk);
    }
    if status != 200 {
        return Err(format!(
            "HTTP {status}: {}",
            short(&String::from_utf8_lossy(&bytes))
        ));
    }
    wire::check(route.kind, cap, &bytes).map_err(|e| e.to_string())
}

fn sensitive(value: &str) -> HeaderValue {
    let mut v = HeaderValue::from_str(value).unwrap_or_else(|_| HeaderValue::from_static(""));
    v.set_sensitive(true);
    v
}

fn short(s: &str) -> String {
    let mut out: String = s.chars().take(MAX_MESSAGE).collect();
    if s.chars().count() > MAX_MESSAGE {
        out.push('…');
    }
    out
}
