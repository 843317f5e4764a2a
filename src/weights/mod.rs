//! Health → traffic weights, per logical model (`serves`), versioned, published on a `watch`
//! channel that the weights feed (`/api/v1/weights`, SSE) and the in-process proxy follow.
//!
//! - [`compute`] (in `compute`) is the pure core: one [`Inputs`] — the routes, a health
//!   snapshot, the policy, drift's view, the switch controller's overrides, the proxy's open
//!   breakers, the running drills' caps — to weights per model.
//! - [`Weights`] keeps the current version and bumps it only on a real change.
//! - [`spawn_publisher`] (in `publisher`) is the thin task that follows every one of those
//!   [`Feeds`] and publishes each new version.
//!
//! **Rules** (tiers and equivalence, docs/architecture.md). A route's score is
//! `configured weight × health factor × success factor (× drift factor)`, all in integer
//! tenths so the arithmetic is exact:
//! - health factor: NORMAL 1, WARNING 0.5, DEGRADED 0.1, CRITICAL and SWITCHED 0, UNKNOWN 1
//!   (flagged with the reason code `unjudged`);
//! - success factor: the route's rolling success ratio (probes and passive, from detection)
//!   rounded to 0.1, once the error window is over the detector's floors
//!   (`[detection] min_error_samples` outcomes with at least `min_failures` failures:
//!   `RouteStatus::success_judged`); below them it counts as 1, so one failed call never
//!   takes a route out of rotation (the proxy's breaker and `Retry-After` rests handle that);
//!   reason `success_ratio_low` when it lowers the score;
//! - drift factor: with `[drift] on_drift = "deweight"` ([`Policy::from_config`]) a route
//!   whose behaviour changed — an open drift finding (regression sets) or `PROBE_OK`
//!   mismatches of the regular probe — keeps [`DEWEIGHT_TENTHS`] (0.1) of its score, reason
//!   `behavior_changed`: first move traffic, then investigate. With `alert` (the default) the
//!   factor is 1 ([`Policy::behavior_changed_tenths`]).
//! - quality gate: a `backup` or `fallback` route that fails
//!   [`DriftSnapshot::eligible`] scores 0 with reason `regression_failed` — a backup that
//!   answers in the wrong format is no backup.
//!
//! A route is *usable* when its score is above 0. The whole share goes to the usable
//! `primary` routes; when none is usable, to the `backup` routes; then to the `fallback`
//! routes. The share is 100 split by largest remainder (ties to config order), so weights are
//! integers summing to exactly 100. With nothing usable every weight is 0 and the model is
//! `all_unhealthy` (a router may then fail open).
//!
//! On top of that, per model: a switch override moves the share to the backup (reasons
//! `switched`, `canary`), a running drill caps its route (reason `drill`), and an open proxy
//! breaker shows in the reason (`breaker_open`) — see [`Inputs`].
//!
//! **Versions.** `version` increases only when a weight, a state, a reason code or the serving
//! tier changes — never because time passed or one more probe arrived — so ETags, long-polls
//! and SSE stay quiet while nothing changes. The first version is the publishing start time in
//! unix milliseconds, so versions keep increasing across restarts and a client's old ETag or
//! `Last-Event-ID` never looks newer than the server's. Each version is serialised to JSON
//! once ([`WeightsSnapshot::json`]) and shared by every subscriber.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod compute;
mod publisher;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::watch;

use crate::config::{Config, OnDrift};
use crate::drift::DriftSnapshot;
use crate::health::{HealthSnapshot, State};
use crate::route::{Route, RouteId, Tier};

pub use compute::{compute, compute_models, largest_remainder, Inputs};
pub use publisher::{spawn_publisher, Feeds};

/// The receiving end of the published weights.
pub type WeightsRx = watch::Receiver<Arc<WeightsSnapshot>>;

/// How the configuration bends the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Factor in tenths applied to a route whose answers stopped being `PROBE_OK`
    /// (`behavior_changed`). 10 = no effect (`on_drift = "alert"`, the default);
    /// [`DEWEIGHT_TENTHS`] with `on_drift = "deweight"`.
    pub behavior_changed_tenths: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Self::ALERT
    }
}

/// The drift factor of `on_drift = "deweight"`: a route whose behaviour changed keeps 0.1 of
/// its score — enough to leave it a trickle of traffic (so recovery shows) among healthy
/// peers, while it still carries the whole share when it is the only usable route.
pub const DEWEIGHT_TENTHS: u64 = 1;

impl Policy {
    /// `on_drift = "alert"`, the default: a behaviour change alerts and moves no traffic.
    pub const ALERT: Policy = Policy {
        behavior_changed_tenths: 10,
    };

    /// `[drift] on_drift`: `alert` leaves weights alone, `deweight` applies
    /// [`DEWEIGHT_TENTHS`].
    pub fn from_config(config: &Config) -> Self {
        match config.drift.on_drift {
            OnDrift::Alert => Self::default(),
            OnDrift::Deweight => Self {
                behavior_changed_tenths: DEWEIGHT_TENTHS,
            },
        }
    }
}

/// The switch controller's say over one logical model (`crate::switch`): the share goes to
/// `backup`, except `primary_share` percent that stays on (returns to) the primaries during a
/// canary. Applies only while the backup is usable; otherwise the model's weights follow
/// health alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SwitchOverride {
    pub backup: RouteId,
    /// 0 while switched; the canary ratio as a percentage (5, 25, 100) during a return.
    pub primary_share: u8,
}

/// Overrides by logical model (`serves`).
pub type Overrides = BTreeMap<String, SwitchOverride>;

/// Routes whose circuit breaker in the in-process proxy is open or half-open.
pub type OpenBreakers = BTreeSet<RouteId>;

/// One running drill's say over its route (`crate::drill`): in the current stage the route's
/// weight is `normal × (1 − percent/100) + target × percent/100`, `normal` being what it
/// would get without the drill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DrillCap {
    pub drill: i64,
    pub target: u8,
    /// How much of the move is done (the ramp's current stage).
    pub percent: u8,
    /// For the weights' `detail`: the drill, its stage and reason.
    pub text: String,
}

/// Drill caps by route.
pub type DrillCaps = BTreeMap<RouteId, DrillCap>;

/// One route's weight within its logical model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WeightEntry {
    pub route: RouteId,
    pub provider: String,
    pub region: String,
    pub model: String,
    pub tier: Tier,
    /// 0..=100; the weights of a model sum to 100 unless it is `all_unhealthy`.
    pub weight: u8,
    pub state: State,
    /// Stable code: `healthy`, `unjudged` (UNKNOWN, weighted as healthy), `standby` (usable,
    /// but a higher tier carries the traffic), `success_ratio_low`, `weight_zero`,
    /// `behavior_changed`, or detection's reason code for WARNING and worse (e.g.
    /// `latency_above_baseline`, `error_rate_high`; the state name when it gave none);
    /// under a switch override: `switched` (the backup carrying the share, and the primaries
    /// it was moved from), `canary` (backup and primaries during a return); `drill` (a
    /// drill moves traffic off the route, or a standby route takes it).
    pub reason: String,
    /// A sentence for people where the code needs one (a drill: its id, stage and reason).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Which tier carries a model, and whether anything can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Serving {
    /// The tier whose routes have the share; `None` when nothing is usable.
    pub tier: Option<Tier>,
    /// No route of the model is usable: every weight is 0.
    pub all_unhealthy: bool,
}

/// One logical model's weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelWeights {
    /// In config order.
    pub entries: Vec<WeightEntry>,
    pub serving: Serving,
}

/// One published version.
#[derive(Debug, Clone)]
pub struct WeightsSnapshot {
    pub version: u64,
    /// When this version was computed (the health snapshot's time).
    pub generated_at: DateTime<Utc>,
    pub models: BTreeMap<String, ModelWeights>,
    /// The JSON body, serialised once per version: `{version, generated_at, models:{"<serves>":
    /// [entries]}, serving:{"<serves>":{tier, all_unhealthy}}}`.
    pub json: Bytes,
}

impl WeightsSnapshot {
    fn new(
        version: u64,
        generated_at: DateTime<Utc>,
        models: BTreeMap<String, ModelWeights>,
    ) -> Self {
        #[derive(Serialize)]
        struct Body<'a> {
            version: u64,
            generated_at: String,
            models: BTreeMap<&'a str, &'a [WeightEntry]>,
            serving: BTreeMap<&'a str, Serving>,
        }
        let body = Body {
            version,
            generated_at: crate::clock::rfc3339(generated_at),
            models: models
                .iter()
                .map(|(k, m)| (k.as_str(), m.entries.as_slice()))
                .collect(),
            serving: models
                .iter()
                .map(|(k, m)| (k.as_str(), m.serving))
                .collect(),
        };
        // Plain strings, numbers and enums with derived impls: serialising cannot fail; an
        // empty body would only show up as a client-side parse error.
        let json = serde_json::to_vec(&body).unwrap_or_default();
        Self {
            version,
            generated_at,
            models,
            json: Bytes::from(json),
        }
    }

    /// The JSON as text (for SSE `data:` lines).
    pub fn json_str(&self) -> &str {
        std::str::from_utf8(&self.json).unwrap_or_default()
    }

    /// The weight of `route`, if it is configured.
    pub fn weight(&self, route: &RouteId) -> Option<u8> {
        self.models
            .values()
            .flat_map(|m| &m.entries)
            .find(|e| &e.route == route)
            .map(|e| e.weight)
    }
}

/// The versioned state of the weights: recompute on each health snapshot, bump the version
/// only on a real change.
#[derive(Debug)]
pub struct Weights {
    routes: Arc<Vec<Route>>,
    policy: Policy,
    drift: Option<Arc<DriftSnapshot>>,
    overrides: Overrides,
    breakers: OpenBreakers,
    drills: DrillCaps,
    current: Arc<WeightsSnapshot>,
    /// The health snapshot `current` was computed from, while nothing else changed since:
    /// [`Weights::update_shared`] then recomputes only the models whose routes changed.
    last: Option<Arc<HealthSnapshot>>,
    /// Each route's logical model.
    serves: std::collections::HashMap<RouteId, String>,
    /// Models computed since the start (a full computation counts every model).
    computed: u64,
}

impl Weights {
    /// The first version is `health.generated_at` in unix milliseconds (at least 1).
    pub fn new(routes: Arc<Vec<Route>>, policy: Policy, health: &HealthSnapshot) -> Self {
        Self::with_drift(routes, policy, None, health)
    }

    /// [`Weights::new`] counting drift's view from the first version on.
    pub fn with_drift(
        routes: Arc<Vec<Route>>,
        policy: Policy,
        drift: Option<Arc<DriftSnapshot>>,
        health: &HealthSnapshot,
    ) -> Self {
        let models = compute(&Inputs {
            policy: &policy,
            drift: drift.as_deref(),
            ..Inputs::new(&routes, health)
        });
        let version = u64::try_from(health.generated_at.timestamp_millis())
            .unwrap_or(0)
            .max(1);
        let computed = models.len() as u64;
        let current = Arc::new(WeightsSnapshot::new(version, health.generated_at, models));
        Self {
            serves: routes
                .iter()
                .map(|r| (r.id.clone(), r.serves.clone()))
                .collect(),
            last: None,
            computed,
            routes,
            policy,
            drift,
            overrides: Overrides::new(),
            breakers: OpenBreakers::new(),
            drills: DrillCaps::new(),
            current,
        }
    }

    /// Replaces the proxy's open breakers; the next [`Weights::update`] discloses them.
    pub fn set_breakers(&mut self, breakers: OpenBreakers) {
        self.breakers = breakers;
        self.last = None;
    }

    /// Replaces the running drills' caps; the next [`Weights::update`] applies them.
    pub fn set_drills(&mut self, drills: DrillCaps) {
        self.drills = drills;
        self.last = None;
    }

    /// Replaces the switch overrides; the next [`Weights::update`] applies them.
    pub fn set_overrides(&mut self, overrides: Overrides) {
        self.overrides = overrides;
        self.last = None;
    }

    pub fn current(&self) -> Arc<WeightsSnapshot> {
        self.current.clone()
    }

    /// Sets drift's latest view; the next [`Weights::update`] takes it into account.
    pub fn set_drift(&mut self, drift: Option<Arc<DriftSnapshot>>) {
        self.drift = drift;
        self.last = None;
    }

    /// Recomputes; `Some(new version)` when a weight, state, reason code or serving tier
    /// changed, `None` (and no serialisation) otherwise.
    pub fn update(&mut self, health: &HealthSnapshot) -> Option<Arc<WeightsSnapshot>> {
        self.last = None;
        let models = self.models(health, None);
        self.next(models, health)
    }

    /// [`Weights::update`] from a shared snapshot: when only health changed since the last
    /// call, only the logical models with a route whose status changed are recomputed.
    pub fn update_shared(&mut self, health: &Arc<HealthSnapshot>) -> Option<Arc<WeightsSnapshot>> {
        let changed = self
            .last
            .as_ref()
            .and_then(|last| changed_models(last, health, &self.serves));
        self.last = Some(health.clone());
        let models = match changed {
            None => self.models(health, None),
            Some(changed) if changed.is_empty() => return None,
            Some(changed) => {
                let mut models = self.current.models.clone();
                models.extend(self.models(health, Some(&changed)));
                models
            }
        };
        self.next(models, health)
    }

    /// Logical models computed since the start: what recomputation has cost.
    pub fn computed(&self) -> u64 {
        self.computed
    }

    fn models(
        &mut self,
        health: &HealthSnapshot,
        only: Option<&BTreeSet<String>>,
    ) -> BTreeMap<String, ModelWeights> {
        let models = compute_models(
            &Inputs {
                routes: &self.routes,
                health,
                policy: &self.policy,
                drift: self.drift.as_deref(),
                overrides: &self.overrides,
                breakers: &self.breakers,
                drills: &self.drills,
            },
            only,
        );
        self.computed += models.len() as u64;
        models
    }

    fn next(
        &mut self,
        models: BTreeMap<String, ModelWeights>,
        health: &HealthSnapshot,
    ) -> Option<Arc<WeightsSnapshot>> {
        if models == self.current.models {
            return None;
        }
        let next = Arc::new(WeightsSnapshot::new(
            self.current.version + 1,
            health.generated_at,
            models,
        ));
        self.current = next.clone();
        Some(next)
    }
}

/// The logical models with a route whose status differs between `before` and `after`;
/// `None` when the two do not list the same routes in the same order (then compute all).
fn changed_models(
    before: &HealthSnapshot,
    after: &HealthSnapshot,
    serves: &std::collections::HashMap<RouteId, String>,
) -> Option<BTreeSet<String>> {
    if before.routes.len() != after.routes.len() {
        return None;
    }
    let mut changed = BTreeSet::new();
    for (a, b) in before.routes.iter().zip(&after.routes) {
        if a.route != b.route {
            return None;
        }
        if a != b {
            changed.insert(serves.get(&a.route)?.clone());
        }
    }
    Some(changed)
}
