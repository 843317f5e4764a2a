//! What suppresses alerts without touching probing or storage: `[[maintenance]]` windows from
//! the config (route globs, a start, a duration, optionally repeating `every`) and silences
//! created through the admin API (route globs until an end time, persisted in the store).
//!
//! A message is suppressed when every route it names is covered; a message about no route
//! (a stale heartbeat, a test) only by a silence whose globs include `*`.

use chrono::{DateTime, Utc};

use super::Message;
use crate::config::MaintenanceConfig;
/// The product's one glob dialect (`*` any run, `?` one character), kept at this path.
pub use crate::glob::glob_match;
use crate::route::RouteId;
pub use crate::silence::Silence;

fn any_match(globs: &[String], route: &RouteId) -> bool {
    globs.iter().any(|g| glob_match(g, route.as_str()))
}

/// Whether a `[[maintenance]]` window is open at `now`.
pub fn window_active(m: &MaintenanceConfig, now: DateTime<Utc>) -> bool {
    if now < m.start {
        return false;
    }
    let Ok(duration) = chrono::Duration::from_std(m.duration) else {
        return false;
    };
    let elapsed = now - m.start;
    let into = match m.every.and_then(|e| chrono::Duration::from_std(e).ok()) {
        Some(every) if every > chrono::Duration::zero() => {
            let e = every.num_milliseconds().max(1);
            chrono::Duration::milliseconds(elapsed.num_milliseconds().rem_euclid(e))
        }
        _ => elapsed,
    };
    into < duration
}

/// Why a message was suppressed (for the log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Suppressed {
    Maintenance(usize),
    Silence(String),
}

/// The windows and silences in force, judged at one instant.
pub struct Suppressor<'a> {
    pub windows: &'a [MaintenanceConfig],
    pub silences: &'a [Silence],
    pub now: DateTime<Utc>,
}

impl Suppressor<'_> {
    /// Why `route` is suppressed now, if it is.
    pub fn route(&self, route: &RouteId) -> Option<Suppressed> {
        for (i, w) in self.windows.iter().enumerate() {
            if window_active(w, self.now) && any_match(&w.routes, route) {
                return Some(Suppressed::Maintenance(i));
            }
        }
        self.silences
            .iter()
            .find(|s| s.active(self.now) && any_match(&s.routes, route))
            .map(|s| Suppressed::Silence(s.id.clone()))
    }

    /// Drops the routes of `m` that are suppressed; `Err` with a reason when nothing is left.
    pub fn filter(&self, mut m: Message) -> Result<Message, Suppressed> {
        if m.items.is_empty() && m.related.is_empty() {
            return match self
                .silences
                .iter()
                .find(|s| s.active(self.now) && s.routes.iter().any(|g| g == "*"))
            {
                Some(s) => Err(Suppressed::Silence(s.id.clone())),
                None => Ok(m),
            };
        }
        let mut last = None;
        let mut keep = |route: &RouteId| match self.route(route) {
            Some(why) => {
                last = Some(why);
                false
            }
            None => true,
        };
        m.items.retain(|i| keep(&i.route));
        m.related.retain(|r| keep(r));
        match (m.items.is_empty() && m.related.is_empty(), last) {
            (true, Some(why)) => Err(why),
            _ => Ok(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn windows_and_repeats() {
        let mut m = MaintenanceConfig {
            routes: vec!["qwen/*".into()],
            start: at("2026-12-01T02:00:00+08:00"),
            duration: std::time::Duration::from_secs(7200),
            every: None,
        };
        assert!(!window_active(&m, at("2026-11-30T17:59:59Z")));
        assert!(window_active(&m, at("2026-11-30T18:00:00Z")));
        assert!(window_active(&m, at("2026-11-30T19:59:59Z")));
        assert!(!window_active(&m, at("2026-11-30T20:00:00Z")));
        assert!(!window_active(&m, at("2026-12-07T18:30:00Z")));
        m.every = Some(std::time::Duration::from_secs(7 * 86400));
        assert!(window_active(&m, at("2026-12-07T18:30:00Z")));
        assert!(!window_active(&m, at("2026-12-07T20:30:00Z")));
    }
}
