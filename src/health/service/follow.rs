//! The health service of a cluster follower: it judges nothing and publishes what the
//! leader stored, through the same publish path as a leader's own judgements.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::{HealthService, HealthSnapshot, RouteHealth};
use crate::store::Store;

/// How far before the newest save already read a follower reads again (ms).
const FOLLOW_MARGIN_MS: i64 = 10_000;

impl HealthService {
    /// Publishes into `tx` from now on, its receivers seeing this service's snapshot at once:
    /// a cluster member's successive services (one per leader or follower term) share one
    /// watch, so the pages, the weights and the proxy never notice the change of term.
    pub fn publish_into(&mut self, tx: watch::Sender<Arc<HealthSnapshot>>) {
        // Read before sending: `tx` may be this service's own channel already.
        let current = self.snapshot.borrow().clone();
        tx.send_replace(current);
        self.snapshot = tx;
    }

    /// A follower's service (another member of the cluster leads and judges): every
    /// `every` it reads the route states stored since its last read and publishes them through the same path as
    /// its own judgements, with the findings recomputed from them, until `shutdown`. It
    /// judges nothing and stores nothing; the leader's transitions (stored at once) and
    /// periodic saves are what it shows.
    pub async fn follow(mut self, store: Store, every: Duration, shutdown: CancellationToken) {
        // A follower judges nothing: its baselines need not warm (the rebuild stops).
        self.warming = None;
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut failing = false;
        // The newest save read so far; `None` until the first full read.
        let mut newest: Option<i64> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let reading = store.clone();
            // Only the states saved since the last read, with a margin for saves committed
            // out of their clock order and for members' clocks that differ a little.
            let since = newest.map_or(i64::MIN, |ms| ms.saturating_sub(FOLLOW_MARGIN_MS));
            let stored = tokio::task::spawn_blocking(move || {
                reading
                    .reader()?
                    .route_health_updated_since::<RouteHealth>(since)
            })
            .await;
            match stored {
                Ok(Ok(rows)) => {
                    failing = false;
                    let now = self.clock.now();
                    for row in &rows {
                        let ms = row.updated_at.timestamp_millis();
                        newest = Some(newest.map_or(ms, |n| n.max(ms)));
                    }
                    for row in rows {
                        if let Some(&i) = self.index.get(&row.route) {
                            self.routes[i].health = row.health;
                            self.wheel.touch(i);
                        }
                    }
                    // Every route, read now or not: what a route shows moves with time too.
                    for i in 0..self.routes.len() {
                        self.refresh(i, now);
                    }
                    self.refresh_baselines();
                    self.evaluate_findings();
                    self.publish();
                }
                Ok(Err(e)) => {
                    if !failing {
                        tracing::error!(error = %e, "follower: cannot read the stored route states; showing the last ones");
                    }
                    failing = true;
                }
                Err(e) => tracing::error!(error = %e, "follower: reading route states panicked"),
            }
        }
        tracing::debug!("follower's health view stopped");
    }
}
