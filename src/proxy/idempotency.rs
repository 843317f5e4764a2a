//! `Idempotency-Key`: a repeated key within `idempotency_ttl` never reaches an upstream twice.
//!
//! - A key is scoped per client: `sha256(client key)[..16] ":" key` (the client key itself is
//!   never stored). Keys are 1–255 visible ASCII characters, else 400.
//! - While the first request runs, the key is held in memory: a repeat gets 409
//!   `idempotency_in_progress`. One process owns its keys; proxies behind one load balancer
//!   should route a client's retries to the same proxy or share nothing but the answers.
//! - When the first request ends with an upstream's answer (2xx, or the client's own 4xx
//!   returned as is), the answer is stored in SQLite (status, the headers that matter, body —
//!   for streams the full event sequence) until the TTL; a repeat gets it back with
//!   `x-probeok-idempotent-replay: true`. The same key with a different body gets 422.
//! - Answers the proxy made up (every candidate failed, 503/504; bad input) are not stored: no
//!   upstream produced an answer, so a retry with the same key may try again. A client that
//!   hangs up mid-stream leaves nothing stored either. Answers larger than `max_body` are not
//!   stored (logged), bounding the table.
//! - The request does not wait for that write: the answer is kept in memory until the writer
//!   has committed it, and a repeat in the meantime is answered from there.
//! - A store that cannot be read fails closed (503): the guarantee is "never twice".

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use super::contract::hex;
use crate::store::sql::Engine;
use crate::store::{IdempotentAnswer, Reader, Store};

/// SQLite readers kept open for lookups (a new connection per lookup costs more than the
/// query). PostgreSQL readers come from the store's own pool.
const KEPT_READERS: usize = 4;

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

/// The idempotency keys of one proxy.
#[derive(Debug)]
pub struct Idempotency {
    store: Store,
    ttl: Duration,
    max_answer: usize,
    in_flight: Mutex<HashSet<String>>,
    /// Answers handed to the writer and not yet committed, by scope key. Bounded by the
    /// writer's queue: each entry leaves once its write has ended.
    pending: Mutex<HashMap<String, Arc<IdempotentAnswer>>>,
    readers: Mutex<Vec<Reader>>,
}

/// What a request with a key should do.
pub enum Lookup {
    /// The stored answer.
    Replay(IdempotentAnswer),
    /// The first request with this key is still running.
    InProgress,
    /// The key was used with another body.
    Mismatch,
    /// The store could not be read.
    Unavailable,
    /// First use: proceed, and store the answer through the guard.
    Proceed(Guard),
}

/// Holds a key while its first request runs; releases it when dropped.
pub struct Guard {
    owner: Arc<Idempotency>,
    scope: String,
    body_hash: String,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut set = self
            .owner
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        set.remove(&self.scope);
    }
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
    pub fn new(store: Store, ttl: Duration, max_answer: usize) -> Arc<Self> {
        Arc::new(Self {
            store,
            ttl,
            max_answer,
            in_flight: Mutex::new(HashSet::new()),
            pending: Mutex::new(HashMap::new()),
            readers: Mutex::new(Vec::new()),
        })
    }

    /// The stored answer of `scope`, through a kept reader when there is one.
    fn read(&self, scope: &str, now: DateTime<Utc>) -> Result<Option<IdempotentAnswer>, String> {
        let kept = self.readers.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let reader = match kept {
            Some(r) => r,
            None => self.store.reader().map_err(|e| e.to_string())?,
        };
        let answer = reader.idempotent(scope, now).map_err(|e| e.to_string())?;
        if self.store.engine() == Engine::Sqlite {
            let mut kept = self.readers.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() < KEPT_READERS {
                kept.push(reader);
            }
        }
        Ok(answer)
    }

    /// Looks `key` up for the client `client_key` (empty without client auth).
    pub async fn lookup(
        self: &Arc<Self>,
        client_key: &str,
        key: &str,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Lookup {
        let scope = format!(
            "{}:{key}",
            &hex(&Sha256::digest(client_key.as_bytes()))[..16]
        );
        let body_hash = hex(&Sha256::digest(body));
        {
            let mut set = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            if !set.insert(scope.clone()) {
                return Lookup::InProgress;
            }
        }
        // From here the key is ours until the guard drops.
        let guard = Guard {
            owner: self.clone(),
            scope: scope.clone(),
            body_hash: body_hash.clone(),
        };
        // An answer on its way to the store is the stored answer.
        let pending = (self.pending.lock().unwrap_or_else(|e| e.into_inner()))
            .get(&scope)
            .filter(|a| a.expires_at > now)
            .cloned();
        let read = match pending {
            Some(a) => Ok(Ok(Some((*a).clone()))),
            None => {
                let owner = self.clone();
                tokio::task::spawn_blocking(move || owner.read(&scope, now)).await
            }
        };
        match read {
            Ok(Ok(Some(answer))) if answer.body_hash == body_hash => Lookup::Replay(answer),
            Ok(Ok(Some(_))) => Lookup::Mismatch,
            Ok(Ok(None)) => Lookup::Proceed(guard),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot read idempotency keys");
                Lookup::Unavailable
            }
            Err(_) => Lookup::Unavailable,
        }
    }
}

impl Guard {
    /// Stores the first request's answer (then releases the key). Resolves once the answer is
    /// on its way to the store and kept in memory until it is committed, so a repeat sent
    /// after the answer finds it.
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
            body_hash: self.body_hash.clone(),
            expires_at,
            status,
            headers: kept,
            stream,
            body,
        };
        let kept = Arc::new(answer.clone());
        let owner = self.owner.clone();
        let scope = self.scope.clone();
        // Kept before the guard releases the key (when `self` drops, below).
        (owner.pending.lock().unwrap_or_else(|e| e.into_inner()))
            .insert(scope.clone(), kept.clone());
        let write = async move {
            if let Err(e) = owner.store.writer().store_idempotent(answer, now).await {
                tracing::error!(error = %e, "cannot store an idempotent answer");
            }
            let mut pending = owner.pending.lock().unwrap_or_else(|e| e.into_inner());
            // A later answer under the same key (after a TTL expiry) stays.
            if pending.get(&scope).is_some_and(|a| Arc::ptr_eq(a, &kept)) {
                pending.remove(&scope);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(write);
            }
            Err(_) => write.await,
        }
    }
}
