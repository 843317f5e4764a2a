//! Route faults end to end: outcomes (a probe, then real proxy traffic) with an upstream
//! 401/403 go through the real detection shell and the real alert engine to a webhook receiver
//! that is a real HTTP server — one `route_fault` alert per fault, one resolved message when
//! the route answers normally, and none again after a restart while it is still firing.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use probeok::alert::Severity;
use probeok::clock::{Clock, ManualClock};
use probeok::health::service::{HealthOptions, HealthService};
use probeok::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::route::RouteId;

use common::alerts::*;

fn outcome(route: &RouteId, kind: OutcomeKind, at: DateTime<Utc>, status: u16) -> ProbeOutcome {
    let ok = status == 200;
    ProbeOutcome {
        route: route.clone(),
        kind,
        started_at: at,
        success: ok,
        attributed_to: None,
        verified: (ok && kind != OutcomeKind::Passive).then_some(true),
        ttfb_ms: Some(120.0),
        ttft_ms: ok.then_some(300.0),
        first_answer_ms: ok.then_some(300.0),
        total_ms: 400.0,
        output_tokens: ok.then_some(3),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: Some(status),
        error: (!ok).then(|| ProbeError::Http {
            status,
            message: "invalid api key".into(),
        }),
        answer: ok.then(|| "PROBE_OK".into()),
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

/// The detection shell and the alert engine on one store, fed through `tx`.
struct Running {
    tx: mpsc::Sender<ProbeOutcome>,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn start(rig: &Rig) -> Running {
    let config = rig.service.config();
    let (events_tx, events_rx) = broadcast::channel(256);
    let health = HealthService::restore(
        &config,
        HealthOptions::default(),
        &rig.service.store,
        rig.clock.clone(),
        events_tx,
    )
    .await
    .unwrap();
    let (tx, inputs) = mpsc::channel(64);
    let shutdown = CancellationToken::new();
    let tasks = vec![
        tokio::spawn(health.run(inputs, shutdown.clone())),
        tokio::spawn(probeok::alert::run(
            rig.service.clone(),
            events_rx,
            shutdown.clone(),
        )),
    ];
    Running {
        tx,
        shutdown,
        tasks,
    }
}

impl Running {
    async fn stop(self) {
        // Detection drains its inputs until every sender is gone.
        drop(self.tx);
        self.shutdown.cancel();
        for t in self.tasks {
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .unwrap()
                .unwrap();
        }
    }
}

/// The route-fault messages the receiver has, as `(status, upstream status)`.
fn faults(f: &Fake) -> Vec<(String, Option<u64>)> {
    f.got()
        .iter()
        .filter(|g| g.body["subject"]["type"] == "route_fault")
        .map(|g| {
            (
                g.body["status"].as_str().unwrap_or_default().to_owned(),
                g.body["subject"]["status"].as_u64(),
            )
        })
        .collect()
}

async fn wait_for(f: &Fake, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while faults(f).len() < n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_401_route_raises_one_route_fault_and_one_resolved() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _h) = serve(hook.clone(), None).await;
    let rig = rig(
        vec![webhook("webhook[0]", addr, None, Severity::Critical)],
        clock.clone(),
        |_| {},
    )
    .await;
    let route = qwen(3);

    let run = start(&rig).await;
    // A probe finds the key refused; real traffic through the proxy keeps hitting it.
    run.tx
        .send(outcome(&route, OutcomeKind::Probe, t0(), 401))
        .await
        .unwrap();
    for s in [401, 401, 403] {
        run.tx
            .send(outcome(&route, OutcomeKind::Passive, t0(), s))
            .await
            .unwrap();
    }
    wait_for(&hook, 1).await;
    assert_eq!(faults(&hook), [("firing".to_owned(), Some(401))]);
    let first = hook
        .got()
        .into_iter()
        .find(|g| g.body["subject"]["type"] == "route_fault")
        .unwrap();
    assert_eq!(first.body["severity"], "critical");
    let title = first.body["title"].as_str().unwrap();
    assert!(title.contains(route.as_str()), "{title}");
    assert!(title.contains("401"), "{title}");
    run.stop().await;

    // A restart sees the fault anew on the next probe: still the one alert.
    let run = start(&rig).await;
    run.tx
        .send(outcome(&route, OutcomeKind::Probe, t0(), 401))
        .await
        .unwrap();
    // A proxy request that succeeds ends it.
    run.tx
        .send(outcome(&route, OutcomeKind::Passive, t0(), 200))
        .await
        .unwrap();
    wait_for(&hook, 2).await;
    assert_eq!(
        faults(&hook),
        [
            ("firing".to_owned(), Some(401)),
            ("resolved".to_owned(), None)
        ]
    );
    // Healthy answers after that say nothing more.
    run.tx
        .send(outcome(&route, OutcomeKind::Probe, t0(), 200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(faults(&hook).len(), 2);
    // Other routes never spoke of it.
    assert!(hook
        .got()
        .iter()
        .all(|g| g.body["subject"]["type"] != "route_fault"
            || g.body["subject"]["route"] == route.as_str()));
    run.stop().await;
}

#[tokio::test]
async fn a_fault_again_after_it_was_resolved_alerts_again() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _h) = serve(hook.clone(), None).await;
    let rig = rig(
        vec![webhook("webhook[0]", addr, None, Severity::Critical)],
        clock.clone(),
        |_| {},
    )
    .await;
    let route = qwen(0);
    let run = start(&rig).await;
    for (n, s) in [404, 200, 404].into_iter().enumerate() {
        run.tx
            .send(outcome(&route, OutcomeKind::Probe, clock.now(), s))
            .await
            .unwrap();
        wait_for(&hook, n + 1).await;
        clock.advance(Duration::from_secs(30));
    }
    assert_eq!(
        faults(&hook),
        [
            ("firing".to_owned(), Some(404)),
            ("resolved".to_owned(), None),
            ("firing".to_owned(), Some(404)),
        ]
    );
    run.stop().await;
}
