//! `ratelimit_low` end to end: outcomes of real traffic carrying a route's rate-limit headroom
//! go through the real detection shell and the real alert engine to a webhook receiver that is
//! a real HTTP server. Under 10 % for 4 min 59 s: nothing; at 5 min: one warning, however long
//! it lasts; back above: one resolution. Time is the outcomes' own, on a manual clock.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use probeok::alert::Severity;
use probeok::clock::ManualClock;
use probeok::health::service::{HealthOptions, HealthService};
use probeok::health::{Headroom, HealthEvent};
use probeok::probe::outcome::{OutcomeKind, ProbeOutcome};
use probeok::ratelimit::{Quota, RateLimits};
use probeok::route::RouteId;

use common::alerts::*;

/// A successful outcome at `at` whose answer said `remaining` of 1000 tokens are left.
fn traffic(route: &RouteId, kind: OutcomeKind, at: DateTime<Utc>, remaining: u64) -> ProbeOutcome {
    ProbeOutcome {
        route: route.clone(),
        kind,
        started_at: at,
        success: true,
        attributed_to: None,
        verified: None,
        ttfb_ms: Some(0.0),
        ttft_ms: Some(100.0),
        first_answer_ms: Some(100.0),
        total_ms: 400.0,
        output_tokens: Some(3),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: Some(200),
        error: None,
        answer: None,
        max_tokens_exhausted: false,
        ratelimit: Some(RateLimits {
            tokens: Quota::new(remaining, 1000),
            ..RateLimits::default()
        }),
    }
}

fn secs(n: i64) -> DateTime<Utc> {
    t0() + TimeDelta::seconds(n)
}

/// The `ratelimit_low` messages the receiver has, as `(status, route, limit)`.
fn lows(f: &Fake) -> Vec<(String, String, String)> {
    f.got()
        .iter()
        .filter(|g| g.body["subject"]["type"] == "ratelimit_low")
        .map(|g| {
            let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            (
                s(&g.body["status"]),
                s(&g.body["subject"]["route"]),
                s(&g.body["subject"]["limit"]),
            )
        })
        .collect()
}

async fn wait_for(f: &Fake, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lows(f).len() < n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until detection has taken the reading dated `at` (it judges it before the board
/// shows it to anyone), so what it sent for that reading is already on the event channel.
async fn judged(board: &Headroom, route: &RouteId, at: DateTime<Utc>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while board.route(route).get("tokens").map(|r| r.at) != Some(at) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "reading at {at} never judged"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The `RateLimitLow` events on `rx` so far, as `firing` flags.
fn events(rx: &mut broadcast::Receiver<HealthEvent>) -> Vec<bool> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        if let HealthEvent::RateLimitLow { firing, .. } = e {
            out.push(firing);
        }
    }
    out
}

#[tokio::test]
async fn five_minutes_under_ten_percent_of_traffic_is_one_warning_then_one_resolution() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let (addr, _h) = serve(hook.clone(), None).await;
    let rig = rig(
        vec![webhook("webhook[0]", addr, None, Severity::Warning)],
        clock.clone(),
        |_| {},
    )
    .await;
    let route = qwen(4);
    let board = Headroom::default();
    let config = rig.service.config();
    let (events_tx, alerts_rx) = broadcast::channel(1024);
    let mut watch_rx = events_tx.subscribe();
    let health = HealthService::restore(
        &config,
        HealthOptions {
            headroom: board.clone(),
            ..HealthOptions::default()
        },
        &rig.service.store,
        clock.clone(),
        events_tx,
    )
    .await
    .unwrap();
    let (tx, inputs) = mpsc::channel(64);
    let shutdown = CancellationToken::new();
    let tasks = [
        tokio::spawn(health.run(inputs, shutdown.clone())),
        tokio::spawn(probeok::alert::run(
            rig.service.clone(),
            alerts_rx,
            shutdown.clone(),
        )),
    ];
    let send = |o: ProbeOutcome| {
        let tx = tx.clone();
        async move { tx.send(o).await.unwrap() }
    };

    // Plenty left, then under 10 % on every request for 4 min 59 s: no alert. Low probes
    // in between neither start nor end it.
    clock.set(secs(0));
    send(traffic(&route, OutcomeKind::Passive, secs(0), 600)).await;
    for s in (10..=290).step_by(20) {
        clock.set(secs(s));
        send(traffic(&route, OutcomeKind::Passive, secs(s), 50)).await;
        send(traffic(&route, OutcomeKind::Probe, secs(s + 5), 40)).await;
    }
    clock.set(secs(10 + 299));
    send(traffic(&route, OutcomeKind::Passive, secs(10 + 299), 30)).await;
    judged(&board, &route, secs(10 + 299)).await;
    // The start's healthy reading resolved whatever a previous run left open: nothing fires.
    assert_eq!(events(&mut watch_rx), [false]);
    let tokens = board.route(&route)["tokens"];
    assert_eq!(
        (tokens.remaining, tokens.limit, tokens.ratio),
        (30, 1000, 0.03)
    );

    // Five minutes: one warning, and no second one while it stays low.
    for s in [310, 330, 400, 600] {
        clock.set(secs(s));
        send(traffic(&route, OutcomeKind::Passive, secs(s), 20)).await;
    }
    judged(&board, &route, secs(600)).await;
    assert_eq!(events(&mut watch_rx), [true]);
    wait_for(&hook, 1).await;
    assert_eq!(
        lows(&hook),
        [("firing".into(), route.to_string(), "tokens".into())]
    );
    let first = hook
        .got()
        .into_iter()
        .find(|g| g.body["subject"]["type"] == "ratelimit_low")
        .unwrap();
    assert_eq!(first.body["severity"], "warning");
    let title = first.body["title"].as_str().unwrap();
    assert!(title.contains("ratelimit_low"), "{title}");
    assert!(title.contains(route.as_str()), "{title}");

    // Back above 10 %: resolved once; healthy readings after that say nothing more.
    for s in [620, 640, 660] {
        clock.set(secs(s));
        send(traffic(&route, OutcomeKind::Passive, secs(s), 500)).await;
    }
    judged(&board, &route, secs(660)).await;
    assert_eq!(events(&mut watch_rx), [false]);
    wait_for(&hook, 2).await;
    assert_eq!(
        lows(&hook),
        [
            ("firing".into(), route.to_string(), "tokens".into()),
            ("resolved".into(), route.to_string(), "tokens".into()),
        ]
    );

    drop(tx);
    shutdown.cancel();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .unwrap()
            .unwrap();
    }
}
