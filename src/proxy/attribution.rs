//! Whose fault a passive failure is. A client's own requests can fail on a healthy route —
//! a huge prompt, an enormous `max_tokens` — and, counted as the route's failures, they would
//! open its breaker, push it to DEGRADED/CRITICAL and trigger a costlier switch for everyone.
//!
//! The rule: a failure that can be the request's doing (no first byte in time, a stall, the
//! whole call or stream too long) is **the request's own** when, over the last [`WINDOW`],
//!
//! - its client failed at least [`CLIENT_MIN_FAILURE_RATIO`] of its requests on the route, and
//! - the route's other clients sent at least [`MIN_OTHERS`] requests there, failed at most
//!   [`OTHERS_MAX_FAILURE_RATIO`] of them, and one succeeded within the last [`RECENT`].
//!
//! Such a failure is neutral for the breaker and reaches the detector marked
//! (`ProbeOutcome::attributed_to`), where it feeds a `request_side` finding instead of the
//! route's error rate. Connect errors, 429s and 5xx are never attributed: they are the
//! route's. Without client keys every request is the same client, so nothing is attributed
//! here (the detector's route-wide rule — probes fine while real traffic fails — still holds).
//!
//! Pure apart from one mutex: every call takes an explicit `now` (`tokio::time::Instant`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::probe::ProbeError;
use crate::route::RouteId;

/// How far back a route's outcomes are compared.
pub const WINDOW: Duration = Duration::from_secs(120);
/// Other clients' latest success must be this recent to vouch for the route now.
pub const RECENT: Duration = Duration::from_secs(30);
/// Other clients' requests needed in the window before they can vouch for the route.
pub const MIN_OTHERS: u32 = 3;
/// Other clients fail at most this share of their requests.
pub const OTHERS_MAX_FAILURE_RATIO: f64 = 0.1;
/// The client fails at least this share of its own.
pub const CLIENT_MIN_FAILURE_RATIO: f64 = 0.5;
/// Outcomes kept per route (the oldest are forgotten first): memory is bounded at any rate.
pub const MAX_EVENTS: usize = 4096;

/// The failures a request can cause by itself: time, not refusals or broken connections.
pub fn attributable(e: &ProbeError) -> bool {
    matches!(
        e,
        ProbeError::TimeoutBeforeFirstByte | ProbeError::Stalled | ProbeError::Timeout
    )
}

/// A client's tag as shown in findings: `key:` and the first 8 hex digits of its key's
/// SHA-256 (the key itself is never kept). Empty without client auth.
pub fn client_tag(client_key: &str) -> String {
    if client_key.is_empty() {
        return String::new();
    }
    format!("key:{}", &super::contract::owner_of(client_key)[..8])
}

#[derive(Debug, Clone)]
struct Event {
    at: Instant,
    client: String,
    failed: bool,
}

/// Recent outcomes per route and client.
#[derive(Debug, Default)]
pub struct Ledger {
    routes: Mutex<crate::route::RouteMap<VecDeque<Event>>>,
}

impl Ledger {
    /// Records one attempt of `client` on `route` (`failure`: its error, `None` when it
    /// succeeded) and says whether that failure is the request's own (see the module docs).
    pub fn record(
        &self,
        route: &RouteId,
        client: &str,
        failure: Option<&ProbeError>,
        now: Instant,
    ) -> bool {
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        let events = routes.entry(route.clone()).or_default();
        while events
            .front()
            .is_some_and(|e| now.saturating_duration_since(e.at) > WINDOW)
        {
            events.pop_front();
        }
        if events.len() >= MAX_EVENTS {
            events.pop_front();
        }
        events.push_back(Event {
            at: now,
            client: client.to_owned(),
            failed: failure.is_some(),
        });
        match failure {
            Some(e) if !client.is_empty() && attributable(e) => judge(events, client, now),
            _ => false,
        }
    }
}

/// The rule of the module docs over one route's window (the failure already in it).
fn judge(events: &VecDeque<Event>, client: &str, now: Instant) -> bool {
    let (mut mine, mut mine_failed) = (0u32, 0u32);
    let (mut others, mut others_failed) = (0u32, 0u32);
    let mut others_ok_at: Option<Instant> = None;
    for e in events {
        if e.client == client {
            mine += 1;
            mine_failed += u32::from(e.failed);
        } else {
            others += 1;
            others_failed += u32::from(e.failed);
            if !e.failed {
                others_ok_at = Some(others_ok_at.map_or(e.at, |t| t.max(e.at)));
            }
        }
    }
    let ratio = |f: u32, n: u32| f64::from(f) / f64::from(n.max(1));
    others >= MIN_OTHERS
        && ratio(others_failed, others) <= OTHERS_MAX_FAILURE_RATIO
        && others_ok_at.is_some_and(|t| now.saturating_duration_since(t) <= RECENT)
        && ratio(mine_failed, mine) >= CLIENT_MIN_FAILURE_RATIO
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> RouteId {
        RouteId::new("p", "r", "m")
    }

    #[test]
    fn one_clients_timeouts_are_its_own_while_others_succeed() {
        let l = Ledger::default();
        let t0 = Instant::now();
        let r = route();
        for i in 0..5 {
            assert!(!l.record(&r, "key:b", None, t0 + Duration::from_secs(i)));
        }
        let t = t0 + Duration::from_secs(6);
        assert!(l.record(&r, "key:a", Some(&ProbeError::Timeout), t));
        assert!(l.record(&r, "key:a", Some(&ProbeError::Stalled), t));
        // A 503 is the route's, whoever sent the request.
        let busy = ProbeError::Http {
            status: 503,
            message: String::new(),
        };
        assert!(!l.record(&r, "key:a", Some(&busy), t));
        // Another route is judged on its own outcomes.
        let other = RouteId::new("p", "r", "n");
        assert!(!l.record(&other, "key:a", Some(&ProbeError::Timeout), t));
    }

    #[test]
    fn failures_everyone_sees_are_the_routes() {
        let l = Ledger::default();
        let t = Instant::now();
        let r = route();
        for _ in 0..5 {
            l.record(&r, "key:b", Some(&ProbeError::Timeout), t);
            l.record(&r, "key:b", None, t);
        }
        assert!(!l.record(&r, "key:a", Some(&ProbeError::Timeout), t));
    }

    #[test]
    fn without_fresh_evidence_from_others_nothing_is_attributed() {
        let l = Ledger::default();
        let t0 = Instant::now();
        let r = route();
        for _ in 0..5 {
            l.record(&r, "key:b", None, t0);
        }
        // Too few others.
        let l2 = Ledger::default();
        l2.record(&r, "key:b", None, t0);
        assert!(!l2.record(&r, "key:a", Some(&ProbeError::Timeout), t0));
        // Others' successes are too old to vouch for the route now.
        let later = t0 + RECENT + Duration::from_secs(1);
        assert!(!l.record(&r, "key:a", Some(&ProbeError::Timeout), later));
        // Without client auth every request is the same client.
        assert!(!l.record(&r, "", Some(&ProbeError::Timeout), t0));
    }

    #[test]
    fn a_client_that_mostly_succeeds_is_not_blamed() {
        let l = Ledger::default();
        let t = Instant::now();
        let r = route();
        for _ in 0..5 {
            l.record(&r, "key:b", None, t);
            l.record(&r, "key:a", None, t);
        }
        assert!(!l.record(&r, "key:a", Some(&ProbeError::Timeout), t));
    }

    #[test]
    fn memory_is_bounded_and_old_outcomes_leave() {
        let l = Ledger::default();
        let t = Instant::now();
        let r = route();
        for _ in 0..(MAX_EVENTS + 10) {
            l.record(&r, "key:b", None, t);
        }
        assert_eq!(l.routes.lock().unwrap()[&r].len(), MAX_EVENTS);
        l.record(&r, "key:b", None, t + WINDOW + Duration::from_secs(1));
        assert_eq!(l.routes.lock().unwrap()[&r].len(), 1);
    }

    #[test]
    fn tags_never_show_the_key() {
        assert_eq!(client_tag(""), "");
        let tag = client_tag("sk-client-secret");
        assert!(tag.starts_with("key:") && tag.len() == 12, "{tag}");
        assert!(!tag.contains("secret"));
    }
}
