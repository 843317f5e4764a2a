//! Vantages: the places probes run from. The monitor's own scheduler is one (`[server]
//! vantage`, default [`LOCAL`]); every `probeok agent` is another, pushing its outcomes to
//! `POST /api/v1/ingest`. An outcome from an agent travels as a [`VantageOutcome`]: the
//! outcome, the vantage that measured it, and a unique id so a resend is recognised as one.

use serde::{Deserialize, Serialize};

use crate::outcome::ProbeOutcome;

/// The default vantage id of the monitor's own scheduler.
pub const LOCAL: &str = "local";

/// Longest vantage id accepted (ids are labels on metrics and keys in the API).
pub const MAX_ID_LEN: usize = 64;

/// Longest outcome id accepted from an agent.
pub const MAX_OUTCOME_ID_LEN: usize = 128;

/// Is `s` a vantage id: 1–[`MAX_ID_LEN`] characters of `a-z`, `0-9`, `_`, `-`.
pub fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Is `s` an outcome id an agent may send: 1–[`MAX_OUTCOME_ID_LEN`] printable ASCII
/// characters without spaces.
pub fn valid_outcome_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_OUTCOME_ID_LEN && s.bytes().all(|b| b.is_ascii_graphic())
}

/// One outcome measured at a remote vantage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VantageOutcome {
    pub vantage: String,
    /// Unique per outcome (the agent makes it); the monitor stores each id once.
    pub id: String,
    #[serde(flatten)]
    pub outcome: ProbeOutcome,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_lowercase_words() {
        assert!(valid_id("local"));
        assert!(valid_id("cn-beijing_2"));
        assert!(!valid_id(""));
        assert!(!valid_id("CN"));
        assert!(!valid_id("a b"));
        assert!(!valid_id("a/b"));
        assert!(!valid_id(&"x".repeat(MAX_ID_LEN + 1)));
        assert!(valid_outcome_id("cn-beijing:01J0:7"));
        assert!(!valid_outcome_id("a b"));
        assert!(!valid_outcome_id(""));
    }
}
