//! The export queue: finished spans go into a bounded queue with `try_send` (a request never
//! waits for the collector), one task takes them out in batches and hands each batch to the
//! OTLP/HTTP exporter. Spans that find the queue full, and whole batches the collector did not
//! take (refused, unreachable, too slow), are dropped and counted: tracing is evidence, and
//! losing some of it costs less than slowing live traffic or growing without bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Queued items (one request's spans, or one probe's) waiting for export, at most.
pub const QUEUE: usize = 2048;
/// Spans sent to the collector in one export call, at most.
pub const MAX_BATCH: usize = 512;
/// A batch is sent at the latest this long after its first span arrived.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);

/// The sending side of the queue, with the drop count.
#[derive(Debug, Clone)]
pub struct Queue {
    tx: mpsc::Sender<Vec<SpanData>>,
    dropped: Arc<AtomicU64>,
}

impl Queue {
    /// The queue and its export task (spawned on the current Tokio runtime). The task ends,
    /// after sending what is left, once every [`Queue`] clone is gone.
    pub fn spawn<E: SpanExporter + 'static>(exporter: E) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(rx, exporter, dropped.clone()));
        Self { tx, dropped }
    }

    /// Queues `spans`, or drops and counts them when the queue is full.
    pub fn send(&self, spans: Vec<SpanData>) {
        let n = spans.len() as u64;
        if n == 0 {
            return;
        }
        if self.tx.try_send(spans).is_err() {
            count(&self.dropped, n, "queue full");
        }
    }

    /// Spans dropped so far (queue full or not taken by the collector).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

fn count(dropped: &AtomicU64, n: u64, why: &str) {
    let before = dropped.fetch_add(n, Ordering::Relaxed);
    // Logged when the total crosses a power of two: a dead collector must not flood the log.
    if (before + n).ilog2() != before.checked_ilog2().unwrap_or(u32::MAX) {
        tracing::warn!(dropped = before + n, why, "trace spans dropped");
    }
}

async fn run<E: SpanExporter>(
    mut rx: mpsc::Receiver<Vec<SpanData>>,
    exporter: E,
    dropped: Arc<AtomicU64>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = first;
        let until = Instant::now() + FLUSH_EVERY;
        let mut closed = false;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(more)) => batch.extend(more),
                Ok(None) => {
                    closed = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        if let Err(e) = exporter.export(batch).await {
            count(&dropped, n, "export failed");
            tracing::debug!(error = %e, "trace export failed");
        }
        if closed {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
    use std::sync::Mutex;

    #[derive(Debug, Clone, Default)]
    struct Sink {
        batches: Arc<Mutex<Vec<usize>>>,
        fail: bool,
    }

    impl SpanExporter for Sink {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.batches.lock().unwrap().push(batch.len());
            if self.fail {
                Err(OTelSdkError::InternalFailure("down".into()))
            } else {
                Ok(())
            }
        }
    }

    fn spans(n: usize) -> Vec<SpanData> {
        let now = std::time::SystemTime::now();
        (0..n)
            .map(|_| {
                crate::trace::span::Span::new("x", opentelemetry::trace::SpanKind::Internal)
                    .at(now, now)
                    .data(
                        crate::trace::context::new_trace_id(),
                        crate::trace::context::new_span_id(),
                        None,
                    )
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn spans_are_batched_and_failed_batches_counted() {
        let ok = Sink::default();
        let q = Queue::spawn(ok.clone());
        q.send(spans(2));
        q.send(spans(3));
        tokio::time::sleep(FLUSH_EVERY * 2).await;
        assert_eq!(*ok.batches.lock().unwrap(), vec![5]);
        assert_eq!(q.dropped(), 0);

        let down = Sink {
            fail: true,
            ..Sink::default()
        };
        let q = Queue::spawn(down.clone());
        q.send(spans(4));
        tokio::time::sleep(FLUSH_EVERY * 2).await;
        assert_eq!(q.dropped(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let q = Queue::spawn(Sink::default());
        // Nothing runs the export task before this loop ends: the queue fills up.
        for _ in 0..QUEUE + 10 {
            q.send(spans(1));
        }
        assert_eq!(q.dropped(), 10);
    }
}
