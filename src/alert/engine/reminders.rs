//! `repeat_interval` reminders of what still fires.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::super::{accepts, routing, AlertError, Message, Status};
use super::{to_json, AlertService};
use crate::store::alerts::{AlertOp, FiringRow, NewEntry};

impl AlertService {
    /// `repeat_interval` reminders: the k-th reminder of a firing message goes out once
    /// `k·repeat_interval` after it opened (dedup key `…#remind<k>#<channel>`: exactly once).
    pub(super) async fn reminders(
        &self,
        firing: &[FiringRow],
        now: DateTime<Utc>,
    ) -> Result<u64, AlertError> {
        let mut entries = Vec::new();
        let mut seen = HashSet::new();
        // Rows of one stored message share its text: it is read once, not once per route.
        let mut read: HashSet<usize> = HashSet::new();
        // A held recovery (`held:`) is no alert of its own: its route's still fires.
        for f in firing.iter().filter(|f| !f.key.starts_with("held:")) {
            if !read.insert(Arc::as_ptr(&f.message).cast::<u8>() as usize) {
                continue;
            }
            let Ok(mut m) = serde_json::from_str::<Message>(&f.message) else {
                continue;
            };
            if !seen.insert(m.key.clone()) {
                continue;
            }
            m.status = Status::Reminder;
            for c in self.outbox.channels().iter() {
                let Some(own) = routing::for_channel(&m, &c.options().routes) else {
                    continue;
                };
                let Some(every) = c.options().repeat_interval else {
                    continue;
                };
                let Ok(every) = chrono::Duration::from_std(every) else {
                    continue;
                };
                let k = (now - f.opened_at).num_milliseconds() / every.num_milliseconds().max(1);
                if k < 1 || !accepts(c.options(), &own) {
                    continue;
                }
                let json = to_json(&own)?;
                let key = format!("{}#remind{k}#{}", own.key, c.name());
                let mention = c.mention_part(&own);
                entries.push(NewEntry {
                    dedup_key: key.clone(),
                    channel: c.name().to_owned(),
                    message: json.clone(),
                    created_at: now,
                });
                if mention {
                    entries.push(NewEntry {
                        dedup_key: format!("{key}{}", super::super::outbox::MENTION_PART),
                        channel: c.name().to_owned(),
                        message: json,
                        created_at: now,
                    });
                }
            }
        }
        if entries.is_empty() {
            return Ok(0);
        }
        let n = self
            .store
            .writer()
            .alert(AlertOp::Enqueue {
                entries,
                firing: Vec::new(),
                resolved: Vec::new(),
            })
            .await?;
        if n > 0 {
            self.wake.notify_one();
        }
        Ok(n)
    }
}
