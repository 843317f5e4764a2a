//! Running regression sets: [`run_set`] runs one set on one route now (cases one after the
//! other, a pause between them — low priority: a regression run must never look like load);
//! [`spawn`] schedules every set on every route it applies to.
//!
//! Scheduling: one task per route runs that route's sets in turn, so a route never has two
//! runs at once. A pair's next run is due `every` (± 10 %) after its previous one — taken from
//! the store at start, so a restart does not rerun everything — and a pair never run before
//! first runs at a stable, hash-spread offset within [`RunnerOptions::first_run_within`], so
//! routes and sets do not all fire together. After each run the runner stores it, recomputes
//! that pair's findings from its own history and publishes a new [`DriftSnapshot`]; it beats
//! the `drift` heartbeat every 30 s.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::sets::{Case, RegressionSet};
use super::{
    CaseResult, CompareOptions, DriftRx, DriftSnapshot, History, SetRun, ValidatorFailure,
    MAX_OUTPUT_CHARS,
};
use crate::clock::Clock;
use crate::config::Config;
use crate::probe::outcome::truncate_chars;
use crate::probe::{ChatOutcome, ProbeClient};
use crate::route::Route;
use crate::store::{Store, Writer};

/// The heartbeat job name.
pub const JOB: &str = "drift";

/// Knobs of the runner (defaults suit production; tests shorten them).
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// Pause between two cases of a run.
    pub case_gap: Duration,
    pub heartbeat_every: Duration,
    /// A pair never run before first runs within this long of start.
    pub first_run_within: Duration,
    /// ± fraction of `every`.
    pub jitter: f64,
    pub compare: CompareOptions,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        Self {
            case_gap: Duration::from_millis(500),
            heartbeat_every: Duration::from_secs(30),
            first_run_within: Duration::from_secs(300),
            jitter: 0.1,
            compare: CompareOptions::default(),
        }
    }
}

/// Judges one answer against a case's validators.
pub fn judge(case: &Case, outcome: &ChatOutcome) -> CaseResult {
    let text = outcome.text.trim();
    let (passed, failures) = match &outcome.error {
        Some(_) => (None, Vec::new()),
        None => {
            let failures: Vec<ValidatorFailure> = case
                .validators
                .iter()
                .filter_map(|v| {
                    v.check(&outcome.text)
                        .err()
                        .map(|message| ValidatorFailure {
                            validator: v.name().to_owned(),
                            message,
                        })
                })
                .collect();
            (Some(failures.is_empty()), failures)
        }
    };
    CaseResult {
        case: case.name.clone(),
        passed,
        failures,
        output_chars: u32::try_from(text.chars().count()).unwrap_or(u32::MAX),
        latency_ms: outcome.total_ms,
        output_tokens: outcome.output_tokens,
        model_reported: outcome.model_reported.clone(),
        system_fingerprint: outcome.system_fingerprint.clone(),
        error: outcome.error.as_ref().map(|e| format!("{}: {e}", e.kind())),
        output: truncate_chars(text, MAX_OUTPUT_CHARS),
    }
}

/// Runs every case of `set` on `route` now, one after the other, `case_gap` apart.
pub async fn run_set(
    client: &ProbeClient,
    route: &Route,
    set: &RegressionSet,
    case_gap: Duration,
) -> SetRun {
    let mut cases = Vec::with_capacity(set.cases.len());
    let mut started_at: Option<DateTime<Utc>> = None;
    for (i, case) in set.cases.iter().enumerate() {
        if i > 0 && !case_gap.is_zero() {
            tokio::time::sleep(case_gap).await;
        }
        let outcome = client.chat(route, &set.request(case)).await;
        started_at.get_or_insert(outcome.started_at);
        cases.push(judge(case, &outcome));
    }
    SetRun {
        route: route.id.clone(),
        set: set.name.clone(),
        started_at: started_at.unwrap_or_else(Utc::now),
        cases,
    }
}

/// A running drift runner.
pub struct DriftHandle {
    /// The latest snapshot, updated after every run.
    pub rx: DriftRx,
    /// Ends after shutdown (an idle runner with no sets ends at once).
    pub task: JoinHandle<()>,
    /// The heartbeat jobs it keeps (`["drift"]` when any set applies to any route, else none).
    pub jobs: Vec<&'static str>,
}

struct Ctx {
    client: ProbeClient,
    writer: Writer,
    clock: Arc<dyn Clock>,
    history: Mutex<History>,
    tx: watch::Sender<Arc<DriftSnapshot>>,
    options: RunnerOptions,
}

impl Ctx {
    fn publish(&self) {
        let snapshot = {
            let history = self.history.lock().unwrap_or_else(|e| e.into_inner());
            DriftSnapshot::from_history(&history, self.clock.now())
        };
        self.tx.send_replace(Arc::new(snapshot));
    }
}

/// The heartbeat jobs [`spawn`] keeps for `config` (`["drift"]` when any set applies to any
/// route), without starting it: a cluster member knows them before it first leads.
pub fn jobs(config: &Config, routes: &[Route]) -> Result<Vec<&'static str>, String> {
    let (_, pairs) = pairs(config, routes)?;
    Ok(if pairs.is_empty() {
        Vec::new()
    } else {
        vec![JOB]
    })
}

/// The loaded sets and, per route with any, the sets that apply to it.
#[allow(clippy::type_complexity)]
fn pairs(
    config: &Config,
    routes: &[Route],
) -> Result<(Vec<RegressionSet>, Vec<(Route, Vec<Arc<RegressionSet>>)>), String> {
    let dir = config.drift_sets_dir();
    let sets = if !config.drift.run_sets || (!dir.exists() && !config.drift.explicit) {
        Vec::new()
    } else {
        super::load_dir(&dir).map_err(|e| e.to_string())?
    };
    let pairs = routes
        .iter()
        .map(|r| {
            let mine: Vec<Arc<RegressionSet>> = sets
                .iter()
                .filter(|s| s.applies(r))
                .cloned()
                .map(Arc::new)
                .collect();
            (r.clone(), mine)
        })
        .filter(|(_, s)| !s.is_empty())
        .collect();
    Ok((sets, pairs))
}

/// Loads the sets of `[drift] sets` and starts the runner. No folder (and no `[drift]`
/// section naming one), or `run_sets` off ([`crate::config::DriftConfig::no_sets`]), means no
/// sets: the runner publishes an empty snapshot and idles.
/// Bad sets are an error (`check-config` reports them with positions).
pub async fn spawn(
    config: &Config,
    routes: &[Route],
    client: ProbeClient,
    store: Store,
    clock: Arc<dyn Clock>,
    options: RunnerOptions,
    shutdown: CancellationToken,
) -> Result<DriftHandle, String> {
    let (sets, pairs) = pairs(config, routes)?;
    let dir = config.drift_sets_dir();

    // Each pair's own history, from the store (replayed, so a frozen baseline is rebuilt).
    let keep = History::new(options.compare.clone()).replay_window();
    let wanted: Vec<(crate::route::RouteId, String)> = pairs
        .iter()
        .flat_map(|(r, sets)| sets.iter().map(|s| (r.id.clone(), s.name.clone())))
        .collect();
    let loader = store.clone();
    let stored = tokio::task::spawn_blocking(move || -> Result<Vec<SetRun>, String> {
        let reader = loader.reader().map_err(|e| e.to_string())?;
        let mut all = Vec::new();
        for (route, set) in &wanted {
            all.extend(
                reader
                    .drift_runs(route, set, keep)
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(all)
    })
    .await
    .map_err(|e| e.to_string())??;
    let mut history = History::new(options.compare.clone());
    let mut last_run: HashMap<(String, String), DateTime<Utc>> = HashMap::new();
    for run in stored {
        last_run.insert((run.route.to_string(), run.set.clone()), run.started_at);
        history.ingest(run);
    }
    let (tx, rx) = watch::channel(Arc::new(DriftSnapshot::from_history(&history, clock.now())));
    let jobs = if pairs.is_empty() {
        Vec::new()
    } else {
        vec![JOB]
    };
    tracing::info!(
        sets = sets.len(),
        routes = pairs.len(),
        dir = %dir.display(),
        "drift: regression sets loaded"
    );
    let ctx = Arc::new(Ctx {
        client,
        writer: store.writer(),
        clock,
        history: Mutex::new(history),
        tx,
        options,
    });
    let task = tokio::spawn(async move {
        if pairs.is_empty() {
            return;
        }
        let mut tasks = Vec::new();
        for (route, sets) in pairs {
            let due: Vec<DateTime<Utc>> = sets
                .iter()
                .map(|s| first_due(&ctx, &route, s, &last_run))
                .collect();
            tasks.push(tokio::spawn(route_loop(
                ctx.clone(),
                route,
                sets,
                due,
                shutdown.clone(),
            )));
        }
        tasks.push(tokio::spawn(heartbeat(ctx.clone(), shutdown.clone())));
        for t in tasks {
            let _ = t.await;
        }
    });
    Ok(DriftHandle { rx, task, jobs })
}

fn first_due(
    ctx: &Ctx,
    route: &Route,
    set: &RegressionSet,
    last_run: &HashMap<(String, String), DateTime<Utc>>,
) -> DateTime<Utc> {
    let now = ctx.clock.now();
    if let Some(last) = last_run.get(&(route.id.to_string(), set.name.clone())) {
        let every = chrono::Duration::from_std(set.every).unwrap_or(chrono::Duration::hours(1));
        return (*last + every).max(now);
    }
    let mut h = DefaultHasher::new();
    (route.id.as_str(), set.name.as_str()).hash(&mut h);
    let window = ctx
        .options
        .first_run_within
        .min(set.every)
        .as_millis()
        .max(1);
    let offset_ms = u64::try_from(u128::from(h.finish()) % window).unwrap_or(0);
    now + chrono::Duration::milliseconds(i64::try_from(offset_ms).unwrap_or(0))
}

fn jittered(every: Duration, jitter: f64) -> Duration {
    if jitter <= 0.0 {
        return every;
    }
    let f = rand::thread_rng().gen_range(-jitter..=jitter);
    every.mul_f64((1.0 + f).max(0.0))
}

async fn route_loop(
    ctx: Arc<Ctx>,
    route: Route,
    sets: Vec<Arc<RegressionSet>>,
    mut due: Vec<DateTime<Utc>>,
    shutdown: CancellationToken,
) {
    loop {
        let Some((i, at)) = due.iter().copied().enumerate().min_by_key(|(_, d)| *d) else {
            return;
        };
        let wait = (at - ctx.clock.now()).to_std().unwrap_or(Duration::ZERO);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let set = &sets[i];
        let run = tokio::select! {
            _ = shutdown.cancelled() => return,
            run = run_set(&ctx.client, &route, set, ctx.options.case_gap) => run,
        };
        tracing::debug!(route = %route.id, set = %set.name, passed = run.passed(), answered = run.answered(), "drift run done");
        if let Err(e) = ctx.writer.record_drift_run(run.clone()).await {
            tracing::error!(error = %e, route = %route.id, set = %set.name, "cannot record a drift run");
        }
        let opened: Vec<String> = {
            let mut history = ctx.history.lock().unwrap_or_else(|e| e.into_inner());
            history
                .ingest(run)
                .iter()
                .map(|f| f.summary.clone())
                .collect()
        };
        for summary in opened {
            tracing::warn!(route = %route.id, set = %set.name, "drift: {summary}");
        }
        ctx.publish();
        due[i] = ctx.clock.now()
            + chrono::Duration::from_std(jittered(set.every, ctx.options.jitter))
                .unwrap_or(chrono::Duration::hours(1));
    }
}

async fn heartbeat(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(ctx.options.heartbeat_every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if let Err(e) = ctx.writer.heartbeat(JOB, ctx.clock.now()).await {
            tracing::error!(error = %e, "cannot write the drift heartbeat");
        }
    }
}
