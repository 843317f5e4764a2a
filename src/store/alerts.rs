//! Alert tables (`migrations/*/0004_alerts.sql`): the outbox, the firing alerts and silences.
//! Writes go through the writer thread as [`AlertOp`]s (one transaction each, so an enqueue
//! and the firing-state change that goes with it commit together); reads are [`Reader`]
//! methods. Messages are stored as JSON text; this module does not look inside them.
//!
//! A firing message is stored once however many firing rows share it
//! (`migrations/*/0019_alert_messages.sql`): a provider-wide message names every route it
//! groups, and each of those routes is a firing row, so a copy per row grew as routes².

use std::collections::HashMap;
use std::sync::Arc;

use super::sql::{params, Connection, OptionalExtension};
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use super::{from_ms, to_ms, Reader, StoreError};
use crate::silence::Silence;

/// One message for one channel, to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    pub dedup_key: String,
    pub channel: String,
    pub message: String,
    pub created_at: DateTime<Utc>,
}

/// An outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub id: i64,
    pub dedup_key: String,
    pub channel: String,
    pub message: String,
    pub created_at: DateTime<Utc>,
    /// `pending`, `delivered` or `dropped`.
    pub status: String,
    pub attempts: u32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_error: Option<String>,
}

/// A firing alert. Rows of one message share its text: written, it is stored once (rows that
/// come one after another with the same `Arc` are digested once); read, rows of one stored
/// message hold the same `Arc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiringRow {
    pub key: String,
    pub message: Arc<str>,
    pub opened_at: DateTime<Utc>,
}

/// The stored name of a message: the SHA-256 of its text, in hex.
fn digest(message: &str) -> String {
    Sha256::digest(message.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A write to the alert tables.
#[derive(Debug, Clone)]
pub enum AlertOp {
    /// Inserts entries (a known dedup key is skipped), records firing alerts and forgets
    /// resolved ones, atomically. Answers how many entries were new.
    Enqueue {
        entries: Vec<NewEntry>,
        firing: Vec<FiringRow>,
        resolved: Vec<String>,
    },
    /// Takes a pending row due at `now` for one member's attempt: its `next_attempt_ms`
    /// moves to `until`, so no other member sharing the database finds it due until then
    /// (nor this one: the claim's expiry is its owner's mark). Answers 1 when claimed, 0 when
    /// the row is no longer pending or already claimed — by one statement, so two members
    /// never both win it.
    Claim {
        id: i64,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    },
    Delivered {
        id: i64,
        at: DateTime<Utc>,
    },
    /// A failed attempt: count it (or not, when only deferred) and wait until `next`. With
    /// `claim`, only while the row is still under that claim (one that expired and was taken
    /// by another member is theirs to settle).
    Retry {
        id: i64,
        count_attempt: bool,
        next: DateTime<Utc>,
        error: Option<String>,
        claim: Option<DateTime<Utc>>,
    },
    /// Past its maximum age (or for a channel that no longer exists): given up.
    Dropped {
        id: i64,
        at: DateTime<Utc>,
        error: String,
    },
    PutSilence(Silence),
    /// Answers 1 when it existed.
    DeleteSilence(String),
    /// Deletes delivered/dropped rows finished before `before` and silences ended before it.
    Prune {
        before: DateTime<Utc>,
    },
    /// Keeps the outbox within `max_rows`: deletes the oldest rows beyond it, delivered and
    /// dropped ones first, pending ones only when nothing else is left. Answers how many.
    Bound {
        max_rows: u64,
    },
}

pub(crate) fn apply(conn: &Connection, op: &AlertOp) -> Result<u64, StoreError> {
    match op {
        AlertOp::Enqueue {
            entries,
            firing,
            resolved,
        } => {
            let mut n = 0;
            let mut ins = conn.prepare_cached(
                "INSERT INTO alert_outbox (dedup_key, channel, message, created_ms, status, next_attempt_ms)
                 VALUES (?1, ?2, ?3, ?4, 'pending', ?4)
                 ON CONFLICT (dedup_key) DO NOTHING",
            )?;
            for e in entries {
                let t = to_ms(e.created_at);
                n += ins.execute(params![e.dedup_key, e.channel, e.message, t])? as u64;
            }
            let mut text = conn.prepare_cached(
                "INSERT INTO alert_messages (digest, message) VALUES (?1, ?2)
                 ON CONFLICT (digest) DO NOTHING",
            )?;
            let mut put = conn.prepare_cached(
                "INSERT INTO alert_state (key, digest, opened_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (key) DO UPDATE SET digest = excluded.digest",
            )?;
            let mut last: Option<(&Arc<str>, String)> = None;
            for f in firing {
                let d = match &last {
                    Some((m, d)) if Arc::ptr_eq(m, &f.message) => d.clone(),
                    _ => {
                        let d = digest(&f.message);
                        text.execute(params![d, &*f.message])?;
                        last = Some((&f.message, d.clone()));
                        d
                    }
                };
                put.execute(params![f.key, d, to_ms(f.opened_at)])?;
            }
            let mut del = conn.prepare_cached("DELETE FROM alert_state WHERE key = ?1")?;
            for k in resolved {
                del.execute(params![k])?;
            }
            if !firing.is_empty() || !resolved.is_empty() {
                // A message no firing row names any more (resolved, or replaced) goes with it.
                conn.prepare_cached(
                    "DELETE FROM alert_messages WHERE NOT EXISTS
                         (SELECT 1 FROM alert_state s WHERE s.digest = alert_messages.digest)",
                )?
                .execute([])?;
            }
            Ok(n)
        }
        AlertOp::Claim { id, now, until } => Ok(conn
            .prepare_cached(
                "UPDATE alert_outbox SET next_attempt_ms = ?3
                 WHERE id = ?1 AND status = 'pending' AND next_attempt_ms <= ?2",
            )?
            .execute(params![id, to_ms(*now), to_ms(*until)])?
            as u64),
        AlertOp::Delivered { id, at } => Ok(conn
            .prepare_cached(
                "UPDATE alert_outbox SET status = 'delivered', attempts = attempts + 1,
                     done_ms = ?2, last_error = NULL
                 WHERE id = ?1 AND status = 'pending'",
            )?
            .execute(params![id, to_ms(*at)])? as u64),
        AlertOp::Retry {
            id,
            count_attempt,
            next,
            error,
            claim,
        } => Ok(conn
            .prepare_cached(
                "UPDATE alert_outbox SET attempts = attempts + ?2, next_attempt_ms = ?3,
                     last_error = coalesce(?4, last_error)
                 WHERE id = ?1 AND status = 'pending' AND (CAST(?5 AS BIGINT) IS NULL OR next_attempt_ms = ?5)",
            )?
            .execute(params![
                id,
                i64::from(*count_attempt),
                to_ms(*next),
                error,
                claim.map(to_ms)
            ])? as u64),
        AlertOp::Dropped { id, at, error } => Ok(conn
            .prepare_cached(
                "UPDATE alert_outbox SET status = 'dropped', done_ms = ?2, last_error = ?3
                 WHERE id = ?1 AND status = 'pending'",
            )?
            .execute(params![id, to_ms(*at), error])?
            as u64),
        AlertOp::PutSilence(s) => {
            let routes =
                serde_json::to_string(&s.routes).map_err(|e| StoreError::Invalid(e.to_string()))?;
            conn.prepare_cached(
                "INSERT INTO alert_silences (id, routes, starts_ms, ends_ms, comment, created_by, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (id) DO UPDATE SET routes = excluded.routes,
                     starts_ms = excluded.starts_ms, ends_ms = excluded.ends_ms,
                     comment = excluded.comment",
            )?
            .execute(params![
                s.id,
                routes,
                to_ms(s.starts_at),
                to_ms(s.ends_at),
                s.comment,
                s.created_by,
                to_ms(s.created_at)
            ])?;
            Ok(1)
        }
        AlertOp::DeleteSilence(id) => Ok(conn
            .prepare_cached("DELETE FROM alert_silences WHERE id = ?1")?
            .execute(params![id])? as u64),
        AlertOp::Prune { before } => {
            let t = to_ms(*before);
            let a = conn
                .prepare_cached(
                    "DELETE FROM alert_outbox WHERE status != 'pending' AND done_ms < ?1",
                )?
                .execute(params![t])?;
            let b = conn
                .prepare_cached("DELETE FROM alert_silences WHERE ends_ms < ?1")?
                .execute(params![t])?;
            Ok((a + b) as u64)
        }
        AlertOp::Bound { max_rows } => {
            let rows: i64 = conn
                .prepare_cached("SELECT COUNT(*) FROM alert_outbox")?
                .query_row([], |r| r.get(0))?;
            let over = rows.saturating_sub(i64::try_from(*max_rows).unwrap_or(i64::MAX));
            if over <= 0 {
                return Ok(0);
            }
            let n = conn
                .prepare_cached(
                    "DELETE FROM alert_outbox WHERE id IN
                         (SELECT id FROM alert_outbox
                          ORDER BY CASE WHEN status = 'pending' THEN 1 ELSE 0 END, id
                          LIMIT ?1)",
                )?
                .execute(params![over])?;
            Ok(n as u64)
        }
    }
}

fn outbox_row(r: &super::sql::Row<'_>) -> super::sql::Result<(OutboxRow, i64, i64)> {
    Ok((
        OutboxRow {
            id: r.get(0)?,
            dedup_key: r.get(1)?,
            channel: r.get(2)?,
            message: r.get(3)?,
            created_at: DateTime::<Utc>::UNIX_EPOCH,
            status: r.get(5)?,
            attempts: r.get(6)?,
            next_attempt_at: DateTime::<Utc>::UNIX_EPOCH,
            last_error: r.get(8)?,
        },
        r.get(4)?,
        r.get(7)?,
    ))
}

const OUTBOX_COLUMNS: &str = "id, dedup_key, channel, message, created_ms, status, attempts, \
                              next_attempt_ms, last_error";

impl Reader {
    fn outbox_query(
        &self,
        sql: &str,
        p: &[&dyn super::sql::ToSql],
    ) -> Result<Vec<OutboxRow>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let rows = stmt.query_map(p, outbox_row)?;
        let mut out = Vec::new();
        for row in rows {
            let (mut r, created, next) = row?;
            r.created_at = from_ms(created)?;
            r.next_attempt_at = from_ms(next)?;
            out.push(r);
        }
        Ok(out)
    }

    /// Pending entries due at `now`, oldest first, at most `limit`.
    pub fn outbox_due(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.outbox_query(
            &format!(
                "SELECT {OUTBOX_COLUMNS} FROM alert_outbox
                 WHERE status = 'pending' AND next_attempt_ms <= ?1 ORDER BY id LIMIT ?2"
            ),
            &[&to_ms(now), &limit],
        )
    }

    /// When the next pending entry is due, if any is pending.
    pub fn outbox_next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let ms: Option<i64> = self
            .conn
            .prepare_cached(
                "SELECT min(next_attempt_ms) FROM alert_outbox WHERE status = 'pending'",
            )?
            .query_row([], |r| r.get(0))
            .optional()?
            .flatten();
        ms.map(from_ms).transpose()
    }

    /// Every outbox row, oldest first (tests, diagnostics).
    pub fn outbox_all(&self) -> Result<Vec<OutboxRow>, StoreError> {
        self.outbox_query(
            &format!("SELECT {OUTBOX_COLUMNS} FROM alert_outbox ORDER BY id"),
            &[],
        )
    }

    /// Every firing alert, by key; rows of one message share its text.
    pub fn alert_firing(&self) -> Result<Vec<FiringRow>, StoreError> {
        let mut texts: HashMap<String, Arc<str>> = HashMap::new();
        let mut stmt = self
            .conn
            .prepare_cached("SELECT digest, message FROM alert_messages")?;
        for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))? {
            let (d, m) = row?;
            texts.insert(d, Arc::from(m));
        }
        let mut stmt = self
            .conn
            .prepare_cached("SELECT key, digest, opened_ms FROM alert_state ORDER BY key")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (key, d, opened) = row?;
            let message = texts
                .get(&d)
                .cloned()
                .ok_or_else(|| StoreError::Corrupt(format!("firing alert {key}: no message")))?;
            out.push(FiringRow {
                key,
                message,
                opened_at: from_ms(opened)?,
            });
        }
        Ok(out)
    }

    /// The keys of every firing alert (without their messages).
    pub fn alert_firing_keys(&self) -> Result<Vec<String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT key FROM alert_state ORDER BY key")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row?);
        }
        Ok(out)
    }

    /// The bytes of firing-message text stored, and how many messages hold them (diagnostics:
    /// this grows with the routes alerting, not with their square).
    pub fn alert_message_bytes(&self) -> Result<(u64, u64), StoreError> {
        let (bytes, n): (Option<i64>, i64) = self
            .conn
            .prepare_cached(
                "SELECT CAST(SUM(length(message)) AS BIGINT), count(*) FROM alert_messages",
            )?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok((
            u64::try_from(bytes.unwrap_or(0)).unwrap_or(0),
            u64::try_from(n).unwrap_or(0),
        ))
    }

    /// Every stored silence (ended ones too, until pruned), by start.
    pub fn silences(&self) -> Result<Vec<Silence>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, routes, starts_ms, ends_ms, comment, created_by, created_ms
             FROM alert_silences ORDER BY starts_ms, id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, i64>(6)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, routes, s, e, comment, created_by, c) = row?;
            out.push(Silence {
                id,
                routes: serde_json::from_str(&routes)
                    .map_err(|e| StoreError::Corrupt(format!("silence routes: {e}")))?,
                starts_at: from_ms(s)?,
                ends_at: from_ms(e)?,
                comment,
                created_by,
                created_at: from_ms(c)?,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Store, StoreOptions};

    /// Past its row bound the outbox loses its oldest done rows first, pending ones last.
    #[tokio::test]
    async fn the_outbox_is_bounded_by_rows_done_ones_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("a.db"), StoreOptions::default()).unwrap();
        let w = store.writer();
        let t0 = DateTime::from_timestamp(1_767_225_600, 0).unwrap();
        let entries = (0..6)
            .map(|i| NewEntry {
                dedup_key: format!("k{i}#ch"),
                channel: "ch".into(),
                message: "{}".into(),
                created_at: t0 + chrono::Duration::seconds(i),
            })
            .collect();
        let op = AlertOp::Enqueue {
            entries,
            firing: Vec::new(),
            resolved: Vec::new(),
        };
        assert_eq!(w.alert(op).await.unwrap(), 6);
        let ids: Vec<i64> = (store.reader().unwrap().outbox_all().unwrap())
            .iter()
            .map(|r| r.id)
            .collect();
        // The two newest were delivered, the others are pending.
        for id in &ids[4..] {
            let op = AlertOp::Delivered { id: *id, at: t0 };
            w.alert(op).await.unwrap();
        }
        assert_eq!(w.alert(AlertOp::Bound { max_rows: 6 }).await.unwrap(), 0);
        assert_eq!(w.alert(AlertOp::Bound { max_rows: 3 }).await.unwrap(), 3);
        let mut left: Vec<(String, String)> = (store.reader().unwrap().outbox_all().unwrap())
            .into_iter()
            .map(|r| (r.dedup_key, r.status))
            .collect();
        left.sort();
        let pending = |k: &str| (k.to_owned(), "pending".to_owned());
        assert_eq!(
            left,
            vec![pending("k1#ch"), pending("k2#ch"), pending("k3#ch")]
        );
    }
}
