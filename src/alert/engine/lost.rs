//! Resolutions that never reached the engine: an incident still firing on the channels whose
//! incident the store closed long ago had its resolution held in the memory of a leader that
//! died (its grouping buffer, or a flush cut short). The leader's evaluation finds them and
//! sends them, grouped as live ones are.

use chrono::{DateTime, Utc};

use super::{AlertService, LOST_AFTER, LOST_SCAN};
use crate::alert::group::Draft;
use crate::alert::RouteItem;
use crate::store::alerts::FiringRow;

impl AlertService {
    /// Incidents still firing here whose incident the store has closed for over
    /// [`LOST_AFTER`]: their resolution was lost (held in the grouping buffer of a leader
    /// that died, or of a process killed before its flush). The on-call must not be left
    /// with an open page for an incident that ended, so the resolution is sent now.
    pub(super) async fn lost_resolutions(
        &self,
        firing: &[FiringRow],
        texts: &mut crate::alert::texts::Texts,
        now: DateTime<Utc>,
    ) -> Vec<Draft> {
        let mut wanted: Vec<(RouteItem, DateTime<Utc>)> = Vec::new();
        // A recovery held back for its cause's last route is not lost.
        let held: std::collections::HashSet<&str> = (firing.iter())
            .filter_map(|f| f.key.strip_prefix("held:"))
            .collect();
        for f in firing {
            let Some(id) = f.key.strip_prefix("incident:") else {
                continue;
            };
            if held.contains(id) {
                continue;
            }
            let Some(parsed) = texts.get(&f.message) else {
                continue;
            };
            if let Some(item) = parsed.incident(id) {
                wanted.push((item.clone(), f.opened_at));
            }
        }
        if wanted.is_empty() {
            return Vec::new();
        }
        let group_wait =
            chrono::Duration::from_std(self.config().alerting.group_wait).unwrap_or(LOST_AFTER);
        let after = LOST_AFTER.max(group_wait * 2);
        let read = self
            .blocking(move |r| {
                let mut closed = Vec::new();
                for (item, opened) in wanted {
                    let since = opened - chrono::Duration::days(1);
                    let found = r
                        .incidents(Some(&item.route), since, LOST_SCAN)?
                        .into_iter()
                        .find(|i| Some(&i.id) == item.incident_id.as_ref());
                    if let Some(i) = found {
                        if i.closed_at.is_some_and(|c| now - c >= after) {
                            closed.push((item, i));
                        }
                    }
                }
                Ok(closed)
            })
            .await;
        match read {
            Ok(closed) if !closed.is_empty() => {
                tracing::warn!(
                    incidents = closed.len(),
                    "resolutions that were never sent (their incidents closed in the store): sending them now"
                );
                crate::alert::group::lost_resolutions(closed)
            }
            Ok(_) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for lost resolutions");
                Vec::new()
            }
        }
    }
}
