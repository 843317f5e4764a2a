//! Reading a response body under two clocks: the longest silence tolerated between byte
//! chunks (else `Stalled`) and the whole call's deadline (`timeout`). A stream's silence is
//! only tolerated without bound until its first answer token ([`Silence`]): a provider that
//! sent its headers and queues the request is slow, not stalled.
//!
//! The silence is measured on *bytes*, below the SSE parser, on purpose: keep-alive comments
//! (`: ping`) are data on the wire and prove the connection is alive even though they carry no
//! event, while a parser-level timer would call such a stream stalled. SSE framing itself is
//! left to `sse-parse`, which implements the WHATWG rules (CRLF, comments, multi-line `data:`,
//! a byte order mark).
//!
//! That parser buffers a line, and an event, until its end: an upstream that never sends a
//! newline would grow it without bound. [`events`] therefore cuts the body before the parser
//! once a line passes [`MAX_LINE`] bytes or an event [`MAX_EVENT`]: the stream ends as
//! malformed, and memory stays at one line plus one network chunk. The parser would also
//! replace bytes that are not UTF-8; a provider that sends them is broken, so the stream ends
//! as malformed there too, after the events that came before those bytes (a character that a
//! chunk cuts in two is finished by the next chunk, so the chunking never matters).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use sse_parse::{Event, SseParser};
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

/// Whether the bytes so far are UTF-8, across chunks.
#[derive(Debug, Default, Clone, Copy)]
struct Utf8 {
    /// The start of a character the last chunk ended inside of.
    cut: [u8; 3],
    cut_len: usize,
}

impl Utf8 {
    /// Checks `chunk`; `Err(n)` when it is UTF-8 up to its byte `n` and not past it.
    fn feed(&mut self, chunk: &[u8]) -> Result<(), usize> {
        let mut rest = chunk;
        if self.cut_len > 0 {
            // A proper start of a character, so its first byte says how long it is.
            let width = match self.cut[0] {
                0xF0.. => 4,
                0xE0.. => 3,
                _ => 2,
            };
            let take = (width - self.cut_len).min(chunk.len());
            let mut char = [0u8; 4];
            char[..self.cut_len].copy_from_slice(&self.cut[..self.cut_len]);
            char[self.cut_len..self.cut_len + take].copy_from_slice(&chunk[..take]);
            match std::str::from_utf8(&char[..self.cut_len + take]) {
                Ok(_) => self.cut_len = 0,
                Err(e) if e.error_len().is_none() => {
                    // Still unfinished: the chunk was shorter than the rest of the character.
                    self.cut[self.cut_len..self.cut_len + take].copy_from_slice(&chunk[..take]);
                    self.cut_len += take;
                    return Ok(());
                }
                Err(_) => return Err(0),
            }
            rest = &chunk[take..];
        }
        let skipped = chunk.len() - rest.len();
        match std::str::from_utf8(rest) {
            Ok(_) => Ok(()),
            Err(e) if e.error_len().is_none() => {
                let tail = &rest[e.valid_up_to()..];
                self.cut[..tail.len()].copy_from_slice(tail);
                self.cut_len = tail.len();
                Ok(())
            }
            Err(e) => Err(skipped + e.valid_up_to()),
        }
    }

    /// Whether the last character was cut and never finished.
    fn unfinished(&self) -> bool {
        self.cut_len > 0
    }
}

/// The bytes ended inside a character, or a chunk was not UTF-8.
const NOT_UTF8: &str = "invalid UTF-8 in the stream";

/// [`events`]' reading: the body's chunks through the line bounds and the UTF-8 check into
/// the parser, the parser's events out, then the fault that ended the body, if any.
struct Reader<S> {
    bytes: S,
    lengths: Lengths,
    utf8: Utf8,
    parser: SseParser,
    /// Yielded once the events before it are.
    fault: Option<ReadFault>,
    ended: bool,
}

impl<S: Stream<Item = Result<Bytes, BodyFault>> + Unpin> Reader<S> {
    async fn next(&mut self) -> Option<Result<Event, ReadFault>> {
        loop {
            if let Some(event) = self.parser.next_event() {
                return Some(Ok(event));
            }
            if let Some(fault) = self.fault.take() {
                return Some(Err(fault));
            }
            if self.ended {
                return None;
            }
            let chunk = match self.bytes.next().await {
                Some(Ok(chunk)) => chunk,
                Some(Err(f)) => {
                    self.end(ReadFault::Body(f));
                    continue;
                }
                None if self.utf8.unfinished() => {
                    self.end(ReadFault::Framing(NOT_UTF8.into()));
                    continue;
                }
                None => {
                    self.parser.finish();
                    self.ended = true;
                    continue;
                }
            };
            // The chunk that passes a bound never reaches the parser.
            if let Err(why) = self.lengths.feed(&chunk) {
                self.end(ReadFault::Framing(why));
                continue;
            }
            match self.utf8.feed(&chunk) {
                Ok(()) => self.parser.feed(&chunk),
                // What came before the bad bytes is read, then the stream ends.
                Err(valid) => {
                    self.parser.feed(&chunk[..valid]);
                    self.end(ReadFault::Framing(NOT_UTF8.into()));
                }
            }
        }
    }

    /// Nothing more is read; `fault` comes after the events already complete.
    fn end(&mut self, fault: ReadFault) {
        self.fault = Some(fault);
        self.ended = true;
    }
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
    let reader = Reader {
        bytes: Box::pin(bytes),
        lengths: Lengths::default(),
        utf8: Utf8::default(),
        parser: SseParser::new(),
        fault: None,
        ended: false,
    };
    futures_util::stream::unfold(reader, |mut r| async move { Some((r.next().await?, r)) })
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

    /// The stream ends at the bad bytes, not when the upstream ends it (here: never, so
    /// anything buffered past them would end as a stall instead).
    #[tokio::test(start_paused = true)]
    async fn bytes_after_invalid_utf8_are_not_read() {
        let now = Instant::now();
        let body = futures_util::stream::iter(vec![
            Ok::<_, String>(Bytes::from_static(b"data: a\n\ndata: \xe4\xb8")),
            Ok(Bytes::from_static(b"x\n\ndata: b\n\n")),
        ])
        .chain(futures_util::stream::pending());
        let far = now + Duration::from_secs(60);
        let got: Vec<_> = events(guarded_bytes(body, now, Duration::from_secs(5), far))
            .collect()
            .await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].as_ref().map(|e| e.data.as_str()), Ok("a"));
        assert!(matches!(&got[1], Err(ReadFault::Framing(m)) if m.contains("UTF-8")));
    }

    #[tokio::test]
    async fn a_stream_that_ends_inside_a_character_is_malformed() {
        let now = Instant::now();
        let body = futures_util::stream::iter(vec![Ok::<_, String>(Bytes::from_static(
            b"data: a\n\ndata: \xf0\x9f\x98",
        ))]);
        let far = now + Duration::from_secs(60);
        let got: Vec<_> = events(guarded_bytes(body, now, Duration::from_secs(5), far))
            .collect()
            .await;
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(matches!(&got[1], Err(ReadFault::Framing(_))));
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
