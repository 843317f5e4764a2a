//! Property tests of the SSE reader: any bytes, split at any points, never panic and read as
//! the same events (and the same first fault) whatever the chunking, so what a proxy or a
//! probe sees never depends on how the network cut the stream.

use bytes::Bytes;
use futures_util::StreamExt;
use proptest::prelude::*;

use super::{events, BodyFault, Lengths, ReadFault, Utf8};

/// Cases per property: bounded so the suite's time does not depend on the environment.
const CASES: u32 = 256;

/// What a reader yields, faults by kind only: a UTF-8 error's message names its position
/// within the chunk, which the chunking moves.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Read {
    Event {
        event: String,
        data: String,
        id: String,
    },
    Framing,
    Body(BodyFault),
}

fn read_all(body: &[u8], cuts: &[usize]) -> Vec<Read> {
    read_all_then(body, cuts, None)
}

/// `body` cut at `cuts` (taken modulo its length): its chunks, in order.
fn chunked<'a>(body: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    at.sort_unstable();
    at.dedup();
    let mut from = 0;
    at.into_iter()
        .chain([body.len()])
        .map(|to| {
            let chunk = &body[from..to];
            from = to;
            chunk
        })
        .collect()
}

/// [`read_all`], the body ending with `fault` (a cut connection, a stall) when given.
fn read_all_then(body: &[u8], cuts: &[usize], fault: Option<BodyFault>) -> Vec<Read> {
    let mut chunks: Vec<Result<Bytes, BodyFault>> = chunked(body, cuts)
        .into_iter()
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    chunks.extend(fault.map(Err));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let got: Vec<_> = rt.block_on(events(futures_util::stream::iter(chunks)).collect());
    let mut out = Vec::new();
    for r in got {
        match r {
            Ok(e) => out.push(Read::Event {
                event: e.event,
                data: e.data,
                id: e.id,
            }),
            // Up to the first fault: what a reader does after one is its own business.
            Err(ReadFault::Framing(_)) => {
                out.push(Read::Framing);
                break;
            }
            Err(ReadFault::Body(f)) => {
                out.push(Read::Body(f));
                break;
            }
        }
    }
    out
}

/// A field value with multi-byte characters, so cuts fall inside UTF-8 sequences.
fn text() -> impl Strategy<Value = String> {
    "[a-z0-9 {}\":,é中😀]{0,12}"
}

/// One SSE line, sometimes not valid SSE or not valid UTF-8.
fn line() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => text().prop_map(|t| format!("data: {t}").into_bytes()),
        1 => text().prop_map(|t| format!("data:{t}").into_bytes()),
        1 => Just(b"data".to_vec()),
        1 => text().prop_map(|t| format!("event: {t}").into_bytes()),
        1 => "[0-9]{1,3}".prop_map(|t| format!("id: {t}").into_bytes()),
        1 => "[0-9x]{1,4}".prop_map(|t| format!("retry: {t}").into_bytes()),
        1 => text().prop_map(|t| format!(": {t}").into_bytes()),
        2 => Just(Vec::new()),
        1 => text().prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..6),
    ]
}

fn ending() -> impl Strategy<Value = &'static [u8]> {
    prop_oneof![4 => Just(&b"\n"[..]), 2 => Just(&b"\r\n"[..]), 1 => Just(&b"\r"[..])]
}

fn document() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((line(), ending()), 0..16).prop_map(|lines| {
        lines
            .into_iter()
            .flat_map(|(mut l, end)| {
                l.extend_from_slice(end);
                l
            })
            .collect()
    })
}

#[test]
fn a_cut_between_cr_and_lf_is_one_line_ending() {
    let body = b"data: a\r\ndata: b\r\n\r\n";
    let whole = read_all(body, &[]);
    assert_eq!(
        whole,
        vec![Read::Event {
            event: "message".into(),
            data: "a\nb".into(),
            id: String::new(),
        }]
    );
    assert_eq!(read_all(body, &[8]), whole);
    assert_eq!(read_all(body, &[18, 19]), whole);
}

/// The line bounds' count, one byte at a time: `(line, event, cr)` after `bytes` (a `\n`
/// right after a `\r` ends no second line).
fn counted(bytes: &[u8]) -> (usize, usize, bool) {
    let (mut line, mut event, mut cr) = (0, 0, false);
    for &b in bytes {
        match b {
            b'\n' if cr => cr = false,
            b'\n' | b'\r' => {
                if line == 0 {
                    event = 0;
                }
                line = 0;
                cr = b == b'\r';
            }
            _ => {
                line += 1;
                event += 1;
                cr = false;
            }
        }
    }
    (line, event, cr)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn line_bounds_count_as_one_byte_at_a_time_whatever_the_chunking(
        body in prop::collection::vec(
            prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'x'), any::<u8>()], 0..256),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut lengths = Lengths::default();
        for chunk in chunked(&body, &cuts) {
            prop_assert!(lengths.feed(chunk).is_ok());
        }
        prop_assert_eq!((lengths.line, lengths.event, lengths.cr), counted(&body));
    }

    #[test]
    fn any_bytes_in_any_chunks_never_panic(
        body in prop::collection::vec(any::<u8>(), 0..256),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let whole = read_all(&body, &[]);
        prop_assert_eq!(read_all(&body, &cuts), whole);
    }

    #[test]
    fn a_body_fault_ends_the_events_whatever_the_chunking(
        body in document(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
        fault in prop_oneof![
            Just(BodyFault::Stalled),
            Just(BodyFault::Timeout),
            "[a-z ]{0,12}".prop_map(BodyFault::Cut),
        ],
    ) {
        let whole = read_all_then(&body, &[], Some(fault.clone()));
        prop_assert_eq!(&read_all_then(&body, &cuts, Some(fault.clone())), &whole);
        // The fault is the last thing read, unless the framing failed before it.
        match whole.last() {
            Some(Read::Framing) => {}
            last => prop_assert_eq!(last, Some(&Read::Body(fault))),
        }
    }

    #[test]
    fn the_utf8_check_finds_what_the_whole_body_shows_whatever_the_chunking(
        parts in prop::collection::vec(prop_oneof![
            3 => text().prop_map(String::into_bytes),
            1 => prop::collection::vec(any::<u8>(), 0..4),
        ], 0..8),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let body = parts.concat();
        let mut utf8 = Utf8::default();
        let (mut at, mut bad) = (0, None);
        for chunk in chunked(&body, &cuts) {
            if let Err(n) = utf8.feed(chunk) {
                bad = Some(at + n);
                break;
            }
            at += chunk.len();
        }
        match std::str::from_utf8(&body) {
            Ok(_) => prop_assert_eq!((bad, utf8.unfinished()), (None, false)),
            Err(e) => match e.error_len() {
                None => prop_assert_eq!((bad, utf8.unfinished()), (None, true)),
                // Found at the bad bytes: where they start, or past the ones an earlier
                // chunk held as an unfinished character.
                Some(len) => {
                    let at = bad.expect("invalid UTF-8 found");
                    prop_assert!(at >= e.valid_up_to() && at <= e.valid_up_to() + len, "{at} {e}");
                }
            },
        }
    }

    #[test]
    fn the_chunking_never_changes_the_events(
        body in document(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = read_all(&body, &[]);
        prop_assert_eq!(read_all(&body, &cuts), whole);
        // One byte at a time: every cut at once.
        let every: Vec<usize> = (0..body.len()).collect();
        prop_assert_eq!(read_all(&body, &every), read_all(&body, &[]));
    }
}
