//! Outbox rows are claimed before they are sent: two monitors sharing one database (here two
//! alert services on one store, as a leader and the member taking over from it) never send
//! the same row, and a row claimed by a member that died mid-send is sent once its claim runs
//! out — neither lost nor doubled. A real webhook receiver counts what arrives.

use crate::common;

use std::sync::Arc;

use common::alerts::{config, critical, rig, serve, t0, webhook, Fake, Kind};
use probeok::alert::outbox::CLAIM_FOR;
use probeok::alert::AlertService;
use probeok::clock::{Clock, ManualClock};
use probeok::severity::Severity;
use probeok::store::alerts::AlertOp;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_delivering_at_once_send_every_row_once() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, Some("whsec"), clock.clone());
    let addr = serve(hook.clone(), None).await.0;
    let channel = webhook("webhook[0]", addr, Some("whsec"), Severity::Info);
    let r = rig(vec![channel.clone()], clock.clone(), |_| {}).await;
    let events: Vec<_> = (0..20).map(|i| critical(i, t0())).collect();
    let written = r.push(events).await;
    assert!(written >= 1, "the outbox has rows");
    let rows = r.outbox().len();

    // The other member: its own service on the same database, the same channel.
    let other = Arc::new(AlertService::new(
        Arc::new(config(&r.db)),
        r.service.store.clone(),
        clock.clone(),
        vec![channel],
    ));
    let (a, b) = tokio::join!(r.service.deliver(), other.deliver());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        (a.delivered + b.delivered) as usize,
        rows,
        "every row delivered by exactly one member: {a:?} {b:?}"
    );
    assert_eq!(hook.got().len(), rows, "the receiver got each message once");
    assert!(r.outbox().iter().all(|row| row.status == "delivered"));

    // A later round of either finds nothing due.
    let again = other.deliver().await.unwrap();
    assert_eq!(again.delivered, 0);
    assert_eq!(hook.got().len(), rows);
}

#[tokio::test]
async fn a_row_claimed_by_a_member_that_died_is_sent_once_its_claim_runs_out() {
    let clock = Arc::new(ManualClock::new(t0()));
    let hook = Fake::new(Kind::Webhook, None, clock.clone());
    let addr = serve(hook.clone(), None).await.0;
    let r = rig(
        vec![webhook("webhook[0]", addr, None, Severity::Info)],
        clock.clone(),
        |_| {},
    )
    .await;
    r.push(vec![critical(0, t0())]).await;
    let row = r.outbox().into_iter().next().expect("one row");

    // A member claims it and dies before sending.
    let now = clock.now();
    let claimed = r
        .service
        .store
        .writer()
        .alert(AlertOp::Claim {
            id: row.id,
            now,
            until: now + CLAIM_FOR,
        })
        .await
        .unwrap();
    assert_eq!(claimed, 1);
    // A second claim of the same row loses.
    let again = r
        .service
        .store
        .writer()
        .alert(AlertOp::Claim {
            id: row.id,
            now,
            until: now + CLAIM_FOR,
        })
        .await
        .unwrap();
    assert_eq!(again, 0, "a claimed row cannot be claimed twice");

    // While the claim lasts, nobody sends it.
    clock.advance((CLAIM_FOR - chrono::Duration::seconds(1)).to_std().unwrap());
    let round = r.service.deliver().await.unwrap();
    assert_eq!(round.delivered, 0, "{round:?}");
    assert!(hook.got().is_empty());

    // Once it has run out, the next member's round sends it, once.
    clock.advance(std::time::Duration::from_secs(2));
    let round = r.service.deliver().await.unwrap();
    assert_eq!(round.delivered, 1, "{round:?}");
    assert_eq!(hook.got().len(), 1);
    assert_eq!(r.outbox()[0].status, "delivered");
}
