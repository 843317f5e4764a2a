//! The route's state from its vantages' states: a provider's outage is what several places
//! see; one place failing alone is that place's network.
//!
//! Pure: [`judge`] takes each fresh vantage's state and `[quorum] min_vantages`. The route is
//! as bad as the worst state that at least `min_vantages` vantages share (a vantage in a
//! worse state shares every milder one: DEGRADED counts for WARNING); with fewer fresh
//! vantages than that, the state all of them share. A fresh vantage still `UNKNOWN` (too few
//! samples for a baseline) with no failure in its error window shares no bad state, so one
//! judged vantage cannot carry a bad state past it — the route stays `UNKNOWN`, or NORMAL
//! where a judged vantage says so. An `UNKNOWN` vantage that has failed lately (it fell back
//! to `UNKNOWN` after one success) does not vote. A vantage whose state is DEGRADED or worse
//! while the quorum is milder is *local*: a `vantage_local` finding.

use super::{Reason, State};

/// One vantage's view of a route, as the quorum reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Vote<'a> {
    pub vantage: &'a str,
    pub state: State,
    pub reason: Option<&'a Reason>,
    /// Failures in the vantage's error window: an `UNKNOWN` vantage with some is no witness
    /// that the route works.
    pub failed_lately: bool,
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
}

/// The quorum over `votes` (fresh vantages only; see the module docs).
pub fn judge(votes: &[Vote<'_>], min_vantages: u32) -> Verdict {
    let known: Vec<&Vote<'_>> = votes.iter().filter(|v| v.state != State::Unknown).collect();
    if known.is_empty() {
        return Verdict {
            state: State::Unknown,
            agreeing: votes.iter().map(|v| v.vantage.to_owned()).collect(),
            local: Vec::new(),
            reason: Reason::new("vantages_unknown", "no vantage has judged the route yet"),
        };
    }
    // Every fresh vantage counts toward the quorum, UNKNOWN sorting mildest — but only an
    // UNKNOWN one that has not failed lately.
    let voting: Vec<&Vote<'_>> = (votes.iter())
        .filter(|v| v.state != State::Unknown || !v.failed_lately)
        .collect();
    let mut states: Vec<State> = voting.iter().map(|v| v.state).collect();
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
            agreeing: (voting.iter())
                .filter(|v| v.state == State::Unknown)
                .map(|v| v.vantage.to_owned())
                .collect(),
            local,
            reason: Reason::new(
                "vantages_unknown",
                format!(
                    "{} of {} vantages have judged the route: too few to carry a state",
                    known.len(),
                    voting.len()
                ),
            ),
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
        "{} of {} vantages ({}) see {}",
        agreeing.len(),
        known.len(),
        agreeing.join(", "),
        state.as_str()
    );
    if let Some(r) = lead.filter(|_| state != State::Normal) {
        text.push_str(": ");
        text.push_str(&r.text);
    }
    Verdict {
        state,
        agreeing,
        local,
        reason: Reason::new(&code, text),
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
                failed_lately: false,
            })
            .collect()
    }

    use State::*;

    #[test]
    fn one_failing_vantage_of_three_is_local() {
        let v = judge(&votes(&[("a", Normal), ("b", Critical), ("c", Normal)]), 2);
        assert_eq!(v.state, Normal);
        assert_eq!(v.local, ["b"]);
    }

    #[test]
    fn two_failing_vantages_carry_the_milder_of_their_states() {
        let v = judge(
            &votes(&[("a", Normal), ("b", Critical), ("c", Degraded)]),
            2,
        );
        assert_eq!(v.state, Degraded);
        assert_eq!(v.agreeing, ["b", "c"]);
        assert!(v.local.is_empty());
        let v = judge(
            &votes(&[("a", Critical), ("b", Critical), ("c", Normal)]),
            2,
        );
        assert_eq!(v.state, Critical);
    }

    #[test]
    fn fewer_fresh_vantages_than_the_quorum_need_all_of_them() {
        assert_eq!(judge(&votes(&[("a", Degraded)]), 2).state, Degraded);
        let v = judge(&votes(&[("a", Degraded), ("b", Normal)]), 3);
        assert_eq!(v.state, Normal);
        assert_eq!(v.local, ["a"]);
        assert_eq!(
            judge(&votes(&[("a", Warning), ("b", Degraded)]), 3).state,
            Warning
        );
    }

    #[test]
    fn a_lone_failing_vantage_beside_unjudged_ones_is_local() {
        // The other place has probed without a failure but has no baseline yet: one place
        // failing is not a quorum.
        let v = judge(&votes(&[("a", Unknown), ("b", Degraded)]), 2);
        assert_eq!(v.state, Unknown);
        assert_eq!(v.local, ["b"]);
        assert_eq!(v.reason.code, "vantages_unknown");
        let v = judge(
            &votes(&[("a", Unknown), ("b", Critical), ("c", Unknown)]),
            2,
        );
        assert_eq!(v.state, Unknown);
        assert_eq!(v.local, ["b"]);
        // Two failing places still carry it, whatever the third has judged.
        let v = judge(
            &votes(&[("a", Unknown), ("b", Critical), ("c", Degraded)]),
            2,
        );
        assert_eq!(v.state, Degraded);
        assert!(v.local.is_empty());
        // A place that fell back to UNKNOWN after failing is no witness: it does not vote.
        let mut v = votes(&[("a", Unknown), ("b", Degraded)]);
        v[0].failed_lately = true;
        let v = judge(&v, 2);
        assert_eq!(v.state, Degraded);
        assert!(v.local.is_empty());
        // With a quorum of one, one place is enough.
        assert_eq!(
            judge(&votes(&[("a", Unknown), ("b", Degraded)]), 1).state,
            Degraded
        );
    }

    #[test]
    fn unknown_vantages_do_not_vote_until_none_knows() {
        assert_eq!(
            judge(&votes(&[("a", Normal), ("b", Unknown)]), 2).state,
            Normal
        );
        assert_eq!(
            judge(&votes(&[("a", Unknown), ("b", Unknown)]), 2).state,
            Unknown
        );
        assert_eq!(judge(&[], 2).state, Unknown);
        // A single vote with a quorum of one is that vote.
        assert_eq!(
            judge(&votes(&[("a", Warning), ("b", Normal)]), 1).state,
            Warning
        );
    }

    #[test]
    fn the_local_sentence_names_the_vantage() {
        assert_eq!(
            local_text(&["cn-beijing".into()], "qwen/cn/m"),
            "cn-beijing sees qwen/cn/m failing; other vantages do not: likely that vantage's network"
        );
    }
}
