//! A committed stream, forwarded to the client event by event as it arrives (no buffering
//! beyond one SSE event: an event is sent the moment its blank line is read).
//!
//! After the commit point there is never a failover and never a second model's text: an
//! upstream error event, a stall past `stream_idle_timeout`, an end without a finish reason /
//! `[DONE]`, a malformed chunk (an SSE line over 1 MiB too) or a stream older than
//! `max_stream_duration` ends the client's stream with the documented
//! `data: {"error":{"message":…,"type":"upstream_error","code":"provider_interrupted"}}`.
//! The end rules are the probe's (`probe::openai::OpenAiStream`): a finish reason plus `[DONE]`
//! or the usage chunk. When an upstream finished properly but dropped `[DONE]`, the proxy
//! sends `[DONE]` itself, so clients always see the usual end.
//!
//! The stream's passive outcome is sent when it ends. A client that hangs up mid-stream drops
//! the body and no outcome is sent: the route did nothing wrong, nor was its answer complete.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde_json::json;
use sse_parse::Event;
use tokio::time::Instant;

use super::attempt::{class_of, Class, Committed, PassiveSink};
use super::attribution::Ledger;
use crate::extra_cost::Reservation;
use crate::probe::sse::{BodyFault, ReadFault};
use crate::probe::wire::{Step, StreamDecoder};
use crate::probe::ProbeError;

enum Phase {
    First,
    Running,
    Ended,
}

/// Called once with the stream's outcome when it ends (not when the client hangs up).
pub(crate) type OnEnd = Box<dyn FnOnce(&crate::probe::ProbeOutcome, Streamed) + Send>;

/// What the route observables take from a stream that ended: its pace and the assembled
/// answer (bounded: `cut` when the text did not fit), judged off the client's path.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Streamed {
    /// Time per output token: (last token − first token) / (output tokens − 1), ms.
    pub tpot_ms: Option<f64>,
    pub text: String,
    pub tool_args: Vec<String>,
    pub cut: bool,
}

/// Time per output token from the first and last content event and the token count.
pub(crate) fn tpot_ms(
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: Option<u32>,
) -> Option<f64> {
    let (first, last, n) = (first?, last?, tokens?);
    if n < 2 || last <= first {
        return None;
    }
    Some((last - first).as_secs_f64() * 1000.0 / f64::from(n - 1))
}

struct State {
    c: Committed,
    phase: Phase,
    sink: PassiveSink,
    on_end: Option<OnEnd>,
    /// The extra-cost reservation of a non-primary route and the prompt's estimated tokens:
    /// settled with the metered output when the stream ends.
    charge: Option<(Reservation, u64)>,
    /// The proxy's ledger and the client's tag: whether a failure is the request's own.
    whose: (Arc<Ledger>, String),
    /// Content events seen so far and when the latest arrived (the stream's last token).
    events_seen: u32,
    last_token: Option<Instant>,
}

/// The client's body for a committed stream.
pub(crate) fn body(
    c: Committed,
    sink: PassiveSink,
    on_end: OnEnd,
    charge: Option<(Reservation, u64)>,
    whose: (Arc<Ledger>, String),
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let state = State {
        c,
        phase: Phase::First,
        sink,
        on_end: Some(on_end),
        charge,
        whose,
        events_seen: 0,
        last_token: None,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        let chunk = st.next().await?;
        Some((Ok(chunk), st))
    })
}

/// One upstream event as SSE text (multi-line data kept as several `data:` lines).
pub fn frame(ev: &Event) -> Bytes {
    let mut out = String::with_capacity(ev.data.len() + 16);
    if !ev.event.is_empty() && ev.event != "message" {
        out.push_str("event: ");
        out.push_str(&ev.event);
        out.push('\n');
    }
    for line in ev.data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

/// The interruption event sent after the commit point (`provider_interrupted`).
pub fn interrupted_event(message: &str) -> Bytes {
    let v = json!({"error": {
        "message": message,
        "type": "upstream_error",
        "code": "provider_interrupted",
    }});
    Bytes::from(format!("data: {v}\n\n"))
}

impl State {
    fn finish(&mut self, error: Option<ProbeError>) {
        self.phase = Phase::Ended;
        let c = &self.c;
        let now = Instant::now();
        let (ledger, client) = &self.whose;
        let own = match &error {
            None => {
                ledger.record(&c.route.id, client, None, now);
                false
            }
            Some(e) if class_of(e) == Class::ClientFault => false,
            Some(e) => ledger.record(&c.route.id, client, Some(e), now),
        };
        let mut outcome = (c.timing).outcome(
            &c.route.id,
            now,
            Some(200),
            error,
            Some(c.decoder.collected()),
        );
        if own {
            outcome.attributed_to = Some(client.clone());
        }
        if let Some(f) = self.on_end.take() {
            let first = self.c.timing.ttft;
            let collected = std::mem::take(&mut self.c.decoder).into_collected();
            let streamed = Streamed {
                tpot_ms: tpot_ms(first, self.last_token, outcome.output_tokens),
                cut: collected.text_cut,
                text: collected.text,
                tool_args: collected.tool_args,
            };
            f(&outcome, streamed);
        }
        if let Some((r, prompt)) = self.charge.take() {
            r.settle(prompt, u64::from(outcome.output_tokens.unwrap_or(0)));
        }
        self.sink.send(outcome);
    }

    fn interrupt(&mut self, error: ProbeError) -> Bytes {
        tracing::warn!(route = %self.c.route.id, error = %error, "committed stream interrupted");
        let message = format!(
            "the upstream provider interrupted the stream ({}); the answer is incomplete, retry the request",
            error.kind()
        );
        self.finish(Some(error));
        interrupted_event(&message)
    }

    /// The end marker arrived with `ev`: forward it when the answer is complete.
    fn done(&mut self, ev: &Event) -> Bytes {
        match self.c.decoder.finish() {
            Ok(()) => {
                self.finish(None);
                frame(ev)
            }
            Err(e) if class_of(&e) == Class::ClientFault => {
                self.finish(Some(e));
                frame(ev)
            }
            Err(e) => self.interrupt(e),
        }
    }

    fn note_content(&mut self) {
        let collected = self.c.decoder.collected();
        if collected.content_events != self.events_seen {
            self.events_seen = collected.content_events;
            let now = Instant::now();
            self.last_token = Some(now);
            if self.c.timing.ttft.is_none() {
                self.c.timing.ttft = Some(now);
            }
        } else if self.c.timing.ttft.is_none() && collected.has_content() {
            self.c.timing.ttft = Some(Instant::now());
        }
    }

    async fn next(&mut self) -> Option<Bytes> {
        match self.phase {
            Phase::Ended => None,
            Phase::First => {
                self.phase = Phase::Running;
                let first = self.c.first.clone();
                if let Some(e) = self.c.client_fault.take() {
                    self.finish(Some(e));
                    return Some(frame(&first));
                }
                if self.c.first_step == Step::Done {
                    return Some(self.done(&first));
                }
                Some(frame(&first))
            }
            Phase::Running => match self.c.events.next().await {
                Some(Ok(ev)) => match self.c.decoder.feed(&ev) {
                    Ok(Step::Continue) => {
                        self.note_content();
                        Some(frame(&ev))
                    }
                    Ok(Step::Done) => Some(self.done(&ev)),
                    Err(e) if class_of(&e) == Class::ClientFault => {
                        self.finish(Some(e));
                        Some(frame(&ev))
                    }
                    Err(e) => Some(self.interrupt(e)),
                },
                Some(Err(ReadFault::Body(BodyFault::Stalled))) => {
                    Some(self.interrupt(ProbeError::Stalled))
                }
                // Past `max_stream_duration`.
                Some(Err(ReadFault::Body(BodyFault::Timeout))) => {
                    Some(self.interrupt(ProbeError::Timeout))
                }
                Some(Err(ReadFault::Framing(message))) => {
                    Some(self.interrupt(ProbeError::Malformed { message }))
                }
                // The body ended (cleanly or cut): complete only by the end rules.
                Some(Err(ReadFault::Body(BodyFault::Cut(_)))) | None => {
                    match self.c.decoder.finish() {
                        Ok(()) => {
                            self.finish(None);
                            Some(Bytes::from_static(b"data: [DONE]\n\n"))
                        }
                        Err(e) if class_of(&e) == Class::ClientFault => {
                            self.finish(Some(e));
                            None
                        }
                        Err(e) => Some(self.interrupt(e)),
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_keep_event_names_and_lines() {
        let ev = Event {
            event: "message".into(),
            data: "{\"a\":1}".into(),
            ..Event::default()
        };
        assert_eq!(&frame(&ev)[..], b"data: {\"a\":1}\n\n");
        let ev = Event {
            event: "x".into(),
            data: "a\nb".into(),
            ..Event::default()
        };
        assert_eq!(&frame(&ev)[..], b"event: x\ndata: a\ndata: b\n\n");
        let e = interrupted_event("m");
        let text = std::str::from_utf8(&e).unwrap();
        assert!(text.starts_with("data: {\"error\":"));
        assert!(text.contains("\"code\":\"provider_interrupted\""));
        assert!(text.contains("\"type\":\"upstream_error\""));
    }
}
