//! A fixed, mergeable latency histogram. Every rollup row carries one, so a percentile over
//! 30 days merges a few hundred small histograms instead of scanning raw rows.
//!
//! The layout is part of the stored format: 64 log-spaced buckets from 10 ms to 600 s (each
//! about 18.8% wider than the previous one), plus an underflow bucket `[0, 10 ms)` and an
//! overflow bucket `[600 s, ∞)`. Changing it needs a new encoding version byte.

/// Lower edge of the first log-spaced bucket, in ms.
pub const MIN_MS: f64 = 10.0;
/// Upper edge of the last log-spaced bucket, in ms.
pub const MAX_MS: f64 = 600_000.0;
/// Log-spaced buckets between [`MIN_MS`] and [`MAX_MS`].
pub const LOG_BUCKETS: usize = 64;
/// All buckets: underflow, the log-spaced ones, overflow.
pub const BUCKETS: usize = LOG_BUCKETS + 2;

/// First byte of an encoded histogram; bump it if the bucket layout ever changes.
const ENCODING_V1: u8 = 1;

/// The ratio between a log-spaced bucket's upper and lower edge (≈ 1.188). A percentile
/// estimate is within this factor of the exact value (for values in 10 ms..600 s).
pub fn bucket_ratio() -> f64 {
    (MAX_MS / MIN_MS).powf(1.0 / LOG_BUCKETS as f64)
}

/// The bucket a latency falls in.
pub fn bucket_index(ms: f64) -> usize {
    if ms.is_nan() || ms < MIN_MS {
        return 0;
    }
    if ms >= MAX_MS {
        return BUCKETS - 1;
    }
    let i = ((ms / MIN_MS).ln() / bucket_ratio().ln()).floor();
    // `i` is in [0, LOG_BUCKETS) up to rounding at the very top edge; clamp covers that.
    1 + (i.max(0.0) as usize).min(LOG_BUCKETS - 1)
}

/// `[lower, upper)` edges of bucket `i`, in ms (the overflow bucket's upper edge is infinite).
pub fn bucket_bounds(i: usize) -> (f64, f64) {
    match i {
        0 => (0.0, MIN_MS),
        i if i > LOG_BUCKETS => (MAX_MS, f64::INFINITY),
        i => {
            let r = bucket_ratio();
            (MIN_MS * r.powi(i as i32 - 1), MIN_MS * r.powi(i as i32))
        }
    }
}

/// Counts per bucket. Dense in memory (cheap to merge), sparse on disk (a route's latencies
/// usually fall in a handful of buckets, so a rollup's histogram is ~10–30 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: [u64; BUCKETS],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: [0; BUCKETS],
        }
    }
}

/// A stored histogram that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad latency histogram encoding: {0}")]
pub struct DecodeError(&'static str);

impl LatencyHistogram {
    pub fn record(&mut self, ms: f64) {
        self.counts[bucket_index(ms)] += 1;
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Counts per bucket, index as in [`bucket_index`].
    pub fn counts(&self) -> &[u64; BUCKETS] {
        &self.counts
    }

    /// Estimates the `q`-quantile (0..=1) with the nearest-rank definition: the bucket is
    /// exactly the one holding the exact answer; inside it the rank is interpolated on a log
    /// scale. `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 || q.is_nan() {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).clamp(1, n);
        let mut before = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0 || before + c < rank {
                before += c;
                continue;
            }
            // Where the rank sits inside this bucket, in (0, 1).
            let pos = ((rank - before) as f64 - 0.5) / c as f64;
            let (lo, hi) = bucket_bounds(i);
            return Some(match i {
                0 => hi * pos,
                i if i > LOG_BUCKETS => lo,
                _ => lo * (hi / lo).powf(pos),
            });
        }
        None
    }

    /// Sparse encoding: a version byte, then `(bucket index: u8, count: LEB128)` for each
    /// non-empty bucket in increasing index order.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        out.push(ENCODING_V1);
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            // BUCKETS < 256, so the index always fits a byte.
            out.push(i as u8);
            let mut v = c;
            loop {
                let byte = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    out.push(byte);
                    break;
                }
                out.push(byte | 0x80);
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut h = Self::default();
        let (&version, mut rest) = bytes.split_first().ok_or(DecodeError("empty"))?;
        if version != ENCODING_V1 {
            return Err(DecodeError("unknown version"));
        }
        while let Some((&i, tail)) = rest.split_first() {
            let slot = h
                .counts
                .get_mut(i as usize)
                .ok_or(DecodeError("bucket index out of range"))?;
            let (mut v, mut shift) = (0u64, 0u32);
            rest = tail;
            loop {
                let (&b, tail) = rest.split_first().ok_or(DecodeError("truncated count"))?;
                rest = tail;
                if shift > 63 {
                    return Err(DecodeError("count overflow"));
                }
                v |= u64::from(b & 0x7f) << shift;
                shift += 7;
                if b & 0x80 == 0 {
                    break;
                }
            }
            *slot += v;
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_cover_the_range_without_gaps() {
        assert_eq!(bucket_bounds(1).0, MIN_MS);
        assert!((bucket_bounds(LOG_BUCKETS).1 - MAX_MS).abs() < 1e-6);
        for i in 1..LOG_BUCKETS {
            assert!((bucket_bounds(i).1 - bucket_bounds(i + 1).0).abs() < 1e-9);
        }
        for ms in [
            0.0, 5.0, 10.0, 11.0, 250.0, 999.9, 30_000.0, 599_999.0, 600_000.0, 1e9,
        ] {
            let (lo, hi) = bucket_bounds(bucket_index(ms));
            assert!(
                lo <= ms * (1.0 + 1e-12) && ms < hi * (1.0 + 1e-12),
                "{ms}: {lo}..{hi}"
            );
        }
        assert_eq!(bucket_index(f64::NAN), 0);
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut h = LatencyHistogram::default();
        for (ms, n) in [(3.0, 1u64), (120.0, 300), (800.0, 70_000), (1e7, 2)] {
            for _ in 0..n {
                h.record(ms);
            }
        }
        let bytes = h.encode();
        assert!(bytes.len() < 16, "{} bytes", bytes.len());
        assert_eq!(LatencyHistogram::decode(&bytes), Ok(h));
        assert_eq!(
            LatencyHistogram::decode(&LatencyHistogram::default().encode()),
            Ok(LatencyHistogram::default())
        );
        assert!(LatencyHistogram::decode(&[]).is_err());
        assert!(LatencyHistogram::decode(&[9]).is_err());
        assert!(LatencyHistogram::decode(&[1, 200, 1]).is_err());
        assert!(LatencyHistogram::decode(&[1, 3, 0x80]).is_err());
    }

    #[test]
    fn quantiles_stay_within_one_bucket_of_exact() {
        // A skewed spread: mostly fast, a slow tail.
        let values: Vec<f64> = (0..10_000)
            .map(|i| 200.0 + (i % 97) as f64 * 3.0 + if i % 50 == 0 { 9_000.0 } else { 0.0 })
            .collect();
        let mut h = LatencyHistogram::default();
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        for v in &values {
            h.record(*v);
        }
        for q in [0.01, 0.5, 0.9, 0.95, 0.99, 1.0] {
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            let exact = sorted[rank - 1];
            let est = h.quantile(q).unwrap_or(f64::NAN);
            let (lo, hi) = bucket_bounds(bucket_index(exact));
            assert!(lo <= est && est <= hi, "q={q}: est {est}, exact {exact}");
        }
        assert_eq!(LatencyHistogram::default().quantile(0.5), None);
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = LatencyHistogram::default();
        let mut b = LatencyHistogram::default();
        a.record(100.0);
        b.record(100.0);
        b.record(5_000.0);
        a.merge(&b);
        assert_eq!(a.count(), 3);
        assert_eq!(a.counts()[bucket_index(100.0)], 2);
    }
}
