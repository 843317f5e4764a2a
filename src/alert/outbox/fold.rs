//! What a channel is handed in one round (pure): no more than its receiver accepts, and no
//! message about something that resolved before it could be sent.
//!
//! Of one channel's due rows, in order:
//! - a firing message (or reminder) whose every firing state a later due resolution closes is
//!   **superseded**: the receiver gets the resolution, not a stale "firing" before it;
//! - with `capacity` messages left in the channel's minute, and more rows than that, the first
//!   `capacity − 1` go out as they are and the rest are **folded** into one summary: a flood
//!   costs the channel one minute, never hours of queue in front of the next incident.

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use super::super::group::batch::state_keys;
use super::super::{Message, Severity, Status, Subject};

/// What becomes of one due row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disp {
    /// Sent as it is (or deferred, when the channel's window is full).
    Send,
    /// Its subject resolved in a later due row: recorded, not sent.
    Superseded,
    /// Part of the round's summary.
    Fold,
}

/// The plan for one channel's due rows (`None`: a row this cannot read; it is sent as it is,
/// and the sender deals with it). `capacity`: messages the channel may still send in its
/// current minute (`None`: no limit).
pub fn plan(rows: &[Option<&Message>], capacity: Option<usize>) -> Vec<Disp> {
    let mut out = vec![Disp::Send; rows.len()];
    let mut closed_later: HashSet<String> = HashSet::new();
    for (i, m) in rows.iter().enumerate().rev() {
        let Some(m) = m else { continue };
        let keys = state_keys(m);
        match m.status {
            Status::Resolved => closed_later.extend(keys),
            Status::Firing | Status::Reminder => {
                if !keys.is_empty() && keys.iter().all(|k| closed_later.contains(k)) {
                    out[i] = Disp::Superseded;
                }
            }
            Status::Test => {}
        }
    }
    let Some(capacity) = capacity.filter(|c| *c >= 1) else {
        return out;
    };
    let sending: Vec<usize> = (0..rows.len())
        .filter(|i| out[*i] == Disp::Send && rows[*i].is_some())
        .collect();
    if sending.len() > capacity {
        for i in &sending[capacity - 1..] {
            out[*i] = Disp::Fold;
        }
    }
    out
}

/// One channel's folded rows of a round, gathered across the rows read: how many fire and
/// resolve, the most severe first few (firing before resolved, then oldest first) kept to show.
#[derive(Debug, Default)]
pub struct Folding {
    /// `(id, attempts)` of each row claimed into it.
    pub rows: Vec<(i64, u32)>,
    total: u32,
    resolved: u32,
    severity: Option<Severity>,
    shown: Vec<Message>,
}

impl Folding {
    /// Adds a claimed row and its message (`None`: a mention part, counted with its message).
    pub fn add(&mut self, id: i64, attempts: u32, m: Option<Message>) {
        self.rows.push((id, attempts));
        let Some(mut m) = m else { return };
        self.total = self.total.saturating_add(1);
        if m.status == Status::Resolved {
            self.resolved = self.resolved.saturating_add(1);
        } else {
            self.severity = self.severity.max(Some(m.severity));
        }
        // A summary names them; their own details stay in their own alerts.
        m.note = None;
        self.shown.push(m);
        let rank = |m: &Message| (m.status == Status::Resolved, std::cmp::Reverse(m.severity));
        self.shown
            .sort_by(|a, b| rank(a).cmp(&rank(b)).then(a.at.cmp(&b.at)));
        self.shown.truncate(super::super::render::FOLDED_LISTED);
    }

    /// The summary message for a channel taking `per_minute`.
    pub fn summary(&self, per_minute: u32, now: DateTime<Utc>) -> Message {
        let firing = self.total.saturating_sub(self.resolved);
        Message {
            key: format!("folded@{}", now.timestamp_millis()),
            severity: self.severity.unwrap_or(Severity::Info),
            status: if firing > 0 {
                Status::Firing
            } else {
                Status::Resolved
            },
            subject: Subject::Folded {
                total: self.total,
                firing,
                resolved: self.resolved,
                per_minute,
                shown: self.shown.clone(),
            },
            at: now,
            items: Vec::new(),
            related: Vec::new(),
            note: None,
            resolves: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::RouteId;

    fn fault(route: &str, status: Status, at_s: i64) -> Message {
        let route = RouteId::parse(route).unwrap();
        Message {
            key: format!("route_fault:{route}:x@{at_s}"),
            severity: Severity::Critical,
            status,
            subject: Subject::RouteFault {
                route: route.clone(),
                status: (status == Status::Firing).then_some(401),
            },
            at: DateTime::UNIX_EPOCH + chrono::Duration::seconds(at_s),
            items: Vec::new(),
            related: vec![route],
            note: None,
            resolves: None,
        }
    }

    #[test]
    fn resolved_before_sent_is_superseded_and_the_excess_folds() {
        let a = fault("qwen/cn/a", Status::Firing, 0);
        let b = fault("qwen/cn/b", Status::Firing, 1);
        let a_ok = fault("qwen/cn/a", Status::Resolved, 2);
        let rows = [Some(&a), Some(&b), Some(&a_ok)];
        assert_eq!(
            plan(&rows, None),
            vec![Disp::Superseded, Disp::Send, Disp::Send]
        );
        let many: Vec<Message> = (0..200)
            .map(|i| fault(&format!("p{i}/cn/m"), Status::Firing, i))
            .collect();
        let rows: Vec<Option<&Message>> = many.iter().map(Some).collect();
        let p = plan(&rows, Some(20));
        assert_eq!(p.iter().filter(|d| **d == Disp::Send).count(), 19);
        assert_eq!(p.iter().filter(|d| **d == Disp::Fold).count(), 181);
        assert!(p[..19].iter().all(|d| *d == Disp::Send));
        // A full window folds nothing: the sender defers to the next minute.
        assert!(plan(&rows, Some(0)).iter().all(|d| *d == Disp::Send));
        let mut f = Folding::default();
        for (i, m) in many[19..].iter().enumerate() {
            f.add(i as i64, 0, Some(m.clone()));
        }
        let s = f.summary(20, DateTime::UNIX_EPOCH);
        match s.subject {
            Subject::Folded {
                total, ref shown, ..
            } => {
                assert_eq!(total, 181);
                assert_eq!(shown.len(), super::super::super::render::FOLDED_LISTED);
            }
            _ => panic!(),
        }
    }
}
