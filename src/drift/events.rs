//! Drift findings as [`HealthEvent`]s: a small task watches the [`DriftSnapshot`] channel and
//! publishes every finding opened or closed ([`DriftSnapshot::diff`]) on the health event
//! broadcast, where the alert engine picks it up (severity `warning`, `info` for
//! `model_changed`).
//!
//! Findings already present when the task starts (restored from the store's history) are not
//! announced again: the alert outbox remembers what it announced across restarts, and a
//! finding that closes later still resolves its message.

use std::sync::Arc;

use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{DriftRx, DriftSnapshot};
use crate::clock::Clock;
use crate::health::HealthEvent;

/// The events for one change of the snapshot: opened findings first, then closed ones.
pub fn events(
    old: &DriftSnapshot,
    new: &DriftSnapshot,
    at: chrono::DateTime<chrono::Utc>,
) -> Vec<HealthEvent> {
    let (opened, closed) = DriftSnapshot::diff(old, new);
    let ev = |f: &super::DriftFinding, opened| HealthEvent::DriftFinding {
        finding: Box::new(f.clone()),
        opened,
        at,
    };
    opened
        .into_iter()
        .map(|f| ev(f, true))
        .chain(closed.into_iter().map(|f| ev(f, false)))
        .collect()
}

/// Forwards drift findings to `events` until `shutdown` or until the drift runner is gone.
pub fn spawn(
    mut rx: DriftRx,
    tx: broadcast::Sender<HealthEvent>,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let mut last = rx.borrow_and_update().clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
            let next = rx.borrow_and_update().clone();
            for ev in events(&last, &next, clock.now()) {
                // No subscriber (alerts off) is not an error.
                let _ = tx.send(ev);
            }
            last = next;
        }
    })
}
