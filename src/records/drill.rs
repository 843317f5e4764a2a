//! A drill as recorded — a planned, time-limited move of traffic off one route, ramped in
//! stages — and the stage in force at any instant. The drill service writes it, the store
//! keeps it, weights, pages and reports read it.

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::route::RouteId;

/// How a drill ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndedBy {
    /// At its end time (or found past it after a restart).
    Auto,
    /// An operator stopped it.
    Stop,
}

impl EndedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            EndedBy::Auto => "auto",
            EndedBy::Stop => "stop",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(EndedBy::Auto),
            "stop" => Some(EndedBy::Stop),
            _ => None,
        }
    }
}

/// One drill as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drill {
    pub id: i64,
    /// The route whose traffic moves.
    pub route: RouteId,
    /// Its logical model.
    pub serves: String,
    /// The route's weight at 100 % of the ramp (0: all its traffic moves away).
    pub weight: u8,
    /// Percentages of the move, one per stage of equal length; `[100]` moves at once.
    pub ramp: Vec<u8>,
    pub reason: String,
    pub started_by: Option<String>,
    /// Started outside the off-peak windows on purpose.
    pub forced: bool,
    pub started_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub ended_by: Option<EndedBy>,
    /// Who asked for the stop, when they said.
    pub stopped_by: Option<String>,
    /// The routes of the model that carried traffic while it ran (the report's "backup").
    pub receivers: Vec<RouteId>,
}

impl Drill {
    pub fn active(&self) -> bool {
        self.ended_at.is_none()
    }

    /// The window the report covers: start → end (or `now` while it runs).
    pub fn window(&self, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        let end = self.ended_at.unwrap_or_else(|| now.min(self.ends_at));
        (self.started_at, end.max(self.started_at))
    }

    /// The stage in force at `now` (`None` once the drill's time is up or it ended).
    pub fn stage(&self, now: DateTime<Utc>) -> Option<Stage> {
        if !self.active() {
            return None;
        }
        stage_at(&self.ramp, self.started_at, self.ends_at, now)
    }
}

/// One stage of a running drill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stage {
    /// 1-based.
    pub index: usize,
    pub of: usize,
    /// How much of the move is done in this stage.
    pub percent: u8,
    pub from: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

/// The stage in force at `now` for a drill over `[start, end)`; `None` before the start and
/// from the end on.
pub fn stage_at(
    ramp: &[u8],
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<Stage> {
    if ramp.is_empty() || now < start || now >= end {
        return None;
    }
    let n = ramp.len() as i64;
    let total = (end - start).num_milliseconds().max(1);
    let bound = |i: i64| start + TimeDelta::milliseconds(total * i / n);
    let i = (((now - start).num_milliseconds() * n) / total).clamp(0, n - 1);
    // Integer division can put `now` a stage off at a boundary; the bounds decide.
    let mut i = i;
    while i > 0 && now < bound(i) {
        i -= 1;
    }
    while i < n - 1 && now >= bound(i + 1) {
        i += 1;
    }
    Some(Stage {
        index: i as usize + 1,
        of: ramp.len(),
        percent: ramp[i as usize],
        from: bound(i),
        until: bound(i + 1),
    })
}
