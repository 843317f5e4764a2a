//! Microsoft Teams through a Workflows (Power Automate) webhook: a message whose one attachment
//! is an Adaptive Card (`application/vnd.microsoft.card.adaptive`). The retired Office 365
//! connector format (`MessageCard`) is not used.
//!
//! Documentation: <https://learn.microsoft.com/en-us/connectors/teams/?tabs=text1#microsoft-teams-webhook>
//! (the "Post to a channel when a webhook request is received" trigger: the body is
//! `{"type":"message","attachments":[{"contentType":"application/vnd.microsoft.card.adaptive",
//! "content":{…}}]}` and a card of at most 28 KB), <https://adaptivecards.io/explorer/> (card
//! elements) and
//! <https://learn.microsoft.com/en-us/power-automate/limits-and-config#request-limits> (throttled
//! requests answer 429 with `Retry-After`).
//!
//! Success is 202 Accepted (the flow runs later; 200 is taken too). A 4xx other than 429 is a
//! refusal (a wrong or deleted flow) and is not retried.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;

use super::oncall;
use super::slack::{labels, status_word};
use super::{render, AlertError, ChannelEnv, Message, Notifier, Receipt, RenderCtx, Severity};
use crate::config::{ChannelOptions, ChatWebhookConfig};
use crate::secret::Secret;

/// Teams refuses cards over 28 KB; the text is cut to leave room for the rest of the card.
pub const MAX_TEXT_BYTES: usize = 20 * 1024;

pub struct Teams {
    name: String,
    url: Secret,
    api_base: Option<String>,
    options: ChannelOptions,
    http: reqwest::Client,
}

impl Teams {
    /// The webhook of an `[[alert.teams]]` table, its URL read through `env`.
    pub fn from_config(c: &ChatWebhookConfig, env: &ChannelEnv<'_>) -> Result<Self, AlertError> {
        Ok(Self {
            url: env.secret(&c.webhook_env)?,
            api_base: c.api_base.clone(),
            options: c.options.clone(),
            http: env.http.clone(),
            name: env.name.clone(),
        })
    }

    /// The request body: a message with the Adaptive Card attached.
    pub fn body(&self, message: &Message, ctx: &RenderCtx) -> serde_json::Value {
        let r = render::render(message, self.options.lang, ctx);
        let (sev, status, routes, open) = labels(self.options.lang);
        let color = match (message.status, message.severity) {
            (super::Status::Resolved, _) => "Good",
            (_, Severity::Critical) => "Attention",
            (_, Severity::Warning) => "Warning",
            _ => "Default",
        };
        json!({
            "type": "message",
            "attachments": [{
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": null,
                "content": {
                    "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                    "type": "AdaptiveCard",
                    "version": "1.4",
                    "body": [
                        {"type": "TextBlock", "text": r.title, "weight": "Bolder", "size": "Medium", "color": color, "wrap": true},
                        {"type": "FactSet", "facts": [
                            {"title": sev, "value": message.severity.as_str()},
                            {"title": status, "value": status_word(message)},
                            {"title": routes, "value": message.route_count().to_string()},
                        ]},
                        {"type": "TextBlock", "text": render::fit_bytes(&r.text, MAX_TEXT_BYTES), "wrap": true},
                    ],
                    "actions": [
                        {"type": "Action.OpenUrl", "title": open, "url": oncall::link(message, ctx)},
                    ],
                },
            }],
        })
    }
}

impl Notifier for Teams {
    fn name(&self) -> &str {
        &self.name
    }

    fn options(&self) -> &ChannelOptions {
        &self.options
    }

    fn send<'a>(
        &'a self,
        message: &'a Message,
        ctx: &'a RenderCtx,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Receipt, AlertError>> {
        async move {
            let url = oncall::rebase(self.url.expose(), self.api_base.as_deref())?;
            let a = oncall::post(&self.http, &url, &self.body(message, ctx), &[]).await?;
            if a.status == 202 || a.status == 200 {
                Ok(Receipt {
                    status: a.status,
                    body: a.body,
                })
            } else {
                Err(oncall::failure(a))
            }
        }
        .boxed()
    }
}
