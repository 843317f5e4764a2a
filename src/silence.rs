//! A silence created through the admin API: alerts about matching routes are dropped for a
//! while. The store persists them and the alert engine applies them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A silence: alerts for matching routes are dropped from `starts_at` until `ends_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Silence {
    pub id: String,
    /// Globs over route ids; `*` silences everything, route-less alerts included.
    pub routes: Vec<String>,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub comment: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

impl Silence {
    pub fn active(&self, now: DateTime<Utc>) -> bool {
        self.starts_at <= now && now < self.ends_at
    }
}
