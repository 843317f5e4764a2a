//! The loop both kinds of capability probe run: `n` items each probed every `every`, the
//! first round spread evenly over one interval, at most `limit` probes in flight and never one
//! item twice at once; an item's next probe is due `every` after its last one started, or
//! [`judge::RECHECK`] after it when its judge asks for a quick re-check.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::judge::{self, Verdict};

/// How many of `items` probes, each assumed to take `probe_time`, must be in flight at once
/// for each item to be probed every `every`, kept within `[min, max]` (past `max` a round
/// takes longer than `every`, and probes come later, never more often).
pub fn bound(items: usize, every: Duration, probe_time: Duration, min: usize, max: usize) -> usize {
    let needed = (items as f64 * probe_time.as_secs_f64() / every.as_secs_f64().max(1.0)).ceil();
    (needed as usize).clamp(min, max)
}

/// What the loop drives: sending one item's probe, and taking its result.
pub trait Cadenced {
    type Done: Send + 'static;
    /// Item `i`'s probe, to run on its own task.
    fn send(&self, i: usize) -> impl Future<Output = Self::Done> + Send + 'static;
    /// Records and judges a result; says when its item is probed next.
    fn take(&mut self, done: &Self::Done) -> impl Future<Output = Verdict> + Send;
    /// Which item a result is of, and when its probe started.
    fn slot(done: &Self::Done) -> (usize, Instant);
}

/// Runs `p`'s `n` items until `shutdown`.
pub async fn run<P: Cadenced>(
    mut p: P,
    n: usize,
    every: Duration,
    limit: usize,
    shutdown: CancellationToken,
) {
    let start = Instant::now();
    let slots = u32::try_from(n).unwrap_or(u32::MAX);
    let mut due: Vec<Instant> = (0..slots).map(|i| start + every * i / slots).collect();
    let mut busy = vec![false; n];
    let mut running: JoinSet<P::Done> = JoinSet::new();
    loop {
        let now = Instant::now();
        for i in 0..n {
            if running.len() >= limit {
                break;
            }
            if !busy[i] && due[i] <= now {
                busy[i] = true;
                running.spawn(p.send(i));
            }
        }
        let next = (running.len() < limit)
            .then(|| (0..n).filter(|&i| !busy[i]).map(|i| due[i]).min())
            .flatten();
        let sleep = async {
            match next {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let joined = async {
            if running.is_empty() {
                std::future::pending().await
            } else {
                running.join_next().await
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = sleep => {}
            done = joined => {
                let Some(Ok(done)) = done else { continue };
                let (item, started) = P::slot(&done);
                busy[item] = false;
                let verdict = p.take(&done).await;
                due[item] = started
                    + match verdict {
                        Verdict::Next => every,
                        Verdict::Recheck => judge::RECHECK.min(every),
                    };
            }
        }
    }
}
