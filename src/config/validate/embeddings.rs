//! Embeddings routes' checks: `dimensions` given, an OpenAI-compatible provider (Anthropic has
//! no embeddings API), and a logical model whose routes are interchangeable — all chat or all
//! embeddings, and its embeddings routes of one upstream model and one vector length (a
//! failover to another model would hand the client vectors of another space).

use super::*;
use crate::route::{ProviderKind, RouteKind};

impl Checker<'_> {
    pub(super) fn embeddings(&mut self, c: &Config) {
        // The first route seen per logical model.
        let mut first: HashMap<&str, usize> = HashMap::new();
        for (i, r) in c.routes.iter().enumerate() {
            let p = format!("route[{i}]");
            let id =
                |r: &super::super::RouteConfig| format!("{}/{}/{}", r.provider, r.region, r.model);
            if r.kind == RouteKind::Embeddings {
                if r.dimensions.is_none() && self.converted(&[&format!("{p}.dimensions")]) {
                    self.error(
                        format!("{p}.kind"),
                        "an embeddings route needs `dimensions`, the vector length its model answers (e.g. dimensions = 1024)",
                    );
                }
                let anthropic = (c.providers.iter())
                    .find(|x| x.id == r.provider)
                    .is_some_and(|x| x.kind == ProviderKind::Anthropic);
                if anthropic {
                    self.error(
                        format!("{p}.kind"),
                        format!(
                            "provider {:?} is of kind \"anthropic\", which has no embeddings API: use an OpenAI-compatible provider",
                            r.provider
                        ),
                    );
                }
            } else if r.dimensions.is_some() {
                self.error(
                    format!("{p}.dimensions"),
                    "only an embeddings route has dimensions: add kind = \"embeddings\" or remove it",
                );
            }
            let Some(&j) = first.get(r.serves.as_str()) else {
                first.insert(&r.serves, i);
                continue;
            };
            let f = &c.routes[j];
            let clash = if f.kind != r.kind {
                Some(format!(
                    "logical model {:?} mixes {} and {} routes: route[{j}] ({}) is {}, this route ({}) is {}; serve them under separate names",
                    r.serves,
                    f.kind.as_str(),
                    r.kind.as_str(),
                    id(f),
                    f.kind.as_str(),
                    id(r),
                    r.kind.as_str()
                ))
            } else if r.kind == RouteKind::Embeddings && f.model != r.model {
                Some(format!(
                    "logical model {:?} mixes embedding models: route[{j}] ({}) answers {:?}, this route ({}) answers {:?}; vectors of different models are not comparable, so failover among them is refused",
                    r.serves,
                    id(f),
                    f.model,
                    id(r),
                    r.model
                ))
            } else if r.kind == RouteKind::Embeddings
                && f.dimensions.is_some()
                && r.dimensions.is_some()
                && f.dimensions != r.dimensions
            {
                Some(format!(
                    "logical model {:?} mixes dimensions: route[{j}] ({}) answers {}, this route ({}) answers {}",
                    r.serves,
                    id(f),
                    f.dimensions.unwrap_or_default(),
                    id(r),
                    r.dimensions.unwrap_or_default()
                ))
            } else {
                None
            };
            if let Some(message) = clash {
                let key = if f.kind != r.kind {
                    "kind"
                } else if f.model != r.model {
                    "model"
                } else {
                    "dimensions"
                };
                self.error(format!("{p}.{key}"), message);
            }
        }
    }
}
