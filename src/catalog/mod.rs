//! The model catalog: providers withdraw models, and a withdrawn model is a wave of 404s the
//! next day. On the monitor's leader, one task reads each provider region's model list every
//! `[catalog] every` ([`client`]) and remembers per model when it was first and last listed
//! and how many successful answers in a row have lacked it (`store::catalog`):
//!
//! - a routed model missing from two answers in a row raises `model_withdrawn` (critical, one
//!   per provider region and model, naming the routes), resolved when it is listed again —
//!   the list usually drops a model before the endpoint stops serving it;
//! - a failed or malformed answer is a logged warning and changes nothing: it is never read
//!   as every model withdrawn;
//! - `retires = "YYYY-MM-DD"` on a route raises `model_retiring` (warning) 30, 7 and 1 day(s)
//!   before, each once: the notices sent are remembered in the store, so neither a restart nor
//!   a new leader sends one again.
//!
//! The decisions are [`plan`]'s (pure); this is the I/O around them. Times are the injected
//! clock's. `GET /api/v1/catalog` (`web::catalog`) shows what the store holds.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod client;
pub mod plan;

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::CatalogConfig;
use crate::health::HealthEvent;
use crate::route::Route;
use crate::secret::Env;
use crate::store::catalog::{CatalogOp, ModelRow};
use crate::store::{Store, StoreError};
pub use client::CatalogError;
use plan::Region;

/// What the task needs.
pub struct CatalogDriver {
    pub routes: Arc<Vec<Route>>,
    pub config: CatalogConfig,
    /// Where the key variables are read (at every pass: a rotated key takes effect).
    pub env: Env,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub events: broadcast::Sender<HealthEvent>,
}

/// What one pass did, region by region (`provider/region` names).
#[derive(Debug, Default)]
pub struct Pass {
    /// Regions whose list was read and stored.
    pub answered: Vec<String>,
    /// Regions whose list was not read (or not stored), and why.
    pub failed: Vec<(String, String)>,
    /// `model_retiring` warnings sent.
    pub retiring: usize,
}

/// The catalog of one leader term.
pub struct Catalog {
    d: CatalogDriver,
    regions: Vec<Region>,
    http: reqwest::Client,
}

impl Catalog {
    pub fn new(d: CatalogDriver) -> Result<Self, CatalogError> {
        Ok(Self {
            regions: plan::regions(&d.routes),
            http: client::http_client()?,
            d,
        })
    }

    /// Reads every region's list once, then sends the `retires` warnings due today.
    pub async fn pass(&self) -> Pass {
        let mut out = Pass::default();
        let known = match self.read(|r| r.catalog_models()).await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "catalog: cannot read the remembered models; this pass is skipped");
                out.failed.push(("*".into(), e));
                return out;
            }
        };
        for g in &self.regions {
            let rows: Vec<ModelRow> = known
                .iter()
                .filter(|(k, _)| *k == g.key)
                .map(|(_, r)| r.clone())
                .collect();
            match self.region(g, &rows).await {
                Ok(()) => out.answered.push(g.name.clone()),
                Err(e) => out.failed.push((g.name.clone(), e)),
            }
        }
        out.retiring = self.retirements().await;
        out
    }

    /// One region: its list, the rows, then the alerts (only once the rows are stored, so a
    /// store failure repeats nothing).
    async fn region(&self, g: &Region, known: &[ModelRow]) -> Result<(), String> {
        let key = g.api_key_env.as_ref().and_then(|v| self.d.env.secret(v));
        let listed = match client::list(&self.http, g.kind, &g.base_url, key.as_ref()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(region = %g.name, error = %e,
                    "catalog: model list not read; the catalog is kept as it was");
                return Err(e.to_string());
            }
        };
        let now = self.d.clock.now();
        let o = plan::observe(known, &listed, &g.routed, now);
        let op = CatalogOp::Answer {
            region: g.key.clone(),
            rows: o.rows,
            forget: o.forget,
        };
        if let Err(e) = self.d.store.writer().catalog(op).await {
            tracing::warn!(region = %g.name, error = %e, "catalog: cannot store the model list");
            return Err(e.to_string());
        }
        for m in routed_unlisted(g, &listed, known) {
            tracing::info!(region = %g.name, model = %m,
                "catalog: a routed model the provider's list has never named (not alerted)");
        }
        for (model, withdrawn) in o
            .withdrawn
            .into_iter()
            .map(|m| (m, true))
            .chain(o.returned.into_iter().map(|m| (m, false)))
        {
            let routes = g.routed.get(&model).cloned().unwrap_or_default();
            if withdrawn {
                tracing::warn!(region = %g.name, model = %model, "catalog: routed model withdrawn from the provider's list");
            } else {
                tracing::info!(region = %g.name, model = %model, "catalog: withdrawn model listed again");
            }
            let _ = self.d.events.send(HealthEvent::ModelWithdrawn {
                region: g.name.clone(),
                model,
                routes,
                withdrawn,
                at: now,
            });
        }
        Ok(())
    }

    /// Sends the `retires` warnings due today and not sent yet; returns how many went out.
    async fn retirements(&self) -> usize {
        if self.d.config.retires.is_empty() {
            return 0;
        }
        let sent: BTreeSet<_> = match self.read(|r| r.catalog_notices()).await {
            Ok(s) => s.into_iter().collect(),
            Err(e) => {
                tracing::warn!(error = %e, "catalog: cannot read the retirement notices sent");
                return 0;
            }
        };
        let now = self.d.clock.now();
        let mut n = 0;
        for r in plan::retirements(&self.d.config.retires, now.date_naive(), &sent) {
            let op = CatalogOp::Notice {
                route: r.route.to_string(),
                retires: r.retires,
                days: r.days,
                at: now,
            };
            // Recorded first: a notice the store cannot remember is not sent (it would be
            // sent again on every pass).
            match self.d.store.writer().catalog(op).await {
                Ok(_) => {
                    n += 1;
                    tracing::info!(route = %r.route, retires = %r.retires, days_left = r.days_left,
                        "catalog: route's model retires soon");
                    let _ = self.d.events.send(HealthEvent::ModelRetiring {
                        route: r.route,
                        retires: r.retires,
                        days_left: r.days_left,
                        days: r.days,
                        at: now,
                    });
                }
                Err(e) => {
                    tracing::warn!(route = %r.route, error = %e, "catalog: cannot record a retirement notice; not sent")
                }
            }
        }
        n
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&crate::store::Reader) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, String> {
        let s = self.d.store.clone();
        match tokio::task::spawn_blocking(move || f(&s.reader()?)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(format!("the store read panicked: {e}")),
        }
    }
}

/// Routed models of `g` neither listed now nor ever before.
fn routed_unlisted<'a>(
    g: &'a Region,
    listed: &BTreeSet<String>,
    known: &[ModelRow],
) -> Vec<&'a String> {
    g.routed
        .keys()
        .filter(|m| !listed.contains(*m) && !known.iter().any(|k| &k.model == *m))
        .collect()
}

/// Runs a pass at once and then every `[catalog] every` until `shutdown`. Never fatal: a pass
/// that fails is logged and the next one tries again.
pub async fn run(d: CatalogDriver, shutdown: CancellationToken) {
    let every = d.config.every;
    let catalog = match Catalog::new(d) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "catalog: cannot build the HTTP client; model lists are not read");
            shutdown.cancelled().await;
            return;
        }
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = catalog.pass() => {}
        }
    }
}
