//! Telegram bot: `sendMessage` into one chat, `parse_mode = "HTML"`, every text escaped.
//!
//! Documentation: <https://core.telegram.org/bots/api#sendmessage> (the request and its
//! 1–4096 character text), <https://core.telegram.org/bots/api#html-style> (only `&`, `<`, `>`
//! need escaping, as entities), <https://core.telegram.org/bots/api#making-requests> (every
//! answer is `{"ok": …}`; a failure carries `error_code`, `description` and, for flood
//! control, `parameters.retry_after` in seconds) and
//! <https://core.telegram.org/bots/faq#my-bot-is-hitting-limits-how-do-i-avoid-this> (about 20
//! messages a minute into one group).
//!
//! Success is `ok: true`. `error_code` 429 waits `retry_after`; 400 (chat not found) and 403
//! (bot blocked or removed) are refusals kept with Telegram's `description`, not retried.
//! The token is in the request path: transport errors drop the URL, and Telegram's own
//! descriptions never echo it.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;

use super::oncall::{self, escape_html};
use super::slack::{labels, status_word};
use super::{render, AlertError, ChannelEnv, Message, Notifier, Receipt, RenderCtx};
use crate::config::{ChannelOptions, TelegramConfig};
use crate::secret::Secret;

pub const DEFAULT_API_BASE: &str = "https://api.telegram.org";
/// `sendMessage`'s text limit, after entities are parsed; the escaped text is cut below it.
pub const MAX_TEXT_CHARS: usize = 4096;
/// Telegram's advice for messages into one group.
pub const PER_MINUTE: u32 = 20;

pub struct Telegram {
    name: String,
    token: Secret,
    chat_id: String,
    api_base: String,
    options: ChannelOptions,
    http: reqwest::Client,
}

impl Telegram {
    /// The bot of an `[[alert.telegram]]` table, its token read through `env`.
    pub fn from_config(c: &TelegramConfig, env: &ChannelEnv<'_>) -> Result<Self, AlertError> {
        Ok(Self {
            token: env.secret(&c.token_env)?,
            chat_id: c.chat_id.clone(),
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

    /// The `sendMessage` parameters.
    pub fn body(&self, message: &Message, ctx: &RenderCtx) -> serde_json::Value {
        let r = render::render(message, self.options.lang, ctx);
        let (sev, status, _, open) = labels(self.options.lang);
        let link = oncall::link(message, ctx);
        let head = format!(
            "<b>{}</b>\n{sev}: {} · {status}: {}\n\n",
            escape_html(&r.title),
            message.severity.as_str(),
            status_word(message)
        );
        let tail = format!(
            "\n\n<a href=\"{}\">{}</a>",
            escape_html(&link),
            escape_html(open)
        );
        let room = MAX_TEXT_CHARS
            .saturating_sub(head.chars().count() + tail.chars().count())
            .saturating_sub(1);
        // Cut before escaping, so an entity is never split.
        let text = escape_html(&super::cut(&r.text, room / 2));
        json!({
            "chat_id": self.chat_id,
            "text": format!("{head}{text}{tail}"),
            "parse_mode": "HTML",
            "link_preview_options": {"is_disabled": true},
        })
    }
}

impl Notifier for Telegram {
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
            let url = format!("{}/bot{}/sendMessage", self.api_base, self.token.expose());
            let a = oncall::post(&self.http, &url, &self.body(message, ctx), &[]).await?;
            let v: serde_json::Value = serde_json::from_str(&a.body).unwrap_or_default();
            if a.status == 200 && v["ok"] == json!(true) {
                return Ok(Receipt {
                    status: a.status,
                    body: a.body,
                });
            }
            let code = v["error_code"]
                .as_u64()
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(a.status);
            let reason = v["description"]
                .as_str()
                .map_or_else(|| a.body.clone(), |d| super::cut(d, 300));
            Err(oncall::failure(oncall::Answer {
                status: code,
                body: reason,
                retry_after_s: v["parameters"]["retry_after"].as_u64().or(a.retry_after_s),
            }))
        }
        .boxed()
    }
}
