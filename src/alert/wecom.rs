//! WeCom (企业微信) group robot: a markdown message, and the mention as its own short `text`
//! message.
//!
//! The URL carries the robot's key (`…/cgi-bin/webhook/send?key=…`); there is no signing.
//! Success is `errcode == 0` in the answer — WeCom answers HTTP 200 for failures too; `45009`
//! ("api freq out of limit": a robot takes 20 messages a minute) is retried no sooner than a
//! minute later. Markdown content is at most 4,096 bytes, text content 2,048.
//!
//! WeCom's markdown messages ignore `mentioned_list` / `mentioned_mobile_list`, so user ids
//! are mentioned inside the markdown as `<@userid>`, and phone numbers (or everyone) by a
//! second, `text` message that carries `mentioned_mobile_list` / `mentioned_list: ["@all"]`.
//! That second message is its own outbox row (`…#mention`, after the markdown's), so a retry
//! of one never repeats the other.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;

use super::{
    cut, post_json, render, routing, AlertError, ChannelEnv, Message, Notifier, Receipt, RenderCtx,
};
use crate::config::{ChannelOptions, Mention, WecomConfig};
use crate::secret::Secret;

/// WeCom's documented limit per robot.
pub const PER_MINUTE: u32 = 20;
/// Markdown `content` limit, in UTF-8 bytes.
pub const MAX_MARKDOWN_BYTES: usize = 4096;
/// Text `content` limit, in UTF-8 bytes.
pub const MAX_TEXT_BYTES: usize = 2048;
/// WeCom's "api freq out of limit".
pub const ERRCODE_TOO_MANY: i64 = 45009;
/// How long to wait after a 45009: the robot's per-minute window.
pub const THROTTLE_PAUSE_S: u64 = 60;

pub struct Wecom {
    name: String,
    url: Secret,
    mention: Option<Mention>,
    options: ChannelOptions,
    http: reqwest::Client,
}

impl Wecom {
    /// The robot of an `[[alert.wecom]]` table, its URL read through `env`.
    pub fn from_config(c: &WecomConfig, env: &ChannelEnv<'_>) -> Result<Self, AlertError> {
        Ok(Self {
            url: env.secret(&c.webhook_env)?,
            mention: c.mention.clone(),
            options: c.options.clone(),
            http: env.http.clone(),
            name: env.name.clone(),
        })
    }

    /// The markdown message, with `<@userid>` mentions at the end (never cut by the limit).
    pub fn markdown(&self, message: &Message, ctx: &RenderCtx) -> serde_json::Value {
        let r = render::render(message, self.options.lang, ctx);
        let ats = routing::mention_for(self.mention.as_ref(), message)
            .map(|m| {
                m.user_ids
                    .iter()
                    .map(|id| format!("<@{id}>"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .filter(|s| !s.is_empty())
            .map(|s| format!("\n\n{s}"))
            .unwrap_or_default();
        let content = render::fit_bytes(&r.markdown, MAX_MARKDOWN_BYTES.saturating_sub(ats.len()));
        json!({"msgtype": "markdown", "markdown": {"content": format!("{content}{ats}")}})
    }

    /// The text message that mentions phone numbers (and everyone), or `None` when the
    /// mention has none of those.
    pub fn mention_text(&self, message: &Message, ctx: &RenderCtx) -> Option<serde_json::Value> {
        let m = routing::mention_for(self.mention.as_ref(), message)?;
        if m.mobiles.is_empty() && !m.all {
            return None;
        }
        let mut mobiles = m.mobiles.clone();
        let mut users = Vec::new();
        if m.all {
            mobiles.push("@all".into());
            users.push("@all".to_owned());
        }
        let r = render::render(message, self.options.lang, ctx);
        Some(json!({
            "msgtype": "text",
            "text": {
                "content": render::fit_bytes(&r.title, MAX_TEXT_BYTES),
                "mentioned_list": users,
                "mentioned_mobile_list": mobiles,
            },
        }))
    }

    async fn post(&self, body: serde_json::Value) -> Result<Receipt, AlertError> {
        let body = serde_json::to_vec(&body).map_err(|e| AlertError::Config(e.to_string()))?;
        let (status, text) = post_json(&self.http, self.url.expose(), body, &[]).await?;
        let errcode = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("errcode").and_then(serde_json::Value::as_i64));
        match errcode {
            Some(0) if status == 200 => Ok(Receipt { status, body: text }),
            Some(ERRCODE_TOO_MANY) => Err(AlertError::Throttled {
                status,
                body: cut(&text, 300),
                retry_after_s: THROTTLE_PAUSE_S,
            }),
            _ => Err(AlertError::Rejected {
                status,
                body: cut(&text, 300),
            }),
        }
    }
}

impl Notifier for Wecom {
    fn name(&self) -> &str {
        &self.name
    }

    fn options(&self) -> &ChannelOptions {
        &self.options
    }

    fn per_minute(&self) -> Option<u32> {
        Some(PER_MINUTE)
    }

    fn mention_part(&self, message: &Message) -> bool {
        routing::mention_for(self.mention.as_ref(), message)
            .is_some_and(|m| !m.mobiles.is_empty() || m.all)
    }

    fn send<'a>(
        &'a self,
        message: &'a Message,
        ctx: &'a RenderCtx,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Receipt, AlertError>> {
        async move { self.post(self.markdown(message, ctx)).await }.boxed()
    }

    fn send_mention<'a>(
        &'a self,
        message: &'a Message,
        ctx: &'a RenderCtx,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Receipt, AlertError>> {
        async move {
            match self.mention_text(message, ctx) {
                Some(body) => self.post(body).await,
                // The mention no longer applies (config reloaded): nothing to send.
                None => Ok(Receipt {
                    status: 0,
                    body: "no mention".into(),
                }),
            }
        }
        .boxed()
    }
}
