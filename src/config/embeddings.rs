//! `route.kind = "embeddings"` and `route.dimensions`: which routes answer embeddings, and
//! the vector length each answers (see `crate::embed`).

use std::collections::BTreeSet;

use super::Config;
use crate::route::{RouteId, RouteKind, RouteMap};

impl Config {
    /// Every embeddings route with its `dimensions` (a route lacking them is a config error,
    /// so an unvalidated one is left out).
    pub fn embedding_routes(&self) -> RouteMap<u32> {
        self.routes
            .iter()
            .filter(|r| r.kind == RouteKind::Embeddings)
            .filter_map(|r| {
                Some((
                    RouteId::new(&r.provider, &r.region, &r.model),
                    r.dimensions?,
                ))
            })
            .collect()
    }

    /// The logical models (`serves`) whose routes answer embeddings.
    pub fn embedding_models(&self) -> BTreeSet<String> {
        self.routes
            .iter()
            .filter(|r| r.kind == RouteKind::Embeddings)
            .map(|r| r.serves.clone())
            .collect()
    }
}
