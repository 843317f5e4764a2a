//! The provider's own word beside ours: `[[provider.status_page]]` pages read by the monitor's
//! leader, what they declare kept in the store and shown per route, `provider_declared`
//! raised when a provider admits trouble our probes do not see, and the lead time between our
//! incidents and their declarations.
//!
//! - [`parse`]: Statuspage v2 JSON and RSS/Atom feeds into declared incidents and component
//!   states (pure);
//! - [`fetch`]: conditional, bounded HTTP reads;
//! - [`lead`]: which declared incident matches one of ours, the lead time, the month's
//!   summary (pure);
//! - [`judge`]: each route's declared state and the `provider_declared` decisions (pure);
//! - this module: the [`DeclaredBoard`] every member serves from, and the leader's task.
//!
//! A page that fails (no answer, HTTP 5xx, not the documented shape, past the body bound) is a
//! logged warning and the page's `last_error`; what it declared before is kept, never
//! replaced by "nothing declared".

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod fetch;
pub mod judge;
pub mod lead;
pub mod parse;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use prometheus_client::metrics::histogram::Histogram;
use serde::Serialize;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::clock::{rfc3339, Clock};
use crate::config::{Config, StatusPageConfig, StatusPageKind};
use crate::health::{HealthEvent, HealthRx};
use crate::route::RouteId;
use crate::store::declared::DeclaredOp;
use crate::store::Store;
use fetch::{Fetched, Validators};
use judge::{Alerter, Declared};
use lead::{Lead, Mapping};

/// How far back our incidents are matched for the lead-time histogram.
const LEAD_LOOKBACK: TimeDelta = TimeDelta::days(7);
/// Most incidents (ours, and declared) read per pass or per answer.
pub const MAX_DECLARED: usize = 2_000;

/// One page as `/api/v1/status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PageStatus {
    pub provider: String,
    pub kind: &'static str,
    pub url: String,
    /// The last successful read.
    pub last_ok: Option<String>,
    /// Why the last read failed, while it fails.
    pub last_error: Option<String>,
}

/// What the status pages declare now, shared by the leader's task (which writes it) and the
/// web surface (which shows it).
#[derive(Clone)]
pub struct DeclaredBoard {
    view: Arc<watch::Sender<Arc<Declared>>>,
    pages: Arc<watch::Sender<Arc<Vec<PageStatus>>>>,
    /// Page reads completed (successful or not).
    reads: Arc<AtomicU64>,
    /// `probeok_incident_lead_seconds`, when metrics are kept.
    lead: Option<Histogram>,
}

impl DeclaredBoard {
    pub fn new(config: &Config, lead: Option<Histogram>) -> Self {
        let pages = config
            .providers
            .iter()
            .flat_map(|p| p.status_pages.iter())
            .map(|s| PageStatus {
                provider: s.provider.clone(),
                kind: s.kind.as_str(),
                url: s.url.clone(),
                last_ok: None,
                last_error: None,
            })
            .collect();
        Self {
            view: Arc::new(watch::channel(Arc::new(Declared::default())).0),
            pages: Arc::new(watch::channel(Arc::new(pages)).0),
            reads: Arc::default(),
            lead,
        }
    }

    pub fn view(&self) -> Arc<Declared> {
        self.view.borrow().clone()
    }

    pub fn pages(&self) -> Arc<Vec<PageStatus>> {
        self.pages.borrow().clone()
    }

    /// Page reads completed: a read that starts after a change on the page has seen it.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Acquire)
    }

    /// Reads what the store keeps (every member does at start, so a follower shows the last
    /// known declarations too).
    pub async fn load(&self, store: &Store, now: DateTime<Utc>) {
        let store = store.clone();
        let read = tokio::task::spawn_blocking(move || {
            let r = store.reader()?;
            let components = r.declared_components()?;
            let open = r
                .declared_incidents(now, MAX_DECLARED)?
                .into_iter()
                .filter(|i| !i.is_resolved())
                .collect();
            Ok::<_, crate::store::StoreError>(Declared { components, open })
        })
        .await;
        match read {
            Ok(Ok(d)) => {
                self.view.send_replace(Arc::new(d));
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "status pages: cannot read the declared state")
            }
            Err(e) => tracing::warn!(error = %e, "status pages: the read panicked"),
        }
    }

    fn set_page(&self, url: &str, f: impl FnOnce(&mut PageStatus)) {
        self.pages.send_modify(|rows| {
            let mut next = (**rows).clone();
            if let Some(row) = next.iter_mut().find(|r| r.url == url) {
                f(row);
            }
            *rows = Arc::new(next);
        });
    }
}

/// A follower's view of the declarations: read again from the store every `every` until
/// `token` ends the term (the leader writes them).
pub async fn follow(
    board: DeclaredBoard,
    store: Store,
    clock: Arc<dyn Clock>,
    every: Duration,
    token: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(every) => board.load(&store, clock.now()).await,
        }
    }
}

/// What the leader's task needs.
pub struct DeclaredDriver {
    pub config: Arc<Config>,
    pub routes: Vec<RouteId>,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub events: broadcast::Sender<HealthEvent>,
    pub health: HealthRx,
    pub board: DeclaredBoard,
    /// How often due pages are looked for (1 s in service).
    pub tick: Duration,
    /// How long one read may take ([`fetch::TIMEOUT`] in service).
    pub timeout: Duration,
}

struct Page {
    cfg: StatusPageConfig,
    next: DateTime<Utc>,
    /// Per URL read (`summary.json`, `incidents.json`, or the feed).
    validators: BTreeMap<String, Validators>,
}

/// Runs until `shutdown`: every page on its own period, the first read at once.
pub async fn run(d: DeclaredDriver, shutdown: CancellationToken) {
    let http = match fetch::http_client(d.timeout) {
        Ok(h) => h,
        Err(e) => {
            tracing::error!(error = %e, "status pages: cannot build the HTTP client; provider status pages are not read");
            shutdown.cancelled().await;
            return;
        }
    };
    let map = Mapping::from_config(&d.config);
    let alerting: BTreeSet<String> = d
        .config
        .providers
        .iter()
        .flat_map(|p| p.status_pages.iter())
        .filter(|s| s.alert)
        .map(|s| s.url.clone())
        .collect();
    let now = d.clock.now();
    let mut pages: Vec<Page> = d
        .config
        .providers
        .iter()
        .flat_map(|p| p.status_pages.iter())
        .map(|cfg| Page {
            cfg: cfg.clone(),
            next: now,
            validators: BTreeMap::new(),
        })
        .collect();
    d.board.load(&d.store, now).await;
    let mut alerter = Alerter::resume(firing_keys(&d.store).await);
    let mut observed = Observed::default();
    observed.pass(&d, &map, now, false).await;
    let mut tick = tokio::time::interval(d.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let now = d.clock.now();
        let mut changed = false;
        for p in pages.iter_mut().filter(|p| p.next <= now) {
            p.next = now + TimeDelta::from_std(p.cfg.every).unwrap_or(TimeDelta::minutes(1));
            let read = read_page(&http, p, &map, now).await;
            match read {
                Ok(Some(op)) => match d.store.writer().declared(op).await {
                    Ok(_) => {
                        changed = true;
                        d.board.set_page(&p.cfg.url, |s| {
                            s.last_ok = Some(rfc3339(now));
                            s.last_error = None;
                        });
                    }
                    Err(e) => {
                        tracing::warn!(page = %p.cfg.url, error = %e, "status page: read, but not stored; read again next time");
                        p.validators.clear();
                    }
                },
                Ok(None) => d.board.set_page(&p.cfg.url, |s| {
                    s.last_ok = Some(rfc3339(now));
                    s.last_error = None;
                }),
                Err(e) => {
                    tracing::warn!(page = %p.cfg.url, provider = %p.cfg.provider, error = %e, "status page: cannot read it; the last known state is kept");
                    d.board
                        .set_page(&p.cfg.url, |s| s.last_error = Some(e.clone()));
                }
            }
            d.board.reads.fetch_add(1, Ordering::AcqRel);
        }
        // Declarations are judged when they change (each is raised or not when first seen),
        // not every tick: at 10,000 routes that is a glob match per route and incident.
        if changed {
            d.board.load(&d.store, now).await;
            observed.pass(&d, &map, now, true).await;
            let health = d.health.borrow().clone();
            for r in alerter.step(&map, &d.board.view(), &alerting, &d.routes, &health) {
                let _ = d.events.send(HealthEvent::ProviderDeclared {
                    key: r.key,
                    provider: r.provider,
                    what: r.what,
                    url: r.url,
                    routes: r.routes,
                    firing: r.firing,
                    at: now,
                });
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
    }
}

/// One read of a page: `Some` op to store, `None` when unchanged (304), or why it failed.
async fn read_page(
    http: &reqwest::Client,
    p: &mut Page,
    map: &Mapping,
    now: DateTime<Utc>,
) -> Result<Option<DeclaredOp>, String> {
    let cfg = &p.cfg;
    let mut get = |url: String| {
        let v = p.validators.entry(url.clone()).or_default();
        let mut v2 = v.clone();
        async move {
            let r = fetch::get(http, &url, &mut v2).await;
            (url, v2, r)
        }
    };
    match cfg.kind {
        StatusPageKind::Statuspage => {
            let (su, sv, summary) = get(format!("{}/api/v2/summary.json", cfg.url)).await;
            let summary = summary.map_err(|e| format!("summary.json: {e}"))?;
            let (iu, iv, incidents) = get(format!("{}/api/v2/incidents.json", cfg.url)).await;
            let incidents = incidents.map_err(|e| format!("incidents.json: {e}"))?;
            let mut op_components = None;
            let mut op_incidents = Vec::new();
            if let Fetched::Body(b) = &summary {
                let read = parse::statuspage_summary(&cfg.provider, &cfg.url, b, now)
                    .map_err(|e| format!("summary.json: {e}"))?;
                op_components = read.components;
                op_incidents = read.incidents;
            }
            if let Fetched::Body(b) = &incidents {
                let listed = parse::statuspage_incidents(&cfg.provider, &cfg.url, b, now)
                    .map_err(|e| format!("incidents.json: {e}"))?;
                for i in listed {
                    if !op_incidents.iter().any(|o| o.id == i.id) {
                        op_incidents.push(i);
                    }
                }
            }
            // Both parsed: keep both validators (one that failed is asked again whole).
            p.validators.insert(su, sv);
            p.validators.insert(iu, iv);
            if op_components.is_none() && op_incidents.is_empty() {
                return Ok(None);
            }
            Ok(Some(DeclaredOp::Page {
                provider: cfg.provider.clone(),
                page: cfg.url.clone(),
                components: op_components,
                incidents: op_incidents,
                at: now,
            }))
        }
        StatusPageKind::Feed => {
            let (u, v, body) = get(cfg.url.clone()).await;
            let Fetched::Body(b) = body.map_err(|e| e.to_string())? else {
                return Ok(None);
            };
            let known = map.component_names(&cfg.url);
            let read =
                parse::feed(&cfg.provider, &cfg.url, &b, &known, now).map_err(|e| e.to_string())?;
            p.validators.insert(u, v);
            Ok(Some(DeclaredOp::Page {
                provider: cfg.provider.clone(),
                page: cfg.url.clone(),
                components: None,
                incidents: read.incidents,
                at: now,
            }))
        }
    }
}

async fn firing_keys(store: &Store) -> Vec<String> {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || store.reader()?.alert_firing_keys()).await {
        Ok(Ok(keys)) => keys,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "status pages: cannot read the firing alerts; a provider_declared alert resolved while away stays open");
            Vec::new()
        }
        Err(_) => Vec::new(),
    }
}

/// Our incidents whose lead time is already in the histogram (by id, with their opening).
#[derive(Default)]
struct Observed(BTreeMap<String, DateTime<Utc>>);

impl Observed {
    /// Matches our recent incidents with the declared ones; each newly matched lead goes into
    /// the histogram once (`record` false: remembered only, as at start, so a restart does not
    /// count a lead twice).
    async fn pass(&mut self, d: &DeclaredDriver, map: &Mapping, now: DateTime<Utc>, record: bool) {
        let since = now - LEAD_LOOKBACK;
        let store = d.store.clone();
        let read = tokio::task::spawn_blocking(move || {
            let r = store.reader()?;
            Ok::<_, crate::store::StoreError>((
                r.incidents(None, since, MAX_DECLARED)?,
                r.declared_incidents(since, MAX_DECLARED)?,
            ))
        })
        .await;
        let Ok(Ok((ours, declared))) = read else {
            return;
        };
        self.0.retain(|_, opened| *opened >= since);
        for i in &ours {
            if self.0.contains_key(&i.id) {
                continue;
            }
            if let Some(Lead::Declared { lead_seconds, .. }) = lead::lead(map, i, &declared) {
                self.0.insert(i.id.clone(), i.opened_at);
                if let (true, Some(h)) = (record, &d.board.lead) {
                    h.observe(lead_seconds as f64);
                }
            }
        }
    }
}

/// `probeok_incident_lead_seconds`' buckets: negative when the provider declared first.
pub fn lead_histogram() -> Histogram {
    Histogram::new([
        -1800.0, -600.0, -300.0, -60.0, 0.0, 60.0, 300.0, 600.0, 900.0, 1800.0, 3600.0,
    ])
}
