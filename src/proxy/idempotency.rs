//! `Idempotency-Key`: a repeated key within `idempotency_ttl` never reaches an upstream twice,
//! whichever proxy of a fleet on one database it reaches.
//!
//! - A key is scoped per client: `sha256(client key)[..16] ":" key` (the client key itself is
//!   never stored). Keys are 1–255 visible ASCII characters, else 400.
//! - The first request **claims** the key in the store before it runs: a pending row, inserted
//!   in a writer transaction (on PostgreSQL under the writers' advisory lock), so of any number
//!   of proxies exactly one gets it. The claim has a lease ([`CLAIM_LEASE`]) that the running
//!   request renews; a proxy that dies mid-request leaves it to lapse, and the key is free again.
//! - A repeat while the first runs waits for its answer, polling the store, up to
//!   `idempotency_wait`; still running then: 409 `idempotency_in_progress`.
//! - When the first request ends with an upstream's answer (2xx, or the client's own 4xx
//!   returned as is), the answer is stored (status, the headers that matter, body — for streams
//!   the full event sequence) until the TTL; a repeat gets it back with
//!   `x-probeok-idempotent-replay: true`. The same key with a different body gets 422.
//! - Answers the proxy made up (every candidate failed, 503/504; bad input) are not stored and
//!   the claim is released: no upstream produced an answer, so a retry may try again. A client
//!   that hangs up mid-stream leaves nothing stored either. Answers larger than `max_body` are
//!   not stored (logged).
//! - One client holds at most `idempotency_keys_per_client` live keys (checked in the claim's
//!   transaction; without client auth there is one client and no share): beyond, 429
//!   `client_idempotency_keys_full`.
//! - A store that is unavailable (read-only mode) or cannot be read fails closed with 503
//!   `store_unavailable`: the guarantee is "never twice".

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::clock::Clock;
use crate::store::{claim, IdempotencyEntry, IdempotencyOp, IdempotentAnswer, Store, StoreError};

/// How long a claim holds without renewal; the running request renews it every third of it.
pub const CLAIM_LEASE: Duration = Duration::from_secs(60);
/// The first poll of a waiting repeat; later polls back off to [`POLL_MAX`].
const POLL_MIN: Duration = Duration::from_millis(20);
const POLL_MAX: Duration = Duration::from_millis(250);

/// Headers kept with a stored answer.
pub const KEPT_HEADERS: &[&str] = &[
    "content-type",
    "x-probeok-route",
    "x-probeok-attempts",
    "x-probeok-mode",
    "x-probeok-fallback-reason",
    "x-probeok-degraded-since",
    "x-request-id",
    // A contract's answers (an async job's 202 above all: a retry gets the same job).
    "location",
    "retry-after",
    "x-probeok-model",
    "x-probeok-user-message",
];

/// The idempotency keys of one proxy (shared with every proxy on its database).
pub struct Idempotency {
    store: Store,
    clock: Arc<dyn Clock>,
    ttl: Duration,
    /// How long a repeat waits for a running first request's answer.
    wait: Duration,
    max_answer: usize,
    /// Live keys one client may hold.
    per_client: u64,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("ttl", &self.ttl)
            .field("per_client", &self.per_client)
            .finish_non_exhaustive()
    }
}

/// What a request with a key should do.
pub enum Lookup {
    /// The stored answer.
    Replay(IdempotentAnswer),
    /// The first request with this key is still running (past the wait).
    InProgress,
    /// The key was used with another body.
    Mismatch,
    /// The client holds its share of keys already.
    ClientFull { max: u64 },
    /// The store is unavailable or could not be read.
    Unavailable,
    /// First use: proceed, and store the answer through the guard.
    Proceed(Guard),
}

/// Holds a key's claim while its first request runs (renewing it); releases it when dropped
/// without an answer stored.
pub struct Guard {
    owner: Arc<Idempotency>,
    scope: String,
    client: String,
    body_hash: String,
    renew: tokio::task::AbortHandle,
    answered: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.renew.abort();
        if self.answered {
            return;
        }
        let writer = self.owner.store.writer();
        let op = IdempotencyOp::Release {
            scope_key: self.scope.clone(),
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = writer.idempotency(op).await {
                    // The claim lapses with its lease instead.
                    tracing::warn!(error = %e, "cannot release an idempotency key");
                }
            });
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A malformed `Idempotency-Key` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadKey;

/// The request's key, if it sent one; `Err` when it is malformed.
pub fn key_of(headers: &HeaderMap) -> Result<Option<String>, BadKey> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let s = v.to_str().map_err(|_| BadKey)?.trim();
    if s.is_empty() || s.len() > 255 || !s.chars().all(|c| c.is_ascii_graphic()) {
        return Err(BadKey);
    }
    Ok(Some(s.to_owned()))
}

impl Idempotency {
    pub fn new(
        store: Store,
        clock: Arc<dyn Clock>,
        ttl: Duration,
        wait: Duration,
        max_answer: usize,
        per_client: u64,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            clock,
            ttl,
            wait,
            max_answer,
            per_client,
        })
    }

    fn unavailable(&self, e: &StoreError) -> Lookup {
        self.store.health().failed(e, self.clock.now());
        tracing::error!(error = %e, "cannot check an idempotency key");
        Lookup::Unavailable
    }

    /// Looks `key` up for the client `client_key` (empty without client auth): the stored
    /// answer, the claim, or a bounded wait for another request's answer.
    pub async fn lookup(
        self: &Arc<Self>,
        client_key: &str,
        key: &str,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Lookup {
        if !self.store.health().available() {
            return Lookup::Unavailable;
        }
        let client = super::contract::owner_of(client_key);
        let scope = format!("{}:{key}", &client[..16]);
        let body_hash = hex(&Sha256::digest(body));
        // Without client auth every request is one client: the whole table is its share.
        let max_per_owner = if client_key.is_empty() {
            u64::MAX
        } else {
            self.per_client
        };
        let deadline = tokio::time::Instant::now() + self.wait;
        let mut pause = POLL_MIN;
        let mut now = now;
        // A first request (the usual case) claims at once: one store round trip, not a read
        // and then a claim. The claim answers TAKEN for a live key, which is read below.
        let mut read = false;
        loop {
            if !std::mem::replace(&mut read, true) {
                match self
                    .claim(&scope, &client, &body_hash, now, max_per_owner)
                    .await
                {
                    Ok(claim::CLAIMED) => {
                        return Lookup::Proceed(self.guard(scope, client, body_hash))
                    }
                    Ok(claim::OWNER_SHARE_FULL) => {
                        return Lookup::ClientFull {
                            max: self.per_client,
                        }
                    }
                    Ok(_) => {}
                    Err(e) => return self.unavailable(&e),
                }
            }
            let store = self.store.clone();
            let s = scope.clone();
            let read =
                tokio::task::spawn_blocking(move || store.reader()?.idempotency_entry(&s, now))
                    .await;
            match read {
                Ok(Ok(Some(IdempotencyEntry::Answered(a)))) if a.body_hash == body_hash => {
                    return Lookup::Replay(a)
                }
                Ok(Ok(Some(IdempotencyEntry::Answered(_)))) => return Lookup::Mismatch,
                Ok(Ok(Some(IdempotencyEntry::Pending { body_hash: h, .. }))) => {
                    if h != body_hash {
                        return Lookup::Mismatch;
                    }
                    if tokio::time::Instant::now() + pause > deadline {
                        return Lookup::InProgress;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(POLL_MAX);
                    now = self.clock.now();
                    continue;
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => return self.unavailable(&e),
                Err(_) => return Lookup::Unavailable,
            }
            match self
                .claim(&scope, &client, &body_hash, now, max_per_owner)
                .await
            {
                Ok(claim::CLAIMED) => return Lookup::Proceed(self.guard(scope, client, body_hash)),
                Ok(claim::OWNER_SHARE_FULL) => {
                    return Lookup::ClientFull {
                        max: self.per_client,
                    }
                }
                // Another request claimed it between the read and the claim: read again,
                // within the same wait.
                Ok(_) if tokio::time::Instant::now() < deadline => {}
                Ok(_) => return Lookup::InProgress,
                Err(e) => return self.unavailable(&e),
            }
        }
    }

    /// Claims `scope` for this request (see [`claim`] for the answers).
    async fn claim(
        &self,
        scope: &str,
        client: &str,
        body_hash: &str,
        now: DateTime<Utc>,
        max_per_owner: u64,
    ) -> Result<u64, StoreError> {
        let op = IdempotencyOp::Claim {
            scope_key: scope.to_owned(),
            owner: client.to_owned(),
            body_hash: body_hash.to_owned(),
            now,
            lease_until: now + chrono::Duration::from_std(CLAIM_LEASE).unwrap_or_default(),
            expires_at: now + chrono::Duration::from_std(self.ttl).unwrap_or_default(),
            max_per_owner,
        };
        self.store.writer().idempotency(op).await
    }

    /// The claim's guard, with the task that renews its lease while the request runs.
    fn guard(self: &Arc<Self>, scope: String, client: String, body_hash: String) -> Guard {
        let writer = self.store.writer();
        let clock = self.clock.clone();
        let key = scope.clone();
        let renew = tokio::spawn(async move {
            let every = CLAIM_LEASE / 3;
            loop {
                tokio::time::sleep(every).await;
                let until =
                    clock.now() + chrono::Duration::from_std(CLAIM_LEASE).unwrap_or_default();
                let op = IdempotencyOp::Renew {
                    scope_key: key.clone(),
                    until,
                };
                if let Err(e) = writer.idempotency(op).await {
                    tracing::warn!(error = %e, "cannot renew an idempotency key's claim");
                }
            }
        })
        .abort_handle();
        Guard {
            owner: self.clone(),
            scope,
            client,
            body_hash,
            renew,
            answered: false,
        }
    }
}

impl Guard {
    /// Stores the first request's answer (then releases the key). Resolves once the write is
    /// queued, not committed: the client need not wait for the commit. The key stays claimed
    /// until then, so a repeat that comes meanwhile waits for the answer, and one that reaches
    /// this proxy queues its claim behind the answer and finds it at once. Should the commit
    /// fail, the claim is released, as when the answer could not be kept at all.
    pub async fn store(
        self,
        status: u16,
        headers: &HeaderMap,
        stream: bool,
        body: Vec<u8>,
        now: DateTime<Utc>,
    ) {
        if body.len() > self.owner.max_answer {
            tracing::warn!(
                bytes = body.len(),
                "answer too large to keep for its idempotency key"
            );
            return;
        }
        let kept = KEPT_HEADERS
            .iter()
            .filter_map(|name| {
                let v = headers.get(*name)?.to_str().ok()?;
                Some(((*name).to_owned(), v.to_owned()))
            })
            .collect();
        let expires_at = now + chrono::Duration::from_std(self.owner.ttl).unwrap_or_default();
        let answer = IdempotentAnswer {
            scope_key: self.scope.clone(),
            owner: self.client.clone(),
            body_hash: self.body_hash.clone(),
            expires_at,
            status,
            headers: kept,
            stream,
            body,
        };
        let writer = self.owner.store.writer();
        let queued = match writer.queue_idempotent(answer, now).await {
            Ok(queued) => queued,
            Err(e) => return self.not_stored(&e, now),
        };
        tokio::spawn(async move {
            match queued.committed().await {
                Ok(()) => self.answered(),
                Err(e) => self.not_stored(&e, now),
            }
        });
    }

    /// The answer is committed: the key stays with it.
    fn answered(mut self) {
        self.answered = true;
    }

    /// The answer could not be stored: the store is marked, and dropping the guard releases
    /// the key.
    fn not_stored(self, e: &StoreError, now: DateTime<Utc>) {
        self.owner.store.health().failed(e, now);
        tracing::error!(error = %e, "cannot store an idempotent answer");
    }
}
