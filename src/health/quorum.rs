//! The route's state from its vantages' states: a provider's outage is what several places
//! see; one place failing alone is that place's network.
//!
//! Two parts, both pure. [`judge`] reads one evaluation: each fresh vantage's state and
//! `[quorum] min_vantages`. The route is as bad as the worst state that at least
//! `min_vantages` vantages share (a vantage in a worse state shares every milder one:
//! DEGRADED counts for WARNING); with fewer fresh vantages than that, the state all of them
//! share. A vantage that has not judged the route since the monitor started (its own machine
//! never left `UNKNOWN`) has *no opinion yet*: its vote is the route's current state, so it
//! neither heals nor worsens the route. A vantage that has judged stays a member of the vote
//! until it goes stale, whatever its next sample says: one whose own machine recovered to
//! `UNKNOWN` (no baseline yet) votes "no trouble seen", the mildest vote. One judged vantage
//! cannot carry a bad state past a member that sees no trouble — the route stays `UNKNOWN`,
//! or NORMAL where a judged vantage says so. A vantage whose state is DEGRADED or worse while
//! the quorum is milder is *local*: a `vantage_local` finding.
//!
//! [`Memory`] gives the route the single-vantage machine's hysteresis over those verdicts:
//! the route moves to a worse state only when the quorum held it for `degraded_after`
//! consecutive evaluations that brought a vantage's report (at once when the vantages carry
//! CRITICAL by the error-rate rule, which held for `critical_after` already), and to a better
//! one only when every verdict for `recover_after` was better, ending with a vantage's report.
//! Evaluations of the 1-second tick keep or break a run but never complete one.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{FailureMode, Reason, State};

/// One vantage's view of a route, as the quorum reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Vote<'a> {
    pub vantage: &'a str,
    pub state: State,
    pub reason: Option<&'a Reason>,
    /// Has this vantage judged the route since the monitor started? Without, it has no
    /// opinion yet: its vote is the route's current state.
    pub judged: bool,
    /// The failure mode its own machine sees, if any.
    pub mode: Option<FailureMode>,
}

/// What the quorum decided for one route.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub state: State,
    /// The vantages at or worse than `state` (those who carried it), in vote order.
    pub agreeing: Vec<String>,
    /// Vantages DEGRADED or worse on their own while the route is milder.
    pub local: Vec<String>,
    /// Why, for the route's transition.
    pub reason: Reason,
    /// How the route fails, as the vantages carrying the state see it.
    pub failure_mode: Option<FailureMode>,
}

/// The quorum over `votes` (fresh vantages only) for a route now in `current` (see the
/// module docs).
pub fn judge(votes: &[Vote<'_>], min_vantages: u32, current: State) -> Verdict {
    let known: Vec<&Vote<'_>> = (votes.iter())
        .filter(|v| v.judged && v.state != State::Unknown)
        .collect();
    if known.is_empty() {
        return Verdict {
            state: State::Unknown,
            agreeing: votes.iter().map(|v| v.vantage.to_owned()).collect(),
            local: Vec::new(),
            reason: Reason::new("vantages_unknown", "no vantage has judged the route yet"),
            failure_mode: None,
        };
    }
    // Every fresh vantage counts toward the quorum, UNKNOWN sorting mildest; one with no
    // opinion yet votes for the state the route is in.
    let mut states: Vec<State> = (votes.iter())
        .map(|v| if v.judged { v.state } else { current })
        .collect();
    states.sort_unstable_by(|a, b| b.cmp(a));
    let k = (min_vantages.max(1) as usize).min(states.len());
    let mut state = states[k - 1];
    if state == State::Unknown && known.iter().any(|v| v.state == State::Normal) {
        state = State::Normal;
    }
    if state == State::Unknown {
        // Too few judgements to carry any state: a lone bad one is local (below).
        let local: Vec<String> = (known.iter())
            .filter(|v| v.state >= State::Degraded)
            .map(|v| v.vantage.to_owned())
            .collect();
        return Verdict {
            state,
            agreeing: (votes.iter())
                .filter(|v| v.state == State::Unknown)
                .map(|v| v.vantage.to_owned())
                .collect(),
            local,
            reason: Reason::new(
                "vantages_unknown",
                format!(
                    "{} of {} vantages have judged the route: too few to carry a state",
                    known.len(),
                    votes.len()
                ),
            ),
            failure_mode: None,
        };
    }
    let agreeing: Vec<String> = known
        .iter()
        .filter(|v| v.state >= state)
        .map(|v| v.vantage.to_owned())
        .collect();
    let local: Vec<String> = if state < State::Degraded {
        known
            .iter()
            .filter(|v| v.state >= State::Degraded)
            .map(|v| v.vantage.to_owned())
            .collect()
    } else {
        Vec::new()
    };
    // The reason of the mildest vantage that still carries the state: what they all agree on.
    let lead = known
        .iter()
        .filter(|v| v.state == state)
        .find_map(|v| v.reason);
    let code = match (state, lead) {
        (State::Normal, _) => "quorum_normal".to_owned(),
        (_, Some(r)) => r.code.clone(),
        (_, None) => "quorum".to_owned(),
    };
    let mut text = format!(
        "{} of {} {} ({}) {} {}",
        agreeing.len(),
        known.len(),
        if known.len() == 1 {
            "vantage"
        } else {
            "vantages"
        },
        agreeing.join(", "),
        if agreeing.len() == 1 { "sees" } else { "see" },
        state.as_str()
    );
    let failure_mode = (state > State::Normal)
        .then(|| {
            (known.iter())
                .filter(|v| v.state >= state)
                .find_map(|v| v.mode)
        })
        .flatten();
    if let Some(r) = lead.filter(|_| state != State::Normal) {
        text.push_str(": ");
        text.push_str(&r.text);
    }
    Verdict {
        state,
        agreeing,
        local,
        reason: Reason::new(&code, text),
        failure_mode,
    }
}

/// The hysteresis the route's quorum moves with (the single-vantage machine's own settings).
#[derive(Debug, Clone, Copy)]
pub struct Hysteresis {
    pub degraded_after: u32,
    pub recover_after: Duration,
}

/// A run of verdicts on one side of the route's state, and the state it held throughout
/// (the mildest of a worse run, the worst of a better one).
#[derive(Debug, Clone)]
struct Run {
    worse: bool,
    /// Evaluations with a vantage's report in it.
    reports: u32,
    since: DateTime<Utc>,
    held: Verdict,
}

/// A route's quorum with memory: the state last applied and the run toward another one.
#[derive(Debug, Clone)]
pub struct Memory {
    applied: State,
    run: Option<Run>,
}

impl Memory {
    /// A route now in `applied` (restored from the store on a start, `UNKNOWN` when new).
    pub fn new(applied: State) -> Self {
        Self { applied, run: None }
    }

    /// The state the quorum last moved the route to.
    pub fn applied(&self) -> State {
        self.applied
    }

    /// One evaluation's verdict; `report` says whether a vantage reported since the last
    /// one. Answers the verdict to move the route to, if it moves now (see the module docs).
    pub fn step(
        &mut self,
        v: &Verdict,
        report: bool,
        h: Hysteresis,
        now: DateTime<Utc>,
    ) -> Option<Verdict> {
        // No judgement yet: no opinion, neither way.
        if v.state == State::Unknown {
            return None;
        }
        if v.state == self.applied {
            self.run = None;
            return None;
        }
        // The first judgement of a new route is its baseline, not a change.
        if self.applied == State::Unknown && v.state == State::Normal {
            return Some(self.apply(v));
        }
        let worse = v.state > self.applied;
        if self.run.as_ref().is_some_and(|r| r.worse != worse) {
            self.run = None;
        }
        let run = self.run.get_or_insert_with(|| Run {
            worse,
            reports: 0,
            since: now,
            held: v.clone(),
        });
        if (worse && v.state < run.held.state) || (!worse && v.state > run.held.state) {
            run.held = v.clone();
        }
        if report {
            run.reports = run.reports.saturating_add(1);
        }
        let due = if worse {
            // The error-rate rule: the vantages held it for `critical_after` already.
            let by_rate = v.state == State::Critical && v.reason.code == "error_rate_high";
            if by_rate {
                run.held = v.clone();
            }
            by_rate || run.reports >= h.degraded_after.max(1)
        } else {
            report
                && run.reports > 0
                && (now - run.since).to_std().unwrap_or_default() >= h.recover_after
        };
        if !due {
            return None;
        }
        let held = run.held.clone();
        Some(self.apply(&held))
    }

    fn apply(&mut self, v: &Verdict) -> Verdict {
        self.applied = v.state;
        self.run = None;
        v.clone()
    }
}

/// The `vantage_local` sentence: "cn-beijing sees qwen/cn/m failing; other vantages do not:
/// likely that vantage's network".
pub fn local_text(vantages: &[String], route: &str) -> String {
    let (who, that) = if vantages.len() == 1 {
        (format!("{} sees", vantages[0]), "that vantage's")
    } else {
        (format!("{} see", vantages.join(", ")), "those vantages'")
    };
    format!("{who} {route} failing; other vantages do not: likely {that} network")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn votes(states: &[(&'static str, State)]) -> Vec<Vote<'static>> {
        states
            .iter()
            .map(|(v, s)| Vote {
                vantage: v,
                state: *s,
                reason: None,
                judged: true,
                mode: None,
            })
            .collect()
    }

    use State::*;

    /// The quorum of a route not judged yet.
    fn fresh(v: &[Vote<'_>], k: u32) -> Verdict {
        judge(v, k, Unknown)
    }

    #[test]
    fn one_failing_vantage_of_three_is_local() {
        let v = fresh(&votes(&[("a", Normal), ("b", Critical), ("c", Normal)]), 2);
        assert_eq!(v.state, Normal);
        assert_eq!(v.local, ["b"]);
    }

    #[test]
    fn two_failing_vantages_carry_the_milder_of_their_states() {
        let v = fresh(
            &votes(&[("a", Normal), ("b", Critical), ("c", Degraded)]),
            2,
        );
        assert_eq!(v.state, Degraded);
        assert_eq!(v.agreeing, ["b", "c"]);
        assert!(v.local.is_empty());
        let v = fresh(
            &votes(&[("a", Critical), ("b", Critical), ("c", Normal)]),
            2,
        );
        assert_eq!(v.state, Critical);
    }

    #[test]
    fn fewer_fresh_vantages_than_the_quorum_need_all_of_them() {
        assert_eq!(fresh(&votes(&[("a", Degraded)]), 2).state, Degraded);
        let v = fresh(&votes(&[("a", Degraded), ("b", Normal)]), 3);
        assert_eq!(v.state, Normal);
        assert_eq!(v.local, ["a"]);
        assert_eq!(
            fresh(&votes(&[("a", Warning), ("b", Degraded)]), 3).state,
            Warning
        );
    }

    #[test]
    fn a_lone_failing_vantage_beside_unjudged_ones_is_local() {
        // The other place has probed without a failure but has no baseline yet: one place
        // failing is not a quorum.
        let v = fresh(&votes(&[("a", Unknown), ("b", Degraded)]), 2);
        assert_eq!(v.state, Unknown);
        assert_eq!(v.local, ["b"]);
        assert_eq!(v.reason.code, "vantages_unknown");
        let v = fresh(
            &votes(&[("a", Unknown), ("b", Critical), ("c", Unknown)]),
            2,
        );
        assert_eq!(v.state, Unknown);
        assert_eq!(v.local, ["b"]);
        // Two failing places still carry it, whatever the third has judged.
        let v = fresh(
            &votes(&[("a", Unknown), ("b", Critical), ("c", Degraded)]),
            2,
        );
        assert_eq!(v.state, Degraded);
        assert!(v.local.is_empty());
        // A place that judged and recovered without a baseline is a member seeing no trouble:
        // it still blocks a lone failing one.
        let v = fresh(&votes(&[("a", Unknown), ("b", Degraded)]), 2);
        assert_eq!(v.state, Unknown);
        assert_eq!(v.local, ["b"]);
        // With a quorum of one, one place is enough.
        assert_eq!(
            fresh(&votes(&[("a", Unknown), ("b", Degraded)]), 1).state,
            Degraded
        );
    }

    #[test]
    fn unknown_vantages_do_not_vote_until_none_knows() {
        assert_eq!(
            fresh(&votes(&[("a", Normal), ("b", Unknown)]), 2).state,
            Normal
        );
        assert_eq!(
            fresh(&votes(&[("a", Unknown), ("b", Unknown)]), 2).state,
            Unknown
        );
        assert_eq!(fresh(&[], 2).state, Unknown);
        // A single vote with a quorum of one is that vote.
        assert_eq!(
            fresh(&votes(&[("a", Warning), ("b", Normal)]), 1).state,
            Warning
        );
    }

    fn abstaining(mut v: Vec<Vote<'static>>, who: &[usize]) -> Vec<Vote<'static>> {
        for i in who {
            v[*i].judged = false;
            v[*i].state = Unknown;
        }
        v
    }

    #[test]
    fn a_vantage_with_no_opinion_yet_neither_heals_nor_worsens() {
        // Restarted DEGRADED: the monitor's own vantage sees NORMAL, the agents have not
        // reported yet. Their votes keep the route where it is.
        let v = abstaining(
            votes(&[("a", Normal), ("b", Normal), ("c", Normal)]),
            &[1, 2],
        );
        assert_eq!(judge(&v, 2, Degraded).state, Degraded);
        assert_eq!(judge(&v, 1, Degraded).state, Degraded);
        // And a NORMAL route is not worsened by one failing place beside them.
        let v = abstaining(
            votes(&[("a", Critical), ("b", Normal), ("c", Normal)]),
            &[1, 2],
        );
        assert_eq!(judge(&v, 2, Normal).state, Normal);
    }

    fn at(s: i64) -> DateTime<Utc> {
        use chrono::TimeZone;
        Utc.with_ymd_and_hms(2026, 3, 2, 10, 0, 0).unwrap() + chrono::Duration::seconds(s)
    }

    const H: Hysteresis = Hysteresis {
        degraded_after: 3,
        recover_after: Duration::from_secs(60),
    };

    fn verdict(state: State, code: &str) -> Verdict {
        Verdict {
            state,
            agreeing: vec!["a".into(), "b".into()],
            local: Vec::new(),
            reason: Reason::new(code, "x"),
            failure_mode: None,
        }
    }

    #[test]
    fn the_route_moves_worse_on_a_held_quorum_and_better_after_recover_after() {
        let mut m = Memory::new(Unknown);
        assert_eq!(m.step(&verdict(Unknown, "u"), true, H, at(0)), None);
        let n = m.step(&verdict(Normal, "quorum_normal"), true, H, at(1));
        assert_eq!(n.map(|v| v.state), Some(Normal));
        // Two reports of DEGRADED, then one of NORMAL: the run is broken, no move.
        assert_eq!(m.step(&verdict(Degraded, "d"), true, H, at(2)), None);
        assert_eq!(m.step(&verdict(Degraded, "d"), true, H, at(3)), None);
        assert_eq!(m.step(&verdict(Normal, "n"), true, H, at(4)), None);
        // Ticks alone never complete a run.
        for s in 5..20 {
            assert_eq!(m.step(&verdict(Degraded, "d"), false, H, at(s)), None);
        }
        assert_eq!(m.step(&verdict(Degraded, "d"), true, H, at(20)), None);
        assert_eq!(m.step(&verdict(Warning, "w"), true, H, at(21)), None);
        // Three reports in a row worse than NORMAL: the route moves to what held throughout.
        let v = m.step(&verdict(Degraded, "d"), true, H, at(22)).unwrap();
        assert_eq!(v.state, Warning);
        assert_eq!(m.applied(), Warning);
        // The error-rate rule moves at once.
        let v = m.step(&verdict(Critical, "error_rate_high"), false, H, at(23));
        assert_eq!(v.map(|v| v.state), Some(Critical));
        // Better needs recover_after of better verdicts, ended by a report.
        assert_eq!(m.step(&verdict(Normal, "n"), true, H, at(30)), None);
        assert_eq!(m.step(&verdict(Normal, "n"), false, H, at(95)), None);
        assert_eq!(m.step(&verdict(Critical, "c"), true, H, at(96)), None);
        assert_eq!(m.step(&verdict(Normal, "n"), true, H, at(100)), None);
        assert_eq!(m.step(&verdict(Normal, "n"), true, H, at(159)), None);
        let v = m.step(&verdict(Normal, "n"), true, H, at(160)).unwrap();
        assert_eq!(v.state, Normal);
    }

    #[test]
    fn the_local_sentence_names_the_vantage() {
        assert_eq!(
            local_text(&["cn-beijing".into()], "qwen/cn/m"),
            "cn-beijing sees qwen/cn/m failing; other vantages do not: likely that vantage's network"
        );
    }
}
