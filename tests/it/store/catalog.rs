//! The model catalog's tables (`catalog_models`, `catalog_notices`), on both engines: one
//! answer's rows written per provider region, rewritten by the next, forgotten on request; a
//! retirement notice recorded once.

use crate::common::pg;
use crate::on_both_engines;

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
use pg::TestDb;
use probeok::store::catalog::{CatalogOp, ModelRow};
use probeok::store::StoreOptions;

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).unwrap()
}

fn row(model: &str, first: DateTime<Utc>, last: DateTime<Utc>, missing: u32) -> ModelRow {
    ModelRow {
        model: model.into(),
        first_seen: first,
        last_seen: last,
        missing,
    }
}

on_both_engines! {
#[tokio::test]
async fn catalog_rows_are_kept_per_region_and_notices_once(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let a = "openai https://api.openai.com/v1 OPENAI_API_KEY";
    let b = "anthropic https://api.anthropic.com ANTHROPIC_API_KEY";
    let t1 = t0() + TimeDelta::hours(1);
    w.catalog(CatalogOp::Answer {
        region: a.into(),
        rows: vec![row("gpt-4o", t0(), t0(), 0), row("gpt-4-0613", t0(), t0(), 0)],
        forget: Vec::new(),
    })
    .await
    .unwrap();
    w.catalog(CatalogOp::Answer {
        region: b.into(),
        rows: vec![row("gpt-4o", t0(), t0(), 0)],
        forget: Vec::new(),
    })
    .await
    .unwrap();
    // The next answer of `a`: gpt-4o seen again, gpt-4-0613 missing once, o1 forgotten (never there).
    w.catalog(CatalogOp::Answer {
        region: a.into(),
        rows: vec![row("gpt-4o", t0(), t1, 0), row("gpt-4-0613", t0(), t0(), 1)],
        forget: vec!["o1".into()],
    })
    .await
    .unwrap();
    let all = store.reader().unwrap().catalog_models().unwrap();
    assert_eq!(
        all,
        vec![
            (b.to_owned(), row("gpt-4o", t0(), t0(), 0)),
            (a.to_owned(), row("gpt-4-0613", t0(), t0(), 1)),
            (a.to_owned(), row("gpt-4o", t0(), t1, 0)),
        ]
    );
    let n = w
        .catalog(CatalogOp::Answer {
            region: a.into(),
            rows: Vec::new(),
            forget: vec!["gpt-4-0613".into()],
        })
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(store.reader().unwrap().catalog_models().unwrap().len(), 2);

    let date = NaiveDate::from_ymd_opt(2026, 6, 30).unwrap();
    let notice = |days| CatalogOp::Notice {
        route: "openai/us/gpt-4-0613".into(),
        retires: date,
        days,
        at: t0(),
    };
    assert_eq!(w.catalog(notice(30)).await.unwrap(), 1);
    assert_eq!(w.catalog(notice(30)).await.unwrap(), 0, "recorded once");
    assert_eq!(w.catalog(notice(7)).await.unwrap(), 1);
    let mut sent = store.reader().unwrap().catalog_notices().unwrap();
    sent.sort();
    assert_eq!(
        sent,
        vec![
            ("openai/us/gpt-4-0613".to_owned(), date, 7),
            ("openai/us/gpt-4-0613".to_owned(), date, 30),
        ]
    );
}
}
