//! Email through `lettre` (SMTP on tokio with rustls): plain text and HTML parts, subject
//! `[probeok][CRITICAL] qwen/cn-beijing/qwen-max unavailable`.
//!
//! The SMTP URL comes from an environment variable and decides the transport:
//! `smtps://user:pass@host[:465]` (TLS from the first byte), `smtp://…?tls=required`
//! (STARTTLS, refused if the server does not offer it), plain `smtp://` only to a loopback
//! host (a local relay). Credentials are taken from the URL's user info, percent-decoded.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use lettre::message::{header::ContentType, Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use super::{cut, render, AlertError, ChannelEnv, Message, Notifier, Receipt, RenderCtx};
use crate::config::{ChannelOptions, EmailConfig};

/// How an SMTP URL is to be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Security {
    /// `smtps://`
    Tls,
    /// `smtp://…?tls=required`
    StartTls,
    /// `smtp://` to a loopback host.
    Plain,
}

/// The parts of an SMTP URL. `Debug` leaves out the password.
#[derive(Clone, PartialEq, Eq)]
pub struct SmtpTarget {
    pub security: Security,
    pub host: String,
    pub port: u16,
    pub user: Option<String>,
    password: Option<String>,
}

impl std::fmt::Debug for SmtpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpTarget")
            .field("security", &self.security)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Parses an SMTP URL (the forms docs/configuration.md lists). Errors never echo the URL (it holds a password).
pub fn parse_smtp_url(s: &str) -> Result<SmtpTarget, String> {
    let url = reqwest::Url::parse(s).map_err(|e| format!("not a URL ({e})"))?;
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or("no host")?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let tls = url
        .query_pairs()
        .find(|(k, _)| k == "tls")
        .map(|(_, v)| v.into_owned());
    let security = match (url.scheme(), tls.as_deref()) {
        ("smtps", None | Some("required") | Some("wrapper")) => Security::Tls,
        ("smtp", Some("required")) => Security::StartTls,
        ("smtp", None | Some("none")) => {
            let loopback = host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if !loopback {
                return Err(format!(
                    "plain smtp:// only to a loopback host; use smtps:// or smtp://…?tls=required for {host}"
                ));
            }
            Security::Plain
        }
        (scheme @ ("smtp" | "smtps"), Some(other)) => {
            return Err(format!(
                "{scheme}:// with unknown tls={other} (use tls=required)"
            ));
        }
        (scheme, _) => return Err(format!("scheme {scheme}: expected smtps:// or smtp://")),
    };
    let port = url.port().unwrap_or(match security {
        Security::Tls => 465,
        Security::StartTls => 587,
        Security::Plain => 25,
    });
    let decode = |v: &str| {
        percent_encoding::percent_decode_str(v)
            .decode_utf8_lossy()
            .into_owned()
    };
    let user = (!url.username().is_empty()).then(|| decode(url.username()));
    let password = url.password().map(decode);
    Ok(SmtpTarget {
        security,
        host,
        port,
        user,
        password,
    })
}

pub struct Email {
    name: String,
    from: Mailbox,
    to: Vec<Mailbox>,
    options: ChannelOptions,
    transport: AsyncSmtpTransport<Tokio1Executor>,
}

impl Email {
    /// The mailer of an `[[alert.email]]` table, its SMTP URL read through `env`.
    pub fn from_config(c: &EmailConfig, env: &ChannelEnv<'_>) -> Result<Self, AlertError> {
        let name = env.name.clone();
        let url = env.secret(&c.smtp_url_env)?;
        let target = parse_smtp_url(url.expose())
            .map_err(|e| AlertError::Config(format!("{name}: {}: {e}", c.smtp_url_env)))?;
        Self::build(name, &target, &c.from, &c.to, c.options.clone())
    }

    fn build(
        name: String,
        target: &SmtpTarget,
        from: &str,
        to: &[String],
        options: ChannelOptions,
    ) -> Result<Self, AlertError> {
        let mailbox = |s: &str| {
            s.parse::<Mailbox>()
                .map_err(|e| AlertError::Config(format!("{name}: address {s:?}: {e}")))
        };
        let from = mailbox(from)?;
        let to = to
            .iter()
            .map(|t| mailbox(t))
            .collect::<Result<Vec<_>, _>>()?;
        let transport = transport(&name, target)?;
        Ok(Self {
            name,
            from,
            to,
            options,
            transport,
        })
    }
}

/// The SMTP transport for `target` (`name` labels errors): also how subscriber mail is sent.
pub fn transport(
    name: &str,
    target: &SmtpTarget,
) -> Result<AsyncSmtpTransport<Tokio1Executor>, AlertError> {
    let tls_err =
        |e: lettre::transport::smtp::Error| AlertError::Config(format!("{name}: TLS setup: {e}"));
    let mut builder = match target.security {
        Security::Tls => {
            AsyncSmtpTransport::<Tokio1Executor>::relay(&target.host).map_err(tls_err)?
        }
        Security::StartTls => {
            AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(&target.host).map_err(tls_err)?
        }
        Security::Plain => AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&target.host),
    };
    builder = builder
        .port(target.port)
        .timeout(Some(std::time::Duration::from_secs(15)));
    if let (Some(u), Some(p)) = (&target.user, &target.password) {
        builder = builder.credentials(Credentials::new(u.clone(), p.clone()));
    }
    Ok(builder.build())
}

/// A send's SMTP answer as a receipt, or its failure.
pub fn receipt(
    sent: Result<lettre::transport::smtp::response::Response, lettre::transport::smtp::Error>,
) -> Result<Receipt, AlertError> {
    match sent {
        Ok(resp) => Ok(Receipt {
            status: u16::from(resp.code()),
            body: cut(&resp.message().collect::<Vec<_>>().join(" "), 300),
        }),
        Err(e) => match e.status() {
            Some(code) => Err(AlertError::Rejected {
                status: u16::from(code),
                body: cut(&e.to_string(), 300),
            }),
            None => Err(AlertError::Transport(cut(&e.to_string(), 300))),
        },
    }
}

impl Notifier for Email {
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
            let r = render::render(message, self.options.lang, ctx);
            let mut b = lettre::Message::builder()
                .from(self.from.clone())
                .subject(r.subject.clone())
                .header(lettre::message::header::MessageId::from(format!(
                    "<{}@probeok>",
                    render::key_digest(&message.key)
                )));
            for to in &self.to {
                b = b.to(to.clone());
            }
            let email = b
                .multipart(
                    MultiPart::alternative()
                        .singlepart(
                            SinglePart::builder()
                                .header(ContentType::TEXT_PLAIN)
                                .body(r.text.clone()),
                        )
                        .singlepart(
                            SinglePart::builder()
                                .header(ContentType::TEXT_HTML)
                                .body(r.html.clone()),
                        ),
                )
                .map_err(|e| AlertError::Config(format!("{}: {e}", self.name)))?;
            receipt(self.transport.send(email).await)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smtp_urls_per_spec() {
        let t = parse_smtp_url("smtps://u%40x:p%2Fw@mail.example.com").unwrap();
        assert_eq!(t.security, Security::Tls);
        assert_eq!(t.port, 465);
        assert_eq!(t.user.as_deref(), Some("u@x"));
        assert_eq!(t.password.as_deref(), Some("p/w"));
        assert!(!format!("{t:?}").contains("p/w"));
        let t = parse_smtp_url("smtp://mail.example.com:2525?tls=required").unwrap();
        assert_eq!((t.security, t.port), (Security::StartTls, 2525));
        let t = parse_smtp_url("smtp://127.0.0.1:2525").unwrap();
        assert_eq!(t.security, Security::Plain);
        let e = parse_smtp_url("smtp://user:hunter2@mail.example.com").unwrap_err();
        assert!(e.contains("loopback") && !e.contains("hunter2"), "{e}");
        assert!(parse_smtp_url("http://x").is_err());
        assert!(parse_smtp_url("smtp://x?tls=maybe").is_err());
    }
}
