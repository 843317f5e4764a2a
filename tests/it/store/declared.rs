//! What providers declare on their status pages (`declared_components`,
//! `declared_incidents`), on both engines: a component's `since` stays while its state does,
//! a component the page stops listing is forgotten, incidents are updated in place and kept
//! after they resolve, and a feed's read (no component states) leaves the components alone.

use crate::common::pg;
use crate::on_both_engines;

use chrono::{DateTime, TimeDelta, Utc};
use pg::TestDb;
use probeok::store::declared::{DeclaredIncident, DeclaredOp};
use probeok::store::StoreOptions;

fn t(min: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).unwrap() + TimeDelta::minutes(min)
}

const PAGE: &str = "https://status.example.com";

fn incident(id: &str, declared: i64, resolved: Option<i64>) -> DeclaredIncident {
    DeclaredIncident {
        provider: "anthropic".into(),
        page: PAGE.into(),
        id: id.into(),
        name: format!("Elevated errors ({id})"),
        status: if resolved.is_some() {
            "resolved"
        } else {
            "investigating"
        }
        .into(),
        impact: Some("major".into()),
        declared_at: t(declared),
        started_at: t(declared - 5),
        resolved_at: resolved.map(t),
        url: Some(format!("https://stspg.io/{id}")),
        components: vec!["API".into(), "Console".into()],
        seen_at: t(declared),
    }
}

fn read(components: &[(&str, &str)], incidents: Vec<DeclaredIncident>, at: i64) -> DeclaredOp {
    DeclaredOp::Page {
        provider: "anthropic".into(),
        page: PAGE.into(),
        components: Some(
            components
                .iter()
                .map(|(c, s)| ((*c).to_owned(), (*s).to_owned()))
                .collect(),
        ),
        incidents,
        at: t(at),
    }
}

on_both_engines! {
#[tokio::test]
async fn declared_states_and_incidents_are_kept_as_the_page_changes(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    w.declared(read(&[("API", "operational"), ("Console", "operational")], vec![], 0))
        .await
        .unwrap();
    w.declared(read(
        &[("API", "major_outage"), ("Console", "operational")],
        vec![incident("a", 10, None)],
        10,
    ))
    .await
    .unwrap();
    // Read again unchanged, later: `since` is when the state was first read.
    w.declared(read(
        &[("API", "major_outage"), ("Console", "operational")],
        vec![incident("a", 10, None)],
        12,
    ))
    .await
    .unwrap();
    let r = store.reader().unwrap();
    let c = r.declared_components().unwrap();
    assert_eq!(c.len(), 2);
    assert_eq!((c[0].component.as_str(), c[0].status.as_str()), ("API", "major_outage"));
    assert_eq!(c[0].since, t(10));
    assert_eq!(c[1].since, t(0));
    let open = r.declared_incidents(t(0), 100).unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0], incident("a", 10, None), "read back as written");

    // Resolved, and Console no longer listed: the incident is kept (it is history), the
    // component forgotten.
    w.declared(read(&[("API", "operational")], vec![incident("a", 10, Some(30))], 31))
        .await
        .unwrap();
    let r = store.reader().unwrap();
    let c = r.declared_components().unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].status.as_str(), c[0].since), ("operational", t(31)));
    let all = r.declared_incidents(t(0), 100).unwrap();
    assert_eq!(all[0].resolved_at, Some(t(30)));
    assert!(all[0].is_resolved());
    assert_eq!(all[0].seen_at, t(10), "first read kept");
    assert!(r.declared_incidents(t(31), 100).unwrap().is_empty(), "resolved before 31");

    // A feed's read names no component states: the components stay as they were.
    w.declared(DeclaredOp::Page {
        provider: "anthropic".into(),
        page: PAGE.into(),
        components: None,
        incidents: vec![incident("b", 40, None)],
        at: t(40),
    })
    .await
    .unwrap();
    let r = store.reader().unwrap();
    assert_eq!(r.declared_components().unwrap().len(), 1);
    let newest = r.declared_incidents(t(0), 1).unwrap();
    assert_eq!(newest[0].id, "b", "newest declaration first, limited");
}
}
