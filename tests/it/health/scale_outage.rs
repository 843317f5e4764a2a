//! One provider-wide outage over 500 routes costs work in proportion to the outcomes, not to
//! routes × changes: detection publishes a handful of snapshots per probe round (not one per
//! transition), and the weights recompute only the logical models that changed.
//!
//! Time is tokio's paused clock (read through [`TokioClock`]); a probe round is every route's
//! outcome at the same instant, as a 30-second schedule delivers them within a tick.

use crate::common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use common::app::{config, Spec};
use probeok::clock::Clock;
use probeok::health::service::{HealthOptions, HealthService};
use probeok::health::State;
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;
use probeok::store::{Store, StoreOptions};
use probeok::weights::Weights;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

const ROUTES: usize = 500;
const MODELS: usize = 50;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 6, 30, 0).unwrap()
}

struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        t0() + chrono::Duration::from_std(self.0.elapsed()).unwrap()
    }
}

fn outcome(route: &RouteId, at: DateTime<Utc>, ok: bool) -> ProbeOutcome {
    ProbeOutcome {
        route: route.clone(),
        kind: OutcomeKind::Probe,
        started_at: at,
        success: ok,
        attributed_to: None,
        verified: ok.then_some(true),
        ttfb_ms: ok.then_some(20.0),
        ttft_ms: ok.then_some(40.0),
        first_answer_ms: ok.then_some(40.0),
        total_ms: if ok { 100.0 } else { 5.0 },
        output_tokens: ok.then_some(3),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: Some(if ok { 200 } else { 502 }),
        error: (!ok).then(|| ProbeError::Http {
            status: 502,
            message: "bad gateway".into(),
        }),
        answer: ok.then(|| "PROBE_OK".into()),
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_provider_wide_outage_costs_work_per_outcome_not_routes_squared() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let specs: Vec<Spec<'static>> = (0..ROUTES)
        .map(|i| {
            let tier = if i % 10 < 3 { "primary" } else { "backup" };
            Spec::new("acme", leak(format!("r{}", i % 5)), leak(format!("m{i}")))
                .serves(leak(format!("model-{}", i % MODELS)))
                .tier(tier)
                .weight(50)
        })
        .collect();
    let cfg = config(&specs, &db);
    let routes = cfg.routes();
    let ids: Vec<RouteId> = routes.iter().map(|r| r.id.clone()).collect();
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let clock = Arc::new(TokioClock(tokio::time::Instant::now()));
    let (events, mut transitions_rx) = broadcast::channel(16_384);
    let service = HealthService::restore(
        &cfg,
        HealthOptions::default(),
        &store,
        clock.clone(),
        events,
    )
    .await
    .unwrap();
    let counts = service.publish_counts();
    let mut rx = service.subscribe();
    let (tx, inputs) = mpsc::channel(4 * ROUTES);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(service.run(inputs, shutdown.clone()));

    // The weights follow every snapshot the way the publisher does.
    let routes = Arc::new(routes);
    let mut weights_rx = rx.clone();
    let weights_task = tokio::spawn({
        let routes = routes.clone();
        async move {
            let first = weights_rx.borrow_and_update().clone();
            let mut w = Weights::new(routes.clone(), Default::default(), &first);
            let mut versions = 0u64;
            let mut last = first;
            while weights_rx.changed().await.is_ok() {
                last = weights_rx.borrow_and_update().clone();
                if w.update_shared(&last).is_some() {
                    versions += 1;
                }
            }
            // Recomputing the changed models only ends where computing everything does.
            let full = probeok::weights::compute(&probeok::weights::Inputs::new(&routes, &last));
            assert_eq!(w.current().models, full);
            (w.computed(), versions)
        }
    });

    // Three rounds of every route failing, 30 s apart: the whole provider is down.
    let mut sent = 0u64;
    let mut degraded_at = None;
    for round in 0..6 {
        let now = clock.now();
        for id in &ids {
            tx.send(outcome(id, now, false)).await.unwrap();
            sent += 1;
        }
        // Judged as they arrive, then the rest of the interval in 1-second ticks.
        while tx.capacity() < tx.max_capacity() {
            tokio::task::yield_now().await;
        }
        for _ in 0..30 {
            tokio::time::advance(Duration::from_secs(1)).await;
            tokio::task::yield_now().await;
        }
        let snap = rx.borrow_and_update().clone();
        let bad = snap
            .routes
            .iter()
            .filter(|r| r.state >= State::Degraded)
            .count();
        if degraded_at.is_none() && bad * 100 >= ROUTES * 95 {
            degraded_at = Some(round + 1);
        }
    }
    let judged_in = degraded_at.expect("95% of the routes DEGRADED or worse");
    assert!(judged_in <= 3, "judged after {judged_in} rounds");

    drop(tx);
    shutdown.cancel();
    task.await.unwrap();
    let (models_computed, versions) = weights_task.await.unwrap();
    let snapshots = counts.snapshots.load(Relaxed);
    let mut transitions = 0u64;
    while let Ok(e) = transitions_rx.try_recv() {
        if matches!(e, probeok::health::HealthEvent::Transition { .. }) {
            transitions += 1;
        }
    }
    eprintln!(
        "{sent} outcomes, {transitions} transitions: {snapshots} snapshots, {} route statuses \
         copied, {models_computed} models computed, {versions} weights versions; 95% DEGRADED \
         after {judged_in} rounds",
        counts.route_statuses.load(Relaxed)
    );
    assert!(
        transitions >= 2 * ROUTES as u64,
        "{transitions} transitions"
    );
    let statuses = counts.route_statuses.load(Relaxed);
    // At least two transitions per route (UNKNOWN → WARNING → DEGRADED): one snapshot each
    // would be ≥ 1,000 snapshots of 500 routes. Coalesced, a few per round.
    assert!(
        snapshots <= 6 * 8,
        "{snapshots} snapshots for {sent} outcomes"
    );
    assert!(
        statuses <= 10 * sent,
        "{statuses} route statuses copied for {sent} outcomes: grows with routes × changes"
    );
    // Each version recomputes the models that changed, not all 50 per snapshot.
    assert!(versions >= 2, "{versions} weights versions");
    assert!(
        models_computed <= MODELS as u64 * (1 + snapshots),
        "{models_computed} models computed for {snapshots} snapshots"
    );
    store.close().await.unwrap();
}

/// Healthy routes between their probes are not evaluated every second: the 1-second ticks
/// evaluate a route when an outcome touched it and when its window slides (about twice per
/// probe interval), not 30 times per interval — and the outage that follows is judged in the
/// same rounds as ever.
#[tokio::test(start_paused = true)]
async fn quiet_routes_cost_the_ticks_nothing_between_their_probes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let specs: Vec<Spec<'static>> = (0..ROUTES)
        .map(|i| {
            Spec::new("acme", "r0", leak(format!("m{i}")))
                .serves(leak(format!("model-{}", i % MODELS)))
                .weight(50)
        })
        .collect();
    let cfg = config(&specs, &db);
    let ids: Vec<RouteId> = cfg.routes().iter().map(|r| r.id.clone()).collect();
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let clock = Arc::new(TokioClock(tokio::time::Instant::now()));
    let (events, _events_rx) = broadcast::channel(16_384);
    let service = HealthService::restore(
        &cfg,
        HealthOptions::default(),
        &store,
        clock.clone(),
        events,
    )
    .await
    .unwrap();
    let counts = service.publish_counts();
    let mut rx = service.subscribe();
    let (tx, inputs) = mpsc::channel(4 * ROUTES);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(service.run(inputs, shutdown.clone()));
    let round = |ok: bool| {
        let (tx, ids, clock) = (tx.clone(), ids.clone(), clock.clone());
        async move {
            let now = clock.now();
            for id in &ids {
                tx.send(outcome(id, now, ok)).await.unwrap();
            }
            while tx.capacity() < tx.max_capacity() {
                tokio::task::yield_now().await;
            }
            for _ in 0..30 {
                tokio::time::advance(Duration::from_secs(1)).await;
                tokio::task::yield_now().await;
            }
        }
    };
    // Twenty healthy rounds: ten minutes, 600 ticks.
    for _ in 0..20 {
        round(true).await;
    }
    let healthy = counts.route_ticks.load(Relaxed);
    let every_route_every_second = (ROUTES * 20 * 30) as u64;
    eprintln!("{healthy} route evaluations in 600 ticks of {ROUTES} quiet routes");
    assert!(
        healthy * 5 <= every_route_every_second,
        "{healthy} route evaluations: about every route every second"
    );
    let snap = rx.borrow_and_update().clone();
    assert!(snap.routes.iter().all(|r| r.state <= State::Normal));
    // Then the provider goes down: judged DEGRADED within three rounds, as before.
    let mut judged = None;
    for n in 1..=4 {
        round(false).await;
        let snap = rx.borrow_and_update().clone();
        let bad = snap
            .routes
            .iter()
            .filter(|r| r.state >= State::Degraded)
            .count();
        if judged.is_none() && bad * 100 >= ROUTES * 95 {
            judged = Some(n);
        }
    }
    assert!(
        judged.is_some_and(|n| n <= 3),
        "judged after {judged:?} rounds"
    );
    drop(tx);
    shutdown.cancel();
    task.await.unwrap();
    store.close().await.unwrap();
}
