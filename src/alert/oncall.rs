//! What the on-call channels ([`super::slack`], [`super::teams`], [`super::telegram`],
//! [`super::pagerduty`], [`super::opsgenie`]) share: posting with the receiver's
//! `Retry-After`, the `api_base` override, the link a message carries, the incident key an
//! incident tool deduplicates on, and how an HTTP status maps to retry or refusal.

use super::{cut, render, AlertError, Message, RenderCtx, Status, Subject};

/// Most characters of a receiver's answer kept in an error.
const MAX_REASON: usize = 300;
/// A `Retry-After` beyond this is capped: the outbox's own maximum age bounds the wait anyway.
const MAX_RETRY_AFTER_S: u64 = 3600;

/// A receiver's answer: status, body (cut), and the wait it asked for, if any.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: String,
    pub retry_after_s: Option<u64>,
}

/// POSTs `body` as JSON to `url` with `headers`. Transport errors lose their URL (it may hold
/// the secret); the answer body is bounded.
pub async fn post(
    http: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
    headers: &[(&str, String)],
) -> Result<Answer, AlertError> {
    let bytes = serde_json::to_vec(body).map_err(|e| AlertError::Config(e.to_string()))?;
    let mut req = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(bytes);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| AlertError::Transport(e.without_url().to_string()))?;
    let status = resp.status().as_u16();
    let retry_after_s = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| s.min(MAX_RETRY_AFTER_S));
    let text = read_bounded(resp).await?;
    Ok(Answer {
        status,
        body: cut(&text, MAX_REASON),
        retry_after_s,
    })
}

/// At most 64 KiB of an answer body: a receiver cannot make us buffer without bound.
async fn read_bounded(mut resp: reqwest::Response) -> Result<String, AlertError> {
    const MAX: usize = 64 * 1024;
    let mut buf = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| AlertError::Transport(e.without_url().to_string()))?
    {
        let room = MAX.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if buf.len() >= MAX {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The usual reading of a non-success status: 429 → throttled (the asked wait, else the
/// outbox's backoff); 408 and 5xx → retried; any other 4xx → refused, with the body as the
/// reason.
pub fn failure(a: Answer) -> AlertError {
    match a.status {
        429 => AlertError::Throttled {
            status: a.status,
            body: a.body,
            retry_after_s: a.retry_after_s.unwrap_or(0),
        },
        400..=499 if a.status != 408 => AlertError::Refused {
            status: a.status,
            body: a.body,
        },
        _ => AlertError::Rejected {
            status: a.status,
            body: a.body,
        },
    }
}

/// `url` sent to `base` instead: `base`'s scheme, host and port (and path prefix), `url`'s
/// path and query. `None` keeps `url`.
pub fn rebase(url: &str, base: Option<&str>) -> Result<String, AlertError> {
    let Some(base) = base else {
        return Ok(url.to_owned());
    };
    let parsed = reqwest::Url::parse(url)
        .map_err(|_| AlertError::Config("the webhook URL is not a valid URL".into()))?;
    let mut out = base.trim_end_matches('/').to_owned();
    out.push_str(parsed.path());
    if let Some(q) = parsed.query() {
        out.push('?');
        out.push_str(q);
    }
    Ok(out)
}

/// The page a message links to: its first route's page, else the status page.
pub fn link(m: &Message, ctx: &RenderCtx) -> String {
    m.items
        .iter()
        .map(|i| &i.route)
        .chain(m.related.iter())
        .next()
        .map_or_else(
            || format!("{}/", ctx.public_url),
            |r| render::route_url(ctx, r),
        )
}

/// The keys a resolution resolves at an incident tool: those the engine worked out from the
/// triggers it stands for ([`Message::resolves`]), else the message's own key (egress,
/// heartbeats, burn rate, and rows written before the engine worked them out).
pub fn resolved_keys(m: &Message) -> Vec<String> {
    m.resolves.clone().unwrap_or_else(|| vec![incident_key(m)])
}

/// The key an incident tool deduplicates on (PagerDuty `dedup_key`, Opsgenie `alias`): the
/// same for a message that fires and the one that resolves it, read from the message the
/// outbox stored (so a restart or another monitor of the pair sends the same key).
///
/// - route messages: the incident's id;
/// - a provider's grouped routes: the provider and its earliest-opened incident (the firing
///   message and the resolution of the whole group name the same one);
/// - anything else: its message key without the firing/resolved tag and time
///   (`burn:<route>`, `egress`, `heartbeat:<job>`).
///
/// Hashed to 32 hex characters under a readable prefix: PagerDuty takes 255 characters,
/// Opsgenie 512.
pub fn incident_key(m: &Message) -> String {
    let first = m
        .items
        .iter()
        .filter_map(|i| Some((i.opened_at?, i.incident_id.as_deref()?)))
        .min();
    let (prefix, basis) = match (&m.subject, first) {
        (Subject::Provider { provider }, Some((_, id))) => {
            (format!("probeok-{provider}"), format!("{provider}|{id}"))
        }
        (_, Some((_, id))) => ("probeok-incident".to_owned(), id.to_owned()),
        _ => {
            let k = m.key.split('@').next().unwrap_or(&m.key);
            let k = k
                .strip_suffix(":resolved")
                .or_else(|| k.strip_suffix(":firing"))
                .unwrap_or(k);
            ("probeok".to_owned(), k.to_owned())
        }
    };
    let digest = render::key_digest(&basis);
    let prefix: String = prefix
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(64)
        .collect();
    format!("{prefix}-{digest}")
}

/// Whether the message closes what an earlier one opened.
pub fn resolves(m: &Message) -> bool {
    m.status == Status::Resolved
}

/// `&`, `<`, `>` (and quotes) as entities: what Slack's mrkdwn and Telegram's HTML ask for.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebase_keeps_path_and_query() {
        assert_eq!(
            rebase(
                "https://hooks.slack.com/services/T0/B0/XYZ?x=1",
                Some("http://127.0.0.1:9/")
            )
            .unwrap(),
            "http://127.0.0.1:9/services/T0/B0/XYZ?x=1"
        );
        assert_eq!(rebase("https://a/b", None).unwrap(), "https://a/b");
    }

    #[test]
    fn statuses_map_to_retry_or_refusal() {
        let a = |status, retry_after_s| Answer {
            status,
            body: "x".into(),
            retry_after_s,
        };
        assert!(matches!(
            failure(a(429, Some(7))),
            AlertError::Throttled {
                retry_after_s: 7,
                ..
            }
        ));
        assert!(failure(a(404, None)).is_permanent());
        assert!(!failure(a(408, None)).is_permanent());
        assert!(!failure(a(503, None)).is_permanent());
    }

    #[test]
    fn html_is_escaped() {
        assert_eq!(escape_html("a<b>&\"c"), "a&lt;b&gt;&amp;&quot;c");
    }
}
