//! Reading what a status page says, pure: Atlassian Statuspage's public v2 JSON
//! (`summary.json` for component states and open incidents, `incidents.json` for the last
//! incidents with their updates) and RSS 2.0 / Atom incident feeds, into the store's
//! [`DeclaredIncident`] rows and `(component, status)` pairs.
//!
//! Pages are read leniently (unknown fields ignored, missing optional ones defaulted), but an
//! answer that is not the documented shape at all is an error, never "no incidents": the last
//! known state is then kept.

use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::store::declared::DeclaredIncident;

#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("not Statuspage v2 JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("not an RSS or Atom feed: {0}")]
    Feed(String),
}

/// What one read of a page says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageRead {
    /// `(component name, status)`; `None` for a feed, which has no component states.
    pub components: Option<Vec<(String, String)>>,
    pub incidents: Vec<DeclaredIncident>,
}

#[derive(Debug, Deserialize)]
struct Summary {
    components: Vec<Component>,
    #[serde(default)]
    incidents: Vec<Incident>,
}

#[derive(Debug, Deserialize)]
struct Incidents {
    incidents: Vec<Incident>,
}

#[derive(Debug, Deserialize)]
struct Component {
    name: String,
    status: String,
}

#[derive(Debug, Deserialize)]
struct Incident {
    id: String,
    name: String,
    status: String,
    impact: Option<String>,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    resolved_at: Option<DateTime<Utc>>,
    shortlink: Option<String>,
    #[serde(default)]
    components: Vec<IncidentComponent>,
    #[serde(default)]
    incident_updates: Vec<Update>,
}

#[derive(Debug, Deserialize)]
struct IncidentComponent {
    name: String,
}

#[derive(Debug, Deserialize)]
struct Update {
    #[serde(default)]
    affected_components: Option<Vec<Affected>>,
}

#[derive(Debug, Deserialize)]
struct Affected {
    name: String,
}

/// A `summary.json` answer: component states and the unresolved incidents.
pub fn statuspage_summary(
    provider: &str,
    page: &str,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<PageRead, ParseError> {
    let s: Summary = serde_json::from_slice(body)?;
    Ok(PageRead {
        components: Some(
            s.components
                .into_iter()
                .map(|c| (c.name, c.status))
                .collect(),
        ),
        incidents: s
            .incidents
            .into_iter()
            .map(|i| incident(provider, page, i, now))
            .collect(),
    })
}

/// An `incidents.json` answer: the page's last incidents, resolved or not.
pub fn statuspage_incidents(
    provider: &str,
    page: &str,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<Vec<DeclaredIncident>, ParseError> {
    let s: Incidents = serde_json::from_slice(body)?;
    Ok(s.incidents
        .into_iter()
        .map(|i| incident(provider, page, i, now))
        .collect())
}

fn incident(provider: &str, page: &str, i: Incident, now: DateTime<Utc>) -> DeclaredIncident {
    // The incident's components, or failing that every component its updates touched.
    let mut components: Vec<String> = i.components.into_iter().map(|c| c.name).collect();
    if components.is_empty() {
        for u in i.incident_updates {
            for a in u.affected_components.unwrap_or_default() {
                if !components.contains(&a.name) {
                    components.push(a.name);
                }
            }
        }
    }
    let resolved = matches!(i.status.as_str(), "resolved" | "postmortem");
    DeclaredIncident {
        provider: provider.to_owned(),
        page: page.to_owned(),
        id: i.id,
        name: i.name,
        impact: i.impact,
        declared_at: i.created_at,
        started_at: i.started_at.unwrap_or(i.created_at).min(i.created_at),
        // A page that says resolved without a time: resolved when it was read so.
        resolved_at: i.resolved_at.or(resolved.then_some(now)),
        status: i.status,
        url: i.shortlink,
        components,
        seen_at: now,
    }
}

/// An RSS 2.0 or Atom feed: one incident per entry. A feed has no machine-readable status,
/// so an entry is resolved when its newest update says so ([`says_resolved`]), at the
/// entry's update time; the components are those of `known` that its title or text names.
pub fn feed(
    provider: &str,
    page: &str,
    body: &[u8],
    known: &[&str],
    now: DateTime<Utc>,
) -> Result<PageRead, ParseError> {
    let parsed = feed_rs::parser::parse(body).map_err(|e| ParseError::Feed(e.to_string()))?;
    let incidents = parsed
        .entries
        .into_iter()
        .filter_map(|e| {
            let title = e.title.map(|t| t.content).unwrap_or_default();
            let text = e
                .content
                .and_then(|c| c.body)
                .or(e.summary.map(|s| s.content))
                .unwrap_or_default();
            let declared = e.published.or(e.updated)?;
            let updated = e.updated.unwrap_or(declared);
            let resolved = says_resolved(&title, &text);
            let haystack = format!("{title}\n{text}");
            let components = known
                .iter()
                .filter(|k| haystack.contains(**k))
                .map(|k| (*k).to_owned())
                .collect();
            Some(DeclaredIncident {
                provider: provider.to_owned(),
                page: page.to_owned(),
                id: if e.id.is_empty() { title.clone() } else { e.id },
                name: title,
                status: if resolved {
                    "resolved"
                } else {
                    "investigating"
                }
                .to_owned(),
                impact: None,
                declared_at: declared,
                started_at: declared,
                resolved_at: resolved.then_some(updated.max(declared)),
                url: e.links.into_iter().next().map(|l| l.href),
                components,
                seen_at: now,
            })
        })
        .collect();
    Ok(PageRead {
        components: None,
        incidents,
    })
}

/// Feeds put the newest update first in an entry's text, each led by its status word
/// (Statuspage: `<p><strong>Resolved</strong> - …</p>`; incident.io and Instatus alike): the
/// newest update is resolved when its text, tags stripped, starts with one of those words.
/// A title marked `[Resolved]` / `(Resolved)` counts too.
fn says_resolved(title: &str, text: &str) -> bool {
    let title = title.to_ascii_lowercase();
    if title.contains("[resolved]") || title.contains("(resolved)") {
        return true;
    }
    let plain = strip_tags(text);
    let first = plain
        .split(|c: char| !c.is_alphanumeric())
        .find(|w| !w.is_empty())
        .unwrap_or_default()
        .to_ascii_lowercase();
    matches!(first.as_str(), "resolved" | "completed" | "postmortem")
}

fn strip_tags(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(4096));
    let mut in_tag = false;
    for c in text.chars().take(4096) {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                out.push(' ');
            }
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    const SUMMARY: &str = r#"{
      "page": {"id": "kctbh9vrtdwd", "name": "Example", "url": "https://status.example.com",
               "time_zone": "Etc/UTC", "updated_at": "2026-12-01T10:12:00.000Z"},
      "components": [
        {"id": "c1", "name": "API", "status": "major_outage", "created_at": "2024-01-01T00:00:00Z",
         "updated_at": "2026-12-01T10:12:00Z", "position": 1, "description": null, "showcase": false,
         "start_date": null, "group_id": null, "page_id": "kctbh9vrtdwd", "group": false,
         "only_show_if_degraded": false},
        {"id": "c2", "name": "Console", "status": "operational", "group": false}
      ],
      "incidents": [
        {"id": "inc1", "name": "Elevated errors on the API", "status": "investigating",
         "created_at": "2026-12-01T10:12:00.000Z", "updated_at": "2026-12-01T10:12:00.000Z",
         "monitoring_at": null, "resolved_at": null, "impact": "major",
         "shortlink": "https://stspg.io/abc", "started_at": "2026-12-01T10:00:00.000Z",
         "page_id": "kctbh9vrtdwd",
         "incident_updates": [{"id": "u1", "status": "investigating", "body": "We are investigating.",
            "incident_id": "inc1", "created_at": "2026-12-01T10:12:00.000Z",
            "affected_components": [{"code": "c1", "name": "API", "old_status": "operational",
                                     "new_status": "major_outage"}]}],
         "components": [{"id": "c1", "name": "API", "status": "major_outage"}]}
      ],
      "scheduled_maintenances": [],
      "status": {"indicator": "major", "description": "Partial System Outage"}
    }"#;

    #[test]
    fn a_summary_gives_component_states_and_open_incidents() {
        let now = t("2026-12-01T10:13:00Z");
        let r =
            statuspage_summary("p", "https://status.example.com", SUMMARY.as_bytes(), now).unwrap();
        assert_eq!(
            r.components.unwrap(),
            vec![
                ("API".to_owned(), "major_outage".to_owned()),
                ("Console".to_owned(), "operational".to_owned())
            ]
        );
        let i = &r.incidents[0];
        assert_eq!(i.id, "inc1");
        assert_eq!(i.declared_at, t("2026-12-01T10:12:00Z"));
        assert_eq!(i.started_at, t("2026-12-01T10:00:00Z"));
        assert_eq!(i.components, vec!["API".to_owned()]);
        assert_eq!(i.url.as_deref(), Some("https://stspg.io/abc"));
        assert!(!i.is_resolved());
    }

    #[test]
    fn an_incident_without_components_takes_those_its_updates_touched() {
        let body = r#"{"page": {}, "incidents": [{"id": "i", "name": "n", "status": "resolved",
          "impact": "minor", "created_at": "2026-12-01T10:00:00Z", "resolved_at": "2026-12-01T11:00:00Z",
          "incident_updates": [{"affected_components": [{"name": "Chat"}, {"name": "Chat"}]},
                               {"affected_components": null}]}]}"#;
        let r = statuspage_incidents("p", "u", body.as_bytes(), t("2026-12-02T00:00:00Z")).unwrap();
        assert_eq!(r[0].components, vec!["Chat".to_owned()]);
        assert_eq!(r[0].resolved_at, Some(t("2026-12-01T11:00:00Z")));
    }

    #[test]
    fn a_page_that_is_not_the_documented_shape_is_an_error_not_an_empty_page() {
        let now = t("2026-12-01T00:00:00Z");
        for body in [
            "",
            "{}",
            "<html>maintenance</html>",
            r#"{"components": 3}"#,
            "[]",
        ] {
            assert!(
                statuspage_summary("p", "u", body.as_bytes(), now).is_err(),
                "{body:?} was read as a page"
            );
        }
        assert!(statuspage_incidents("p", "u", b"{\"page\":{}}", now).is_err());
        assert!(feed("p", "u", b"{not xml", &[], now).is_err());
    }

    #[test]
    fn an_atom_feed_gives_incidents_with_their_named_components_and_resolution() {
        let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<feed xmlns="http://www.w3.org/2005/Atom" xml:lang="en-US">
  <id>tag:status.example.com,2005:/history</id>
  <link rel="alternate" type="text/html" href="https://status.example.com"/>
  <title>Example Status - Incident History</title>
  <updated>2026-12-01T11:00:00Z</updated>
  <entry>
    <id>tag:status.example.com,2005:Incident/2</id>
    <published>2026-12-01T10:12:00Z</published>
    <updated>2026-12-01T11:00:00Z</updated>
    <link rel="alternate" type="text/html" href="https://status.example.com/incidents/2"/>
    <title>Elevated errors on Chat API</title>
    <content type="html">&lt;p&gt;&lt;strong&gt;Resolved&lt;/strong&gt; - This incident has been resolved.&lt;/p&gt;&lt;p&gt;&lt;strong&gt;Investigating&lt;/strong&gt; - We are investigating errors on Chat API.&lt;/p&gt;</content>
  </entry>
  <entry>
    <id>tag:status.example.com,2005:Incident/3</id>
    <published>2026-12-01T12:00:00Z</published>
    <updated>2026-12-01T12:05:00Z</updated>
    <link rel="alternate" type="text/html" href="https://status.example.com/incidents/3"/>
    <title>Slow responses</title>
    <content type="html">&lt;p&gt;&lt;strong&gt;Investigating&lt;/strong&gt; - We are looking into it; the last incident was resolved.&lt;/p&gt;</content>
  </entry>
</feed>"#;
        let r = feed(
            "p",
            "u",
            body.as_bytes(),
            &["Chat API", "Embeddings"],
            t("2026-12-01T12:06:00Z"),
        )
        .unwrap();
        assert_eq!(r.components, None);
        let (a, b) = (&r.incidents[0], &r.incidents[1]);
        assert_eq!(a.declared_at, t("2026-12-01T10:12:00Z"));
        assert_eq!(a.resolved_at, Some(t("2026-12-01T11:00:00Z")));
        assert_eq!(a.components, vec!["Chat API".to_owned()]);
        assert_eq!(
            a.url.as_deref(),
            Some("https://status.example.com/incidents/2")
        );
        // Only the newest update counts: an older "resolved" in the text does not close it.
        assert!(!b.is_resolved(), "{b:?}");
        assert!(b.components.is_empty());
    }

    #[test]
    fn an_rss_feed_is_read_too() {
        let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<rss version="2.0"><channel><title>Status</title><link>https://status.example.com</link>
<description>Incidents</description>
<item><title>API outage</title><link>https://status.example.com/i/9</link>
<guid>https://status.example.com/i/9</guid><pubDate>Tue, 01 Dec 2026 10:12:00 +0000</pubDate>
<description>We are investigating.</description></item>
</channel></rss>"#;
        let r = feed(
            "p",
            "u",
            body.as_bytes(),
            &["API"],
            t("2026-12-01T10:13:00Z"),
        )
        .unwrap();
        assert_eq!(r.incidents.len(), 1);
        assert_eq!(r.incidents[0].declared_at, t("2026-12-01T10:12:00Z"));
        assert_eq!(r.incidents[0].id, "https://status.example.com/i/9");
        assert!(!r.incidents[0].is_resolved());
    }
}
