//! The capability probes' figures in the status answer: per declared, probed capability of a
//! route its latest result and its 7-day success share (`crate::capability`).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration as TimeDelta, Utc};
use serde::Serialize;

use crate::capability::long_prompt;
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
    /// Each route's last good long-prompt TTFTs (ms), oldest first: its baseline.
    long_good: HashMap<String, Vec<u64>>,
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
        let long_good = reader
            .capability_recent_good(long_prompt::judge::NAME, long_prompt::judge::WINDOW)?
            .into_iter()
            .collect();
        Ok(Self {
            latest,
            week,
            long_good,
        })
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

impl CapabilityFigures {
    /// The route's long prompt: its latest result beside its baseline; `None` for an
    /// embeddings route (no long prompt is sent there).
    pub fn long_prompt(&self, route: &Route) -> Option<LongPromptView> {
        if !long_prompt::probed(route) {
            return None;
        }
        let last = self
            .latest
            .get(&(route.id.to_string(), long_prompt::judge::NAME.to_owned()));
        let good: Vec<f64> = self
            .long_good
            .get(route.id.as_str())
            .map(|v| v.iter().map(|&ms| ms as f64).collect())
            .unwrap_or_default();
        Some(LongPromptView {
            // A failed call has no TTFT (its row's latency is the time it took to fail).
            ttft_ms: last.filter(|l| l.ok).map(|l| l.latency_ms),
            baseline_ms: long_prompt::judge::baseline(&good).map(|b| b.round() as u64),
            checked_at: last.map(|l| rfc3339(l.at)),
            ok: last.map(|l| l.ok),
            note: last.and_then(|l| l.error.clone()),
        })
    }
}

/// A route's long prompt, as `/api/v1/status` and the route page show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LongPromptView {
    /// Time to first token of the latest answer; null before one, or when the latest call
    /// failed.
    pub ttft_ms: Option<u64>,
    /// The median of the last good TTFTs; null until 3 exist.
    pub baseline_ms: Option<u64>,
    pub checked_at: Option<String>,
    /// The latest answer held the code word; null before the first probe.
    pub ok: Option<bool>,
    /// Why the latest result was not good (slow, wrong, failed); absent when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
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
