//! Embeddings routes' vectors (`embedding_references`), on both engines: the first good vector
//! is the reference and later ones only the latest; adopting the latest makes it the
//! reference; clearing leaves the next vector to become it; vectors read back bit for bit.

use crate::common::pg;
use crate::on_both_engines;

use chrono::{DateTime, TimeDelta, Utc};
use pg::TestDb;
use probeok::store::embeddings::EmbeddingOp;
use probeok::store::StoreOptions;

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).unwrap()
}

const ROUTE: &str = "acme/r0/text-embedding-v3";

on_both_engines! {
#[tokio::test]
async fn the_first_vector_is_the_reference_until_the_latest_is_adopted(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let a = vec![0.6_f32, 0.8, -0.0, f32::MIN_POSITIVE, 1e-30];
    let b = vec![0.48_f32, 0.64, 0.6, 0.0, -3.5];
    let observe = |v: &Vec<f32>, at| EmbeddingOp::Observe {
        route: ROUTE.into(),
        vector: v.clone(),
        at,
    };
    let row = || store.reader().unwrap().embedding_row(ROUTE).unwrap();
    assert_eq!(row(), None);
    w.embedding(observe(&a, t0())).await.unwrap();
    let t1 = t0() + TimeDelta::minutes(1);
    w.embedding(observe(&b, t1)).await.unwrap();
    let r = row().unwrap();
    assert_eq!((r.reference.clone(), r.reference_at), (a.clone(), t0()));
    assert_eq!((r.latest.clone(), r.latest_at), (b.clone(), t1));
    assert_eq!(r.reference[2].to_bits(), (-0.0_f32).to_bits(), "bit for bit");

    let adopt = || EmbeddingOp::AdoptLatest { route: ROUTE.into() };
    assert_eq!(w.embedding(adopt()).await.unwrap(), 1);
    let r = row().unwrap();
    assert_eq!((r.reference, r.reference_at), (b.clone(), t1));

    assert_eq!(w.embedding(EmbeddingOp::Clear { route: ROUTE.into() }).await.unwrap(), 1);
    assert_eq!(row(), None);
    assert_eq!(w.embedding(adopt()).await.unwrap(), 0, "nothing to adopt");
    w.embedding(observe(&a, t1)).await.unwrap();
    assert_eq!(row().unwrap().reference, a);
}
}
