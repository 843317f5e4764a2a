//! Which routes the 1-second evaluation must look at: those an outcome, a command or a
//! finding touched since their last evaluation, and those whose state can change by time
//! alone. A healthy route between two probes is neither, so a monitor of 10,000 quiet routes
//! evaluates the few that moved, not all of them every second.
//!
//! [`due`] is the rule (pure, from the route's state); [`Wheel`] keeps the touched routes and
//! a due-time heap of the settled ones, and hands out, at each tick, the routes to evaluate
//! in route order (the order every route was evaluated in before, so events keep theirs).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::detector::MIN_PASSIVE_TPS;
use super::route_health::RouteHealth;
use crate::state::State;

/// When a route's next evaluation can change something, with no new outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Rules that run on time are live (an incident's clocks, an error rate above its
    /// threshold or failures in the window that may become one as successes age out, passive
    /// tokens/s being gathered): every tick, as always.
    EveryTick,
    /// Nothing changes before this Unix second, when the window's oldest second leaves it
    /// (the success ratio shown moves then).
    At(i64),
    /// Nothing changes until the route is touched (an empty window).
    Never,
}

/// The rule, read right after an evaluation of `h`. A route is settled only when an
/// evaluation without a new outcome provably does nothing to it: judged NORMAL or UNKNOWN (no
/// time rule applies to them), no failure in its window (so no error rate can rise as the
/// window slides), no "error rate high since" clock running, and no passive tokens/s tally
/// complete enough to be judged.
pub fn due(h: &RouteHealth) -> Due {
    let settled = matches!(h.state, State::Normal | State::Unknown)
        && h.rate_high_since.is_none()
        && h.passive_high_since.is_none()
        && h.since_tick.total == 0
        && h.tps_seen < MIN_PASSIVE_TPS
        && h.window.failures_held() == 0;
    if !settled {
        return Due::EveryTick;
    }
    match h.window.next_expiry() {
        Some(at) => Due::At(at),
        None => Due::Never,
    }
}

/// The routes waiting for an evaluation: touched ones (evaluated at the next tick) and
/// settled ones by due second. Memory: one entry per route in each, at most.
#[derive(Debug, Default)]
pub struct Wheel {
    /// Evaluated at the next tick.
    next: Vec<usize>,
    queued: Vec<bool>,
    /// Settled routes by the second they are due; an entry whose second no longer matches
    /// `wake[i]` is stale (the route was touched or rescheduled since) and skipped.
    heap: BinaryHeap<Reverse<(i64, usize)>>,
    wake: Vec<Option<i64>>,
}

impl Wheel {
    /// `routes` routes, every one due at the next tick (nothing is known of them yet).
    pub fn new(routes: usize) -> Self {
        Self {
            next: (0..routes).collect(),
            queued: vec![true; routes],
            heap: BinaryHeap::new(),
            wake: vec![None; routes],
        }
    }

    /// Route `i` changed outside an evaluation: evaluate it at the next tick.
    pub fn touch(&mut self, i: usize) {
        if i >= self.queued.len() {
            return;
        }
        self.wake[i] = None;
        if !self.queued[i] {
            self.queued[i] = true;
            self.next.push(i);
        }
    }

    /// Route `i` was just evaluated and is `due` next.
    pub fn schedule(&mut self, i: usize, due: Due) {
        if i >= self.queued.len() || self.queued[i] {
            return;
        }
        match due {
            Due::EveryTick => self.touch(i),
            Due::At(sec) => {
                self.wake[i] = Some(sec);
                self.heap.push(Reverse((sec, i)));
            }
            Due::Never => self.wake[i] = None,
        }
    }

    /// The routes to evaluate at Unix second `now_sec`, in route order; each leaves the
    /// wheel until [`Wheel::schedule`] or [`Wheel::touch`] puts it back.
    pub fn take(&mut self, now_sec: i64) -> Vec<usize> {
        let mut out = std::mem::take(&mut self.next);
        while let Some(&Reverse((sec, i))) = self.heap.peek() {
            if sec > now_sec {
                break;
            }
            self.heap.pop();
            if self.wake[i] == Some(sec) && !self.queued[i] {
                self.wake[i] = None;
                out.push(i);
            }
        }
        for &i in &out {
            self.queued[i] = false;
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DetectionConfig;
    use crate::health::baseline::Baseline;
    use crate::health::Detector;
    use crate::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
    use crate::route::RouteId;
    use chrono::{DateTime, Duration, Utc};

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_767_225_600, 0).unwrap()
    }

    fn outcome(route: &RouteId, at: DateTime<Utc>, ok: bool) -> ProbeOutcome {
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

    /// What a run of one route looked like, second by second: its transitions and what was
    /// shown of it.
    type Seen = Vec<(i64, String)>;

    /// One route through `seconds` of probes every `every` s, failing in `bad` (seconds from
    /// the start): evaluated every second (`lazy` false) or only when the wheel says so.
    fn run(bad: &dyn Fn(i64) -> bool, every: i64, seconds: i64, lazy: bool) -> (Seen, u64) {
        let cfg = DetectionConfig::default();
        let det = Detector::new(&cfg);
        let id = RouteId::new("p", "r", "m");
        let mut h = det.route(id.clone(), t0());
        let mut b = Baseline::new(id.clone(), det.config());
        let mut wheel = Wheel::new(1);
        let mut seen = Vec::new();
        let mut evaluated = 0u64;
        for s in 0..seconds {
            let now = t0() + Duration::seconds(s) + Duration::milliseconds(300);
            if s % every == 0 {
                let o = outcome(&id, now, !bad(s));
                if let Some(t) = det.ingest(&mut h, &mut b, &o, now) {
                    seen.push((s, format!("{} -> {}", t.from, t.to)));
                }
                wheel.touch(0);
            }
            let tick = now + Duration::milliseconds(400);
            let due = if lazy {
                wheel.take(tick.timestamp()).contains(&0)
            } else {
                true
            };
            if due {
                evaluated += 1;
                if let Some(t) = det.tick(&mut h, tick) {
                    seen.push((s, format!("{} -> {}", t.from, t.to)));
                }
                wheel.schedule(0, super::due(&h));
            }
            let c = h.window().counts(tick, cfg.error_window.as_secs());
            seen.push((s, format!("{}/{} {}", c.failures, c.total, h.state())));
        }
        (seen, evaluated)
    }

    /// The same transitions at the same seconds, and the same counts shown every second,
    /// whether every second evaluates the route or only the seconds the wheel names — through
    /// a healthy stretch, an outage, its recovery and a flapping stretch; the lazy run
    /// evaluates far fewer seconds while the route is healthy.
    #[test]
    fn the_wheel_changes_when_things_happen_not_what_happens() {
        type Failing = Box<dyn Fn(i64) -> bool>;
        let scenarios: Vec<(&str, Failing, i64)> = vec![
            ("healthy", Box::new(|_| false), 30),
            ("outage", Box::new(|s| (600..1500).contains(&s)), 10),
            ("flapping", Box::new(|s| (s / 40) % 3 == 0), 10),
            ("one failure", Box::new(|s| s == 300), 5),
        ];
        for (name, bad, every) in &scenarios {
            let (eager, all) = run(bad.as_ref(), *every, 3600, false);
            let (lazy, some) = run(bad.as_ref(), *every, 3600, true);
            assert_eq!(eager, lazy, "{name}");
            assert!(eager.iter().any(|(_, x)| x.contains("->")) || *name == "healthy");
            assert!(some <= all, "{name}");
            if *name == "healthy" {
                assert!(some * 10 < all, "{name}: {some} of {all} seconds evaluated");
            }
        }
    }

    #[test]
    fn touched_and_due_routes_come_out_once_in_route_order() {
        let mut w = Wheel::new(4);
        assert_eq!(w.take(0), vec![0, 1, 2, 3]);
        w.schedule(3, Due::At(10));
        w.schedule(1, Due::At(5));
        w.schedule(0, Due::Never);
        w.schedule(2, Due::EveryTick);
        assert_eq!(w.take(1), vec![2]);
        w.touch(3);
        w.touch(3);
        assert_eq!(w.take(5), vec![1, 3]);
        // 3's heap entry went stale when it was touched.
        assert_eq!(w.take(10), Vec::<usize>::new());
        w.touch(0);
        assert_eq!(w.take(11), vec![0]);
    }
}
