//! The prober the scheduler calls: an embeddings route gets the embeddings probe and its
//! vector is judged against the stored reference; any other route goes to the probe client's
//! chat probe as before. The open findings are published on a `watch` channel that joins the
//! drift findings (`app::terms`).
//!
//! The reference lives in the store, read at every probe of the route, so an admin's
//! replacement (`POST /api/v1/admin/routes/{route}/embedding-reference`, answered by any
//! member of a cluster) takes effect at the leader's next probe.

use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::watch;

use super::{finding, judge, Verdict};
use crate::clock::Clock;
use crate::drift::DriftFinding;
use crate::probe::{OutcomeKind, ProbeClient, ProbeOutcome};
use crate::route::{Route, RouteId, RouteMap};
use crate::scheduler::Prober;
use crate::store::embeddings::{EmbeddingOp, EmbeddingRow};
use crate::store::{Store, StoreError};

/// Why a vector could not be judged, or a reference not replaced.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the store read task failed: {0}")]
    Task(String),
}

/// The embeddings routes' findings as published: one per route whose model changed.
pub type FindingsRx = watch::Receiver<Arc<Vec<DriftFinding>>>;

/// Probes chat routes with the chat probe and embeddings routes with the embeddings probe,
/// judging their vectors. Cheap to clone.
#[derive(Clone)]
pub struct EmbedProber {
    inner: Arc<Inner>,
}

struct Inner {
    client: ProbeClient,
    /// Embeddings routes and their `dimensions`.
    routes: RouteMap<u32>,
    store: Store,
    clock: Arc<dyn Clock>,
    open: Mutex<RouteMap<DriftFinding>>,
    tx: watch::Sender<Arc<Vec<DriftFinding>>>,
}

impl EmbedProber {
    /// `routes`: the embeddings routes with their `dimensions` (`Config::embedding_routes`).
    pub fn new(
        client: ProbeClient,
        routes: RouteMap<u32>,
        store: Store,
        clock: Arc<dyn Clock>,
    ) -> (Self, FindingsRx) {
        let (tx, rx) = watch::channel(Arc::new(Vec::new()));
        let inner = Inner {
            client,
            routes,
            store,
            clock,
            open: Mutex::new(RouteMap::default()),
            tx,
        };
        (
            Self {
                inner: Arc::new(inner),
            },
            rx,
        )
    }

    /// Whether `route` is an embeddings route.
    pub fn embeds(&self, route: &RouteId) -> bool {
        self.inner.routes.contains_key(route)
    }

    /// One embeddings probe of `route` and the judgement of its vector.
    pub async fn embed(&self, route: &Route, dimensions: u32) -> ProbeOutcome {
        let probe = self.inner.client.embed(route, dimensions).await;
        if let Some(vector) = probe.vector {
            if let Err(e) = self.judge(&route.id, vector).await {
                // The outcome still counts; the vector is judged again at the next probe.
                tracing::warn!(route = %route.id, error = %e, "embeddings: the reference could not be read or written");
            }
        }
        probe.outcome
    }

    async fn judge(&self, route: &RouteId, vector: Vec<f32>) -> Result<(), EmbedError> {
        let p = &self.inner;
        let at = p.clock.now();
        let key = route.as_str().to_owned();
        let store = p.store.clone();
        let k = key.clone();
        let row: Option<EmbeddingRow> =
            tokio::task::spawn_blocking(move || store.reader()?.embedding_row(&k))
                .await
                .map_err(|e| EmbedError::Task(e.to_string()))??;
        let verdict = judge(row.as_ref().map(|r| r.reference.as_slice()), &vector);
        let writer = p.store.writer();
        writer
            .embedding(EmbeddingOp::Observe {
                route: key.clone(),
                vector,
                at,
            })
            .await?;
        if verdict == Verdict::NewReference && row.is_some() {
            // The stored reference has another length: the route's `dimensions` changed (an
            // intended change), so this vector is the new reference.
            writer
                .embedding(EmbeddingOp::AdoptLatest { route: key })
                .await?;
            tracing::info!(route = %route, "embeddings: the vector length changed; the latest vector is the new reference");
        }
        let mut open = p.open.lock().unwrap_or_else(|e| e.into_inner());
        let changed = match verdict {
            Verdict::NewReference | Verdict::Same { .. } => open.remove(route).is_some(),
            Verdict::Changed { .. } if open.contains_key(route) => false,
            Verdict::Changed { cosine } => {
                let since = row.as_ref().map_or(at, |r| r.reference_at);
                open.insert(route.clone(), finding(route, cosine, since, at));
                tracing::warn!(route = %route, cosine, "embeddings: the vector no longer matches the reference");
                true
            }
        };
        if changed {
            let mut all: Vec<DriftFinding> = open.values().cloned().collect();
            all.sort_by(|a, b| a.id.cmp(&b.id));
            p.tx.send_replace(Arc::new(all));
        }
        Ok(())
    }
}

impl Prober for EmbedProber {
    fn probe<'a>(&'a self, route: &'a Route, kind: OutcomeKind) -> BoxFuture<'a, ProbeOutcome> {
        match self.inner.routes.get(&route.id) {
            Some(&dimensions) => self.embed(route, dimensions).boxed(),
            None => self.inner.client.probe(route, kind).boxed(),
        }
    }
}

/// What `POST /api/v1/admin/routes/{route}/embedding-reference` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replaced {
    /// The latest good vector is the reference now.
    Latest,
    /// The route had no vector yet: its next good vector becomes the reference.
    Cleared,
}

/// Makes the route's latest good vector its reference (after an intended model change), or,
/// without one, leaves the next good vector to become it. The finding closes at the route's
/// next probe.
pub async fn replace_reference(store: &Store, route: &RouteId) -> Result<Replaced, StoreError> {
    let key = route.as_str().to_owned();
    let n = store
        .writer()
        .embedding(EmbeddingOp::AdoptLatest { route: key.clone() })
        .await?;
    if n > 0 {
        Ok(Replaced::Latest)
    } else {
        store
            .writer()
            .embedding(EmbeddingOp::Clear { route: key })
            .await?;
        Ok(Replaced::Cleared)
    }
}
