//! Heartbeats of the scheduled jobs (every scheduled job has one; missed heartbeats
//! caught more incidents than alerts did).
//!
//! - Which jobs the service expects ([`expected`], kept as [`Jobs`] with the start time) and
//!   which of them are stale ([`Jobs::stale`], pure): silent longer than `[heartbeat]
//!   stale_after`, silence counted from the later of the last beat and the service's start,
//!   so neither a fresh boot nor a beat left over from the previous run raises a false alarm.
//! - [`Pulse`]: an in-memory beat for loops that must never wait on the store (the weights
//!   publisher, the switch controller, the alert loops, the budget's hour). [`Monitor`]
//!   persists the pulses every [`Options::flush_every`] together with its own `store` beat —
//!   a committed write of the single writer thread, which also writes the rollups, so it is the
//!   honest heartbeat of the writer and its rollups.
//! - The dead-man's switch: every [`Options::ping_every`] (the monitor's cycle), when
//!   `[heartbeat] ping_url_env` names a set variable, a `GET <url>` if every job is fresh and
//!   the store took the last write, else a `POST <url>/fail` with a plain-text body naming
//!   what is wrong (healthchecks.io style). One try per cycle, 10 s timeout; the URL is a
//!   secret: only the variable's name is ever logged.
//!
//! `/readyz`, the status page and the alert engine all read [`Jobs::stale`] with the live
//! config's `stale_after`.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::Config;
use crate::reload::LiveConfig;
use crate::store::Store;

/// The probe scheduler's loop.
pub const SCHEDULER: &str = "scheduler";
/// Detection (the health service).
pub const HEALTH: &str = crate::health::service::HEARTBEAT_JOB;
/// Pruning of old rows.
pub const RETENTION: &str = "retention";
/// Regression-set runs (only when sets run).
pub const DRIFT: &str = crate::drift::runner::JOB;
/// The alert outbox's sender.
pub const ALERT_OUTBOX: &str = "alert_outbox";
/// The alert engine's loop (grouping, burn rates, stale heartbeats, reminders).
pub const ALERT_EVAL: &str = "alert_eval";
/// The weights publisher.
pub const WEIGHTS: &str = "weights";
/// The switch controller.
pub const SWITCH: &str = "switch";
/// The extra-cost budget's clock hour.
pub const BUDGET: &str = "budget";
/// The store's writer thread (raw rows and the rollups written in the same transactions).
pub const STORE: &str = "store";
/// The proxy's async-job worker (only when the proxy runs); the worker beats under the same
/// name (`proxy::jobs::HEARTBEAT_JOB`, held equal by a test).
pub const ASYNC_JOBS: &str = "async_jobs";
/// The drill service's ticks (ramp stages, automatic ends).
pub const DRILLS: &str = "drills";

/// How often a pulse-driven loop beats (well under a minute: a shorter `stale_after` is
/// warned about at load).
pub const PULSE_EVERY: Duration = Duration::from_secs(10);

/// What a job does, in English and Chinese, for people reading a banner or an alert at 4 a.m.
pub fn what(job: &str) -> Option<(&'static str, &'static str)> {
    Some(match job {
        SCHEDULER => ("probe scheduler", "探测调度"),
        HEALTH => ("detection", "状态判定"),
        RETENTION => ("pruning of old data", "旧数据清理"),
        DRIFT => ("regression sets", "回归集"),
        ALERT_OUTBOX => ("alert delivery", "告警发送"),
        ALERT_EVAL => ("alert evaluation", "告警评估"),
        WEIGHTS => ("weights publisher", "权重发布"),
        SWITCH => ("switch controller", "切换控制器"),
        BUDGET => ("hourly budget", "每小时预算"),
        STORE => ("store writer and rollups", "存储写入与汇总"),
        ASYNC_JOBS => ("async job queue", "异步任务队列"),
        DRILLS => (
            "drills (ramps, automatic ends)",
            "演练（分阶段切流、自动结束）",
        ),
        _ => return None,
    })
}

/// The jobs a service running `config` expects to beat; `drift_jobs` are the drift runner's
/// (empty when no regression set runs).
pub fn expected(config: &Config, drift_jobs: &[&'static str]) -> Vec<&'static str> {
    let mut jobs = vec![
        SCHEDULER,
        HEALTH,
        RETENTION,
        STORE,
        WEIGHTS,
        SWITCH,
        BUDGET,
        ALERT_EVAL,
        ALERT_OUTBOX,
        DRILLS,
    ];
    jobs.extend(drift_jobs.iter().copied());
    if config.proxy.enabled {
        jobs.push(ASYNC_JOBS);
    }
    jobs
}

/// The jobs that must keep beating, and since when the service runs.
#[derive(Debug, Clone)]
pub struct Jobs {
    pub names: Vec<&'static str>,
    pub started_at: DateTime<Utc>,
}

impl Default for Jobs {
    /// No job expected.
    fn default() -> Self {
        Self {
            names: Vec::new(),
            started_at: DateTime::<Utc>::UNIX_EPOCH,
        }
    }
}

/// A job silent for longer than `stale_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale {
    pub job: String,
    /// Since the later of its last beat and the service's start.
    pub silent: Duration,
    /// Its last beat ever (maybe from an earlier run); `None` if it never beat.
    pub last_beat: Option<DateTime<Utc>>,
}

impl Stale {
    /// `job weights silent for 245s (last beat 2026-05-01T04:00:00.000Z)`.
    pub fn describe(&self) -> String {
        let last = match self.last_beat {
            Some(t) => format!("last beat {}", crate::clock::rfc3339(t)),
            None => "no beat since start".to_owned(),
        };
        format!(
            "job {} silent for {}s ({last})",
            self.job,
            self.silent.as_secs()
        )
    }
}

impl Jobs {
    pub fn new(names: Vec<&'static str>, started_at: DateTime<Utc>) -> Self {
        Self { names, started_at }
    }

    /// The expected jobs silent for longer than `stale_after` at `now`, in list order.
    pub fn stale(
        &self,
        beats: &[(String, DateTime<Utc>)],
        now: DateTime<Utc>,
        stale_after: Duration,
    ) -> Vec<Stale> {
        let last: HashMap<&str, DateTime<Utc>> =
            beats.iter().map(|(j, t)| (j.as_str(), *t)).collect();
        self.names
            .iter()
            .filter_map(|job| {
                let last_beat = last.get(job).copied();
                let since = last_beat.map_or(self.started_at, |t| t.max(self.started_at));
                let silent = (now - since).to_std().unwrap_or_default();
                (silent > stale_after).then(|| Stale {
                    job: (*job).to_owned(),
                    silent,
                    last_beat,
                })
            })
            .collect()
    }
}

/// A job's in-memory heartbeat: its own loop calls [`Pulse::beat`]; the [`Monitor`] persists
/// the latest beat. A stuck loop stops beating, so its stored beat ages.
#[derive(Clone)]
pub struct Pulse {
    job: &'static str,
    clock: Arc<dyn Clock>,
    /// Milliseconds since the epoch of the last beat; 0 before the first.
    last_ms: Arc<AtomicI64>,
}

impl std::fmt::Debug for Pulse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pulse")
            .field("job", &self.job)
            .field("last", &self.last())
            .finish()
    }
}

impl Pulse {
    /// A pulse no monitor persists (tests, or a loop run on its own).
    pub fn detached(job: &'static str, clock: Arc<dyn Clock>) -> Self {
        Self {
            job,
            clock,
            last_ms: Arc::new(AtomicI64::new(0)),
        }
    }

    pub fn job(&self) -> &'static str {
        self.job
    }

    /// Alive now.
    pub fn beat(&self) {
        let now = self.clock.now().timestamp_millis();
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    pub fn last(&self) -> Option<DateTime<Utc>> {
        match self.last_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => DateTime::from_timestamp_millis(ms),
        }
    }
}

/// The pulses a [`Monitor`] persists.
#[derive(Clone)]
pub struct Pulses {
    clock: Arc<dyn Clock>,
    all: Arc<Mutex<Vec<Pulse>>>,
}

impl Pulses {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            all: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The pulse of `job` (the same one for the same name).
    pub fn pulse(&self, job: &'static str) -> Pulse {
        let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = all.iter().find(|p| p.job == job) {
            return p.clone();
        }
        let p = Pulse::detached(job, self.clock.clone());
        all.push(p.clone());
        p
    }

    fn snapshot(&self) -> Vec<Pulse> {
        self.all.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The monitor's periods.
#[derive(Debug, Clone)]
pub struct Options {
    /// Pulses and the `store` beat are written this often.
    pub flush_every: Duration,
    /// The dead-man's switch is pinged this often (the first time one period after start).
    pub ping_every: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            flush_every: Duration::from_secs(10),
            ping_every: Duration::from_secs(60),
        }
    }
}

/// What one ping cycle sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ping {
    /// Every job fresh, the store writable: `GET <url>`.
    Ok,
    /// `POST <url>/fail` with this plain-text body.
    Fail(String),
}

/// The longest `/fail` body (healthchecks.io keeps 10 kB; ours names jobs only).
pub const MAX_FAIL_BODY: usize = 2000;

/// The verdict of a cycle (pure).
pub fn verdict(stale: &[Stale], store_error: Option<&str>) -> Ping {
    if stale.is_empty() && store_error.is_none() {
        return Ping::Ok;
    }
    let mut lines = Vec::new();
    if let Some(e) = store_error {
        lines.push(format!("store not writable: {e}"));
    }
    lines.extend(stale.iter().map(Stale::describe));
    let body = lines.join("\n");
    Ping::Fail(crate::probe::outcome::truncate_chars(&body, MAX_FAIL_BODY))
}

/// Persists pulses, beats `store`, pings the dead-man's switch.
pub struct Monitor {
    pub pulses: Pulses,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub jobs: Arc<Jobs>,
    pub config: LiveConfig,
    pub options: Options,
}

pub fn spawn(m: Monitor, shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(m.run(shutdown))
}

impl Monitor {
    async fn run(self, shutdown: CancellationToken) {
        let http = match reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(5))
            .build()
        {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(error = %e.without_url(), "no HTTP client: the dead-man's switch is off");
                None
            }
        };
        let mut written: HashMap<&'static str, DateTime<Utc>> = HashMap::new();
        let mut flush = tokio::time::interval(self.options.flush_every);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let first_ping = tokio::time::Instant::now() + self.options.ping_every;
        let mut ping = tokio::time::interval_at(first_ping, self.options.ping_every);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut store_error: Option<String> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.flush(&mut written).await;
                    return;
                }
                _ = flush.tick() => {
                    store_error = self.flush(&mut written).await;
                }
                _ = ping.tick() => {
                    if let Some(http) = &http {
                        self.ping(http, store_error.as_deref()).await;
                    }
                }
            }
        }
    }

    /// Writes the pulses that beat since their last write, then the `store` beat; returns
    /// the writer's error, if any.
    async fn flush(&self, written: &mut HashMap<&'static str, DateTime<Utc>>) -> Option<String> {
        let writer = self.store.writer();
        for p in self.pulses.snapshot() {
            let Some(at) = p.last() else { continue };
            if written.get(p.job).is_some_and(|w| *w >= at) {
                continue;
            }
            match writer.heartbeat(p.job, at).await {
                Ok(()) => {
                    written.insert(p.job, at);
                }
                Err(e) => tracing::error!(job = p.job, error = %e, "cannot write a heartbeat"),
            }
        }
        match writer.heartbeat(STORE, self.clock.now()).await {
            Ok(()) => None,
            Err(e) => {
                tracing::error!(error = %e, "the store writer did not commit the store heartbeat");
                Some(e.to_string())
            }
        }
    }

    /// One cycle of the dead-man's switch: one try, never retried before the next cycle.
    async fn ping(&self, http: &reqwest::Client, store_error: Option<&str>) {
        let config = self.config.current();
        let Some(var) = config.heartbeat.ping_url_env.as_deref() else {
            return;
        };
        let Some(url) = config.env.secret(var) else {
            tracing::debug!(var, "dead-man's switch variable unset; not pinging");
            return;
        };
        let store = self.store.clone();
        let beats = tokio::task::spawn_blocking(move || store.reader()?.heartbeats()).await;
        let now = self.clock.now();
        let (stale, read_error) = match beats {
            Ok(Ok(beats)) => (
                self.jobs.stale(&beats, now, config.heartbeat.stale_after),
                None,
            ),
            Ok(Err(e)) => (Vec::new(), Some(format!("cannot read heartbeats: {e}"))),
            Err(e) => (Vec::new(), Some(format!("cannot read heartbeats: {e}"))),
        };
        let store_problem = store_error.map(str::to_owned).or(read_error);
        let base = url.expose().trim_end_matches('/');
        let (kind, request) = match verdict(&stale, store_problem.as_deref()) {
            Ping::Ok => ("ok", http.get(base)),
            Ping::Fail(body) => (
                "fail",
                http.post(format!("{base}/fail"))
                    .header(reqwest::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                    .body(body),
            ),
        };
        match request.send().await {
            Ok(r) if r.status().is_success() => {
                tracing::debug!(
                    var,
                    kind,
                    status = r.status().as_u16(),
                    "dead-man's switch pinged"
                );
            }
            Ok(r) => {
                tracing::warn!(
                    var,
                    kind,
                    status = r.status().as_u16(),
                    "dead-man's switch answered with an error status"
                );
            }
            Err(e) => {
                tracing::warn!(var, kind, error = %e.without_url(), "dead-man's switch ping failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
    }

    const STALE: Duration = Duration::from_secs(180);

    #[test]
    fn a_job_that_never_beat_is_stale_only_stale_after_from_start() {
        let jobs = Jobs::new(vec!["weights"], t(0));
        assert!(jobs.stale(&[], t(180), STALE).is_empty());
        let s = jobs.stale(&[], t(181), STALE);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].silent, Duration::from_secs(181));
        assert_eq!(s[0].last_beat, None);
        assert!(s[0].describe().contains("no beat since start"));
    }

    #[test]
    fn a_beat_from_the_previous_run_counts_from_start() {
        let jobs = Jobs::new(vec!["switch"], t(1000));
        let beats = vec![("switch".to_owned(), t(0))];
        assert!(jobs.stale(&beats, t(1100), STALE).is_empty());
        let s = jobs.stale(&beats, t(1200), STALE);
        assert_eq!(s[0].silent, Duration::from_secs(200));
        assert_eq!(s[0].last_beat, Some(t(0)));
    }

    #[test]
    fn fresh_beats_and_unexpected_jobs_are_not_stale() {
        let jobs = Jobs::new(vec!["a", "b"], t(0));
        let beats = vec![
            ("a".to_owned(), t(900)),
            ("b".to_owned(), t(700)),
            ("other".to_owned(), t(0)),
        ];
        let s = jobs.stale(&beats, t(1000), STALE);
        assert_eq!(
            s.iter().map(|s| s.job.as_str()).collect::<Vec<_>>(),
            vec!["b"]
        );
        assert_eq!(s[0].silent, Duration::from_secs(300));
    }

    #[test]
    fn verdict_names_every_problem() {
        assert_eq!(verdict(&[], None), Ping::Ok);
        let stale = vec![Stale {
            job: "weights".into(),
            silent: Duration::from_secs(300),
            last_beat: None,
        }];
        let Ping::Fail(body) = verdict(&stale, Some("disk full")) else {
            panic!()
        };
        assert!(
            body.starts_with("store not writable: disk full\n"),
            "{body}"
        );
        assert!(body.contains("job weights silent for 300s"), "{body}");
    }

    #[test]
    fn pulses_are_shared_by_name_and_only_move_forward() {
        let clock = Arc::new(crate::clock::ManualClock::new(t(10)));
        let pulses = Pulses::new(clock.clone());
        let a = pulses.pulse("a");
        assert_eq!(a.last(), None);
        pulses.pulse("a").beat();
        assert_eq!(a.last(), Some(t(10)));
        clock.set(t(5));
        a.beat();
        assert_eq!(a.last(), Some(t(10)));
        assert_eq!(pulses.snapshot().len(), 1);
    }
}
