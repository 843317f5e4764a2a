//! `[capability]`: how often each route's declared `tools` and `json_schema` capabilities are
//! probed, and the optional long-prompt probe (see `crate::capability`).

use std::time::Duration;

use super::raw::{RawCapability, RawLongPrompt};
use super::validate::Checker;

/// The shortest `[capability] every`: each probe is a paid request, and a capability breaks
/// with a model release, not from minute to minute.
pub const MIN_EVERY: Duration = Duration::from_secs(60);
/// The longest: a lost capability should be found within the day.
pub const MAX_EVERY: Duration = Duration::from_secs(24 * 3600);

/// The smallest long prompt: below it prefill time hides in the network's noise.
pub const LONG_PROMPT_MIN_TOKENS: u32 = 1_000;
/// The largest: past it many models' context ends, and each probe costs real money.
pub const LONG_PROMPT_MAX_TOKENS: u32 = 200_000;
/// The shortest `long_prompt.every`: thousands of input tokens per probe.
pub const LONG_PROMPT_MIN_EVERY: Duration = Duration::from_secs(3600);

/// `[capability]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityConfig {
    /// How often each declared, probed capability of a route is probed.
    pub every: Duration,
    /// `long_prompt = { tokens, every }`; `None` (the key absent): no long-prompt probe.
    pub long_prompt: Option<LongPromptConfig>,
}

/// `[capability] long_prompt`: a prompt of about `tokens` tokens sent to every chat route
/// every `every`, its time to first token judged against the route's own baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongPromptConfig {
    pub tokens: u32,
    pub every: Duration,
}

impl Default for LongPromptConfig {
    fn default() -> Self {
        Self {
            tokens: 8_000,
            every: Duration::from_secs(24 * 3600),
        }
    }
}

impl Default for CapabilityConfig {
    fn default() -> Self {
        Self {
            every: Duration::from_secs(15 * 60),
            long_prompt: None,
        }
    }
}

/// `[capability]`, located errors for a bad duration or size.
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
    let long_prompt = raw.long_prompt.map(|r| long_prompt(ck, r));
    CapabilityConfig { every, long_prompt }
}

fn long_prompt(ck: &mut Checker<'_>, raw: RawLongPrompt) -> LongPromptConfig {
    let d = LongPromptConfig::default();
    let tokens = match raw.tokens {
        None => d.tokens,
        Some(t) => {
            let range = i64::from(LONG_PROMPT_MIN_TOKENS)..=i64::from(LONG_PROMPT_MAX_TOKENS);
            if range.contains(&t) {
                u32::try_from(t).unwrap_or(d.tokens)
            } else {
                ck.fail(
                    "capability.long_prompt.tokens",
                    format!("must be between 1000 and 200000, got {t}"),
                );
                d.tokens
            }
        }
    };
    let every = super::convert::duration(ck, "capability.long_prompt.every", raw.every, d.every);
    if every < LONG_PROMPT_MIN_EVERY {
        ck.fail(
            "capability.long_prompt.every",
            format!(
                "must be at least 1h (each probe sends thousands of tokens), got {}",
                humantime::format_duration(every)
            ),
        );
    }
    LongPromptConfig { tokens, every }
}
