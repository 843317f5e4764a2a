//! `[[sync]]`: new-api / one-api gateways whose channels follow the weights. On the monitor's
//! leader, one task keeps every mapped channel's `weight` and `status` in step with its route's
//! weight in the feed:
//!
//! - the channel is read (`GET /api/channel/{id}`), only `weight` and `status` change, and the
//!   whole channel is written back (`PUT /api/channel/`) — what the gateways' own admin UI does;
//! - channel weight = route weight (integers 0–100 summing to 100 per logical model,
//!   [`plan::channel_weight`]); a route at weight 0 disables its channel (`status = 2`), and
//!   probeok remembers in the store that it did (`store::gateways`); when the route returns,
//!   only channels it remembers are enabled again — never one an operator disabled, nor one the
//!   gateway disabled itself (`status = 3`);
//! - at most one write per channel per 10 s ([`plan::MIN_WRITE_GAP`]): a route that flaps
//!   faster gets its latest weight written when the gap is over, the swings in between never;
//! - a refused write (HTTP 401/403, `success: false`, no answer) is retried after 10 s,
//!   doubling to 5 min ([`plan::backoff`]); the first refusal raises the `sync_failed` alert
//!   (warning, one per gateway), resolved when no channel of the gateway is failing any more;
//! - every write is logged (gateway, channel, route, old and new fields; never the token), and
//!   each gateway's `last_ok` / `last_error` are on [`SyncBoard`] (`/api/v1/status`'s `sync`).
//!
//! Times are the injected clock's; the task wakes on every new weights version and every
//! `tick` to send what the gap or a backoff held back.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod client;
pub mod plan;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::clock::{rfc3339, Clock};
use crate::config::SyncConfig;
use crate::health::HealthEvent;
use crate::route::RouteId;
use crate::secret::Env;
use crate::store::gateways::GatewayOp;
use crate::store::Store;
use crate::weights::WeightsRx;
use client::{GatewayClient, SyncError};
use plan::Decision;

/// A whole read-again of every channel this often, so a change made by hand on the gateway
/// (a weight edited, a channel enabled) is seen and put back in step.
pub const RESYNC_EVERY: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

/// One gateway as `/api/v1/status` shows it (no token, no user id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GatewayStatus {
    pub kind: &'static str,
    pub url: String,
    /// The last successful read or write of a channel.
    pub last_ok: Option<String>,
    /// The last refusal, while the gateway refuses (cleared by a success).
    pub last_error: Option<String>,
}

/// Every gateway's state, shared by the sync task and the status endpoint.
#[derive(Debug, Clone)]
pub struct SyncBoard {
    rows: Arc<watch::Sender<Arc<Vec<GatewayStatus>>>>,
    /// Rounds over every channel completed (a round looks at what is due, writes or not).
    rounds: Arc<AtomicU64>,
}

impl SyncBoard {
    pub fn new(gateways: &[SyncConfig]) -> Self {
        let rows = gateways
            .iter()
            .map(|g| GatewayStatus {
                kind: g.kind.as_str(),
                url: g.url.clone(),
                last_ok: None,
                last_error: None,
            })
            .collect();
        Self {
            rows: Arc::new(watch::channel(Arc::new(rows)).0),
            rounds: Arc::default(),
        }
    }

    pub fn snapshot(&self) -> Arc<Vec<GatewayStatus>> {
        self.rows.borrow().clone()
    }

    /// How many rounds the task has completed: a round that starts after a weights change has
    /// seen it.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Acquire)
    }

    fn set(&self, i: usize, f: impl FnOnce(&mut GatewayStatus)) {
        self.rows.send_modify(|rows| {
            let mut next = (**rows).clone();
            if let Some(row) = next.get_mut(i) {
                f(row);
            }
            *rows = Arc::new(next);
        });
    }
}

/// What the task needs.
pub struct SyncDriver {
    pub gateways: Vec<SyncConfig>,
    /// Where the token variables are read (at every pass: a rotated token takes effect).
    pub env: Env,
    pub weights: WeightsRx,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub events: broadcast::Sender<HealthEvent>,
    pub board: SyncBoard,
    /// How often held-back writes are looked at (1 s in service).
    pub tick: Duration,
}

/// One mapped channel's memory between passes.
#[derive(Debug)]
struct ChannelSlot {
    route: RouteId,
    id: u64,
    /// The route weight this channel was last found or put in step with.
    in_step_with: Option<u8>,
    last_write: Option<DateTime<Utc>>,
    failures: u32,
    retry_at: Option<DateTime<Utc>>,
}

/// One gateway's memory between passes.
struct Gateway {
    cfg: SyncConfig,
    channels: Vec<ChannelSlot>,
    /// Channel ids probeok disabled (mirrors the store).
    ours: BTreeSet<i64>,
    /// Channels whose last pass failed; the gateway's alert fires with the first and resolves
    /// when none is left.
    failing: BTreeSet<u64>,
    alerted: bool,
}

/// Runs until `shutdown`. Returns nothing: failures are retried, alerted and shown, never fatal.
pub async fn run(d: SyncDriver, shutdown: CancellationToken) {
    let http = match client::http_client() {
        Ok(h) => h,
        Err(e) => {
            tracing::error!(error = %e, "sync: cannot build the HTTP client; gateways are not kept in step");
            shutdown.cancelled().await;
            return;
        }
    };
    let mut gateways = Vec::new();
    for cfg in &d.gateways {
        let ours = load_ours(&d.store, &cfg.url, &shutdown).await;
        let channels = cfg
            .channels
            .iter()
            .filter_map(|(route, id)| {
                Some(ChannelSlot {
                    route: RouteId::parse(route)?,
                    id: *id,
                    in_step_with: None,
                    last_write: None,
                    failures: 0,
                    retry_at: None,
                })
            })
            .collect();
        gateways.push(Gateway {
            cfg: cfg.clone(),
            channels,
            ours,
            failing: BTreeSet::new(),
            alerted: false,
        });
    }
    let mut weights = d.weights.clone();
    let mut last_resync = d.clock.now();
    let mut tick = tokio::time::interval(d.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let now = d.clock.now();
        if now - last_resync >= RESYNC_EVERY {
            last_resync = now;
            for slot in gateways.iter_mut().flat_map(|g| g.channels.iter_mut()) {
                slot.in_step_with = None;
            }
        }
        let snapshot = weights.borrow_and_update().clone();
        for (i, g) in gateways.iter_mut().enumerate() {
            let token = d.env.secret(&g.cfg.token_env);
            let gw = token.map(|t| GatewayClient::new(http.clone(), &g.cfg.url, t, g.cfg.user_id));
            for c in 0..g.channels.len() {
                let Some(w) = snapshot.weight(&g.channels[c].route) else {
                    continue;
                };
                if !due(&g.channels[c], w, now) {
                    continue;
                }
                let result = match &gw {
                    Some(gw) => pass(&d, g, c, gw, w, now).await,
                    None => Err(SyncError::NoToken(g.cfg.token_env.clone())),
                };
                settle(&d, i, g, c, w, now, result);
            }
        }
        d.board.rounds.fetch_add(1, Ordering::AcqRel);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            changed = weights.changed() => if changed.is_err() { shutdown.cancelled().await; return },
        }
    }
}

/// Whether a channel should be looked at now for route weight `w`.
fn due(slot: &ChannelSlot, w: u8, now: DateTime<Utc>) -> bool {
    if slot.retry_at.is_some_and(|t| now < t) {
        return false;
    }
    if slot.retry_at.is_none() && slot.in_step_with == Some(w) {
        return false;
    }
    plan::next_write(slot.last_write).is_none_or(|t| now >= t)
}

/// What one pass over a channel did: the weight it is now in step with.
type PassResult = Result<(), SyncError>;

/// Reads the channel, decides, writes when needed and records what probeok disabled.
async fn pass(
    d: &SyncDriver,
    g: &mut Gateway,
    c: usize,
    gw: &GatewayClient,
    w: u8,
    now: DateTime<Utc>,
) -> PassResult {
    let (id, route) = (g.channels[c].id, g.channels[c].route.clone());
    let key = i64::try_from(id).unwrap_or(i64::MAX);
    let read = gw.get(id).await?;
    let ours = g.ours.contains(&key);
    match plan::decide(w, read.fields, ours) {
        Decision::Keep => {}
        Decision::LeaveAlone => {
            tracing::info!(gateway = %g.cfg.url, channel = id, route = %route, status = read.fields.status,
                "sync: channel disabled by someone else; left alone");
        }
        Decision::Forget => {
            forget(d, g, key).await;
        }
        Decision::Write { to, ours: now_ours } => {
            g.channels[c].last_write = Some(now);
            gw.put(&read, to).await?;
            tracing::info!(
                gateway = %g.cfg.url, kind = g.cfg.kind.as_str(), channel = id, route = %route,
                route_weight = w, from_status = read.fields.status, from_weight = read.fields.weight,
                status = to.status, weight = to.weight, "sync: channel written"
            );
            match now_ours {
                Some(true) => {
                    g.ours.insert(key);
                    let op = GatewayOp::Disabled {
                        gateway: g.cfg.url.clone(),
                        channel_id: key,
                        route: route.to_string(),
                        at: now,
                    };
                    if let Err(e) = d.store.writer().gateway(op).await {
                        tracing::error!(error = %e, channel = id, "sync: cannot remember a disabled channel; it may stay disabled when its route returns");
                    }
                }
                Some(false) => forget(d, g, key).await,
                None => {}
            }
        }
    }
    Ok(())
}

async fn forget(d: &SyncDriver, g: &mut Gateway, key: i64) {
    g.ours.remove(&key);
    let op = GatewayOp::Enabled {
        gateway: g.cfg.url.clone(),
        channel_id: key,
    };
    if let Err(e) = d.store.writer().gateway(op).await {
        tracing::error!(error = %e, channel = key, "sync: cannot forget an enabled channel");
    }
}

/// Books a pass's result: the board, the retry, and the alert's firing or resolution.
fn settle(
    d: &SyncDriver,
    i: usize,
    g: &mut Gateway,
    c: usize,
    w: u8,
    now: DateTime<Utc>,
    result: PassResult,
) {
    let slot = &mut g.channels[c];
    match result {
        Ok(()) => {
            slot.in_step_with = Some(w);
            slot.failures = 0;
            slot.retry_at = None;
            g.failing.remove(&slot.id);
            let clear = g.failing.is_empty();
            d.board.set(i, |row| {
                row.last_ok = Some(rfc3339(now));
                if clear {
                    row.last_error = None;
                }
            });
            if clear && g.alerted {
                g.alerted = false;
                tracing::info!(gateway = %g.cfg.url, "sync: the gateway accepts writes again");
                let _ = d.events.send(HealthEvent::SyncFailed {
                    kind: g.cfg.kind.as_str().to_owned(),
                    gateway: g.cfg.url.clone(),
                    error: None,
                    at: now,
                });
            }
        }
        Err(e) => {
            slot.in_step_with = None;
            slot.failures = slot.failures.saturating_add(1);
            let wait = plan::backoff(slot.failures);
            slot.retry_at = Some(now + wait);
            g.failing.insert(slot.id);
            let text = e.to_string();
            tracing::warn!(gateway = %g.cfg.url, channel = slot.id, route = %slot.route, error = %text,
                failures = slot.failures, retry_in_s = wait.num_seconds(), "sync: channel not kept in step");
            d.board.set(i, |row| row.last_error = Some(text.clone()));
            if !g.alerted {
                g.alerted = true;
                let _ = d.events.send(HealthEvent::SyncFailed {
                    kind: g.cfg.kind.as_str().to_owned(),
                    gateway: g.cfg.url.clone(),
                    error: Some(text),
                    at: now,
                });
            }
        }
    }
}

/// The channels probeok disabled on `gateway`, read once at the start (retried every second:
/// enabling a channel it did not disable would be worse than waiting).
async fn load_ours(store: &Store, gateway: &str, shutdown: &CancellationToken) -> BTreeSet<i64> {
    loop {
        let (s, gw) = (store.clone(), gateway.to_owned());
        match tokio::task::spawn_blocking(move || s.reader()?.sync_disabled(&gw)).await {
            Ok(Ok(ids)) => return ids.into_iter().collect(),
            Ok(Err(e)) => {
                tracing::error!(error = %e, gateway, "sync: cannot read the channels probeok disabled; retrying")
            }
            Err(e) => {
                tracing::error!(error = %e, gateway, "sync: reading the disabled channels panicked; retrying")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return BTreeSet::new(),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
