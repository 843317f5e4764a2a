//! The channels probeok disabled on a gateway (`sync_disabled`), on both engines: remembered
//! per gateway, a second disable of one channel is one row, an enable forgets it.

use crate::common::pg;
use crate::on_both_engines;

use chrono::{DateTime, Utc};
use pg::TestDb;
use probeok::store::gateways::GatewayOp;
use probeok::store::StoreOptions;

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).unwrap()
}

on_both_engines! {
#[tokio::test]
async fn disabled_channels_are_remembered_per_gateway_until_enabled(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let a = "http://new-api:3000";
    let b = "http://one-api:3000";
    let disabled = |gateway: &str, channel_id: i64| GatewayOp::Disabled {
        gateway: gateway.into(),
        channel_id,
        route: "qwen/cn-beijing/qwen-max".into(),
        at: t0(),
    };
    assert_eq!(w.gateway(disabled(a, 12)).await.unwrap(), 1);
    assert_eq!(w.gateway(disabled(a, 15)).await.unwrap(), 1);
    assert_eq!(w.gateway(disabled(b, 12)).await.unwrap(), 1);
    // Disabled again (after a restart that lost the memory): still one row.
    w.gateway(disabled(a, 12)).await.unwrap();
    let read = |g: &str| store.reader().unwrap().sync_disabled(g).unwrap();
    assert_eq!(read(a), vec![12, 15]);
    assert_eq!(read(b), vec![12]);
    let enabled = GatewayOp::Enabled {
        gateway: a.into(),
        channel_id: 12,
    };
    assert_eq!(w.gateway(enabled.clone()).await.unwrap(), 1);
    assert_eq!(w.gateway(enabled).await.unwrap(), 0, "already forgotten");
    assert_eq!(read(a), vec![15]);
    assert_eq!(read(b), vec![12], "another gateway's channel 12 is its own");
    assert!(read("http://elsewhere").is_empty());
}
}
