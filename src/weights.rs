//! Health → traffic weights, per logical model (`serves`), versioned, published on a `watch`
//! channel that the weights feed (`/api/v1/weights`, SSE) and the in-process proxy follow.
//!
//! The core ([`compute`], [`Weights::update`]) is pure; [`spawn_publisher`] is the thin task
//! that recomputes on every health change.
//!
//! **Rules** (SPEC "Tiers and equivalence"). A route's score is
//! `configured weight × health factor × success factor (× drift factor)`, all in integer
//! tenths so the arithmetic is exact:
//! - health factor: NORMAL 1, WARNING 0.5, DEGRADED 0.1, CRITICAL and SWITCHED 0, UNKNOWN 1
//!   (flagged with the reason code `unjudged`);
//! - success factor: the route's rolling success ratio (probes and passive, from detection)
//!   rounded to 0.1; no outcome yet counts as 1;
//! - drift factor: with `[drift] on_drift = "deweight"` ([`Policy::from_config`]) a route
//!   whose behaviour changed — an open drift finding (regression sets) or `PROBE_OK`
//!   mismatches of the regular probe — keeps [`DEWEIGHT_TENTHS`] (0.1) of its score, reason
//!   `behavior_changed`: first move traffic, then investigate. With `alert` (the default) the
//!   factor is 1 ([`Policy::behavior_changed_tenths`]).
//! - quality gate (seed 003): a `backup` or `fallback` route that fails
//!   [`DriftSnapshot::eligible`] scores 0 with reason `regression_failed` — a backup that
//!   answers in the wrong format is no backup.
//!
//! A route is *usable* when its score is above 0. The whole share goes to the usable
//! `primary` routes; when none is usable, to the `backup` routes; then to the `fallback`
//! routes. The share is 100 split by largest remainder (ties to config order), so weights are
//! integers summing to exactly 100. With nothing usable every weight is 0 and the model is
//! `all_unhealthy` (a router may then fail open).
//!
//! **Versions.** `version` increases only when a weight, a state, a reason code or the serving
//! tier changes — never because time passed or one more probe arrived — so ETags, long-polls
//! and SSE stay quiet while nothing changes. The first version is the publishing start time in
//! unix milliseconds, so versions keep increasing across restarts and a client's old ETag or
//! `Last-Event-ID` never looks newer than the server's. Each version is serialised to JSON
//! once ([`WeightsSnapshot::json`]) and shared by every subscriber.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, OnDrift};
use crate::drift::{DriftRx, DriftSnapshot};
use crate::health::{HealthRx, HealthSnapshot, RouteStatus, State};
use crate::route::{Route, RouteId, Tier};

/// The receiving end of the published weights.
pub type WeightsRx = watch::Receiver<Arc<WeightsSnapshot>>;

/// Knobs that later issues turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Factor in tenths applied to a route whose answers stopped being `PROBE_OK`
    /// (`behavior_changed`). 10 = no effect (`on_drift = "alert"`, the default); the drift
    /// issue lowers it for `on_drift = "deweight"`.
    pub behavior_changed_tenths: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            behavior_changed_tenths: 10,
        }
    }
}

/// The drift factor of `on_drift = "deweight"`: a route whose behaviour changed keeps 0.1 of
/// its score — enough to leave it a trickle of traffic (so recovery shows) among healthy
/// peers, while it still carries the whole share when it is the only usable route.
pub const DEWEIGHT_TENTHS: u64 = 1;

impl Policy {
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

/// Health factor in tenths.
fn health_tenths(state: State) -> u64 {
    match state {
        State::Unknown | State::Normal => 10,
        State::Warning => 5,
        State::Degraded => 1,
        State::Critical | State::Switched => 0,
    }
}

/// Success factor in tenths: the ratio rounded to 0.1; no evidence counts as 1.
fn success_tenths(ratio: Option<f64>) -> u64 {
    match ratio {
        Some(r) if r.is_finite() => (r.clamp(0.0, 1.0) * 10.0).round() as u64,
        _ => 10,
    }
}

/// A route's score and the reason code that explains it (before tier selection).
fn score(
    route: &Route,
    status: Option<&RouteStatus>,
    drift: Option<&DriftSnapshot>,
    policy: &Policy,
) -> (u64, State, String) {
    score_as(
        route,
        status,
        drift,
        policy,
        status.map_or(State::Unknown, |s| s.state),
    )
}

/// [`score`] as if the route were in `state` (a canary judges primaries by their judged
/// state under the `SWITCHED` overlay).
fn score_as(
    route: &Route,
    status: Option<&RouteStatus>,
    drift: Option<&DriftSnapshot>,
    policy: &Policy,
    state: State,
) -> (u64, State, String) {
    let health = health_tenths(state);
    let success = success_tenths(status.and_then(|s| s.success_ratio));
    let gated = drift.is_some_and(|d| d.eligible(route).is_err());
    let drifted = status.is_some_and(|s| s.behavior_changed)
        || drift.is_some_and(|d| d.behavior_changed(&route.id));
    let drift = if drifted {
        policy.behavior_changed_tenths.min(10)
    } else {
        10
    };
    let score = if gated {
        0
    } else {
        u64::from(route.weight) * health * success * drift
    };
    let reason = match state {
        State::Critical | State::Switched if gated => status
            .and_then(|s| s.reason.as_ref())
            .map(|r| r.code.clone())
            .unwrap_or_else(|| state.as_str().to_ascii_lowercase()),
        _ if gated => "regression_failed".to_owned(),
        State::Warning | State::Degraded | State::Critical | State::Switched => status
            .and_then(|s| s.reason.as_ref())
            .map(|r| r.code.clone())
            .unwrap_or_else(|| state.as_str().to_ascii_lowercase()),
        _ if route.weight == 0 => "weight_zero".to_owned(),
        _ if drift < 10 => "behavior_changed".to_owned(),
        _ if success < 10 => "success_ratio_low".to_owned(),
        State::Unknown => "unjudged".to_owned(),
        _ => "healthy".to_owned(),
    };
    (score, state, reason)
}

/// Splits 100 proportionally to `scores` by largest remainder (ties to the earlier index).
/// All zero → all zero.
pub fn largest_remainder(scores: &[u64]) -> Vec<u8> {
    let total: u64 = scores.iter().sum();
    if total == 0 {
        return vec![0; scores.len()];
    }
    let mut out: Vec<u64> = scores.iter().map(|s| s * 100 / total).collect();
    let assigned: u64 = out.iter().sum();
    let mut order: Vec<usize> = (0..scores.len()).collect();
    // Largest remainder first; the stable sort keeps config order among equals.
    order.sort_by_key(|&i| std::cmp::Reverse(scores[i] * 100 % total));
    for &i in order.iter().take((100 - assigned) as usize) {
        out[i] += 1;
    }
    out.into_iter()
        .map(|w| u8::try_from(w).unwrap_or(100))
        .collect()
}

/// The weights of every logical model for one health snapshot (routes missing from it are
/// UNKNOWN). Models in name order, entries in config order.
pub fn compute(
    routes: &[Route],
    health: &HealthSnapshot,
    policy: &Policy,
) -> BTreeMap<String, ModelWeights> {
    compute_with(routes, health, None, policy, &Overrides::new())
}

/// [`compute`] with drift's view: open findings (the drift factor) and the quality gate.
pub fn compute_with_drift(
    routes: &[Route],
    health: &HealthSnapshot,
    drift: Option<&DriftSnapshot>,
    policy: &Policy,
) -> BTreeMap<String, ModelWeights> {
    compute_with(routes, health, drift, policy, &Overrides::new())
}

/// [`compute_with_drift`] with the switch controller's overrides: for an overridden model
/// whose backup is usable, the backup gets `100 − primary_share` and the primaries
/// `primary_share` (split by their scores under their judged state, by configured weight when
/// none scores); every other route of the model gets 0.
pub fn compute_with(
    routes: &[Route],
    health: &HealthSnapshot,
    drift: Option<&DriftSnapshot>,
    policy: &Policy,
    overrides: &Overrides,
) -> BTreeMap<String, ModelWeights> {
    compute_full(
        routes,
        health,
        drift,
        policy,
        overrides,
        &OpenBreakers::new(),
    )
}

/// Routes whose circuit breaker in the in-process proxy is open or half-open.
pub type OpenBreakers = std::collections::BTreeSet<RouteId>;

/// [`compute_with`] that also discloses the proxy's open breakers: such a route keeps its
/// weight (the proxy already tries it last, and half-open trials need traffic to close it)
/// but its reason says `breaker_open` while detection has nothing worse to say.
pub fn compute_full(
    routes: &[Route],
    health: &HealthSnapshot,
    drift: Option<&DriftSnapshot>,
    policy: &Policy,
    overrides: &Overrides,
    breakers: &OpenBreakers,
) -> BTreeMap<String, ModelWeights> {
    compute_all(
        routes,
        health,
        drift,
        policy,
        overrides,
        breakers,
        &DrillCaps::new(),
    )
}

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

/// [`compute_full`] with the running drills' caps: a drilled route gets its drill weight
/// (reason `drill`) and the rest of the share goes to the model's other routes as the
/// publisher spreads it when the drilled routes carry nothing. While no other route of the
/// model is usable the drill moves nothing (traffic is never moved onto nothing).
pub fn compute_all(
    routes: &[Route],
    health: &HealthSnapshot,
    drift: Option<&DriftSnapshot>,
    policy: &Policy,
    overrides: &Overrides,
    breakers: &OpenBreakers,
    drills: &DrillCaps,
) -> BTreeMap<String, ModelWeights> {
    let by_id: HashMap<&RouteId, &RouteStatus> =
        health.routes.iter().map(|s| (&s.route, s)).collect();
    let mut groups: BTreeMap<&str, Vec<&Route>> = BTreeMap::new();
    for r in routes {
        groups.entry(r.serves.as_str()).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|(serves, members)| {
            let scored: Vec<(u64, State, String)> = members
                .iter()
                .map(|r| {
                    let (score, state, reason) = score(r, by_id.get(&r.id).copied(), drift, policy);
                    let quiet = matches!(state, State::Normal | State::Unknown | State::Warning);
                    let reason = if quiet && breakers.contains(&r.id) && score > 0 {
                        "breaker_open".to_owned()
                    } else {
                        reason
                    };
                    (score, state, reason)
                })
                .collect();
            let model = |scored: &[(u64, State, String)]| {
                model_weights(
                    &members,
                    scored,
                    &by_id,
                    drift,
                    policy,
                    overrides.get(serves),
                )
            };
            let normal = model(&scored);
            let drilled: Vec<(usize, &DrillCap)> = members
                .iter()
                .enumerate()
                .filter_map(|(i, r)| drills.get(&r.id).map(|c| (i, c)))
                .collect();
            if drilled.is_empty() {
                return (serves.to_owned(), normal);
            }
            let mut without = scored.clone();
            for (i, _) in &drilled {
                without[*i].0 = 0;
            }
            let alt = model(&without);
            (serves.to_owned(), drilled_weights(normal, alt, &drilled))
        })
        .collect()
}

/// A model's weights from its routes' scores (and the switch override, if any).
fn model_weights(
    members: &[&Route],
    scored: &[(u64, State, String)],
    by_id: &HashMap<&RouteId, &RouteStatus>,
    drift: Option<&DriftSnapshot>,
    policy: &Policy,
    o: Option<&SwitchOverride>,
) -> ModelWeights {
    if let Some(o) = o {
        if let Some(m) = overridden(members, scored, by_id, drift, policy, o) {
            return m;
        }
    }
    let serving_tier = [Tier::Primary, Tier::Backup, Tier::Fallback]
        .into_iter()
        .find(|t| {
            members
                .iter()
                .zip(scored)
                .any(|(r, (s, _, _))| r.tier == *t && *s > 0)
        });
    let shares: Vec<u64> = members
        .iter()
        .zip(scored)
        .map(|(r, (s, _, _))| if Some(r.tier) == serving_tier { *s } else { 0 })
        .collect();
    let weights = largest_remainder(&shares);
    let entries = members
        .iter()
        .zip(scored.iter().cloned())
        .zip(weights)
        .map(|((r, (s, state, reason)), weight)| {
            let standby = s > 0 && Some(r.tier) != serving_tier;
            WeightEntry {
                route: r.id.clone(),
                provider: r.provider.clone(),
                region: r.region.clone(),
                model: r.model.clone(),
                tier: r.tier,
                weight,
                state,
                reason: if standby {
                    "standby".to_owned()
                } else {
                    reason
                },
                detail: None,
            }
        })
        .collect();
    ModelWeights {
        entries,
        serving: Serving {
            tier: serving_tier,
            all_unhealthy: serving_tier.is_none(),
        },
    }
}

/// Combines a model's `normal` weights with `alt` (its weights with the drilled routes
/// scoring 0): each drilled route gets its drill weight, the others split the rest as in
/// `alt`.
fn drilled_weights(
    normal: ModelWeights,
    alt: ModelWeights,
    drilled: &[(usize, &DrillCap)],
) -> ModelWeights {
    let n = normal.entries.len();
    let mut want: Vec<u64> = drilled
        .iter()
        .map(|(i, c)| {
            u64::from(crate::drill::plan::drill_weight(
                normal.entries[*i].weight,
                c.target,
                c.percent,
            ))
        })
        .collect();
    let others: Vec<u64> = (0..n)
        .map(|i| {
            if drilled.iter().any(|(d, _)| *d == i) {
                0
            } else {
                u64::from(alt.entries[i].weight)
            }
        })
        .collect();
    let rest_usable = others.iter().any(|w| *w > 0);
    if !rest_usable && want.iter().sum::<u64>() < 100 {
        // Nowhere to move the traffic: the drill holds, the weights follow health.
        let mut normal = normal;
        for (i, cap) in drilled {
            normal.entries[*i].detail = Some(format!("{} (held: no other usable route)", cap.text));
        }
        return normal;
    }
    if want.iter().sum::<u64>() > 100 {
        want = apportion(100, &want);
    }
    let rest = 100 - want.iter().sum::<u64>();
    let split = apportion(rest, &others);
    let mut entries = alt.entries;
    for (k, e) in entries.iter_mut().enumerate() {
        match drilled.iter().position(|(d, _)| *d == k) {
            Some(j) => {
                let (_, cap) = drilled[j];
                e.weight = u8::try_from(want[j]).unwrap_or(100);
                e.state = normal.entries[k].state;
                e.reason = "drill".to_owned();
                e.detail = Some(cap.text.clone());
            }
            None => {
                e.weight = u8::try_from(split[k]).unwrap_or(100);
                // A standby route carrying the drilled route's traffic says why.
                if e.weight > 0 && normal.entries[k].reason == "standby" {
                    e.reason = "drill".to_owned();
                }
            }
        }
    }
    let serving = if rest > 0 {
        alt.serving
    } else {
        normal.serving
    };
    ModelWeights { entries, serving }
}

/// Splits `total` proportionally to `scores` by largest remainder (ties to the earlier
/// index); all zero → all zero.
fn apportion(total: u64, scores: &[u64]) -> Vec<u64> {
    let sum: u64 = scores.iter().sum();
    if sum == 0 {
        return vec![0; scores.len()];
    }
    let mut out: Vec<u64> = scores.iter().map(|s| s * total / sum).collect();
    let assigned: u64 = out.iter().sum();
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(scores[i] * total % sum));
    for &i in order.iter().take((total - assigned) as usize) {
        out[i] += 1;
    }
    out
}

/// A model's weights under a switch override; `None` when its backup is not usable.
fn overridden(
    members: &[&Route],
    scored: &[(u64, State, String)],
    by_id: &HashMap<&RouteId, &RouteStatus>,
    drift: Option<&DriftSnapshot>,
    policy: &Policy,
    o: &SwitchOverride,
) -> Option<ModelWeights> {
    let b = members.iter().position(|r| r.id == o.backup)?;
    if scored[b].0 == 0 {
        return None;
    }
    let primary_share = u64::from(o.primary_share.min(100));
    let prim: Vec<usize> = (0..members.len())
        .filter(|&i| members[i].tier == Tier::Primary)
        .collect();
    // Primaries by their judged state (their display state is SWITCHED).
    let mut prim_scores: Vec<u64> = prim
        .iter()
        .map(|&i| {
            let st = by_id.get(&members[i].id).copied();
            score_as(
                members[i],
                st,
                drift,
                policy,
                st.map_or(State::Unknown, |s| s.judged),
            )
            .0
        })
        .collect();
    if prim_scores.iter().all(|s| *s == 0) {
        prim_scores = prim.iter().map(|&i| u64::from(members[i].weight)).collect();
    }
    let mut shares = vec![0u64; members.len()];
    let split = largest_remainder(&prim_scores);
    if primary_share > 0 && prim_scores.iter().any(|s| *s > 0) {
        for (k, &i) in prim.iter().enumerate() {
            shares[i] = u64::from(split[k]) * primary_share;
        }
        shares[b] = (100 - primary_share) * 100;
    } else {
        shares[b] = 1;
    }
    let weights = largest_remainder(&shares);
    let reason = if primary_share > 0 {
        "canary"
    } else {
        "switched"
    };
    let entries = members
        .iter()
        .zip(scored)
        .zip(weights)
        .map(|((r, (_, state, why)), weight)| WeightEntry {
            route: r.id.clone(),
            provider: r.provider.clone(),
            region: r.region.clone(),
            model: r.model.clone(),
            tier: r.tier,
            weight,
            state: *state,
            reason: if r.id == o.backup || r.tier == Tier::Primary {
                reason.to_owned()
            } else if weight == 0 && scored_usable(state) {
                "standby".to_owned()
            } else {
                why.clone()
            },
            detail: None,
        })
        .collect();
    let tier = if primary_share >= 100 {
        Tier::Primary
    } else {
        Tier::Backup
    };
    Some(ModelWeights {
        entries,
        serving: Serving {
            tier: Some(tier),
            all_unhealthy: false,
        },
    })
}

fn scored_usable(state: &State) -> bool {
    !matches!(state, State::Critical | State::Switched)
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
        let models = compute_with_drift(&routes, health, drift.as_deref(), &policy);
        let version = u64::try_from(health.generated_at.timestamp_millis())
            .unwrap_or(0)
            .max(1);
        let current = Arc::new(WeightsSnapshot::new(version, health.generated_at, models));
        Self {
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
    }

    /// Replaces the running drills' caps; the next [`Weights::update`] applies them.
    pub fn set_drills(&mut self, drills: DrillCaps) {
        self.drills = drills;
    }

    /// Replaces the switch overrides; the next [`Weights::update`] applies them.
    pub fn set_overrides(&mut self, overrides: Overrides) {
        self.overrides = overrides;
    }

    pub fn current(&self) -> Arc<WeightsSnapshot> {
        self.current.clone()
    }

    /// Sets drift's latest view; the next [`Weights::update`] takes it into account.
    pub fn set_drift(&mut self, drift: Option<Arc<DriftSnapshot>>) {
        self.drift = drift;
    }

    /// Recomputes; `Some(new version)` when a weight, state, reason code or serving tier
    /// changed, `None` (and no serialisation) otherwise.
    pub fn update(&mut self, health: &HealthSnapshot) -> Option<Arc<WeightsSnapshot>> {
        let models = compute_all(
            &self.routes,
            health,
            self.drift.as_deref(),
            &self.policy,
            &self.overrides,
            &self.breakers,
            &self.drills,
        );
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

/// Publishes the weights: computes them from the current health snapshot at once, then again
/// on every health change, sending only new versions. Ends on `shutdown`; if the health
/// publisher goes away first, the last weights stay published until shutdown.
pub fn spawn_publisher(
    routes: Arc<Vec<Route>>,
    health: HealthRx,
    shutdown: CancellationToken,
) -> WeightsRx {
    spawn_publisher_full(
        routes,
        health,
        None,
        Policy::default(),
        Feeds::default(),
        shutdown,
    )
}

/// [`spawn_publisher`] that also follows drift (findings and the quality gate) under
/// `policy` ([`Policy::from_config`]): recomputes on every health or drift change.
pub fn spawn_publisher_with(
    routes: Arc<Vec<Route>>,
    health: HealthRx,
    drift: Option<DriftRx>,
    policy: Policy,
    shutdown: CancellationToken,
) -> WeightsRx {
    spawn_publisher_full(routes, health, drift, policy, Feeds::default(), shutdown)
}

/// What else the weights follow besides health and drift.
#[derive(Debug, Default)]
pub struct Feeds {
    /// The switch controller's overrides.
    pub overrides: Option<watch::Receiver<Arc<Overrides>>>,
    /// The in-process proxy's open breakers.
    pub breakers: Option<watch::Receiver<Arc<OpenBreakers>>>,
    /// The publisher's heartbeat (`weights`), beaten by its loop.
    pub pulse: Option<crate::heartbeat::Pulse>,
    /// The running drills' caps (`crate::drill`).
    pub drills: Option<watch::Receiver<Arc<DrillCaps>>>,
}

/// [`spawn_publisher_with`] that also follows the switch controller's overrides and the
/// proxy's breakers.
pub fn spawn_publisher_full(
    routes: Arc<Vec<Route>>,
    mut health: HealthRx,
    mut drift: Option<DriftRx>,
    policy: Policy,
    feeds: Feeds,
    shutdown: CancellationToken,
) -> WeightsRx {
    let Feeds {
        mut overrides,
        mut breakers,
        pulse,
        mut drills,
    } = feeds;
    let first = health.borrow_and_update().clone();
    let first_drift = drift.as_mut().map(|d| d.borrow_and_update().clone());
    let mut weights = Weights::with_drift(routes, policy, first_drift, &first);
    if let Some(o) = &mut overrides {
        weights.set_overrides((**o.borrow_and_update()).clone());
    }
    if let Some(b) = &mut breakers {
        weights.set_breakers((**b.borrow_and_update()).clone());
    }
    if let Some(d) = &mut drills {
        weights.set_drills((**d.borrow_and_update()).clone());
    }
    // Applies them to the first version (a new version only if they change anything).
    let _ = weights.update(&first);
    let (tx, rx) = watch::channel(weights.current());
    tokio::spawn(async move {
        let mut health_open = true;
        let mut beat = tokio::time::interval(crate::heartbeat::PULSE_EVERY);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let drift_changed = async {
                match drift.as_mut() {
                    Some(d) => d.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = beat.tick(), if pulse.is_some() => {
                    if let Some(p) = &pulse {
                        p.beat();
                    }
                    continue;
                }
                changed = health.changed(), if health_open => {
                    if changed.is_err() {
                        // No more health updates: keep the last weights (overrides may
                        // still change them) until shutdown.
                        health_open = false;
                        if overrides.is_none() && drills.is_none() {
                            shutdown.cancelled().await;
                            break;
                        }
                        continue;
                    }
                }
                changed = next_overrides(&mut overrides) => {
                    match changed {
                        Some(o) => weights.set_overrides(o),
                        None => overrides = None,
                    }
                }
                changed = next_overrides(&mut breakers) => {
                    match changed {
                        Some(b) => weights.set_breakers(b),
                        None => breakers = None,
                    }
                }
                changed = next_overrides(&mut drills) => {
                    match changed {
                        Some(d) => weights.set_drills(d),
                        None => drills = None,
                    }
                }
                changed = drift_changed => {
                    match changed {
                        Ok(()) => {
                            let d = drift.as_mut().map(|d| d.borrow_and_update().clone());
                            weights.set_drift(d);
                        }
                        // The drift runner is gone: keep its last view, follow health only.
                        Err(_) => drift = None,
                    }
                }
            }
            let snapshot = health.borrow_and_update().clone();
            if let Some(next) = weights.update(&snapshot) {
                tracing::debug!(version = next.version, "weights changed");
                tx.send_replace(next);
            }
        }
    });
    rx
}

/// The next value of an optional feed (`None`: its sender is gone); pending forever without a
/// receiver.
async fn next_overrides<T: Clone>(rx: &mut Option<watch::Receiver<Arc<T>>>) -> Option<T> {
    match rx {
        Some(r) => match r.changed().await {
            Ok(()) => Some((**r.borrow_and_update()).clone()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_remainder_sums_to_100_and_breaks_ties_by_order() {
        assert_eq!(largest_remainder(&[1, 1, 1]), vec![34, 33, 33]);
        assert_eq!(largest_remainder(&[0, 0]), vec![0, 0]);
        assert_eq!(largest_remainder(&[5, 0]), vec![100, 0]);
        assert_eq!(largest_remainder(&[800, 200]), vec![80, 20]);
        assert_eq!(largest_remainder(&[2, 1]), vec![67, 33]);
        for scores in [vec![7, 3, 9, 1], vec![1; 7], vec![999, 1, 1]] {
            let w = largest_remainder(&scores);
            assert_eq!(
                w.iter().map(|&x| u32::from(x)).sum::<u32>(),
                100,
                "{scores:?}"
            );
        }
    }

    #[test]
    fn apportion_splits_any_total() {
        assert_eq!(apportion(75, &[50, 50]), vec![38, 37]);
        assert_eq!(apportion(0, &[1, 2]), vec![0, 0]);
        assert_eq!(apportion(10, &[0, 0]), vec![0, 0]);
        assert_eq!(apportion(100, &[1, 1, 1]).iter().sum::<u64>(), 100);
    }

    fn entry(route: &str, tier: Tier, weight: u8, reason: &str) -> WeightEntry {
        WeightEntry {
            route: RouteId::parse(route).unwrap(),
            provider: "p".into(),
            region: "r".into(),
            model: "m".into(),
            tier,
            weight,
            state: State::Normal,
            reason: reason.into(),
            detail: None,
        }
    }

    fn cap(percent: u8) -> DrillCap {
        DrillCap {
            drill: 7,
            target: 0,
            percent,
            text: "drill 7".into(),
        }
    }

    fn model(entries: Vec<WeightEntry>, tier: Tier) -> ModelWeights {
        ModelWeights {
            entries,
            serving: Serving {
                tier: Some(tier),
                all_unhealthy: false,
            },
        }
    }

    #[test]
    fn a_drill_moves_its_share_to_the_routes_that_would_carry_it() {
        // Primary 100, backup standby; without the primary the backup carries everything.
        let normal = model(
            vec![
                entry("a/r/p", Tier::Primary, 100, "healthy"),
                entry("a/r/b", Tier::Backup, 0, "standby"),
            ],
            Tier::Primary,
        );
        let alt = model(
            vec![
                entry("a/r/p", Tier::Primary, 0, "healthy"),
                entry("a/r/b", Tier::Backup, 100, "healthy"),
            ],
            Tier::Backup,
        );
        let c = cap(25);
        let m = drilled_weights(normal.clone(), alt.clone(), &[(0, &c)]);
        assert_eq!(m.entries[0].weight, 75);
        assert_eq!(m.entries[0].reason, "drill");
        assert_eq!(m.entries[0].detail.as_deref(), Some("drill 7"));
        assert_eq!(m.entries[1].weight, 25);
        assert_eq!(m.entries[1].reason, "drill");
        let c = cap(100);
        let m = drilled_weights(normal.clone(), alt, &[(0, &c)]);
        assert_eq!((m.entries[0].weight, m.entries[1].weight), (0, 100));
        assert_eq!(m.serving.tier, Some(Tier::Backup));
        // Nothing else usable: the drill holds and says so.
        let dead = model(
            vec![
                entry("a/r/p", Tier::Primary, 0, "healthy"),
                entry("a/r/b", Tier::Backup, 0, "error_rate_high"),
            ],
            Tier::Primary,
        );
        let m = drilled_weights(normal, dead, &[(0, &c)]);
        assert_eq!(m.entries[0].weight, 100);
        assert!(m.entries[0].detail.as_deref().unwrap().contains("held"));
    }

    #[test]
    fn factors_in_tenths() {
        assert_eq!(success_tenths(Some(0.96)), 10);
        assert_eq!(success_tenths(Some(0.94)), 9);
        assert_eq!(success_tenths(Some(0.0)), 0);
        assert_eq!(success_tenths(None), 10);
        assert_eq!(success_tenths(Some(f64::NAN)), 10);
        assert_eq!(health_tenths(State::Degraded), 1);
        assert_eq!(health_tenths(State::Switched), 0);
    }
}
