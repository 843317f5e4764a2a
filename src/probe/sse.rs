//! Reading a response body under two clocks: the longest silence tolerated between byte
//! chunks (else `Stalled`) and the whole call's deadline (`timeout`). A stream's silence is
//! only tolerated without bound until its first answer token ([`Silence`]): a provider that
//! sent its headers and queues the request is slow, not stalled.
//!
//! The silence is measured on *bytes*, below the SSE parser, on purpose: keep-alive comments
//! (`: ping`) are data on the wire and prove the connection is alive even though they carry no
//! event, while a parser-level timer would call such a stream stalled. SSE framing itself is
//! left to `eventsource-stream`, which implements the WHATWG rules (CRLF, comments, multi-line
//! `data:`, split UTF-8 sequences across chunks).
//!
//! That parser buffers a line, and an event, until its end: an upstream that never sends a
//! newline would grow it without bound. [`events`] therefore cuts the body before the parser
//! once a line passes [`MAX_LINE`] bytes or an event [`MAX_EVENT`]: the stream ends as
//! malformed, and memory stays at one line plus one network chunk.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use tokio::time::Instant;

use super::outcome::scrub;

/// Why the body stopped before its natural end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BodyFault {
    /// No byte for longer than the tolerated silence.
    Stalled,
    /// The whole call's deadline passed while bytes were still arriving.
    Timeout,
    /// The connection failed mid-body (reset, broken chunked encoding).
    Cut(String),
}

impl std::fmt::Display for BodyFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyFault::Stalled => f.write_str("stalled"),
            BodyFault::Timeout => f.write_str("timeout"),
            BodyFault::Cut(m) => write!(f, "cut: {m}"),
        }
    }
}

/// What the event reader yields besides events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadFault {
    Body(BodyFault),
    /// Not valid UTF-8 or not valid SSE framing.
    Framing(String),
}

type ByteStream<E> = Pin<Box<dyn Stream<Item = Result<Bytes, E>> + Send>>;

/// A body's transport error, told as one line for an outcome.
pub(crate) trait Describe: Send + 'static {
    fn describe(self) -> String;
}

impl Describe for reqwest::Error {
    fn describe(self) -> String {
        describe_reqwest(self)
    }
}

/// Already told.
impl Describe for String {
    fn describe(self) -> String {
        self
    }
}

/// The longest SSE line read from an upstream.
pub const MAX_LINE: usize = 1024 * 1024;
/// The longest SSE event (its lines together) read from an upstream.
pub const MAX_EVENT: usize = 4 * 1024 * 1024;

/// Bytes since the last line end and since the last blank line, across chunks.
#[derive(Debug, Default, Clone, Copy)]
struct Lengths {
    line: usize,
    event: usize,
    /// The previous byte was `\r` (a `\n` right after it ends the same line).
    cr: bool,
}

impl Lengths {
    /// Counts `chunk`; `Err` with the reason once a bound is passed. Runs between line ends
    /// are counted whole (every byte of every streamed event passes here).
    fn feed(&mut self, chunk: &[u8]) -> Result<(), String> {
        let mut rest = chunk;
        loop {
            let end = memchr::memchr2(b'\n', b'\r', rest);
            self.text(end.unwrap_or(rest.len()))?;
            let Some(i) = end else { return Ok(()) };
            match rest[i] {
                b'\n' if self.cr => self.cr = false,
                b => {
                    if self.line == 0 {
                        self.event = 0; // a blank line ends the event
                    }
                    self.line = 0;
                    self.cr = b == b'\r';
                }
            }
            rest = &rest[i + 1..];
        }
    }

    /// `n` bytes of a line.
    fn text(&mut self, n: usize) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        self.line += n;
        self.event += n;
        self.cr = false;
        if self.line > MAX_LINE {
            return Err(format!("an SSE line longer than {MAX_LINE} bytes"));
        }
        if self.event > MAX_EVENT {
            return Err(format!("an SSE event longer than {MAX_EVENT} bytes"));
        }
        Ok(())
    }
}

/// What the line bound lets through to the SSE parser.
#[derive(Debug)]
enum Bounded {
    Body(BodyFault),
    TooLong(String),
}

/// The longest silence tolerated between byte chunks. `Fixed` holds for the whole body;
/// `AfterArmed` tolerates any silence (up to the deadline) until the reader arms it — at the
/// first answer token — and `max` from then on.
#[derive(Debug, Clone)]
pub(crate) enum Silence {
    Fixed(Duration),
    AfterArmed {
        max: Duration,
        armed: Arc<AtomicBool>,
    },
}

impl Silence {
    fn current(&self) -> Option<Duration> {
        match self {
            Silence::Fixed(d) => Some(*d),
            Silence::AfterArmed { max, armed } => armed.load(Ordering::Relaxed).then_some(*max),
        }
    }
}

/// The body's byte chunks, each awaited until `min(last byte + max_silence, deadline)`.
/// `last_byte` starts at the moment the headers arrived. After a fault the stream ends.
pub(crate) fn guarded_bytes<E: Describe>(
    body: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
    last_byte: Instant,
    max_silence: Duration,
    deadline: Instant,
) -> impl Stream<Item = Result<Bytes, BodyFault>> + Send {
    guarded_bytes_with(body, last_byte, Silence::Fixed(max_silence), deadline)
}

/// [`guarded_bytes`] under any [`Silence`] policy.
pub(crate) fn guarded_bytes_with<E: Describe>(
    body: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
    last_byte: Instant,
    silence: Silence,
    deadline: Instant,
) -> impl Stream<Item = Result<Bytes, BodyFault>> + Send {
    let body: ByteStream<E> = Box::pin(body);
    futures_util::stream::unfold(Some((body, last_byte)), move |state| {
        let silence = silence.current();
        async move {
            let (mut body, last) = state?;
            // A silence that would end before the call's deadline is a stall; otherwise the call
            // simply ran out of time while data was flowing (or while the upstream queued).
            let (wake, fault) = match silence.map(|s| last + s) {
                Some(silence_deadline) if silence_deadline <= deadline => {
                    (silence_deadline, BodyFault::Stalled)
                }
                _ => (deadline, BodyFault::Timeout),
            };
            match tokio::time::timeout_at(wake, body.next()).await {
                Err(_) => Some((Err(fault), None)),
                Ok(None) => None,
                Ok(Some(Err(e))) => Some((Err(BodyFault::Cut(e.describe())), None)),
                Ok(Some(Ok(bytes))) => Some((Ok(bytes), Some((body, Instant::now())))),
            }
        }
    })
}

/// Reads a whole (non-streamed) body from a guarded byte stream, keeping at most `limit`
/// bytes. Returns what arrived, and the fault that ended it early, if any; `too_large` when
/// the body went past `limit` (reading stops there).
pub(crate) async fn read_body(
    bytes: impl Stream<Item = Result<Bytes, BodyFault>> + Send,
    limit: usize,
) -> (Vec<u8>, Option<BodyFault>, bool) {
    let mut bytes = std::pin::pin!(bytes);
    let mut out = Vec::new();
    while let Some(chunk) = bytes.next().await {
        match chunk {
            Ok(b) => {
                let room = limit.saturating_sub(out.len());
                if b.len() > room {
                    out.extend_from_slice(&b[..room]);
                    return (out, None, true);
                }
                out.extend_from_slice(&b);
            }
            Err(fault) => return (out, Some(fault), false),
        }
    }
    (out, None, false)
}

/// SSE events from a guarded body.
pub(crate) fn events(
    bytes: impl Stream<Item = Result<Bytes, BodyFault>> + Send,
) -> impl Stream<Item = Result<Event, ReadFault>> + Send {
    let bytes = Box::pin(bytes);
    let bounded =
        futures_util::stream::unfold(Some((bytes, Lengths::default())), |state| async move {
            let (mut bytes, mut lengths) = state?;
            match bytes.next().await? {
                Err(f) => Some((Err(Bounded::Body(f)), None)),
                Ok(chunk) => match lengths.feed(&chunk) {
                    // The chunk that passes a bound never reaches the parser.
                    Err(why) => Some((Err(Bounded::TooLong(why)), None)),
                    Ok(()) => Some((Ok(chunk), Some((bytes, lengths)))),
                },
            }
        });
    bounded.eventsource().map(|r| {
        r.map_err(|e| match e {
            EventStreamError::Transport(Bounded::Body(f)) => ReadFault::Body(f),
            EventStreamError::Transport(Bounded::TooLong(why)) => ReadFault::Framing(why),
            EventStreamError::Utf8(e) => ReadFault::Framing(format!("invalid UTF-8: {e}")),
            EventStreamError::Parser(e) => ReadFault::Framing(format!("invalid SSE: {e}")),
        })
    })
}

/// A reqwest error as one line: the cause chain, without the URL (a base URL may carry
/// credentials in its query), scrubbed.
pub(crate) fn describe_reqwest(e: reqwest::Error) -> String {
    describe_error(&e.without_url())
}

/// An error and its causes as one line, scrubbed.
pub(crate) fn describe_error(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let s = cause.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        source = cause.source();
    }
    scrub(&text)
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&'static str]) -> impl Stream<Item = reqwest::Result<Bytes>> + Send {
        futures_util::stream::iter(
            parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p.as_bytes())))
                .collect::<Vec<_>>(),
        )
    }

    #[tokio::test]
    async fn events_split_across_chunks_and_comments_are_parsed() {
        let now = Instant::now();
        let far = now + Duration::from_secs(60);
        let body = chunks(&[
            ": keep-alive\n\nda",
            "ta: {\"a\":1}\r\n\r\nevent: ping\ndata: {}\n\n",
        ]);
        let got: Vec<_> = events(guarded_bytes(body, now, Duration::from_secs(5), far))
            .collect()
            .await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].as_ref().map(|e| e.data.as_str()), Ok("{\"a\":1}"));
        assert_eq!(got[1].as_ref().map(|e| e.event.as_str()), Ok("ping"));
    }

    #[tokio::test]
    async fn invalid_utf8_is_a_framing_error_not_a_hang() {
        let now = Instant::now();
        let body = futures_util::stream::iter(vec![
            Ok::<_, String>(Bytes::from_static(b"data: {\"a\":\"\xff\xfe\"}\n\n")),
            Ok(Bytes::from_static(b"data: [DONE]\n\n")),
        ]);
        let got: Vec<_> = events(guarded_bytes(
            body,
            now,
            Duration::from_secs(5),
            now + Duration::from_secs(60),
        ))
        .collect()
        .await;
        assert!(
            matches!(got.last(), Some(Err(ReadFault::Framing(_)))),
            "{got:?}"
        );
    }

    /// A line or an event past its bound ends the stream as a framing error after the events
    /// before it, whatever the chunking, and nothing of it is buffered beyond the bound.
    #[tokio::test]
    async fn an_endless_line_ends_the_stream_as_malformed() {
        let now = Instant::now();
        let far = now + Duration::from_secs(60);
        let piece = Bytes::from(vec![b'x'; 64 * 1024]);
        let mut parts: Vec<reqwest::Result<Bytes>> =
            vec![Ok(Bytes::from_static(b"data: {\"a\":1}\n\ndata: "))];
        // 10 MiB without a newline, in 64 KiB chunks, then a proper end that is never read.
        parts.extend((0..160).map(|_| Ok(piece.clone())));
        parts.push(Ok(Bytes::from_static(b"\n\ndata: [DONE]\n\n")));
        let got: Vec<_> = events(guarded_bytes(
            futures_util::stream::iter(parts),
            now,
            Duration::from_secs(5),
            far,
        ))
        .collect()
        .await;
        assert_eq!(
            got.len(),
            2,
            "{:?}",
            got.iter().map(|e| e.is_ok()).collect::<Vec<_>>()
        );
        assert_eq!(got[0].as_ref().map(|e| e.data.as_str()), Ok("{\"a\":1}"));
        assert_eq!(
            got[1],
            Err(ReadFault::Framing(format!(
                "an SSE line longer than {MAX_LINE} bytes"
            )))
        );

        // Many short lines in one event: the event's bound.
        let line = Bytes::from(format!("data: {}\n", "y".repeat(1000)));
        let parts: Vec<reqwest::Result<Bytes>> = (0..5000).map(|_| Ok(line.clone())).collect();
        let got: Vec<_> = events(guarded_bytes(
            futures_util::stream::iter(parts),
            now,
            Duration::from_secs(5),
            far,
        ))
        .collect()
        .await;
        assert!(
            matches!(got.last(), Some(Err(ReadFault::Framing(m))) if m.contains("event")),
            "{:?}",
            got.last()
        );

        // Lines just under the bound, and CRLF line ends, pass.
        let mut l = Lengths::default();
        assert!(l.feed(&vec![b'z'; MAX_LINE]).is_ok());
        assert!(l.feed(b"\r\n\r\n").is_ok());
        assert!(l.feed(&vec![b'z'; MAX_LINE]).is_ok());
        assert!(l.feed(b"z").is_err());
        // CRLF lines of one event add up to the event's bound.
        let mut l = Lengths::default();
        let crlf = format!("data: {}\r\n", "y".repeat(1000));
        let n = (0..5000)
            .take_while(|_| l.feed(crlf.as_bytes()).is_ok())
            .count();
        assert!(n < 5000 && n * 1006 >= MAX_EVENT - 1006, "{n}");
        let mut l = Lengths::default();
        assert!((0..5000).all(|_| l.feed(format!("{crlf}\r\n").as_bytes()).is_ok()));
    }

    #[tokio::test(start_paused = true)]
    async fn silence_is_a_stall_until_the_deadline_is_nearer() {
        let now = Instant::now();
        let silent = futures_util::stream::pending::<reqwest::Result<Bytes>>();
        let got: Vec<_> = guarded_bytes(
            silent,
            now,
            Duration::from_millis(100),
            now + Duration::from_secs(1),
        )
        .collect()
        .await;
        assert_eq!(got, vec![Err(BodyFault::Stalled)]);

        let silent = futures_util::stream::pending::<reqwest::Result<Bytes>>();
        let got: Vec<_> = guarded_bytes(
            silent,
            now,
            Duration::from_secs(5),
            Instant::now() + Duration::from_millis(50),
        )
        .collect()
        .await;
        assert_eq!(got, vec![Err(BodyFault::Timeout)]);
    }
}
