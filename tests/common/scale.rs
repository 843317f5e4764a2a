//! A served monitor with a thousand routes (20 providers, 100 logical models of ten routes),
//! 90 days of history and mixed states, for the status page's scale and browser tests.

use chrono::TimeDelta;
use probeok::health::{RouteStatus, State};
use probeok::probe::outcome::OutcomeKind;

use super::app::*;

pub const ROUTES: usize = 1000;

pub fn now() -> chrono::DateTime<chrono::Utc> {
    at("2026-05-20T12:00:00Z")
}

/// `p{i%20}/r{(i/20)%5}/m{i}` serving `model-{i/per_model}`: 20 providers, models of
/// `per_model` routes.
fn specs(routes: usize, per_model: usize) -> Vec<Spec<'static>> {
    (0..routes)
        .map(|i| {
            let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
            let tier = match i % 10 {
                0..=2 => "primary",
                3..=6 => "backup",
                _ => "fallback",
            };
            Spec::new(
                leak(format!("p{}", i % 20)),
                leak(format!("r{}", (i / 20) % 5)),
                leak(format!("m{i}")),
            )
            .serves(leak(format!("model-{}", i / per_model)))
            .tier(tier)
            .weight(50)
        })
        .collect()
}

fn route_id(s: &Spec<'_>) -> String {
    s.id()
}

const STATES: [State; 8] = [
    State::Normal,
    State::Normal,
    State::Normal,
    State::Warning,
    State::Degraded,
    State::Critical,
    State::Switched,
    State::Unknown,
];

/// Route `i`'s state in a fixture of models of `per_model` routes.
pub fn state_of(i: usize, per_model: usize) -> State {
    STATES[(i / per_model + i) % STATES.len()]
}

/// [`ROUTES`] routes in models of ten, with 90 days of history.
pub async fn fixture() -> (Harness, Served, Vec<String>) {
    fixture_of(ROUTES, 10, 90).await
}

/// `days` days of one probe a day per route (one bad day in eight for every seventh route,
/// the bars' worst case of short runs), the last hour for the latency, and mixed states.
pub async fn fixture_of(
    routes: usize,
    per_model: usize,
    days: i64,
) -> (Harness, Served, Vec<String>) {
    let specs = specs(routes, per_model);
    let h = Harness::new(&specs, now()).await;
    let ids: Vec<String> = specs.iter().map(route_id).collect();
    let mut batch = Vec::new();
    for (i, r) in ids.iter().enumerate() {
        for d in 0..days {
            let bad = i % 7 == 0 && d % 8 == 3;
            batch.push(outcome(
                r,
                OutcomeKind::Probe,
                now() - TimeDelta::days(d) - TimeDelta::hours(3),
                !bad,
                900.0,
            ));
        }
        batch.push(outcome(
            r,
            OutcomeKind::Probe,
            now() - TimeDelta::minutes(10),
            true,
            1000.0 + i as f64,
        ));
        if batch.len() > 20_000 {
            h.record(std::mem::take(&mut batch)).await;
        }
    }
    h.record(batch).await;
    let statuses: Vec<RouteStatus> = ids
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let state = state_of(i, per_model);
            let s = normal(r, now() - TimeDelta::minutes(30));
            if state == State::Normal {
                s
            } else {
                with_state(s, state, "latency_above_baseline")
            }
        })
        .collect();
    h.publish(snapshot(now(), statuses));
    let s = h.serve().await;
    (h, s, ids)
}
