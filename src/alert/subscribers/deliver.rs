//! The leader's subscriber task: incidents in (health events), one grouped notice per
//! subscriber and group into the subscriber outbox, the outbox sent.
//!
//! - Transitions are collected until `[alerting] group_wait` passes without a new one (at
//!   most 5 × `group_wait` after the first), then split into opened, worse and
//!   resolved; each confirmed subscriber gets one row per kind covering every incident its
//!   scope takes (a 20-route provider outage is one notice, not twenty; an incident opened
//!   and ended within one group is left out), under a dedup key
//!   made of the incidents, so a new leader repeating a group queues nothing twice.
//! - Rows are claimed before each send (one conditional UPDATE, as the alert outbox does):
//!   a monitor pair sends each once. A failure is retried with the alert outbox's backoff; a
//!   row older than [`MAX_AGE`] is dropped; a webhook failing for
//!   [`super::FAILING_FOR`] is removed (logged by id: addresses are never logged).
//! - A webhook's confirmation is its `subscription.confirm` event answered 2xx with the code
//!   in the answer's body.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lettre::message::header::{
    ContentTransferEncoding, ContentType, Header, HeaderName, HeaderValue,
};
use lettre::message::Mailbox;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use rand::Rng;
use sha2::{Digest, Sha256};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::{Keys, Notice, PublicIncident, Scope};
use crate::alert::outbox::{backoff, CLAIM_FOR};
use crate::alert::{AlertError, Vars};
use crate::clock::Clock;
use crate::config::Config;
use crate::health::HealthEvent;
use crate::lang::Lang;
use crate::route::RouteId;
use crate::state::State;
use crate::store::subscribers::{NoticeRow, SubscriberOp, SubscriberRow};
use crate::store::Store;

/// A notice undelivered this long after it was queued is given up.
pub const MAX_AGE: chrono::Duration = chrono::Duration::hours(24);
/// Rows read per round.
const BATCH: usize = 200;
/// Largest webhook answer read (the echoed code is in its first bytes).
const MAX_ANSWER: usize = 16 * 1024;

/// The link key from the store, generated and stored on first use (see the module docs of
/// [`super`] for why it is not an environment variable).
pub async fn keys(store: &Store) -> Result<Keys, AlertError> {
    let s = store.clone();
    let read =
        move || -> Result<Option<String>, AlertError> { Ok(s.reader()?.subscription_key()?) };
    let stored = tokio::task::spawn_blocking(read.clone())
        .await
        .map_err(|e| AlertError::Store(e.to_string()))??;
    if let Some(k) = stored {
        return Ok(Keys::new(&k));
    }
    store
        .writer()
        .subscriber(SubscriberOp::EnsureKey {
            candidate: super::random_secret(),
        })
        .await?;
    // Another member may have stored its own first: read the one that won.
    let k = tokio::task::spawn_blocking(read)
        .await
        .map_err(|e| AlertError::Store(e.to_string()))??
        .ok_or_else(|| AlertError::Store("the subscription link key did not persist".into()))?;
    Ok(Keys::new(&k))
}

#[derive(Clone)]
struct ListUnsubscribe(String);
#[derive(Clone)]
struct ListUnsubscribePost;

impl Header for ListUnsubscribe {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("List-Unsubscribe")
    }
    fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self(s.to_owned()))
    }
    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), self.0.clone())
    }
}

impl Header for ListUnsubscribePost {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("List-Unsubscribe-Post")
    }
    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self)
    }
    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), "List-Unsubscribe=One-Click".to_owned())
    }
}

/// Sends mail through the first `[[alert.email]]` table's SMTP setting.
struct Mailer {
    from: Mailbox,
    transport: AsyncSmtpTransport<Tokio1Executor>,
}

/// Everything the task needs.
pub struct Subscribers {
    store: Store,
    clock: Arc<dyn Clock>,
    title: String,
    base: String,
    group_wait: Duration,
    /// Route → (logical model, provider).
    routes: HashMap<RouteId, (String, String)>,
    mailer: Option<Mailer>,
    http: reqwest::Client,
    allow_private: bool,
}

impl Subscribers {
    /// Built at start; the SMTP URL is read now (an unusable one leaves email off, logged).
    pub fn new(c: &Config, store: Store, clock: Arc<dyn Clock>) -> Self {
        let mailer = if c.subscriptions.email {
            c.alert.email.first().and_then(|e| {
                let built = (|| -> Result<Mailer, AlertError> {
                    let url = c.env.get(&e.smtp_url_env).ok_or_else(|| {
                        AlertError::Config(format!("{} is not set", e.smtp_url_env))
                    })?;
                    let target = super::super::email::parse_smtp_url(url.expose())
                        .map_err(|m| AlertError::Config(format!("{}: {m}", e.smtp_url_env)))?;
                    Ok(Mailer {
                        from: e.from.parse().map_err(|_| {
                            AlertError::Config("alert.email[0].from is not an address".into())
                        })?,
                        transport: super::super::email::transport("subscriptions", &target)?,
                    })
                })();
                built
                    .map_err(
                        |err| tracing::error!(error = %err, "subscriptions: mail cannot be sent"),
                    )
                    .ok()
            })
        } else {
            None
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self {
            store,
            clock,
            title: c.server.title.clone(),
            base: c.server.public_url.trim_end_matches('/').to_owned(),
            group_wait: c.alerting.group_wait,
            routes: c
                .routes()
                .into_iter()
                .map(|r| (r.id.clone(), (r.serves.clone(), r.provider.clone())))
                .collect(),
            mailer,
            http,
            allow_private: c.subscriptions.allow_private_webhooks,
        }
    }

    /// The public incident a transition opened, worsened or resolved, and which of these.
    fn public(&self, e: &HealthEvent) -> Option<(&'static str, PublicIncident)> {
        let HealthEvent::Transition {
            transition,
            incident: Some(inc),
        } = e
        else {
            return None;
        };
        let event = if inc.closed_at.is_some() {
            "incident.resolved"
        } else if !transition.from.is_incident() && transition.to.is_incident() {
            "incident.opened"
        } else if transition.to.is_incident() && transition.to > transition.from {
            "incident.updated"
        } else {
            return None;
        };
        let (model, provider) = self.routes.get(&inc.route)?.clone();
        let state = if inc.closed_at.is_some() {
            State::Normal
        } else {
            transition.to
        };
        Some((
            event,
            PublicIncident {
                id: inc.id.clone(),
                route: inc.route.clone(),
                model,
                provider,
                state,
                started_at: inc.opened_at,
                ended_at: inc.closed_at,
                failure_mode: inc.failure_mode.or(transition.failure_mode),
            },
        ))
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(crate::store::Reader) -> Result<T, crate::store::StoreError> + Send + 'static,
    ) -> Result<T, AlertError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(store.reader()?))
            .await
            .map_err(|e| AlertError::Store(e.to_string()))?
            .map_err(AlertError::from)
    }

    /// Queues one notice per confirmed subscriber and kind for a group of incidents.
    pub async fn enqueue(
        &self,
        group: Vec<(&'static str, PublicIncident)>,
    ) -> Result<u64, AlertError> {
        if group.is_empty() {
            return Ok(0);
        }
        // An incident that opened and ended within one group was a blip shorter than the
        // group: subscribers hear of neither.
        let blips: std::collections::HashSet<String> = group
            .iter()
            .filter(|(k, _)| *k == "incident.resolved")
            .filter(|(_, i)| {
                group
                    .iter()
                    .any(|(k, o)| *k == "incident.opened" && o.id == i.id)
            })
            .map(|(_, i)| i.id.clone())
            .collect();
        let mut by_kind: BTreeMap<&str, Vec<PublicIncident>> = BTreeMap::new();
        for (kind, i) in group.into_iter().filter(|(_, i)| !blips.contains(&i.id)) {
            let list = by_kind.entry(kind).or_default();
            list.retain(|x| x.id != i.id);
            list.push(i);
        }
        let subs = self.read(|r| r.subscribers()).await?;
        let mut rows = Vec::new();
        for (kind, incidents) in by_kind {
            let mut ids: Vec<String> = incidents
                .iter()
                .map(|i| format!("{}:{}", i.id, i.state))
                .collect();
            ids.sort();
            let digest: String = Sha256::digest(ids.join("\n").as_bytes())
                .iter()
                .take(12)
                .map(|b| format!("{b:02x}"))
                .collect();
            for s in subs.iter().filter(|s| s.confirmed_at.is_some()) {
                let Some(scope) = Scope::parse(&s.scope) else {
                    continue;
                };
                let mine: Vec<PublicIncident> = incidents
                    .iter()
                    .filter(|i| scope.covers(i))
                    .cloned()
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let body = serde_json::to_string(&Notice::Incidents {
                    event: kind.to_owned(),
                    incidents: mine,
                })
                .map_err(|e| AlertError::Store(e.to_string()))?;
                rows.push((format!("{kind}:{digest}#{}", s.id), s.id, body));
            }
        }
        if rows.is_empty() {
            return Ok(0);
        }
        let at = self.clock.now();
        Ok(self
            .store
            .writer()
            .subscriber(SubscriberOp::Enqueue { rows, at })
            .await?)
    }

    /// Sends every due row; answers how many were delivered.
    pub async fn deliver_due(&self, keys: &Keys) -> Result<u32, AlertError> {
        let now = self.clock.now();
        let rows = self.read(move |r| r.notices_due(now, BATCH)).await?;
        let mut delivered = 0;
        for row in rows {
            delivered += u32::from(self.one(keys, row, now).await?);
        }
        Ok(delivered)
    }

    async fn one(
        &self,
        keys: &Keys,
        row: NoticeRow,
        now: DateTime<Utc>,
    ) -> Result<bool, AlertError> {
        let writer = self.store.writer();
        let claimed = writer
            .subscriber(SubscriberOp::Claim {
                id: row.id,
                now,
                until: now + CLAIM_FOR,
            })
            .await?;
        if claimed == 0 {
            return Ok(false);
        }
        let sid = row.subscriber_id;
        let drop = |error: String| SubscriberOp::Dropped {
            id: row.id,
            at: now,
            error,
        };
        let Some(sub) = self.read(move |r| r.subscriber(sid)).await? else {
            writer
                .subscriber(drop("the subscriber is gone".into()))
                .await?;
            return Ok(false);
        };
        if now - row.created_at > MAX_AGE {
            tracing::warn!(subscriber = sub.id, key = %row.dedup_key, attempts = row.attempts, "subscriber notice dropped: undelivered past its maximum age");
            writer
                .subscriber(drop("undelivered past its maximum age".into()))
                .await?;
            return Ok(false);
        }
        let notice: Notice = match serde_json::from_str(&row.body) {
            Ok(n) => n,
            Err(e) => {
                writer
                    .subscriber(drop(format!("unreadable notice: {e}")))
                    .await?;
                return Ok(false);
            }
        };
        let sent = match sub.kind.as_str() {
            "email" => self.mail(keys, &sub, &notice, now).await,
            _ => self.post(keys, &sub, &notice, now).await,
        };
        match sent {
            Ok(()) => {
                writer
                    .subscriber(SubscriberOp::Delivered {
                        id: row.id,
                        subscriber_id: sub.id,
                        at: now,
                    })
                    .await?;
                if matches!(notice, Notice::Confirm) && sub.kind == "webhook" {
                    writer
                        .subscriber(SubscriberOp::Confirm {
                            id: sub.id,
                            at: now,
                        })
                        .await?;
                    tracing::info!(subscriber = sub.id, "subscriber webhook confirmed");
                }
                tracing::info!(subscriber = sub.id, key = %row.dedup_key, "subscriber notice delivered");
                Ok(true)
            }
            Err(e) => {
                let attempts = row.attempts + 1;
                let next = now + backoff(attempts, rand::thread_rng().gen::<f64>());
                tracing::warn!(subscriber = sub.id, key = %row.dedup_key, attempt = attempts, error = %e, "subscriber notice failed; will retry");
                writer
                    .subscriber(SubscriberOp::Retry {
                        id: row.id,
                        subscriber_id: sub.id,
                        at: now,
                        next,
                        error: crate::alert::cut(&e.to_string(), 300),
                    })
                    .await?;
                Ok(false)
            }
        }
    }

    fn lang(sub: &SubscriberRow) -> Lang {
        if sub.lang == "zh" {
            Lang::Zh
        } else {
            Lang::En
        }
    }

    async fn mail(
        &self,
        keys: &Keys,
        sub: &SubscriberRow,
        notice: &Notice,
        now: DateTime<Utc>,
    ) -> Result<(), AlertError> {
        let Some(m) = &self.mailer else {
            return Err(AlertError::Config(
                "no usable [[alert.email]] SMTP setting".into(),
            ));
        };
        let lang = Self::lang(sub);
        let unsubscribe = format!(
            "{}/subscribe/unsubscribe?t={}",
            self.base,
            keys.unsubscribe_token(sub.id, &sub.secret)
        );
        let mail = match notice {
            Notice::Confirm => {
                let link = format!(
                    "{}/subscribe/confirm?t={}",
                    self.base,
                    keys.confirm_token(sub.id, &sub.secret, now + super::CONFIRM_VALID)
                );
                super::confirm_mail(&self.title, &sub.scope, &link, lang)
            }
            Notice::Incidents { event, incidents } => super::incident_mail(
                &self.title,
                event,
                incidents,
                &self.base,
                &unsubscribe,
                lang,
            ),
        };
        let to: Mailbox = sub
            .target
            .parse()
            .map_err(|_| AlertError::Config(format!("subscriber {}: not an address", sub.id)))?;
        let mut b = lettre::Message::builder()
            .from(m.from.clone())
            .to(to)
            .subject(mail.subject);
        if !matches!(notice, Notice::Confirm) {
            b = b
                .header(ListUnsubscribe(format!("<{unsubscribe}>")))
                .header(ListUnsubscribePost);
        }
        let email = b
            .header(ContentType::TEXT_PLAIN)
            // Quoted-printable keeps the links readable in the raw message.
            .header(ContentTransferEncoding::QuotedPrintable)
            .body(mail.text)
            .map_err(|e| AlertError::Config(e.to_string()))?;
        crate::alert::email::receipt(m.transport.send(email).await).map(|_| ())
    }

    async fn post(
        &self,
        keys: &Keys,
        sub: &SubscriberRow,
        notice: &Notice,
        now: DateTime<Utc>,
    ) -> Result<(), AlertError> {
        // Checked again at every send: a name may resolve elsewhere than when it subscribed.
        let url = super::check_webhook(&sub.target, self.allow_private)
            .await
            .map_err(|e| AlertError::Config(e.to_string()))?;
        let (kind, code) = match notice {
            Notice::Confirm => (
                "subscription.confirm",
                Some(keys.webhook_code(sub.id, &sub.secret)),
            ),
            Notice::Incidents { event, .. } => (event.as_str(), None),
        };
        let body = super::event_body(
            kind,
            sub.id,
            &sub.scope,
            notice,
            &self.base,
            code.as_deref(),
            now,
        );
        let raw = serde_json::to_vec(&body).map_err(|e| AlertError::Config(e.to_string()))?;
        let resp = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("x-probeok-event", kind)
            .header("x-probeok-signature", super::signature(&sub.secret, &raw))
            .body(raw)
            .send()
            .await
            .map_err(|e| {
                AlertError::Transport(crate::alert::cut(&e.without_url().to_string(), 300))
            })?;
        let status = resp.status().as_u16();
        let mut answer = Vec::new();
        let mut resp = resp;
        while let Ok(Some(chunk)) = resp.chunk().await {
            answer.extend_from_slice(&chunk);
            if answer.len() >= MAX_ANSWER {
                break;
            }
        }
        let answer = String::from_utf8_lossy(&answer);
        if !(200..300).contains(&status) {
            return Err(AlertError::Rejected {
                status,
                body: crate::alert::cut(&answer, 200),
            });
        }
        if let Some(code) = code {
            if !answer.contains(&code) {
                return Err(AlertError::Rejected {
                    status,
                    body: "the answer did not echo the confirmation code".into(),
                });
            }
        }
        Ok(())
    }

    /// Forgets old attempts and done rows, unconfirmed subscribers past their link's life,
    /// and removes webhooks failing for [`super::FAILING_FOR`].
    pub async fn maintain(&self) -> Result<(), AlertError> {
        let now = self.clock.now();
        let writer = self.store.writer();
        writer
            .subscriber(SubscriberOp::Prune {
                before: now - chrono::Duration::days(1).max(super::CONFIRM_VALID),
            })
            .await?;
        for s in self.read(|r| r.subscribers()).await? {
            if s.kind == "webhook"
                && s.failing_since
                    .is_some_and(|t| now - t >= super::FAILING_FOR)
            {
                writer.subscriber(SubscriberOp::Delete { id: s.id }).await?;
                tracing::warn!(
                    subscriber = s.id,
                    "subscriber webhook removed: failing for 3 days"
                );
            }
        }
        Ok(())
    }
}

/// The leader's task: groups incidents into notices and sends the subscriber outbox, until
/// `token` ends the term.
pub async fn run(
    subs: Arc<Subscribers>,
    mut events: broadcast::Receiver<HealthEvent>,
    token: CancellationToken,
) {
    let mut keys: Option<Keys> = None;
    let mut group: Vec<(&'static str, PublicIncident)> = Vec::new();
    let mut flush_at: Option<tokio::time::Instant> = None;
    let mut first_at: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_maintenance = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = token.cancelled() => break,
            e = events.recv() => match e {
                Ok(e) => {
                    if let Some(p) = subs.public(&e) {
                        group.push(p);
                        // The group closes after `group_wait` without a new incident (routes of
                        // one outage recover a few probes apart), at most 5 × `group_wait` after
                        // its first.
                        let now = tokio::time::Instant::now();
                        let first = *first_at.get_or_insert(now);
                        flush_at = Some((now + subs.group_wait).min(first + subs.group_wait * 5));
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "subscriptions: health events missed (too slow)");
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
            _ = tick.tick() => {
                if flush_at.is_some_and(|t| t <= tokio::time::Instant::now()) {
                    flush_at = None;
                    first_at = None;
                    let g = std::mem::take(&mut group);
                    if let Err(e) = subs.enqueue(g).await {
                        tracing::error!(error = %e, "subscriptions: cannot queue notices");
                    }
                }
                if keys.is_none() {
                    match self::keys(&subs.store).await {
                        Ok(k) => keys = Some(k),
                        Err(e) => tracing::error!(error = %e, "subscriptions: no link key"),
                    }
                }
                if let Some(k) = &keys {
                    if let Err(e) = subs.deliver_due(k).await {
                        tracing::error!(error = %e, "subscriptions: delivery round failed");
                    }
                }
                if last_maintenance.elapsed() >= Duration::from_secs(60) {
                    last_maintenance = tokio::time::Instant::now();
                    if let Err(e) = subs.maintain().await {
                        tracing::error!(error = %e, "subscriptions: maintenance failed");
                    }
                }
            }
        }
    }
}
