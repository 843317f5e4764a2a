//! The capability probes' figures in the status answer: per declared, probed capability of a
//! route its latest result and its 7-day success share (`crate::capability`).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration as TimeDelta, Utc};
use serde::Serialize;

use crate::clock::rfc3339;
use crate::route::Route;
use crate::store::capabilities::CapabilityRow;
use crate::store::{Reader, StoreError};

/// `(route, capability)` → what the store holds.
#[derive(Debug, Default)]
pub struct CapabilityFigures {
    latest: HashMap<(String, String), CapabilityRow>,
    /// Successes and probes over the last 7 days.
    week: HashMap<(String, String), (u64, u64)>,
}

impl CapabilityFigures {
    pub fn load(reader: &Reader, now: DateTime<Utc>) -> Result<Self, StoreError> {
        let latest = reader
            .capability_latest()?
            .into_iter()
            .map(|r| ((r.route.clone(), r.capability.clone()), r))
            .collect();
        let week = reader
            .capability_tallies(now - TimeDelta::days(7))?
            .into_iter()
            .map(|t| ((t.route, t.capability), (t.ok, t.total)))
            .collect();
        Ok(Self { latest, week })
    }

    /// The route's declared, probed capabilities, each with its figures (an unprobed one yet:
    /// `ok` and `checked_at` null).
    pub fn route(&self, route: &Route) -> BTreeMap<&'static str, CapabilityView> {
        crate::capability::probed(route)
            .into_iter()
            .map(|c| {
                let key = (route.id.to_string(), c.as_str().to_owned());
                let last = self.latest.get(&key);
                let success_7d = self
                    .week
                    .get(&key)
                    .filter(|(_, total)| *total > 0)
                    .map(|(ok, total)| super::round(*ok as f64 / *total as f64, 4));
                (
                    c.as_str(),
                    CapabilityView {
                        ok: last.map(|l| l.ok),
                        checked_at: last.map(|l| rfc3339(l.at)),
                        latency_ms: last.map(|l| l.latency_ms),
                        error: last.and_then(|l| l.error.clone()),
                        success_7d,
                    },
                )
            })
            .collect()
    }
}

/// One capability of one route, as `/api/v1/status` and the route page show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapabilityView {
    /// The latest probe succeeded; null before the first.
    pub ok: Option<bool>,
    pub checked_at: Option<String>,
    pub latency_ms: Option<u64>,
    /// Why the latest probe failed; absent when it succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Share of the last 7 days' probes that succeeded; null without one.
    pub success_7d: Option<f64>,
}
