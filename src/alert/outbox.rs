//! The persisted outbox's sending side. Rows are written by the engine (one per message and
//! channel, under `<message key>#<channel>`, ignored when the key exists); this sends what is
//! due, oldest first, and records each result:
//!
//! - a receiver-confirmed success → `delivered` (never sent again, across restarts);
//! - a failure → attempt counted, next try after [`backoff`] (exponential with jitter); the
//!   channel's other due rows wait for the next round instead of hammering a dead receiver;
//! - over the channel's per-minute limit (DingTalk and WeCom: 20, Feishu: 100 and 5 a second,
//!   a webhook's `max_per_minute`) → deferred to when its window frees, no attempt counted;
//!   and more due than the window has room for → the excess **folded** into one summary
//!   ([`fold`]), so a flood costs a channel one minute, not hours of queue;
//! - a firing message whose subject a later due row resolves → not sent (the resolution
//!   says it), counted `folded`;
//! - a refusal no retry changes ([`AlertError::is_permanent`]) → recorded with the
//!   receiver's reason, counted `failed`, not tried again;
//! - older than [`MAX_AGE`] → `dropped`, with a log line and `probeok_alerts_total{result=dropped}`;
//! - beyond [`MAX_ROWS`] rows in all, the oldest are deleted (done ones first) by the engine's
//!   maintenance, counted in `probeok_alert_outbox_evicted_total`.
//!
//! Every row is claimed before it is handled ([`CLAIM_FOR`], one conditional UPDATE): monitors
//! sharing one database (a leader and the one taking over from it) never both send a row.
//!
//! A crash between a send and its record repeats that one message after the restart (or, in
//! a cluster, once its claim expires); nothing recorded delivered is repeated and nothing
//! pending is lost.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use rand::Rng;

use super::{AlertError, AlertMetrics, Message, Notifier, RenderCtx};

// What one round hands a channel: superseded firings dropped, the excess folded.
pub mod fold;
use crate::store::alerts::{AlertOp, OutboxRow};
use crate::store::Store;
use fold::Disp;

/// Rows the outbox keeps at most, whatever their age: past it the oldest delivered and
/// dropped rows go first, pending ones only when nothing else is left (counted in
/// `probeok_alert_outbox_evicted_total`). An alert storm cannot grow the table without bound.
pub const MAX_ROWS: u64 = 100_000;
/// A message still undelivered this long after it was written is given up.
pub const MAX_AGE: chrono::Duration = chrono::Duration::hours(24);
/// First retry after about this long…
pub const BACKOFF_BASE: chrono::Duration = chrono::Duration::seconds(5);
/// …doubling per attempt up to this.
pub const BACKOFF_CAP: chrono::Duration = chrono::Duration::minutes(10);
/// The dedup-key suffix of a message's mention part (its own row, after the message's).
pub const MENTION_PART: &str = "#mention";
/// How long a member's claim on a row lasts: far longer than one send (every channel gives
/// up within 15 s), so it only runs out when its owner died mid-send.
pub const CLAIM_FOR: chrono::Duration = chrono::Duration::seconds(60);
/// Rows read at once. A channel's rows past its window's room are claimed into its summary as
/// they are read, so however many are due, a round ends with one summary per channel.
const BATCH: usize = 500;

/// The wait after `attempts` failed attempts (1-based): `min(cap, base·2^(attempts−1))`, of
/// which the upper half is jittered by `jitter` ∈ [0, 1] ("equal jitter": never less than half).
pub fn backoff(attempts: u32, jitter: f64) -> chrono::Duration {
    let exp = attempts.saturating_sub(1).min(20);
    let full = (BACKOFF_BASE.num_milliseconds() << exp).min(BACKOFF_CAP.num_milliseconds());
    let jitter = jitter.clamp(0.0, 1.0);
    let half = full / 2;
    chrono::Duration::milliseconds(half + (half as f64 * jitter) as i64)
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    pub delivered: u32,
    pub failed: u32,
    pub deferred: u32,
    pub dropped: u32,
    /// Due rows another member claimed first (it sends them).
    pub claimed_elsewhere: u32,
    /// Rows folded into a summary, or superseded by their resolution.
    pub folded: u32,
}

/// Sends the outbox's due rows through the channels.
pub struct Outbox {
    store: Store,
    /// Swapped whole on a config reload ([`Outbox::reconfigure`]).
    channels: std::sync::RwLock<Arc<Vec<Arc<dyn Notifier>>>>,
    ctx: std::sync::RwLock<Arc<RenderCtx>>,
    metrics: Arc<AlertMetrics>,
    max_age: chrono::Duration,
    /// Send times in the last minute, per rate-limited channel.
    sent: Mutex<HashMap<String, VecDeque<DateTime<Utc>>>>,
}

impl Outbox {
    pub fn new(
        store: Store,
        channels: Vec<Arc<dyn Notifier>>,
        ctx: RenderCtx,
        metrics: Arc<AlertMetrics>,
    ) -> Self {
        for c in &channels {
            metrics.declare(c.name());
        }
        Self {
            store,
            channels: std::sync::RwLock::new(Arc::new(channels)),
            ctx: std::sync::RwLock::new(Arc::new(ctx)),
            metrics,
            max_age: MAX_AGE,
            sent: Mutex::new(HashMap::new()),
        }
    }

    /// Overrides [`MAX_AGE`] (tests).
    pub fn with_max_age(mut self, max_age: chrono::Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// The channels in effect (a snapshot: a reload may replace them).
    pub fn channels(&self) -> Arc<Vec<Arc<dyn Notifier>>> {
        self.channels
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// New channels and links after a config reload. Pending rows of a channel that is gone
    /// are dropped (logged and counted) at their next round, as at a restart.
    pub fn reconfigure(&self, channels: Vec<Arc<dyn Notifier>>, ctx: RenderCtx) {
        for c in &channels {
            self.metrics.declare(c.name());
        }
        *self.channels.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(channels);
        *self.ctx.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(ctx);
    }

    fn ctx(&self) -> Arc<RenderCtx> {
        self.ctx.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn metrics(&self) -> &Arc<AlertMetrics> {
        &self.metrics
    }

    /// When the next pending row is due.
    pub async fn next_due(&self) -> Result<Option<DateTime<Utc>>, AlertError> {
        let store = self.store.clone();
        Ok(
            tokio::task::spawn_blocking(move || store.reader()?.outbox_next_due())
                .await
                .map_err(|e| AlertError::Store(e.to_string()))??,
        )
    }

    /// Sends every row due at `now` (signing with `now`) and records the results.
    pub async fn deliver_due(&self, now: DateTime<Utc>) -> Result<Round, AlertError> {
        let mut round = Round::default();
        let mut seen: HashSet<i64> = HashSet::new();
        // A channel that failed this round: its other rows wait for the failed one.
        let mut failed: HashMap<String, DateTime<Utc>> = HashMap::new();
        // Per channel, what is folded this round: claimed as read, sent as one at the end.
        let mut folding: HashMap<String, fold::Folding> = HashMap::new();
        loop {
            let store = self.store.clone();
            let rows = tokio::task::spawn_blocking(move || store.reader()?.outbox_due(now, BATCH))
                .await
                .map_err(|e| AlertError::Store(e.to_string()))??;
            let fresh: Vec<OutboxRow> = rows.into_iter().filter(|r| seen.insert(r.id)).collect();
            if fresh.is_empty() {
                break;
            }
            let plan = self.plan(&fresh, &folding, now);
            for row in fresh {
                match plan.get(&row.id) {
                    Some(Disp::Superseded) => self.superseded(row, now, &mut round).await?,
                    Some(Disp::Fold) => self.claim_fold(row, now, &mut folding, &mut round).await?,
                    _ => self.one(row, now, &mut failed, &mut round).await?,
                }
            }
        }
        for (name, f) in folding {
            self.fold(&name, f, now, &mut failed, &mut round).await?;
        }
        Ok(round)
    }

    /// Each due row's fate (rows not in it are sent as they are). A channel already folding
    /// this round folds the rest of its rows too: its minute has no room left.
    fn plan(
        &self,
        rows: &[OutboxRow],
        folding: &HashMap<String, fold::Folding>,
        now: DateTime<Utc>,
    ) -> HashMap<i64, Disp> {
        let channels = self.channels();
        let mut by_channel: HashMap<&str, Vec<&OutboxRow>> = HashMap::new();
        for r in rows {
            by_channel.entry(r.channel.as_str()).or_default().push(r);
        }
        let mut out = HashMap::new();
        for (name, rows) in by_channel {
            let Some(ch) = channels.iter().find(|c| c.name() == name) else {
                continue;
            };
            // Past its age, a row is dropped by the sender, not folded.
            let parsed: Vec<Option<Message>> = rows
                .iter()
                .map(|r| {
                    (now - r.created_at <= self.max_age)
                        .then(|| serde_json::from_str(&r.message).ok())
                        .flatten()
                })
                .collect();
            let refs: Vec<Option<&Message>> = parsed.iter().map(Option::as_ref).collect();
            let capacity = if folding.contains_key(name) {
                Some(1)
            } else {
                ch.per_minute()
                    .map(|l| (l as usize).saturating_sub(self.sent_in_minute(ch.as_ref(), now)))
            };
            for (r, d) in rows.iter().zip(fold::plan(&refs, capacity)) {
                out.insert(r.id, d);
            }
        }
        out
    }

    /// Claims a row into its channel's summary of this round.
    async fn claim_fold(
        &self,
        row: OutboxRow,
        now: DateTime<Utc>,
        folding: &mut HashMap<String, fold::Folding>,
        round: &mut Round,
    ) -> Result<(), AlertError> {
        let op = AlertOp::Claim {
            id: row.id,
            now,
            until: now + CLAIM_FOR,
        };
        if self.store.writer().alert(op).await? == 0 {
            round.claimed_elsewhere += 1;
            return Ok(());
        }
        let message = if row.dedup_key.ends_with(MENTION_PART) {
            None
        } else {
            serde_json::from_str(&row.message).ok()
        };
        (folding.entry(row.channel).or_default()).add(row.id, row.attempts, message);
        Ok(())
    }

    /// A firing row whose subject resolved before it was sent: recorded, not sent.
    async fn superseded(
        &self,
        row: OutboxRow,
        now: DateTime<Utc>,
        round: &mut Round,
    ) -> Result<(), AlertError> {
        let writer = self.store.writer();
        let claimed = writer
            .alert(AlertOp::Claim {
                id: row.id,
                now,
                until: now + CLAIM_FOR,
            })
            .await?;
        if claimed == 0 {
            round.claimed_elsewhere += 1;
            return Ok(());
        }
        tracing::info!(channel = %row.channel, key = %row.dedup_key, "alert not sent: resolved before it could be, the resolution says it");
        self.metrics.add(&row.channel, "folded");
        round.folded += 1;
        let error = "resolved before it was sent: folded into its resolution".to_owned();
        writer
            .alert(AlertOp::Dropped {
                id: row.id,
                at: now,
                error,
            })
            .await?;
        Ok(())
    }

    /// Sends one channel's summary of the rows folded this round and records them.
    async fn fold(
        &self,
        name: &str,
        f: fold::Folding,
        now: DateTime<Utc>,
        failed: &mut HashMap<String, DateTime<Utc>>,
        round: &mut Round,
    ) -> Result<(), AlertError> {
        let writer = self.store.writer();
        let claim = now + CLAIM_FOR;
        let channel = self.channels().iter().find(|c| c.name() == name).cloned();
        let wait = match &channel {
            // Gone since the round began (a reload): its rows go back, to be dropped as such.
            None => Some(now),
            Some(c) => failed
                .get(name)
                .copied()
                .or_else(|| self.rate_limited(c.as_ref(), now)),
        };
        let (Some(channel), None) = (channel, wait) else {
            for (id, _) in &f.rows {
                round.deferred += 1;
                let op = AlertOp::Retry {
                    id: *id,
                    count_attempt: false,
                    next: wait.unwrap_or(now),
                    error: None,
                    claim: Some(claim),
                };
                writer.alert(op).await?;
            }
            return Ok(());
        };
        let summary = f.summary(channel.per_minute().unwrap_or(0), now);
        self.note_sent(channel.as_ref(), now);
        let sent = channel.send(&summary, &self.ctx(), now).await;
        for (id, attempts) in &f.rows {
            let op = match &sent {
                Ok(_) => {
                    self.metrics.add(name, "folded");
                    round.folded += 1;
                    AlertOp::Delivered { id: *id, at: now }
                }
                Err(e) if e.is_permanent() => {
                    self.metrics.add(name, "failed");
                    AlertOp::Dropped {
                        id: *id,
                        at: now,
                        error: e.to_string(),
                    }
                }
                Err(e) => {
                    let wait = backoff(attempts + 1, rand::thread_rng().gen::<f64>());
                    let next = now + e.retry_after().map_or(wait, |asked| asked.max(wait));
                    failed.insert(name.to_owned(), next);
                    AlertOp::Retry {
                        id: *id,
                        count_attempt: true,
                        next,
                        error: Some(e.to_string()),
                        claim: Some(claim),
                    }
                }
            };
            writer.alert(op).await?;
        }
        let n = f.rows.len();
        match sent {
            Ok(_) => {
                tracing::info!(channel = %name, folded = n, "alerts past the channel's rate folded into one summary");
                self.metrics.add(name, "delivered");
                round.delivered += 1;
            }
            Err(e) => {
                tracing::warn!(channel = %name, folded = n, error = %e, "alert summary delivery failed; its alerts will be tried again");
                round.failed += 1;
            }
        }
        Ok(())
    }

    async fn one(
        &self,
        row: OutboxRow,
        now: DateTime<Utc>,
        failed: &mut HashMap<String, DateTime<Utc>>,
        round: &mut Round,
    ) -> Result<(), AlertError> {
        let writer = self.store.writer();
        let claim = now + CLAIM_FOR;
        let claimed = writer
            .alert(AlertOp::Claim {
                id: row.id,
                now,
                until: claim,
            })
            .await?;
        if claimed == 0 {
            tracing::debug!(channel = %row.channel, key = %row.dedup_key, "alert row claimed by another member");
            round.claimed_elsewhere += 1;
            return Ok(());
        }
        if now - row.created_at > self.max_age {
            tracing::warn!(
                channel = %row.channel,
                key = %row.dedup_key,
                attempts = row.attempts,
                last_error = row.last_error.as_deref().unwrap_or("-"),
                "alert dropped: undelivered past its maximum age"
            );
            self.metrics.add(&row.channel, "dropped");
            round.dropped += 1;
            let error = format!(
                "undelivered after {} attempts; last error: {}",
                row.attempts,
                row.last_error.as_deref().unwrap_or("-")
            );
            writer
                .alert(AlertOp::Dropped {
                    id: row.id,
                    at: now,
                    error,
                })
                .await?;
            return Ok(());
        }
        let Some(channel) = self
            .channels()
            .iter()
            .find(|c| c.name() == row.channel)
            .cloned()
        else {
            tracing::warn!(channel = %row.channel, key = %row.dedup_key, "alert dropped: its channel is no longer configured");
            self.metrics.add(&row.channel, "dropped");
            round.dropped += 1;
            writer
                .alert(AlertOp::Dropped {
                    id: row.id,
                    at: now,
                    error: "channel no longer configured".into(),
                })
                .await?;
            return Ok(());
        };
        if let Some(next) = failed.get(&row.channel) {
            round.deferred += 1;
            writer
                .alert(AlertOp::Retry {
                    id: row.id,
                    count_attempt: false,
                    next: *next,
                    error: None,
                    claim: Some(claim),
                })
                .await?;
            return Ok(());
        }
        if let Some(next) = self.rate_limited(channel.as_ref(), now) {
            round.deferred += 1;
            tracing::debug!(channel = %row.channel, "alert deferred: channel's per-minute limit reached");
            failed.insert(row.channel.clone(), next);
            writer
                .alert(AlertOp::Retry {
                    id: row.id,
                    count_attempt: false,
                    next,
                    error: None,
                    claim: Some(claim),
                })
                .await?;
            return Ok(());
        }
        let message: Message = match serde_json::from_str(&row.message) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(channel = %row.channel, key = %row.dedup_key, error = %e, "alert dropped: unreadable stored message");
                self.metrics.add(&row.channel, "dropped");
                round.dropped += 1;
                writer
                    .alert(AlertOp::Dropped {
                        id: row.id,
                        at: now,
                        error: format!("unreadable message: {e}"),
                    })
                    .await?;
                return Ok(());
            }
        };
        self.note_sent(channel.as_ref(), now);
        let ctx = self.ctx();
        let sent = if row.dedup_key.ends_with(MENTION_PART) {
            channel.send_mention(&message, &ctx, now).await
        } else {
            channel.send(&message, &ctx, now).await
        };
        match sent {
            Ok(receipt) => {
                tracing::info!(channel = %row.channel, key = %row.dedup_key, attempt = row.attempts + 1, status = receipt.status, "alert delivered");
                self.metrics.add(&row.channel, "delivered");
                round.delivered += 1;
                writer
                    .alert(AlertOp::Delivered {
                        id: row.id,
                        at: now,
                    })
                    .await?;
            }
            Err(e) if e.is_permanent() => {
                tracing::warn!(channel = %row.channel, key = %row.dedup_key, attempt = row.attempts + 1, error = %e, "alert refused by its receiver; not retried");
                self.metrics.add(&row.channel, "failed");
                round.failed += 1;
                writer
                    .alert(AlertOp::Dropped {
                        id: row.id,
                        at: now,
                        error: e.to_string(),
                    })
                    .await?;
            }
            Err(e) => {
                let attempts = row.attempts + 1;
                let wait = backoff(attempts, rand::thread_rng().gen::<f64>());
                let next = now + e.retry_after().map_or(wait, |asked| asked.max(wait));
                tracing::warn!(channel = %row.channel, key = %row.dedup_key, attempt = attempts, error = %e, retry_at = %next, "alert delivery failed; will retry");
                self.metrics.add(&row.channel, "failed");
                round.failed += 1;
                failed.insert(row.channel.clone(), next);
                writer
                    .alert(AlertOp::Retry {
                        id: row.id,
                        count_attempt: true,
                        next,
                        error: Some(e.to_string()),
                        claim: Some(claim),
                    })
                    .await?;
            }
        }
        Ok(())
    }

    /// `Some(when the window frees up)` when the channel sent its per-minute (or per-second)
    /// limit already.
    fn rate_limited(&self, ch: &dyn Notifier, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if ch.per_minute().is_none() && ch.per_second().is_none() {
            return None;
        }
        let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        let q = sent.entry(ch.name().to_owned()).or_default();
        let minute = chrono::Duration::minutes(1);
        while q.front().is_some_and(|t| now - *t >= minute) {
            q.pop_front();
        }
        if let Some(limit) = ch.per_minute() {
            if q.len() >= limit as usize {
                return Some(q.front().map_or(now, |t| *t + minute));
            }
        }
        let second = chrono::Duration::seconds(1);
        let limit = ch.per_second()? as usize;
        let recent: Vec<&DateTime<Utc>> = q.iter().filter(|t| now - **t < second).collect();
        (recent.len() >= limit).then(|| recent.first().map_or(now, |t| **t + second))
    }

    /// Messages the channel sent in the last minute.
    fn sent_in_minute(&self, ch: &dyn Notifier, now: DateTime<Utc>) -> usize {
        let sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        let minute = chrono::Duration::minutes(1);
        sent.get(ch.name())
            .map_or(0, |q| q.iter().filter(|t| now - **t < minute).count())
    }

    fn note_sent(&self, ch: &dyn Notifier, now: DateTime<Utc>) {
        if ch.per_minute().is_none() && ch.per_second().is_none() {
            return;
        }
        let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        sent.entry(ch.name().to_owned()).or_default().push_back(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        assert_eq!(backoff(1, 0.0), chrono::Duration::milliseconds(2500));
        assert_eq!(backoff(1, 1.0), chrono::Duration::seconds(5));
        assert_eq!(backoff(2, 1.0), chrono::Duration::seconds(10));
        assert_eq!(backoff(3, 0.5), chrono::Duration::seconds(15));
        assert_eq!(backoff(30, 1.0), BACKOFF_CAP);
        assert_eq!(backoff(30, 0.0), BACKOFF_CAP / 2);
        assert!(backoff(0, 1.0) > chrono::Duration::zero());
    }
}
