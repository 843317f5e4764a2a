//! Detection per route × vantage, for the routes a `[[vantage]]` probes besides this monitor.
//!
//! The [`Board`] keeps, for each such route, one state machine ([`RouteHealth`]) per vantage
//! that probes it — the monitor's own (judged against the route's usual baseline) and each
//! agent's (against that vantage's own baseline: a far vantage is slower by nature) — and
//! the freshness of every agent. The route's published state is then the quorum of the fresh
//! vantages ([`super::quorum`]); the shell moves the route there with
//! [`Detector::follow`]. Routes no `[[vantage]]` names are not on the board: one box judges
//! them exactly as before.
//!
//! A vantage joins a route's vote once its own machine has judged the route (left `UNKNOWN`)
//! and stays in it until it goes stale; before that it has no opinion (see [`super::quorum`]).
//! Each route's [`quorum::Memory`] moves it with the single-vantage machine's hysteresis.
//!
//! An agent silent for its `stale_after` (counted from the later of its last push and the
//! service start) is stale: it leaves every quorum until it pushes again, and the change is
//! reported once as a `vantage_stale` finding. Pure apart from the clock values passed in.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::findings::{Finding, FindingKind};
use super::quorum::{self, Hysteresis, Memory, Verdict, Vote};
use super::{Baseline, Detector, Reason, RouteHealth, State};
use crate::config::Config;
use crate::outcome::ProbeOutcome;
use crate::route::RouteId;

/// One vantage's view of one route, as `/api/v1/status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VantageStatus {
    pub state: State,
    pub since: DateTime<Utc>,
    pub reason: Option<Reason>,
    /// The latest outcome from there (for an agent: its latest push of any route).
    pub last_seen: Option<DateTime<Utc>>,
    pub stale: bool,
    /// Median total latency of its successful probes in the baseline's current bucket.
    pub p50_ms: Option<f64>,
}

/// Every multi-vantage route's vantages, published on a `watch` channel.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VantageView {
    pub routes: HashMap<RouteId, BTreeMap<String, VantageStatus>>,
}

impl VantageView {
    pub fn route(&self, id: &RouteId) -> Option<&BTreeMap<String, VantageStatus>> {
        self.routes.get(id)
    }
}

/// The receiving end of the published [`VantageView`].
pub type VantageRx = tokio::sync::watch::Receiver<Arc<VantageView>>;

/// What ingest needs of detection for agents: where their outcomes go, and what it judged.
#[derive(Debug, Clone)]
pub struct VantageLink {
    pub inputs: tokio::sync::mpsc::Sender<crate::vantage::VantageOutcome>,
    pub view: VantageRx,
}

/// An agent's freshness.
#[derive(Debug, Clone)]
struct Agent {
    id: String,
    stale_after: Duration,
    last_seen: Option<DateTime<Utc>>,
    stale: bool,
    routes: Vec<RouteId>,
}

struct Seat {
    agent: usize,
    health: RouteHealth,
    baseline: Baseline,
    /// Its machine has left `UNKNOWN` since the start: a member of the route's vote.
    judged: bool,
}

struct Judged {
    /// The monitor's own vantage's machine (its baseline is the shell's route baseline).
    local: RouteHealth,
    local_judged: bool,
    seats: Vec<Seat>,
    /// The quorum state last applied to the route, and the run toward another.
    memory: Memory,
    /// The vantages failing alone, as last reported.
    alone: Vec<String>,
}

/// See the module docs.
pub struct Board {
    local_id: String,
    min_vantages: u32,
    hysteresis: Hysteresis,
    started: DateTime<Utc>,
    agents: Vec<Agent>,
    routes: HashMap<RouteId, Judged>,
}

impl Board {
    /// The board for `config`'s multi-vantage routes; `baselines` holds each (route, agent)
    /// baseline rebuilt from the store (missing ones start empty).
    pub fn new(
        config: &Config,
        detector: &Detector,
        mut baselines: HashMap<(RouteId, String), Baseline>,
        now: DateTime<Utc>,
    ) -> Self {
        let ids: Vec<RouteId> = config.routes().into_iter().map(|r| r.id).collect();
        let agents: Vec<Agent> = config
            .vantages
            .iter()
            .map(|v| Agent {
                id: v.id.clone(),
                stale_after: v.stale_after,
                last_seen: None,
                stale: false,
                routes: ids.iter().filter(|r| v.assigned(r)).cloned().collect(),
            })
            .collect();
        let mut routes = HashMap::new();
        for id in &ids {
            let seats: Vec<Seat> = agents
                .iter()
                .enumerate()
                .filter(|(_, a)| a.routes.contains(id))
                .map(|(i, a)| Seat {
                    agent: i,
                    health: detector.route(id.clone(), now),
                    baseline: baselines
                        .remove(&(id.clone(), a.id.clone()))
                        .unwrap_or_else(|| Baseline::new(id.clone(), detector.config())),
                    judged: false,
                })
                .collect();
            if !seats.is_empty() {
                routes.insert(
                    id.clone(),
                    Judged {
                        local: detector.route(id.clone(), now),
                        local_judged: false,
                        seats,
                        memory: Memory::new(State::Unknown),
                        alone: Vec::new(),
                    },
                );
            }
        }
        Self {
            local_id: config.server.vantage.clone(),
            min_vantages: config.quorum.min_vantages,
            hysteresis: Hysteresis {
                degraded_after: detector.config().degraded_after,
                recover_after: detector.config().recover_after,
            },
            started: now,
            agents,
            routes,
        }
    }

    /// After a start: `route` is in `state` (restored from the store) until its vantages
    /// move it.
    pub fn resume(&mut self, route: &RouteId, state: State) {
        if let Some(j) = self.routes.get_mut(route) {
            j.memory = Memory::new(state);
        }
    }

    /// No route is judged by more than this monitor.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Every remote vantage's baseline with the vantage's id (for saving them).
    pub fn baselines_mut(&mut self) -> impl Iterator<Item = (&str, &mut Baseline)> {
        let agents = &self.agents;
        self.routes.values_mut().flat_map(move |j| {
            j.seats
                .iter_mut()
                .map(move |s| (agents[s.agent].id.as_str(), &mut s.baseline))
        })
    }

    /// Is `route` judged by its vantages' quorum?
    pub fn covers(&self, route: &RouteId) -> bool {
        self.routes.contains_key(route)
    }

    /// The monitor's own vantage's machine of a covered route.
    pub fn local_mut(&mut self, route: &RouteId) -> Option<&mut RouteHealth> {
        self.routes.get_mut(route).map(|j| &mut j.local)
    }

    /// After the monitor's own vantage judged an outcome of `route`: it joins the vote once
    /// its machine left `UNKNOWN`.
    pub fn local_judged(&mut self, route: &RouteId) {
        if let Some(j) = self.routes.get_mut(route) {
            j.local_judged |= j.local.state() != State::Unknown;
        }
    }

    /// One outcome measured at `vantage`. Answers whether a covered route and an assigned
    /// vantage took it, and whether the agent was stale until now.
    pub fn ingest_remote(
        &mut self,
        detector: &Detector,
        vantage: &str,
        o: &ProbeOutcome,
        now: DateTime<Utc>,
    ) -> (bool, bool) {
        let Some(a) = self.agents.iter().position(|a| a.id == vantage) else {
            return (false, false);
        };
        self.agents[a].last_seen = Some(now);
        let fresh = std::mem::replace(&mut self.agents[a].stale, false);
        let Some(seat) = self
            .routes
            .get_mut(&o.route)
            .and_then(|j| j.seats.iter_mut().find(|s| s.agent == a))
        else {
            return (false, fresh);
        };
        // Transitions of one vantage are its own view, not the route's: they are shown, not
        // stored as the route's history.
        let _ = detector.ingest(&mut seat.health, &mut seat.baseline, o, now);
        seat.judged |= seat.health.state() != State::Unknown;
        (true, fresh)
    }

    /// The 1-second evaluation: every vantage machine ticks, agents' freshness is updated.
    /// Answers whether an agent just became stale.
    pub fn tick(&mut self, detector: &Detector, now: DateTime<Utc>) -> bool {
        for j in self.routes.values_mut() {
            let _ = detector.tick(&mut j.local, now);
            j.local_judged |= j.local.state() != State::Unknown;
            for s in &mut j.seats {
                let _ = detector.tick(&mut s.health, now);
                s.judged |= s.health.state() != State::Unknown;
            }
        }
        let mut changed = false;
        let started = self.started;
        for a in &mut self.agents {
            let from = a.last_seen.map_or(started, |t| t.max(started));
            let silent = (now - from).to_std().unwrap_or_default();
            if !a.stale && silent >= a.stale_after {
                a.stale = true;
                changed = true;
            }
        }
        changed
    }

    fn stale_finding(&self, i: usize, now: DateTime<Utc>) -> Finding {
        let a = &self.agents[i];
        let seen = match a.last_seen {
            Some(t) => format!("last push {} s ago", (now - t).num_seconds().max(0)),
            None => "no push since the monitor started".to_owned(),
        };
        Finding {
            kind: FindingKind::VantageStale,
            routes: a.routes.clone(),
            providers: vec![a.id.clone()],
            code: "vantage_stale".into(),
            text: format!(
                "vantage {} is silent ({seen}; stale after {} s): it leaves the quorum of {} routes until it pushes again",
                a.id,
                a.stale_after.as_secs(),
                a.routes.len()
            ),
        }
    }

    /// The quorum of `route`'s fresh vantages.
    pub fn verdict(&self, route: &RouteId) -> Option<Verdict> {
        let j = self.routes.get(route)?;
        let mut votes = vec![Vote {
            vantage: &self.local_id,
            state: j.local.state(),
            reason: j.local.reason(),
            judged: j.local_judged,
            mode: j.local.failure_mode(),
        }];
        for s in &j.seats {
            let a = &self.agents[s.agent];
            if !a.stale {
                votes.push(Vote {
                    vantage: &a.id,
                    state: s.health.state(),
                    reason: s.health.reason(),
                    judged: s.judged,
                    mode: s.health.failure_mode(),
                });
            }
        }
        Some(quorum::judge(&votes, self.min_vantages, j.memory.applied()))
    }

    /// Records `v` as `route`'s latest verdict (`report`: a vantage reported since the last
    /// evaluation): answers the verdict to move the route to, when its memory moves it now
    /// (never back to UNKNOWN), and whether the vantages failing alone changed.
    pub fn note(
        &mut self,
        route: &RouteId,
        v: &Verdict,
        report: bool,
        now: DateTime<Utc>,
    ) -> (Option<Verdict>, bool) {
        let Some(j) = self.routes.get_mut(route) else {
            return (None, false);
        };
        let alone_changed = j.alone != v.local;
        j.alone.clone_from(&v.local);
        (
            j.memory.step(v, report, self.hysteresis, now),
            alone_changed,
        )
    }

    /// The state the quorum last moved `route` to.
    pub fn applied(&self, route: &RouteId) -> Option<State> {
        self.routes.get(route).map(|j| j.memory.applied())
    }

    pub fn min_vantages(&self) -> u32 {
        self.min_vantages
    }

    /// The `vantage_stale` findings (one per stale agent) and the `vantage_local` ones
    /// (routes where vantages fail alone).
    pub fn findings(&self, now: DateTime<Utc>) -> Vec<Finding> {
        let mut out: Vec<Finding> = (0..self.agents.len())
            .filter(|i| self.agents[*i].stale)
            .map(|i| self.stale_finding(i, now))
            .collect();
        let mut ids: Vec<&RouteId> = self.routes.keys().collect();
        ids.sort();
        out.extend(ids.into_iter().filter_map(|id| {
            let v = self.verdict(id)?;
            (!v.local.is_empty()).then(|| Finding {
                kind: FindingKind::VantageLocal,
                routes: vec![id.clone()],
                text: quorum::local_text(&v.local, id.as_str()),
                providers: v.local,
                code: "vantage_local".into(),
            })
        }));
        out
    }

    /// Every covered route's vantages as shown; `local_baseline` gives the monitor's own
    /// baseline of a route.
    pub fn view<'a>(
        &self,
        now: DateTime<Utc>,
        local_baseline: impl Fn(&RouteId) -> Option<&'a Baseline>,
    ) -> VantageView {
        let p50 = |b: Option<&Baseline>| b.and_then(|b| b.snapshot(now)).map(|s| s.p50_ms);
        let mut routes = HashMap::with_capacity(self.routes.len());
        for (id, j) in &self.routes {
            let mut m = BTreeMap::new();
            m.insert(
                self.local_id.clone(),
                VantageStatus {
                    state: j.local.state(),
                    since: j.local.since(),
                    reason: j.local.reason().cloned(),
                    last_seen: j.local.last_probe().0,
                    stale: false,
                    p50_ms: p50(local_baseline(id)),
                },
            );
            for s in &j.seats {
                let a = &self.agents[s.agent];
                m.insert(
                    a.id.clone(),
                    VantageStatus {
                        state: s.health.state(),
                        since: s.health.since(),
                        reason: s.health.reason().cloned(),
                        last_seen: a.last_seen,
                        stale: a.stale,
                        p50_ms: p50(Some(&s.baseline)),
                    },
                );
            }
            routes.insert(id.clone(), m);
        }
        VantageView { routes }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::outcome::{OutcomeKind, ProbeError};

    fn config() -> Config {
        Config::parse(
            r#"
[[provider]]
id = "qwen"
kind = "openai"
  [[provider.region]]
  id = "cn"
  base_url = "http://127.0.0.1:1/v1"
[[route]]
provider = "qwen"
region = "cn"
model = "m"
serves = "chat"
[[route]]
provider = "qwen"
region = "cn"
model = "solo"
serves = "chat"
[detection]
min_samples = 2
degraded_after = 2
[[vantage]]
id = "bj"
routes = ["qwen/cn/m"]
stale_after = "10s"
[[vantage]]
id = "sh"
routes = ["qwen/cn/m"]
stale_after = "10s"
"#,
            "t.toml",
        )
        .unwrap()
        .config
    }

    fn probe(route: &RouteId, at: DateTime<Utc>, ok: bool) -> ProbeOutcome {
        ProbeOutcome {
            route: route.clone(),
            kind: OutcomeKind::Probe,
            started_at: at,
            success: ok,
            attributed_to: None,
            verified: ok.then_some(true),
            ttfb_ms: Some(10.0),
            ttft_ms: Some(20.0),
            total_ms: 50.0,
            output_tokens: Some(3),
            tokens_estimated: false,
            tokens_per_second: None,
            model_reported: None,
            system_fingerprint: None,
            http_status: Some(if ok { 200 } else { 503 }),
            error: (!ok).then(|| ProbeError::Http {
                status: 503,
                message: "overloaded".into(),
            }),
            answer: ok.then(|| "PROBE_OK".into()),
            first_answer_ms: Some(20.0),
            max_tokens_exhausted: false,
            ratelimit: None,
        }
    }

    #[test]
    fn one_agent_failing_alone_is_local_and_a_silent_one_goes_stale_once() {
        let c = config();
        let d = Detector::new(&c.detection);
        let t0 = Utc.with_ymd_and_hms(2026, 3, 2, 10, 0, 0).unwrap();
        let mut board = Board::new(&c, &d, HashMap::new(), t0);
        let m = RouteId::new("qwen", "cn", "m");
        assert!(board.covers(&m));
        assert!(!board.covers(&RouteId::new("qwen", "cn", "solo")));
        let mut local = Baseline::new(m.clone(), d.config());
        for s in 0..3 {
            let at = t0 + chrono::Duration::seconds(s);
            let o = probe(&m, at, true);
            let h = board.local_mut(&m).unwrap();
            let _ = d.ingest(h, &mut local, &o, at);
            board.local_judged(&m);
            assert_eq!(board.ingest_remote(&d, "bj", &o, at), (true, false));
            assert_eq!(board.ingest_remote(&d, "sh", &o, at), (true, false));
        }
        assert_eq!(board.verdict(&m).unwrap().state, State::Normal);
        for s in 3..6 {
            let at = t0 + chrono::Duration::seconds(s);
            board.ingest_remote(&d, "bj", &probe(&m, at, false), at);
            board.ingest_remote(&d, "sh", &probe(&m, at, true), at);
        }
        let v = board.verdict(&m).unwrap();
        assert_eq!(v.state, State::Normal);
        assert_eq!(v.local, ["bj"]);
        let f = board.findings(t0);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, FindingKind::VantageLocal);
        let (to, alone) = board.note(&m, &v, true, t0);
        assert_eq!((to.map(|v| v.state), alone), (Some(State::Normal), true));
        assert!(!board.note(&m, &v, true, t0).1);

        // sh goes silent: stale once, out of the quorum (hz and bj are left: still NORMAL,
        // bj failing alone).
        let later = t0 + chrono::Duration::seconds(16);
        board.ingest_remote(&d, "bj", &probe(&m, later, false), later);
        assert!(board.tick(&d, later));
        assert!(!board.tick(&d, later + chrono::Duration::seconds(1)));
        let v = board.verdict(&m).unwrap();
        assert_eq!((v.state, v.agreeing.len()), (State::Normal, 2));
        let stale: Vec<Finding> = board
            .findings(later)
            .into_iter()
            .filter(|f| f.kind == FindingKind::VantageStale)
            .collect();
        assert_eq!(stale.len(), 1);
        assert_eq!(stale[0].providers, ["sh"]);
        let view = board.view(later, |_| None);
        assert!(view.route(&m).unwrap()["sh"].stale);
        assert!(!view.route(&m).unwrap()["bj"].stale);
        // It pushes again: fresh.
        assert_eq!(
            board.ingest_remote(&d, "sh", &probe(&m, later, true), later),
            (true, true)
        );
        assert!(board
            .findings(later)
            .iter()
            .all(|f| f.kind != FindingKind::VantageStale));
        // An agent pushing a route it does not probe is not judged.
        assert_eq!(
            board.ingest_remote(
                &d,
                "bj",
                &probe(&RouteId::new("qwen", "cn", "solo"), later, true),
                later
            ),
            (false, false)
        );
    }
}
