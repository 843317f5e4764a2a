//! Route observables from real traffic: every sent attempt of a finished request becomes a
//! [`Seen`] (status, refusal, TTFT and TPOT of streams, cost), and the answer of a request that
//! asked for structure is judged by [`super::structured`]. All of it goes over a bounded queue
//! ([`Observer`]: the request path only does a `try_send`; a full queue drops and counts) to a
//! task that judges the answers, adds everything into per-route minute and hour buckets and
//! writes the buckets it changed through the store's writer every [`FLUSH_EVERY`] (this
//! process's rows: `store::observed`). No prompt or answer text is kept or stored: an answer
//! is held only until it is judged.

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::record::AttemptOutcome;
use super::request::RequestCtx;
use super::stream::Streamed;
use super::structured::{self, Expect, Validity};
use crate::clock::Clock;
use crate::gather::Gather;
use crate::route::RouteId;
use crate::store::observed::TPOT_SCALE;
use crate::store::{ObservedBucket, ObservedRow, Span, Writer};

/// Requests waiting to be added up, at most.
pub const OBSERVE_QUEUE: usize = 4096;
/// How often changed buckets are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(10);
/// Observations taken from the queue at once.
const TAKE: usize = 512;
/// Answers larger than this are not judged ("not checked"), so the queue never holds a
/// large body alive.
pub const MAX_JUDGED_BYTES: usize = 256 * 1024;
/// Answer bytes waiting in the queue to be judged, at most; beyond it answers go unjudged.
pub const MAX_PENDING_BYTES: usize = 16 * 1024 * 1024;

/// What the task judges: the answer, or why it is not judged.
enum Judge {
    /// The answer and the bytes it holds in the queue.
    Answer(Content, usize),
    Skip(&'static str),
}

/// The answer to judge.
pub(crate) enum Content {
    /// A non-streamed answer body (OpenAI's chat completion JSON).
    Body(Bytes),
    /// A stream's assembled answer.
    Streamed(Streamed),
}

/// One sent attempt as the observables count it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    /// The route's id (an `Arc`: keying the buckets by it allocates nothing per request).
    route: RouteId,
    /// A complete answer (a refusal is one).
    ok: bool,
    status: Option<u16>,
    refused: bool,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    cost: Option<f64>,
}

enum Msg {
    Seen {
        seen: Vec<Seen>,
        judge: Option<(RouteId, Expect, Judge)>,
    },
    Flush(oneshot::Sender<()>),
}

/// Where finished requests go to be counted.
#[derive(Debug, Clone)]
pub struct Observer {
    tx: mpsc::Sender<Msg>,
    dropped: Arc<AtomicU64>,
    /// Answer bytes queued for judging.
    pending: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

impl Observer {
    /// Starts the task that adds observations up and writes them through `writer`; it ends
    /// once every `Observer` clone is dropped, after a last write.
    pub fn spawn(writer: Writer, clock: Arc<dyn Clock>) -> Self {
        let (tx, rx) = mpsc::channel(OBSERVE_QUEUE);
        let source = format!("{:016x}", rand::random::<u64>());
        let pending = Arc::new(AtomicUsize::new(0));
        let rollup = Rollup::new(source);
        tokio::spawn(run(rx, rollup, writer, clock, pending.clone()));
        Self {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
            pending,
        }
    }

    /// Counts a finished request's sent attempts; `answer` is the answering attempt's
    /// answer, judged when the request asked for structure. Never waits.
    pub(crate) fn request(&self, ctx: &RequestCtx, answer: Option<Content>) {
        let seen: Vec<Seen> = ctx
            .attempts
            .iter()
            .filter(|a| a.outcome != AttemptOutcome::Skipped)
            .map(|a| {
                let ok = a.outcome == AttemptOutcome::Ok || a.refused;
                Seen {
                    route: a.route.clone(),
                    ok,
                    status: a.status,
                    refused: a.refused,
                    ttft_ms: a.ttft_ms.filter(|_| ctx.stream && ok),
                    tpot_ms: a.tpot_ms.filter(|_| ok),
                    cost: a.cost.filter(|_| ok),
                }
            })
            .collect();
        if seen.is_empty() {
            return;
        }
        let last = seen.last().filter(|s| s.ok && !s.refused);
        let judge = match (last, answer) {
            (Some(s), Some(content)) if !ctx.expect.is_nothing() => {
                Some((s.route.clone(), ctx.expect.clone(), self.hold(content)))
            }
            _ => None,
        };
        let held = match &judge {
            Some((_, _, Judge::Answer(_, n))) => *n,
            _ => 0,
        };
        if self.tx.try_send(Msg::Seen { seen, judge }).is_err() {
            self.pending.fetch_sub(held, Ordering::Relaxed);
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(dropped = n, "route observations dropped (queue full)");
            }
        }
    }

    /// The answer to queue for judging, within [`MAX_JUDGED_BYTES`] and
    /// [`MAX_PENDING_BYTES`].
    fn hold(&self, content: Content) -> Judge {
        let n = match &content {
            Content::Body(b) => b.len(),
            Content::Streamed(s) => {
                s.text.len() + s.tool_args.iter().map(String::len).sum::<usize>()
            }
        };
        if n > MAX_JUDGED_BYTES {
            return Judge::Skip("answer_too_large");
        }
        let before = self.pending.fetch_add(n, Ordering::Relaxed);
        if before + n > MAX_PENDING_BYTES {
            self.pending.fetch_sub(n, Ordering::Relaxed);
            return Judge::Skip("queue_full");
        }
        Judge::Answer(content, n)
    }

    /// Writes what is counted so far and waits for the commit.
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Msg::Flush(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    /// Observations dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

async fn run(
    mut rx: mpsc::Receiver<Msg>,
    mut r: Rollup,
    writer: Writer,
    clock: Arc<dyn Clock>,
    pending: Arc<AtomicUsize>,
) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Woken once per gathering, not once per request.
    let mut gather = Gather::new(crate::gather::PAUSE);
    let mut msgs = Vec::with_capacity(TAKE);
    loop {
        tokio::select! {
            n = gather.take(&mut rx, &mut msgs, TAKE) => {
                if n == 0 {
                    r.flush(&writer, clock.now()).await;
                    return;
                }
                for msg in msgs.drain(..) {
                    match msg {
                        Msg::Seen { seen, judge } => {
                            let validity =
                                judge.map(|(route, expect, j)| (route, judged(&expect, j, &pending)));
                            r.add(clock.now(), &seen, validity);
                        }
                        Msg::Flush(ack) => {
                            r.flush(&writer, clock.now()).await;
                            let _ = ack.send(());
                        }
                    }
                }
            }
            _ = tick.tick() => r.flush(&writer, clock.now()).await,
        }
    }
}

/// The verdict on what was held for judging; an answer's bytes leave the queue's count.
fn judged(expect: &Expect, judge: Judge, pending: &AtomicUsize) -> Validity {
    match judge {
        Judge::Answer(content, n) => {
            pending.fetch_sub(n, Ordering::Relaxed);
            verdict(expect, content)
        }
        Judge::Skip(why) => Validity::NotChecked(why),
    }
}

/// Judges an answer (off the client's path).
fn verdict(expect: &Expect, content: Content) -> Validity {
    match content {
        Content::Streamed(s) if s.cut => Validity::NotChecked("answer_too_large"),
        Content::Streamed(s) => {
            let args: Vec<&str> = s.tool_args.iter().map(String::as_str).collect();
            structured::judge(expect, &s.text, &args)
        }
        Content::Body(body) => {
            let Ok(v) = serde_json::from_slice::<Value>(&body) else {
                return Validity::NotChecked("answer_not_json");
            };
            let message = &v["choices"][0]["message"];
            let text = message["content"].as_str().unwrap_or("");
            let args: Vec<&str> = (message["tool_calls"].as_array().into_iter().flatten())
                .filter_map(|c| c["function"]["arguments"].as_str())
                .collect();
            structured::judge(expect, text, &args)
        }
    }
}

/// The buckets this process holds: route × minute and route × hour.
struct Rollup {
    source: String,
    buckets: FxHashMap<(Span, RouteId, i64), ObservedBucket>,
    dirty: FxHashSet<(Span, RouteId, i64)>,
}

impl Rollup {
    fn new(source: String) -> Self {
        Self {
            source,
            buckets: FxHashMap::default(),
            dirty: FxHashSet::default(),
        }
    }

    fn add(&mut self, now: DateTime<Utc>, seen: &[Seen], validity: Option<(RouteId, Validity)>) {
        for span in [Span::Minute, Span::Hour] {
            let start = span.start(now);
            for s in seen {
                let key = (span, s.route.clone(), start);
                let b = self.buckets.entry(key.clone()).or_default();
                b.requests += 1;
                b.ok += u64::from(s.ok);
                b.refused += u64::from(s.refused);
                match s.status {
                    Some(429) => b.rate_limited += 1,
                    Some(st) if st >= 500 => b.server_error += 1,
                    _ => {}
                }
                if let Some(ms) = s.ttft_ms {
                    b.ttft.record(ms);
                }
                if let Some(ms) = s.tpot_ms {
                    b.tpot.record(ms * TPOT_SCALE);
                }
                if let Some(c) = s.cost.filter(|c| c.is_finite()) {
                    b.cost_sum += c;
                    b.cost_n += 1;
                }
                self.dirty.insert(key);
            }
            if let Some((route, v)) = &validity {
                let key = (span, route.clone(), start);
                let b = self.buckets.entry(key.clone()).or_default();
                match v {
                    Validity::Valid => {
                        b.checked += 1;
                        b.valid += 1;
                    }
                    Validity::Invalid(e) => {
                        b.checked += 1;
                        b.note_error(e);
                    }
                    Validity::NotChecked(_) => b.not_checked += 1,
                    Validity::NotApplicable => {}
                }
                self.dirty.insert(key);
            }
        }
    }

    /// Writes the changed buckets, then forgets the ones that are over.
    async fn flush(&mut self, writer: &Writer, now: DateTime<Utc>) {
        if !self.dirty.is_empty() {
            let rows: Vec<ObservedRow> = self
                .dirty
                .iter()
                .filter_map(|k| {
                    let b = self.buckets.get(k)?;
                    Some(ObservedRow {
                        span: k.0,
                        bucket_ms: k.2,
                        route: k.1.as_str().to_owned(),
                        source: self.source.clone(),
                        bucket: b.clone(),
                    })
                })
                .collect();
            match writer.record_observed(rows, now).await {
                // Kept dirty on failure: the next flush writes them again.
                Ok(()) => self.dirty.clear(),
                Err(e) => tracing::warn!(error = %e, "cannot store route observations"),
            }
        }
        let dirty = &self.dirty;
        self.buckets
            .retain(|k, _| dirty.contains(k) || k.0.start(now) == k.2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id(model: &str) -> RouteId {
        RouteId::new("p", "r", model)
    }

    fn seen(route: &str, ok: bool, status: u16) -> Seen {
        Seen {
            route: id(route),
            ok,
            status: Some(status),
            refused: false,
            ttft_ms: ok.then_some(120.0),
            tpot_ms: ok.then_some(20.0),
            cost: ok.then_some(0.01),
        }
    }

    #[test]
    fn attempts_add_into_minute_and_hour_buckets() {
        let mut r = Rollup::new("s".into());
        let now = Utc::now();
        r.add(
            now,
            &[seen("a", false, 503), seen("b", true, 200)],
            Some((id("b"), Validity::Invalid("content is not JSON".into()))),
        );
        r.add(now, &[seen("a", false, 429)], None);
        let a = &r.buckets[&(Span::Minute, id("a"), Span::Minute.start(now))];
        assert_eq!(
            (a.requests, a.ok, a.server_error, a.rate_limited),
            (2, 0, 1, 1)
        );
        let b = &r.buckets[&(Span::Hour, id("b"), Span::Hour.start(now))];
        assert_eq!((b.requests, b.ok, b.checked, b.valid), (1, 1, 1, 0));
        assert_eq!(b.errors, ["content is not JSON"]);
        assert_eq!(b.cost_n, 1);
        let tpot = b.tpot_ms(0.5).unwrap();
        assert!((tpot - 20.0).abs() / 20.0 < 0.1, "{tpot}");
        assert_eq!(r.dirty.len(), 4);
    }

    #[test]
    fn answers_held_for_judging_are_bounded() {
        let (tx, _rx) = mpsc::channel(4);
        let o = Observer {
            tx,
            dropped: Arc::default(),
            pending: Arc::default(),
        };
        let big = Content::Body(Bytes::from(vec![b' '; MAX_JUDGED_BYTES + 1]));
        assert!(matches!(o.hold(big), Judge::Skip("answer_too_large")));
        o.pending.store(MAX_PENDING_BYTES - 10, Ordering::Relaxed);
        let small = || Content::Body(Bytes::from_static(b"{\"choices\": []}"));
        assert!(matches!(o.hold(small()), Judge::Skip("queue_full")));
        o.pending.store(0, Ordering::Relaxed);
        assert!(matches!(o.hold(small()), Judge::Answer(_, 15)));
        assert_eq!(o.pending.load(Ordering::Relaxed), 15);
    }

    #[test]
    fn answers_are_judged_from_bodies_and_streams() {
        let body = json!({"choices": [{"message": {"content": "{\"a\":"}}]});
        let v = verdict(
            &Expect::JsonObject,
            Content::Body(Bytes::from(body.to_string())),
        );
        assert!(matches!(v, Validity::Invalid(_)));
        let body = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"function": {"name": "f", "arguments": "{\"x\": 1}"}}]}}]});
        let v = verdict(&Expect::Tools, Content::Body(Bytes::from(body.to_string())));
        assert_eq!(v, Validity::Valid);
        let s = Streamed {
            text: "{\"a\": 1}".into(),
            cut: true,
            ..Streamed::default()
        };
        assert_eq!(
            verdict(&Expect::JsonObject, Content::Streamed(s.clone())),
            Validity::NotChecked("answer_too_large")
        );
        let s = Streamed { cut: false, ..s };
        assert_eq!(
            verdict(&Expect::JsonObject, Content::Streamed(s)),
            Validity::Valid
        );
    }
}
