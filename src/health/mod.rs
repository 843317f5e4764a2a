//! Detection: per-route baselines by time of day, the per-route state machine
//! (`UNKNOWN NORMAL WARNING DEGRADED CRITICAL`, + the `SWITCHED` overlay), failure modes,
//! incidents and cross-route findings (our egress, the requests themselves).
//!
//! Everything here but [`service`] and [`control`] is pure: plain data, functions of (state,
//! observation, baseline, config, `now`). No I/O, no tasks, no global clock — so a test can
//! replay an incident second by second.
//!
//! The shell's part ([`service`], the only I/O here): keep one [`RouteHealth`] and one [`Baseline`] per
//! route; on start rebuild each `Baseline` from the store ([`Baseline::rebuild`]) and restore
//! each `RouteHealth` from its persisted JSON; feed every outcome through
//! [`Detector::ingest`]; call [`Detector::tick`] every second per route; persist the returned
//! [`Transition`]s, [`RouteHealth::incident`] / [`RouteHealth::last_closed`] and the
//! `RouteHealth` itself; every few seconds build [`findings::RouteSummary`]s and call
//! [`findings::findings`], then [`RouteHealth::set_suppression`] on the routes it names.
//!
//! - [`baseline`]: time-of-day buckets, ring buffers, mean/σ/percentiles via `statrs`.
//! - [`classify`]: is one outcome abnormal, on which dimension, and is it the client's fault.
//! - [`window`]: the bounded error-rate window (per-second counters).
//! - [`due`]: which routes the 1-second evaluation looks at (touched ones, and settled ones
//!   when their window next slides), so its work follows what changed, not the route count.
//! - [`detector`]: the state machine; [`route_health`]: the per-route state it moves;
//!   [`evidence`]: transitions, their evidence and incidents; [`reasons`]: reason codes,
//!   sentences and failure modes; [`split`]: queueing vs. throttling (first token vs.
//!   tokens/s); [`confirm`]: which confirmation probe an observation calls for; [`cause`]:
//!   routes failing the same way at one endpoint, confirmed on a few and judged together.
//! - [`fault`]: route faults (401/403/404: our key or model name), opened once, cleared by a
//!   normal answer.
//! - [`headroom`]: each route's latest rate-limit headroom per limit (probes and traffic) and
//!   the `ratelimit_low` judgement (low on real traffic for 5 minutes).
//! - [`findings`]: egress and request-side findings over all routes.
//! - [`vantages`]: detection per route × vantage for the routes remote agents probe too
//!   (own baselines per vantage, agents' freshness); [`quorum`]: the route's state from its
//!   fresh vantages' states, and `vantage_local` when one place fails alone.
//! - [`status`]: the published view (`HealthSnapshot`, `HealthEvent`) other modules consume.
//! - [`service`]: the shell — owns every route's state, feeds it outcomes and ticks, persists
//!   transitions, incidents and states, publishes snapshots and events.
//! - [`control`]: the egress control probe (a plain GET of `[egress] control_url`).
//! - [`outage`]: a shared cause's incidents grouped into outages for the incident history.

pub(crate) mod baseline;
pub mod cause;
pub mod classify;
pub mod confirm;
pub(crate) mod control;
pub(crate) mod detector;
pub(crate) mod due;
pub(crate) mod evidence;
pub(crate) mod fault;
pub mod findings;
pub mod headroom;
pub mod outage;
pub(crate) mod quorum;
pub(crate) mod reasons;
pub(crate) mod route_health;
pub mod service;
pub(crate) mod split;
pub(crate) mod status;
pub mod vantages;
pub(crate) mod window;

pub use crate::evidence::{fmt_ms, fmt_spread};
pub use crate::state::{FailureMode, Reason, State};
pub use baseline::{Baseline, BaselineSnapshot, LatencyRef, TpsRef};
pub use classify::{Dims, Judgement, Signal};
pub use detector::Detector;
pub use evidence::{ErrorRateEvidence, Evidence, Incident, Observed, Threshold, Transition};
pub use findings::{Finding, FindingKind, RouteSummary};
pub use headroom::Headroom;
pub use route_health::{RouteHealth, Suppression};
pub use split::{Split, TpsCheck, TtftCheck};
pub use status::{HealthEvent, HealthRx, HealthSnapshot, IncidentSummary, RouteStatus};
pub use vantages::{VantageLink, VantageRx, VantageStatus, VantageView};
