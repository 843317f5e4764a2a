//! Taking what a queue holds in gatherings. A task that drains a queue the request path feeds
//! (`try_send`, never waiting) would otherwise be woken for every item: on a small machine a
//! wake-up of a parked thread costs more than the item's own work. [`Gather`] takes everything
//! queued at once and then lets the next items gather for a short pause, so its task wakes at
//! most once per pause, whatever the request rate; a take that filled its batch does not
//! pause, since more is already waiting.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

/// The pause between takes for queues whose consumer is not in a hurry (observations, passive
/// outcomes): short beside what they feed (10 s rollups, 1 s detection ticks), long enough
/// for hundreds of requests to share a wake-up.
pub const PAUSE: Duration = Duration::from_millis(20);

/// One consumer's pacing; see the module docs.
#[derive(Debug)]
pub struct Gather {
    pause: Duration,
    not_before: Option<Instant>,
}

impl Gather {
    pub fn new(pause: Duration) -> Self {
        Self {
            pause,
            not_before: None,
        }
    }

    /// Appends up to `max` items to `buf`, after the pause since the last take that did not
    /// fill its batch; 0 once the queue is closed and empty. Cancel-safe: a take dropped
    /// while it pauses loses nothing (the next one just does not pause).
    pub async fn take<T>(
        &mut self,
        rx: &mut mpsc::Receiver<T>,
        buf: &mut Vec<T>,
        max: usize,
    ) -> usize {
        if let Some(t) = self.not_before.take() {
            if t > Instant::now() {
                tokio::time::sleep_until(t).await;
            }
        }
        let n = rx.recv_many(buf, max).await;
        if n > 0 && n < max {
            self.not_before = Some(Instant::now() + self.pause);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn items_sent_during_the_pause_are_taken_together_after_it() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut g = Gather::new(Duration::from_millis(20));
        let mut buf = Vec::new();
        tx.send(1).await.unwrap();
        assert_eq!(g.take(&mut rx, &mut buf, 8).await, 1);
        let first = Instant::now();
        tx.send(2).await.unwrap();
        tx.send(3).await.unwrap();
        buf.clear();
        assert_eq!(g.take(&mut rx, &mut buf, 8).await, 2);
        assert_eq!(buf, [2, 3]);
        assert_eq!(Instant::now() - first, Duration::from_millis(20));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_take_does_not_pause_and_a_closed_queue_ends() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut g = Gather::new(Duration::from_millis(20));
        let mut buf = Vec::new();
        for i in 0..5 {
            tx.send(i).await.unwrap();
        }
        let start = Instant::now();
        assert_eq!(g.take(&mut rx, &mut buf, 3).await, 3);
        assert_eq!(g.take(&mut rx, &mut buf, 3).await, 2);
        assert_eq!(Instant::now(), start, "more was waiting: no pause");
        drop(tx);
        assert_eq!(g.take(&mut rx, &mut buf, 3).await, 0);
        assert_eq!(buf, [0, 1, 2, 3, 4]);
    }
}
