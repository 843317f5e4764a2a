//! The health service's cadences ([`HealthOptions`]).

use std::time::Duration;

use super::WarmProgress;

/// The service's cadences. Production uses [`Default`]; tests shorten or stretch them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthOptions {
    /// [`Detector::tick`] for every route (the 1-second evaluation).
    pub tick_every: Duration,
    /// Cross-route findings, besides the event-driven recomputations.
    pub findings_every: Duration,
    /// Routes whose state changed since their last save are saved this often, so windows and
    /// counters survive a crash, not only a clean shutdown.
    pub save_every: Duration,
    /// Baselines in the published snapshot are refreshed at most this often.
    pub baselines_every: Duration,
    /// Baselines' changed parts are saved this often (and at shutdown), so a start restores
    /// them instead of replaying the raw history; a crash replays what came after the last
    /// save.
    pub baseline_save_every: Duration,
    /// The `health` heartbeat.
    pub heartbeat_every: Duration,
    /// Snapshots are published at most a couple of times in this period: changes beyond
    /// (a provider-wide outage moves thousands of routes in one tick) go out together in one
    /// snapshot at its end, and their transition events right after it.
    pub publish_every: Duration,
    /// Where every outcome's rate-limit headroom is kept (shared with the status API and
    /// `/metrics`, which read it).
    pub headroom: super::super::Headroom,
    /// How long the start waits for baselines rebuilt from the history; the rest warm in the
    /// background while the service runs (`warm`).
    pub warm_wait: Duration,
    /// How far that rebuild has come (shared with `/readyz`, which reads it).
    pub warm: WarmProgress,
}

impl Default for HealthOptions {
    fn default() -> Self {
        Self {
            tick_every: Duration::from_secs(1),
            findings_every: Duration::from_secs(5),
            save_every: Duration::from_secs(30),
            baselines_every: Duration::from_secs(30),
            baseline_save_every: Duration::from_secs(600),
            heartbeat_every: Duration::from_secs(10),
            publish_every: Duration::from_millis(250),
            headroom: super::super::Headroom::default(),
            warm_wait: Duration::from_secs(5),
            warm: WarmProgress::default(),
        }
    }
}
