//! Rate-limit headroom per route: the latest remaining share of each limit the route's answers
//! announced ([`crate::ratelimit`]), from probes and from real traffic, and the `ratelimit_low`
//! judgement over it.
//!
//! - **Kept**: per route and limit, the latest reading only (remaining, limit, share, when,
//!   from which source) — at most routes × 4 entries, in memory; a restart starts empty.
//!   Readings arrive out of order (the proxies' batches, agents' outboxes): one older than the
//!   kept reading changes nothing.
//! - **Judged** ([`judge`], pure): a limit is low when a reading from real traffic is under
//!   [`LOW_RATIO`] and every reading since the first such one stayed under it for [`HOLD`];
//!   then `ratelimit_low` fires once. Any reading (probe or traffic) at or above
//!   [`LOW_RATIO`] ends the hold and resolves the alert. Probes alone never fire it: a probe
//!   every minute is no evidence that callers are about to be refused, real traffic is.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::ratelimit::{Limit, Quota, RateLimits};
use crate::route::RouteId;

/// Under this share left a limit is low.
pub const LOW_RATIO: f64 = 0.10;
/// How long a limit must stay low on real traffic before `ratelimit_low` fires.
pub const HOLD: Duration = Duration::from_secs(300);

/// Where a reading came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A probe of probeok's own (the monitor's scheduler or an agent).
    Probe,
    /// A real request through a proxy.
    Traffic,
}

impl Source {
    pub fn of(kind: crate::outcome::OutcomeKind) -> Self {
        match kind {
            crate::outcome::OutcomeKind::Passive => Source::Traffic,
            _ => Source::Probe,
        }
    }
}

/// One limit's latest figures, as `/api/v1/status` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Reading {
    pub remaining: u64,
    pub limit: u64,
    /// `remaining / limit`, rounded to 4 places.
    pub ratio: f64,
    #[serde(serialize_with = "at_rfc3339")]
    pub at: DateTime<Utc>,
    pub source: Source,
}

fn at_rfc3339<S: serde::Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::clock::rfc3339(*at))
}

impl Reading {
    pub fn new(q: Quota, at: DateTime<Utc>, source: Source) -> Self {
        Self {
            remaining: q.remaining,
            limit: q.limit,
            ratio: (q.ratio() * 10_000.0).round() / 10_000.0,
            at,
            source,
        }
    }
}

/// The judgement's memory of one route's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Watch {
    /// The first traffic reading under [`LOW_RATIO`] of the current low run.
    low_since: Option<DateTime<Utc>>,
    /// `None` before any judgement since the start: an alert fired before a restart may still
    /// be open, so the first reading above the threshold resolves it (the alert engine drops a
    /// resolution of nothing).
    firing: Option<bool>,
}

/// What a reading did to the alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Low on real traffic for [`HOLD`]: fire.
    Low,
    /// Back at or above [`LOW_RATIO`]: resolve.
    Recovered,
}

/// One reading through the judgement (pure): `ratio` seen at `at` from `source`.
pub fn judge(w: &mut Watch, ratio: f64, source: Source, at: DateTime<Utc>) -> Option<Change> {
    if ratio >= LOW_RATIO {
        w.low_since = None;
        let was = w.firing.replace(false);
        return (was != Some(false)).then_some(Change::Recovered);
    }
    if source != Source::Traffic {
        return None;
    }
    let since = *w.low_since.get_or_insert(at);
    let held = (at - since).to_std().is_ok_and(|d| d >= HOLD);
    if held && w.firing != Some(true) {
        w.firing = Some(true);
        return Some(Change::Low);
    }
    None
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    reading: Reading,
    watch: Watch,
}

/// Every route's latest readings and judgements, shared by detection (which feeds it), the
/// status API and `/metrics` (which read it). Cloning shares it.
#[derive(Clone, Default)]
pub struct Headroom(Arc<Mutex<HashMap<RouteId, [Option<Entry>; 4]>>>);

impl std::fmt::Debug for Headroom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Headroom").finish_non_exhaustive()
    }
}

/// One handle is one board: equal when shared.
impl PartialEq for Headroom {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Headroom {}

/// A change of a route's limit, for the `ratelimit_low` alert.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judged {
    pub limit: Limit,
    pub change: Change,
    pub reading: Reading,
}

impl Headroom {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RouteId, [Option<Entry>; 4]>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps what one answer of `route` said at `at` and judges it. The caller bounds the
    /// routes (configured ones only).
    pub fn observe(
        &self,
        route: &RouteId,
        limits: &RateLimits,
        source: Source,
        at: DateTime<Utc>,
    ) -> Vec<Judged> {
        let mut map = self.lock();
        let slots = map.entry(route.clone()).or_default();
        let mut out = Vec::new();
        for (limit, quota) in limits.iter() {
            let slot = &mut slots[Limit::ALL.iter().position(|l| *l == limit).unwrap_or(0)];
            if slot.is_some_and(|e| e.reading.at > at) {
                continue;
            }
            let reading = Reading::new(quota, at, source);
            let mut watch = slot.map(|e| e.watch).unwrap_or_default();
            if let Some(change) = judge(&mut watch, quota.ratio(), source, at) {
                out.push(Judged {
                    limit,
                    change,
                    reading,
                });
            }
            *slot = Some(Entry { reading, watch });
        }
        out
    }

    /// A route's latest readings by limit name; empty when it never announced any.
    pub fn route(&self, route: &RouteId) -> BTreeMap<&'static str, Reading> {
        let map = self.lock();
        let Some(slots) = map.get(route) else {
            return BTreeMap::new();
        };
        Limit::ALL
            .iter()
            .zip(slots)
            .filter_map(|(l, e)| e.map(|e| (l.as_str(), e.reading)))
            .collect()
    }

    /// Every route's readings (for the status document and `/metrics`).
    pub fn all(&self) -> HashMap<RouteId, BTreeMap<&'static str, Reading>> {
        let map = self.lock();
        map.iter()
            .map(|(route, slots)| {
                let readings = Limit::ALL
                    .iter()
                    .zip(slots)
                    .filter_map(|(l, e)| e.map(|e| (l.as_str(), e.reading)))
                    .collect();
                (route.clone(), readings)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-06T08:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn secs(n: i64) -> DateTime<Utc> {
        t0() + TimeDelta::seconds(n)
    }

    /// Readings every 30 s from `from` to `to` (inclusive), all at `ratio` from traffic.
    fn run(w: &mut Watch, ratio: f64, from: i64, to: i64) -> Vec<(i64, Change)> {
        (from..=to)
            .step_by(30)
            .filter_map(|s| judge(w, ratio, Source::Traffic, secs(s)).map(|c| (s, c)))
            .collect()
    }

    #[test]
    fn low_for_five_minutes_of_traffic_fires_once_and_resolves_once() {
        let mut w = Watch::default();
        // Known healthy at the start: the first good reading resolves whatever came before.
        assert_eq!(
            judge(&mut w, 0.5, Source::Traffic, t0()),
            Some(Change::Recovered)
        );
        assert_eq!(run(&mut w, 0.05, 30, 270), vec![]);
        // 4 min 59 s after the first low reading: still nothing.
        assert_eq!(judge(&mut w, 0.05, Source::Traffic, secs(30 + 299)), None);
        // 5 min: fires, and only once however long it lasts.
        assert_eq!(run(&mut w, 0.05, 330, 330), vec![(330, Change::Low)]);
        assert_eq!(run(&mut w, 0.02, 360, 1200), vec![]);
        // Back above: resolved once.
        assert_eq!(
            run(&mut w, 0.5, 1230, 1300),
            vec![(1230, Change::Recovered)]
        );
    }

    #[test]
    fn one_reading_back_above_restarts_the_hold() {
        let mut w = Watch {
            firing: Some(false),
            ..Watch::default()
        };
        assert_eq!(run(&mut w, 0.05, 0, 240), vec![]);
        // Exactly at the threshold is not low.
        assert_eq!(judge(&mut w, LOW_RATIO, Source::Traffic, secs(250)), None);
        assert_eq!(run(&mut w, 0.05, 270, 540), vec![]);
        assert_eq!(run(&mut w, 0.05, 570, 570), vec![(570, Change::Low)]);
    }

    #[test]
    fn probes_alone_never_fire_but_their_good_readings_resolve() {
        let mut w = Watch {
            firing: Some(false),
            ..Watch::default()
        };
        for s in (0..=900).step_by(60) {
            assert_eq!(judge(&mut w, 0.01, Source::Probe, secs(s)), None);
        }
        // Traffic starts the hold; low probes in between keep it.
        assert_eq!(judge(&mut w, 0.05, Source::Traffic, secs(1000)), None);
        assert_eq!(judge(&mut w, 0.05, Source::Probe, secs(1200)), None);
        assert_eq!(
            judge(&mut w, 0.05, Source::Traffic, secs(1300)),
            Some(Change::Low)
        );
        assert_eq!(
            judge(&mut w, 0.9, Source::Probe, secs(1400)),
            Some(Change::Recovered)
        );
    }

    #[test]
    fn the_board_keeps_the_latest_reading_per_limit() {
        let h = Headroom::default();
        let route = RouteId::new("openai", "us", "gpt");
        let limits = |remaining| RateLimits {
            requests: Quota::new(remaining, 500),
            ..RateLimits::default()
        };
        h.observe(&route, &limits(400), Source::Probe, secs(10));
        h.observe(&route, &limits(12), Source::Traffic, secs(20));
        // An older reading arriving late changes nothing.
        assert!(h
            .observe(&route, &limits(499), Source::Probe, secs(5))
            .is_empty());
        let r = h.route(&route);
        assert_eq!(r.len(), 1);
        let req = r["requests"];
        assert_eq!((req.remaining, req.limit, req.ratio), (12, 500, 0.024));
        assert_eq!(req.source, Source::Traffic);
        assert_eq!(req.at, secs(20));
        assert!(h.route(&RouteId::new("x", "y", "z")).is_empty());
        let json = serde_json::to_value(req).unwrap();
        assert_eq!(json["at"], "2026-12-06T08:00:20.000Z");
        assert_eq!(json["source"], "traffic");
    }
}
