//! Reading a provider region's model list, as the providers document it:
//!
//! - OpenAI-compatible: `GET {base_url}/models` with `Authorization: Bearer`, answering
//!   `{"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}`;
//! - Anthropic: `GET {base_url}/v1/models?limit=N[&after_id=…]` with `x-api-key` and
//!   `anthropic-version`, answering `{"data": [{"type": "model", "id", "display_name",
//!   "created_at"}], "has_more", "first_id", "last_id"}`, followed page by page while
//!   `has_more` (with `last_id` as the next `after_id`).
//!
//! Every answer is bounded (time, bytes, pages, models). Anything short of a whole, well-formed
//! list is an error — an incomplete list must never read as models withdrawn.

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION};
use serde::Deserialize;

use crate::route::ProviderKind;
use crate::secret::Secret;

/// Largest answer read (one page): a list of a few thousand models is well under it.
pub const MAX_BODY: usize = 4 << 20;
/// The most models one region may list.
pub const MAX_MODELS: usize = 10_000;
/// The most pages followed on an Anthropic list.
pub const MAX_PAGES: usize = 20;
/// Anthropic's page size (its documented maximum).
pub const PAGE_LIMIT: u32 = 1000;
const TIMEOUT: Duration = Duration::from_secs(30);
const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The provider's text is kept at most this long in logs.
const MAX_MESSAGE: usize = 200;

/// Why a model list was not read. Never holds the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("no answer: {0}")]
    Network(String),
    #[error("answer larger than {MAX_BODY} bytes")]
    TooLarge,
    #[error("not a model list: {0}")]
    Malformed(String),
    #[error("more than {MAX_MODELS} models")]
    TooManyModels,
    #[error("more than {MAX_PAGES} pages")]
    TooManyPages,
    #[error("the list names no model")]
    Empty,
}

/// The HTTP client every list read shares: bounded in time, no redirects (the key goes only
/// to the configured base URL).
pub fn http_client() -> Result<reqwest::Client, CatalogError> {
    reqwest::Client::builder()
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| CatalogError::Network(e.without_url().to_string()))
}

#[derive(Deserialize)]
struct Page {
    data: Vec<Entry>,
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    last_id: Option<String>,
}

#[derive(Deserialize)]
struct Entry {
    id: String,
}

/// Every model id the region lists.
pub async fn list(
    http: &reqwest::Client,
    kind: ProviderKind,
    base_url: &str,
    key: Option<&Secret>,
) -> Result<BTreeSet<String>, CatalogError> {
    let base = base_url.trim_end_matches('/');
    let mut models = BTreeSet::new();
    let mut after: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut req = match kind {
            ProviderKind::Openai => {
                let mut r = http.get(format!("{base}/models"));
                if let Some(k) = key {
                    r = r.header(AUTHORIZATION, sensitive(&format!("Bearer {}", k.expose())));
                }
                r
            }
            ProviderKind::Anthropic => {
                let mut r = http
                    .get(format!("{base}/v1/models"))
                    .header("anthropic-version", ANTHROPIC_VERSION)
                    .query(&[("limit", PAGE_LIMIT.to_string())]);
                if let Some(a) = &after {
                    r = r.query(&[("after_id", a)]);
                }
                if let Some(k) = key {
                    r = r.header("x-api-key", sensitive(k.expose()));
                }
                r
            }
        };
        req = req.header(ACCEPT, "application/json");
        let page = page(req).await?;
        for e in page.data {
            if e.id.is_empty() {
                return Err(CatalogError::Malformed("a model without an id".into()));
            }
            models.insert(e.id);
            if models.len() > MAX_MODELS {
                return Err(CatalogError::TooManyModels);
            }
        }
        // OpenAI-compatible lists are one page; `has_more` is Anthropic's.
        if kind == ProviderKind::Openai || !page.has_more {
            return if models.is_empty() {
                Err(CatalogError::Empty)
            } else {
                Ok(models)
            };
        }
        match page.last_id {
            Some(id) if after.as_ref() != Some(&id) => after = Some(id),
            _ => {
                return Err(CatalogError::Malformed(
                    "has_more without a new last_id".into(),
                ))
            }
        }
    }
    Err(CatalogError::TooManyPages)
}

async fn page(req: reqwest::RequestBuilder) -> Result<Page, CatalogError> {
    let net = |e: reqwest::Error| CatalogError::Network(short(&e.without_url().to_string()));
    let mut resp = req.send().await.map_err(net)?;
    let status = resp.status().as_u16();
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(CatalogError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(net)? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(CatalogError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    if status != 200 {
        return Err(CatalogError::Status {
            status,
            body: short(&String::from_utf8_lossy(&body)),
        });
    }
    serde_json::from_slice(&body).map_err(|e| CatalogError::Malformed(short(&e.to_string())))
}

fn sensitive(value: &str) -> HeaderValue {
    let mut v = HeaderValue::from_str(value).unwrap_or_else(|_| HeaderValue::from_static(""));
    v.set_sensitive(true);
    v
}

fn short(s: &str) -> String {
    if s.chars().count() <= MAX_MESSAGE {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(MAX_MESSAGE).collect();
    out.push('…');
    out
}
