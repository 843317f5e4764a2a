//! Feishu/Lark custom bot: an interactive card, signed at send time when a secret is set.
//!
//! Signature: `ts` = epoch **seconds**; HMAC-SHA256 with the **key** `ts + "\n" + secret`
//! over an **empty** message; Base64 (not URL-encoded); sent in the JSON body as
//! `"timestamp": "<ts>"` and `"sign"`. Success is `code == 0` (older bots: `StatusCode == 0`)
//! — Feishu answers HTTP 200 for failures too. The body must stay under 20 KB.
//!
//! Mentions go into the card's markdown as `<at id=…></at>` (`id=all` for everyone): a custom
//! bot mentions by user id (open_id `ou_…` or user_id), not by phone number.

use base64::Engine as _;
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;

use super::{
    cut, hmac_sha256, post_json, render, AlertError, ChannelEnv, Message, Notifier, Receipt,
    RenderCtx, Severity, Status,
};
use crate::config::{ChannelOptions, Mention, RobotConfig};
use crate::secret::Secret;

/// Feishu refuses request bodies over 20 KB; the text is cut to leave room for the card.
pub const MAX_BODY_BYTES: usize = 20 * 1024;
const MAX_TEXT_BYTES: usize = 18 * 1024;

/// `(timestamp, sign)` as they go into the body.
pub fn sign(ts_s: i64, secret: &str) -> (String, String) {
    let ts = ts_s.to_string();
    let key = format!("{ts}\n{secret}");
    let mac = hmac_sha256(key.as_bytes(), b"");
    (ts, base64::engine::general_purpose::STANDARD.encode(mac))
}

pub struct Feishu {
    name: String,
    mention: Option<Mention>,
    url: Secret,
    secret: Option<Secret>,
    options: ChannelOptions,
    http: reqwest::Client,
}

impl Feishu {
    /// The bot of an `[[alert.feishu]]` table, its URL and secret read through `env`.
    pub fn from_config(c: &RobotConfig, env: &ChannelEnv<'_>) -> Result<Self, AlertError> {
        Ok(Self {
            url: env.secret(&c.webhook_env)?,
            secret: env.secret_opt(c.secret_env.as_ref())?,
            options: c.options.clone(),
            mention: c.mention.clone(),
            http: env.http.clone(),
            name: env.name.clone(),
        })
    }

    /// The request body for `message`, signed for `now`.
    pub fn body(
        &self,
        message: &Message,
        ctx: &RenderCtx,
        now: DateTime<Utc>,
    ) -> serde_json::Value {
        let r = render::render(message, self.options.lang, ctx);
        // Card markdown mentions: `<at id=ou_…></at>`, `<at id=all></at>`; never cut by the limit.
        let mention = super::routing::mention_for(self.mention.as_ref(), message)
            .map(|m| {
                let mut ats: Vec<String> = m
                    .user_ids
                    .iter()
                    .map(|id| format!("<at id={id}></at>"))
                    .collect();
                if m.all {
                    ats.push("<at id=all></at>".into());
                }
                ats.join(" ")
            })
            .filter(|s| !s.is_empty())
            .map(|s| format!("\n\n{s}"))
            .unwrap_or_default();
        let content = format!(
            "{}{mention}",
            render::fit_bytes(&r.markdown, MAX_TEXT_BYTES.saturating_sub(mention.len()))
        );
        let template = match (message.status, message.severity) {
            (Status::Resolved, _) => "green",
            (Status::Test, _) => "blue",
            (_, Severity::Critical) => "red",
            (_, Severity::Warning) => "orange",
            (_, Severity::Info) => "yellow",
        };
        let mut body = json!({
            "msg_type": "interactive",
            "card": {
                "config": {"wide_screen_mode": true},
                "header": {
                    "title": {"tag": "plain_text", "content": r.title},
                    "template": template,
                },
                "elements": [{
                    "tag": "div",
                    "text": {"tag": "lark_md", "content": content},
                }],
            },
        });
        if let (Some(secret), Some(obj)) = (&self.secret, body.as_object_mut()) {
            let (ts, sign) = sign(now.timestamp(), secret.expose());
            obj.insert("timestamp".into(), json!(ts));
            obj.insert("sign".into(), json!(sign));
        }
        body
    }
}

impl Notifier for Feishu {
    fn name(&self) -> &str {
        &self.name
    }

    fn options(&self) -> &ChannelOptions {
        &self.options
    }

    /// A custom bot takes 100 messages a minute and 5 a second.
    fn per_minute(&self) -> Option<u32> {
        Some(100)
    }

    fn per_second(&self) -> Option<u32> {
        Some(5)
    }

    fn send<'a>(
        &'a self,
        message: &'a Message,
        ctx: &'a RenderCtx,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Receipt, AlertError>> {
        async move {
            let body = serde_json::to_vec(&self.body(message, ctx, now))
                .map_err(|e| AlertError::Config(e.to_string()))?;
            if body.len() > MAX_BODY_BYTES {
                return Err(AlertError::Config(format!(
                    "message body {} bytes exceeds Feishu's 20 KB",
                    body.len()
                )));
            }
            let (status, text) = post_json(&self.http, self.url.expose(), body, &[]).await?;
            let v = serde_json::from_str::<serde_json::Value>(&text).ok();
            let code = v.as_ref().and_then(|v| {
                v.get("code")
                    .or_else(|| v.get("StatusCode"))
                    .and_then(serde_json::Value::as_i64)
            });
            if (200..300).contains(&status) && code == Some(0) {
                Ok(Receipt { status, body: text })
            } else {
                Err(AlertError::Rejected {
                    status,
                    body: cut(&text, 300),
                })
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signer_matches_the_issue_vector() {
        let (ts, sign) = sign(1_599_360_473, "this is secret");
        assert_eq!(ts, "1599360473");
        assert_eq!(sign, "/eYKrXQBzTjUZJ3s6NX16VxGbTwmK7AEs8/FnvC1CSw=");
        // The common mistake (key = secret) gives the issue's other value.
        assert_ne!(sign, "Aa897dtSTyHzD0ZCF2+ph58VjSQ6lUYLT11QvLTQCnU=");
    }
}
