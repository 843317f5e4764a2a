//! What an incident tool may resolve. PagerDuty and Opsgenie are triggered once per message
//! (a provider's grouped routes are one trigger, under one key), so a trigger is resolved when
//! no route it still stands for is firing — not when the first of a group's routes recovers,
//! and never under a key nothing was triggered with.
//!
//! Pure: built from the stored firing state (each firing key with the text of the message that
//! last announced it), moved along as an enqueue fires and resolves keys; the keys are worked
//! out per channel, as each channel's `routes` regroup the message it triggered with.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::texts::{Parsed, Texts};
use super::{oncall, routing};
use crate::store::alerts::FiringRow;

/// Firing keys with the text of the message that last announced each.
#[derive(Debug, Default)]
pub struct Announced {
    by_key: HashMap<String, Arc<str>>,
    /// Parsed texts, each once per enqueue (found by address: a grouped text of thousands
    /// of routes is neither hashed nor compared per route).
    texts: Texts,
    /// Per channel, the shared causes it was told of and at what severity (built when a
    /// message with a cause is first written for it, then kept up to date).
    told: HashMap<String, HashMap<String, super::Severity>>,
}

impl Announced {
    pub fn new(rows: &[FiringRow]) -> Self {
        let mut a = Self::default();
        for r in rows {
            a.fire(&r.key, &r.message);
        }
        a
    }

    pub fn is_firing(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    /// `key` is announced by `text` from now on.
    pub fn fire(&mut self, key: &str, text: &Arc<str>) {
        self.by_key.insert(key.to_owned(), text.clone());
    }

    /// Resolves `key`; the text that announced it, if it was firing.
    pub fn resolve(&mut self, key: &str) -> Option<Arc<str>> {
        self.by_key.remove(key)
    }

    /// The incident keys the channel with route globs `routes` may resolve, now that the keys
    /// announced by `resolved` texts have resolved: the key each of those messages was
    /// triggered with on this channel, unless a route the channel sees, still firing, was
    /// announced under it.
    pub fn closed_keys(&mut self, resolved: &[Arc<str>], routes: &[String]) -> Vec<String> {
        let mut keys: HashMap<usize, Option<String>> = HashMap::new();
        let mut candidates = BTreeSet::new();
        for t in resolved {
            if let Some(k) = self.channel_key(&mut keys, t, routes) {
                candidates.insert(k);
            }
        }
        if candidates.is_empty() {
            return Vec::new();
        }
        let still: Vec<(String, Arc<str>)> = (self.by_key.iter())
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        for (key, text) in still {
            if candidates.is_empty() {
                break;
            }
            // A firing route outside the channel's routes holds nothing open on it.
            let seen = match self.texts.get(&text) {
                Some(p) => route_of(&key, &p).is_none_or(|r| routing::owns(routes, r)),
                None => false,
            };
            if seen {
                if let Some(k) = self.channel_key(&mut keys, &text, routes) {
                    candidates.remove(&k);
                }
            }
        }
        candidates.into_iter().collect()
    }

    /// The routes whose state alert (an incident) is firing, each at its severity and the time
    /// the route entered the state it was announced in.
    pub fn states_firing(
        &mut self,
    ) -> HashMap<crate::route::RouteId, (super::Severity, chrono::DateTime<chrono::Utc>)> {
        let mut out = HashMap::new();
        for (_, item, sev) in self.incident_items() {
            let e = out.entry(item.route.clone()).or_insert((sev, item.at));
            if sev > e.0 {
                *e = (sev, item.at);
            }
        }
        out
    }

    /// Every firing state alert: its incident id, the route item that announced it, and its
    /// severity.
    fn incident_items(&mut self) -> Vec<(String, super::RouteItem, super::Severity)> {
        let incidents: Vec<(String, Arc<str>)> = (self.by_key.iter())
            .filter(|(k, _)| k.starts_with("incident:"))
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        let mut out = Vec::with_capacity(incidents.len());
        for (key, text) in incidents {
            let Some(p) = self.texts.get(&text) else {
                continue;
            };
            let id = key.strip_prefix("incident:").unwrap_or_default();
            let Some(i) = p.incident(id) else {
                continue;
            };
            let sev = super::Severity::of_state(i.to).unwrap_or(p.message.severity);
            out.push((id.to_owned(), i.clone(), sev));
        }
        out
    }

    /// A firing `m` as the channel `channel` (route globs `routes`) is to hear it: the routes
    /// of a shared cause it was told of already, at their severity or higher, are left out —
    /// they add to the outage it was paged for; a route that makes it worse is said. `None`
    /// when nothing is left.
    pub fn unheard<'a>(
        &mut self,
        channel: &str,
        routes: &[String],
        mut m: Cow<'a, super::Message>,
    ) -> Option<Cow<'a, super::Message>> {
        // Only state messages tell of a cause: a flapping summary names a few routes that
        // flap, not how the outage stands.
        let state = matches!(
            m.subject,
            super::Subject::Provider { .. } | super::Subject::Route
        );
        if !state || m.status != super::Status::Firing || m.items.iter().all(|i| i.cause.is_none())
        {
            return Some(m);
        }
        if !self.told.contains_key(channel) {
            // What the channel heard before this message (whose routes fire already).
            let own: HashSet<&str> = (m.items.iter())
                .filter_map(|i| i.incident_id.as_deref())
                .collect();
            let mut told: HashMap<String, super::Severity> = HashMap::new();
            for (id, item, sev) in self.incident_items() {
                let Some(cause) = item.cause else { continue };
                if own.contains(id.as_str()) || !routing::owns(routes, &item.route) {
                    continue;
                }
                let e = told.entry(cause).or_insert(sev);
                *e = (*e).max(sev);
            }
            self.told.insert(channel.to_owned(), told);
        }
        let told = self.told.get_mut(channel)?;
        let fallback = m.severity;
        let sev = |i: &super::RouteItem| super::Severity::of_state(i.to).unwrap_or(fallback);
        let heard = |i: &super::RouteItem| {
            (i.cause.as_ref()).is_some_and(|c| told.get(c).is_some_and(|s| *s >= sev(i)))
        };
        if m.items.iter().any(heard) {
            let own = m.to_mut();
            own.items.retain(|i| !heard(i));
            if own.items.is_empty() {
                return None;
            }
            own.severity = (own.items.iter().map(sev)).max().unwrap_or(own.severity);
        }
        for i in &m.items {
            if let Some(c) = &i.cause {
                let e = told.entry(c.clone()).or_insert(sev(i));
                *e = (*e).max(sev(i));
            }
        }
        Some(m)
    }

    /// Per shared cause, the incidents whose state alert fires and whose route has not
    /// recovered yet (a recovery held back is under `held:<incident id>`).
    pub fn causes_open(&mut self) -> HashMap<String, Vec<String>> {
        let mut out: HashMap<String, Vec<String>> = HashMap::new();
        for (id, item, _) in self.incident_items() {
            if let Some(cause) = item.cause {
                if !self.by_key.contains_key(&held_key(&id)) {
                    out.entry(cause).or_default().push(id);
                }
            }
        }
        out
    }

    /// The recoveries held back: per incident id, the resolution text that held it.
    pub fn held(&self) -> Vec<(String, Arc<str>)> {
        (self.by_key.iter())
            .filter_map(|(k, t)| Some((k.strip_prefix("held:")?.to_owned(), t.clone())))
            .collect()
    }

    /// The message `text` holds, parsed once per enqueue.
    pub fn parsed(&mut self, text: &Arc<str>) -> Option<Arc<Parsed>> {
        self.texts.get(text)
    }

    /// The key the message `text` was triggered with on a channel with `routes` (memoised in
    /// `keys` for one call: a firing group text is shared by all its routes).
    fn channel_key(
        &mut self,
        keys: &mut HashMap<usize, Option<String>>,
        text: &Arc<str>,
        routes: &[String],
    ) -> Option<String> {
        // By address: the texts are held by `self` while the call lasts.
        let at = Arc::as_ptr(text).cast::<u8>() as usize;
        if let Some(k) = keys.get(&at) {
            return k.clone();
        }
        let k = self.texts.get(text).and_then(|p| {
            let own = routing::for_channel(&p.message, routes)?;
            Some(oncall::incident_key(&own))
        });
        keys.insert(at, k.clone());
        k
    }
}

/// The firing key under which the recovery of incident `id` waits for its cause's last route.
pub fn held_key(id: &str) -> String {
    format!("held:{id}")
}

/// The route a firing key (`incident:<id>`, or a gathered message's member) names in the
/// message that announced it.
fn route_of<'m>(key: &str, p: &'m Parsed) -> Option<&'m crate::route::RouteId> {
    let Some(id) = key.strip_prefix("incident:") else {
        return super::group::batch::member_route(&p.message, key);
    };
    p.incident(id).map(|i| &i.route)
}

#[cfg(test)]
mod tests {
    use super::super::{Message, RouteItem, Severity, Status, Subject};
    use super::*;
    use crate::state::State;

    fn item(route: &str, incident: &str, opened_min: i64) -> RouteItem {
        let at = chrono::DateTime::UNIX_EPOCH + chrono::Duration::minutes(opened_min);
        RouteItem {
            route: crate::route::RouteId::parse(route).unwrap(),
            serves: Vec::new(),
            from: State::Normal,
            to: State::Degraded,
            at,
            reason_code: "unavailable".into(),
            reason_text: String::new(),
            failure_mode: None,
            evidence: None,
            incident_id: Some(incident.to_owned()),
            opened_at: Some(at),
            closed_at: None,
            peak: None,
            shifted: None,
            path: Vec::new(),
            cause: None,
        }
    }

    fn text(subject: Subject, items: Vec<RouteItem>) -> Arc<str> {
        let m = Message {
            key: "k".into(),
            severity: Severity::Warning,
            status: Status::Firing,
            subject,
            at: chrono::DateTime::UNIX_EPOCH,
            items,
            related: Vec::new(),
            note: None,
            resolves: None,
        };
        Arc::from(serde_json::to_string(&m).unwrap())
    }

    fn provider(items: Vec<RouteItem>) -> Arc<str> {
        text(
            Subject::Provider {
                provider: "qwen".into(),
            },
            items,
        )
    }

    fn resolve(a: &mut Announced, keys: &[&str]) -> Vec<Arc<str>> {
        keys.iter().filter_map(|k| a.resolve(k)).collect()
    }

    #[test]
    fn a_group_is_resolved_when_its_last_route_resolves() {
        let group = provider(vec![
            item("qwen/cn/a", "i-a", 0),
            item("qwen/cn/b", "i-b", 1),
            item("qwen/cn/c", "i-c", 2),
        ]);
        let lone = text(Subject::Route, vec![item("qwen/us/d", "i-d", 3)]);
        let rows: Vec<FiringRow> = [("a", &group), ("b", &group), ("c", &group), ("d", &lone)]
            .iter()
            .map(|(k, t)| FiringRow {
                key: format!("incident:i-{k}"),
                message: (*t).clone(),
                opened_at: chrono::DateTime::UNIX_EPOCH,
            })
            .collect();
        let mut a = Announced::new(&rows);
        let group_key = a.channel_key(&mut HashMap::new(), &group, &[]).unwrap();
        let lone_key = a.channel_key(&mut HashMap::new(), &lone, &[]).unwrap();
        assert_ne!(group_key, lone_key);

        // The group's earliest route recovers first: nothing is resolved.
        let r = resolve(&mut a, &["incident:i-a", "incident:i-b"]);
        assert!(a.closed_keys(&r, &[]).is_empty());
        let r = resolve(&mut a, &["incident:i-d"]);
        assert_eq!(a.closed_keys(&r, &[]), vec![lone_key]);
        let r = resolve(&mut a, &["incident:i-c", "incident:i-x"]);
        assert_eq!(a.closed_keys(&r, &[]), vec![group_key.clone()]);

        // A channel that sees only route a was triggered for a alone, and resolves that.
        let mut a = Announced::new(&rows);
        let only_a = vec!["qwen/cn/a".to_owned()];
        let r = resolve(&mut a, &["incident:i-a"]);
        let keys = a.closed_keys(&r, &only_a);
        assert_eq!(keys.len(), 1);
        assert_ne!(keys[0], group_key);
    }

    #[test]
    fn routes_announced_again_under_the_same_key_keep_it_open() {
        let group = provider(vec![
            item("qwen/cn/a", "i-a", 0),
            item("qwen/cn/b", "i-b", 1),
        ]);
        let mut a = Announced::new(&[]);
        a.fire("incident:i-a", &group);
        a.fire("incident:i-b", &group);
        // Route a gets worse and is announced again, with the group's earliest incident:
        // the same key as the group.
        let worse = provider(vec![item("qwen/cn/a", "i-a", 0)]);
        a.fire("incident:i-a", &worse);
        let key = a.channel_key(&mut HashMap::new(), &group, &[]).unwrap();
        assert_eq!(
            a.channel_key(&mut HashMap::new(), &worse, &[]).unwrap(),
            key
        );
        let r = resolve(&mut a, &["incident:i-b"]);
        assert!(a.closed_keys(&r, &[]).is_empty(), "a still fires under it");
        let r = resolve(&mut a, &["incident:i-a"]);
        assert_eq!(a.closed_keys(&r, &[]), vec![key]);
    }
}
