//! Baselines' saved parts (`baseline_parts`), on both engines: a save writes a head and the
//! buckets it names; a later save replaces the head and its buckets and keeps the others;
//! each vantage of a route is its own baseline; the bytes read back as written; a route
//! without a head has no saved baseline. The store counts the rows its readers read.

use crate::common::pg;
use crate::on_both_engines;

use chrono::{DateTime, TimeDelta, Utc};
use pg::TestDb;
use probeok::store::baselines::SavedBaseline;
use probeok::store::StoreOptions;

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).unwrap()
}

const ROUTE: &str = "acme/r0/m";

fn saved(
    vantage: &str,
    head: &[u8],
    buckets: &[(i32, &[u8])],
    newest: DateTime<Utc>,
) -> SavedBaseline {
    SavedBaseline {
        route: ROUTE.into(),
        vantage: vantage.into(),
        shape: "v1 window=100".into(),
        newest: Some(newest),
        head: head.to_vec(),
        buckets: buckets.iter().map(|(i, b)| (*i, b.to_vec())).collect(),
    }
}

on_both_engines! {
#[tokio::test]
async fn a_save_replaces_the_head_and_its_buckets_and_keeps_the_others(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let read = |vantage: &str| store.reader().unwrap().saved_baseline(ROUTE, vantage).unwrap();
    assert_eq!(read(""), None);

    let first = saved("", &[1, 0, 255], &[(3, &[7, 7]), (4, &[8, 0, 8])], t0());
    w.save_baselines(vec![first.clone()]).await.unwrap();
    assert_eq!(read(""), Some(first));

    let later = t0() + TimeDelta::minutes(10);
    let far = saved("cn-beijing", &[9], &[], t0());
    let second = saved("", &[1, 1], &[(4, &[0])], later);
    w.save_baselines(vec![second, far.clone()]).await.unwrap();
    let got = read("").unwrap();
    assert_eq!(got.head, vec![1, 1]);
    assert_eq!(got.newest, Some(later));
    assert_eq!(
        got.buckets,
        vec![(3, vec![7, 7]), (4, vec![0])],
        "bucket 3 kept from the first save, 4 replaced"
    );
    assert_eq!(read("cn-beijing"), Some(far), "each vantage its own baseline");

    let before = store.rows_read();
    read("");
    assert_eq!(store.rows_read() - before, 3, "a head and two buckets read");
}
}
