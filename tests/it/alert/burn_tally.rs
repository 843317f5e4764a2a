//! The burn-rate windows kept as running sums equal the windows read from the store's rollups:
//! the history before the start seeded from the rollups, every later outcome added as it is
//! stored, at many moments over three days.

use crate::common;

use std::time::Duration;

use chrono::TimeDelta;
use common::app::{at, id, outcome};
use probeok::alert::burn::read_windows;
use probeok::alert::tally::Tally;
use probeok::probe::OutcomeKind;
use probeok::store::{Store, StoreOptions};

#[tokio::test]
async fn running_sums_equal_the_rollups() {
    let dir = tempfile::tempdir().unwrap();
    let threshold = Duration::from_secs(2);
    let store = Store::open(
        &dir.path().join("t.db"),
        StoreOptions {
            latency_threshold: threshold,
        },
    )
    .unwrap();
    let routes = [id("a/r/m"), id("b/r/m")];
    let start = at("2026-05-17T00:00:00Z");
    // Four days of outcomes every 7 minutes, some failed, some slow, some passive (which the
    // budget does not count), in a deterministic mix.
    let mut all = Vec::new();
    for i in 0..(4 * 24 * 60 / 7) {
        let t = start + TimeDelta::minutes(7 * i) + TimeDelta::seconds(i % 50);
        for (k, r) in routes.iter().enumerate() {
            let x = (i as usize * 7 + k * 3) % 11;
            let kind = if x == 5 {
                OutcomeKind::Passive
            } else {
                OutcomeKind::Probe
            };
            let ok = x != 0 && x != 1;
            let ms = if x == 2 { 2500.0 } else { 300.0 };
            all.push(outcome(r.as_str(), kind, t, ok, ms));
        }
    }
    let boot = start + TimeDelta::days(2) + TimeDelta::minutes(3);
    let (before, after): (Vec<_>, Vec<_>) = all.into_iter().partition(|o| o.started_at < boot);
    store.writer().record_many(before).await.unwrap();

    let tally = Tally::new(routes.iter(), threshold);
    tally.seed(&store.reader().unwrap(), boot).unwrap();
    let mut checked = 0;
    for o in after {
        let t = o.started_at;
        store.writer().record(o.clone()).await.unwrap();
        tally.record(&o);
        // Compare now and then, including just before and after bucket edges.
        if o.route == routes[0] {
            continue;
        }
        let reader = store.reader().unwrap();
        for now in [t, t + TimeDelta::seconds(150), t + TimeDelta::minutes(4)] {
            for r in &routes {
                let stored = read_windows(&reader, r, now).unwrap();
                assert_eq!(tally.windows(r, now).unwrap(), stored, "{r} at {now}");
            }
            checked += 1;
        }
    }
    assert!(checked > 500, "{checked}");
    let reader = store.reader().unwrap();
    let w = read_windows(&reader, &routes[0], boot + TimeDelta::days(2)).unwrap();
    assert!(w.d3.bad > 0 && w.d3.total > w.h6.total, "{w:?}");
}
