//! The `cached_response` behaviour's answers, in SQLite (`contract_cache`).
//!
//! - While a request's contract has a `cached_response` (for either state), every successful
//!   answer to it is remembered under [`super::contract::cache_key`] — normalized request,
//!   stream flag, feature and client-key hash — so one client never reads another's answer.
//!   Only answers of the requested model itself are kept (never a contract's fallback).
//! - Stream and non-stream requests are kept apart; a stream's answer is stored as its full
//!   SSE event sequence and replayed as such (its `user_message` then travels in the header
//!   only: SSE events are the upstream's).
//! - An answer is served only while younger than the contract's `max_age`; rows older than the
//!   longest configured max age are deleted (a few per insert, the rest by the job worker's
//!   maintenance). Answers larger than `max_body` are not kept. Nothing else reads the table.
//! - One client holds at most `cached_answers_per_client` answers (counted in the insert's
//!   transaction): beyond, its own oldest is replaced, so one client cannot push everyone
//!   else's answers out. The answer is already sent by then: nobody is refused for it.
//! - Every proxy on one database shares the table: an answer one stored is served by all.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::store::{CachedAnswer, ContractOp, Store};

/// Where a request's answer goes once it succeeded.
#[derive(Debug, Clone)]
pub struct Slot {
    pub key: String,
    /// The client-key digest: whose share the answer counts against.
    pub owner: String,
    pub feature: String,
    pub stream: bool,
    /// Answers stored before this are out of every contract's max age.
    pub purge_before: DateTime<Utc>,
}

/// The proxy's response cache.
#[derive(Debug, Clone)]
pub struct Cache {
    store: Store,
    max_body: usize,
    /// Answers one client may hold; its oldest is replaced beyond.
    per_client: u64,
}

impl Cache {
    pub fn new(store: Store, max_body: usize, per_client: u64) -> Self {
        Self {
            store,
            max_body,
            per_client,
        }
    }

    /// The answer under `key` if it is younger than `max_age` at `now`. A store that cannot be
    /// read is a miss (logged): the request is then served as it would be without a cache.
    pub async fn lookup(
        &self,
        key: &str,
        now: DateTime<Utc>,
        max_age: Duration,
    ) -> Option<CachedAnswer> {
        if !self.store.health().available() {
            return None;
        }
        let since = chrono::Duration::from_std(max_age)
            .ok()
            .and_then(|d| now.checked_sub_signed(d))
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let store = self.store.clone();
        let key = key.to_owned();
        match tokio::task::spawn_blocking(move || store.reader()?.cached_answer(&key, since)).await
        {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot read the contract cache");
                None
            }
            Err(_) => None,
        }
    }

    /// Remembers a successful answer, in the background (the request never waits for it).
    pub fn remember(&self, slot: Slot, status: u16, body: Vec<u8>, now: DateTime<Utc>) {
        if !self.store.health().available() {
            return;
        }
        if body.len() > self.max_body {
            tracing::debug!(
                bytes = body.len(),
                "answer too large for the contract cache"
            );
            return;
        }
        let writer = self.store.writer();
        let op = ContractOp::CacheUpsert {
            answer: Box::new(CachedAnswer {
                key: slot.key,
                owner: slot.owner,
                feature: slot.feature,
                stream: slot.stream,
                stored_at: now,
                status,
                body,
            }),
            purge_before: slot.purge_before,
            max_per_owner: self.per_client,
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = writer.contract(op).await {
                    tracing::error!(error = %e, "cannot store an answer in the contract cache");
                }
            });
        }
    }
}
