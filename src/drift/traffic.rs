//! Structured-output validity from real traffic as a drift signal: a route whose share of
//! valid structured answers (`store::observed`, filled by the proxies) falls well below **its
//! own** past gets a `validity_drop` finding (`behavior_changed`), with the validity errors
//! as examples (the error text and the route only, never prompt or answer text).
//!
//! The statistics are the regression sets' ([`super::compare`]): the two latest windows
//! ([`TrafficOptions::window`] each, from minute rollups) pooled against the baseline (the
//! hour rollups of the day before them) by Fisher's exact test, one-sided, at a small α; and
//! each window on its own must show the drop, hold at least [`TrafficOptions::min_checked`]
//! judged answers, and fall at least [`TrafficOptions::min_drop`] below the baseline's rate.
//! A small α and "seen in two consecutive windows" keep thousands of routes tested every
//! minute from raising false findings; the minimum counts keep a handful of answers from
//! deciding anything.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::stats::fisher_exact;
use super::{
    DriftFinding, DriftKind, Evidence, Example, RateSample, RunStat, Severity, ValidatorFailure,
};
use crate::clock::Clock;
use crate::health::FailureMode;
use crate::route::RouteId;
use crate::store::{ObservedBucket, Span, Store, StoreError};

/// The `set` a traffic finding names (it comes from no regression set).
pub const SET: &str = "traffic:structured_output";

/// Thresholds of the validity comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct TrafficOptions {
    pub alpha: f64,
    /// Each of the two recent windows.
    pub window: Duration,
    /// Judged answers each recent window needs.
    pub min_checked: u64,
    /// Judged answers the baseline needs.
    pub min_baseline: u64,
    /// The smallest drop of the validity ratio worth a finding (absolute).
    pub min_drop: f64,
    /// How often the store is read.
    pub every: Duration,
}

impl Default for TrafficOptions {
    fn default() -> Self {
        Self {
            alpha: 0.001,
            window: Duration::from_secs(15 * 60),
            min_checked: 20,
            min_baseline: 50,
            min_drop: 0.1,
            every: Duration::from_secs(60),
        }
    }
}

fn rate(b: &ObservedBucket) -> Option<f64> {
    (b.checked > 0).then(|| b.valid as f64 / b.checked as f64)
}

fn sample(b: &ObservedBucket, runs: usize) -> RateSample {
    RateSample {
        runs,
        passed: b.valid,
        total: b.checked,
        rate: rate(b),
    }
}

/// The finding for one route from its two recent windows (oldest first, with their starts)
/// and its baseline (`hours` hour buckets), if the validity dropped.
pub fn judge(
    route: &RouteId,
    recent: [(DateTime<Utc>, &ObservedBucket); 2],
    baseline: &ObservedBucket,
    hours: usize,
    now: DateTime<Utc>,
    o: &TrafficOptions,
) -> Option<DriftFinding> {
    let before = rate(baseline)?;
    if baseline.checked < o.min_baseline {
        return None;
    }
    let invalid = |b: &ObservedBucket| b.checked - b.valid.min(b.checked);
    let mut runs = Vec::with_capacity(2);
    let mut pooled = ObservedBucket::default();
    for (at, w) in recent {
        let r = rate(w)?;
        if w.checked < o.min_checked || r > before - o.min_drop {
            return None;
        }
        let p = fisher_exact(w.valid, invalid(w), baseline.valid, invalid(baseline)).less;
        runs.push(RunStat {
            started_at: at,
            passed: w.valid,
            total: w.checked,
            p_value: Some(p),
            median_length_ratio: None,
        });
        pooled.merge(w);
    }
    let p = fisher_exact(
        pooled.valid,
        invalid(&pooled),
        baseline.valid,
        invalid(baseline),
    )
    .less;
    if p >= o.alpha {
        return None;
    }
    let after = rate(&pooled)?;
    let examples = pooled
        .errors
        .iter()
        .map(|e| Example {
            case: "structured_output".into(),
            failures: vec![ValidatorFailure {
                validator: "structured_output".into(),
                message: e.clone(),
            }],
            before: None,
            after: None,
        })
        .collect();
    Some(DriftFinding {
        id: DriftFinding::key(route, SET, DriftKind::ValidityDrop),
        route: route.clone(),
        set: SET.into(),
        kind: DriftKind::ValidityDrop,
        severity: Severity::Warning,
        failure_mode: Some(FailureMode::BehaviorChanged),
        detected_at: now,
        summary: format!(
            "structured-output validity of real traffic fell to {:.1}% ({}/{}) over the last two {}-minute windows, from {:.1}% ({}/{}) the day before (p = {p:.2e})",
            after * 100.0,
            pooled.valid,
            pooled.checked,
            o.window.as_secs() / 60,
            before * 100.0,
            baseline.valid,
            baseline.checked,
        ),
        evidence: Evidence {
            test: "fisher_exact_one_sided".into(),
            p_value: Some(p),
            before: sample(baseline, hours),
            after: sample(&pooled, 2),
            runs,
            length: None,
            model: None,
            examples,
        },
    })
}

/// Every route's finding at `now` from minute buckets (covering the two recent windows) and
/// hour buckets (the baseline), as the store reads them.
pub fn evaluate(
    minutes: &HashMap<String, BTreeMap<i64, ObservedBucket>>,
    hours: &HashMap<String, BTreeMap<i64, ObservedBucket>>,
    now: DateTime<Utc>,
    o: &TrafficOptions,
) -> Vec<DriftFinding> {
    let (w2_start, w1_start, base_end) = bounds(now, o);
    let mut out: Vec<DriftFinding> = minutes
        .iter()
        .filter_map(|(route, buckets)| {
            let id = RouteId::parse(route)?;
            let mut w = [ObservedBucket::default(), ObservedBucket::default()];
            for (at, b) in buckets {
                if *at >= w2_start {
                    w[1].merge(b);
                } else if *at >= w1_start {
                    w[0].merge(b);
                }
            }
            let mut base = ObservedBucket::default();
            let mut n = 0;
            for (_, b) in hours.get(route)?.range(..base_end) {
                base.merge(b);
                n += 1;
            }
            let at = |ms: i64| DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or(now);
            judge(
                &id,
                [(at(w1_start), &w[0]), (at(w2_start), &w[1])],
                &base,
                n,
                now,
                o,
            )
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// Starts (ms) of the second and the first recent window, and the end of the baseline (the
/// hour buckets that end before the first window).
fn bounds(now: DateTime<Utc>, o: &TrafficOptions) -> (i64, i64, i64) {
    let w = i64::try_from(o.window.as_millis()).unwrap_or(i64::MAX / 4);
    let end = Span::Minute.start(now) + 60_000;
    let w2 = end - w;
    let w1 = w2 - w;
    let base_end = Span::Hour.start(DateTime::<Utc>::from_timestamp_millis(w1).unwrap_or(now));
    (w2, w1, base_end - 3_600_000 + 1)
}

/// Reads what [`evaluate`] needs at `now`.
pub fn load(
    store: &Store,
    now: DateTime<Utc>,
    o: &TrafficOptions,
) -> Result<Vec<DriftFinding>, StoreError> {
    let reader = store.reader()?;
    let (_, w1, base_end) = bounds(now, o);
    let until = Span::Minute.start(now) + 60_000;
    let minutes = reader.observed_buckets(Span::Minute, w1, until)?;
    let hours = reader.observed_buckets(Span::Hour, base_end - 24 * 3_600_000, base_end)?;
    Ok(evaluate(&minutes, &hours, now, o))
}

/// Re-reads the store every [`TrafficOptions::every`] and publishes the findings (only when
/// they changed) until `token` ends.
pub fn spawn(
    store: Store,
    clock: Arc<dyn Clock>,
    o: TrafficOptions,
    token: CancellationToken,
) -> (
    watch::Receiver<Arc<Vec<DriftFinding>>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = watch::channel(Arc::new(Vec::<DriftFinding>::new()));
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(o.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (store, now, opts) = (store.clone(), clock.now(), o.clone());
            match tokio::task::spawn_blocking(move || load(&store, now, &opts)).await {
                Ok(Ok(findings)) => {
                    tx.send_if_modified(|old| {
                        let changed = old.len() != findings.len()
                            || old.iter().zip(&findings).any(|(a, b)| a.id != b.id);
                        if changed {
                            *old = Arc::new(findings);
                        }
                        changed
                    });
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "drift: cannot read the route observables")
                }
                Err(e) => tracing::warn!(error = %e, "drift: the observables check failed"),
            }
        }
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(valid: u64, checked: u64) -> ObservedBucket {
        ObservedBucket {
            checked,
            valid,
            requests: checked,
            ok: checked,
            ..Default::default()
        }
    }

    #[test]
    fn a_sustained_drop_in_two_windows_is_a_finding() {
        let route = RouteId::new("p", "r", "m");
        let now = Utc::now();
        let o = TrafficOptions::default();
        let base = bucket(495, 500);
        let low = bucket(20, 40);
        let f = judge(&route, [(now, &low), (now, &low)], &base, 24, now, &o).unwrap();
        assert_eq!(f.kind, DriftKind::ValidityDrop);
        assert_eq!(f.failure_mode, Some(FailureMode::BehaviorChanged));
        assert!(f.evidence.p_value.unwrap() < 1e-6);
        // One window alone is not enough; nor are a few answers; nor a small dip.
        let fine = bucket(39, 40);
        assert!(judge(&route, [(now, &fine), (now, &low)], &base, 24, now, &o).is_none());
        let few = bucket(2, 5);
        assert!(judge(&route, [(now, &few), (now, &few)], &base, 24, now, &o).is_none());
        let dip = bucket(37, 40);
        assert!(judge(&route, [(now, &dip), (now, &dip)], &base, 24, now, &o).is_none());
        let thin = bucket(20, 20);
        assert!(judge(&route, [(now, &low), (now, &low)], &thin, 1, now, &o).is_none());
    }

    #[test]
    fn windows_and_baseline_come_from_their_buckets() {
        let o = TrafficOptions::default();
        let now = DateTime::parse_from_rfc3339("2026-03-01T12:40:30Z")
            .unwrap()
            .with_timezone(&Utc);
        let (w2, w1, base_end) = bounds(now, &o);
        assert_eq!(Span::Minute.start(now) + 60_000 - w2, 15 * 60_000);
        assert_eq!(w2 - w1, 15 * 60_000);
        // The first window starts at 12:11; the baseline's hours end before 11:00 + 1 h.
        assert!(base_end <= Span::Hour.start(now) - 3_600_000 + 1);
        let mut minutes = HashMap::new();
        let mut m = BTreeMap::new();
        let mut bad = bucket(10, 30);
        bad.note_error("content is not JSON: EOF while parsing an object at line 1 column 9");
        for i in 0..30 {
            m.insert(w1 + i * 60_000, bad.clone());
        }
        minutes.insert("p/r/m".to_owned(), m);
        let mut hours = HashMap::new();
        let mut h = BTreeMap::new();
        for i in 1..=24 {
            h.insert(
                Span::Hour.start(now) - i * 3_600_000 - 3_600_000,
                bucket(99, 100),
            );
        }
        hours.insert("p/r/m".to_owned(), h);
        let found = evaluate(&minutes, &hours, now, &o);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].evidence.after.total, 900);
        assert_eq!(found[0].evidence.examples.len(), 1);
        assert!(found[0].evidence.examples[0].failures[0]
            .message
            .starts_with("content is not JSON"));
    }
}
