//! A baseline as bytes, so a start reads each route's baselines instead of replaying its raw
//! history (which grows with `retention_days` and took minutes to hours at thousands of
//! routes). The state is split in parts: one per time-of-day bucket, and a head (the all-day
//! window and the runs of held-back samples). A periodic save writes only the parts that
//! changed since the last one, about two buckets a route per hour at hourly buckets.
//!
//! A restored baseline is the baseline that was saved: the same samples in the same order
//! (16-bit, as held), the same held runs. The start replays the outcomes after the newest one
//! it learned, so restored-and-replayed equals rebuilt-from-raw on the same outcomes.
//! A state learned under other detection settings ([`Baseline::shape`]) is not restored: those
//! settings decide which samples are learned, so the start rebuilds from the raw history.

use chrono::{DateTime, Utc};

use super::{Baseline, Bucket, Held, Run, Sample, Series};
use crate::config::DetectionConfig;
use crate::route::RouteId;

/// The encoding's version, first byte of a head.
const VERSION: u8 = 1;
/// The dirty bit of the head; buckets use bits 0..=62 (62: that bucket and all above it).
const HEAD_BIT: u64 = 1 << 63;
const LAST_BUCKET_BIT: usize = 62;

/// A baseline's parts to save.
#[derive(Debug, Clone, PartialEq)]
pub struct Parts {
    pub head: Vec<u8>,
    /// (bucket index, bytes), only those that changed (all, when asked).
    pub buckets: Vec<(i32, Vec<u8>)>,
}

/// Why saved bytes were not restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    #[error("learned under other detection settings")]
    Shape,
    #[error("saved state unreadable: {0}")]
    Bytes(&'static str),
}

impl Baseline {
    /// The settings that decide which outcomes become which samples (window, thresholds,
    /// hold, bucket scheme); `min_samples` only decides readiness and is not part of it.
    pub fn shape(&self) -> String {
        format!(
            "v{VERSION} window={} sigma={} floor_ratio={} floor_ms={} tps_floor={} hold={} buckets={:?}",
            self.window, self.sigma, self.floor_ratio, self.floor_ms, self.tps_floor, self.hold, self.scheme
        )
    }

    /// The newest outcome this baseline was given.
    pub fn newest(&self) -> Option<DateTime<Utc>> {
        self.newest
    }

    /// Whether anything changed since the last [`Baseline::take_parts`].
    pub fn unsaved(&self) -> bool {
        self.unsaved != 0
    }

    pub(super) fn mark(&mut self, bucket: Option<usize>) {
        self.unsaved |= HEAD_BIT | bucket.map_or(0, |i| 1 << i.min(LAST_BUCKET_BIT));
    }

    /// Every part is saved next time (after a save that failed).
    pub fn mark_all_unsaved(&mut self) {
        self.unsaved = u64::MAX;
    }

    /// The parts that changed since the last call (every part with `all`); marks them saved.
    pub fn take_parts(&mut self, all: bool) -> Parts {
        let dirty = if all { u64::MAX } else { self.unsaved };
        self.unsaved = 0;
        let mut head = vec![VERSION, u8::from(!self.buckets.is_empty())];
        put_bucket(&mut head, &self.all_day);
        put_run(&mut head, &self.latency_run);
        put_run(&mut head, &self.tps_run);
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .filter(|(i, b)| dirty & (1 << (*i).min(LAST_BUCKET_BIT)) != 0 && !b.is_empty())
            .map(|(i, b)| {
                let mut out = Vec::new();
                put_bucket(&mut out, b);
                (i32::try_from(i).unwrap_or(i32::MAX), out)
            })
            .collect();
        Parts { head, buckets }
    }

    /// The baseline saved as `parts` under `shape`, having learned up to `newest`.
    pub fn restore(
        route: RouteId,
        cfg: &DetectionConfig,
        shape: &str,
        newest: Option<DateTime<Utc>>,
        parts: &Parts,
    ) -> Result<Baseline, RestoreError> {
        let mut b = Baseline::new(route, cfg);
        if b.shape() != shape {
            return Err(RestoreError::Shape);
        }
        let mut r = Bytes(&parts.head);
        if r.u8()? != VERSION {
            return Err(RestoreError::Bytes("unknown version"));
        }
        let has_buckets = r.u8()? != 0;
        b.all_day = get_bucket(&mut r, b.window)?;
        b.latency_run = get_run(&mut r, b.window)?;
        b.tps_run = get_run(&mut r, b.window)?;
        r.end()?;
        if has_buckets {
            let n = b.bucket_count as usize;
            b.buckets.reserve_exact(n);
            b.buckets.resize_with(n, Bucket::default);
        }
        for (i, bytes) in &parts.buckets {
            let slot = usize::try_from(*i)
                .ok()
                .and_then(|i| b.buckets.get_mut(i))
                .ok_or(RestoreError::Bytes("bucket out of range"))?;
            let mut r = Bytes(bytes);
            *slot = get_bucket(&mut r, b.window)?;
            r.end()?;
        }
        b.newest = newest;
        b.unsaved = 0;
        Ok(b)
    }
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend(u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_series(out: &mut Vec<u8>, s: &Series) {
    put_u32(out, s.len());
    let (newer, older) = s.buf[..s.len()].split_at(s.head as usize);
    for v in older.iter().chain(newer) {
        out.extend(v.0.to_le_bytes());
    }
}

fn put_bucket(out: &mut Vec<u8>, b: &Bucket) {
    out.push(u8::from(b.more.is_some()));
    put_series(out, &b.latency);
    if let Some(m) = &b.more {
        put_series(out, &m[0]);
        put_series(out, &m[1]);
    }
}

fn put_run(out: &mut Vec<u8>, r: &Run) {
    put_u32(out, r.pending.len());
    for (bucket, x, ttft) in &r.pending {
        let b = bucket.and_then(|b| i32::try_from(b).ok()).unwrap_or(-1);
        out.extend(b.to_le_bytes());
        out.extend(x.to_le_bytes());
        out.extend(ttft.unwrap_or(f64::NAN).to_le_bytes());
    }
    put_u32(out, r.len as usize);
    put_u32(out, r.recent.len());
    let mut byte = 0u8;
    for (i, abnormal) in r.recent.iter().enumerate() {
        byte |= u8::from(*abnormal) << (i % 8);
        if i % 8 == 7 {
            out.push(byte);
            byte = 0;
        }
    }
    if r.recent.len() % 8 != 0 {
        out.push(byte);
    }
}

/// A cursor over saved bytes; every read says when the bytes are short.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], RestoreError> {
        if self.0.len() < N {
            return Err(RestoreError::Bytes("truncated"));
        }
        let (a, rest) = self.0.split_at(N);
        self.0 = rest;
        Ok(a.try_into().unwrap_or([0; N]))
    }

    fn u8(&mut self) -> Result<u8, RestoreError> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<usize, RestoreError> {
        Ok(u32::from_le_bytes(self.take()?) as usize)
    }

    fn end(&self) -> Result<(), RestoreError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(RestoreError::Bytes("trailing bytes"))
        }
    }
}

fn get_series(r: &mut Bytes<'_>, window: usize) -> Result<Series, RestoreError> {
    let n = r.u32()?;
    if n > window {
        return Err(RestoreError::Bytes("series longer than the window"));
    }
    let mut s = Series::default();
    for _ in 0..n {
        s.push_sample(Sample(u16::from_le_bytes(r.take()?)), window);
    }
    Ok(s)
}

fn get_bucket(r: &mut Bytes<'_>, window: usize) -> Result<Bucket, RestoreError> {
    let more = r.u8()? != 0;
    let latency = get_series(r, window)?;
    let more = if more {
        Some(Box::new([get_series(r, window)?, get_series(r, window)?]))
    } else {
        None
    };
    Ok(Bucket { latency, more })
}

fn get_run(r: &mut Bytes<'_>, window: usize) -> Result<Run, RestoreError> {
    let pending_n = r.u32()?;
    if pending_n > window {
        return Err(RestoreError::Bytes("more held samples than the window"));
    }
    let mut pending: Vec<Held> = Vec::with_capacity(pending_n);
    for _ in 0..pending_n {
        let b = i32::from_le_bytes(r.take()?);
        let x = f64::from_le_bytes(r.take()?);
        let ttft = f64::from_le_bytes(r.take()?);
        pending.push((usize::try_from(b).ok(), x, (!ttft.is_nan()).then_some(ttft)));
    }
    let len = u32::try_from(r.u32()?).unwrap_or(u32::MAX);
    let recent_n = r.u32()?;
    if recent_n > window {
        return Err(RestoreError::Bytes("more recent marks than the window"));
    }
    let mut run = Run {
        pending,
        len,
        ..Run::default()
    };
    let mut byte = 0;
    for i in 0..recent_n {
        if i % 8 == 0 {
            byte = r.u8()?;
        }
        run.remember(byte & (1 << (i % 8)) != 0, window);
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::super::tests::probe;
    use super::*;
    use chrono::TimeZone;

    fn at(s: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0).unwrap() + chrono::Duration::seconds(s)
    }

    /// Two days of probes every 5 minutes, latencies varying by hour, with a slow stretch
    /// (held back, then learned as jitter or dropped) now and then.
    fn history(n: i64) -> Vec<crate::probe::ProbeOutcome> {
        (0..n)
            .map(|i| {
                let hour = (i / 12) % 24;
                let slow = if i % 97 < 2 { 5000.0 } else { 0.0 };
                let mut o = probe(
                    at(300 * i),
                    800.0 + 20.0 * hour as f64 + (i % 7) as f64 * 13.0 + slow,
                );
                if i % 3 == 0 {
                    o.ttft_ms = Some(200.0 + (i % 5) as f64);
                }
                o
            })
            .collect()
    }

    fn restored(b: &mut Baseline, cfg: &DetectionConfig, all: bool) -> Baseline {
        let parts = b.take_parts(all);
        Baseline::restore(b.route().clone(), cfg, &b.shape(), b.newest(), &parts).unwrap()
    }

    #[test]
    fn saved_and_replayed_equals_rebuilt_from_raw() {
        let route = RouteId::new("p", "r", "m");
        let cfg = DetectionConfig::default();
        let all = history(600);
        let (before, after) = all.split_at(400);
        let mut saved = Baseline::rebuild(route.clone(), &cfg, before);
        let mut b = restored(&mut saved, &cfg, true);
        assert_eq!(b.newest(), Some(before[399].started_at));
        for o in after {
            b.record(o);
        }
        let raw = Baseline::rebuild(route, &cfg, &all);
        assert_eq!(b.snapshots(), raw.snapshots());
        assert_eq!(b.samples(), raw.samples());
        assert_eq!(b.latency_run.len, raw.latency_run.len);
        assert_eq!(b.latency_run.pending, raw.latency_run.pending);
        assert_eq!(b.latency_run.recent, raw.latency_run.recent);
        assert_eq!(
            b.latency_run.recent_abnormal,
            raw.latency_run.recent_abnormal
        );
    }

    #[test]
    fn only_changed_buckets_are_saved_and_the_rest_are_kept() {
        let route = RouteId::new("p", "r", "m");
        let cfg = DetectionConfig::default();
        let all = history(300);
        let mut live = Baseline::rebuild(route.clone(), &cfg, &all[..288]);
        let first = live.take_parts(false);
        assert!(
            first.buckets.len() >= 23,
            "a day of probes fills every hour's bucket"
        );
        assert!(!live.unsaved());
        for o in &all[288..] {
            live.record(o);
        }
        let second = live.take_parts(false);
        assert_eq!(
            second.buckets.len(),
            1,
            "an hour of probes changes one bucket"
        );
        // The store keeps the first save's buckets and the second's head and changed bucket.
        let mut merged = first.clone();
        merged.head = second.head.clone();
        for (i, bytes) in &second.buckets {
            let slot = merged.buckets.iter_mut().find(|(j, _)| j == i).unwrap();
            slot.1 = bytes.clone();
        }
        let back = Baseline::restore(route, &cfg, &live.shape(), live.newest(), &merged).unwrap();
        assert_eq!(back.snapshots(), live.snapshots());
    }

    #[test]
    fn other_settings_or_damaged_bytes_are_not_restored() {
        let route = RouteId::new("p", "r", "m");
        let cfg = DetectionConfig::default();
        let mut b = Baseline::rebuild(route.clone(), &cfg, &history(50));
        let shape = b.shape();
        let parts = b.take_parts(true);
        let mut wider = cfg.clone();
        wider.baseline_window += 1;
        assert_eq!(
            Baseline::restore(route.clone(), &wider, &shape, None, &parts).unwrap_err(),
            RestoreError::Shape
        );
        for cut in [0, 1, parts.head.len() / 2, parts.head.len() - 1] {
            let short = Parts {
                head: parts.head[..cut].to_vec(),
                buckets: parts.buckets.clone(),
            };
            assert!(matches!(
                Baseline::restore(route.clone(), &cfg, &shape, None, &short),
                Err(RestoreError::Bytes(_))
            ));
        }
        let mut long = parts.clone();
        long.buckets[0].1.push(0);
        assert!(Baseline::restore(route, &cfg, &shape, None, &long).is_err());
    }
}
