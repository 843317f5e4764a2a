//! What "normal" looks like for one route: total latency and time to first token of the last
//! `baseline_window` successful `PROBE_OK` probes per time-of-day bucket (peak hours have their
//! own normal), plus an all-day rolling window that a thin bucket falls
//! back to; tokens/s from throughput probes and real streams.
//!
//! Only [`OutcomeKind::Probe`] outcomes feed latency: they use one fixed prompt, while passive
//! traffic has every prompt size. Updates are incremental (ring buffers, O(window) per update
//! for the cached mean/σ); percentiles are computed only for [`Baseline::snapshot`].
//!
//! **Sustained anomalies are not learned.** A sample above the judging threshold is held back:
//! if the run of such samples ends before `degraded_after` and such samples are rare (at most
//! [`JITTER_FRACTION`] of the last `baseline_window`), it was jitter and the held samples are
//! learned after all, so the spread is not truncated (plain σ-clipping shrinks σ and makes the
//! detector jumpier over time). Otherwise they are dropped: a 23-minute latency spike does not
//! teach the baseline that 14 s is normal halfway through it, nor does a route that is slow on
//! every other probe. Only after a full `baseline_window` of consecutive anomalous samples does
//! the baseline accept the new level (a provider that really became slower for good). The rule depends only on the sequence of
//! outcomes, so [`Baseline::rebuild`] reproduces the live baseline exactly.

use std::collections::VecDeque;

use chrono::{DateTime, NaiveTime, Timelike, Utc};
use serde::Serialize;
use statrs::statistics::{Data, OrderStatistics, Statistics};

use crate::config::{Buckets, DetectionConfig};
pub use crate::evidence::{LatencyRef, TpsRef};
use crate::probe::outcome::{OutcomeKind, ProbeOutcome};
use crate::route::RouteId;

pub mod saved;

/// The label of the all-day window.
pub const ALL_DAY: &str = "all-day";

/// Above-threshold samples are jitter (and learned) only while at most this fraction of the
/// recent samples was above the threshold: a 2σ threshold on steady data is crossed by a few
/// percent of samples, an intermittent fault by far more.
pub const JITTER_FRACTION: f64 = 0.1;

/// A bounded series of samples, the oldest dropped first.
///
/// Samples are kept in 16 bits ([`Sample`]: ±0.025%, whole numbers up to 4,096 exact) and the
/// buffer grows with the samples instead of being allocated for the whole window up front: a
/// route has 25 buckets × 1–3 series at hourly buckets, full after a day, and at 10,000 routes
/// each byte a sample saves is 25–75 MB.
#[derive(Debug, Clone, Default)]
struct Series {
    /// The samples: in order until the window is full, then a ring whose oldest is at `head`.
    buf: Box<[Sample]>,
    len: u32,
    head: u32,
}

impl Series {
    /// Adds a sample, dropping the oldest once `window` are held.
    fn push(&mut self, x: f64, window: usize) {
        self.push_sample(Sample::pack(x), window);
    }

    fn push_sample(&mut self, x: Sample, window: usize) {
        let len = self.len as usize;
        if len >= window && len == self.buf.len() {
            let head = self.head as usize;
            self.buf[head] = x;
            self.head = ((head + 1) % len) as u32;
            return;
        }
        if len == self.buf.len() {
            // Grow by doubling, never past the window (a full window of 100 holds 100). Not
            // full yet, so nothing was dropped and the samples are in order.
            let cap = (len * 2).max(4).min(window.max(len + 1));
            let mut grown = Vec::with_capacity(cap);
            grown.extend_from_slice(&self.buf);
            grown.resize(cap, Sample(0));
            self.buf = grown.into_boxed_slice();
        }
        self.buf[len] = x;
        self.len += 1;
    }

    /// Oldest first.
    fn values(&self) -> impl Iterator<Item = f64> + '_ {
        let (newer, older) = self.buf[..self.len()].split_at(self.head as usize);
        older.iter().chain(newer).map(|v| v.unpack())
    }

    fn len(&self) -> usize {
        self.len as usize
    }

    /// Mean and sample standard deviation (n − 1; no spread for a single sample). Computed
    /// when asked, over at most a window: cheaper than 16 bytes a series kept for them.
    fn spread(&self) -> (f64, f64) {
        let sd = self.values().std_dev();
        (self.values().mean(), if sd.is_finite() { sd } else { 0.0 })
    }

    fn summary(&self) -> Option<Summary> {
        if self.len == 0 {
            return None;
        }
        let (mean, stddev) = self.spread();
        let mut data = Data::new(self.values().collect::<Vec<f64>>());
        Some(Summary {
            samples: self.len(),
            mean,
            stddev,
            p50: data.percentile(50),
            p95: data.percentile(95),
            p99: data.percentile(99),
        })
    }
}

/// A non-negative sample in 16 bits: an unsigned float with 5 exponent bits and 11 mantissa
/// bits, from 2⁻¹¹ to just under 2²⁰ (a latency of 0.5 µs to 17 minutes in ms). Relative
/// error at most 2⁻¹² (0.025%), far below any spread a baseline judges by; whole numbers up
/// to 4,096 are exact. Zero, negatives and NaN are 0; larger values are the largest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample(u16);

impl Sample {
    /// The exponent of 2⁰ in the 5-bit field.
    const EXP_BIAS: i32 = 12;
    /// The mantissa bits an `f32` has beyond the 11 kept.
    const DROPPED: u32 = 23 - 11;

    fn pack(x: f64) -> Self {
        if x.is_nan() || x <= 0.0 {
            return Self(0);
        }
        // Round to nearest on the dropped bits; a carry moves into the exponent, as it should.
        let bits = (x as f32).to_bits() + (1 << (Self::DROPPED - 1));
        let exp = (bits >> 23) as i32 - 127 + Self::EXP_BIAS;
        match exp {
            ..=0 => Self(0),
            32.. => Self(u16::MAX),
            e => Self(((e as u16) << 11) | ((bits >> Self::DROPPED) & 0x7ff) as u16),
        }
    }

    fn unpack(self) -> f64 {
        if self.0 == 0 {
            return 0.0;
        }
        let exp = (i32::from(self.0 >> 11) - Self::EXP_BIAS + 127) as u32;
        let mantissa = u32::from(self.0 & 0x7ff) << Self::DROPPED;
        f64::from(f32::from_bits((exp << 23) | mantissa))
    }
}

#[derive(Debug, Clone, Copy)]
struct Summary {
    samples: usize,
    mean: f64,
    stddev: f64,
    p50: f64,
    p95: f64,
    p99: f64,
}

/// One time-of-day bucket. First token and tokens/s come only from streaming and
/// throughput probes, so their series live behind a box made on their first sample: a
/// non-streaming route's buckets have no room for them.
#[derive(Debug, Clone, Default)]
struct Bucket {
    latency: Series,
    /// First token, then tokens/s.
    more: Option<Box<[Series; 2]>>,
}

impl Bucket {
    fn latency(&self) -> Option<&Series> {
        Some(&self.latency)
    }

    fn ttft(&self) -> Option<&Series> {
        self.more.as_ref().map(|m| &m[0])
    }

    fn tps(&self) -> Option<&Series> {
        self.more.as_ref().map(|m| &m[1])
    }

    fn more(&mut self) -> &mut [Series; 2] {
        self.more.get_or_insert_with(Box::default)
    }

    fn is_empty(&self) -> bool {
        self.latency.len() == 0 && self.more.is_none()
    }
}

/// A held-back sample: (bucket, value, ttft).
type Held = (Option<usize>, f64, Option<f64>);

/// A run of consecutive anomalous samples (see the module docs).
#[derive(Debug, Clone, Default)]
struct Run {
    /// Held back while the run is shorter than `degraded_after`: (bucket, value, ttft).
    pending: Vec<Held>,
    len: u32,
    /// Whether each of the last `baseline_window` samples was above the threshold.
    recent: VecDeque<bool>,
    recent_abnormal: usize,
}

impl Run {
    fn remember(&mut self, abnormal: bool, window: usize) {
        if self.recent.len() == window && self.recent.pop_front() == Some(true) {
            self.recent_abnormal -= 1;
        }
        self.recent.push_back(abnormal);
        self.recent_abnormal += usize::from(abnormal);
    }

    fn rare(&self) -> bool {
        self.recent_abnormal as f64 <= JITTER_FRACTION * self.recent.len().max(1) as f64
    }
}

/// How local time maps to buckets.
#[derive(Debug, Clone)]
enum Scheme {
    None,
    Hour(chrono_tz::Tz),
    Windows(chrono_tz::Tz, Vec<(NaiveTime, NaiveTime)>),
}

/// The baseline in force for one bucket, for the status API.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct BaselineSnapshot {
    pub bucket: String,
    pub samples: usize,
    pub mean_ms: f64,
    pub stddev_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub ttft_samples: usize,
    pub ttft_mean_ms: Option<f64>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub tps_samples: usize,
    pub tps_mean: Option<f64>,
}

/// One route's baselines. Saved as parts ([`saved`]) and restored at start; without a saved
/// state (or one learned under other settings) [`Baseline::rebuild`] recomputes it from the
/// stored raw outcomes.
#[derive(Debug, Clone)]
pub struct Baseline {
    route: RouteId,
    scheme: Scheme,
    min_samples: usize,
    window: usize,
    sigma: f64,
    floor_ratio: f64,
    floor_ms: f64,
    tps_floor: f64,
    /// Runs shorter than this are jitter and are learned.
    hold: u32,
    /// One per time-of-day bucket, made all at once on the first sample (none before).
    buckets: Vec<Bucket>,
    /// How many time-of-day buckets the scheme has.
    bucket_count: u32,
    all_day: Bucket,
    latency_run: Run,
    tps_run: Run,
    /// The newest outcome given to [`Baseline::record`]: a restore replays what came after.
    newest: Option<DateTime<Utc>>,
    /// Parts changed since the last save ([`saved`]).
    unsaved: u64,
}

impl Baseline {
    pub fn new(route: RouteId, cfg: &DetectionConfig) -> Self {
        let window = cfg.baseline_window.max(1) as usize;
        let (scheme, n) = match &cfg.buckets {
            Buckets::None => (Scheme::None, 0),
            Buckets::Hour => (Scheme::Hour(cfg.timezone), 24),
            Buckets::Windows(w) => (Scheme::Windows(cfg.timezone, w.clone()), w.len() + 1),
        };
        Self {
            route,
            scheme,
            min_samples: cfg.min_samples.max(1) as usize,
            window,
            sigma: cfg.sigma,
            floor_ratio: cfg.latency_floor_ratio,
            floor_ms: cfg.latency_floor.as_secs_f64() * 1000.0,
            tps_floor: cfg.tps_floor,
            hold: cfg.degraded_after.max(1),
            buckets: Vec::new(),
            bucket_count: u32::try_from(n).unwrap_or(u32::MAX),
            all_day: Bucket::default(),
            latency_run: Run::default(),
            tps_run: Run::default(),
            newest: None,
            unsaved: 0,
        }
    }

    /// Replays stored outcomes (oldest first) into a fresh baseline; outcomes of other routes
    /// are ignored. Same sequence in, same baseline out.
    pub fn rebuild<'a>(
        route: RouteId,
        cfg: &DetectionConfig,
        outcomes: impl IntoIterator<Item = &'a ProbeOutcome>,
    ) -> Self {
        let mut b = Self::new(route, cfg);
        for o in outcomes {
            b.record(o);
        }
        b
    }

    pub fn route(&self) -> &RouteId {
        &self.route
    }

    /// Enough successful probes overall to judge latency (else the route is UNKNOWN).
    pub fn ready(&self) -> bool {
        self.all_day.latency.len() >= self.min_samples
    }

    /// Latency samples in the all-day window.
    pub fn samples(&self) -> usize {
        self.all_day.latency.len()
    }

    /// Heap and inline bytes held (for capacity planning: 200 bytes per full series at the
    /// default window of 100, nothing for an empty one).
    pub fn approx_bytes(&self) -> usize {
        let series = |s: &Series| s.buf.len() * std::mem::size_of::<Sample>();
        let bucket = |b: &Bucket| {
            let more = b.more.as_ref().map_or(0, |m| {
                std::mem::size_of::<[Series; 2]>() + series(&m[0]) + series(&m[1])
            });
            series(&b.latency) + more
        };
        let run =
            |r: &Run| r.recent.capacity() + r.pending.capacity() * std::mem::size_of::<Held>();
        std::mem::size_of::<Self>()
            + self.buckets.capacity() * std::mem::size_of::<Bucket>()
            + self.buckets.iter().map(bucket).sum::<usize>()
            + bucket(&self.all_day)
            + run(&self.latency_run)
            + run(&self.tps_run)
    }

    /// Learns from one outcome (call it after the detector judged the outcome).
    pub fn record(&mut self, o: &ProbeOutcome) {
        if o.route != self.route {
            return;
        }
        self.newest = self.newest.max(Some(o.started_at));
        if !o.success {
            return;
        }
        let at = o.started_at;
        let b = self.bucket_index(at);
        // The runs of held samples are in the head: it changes with every success.
        self.mark(None);
        if o.kind == OutcomeKind::Probe && o.verified != Some(false) {
            // A wrong answer may be longer or shorter: not this prompt's latency.
            let abnormal = self
                .latency_ref(at)
                .is_some_and(|r| o.total_ms > r.threshold_ms);
            let (window, hold) = (self.window, self.hold);
            if let Some(accept) = step_run(&mut self.latency_run, abnormal, hold, window) {
                for (pb, x, ttft) in accept {
                    self.push_latency(pb, x, ttft);
                }
                self.push_latency(b, o.total_ms, o.ttft_ms);
            } else if abnormal && self.latency_run.len < hold {
                self.latency_run.pending.push((b, o.total_ms, o.ttft_ms));
            }
        }
        if matches!(o.kind, OutcomeKind::Throughput | OutcomeKind::Passive) {
            if let Some(tps) = o.tokens_per_second.filter(|t| t.is_finite() && *t > 0.0) {
                let abnormal = self.tps_ref(at).is_some_and(|r| tps < r.floor);
                let (window, hold) = (self.window, self.hold);
                if let Some(accept) = step_run(&mut self.tps_run, abnormal, hold, window) {
                    for (pb, x, _) in accept {
                        self.push_tps(pb, x);
                    }
                    self.push_tps(b, tps);
                } else if abnormal && self.tps_run.len < hold {
                    self.tps_run.pending.push((b, tps, None));
                }
            }
        }
    }

    fn push_latency(&mut self, b: Option<usize>, x: f64, ttft: Option<f64>) {
        self.mark(b);
        let window = self.window;
        for bucket in self.targets(b) {
            bucket.latency.push(x, window);
            if let Some(t) = ttft {
                bucket.more()[0].push(t, window);
            }
        }
    }

    fn push_tps(&mut self, b: Option<usize>, x: f64) {
        self.mark(b);
        let window = self.window;
        for bucket in self.targets(b) {
            bucket.more()[1].push(x, window);
        }
    }

    fn targets(&mut self, b: Option<usize>) -> impl Iterator<Item = &mut Bucket> {
        if b.is_some() && self.buckets.is_empty() {
            let n = self.bucket_count as usize;
            self.buckets.reserve_exact(n);
            self.buckets.resize_with(n, Bucket::default);
        }
        let own = b.and_then(|i| self.buckets.get_mut(i));
        own.into_iter().chain(std::iter::once(&mut self.all_day))
    }

    /// The latency baseline for an observation started at `at`: its bucket, or the all-day
    /// window when the bucket is thin; `None` when even that has fewer than `min_samples`.
    pub fn latency_ref(&self, at: DateTime<Utc>) -> Option<LatencyRef> {
        self.reference(at, Bucket::latency)
    }

    /// The first-token baseline of `PROBE_OK` probes, with a threshold by the same rule as
    /// latency's; `None` while too few probes reported a first token.
    pub fn ttft_ref(&self, at: DateTime<Utc>) -> Option<LatencyRef> {
        self.reference(at, Bucket::ttft)
    }

    /// The window `which` picks at `at`, its threshold `sigma` spreads above its mean (at
    /// least `floor_ratio` of the mean and `floor_ms`).
    fn reference(
        &self,
        at: DateTime<Utc>,
        which: fn(&Bucket) -> Option<&Series>,
    ) -> Option<LatencyRef> {
        let (label, s) = self.pick(at, which)?;
        let (mean, stddev) = s.spread();
        let spread = (self.sigma * stddev)
            .max(self.floor_ratio * mean)
            .max(self.floor_ms);
        Some(LatencyRef {
            bucket: label,
            samples: s.len(),
            mean_ms: mean,
            stddev_ms: stddev,
            threshold_ms: mean + spread,
        })
    }

    /// The tokens/s baseline (never a latency figure: comparing tokens/s
    /// with a latency percentile).
    pub fn tps_ref(&self, at: DateTime<Utc>) -> Option<TpsRef> {
        let (label, s) = self.pick(at, Bucket::tps)?;
        let mean = s.values().mean();
        Some(TpsRef {
            bucket: label,
            samples: s.len(),
            mean,
            floor: self.tps_floor * mean,
        })
    }

    fn pick<'a>(
        &'a self,
        at: DateTime<Utc>,
        series: impl Fn(&'a Bucket) -> Option<&'a Series>,
    ) -> Option<(String, &'a Series)> {
        if let Some(i) = self.bucket_index(at) {
            if let Some(s) = self.buckets.get(i).and_then(&series) {
                if s.len() >= self.min_samples {
                    return Some((self.label(i), s));
                }
            }
        }
        let s = series(&self.all_day)?;
        (s.len() >= self.min_samples).then(|| (ALL_DAY.to_owned(), s))
    }

    /// The baseline in force at `at` (bucket, or the all-day fallback), for the API.
    pub fn snapshot(&self, at: DateTime<Utc>) -> Option<BaselineSnapshot> {
        if let Some(i) = self.bucket_index(at) {
            if let Some(b) = self.buckets.get(i) {
                if b.latency.len() >= self.min_samples {
                    return snapshot_of(self.label(i), b);
                }
            }
        }
        snapshot_of(ALL_DAY.to_owned(), &self.all_day)
    }

    /// Every non-empty bucket, then the all-day window.
    pub fn snapshots(&self) -> Vec<BaselineSnapshot> {
        let mut out: Vec<_> = self
            .buckets
            .iter()
            .enumerate()
            .filter(|(_, b)| !b.is_empty())
            .filter_map(|(i, b)| snapshot_of(self.label(i), b))
            .collect();
        out.extend(snapshot_of(ALL_DAY.to_owned(), &self.all_day));
        out
    }

    /// Which bucket `at` falls in (`None` with `buckets = "none"`).
    pub fn bucket_index(&self, at: DateTime<Utc>) -> Option<usize> {
        match &self.scheme {
            Scheme::None => None,
            Scheme::Hour(tz) => Some(at.with_timezone(tz).hour() as usize),
            Scheme::Windows(tz, windows) => {
                let t = at.with_timezone(tz).time();
                let i = windows
                    .iter()
                    .position(|(s, e)| *s <= t && t < *e)
                    .unwrap_or(windows.len());
                Some(i)
            }
        }
    }

    /// The bucket label of `at` (whether or not it has enough samples).
    pub fn bucket_label(&self, at: DateTime<Utc>) -> String {
        match self.bucket_index(at) {
            Some(i) => self.label(i),
            None => ALL_DAY.to_owned(),
        }
    }

    fn label(&self, i: usize) -> String {
        match &self.scheme {
            Scheme::None => ALL_DAY.to_owned(),
            Scheme::Hour(_) => format!("{:02}:00-{:02}:00", i, i + 1),
            Scheme::Windows(_, w) => match w.get(i) {
                Some((s, e)) => format!("peak {}-{}", s.format("%H:%M"), e.format("%H:%M")),
                None => "off-peak".to_owned(),
            },
        }
    }
}

/// Advances a run with one sample. Returns what to learn now (held samples first), or `None`
/// when this sample is held back or dropped.
fn step_run(run: &mut Run, abnormal: bool, hold: u32, window: usize) -> Option<Vec<Held>> {
    run.remember(abnormal, window);
    if !abnormal {
        // The run ended before it looked sustained: if such runs are rare, it was jitter.
        let held = std::mem::take(&mut run.pending);
        run.len = 0;
        return Some(if run.rare() { held } else { Vec::new() });
    }
    run.len = run.len.saturating_add(1);
    if run.len as usize >= window {
        // A full window of "anomalies" is the new normal.
        return Some(Vec::new());
    }
    if run.len >= hold {
        // Sustained: the held samples belong to an anomaly, not to normal.
        run.pending.clear();
    }
    None
}

fn snapshot_of(label: String, b: &Bucket) -> Option<BaselineSnapshot> {
    let lat = b.latency.summary()?;
    let ttft = b.ttft().and_then(Series::summary);
    let tps = b.tps().filter(|s| s.len() > 0);
    Some(BaselineSnapshot {
        bucket: label,
        samples: lat.samples,
        mean_ms: lat.mean,
        stddev_ms: lat.stddev,
        p50_ms: lat.p50,
        p95_ms: lat.p95,
        p99_ms: lat.p99,
        ttft_samples: ttft.map_or(0, |t| t.samples),
        ttft_mean_ms: ttft.map(|t| t.mean),
        ttft_p50_ms: ttft.map(|t| t.p50),
        ttft_p95_ms: ttft.map(|t| t.p95),
        ttft_p99_ms: ttft.map(|t| t.p99),
        tps_samples: tps.map_or(0, Series::len),
        tps_mean: tps.map(|s| s.values().mean()),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::TimeZone;

    fn cfg() -> DetectionConfig {
        DetectionConfig::default()
    }

    pub(crate) fn probe(at: DateTime<Utc>, ms: f64) -> ProbeOutcome {
        ProbeOutcome {
            route: RouteId::new("p", "r", "m"),
            kind: OutcomeKind::Probe,
            started_at: at,
            success: true,
            attributed_to: None,
            verified: Some(true),
            ttfb_ms: None,
            ttft_ms: Some(ms / 2.0),
            total_ms: ms,
            output_tokens: None,
            tokens_estimated: false,
            tokens_per_second: None,
            model_reported: None,
            system_fingerprint: None,
            http_status: Some(200),
            error: None,
            answer: None,
            first_answer_ms: None,
            max_tokens_exhausted: false,
            ratelimit: None,
        }
    }

    fn utc(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, h, m, 0).unwrap()
    }

    #[test]
    fn hour_buckets_follow_the_timezone_and_fall_back_to_all_day() {
        let c = cfg();
        let mut b = Baseline::new(RouteId::new("p", "r", "m"), &c);
        // 06:xx UTC is 14:xx in Shanghai.
        assert_eq!(b.bucket_label(utc(6, 10)), "14:00-15:00");
        assert_eq!(b.bucket_label(utc(15, 59)), "23:00-24:00");
        for i in 0..19 {
            b.record(&probe(
                utc(6, 0) + chrono::Duration::seconds(30 * i),
                1000.0,
            ));
        }
        assert!(!b.ready());
        assert!(
            b.latency_ref(utc(6, 30)).is_none(),
            "below min_samples: cannot judge"
        );
        b.record(&probe(utc(6, 10), 1000.0));
        assert!(b.ready());
        assert_eq!(b.latency_ref(utc(6, 30)).unwrap().bucket, "14:00-15:00");
        // Another hour with no samples of its own uses the all-day window.
        assert_eq!(b.latency_ref(utc(9, 0)).unwrap().bucket, ALL_DAY);
        let snap = b.snapshot(utc(6, 30)).unwrap();
        assert_eq!(snap.samples, 20);
        assert_eq!(snap.ttft_mean_ms, Some(500.0));
    }

    #[test]
    fn memory_grows_with_the_samples_and_stops_at_the_window() {
        let c = cfg();
        let mut b = Baseline::new(RouteId::new("p", "r", "m"), &c);
        let empty = b.approx_bytes();
        assert!(empty < 1024, "an empty baseline holds {empty} bytes");
        // 300 probes in one hour: that hour's series and the all-day ones fill to the window.
        for i in 0..300 {
            b.record(&probe(
                utc(6, 0) + chrono::Duration::seconds(10 * i),
                1000.0 + i as f64,
            ));
        }
        let window = c.baseline_window as usize;
        for s in [
            &b.all_day.latency,
            b.all_day.ttft().unwrap(),
            &b.buckets[14].latency,
        ] {
            assert_eq!(s.len(), window);
            assert_eq!(s.buf.len(), window, "no slack past the window");
        }
        assert!(
            b.buckets[3].is_empty(),
            "an hour without samples holds nothing"
        );
        // Four full series (latency and ttft, one hour and all day), 2 bytes a sample.
        let full = b.approx_bytes() - empty;
        assert!(
            full <= 4 * window * 2 + 4096,
            "{full} bytes for four full series"
        );
        // Still the newest window's figures (whole ms up to 4,096 are kept exactly).
        let snap = b.snapshot(utc(6, 30)).unwrap();
        assert_eq!(snap.samples, window);
        assert!((snap.mean_ms - 1249.5).abs() < 1e-9, "{}", snap.mean_ms);
    }

    #[test]
    fn a_sample_keeps_four_significant_digits_in_two_bytes() {
        for x in [1.0, 500.0, 1000.0, 4096.0, 9000.0, 0.5, 0.125] {
            assert_eq!(Sample::pack(x).unpack(), x, "{x} is exact");
        }
        let mut worst: f64 = 0.0;
        let mut x = 0.001;
        while x < 1.0e6 {
            let back = Sample::pack(x).unpack();
            worst = worst.max((back - x).abs() / x);
            x *= 1.0007;
        }
        assert!(worst <= 1.0 / 4096.0, "worst relative error {worst}");
        // Order is kept, so percentiles of the packed samples are the packed percentiles.
        assert!(Sample::pack(1000.0).0 < Sample::pack(1000.5).0);
        for (x, packed) in [(0.0, 0.0), (-3.0, 0.0), (f64::NAN, 0.0), (1e-9, 0.0)] {
            assert_eq!(Sample::pack(x).unpack(), packed, "{x}");
        }
        assert!(
            Sample::pack(1e12).unpack() > 1.0e6,
            "large values stay the largest"
        );
        assert!(Sample::pack(f64::INFINITY).unpack() > 1.0e6);
    }

    #[test]
    fn passive_and_failed_outcomes_never_feed_latency() {
        let c = cfg();
        let mut b = Baseline::new(RouteId::new("p", "r", "m"), &c);
        let mut o = probe(utc(6, 0), 1000.0);
        o.kind = OutcomeKind::Passive;
        o.tokens_per_second = Some(40.0);
        b.record(&o);
        let mut f = probe(utc(6, 0), 1000.0);
        f.success = false;
        b.record(&f);
        let mut other = probe(utc(6, 0), 1000.0);
        other.route = RouteId::new("x", "r", "m");
        b.record(&other);
        assert_eq!(b.samples(), 0);
        assert_eq!(b.all_day.tps().unwrap().len(), 1);
    }

    #[test]
    fn isolated_jitter_is_learned_sustained_shifts_are_not_until_a_full_window() {
        let mut c = cfg();
        c.buckets = Buckets::None;
        c.baseline_window = 40;
        let mut b = Baseline::new(RouteId::new("p", "r", "m"), &c);
        let mut t = utc(0, 0);
        let mut next = |b: &mut Baseline, ms: f64| {
            t += chrono::Duration::seconds(30);
            b.record(&probe(t, ms));
        };
        for i in 0..40 {
            next(&mut b, if i % 2 == 0 { 950.0 } else { 1050.0 });
        }
        let before = b.samples();
        next(&mut b, 5000.0); // held
        assert_eq!(b.samples(), before);
        next(&mut b, 1000.0); // run of one ended: jitter, learned (both)
        assert!(b.latency_ref(utc(0, 0)).unwrap().mean_ms > 1050.0);
        let mean = b.latency_ref(utc(0, 0)).unwrap().mean_ms;
        for _ in 0..39 {
            next(&mut b, 9000.0); // sustained: not learned
        }
        assert_eq!(b.latency_ref(utc(0, 0)).unwrap().mean_ms, mean);
        for _ in 0..5 {
            next(&mut b, 9000.0); // a full window of it: the new level
        }
        assert!(b.latency_ref(utc(0, 0)).unwrap().mean_ms > mean);
    }

    #[test]
    fn rebuild_equals_live() {
        let c = cfg();
        let r = RouteId::new("p", "r", "m");
        let outcomes: Vec<_> = (0..500)
            .map(|i| {
                probe(
                    utc(0, 0) + chrono::Duration::seconds(37 * i),
                    900.0 + (i % 13) as f64 * 30.0,
                )
            })
            .collect();
        let mut live = Baseline::new(r.clone(), &c);
        for o in &outcomes {
            live.record(o);
        }
        let rebuilt = Baseline::rebuild(r, &c, &outcomes);
        assert_eq!(live.snapshots(), rebuilt.snapshots());
    }
}
