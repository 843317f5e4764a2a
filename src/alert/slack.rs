//! Slack incoming webhook: a Block Kit message (header, fields, the text, a link button) with
//! the plain `text` as the notification fallback.
//!
//! Documentation: <https://api.slack.com/messaging/webhooks> (request, `ok` answer and the
//! error strings `invalid_payload`, `channel_not_found`, `channel_is_archived`,
//! `action_prohibited`, `no_text`), <https://api.slack.com/reference/block-kit/blocks>
//! (a `section` text holds at most 3,000 characters, a `header` 150, at most 50 blocks) and
//! <https://api.slack.com/docs/rate-limits> (about one message a second per webhook; 429 with
//! `Retry-After` in seconds).
//!
//! Success is HTTP 200 (body `ok`). A 4xx other than 429 is Slack refusing the message for
//! good: recorded with Slack's reason and not retried.
//!
//! Mentions (`mention.user_ids`): a member id `U…`/`W…` becomes `<@U…>`, a user-group id
//! `S…` `<!subteam^S…>`, `all = true` `<!here>`, in the fallback text and the first section.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;

use super::oncall::{self, escape_html};
use super::{render, AlertError, ChannelEnv, Message, Notifier, Receipt, RenderCtx};
use crate::config::{ChannelOptions, ChatWebhookConfig, Mention};
use crate::secret::Secret;

/// Block Kit's limit on a section's text.
pub const MAX_SECTION_CHARS: usize = 3000;
/// Block Kit's limit on a header's plain text.
pub const MAX_HEADER_CHARS: usize = 150;
/// Slack's fallback `text` is truncated past 40,000 characters; stay well under.
pub const MAX_TEXT_CHARS: usize = 4000;
/// About one message a second per incoming webhook.
pub const PER_MINUTE: u32 = 60;

pub struct Slack {
    name: String,
    url: Secret,
    api_base: Option<String>,
    mention: Option<Mention>,
    options: ChannelOptions,
    http: reqwest::Client,
}

impl Slack {
    /// The webhook of an `[[alert.slack]]` table, its URL read through `env`.
    pub fn from_config(c: &ChatWebhookConfig, env: &ChannelEnv<'_>) -> Result<Self, AlertError> {
        Ok(Self {
            url: env.secret(&c.webhook_env)?,
            api_base: c.api_base.clone(),
            mention: c.mention.clone(),
            options: c.options.clone(),
            http: env.http.clone(),
            name: env.name.clone(),
        })
    }

    /// The mention line (`<@U1> <!subteam^S1> <!here>`) when the message calls for one.
    fn mention_line(&self, message: &Message) -> Option<String> {
        let m = super::routing::mention_for(self.mention.as_ref(), message)?;
        let mut parts: Vec<String> = m
            .user_ids
            .iter()
            .map(|id| {
                if id.starts_with('S') {
                    format!("<!subteam^{id}>")
                } else {
                    format!("<@{id}>")
                }
            })
            .collect();
        if m.all {
            parts.push("<!here>".into());
        }
        (!parts.is_empty()).then(|| parts.join(" "))
    }

    /// The request body: `text` (the notification fallback) and `blocks`.
    pub fn body(&self, message: &Message, ctx: &RenderCtx) -> serde_json::Value {
        let r = render::render(message, self.options.lang, ctx);
        let link = oncall::link(message, ctx);
        let mention = self.mention_line(message);
        let prefix = mention
            .as_ref()
            .map(|m| format!("{m}\n"))
            .unwrap_or_default();
        let text = super::cut(
            &format!("{prefix}{}", escape_html(&r.text)),
            MAX_SECTION_CHARS - 1,
        );
        let fallback = super::cut(
            &format!("{prefix}{}", escape_html(&r.title)),
            MAX_TEXT_CHARS,
        );
        let (sev, status, routes, open) = labels(self.options.lang);
        json!({
            "text": fallback,
            "blocks": [
                {"type": "header", "text": {"type": "plain_text", "text": super::cut(&r.title, MAX_HEADER_CHARS - 1), "emoji": true}},
                {"type": "section", "fields": [
                    {"type": "mrkdwn", "text": format!("*{sev}*\n{}", message.severity.as_str())},
                    {"type": "mrkdwn", "text": format!("*{status}*\n{}", status_word(message))},
                    {"type": "mrkdwn", "text": format!("*{routes}*\n{}", message.route_count())},
                ]},
                {"type": "section", "text": {"type": "mrkdwn", "text": text}},
                {"type": "actions", "elements": [
                    {"type": "button", "text": {"type": "plain_text", "text": open}, "url": link},
                ]},
            ],
        })
    }
}

/// `firing`, `resolved`, `reminder`, `test`.
pub(crate) fn status_word(m: &Message) -> &'static str {
    match m.status {
        super::Status::Firing => "firing",
        super::Status::Resolved => "resolved",
        super::Status::Reminder => "reminder",
        super::Status::Test => "test",
    }
}

/// Field labels and the link's title in the channel's language.
pub(crate) fn labels(
    lang: super::Lang,
) -> (&'static str, &'static str, &'static str, &'static str) {
    match lang {
        super::Lang::Zh => ("级别", "状态", "线路数", "打开线路页"),
        super::Lang::En => ("Severity", "Status", "Routes", "Open route page"),
    }
}

impl Notifier for Slack {
    fn name(&self) -> &str {
        &self.name
    }

    fn options(&self) -> &ChannelOptions {
        &self.options
    }

    fn per_minute(&self) -> Option<u32> {
        Some(PER_MINUTE)
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
            if a.status == 200 {
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
