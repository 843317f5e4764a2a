//! The pure core: one health snapshot and everything else that has a say ([`Inputs`]) →
//! integer weights per logical model ([`compute`]). The rules are in the parent module's docs.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{
    DrillCap, DrillCaps, ModelWeights, OpenBreakers, Overrides, Policy, Serving, SwitchOverride,
    WeightEntry,
};
use crate::drift::DriftSnapshot;
use crate::health::{HealthSnapshot, RouteStatus, State};
use crate::route::{Route, RouteId, Tier};

static NO_OVERRIDES: Overrides = BTreeMap::new();
static NO_BREAKERS: OpenBreakers = OpenBreakers::new();
static NO_DRILLS: DrillCaps = BTreeMap::new();
static DEFAULT_POLICY: Policy = Policy::ALERT;

/// What the weights are computed from: the routes, one health snapshot, and everything else
/// that has a say. [`Inputs::new`] is health alone under the default policy; set the other
/// fields with struct update syntax (`Inputs { drift: Some(&d), ..Inputs::new(&r, &h) }`).
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Every configured route, in config order (entries keep it).
    pub routes: &'a [Route],
    /// Detection's judgement; routes missing from it are UNKNOWN.
    pub health: &'a HealthSnapshot,
    /// `[drift] on_drift` as a factor ([`Policy::from_config`]).
    pub policy: &'a Policy,
    /// Drift's view: open findings (the drift factor) and the quality gate.
    pub drift: Option<&'a DriftSnapshot>,
    /// The switch controller's overrides: for an overridden model whose backup is usable, the
    /// backup gets `100 − primary_share` and the primaries `primary_share` (split by their
    /// scores under their judged state, by configured weight when none scores); every other
    /// route of the model gets 0.
    pub overrides: &'a Overrides,
    /// The proxy's open breakers: such a route keeps its weight (the proxy already tries it
    /// last, and half-open trials need traffic to close it) but its reason says
    /// `breaker_open` while detection has nothing worse to say.
    pub breakers: &'a OpenBreakers,
    /// The running drills' caps: a drilled route gets its drill weight (reason `drill`) and
    /// the rest of the share goes to the model's other routes as they would carry it if the
    /// drilled routes carried nothing. While no other route of the model is usable the drill
    /// moves nothing (traffic is never moved onto nothing).
    pub drills: &'a DrillCaps,
}

impl<'a> Inputs<'a> {
    /// Health alone: the default policy, no drift view, no override, breaker or drill.
    pub fn new(routes: &'a [Route], health: &'a HealthSnapshot) -> Self {
        Self {
            routes,
            health,
            policy: &DEFAULT_POLICY,
            drift: None,
            overrides: &NO_OVERRIDES,
            breakers: &NO_BREAKERS,
            drills: &NO_DRILLS,
        }
    }
}

/// The weights of every logical model: models in name order, entries in config order.
pub fn compute(i: &Inputs<'_>) -> BTreeMap<String, ModelWeights> {
    compute_models(i, None)
}

/// [`compute`] for the logical models in `only` (every model when `None`): the others'
/// weights do not depend on what changed.
pub fn compute_models(
    i: &Inputs<'_>,
    only: Option<&BTreeSet<String>>,
) -> BTreeMap<String, ModelWeights> {
    let Inputs {
        routes,
        health,
        policy,
        drift,
        overrides,
        breakers,
        drills,
    } = *i;
    let mut groups: BTreeMap<&str, Vec<&Route>> = BTreeMap::new();
    for r in routes {
        if only.is_none_or(|m| m.contains(&r.serves)) {
            groups.entry(r.serves.as_str()).or_default().push(r);
        }
    }
    let by_id: HashMap<&RouteId, &RouteStatus> = match only {
        None => health.routes.iter().map(|s| (&s.route, s)).collect(),
        Some(_) => {
            let wanted: std::collections::HashSet<&RouteId> =
                groups.values().flatten().map(|r| &r.id).collect();
            health
                .routes
                .iter()
                .filter(|s| wanted.contains(&s.route))
                .map(|s| (&s.route, s))
                .collect()
        }
    };
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
    // The success factor applies only over the detector's floors (`success_judged`).
    let success = success_tenths(
        status
            .filter(|s| s.success_judged)
            .and_then(|s| s.success_ratio),
    );
    let gated = drift.is_some_and(|d| d.eligible(route).is_err());
    let drifted =
        status.is_some_and(|s| s.behavior_changed) || drift.is_some_and(|d| d.deweights(&route.id));
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
