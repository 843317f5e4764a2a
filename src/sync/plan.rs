//! The pure part of keeping a gateway channel in step with its route: what to write given the
//! route's weight, the channel as the gateway shows it and whether probeok disabled it; when
//! the next write may go (one per channel per [`MIN_WRITE_GAP`]); how long a refused write
//! waits before its retry.

use chrono::{DateTime, TimeDelta, Utc};

/// A channel the gateway serves from (new-api / one-api `status = 1`).
pub const ENABLED: i64 = 1;
/// A channel disabled by hand (`status = 2`): what probeok writes, and what an operator does.
pub const DISABLED: i64 = 2;

/// At most one write per channel in this long, however often the route's weight moves.
pub const MIN_WRITE_GAP: TimeDelta = TimeDelta::seconds(10);
/// The first retry of a refused write waits this long, doubling per failure up to
/// [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: TimeDelta = TimeDelta::seconds(10);
pub const MAX_BACKOFF: TimeDelta = TimeDelta::minutes(5);

/// The two fields probeok reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Channel {
    pub status: i64,
    pub weight: i64,
}

/// What to do with one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// In step already: no write.
    Keep,
    /// Disabled by someone else (an operator, or the gateway's own automatic disabling):
    /// never enabled by probeok, whatever the route does.
    LeaveAlone,
    /// Write these fields (everything else as read); `ours` says whether the channel is then
    /// one probeok disabled (`Some(true)`), one it no longer holds disabled (`Some(false)`),
    /// or unchanged (`None`).
    Write { to: Channel, ours: Option<bool> },
    /// No write, but the channel is enabled now although probeok disabled it (someone enabled
    /// it by hand): forget it.
    Forget,
}

/// The channel weight for a route weight: the feed's weight as it is. Route weights are
/// integers 0–100 summing to 100 per logical model, so channel weights of one model's
/// channels split its traffic in the same proportions.
pub fn channel_weight(route_weight: u8) -> i64 {
    i64::from(route_weight)
}

/// What a channel needs for `route_weight`, given the channel and whether probeok disabled it.
pub fn decide(route_weight: u8, ch: Channel, ours: bool) -> Decision {
    let weight = channel_weight(route_weight);
    match (route_weight, ch.status) {
        (0, ENABLED) => Decision::Write {
            to: Channel {
                status: DISABLED,
                weight: ch.weight,
            },
            ours: Some(true),
        },
        (0, _) => Decision::Keep,
        (_, ENABLED) if ch.weight != weight => Decision::Write {
            to: Channel {
                status: ENABLED,
                weight,
            },
            ours: ours.then_some(false),
        },
        (_, ENABLED) if ours => Decision::Forget,
        (_, ENABLED) => Decision::Keep,
        (_, DISABLED) if ours => Decision::Write {
            to: Channel {
                status: ENABLED,
                weight,
            },
            ours: Some(false),
        },
        _ => Decision::LeaveAlone,
    }
}

/// When a channel last written at `last` may be written again.
pub fn next_write(last: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    last.map(|t| t + MIN_WRITE_GAP)
}

/// The wait before retry number `failures` (1 for the first failure).
pub fn backoff(failures: u32) -> TimeDelta {
    let doublings = failures.saturating_sub(1).min(16);
    let wait = FIRST_BACKOFF * 2i32.saturating_pow(doublings);
    wait.min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ch(status: i64, weight: i64) -> Channel {
        Channel { status, weight }
    }

    #[test]
    fn weight_zero_disables_an_enabled_channel_and_remembers_it() {
        assert_eq!(
            decide(0, ch(ENABLED, 40), false),
            Decision::Write {
                to: ch(DISABLED, 40),
                ours: Some(true)
            }
        );
        assert_eq!(decide(0, ch(DISABLED, 40), false), Decision::Keep);
        assert_eq!(decide(0, ch(3, 40), false), Decision::Keep);
    }

    #[test]
    fn only_channels_probeok_disabled_are_enabled_again() {
        assert_eq!(
            decide(70, ch(DISABLED, 40), true),
            Decision::Write {
                to: ch(ENABLED, 70),
                ours: Some(false)
            }
        );
        assert_eq!(decide(70, ch(DISABLED, 40), false), Decision::LeaveAlone);
        // The gateway's own automatic disabling is not probeok's either.
        assert_eq!(decide(70, ch(3, 40), false), Decision::LeaveAlone);
    }

    #[test]
    fn weight_follows_and_a_hand_enabled_channel_is_forgotten() {
        assert_eq!(
            decide(30, ch(ENABLED, 70), false),
            Decision::Write {
                to: ch(ENABLED, 30),
                ours: None
            }
        );
        assert_eq!(decide(30, ch(ENABLED, 30), false), Decision::Keep);
        assert_eq!(decide(30, ch(ENABLED, 30), true), Decision::Forget);
    }

    #[test]
    fn backoff_doubles_from_ten_seconds_up_to_five_minutes() {
        assert_eq!(backoff(1), TimeDelta::seconds(10));
        assert_eq!(backoff(2), TimeDelta::seconds(20));
        assert_eq!(backoff(5), TimeDelta::seconds(160));
        assert_eq!(backoff(6), TimeDelta::minutes(5));
        assert_eq!(backoff(u32::MAX), TimeDelta::minutes(5));
    }
}
