//! One outage, one resolution: the recoveries of routes judged on one shared cause are held
//! back while other routes of the cause still fail, and go out together with the last one —
//! or after [`HOLD_MAX`], when a straggler keeps failing, so the news that the rest is back
//! waits at most that long. A held recovery is a firing row (`held:<incident id>`, the
//! resolution's text), so a restart keeps it; the route's own state alert fires until then,
//! which keeps an incident tool's page open as long as the outage is not over.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::super::announced::{held_key, Announced};
use super::super::group::Draft;
use super::super::{AlertError, Message, Status};
use super::to_json;
use crate::store::alerts::FiringRow;

/// How long a cause's recoveries are held back at most.
pub const HOLD_MAX: chrono::Duration = chrono::Duration::minutes(5);

/// The key prefix of a resolution released by [`HOLD_MAX`]: it is sent as it is.
const RELEASED: &str = "released:";

/// Takes out of the resolution `m` the routes whose cause still has other routes failing
/// (recording them as held), and adds to it every held recovery of the causes it ends.
/// `keys` maps each of `m`'s routes to the firing key its resolution closes.
pub(super) fn hold(
    m: &mut Message,
    keys: &mut HashMap<String, Option<String>>,
    firing: &mut Announced,
    fire: &mut Vec<FiringRow>,
    resolve: &mut Vec<String>,
    now: DateTime<Utc>,
) -> Result<(), AlertError> {
    if m.status != Status::Resolved || m.items.iter().all(|i| i.cause.is_none()) {
        return Ok(());
    }
    let mine: HashSet<String> = (m.items.iter())
        .filter_map(|i| i.incident_id.clone())
        .collect();
    let open = firing.causes_open();
    let waiting = |cause: &str| {
        !m.key.starts_with(RELEASED)
            && open
                .get(cause)
                .is_some_and(|ids| ids.iter().any(|id| !mine.contains(id)))
    };
    let (held, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut m.items)
        .into_iter()
        .partition(|i| i.cause.as_deref().is_some_and(waiting));
    m.items = kept;
    if !held.is_empty() {
        for i in &held {
            keys.remove(i.route.as_str());
        }
        let ids: Vec<String> = held.iter().filter_map(|i| i.incident_id.clone()).collect();
        let text: Arc<str> = Arc::from(to_json(&Message {
            items: held,
            ..m.clone()
        })?);
        for id in ids {
            let key = held_key(&id);
            firing.fire(&key, &text);
            fire.push(FiringRow {
                key,
                message: text.clone(),
                opened_at: now,
            });
        }
    }
    // The causes this resolution ends: their held recoveries go with it.
    let ending: HashSet<String> = (m.items.iter()).filter_map(|i| i.cause.clone()).collect();
    let mut named: HashSet<String> = (m.items.iter()).map(|i| i.route.to_string()).collect();
    for (id, text) in firing.held() {
        let Some(p) = firing.parsed(&text) else {
            continue;
        };
        let Some(item) = p.incident(&id) else {
            continue;
        };
        let ends = item.cause.as_ref().is_some_and(|c| ending.contains(c));
        if !ends {
            continue;
        }
        let key = held_key(&id);
        firing.resolve(&key);
        resolve.push(key);
        if !mine.contains(&id) && named.insert(item.route.to_string()) {
            keys.insert(item.route.to_string(), Some(format!("incident:{id}")));
            m.items.push(item.clone());
        }
    }
    Ok(())
}

/// Resolutions of the causes whose oldest held recovery waited [`HOLD_MAX`]: every held
/// recovery of such a cause, in one message per cause.
pub(super) fn overdue(
    rows: &[FiringRow],
    texts: &mut crate::alert::texts::Texts,
    now: DateTime<Utc>,
) -> Vec<Draft> {
    let mut due: HashSet<String> = HashSet::new();
    let mut by_cause: HashMap<String, Vec<(Message, super::super::RouteItem)>> = HashMap::new();
    for r in rows {
        let Some(id) = r.key.strip_prefix("held:") else {
            continue;
        };
        let Some(p) = texts.get(&r.message) else {
            continue;
        };
        let Some(item) = p.incident(id) else {
            continue;
        };
        let Some(cause) = item.cause.clone() else {
            continue;
        };
        if now - r.opened_at >= HOLD_MAX {
            due.insert(cause.clone());
        }
        by_cause
            .entry(cause)
            .or_default()
            .push((p.message.clone(), item.clone()));
    }
    let mut out = Vec::new();
    for cause in due {
        let Some(held) = by_cause.remove(&cause) else {
            continue;
        };
        let mut message = held[0].0.clone();
        message.key = format!("{RELEASED}{cause}@{}", now.timestamp_millis());
        message.at = now;
        message.items = held.into_iter().map(|(_, i)| i).collect();
        message.items.sort_by(|a, b| a.route.cmp(&b.route));
        message.items.dedup_by(|a, b| a.route == b.route);
        let item_keys = (message.items.iter())
            .map(|i| i.incident_id.as_ref().map(|id| format!("incident:{id}")))
            .collect();
        out.push(Draft {
            message,
            item_keys,
            key: None,
        });
    }
    out
}
