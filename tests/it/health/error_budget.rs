//! One error budget everywhere: a two-minute outage reads as the same bad seconds on the
//! route page, `/api/v1/status`, `/metrics`, the incidents page and the burn-rate
//! windows; a fresh route's one failed probe is one interval, not an overspent budget.

use crate::common;

use chrono::{DateTime, Duration as TimeDelta, Utc};
use common::app::{at, id, normal, outcome, snapshot, Harness, Spec};
use common::pages::evidence;
use probeok::health::{FailureMode, Incident, Reason, RouteHealth, State, Transition};
use probeok::probe::OutcomeKind;
use serde_json::Value;

const ACME: &str = "acme/r1/m";
const FRESH: &str = "fresh/r1/m";

const ROUTES: &[Spec<'static>] = &[
    Spec::new("acme", "r1", "m").serves("chat"),
    Spec::new("fresh", "r1", "m").serves("chat"),
];

fn now() -> DateTime<Utc> {
    at("2026-05-20T12:00:00Z")
}

async fn text(url: &str) -> String {
    let r = reqwest::get(url).await.unwrap();
    assert_eq!(r.status(), 200, "{url}");
    r.text().await.unwrap()
}

#[tokio::test]
async fn an_outage_spends_the_same_seconds_on_every_surface() {
    let h = Harness::new(ROUTES, now()).await;
    let n = now();
    // ACME: a probe every 30 s (the default interval) for the last hour. The outage from
    // 11:30 to 11:32 fails 4 probes (2 min); one more failure at 11:10 is outside it.
    let outage = (at("2026-05-20T11:30:00Z"), at("2026-05-20T11:32:00Z"));
    let mut all = Vec::new();
    for k in 0..120 {
        let t = n - TimeDelta::seconds(30 * (120 - k));
        let bad = (t >= outage.0 && t < outage.1) || t == at("2026-05-20T11:10:00Z");
        all.push(outcome(ACME, OutcomeKind::Probe, t, !bad, 900.0));
    }
    // Real traffic and throughput checks do not spend the probe budget.
    all.push(outcome(
        ACME,
        OutcomeKind::Passive,
        n - TimeDelta::minutes(5),
        false,
        80.0,
    ));
    all.push(outcome(
        ACME,
        OutcomeKind::Throughput,
        n - TimeDelta::minutes(5),
        false,
        80.0,
    ));
    // FRESH: its first and only probe failed.
    all.push(outcome(
        FRESH,
        OutcomeKind::Probe,
        n - TimeDelta::seconds(30),
        false,
        80.0,
    ));
    h.record(all).await;

    // The outage's incident, closed.
    let config = h.state.config.current();
    let incident = Incident {
        id: format!("{ACME}@outage"),
        route: id(ACME),
        opened_at: outage.0,
        closed_at: Some(outage.1),
        peak: State::Critical,
        failure_mode: Some(FailureMode::Unavailable),
        transitions: Vec::new(),
        cause: None,
    };
    let t = Transition {
        route: id(ACME),
        from: State::Normal,
        to: State::Critical,
        at: outage.0,
        reason: Reason::new("probe_failed", "probes failing"),
        failure_mode: Some(FailureMode::Unavailable),
        evidence: evidence(80.0, false),
        incident_id: Some(incident.id.clone()),
    };
    let health = RouteHealth::new(id(ACME), &config.detection, n);
    h.store
        .writer()
        .record_transition(&t, Some(&incident), &health)
        .await
        .unwrap();
    h.publish(snapshot(
        n,
        vec![normal(ACME, n - TimeDelta::hours(2)), normal(FRESH, n)],
    ));
    let s = h.serve().await;

    // 5 bad probes × 30 s = 150 s; the fresh route's one is 30 s; budget 2,592 s.
    let v: Value = reqwest::get(s.url("/api/v1/status"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let slo = |route: &str| {
        v["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == route)
            .unwrap()["slo"]
            .clone()
    };
    let (acme, fresh) = (slo(ACME), slo(FRESH));
    assert_eq!(acme["bad_seconds"], 150.0, "{acme}");
    assert_eq!(acme["budget_seconds"], 2592.0, "{acme}");
    assert_eq!(acme["error_budget_remaining"], 0.9421, "{acme}");
    assert_eq!(fresh["bad_seconds"], 30.0, "{fresh}");
    let left = fresh["error_budget_remaining"].as_f64().unwrap();
    assert!(
        left > 0.98,
        "one failed probe is not an overspent budget: {fresh}"
    );

    // `/metrics` carries the same figure for dashboards.
    let metrics = text(&s.url("/metrics")).await;
    assert!(
        metrics.contains(
            "probeok_slo_error_budget_remaining{provider=\"acme\",region=\"r1\",model=\"m\"} 0.9421\n"
        ),
        "{metrics}"
    );

    // The route's page carries its budget (the status page's compact line leaves it to it).
    let route_page = text(&s.url(&format!("/routes/{ACME}?lang=en"))).await;
    assert!(
        route_page.contains("94.2% · 2 m 30 s bad of 43.2 min"),
        "route page"
    );
    assert!(!route_page.contains("× the budget"), "nothing overspent");
    let fresh_page = text(&s.url(&format!("/routes/{FRESH}?lang=en"))).await;
    assert!(
        fresh_page.contains("98.8% · 30 s bad of 43.2 min"),
        "fresh route page"
    );

    // The incidents page: the month's 150 s (of 2,678.4 s in May), 120 s inside the
    // incident and 30 s outside it.
    let inc = text(&s.url("/incidents?lang=en")).await;
    assert!(inc.contains("2 m 30 s (5.6%)"), "the route's month");
    assert!(
        inc.contains("<strong>2 m</strong>"),
        "the incident's bad time"
    );
    assert!(inc.contains("4.5% of the route"));
    assert!(
        inc.contains("<strong>30 s</strong>"),
        "outside the incident"
    );
    assert!(inc.contains("bad probes outside incidents"));
    assert!(inc.contains("30 s (1.1%)"), "the fresh route's month");

    // The burn-rate windows count the same bad probes.
    let reader = h.store.reader().unwrap();
    let w = probeok::alert::burn::read_windows(&reader, &id(ACME), n).unwrap();
    assert_eq!((w.h1.bad, w.h1.total), (5, 120));
    let rate = probeok::slo::burn_rate(w.h1.bad, w.h1.total, 0.999).unwrap();
    assert!((w.h1.burn_rate(0.999) - rate).abs() < 1e-12);
    h.shutdown.cancel();
}
