//! The commands behind the binary's subcommands (check-config, probe, proxy, regress, serve,
//! simulate): each loads what it needs, runs, and returns a
//! [`CliError`] that the binary turns into stderr lines and an exit code (1 bad input, 2 runtime).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::clock::SystemClock;
use crate::config::{Config, Diagnostic};
use crate::probe::client::{probe_json, ProbeClient};
use crate::probe::{OutcomeKind, ProbeOutcome};
use crate::route::{Route, RouteId};
use crate::sim::{self, Scenario, SimConfig};
use crate::store::{Store, StoreOptions};
use crate::{app, demo, drift};

// The fleet's commands: a remote vantage's agent, and moving a store into PostgreSQL.
mod fleet;
pub use fleet::{agent, migrate_store, proxy};

/// What went wrong, as the user should read it.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad config or arguments: every problem, one line each. Exit 1.
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
    /// The service failed while running. Exit 2.
    #[error("error: {0}")]
    Runtime(String),
}

impl From<crate::drill::client::ClientError> for CliError {
    fn from(e: crate::drill::client::ClientError) -> Self {
        use crate::drill::client::ClientError;
        match e {
            ClientError::Invalid(lines) => CliError::Invalid(lines),
            ClientError::Runtime(s) => CliError::Runtime(s),
        }
    }
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Invalid(_) => 1,
            CliError::Runtime(_) => 2,
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.to_string().lines().map(str::to_owned).collect()
    }

    fn runtime(e: impl std::fmt::Display) -> Self {
        CliError::Runtime(e.to_string())
    }
}

/// `RUST_LOG` filters (default `info`); pretty for people, JSON for log pipelines. Logs go to
/// stderr so `probe --json` output stays machine-readable.
pub fn init_tracing(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn load(path: &Path) -> Result<(Config, Vec<Diagnostic>), CliError> {
    match Config::load(path) {
        Ok(loaded) => Ok((loaded.config, loaded.warnings)),
        Err(errors) => Err(CliError::Invalid(
            errors.0.iter().map(ToString::to_string).collect(),
        )),
    }
}

/// A key that is not there makes every probe fail as 401: refuse to run instead.
fn refuse_missing_secrets(config: &Config) -> Result<(), CliError> {
    let missing = config.missing_secrets();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CliError::Invalid(
            missing.iter().map(ToString::to_string).collect(),
        ))
    }
}

/// A proxy that would answer anyone on a non-loopback address is refused unless the config
/// allows it explicitly; an allowed one adds a warning.
fn refuse_open_proxy(config: &Config, warnings: &mut Vec<Diagnostic>) -> Result<(), CliError> {
    match config.open_proxy_now() {
        Some(crate::config::OpenProxy::Refused(d)) => Err(CliError::Invalid(vec![d.to_string()])),
        Some(crate::config::OpenProxy::Allowed(d)) => {
            warnings.push(d);
            Ok(())
        }
        None => Ok(()),
    }
}

fn warn_all(warnings: &[Diagnostic]) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

/// `probeok check-config`: every error, or the routes found (and the regression sets).
pub fn check_config(path: &Path) -> Result<(), CliError> {
    let (config, mut warnings) = load(path)?;
    let sets = load_sets(&config)?;
    warnings.extend(config.missing_secrets());
    let open = refuse_open_proxy(&config, &mut warnings);
    warn_all(&warnings);
    open?;
    let routes = config.routes();
    crate::stdout::println(format_args!(
        "{}: ok, {} route(s)",
        path.display(),
        routes.len()
    ));
    crate::stdout::print(format_args!("{}", routes_table(&routes)));
    crate::stdout::print(format_args!("{}", sets_summary(&config, &sets, &routes)));
    crate::stdout::print(format_args!(
        "{}",
        cost_summary(&sets, &routes, &config.capability)
    ));
    crate::stdout::print(format_args!("{}", alert_channels_summary(&config, &routes)));
    Ok(())
}

/// What probing and the regression sets will cost per month, per route and in total, before
/// any of it is spent (see [`crate::probe::cost`] for what is counted).
fn cost_summary(
    sets: &[drift::RegressionSet],
    routes: &[Route],
    capability: &crate::config::CapabilityConfig,
) -> String {
    use crate::probe::cost::{self, CallTokens};
    let mut rows = vec![[
        "ROUTE".to_owned(),
        "PROBES/MO".to_owned(),
        "PROBE TOKENS".to_owned(),
        "THROUGHPUT TOKENS".to_owned(),
        "CONFIRM TOKENS".to_owned(),
        "CAPABILITY TOKENS".to_owned(),
        "LONG PROMPT TOKENS".to_owned(),
        "SET TOKENS".to_owned(),
        "TOTAL TOKENS".to_owned(),
        "COST/MO".to_owned(),
    ]];
    let fmt_cost = |c: Option<f64>, currency: Option<&str>| match c {
        Some(c) => format!("{c:.2} {}", currency.unwrap_or_default()),
        None => "no price".to_owned(),
    };
    let mut tokens = 0.0;
    let mut costs: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    for r in routes {
        // An embeddings route: its embeddings probe, and no regression sets.
        let c = cost::route_cost(r, capability);
        let sets_month = sets
            .iter()
            .filter(|s| s.applies(r) && r.embedding.is_none())
            .fold(cost::Monthly::default(), |m, s| {
                let cases: Vec<CallTokens> = s
                    .cases
                    .iter()
                    .map(|c| {
                        CallTokens::of(
                            c.messages.iter().map(|m| m.content.as_str()),
                            s.params.max_tokens,
                        )
                    })
                    .collect();
                let one = cost::set_cost(s.every, &cases);
                cost::Monthly {
                    calls: m.calls + one.calls,
                    input_tokens: m.input_tokens + one.input_tokens,
                    output_tokens: m.output_tokens + one.output_tokens,
                }
            });
        let total = c.total();
        let price = r.price.as_ref();
        let all = total.tokens() + sets_month.tokens();
        let money = total
            .cost(price)
            .zip(sets_month.cost(price))
            .map(|(a, b)| a + b);
        tokens += all;
        if let (Some(m), Some(p)) = (money, price) {
            *costs.entry(p.currency.clone()).or_default() += m;
        }
        rows.push([
            r.id.to_string(),
            format!(
                "{:.0}",
                c.probes.calls
                    + c.throughput.calls
                    + c.confirmations.calls
                    + c.capabilities.calls
                    + c.long_prompt.calls
            ),
            format!("{:.0}", c.probes.tokens()),
            format!("{:.0}", c.throughput.tokens()),
            format!("{:.0}", c.confirmations.tokens()),
            format!("{:.0}", c.capabilities.tokens()),
            format!("{:.0}", c.long_prompt.tokens()),
            format!("{:.0}", sets_month.tokens()),
            format!("{all:.0}"),
            fmt_cost(money, price.map(|p| p.currency.as_str())),
        ]);
    }
    let total_cost = if costs.is_empty() {
        "no price".to_owned()
    } else {
        costs
            .iter()
            .map(|(cur, c)| format!("{c:.2} {cur}"))
            .collect::<Vec<_>>()
            .join(" + ")
    };
    format!(
        "probe cost per month (30 days; output counted at max_tokens, an upper bound; \
         confirmation probes at {:.0}% of probes, the abnormal-outcome rate of a healthy jittery day; \
         declared tools / json_schema capabilities probed every {}; {}):\n{}\
         total: {tokens:.0} tokens, {total_cost} per month\n",
        cost::CONFIRM_RATE * 100.0,
        humantime::format_duration(capability.every),
        match &capability.long_prompt {
            Some(lp) => format!(
                "a long prompt of {} tokens to every chat route every {}",
                lp.tokens,
                humantime::format_duration(lp.every)
            ),
            None => "no long prompt".to_owned(),
        },
        format_table(&rows),
    )
}

/// Which routes each alert channel will get (its `routes` globs), and who it mentions.
fn alert_channels_summary(config: &Config, routes: &[Route]) -> String {
    let a = &config.alert;
    if a.is_empty() {
        return "alert channels: none\n".to_owned();
    }
    let mentions: std::collections::HashMap<String, &crate::config::Mention> = a
        .dingtalk
        .iter()
        .enumerate()
        .filter_map(|(i, c)| Some((format!("dingtalk[{i}]"), c.mention.as_ref()?)))
        .chain(
            a.feishu
                .iter()
                .enumerate()
                .filter_map(|(i, c)| Some((format!("feishu[{i}]"), c.mention.as_ref()?))),
        )
        .chain(
            a.wecom
                .iter()
                .enumerate()
                .filter_map(|(i, c)| Some((format!("wecom[{i}]"), c.mention.as_ref()?))),
        )
        .collect();
    let mut out = format!("{} alert channel(s):\n", a.len());
    for (name, o) in a.options() {
        let owned: Vec<&Route> = routes
            .iter()
            .filter(|r| crate::alert::routing::owns(&o.routes, &r.id))
            .collect();
        let filter = if o.routes.is_empty() {
            "all routes".to_owned()
        } else {
            format!("routes {}", o.routes.join(", "))
        };
        let cross = if o.routes.is_empty() || o.routes.iter().any(|g| g == "*") {
            ", and cross-route alerts"
        } else {
            ""
        };
        let mention = mentions.get(&name).map_or(String::new(), |m| {
            let mut who = Vec::new();
            if !m.mobiles.is_empty() {
                who.push(format!("{} mobile(s)", m.mobiles.len()));
            }
            if !m.user_ids.is_empty() {
                who.push(format!("{} user id(s)", m.user_ids.len()));
            }
            if m.all {
                who.push("everyone".to_owned());
            }
            format!("; mentions {} from {}", who.join(" + "), m.min_severity)
        });
        out.push_str(&format!(
            "  {name} ({filter}; from {}{mention}): {} route(s){cross}\n",
            o.min_severity,
            owned.len()
        ));
        for r in owned {
            out.push_str(&format!("    {}\n", r.id));
        }
    }
    out
}

/// The regression sets of `[drift] sets` (relative to the config file): none when the folder
/// is absent and `[drift]` does not name it; every located error otherwise.
pub fn load_sets(config: &Config) -> Result<Vec<drift::RegressionSet>, CliError> {
    let dir = config.drift_sets_dir();
    if !dir.exists() && !config.drift.explicit {
        return Ok(Vec::new());
    }
    drift::load_dir(&dir)
        .map_err(|errors| CliError::Invalid(errors.0.iter().map(ToString::to_string).collect()))
}

fn sets_summary(config: &Config, sets: &[drift::RegressionSet], routes: &[Route]) -> String {
    let dir = config.drift_sets_dir();
    if sets.is_empty() {
        return format!("regression sets ({}): none\n", dir.display());
    }
    let mut rows = vec![[
        "SET".to_owned(),
        "CASES".to_owned(),
        "EVERY".to_owned(),
        "ROUTES".to_owned(),
        "FILE".to_owned(),
    ]];
    for s in sets {
        rows.push([
            s.name.clone(),
            s.cases.len().to_string(),
            humantime::format_duration(s.every).to_string(),
            routes.iter().filter(|r| s.applies(r)).count().to_string(),
            s.file.display().to_string(),
        ]);
    }
    format!(
        "{} regression set(s) in {}:\n{}",
        sets.len(),
        dir.display(),
        format_table(&rows)
    )
}

/// `probeok regress`: runs the regression sets now on every route they apply to and prints
/// the report (or JSON lines). Failing cases are the report, not an error: exit 0.
pub async fn regress(path: &Path, only: Option<&str>, json: bool) -> Result<(), CliError> {
    let (config, warnings) = load(path)?;
    let mut sets = load_sets(&config)?;
    warn_all(&warnings);
    if let Some(only) = only {
        let known: Vec<String> = sets.iter().map(|s| s.name.clone()).collect();
        sets.retain(|s| s.name == only);
        if sets.is_empty() {
            return Err(CliError::Invalid(vec![format!(
                "--set: unknown regression set \"{only}\" (known: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )]));
        }
    }
    let routes: Vec<Route> = config
        .routes()
        .into_iter()
        .filter(|r| sets.iter().any(|s| s.applies(r)))
        .collect();
    if routes.is_empty() {
        eprintln!("no route is named by any regression set's applies_to: nothing to run");
        return Ok(());
    }
    let mut missing = config.missing_secrets();
    missing.retain(|d| {
        config.providers.iter().enumerate().any(|(i, p)| {
            d.path == format!("provider[{i}].api_key_env")
                && routes.iter().any(|r| r.provider == p.id)
        })
    });
    if !missing.is_empty() {
        return Err(CliError::Invalid(
            missing.iter().map(ToString::to_string).collect(),
        ));
    }
    let client = ProbeClient::new(&routes, Arc::new(SystemClock)).map_err(CliError::runtime)?;
    // Routes in parallel, each route's sets one after the other (one run per route at a time).
    let per_route = futures_util::future::join_all(routes.iter().map(|route| {
        let client = &client;
        let sets = &sets;
        async move {
            let mut runs = Vec::new();
            for set in sets.iter().filter(|s| s.applies(route)) {
                runs.push(drift::run_set(client, route, set, std::time::Duration::ZERO).await);
            }
            runs
        }
    }))
    .await;
    let runs: Vec<drift::SetRun> = per_route.into_iter().flatten().collect();
    if json {
        crate::stdout::print(format_args!("{}", drift::report::json_lines(&runs)));
    } else {
        crate::stdout::print(format_args!("{}", drift::report::text(&runs)));
    }
    Ok(())
}

fn routes_table(routes: &[Route]) -> String {
    let mut rows = vec![[
        "ROUTE".to_owned(),
        "SERVES".to_owned(),
        "TIER".to_owned(),
        "WEIGHT".to_owned(),
        "KIND".to_owned(),
        "INTERVAL".to_owned(),
        "BASE URL".to_owned(),
    ]];
    for r in routes {
        rows.push([
            r.id.to_string(),
            r.serves.clone(),
            r.tier.as_str().to_owned(),
            r.weight.to_string(),
            format!("{:?}", r.kind).to_lowercase(),
            humantime::format_duration(r.probe.interval).to_string(),
            r.base_url.clone(),
        ]);
    }
    format_table(&rows)
}

fn format_table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `probeok probe`: one probe per route now, printed as a table or JSON lines.
pub async fn probe(
    path: &Path,
    only: Option<&str>,
    json: bool,
    record: bool,
) -> Result<(), CliError> {
    let (config, warnings) = load(path)?;
    warn_all(&warnings);
    refuse_missing_secrets(&config)?;
    let mut routes = config.routes();
    if let Some(only) = only {
        routes.retain(|r| r.id.as_str() == only);
        if routes.is_empty() {
            let known: Vec<String> = config.routes().iter().map(|r| r.id.to_string()).collect();
            return Err(CliError::Invalid(vec![format!(
                "--route: unknown route \"{only}\" (known: {})",
                known.join(", ")
            )]));
        }
    }
    let client = ProbeClient::new(&routes, Arc::new(SystemClock)).map_err(CliError::runtime)?;
    // Through the prober: an embeddings route gets the embeddings probe.
    let prober: &dyn crate::scheduler::Prober = &client;
    let outcomes =
        futures_util::future::join_all(routes.iter().map(|r| prober.probe(r, OutcomeKind::Probe)))
            .await;
    if json {
        for o in &outcomes {
            crate::stdout::println(format_args!("{}", probe_json(o)));
        }
    } else {
        crate::stdout::print(format_args!("{}", outcomes_table(&outcomes)));
    }
    if record {
        let location = app::store_location(&config).map_err(CliError::runtime)?;
        let store = Store::open_at(
            &location,
            StoreOptions {
                latency_threshold: config.slo.latency_threshold,
            },
        )
        .map_err(CliError::runtime)?;
        store
            .writer()
            .record_many(outcomes)
            .await
            .map_err(CliError::runtime)?;
        store.close().await.map_err(CliError::runtime)?;
    }
    Ok(())
}

fn outcomes_table(outcomes: &[ProbeOutcome]) -> String {
    let ms = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.0}"));
    let mut rows = vec![[
        "ROUTE".to_owned(),
        "RESULT".to_owned(),
        "TTFB_MS".to_owned(),
        "TTFT_MS".to_owned(),
        "TOTAL_MS".to_owned(),
        "TOKENS".to_owned(),
        "TOK/S".to_owned(),
        "DETAIL".to_owned(),
    ]];
    for o in outcomes {
        let result = match (&o.error, o.verified) {
            (Some(e), _) => e.kind().to_owned(),
            (None, Some(false)) => "unverified".to_owned(),
            (None, _) => "ok".to_owned(),
        };
        let detail = match &o.error {
            Some(e) => e.to_string(),
            None if o.verified == Some(false) => {
                format!("answer: {:?}", o.answer.as_deref().unwrap_or_default())
            }
            None => o.model_reported.clone().unwrap_or_default(),
        };
        rows.push([
            o.route.to_string(),
            result,
            ms(o.ttfb_ms),
            ms(o.ttft_ms),
            format!("{:.0}", o.total_ms),
            o.output_tokens.map_or("-".to_owned(), |t| t.to_string()),
            o.tokens_per_second
                .map_or("-".to_owned(), |t| format!("{t:.1}")),
            detail,
        ]);
    }
    format_table(&rows)
}

/// `probeok serve`: the config given, else the built-in demo.
pub async fn serve(path: Option<&Path>) -> Result<(), CliError> {
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    let (config, demo_sim) = match path {
        Some(path) => {
            // The same checks a reload runs (`reload::load_checked`).
            let (config, warnings) = crate::reload::load_checked(
                path,
                &crate::secret::Env::process(),
                &crate::app::check_channels,
            )
            .map_err(|errors| {
                CliError::Invalid(errors.iter().map(ToString::to_string).collect())
            })?;
            warn_all(&warnings);
            (config, None)
        }
        None => {
            let demo = demo::start(shutdown.clone())
                .await
                .map_err(CliError::runtime)?;
            // Before the service opens the database: the page opens on a month of history.
            demo::history::write_to_file(&demo.config, crate::clock::Clock::now(&SystemClock))
                .await
                .map_err(CliError::runtime)?;
            (demo.config.clone(), Some(demo))
        }
    };
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .map_err(|e| {
            CliError::Runtime(format!("cannot listen on {}: {e}", config.server.listen))
        })?;
    let options = app::StartOptions {
        config_file: path.map(Path::to_path_buf),
        ..app::StartOptions::default()
    };
    let monitor = listener.local_addr().map_err(CliError::runtime)?;
    let agent_config = demo_sim.as_ref().map(|d| (config.clone(), d.sim_addr));
    let running = app::start_with(
        config,
        listener,
        Arc::new(SystemClock),
        shutdown.clone(),
        options,
    )
    .await
    .map_err(CliError::runtime)?;
    // The monitor runs for months through bursts; see `malloc::trim_every`.
    let store = running.store.clone();
    tokio::spawn(crate::malloc::trim_every(
        crate::malloc::TRIM_EVERY,
        move || store.release_memory(),
    ));
    // The demo's second vantage, once the monitor's ingest listens.
    if let Some((demo_config, sim_addr)) = agent_config {
        match demo::start_agent(
            &demo_config,
            sim_addr,
            monitor,
            PathBuf::from(demo::DEMO_AGENT_DB),
            demo::edge::EdgeOutage::DEMO,
            shutdown.clone(),
        )
        .await
        {
            Ok(agent) => {
                tracing::info!(vantage = demo::DEMO_AGENT, metrics = %agent.addr, "demo agent started")
            }
            Err(e) => {
                tracing::warn!(error = %e, "demo agent did not start; the demo runs with one vantage")
            }
        }
    }
    spawn_reload_on_sighup(running.config.clone());
    running
        .done
        .await
        .map_err(CliError::runtime)?
        .map_err(CliError::runtime)
}

/// SIGHUP re-reads the config file (`reload` logs what it applied or why it refused).
fn spawn_reload_on_sighup(live: crate::reload::LiveConfig) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGHUP; reload through the admin API only");
                return;
            }
        };
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the config");
            let _ = live.reload().await;
        }
    });
    #[cfg(not(unix))]
    let _ = live;
}

/// `probeok alert test`: a test message to each channel (or channel `only`, 0-based in the
/// order dingtalk, feishu, email, webhook, wecom), printing what each receiver answered. Exit 2
/// when any channel failed.
pub async fn alert_test(path: &Path, only: Option<usize>) -> Result<(), CliError> {
    let (config, warnings) = load(path)?;
    warn_all(&warnings);
    refuse_missing_secrets(&config)?;
    if config.alert.is_empty() {
        return Err(CliError::Invalid(vec![format!(
            "{}: no alert channels configured ([[alert.dingtalk]], [[alert.feishu]], [[alert.email]], [[alert.webhook]], [[alert.wecom]])",
            path.display()
        )]));
    }
    let results = crate::alert::send_test(&config, only, chrono::Utc::now())
        .await
        .map_err(|e| match e {
            crate::alert::AlertError::Config(m) => CliError::Invalid(vec![m]),
            e => CliError::runtime(e),
        })?;
    let mut rows = vec![[
        "CHANNEL".to_owned(),
        "RESULT".to_owned(),
        "ANSWER".to_owned(),
    ]];
    let mut failed = 0;
    for (name, r) in &results {
        let (result, answer) = match r {
            Ok(receipt) => (
                "ok".to_owned(),
                format!("{} {}", receipt.status, receipt.body),
            ),
            Err(e) => {
                failed += 1;
                ("failed".to_owned(), e.to_string())
            }
        };
        rows.push([name.clone(), result, answer.replace('\n', " ")]);
    }
    crate::stdout::print(format_args!("{}", format_table(&rows)));
    if failed > 0 {
        return Err(CliError::Runtime(format!(
            "{failed} of {} channel(s) failed",
            results.len()
        )));
    }
    Ok(())
}

/// `probeok simulate`: the simulated providers alone, until Ctrl-C.
pub async fn simulate(listen: SocketAddr, scenario: &str, time_scale: f64) -> Result<(), CliError> {
    let scenario: Scenario = scenario.parse().map_err(|_| {
        let known: Vec<String> = Scenario::ALL.iter().map(ToString::to_string).collect();
        CliError::Invalid(vec![format!(
            "--scenario: unknown scenario \"{scenario}\" (known: {})",
            known.join(", ")
        )])
    })?;
    if !(time_scale.is_finite() && time_scale > 0.0) {
        return Err(CliError::Invalid(vec![format!(
            "--time-scale: must be a positive number, got {time_scale}"
        )]));
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| CliError::Runtime(format!("cannot listen on {listen}: {e}")))?;
    let addr = listener.local_addr().map_err(CliError::runtime)?;
    let mut config = SimConfig::standalone(scenario);
    config.time_scale = time_scale;
    let mut seen = std::collections::BTreeSet::new();
    crate::stdout::println(format_args!(
        "scenario {scenario} at {time_scale}x; OpenAI-compatible base URLs:"
    ));
    for r in &config.routes {
        if seen.insert((r.provider.clone(), r.region.clone())) {
            crate::stdout::println(format_args!(
                "  {}",
                sim::base_url(addr, &r.provider, &r.region)
            ));
        }
    }
    for r in &config.routes {
        crate::stdout::println(format_args!(
            "  route {} ({})",
            RouteId::new(&r.provider, &r.region, &r.model),
            r.scenario
        ));
    }
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    sim::serve(listener, config, shutdown)
        .await
        .map_err(CliError::runtime)
}

/// SIGINT or SIGTERM cancels the token once; every task watches it.
pub fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot watch SIGTERM; Ctrl-C only");
                        let _ = ctrl_c.await;
                        shutdown.cancel();
                        return;
                    }
                };
            tokio::select! {
                _ = ctrl_c => {},
                _ = term.recv() => {},
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutting down");
        shutdown.cancel();
    });
}
