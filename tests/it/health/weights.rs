//! Weights per tier rule and version stability, on the pure core and through the publisher.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::app::*;
use probeok::health::State;
use probeok::route::Tier;
use probeok::weights::{compute, spawn_publisher, Feeds, Inputs, Policy, Weights};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const ROUTES: &[Spec<'static>] = &[
    Spec::new("qwen", "bj", "qwen-max")
        .serves("chat")
        .weight(60),
    Spec::new("qwen", "sh", "qwen-max")
        .serves("chat")
        .weight(40),
    Spec::new("deepseek", "cn", "deepseek-ai/DeepSeek-V3")
        .serves("chat")
        .backup()
        .weight(50),
    Spec::new("glm", "cn", "glm-4")
        .serves("chat")
        .backup()
        .weight(50),
    Spec::new("local", "lab", "small").serves("chat").fallback(),
];

fn routes() -> Vec<probeok::route::Route> {
    config(ROUTES, std::path::Path::new("unused.db")).routes()
}

fn all_normal() -> Vec<probeok::health::RouteStatus> {
    let t = at("2026-03-04T12:00:00Z");
    ROUTES.iter().map(|s| normal(&s.id(), t)).collect()
}

fn weights_of(
    statuses: Vec<probeok::health::RouteStatus>,
) -> (Vec<u8>, Vec<String>, Option<Tier>, bool) {
    let routes = routes();
    let health = snapshot(at("2026-03-04T12:00:00Z"), statuses);
    let models = compute(&Inputs::new(&routes, &health));
    let chat = &models["chat"];
    (
        chat.entries.iter().map(|e| e.weight).collect(),
        chat.entries.iter().map(|e| e.reason.clone()).collect(),
        chat.serving.tier,
        chat.serving.all_unhealthy,
    )
}

#[test]
fn healthy_primaries_share_by_configured_weight() {
    let (w, reasons, tier, all_unhealthy) = weights_of(all_normal());
    assert_eq!(w, vec![60, 40, 0, 0, 0]);
    assert_eq!(
        reasons,
        vec!["healthy", "healthy", "standby", "standby", "standby"]
    );
    assert_eq!(tier, Some(Tier::Primary));
    assert!(!all_unhealthy);
}

#[test]
fn a_critical_primary_goes_to_zero_and_the_other_primary_takes_its_share() {
    let mut s = all_normal();
    s[0] = with_state(s[0].clone(), State::Critical, "error_rate_high");
    let (w, reasons, tier, _) = weights_of(s);
    assert_eq!(w, vec![0, 100, 0, 0, 0]);
    assert_eq!(reasons[0], "error_rate_high");
    assert_eq!(tier, Some(Tier::Primary));
}

#[test]
fn health_factors_and_success_ratio_scale_the_share() {
    let mut s = all_normal();
    // WARNING halves: 60×0.5 = 30 vs 40 → 43 / 57 (largest remainder).
    s[0] = with_state(s[0].clone(), State::Warning, "latency_above_baseline");
    let (w, ..) = weights_of(s.clone());
    assert_eq!(w[..2], [43, 57]);
    // DEGRADED is a tenth: 6 vs 40 → 13 / 87.
    s[0] = with_state(s[0].clone(), State::Degraded, "latency_above_baseline");
    let (w, ..) = weights_of(s.clone());
    assert_eq!(w[..2], [13, 87]);
    // Success ratio 0.5 on a NORMAL route: 60×0.5 = 30 vs 40.
    let mut s = all_normal();
    s[0].success_ratio = Some(0.5);
    let (w, reasons, ..) = weights_of(s);
    assert_eq!(w[..2], [43, 57]);
    assert_eq!(reasons[0], "success_ratio_low");
    // UNKNOWN weighs as healthy but is flagged.
    let mut s = all_normal();
    s[1] = with_state(s[1].clone(), State::Unknown, "baseline_building");
    let (w, reasons, ..) = weights_of(s);
    assert_eq!(w[..2], [60, 40]);
    assert_eq!(reasons[1], "unjudged");
}

#[test]
fn no_usable_primary_moves_the_share_to_backups_then_fallbacks() {
    let mut s = all_normal();
    s[0] = with_state(s[0].clone(), State::Critical, "error_rate_high");
    s[1] = with_state(s[1].clone(), State::Switched, "switched");
    let (w, reasons, tier, _) = weights_of(s.clone());
    assert_eq!(w, vec![0, 0, 50, 50, 0]);
    assert_eq!(tier, Some(Tier::Backup));
    assert_eq!(reasons[4], "standby");

    s[2] = with_state(s[2].clone(), State::Critical, "probe_failed");
    s[3].success_ratio = Some(0.02); // rounds to 0: not usable
    let (w, _, tier, all_unhealthy) = weights_of(s);
    assert_eq!(w, vec![0, 0, 0, 0, 100]);
    assert_eq!(tier, Some(Tier::Fallback));
    assert!(!all_unhealthy);
}

#[test]
fn nothing_usable_means_all_zero_and_all_unhealthy() {
    let s: Vec<_> = all_normal()
        .into_iter()
        .map(|s| with_state(s, State::Critical, "error_rate_high"))
        .collect();
    let (w, reasons, tier, all_unhealthy) = weights_of(s);
    assert_eq!(w, vec![0; 5]);
    assert!(reasons.iter().all(|r| r == "error_rate_high"));
    assert_eq!(tier, None);
    assert!(all_unhealthy);
}

#[test]
fn the_json_carries_every_field_and_sums_to_100() {
    let w = Weights::new(
        Arc::new(routes()),
        Policy::default(),
        &snapshot(at("2026-03-04T12:00:00Z"), all_normal()),
    );
    let snap = w.current();
    let v: serde_json::Value = serde_json::from_slice(&snap.json).unwrap();
    assert_eq!(v["version"], snap.version);
    let chat = v["models"]["chat"].as_array().unwrap();
    assert_eq!(chat.len(), 5);
    for e in chat {
        for key in [
            "route", "provider", "region", "model", "tier", "weight", "state", "reason",
        ] {
            assert!(e.get(key).is_some(), "{key} missing in {e}");
        }
    }
    assert_eq!(
        chat.iter()
            .map(|e| e["weight"].as_u64().unwrap())
            .sum::<u64>(),
        100
    );
    assert_eq!(chat[2]["route"], "deepseek/cn/deepseek-ai/DeepSeek-V3");
    assert_eq!(v["serving"]["chat"]["all_unhealthy"], false);
    assert_eq!(v["serving"]["chat"]["tier"], "primary");
}

#[tokio::test]
async fn version_is_unchanged_across_100_identical_health_publishes() {
    let t0 = at("2026-03-04T12:00:00Z");
    let (tx, rx) = watch::channel(Arc::new(snapshot(t0, all_normal())));
    let shutdown = CancellationToken::new();
    let mut weights = spawn_publisher(Feeds::new(Arc::new(routes()), rx), shutdown.clone());
    let first = weights.borrow_and_update().clone();
    assert_eq!(
        first.version as i64,
        t0.timestamp_millis(),
        "seeded from the start time"
    );
    for i in 0..100 {
        // A new probe every second: new snapshot time, same judgement, same rounded ratio.
        let t = t0 + chrono::Duration::seconds(i + 1);
        tx.send_replace(Arc::new(snapshot(t, all_normal())));
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !weights.has_changed().unwrap(),
        "no new version was published"
    );
    assert_eq!(weights.borrow().version, first.version);
    assert!(
        Arc::ptr_eq(&weights.borrow(), &first),
        "the same serialised snapshot"
    );

    // A real change bumps it by one.
    let mut s = all_normal();
    s[0] = with_state(s[0].clone(), State::Critical, "error_rate_high");
    tx.send_replace(Arc::new(snapshot(t0 + chrono::Duration::seconds(200), s)));
    tokio::time::timeout(Duration::from_secs(2), weights.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(weights.borrow().version, first.version + 1);
    shutdown.cancel();
}

const BJ: &str = "qwen/bj/qwen-max";
const DS: &str = "deepseek/cn/deepseek-ai/DeepSeek-V3";
const GLM: &str = "glm/cn/glm-4";
const LOCAL: &str = "local/lab/small";

fn drift_weights(
    statuses: Vec<probeok::health::RouteStatus>,
    drift: &probeok::drift::DriftSnapshot,
    policy: &Policy,
) -> (Vec<u8>, Vec<String>, Option<Tier>) {
    let routes = routes();
    let health = snapshot(at("2026-03-04T12:00:00Z"), statuses);
    let models = compute(&Inputs {
        policy,
        drift: Some(drift),
        ..Inputs::new(&routes, &health)
    });
    let chat = &models["chat"];
    (
        chat.entries.iter().map(|e| e.weight).collect(),
        chat.entries.iter().map(|e| e.reason.clone()).collect(),
        chat.serving.tier,
    )
}

fn policy(on_drift: &str) -> Policy {
    let mut c = config(ROUTES, std::path::Path::new("unused.db"));
    c.drift.on_drift = match on_drift {
        "deweight" => probeok::config::OnDrift::Deweight,
        _ => probeok::config::OnDrift::Alert,
    };
    Policy::from_config(&c)
}

#[test]
fn a_drift_finding_deweights_only_with_on_drift_deweight() {
    let finding = drift_finding(BJ, probeok::drift::DriftKind::PassRateDrop);
    let drift = drift_snapshot(vec![finding], &[]);
    // alert: weights unchanged.
    let (w, reasons, _) = drift_weights(all_normal(), &drift, &policy("alert"));
    assert_eq!(w, vec![60, 40, 0, 0, 0]);
    assert_eq!(reasons[0], "healthy");
    // deweight: 0.1 of its share (60 × 0.1 = 6 against 40 → 13 / 87).
    let (w, reasons, tier) = drift_weights(all_normal(), &drift, &policy("deweight"));
    assert_eq!(w, vec![13, 87, 0, 0, 0]);
    assert_eq!(reasons[0], "behavior_changed");
    assert_eq!(reasons[1], "healthy");
    assert_eq!(tier, Some(Tier::Primary));
    // A model change alone is informational: no deweighting.
    let info = drift_snapshot(
        vec![drift_finding(BJ, probeok::drift::DriftKind::ModelChanged)],
        &[],
    );
    let (w, _, _) = drift_weights(all_normal(), &info, &policy("deweight"));
    assert_eq!(w, vec![60, 40, 0, 0, 0]);
    // The regular probe's PROBE_OK mismatches count the same way.
    let mut statuses = all_normal();
    statuses[1].behavior_changed = true;
    let empty = drift_snapshot(Vec::new(), &[]);
    let (w, reasons, _) = drift_weights(statuses.clone(), &empty, &policy("deweight"));
    assert_eq!(w, vec![94, 6, 0, 0, 0]);
    assert_eq!(reasons[1], "behavior_changed");
    let (w, _, _) = drift_weights(statuses, &empty, &policy("alert"));
    assert_eq!(w, vec![60, 40, 0, 0, 0]);
}

#[test]
fn the_quality_gate_keeps_failing_backups_out_of_the_share() {
    let mut statuses = all_normal();
    statuses[0] = with_state(statuses[0].clone(), State::Critical, "error_rate_high");
    statuses[1] = with_state(statuses[1].clone(), State::Critical, "error_rate_high");
    // No gate: the backups share.
    let (w, _, tier) = drift_weights(
        statuses.clone(),
        &drift_snapshot(Vec::new(), &[]),
        &policy("alert"),
    );
    assert_eq!((w, tier), (vec![0, 0, 50, 50, 0], Some(Tier::Backup)));
    // DeepSeek failed its latest regression runs: weight 0, reason regression_failed.
    let (w, reasons, tier) = drift_weights(
        statuses.clone(),
        &drift_snapshot(Vec::new(), &[DS]),
        &policy("alert"),
    );
    assert_eq!((w, tier), (vec![0, 0, 0, 100, 0], Some(Tier::Backup)));
    assert_eq!(reasons[2], "regression_failed");
    // Both backups fail: the fallback carries it; a failing fallback too → all_unhealthy.
    let (w, _, tier) = drift_weights(
        statuses.clone(),
        &drift_snapshot(Vec::new(), &[DS, GLM]),
        &policy("alert"),
    );
    assert_eq!((w, tier), (vec![0, 0, 0, 0, 100], Some(Tier::Fallback)));
    let (w, reasons, tier) = drift_weights(
        statuses,
        &drift_snapshot(Vec::new(), &[DS, GLM, LOCAL]),
        &policy("alert"),
    );
    assert_eq!((w, tier), (vec![0, 0, 0, 0, 0], None));
    assert_eq!(reasons[4], "regression_failed");
    // Primaries are never gated (their drift is a finding, not a gate).
    let (w, _, _) = drift_weights(
        all_normal(),
        &drift_snapshot(Vec::new(), &[BJ]),
        &policy("alert"),
    );
    assert_eq!(w, vec![60, 40, 0, 0, 0]);
}

#[tokio::test]
async fn the_publisher_follows_drift_changes() {
    let shutdown = CancellationToken::new();
    let t = at("2026-03-04T12:00:00Z");
    let (_health_tx, health_rx) = watch::channel(Arc::new(snapshot(t, all_normal())));
    let (drift_tx, drift_rx) = watch::channel(Arc::new(drift_snapshot(Vec::new(), &[])));
    let mut weights = spawn_publisher(
        Feeds {
            policy: policy("deweight"),
            drift: Some(drift_rx),
            ..Feeds::new(Arc::new(routes()), health_rx)
        },
        shutdown.clone(),
    );
    let v0 = weights.borrow_and_update().version;
    assert_eq!(weights.borrow().weight(&id(BJ)), Some(60));
    drift_tx.send_replace(Arc::new(drift_snapshot(
        vec![drift_finding(BJ, probeok::drift::DriftKind::PassRateDrop)],
        &[],
    )));
    tokio::time::timeout(Duration::from_secs(5), weights.changed())
        .await
        .unwrap()
        .unwrap();
    let w = weights.borrow_and_update().clone();
    assert_eq!(w.version, v0 + 1);
    assert_eq!(w.weight(&id(BJ)), Some(13));
    // Closed again: back to the healthy split.
    drift_tx.send_replace(Arc::new(drift_snapshot(Vec::new(), &[])));
    tokio::time::timeout(Duration::from_secs(5), weights.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(weights.borrow().weight(&id(BJ)), Some(60));
    shutdown.cancel();
}

#[test]
fn an_open_proxy_breaker_shows_in_the_reason_and_keeps_the_weight() {
    let routes = routes();
    let mut s = all_normal();
    s[1] = with_state(s[1].clone(), State::Critical, "error_rate_high");
    let health = snapshot(at("2026-03-04T12:00:00Z"), s);
    let open: probeok::weights::OpenBreakers = [routes[0].id.clone(), routes[1].id.clone()].into();
    let models = compute(&Inputs {
        breakers: &open,
        ..Inputs::new(&routes, &health)
    });
    let chat = &models["chat"];
    // The NORMAL primary keeps its whole share (the proxy tries it last; half-open trials need
    // traffic) but says why a router may see failures; the CRITICAL one keeps detection's word.
    assert_eq!(chat.entries[0].weight, 100);
    assert_eq!(chat.entries[0].reason, "breaker_open");
    assert_eq!(chat.entries[1].reason, "error_rate_high");
}

#[tokio::test]
async fn the_publisher_follows_the_proxys_breakers() {
    let shutdown = CancellationToken::new();
    let t = at("2026-03-04T12:00:00Z");
    let (_health_tx, health_rx) = watch::channel(Arc::new(snapshot(t, all_normal())));
    let (breakers_tx, breakers_rx) =
        watch::channel(Arc::new(probeok::weights::OpenBreakers::new()));
    let routes = routes();
    let first = routes[0].id.clone();
    let mut weights = spawn_publisher(
        Feeds {
            breakers: Some(breakers_rx),
            ..Feeds::new(Arc::new(routes), health_rx)
        },
        shutdown.clone(),
    );
    let v0 = weights.borrow_and_update().version;
    breakers_tx.send_replace(Arc::new([first.clone()].into()));
    tokio::time::timeout(Duration::from_secs(5), weights.changed())
        .await
        .expect("a new version")
        .unwrap();
    let now = weights.borrow_and_update().clone();
    assert_eq!(now.version, v0 + 1);
    let entry = &now.models["chat"].entries[0];
    assert_eq!(
        (entry.route.clone(), entry.reason.as_str()),
        (first, "breaker_open")
    );
    shutdown.cancel();
}

/// Waits for the publisher's next version.
async fn next_version(
    weights: &mut probeok::weights::WeightsRx,
) -> Arc<probeok::weights::WeightsSnapshot> {
    tokio::time::timeout(Duration::from_secs(5), weights.changed())
        .await
        .expect("a new version")
        .unwrap();
    weights.borrow_and_update().clone()
}

#[tokio::test]
async fn the_publisher_follows_switch_overrides_and_drills_even_after_health_stops() {
    use probeok::weights::{DrillCap, DrillCaps, Overrides, SwitchOverride};
    let shutdown = CancellationToken::new();
    let t = at("2026-03-04T12:00:00Z");
    let (health_tx, health_rx) = watch::channel(Arc::new(snapshot(t, all_normal())));
    let (overrides_tx, overrides_rx) = watch::channel(Arc::new(Overrides::new()));
    let (drills_tx, drills_rx) = watch::channel(Arc::new(DrillCaps::new()));
    let mut weights = spawn_publisher(
        Feeds {
            overrides: Some(overrides_rx),
            drills: Some(drills_rx),
            ..Feeds::new(Arc::new(routes()), health_rx)
        },
        shutdown.clone(),
    );
    let v0 = weights.borrow_and_update().version;
    assert_eq!(weights.borrow().weight(&id(BJ)), Some(60));
    // Health goes away: the last weights stay, the other feeds still move them.
    drop(health_tx);

    let switched = |primary_share| {
        Arc::new(Overrides::from([(
            "chat".to_owned(),
            SwitchOverride {
                backup: id(DS),
                primary_share,
            },
        )]))
    };
    overrides_tx.send_replace(switched(0));
    let w = next_version(&mut weights).await;
    assert_eq!(w.version, v0 + 1);
    assert_eq!((w.weight(&id(DS)), w.weight(&id(BJ))), (Some(100), Some(0)));
    assert_eq!(w.models["chat"].entries[2].reason, "switched");

    overrides_tx.send_replace(switched(25));
    let w = next_version(&mut weights).await;
    let chat: Vec<(u8, &str)> = w.models["chat"]
        .entries
        .iter()
        .map(|e| (e.weight, e.reason.as_str()))
        .collect();
    assert_eq!(
        chat[..3],
        [(15, "canary"), (10, "canary"), (75, "canary")],
        "{chat:?}"
    );

    // The return completes, and a drill takes the first primary's traffic.
    overrides_tx.send_replace(Arc::new(Overrides::new()));
    let w = next_version(&mut weights).await;
    assert_eq!(w.weight(&id(BJ)), Some(60));
    drills_tx.send_replace(Arc::new(DrillCaps::from([(
        id(BJ),
        DrillCap {
            drill: 1,
            target: 0,
            percent: 100,
            text: "drill 1".into(),
        },
    )])));
    let w = next_version(&mut weights).await;
    let bj = &w.models["chat"].entries[0];
    assert_eq!((bj.weight, bj.reason.as_str()), (0, "drill"));
    assert_eq!(w.weight(&id("qwen/sh/qwen-max")), Some(100));
    shutdown.cancel();
}

#[test]
fn the_success_ratio_counts_only_over_the_detectors_floors() {
    // A fresh route whose one call failed: ratio 0 but below the floors, full share.
    let mut s = all_normal();
    s[0] = with_state(s[0].clone(), State::Unknown, "baseline_building");
    s[0].success_ratio = Some(0.0);
    s[0].success_judged = false;
    let (w, reasons, ..) = weights_of(s.clone());
    assert_eq!(w[..2], [60, 40]);
    assert_eq!(reasons[0], "unjudged");
    // Over the floors the same ratio takes it out of rotation, and says why.
    s[0].success_judged = true;
    let (w, reasons, ..) = weights_of(s);
    assert_eq!(w[..2], [0, 100]);
    assert_eq!(reasons[0], "success_ratio_low");
}

#[test]
fn every_weight_below_its_configured_share_carries_a_reason() {
    let (configured, ..) = weights_of(all_normal());
    let states = [
        (State::Unknown, "baseline_building"),
        (State::Normal, "baseline_ready"),
        (State::Warning, "latency_above_baseline"),
        (State::Degraded, "error_rate_high"),
        (State::Critical, "probe_failed"),
        (State::Switched, "switched"),
    ];
    let mut checked = 0;
    for (i, _) in ROUTES.iter().enumerate() {
        for (state, code) in states {
            for ratio in [None, Some(0.0), Some(0.5), Some(1.0)] {
                for judged in [false, true] {
                    for changed in [false, true] {
                        let mut s = all_normal();
                        s[i] = with_state(s[i].clone(), state, code);
                        s[i].success_ratio = ratio;
                        s[i].success_judged = judged;
                        s[i].behavior_changed = changed;
                        let routes = routes();
                        let health = snapshot(at("2026-03-04T12:00:00Z"), s);
                        let deweight = policy("deweight");
                        for p in [Policy::ALERT, deweight] {
                            let models = compute(&Inputs {
                                policy: &p,
                                ..Inputs::new(&routes, &health)
                            });
                            for (k, e) in models["chat"].entries.iter().enumerate() {
                                if e.weight < configured[k] {
                                    checked += 1;
                                    assert!(
                                        !matches!(e.reason.as_str(), "healthy" | "unjudged" | ""),
                                        "{} at {} (configured {}) says {:?}",
                                        e.route,
                                        e.weight,
                                        configured[k],
                                        e.reason
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 100, "{checked}");
}
