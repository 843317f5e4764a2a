//! Opsgenie Alert API: create an alert under an `alias`, close it by that alias.
//!
//! Documentation: <https://docs.opsgenie.com/docs/alert-api> ("Create Alert": `POST /v2/alerts`
//! with `message` ≤ 130 characters, `alias` ≤ 512, `description` ≤ 15,000, `details`,
//! `priority` P1–P5, `source`, `tags`; "Close Alert": `POST /v2/alerts/{identifier}/close?identifierType=alias`;
//! both answer 202 `{"result":"Request will be processed","requestId":…}`),
//! <https://docs.opsgenie.com/docs/authentication> (`Authorization: GenieKey <key>`),
//! <https://docs.opsgenie.com/docs/european-service-region> (`api.eu.opsgenie.com`) and
//! <https://docs.opsgenie.com/docs/api-rate-limiting> (429 when throttled).
//!
//! The alias is [`oncall::incident_key`] of the stored message, so the close after a restart or
//! a takeover names the alert that was created; a provider group is closed when its last route
//! recovers ([`super::announced`]). Priority: critical → P1, warning → P3,
//! info → P5. A reminder creates again under the same alias (Opsgenie counts it on the open
//! alert); `alert test` creates a P5 alert and closes it at once. A 4xx other than 429 (422
//! invalid, 401/403 key) is a refusal kept with Opsgenie's `message`, not retried.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;

use super::oncall;
use super::{
    render, AlertError, ChannelEnv, Message, Notifier, Receipt, RenderCtx, Severity, Status,
};
use crate::config::{ChannelOptions, OpsgenieConfig};
use crate::secret::Secret;

pub const US_API_BASE: &str = "https://api.opsgenie.com";
pub const EU_API_BASE: &str = "https://api.eu.opsgenie.com";
/// `message`'s documented limit.
pub const MAX_MESSAGE_CHARS: usize = 130;
/// `description`'s documented limit.
pub const MAX_DESCRIPTION_CHARS: usize = 15_000;

/// What is escaped in the alias's path segment (RFC 3986 keeps `-`, `.`, `_`, `~`).
const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

pub struct Opsgenie {
    name: String,
    api_key: Secret,
    api_base: String,
    options: ChannelOptions,
    http: reqwest::Client,
}

/// P1 for critical, P3 for warning, P5 for info.
pub fn priority(s: Severity) -> &'static str {
    match s {
        Severity::Critical => "P1",
        Severity::Warning => "P3",
        Severity::Info => "P5",
    }
}

impl Opsgenie {
    /// The integration of an `[[alert.opsgenie]]` table, its key read through `env`.
    pub fn from_config(c: &OpsgenieConfig, env: &ChannelEnv<'_>) -> Result<Self, AlertError> {
        let region = if c.region == "eu" {
            EU_API_BASE
        } else {
            US_API_BASE
        };
        Ok(Self {
            api_key: env.secret(&c.api_key_env)?,
            api_base: c
                .api_base
                .as_deref()
                .unwrap_or(region)
                .trim_end_matches('/')
                .to_owned(),
            options: c.options.clone(),
            http: env.http.clone(),
            name: env.name.clone(),
        })
    }

    /// The host messages go to (the region's, or `api_base`).
    pub fn api_base(&self) -> &str {
        &self.api_base
    }

    /// The create request's body.
    pub fn create(&self, message: &Message, ctx: &RenderCtx) -> serde_json::Value {
        let r = render::render(message, self.options.lang, ctx);
        let routes: Vec<&str> = message.routes().iter().map(|r| r.as_str()).collect();
        let link = oncall::link(message, ctx);
        json!({
            "message": super::cut(&r.title, MAX_MESSAGE_CHARS - 1),
            "alias": oncall::incident_key(message),
            "description": super::cut(&format!("{}\n\n{link}", r.text), MAX_DESCRIPTION_CHARS - 1),
            "priority": priority(message.severity),
            "source": ctx.public_url,
            "entity": routes.first().copied().unwrap_or("probeok"),
            "tags": ["probeok", message.severity.as_str()],
            "details": {
                "routes": super::cut(&routes.join(", "), 1000),
                "link": link,
                "severity": message.severity.as_str(),
            },
        })
    }

    async fn post(&self, url: String, body: serde_json::Value) -> Result<Receipt, AlertError> {
        let auth = format!("GenieKey {}", self.api_key.expose());
        let a = oncall::post(&self.http, &url, &body, &[("authorization", auth)]).await?;
        if a.status == 202 {
            return Ok(Receipt {
                status: a.status,
                body: a.body,
            });
        }
        let v: serde_json::Value = serde_json::from_str(&a.body).unwrap_or_default();
        let reason = v["message"]
            .as_str()
            .map_or_else(|| a.body.clone(), |m| super::cut(m, 300));
        Err(oncall::failure(oncall::Answer { body: reason, ..a }))
    }

    /// Closes the alerts `aliases` name, with `message`'s title as the note. A retry after a
    /// partial failure closes again, which Opsgenie takes as a no-op.
    async fn close(
        &self,
        message: &Message,
        aliases: Vec<String>,
        ctx: &RenderCtx,
    ) -> Result<Receipt, AlertError> {
        let note = render::render(message, self.options.lang, ctx).title;
        let mut last = None;
        for alias in aliases {
            let alias = percent_encoding::utf8_percent_encode(&alias, PATH_SEGMENT);
            let url = format!(
                "{}/v2/alerts/{alias}/close?identifierType=alias",
                self.api_base
            );
            last = Some(
                self.post(url, json!({"source": ctx.public_url, "note": note}))
                    .await?,
            );
        }
        last.ok_or_else(|| AlertError::Config("a resolution that closes nothing".into()))
    }
}

impl Notifier for Opsgenie {
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
            if message.status == Status::Resolved {
                return self
                    .close(message, oncall::resolved_keys(message), ctx)
                    .await;
            }
            let url = format!("{}/v2/alerts", self.api_base);
            let r = self.post(url, self.create(message, ctx)).await?;
            if message.status == Status::Test {
                let alias = oncall::incident_key(message);
                return self.close(message, vec![alias], ctx).await;
            }
            Ok(r)
        }
        .boxed()
    }
}
