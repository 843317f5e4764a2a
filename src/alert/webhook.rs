//! Generic webhook: the message as a JSON event, `X-Probeok-Signature: sha256=<hex HMAC of the
//! body>` when a secret is set, `X-Probeok-Delivery: <dedup key>` so a receiver can drop the
//! rare repeat (delivery is at least once). Success is any 2xx.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;

use super::{
    cut, hmac_sha256, post_json, render, AlertError, ChannelEnv, Message, Notifier, Receipt,
    RenderCtx,
};
use crate::config::{ChannelOptions, WebhookConfig};
use crate::secret::Secret;

/// `sha256=<lowercase hex>` of the HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mac = hmac_sha256(secret.as_bytes(), body);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for b in mac {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

pub struct Webhook {
    name: String,
    url: Secret,
    secret: Option<Secret>,
    options: ChannelOptions,
    http: reqwest::Client,
    max_per_minute: Option<u32>,
}

impl Webhook {
    /// The receiver of an `[[alert.webhook]]` table, its URL and secret read through `env`.
    pub fn from_config(c: &WebhookConfig, env: &ChannelEnv<'_>) -> Result<Self, AlertError> {
        Ok(Self {
            url: env.secret(&c.url_env)?,
            secret: env.secret_opt(c.secret_env.as_ref())?,
            options: c.options.clone(),
            http: env.http.clone(),
            name: env.name.clone(),
            max_per_minute: c.max_per_minute,
        })
    }
}

/// The event a webhook receives: the message model plus its rendered title and text.
pub fn event(message: &Message, ctx: &RenderCtx, lang: super::Lang) -> serde_json::Value {
    let r = render::render(message, lang, ctx);
    json!({
        "version": 1,
        "key": message.key,
        "status": message.status,
        "severity": message.severity,
        "subject": message.subject,
        "at": message.at,
        "title": r.title,
        "text": r.text,
        "routes": message.items,
        "note": message.note,
        "links": message.items.iter().map(|i| render::route_url(ctx, &i.route)).collect::<Vec<_>>(),
    })
}

impl Notifier for Webhook {
    fn name(&self) -> &str {
        &self.name
    }

    fn options(&self) -> &ChannelOptions {
        &self.options
    }

    /// `max_per_minute`: a receiver's own limit, declared in the config.
    fn per_minute(&self) -> Option<u32> {
        self.max_per_minute
    }

    fn send<'a>(
        &'a self,
        message: &'a Message,
        ctx: &'a RenderCtx,
        _now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Receipt, AlertError>> {
        async move {
            let body = serde_json::to_vec(&event(message, ctx, self.options.lang))
                .map_err(|e| AlertError::Config(e.to_string()))?;
            let mut headers = vec![("x-probeok-delivery", message.key.clone())];
            if let Some(s) = &self.secret {
                headers.push(("x-probeok-signature", signature(s.expose(), &body)));
            }
            let (status, text) = post_json(&self.http, self.url.expose(), body, &headers).await?;
            if (200..300).contains(&status) {
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
    fn signature_is_hex_hmac() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
