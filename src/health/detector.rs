//! The per-route state machine, with hysteresis:
//!
//! - `NORMAL`/`UNKNOWN` → `WARNING` on one abnormal observation; `WARNING` → `NORMAL` on the
//!   next normal one.
//! - `WARNING` → `DEGRADED` after `degraded_after` consecutive abnormal observations.
//! - `DEGRADED` → `CRITICAL` when the error rate has been above `critical_error_rate`
//!   continuously for `critical_after` (the clock starts when it crosses, in any state), or
//!   after `critical_degraded_for` in `DEGRADED` with no normal observation in between.
//! - `DEGRADED`/`CRITICAL` → `NORMAL` only after `recover_after` of normal observations (no
//!   abnormal one in between) with the error rate below `recover_error_rate`.
//! - `UNKNOWN` (fewer than `min_samples` successful probes) still escalates on failures and
//!   becomes `NORMAL` once the baseline is ready.
//!
//! **Observations.** A probe or throughput outcome is one observation. Passive outcomes are
//! not: they feed the error window and a tokens/s tally, and each [`Detector::tick`] (the
//! shell calls it every second) turns them into one observation — abnormal when the error
//! rate is above `critical_error_rate` (or most passive streams of the last second were below
//! the tokens/s floor), so with live traffic a hard outage is seen in seconds. A tick is a
//! *normal* availability observation only when outcomes arrived since the previous tick, none
//! failed, and the error rate is below `recover_error_rate`.
//!
//! **Dimensions.** An observation is normal only if it measured, and found fine, every
//! dimension that made the route abnormal (see [`super::classify`]); otherwise it is neutral:
//! it neither extends nor ends the trouble. A healthy passive tick does not clear a latency
//! anomaly it cannot see; a fast `PROBE_OK` probe does not clear a soft rate limit.
//!
//! **Error rate.** Judged only with ≥ `min_error_samples` outcomes and ≥ `min_failures`
//! failures. It is read on the last [`FAST_WINDOW_S`] seconds when they hold enough outcomes
//! (busy routes: an outage shows at once instead of after 5% of five minutes of history), else
//! on the whole `error_window`. Once above, it counts as "still above" until the rate since
//! the crossing drops to `critical_error_rate` or the fast window is clean — a noisy 8% does
//! not restart the `critical_after` clock each time one second looks better.
//!
//! **Behaviour.** A `PROBE_OK` mismatch marks `behavior_changed` and on its own never raises
//! the state above `WARNING` (drift has its own handling).

use chrono::{DateTime, Utc};

use super::baseline::{Baseline, LatencyRef, TpsRef};
use super::classify::{self, Dims, Signal};
use super::reasons::{failure_mode, lead_code, reason_text, signals_text, streak_threshold};
use super::route_health::{ModeCounts, RouteHealth, Suppression};
use super::split::{Split, TpsCheck};
use super::window::Counts;
use super::{fmt_spread, Reason, State};
use crate::config::DetectionConfig;
pub use crate::evidence::{ErrorRateEvidence, Evidence, Observed, Threshold};
use crate::probe::outcome::{OutcomeKind, ProbeOutcome};
use crate::route::RouteId;
pub use crate::state::{Incident, Transition};

/// The short error-rate window read first on busy routes.
pub const FAST_WINDOW_S: u64 = 10;
/// Fewer passive streams with a tokens/s figure than this in one tick judge nothing.
pub const MIN_PASSIVE_TPS: u32 = 5;
/// Transitions kept inside one incident (a flapping incident does not grow without bound;
/// every transition is still returned to the shell to be stored).
pub const MAX_INCIDENT_TRANSITIONS: usize = 64;

/// Once a later observation tells queueing from throttling, the route's reason says so
/// without waiting for the next transition (a consumer acting on the code should not act on
/// the vaguer `latency_above_baseline` for the rest of a WARNING).
fn refresh_split_reason(h: &mut RouteHealth, obs: &Obs, core: Dims) {
    let Some(code) = h.split.code() else {
        return;
    };
    let current = h.reason.as_ref().map(|r| r.code.as_str());
    let latency_family = matches!(
        current,
        Some("latency_above_baseline" | "ttft_above_baseline" | "tps_below_baseline")
            | Some("ttft_and_tps_off_baseline")
    );
    if !latency_family || current == Some(code) || core.is_empty() {
        return;
    }
    let text = reason_text(&obs.signals, core, &h.split);
    h.reason = Some(Reason::new(code, text));
}

impl crate::state::PersistedHealth for RouteHealth {
    fn route(&self) -> &RouteId {
        &self.route
    }
    fn state(&self) -> State {
        self.state
    }
    fn incident(&self) -> Option<&Incident> {
        self.incident.as_ref()
    }
}

/// One observation, as the state machine sees it.
#[derive(Debug, Default)]
pub(super) struct Obs {
    abnormal: Dims,
    fine: Dims,
    signals: Vec<Signal>,
    observed: Option<Observed>,
    latency: Option<LatencyRef>,
    tps: Option<TpsRef>,
}

/// The error window read at one instant.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rate {
    full: Counts,
    fast: Counts,
    high_now: bool,
    /// Which window `high_now` was read on.
    used_fast: bool,
}

/// The thresholds, applied to any number of routes' [`RouteHealth`].
#[derive(Debug, Clone)]
pub struct Detector {
    cfg: DetectionConfig,
}

impl Detector {
    pub fn new(cfg: &DetectionConfig) -> Self {
        Self { cfg: cfg.clone() }
    }

    pub fn config(&self) -> &DetectionConfig {
        &self.cfg
    }

    /// A fresh route: UNKNOWN since `now`.
    pub fn route(&self, route: RouteId, now: DateTime<Utc>) -> RouteHealth {
        RouteHealth::new(route, &self.cfg, now)
    }

    /// The shell's entry point for every outcome: judge it against the baseline as it was,
    /// then let the baseline learn from it, then (UNKNOWN only) check whether the baseline has
    /// just become ready — so the `min_samples`-th success is the one that makes it NORMAL.
    pub fn ingest(
        &self,
        h: &mut RouteHealth,
        baseline: &mut Baseline,
        o: &ProbeOutcome,
        now: DateTime<Utc>,
    ) -> Option<Transition> {
        let t = self.observe(h, o, baseline, now);
        baseline.record(o);
        if t.is_some() || o.route != h.route {
            return t;
        }
        h.baseline_ready = baseline.ready();
        if h.state == State::Unknown && h.baseline_ready && o.success && h.open.is_empty() {
            let rate = self.rate(h, now);
            let r = baseline.latency_ref(o.started_at);
            let text = match &r {
                Some(r) => format!(
                    "{} successful probes: normal is {} for {}",
                    baseline.samples(),
                    fmt_spread(r.mean_ms, r.stddev_ms),
                    r.bucket
                ),
                None => format!("{} successful probes", baseline.samples()),
            };
            let obs = Obs {
                observed: Some(Observed::of(o)),
                latency: r,
                ..Obs::default()
            };
            let ev = self.evidence(h, &obs, &rate, Vec::new());
            return Some(self.transition(
                h,
                State::Normal,
                Reason::new("baseline_ready", text),
                ev,
                now,
            ));
        }
        None
    }

    /// Judges one outcome against `baseline` (which must not yet contain it; prefer
    /// [`Detector::ingest`]). Passive outcomes only feed the error window and the tokens/s
    /// tally, judged at the next [`Detector::tick`].
    pub fn observe(
        &self,
        h: &mut RouteHealth,
        o: &ProbeOutcome,
        baseline: &Baseline,
        now: DateTime<Utc>,
    ) -> Option<Transition> {
        if o.route != h.route {
            return None;
        }
        let passive = o.kind == OutcomeKind::Passive;
        if let (true, false, Some(client)) = (passive, o.success, &o.attributed_to) {
            // The request's own failure (see `super::findings`): not the route's.
            let error = o.error.as_ref().map_or("unknown", |e| e.kind());
            let window_s = self.cfg.error_window.as_secs();
            super::findings::note_attributed(&mut h.attributed, client, error, now, window_s);
            return None;
        }
        let j = classify::judge(o, baseline);
        if j.counted {
            h.window.add(now, j.failed, passive);
            h.since_tick.total = h.since_tick.total.saturating_add(1);
            h.since_tick.failures = h.since_tick.failures.saturating_add(u32::from(j.failed));
        }
        if passive {
            if let Some(r) = &j.tps {
                h.tps_seen = h.tps_seen.saturating_add(1);
                h.tps_sum += o.tokens_per_second.unwrap_or(0.0);
                if j.abnormal.contains(Dims::THROUGHPUT) {
                    h.tps_low = h.tps_low.saturating_add(1);
                    h.tps_low_sum += o.tokens_per_second.unwrap_or(0.0);
                }
                h.tps_ref = Some(r.clone());
            }
            return None;
        }
        if !j.counted {
            return None; // the client's own error: nothing about the route
        }
        let mut j = j;
        if h.open.is_empty() {
            // Not in trouble: earlier verdicts describe a healthy route, not this trouble.
            h.split = Split::default();
        }
        if let Some(t) = &j.ttft {
            h.split.ttft = Some(t.clone());
        }
        if o.kind == OutcomeKind::Throughput {
            if let (Some(x), Some(r)) = (o.tokens_per_second, &j.tps) {
                h.split.tps = Some(TpsCheck {
                    observed: x,
                    mean: r.mean,
                    floor: r.floor,
                    low: x < r.floor,
                });
            }
            // While the route's latency is in doubt, a throughput probe (the confirmation that
            // follows an abnormal latency) judges it by its first token: its total is not
            // comparable with the `PROBE_OK` baseline, its wait for the first token is.
            if h.open.contains(Dims::LATENCY) && !j.failed {
                if let Some(t) = j.ttft.clone() {
                    if t.late {
                        let bucket = baseline
                            .ttft_ref(o.started_at)
                            .map(|r| (r.bucket, r.samples))
                            .unwrap_or_default();
                        j.signals.push(Signal::TtftAboveBaseline {
                            observed_ms: t.observed_ms,
                            threshold_ms: t.threshold_ms,
                            bucket: bucket.0,
                            mean_ms: t.mean_ms,
                            stddev_ms: t.stddev_ms,
                            samples: bucket.1,
                        });
                        j.abnormal = j.abnormal.union(Dims::LATENCY);
                    }
                    // An on-time first token is no evidence of normal latency: the doubt came
                    // from a `PROBE_OK` total, and only `PROBE_OK` probes clear it.
                }
            }
        }
        h.baseline_ready = baseline.ready();
        h.last_probe_at = Some(now);
        h.last_probe_failed = j.failed;
        if !j.failed {
            h.last_probe_ok_at = Some(now);
        }
        let rate = self.rate(h, now);
        let obs = Obs {
            abnormal: j.abnormal,
            fine: j.fine,
            signals: j.signals,
            observed: Some(Observed::of(o)),
            latency: j.latency,
            tps: j.tps,
        };
        self.step(h, obs, &rate, now)
    }

    /// The 1-second evaluation: turns the error window and the passive tokens/s tally into one
    /// observation, and lets time-based rules (CRITICAL after a while) fire.
    pub fn tick(&self, h: &mut RouteHealth, now: DateTime<Utc>) -> Option<Transition> {
        h.window.prune(now);
        let rate = self.rate(h, now);
        let mut obs = Obs::default();
        let c = &self.cfg;
        if rate.high_now {
            let (w, counts) = if rate.used_fast {
                (FAST_WINDOW_S, rate.fast)
            } else {
                (h.window.len_s(), rate.full)
            };
            obs.abnormal = Dims::AVAILABILITY;
            obs.signals.push(Signal::ErrorRateHigh {
                failures: counts.failures,
                total: counts.total,
                window_s: w,
            });
        } else {
            let fresh = h.since_tick;
            let read = if rate.used_fast { rate.fast } else { rate.full };
            if fresh.total > 0
                && fresh.failures == 0
                && read.total >= c.min_error_samples
                && read.rate() < c.recover_error_rate
            {
                obs.fine = Dims::AVAILABILITY;
            }
        }
        h.since_tick = Counts::default();
        if h.tps_seen >= MIN_PASSIVE_TPS {
            // Real streams are tokens/s evidence too: with traffic, queueing is told from
            // throttling without waiting for a throughput probe.
            if let Some(r) = &h.tps_ref {
                h.split.tps = Some(TpsCheck {
                    observed: h.tps_sum / f64::from(h.tps_seen),
                    mean: r.mean,
                    floor: r.floor,
                    low: 2 * h.tps_low > h.tps_seen,
                });
            }
            if 2 * h.tps_low > h.tps_seen {
                obs.abnormal = obs.abnormal.union(Dims::THROUGHPUT);
                if let Some(r) = &h.tps_ref {
                    obs.signals.push(Signal::TpsBelowBaseline {
                        observed: h.tps_low_sum / f64::from(h.tps_low.max(1)),
                        floor: r.floor,
                        bucket: r.bucket.clone(),
                        mean: r.mean,
                        samples: r.samples,
                    });
                }
                obs.tps = h.tps_ref.clone();
            } else {
                obs.fine = obs.fine.union(Dims::THROUGHPUT);
            }
        }
        if h.tps_seen >= MIN_PASSIVE_TPS || h.tps_seen == 0 {
            h.tps_seen = 0;
            h.tps_low = 0;
            h.tps_low_sum = 0.0;
            h.tps_sum = 0.0;
        }
        self.step(h, obs, &rate, now)
    }

    /// Reads the error window and moves the "above since" clocks.
    pub(super) fn rate(&self, h: &mut RouteHealth, now: DateTime<Utc>) -> Rate {
        let c = &self.cfg;
        let raw_full = h.window.counts(now, h.window.len_s());
        let raw_fast = h.window.counts(now, FAST_WINDOW_S);
        let (full, fast) = if h.suppression == Suppression::RequestSide {
            (raw_full.probes_only(), raw_fast.probes_only())
        } else {
            (raw_full, raw_fast)
        };
        let judged = |x: &Counts| {
            x.total >= c.min_error_samples
                && x.failures >= c.min_failures
                && x.rate() > c.critical_error_rate
        };
        let used_fast = fast.total >= c.min_error_samples;
        let high_now = if used_fast {
            judged(&fast)
        } else {
            judged(&full)
        };
        match h.rate_high_since {
            None if high_now => h.rate_high_since = Some(now),
            Some(since) if !high_now => {
                let fast_clean = used_fast && fast.rate() < c.recover_error_rate;
                let after = since.timestamp() - FAST_WINDOW_S as i64;
                let mut onset = h.window.counts_after(now, after);
                if h.suppression == Suppression::RequestSide {
                    onset = onset.probes_only();
                }
                if fast_clean || onset.rate() <= c.critical_error_rate {
                    h.rate_high_since = None;
                }
            }
            _ => {}
        }
        // Passive alone, for request-side findings (no hysteresis needed there).
        let passive = |x: &Counts| Counts {
            total: x.passive_total,
            failures: x.passive_failures,
            passive_total: x.passive_total,
            passive_failures: x.passive_failures,
        };
        let (pf, pq) = (passive(&raw_full), passive(&raw_fast));
        let passive_high = if pq.total >= c.min_error_samples {
            judged(&pq)
        } else {
            judged(&pf)
        };
        h.passive_high_since = match (passive_high, h.passive_high_since) {
            (true, None) => Some(now),
            (true, s) => s,
            (false, _) => None,
        };
        Rate {
            full,
            fast,
            high_now,
            used_fast,
        }
    }

    /// Applies one observation to the state machine.
    fn step(
        &self,
        h: &mut RouteHealth,
        obs: Obs,
        rate: &Rate,
        now: DateTime<Utc>,
    ) -> Option<Transition> {
        let c = &self.cfg;
        let mut core = obs.abnormal.without(Dims::BEHAVIOR);
        if h.suppression == Suppression::Egress {
            core = core.without(Dims::AVAILABILITY);
        }
        let behavior_bad = obs.abnormal.contains(Dims::BEHAVIOR);
        // An exhausted `max_tokens` holds the route at WARNING like a changed answer, but it is
        // our configuration: it never marks the route `behavior_changed` (nor its failure mode).
        let exhausted = obs
            .signals
            .iter()
            .any(|s| matches!(s, Signal::MaxTokensExhausted { .. }));
        if behavior_bad && !exhausted {
            h.behavior = true;
        } else if obs.fine.contains(Dims::BEHAVIOR) {
            h.behavior = false;
        }
        let normal =
            core.is_empty() && !behavior_bad && !obs.fine.is_empty() && obs.fine.contains(h.open);
        if obs.observed.is_some() {
            h.last_core = core;
        }
        if !core.is_empty() {
            h.streak = h.streak.saturating_add(1);
            h.open = h.open.union(core);
            h.normal_since = None;
            if core.contains(Dims::AVAILABILITY) {
                h.modes.failures = h.modes.failures.saturating_add(1);
            } else {
                h.modes.slow = h.modes.slow.saturating_add(1);
            }
            if h.state.is_incident() && h.abnormal_run_since.is_none() {
                h.abnormal_run_since = Some(now);
            }
        } else if normal {
            h.streak = 0;
            h.normal_since.get_or_insert(now);
            h.abnormal_run_since = None;
        }

        let mut thresholds = Vec::new();
        let degraded_reason = |h: &RouteHealth, obs: &Obs| {
            Reason::new(
                lead_code(&obs.signals, core, &h.split),
                format!(
                    "{} consecutive abnormal observations; latest: {}",
                    h.streak,
                    reason_text(&obs.signals, core, &h.split)
                ),
            )
        };
        let target = match h.state {
            State::Unknown | State::Normal => {
                if !core.is_empty() {
                    if h.streak >= c.degraded_after {
                        thresholds.push(streak_threshold(h.streak, c.degraded_after));
                        Some((State::Degraded, degraded_reason(h, &obs)))
                    } else {
                        let r = Reason::new(
                            lead_code(&obs.signals, core, &h.split),
                            reason_text(&obs.signals, core, &h.split),
                        );
                        Some((State::Warning, r))
                    }
                } else if behavior_bad {
                    let code = if exhausted {
                        "max_tokens_exhausted"
                    } else {
                        "answer_changed"
                    };
                    let r = Reason::new(code, signals_text(&obs.signals, Dims::BEHAVIOR));
                    Some((State::Warning, r))
                } else {
                    None
                }
            }
            State::Warning => {
                if !core.is_empty() && h.streak >= c.degraded_after {
                    thresholds.push(streak_threshold(h.streak, c.degraded_after));
                    Some((State::Degraded, degraded_reason(h, &obs)))
                } else if normal && !h.behavior {
                    let to = if h.baseline_ready {
                        State::Normal
                    } else {
                        State::Unknown
                    };
                    Some((
                        to,
                        Reason::new("recovered", "the next observation was normal"),
                    ))
                } else {
                    None
                }
            }
            State::Degraded | State::Critical => {
                let high_for = h
                    .rate_high_since
                    .map(|s| (now - s).to_std().unwrap_or_default());
                let run_for = h
                    .abnormal_run_since
                    .filter(|_| h.normal_since.is_none())
                    .map(|s| (now - s).to_std().unwrap_or_default());
                let normal_for = h
                    .normal_since
                    .map(|s| (now - s).to_std().unwrap_or_default());
                if h.state == State::Degraded
                    && rate.high_now
                    && high_for.is_some_and(|d| d >= c.critical_after)
                {
                    let d = high_for.unwrap_or_default();
                    let (w, x) = if rate.used_fast {
                        (FAST_WINDOW_S, rate.fast)
                    } else {
                        (h.window.len_s(), rate.full)
                    };
                    thresholds.push(Threshold {
                        name: "error_rate".into(),
                        observed: x.rate(),
                        limit: c.critical_error_rate,
                    });
                    thresholds.push(Threshold {
                        name: "error_rate_high_for_s".into(),
                        observed: d.as_secs_f64(),
                        limit: c.critical_after.as_secs_f64(),
                    });
                    let text = format!(
                        "error rate {:.1}% above {:.1}% for {} s ({} of {} calls in the last {} s)",
                        100.0 * x.rate(),
                        100.0 * c.critical_error_rate,
                        d.as_secs(),
                        x.failures,
                        x.total,
                        w
                    );
                    Some((State::Critical, Reason::new("error_rate_high", text)))
                } else if h.state == State::Degraded
                    && run_for.is_some_and(|d| d >= c.critical_degraded_for)
                {
                    let d = run_for.unwrap_or_default();
                    thresholds.push(Threshold {
                        name: "degraded_for_s".into(),
                        observed: d.as_secs_f64(),
                        limit: c.critical_degraded_for.as_secs_f64(),
                    });
                    let text = format!(
                        "DEGRADED for {} s without one normal observation",
                        d.as_secs()
                    );
                    Some((State::Critical, Reason::new("degraded_too_long", text)))
                } else if normal
                    && !rate.high_now
                    && normal_for.is_some_and(|d| d >= c.recover_after)
                    && rate.full.rate() < c.recover_error_rate
                {
                    let d = normal_for.unwrap_or_default();
                    thresholds.push(Threshold {
                        name: "normal_for_s".into(),
                        observed: d.as_secs_f64(),
                        limit: c.recover_after.as_secs_f64(),
                    });
                    thresholds.push(Threshold {
                        name: "recover_error_rate".into(),
                        observed: rate.full.rate(),
                        limit: c.recover_error_rate,
                    });
                    let text = format!(
                        "normal for {} s; error rate {:.2}% ({} of {} calls) below {:.1}%",
                        d.as_secs(),
                        100.0 * rate.full.rate(),
                        rate.full.failures,
                        rate.full.total,
                        100.0 * c.recover_error_rate
                    );
                    let to = if h.baseline_ready {
                        State::Normal
                    } else {
                        State::Unknown
                    };
                    Some((to, Reason::new("recovered", text)))
                } else {
                    None
                }
            }
            State::Switched => None, // never stored as the judged state
        };

        match target {
            Some((to, reason)) => {
                let ev = self.evidence(h, &obs, rate, thresholds);
                Some(self.transition(h, to, reason, ev, now))
            }
            None => {
                if !matches!(h.state, State::Normal | State::Unknown) {
                    refresh_split_reason(h, &obs, core);
                    // A route that follows its vantages counts no modes of its own: keep theirs.
                    h.failure_mode = failure_mode(h).or(h.failure_mode);
                    if let Some(i) = h.incident.as_mut() {
                        i.failure_mode = h.failure_mode.or(i.failure_mode);
                    }
                }
                None
            }
        }
    }

    pub(super) fn evidence(
        &self,
        h: &RouteHealth,
        obs: &Obs,
        rate: &Rate,
        mut thresholds: Vec<Threshold>,
    ) -> Evidence {
        let mut per_signal: Vec<Threshold> = obs
            .signals
            .iter()
            .filter_map(|s| match s {
                Signal::LatencyAboveBaseline {
                    observed_ms,
                    threshold_ms,
                    ..
                } => Some(Threshold {
                    name: "latency_ms".into(),
                    observed: *observed_ms,
                    limit: *threshold_ms,
                }),
                Signal::TtftAboveBaseline {
                    observed_ms,
                    threshold_ms,
                    ..
                } => Some(Threshold {
                    name: "ttft_ms".into(),
                    observed: *observed_ms,
                    limit: *threshold_ms,
                }),
                Signal::TpsBelowBaseline {
                    observed, floor, ..
                } => Some(Threshold {
                    name: "tokens_per_second".into(),
                    observed: *observed,
                    limit: *floor,
                }),
                Signal::ErrorRateHigh {
                    failures, total, ..
                } => Some(Threshold {
                    name: "error_rate".into(),
                    observed: f64::from(*failures) / f64::from((*total).max(1)),
                    limit: self.cfg.critical_error_rate,
                }),
                _ => None,
            })
            .collect();
        per_signal.retain(|t| !thresholds.iter().any(|x| x.name == t.name));
        thresholds.splice(0..0, per_signal);
        Evidence {
            observed: obs.observed.clone(),
            signals: obs.signals.clone(),
            baseline: obs.latency.clone(),
            tps_baseline: obs.tps.clone(),
            thresholds,
            error_rate: ErrorRateEvidence {
                window_s: h.window.len_s(),
                total: rate.full.total,
                failures: rate.full.failures,
                rate: rate.full.rate(),
                fast_window_s: FAST_WINDOW_S,
                fast_total: rate.fast.total,
                fast_failures: rate.fast.failures,
                above_since: h.rate_high_since,
            },
            consecutive_abnormal: h.streak,
        }
    }

    /// Moves the route to `to`, keeps its incident, and returns the transition.
    /// Moves a route judged by several vantages to the state their quorum agreed on
    /// ([`super::quorum`]), opening, raising or closing its incident as any transition does.
    /// The route's own rules do not escalate it further on time alone: its vantages do.
    pub fn follow(
        &self,
        h: &mut RouteHealth,
        v: &super::quorum::Verdict,
        min_vantages: u32,
        now: DateTime<Utc>,
    ) -> Option<Transition> {
        let (to, reason, mode) = (v.state, v.reason.clone(), v.failure_mode);
        let agreeing = u32::try_from(v.agreeing.len()).unwrap_or(u32::MAX);
        if h.state == to {
            return None;
        }
        let rate = self.rate(h, now);
        let thresholds = vec![Threshold {
            name: "vantages_agreeing".into(),
            observed: f64::from(agreeing),
            limit: f64::from(min_vantages),
        }];
        let ev = self.evidence(h, &Obs::default(), &rate, thresholds);
        let mut t = self.transition(h, to, reason, ev, now);
        h.abnormal_run_since = None;
        // The route's own machine saw none of the probes: how it fails is what its vantages
        // see.
        if !matches!(to, State::Normal | State::Unknown) && t.failure_mode.is_none() {
            t.failure_mode = mode;
            h.failure_mode = mode;
            if let Some(i) = h.incident.as_mut() {
                i.failure_mode = i.failure_mode.or(mode);
                if let Some(last) = i.transitions.last_mut() {
                    last.failure_mode = mode;
                }
            }
        }
        Some(t)
    }

    pub(super) fn transition(
        &self,
        h: &mut RouteHealth,
        to: State,
        reason: Reason,
        evidence: Evidence,
        now: DateTime<Utc>,
    ) -> Transition {
        let from = h.state;
        let recovering = matches!(to, State::Normal | State::Unknown);
        let mode = if recovering { None } else { failure_mode(h) };
        h.state = to;
        h.since = now;
        h.reason = Some(reason.clone());
        h.failure_mode = mode;
        if recovering {
            h.streak = 0;
            h.open = Dims::NONE;
            h.split = Split::default();
            h.modes = ModeCounts::default();
            h.normal_since = None;
            h.abnormal_run_since = None;
        } else if to == State::Degraded && !from.is_incident() {
            h.abnormal_run_since = Some(now);
        }
        if to.is_incident() && h.incident.is_none() {
            h.incident = Some(Incident {
                id: format!("{}@{}", h.route, now.to_rfc3339()),
                route: h.route.clone(),
                opened_at: now,
                closed_at: None,
                peak: to,
                failure_mode: mode,
                transitions: Vec::new(),
                cause: None,
            });
        }
        let mut t = Transition {
            route: h.route.clone(),
            from,
            to,
            at: now,
            reason,
            failure_mode: mode,
            evidence,
            incident_id: h.incident.as_ref().map(|i| i.id.clone()),
        };
        if let Some(mut i) = h.incident.take() {
            i.peak = i.peak.max(to);
            if mode.is_some() {
                i.failure_mode = mode;
            }
            t.failure_mode = t.failure_mode.or(i.failure_mode);
            if recovering {
                i.closed_at = Some(now);
                i.transitions.push(t.clone());
                h.last_closed = Some(i);
            } else {
                if i.transitions.len() < MAX_INCIDENT_TRANSITIONS {
                    i.transitions.push(t.clone());
                }
                h.incident = Some(i);
            }
        }
        t
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::probe::outcome::ProbeError;

    /// A probe answered 503 at `at` (for the tests of detection and what reads it).
    pub(crate) fn failed_probe(route: &RouteId, at: DateTime<Utc>) -> ProbeOutcome {
        ProbeOutcome {
            route: route.clone(),
            kind: OutcomeKind::Probe,
            started_at: at,
            success: false,
            attributed_to: None,
            verified: None,
            ttfb_ms: None,
            ttft_ms: None,
            total_ms: 80.0,
            output_tokens: None,
            tokens_estimated: false,
            tokens_per_second: None,
            model_reported: None,
            system_fingerprint: None,
            http_status: Some(503),
            error: Some(ProbeError::Http {
                status: 503,
                message: "overloaded".into(),
            }),
            answer: None,
            first_answer_ms: None,
            max_tokens_exhausted: false,
            ratelimit: None,
        }
    }

    /// Downtime is not observed time: a DEGRADED route restored an hour later is not CRITICAL
    /// on the first tick, but still becomes CRITICAL after `critical_degraded_for` of watched
    /// time without a normal observation.
    #[test]
    fn resume_after_counts_watched_time_only() {
        let cfg = DetectionConfig::default();
        let det = Detector::new(&cfg);
        let r = RouteId::new("p", "r", "m");
        let t0 = Utc.with_ymd_and_hms(2026, 11, 30, 6, 30, 0).unwrap();
        let s = |secs: i64| t0 + chrono::Duration::seconds(secs);
        let mut h = det.route(r.clone(), t0);
        let mut b = Baseline::new(r.clone(), &cfg);
        for at in [s(0), s(30), s(60)] {
            det.ingest(&mut h, &mut b, &failed_probe(&r, at), at);
        }
        assert_eq!(h.state(), State::Degraded);

        let mut stale = h.clone();
        assert_eq!(
            det.tick(&mut stale, s(3660)).map(|t| t.to),
            Some(State::Critical),
            "without resume_after the downtime counts"
        );

        h.resume_after(chrono::Duration::seconds(3600));
        assert_eq!(det.tick(&mut h, s(3661)), None);
        let critical = (3662..3800).find_map(|x| det.tick(&mut h, s(x)));
        let critical = critical.expect("escalates after watched time");
        assert_eq!(critical.reason.code, "degraded_too_long");
        assert_eq!(critical.at, s(3600 + 60 + 120));
    }
}
