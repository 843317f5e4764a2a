//! PagerDuty Events API v2: one `trigger` per incident (or provider group) and one `resolve`
//! with the same `dedup_key`.
//!
//! Documentation: <https://developer.pagerduty.com/docs/events-api-v2/trigger-events/> (the
//! event: `routing_key`, `event_action`, `dedup_key` ≤ 255 characters, `payload.summary` ≤ 1,024
//! characters, `payload.source`, `payload.severity` ∈ critical/error/warning/info,
//! `custom_details`, `links`), <https://developer.pagerduty.com/docs/events-api-v2/resolve-events/>
//! and <https://developer.pagerduty.com/docs/events-api-v2/overview/#response-codes--retry-logic>
//! (202 `{"status":"success","dedup_key":…}`; 400 `{"status":"invalid event","errors":[…]}`
//! is not retried; 429 and 5xx are retried with backoff).
//!
//! The `dedup_key` is [`oncall::incident_key`] of the stored message: a resolution sent after
//! a restart, or by the other monitor of a pair, names what was triggered. A provider group
//! is resolved when its last route recovers ([`super::announced`]). A reminder
//! triggers again under the same key (PagerDuty adds it to the open alert); `alert test`
//! triggers an `info` event and resolves it at once, so no incident is left open.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;

use super::oncall;
use super::{render, AlertError, ChannelEnv, Message, Notifier, Receipt, RenderCtx, Status};
use crate::config::{ChannelOptions, PagerDutyConfig};
use crate::secret::Secret;

pub const DEFAULT_API_BASE: &str = "https://events.pagerduty.com";
/// `payload.summary`'s documented limit.
pub const MAX_SUMMARY_CHARS: usize = 1024;

pub struct PagerDuty {
    name: String,
    routing_key: Secret,
    api_base: String,
    options: ChannelOptions,
    http: reqwest::Client,
}

impl PagerDuty {
    /// The integration of an `[[alert.pagerduty]]` table, its routing key read through `env`.
    pub fn from_config(c: &PagerDutyConfig, env: &ChannelEnv<'_>) -> Result<Self, AlertError> {
        Ok(Self {
            routing_key: env.secret(&c.routing_key_env)?,
            api_base: c
                .api_base
                .as_deref()
                .unwrap_or(DEFAULT_API_BASE)
                .trim_end_matches('/')
                .to_owned(),
            options: c.options.clone(),
            http: env.http.clone(),
            name: env.name.clone(),
        })
    }

    /// The `trigger` event for `message`, without the routing key.
    pub fn event(&self, message: &Message, ctx: &RenderCtx) -> serde_json::Value {
        let dedup_key = oncall::incident_key(message);
        let r = render::render(message, self.options.lang, ctx);
        let severity = message.severity.as_str();
        let routes: Vec<&str> = message.routes().iter().map(|r| r.as_str()).collect();
        json!({
            "event_action": "trigger",
            "dedup_key": dedup_key,
            "payload": {
                "summary": super::cut(&r.title, MAX_SUMMARY_CHARS - 1),
                "source": ctx.public_url,
                "severity": severity,
                "timestamp": message.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                "component": routes.first().copied().unwrap_or("probeok"),
                "class": subject_class(message),
                "custom_details": {
                    "text": render::fit_bytes(&r.text, 16 * 1024),
                    "routes": routes,
                    "status": message.status,
                },
            },
            "links": [{"href": oncall::link(message, ctx), "text": "probeok"}],
            "client": "probeok",
            "client_url": ctx.public_url,
        })
    }

    async fn post(&self, mut event: serde_json::Value) -> Result<Receipt, AlertError> {
        event["routing_key"] = json!(self.routing_key.expose());
        let url = format!("{}/v2/enqueue", self.api_base);
        let a = oncall::post(&self.http, &url, &event, &[]).await?;
        if a.status == 202 {
            return Ok(Receipt {
                status: a.status,
                body: a.body,
            });
        }
        // 400 names what is wrong in `errors`; keep that as the reason.
        let v: serde_json::Value = serde_json::from_str(&a.body).unwrap_or_default();
        let reason = match v["errors"].as_array() {
            Some(errs) if !errs.is_empty() => {
                let errs: Vec<&str> = errs.iter().filter_map(|e| e.as_str()).collect();
                format!(
                    "{}: {}",
                    v["status"].as_str().unwrap_or("error"),
                    errs.join("; ")
                )
            }
            _ => a.body.clone(),
        };
        Err(oncall::failure(oncall::Answer {
            body: super::cut(&reason, 300),
            ..a
        }))
    }
}

/// What kind of alert it is, for PagerDuty's `class`.
fn subject_class(m: &Message) -> &'static str {
    use super::Subject as S;
    match &m.subject {
        S::Route => "route",
        S::Provider { .. } => "provider",
        S::Egress { .. } => "egress",
        S::RequestSide => "request_side",
        S::Flapping { .. } => "flapping",
        S::BurnRate(_) => "burn_rate",
        S::Heartbeat { .. } => "heartbeat",
        S::Drift(_) => "drift",
        S::Switch { .. } => "switch",
        S::RouteFault { .. } => "route_fault",
        S::ExtraCost { .. } => "budget",
        S::VantageStale { .. } => "vantage_stale",
        S::SyncFailed { .. } => "sync_failed",
        S::ProviderDeclared { .. } => "provider_declared",
        S::RateLimitLow { .. } => "ratelimit_low",
        S::ModelWithdrawn { .. } => "model_withdrawn",
        S::ModelRetiring { .. } => "model_retiring",
        S::Grouped { .. } => "grouped",
        S::Folded { .. } => "folded",
        S::Test => "test",
    }
}

impl Notifier for PagerDuty {
    fn name(&self) -> &str {
        &self.name
    }

    fn options(&self) -> &ChannelOptions {
        &self.options
    }

    fn resolves_by_key(&self) -> bool {
        true
    }

    fn send<'a>(
        &'a self,
        message: &'a Message,
        ctx: &'a RenderCtx,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Receipt, AlertError>> {
        async move {
            let keys = match message.status {
                Status::Resolved => oncall::resolved_keys(message),
                _ => {
                    let r = self.post(self.event(message, ctx)).await?;
                    if message.status != Status::Test {
                        return Ok(r);
                    }
                    vec![oncall::incident_key(message)]
                }
            };
            // One resolve per trigger; a retry after a partial failure resolves again, which
            // PagerDuty takes as a no-op.
            let mut last = None;
            for dedup_key in keys {
                let event = json!({"event_action": "resolve", "dedup_key": dedup_key});
                last = Some(self.post(event).await?);
            }
            last.ok_or_else(|| AlertError::Config("a resolution that resolves nothing".into()))
        }
        .boxed()
    }
}
