//! Firing rows of one stored message share its text (`Arc<str>`): a grouped message names
//! thousands of routes, and each route's row points at it. Each text is parsed once per
//! evaluation, and its routes' incidents are found by lookup, so the work grows with the
//! messages and routes, not with routes × the message's size.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Message, RouteItem};

/// One parsed text, with its items by incident id.
#[derive(Debug)]
pub struct Parsed {
    pub message: Message,
    by_incident: HashMap<String, usize>,
}

impl Parsed {
    /// The item of `message` for incident `id`.
    pub fn incident(&self, id: &str) -> Option<&RouteItem> {
        self.by_incident
            .get(id)
            .and_then(|&i| self.message.items.get(i))
    }
}

/// Texts parsed so far, by the address of their shared text; each entry holds its text, so
/// the address cannot be reused by another text while the map lives.
#[derive(Debug, Default)]
pub struct Texts {
    parsed: HashMap<usize, (Arc<str>, Option<Arc<Parsed>>)>,
}

impl Texts {
    /// The message `text` holds; `None` when it does not parse.
    pub fn get(&mut self, text: &Arc<str>) -> Option<Arc<Parsed>> {
        let at = Arc::as_ptr(text).cast::<u8>() as usize;
        let (_, parsed) = self.parsed.entry(at).or_insert_with(|| {
            let parsed = serde_json::from_str::<Message>(text).ok().map(|message| {
                let by_incident = (message.items.iter().enumerate())
                    .filter_map(|(i, item)| item.incident_id.clone().map(|id| (id, i)))
                    .collect();
                Arc::new(Parsed {
                    message,
                    by_incident,
                })
            });
            (text.clone(), parsed)
        });
        parsed.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::{Severity, Status, Subject};

    fn text(incidents: &[&str]) -> Arc<str> {
        let items = incidents
            .iter()
            .map(|id| {
                let mut v = serde_json::json!({
                    "route": format!("p/r/{id}"), "serves": [], "from": "NORMAL", "to": "DEGRADED",
                    "at": "2026-12-01T00:00:00Z", "reason_code": "probe_failed", "reason_text": "",
                    "failure_mode": null, "evidence": null, "incident_id": id,
                    "opened_at": null, "closed_at": null, "peak": null, "shifted": null
                });
                v["path"] = serde_json::json!([]);
                serde_json::from_value::<RouteItem>(v).unwrap()
            })
            .collect();
        let m = Message {
            key: "k".into(),
            severity: Severity::Warning,
            status: Status::Firing,
            subject: Subject::Provider {
                provider: "p".into(),
            },
            at: chrono::DateTime::UNIX_EPOCH,
            items,
            related: Vec::new(),
            note: None,
            resolves: None,
        };
        Arc::from(serde_json::to_string(&m).unwrap())
    }

    #[test]
    fn a_shared_text_is_parsed_once_and_its_incidents_found_by_id() {
        let shared = text(&["a", "b", "c"]);
        let rows = [shared.clone(), shared.clone(), shared];
        let mut t = Texts::default();
        let first = t.get(&rows[0]).unwrap();
        for r in &rows[1..] {
            assert!(Arc::ptr_eq(&first, &t.get(r).unwrap()), "parsed again");
        }
        assert_eq!(first.incident("b").unwrap().route.as_str(), "p/r/b");
        assert!(first.incident("x").is_none());
        assert!(t.get(&Arc::from("not a message")).is_none());
    }
}
