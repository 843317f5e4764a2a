//! The demo's past: on its first start the demo writes [`DAYS`] days of simulated history into
//! its database, so the day bars, uptime, incident history and the month's budget account are
//! alive the moment the page opens.
//!
//! The history goes through the same code as live probing: outcomes from the simulator's
//! scenarios ([`crate::sim::history`]: a few minutes of probing per hour, faults now and then)
//! are judged by the real detector (baselines, state machine, incidents) and stored by the
//! store's writer in large batches (raw rows and rollups in the same transactions);
//! transitions and incidents are recorded as the health service records them, and each route's
//! final detection state is saved so the live service carries on from it.
//!
//! Idempotent: a `store_meta` marker ([`MARKER`], the span written) is set last; a database
//! with the marker, or with data of its own, gets no history. The page reads the marker to
//! say the past is simulated.

use std::time::{Duration, Instant};

use chrono::{DateTime, Duration as TimeDelta, Utc};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::config::Config;
use crate::health::{Baseline, Detector, Incident, RouteHealth, Transition};
use crate::route::Route;
use crate::sim::history::{fault_hours, hour};
use crate::store::{Granularity, Store, StoreError, StoreOptions};

/// The `store_meta` key marking simulated history; its value is `{from}/{to}` (RFC 3339).
pub const MARKER: &str = "demo_history";

/// Days of history written.
pub const DAYS: i64 = 30;

/// Outcomes per write: one transaction each (the demo writes before anything else runs).
const CHUNK: usize = 8192;

/// Transitions queued together; well under the writer's queue, so none waits for room and
/// their order holds.
const TRANSITION_CHUNK: usize = 512;

/// Seeds the history, so every fresh demo tells the same past.
pub const SEED: u64 = 0x5eed_2026;

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("demo history task: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What one run wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub outcomes: usize,
    pub transitions: usize,
    pub incidents: usize,
    pub took: Duration,
}

/// The span a [`MARKER`] value names.
pub fn parse_marker(value: &str) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let (a, b) = value.split_once('/')?;
    let p = |s: &str| {
        DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    };
    Some((p(a)?, p(b)?))
}

/// Opens the demo's database at `config.storage.path`, writes the history unless it is there
/// (or the database has data of its own), and closes it again before the service opens it.
pub async fn write_to_file(
    config: &Config,
    now: DateTime<Utc>,
) -> Result<Option<Written>, HistoryError> {
    let path = config.storage.path.clone();
    let opts = StoreOptions {
        latency_threshold: config.slo.latency_threshold,
    };
    let store = tokio::task::spawn_blocking(move || Store::open(&path, opts)).await??;
    let written = write_once(&store, config, now, SEED).await;
    store.close().await?;
    written
}

/// Writes [`DAYS`] days of history ending at the hour before `now` for every route of the
/// demo `config` into `store`, unless the marker is set or the store already has data.
pub async fn write_once(
    store: &Store,
    config: &Config,
    now: DateTime<Utc>,
    seed: u64,
) -> Result<Option<Written>, HistoryError> {
    let started = Instant::now();
    let routes = config.routes();
    let reading = store.clone();
    let probe = routes.first().map(|r| r.id.clone());
    let (marker, has_data) = tokio::task::spawn_blocking(move || {
        let r = reading.reader()?;
        let marker = r.meta(MARKER)?;
        let states = r.route_health_all::<RouteHealth>()?;
        let outcomes = match &probe {
            Some(id) => !r.recent_outcomes(id, 1)?.is_empty(),
            None => false,
        };
        Ok::<_, StoreError>((marker, !states.is_empty() || outcomes))
    })
    .await??;
    if marker.is_some() {
        return Ok(None);
    }
    if has_data {
        tracing::info!("the demo database has data of its own: no simulated history written");
        return Ok(None);
    }
    let to = Granularity::Hour.bucket_start(now);
    let from = to - TimeDelta::days(DAYS);
    tracing::info!(days = DAYS, "first demo start: writing simulated history");
    let writer = store.writer();
    let mut written = Written {
        from,
        to,
        outcomes: 0,
        transitions: 0,
        incidents: 0,
        took: Duration::ZERO,
    };
    let mut finals = Vec::with_capacity(routes.len());
    // One thread judges route after route while this task writes the one before: the CPU
    // and the store's writer work side by side.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Replay>(1);
    let detection = config.detection.clone();
    let producer = tokio::task::spawn_blocking(move || {
        for (i, route) in routes.iter().enumerate() {
            let route_seed = seed.wrapping_add((i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            if tx
                .blocking_send(replay(route, &detection, from, seed, route_seed))
                .is_err()
            {
                break; // the writing side failed and returned
            }
        }
    });
    while let Some(replay) = rx.recv().await {
        for chunk in replay.outcomes.chunks(CHUNK) {
            writer.record_many(chunk.to_vec()).await?;
        }
        written.outcomes += replay.outcomes.len();
        let mut incidents = std::collections::HashSet::new();
        for chunk in replay.transitions.chunks(TRANSITION_CHUNK) {
            // All queued at once, so the writer commits many in one transaction instead of
            // one each. Queued futures may reach the writer out of order, so each incident
            // goes with its last transition of the chunk only (its latest version); chunks
            // are written one after the other.
            let last: std::collections::HashMap<&str, usize> = chunk
                .iter()
                .enumerate()
                .filter_map(|(k, (_, i, _))| i.as_ref().map(|i| (i.id.as_str(), k)))
                .collect();
            let writes = chunk.iter().enumerate().map(|(k, (t, incident, health))| {
                let incident = incident
                    .as_ref()
                    .filter(|i| last.get(i.id.as_str()) == Some(&k));
                writer.record_transition(t, incident, health)
            });
            for r in futures_util::future::join_all(writes).await {
                r?;
            }
            incidents.extend(chunk.iter().filter_map(|(t, ..)| t.incident_id.clone()));
        }
        written.incidents += incidents.len();
        written.transitions += replay.transitions.len();
        finals.push(replay.health);
    }
    producer.await?;
    // The live service restores these and goes on judging from them.
    writer.save_health(&finals, now).await?;
    writer
        .set_meta(
            MARKER,
            &format!(
                "{}/{}",
                crate::clock::rfc3339(from),
                crate::clock::rfc3339(to)
            ),
        )
        .await?;
    written.took = started.elapsed();
    tracing::info!(
        outcomes = written.outcomes,
        transitions = written.transitions,
        incidents = written.incidents,
        took_ms = written.took.as_millis() as u64,
        "demo history written"
    );
    Ok(Some(written))
}

/// One route's history, judged.
struct Replay {
    outcomes: Vec<crate::outcome::ProbeOutcome>,
    transitions: Vec<(Transition, Option<Incident>, RouteHealth)>,
    health: RouteHealth,
}

/// Generates and judges one route's history (CPU only; run it off the async threads).
fn replay(
    route: &Route,
    detection: &crate::config::DetectionConfig,
    from: DateTime<Utc>,
    seed: u64,
    route_seed: u64,
) -> Replay {
    let scenario = super::scenario_for(&route.provider, &route.region, &route.model);
    let hours = u32::try_from(DAYS * 24).unwrap_or(720);
    let faults = fault_hours(seed, &route.provider, &route.region, scenario, hours);
    let detector = Detector::new(detection);
    let mut health = detector.route(route.id.clone(), from);
    let mut baseline = Baseline::new(route.id.clone(), detection);
    let mut rng = StdRng::seed_from_u64(route_seed);
    let mut outcomes = Vec::new();
    let mut transitions = Vec::new();
    for h in 0..hours {
        let start = from + TimeDelta::hours(i64::from(h));
        for o in hour(route, scenario, start, faults.contains(&h), &mut rng) {
            let done = o.started_at + TimeDelta::milliseconds(o.total_ms.round() as i64);
            // The service's 1-second evaluation, at each call's start (the history has no
            // seconds between calls worth evaluating on their own).
            if let Some(t) = detector.tick(&mut health, o.started_at) {
                transitions.push(with_incident(t, &health));
            }
            if let Some(t) = detector.ingest(&mut health, &mut baseline, &o, done) {
                transitions.push(with_incident(t, &health));
            }
            outcomes.push(o);
        }
    }
    Replay {
        outcomes,
        transitions,
        health,
    }
}

/// A transition with its incident as it stood then, and the route's state after it: what the
/// health service records.
fn with_incident(t: Transition, h: &RouteHealth) -> (Transition, Option<Incident>, RouteHealth) {
    let incident = t.incident_id.as_deref().and_then(|id| {
        h.incident()
            .filter(|x| x.id == id)
            .or_else(|| h.last_closed().filter(|x| x.id == id))
            .cloned()
    });
    (t, incident, h.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_names_its_span() {
        let (a, b) = parse_marker("2026-04-01T00:00:00Z/2026-05-01T00:00:00Z").unwrap();
        assert_eq!((b - a).num_days(), 30);
        assert!(parse_marker("yes").is_none());
        assert!(parse_marker("2026-04-01T00:00:00Z/later").is_none());
    }
}
