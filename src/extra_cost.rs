//! The extra cost of serving from non-primary routes, per **clock hour**.
//!
//! A non-primary route's *extra price* is the difference of its price to the model's primary
//! price, per dimension (input, output), only where positive: a cheaper backup costs nothing
//! extra. The primary price is the cheapest primary of the same logical model per dimension
//! (so the extra is never under-counted). Routes without a price, or models without a priced
//! primary, have no extra price (nothing can be accounted for them).
//!
//! **Reserve before spending** (the billing abacus): before the proxy sends a request to a
//! non-primary route, [`ExtraCost::reserve`] books the request's *estimated maximum* extra cost
//! (prompt tokens × input extra + `max_tokens` × output extra) under one mutex, refusing it
//! when `spent + reserved + estimate` would pass `max_extra_cost_per_hour`; so concurrent
//! requests can never overrun the budget together. When the usage is known the
//! [`Reservation`] is settled with the metered tokens (the unused part is released), or
//! released whole when the attempt produced nothing. A reservation dropped without either
//! (a client that hung up mid-stream) keeps its whole amount: the upstream kept generating.
//!
//! The hour is a clock hour (UTC), reset on the hour — never per incident (a budget per
//! incident would reset with every new one). Reservations still open at the turn of the hour stay booked, and settle into
//! the hour they end in.
//!
//! **One budget for the fleet.** Shared through the store ([`ExtraCost::share`], done by `serve`
//! and `probeok proxy`), the booking goes to the store's spend ledger ([`spend`]) under the key
//! [`LEDGER_KEY`]: every proxy on one database reserves from the same hourly row in a
//! transaction, so three replicas stop at one shared limit. The numbers in
//! [`ExtraCost::snapshot`] are then the fleet's as of this process's last booking; a
//! reservation settles into the hour it was booked in. When the ledger cannot be reached a
//! non-primary attempt is refused (the budget cannot be checked, so nothing is spent).
//!
//! Past `degrade_at` × `max_extra_cost_per_hour` (spent + reserved) no new switch happens
//! ([`ExtraCost::allows_switch`]); the first crossing in an hour is sent as a
//! [`HealthEvent::BudgetCrossed`] (alerted with severity `warning`).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde::Serialize;
use tokio::sync::broadcast;

use crate::clock::Clock;
use crate::config::ExtraCostConfig;
use crate::health::HealthEvent;
use crate::route::{Route, RouteId, Tier};
use crate::spend::{self, Spend};
use crate::store::{Hold, LedgerRow};

/// The spend ledger's key of the fleet's hourly extra-cost budget.
pub const LEDGER_KEY: &str = "budget:extra_cost";

/// The positive price difference of a route to its model's primary, per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct ExtraPrice {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

impl ExtraPrice {
    /// The extra cost of `input` prompt and `output` completion tokens.
    pub fn cost(&self, input: u64, output: u64) -> f64 {
        (input as f64 * self.input_per_mtok + output as f64 * self.output_per_mtok) / 1e6
    }

    /// The same in integer micro-units, rounded up (price per million tokens × tokens).
    pub fn micros(&self, input: u64, output: u64) -> i64 {
        let m = input as f64 * self.input_per_mtok + output as f64 * self.output_per_mtok;
        if m.is_finite() && m > 0.0 {
            m.ceil().min(i64::MAX as f64) as i64
        } else {
            0
        }
    }

    fn is_zero(&self) -> bool {
        self.input_per_mtok <= 0.0 && self.output_per_mtok <= 0.0
    }
}

/// The extra prices of every non-primary route that has one (see the module docs).
pub fn extra_prices(routes: &[Route]) -> HashMap<RouteId, (String, ExtraPrice)> {
    let mut out = HashMap::new();
    for r in routes.iter().filter(|r| r.tier != Tier::Primary) {
        let Some(price) = &r.price else { continue };
        let primaries: Vec<_> = routes
            .iter()
            .filter(|p| p.tier == Tier::Primary && p.serves == r.serves)
            .filter_map(|p| p.price.as_ref())
            .collect();
        if primaries.is_empty() {
            continue;
        }
        let min = |f: fn(&crate::route::Price) -> f64| {
            primaries.iter().map(|p| f(p)).fold(f64::INFINITY, f64::min)
        };
        let extra = ExtraPrice {
            input_per_mtok: (price.input_per_mtok - min(|p| p.input_per_mtok)).max(0.0),
            output_per_mtok: (price.output_per_mtok - min(|p| p.output_per_mtok)).max(0.0),
        };
        if !extra.is_zero() {
            out.insert(r.id.clone(), (r.serves.clone(), extra));
        }
    }
    out
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("the hourly extra-cost budget cannot cover {needed:.4} more (left: {left:.4})")]
pub struct Refused {
    pub needed: f64,
    pub left: f64,
}

/// The budget's state, for `/api/v1/switches`, the status page and metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExtraCostSnapshot {
    /// The clock hour being accounted.
    pub hour_start: DateTime<Utc>,
    pub max_extra_cost_per_hour: f64,
    pub degrade_at: f64,
    /// Settled extra cost this hour.
    pub spent: f64,
    /// Booked by requests still running.
    pub reserved: f64,
    /// (spent + reserved) / max (1 when the budget is 0).
    pub used_ratio: f64,
    /// Below `degrade_at`: a new switch may happen.
    pub switching_allowed: bool,
    /// Requests refused this hour because the budget could not cover them.
    pub refused: u64,
    /// Extra cost since start, per logical model (never reset; incident records use it).
    pub total_by_model: HashMap<String, f64>,
}

#[derive(Debug)]
struct Ledger {
    hour: DateTime<Utc>,
    spent: f64,
    reserved: f64,
    refused: u64,
    crossed: bool,
    total_by_model: HashMap<String, f64>,
}

/// The hourly extra-cost budget; share it as `Arc<ExtraCost>`.
pub struct ExtraCost {
    cfg: ExtraCostConfig,
    prices: HashMap<RouteId, (String, ExtraPrice)>,
    clock: Arc<dyn Clock>,
    ledger: Mutex<Ledger>,
    events: Option<broadcast::Sender<HealthEvent>>,
    /// The store's ledger, once shared: the fleet's one budget.
    shared: std::sync::OnceLock<Spend>,
}

impl std::fmt::Debug for ExtraCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtraCost")
            .field("cfg", &self.cfg)
            .field("prices", &self.prices.len())
            .finish_non_exhaustive()
    }
}

fn hour_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::hours(1)).unwrap_or(t)
}

impl ExtraCost {
    /// A budget over `routes`' prices; `events` (when given) receives the `degrade_at` crossing.
    pub fn new(
        cfg: ExtraCostConfig,
        routes: &[Route],
        clock: Arc<dyn Clock>,
        events: Option<broadcast::Sender<HealthEvent>>,
    ) -> Arc<Self> {
        let now = clock.now();
        Arc::new(Self {
            cfg,
            prices: extra_prices(routes),
            clock,
            ledger: Mutex::new(Ledger {
                hour: hour_of(now),
                spent: 0.0,
                reserved: 0.0,
                refused: 0,
                crossed: false,
                total_by_model: HashMap::new(),
            }),
            events,
            shared: std::sync::OnceLock::new(),
        })
    }

    /// The extra price of `route` (`None`: a primary, unpriced, or not dearer).
    pub fn extra_price(&self, route: &RouteId) -> Option<ExtraPrice> {
        self.prices.get(route).map(|(_, p)| *p)
    }

    /// The ledger, rolled over to the current clock hour.
    fn ledger(&self, now: DateTime<Utc>) -> MutexGuard<'_, Ledger> {
        // A panic while holding the lock leaves plain numbers behind: keep using them.
        let mut l = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let hour = hour_of(now);
        if hour > l.hour {
            if l.spent > 0.0 || l.refused > 0 {
                tracing::info!(hour = %l.hour, spent = l.spent, refused = l.refused, "extra-cost budget hour closed");
            }
            l.hour = hour;
            l.spent = 0.0;
            l.refused = 0;
            l.crossed = false;
        }
        l
    }

    fn limit(&self) -> f64 {
        self.cfg.max_extra_cost_per_hour
    }

    fn used_ratio(&self, l: &Ledger) -> f64 {
        if self.limit() > 0.0 {
            (l.spent + l.reserved) / self.limit()
        } else {
            1.0
        }
    }

    /// After a change: the first crossing of `degrade_at` this hour, to be sent (outside the
    /// lock).
    fn crossing(&self, l: &mut Ledger, now: DateTime<Utc>) -> Option<HealthEvent> {
        if l.crossed || self.used_ratio(l) < self.cfg.degrade_at {
            return None;
        }
        l.crossed = true;
        Some(HealthEvent::BudgetCrossed {
            used: l.spent + l.reserved,
            limit: self.limit(),
            degrade_at: self.cfg.degrade_at,
            hour_start: l.hour,
            at: now,
        })
    }

    fn announce(&self, ev: Option<HealthEvent>) {
        if let (Some(ev), Some(tx)) = (ev, &self.events) {
            tracing::warn!("extra-cost budget past degrade_at: no new switch this hour");
            let _ = tx.send(ev);
        }
    }

    /// Books the estimated maximum extra cost of a request to `route` with `prompt_tokens`
    /// and at most `max_tokens` of output. `Ok(None)`: the route costs nothing extra.
    pub fn reserve(
        self: &Arc<Self>,
        route: &RouteId,
        prompt_tokens: u64,
        max_tokens: u64,
    ) -> Result<Option<Reservation>, Refused> {
        let Some((serves, price)) = self.prices.get(route) else {
            return Ok(None);
        };
        let needed = price.cost(prompt_tokens, max_tokens);
        let now = self.clock.now();
        let event;
        {
            let mut l = self.ledger(now);
            let left = (self.limit() - l.spent - l.reserved).max(0.0);
            if needed > left {
                l.refused += 1;
                return Err(Refused { needed, left });
            }
            l.reserved += needed;
            event = self.crossing(&mut l, now);
        }
        self.announce(event);
        Ok(Some(Reservation {
            budget: self.clone(),
            serves: serves.clone(),
            price: *price,
            amount: needed,
            open: true,
            hold: None,
        }))
    }

    /// Settles a shared reservation in the store, off the request's path (the booking stays
    /// in the ledger until then, so a late settlement errs on the safe side).
    fn close_shared(self: &Arc<Self>, spend: Spend, hold: Hold, charged_micros: i64) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime (shutting down): the reservation expires and is released by the
            // next booking.
            return;
        };
        let budget = self.clone();
        rt.spawn(async move {
            match spend.settle(hold, charged_micros).await {
                Ok(row) => budget.mirror(row),
                Err(e) => tracing::warn!(error = %e, "could not settle an extra-cost reservation: it stays booked until it expires"),
            }
        });
    }

    fn close(&self, serves: &str, reserved: f64, charged: f64) {
        let now = self.clock.now();
        let event;
        {
            let mut l = self.ledger(now);
            l.reserved = (l.reserved - reserved).max(0.0);
            l.spent += charged;
            *l.total_by_model.entry(serves.to_owned()).or_insert(0.0) += charged;
            event = self.crossing(&mut l, now);
        }
        self.announce(event);
    }

    /// Books through the store's spend ledger from now on (once; a second call is ignored):
    /// every process sharing the database shares this one budget.
    pub fn share(&self, spend: Spend) {
        let _ = self.shared.set(spend);
    }

    /// Whether bookings go through the store.
    pub fn is_shared(&self) -> bool {
        self.shared.get().is_some()
    }

    /// [`Self::reserve`], through the store's ledger when the budget is shared.
    pub async fn reserve_shared(
        self: &Arc<Self>,
        route: &RouteId,
        prompt_tokens: u64,
        max_tokens: u64,
    ) -> Result<Option<Reservation>, Refused> {
        let Some(spend) = self.shared.get() else {
            return self.reserve(route, prompt_tokens, max_tokens);
        };
        let Some((serves, price)) = self.prices.get(route) else {
            return Ok(None);
        };
        let micros = price.micros(prompt_tokens, max_tokens);
        let limit = spend::to_micros_floor(self.limit());
        let booked = spend
            .reserve(LEDGER_KEY, crate::config::Per::Hour, micros, limit)
            .await;
        let needed = spend::from_micros(micros);
        match booked {
            Ok(Ok((hold, row))) => {
                self.mirror(row);
                Ok(Some(Reservation {
                    budget: self.clone(),
                    serves: serves.clone(),
                    price: *price,
                    amount: needed,
                    open: true,
                    hold: Some((spend.clone(), hold)),
                }))
            }
            Ok(Err(refusal)) => {
                self.mirror(refusal.row);
                let row = refusal.row;
                let left =
                    spend::from_micros((limit - row.spent_micros - row.reserved_micros).max(0));
                Err(Refused { needed, left })
            }
            Err(e) => {
                tracing::warn!(error = %e, "the shared extra-cost budget cannot be checked: not sending to a non-primary route");
                self.ledger(self.clock.now()).refused += 1;
                Err(Refused { needed, left: 0.0 })
            }
        }
    }

    /// The fleet's numbers for this hour as the store gave them (the refusals too).
    fn mirror(&self, row: LedgerRow) {
        let now = self.clock.now();
        let event;
        {
            let mut l = self.ledger(now);
            l.spent = spend::from_micros(row.spent_micros);
            l.reserved = spend::from_micros(row.reserved_micros.max(0));
            l.refused = row.refused;
            event = self.crossing(&mut l, now);
        }
        self.announce(event);
    }

    /// Below `degrade_at`: a new switch may happen now.
    pub fn allows_switch(&self) -> bool {
        let l = self.ledger(self.clock.now());
        self.used_ratio(&l) < self.cfg.degrade_at
    }

    /// The extra cost settled for `serves` since start.
    pub fn total_for(&self, serves: &str) -> f64 {
        let l = self.ledger(self.clock.now());
        l.total_by_model.get(serves).copied().unwrap_or(0.0)
    }

    /// Turns the clock hour on time even when no request comes (the ledger also rolls on
    /// every use), follows the shared ledger's numbers when the budget is shared, and beats `pulse` (`budget`) every [`crate::heartbeat::PULSE_EVERY`].
    pub async fn keep_hours(
        self: Arc<Self>,
        pulse: Option<crate::heartbeat::Pulse>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(crate::heartbeat::PULSE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            drop(self.ledger(self.clock.now()));
            if let Some(p) = &pulse {
                p.beat();
            }
            // Shared: what the other processes booked shows here even when this one books
            // nothing (its switch decisions and metrics follow the fleet's budget). Bounded, so
            // a store that hangs never holds the hour's turn.
            if let Some(spend) = self.shared.get() {
                let read = spend.usage(LEDGER_KEY, crate::config::Per::Hour);
                match tokio::time::timeout(crate::heartbeat::PULSE_EVERY / 2, read).await {
                    Ok(Ok(row)) => self.mirror(row),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "cannot read the shared extra-cost budget")
                    }
                    Err(_) => {
                        tracing::debug!("the shared extra-cost budget did not answer in time")
                    }
                }
            }
        }
    }

    pub fn snapshot(&self) -> ExtraCostSnapshot {
        let l = self.ledger(self.clock.now());
        let used_ratio = self.used_ratio(&l);
        ExtraCostSnapshot {
            hour_start: l.hour,
            max_extra_cost_per_hour: self.limit(),
            degrade_at: self.cfg.degrade_at,
            spent: l.spent,
            reserved: l.reserved,
            used_ratio,
            switching_allowed: used_ratio < self.cfg.degrade_at,
            refused: l.refused,
            total_by_model: l.total_by_model.clone(),
        }
    }
}

/// A booked estimate; settle it with the metered usage, or release it.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<ExtraCost>,
    serves: String,
    price: ExtraPrice,
    amount: f64,
    open: bool,
    /// Booked in the store's ledger (a shared budget).
    hold: Option<(Spend, Hold)>,
}

impl Reservation {
    /// Closes the reservation locally and, when shared, in the store.
    fn finish(&mut self, charged: f64, charged_micros: i64) {
        self.open = false;
        self.budget.close(&self.serves, self.amount, charged);
        if let Some((spend, hold)) = self.hold.take() {
            self.budget.close_shared(spend, hold, charged_micros);
        }
    }

    /// The booked amount.
    pub fn amount(&self) -> f64 {
        self.amount
    }

    /// The usage is known: charge its extra cost, release the rest of the estimate.
    pub fn settle(mut self, input_tokens: u64, output_tokens: u64) -> f64 {
        let charged = self.price.cost(input_tokens, output_tokens);
        let micros = self.price.micros(input_tokens, output_tokens);
        self.finish(charged, micros);
        charged
    }

    /// Nothing was consumed (the attempt failed before an answer).
    pub fn release(mut self) {
        self.finish(0.0, 0);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.open {
            // Usage unknown (e.g. the client hung up mid-stream): the whole estimate counts.
            let micros = self.hold.as_ref().map_or(0, |(_, h)| h.micros);
            self.finish(self.amount, micros);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::clock::ManualClock;

    pub(crate) fn route(id: &str, tier: Tier, input: f64, output: f64) -> Route {
        let id = RouteId::parse(id).unwrap();
        let (p, r, m) = id.split();
        let config = crate::config::Config::default();
        Route {
            id: id.clone(),
            provider: p.into(),
            region: r.into(),
            model: m.into(),
            kind: crate::route::ProviderKind::Openai,
            base_url: "http://127.0.0.1:1".into(),
            api_key_env: None,
            serves: "chat".into(),
            tier,
            weight: 100,
            price: Some(crate::route::Price {
                input_per_mtok: input,
                output_per_mtok: output,
                currency: "CNY".into(),
            }),
            capabilities: Vec::new(),
            context_window: None,
            embedding: None,
            residency: None,
            slo: 0.999,
            probe: config.probe_settings(&crate::config::RouteConfig::default()),
        }
    }

    #[test]
    fn extra_prices_are_positive_differences_to_the_cheapest_primary() {
        let routes = [
            route("a/x/m", Tier::Primary, 2.0, 6.0),
            route("b/x/m", Tier::Backup, 4.0, 5.0),
            route("c/x/m", Tier::Backup, 1.0, 1.0),
        ];
        let p = extra_prices(&routes);
        assert_eq!(
            p[&RouteId::new("b", "x", "m")].1,
            ExtraPrice {
                input_per_mtok: 2.0,
                output_per_mtok: 0.0
            }
        );
        assert!(!p.contains_key(&RouteId::new("c", "x", "m")));
        assert!(!p.contains_key(&RouteId::new("a", "x", "m")));
    }

    #[test]
    fn settle_releases_the_unused_part_and_drop_keeps_it() {
        let clock = Arc::new(ManualClock::new("2024-05-01T10:00:00Z".parse().unwrap()));
        let routes = [
            route("a/x/m", Tier::Primary, 0.0, 0.0),
            route("b/x/m", Tier::Backup, 1_000_000.0, 1_000_000.0),
        ];
        let cfg = ExtraCostConfig {
            max_extra_cost_per_hour: 100.0,
            degrade_at: 0.8,
        };
        let b = ExtraCost::new(cfg, &routes, clock, None);
        let id = RouteId::new("b", "x", "m");
        let r = b.reserve(&id, 10, 20).unwrap().unwrap();
        assert_eq!(r.amount(), 30.0);
        assert_eq!(b.snapshot().reserved, 30.0);
        assert_eq!(r.settle(10, 5), 15.0);
        let s = b.snapshot();
        assert_eq!((s.spent, s.reserved), (15.0, 0.0));
        drop(b.reserve(&id, 1, 1).unwrap());
        assert_eq!(b.snapshot().spent, 17.0);
        b.reserve(&id, 1, 1).unwrap().unwrap().release();
        assert_eq!(b.snapshot().spent, 17.0);
        assert!(b
            .reserve(&RouteId::new("a", "x", "m"), 10, 10)
            .unwrap()
            .is_none());
        assert_eq!(b.total_for("chat"), 17.0);
    }
}
