//! One route's judged state ([`RouteHealth`]): everything the state machine needs between
//! observations, serializable so the shell persists it and restores it exactly after a
//! restart. The rules that move it live in [`super::detector`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::baseline::TpsRef;
use super::classify::{Dims, Signal};
use super::evidence::{Incident, Transition};
use super::findings::Attributed;
use super::split::Split;
use super::window::{Counts, ErrorWindow};
use super::{FailureMode, Reason, State};
use crate::config::DetectionConfig;
use crate::route::RouteId;

/// What a cross-route finding asks the detector to discount (see [`super::findings`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Suppression {
    #[default]
    None,
    /// Our own network is down: failures are not the provider's; they escalate nothing.
    Egress,
    /// Probes fine, real traffic failing: passive failures point at the requests and are left
    /// out of this route's error rate.
    RequestSide,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct ModeCounts {
    pub(super) failures: u32,
    pub(super) slow: u32,
}

/// One route's judged state: everything the state machine needs, serializable so the shell
/// persists it and restores it exactly after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteHealth {
    pub(super) route: RouteId,
    pub(super) state: State,
    pub(super) since: DateTime<Utc>,
    pub(super) switched: bool,
    pub(super) suppression: Suppression,
    pub(super) failure_mode: Option<FailureMode>,
    pub(super) reason: Option<Reason>,
    /// Consecutive abnormal observations.
    pub(super) streak: u32,
    /// Dimensions abnormal since the route was last NORMAL.
    pub(super) open: Dims,
    /// The latest answer was not the expected one.
    pub(super) behavior: bool,
    /// First normal observation after the last abnormal one.
    pub(super) normal_since: Option<DateTime<Utc>>,
    /// In DEGRADED: since when no observation has been normal.
    pub(super) abnormal_run_since: Option<DateTime<Utc>>,
    /// When the error rate crossed `critical_error_rate` (cleared when it is back down).
    pub(super) rate_high_since: Option<DateTime<Utc>>,
    /// When the passive-only error rate crossed it (request-side findings).
    pub(super) passive_high_since: Option<DateTime<Utc>>,
    pub(super) modes: ModeCounts,
    pub(super) window: ErrorWindow,
    /// Passive streams with a tokens/s figure since the last tick, and how many were low.
    pub(super) tps_seen: u32,
    pub(super) tps_low: u32,
    pub(super) tps_low_sum: f64,
    /// The sum over all of them (their mean, for the queueing/throttling split).
    #[serde(default)]
    pub(super) tps_sum: f64,
    pub(super) tps_ref: Option<TpsRef>,
    /// Counted outcomes since the last tick: a tick vouches for availability only with fresh
    /// evidence, never with successes left in the window by traffic that has since stopped.
    pub(super) since_tick: Counts,
    pub(super) baseline_ready: bool,
    pub(super) last_probe_at: Option<DateTime<Utc>>,
    pub(super) last_probe_ok_at: Option<DateTime<Utc>>,
    pub(super) last_probe_failed: bool,
    pub(super) incident: Option<Incident>,
    pub(super) last_closed: Option<Incident>,
    /// The latest first-token and tokens/s verdicts since the route was last NORMAL.
    #[serde(default)]
    pub(super) split: Split,
    /// The core dimensions the latest probe or throughput observation found abnormal (what
    /// a confirmation probe would confirm).
    #[serde(default)]
    pub(super) last_core: Dims,
    /// Passive failures the proxy attributed to their clients' own requests: never in the
    /// error window, tallied per client for the `request_side` finding.
    #[serde(default)]
    pub(super) attributed: Vec<Attributed>,
}

impl RouteHealth {
    pub fn new(route: RouteId, cfg: &DetectionConfig, now: DateTime<Utc>) -> Self {
        Self {
            route,
            state: State::Unknown,
            since: now,
            switched: false,
            suppression: Suppression::None,
            failure_mode: None,
            reason: None,
            streak: 0,
            open: Dims::NONE,
            behavior: false,
            normal_since: None,
            abnormal_run_since: None,
            rate_high_since: None,
            passive_high_since: None,
            modes: ModeCounts::default(),
            window: ErrorWindow::new(cfg.error_window.as_secs()),
            tps_seen: 0,
            tps_low: 0,
            tps_low_sum: 0.0,
            tps_sum: 0.0,
            tps_ref: None,
            since_tick: Counts::default(),
            baseline_ready: false,
            last_probe_at: None,
            last_probe_ok_at: None,
            last_probe_failed: false,
            incident: None,
            last_closed: None,
            split: Split::default(),
            last_core: Dims::NONE,
            attributed: Vec::new(),
        }
    }

    /// The first-token and tokens/s verdicts since the route was last NORMAL (which signal
    /// moved: queueing or throttling).
    pub fn split(&self) -> &Split {
        &self.split
    }

    pub fn route(&self) -> &RouteId {
        &self.route
    }
    /// The judged state (never `SWITCHED`).
    pub fn state(&self) -> State {
        self.state
    }
    /// What the status page shows: `SWITCHED` while the switch controller has moved traffic.
    pub fn display_state(&self) -> State {
        if self.switched {
            State::Switched
        } else {
            self.state
        }
    }
    pub fn since(&self) -> DateTime<Utc> {
        self.since
    }
    pub fn failure_mode(&self) -> Option<FailureMode> {
        self.failure_mode
    }
    pub fn reason(&self) -> Option<&Reason> {
        self.reason.as_ref()
    }
    /// Consecutive abnormal observations so far.
    pub fn streak(&self) -> u32 {
        self.streak
    }
    pub fn normal_since(&self) -> Option<DateTime<Utc>> {
        self.normal_since
    }
    pub fn error_rate_high_since(&self) -> Option<DateTime<Utc>> {
        self.rate_high_since
    }
    /// The answers are currently not `PROBE_OK`.
    pub fn behavior_changed(&self) -> bool {
        self.behavior
    }
    /// Per client, the passive failures attributed to its requests (see
    /// [`super::findings`]).
    pub fn attributed(&self) -> &[Attributed] {
        &self.attributed
    }
    pub fn window(&self) -> &ErrorWindow {
        &self.window
    }
    /// The open incident (DEGRADED or worse).
    pub fn incident(&self) -> Option<&Incident> {
        self.incident.as_ref()
    }
    /// The incident most recently closed (the shell persists it when a transition closes it).
    pub fn last_closed(&self) -> Option<&Incident> {
        self.last_closed.as_ref()
    }
    pub fn switched(&self) -> bool {
        self.switched
    }
    /// Set and cleared by the switch controller; judging goes on underneath.
    pub fn set_switched(&mut self, on: bool) {
        self.switched = on;
    }
    pub fn suppression(&self) -> Suppression {
        self.suppression
    }
    /// Set by the shell from [`super::findings::findings`].
    pub fn set_suppression(&mut self, s: Suppression) {
        self.suppression = s;
    }
    /// After a restart: moves the time-based clocks (`abnormal_run_since`, `normal_since`,
    /// `rate_high_since`, the passive one) `gap` later — the time nobody was watching. The
    /// rules "DEGRADED this long without one normal observation", "error rate above the
    /// threshold this long" and "normal this long" count observed time only: a stale
    /// incident is neither escalated nor resolved by the downtime itself; the route's next
    /// observations decide. `since` and the incident's times are facts and stay.
    pub fn resume_after(&mut self, gap: chrono::Duration) {
        if gap <= chrono::Duration::zero() {
            return;
        }
        for t in [
            &mut self.abnormal_run_since,
            &mut self.normal_since,
            &mut self.rate_high_since,
            &mut self.passive_high_since,
        ] {
            if let Some(at) = t.as_mut() {
                *at += gap;
            }
        }
    }
    /// Bytes held in memory (error window, incidents with their evidence), for capacity
    /// planning.
    pub fn approx_bytes(&self) -> usize {
        let incident = |i: &Option<Incident>| {
            i.as_ref().map_or(0, |i| {
                std::mem::size_of::<Incident>()
                    + i.transitions.capacity() * std::mem::size_of::<Transition>()
                    + i.transitions
                        .iter()
                        .map(|t| {
                            t.reason.text.capacity()
                                + t.evidence.signals.capacity() * std::mem::size_of::<Signal>()
                        })
                        .sum::<usize>()
            })
        };
        std::mem::size_of::<Self>()
            + self.window.approx_bytes()
            + incident(&self.incident)
            + incident(&self.last_closed)
            + self
                .reason
                .as_ref()
                .map_or(0, |r| r.text.capacity() + r.code.capacity())
    }

    pub(crate) fn last_probe(&self) -> (Option<DateTime<Utc>>, Option<DateTime<Utc>>, bool) {
        (
            self.last_probe_at,
            self.last_probe_ok_at,
            self.last_probe_failed,
        )
    }
    pub(crate) fn passive_high_since(&self) -> Option<DateTime<Utc>> {
        self.passive_high_since
    }
}
