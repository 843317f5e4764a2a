//! Circuit breakers, one per route (`[proxy.breaker]`), and the retry backoff. Pure: every
//! decision takes an explicit `now` (`tokio::time::Instant`, so tests run on paused time).
//!
//! - **Closed**: requests pass; outcomes accumulate in a sliding `window` (at most
//!   [`MAX_WINDOW_EVENTS`] kept). The breaker opens when, with at least `min_requests` in the
//!   window, failures / requests ≥ `failure_ratio`, or after [`CONSECUTIVE_FAILURES`] failures
//!   in a row (a hard-down upstream trips at once, before `min_requests`).
//! - **Open** for `open_for`: selection puts the route last (tried only when every other
//!   candidate failed, so a model whose every route is open still gets an answer rather than a
//!   refusal). A failure while open (a request let through before it opened, or a last-resort
//!   try) **extends** the open period to `now + open_for` — a second failure
//!   must never shorten or forget a cooldown.
//! - **Half-open** once the period is over: [`HALF_OPEN_TRIALS`] requests are let through.
//!   That many successes close the breaker (and reset `open_for` to the configured value); any
//!   failure opens it again for twice the last period, up to [`MAX_OPEN`]. A trial that never
//!   reports (its client hung up) is granted again after one open period.
//!
//! Client faults (400/413/422, refusals) never reach a breaker: they are [`Verdict::Neutral`],
//! which only frees a half-open trial slot.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use rand::Rng;
use serde::Serialize;
use tokio::time::Instant;

use crate::config::BreakerConfig;
use crate::route::{RouteId, RouteMap};

/// A run of this many failures opens the breaker whatever the ratio.
pub const CONSECUTIVE_FAILURES: u32 = 5;
/// Requests let through while half-open; as many successes close the breaker.
pub const HALF_OPEN_TRIALS: u32 = 2;
/// The open period never grows beyond this.
pub const MAX_OPEN: Duration = Duration::from_secs(600);
/// Outcomes kept per route in the window (the oldest are forgotten first): bounds memory at
/// any request rate.
pub const MAX_WINDOW_EVENTS: usize = 4096;

/// What an attempt's outcome means for its route's breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Success,
    Failure,
    /// The client's fault, or no judgement possible: never counts.
    Neutral,
}

/// The public state of one breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Closed,
    Open {
        until: Instant,
    },
    HalfOpen {
        granted: u32,
        successes: u32,
        since: Instant,
    },
}

/// One route's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: BreakerConfig,
    phase: Phase,
    /// The current open period (doubles on failed half-open trials).
    open_for: Duration,
    window: VecDeque<(Instant, bool)>,
    consecutive: u32,
    /// How often it opened (for the snapshot).
    opened: u64,
}

/// What [`Breaker::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: go ahead.
    Pass,
    /// Half-open: one of the trial requests.
    Trial,
    /// Open (or half-open with its trials out): only as a last resort.
    Refused,
}

impl Breaker {
    pub fn new(cfg: BreakerConfig) -> Self {
        let open_for = cfg.open_for.min(MAX_OPEN);
        Self {
            cfg,
            phase: Phase::Closed,
            open_for,
            window: VecDeque::new(),
            consecutive: 0,
            opened: 0,
        }
    }

    /// The state at `now` (an elapsed open period reads as half-open).
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.phase {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { until } if now < until => BreakerState::Open,
            Phase::Open { .. } | Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Whether a request would be refused now, without taking a trial slot.
    pub fn refuses(&self, now: Instant) -> bool {
        match self.phase {
            Phase::Closed => false,
            Phase::Open { until } => now < until,
            Phase::HalfOpen { granted, since, .. } => {
                granted >= HALF_OPEN_TRIALS && now < since + self.open_for
            }
        }
    }

    /// Admits (or not) one request at `now`; a half-open trial slot is taken when granted.
    pub fn admit(&mut self, now: Instant) -> Admission {
        if let Phase::Open { until } = self.phase {
            if now < until {
                return Admission::Refused;
            }
            self.phase = Phase::HalfOpen {
                granted: 0,
                successes: 0,
                since: now,
            };
        }
        match &mut self.phase {
            Phase::Closed => Admission::Pass,
            Phase::Open { .. } => Admission::Refused,
            Phase::HalfOpen {
                granted,
                successes,
                since,
            } => {
                // Trials whose clients vanished are granted again after one open period.
                if *granted >= HALF_OPEN_TRIALS && now >= *since + self.open_for {
                    *granted = *successes;
                    *since = now;
                }
                if *granted < HALF_OPEN_TRIALS {
                    *granted += 1;
                    Admission::Trial
                } else {
                    Admission::Refused
                }
            }
        }
    }

    /// Records one attempt's verdict at `now`.
    pub fn record(&mut self, now: Instant, verdict: Verdict) {
        match (&mut self.phase, verdict) {
            (Phase::HalfOpen { granted, .. }, Verdict::Neutral) => {
                *granted = granted.saturating_sub(1);
            }
            (_, Verdict::Neutral) => {}
            (Phase::Closed, v) => {
                let failed = v == Verdict::Failure;
                self.window.push_back((now, failed));
                if self.window.len() > MAX_WINDOW_EVENTS {
                    self.window.pop_front();
                }
                self.consecutive = if failed { self.consecutive + 1 } else { 0 };
                self.prune(now);
                if failed && self.should_open() {
                    self.open(now);
                }
            }
            (Phase::Open { until }, Verdict::Failure) => {
                // A repeated failure extends the open period; it never shortens it.
                let later = now + self.open_for;
                if later > *until {
                    *until = later;
                }
            }
            (Phase::Open { .. }, Verdict::Success) => {}
            (Phase::HalfOpen { .. }, Verdict::Failure) => {
                self.open_for = (self.open_for * 2).min(MAX_OPEN);
                self.open(now);
            }
            (Phase::HalfOpen { successes, .. }, Verdict::Success) => {
                *successes += 1;
                if *successes >= HALF_OPEN_TRIALS {
                    self.close();
                }
            }
        }
    }

    fn prune(&mut self, now: Instant) {
        while let Some((t, _)) = self.window.front() {
            if now.saturating_duration_since(*t) > self.cfg.window {
                self.window.pop_front();
            } else {
                break;
            }
        }
    }

    fn should_open(&self) -> bool {
        if self.consecutive >= CONSECUTIVE_FAILURES {
            return true;
        }
        let n = self.window.len();
        if n == 0 || n < self.cfg.min_requests as usize {
            return false;
        }
        let failures = self.window.iter().filter(|(_, f)| *f).count();
        failures as f64 / n as f64 >= self.cfg.failure_ratio
    }

    fn open(&mut self, now: Instant) {
        self.phase = Phase::Open {
            until: now + self.open_for,
        };
        self.opened += 1;
        self.window.clear();
        self.consecutive = 0;
    }

    fn close(&mut self) {
        self.phase = Phase::Closed;
        self.open_for = self.cfg.open_for.min(MAX_OPEN);
        self.window.clear();
        self.consecutive = 0;
    }

    /// How long it stays open from `now` (zero unless open).
    pub fn open_remaining(&self, now: Instant) -> Duration {
        match self.phase {
            Phase::Open { until } => until.saturating_duration_since(now),
            _ => Duration::ZERO,
        }
    }
}

/// One route's breaker, as metrics and the status page show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BreakerSnapshot {
    pub route: RouteId,
    pub state: BreakerState,
    /// Milliseconds until the open period ends (0 unless open).
    pub open_remaining_ms: u64,
    /// The open period the next opening would use.
    pub open_for_ms: u64,
    /// Outcomes and failures in the window.
    pub window_requests: usize,
    pub window_failures: usize,
    /// How often it opened since start.
    pub opened_total: u64,
}

/// Every route's breaker. Keys are the configured routes only (bounded).
#[derive(Debug)]
pub struct Breakers {
    map: Mutex<RouteMap<Breaker>>,
}

impl Breakers {
    pub fn new<'a>(routes: impl IntoIterator<Item = &'a RouteId>, cfg: &BreakerConfig) -> Self {
        let map = routes
            .into_iter()
            .map(|id| (id.clone(), Breaker::new(cfg.clone())))
            .collect();
        Self {
            map: Mutex::new(map),
        }
    }

    fn with<T>(&self, id: &RouteId, default: T, f: impl FnOnce(&mut Breaker) -> T) -> T {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get_mut(id).map_or(default, f)
    }

    pub fn refuses(&self, id: &RouteId, now: Instant) -> bool {
        self.with(id, false, |b| b.refuses(now))
    }

    pub fn admit(&self, id: &RouteId, now: Instant) -> Admission {
        self.with(id, Admission::Pass, |b| b.admit(now))
    }

    pub fn record(&self, id: &RouteId, now: Instant, verdict: Verdict) {
        self.with(id, (), |b| b.record(now, verdict));
    }

    /// Every breaker's state at `now`, sorted by route.
    pub fn snapshot(&self, now: Instant) -> Vec<BreakerSnapshot> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<BreakerSnapshot> = map
            .iter()
            .map(|(id, b)| BreakerSnapshot {
                route: id.clone(),
                state: b.state(now),
                open_remaining_ms: millis(b.open_remaining(now)),
                open_for_ms: millis(b.open_for),
                window_requests: b.window.len(),
                window_failures: b.window.iter().filter(|(_, f)| *f).count(),
                opened_total: b.opened,
            })
            .collect();
        out.sort_by(|a, b| a.route.as_str().cmp(b.route.as_str()));
        out
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The first retry's backoff ceiling.
pub const BACKOFF_BASE: Duration = Duration::from_millis(100);

/// Exponential backoff with full jitter: a uniform wait in `[0, min(cap, base · 2^retry)]`
/// (`retry` counts from 0). Full jitter spreads the retries of many clients that failed
/// together, so they never hit the upstream in lockstep.
pub fn backoff(retry: u32, base: Duration, cap: Duration, rng: &mut impl Rng) -> Duration {
    let ceiling = base
        .checked_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(cap)
        .min(cap);
    if ceiling.is_zero() {
        return Duration::ZERO;
    }
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.gen_range(0..=nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            failure_ratio: 0.5,
            window: Duration::from_secs(60),
            min_requests: 10,
            open_for: Duration::from_secs(30),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn whole_cycle_open_extended_half_open_closed() {
        let mut b = Breaker::new(cfg());
        let t0 = Instant::now();
        // Four failures in a row: still closed (below both thresholds).
        for _ in 0..4 {
            assert_eq!(b.admit(Instant::now()), Admission::Pass);
            b.record(Instant::now(), Verdict::Failure);
        }
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
        // Client faults never count.
        b.record(Instant::now(), Verdict::Neutral);
        b.record(Instant::now(), Verdict::Failure);
        assert_eq!(b.state(Instant::now()), BreakerState::Open);
        assert_eq!(b.admit(Instant::now()), Admission::Refused);
        assert!(b.refuses(Instant::now()));

        // 20 s later a straggler fails: the open period now ends at t0+50s, not t0+30s.
        tokio::time::advance(Duration::from_secs(20)).await;
        b.record(Instant::now(), Verdict::Failure);
        tokio::time::advance(Duration::from_secs(15)).await; // t0+35
        assert_eq!(b.state(Instant::now()), BreakerState::Open, "extended");
        assert_eq!(b.admit(Instant::now()), Admission::Refused);
        tokio::time::advance(Duration::from_secs(15)).await; // t0+50
        assert_eq!(b.state(Instant::now()), BreakerState::HalfOpen);

        // Half-open: two trials, the third waits; a failed trial doubles the period (60 s).
        assert_eq!(b.admit(Instant::now()), Admission::Trial);
        assert_eq!(b.admit(Instant::now()), Admission::Trial);
        assert_eq!(b.admit(Instant::now()), Admission::Refused);
        b.record(Instant::now(), Verdict::Failure);
        assert_eq!(b.state(Instant::now()), BreakerState::Open);
        assert_eq!(b.open_remaining(Instant::now()), Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(b.state(Instant::now()), BreakerState::Open);
        tokio::time::advance(Duration::from_secs(1)).await;

        // Half-open again: a neutral trial frees its slot; two successes close.
        assert_eq!(b.admit(Instant::now()), Admission::Trial);
        b.record(Instant::now(), Verdict::Neutral);
        assert_eq!(b.admit(Instant::now()), Admission::Trial);
        assert_eq!(b.admit(Instant::now()), Admission::Trial);
        b.record(Instant::now(), Verdict::Success);
        assert_eq!(b.state(Instant::now()), BreakerState::HalfOpen);
        b.record(Instant::now(), Verdict::Success);
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
        assert_eq!(b.admit(Instant::now()), Admission::Pass);
        // Closed resets the period to the configured one.
        for _ in 0..5 {
            b.record(Instant::now(), Verdict::Failure);
        }
        assert_eq!(b.open_remaining(Instant::now()), Duration::from_secs(30));
        assert!(Instant::now() > t0);
    }

    #[tokio::test(start_paused = true)]
    async fn ratio_needs_min_requests_and_the_window_forgets() {
        let mut b = Breaker::new(cfg());
        // 4 failures, 4 successes alternating: ratio 0.5 but only 8 requests.
        for i in 0..8 {
            let v = if i % 2 == 0 {
                Verdict::Failure
            } else {
                Verdict::Success
            };
            b.record(Instant::now(), v);
        }
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
        b.record(Instant::now(), Verdict::Success);
        b.record(Instant::now(), Verdict::Failure); // 10 requests, 5 failures: opens
        assert_eq!(b.state(Instant::now()), BreakerState::Open);

        let mut b = Breaker::new(cfg());
        // 9 requests, 7 failures, never 5 in a row: below min_requests.
        for f in [true, true, true, true, false, true, true, true, false] {
            let v = if f {
                Verdict::Failure
            } else {
                Verdict::Success
            };
            b.record(Instant::now(), v);
        }
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
        tokio::time::advance(Duration::from_secs(61)).await;
        // The old outcomes left the window: one failure is not enough.
        b.record(Instant::now(), Verdict::Failure);
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn open_period_doubles_up_to_ten_minutes() {
        let mut b = Breaker::new(cfg());
        for _ in 0..5 {
            b.record(Instant::now(), Verdict::Failure);
        }
        let mut expected = Duration::from_secs(30);
        for _ in 0..8 {
            assert_eq!(b.open_remaining(Instant::now()), expected);
            tokio::time::advance(expected).await;
            assert_eq!(b.admit(Instant::now()), Admission::Trial);
            b.record(Instant::now(), Verdict::Failure);
            expected = (expected * 2).min(MAX_OPEN);
        }
        assert_eq!(b.open_remaining(Instant::now()), MAX_OPEN);
    }

    #[tokio::test(start_paused = true)]
    async fn lost_trials_are_granted_again() {
        let mut b = Breaker::new(cfg());
        for _ in 0..5 {
            b.record(Instant::now(), Verdict::Failure);
        }
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(b.admit(Instant::now()), Admission::Trial);
        assert_eq!(b.admit(Instant::now()), Admission::Trial);
        assert_eq!(b.admit(Instant::now()), Admission::Refused);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(b.admit(Instant::now()), Admission::Trial);
    }

    #[test]
    fn snapshot_lists_every_route() {
        let a = RouteId::new("a", "r", "m");
        let z = RouteId::new("z", "r", "m");
        let bs = Breakers::new([&z, &a], &cfg());
        let now = Instant::now();
        for _ in 0..5 {
            bs.record(&z, now, Verdict::Failure);
        }
        let snap = bs.snapshot(now);
        assert_eq!(snap.len(), 2);
        assert_eq!(snap[0].route, a);
        assert_eq!(snap[0].state, BreakerState::Closed);
        assert_eq!(snap[1].state, BreakerState::Open);
        assert_eq!(snap[1].open_remaining_ms, 30_000);
        assert_eq!(snap[1].opened_total, 1);
        // Unknown routes are ignored, never inserted.
        bs.record(&RouteId::new("x", "y", "z"), now, Verdict::Failure);
        assert_eq!(bs.snapshot(now).len(), 2);
    }

    #[test]
    fn backoff_is_bounded_and_jittered() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(2);
        for retry in 0..40 {
            let ceiling = (base * 2u32.saturating_pow(retry.min(20))).min(cap);
            let mut seen_low = false;
            for _ in 0..200 {
                let w = backoff(retry, base, cap, &mut rng);
                assert!(w <= ceiling, "retry {retry}: {w:?} > {ceiling:?}");
                seen_low |= w < ceiling / 2;
            }
            assert!(seen_low, "full jitter reaches the lower half");
        }
        assert_eq!(backoff(3, base, Duration::ZERO, &mut rng), Duration::ZERO);
    }
}
