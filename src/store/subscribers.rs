//! Status page subscribers (`migrations/*/0022_subscribers.sql`): who subscribed to what, the
//! attempts behind the abuse limits, and the subscriber outbox. Writes are [`SubscriberOp`]s
//! through the writer thread (one transaction each: a subscription's limit checks, its row and
//! its confirmation message commit together); reads are [`Reader`] methods.

use super::sql::{params, Connection, OptionalExtension, Row};
use chrono::{DateTime, Utc};

use super::writer::{Ack, Command};
use super::{from_ms, to_ms, Reader, StoreError, Writer};

/// A subscriber as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberRow {
    pub id: i64,
    /// `email` or `webhook`.
    pub kind: String,
    /// The address or URL.
    pub target: String,
    /// `*`, `model:<name>` or `provider:<id>`.
    pub scope: String,
    pub lang: String,
    pub secret: String,
    pub created_at: DateTime<Utc>,
    pub confirmed_at: Option<DateTime<Utc>>,
    pub failing_since: Option<DateTime<Utc>>,
}

/// A subscriber outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoticeRow {
    pub id: i64,
    pub dedup_key: String,
    pub subscriber_id: i64,
    pub body: String,
    pub created_at: DateTime<Utc>,
    pub attempts: u32,
}

/// A new subscription and the limits it must keep.
#[derive(Debug, Clone)]
pub struct NewSubscriber {
    pub kind: String,
    pub target: String,
    pub scope: String,
    pub lang: String,
    pub secret: String,
    pub now: DateTime<Utc>,
    /// `ip:<client address>`: at most `ip_limit` attempts an hour.
    pub ip_key: String,
    pub ip_limit: u64,
    /// `to:<digest of the target>`: at most `to_limit` confirmations a day.
    pub to_key: String,
    pub to_limit: u64,
    pub max_subscribers: u64,
    /// The confirmation message's body, queued with the row (under `confirm:<id>:<ms>`).
    pub confirm_body: String,
}

/// What became of a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subscribed {
    /// A new (or renewed unconfirmed) subscriber; its confirmation is queued.
    Pending(i64),
    /// Already confirmed: nothing is sent.
    Already,
    TooManyFromIp,
    TooManyForTarget,
    Full,
}

// `Subscribe`'s answers besides an id (ids are far below these).
const ALREADY: u64 = u64::MAX;
const IP: u64 = u64::MAX - 1;
const TARGET: u64 = u64::MAX - 2;
const FULL: u64 = u64::MAX - 3;

/// A write to the subscriber tables.
#[derive(Debug, Clone)]
pub enum SubscriberOp {
    Subscribe(Box<NewSubscriber>),
    /// Answers 1 when it was pending and is now confirmed.
    Confirm {
        id: i64,
        at: DateTime<Utc>,
    },
    /// Deletes the subscriber and its pending messages; answers 1 when it existed.
    Delete {
        id: i64,
    },
    /// Queues messages `(dedup key, subscriber id, body)`; a known key is skipped. Answers
    /// how many were new.
    Enqueue {
        rows: Vec<(String, i64, String)>,
        at: DateTime<Utc>,
    },
    /// Claims a due row until `until` (one statement: two members never both win it).
    Claim {
        id: i64,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    },
    /// Sent: the row is done and its subscriber is no longer failing.
    Delivered {
        id: i64,
        subscriber_id: i64,
        at: DateTime<Utc>,
    },
    /// A failed send: retry at `next`; the subscriber fails since `at` unless it already did.
    Retry {
        id: i64,
        subscriber_id: i64,
        at: DateTime<Utc>,
        next: DateTime<Utc>,
        error: String,
    },
    Dropped {
        id: i64,
        at: DateTime<Utc>,
        error: String,
    },
    /// The link-signing key: `candidate` unless one is stored already.
    EnsureKey {
        candidate: String,
    },
    /// Forgets attempts, finished rows and unconfirmed subscribers older than `before`.
    Prune {
        before: DateTime<Utc>,
    },
}

pub(crate) const KEY_META: &str = "subscription_link_key";

pub(crate) fn apply(conn: &Connection, op: &SubscriberOp) -> Result<u64, StoreError> {
    match op {
        SubscriberOp::Subscribe(s) => subscribe(conn, s),
        SubscriberOp::Confirm { id, at } => Ok(conn
            .prepare_cached(
                "UPDATE subscribers SET confirmed_ms = ?2 WHERE id = ?1 AND confirmed_ms IS NULL",
            )?
            .execute(params![id, to_ms(*at)])?
            as u64),
        SubscriberOp::Delete { id } => {
            conn.prepare_cached(
                "DELETE FROM subscriber_outbox WHERE subscriber_id = ?1 AND status = 'pending'",
            )?
            .execute(params![id])?;
            Ok(conn
                .prepare_cached("DELETE FROM subscribers WHERE id = ?1")?
                .execute(params![id])? as u64)
        }
        SubscriberOp::Enqueue { rows, at } => {
            let mut ins = conn.prepare_cached(
                "INSERT INTO subscriber_outbox (dedup_key, subscriber_id, body, created_ms, status, next_attempt_ms)
                 VALUES (?1, ?2, ?3, ?4, 'pending', ?4) ON CONFLICT (dedup_key) DO NOTHING",
            )?;
            let mut n = 0;
            for (key, sub, body) in rows {
                n += ins.execute(params![key, sub, body, to_ms(*at)])? as u64;
            }
            Ok(n)
        }
        SubscriberOp::Claim { id, now, until } => Ok(conn
            .prepare_cached(
                "UPDATE subscriber_outbox SET next_attempt_ms = ?3
                 WHERE id = ?1 AND status = 'pending' AND next_attempt_ms <= ?2",
            )?
            .execute(params![id, to_ms(*now), to_ms(*until)])?
            as u64),
        SubscriberOp::Delivered {
            id,
            subscriber_id,
            at,
        } => {
            conn.prepare_cached("UPDATE subscribers SET failing_since_ms = NULL WHERE id = ?1")?
                .execute(params![subscriber_id])?;
            Ok(conn
                .prepare_cached(
                    "UPDATE subscriber_outbox SET status = 'delivered', attempts = attempts + 1,
                         done_ms = ?2, last_error = NULL
                     WHERE id = ?1 AND status = 'pending'",
                )?
                .execute(params![id, to_ms(*at)])? as u64)
        }
        SubscriberOp::Retry {
            id,
            subscriber_id,
            at,
            next,
            error,
        } => {
            conn.prepare_cached(
                "UPDATE subscribers SET failing_since_ms = ?2
                 WHERE id = ?1 AND failing_since_ms IS NULL",
            )?
            .execute(params![subscriber_id, to_ms(*at)])?;
            Ok(conn
                .prepare_cached(
                    "UPDATE subscriber_outbox SET attempts = attempts + 1, next_attempt_ms = ?2,
                         last_error = ?3
                     WHERE id = ?1 AND status = 'pending'",
                )?
                .execute(params![id, to_ms(*next), error])? as u64)
        }
        SubscriberOp::Dropped { id, at, error } => Ok(conn
            .prepare_cached(
                "UPDATE subscriber_outbox SET status = 'dropped', done_ms = ?2, last_error = ?3
                 WHERE id = ?1 AND status = 'pending'",
            )?
            .execute(params![id, to_ms(*at), error])?
            as u64),
        SubscriberOp::EnsureKey { candidate } => Ok(conn
            .prepare_cached(
                "INSERT INTO store_meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
            )?
            .execute(params![KEY_META, candidate])?
            as u64),
        SubscriberOp::Prune { before } => {
            let t = to_ms(*before);
            let a = conn
                .prepare_cached("DELETE FROM subscriber_attempts WHERE at_ms < ?1")?
                .execute(params![t])?;
            let b = conn
                .prepare_cached(
                    "DELETE FROM subscriber_outbox WHERE status != 'pending' AND done_ms < ?1",
                )?
                .execute(params![t])?;
            let c = conn
                .prepare_cached(
                    "DELETE FROM subscribers WHERE confirmed_ms IS NULL AND created_ms < ?1",
                )?
                .execute(params![t])?;
            Ok((a + b + c) as u64)
        }
    }
}

fn count(conn: &Connection, sql: &str, p: &[&dyn super::sql::ToSql]) -> Result<u64, StoreError> {
    let n: i64 = conn.prepare_cached(sql)?.query_row(p, |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

fn subscribe(conn: &Connection, s: &NewSubscriber) -> Result<u64, StoreError> {
    let now = to_ms(s.now);
    let attempts = "SELECT COUNT(*) FROM subscriber_attempts WHERE key = ?1 AND at_ms > ?2";
    let hour = now - 3_600_000;
    if count(conn, attempts, &[&s.ip_key, &hour])? >= s.ip_limit {
        return Ok(IP);
    }
    let mut note =
        conn.prepare_cached("INSERT INTO subscriber_attempts (key, at_ms) VALUES (?1, ?2)")?;
    note.execute(params![s.ip_key, now])?;
    let existing: Option<(i64, Option<i64>)> = conn
        .prepare_cached(
            "SELECT id, confirmed_ms FROM subscribers WHERE kind = ?1 AND target = ?2 AND scope = ?3",
        )?
        .query_row(params![s.kind, s.target, s.scope], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    if let Some((_, Some(_))) = existing {
        return Ok(ALREADY);
    }
    let day = now - 86_400_000;
    if count(conn, attempts, &[&s.to_key, &day])? >= s.to_limit {
        return Ok(TARGET);
    }
    let id = match existing {
        Some((id, None)) => {
            conn.prepare_cached(
                "UPDATE subscribers SET secret = ?2, lang = ?3, created_ms = ?4 WHERE id = ?1",
            )?
            .execute(params![id, s.secret, s.lang, now])?;
            id
        }
        _ => {
            if count(conn, "SELECT COUNT(*) FROM subscribers", &[])? >= s.max_subscribers {
                return Ok(FULL);
            }
            conn.prepare_cached(
                "INSERT INTO subscribers (kind, target, scope, lang, secret, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
            )?
            .query_row(
                params![s.kind, s.target, s.scope, s.lang, s.secret, now],
                |r| r.get::<_, i64>(0),
            )?
        }
    };
    note.execute(params![s.to_key, now])?;
    conn.prepare_cached(
        "INSERT INTO subscriber_outbox (dedup_key, subscriber_id, body, created_ms, status, next_attempt_ms)
         VALUES (?1, ?2, ?3, ?4, 'pending', ?4) ON CONFLICT (dedup_key) DO NOTHING",
    )?
    .execute(params![format!("confirm:{id}:{now}"), id, s.confirm_body, now])?;
    Ok(u64::try_from(id).unwrap_or(0))
}

impl Writer {
    /// One write to the subscriber tables; resolves after COMMIT with the op's answer.
    pub async fn subscriber(&self, op: SubscriberOp) -> Result<u64, StoreError> {
        self.request(|ack: Ack<u64>| Command::Subscriber { op, ack })
            .await
    }

    /// A subscription, its limits checked and its confirmation queued in one transaction.
    pub async fn subscribe(&self, s: NewSubscriber) -> Result<Subscribed, StoreError> {
        Ok(
            match self
                .subscriber(SubscriberOp::Subscribe(Box::new(s)))
                .await?
            {
                ALREADY => Subscribed::Already,
                IP => Subscribed::TooManyFromIp,
                TARGET => Subscribed::TooManyForTarget,
                FULL => Subscribed::Full,
                id => Subscribed::Pending(i64::try_from(id).unwrap_or(0)),
            },
        )
    }
}

const COLUMNS: &str =
    "id, kind, target, scope, lang, secret, created_ms, confirmed_ms, failing_since_ms";

fn read(r: &Row<'_>) -> super::sql::Result<(SubscriberRow, i64, Option<i64>, Option<i64>)> {
    Ok((
        SubscriberRow {
            id: r.get(0)?,
            kind: r.get(1)?,
            target: r.get(2)?,
            scope: r.get(3)?,
            lang: r.get(4)?,
            secret: r.get(5)?,
            created_at: DateTime::<Utc>::UNIX_EPOCH,
            confirmed_at: None,
            failing_since: None,
        },
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
    ))
}

impl Reader {
    fn subscriber_query(
        &self,
        sql: &str,
        p: &[&dyn super::sql::ToSql],
    ) -> Result<Vec<SubscriberRow>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let mut out = Vec::new();
        for row in stmt.query_map(p, read)? {
            let (mut s, created, confirmed, failing) = row?;
            s.created_at = from_ms(created)?;
            s.confirmed_at = confirmed.map(from_ms).transpose()?;
            s.failing_since = failing.map(from_ms).transpose()?;
            out.push(s);
        }
        Ok(out)
    }

    /// Every subscriber, by id.
    pub fn subscribers(&self) -> Result<Vec<SubscriberRow>, StoreError> {
        self.subscriber_query(
            &format!("SELECT {COLUMNS} FROM subscribers ORDER BY id"),
            &[],
        )
    }

    pub fn subscriber(&self, id: i64) -> Result<Option<SubscriberRow>, StoreError> {
        Ok(self
            .subscriber_query(
                &format!("SELECT {COLUMNS} FROM subscribers WHERE id = ?1"),
                &[&id],
            )?
            .pop())
    }

    /// The stored link-signing key, if any.
    pub fn subscription_key(&self) -> Result<Option<String>, StoreError> {
        self.meta(KEY_META)
    }

    /// Pending subscriber messages due at `now`, oldest first.
    pub fn notices_due(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<NoticeRow>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, dedup_key, subscriber_id, body, created_ms, attempts FROM subscriber_outbox
             WHERE status = 'pending' AND next_attempt_ms <= ?1 ORDER BY id LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![to_ms(now), limit], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, u32>(5)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, dedup_key, subscriber_id, body, created, attempts) = row?;
            out.push(NoticeRow {
                id,
                dedup_key,
                subscriber_id,
                body,
                created_at: from_ms(created)?,
                attempts,
            });
        }
        Ok(out)
    }

    /// Every subscriber message's dedup key, status and attempts, by id (tests, figures).
    pub fn notices(&self) -> Result<Vec<(String, i64, String, u32)>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT dedup_key, subscriber_id, status, attempts FROM subscriber_outbox ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}
