//! DingTalk custom robot: a markdown message, signed at send time when a secret is set.
//!
//! Signature: `ts` = epoch milliseconds, `string_to_sign = ts + "\n" + secret`, HMAC-SHA256
//! keyed with the secret, Base64, URL-encoded, appended as `&timestamp=<ts>&sign=<sign>`.
//! DingTalk rejects signatures older than an hour, so a retry is signed afresh. Success is
//! HTTP 200 **and** `errcode == 0`: DingTalk answers 200 with `errcode 310000` for a bad
//! signature, missing keywords and the like. A robot takes about 20 messages a minute.
//!
//! Mentions: `at.atMobiles` / `atUserIds` / `isAtAll`, and every number and id also written in
//! the text as `@…` — DingTalk only highlights the ones the text names.

use base64::Engine as _;
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;

use super::{
    cut, hmac_sha256, post_json, render, AlertError, ChannelEnv, Message, Notifier, Receipt,
    RenderCtx,
};
use crate::config::{ChannelOptions, Mention, RobotConfig};
use crate::secret::Secret;

/// DingTalk's documented limit per robot.
pub const PER_MINUTE: u32 = 20;
/// DingTalk's markdown text limit is about 20 000 bytes; stay under it.
pub const MAX_TEXT_BYTES: usize = 18_000;

/// `(timestamp, sign)` as they go into the URL: the sign Base64 and URL-encoded.
pub fn sign(ts_ms: i64, secret: &str) -> (String, String) {
    let ts = ts_ms.to_string();
    let to_sign = format!("{ts}\n{secret}");
    let mac = hmac_sha256(secret.as_bytes(), to_sign.as_bytes());
    let b64 = base64::engine::general_purpose::STANDARD.encode(mac);
    let encoded =
        percent_encoding::utf8_percent_encode(&b64, percent_encoding::NON_ALPHANUMERIC).to_string();
    (ts, encoded)
}

pub struct DingTalk {
    name: String,
    mention: Option<Mention>,
    url: Secret,
    secret: Option<Secret>,
    options: ChannelOptions,
    http: reqwest::Client,
}

impl DingTalk {
    /// The robot of an `[[alert.dingtalk]]` table, its URL and secret read through `env`.
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

    fn url_at(&self, now: DateTime<Utc>) -> String {
        let base = self.url.expose();
        match &self.secret {
            None => base.to_owned(),
            Some(s) => {
                let (ts, sign) = sign(now.timestamp_millis(), s.expose());
                let sep = if base.contains('?') { '&' } else { '?' };
                format!("{base}{sep}timestamp={ts}&sign={sign}")
            }
        }
    }
}

impl DingTalk {
    /// The request body: markdown, with the `at` object and the mentioned numbers and ids in
    /// the text when the message calls for a mention (DingTalk highlights only what the text
    /// names, and the mention line is never cut by the size limit).
    pub fn body(&self, message: &Message, ctx: &RenderCtx) -> serde_json::Value {
        let r = render::render(message, self.options.lang, ctx);
        let Some(m) = super::routing::mention_for(self.mention.as_ref(), message) else {
            let text = render::fit_bytes(&r.markdown, MAX_TEXT_BYTES);
            return json!({
                "msgtype": "markdown",
                "markdown": {"title": r.title, "text": text},
            });
        };
        let line = m
            .mobiles
            .iter()
            .chain(m.user_ids.iter())
            .map(|x| format!("@{x}"))
            .collect::<Vec<_>>()
            .join(" ");
        let suffix = if line.is_empty() {
            String::new()
        } else {
            format!("\n\n{line}")
        };
        let text = render::fit_bytes(&r.markdown, MAX_TEXT_BYTES.saturating_sub(suffix.len()));
        json!({
            "msgtype": "markdown",
            "markdown": {"title": r.title, "text": format!("{text}{suffix}")},
            "at": {"atMobiles": m.mobiles, "atUserIds": m.user_ids, "isAtAll": m.all},
        })
    }
}

impl Notifier for DingTalk {
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
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Receipt, AlertError>> {
        async move {
            let body = self.body(message, ctx);
            let body = serde_json::to_vec(&body).map_err(|e| AlertError::Config(e.to_string()))?;
            let (status, text) = post_json(&self.http, &self.url_at(now), body, &[]).await?;
            let errcode = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("errcode").and_then(serde_json::Value::as_i64));
            if status == 200 && errcode == Some(0) {
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
        let (ts, sign) = sign(1_700_000_000_000, "SECtest");
        assert_eq!(ts, "1700000000000");
        assert_eq!(sign, "aZLLrriXgn05YbwaGR7knYsLeJADjr9NwLaNNKpxh4g%3D");
    }
}
