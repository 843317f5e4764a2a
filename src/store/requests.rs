//! The proxy's tables (`migrations/*/0006_proxy.sql`, `0014_fleet.sql`): metering — one
//! `proxy_requests` row per request with its `proxy_attempts` — and idempotency keys with
//! their stored answers.
//!
//! An idempotency key is claimed before its first request runs ([`IdempotencyOp::Claim`]): a
//! pending row with a lease, inserted in a writer transaction (on PostgreSQL under the
//! writers' advisory lock), so of several proxies on one database exactly one gets it. The
//! claim also checks the client's share of the table in the same transaction.
//!
//! Writes go through the one writer thread like everything else ([`Writer::record_request`],
//! [`Writer::store_idempotent`]); reads are synchronous [`Reader`] methods (call them from
//! `spawn_blocking`). Metering rows are pruned with the raw outcomes (`retention_days`);
//! idempotency rows expire with their TTL (expired rows are never answered, and each insert
//! deletes a few expired ones).

use std::sync::Arc;

use super::sql::{params, Connection, OptionalExtension};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::writer::{Ack, Command, Queued};
use super::{from_ms, to_ms, Reader, StoreError, Writer};

/// Expired idempotency rows deleted per insert: cleanup keeps up with inserts, never stalls one.
const IDEMPOTENCY_PRUNE: i64 = 64;

/// One proxied request, as metered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub request_id: String,
    /// The logical model asked for.
    pub serves: String,
    pub started_at: DateTime<Utc>,
    /// The route that answered, or the last one tried.
    pub route: Option<String>,
    /// `ok`, `client_error` (the request's fault, returned as is), `failed` (no candidate
    /// answered), `interrupted` (a committed stream broke), `rejected` (refused before any
    /// upstream call: unknown model, every route rate limited, overloaded).
    pub outcome: String,
    /// The HTTP status the client got.
    pub status: u16,
    pub stream: bool,
    /// `x-probeok-fallback-reason`, when there was one.
    pub fallback_reason: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// From the answering route's `price` and the usage tokens.
    pub cost: Option<f64>,
    pub currency: Option<String>,
    pub latency_ms: f64,
    pub attempts: Vec<AttemptRecord>,
    /// The degradation contract behaviour that answered (`fallback_model`, `async_queue`,
    /// `cached_response`, `reject`), if one did.
    #[serde(default)]
    pub contract: Option<String>,
    /// The request's trace (32 hex digits), when the proxy traces.
    #[serde(default)]
    pub trace_id: Option<String>,
    /// The named client (`[[proxy.client]]` id) the request came from.
    #[serde(default)]
    pub client: Option<String>,
}

/// One attempt of a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// 1-based.
    pub n: u32,
    pub route: String,
    /// Why the request moved on from this attempt (`http_503`, `timeout_before_first_byte`,
    /// `rate_limited`, `breaker_open`, `overloaded`…); `None` when it did not.
    pub reason: Option<String>,
    /// `2xx`, `4xx`, `5xx`, or `none` (no HTTP answer).
    pub status_class: String,
    pub status: Option<u16>,
    pub ttfb_ms: Option<f64>,
    pub latency_ms: f64,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub cost: Option<f64>,
    /// `ok`, `client_error`, `failed`, `interrupted`, `skipped` (never sent: breaker open,
    /// or the route or its provider at its in-flight limit).
    pub outcome: String,
}

/// What `GET /api/v1/requests` filters on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestFilter {
    pub limit: usize,
    /// Requests with an attempt at this route.
    pub route: Option<String>,
    /// Requests with an attempt that moved on for this reason.
    pub reason: Option<String>,
    pub since: Option<DateTime<Utc>>,
}

/// A stored answer to an idempotency key.
#[derive(Debug, Clone, PartialEq)]
pub struct IdempotentAnswer {
    pub scope_key: String,
    /// Whose key it is (the client-key digest), for the per-client share.
    pub owner: String,
    pub body_hash: String,
    pub expires_at: DateTime<Utc>,
    pub status: u16,
    /// The headers that matter (content type, `x-probeok-*`, `x-request-id`).
    pub headers: Vec<(String, String)>,
    pub stream: bool,
    /// The answer body, or a stream's full event sequence.
    pub body: Vec<u8>,
}

/// What [`IdempotencyOp::Claim`] answers.
pub mod claim {
    /// Someone holds the key already (a pending claim or an answer): read it.
    pub const TAKEN: u64 = 0;
    /// The key is this caller's now.
    pub const CLAIMED: u64 = 1;
    /// The client already holds its share of keys.
    pub const OWNER_SHARE_FULL: u64 = 2;
}

/// A write to the idempotency table besides storing an answer.
#[derive(Debug, Clone)]
pub enum IdempotencyOp {
    /// Claims `scope_key` for a first request: a pending row held until `lease_until`, kept
    /// (once answered) until `expires_at`. An expired row or a lapsed claim is replaced. See
    /// [`claim`] for the answers.
    Claim {
        scope_key: String,
        owner: String,
        body_hash: String,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        expires_at: DateTime<Utc>,
        /// Keys one owner may hold (pending or answered, not expired) at once.
        max_per_owner: u64,
    },
    /// Gives a pending claim up (its request ended without an answer to keep). 1 if released.
    Release { scope_key: String },
    /// Extends a pending claim to `until` (its request is still running). 1 if renewed.
    Renew {
        scope_key: String,
        until: DateTime<Utc>,
    },
}

/// An idempotency key as the store holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum IdempotencyEntry {
    /// The first request's answer.
    Answered(IdempotentAnswer),
    /// The first request is still running (on this proxy or another), until `until` at most.
    Pending {
        body_hash: String,
        until: DateTime<Utc>,
    },
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// Writes a batch of metered requests with their attempts. Each statement is taken from the
/// connection's cache once per batch, not once per row: handing a statement back to the cache
/// copies its SQL into a new key, and per row that cost as much as binding the row's values.
pub(crate) fn insert_requests(
    conn: &Connection,
    records: &[RequestRecord],
) -> Result<(), StoreError> {
    macro_rules! insert {
        () => {
            "INSERT INTO proxy_requests (request_id, serves, started_at_ms, route, outcome,
             status, stream, attempts, fallback_reason, prompt_tokens, completion_tokens, cost,
             currency, latency_ms, contract, trace_id, client)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
        };
    }
    // SQLite runs `RETURNING` through a temporary table; the connection's last rowid is the
    // same answer, and the row's insert costs a third less on the metering's hot path.
    let sqlite = conn.as_sqlite();
    let mut request = match sqlite {
        Some(_) => conn.prepare_cached(insert!())?,
        None => conn.prepare_cached(concat!(insert!(), " RETURNING id"))?,
    };
    let mut attempt = conn.prepare_cached(
        "INSERT INTO proxy_attempts (request_pk, n, route, reason, status_class, status, ttfb_ms,
             latency_ms, prompt_tokens, completion_tokens, cost, outcome)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )?;
    for r in records {
        let latency = finite(r.latency_ms).unwrap_or(0.0);
        let values = params![
            r.request_id,
            r.serves,
            to_ms(r.started_at),
            r.route,
            r.outcome,
            r.status,
            r.stream,
            r.attempts.len() as i64,
            r.fallback_reason,
            r.prompt_tokens.map(|v| v as i64),
            r.completion_tokens.map(|v| v as i64),
            r.cost.and_then(finite),
            r.currency,
            latency,
            r.contract,
            r.trace_id,
            r.client,
        ];
        let pk = match sqlite {
            Some(sqlite) => {
                request.execute(values)?;
                sqlite.last_insert_rowid()
            }
            None => request.query_row(values, |row| row.get::<_, i64>(0))?,
        };
        for a in &r.attempts {
            attempt.execute(params![
                pk,
                a.n,
                a.route,
                a.reason,
                a.status_class,
                a.status,
                a.ttfb_ms.and_then(finite),
                finite(a.latency_ms).unwrap_or(0.0),
                a.prompt_tokens.map(|v| v as i64),
                a.completion_tokens.map(|v| v as i64),
                a.cost.and_then(finite),
                a.outcome,
            ])?;
        }
    }
    Ok(())
}

/// Deletes up to `limit` metered requests (their attempts cascade) older than `cutoff_ms`.
pub(crate) fn delete_old(
    conn: &Connection,
    cutoff_ms: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    super::jobs::delete_oldest(conn, "proxy_requests", "started_at_ms", cutoff_ms, limit)
}

fn prune_idempotent(conn: &Connection, now: DateTime<Utc>) -> Result<(), StoreError> {
    conn.prepare_cached(
        "DELETE FROM idempotency WHERE scope_key IN
             (SELECT scope_key FROM idempotency WHERE expires_at_ms <= ?1 LIMIT ?2)",
    )?
    .execute(params![to_ms(now), IDEMPOTENCY_PRUNE])?;
    Ok(())
}

pub(crate) fn upsert_idempotent(
    conn: &Connection,
    a: &IdempotentAnswer,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    prune_idempotent(conn, now)?;
    let headers = serde_json::to_string(&a.headers)
        .map_err(|e| StoreError::Invalid(format!("idempotent headers: {e}")))?;
    conn.prepare_cached(
        "INSERT INTO idempotency (scope_key, body_hash, expires_at_ms, status, headers, stream,
             body, owner, claimed_until_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULL)
         ON CONFLICT (scope_key) DO UPDATE SET body_hash = excluded.body_hash,
             expires_at_ms = excluded.expires_at_ms, status = excluded.status,
             headers = excluded.headers, stream = excluded.stream, body = excluded.body,
             owner = excluded.owner, claimed_until_ms = NULL",
    )?
    .execute(params![
        a.scope_key,
        a.body_hash,
        to_ms(a.expires_at),
        a.status,
        headers,
        a.stream,
        a.body,
        a.owner,
    ])?;
    Ok(())
}

pub(crate) fn apply_idempotency(conn: &Connection, op: &IdempotencyOp) -> Result<u64, StoreError> {
    match op {
        IdempotencyOp::Claim {
            scope_key,
            owner,
            body_hash,
            now,
            lease_until,
            expires_at,
            max_per_owner,
        } => {
            let now_ms = to_ms(*now);
            prune_idempotent(conn, *now)?;
            let held: Option<(i64, Option<i64>)> = conn
                .prepare_cached(
                    "SELECT expires_at_ms, claimed_until_ms FROM idempotency WHERE scope_key = ?1",
                )?
                .query_row(params![scope_key], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            if let Some((expires, claimed)) = held {
                let live = expires > now_ms && claimed.is_none_or(|until| until > now_ms);
                if live {
                    return Ok(claim::TAKEN);
                }
                // Expired, or its claimant died before answering: the key is free again.
                conn.prepare_cached("DELETE FROM idempotency WHERE scope_key = ?1")?
                    .execute(params![scope_key])?;
            }
            // The owner's keys (a row the triggers of migration 0017 keep) less those expired
            // but not pruned yet: one row and a short index range, not a count of every key.
            let all: i64 = conn
                .prepare_cached("SELECT keys FROM idempotency_owners WHERE owner = ?1")?
                .query_row(params![owner], |r| r.get(0))
                .optional()?
                .unwrap_or(0);
            let expired: i64 = conn
                .prepare_cached(
                    "SELECT COUNT(*) FROM idempotency WHERE owner = ?1 AND expires_at_ms <= ?2",
                )?
                .query_row(params![owner, now_ms], |r| r.get(0))?;
            let owned = all - expired;
            if u64::try_from(owned).unwrap_or(0) >= *max_per_owner {
                return Ok(claim::OWNER_SHARE_FULL);
            }
            conn.prepare_cached(
                "INSERT INTO idempotency (scope_key, body_hash, expires_at_ms, status, headers,
                     stream, body, owner, claimed_until_ms)
                 VALUES (?1, ?2, ?3, 0, '[]', ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                scope_key,
                body_hash,
                to_ms(*expires_at),
                false,
                Vec::<u8>::new(),
                owner,
                to_ms(*lease_until),
            ])?;
            Ok(claim::CLAIMED)
        }
        IdempotencyOp::Release { scope_key } => {
            let n = conn
                .prepare_cached(
                    "DELETE FROM idempotency WHERE scope_key = ?1 AND claimed_until_ms IS NOT NULL",
                )?
                .execute(params![scope_key])?;
            Ok(n as u64)
        }
        IdempotencyOp::Renew { scope_key, until } => {
            let n = conn
                .prepare_cached(
                    "UPDATE idempotency SET claimed_until_ms = ?2
                     WHERE scope_key = ?1 AND claimed_until_ms IS NOT NULL",
                )?
                .execute(params![scope_key, to_ms(*until)])?;
            Ok(n as u64)
        }
    }
}

impl Writer {
    /// Stores one metered request with its attempts; resolves after COMMIT.
    pub async fn record_request(&self, record: RequestRecord) -> Result<(), StoreError> {
        self.record_requests(Arc::new([record])).await
    }

    /// Stores metered requests with their attempts in one transaction (all or none);
    /// resolves after COMMIT.
    pub async fn record_requests(&self, records: Arc<[RequestRecord]>) -> Result<(), StoreError> {
        self.request(|ack: Ack<()>| Command::ProxyRequests { records, ack })
            .await
    }

    /// Stores (or replaces) the answer to an idempotency key; resolves after COMMIT.
    pub async fn store_idempotent(
        &self,
        answer: IdempotentAnswer,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.queue_idempotent(answer, now).await?.committed().await
    }

    /// Queues the answer to an idempotency key; resolves once it is queued
    /// ([`Queued::committed`] resolves after its COMMIT). The writer takes commands in order,
    /// so any write queued later through this writer (a repeat's claim) sees the answer.
    pub async fn queue_idempotent(
        &self,
        answer: IdempotentAnswer,
        now: DateTime<Utc>,
    ) -> Result<Queued<()>, StoreError> {
        self.queue(|ack: Ack<()>| Command::Idempotent {
            answer: Box::new(answer),
            now,
            ack,
        })
        .await
    }

    /// Claims or releases an idempotency key; resolves after COMMIT with the op's answer.
    pub async fn idempotency(&self, op: IdempotencyOp) -> Result<u64, StoreError> {
        self.request(|ack: Ack<u64>| Command::Idempotency { op, ack })
            .await
    }
}

type RequestRow = (
    i64,
    String,
    String,
    i64,
    Option<String>,
    String,
    u16,
    bool,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<f64>,
    Option<String>,
    f64,
    Option<String>,
    Option<String>,
    Option<String>,
);

impl Reader {
    /// Metered requests, newest first, filtered (`limit` is the caller's bounded value).
    pub fn proxy_requests(&self, f: &RequestFilter) -> Result<Vec<RequestRecord>, StoreError> {
        // The casts give PostgreSQL each optional filter's type (an `IS NULL` alone has none).
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, request_id, serves, started_at_ms, route, outcome, status, stream,
                    fallback_reason, prompt_tokens, completion_tokens, cost, currency, latency_ms,
                    contract, trace_id, client
             FROM proxy_requests r
             WHERE (CAST(?1 AS BIGINT) IS NULL OR started_at_ms >= ?1)
               AND (CAST(?2 AS TEXT) IS NULL OR EXISTS (SELECT 1 FROM proxy_attempts a
                                          WHERE a.request_pk = r.id AND a.route = ?2))
               AND (CAST(?3 AS TEXT) IS NULL OR EXISTS (SELECT 1 FROM proxy_attempts a
                                          WHERE a.request_pk = r.id AND a.reason = ?3))
             ORDER BY started_at_ms DESC, id DESC LIMIT ?4",
        )?;
        let rows: Vec<RequestRow> = stmt
            .query_map(
                params![
                    f.since.map(to_ms),
                    f.route,
                    f.reason,
                    i64::try_from(f.limit).unwrap_or(i64::MAX)
                ],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                        r.get(8)?,
                        r.get(9)?,
                        r.get(10)?,
                        r.get(11)?,
                        r.get(12)?,
                        r.get(13)?,
                        r.get(14)?,
                        r.get(15)?,
                        r.get(16)?,
                    ))
                },
            )?
            .collect::<Result<_, _>>()?;
        let mut attempts = self.conn.prepare_cached(
            "SELECT n, route, reason, status_class, status, ttfb_ms, latency_ms, prompt_tokens,
                    completion_tokens, cost, outcome
             FROM proxy_attempts WHERE request_pk = ?1 ORDER BY n",
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for (
            pk,
            request_id,
            serves,
            at,
            route,
            outcome,
            status,
            stream,
            fb,
            pt,
            ct,
            cost,
            cur,
            lat,
            contract,
            trace_id,
            client,
        ) in rows
        {
            let list = attempts
                .query_map([pk], |r| {
                    Ok(AttemptRecord {
                        n: r.get(0)?,
                        route: r.get(1)?,
                        reason: r.get(2)?,
                        status_class: r.get(3)?,
                        status: r.get(4)?,
                        ttfb_ms: r.get(5)?,
                        latency_ms: r.get(6)?,
                        prompt_tokens: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
                        completion_tokens: r.get::<_, Option<i64>>(8)?.map(|v| v as u64),
                        cost: r.get(9)?,
                        outcome: r.get(10)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            out.push(RequestRecord {
                request_id,
                serves,
                started_at: from_ms(at)?,
                route,
                outcome,
                status,
                stream,
                fallback_reason: fb,
                prompt_tokens: pt.map(|v| v as u64),
                completion_tokens: ct.map(|v| v as u64),
                cost,
                currency: cur,
                latency_ms: lat,
                attempts: list,
                contract,
                trace_id,
                client,
            });
        }
        Ok(out)
    }

    /// The trace ids of up to `limit` traced requests, newest first, with an attempt at
    /// `route` that failed or broke between `from` and `to` (open end: until now): the
    /// requests that fell inside an incident of that route.
    pub fn failed_request_traces(
        &self,
        route: &str,
        from: DateTime<Utc>,
        to: Option<DateTime<Utc>>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT r.trace_id FROM proxy_requests r
             WHERE r.trace_id IS NOT NULL AND r.started_at_ms >= ?2
               AND (?3 IS NULL OR r.started_at_ms <= ?3)
               AND EXISTS (SELECT 1 FROM proxy_attempts a
                           WHERE a.request_pk = r.id AND a.route = ?1
                             AND a.outcome IN ('failed', 'interrupted'))
             ORDER BY r.started_at_ms DESC, r.id DESC LIMIT ?4",
        )?;
        let rows = stmt.query_map(
            params![
                route,
                to_ms(from),
                to.map(to_ms),
                i64::try_from(limit).unwrap_or(i64::MAX)
            ],
            |r| r.get(0),
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The stored answer to `scope_key`, unless it expired by `now` (a pending claim is no
    /// answer).
    pub fn idempotent(
        &self,
        scope_key: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<IdempotentAnswer>, StoreError> {
        Ok(match self.idempotency_entry(scope_key, now)? {
            Some(IdempotencyEntry::Answered(a)) => Some(a),
            _ => None,
        })
    }

    /// The key's answer or its live pending claim at `now`; `None` when it is free (never
    /// used, expired, or its claim lapsed).
    pub fn idempotency_entry(
        &self,
        scope_key: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<IdempotencyEntry>, StoreError> {
        let row = self
            .conn
            .prepare_cached(
                "SELECT body_hash, expires_at_ms, status, headers, stream, body, owner,
                        claimed_until_ms
                 FROM idempotency WHERE scope_key = ?1 AND expires_at_ms > ?2",
            )?
            .query_row(params![scope_key, to_ms(now)], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, u16>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, bool>(4)?,
                    r.get::<_, Vec<u8>>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, Option<i64>>(7)?,
                ))
            })
            .optional()?;
        let Some((body_hash, expires, status, headers, stream, body, owner, claimed)) = row else {
            return Ok(None);
        };
        if let Some(until) = claimed {
            if until <= to_ms(now) {
                return Ok(None);
            }
            return Ok(Some(IdempotencyEntry::Pending {
                body_hash,
                until: from_ms(until)?,
            }));
        }
        let headers: Vec<(String, String)> = serde_json::from_str(&headers)
            .map_err(|e| StoreError::Corrupt(format!("idempotent headers: {e}")))?;
        Ok(Some(IdempotencyEntry::Answered(IdempotentAnswer {
            scope_key: scope_key.to_owned(),
            owner,
            body_hash,
            expires_at: from_ms(expires)?,
            status,
            headers,
            stream,
            body,
        })))
    }
}
