//! One route's outcomes of one closed UTC hour as one compact value (pure: no I/O).
//!
//! A raw row costs about 120 bytes on SQLite (a row of 21 columns plus two indexes over it);
//! 10,000 routes probed every 30 s write 29 million a day. Packed, an hour of a route is one
//! row: its outcomes column by column (flags, start offsets, latencies in microseconds…),
//! repeated strings (model, fingerprint, answer, error) once each in a dictionary, the whole
//! deflated. Columns of similar values deflate well: a probe outcome costs a dozen bytes.
//!
//! Precision: latencies are kept to the microsecond and tokens/s to a thousandth; every other
//! field exactly. The order of outcomes is kept.

use std::io::{Read, Write};

use chrono::{DateTime, Utc};
use flate2::{read::DeflateDecoder, write::DeflateEncoder, Compression};

use crate::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use crate::route::RouteId;

/// The first byte of every packed value: the layout below. A reader meeting another refuses
/// (a newer probeok wrote it) rather than guess.
const VERSION: u8 = 1;

/// Most outcomes a value may claim: far above an hour of any route (a proxy's passive
/// outcomes included), and a bound on what a corrupt value can make a reader allocate.
const MAX_OUTCOMES: usize = 1 << 20;

/// Most bytes a value may inflate to (a bound against a corrupt or hostile value).
const MAX_INFLATED: u64 = 256 << 20;

#[derive(Debug, thiserror::Error)]
#[error("packed outcomes: {0}")]
pub struct PackError(String);

fn bad(what: impl Into<String>) -> PackError {
    PackError(what.into())
}

// Flag bits of one outcome.
const KIND_MASK: u32 = 0b11;
const SUCCESS: u32 = 1 << 2;
const VERIFIED_SET: u32 = 1 << 3;
const VERIFIED: u32 = 1 << 4;
const TOKENS_ESTIMATED: u32 = 1 << 5;
const MAX_TOKENS_EXHAUSTED: u32 = 1 << 6;
const HAS_TTFB: u32 = 1 << 7;
const HAS_TTFT: u32 = 1 << 8;
const HAS_FIRST_ANSWER: u32 = 1 << 9;
const HAS_OUTPUT_TOKENS: u32 = 1 << 10;
const HAS_TPS: u32 = 1 << 11;
const HAS_MODEL: u32 = 1 << 12;
const HAS_FINGERPRINT: u32 = 1 << 13;
const HAS_HTTP_STATUS: u32 = 1 << 14;
const HAS_ERROR: u32 = 1 << 15;
const HAS_ANSWER: u32 = 1 << 16;
// Parts of an error.
const ERR_STATUS: u32 = 1;
const ERR_MESSAGE: u32 = 1 << 1;
const ERR_RETRY: u32 = 1 << 2;

/// The columns, in the order they are written.
#[derive(Default)]
struct Columns {
    flags: Vec<u8>,
    started: Vec<u8>,
    total: Vec<u8>,
    ttfb: Vec<u8>,
    ttft: Vec<u8>,
    first_answer: Vec<u8>,
    output_tokens: Vec<u8>,
    tps: Vec<u8>,
    texts: Vec<u8>,
    http_status: Vec<u8>,
    errors: Vec<u8>,
}

impl Columns {
    fn all(&self) -> [&Vec<u8>; 11] {
        [
            &self.flags,
            &self.started,
            &self.total,
            &self.ttfb,
            &self.ttft,
            &self.first_answer,
            &self.output_tokens,
            &self.tps,
            &self.texts,
            &self.http_status,
            &self.errors,
        ]
    }
}

/// Packs `outcomes` (of one route, in the order to keep), starting offsets measured from
/// `hour_ms`.
pub fn encode<'a>(hour_ms: i64, outcomes: &[&'a ProbeOutcome]) -> Vec<u8> {
    let mut dict: Vec<&'a str> = Vec::new();
    let mut text = |s: &'a str, col: &mut Vec<u8>| {
        let i = dict.iter().position(|d| *d == s).unwrap_or_else(|| {
            dict.push(s);
            dict.len() - 1
        });
        put(col, i as u64);
    };
    let mut c = Columns::default();
    let mut prev = hour_ms;
    for o in outcomes {
        let started = o.started_at.timestamp_millis();
        put(&mut c.started, zigzag(started.wrapping_sub(prev)));
        prev = started;
        put(&mut c.total, micros(o.total_ms));
        let mut f = kind_bits(o.kind);
        let mut set = |bit: u32, on: bool| {
            if on {
                f |= bit;
            }
        };
        set(SUCCESS, o.success);
        set(VERIFIED_SET, o.verified.is_some());
        set(VERIFIED, o.verified == Some(true));
        set(TOKENS_ESTIMATED, o.tokens_estimated);
        set(MAX_TOKENS_EXHAUSTED, o.max_tokens_exhausted);
        for (bit, v, col) in [
            (HAS_TTFB, o.ttfb_ms, &mut c.ttfb),
            (HAS_TTFT, o.ttft_ms, &mut c.ttft),
            (HAS_FIRST_ANSWER, o.first_answer_ms, &mut c.first_answer),
        ] {
            if let Some(ms) = v {
                set(bit, true);
                put(col, micros(ms));
            }
        }
        if let Some(n) = o.output_tokens {
            set(HAS_OUTPUT_TOKENS, true);
            put(&mut c.output_tokens, n.into());
        }
        if let Some(tps) = o.tokens_per_second {
            set(HAS_TPS, true);
            put(&mut c.tps, thousandths(tps));
        }
        for (bit, v) in [
            (HAS_MODEL, o.model_reported.as_deref()),
            (HAS_FINGERPRINT, o.system_fingerprint.as_deref()),
        ] {
            if let Some(s) = v {
                set(bit, true);
                text(s, &mut c.texts);
            }
        }
        if let Some(s) = o.http_status {
            set(HAS_HTTP_STATUS, true);
            put(&mut c.http_status, s.into());
        }
        if let Some(e) = &o.error {
            set(HAS_ERROR, true);
            let parts = [
                (ERR_STATUS, e.status().is_some()),
                (ERR_MESSAGE, e.message().is_some()),
                (ERR_RETRY, e.retry_after_ms().is_some()),
            ];
            let bits = parts.iter().filter(|p| p.1).fold(0, |a, p| a | p.0);
            put(&mut c.errors, bits.into());
            text(e.kind(), &mut c.errors);
            if let Some(s) = e.status() {
                put(&mut c.errors, s.into());
            }
            if let Some(m) = e.message() {
                text(m, &mut c.errors);
            }
            if let Some(r) = e.retry_after_ms() {
                put(&mut c.errors, r);
            }
        }
        if let Some(a) = o.answer.as_deref() {
            set(HAS_ANSWER, true);
            text(a, &mut c.texts);
        }
        put(&mut c.flags, f.into());
    }
    let mut plain = Vec::new();
    put(&mut plain, dict.len() as u64);
    for s in &dict {
        put(&mut plain, s.len() as u64);
        plain.extend_from_slice(s.as_bytes());
    }
    put(&mut plain, outcomes.len() as u64);
    for col in c.all() {
        put(&mut plain, col.len() as u64);
        plain.extend_from_slice(col);
    }
    let mut out = vec![VERSION];
    let mut z = DeflateEncoder::new(&mut out, Compression::default());
    // Writing into a Vec cannot fail.
    let _ = z.write_all(&plain);
    let _ = z.finish();
    out
}

/// Unpacks what [`encode`] packed for `route`.
pub fn decode(
    route: &RouteId,
    hour_ms: i64,
    packed: &[u8],
) -> Result<Vec<ProbeOutcome>, PackError> {
    let (&version, deflated) = packed.split_first().ok_or_else(|| bad("empty value"))?;
    if version != VERSION {
        return Err(bad(format!("layout {version} is not known to this build")));
    }
    let mut plain = Vec::new();
    DeflateDecoder::new(deflated)
        .take(MAX_INFLATED)
        .read_to_end(&mut plain)
        .map_err(|e| bad(format!("does not inflate: {e}")))?;
    let mut r = Cursor(&plain);
    let n_texts = r.len(plain.len())?;
    let mut dict = Vec::with_capacity(n_texts);
    for _ in 0..n_texts {
        let len = r.len(plain.len())?;
        let bytes = r.take(len)?;
        dict.push(std::str::from_utf8(bytes).map_err(|_| bad("a text is not UTF-8"))?);
    }
    let n = r.len(MAX_OUTCOMES)?;
    let mut cols = Vec::with_capacity(11);
    for _ in 0..11 {
        let len = r.len(plain.len())?;
        cols.push(Cursor(r.take(len)?));
    }
    let [mut flags, mut started, mut total, mut ttfb, mut ttft, mut first_answer, mut output_tokens, mut tps, mut texts, mut http_status, mut errors] =
        <[Cursor; 11]>::try_from(cols).map_err(|_| bad("columns"))?;
    let text = |col: &mut Cursor, dict: &[&str]| -> Result<String, PackError> {
        let i = col.get()?;
        let s = usize::try_from(i).ok().and_then(|i| dict.get(i));
        Ok(
            s.ok_or_else(|| bad(format!("text {i} is not in the dictionary")))?
                .to_string(),
        )
    };
    // Every outcome has its flags: a count beyond them is a damaged value.
    if n > flags.0.len() {
        return Err(bad(format!(
            "{n} outcomes in {} bytes of flags",
            flags.0.len()
        )));
    }
    // Grown as outcomes decode: a damaged count must not reserve memory up front.
    let mut out = Vec::with_capacity(n.min(1024));
    let mut prev = hour_ms;
    for _ in 0..n {
        let f = u32::try_from(flags.get()?).map_err(|_| bad("flags"))?;
        let on = |bit: u32| f & bit != 0;
        let at = prev.wrapping_add(unzigzag(started.get()?));
        prev = at;
        let started_at: DateTime<Utc> =
            DateTime::from_timestamp_millis(at).ok_or_else(|| bad(format!("start {at} ms")))?;
        let total_ms = millis(total.get()?);
        let opt_ms = |bit: u32, col: &mut Cursor| -> Result<Option<f64>, PackError> {
            Ok(if on(bit) {
                Some(millis(col.get()?))
            } else {
                None
            })
        };
        let ttfb_ms = opt_ms(HAS_TTFB, &mut ttfb)?;
        let ttft_ms = opt_ms(HAS_TTFT, &mut ttft)?;
        let first_answer_ms = opt_ms(HAS_FIRST_ANSWER, &mut first_answer)?;
        let output_tokens = if on(HAS_OUTPUT_TOKENS) {
            Some(u32::try_from(output_tokens.get()?).map_err(|_| bad("output tokens"))?)
        } else {
            None
        };
        let tokens_per_second = if on(HAS_TPS) {
            Some(tps.get()? as f64 / 1000.0)
        } else {
            None
        };
        let model_reported = on(HAS_MODEL).then(|| text(&mut texts, &dict)).transpose()?;
        let system_fingerprint = on(HAS_FINGERPRINT)
            .then(|| text(&mut texts, &dict))
            .transpose()?;
        let http_status = if on(HAS_HTTP_STATUS) {
            Some(u16::try_from(http_status.get()?).map_err(|_| bad("http status"))?)
        } else {
            None
        };
        let error = if on(HAS_ERROR) {
            let parts = errors.get()?;
            let kind = text(&mut errors, &dict)?;
            let status = if parts & u64::from(ERR_STATUS) != 0 {
                Some(u16::try_from(errors.get()?).map_err(|_| bad("error status"))?)
            } else {
                None
            };
            let message = if parts & u64::from(ERR_MESSAGE) != 0 {
                Some(text(&mut errors, &dict)?)
            } else {
                None
            };
            let retry = if parts & u64::from(ERR_RETRY) != 0 {
                Some(errors.get()?)
            } else {
                None
            };
            Some(ProbeError::from_parts(&kind, status, message, retry))
        } else {
            None
        };
        let answer = on(HAS_ANSWER)
            .then(|| text(&mut texts, &dict))
            .transpose()?;
        out.push(ProbeOutcome {
            route: route.clone(),
            kind: kind_of(f)?,
            started_at,
            success: on(SUCCESS),
            attributed_to: None,
            verified: on(VERIFIED_SET).then_some(on(VERIFIED)),
            ttfb_ms,
            ttft_ms,
            first_answer_ms,
            total_ms,
            output_tokens,
            tokens_estimated: on(TOKENS_ESTIMATED),
            tokens_per_second,
            model_reported,
            system_fingerprint,
            http_status,
            error,
            answer,
            max_tokens_exhausted: on(MAX_TOKENS_EXHAUSTED),
            ratelimit: None,
        });
    }
    Ok(out)
}

fn kind_bits(k: OutcomeKind) -> u32 {
    match k {
        OutcomeKind::Probe => 0,
        OutcomeKind::Throughput => 1,
        OutcomeKind::Passive => 2,
    }
}

fn kind_of(flags: u32) -> Result<OutcomeKind, PackError> {
    match flags & KIND_MASK {
        0 => Ok(OutcomeKind::Probe),
        1 => Ok(OutcomeKind::Throughput),
        2 => Ok(OutcomeKind::Passive),
        k => Err(bad(format!("kind {k}"))),
    }
}

/// Milliseconds (finite, >= 0: the store refuses others) to whole microseconds.
fn micros(ms: f64) -> u64 {
    (ms * 1000.0).round() as u64
}

fn millis(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn thousandths(v: f64) -> u64 {
    (v * 1000.0).round() as u64
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// LEB128: seven bits a byte, low first.
fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn get(&mut self) -> Result<u64, PackError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first().ok_or_else(|| bad("truncated"))?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("a number runs past 64 bits"))
    }

    /// A count or index that may not exceed `max`.
    fn len(&mut self, max: usize) -> Result<usize, PackError> {
        let v = self.get()?;
        usize::try_from(v)
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| bad(format!("{v} is out of range")))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PackError> {
        if n > self.0.len() {
            return Err(bad("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: i64 = 1_796_601_600_000;

    fn route() -> RouteId {
        RouteId::new("qwen", "cn", "qwen-plus")
    }

    fn probe(i: i64) -> ProbeOutcome {
        ProbeOutcome {
            route: route(),
            kind: OutcomeKind::Probe,
            started_at: DateTime::from_timestamp_millis(HOUR + i * 30_000 + (i * 37) % 900)
                .unwrap(),
            success: true,
            attributed_to: None,
            verified: Some(true),
            ttfb_ms: Some(180.0 + (i * 7 % 50) as f64 + 0.123),
            ttft_ms: Some(260.5 + (i * 13 % 70) as f64),
            first_answer_ms: Some(260.5 + (i * 13 % 70) as f64),
            total_ms: 410.25 + (i * 17 % 90) as f64,
            output_tokens: Some(3),
            tokens_estimated: false,
            tokens_per_second: None,
            model_reported: Some("qwen-plus-2025-01-25".into()),
            system_fingerprint: Some("fp_1a2b3c".into()),
            http_status: Some(200),
            error: None,
            answer: Some("PROBE_OK".into()),
            max_tokens_exhausted: false,
            ratelimit: None,
        }
    }

    fn failures() -> Vec<ProbeOutcome> {
        let mut out = Vec::new();
        for (j, error) in [
            ProbeError::RateLimited {
                retry_after_ms: Some(20_000),
                message: "slow down".into(),
            },
            ProbeError::Http {
                status: 503,
                message: "upstream overloaded".into(),
            },
            ProbeError::Timeout,
            ProbeError::Connect {
                message: "connection refused".into(),
            },
        ]
        .into_iter()
        .enumerate()
        {
            let mut o = probe(100 + j as i64);
            o.success = false;
            o.verified = None;
            o.ttft_ms = None;
            o.first_answer_ms = None;
            o.answer = None;
            o.model_reported = None;
            o.output_tokens = None;
            o.http_status = error.status();
            o.error = Some(error);
            out.push(o);
        }
        let mut t = probe(110);
        t.kind = OutcomeKind::Throughput;
        t.output_tokens = Some(120);
        t.tokens_estimated = true;
        t.tokens_per_second = Some(48.123_456);
        t.verified = Some(false);
        t.answer = Some("1 2 3 … 39".into());
        out.push(t);
        let mut p = probe(111);
        p.kind = OutcomeKind::Passive;
        p.max_tokens_exhausted = true;
        p.started_at = DateTime::from_timestamp_millis(HOUR - 5).unwrap();
        out.push(p);
        out
    }

    #[test]
    fn every_field_comes_back_to_its_precision_in_order() {
        let mut all: Vec<ProbeOutcome> = (0..100).map(probe).collect();
        all.extend(failures());
        let refs: Vec<&ProbeOutcome> = all.iter().collect();
        let back = decode(&route(), HOUR, &encode(HOUR, &refs)).unwrap();
        assert_eq!(back.len(), all.len());
        for (a, b) in all.iter().zip(&back) {
            let us = |v: Option<f64>| v.map(|v| (v * 1000.0).round());
            assert_eq!(us(a.ttfb_ms), us(b.ttfb_ms));
            assert_eq!(us(a.ttft_ms), us(b.ttft_ms));
            assert_eq!(us(a.first_answer_ms), us(b.first_answer_ms));
            assert_eq!(us(Some(a.total_ms)), us(Some(b.total_ms)));
            assert_eq!(
                a.tokens_per_second.map(|v| (v * 1000.0).round()),
                b.tokens_per_second.map(|v| (v * 1000.0).round())
            );
            // Everything else exactly: compare with the rounded fields copied over.
            let mut a = a.clone();
            a.ttfb_ms = b.ttfb_ms;
            a.ttft_ms = b.ttft_ms;
            a.first_answer_ms = b.first_answer_ms;
            a.total_ms = b.total_ms;
            a.tokens_per_second = b.tokens_per_second;
            assert_eq!(
                serde_json::to_value(&a).unwrap(),
                serde_json::to_value(b).unwrap()
            );
        }
        // A value at whole microseconds is exact.
        assert_eq!(back[0].total_ms, 410.25);
    }

    #[test]
    fn an_hour_of_probes_packs_to_a_few_bytes_an_outcome() {
        let all: Vec<ProbeOutcome> = (0..120).map(probe).collect();
        let refs: Vec<&ProbeOutcome> = all.iter().collect();
        let packed = encode(HOUR, &refs);
        assert!(packed.len() < 120 * 16, "{} bytes", packed.len());
        assert_eq!(decode(&route(), HOUR, &packed).unwrap().len(), 120);
        assert_eq!(decode(&route(), HOUR, &encode(HOUR, &[])).unwrap().len(), 0);
    }

    #[test]
    fn a_damaged_value_is_an_error_never_a_panic() {
        let all: Vec<ProbeOutcome> = (0..20).map(probe).chain(failures()).collect();
        let refs: Vec<&ProbeOutcome> = all.iter().collect();
        let packed = encode(HOUR, &refs);
        assert!(decode(&route(), HOUR, &[]).is_err());
        assert!(decode(&route(), HOUR, &[9, 1, 2]).is_err());
        for cut in 1..packed.len() {
            assert!(
                decode(&route(), HOUR, &packed[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        // Every byte changed in turn: decoding answers (most often an error), never panics.
        for i in 1..packed.len() {
            let mut bad = packed.clone();
            bad[i] ^= 0x5a;
            let _ = decode(&route(), HOUR, &bad);
        }
    }

    #[test]
    fn varints_and_zigzag_round_trip_at_the_edges() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut b = Vec::new();
            put(&mut b, v);
            assert_eq!(Cursor(&b).get().unwrap(), v);
        }
        for v in [0, 1, -1, 30_000, -5, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }
}
