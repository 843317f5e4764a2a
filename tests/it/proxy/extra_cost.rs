//! The hourly extra-cost budget of non-primary serving: reset on the clock hour, concurrent reservations
//! never overrunning it, `degrade_at` stopping new switches (and alerted).

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use probeok::clock::ManualClock;
use probeok::config::{Config, ExtraCostConfig, ProviderConfig, RegionConfig, RouteConfig};
use probeok::extra_cost::ExtraCost;
use probeok::health::{HealthEvent, HealthSnapshot, State};
use probeok::route::{Price, Route, RouteId, Tier};
use probeok::switch::{self, Action, Effect, Machine};
use tokio::sync::broadcast;

/// Primary ¥0, backup ¥1,000,000 per Mtok both ways: one token costs exactly 1.
fn routes() -> Vec<Route> {
    let mut c = Config::default();
    for (p, tier, price) in [("a", Tier::Primary, 0.0), ("b", Tier::Backup, 1e6)] {
        c.providers.push(ProviderConfig {
            id: p.into(),
            regions: vec![RegionConfig {
                id: "r".into(),
                base_url: "http://127.0.0.1:9/v1".into(),
            }],
            ..ProviderConfig::default()
        });
        c.routes.push(RouteConfig {
            provider: p.into(),
            region: "r".into(),
            model: "m".into(),
            serves: "chat".into(),
            tier,
            weight: 100,
            price: Some(Price {
                input_per_mtok: price,
                output_per_mtok: price,
                currency: "CNY".into(),
            }),
            ..RouteConfig::default()
        });
    }
    c.routes()
}

fn backup() -> RouteId {
    RouteId::new("b", "r", "m")
}

fn budget(max: f64, clock: Arc<ManualClock>) -> Arc<ExtraCost> {
    let cfg = ExtraCostConfig {
        max_extra_cost_per_hour: max,
        degrade_at: 0.8,
    };
    ExtraCost::new(cfg, &routes(), clock, None)
}

#[test]
fn resets_on_the_clock_hour_not_per_incident() {
    let clock = Arc::new(ManualClock::new(
        Utc.with_ymd_and_hms(2026, 11, 30, 6, 59, 0).unwrap(),
    ));
    let b = budget(100.0, clock.clone());
    b.reserve(&backup(), 30, 30)
        .unwrap()
        .unwrap()
        .settle(30, 30);
    assert_eq!(b.snapshot().spent, 60.0);
    assert!(b.reserve(&backup(), 30, 30).is_err(), "60 + 60 > 100");
    // A reservation open across the hour stays booked and settles into the new hour.
    let open = b.reserve(&backup(), 10, 10).unwrap().unwrap();
    clock.advance(Duration::from_secs(59));
    assert_eq!(b.snapshot().spent, 60.0, "06:59:59 is still the same hour");
    clock.advance(Duration::from_secs(1));
    let s = b.snapshot();
    assert_eq!((s.spent, s.reserved), (0.0, 20.0));
    assert_eq!(
        s.hour_start,
        Utc.with_ymd_and_hms(2026, 11, 30, 7, 0, 0).unwrap()
    );
    open.settle(5, 5);
    let s = b.snapshot();
    assert_eq!((s.spent, s.reserved), (10.0, 0.0));
    assert_eq!(
        b.total_for("chat"),
        70.0,
        "the per-model total never resets"
    );
}

#[test]
fn fifty_concurrent_reservations_never_overrun() {
    let clock = Arc::new(ManualClock::new(
        Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap(),
    ));
    let b = budget(1000.0, clock);
    // Nearly spent: 975 of 1000.
    b.reserve(&backup(), 975, 0)
        .unwrap()
        .unwrap()
        .settle(975, 0);
    let barrier = Arc::new(std::sync::Barrier::new(50));
    let handles: Vec<_> = (0..50)
        .map(|_| {
            let b = b.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                // Each request: 2 prompt + 3 max output tokens = 5 at most.
                match b.reserve(&backup(), 2, 3) {
                    Ok(Some(r)) => {
                        let peak = b.snapshot();
                        assert!(peak.spent + peak.reserved <= 1000.0 + 1e-9);
                        std::thread::sleep(Duration::from_millis(5));
                        r.settle(2, 3);
                        true
                    }
                    Ok(None) => unreachable!("the backup has an extra price"),
                    Err(_) => false,
                }
            })
        })
        .collect();
    let admitted = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|ok| *ok)
        .count();
    let s = b.snapshot();
    assert_eq!(admitted, 5, "exactly 25 / 5 requests fit");
    assert_eq!(s.spent, 1000.0);
    assert_eq!(s.reserved, 0.0);
    assert_eq!(s.refused, 45);
}

#[test]
fn past_degrade_at_no_new_switch_and_a_warning() {
    let clock = Arc::new(ManualClock::new(
        Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap(),
    ));
    let (tx, mut rx) = broadcast::channel(8);
    let cfg = ExtraCostConfig {
        max_extra_cost_per_hour: 100.0,
        degrade_at: 0.8,
    };
    let b = ExtraCost::new(cfg, &routes(), clock.clone(), Some(tx));
    b.reserve(&backup(), 40, 39)
        .unwrap()
        .unwrap()
        .settle(40, 39);
    assert!(b.allows_switch(), "79% < 80%");
    assert!(rx.try_recv().is_err());
    b.reserve(&backup(), 1, 0).unwrap().unwrap().settle(1, 0);
    assert!(!b.allows_switch());
    match rx.try_recv().unwrap() {
        HealthEvent::BudgetCrossed { used, limit, .. } => assert_eq!((used, limit), (80.0, 100.0)),
        other => panic!("{other:?}"),
    }

    // The machine, fed from a snapshot where the primary is CRITICAL, refuses to switch.
    let routes = routes();
    let ids: Vec<RouteId> = routes.iter().map(|r| r.id.clone()).collect();
    let mut snap = HealthSnapshot::initial(&ids, clock.now_utc());
    snap.routes[0].judged = State::Critical;
    snap.routes[0].state = State::Critical;
    snap.routes[1].judged = State::Normal;
    snap.routes[1].state = State::Normal;
    let mut m = Machine::new("chat", vec![ids[0].clone()], Default::default());
    let now = clock.now_utc();
    let e = m.step(&switch::input_for(&m, &routes, &snap, &b, now));
    assert_eq!(e, vec![Effect::PreProbe(backup())]);
    m.pre_probed(&backup(), true, "ok");
    let e = m.step(&switch::input_for(&m, &routes, &snap, &b, now));
    let blocked: Vec<_> = e
        .iter()
        .filter_map(|e| match e {
            Effect::Record(r) => Some((r.action, r.trigger.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(blocked, vec![(Action::Blocked, "budget".to_owned())]);
    assert!(!e.iter().any(|e| matches!(e, Effect::SetSwitched { .. })));
    // The next hour the budget is back: the switch may happen.
    clock.advance(Duration::from_secs(3600));
    assert!(b.allows_switch());
}

trait NowUtc {
    fn now_utc(&self) -> chrono::DateTime<Utc>;
}

impl NowUtc for ManualClock {
    fn now_utc(&self) -> chrono::DateTime<Utc> {
        probeok::clock::Clock::now(self)
    }
}
