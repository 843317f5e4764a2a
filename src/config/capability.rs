//! `[capability]`: how often each route's declared `tools` and `json_schema` capabilities are
//! probed (see `crate::capability`).

use std::time::Duration;

use super::raw::RawCapability;
use super::validate::Checker;

/// The shortest `[capability] every`: each probe is a paid request, and a capability breaks
/// with a model release, not from minute to minute.
pub const MIN_EVERY: Duration = Duration::from_secs(60);
/// The longest: a lost capability should be found within the day.
pub const MAX_EVERY: Duration = Duration::from_secs(24 * 3600);

/// `[capability]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityConfig {
    /// How often each declared, probed capability of a route is probed.
    pub every: Duration,
}

impl Default for CapabilityConfig {
    fn default() -> Self {
        Self {
            every: Duration::from_secs(15 * 60),
        }
    }
}

/// `[capability]`, located errors for a bad duration.
pub(super) fn capability(ck: &mut Checker<'_>, raw: RawCapability) -> CapabilityConfig {
    let d = CapabilityConfig::default();
    let every = super::convert::duration(ck, "capability.every", raw.every, d.every);
    if !(MIN_EVERY..=MAX_EVERY).contains(&every) {
        ck.fail(
            "capability.every",
            format!(
                "must be between 1m and 24h, got {}",
                humantime::format_duration(every)
            ),
        );
    }
    CapabilityConfig { every }
}
