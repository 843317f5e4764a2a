//! Status page subscribers (`[subscriptions]`): visitors hear of public incidents by email or
//! webhook. The pure parts live here — what a subscription covers ([`Scope`]), the signed
//! links and codes ([`Keys`]), what is queued ([`Notice`]) and how it reads — and the I/O in
//! [`deliver`]: the leader's task that turns incidents into one grouped notice per subscriber
//! and sends the subscriber outbox.
//!
//! Only public incident facts leave: route, logical model, provider, state, start, end, a
//! public reason sentence (from the failure mode, never detection's numbers) and page links.
//!
//! The link key (HMAC-SHA256 over confirmation and unsubscribe links, and the webhook
//! confirmation code) is generated on first use and kept in the store (`store_meta`): every
//! member of a monitor pair must sign and check the same links, and a key from the
//! environment would be one more secret operators must set and keep equal for a feature whose
//! links are worth little to an attacker (at worst, someone else's subscription is confirmed
//! or ended).

pub mod deliver;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::lang::Lang;
use crate::route::RouteId;
use crate::state::{FailureMode, State};

/// A confirmation link stays valid this long.
pub const CONFIRM_VALID: chrono::Duration = chrono::Duration::hours(24);
/// Confirmation mails to one address a day at most.
pub const PER_ADDRESS_PER_DAY: u64 = 3;
/// Subscription attempts from one client address an hour at most.
pub const PER_IP_PER_HOUR: u64 = 10;
/// A webhook failing this long is removed.
pub const FAILING_FOR: chrono::Duration = chrono::Duration::days(3);
/// Longest email address or webhook URL accepted.
pub const MAX_TARGET: usize = 512;
/// Longest scope name (a logical model or provider id).
pub const MAX_SCOPE: usize = 200;

/// What went wrong with a subscription request or a link.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubscribeError {
    #[error("{0}")]
    Invalid(String),
    #[error("this link is not valid (it may have expired: subscribe again)")]
    BadLink,
}

/// What a subscription covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Model(String),
    Provider(String),
}

impl Scope {
    /// `*`, `model:<name>` or `provider:<id>` (how it is stored and shown).
    pub fn parse(s: &str) -> Option<Scope> {
        match s.split_once(':') {
            _ if s == "*" || s.is_empty() => Some(Scope::All),
            Some(("model", m)) if !m.is_empty() && m.len() <= MAX_SCOPE => {
                Some(Scope::Model(m.to_owned()))
            }
            Some(("provider", p)) if !p.is_empty() && p.len() <= MAX_SCOPE => {
                Some(Scope::Provider(p.to_owned()))
            }
            _ => None,
        }
    }

    pub fn as_string(&self) -> String {
        match self {
            Scope::All => "*".to_owned(),
            Scope::Model(m) => format!("model:{m}"),
            Scope::Provider(p) => format!("provider:{p}"),
        }
    }

    pub fn covers(&self, i: &PublicIncident) -> bool {
        match self {
            Scope::All => true,
            Scope::Model(m) => &i.model == m,
            Scope::Provider(p) => &i.provider == p,
        }
    }
}

/// Checks an email address's shape (the SMTP server decides the rest): bounded, one `@`,
/// no spaces or header-breaking characters.
pub fn check_address(s: &str) -> Result<(), SubscribeError> {
    let bad = || SubscribeError::Invalid("not an email address".into());
    if s.len() > MAX_TARGET
        || s.chars()
            .any(|c| c.is_whitespace() || c.is_control() || "<>,;\"".contains(c))
    {
        return Err(bad());
    }
    match s.split_once('@') {
        Some((local, domain))
            if !local.is_empty() && domain.contains('.') && !domain.contains('@') =>
        {
            s.parse::<lettre::message::Mailbox>()
                .map(|_| ())
                .map_err(|_| bad())
        }
        _ => Err(bad()),
    }
}

/// Checks a webhook URL: `https://` (or `http://`), bounded, no user info; unless
/// `allow_private`, every address its host resolves to must be public (the form is public:
/// no one may make the monitor call into its own network).
pub async fn check_webhook(url: &str, allow_private: bool) -> Result<reqwest::Url, SubscribeError> {
    let bad = |m: &str| SubscribeError::Invalid(format!("webhook URL: {m}"));
    if url.len() > MAX_TARGET {
        return Err(bad("too long"));
    }
    let u = reqwest::Url::parse(url).map_err(|_| bad("not a URL"))?;
    if !matches!(u.scheme(), "https" | "http") {
        return Err(bad("use https:// (or http://)"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad("no user or password in the URL"));
    }
    let host = u.host_str().ok_or_else(|| bad("no host"))?.to_owned();
    if allow_private {
        return Ok(u);
    }
    let port = u.port_or_known_default().unwrap_or(443);
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|_| bad("its host does not resolve"))?
        .collect();
    if addrs.is_empty() || addrs.iter().any(|a| !is_public(a.ip())) {
        return Err(bad(
            "it resolves to a loopback, private or link-local address, which is refused",
        ));
    }
    Ok(u)
}

/// Not loopback, private, link-local, unspecified, shared (CGNAT) or unique-local.
pub fn is_public(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v) => {
            let o = v.octets();
            !(v.is_loopback()
                || v.is_private()
                || v.is_link_local()
                || v.is_unspecified()
                || v.is_broadcast()
                || v.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (64..128).contains(&o[1])))
        }
        std::net::IpAddr::V6(v) => {
            if let Some(v4) = v.to_ipv4_mapped() {
                return is_public(std::net::IpAddr::V4(v4));
            }
            let s = v.segments();
            !(v.is_loopback()
                || v.is_unspecified()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80)
        }
    }
}

/// The link key and what it signs.
#[derive(Clone)]
pub struct Keys {
    key: Vec<u8>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// `sha256=<hex HMAC-SHA256 of body under secret>`: the `X-Probeok-Signature` header.
pub fn signature(secret: &str, body: &[u8]) -> String {
    format!("sha256={}", hex(&hmac(secret.as_bytes(), body)))
}

fn hmac(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    m.update(msg);
    m.finalize().into_bytes().to_vec()
}

/// A fresh random secret, 32 bytes in hex.
pub fn random_secret() -> String {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    hex(&b)
}

impl Keys {
    pub fn new(key: &str) -> Self {
        Self {
            key: key.as_bytes().to_vec(),
        }
    }

    fn mac(&self, msg: &str) -> String {
        hex(&hmac(&self.key, msg.as_bytes()))
    }

    /// `c.<id>.<expiry unix s>.<mac>`; the subscriber's secret is signed in, so a renewed
    /// subscription's earlier links stop working.
    pub fn confirm_token(&self, id: i64, secret: &str, expires: DateTime<Utc>) -> String {
        let exp = expires.timestamp();
        format!(
            "c.{id}.{exp}.{}",
            self.mac(&format!("confirm:{id}:{exp}:{secret}"))
        )
    }

    /// `u.<id>.<mac>`: valid as long as the subscription.
    pub fn unsubscribe_token(&self, id: i64, secret: &str) -> String {
        format!("u.{id}.{}", self.mac(&format!("unsubscribe:{id}:{secret}")))
    }

    /// The webhook confirmation code the receiver must echo.
    pub fn webhook_code(&self, id: i64, secret: &str) -> String {
        self.mac(&format!("code:{id}:{secret}"))[..32].to_owned()
    }

    /// The subscriber id a token names (before its row is read to [`Keys::verify`] it).
    pub fn token_id(token: &str) -> Option<i64> {
        token.split('.').nth(1)?.parse().ok()
    }

    /// Whether `token` is a valid confirmation (`confirm`) or unsubscribe token of subscriber
    /// `id` with `secret`, at `now`. Compared in constant time.
    pub fn verify(
        &self,
        token: &str,
        confirm: bool,
        id: i64,
        secret: &str,
        now: DateTime<Utc>,
    ) -> bool {
        use subtle::ConstantTimeEq;
        let want = if confirm {
            let Some(exp) = token.split('.').nth(2).and_then(|e| e.parse::<i64>().ok()) else {
                return false;
            };
            if now.timestamp() > exp {
                return false;
            }
            match DateTime::from_timestamp(exp, 0) {
                Some(e) => self.confirm_token(id, secret, e),
                None => return false,
            }
        } else {
            self.unsubscribe_token(id, secret)
        };
        token.len() == want.len() && bool::from(token.as_bytes().ct_eq(want.as_bytes()))
    }
}

/// One incident as subscribers see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublicIncident {
    pub id: String,
    pub route: RouteId,
    pub model: String,
    pub provider: String,
    pub state: State,
    pub started_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub failure_mode: Option<FailureMode>,
}

/// What the subscriber outbox holds (JSON), rendered per subscriber at send time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Notice {
    /// The confirmation mail, or the webhook's `subscription.confirm` event.
    Confirm,
    /// `incident.opened`, `incident.updated` or `incident.resolved`, for every incident of one
    /// group the subscriber's scope covers.
    Incidents {
        event: String,
        incidents: Vec<PublicIncident>,
    },
}

/// The public reason sentence of a failure mode.
pub fn reason(mode: Option<FailureMode>, lang: Lang) -> &'static str {
    match (mode, lang) {
        (Some(FailureMode::Unavailable), Lang::Zh) => "请求失败（连接错误、5xx 或超时）",
        (Some(FailureMode::Unavailable), Lang::En) => {
            "requests fail (connection errors, 5xx or timeouts)"
        }
        (Some(FailureMode::Degraded), Lang::Zh) => "响应变慢",
        (Some(FailureMode::Degraded), Lang::En) => "answers are slow",
        (Some(FailureMode::BehaviorChanged), Lang::Zh) => "回答异常",
        (Some(FailureMode::BehaviorChanged), Lang::En) => "answers are not as expected",
        (None, Lang::Zh) => "服务异常",
        (None, Lang::En) => "service disrupted",
    }
}

/// The route page of `route` under `base`.
pub fn route_url(base: &str, route: &RouteId) -> String {
    format!(
        "{base}/routes/{}",
        percent_encoding::utf8_percent_encode(route.as_str(), percent_encoding::NON_ALPHANUMERIC)
    )
}

/// A mail's subject and plain text.
pub struct Mail {
    pub subject: String,
    pub text: String,
}

/// The confirmation mail.
pub fn confirm_mail(title: &str, scope: &str, link: &str, lang: Lang) -> Mail {
    match lang {
        Lang::Zh => Mail {
            subject: format!("[{title}] 请确认订阅"),
            text: format!(
                "有人（希望是您）在 {title} 状态页订阅了故障通知（范围：{scope}）。\n\n\
                 确认订阅请打开（24 小时内有效）：\n{link}\n\n\
                 如果不是您本人，请忽略此邮件，您不会再收到任何邮件。\n"
            ),
        },
        Lang::En => Mail {
            subject: format!("[{title}] Confirm your subscription"),
            text: format!(
                "Someone (we hope you) subscribed to incident notices of the {title} status page (scope: {scope}).\n\n\
                 To confirm, open this link (valid for 24 hours):\n{link}\n\n\
                 If this was not you, ignore this mail: nothing more will be sent.\n"
            ),
        },
    }
}

/// An incident mail: one for the whole group.
pub fn incident_mail(
    title: &str,
    event: &str,
    incidents: &[PublicIncident],
    base: &str,
    unsubscribe: &str,
    lang: Lang,
) -> Mail {
    let n = incidents.len();
    let what = match (event, lang) {
        ("incident.resolved", Lang::Zh) => "已恢复",
        ("incident.updated", Lang::Zh) => "故障加重",
        (_, Lang::Zh) => "发生故障",
        ("incident.resolved", Lang::En) => "resolved",
        ("incident.updated", Lang::En) => "worse",
        (_, Lang::En) => "incident",
    };
    let head = match incidents {
        [one] => one.route.to_string(),
        _ => match lang {
            Lang::Zh => format!("{n} 条线路"),
            Lang::En => format!("{n} routes"),
        },
    };
    let mut text = String::new();
    for i in incidents {
        let end = i
            .ended_at
            .map(|e| format!(" → {}", crate::clock::rfc3339(e)))
            .unwrap_or_default();
        text.push_str(&format!(
            "{} ({}, {}): {} — {}{}\n  {}\n",
            i.route,
            i.model,
            i.state,
            reason(i.failure_mode, lang),
            crate::clock::rfc3339(i.started_at),
            end,
            route_url(base, &i.route),
        ));
    }
    let foot = match lang {
        Lang::Zh => format!("\n状态页：{base}/\n退订：{unsubscribe}\n"),
        Lang::En => format!("\nStatus page: {base}/\nUnsubscribe: {unsubscribe}\n"),
    };
    Mail {
        subject: format!("[{title}] {what}: {head}"),
        text: text + &foot,
    }
}

/// A webhook event's JSON body.
pub fn event_body(
    kind: &str,
    subscriber: i64,
    scope: &str,
    notice: &Notice,
    base: &str,
    code: Option<&str>,
    now: DateTime<Utc>,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "type": kind,
        "sent_at": crate::clock::rfc3339(now),
        "subscription": { "id": subscriber, "scope": scope },
        "page": format!("{base}/"),
    });
    if let Some(code) = code {
        v["code"] = code.into();
    }
    if let Notice::Incidents { incidents, .. } = notice {
        v["incidents"] = incidents
            .iter()
            .map(|i| {
                serde_json::json!({
                    "id": i.id,
                    "route": i.route.as_str(),
                    "model": i.model,
                    "provider": i.provider,
                    "state": i.state,
                    "started_at": crate::clock::rfc3339(i.started_at),
                    "ended_at": i.ended_at.map(crate::clock::rfc3339),
                    "reason": reason(i.failure_mode, Lang::En),
                    "url": route_url(base, &i.route),
                })
            })
            .collect();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_expire_and_bind_the_secret() {
        let k = Keys::new("k");
        let now = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let t = k.confirm_token(7, "s", now + CONFIRM_VALID);
        assert_eq!(Keys::token_id(&t), Some(7));
        assert!(k.verify(&t, true, 7, "s", now));
        assert!(!k.verify(&t, true, 7, "other", now));
        assert!(!k.verify(&t, true, 8, "s", now));
        assert!(
            !k.verify(&t, false, 7, "s", now),
            "not an unsubscribe token"
        );
        assert!(!k.verify(
            &t,
            true,
            7,
            "s",
            now + CONFIRM_VALID + chrono::Duration::seconds(1)
        ));
        let u = k.unsubscribe_token(7, "s");
        assert!(k.verify(&u, false, 7, "s", now));
        assert!(!Keys::new("other").verify(&u, false, 7, "s", now));
    }

    #[test]
    fn scopes_and_addresses() {
        assert_eq!(Scope::parse("*"), Some(Scope::All));
        assert_eq!(
            Scope::parse("model:qwen-max"),
            Some(Scope::Model("qwen-max".into()))
        );
        assert_eq!(
            Scope::parse("provider:qwen").unwrap().as_string(),
            "provider:qwen"
        );
        assert_eq!(Scope::parse("route:x"), None);
        assert!(check_address("a@example.com").is_ok());
        assert!(check_address("a@b@example.com").is_err());
        assert!(check_address("a@example.com\r\nBcc: x@y.z").is_err());
        assert!(check_address(&format!("{}@example.com", "a".repeat(600))).is_err());
        assert!(!is_public("127.0.0.1".parse().unwrap()));
        assert!(!is_public("10.1.2.3".parse().unwrap()));
        assert!(!is_public("169.254.169.254".parse().unwrap()));
        assert!(!is_public("::1".parse().unwrap()));
        assert!(!is_public("::ffff:192.168.0.1".parse().unwrap()));
        assert!(is_public("1.1.1.1".parse().unwrap()));
    }

    #[tokio::test]
    async fn private_webhooks_are_refused_unless_allowed() {
        let e = check_webhook("http://127.0.0.1:9/hook", false)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
        assert!(check_webhook("http://127.0.0.1:9/hook", true).await.is_ok());
        assert!(check_webhook("ftp://example.com/", true).await.is_err());
        assert!(check_webhook("https://u:p@example.com/", true)
            .await
            .is_err());
    }
}
