//! Read-only mode: the proxy without its database keeps serving model calls.
//!
//! - Whether the store answers is [`crate::store::StoreHealth`], one atomic the request path
//!   reads: set unavailable by real connection failures of store calls (the idempotency
//!   lookup, metering, the job worker), and by [`watch`], a cheap periodic check — a
//!   `SELECT 1` every [`CHECK_EVERY`] while healthy, a real write through the writer every
//!   [`RETRY_EVERY`] while not, which is also how the return is noticed. A healthy request
//!   adds no store round trip.
//! - While unavailable every answer carries `x-probeok-store: unavailable` ([`disclose`]);
//!   requests are routed on the weights the proxy already has; metering waits in its bounded
//!   queue (`meter`) and is written once the store returns (drops are counted); a request
//!   with an `Idempotency-Key` gets 503 `store_unavailable` (it cannot be deduplicated);
//!   async jobs and cached answers are not read or written.
//! - `GET /readyz` ([`readyz`]) says whether the proxy serves and, when the store is away,
//!   since when and why. It stays 200 while the proxy serves: a load balancer should keep
//!   sending traffic to a proxy in read-only mode.

use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{Inner, Proxy};
use crate::clock::{rfc3339, Clock};
use crate::store::{Store, StoreMode};

/// The answer header while the store is unavailable.
pub const HEADER: &str = "x-probeok-store";
/// The check while the store answers.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);
/// The check while it does not (a write through the writer, which reconnects).
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// A check taking longer than this counts as a failure.
const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// Checks the store until the proxy is dropped.
pub(super) fn watch(proxy: Weak<Inner>, store: Store, clock: Arc<dyn Clock>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        loop {
            let health = store.health().clone();
            let pause = if health.available() {
                CHECK_EVERY
            } else {
                RETRY_EVERY
            };
            tokio::time::sleep(pause).await;
            if proxy.strong_count() == 0 {
                break;
            }
            let check = async {
                if health.available() {
                    let s = store.clone();
                    tokio::task::spawn_blocking(move || s.reader()?.ping())
                        .await
                        .unwrap_or(Err(crate::store::StoreError::Closed))
                } else {
                    store.writer().check_writable().await
                }
            };
            match tokio::time::timeout(CHECK_TIMEOUT, check).await {
                Ok(Ok(())) => health.recovered(),
                Ok(Err(e)) => {
                    if !health.failed(&e, clock.now()) {
                        tracing::warn!(error = %e, "the store check failed");
                    }
                }
                Err(_) => health.mark_down("the store did not answer in time".into(), clock.now()),
            }
        }
    });
}

/// Adds `x-probeok-store: unavailable` to every answer while the store is unavailable.
pub(super) async fn disclose(
    State(proxy): State<Proxy>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    // Every request passes here, on the worker that took it.
    proxy.note_served();
    let mut r = next.run(req).await;
    if let Some(store) = &proxy.inner.store {
        if store.health().mode() == StoreMode::Unavailable {
            r.headers_mut()
                .insert(HEADER, HeaderValue::from_static("unavailable"));
        }
    }
    r
}

/// `GET /readyz`: 200 while the proxy serves, with the store's state.
pub(super) async fn readyz(State(proxy): State<Proxy>) -> Response {
    let p = &proxy.inner;
    let counters = proxy.counters();
    let mut body = json!({
        "status": "ready",
        "serving": true,
        "store": "none",
        "meter_dropped": counters.meter_dropped,
        "meter_waiting": p.meter.as_ref().map_or(0, |m| m.waiting()),
    });
    if let Some(store) = &p.store {
        let health = store.health();
        body["store"] = json!(health.mode().as_str());
        if let Some((reason, since)) = health.outage() {
            body["status"] = json!("read_only");
            body["store_error"] = json!(reason);
            body["store_unavailable_since"] = json!(rfc3339(since));
            body["note"] = json!(
                "serving on the last weights; metering is buffered; requests with an Idempotency-Key get 503 store_unavailable"
            );
        }
    }
    Json(body).into_response()
}
