//! What the rest of the service sees of detection. The health service (the I/O shell around
//! the pure detector) publishes a [`HealthSnapshot`] on a `watch` channel whenever a route's
//! state, reason code, failure mode or the findings change, and sends every transition and
//! finding change as a [`HealthEvent`] on a `broadcast` channel (alerts, SSE, metrics).
//!
//! Consumers never reach into `RouteHealth`: this is the contract between detection and
//! publishing (API, weights, status page, alerts, proxy).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{BaselineSnapshot, FailureMode, Finding, Incident, Reason, Split, State, Transition};
use crate::route::RouteId;

/// One route as detection judges it now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteStatus {
    pub route: RouteId,
    /// The display state: `SWITCHED` when the switch controller moved traffic off the route.
    pub state: State,
    /// The state the detector judges underneath an overlay (equal to `state` without one).
    pub judged: State,
    pub since: DateTime<Utc>,
    pub reason: Option<Reason>,
    pub failure_mode: Option<FailureMode>,
    /// The baseline of the current time-of-day bucket (or the all-day fallback); `None` while
    /// the route has too few samples to judge latency.
    pub baseline: Option<BaselineSnapshot>,
    /// Successful share of probe and passive outcomes over `error_window`, rounded to 0.01 so
    /// consumers that publish it (weights) do not change on every probe; `None` with no outcome.
    pub success_ratio: Option<f64>,
    /// The error window holds enough evidence to act on `success_ratio`: at least
    /// `[detection] min_error_samples` outcomes with at least `min_failures` failures, the
    /// floors the detector judges the error rate by. Until then the weights keep the route's
    /// configured share: a single failed call is what the proxy's breaker and `Retry-After`
    /// rests react to, not a reason to take a route out of rotation.
    #[serde(default)]
    pub success_judged: bool,
    /// The latest `PROBE_OK` answers were not `PROBE_OK`.
    pub behavior_changed: bool,
    /// The open incident (DEGRADED or worse), if any.
    pub incident: Option<IncidentSummary>,
    /// The latest first-token and tokens/s verdicts against their baselines since the route
    /// was last NORMAL: which signal moved (queueing or throttling).
    #[serde(default)]
    pub split: Split,
    /// The shared cause ([`super::cause`]) the route's latest probe failure belongs to, while
    /// two routes or more share it: `provider/region:class`.
    #[serde(default)]
    pub cause: Option<String>,
}

impl RouteStatus {
    /// The split while the route is judged in trouble (WARNING or worse) and at least one
    /// signal was measured: on a healthy route there is nothing to tell apart.
    pub fn open_split(&self) -> Option<&Split> {
        let troubled = !matches!(self.judged, State::Normal | State::Unknown);
        let measured = self.split.ttft.is_some() || self.split.tps.is_some();
        (troubled && measured).then_some(&self.split)
    }
}

/// The open incident in brief; the full record with transitions is in the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IncidentSummary {
    pub id: String,
    pub opened_at: DateTime<Utc>,
    pub peak: State,
    pub failure_mode: Option<FailureMode>,
}

impl From<&Incident> for IncidentSummary {
    fn from(i: &Incident) -> Self {
        Self {
            id: i.id.clone(),
            opened_at: i.opened_at,
            peak: i.peak,
            failure_mode: i.failure_mode,
        }
    }
}

/// Every route (in config order) and the cross-route findings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthSnapshot {
    pub generated_at: DateTime<Utc>,
    pub routes: Vec<RouteStatus>,
    pub findings: Vec<Finding>,
}

impl HealthSnapshot {
    /// Before any judgement: every route `UNKNOWN` since `now`.
    pub fn initial(routes: &[RouteId], now: DateTime<Utc>) -> Self {
        Self {
            generated_at: now,
            routes: routes
                .iter()
                .map(|route| RouteStatus {
                    route: route.clone(),
                    state: State::Unknown,
                    judged: State::Unknown,
                    since: now,
                    reason: None,
                    failure_mode: None,
                    baseline: None,
                    success_ratio: None,
                    success_judged: false,
                    behavior_changed: false,
                    incident: None,
                    split: Split::default(),
                    cause: None,
                })
                .collect(),
            findings: Vec::new(),
        }
    }

    pub fn route(&self, id: &RouteId) -> Option<&RouteStatus> {
        self.routes.iter().find(|r| &r.route == id)
    }
}

/// Something that happened, for consumers that act on changes (alerts, event streams).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HealthEvent {
    /// A route changed state; `incident` is the incident it opened, changed or closed (closed
    /// ones carry `closed_at` and their peak).
    Transition {
        transition: Box<Transition>,
        incident: Option<Box<Incident>>,
    },
    /// A cross-route finding appeared.
    FindingOpened { finding: Finding, at: DateTime<Utc> },
    /// A finding is no longer true.
    FindingClosed { finding: Finding, at: DateTime<Utc> },
    /// A drift finding (regression sets, see [`crate::drift`]) was opened or closed; published
    /// by [`crate::drift::events`], not by detection.
    DriftFinding {
        finding: Box<crate::drift::DriftFinding>,
        opened: bool,
        at: DateTime<Utc>,
    },
    /// The switch controller moved a logical model's traffic, or could not (`crate::switch`).
    Switch {
        record: Box<crate::switch::SwitchRecord>,
    },
    /// An upstream 401/403/404 on a route (our key, account or model name is wrong), from a
    /// probe or real traffic: once per fault with its `status`, then once with `None` when the
    /// route answers normally ([`super::fault`]).
    RouteFault {
        route: RouteId,
        status: Option<u16>,
        at: DateTime<Utc>,
    },
    /// A gateway refused probeok's channel writes (`crate::sync`): once with `error` when
    /// its writes start failing, then once with `None` when a write succeeds again.
    SyncFailed {
        /// `new-api` or `one-api`.
        kind: String,
        /// The gateway's base URL.
        gateway: String,
        error: Option<String>,
        at: DateTime<Utc>,
    },
    /// A provider's status page declares trouble on components that map routes our own probes
    /// find NORMAL (`crate::declared`): once with `firing` when first seen so, then once
    /// without when the provider no longer declares it.
    ProviderDeclared {
        /// `provider_declared:<page>#<incident id or component>`.
        key: String,
        provider: String,
        /// The incident's name, or `<component>: <state>`.
        what: String,
        url: Option<String>,
        routes: Vec<RouteId>,
        firing: bool,
        at: DateTime<Utc>,
    },
    /// A route's rate limit stayed under 10 % on real traffic for 5 minutes
    /// ([`super::headroom`]): once with `firing`, then once without when it is back above.
    #[serde(rename = "ratelimit_low")]
    RateLimitLow {
        route: RouteId,
        /// `requests`, `tokens`, `input_tokens` or `output_tokens`.
        limit: String,
        /// The reading that decided it.
        quota: crate::ratelimit::Quota,
        firing: bool,
        at: DateTime<Utc>,
    },
    /// A routed model is missing from two answers in a row of its provider region's model
    /// list (`crate::catalog`): sent with `withdrawn` on every answer that still lacks it (the
    /// alert engine keeps one alert), once without when it is listed again.
    ModelWithdrawn {
        /// The provider region (`provider/region` of its first route).
        region: String,
        model: String,
        /// The routes that use it there.
        routes: Vec<RouteId>,
        withdrawn: bool,
        at: DateTime<Utc>,
    },
    /// A route's configured `retires` date is `days` (30, 7 or 1) or fewer days away
    /// (`crate::catalog`): once per route, date and milestone.
    ModelRetiring {
        route: RouteId,
        retires: chrono::NaiveDate,
        /// Whole days left (0 on the day itself).
        days_left: i64,
        /// The milestone reached: 30, 7 or 1.
        days: u32,
        at: DateTime<Utc>,
    },
    /// The hourly extra-cost budget passed `degrade_at` (`crate::extra_cost`): no new switch this
    /// hour.
    BudgetCrossed {
        /// Spent + reserved.
        used: f64,
        limit: f64,
        degrade_at: f64,
        hour_start: DateTime<Utc>,
        at: DateTime<Utc>,
    },
}

/// The receiving end consumers hold.
pub type HealthRx = tokio::sync::watch::Receiver<Arc<HealthSnapshot>>;
