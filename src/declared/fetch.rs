//! Reading a status page over HTTP: conditional requests (`If-None-Match` /
//! `If-Modified-Since` from the last answer, so an unchanged page costs a 304), a time bound,
//! a body bound, redirects followed only a few times, and nothing but a plain GET.

use std::time::Duration;

use reqwest::header::{ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED};

/// The largest page read: Statuspage's `incidents.json` with 50 incidents and their updates
/// is a few hundred KiB; anything past this is not a status page.
pub const MAX_BODY: usize = 4 << 20;
pub const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("HTTP {0}")]
    Status(u16),
    #[error("answer larger than {MAX_BODY} bytes")]
    TooLarge,
    #[error("no answer: {0}")]
    Network(String),
}

/// One URL's validators from its last answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Validators {
    etag: Option<String>,
    last_modified: Option<String>,
}

/// What a conditional GET found.
#[derive(Debug)]
pub enum Fetched {
    /// 304: as last read.
    Unchanged,
    Body(Vec<u8>),
}

pub fn http_client(timeout: Duration) -> Result<reqwest::Client, FetchError> {
    reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::limited(3))
        .user_agent(concat!("probeok/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| FetchError::Network(e.to_string()))
}

/// GETs `url` with the validators of its last answer; keeps the new ones only once the whole
/// body is read (a half-read page must be read again whole).
pub async fn get(
    http: &reqwest::Client,
    url: &str,
    validators: &mut Validators,
) -> Result<Fetched, FetchError> {
    let mut req = http.get(url);
    if let Some(e) = &validators.etag {
        req = req.header(IF_NONE_MATCH, e);
    }
    if let Some(m) = &validators.last_modified {
        req = req.header(IF_MODIFIED_SINCE, m);
    }
    let mut resp = req
        .send()
        .await
        .map_err(|e| FetchError::Network(e.without_url().to_string()))?;
    let status = resp.status();
    if status == reqwest::StatusCode::NOT_MODIFIED {
        return Ok(Fetched::Unchanged);
    }
    if !status.is_success() {
        return Err(FetchError::Status(status.as_u16()));
    }
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(FetchError::TooLarge);
    }
    let header = |name| {
        resp.headers()
            .get(name)
            .and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok())
            .filter(|v| v.len() <= 256)
            .map(str::to_owned)
    };
    let next = Validators {
        etag: header(ETAG),
        last_modified: header(LAST_MODIFIED),
    };
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| FetchError::Network(e.without_url().to_string()))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(FetchError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    *validators = next;
    Ok(Fetched::Body(body))
}
