//! The one harness every integration test shares (each test binary compiles it and uses a
//! different part of it):
//!
//! - [`upstream`]: fake providers — small real axum servers on `127.0.0.1:0` speaking the
//!   OpenAI-compatible and Anthropic wire formats, with captured requests and scripted timing.
//!   Re-exported here, so `common::{fake, json, openai, …}` reads as before.
//! - [`app`]: the monitor's web surface around a real store with hand-fed health and weights,
//!   served on `127.0.0.1:0`, and builders for configs, outcomes and route statuses.
//! - [`alerts`]: fake alert receivers (DingTalk, Feishu, WeCom, webhook, SMTP) that verify
//!   signatures and answer the services' real bodies, and the alert tests' rig.
//! - [`oncall`]: fake Slack, Teams, Telegram, PagerDuty and Opsgenie services that check the
//!   documented request shapes and answer as the services do, rate limits and refusals included.
//! - [`pages`]: a served monitor with routes in every state and 90 days of history, for the
//!   page and browser tests.
//! - [`scale`]: a served monitor with a thousand routes and 90 days of history.
//! - [`pool`]: three model servers on 127.0.0.1-3 probed by a monitor that Envoy and HAProxy
//!   follow, and the helpers to run those programs and count where traffic went.
//! - [`gateway`]: a fake new-api / one-api admin channel API (routes, envelope, admin auth with
//!   `New-Api-User`, GORM's update semantics) built from their Go sources.
//! - [`embeddings`]: a fake OpenAI-compatible embeddings endpoint (`POST /v1/embeddings`) that
//!   checks the documented request shape and answers steady vectors of one model or another.
//! - [`statuspage`]: a fake provider status page (Statuspage v2 JSON and its Atom history
//!   feed, ETags, fault modes).
//! - [`cluster`]: a database of the test's own on the PostgreSQL server of
//!   `PROBEOK_TEST_PG_URL`, for the monitor pair's lease.

#![allow(dead_code, unused_imports)]

pub mod alerts;
pub mod app;
pub mod cluster;
pub mod embeddings;
pub mod gateway;
pub mod oncall;
pub mod pages;
pub mod pg;
pub mod pool;
pub mod scale;
pub mod statuspage;
pub mod upstream;

pub use upstream::*;

/// `GET url` answered with a JSON body (panics otherwise: a test's own request).
pub async fn get_json(http: &reqwest::Client, url: &str) -> serde_json::Value {
    http.get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"))
}
