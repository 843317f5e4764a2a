//! The switch controller: per logical model, move the traffic from its primaries to a backup
//! when the primaries are `CRITICAL`, and bring it back gradually. Every decision follows the
//! `[switch]` settings (docs/configuration.md), never improvised.
//!
//! **The machine** ([`Machine`]) is pure: plain data, [`Machine::step`] is a function of
//! (phase, [`Input`], `now`) returning [`Effect`]s; the pre-probe result comes back through
//! [`Machine::pre_probed`]. Phases:
//!
//! - `primary`: the primaries carry the traffic. When the model's state (the best judged state
//!   among its primaries) is `CRITICAL`, the first healthy backup (NORMAL or UNKNOWN, in
//!   config order, not already failed a pre-probe in this episode) is **pre-probed**.
//! - `probing`: waiting for that probe. It must pass; then the budget is checked
//!   (`degrade_at`); then the **switch**: the primaries become `SWITCHED`, the share goes to
//!   the backup (weights reason `switched`).
//! - `switched`: after `return_after` (from the switch, or from an aborted canary) and once
//!   the primary has been `NORMAL` without a break for `return_healthy_for`, the **canary**
//!   starts: the primaries get `canary[0]` of the share, then each next ratio every
//!   `canary_stage` (weights reason `canary`); after the last stage's time the return is
//!   complete (primaries active, `SWITCHED` cleared).
//! - `canary`: any primary state other than NORMAL in a stage aborts: all traffic back on the
//!   backup, and the wait restarts.
//!
//! **Hysteresis**: the switch threshold is `CRITICAL`, the return threshold an unbroken
//! `NORMAL` for `return_healthy_for`; WARNING/DEGRADED in between move nothing.
//! **Dwell**: no switch before `dwell_until` (`min_dwell` after a switch or a completed
//! return). **Cap**: at most `max_switches_per_hour` switches in any rolling hour; past it
//! the controller holds where it is and records (alerts) `held`. Every refusal (no healthy
//! backup, failed pre-probe, budget, dwell, cap) is a `blocked` record, once per cause per
//! episode, retried after [`RETRY_BLOCKED`] (or the dwell's end).
//!
//! Every switch, canary stage, abort, return and refusal is a [`SwitchRecord`] (its switch
//! context: trigger, from/to routes, automatic, dwell-until), stored in SQLite
//! (`switch_events`), sent as
//! [`HealthEvent::Switch`](crate::health::HealthEvent::Switch) (alerts: `critical` for a
//! switch or a refusal, `warning` for an abort, `info` for canary stages and the return),
//! and listed by `GET /api/v1/switches` with the current phase of every model and the
//! budget.
//!
//! This module is the pure machine and its types. Around it:
//! - [`driver`] ([`spawn`]), the thin I/O shell: on every health snapshot and every second it
//!   steps each machine, runs the pre-probe (the real probe client), sets `SWITCHED` through
//!   the health service's command channel, publishes the weights
//!   [`Overrides`](crate::weights::Overrides), stores and announces the records;
//! - [`view`]: the published [`SwitchStatus`], which `GET /api/v1/switches` (in the web
//!   layer) serves with the stored records.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub(crate) mod driver;
pub(crate) mod view;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::SwitchConfig;
use crate::extra_cost::ExtraCost;
use crate::health::{HealthSnapshot, State};
use crate::probe::ProbeOutcome;
use crate::route::{Route, RouteId, Tier};
use crate::weights::SwitchOverride;

pub use driver::{spawn, Driver, Spawned};
use view::status_of;
pub use view::{ModelSwitch, SwitchRx, SwitchStatus};

/// A refused switch is tried again after this long (a failed pre-probe, no healthy backup,
/// the budget, the cap).
pub const RETRY_BLOCKED: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

pub use crate::records::switch::{Action, Episode, SwitchRecord};

/// What the machine sees of the world at one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub now: DateTime<Utc>,
    /// The best judged state among the model's primaries (the model's state).
    pub primary: State,
    /// The reason code of that primary (the switch's trigger).
    pub primary_reason: Option<String>,
    /// Each backup's judged state, in config order.
    pub backups: Vec<(RouteId, State)>,
    /// Below `degrade_at` of the hourly budget.
    pub budget_allows: bool,
    /// The model's extra cost since start (`ExtraCost::total_for`).
    pub extra_cost_total: f64,
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Probe this backup now and report with [`Machine::pre_probed`].
    PreProbe(RouteId),
    /// Set or clear the `SWITCHED` overlay on these routes.
    SetSwitched {
        routes: Vec<RouteId>,
        on: bool,
    },
    /// The model's weights override (`None`: computed from health alone).
    Override(Option<SwitchOverride>),
    Record(SwitchRecord),
}

/// Where a model is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    Primary,
    Probing {
        backup: RouteId,
        since: DateTime<Utc>,
    },
    Switched {
        backup: RouteId,
        /// The switch.
        since: DateTime<Utc>,
        /// `return_after` counts from here (the switch, or the last abort).
        wait_from: DateTime<Utc>,
        /// The primary has been NORMAL since then, without a break.
        healthy_since: Option<DateTime<Utc>>,
    },
    Canary {
        backup: RouteId,
        since: DateTime<Utc>,
        stage: usize,
        ratio: f64,
        stage_started: DateTime<Utc>,
    },
}

/// One logical model's switch controller (pure; see the module docs).
#[derive(Debug, Clone)]
pub struct Machine {
    serves: String,
    primaries: Vec<RouteId>,
    cfg: SwitchConfig,
    phase: Phase,
    /// Switch times within the last hour.
    switches: VecDeque<DateTime<Utc>>,
    dwell_until: Option<DateTime<Utc>>,
    /// The current episode (first switch until the return).
    episode: Option<(DateTime<Utc>, u32, f64)>,
    /// Backups that failed their pre-probe while the primaries stayed CRITICAL.
    failed_probes: HashSet<RouteId>,
    /// Refusal causes already recorded in this CRITICAL spell, and when to try again.
    blocked: HashSet<String>,
    retry_at: Option<DateTime<Utc>>,
    probe_result: Option<(RouteId, bool, String)>,
}

/// A chrono span from a config duration (saturating).
fn span(d: Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(d).unwrap_or(chrono::TimeDelta::MAX)
}

impl Machine {
    pub fn new(serves: &str, primaries: Vec<RouteId>, cfg: SwitchConfig) -> Self {
        Self {
            serves: serves.to_owned(),
            primaries,
            cfg,
            phase: Phase::Primary,
            switches: VecDeque::new(),
            dwell_until: None,
            episode: None,
            failed_probes: HashSet::new(),
            blocked: HashSet::new(),
            retry_at: None,
            probe_result: None,
        }
    }

    pub fn serves(&self) -> &str {
        &self.serves
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    pub fn dwell_until(&self) -> Option<DateTime<Utc>> {
        self.dwell_until
    }

    /// Switches in the hour before `now`.
    pub fn switches_last_hour(&self, now: DateTime<Utc>) -> usize {
        self.switches
            .iter()
            .filter(|t| now - **t < chrono::TimeDelta::hours(1))
            .count()
    }

    /// The pre-probe of `backup` ended; the next [`Machine::step`] acts on it.
    pub fn pre_probed(&mut self, backup: &RouteId, ok: bool, detail: impl Into<String>) {
        self.probe_result = Some((backup.clone(), ok, detail.into()));
    }

    fn record(
        &self,
        action: Action,
        at: DateTime<Utc>,
        trigger: &str,
        from: Vec<RouteId>,
        to: Vec<RouteId>,
        text: String,
    ) -> SwitchRecord {
        SwitchRecord {
            serves: self.serves.clone(),
            action,
            at,
            trigger: trigger.to_owned(),
            from,
            to,
            automatic: true,
            dwell_until: self.dwell_until,
            ratio: None,
            episode: None,
            text,
        }
    }

    /// A refusal: recorded once per cause per spell, retried later.
    fn block(
        &mut self,
        now: DateTime<Utc>,
        code: &str,
        to: Vec<RouteId>,
        text: String,
        retry_at: DateTime<Utc>,
    ) -> Vec<Effect> {
        self.retry_at = Some(retry_at);
        if !self.blocked.insert(code.to_owned()) {
            return Vec::new();
        }
        tracing::warn!(serves = %self.serves, cause = code, "switch refused: {text}");
        let r = self.record(Action::Blocked, now, code, self.primaries.clone(), to, text);
        vec![Effect::Record(r)]
    }

    /// One evaluation (see the module docs).
    pub fn step(&mut self, input: &Input) -> Vec<Effect> {
        let now = input.now;
        while self
            .switches
            .front()
            .is_some_and(|t| now - *t >= chrono::TimeDelta::hours(1))
        {
            self.switches.pop_front();
        }
        match self.phase.clone() {
            Phase::Primary => self.step_primary(input),
            Phase::Probing { backup, .. } => self.step_probing(input, backup),
            Phase::Switched {
                backup,
                since,
                wait_from,
                healthy_since,
            } => self.step_switched(input, backup, since, wait_from, healthy_since),
            Phase::Canary {
                backup,
                since,
                stage,
                stage_started,
                ..
            } => self.step_canary(input, backup, since, stage, stage_started),
        }
    }

    fn step_primary(&mut self, input: &Input) -> Vec<Effect> {
        let now = input.now;
        self.probe_result = None;
        if input.primary != State::Critical {
            // The spell is over: a new one starts with a clean slate.
            self.failed_probes.clear();
            self.blocked.clear();
            self.retry_at = None;
            return Vec::new();
        }
        if self.retry_at.is_some_and(|t| now < t) {
            return Vec::new();
        }
        if let Some(until) = self.dwell_until.filter(|u| now < *u) {
            let text = format!(
                "{} is CRITICAL but the last move was less than min_dwell ago; holding until {}",
                self.serves,
                crate::clock::rfc3339(until)
            );
            return self.block(now, "min_dwell", Vec::new(), text, until);
        }
        let cap = self.cfg.max_switches_per_hour as usize;
        if self.switches.len() >= cap {
            let retry = self
                .switches
                .front()
                .map_or(now + RETRY_BLOCKED, |t| *t + chrono::TimeDelta::hours(1));
            let text = format!(
                "{} is CRITICAL but already switched {} times in the last hour (max_switches_per_hour = {cap}); holding where it is",
                self.serves,
                self.switches.len()
            );
            return self.block(now, "max_switches_per_hour", Vec::new(), text, retry);
        }
        let candidate = input
            .backups
            .iter()
            .find(|(id, s)| {
                matches!(s, State::Normal | State::Unknown) && !self.failed_probes.contains(id)
            })
            .map(|(id, _)| id.clone());
        let Some(backup) = candidate else {
            let text = format!(
                "{} is CRITICAL and no backup is healthy: no switch (the degradation contracts apply)",
                self.serves
            );
            return self.block(
                now,
                "no_healthy_backup",
                Vec::new(),
                text,
                now + RETRY_BLOCKED,
            );
        };
        self.phase = Phase::Probing {
            backup: backup.clone(),
            since: now,
        };
        vec![Effect::PreProbe(backup)]
    }

    fn step_probing(&mut self, input: &Input, backup: RouteId) -> Vec<Effect> {
        let now = input.now;
        if input.primary != State::Critical {
            self.phase = Phase::Primary;
            self.probe_result = None;
            return Vec::new();
        }
        let Some((probed, ok, detail)) = self.probe_result.take() else {
            return Vec::new();
        };
        if probed != backup {
            return Vec::new();
        }
        self.phase = Phase::Primary;
        if !ok {
            self.failed_probes.insert(backup.clone());
            let text = format!("backup {backup} failed its pre-probe ({detail}): not switched");
            let mut out = self.block(
                now,
                "backup_probe_failed",
                vec![backup],
                text,
                now + RETRY_BLOCKED,
            );
            // Another backup may pass: try at once.
            self.retry_at = None;
            out.extend(self.step_primary(input));
            return out;
        }
        if !input.budget_allows {
            let text = format!(
                "backup {backup} is healthy but the hourly extra-cost budget is past degrade_at: no switch (the degradation contracts apply)"
            );
            return self.block(now, "budget", vec![backup], text, now + RETRY_BLOCKED);
        }
        // Switch.
        self.switches.push_back(now);
        self.dwell_until = Some(now + span(self.cfg.min_dwell));
        match &mut self.episode {
            Some((_, n, _)) => *n += 1,
            None => self.episode = Some((now, 1, input.extra_cost_total)),
        }
        self.blocked.clear();
        self.failed_probes.clear();
        self.retry_at = None;
        self.phase = Phase::Switched {
            backup: backup.clone(),
            since: now,
            wait_from: now,
            healthy_since: None,
        };
        let trigger = input
            .primary_reason
            .clone()
            .unwrap_or_else(|| "critical".to_owned());
        let text = format!(
            "{}: primaries CRITICAL ({trigger}); backup {backup} pre-probed healthy ({detail}), budget ok: all traffic to {backup}",
            self.serves
        );
        tracing::warn!(serves = %self.serves, %backup, "{text}");
        let r = self.record(
            Action::Switch,
            now,
            &trigger,
            self.primaries.clone(),
            vec![backup.clone()],
            text,
        );
        vec![
            Effect::SetSwitched {
                routes: self.primaries.clone(),
                on: true,
            },
            Effect::Override(Some(SwitchOverride {
                backup,
                primary_share: 0,
            })),
            Effect::Record(r),
        ]
    }

    fn step_switched(
        &mut self,
        input: &Input,
        backup: RouteId,
        since: DateTime<Utc>,
        wait_from: DateTime<Utc>,
        healthy_since: Option<DateTime<Utc>>,
    ) -> Vec<Effect> {
        let now = input.now;
        let healthy_since = if input.primary == State::Normal {
            Some(healthy_since.unwrap_or(now))
        } else {
            None
        };
        let waited = now - wait_from >= span(self.cfg.return_after);
        let healthy = healthy_since.is_some_and(|h| now - h >= span(self.cfg.return_healthy_for));
        let dwelt = self.dwell_until.is_none_or(|u| now >= u);
        if !(waited && healthy && dwelt) {
            self.phase = Phase::Switched {
                backup,
                since,
                wait_from,
                healthy_since,
            };
            return Vec::new();
        }
        self.start_stage(now, backup, since, 0, "primary_healthy")
    }

    fn start_stage(
        &mut self,
        now: DateTime<Utc>,
        backup: RouteId,
        since: DateTime<Utc>,
        stage: usize,
        trigger: &str,
    ) -> Vec<Effect> {
        let ratio = self.cfg.canary.get(stage).copied().unwrap_or(1.0);
        self.phase = Phase::Canary {
            backup: backup.clone(),
            since,
            stage,
            ratio,
            stage_started: now,
        };
        let text = format!(
            "{}: canary stage {}/{}: {:.0}% of the traffic back on the primaries",
            self.serves,
            stage + 1,
            self.cfg.canary.len(),
            ratio * 100.0
        );
        tracing::info!(serves = %self.serves, "{text}");
        let mut r = self.record(
            Action::CanaryStage,
            now,
            trigger,
            vec![backup.clone()],
            self.primaries.clone(),
            text,
        );
        r.ratio = Some(ratio);
        vec![
            Effect::Override(Some(SwitchOverride {
                backup,
                primary_share: pct(ratio),
            })),
            Effect::Record(r),
        ]
    }

    fn step_canary(
        &mut self,
        input: &Input,
        backup: RouteId,
        since: DateTime<Utc>,
        stage: usize,
        stage_started: DateTime<Utc>,
    ) -> Vec<Effect> {
        let now = input.now;
        if input.primary != State::Normal {
            // Any failure in a stage: all traffic back on the backup, the wait restarts.
            self.phase = Phase::Switched {
                backup: backup.clone(),
                since,
                wait_from: now,
                healthy_since: None,
            };
            if let Some((_, n, _)) = &mut self.episode {
                *n += 1;
            }
            let trigger = input
                .primary_reason
                .clone()
                .unwrap_or_else(|| "canary_failed".to_owned());
            let text = format!(
                "{}: canary stage {} failed (primary {}, {trigger}): all traffic back on {backup}; the wait restarts",
                self.serves,
                stage + 1,
                input.primary
            );
            tracing::warn!(serves = %self.serves, "{text}");
            let r = self.record(
                Action::Abort,
                now,
                "canary_failed",
                self.primaries.clone(),
                vec![backup.clone()],
                text,
            );
            return vec![
                Effect::Override(Some(SwitchOverride {
                    backup,
                    primary_share: 0,
                })),
                Effect::Record(r),
            ];
        }
        if now - stage_started < span(self.cfg.canary_stage) {
            return Vec::new();
        }
        if stage + 1 < self.cfg.canary.len() {
            return self.start_stage(now, backup, since, stage + 1, "canary");
        }
        // The return is complete.
        self.phase = Phase::Primary;
        self.dwell_until = Some(now + span(self.cfg.min_dwell));
        let episode = self.episode.take().map(|(start, n, cost0)| Episode {
            started_at: start,
            duration_s: (now - start).num_seconds(),
            switches: n,
            extra_cost: (input.extra_cost_total - cost0).max(0.0),
        });
        let text = match &episode {
            Some(e) => format!(
                "{}: return complete, primaries active again after {} min ({} switch(es), extra cost {:.4})",
                self.serves,
                e.duration_s / 60,
                e.switches,
                e.extra_cost
            ),
            None => format!("{}: return complete, primaries active again", self.serves),
        };
        tracing::info!(serves = %self.serves, "{text}");
        let mut r = self.record(
            Action::Returned,
            now,
            "canary_passed",
            vec![backup],
            self.primaries.clone(),
            text,
        );
        r.ratio = Some(1.0);
        r.episode = episode;
        vec![
            Effect::SetSwitched {
                routes: self.primaries.clone(),
                on: false,
            },
            Effect::Override(None),
            Effect::Record(r),
        ]
    }
}

/// A ratio as a whole percentage of the share (at least 1 for a positive ratio).
fn pct(ratio: f64) -> u8 {
    let p = (ratio.clamp(0.0, 1.0) * 100.0).round() as u8;
    if ratio > 0.0 {
        p.max(1)
    } else {
        p
    }
}

/// What the controller shows before it runs (every model idle): a cluster member publishes
/// it until it first leads.
pub fn idle_status(
    routes: &[Route],
    cfg: &SwitchConfig,
    budget: &ExtraCost,
    now: DateTime<Utc>,
) -> SwitchStatus {
    status_of(&machines(routes, cfg), budget, now)
}

/// Builds one machine per logical model that has primaries and backups (config order).
pub fn machines(routes: &[Route], cfg: &SwitchConfig) -> Vec<Machine> {
    let mut by_model: BTreeMap<&str, (Vec<RouteId>, usize)> = BTreeMap::new();
    for r in routes {
        let e = by_model.entry(r.serves.as_str()).or_default();
        match r.tier {
            Tier::Primary => e.0.push(r.id.clone()),
            Tier::Backup => e.1 += 1,
            Tier::Fallback => {}
        }
    }
    by_model
        .into_iter()
        .filter(|(_, (p, b))| !p.is_empty() && *b > 0)
        .map(|(serves, (p, _))| Machine::new(serves, p, cfg.clone()))
        .collect()
}

/// The machine's input from a health snapshot.
pub fn input_for(
    machine: &Machine,
    routes: &[Route],
    health: &HealthSnapshot,
    budget: &ExtraCost,
    now: DateTime<Utc>,
) -> Input {
    let judged = |id: &RouteId| health.route(id).map_or(State::Unknown, |s| s.judged);
    // The best primary: the lowest state in NORMAL < UNKNOWN < WARNING < … order.
    let rank = |s: State| match s {
        State::Normal => 0,
        State::Unknown => 1,
        State::Warning => 2,
        State::Degraded => 3,
        State::Critical | State::Switched => 4,
    };
    let best = machine
        .primaries
        .iter()
        .min_by_key(|id| rank(judged(id)))
        .cloned();
    let primary = best.as_ref().map_or(State::Unknown, &judged);
    let primary_reason = best
        .as_ref()
        .and_then(|id| health.route(id))
        .and_then(|s| s.reason.as_ref())
        .map(|r| r.code.clone());
    let backups = routes
        .iter()
        .filter(|r| r.serves == machine.serves && r.tier == Tier::Backup)
        .map(|r| (r.id.clone(), judged(&r.id)))
        .collect();
    Input {
        now,
        primary,
        primary_reason,
        backups,
        budget_allows: budget.allows_switch(),
        extra_cost_total: budget.total_for(&machine.serves),
    }
}

/// Whether a pre-probe outcome passes: a success whose answer was not found changed.
pub fn pre_probe_passed(o: &ProbeOutcome) -> bool {
    o.success && o.verified != Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_714_557_600 + s, 0).unwrap()
    }
    fn id(s: &str) -> RouteId {
        RouteId::parse(s).unwrap()
    }
    fn input(now: i64, primary: State, backup: State) -> Input {
        Input {
            now: t(now),
            primary,
            primary_reason: Some("error_rate_high".into()),
            backups: vec![(id("deepseek/cn/v3"), backup)],
            budget_allows: true,
            extra_cost_total: 0.0,
        }
    }
    fn machine() -> Machine {
        Machine::new("chat", vec![id("qwen/cn/max")], SwitchConfig::default())
    }
    fn records(e: &[Effect]) -> Vec<(Action, String)> {
        e.iter()
            .filter_map(|e| match e {
                Effect::Record(r) => Some((r.action, r.trigger.clone())),
                _ => None,
            })
            .collect()
    }
    /// Critical → pre-probe ok → switched; returns the effects of the switching step.
    fn switch_at(m: &mut Machine, now: i64) -> Vec<Effect> {
        let e = m.step(&input(now, State::Critical, State::Normal));
        assert_eq!(e, vec![Effect::PreProbe(id("deepseek/cn/v3"))]);
        m.pre_probed(&id("deepseek/cn/v3"), true, "800 ms");
        m.step(&input(now, State::Critical, State::Normal))
    }

    #[test]
    fn switches_after_a_passing_pre_probe() {
        let mut m = machine();
        assert!(m.step(&input(0, State::Degraded, State::Normal)).is_empty());
        let e = switch_at(&mut m, 90);
        assert_eq!(
            records(&e),
            vec![(Action::Switch, "error_rate_high".into())]
        );
        assert!(e.contains(&Effect::SetSwitched {
            routes: vec![id("qwen/cn/max")],
            on: true
        }));
        assert!(matches!(m.phase(), Phase::Switched { .. }));
        assert_eq!(m.dwell_until(), Some(t(90 + 300)));
    }

    #[test]
    fn a_failing_pre_probe_blocks_the_switch() {
        let mut m = machine();
        m.step(&input(0, State::Critical, State::Normal));
        m.pre_probed(&id("deepseek/cn/v3"), false, "connect refused");
        let e = m.step(&input(1, State::Critical, State::Normal));
        assert_eq!(
            records(&e),
            vec![
                (Action::Blocked, "backup_probe_failed".into()),
                (Action::Blocked, "no_healthy_backup".into())
            ]
        );
        assert_eq!(m.phase(), &Phase::Primary);
        // Nothing again until the retry, and the same cause is not recorded twice.
        assert!(m
            .step(&input(30, State::Critical, State::Normal))
            .is_empty());
        assert!(m
            .step(&input(61, State::Critical, State::Normal))
            .is_empty());
        // Once the spell ends the backup may be tried again.
        m.step(&input(100, State::Normal, State::Normal));
        assert_eq!(
            m.step(&input(101, State::Critical, State::Normal)),
            vec![Effect::PreProbe(id("deepseek/cn/v3"))]
        );
    }

    #[test]
    fn an_unhealthy_backup_or_no_budget_blocks() {
        let mut m = machine();
        let e = m.step(&input(0, State::Critical, State::Degraded));
        assert_eq!(
            records(&e),
            vec![(Action::Blocked, "no_healthy_backup".into())]
        );
        let mut m = machine();
        m.step(&input(0, State::Critical, State::Normal));
        m.pre_probed(&id("deepseek/cn/v3"), true, "ok");
        let mut i = input(0, State::Critical, State::Normal);
        i.budget_allows = false;
        assert_eq!(
            records(&m.step(&i)),
            vec![(Action::Blocked, "budget".into())]
        );
        assert_eq!(m.phase(), &Phase::Primary);
    }

    /// Switched at 0, primary normal from `healthy_from`: the canary's steps.
    #[test]
    fn canary_returns_in_stages_after_the_wait() {
        let mut m = machine();
        switch_at(&mut m, 0);
        let mut now = 1;
        // Critical for 20 minutes, then normal.
        while now < 1200 {
            assert!(m
                .step(&input(now, State::Critical, State::Normal))
                .is_empty());
            now += 30;
        }
        let mut stages = Vec::new();
        while now < 3600 {
            let e = m.step(&input(now, State::Normal, State::Normal));
            for e in e {
                if let Effect::Record(r) = e {
                    stages.push((now, r.action, r.ratio));
                }
            }
            now += 30;
        }
        // return_after 30 min from the switch (healthy since 20 min already ≥ 5 min); steps
        // every 30 s from 1 s.
        assert_eq!(
            stages,
            vec![
                (1801, Action::CanaryStage, Some(0.05)),
                (1921, Action::CanaryStage, Some(0.25)),
                (2041, Action::CanaryStage, Some(1.0)),
                (2161, Action::Returned, Some(1.0)),
            ]
        );
        assert_eq!(m.phase(), &Phase::Primary);
    }

    #[test]
    fn the_return_waits_for_an_unbroken_healthy_spell() {
        let mut m = machine();
        switch_at(&mut m, 0);
        // Normal from 1700 s: at 1800 only 100 s healthy; a WARNING at 1850 restarts it.
        for now in (1700..1850).step_by(10) {
            assert!(m.step(&input(now, State::Normal, State::Normal)).is_empty());
        }
        assert!(m
            .step(&input(1850, State::Warning, State::Normal))
            .is_empty());
        let mut first = None;
        for now in (1860..2400).step_by(10) {
            if !m.step(&input(now, State::Normal, State::Normal)).is_empty() {
                first = Some(now);
                break;
            }
        }
        assert_eq!(first, Some(1860 + 300));
    }

    #[test]
    fn a_canary_failure_aborts_and_restarts_the_wait() {
        let mut m = machine();
        switch_at(&mut m, 0);
        for now in (1500..=1800).step_by(10) {
            m.step(&input(now, State::Normal, State::Normal));
        }
        assert!(matches!(m.phase(), Phase::Canary { stage: 0, .. }));
        m.step(&input(1920, State::Normal, State::Normal));
        assert!(matches!(m.phase(), Phase::Canary { stage: 1, .. }));
        let e = m.step(&input(1950, State::Warning, State::Normal));
        assert_eq!(records(&e), vec![(Action::Abort, "canary_failed".into())]);
        assert!(e.contains(&Effect::Override(Some(SwitchOverride {
            backup: id("deepseek/cn/v3"),
            primary_share: 0
        }))));
        // The wait restarts from the abort: no canary before 1950 + 30 min.
        let mut next = None;
        for now in (1960..6000).step_by(10) {
            if !m.step(&input(now, State::Normal, State::Normal)).is_empty() {
                next = Some(now);
                break;
            }
        }
        assert_eq!(next, Some(1950 + 1800));
    }

    #[test]
    fn dwell_and_the_hourly_cap_hold() {
        let cfg = SwitchConfig {
            return_after: Duration::from_secs(60),
            return_healthy_for: Duration::from_secs(30),
            canary: vec![1.0],
            canary_stage: Duration::from_secs(10),
            ..SwitchConfig::default()
        };
        let mut m = Machine::new("chat", vec![id("qwen/cn/max")], cfg);
        let mut switched_at = Vec::new();
        let mut blocked = Vec::new();
        // The primary flaps: CRITICAL for 2 min, NORMAL for 3 min, for 2 hours.
        for now in (0..7200).step_by(5) {
            let state = if now % 300 < 120 {
                State::Critical
            } else {
                State::Normal
            };
            let e = m.step(&input(now, state, State::Normal));
            if e.contains(&Effect::PreProbe(id("deepseek/cn/v3"))) {
                m.pre_probed(&id("deepseek/cn/v3"), true, "ok");
                for e in m.step(&input(now, state, State::Normal)) {
                    if let Effect::Record(r) = e {
                        if r.action == Action::Switch {
                            switched_at.push(now);
                        }
                    }
                }
            }
            for (a, why) in records(&e) {
                if a == Action::Blocked {
                    blocked.push((now, why));
                }
            }
        }
        // Dwell: never two switches (or a return and a switch) closer than min_dwell.
        for w in switched_at.windows(2) {
            assert!(w[1] - w[0] >= 300, "{switched_at:?}");
        }
        // Cap: never more than 3 in any hour.
        for (i, s) in switched_at.iter().enumerate() {
            let in_hour = switched_at[i..].iter().filter(|x| **x - s < 3600).count();
            assert!(in_hour <= 3, "{switched_at:?}");
        }
        assert!(blocked.iter().any(|(_, w)| w == "max_switches_per_hour"));
        assert!(blocked.iter().any(|(_, w)| w == "min_dwell"));
    }

    #[test]
    fn machines_only_for_models_with_backups() {
        let mut a = crate::extra_cost::tests::route("a/x/m", Tier::Primary, 1.0, 1.0);
        a.serves = "one".into();
        let mut b = crate::extra_cost::tests::route("b/x/m", Tier::Primary, 1.0, 1.0);
        b.serves = "two".into();
        let mut c = crate::extra_cost::tests::route("c/x/m", Tier::Backup, 1.0, 1.0);
        c.serves = "two".into();
        let ms = machines(&[a, b, c], &SwitchConfig::default());
        assert_eq!(ms.len(), 1);
        assert_eq!(ms[0].serves(), "two");
    }
}
