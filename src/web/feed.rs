//! The weights feed routers follow.
//!
//! - `GET /api/v1/weights`: the current snapshot with `ETag: "<version>"`. `If-None-Match`
//!   naming the current version → 304; with `?wait=30s` (at most [`MAX_WAIT`]) the request is
//!   held until a newer version appears (200 with it) or the wait ends (304).
//! - `GET /api/v1/weights/stream`: Server-Sent Events. The current snapshot on connect as
//!   `event: weights` with `id: <version>`, then one such event per new version, and a
//!   `: heartbeat` comment every [`HEARTBEAT`]. A client resuming with `Last-Event-ID` gets
//!   the current snapshot only if its version differs from that id (versions only grow, even
//!   across restarts: see [`crate::weights`]), otherwise nothing until the next change.
//!
//! Both watch `AppState::shutdown` and end when it fires, so subscribers never hold graceful
//! shutdown open. Every subscriber sends the same JSON, serialised once per version.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{ApiError, AppState};
use crate::weights::{WeightsRx, WeightsSnapshot};

/// Longest `?wait=` honoured; longer asks are cut to this.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// SSE comment heartbeat interval.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

#[derive(Debug, Deserialize)]
pub struct WaitQuery {
    wait: Option<String>,
}

/// `?wait=30s` (humantime, or plain seconds), clamped to [`MAX_WAIT`]; absent → zero.
fn wait(q: Result<Query<WaitQuery>, QueryRejection>) -> Result<Duration, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    let Some(s) = q.wait else {
        return Ok(Duration::ZERO);
    };
    let s = s.trim();
    let parsed = match s.parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => humantime::parse_duration(s),
    };
    parsed.map(|d| d.min(MAX_WAIT)).map_err(|_| {
        ApiError::bad_request(
            "bad_query",
            format!("wait must be a duration like 30s, got {s:?}"),
        )
    })
}

/// The strong ETag of a version.
pub fn etag(version: u64) -> String {
    format!("\"{version}\"")
}

/// Does `If-None-Match` name `version` (or `*`)? Weak and strong forms both count.
fn none_match_hits(headers: &HeaderMap, version: u64) -> bool {
    let tag = etag(version);
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == tag)
}

fn with_etag(mut response: Response, version: u64) -> Response {
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&etag(version)) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn full(snapshot: &WeightsSnapshot) -> Response {
    let response = (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(snapshot.json.clone()),
    )
        .into_response();
    with_etag(response, snapshot.version)
}

fn not_modified(version: u64) -> Response {
    with_etag(StatusCode::NOT_MODIFIED.into_response(), version)
}

/// Waits until `rx` holds a version other than `seen`, `shutdown` fires or `deadline`
/// passes; the new snapshot, if any.
async fn next_version(
    rx: &mut WeightsRx,
    seen: u64,
    shutdown: &CancellationToken,
    wait: Duration,
) -> Option<Arc<WeightsSnapshot>> {
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline);
    loop {
        {
            let current = rx.borrow_and_update();
            if current.version != seen {
                return Some(current.clone());
            }
        }
        tokio::select! {
            _ = &mut deadline => return None,
            _ = shutdown.cancelled() => return None,
            changed = rx.changed() => {
                if changed.is_err() {
                    // The publisher is gone: nothing new will come before the deadline.
                    tokio::select! {
                        _ = &mut deadline => {}
                        _ = shutdown.cancelled() => {}
                    }
                    return None;
                }
            }
        }
    }
}

/// `GET /api/v1/weights[?wait=30s]`.
pub async fn weights(
    State(state): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<WaitQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let wait = wait(q)?;
    let mut rx = state.weights.clone();
    let current = rx.borrow_and_update().clone();
    if !none_match_hits(&headers, current.version) {
        return Ok(full(&current));
    }
    if wait.is_zero() {
        return Ok(not_modified(current.version));
    }
    Ok(
        match next_version(&mut rx, current.version, &state.shutdown, wait).await {
            Some(next) => full(&next),
            None => not_modified(current.version),
        },
    )
}

fn event(snapshot: &WeightsSnapshot) -> Event {
    Event::default()
        .event("weights")
        .id(snapshot.version.to_string())
        .data(snapshot.json_str())
}

/// The SSE event stream: every version other than the last one sent, until shutdown.
pub fn events(
    rx: WeightsRx,
    last_event_id: Option<u64>,
    shutdown: CancellationToken,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    futures_util::stream::unfold(
        (rx, last_event_id, shutdown),
        |(mut rx, last, shutdown)| async move {
            if shutdown.is_cancelled() {
                return None;
            }
            // A wait longer than any connection lives; the loop ends on shutdown or change.
            let next = match last {
                None => Some(rx.borrow_and_update().clone()),
                Some(seen) => next_version(&mut rx, seen, &shutdown, FOREVER).await,
            }?;
            Some((Ok(event(&next)), (rx, Some(next.version), shutdown)))
        },
    )
}

/// "Until shutdown" for SSE waits (a year; `Instant + Duration::MAX` would overflow).
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// `GET /api/v1/weights/stream`.
pub async fn stream(State(state): State<AppState>, headers: HeaderMap) -> impl IntoResponse {
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let sse = Sse::new(events(state.weights.clone(), last, state.shutdown.clone()))
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat"));
    (
        [
            (header::CACHE_CONTROL, "no-cache"),
            // Reverse proxies (nginx) must not buffer the stream.
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        sse,
    )
}
