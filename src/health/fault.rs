//! Route faults (pure): an upstream 401, 403 or 404 means our key, account or model name is
//! wrong at that route — no amount of waiting fixes it, so it is announced once, as soon as it
//! is seen (a probe or real traffic), and again when the route answers normally.

use crate::outcome::ProbeOutcome;

/// Statuses that name a mistake of ours at the route rather than the provider's trouble.
pub fn is_fault_status(status: u16) -> bool {
    matches!(status, 401 | 403 | 404)
}

/// What one outcome does to a route's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultChange {
    /// The route started answering with this fault status.
    Opened(u16),
    /// The route answered normally again after a fault.
    Cleared,
}

/// What the service knows of a route's fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Nothing seen since the start: a fault announced before a restart may still be firing,
    /// so the first normal answer clears it (the alert engine ignores a clear of nothing).
    #[default]
    Unknown,
    Clear,
    Faulted(u16),
}

/// The change `o` makes to a route whose fault is `current` (updated in place). Other
/// failures (timeouts, 5xx, 429) neither open nor clear a fault: only a normal answer proves
/// the key and the model name work again.
pub fn observe(current: &mut Fault, o: &ProbeOutcome) -> Option<FaultChange> {
    let status = o.error.as_ref().and_then(|e| e.status());
    match (status, *current) {
        (_, Fault::Faulted(_)) | (_, Fault::Unknown) if o.success && o.error.is_none() => {
            *current = Fault::Clear;
            Some(FaultChange::Cleared)
        }
        (Some(s), Fault::Clear | Fault::Unknown) if is_fault_status(s) => {
            *current = Fault::Faulted(s);
            Some(FaultChange::Opened(s))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::ProbeError;

    fn outcome(error: Option<ProbeError>) -> ProbeOutcome {
        ProbeOutcome {
            route: crate::route::RouteId::new("p", "r", "m"),
            kind: crate::outcome::OutcomeKind::Passive,
            started_at: chrono::Utc::now(),
            success: error.is_none(),
            attributed_to: None,
            verified: None,
            ttfb_ms: Some(10.0),
            ttft_ms: Some(20.0),
            first_answer_ms: Some(20.0),
            total_ms: 80.0,
            output_tokens: Some(3),
            tokens_estimated: false,
            tokens_per_second: None,
            model_reported: None,
            system_fingerprint: None,
            http_status: Some(error.as_ref().and_then(ProbeError::status).unwrap_or(200)),
            error,
            answer: None,
            max_tokens_exhausted: false,
            ratelimit: None,
        }
    }

    fn http(status: u16) -> Option<ProbeError> {
        Some(ProbeError::Http {
            status,
            message: "no".into(),
        })
    }

    #[test]
    fn a_fault_opens_once_and_clears_on_a_normal_answer() {
        let mut f = Fault::Clear;
        assert_eq!(
            observe(&mut f, &outcome(http(401))),
            Some(FaultChange::Opened(401))
        );
        assert_eq!(observe(&mut f, &outcome(http(401))), None);
        assert_eq!(
            observe(&mut f, &outcome(http(404))),
            None,
            "still the same fault"
        );
        assert_eq!(
            observe(&mut f, &outcome(http(503))),
            None,
            "not a proof of health"
        );
        assert_eq!(f, Fault::Faulted(401));
        assert_eq!(observe(&mut f, &outcome(None)), Some(FaultChange::Cleared));
        assert_eq!(observe(&mut f, &outcome(None)), None);
        assert_eq!(f, Fault::Clear);
    }

    #[test]
    fn after_a_start_the_first_normal_answer_clears_what_may_still_fire() {
        let mut f = Fault::Unknown;
        assert_eq!(observe(&mut f, &outcome(None)), Some(FaultChange::Cleared));
        assert_eq!(observe(&mut f, &outcome(None)), None);
        let mut f = Fault::Unknown;
        assert_eq!(
            observe(&mut f, &outcome(http(403))),
            Some(FaultChange::Opened(403))
        );
    }

    #[test]
    fn other_failures_are_not_faults() {
        let mut f = Fault::Clear;
        for s in [400, 402, 429, 500, 503] {
            assert_eq!(observe(&mut f, &outcome(http(s))), None, "{s}");
        }
        assert_eq!(observe(&mut f, &outcome(None)), None);
    }
}
