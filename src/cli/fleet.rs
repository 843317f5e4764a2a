//! The fleet's commands: `probeok proxy` (a proxy replica), `probeok agent` (a remote vantage)
//! and `probeok migrate-store`.

use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{
    load, refuse_missing_secrets, refuse_open_proxy, spawn_signal_handler, warn_all, CliError,
};
use crate::app;
use crate::store::{Store, StoreOptions};

/// `probeok agent`: probes the routes of one `[[vantage]]` and pushes the outcomes to the
/// monitor; needs those routes' provider keys and the ingest token from the environment.
pub async fn agent(
    path: &Path,
    vantage: String,
    server: String,
    data: Option<std::path::PathBuf>,
    listen: std::net::SocketAddr,
) -> Result<(), CliError> {
    use crate::agent::{AgentError, AgentOptions};
    let (config, warnings) = load(path)?;
    warn_all(&warnings);
    let routes = crate::agent::routes_of(&config, &vantage)
        .map_err(|e| CliError::Invalid(vec![format!("error: {e}")]))?;
    let mut missing: Vec<String> = routes
        .iter()
        .filter_map(|r| r.api_key_env.as_deref())
        .filter(|var| crate::secret::Secret::from_env(var).is_none())
        .map(|var| format!("error: provider key variable {var} is not set"))
        .collect();
    missing.sort();
    missing.dedup();
    let token = crate::secret::Secret::from_env(&config.server.ingest_token_env);
    if token.is_none() {
        missing.push(format!(
            "error: the ingest token variable {} is not set",
            config.server.ingest_token_env
        ));
    }
    let Some(token) = token.filter(|_| missing.is_empty()) else {
        return Err(CliError::Invalid(missing));
    };
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    let opts = AgentOptions {
        vantage,
        server,
        data,
        listen,
        push: Default::default(),
    };
    let running = crate::agent::start(
        config,
        opts,
        token,
        Arc::new(crate::clock::SystemClock),
        shutdown,
    )
    .await
    .map_err(|e| match e {
        AgentError::Invalid(m) => CliError::Invalid(vec![format!("error: {m}")]),
        e => CliError::Runtime(e.to_string()),
    })?;
    running
        .done
        .await
        .map_err(CliError::runtime)?
        .map_err(CliError::runtime)
}

/// `probeok migrate-store`: copies the SQLite store at `from` (migrated first) into the
/// PostgreSQL store named by the variable `to_env`, then compares the row counts of every
/// table. A target with rows is refused unless `replace`.
pub async fn migrate_store(
    path: &Path,
    from: &Path,
    to_env: &str,
    replace: bool,
) -> Result<(), CliError> {
    use crate::store::{copy, sql::PgUrl, StoreLocation};
    let (config, warnings) = load(path)?;
    warn_all(&warnings);
    if !from.is_file() {
        return Err(CliError::Invalid(vec![format!(
            "--from {}: no such file",
            from.display()
        )]));
    }
    let url = match std::env::var(to_env).ok().as_deref().map(PgUrl::parse) {
        Some(Some(Ok(url))) => url,
        Some(Some(Err(e))) => return Err(CliError::Invalid(vec![format!("${to_env}: {e}")])),
        _ => {
            return Err(CliError::Invalid(vec![format!(
                "--to-env {to_env}: the variable must hold a postgres:// URL"
            )]))
        }
    };
    let opts = StoreOptions {
        latency_threshold: config.slo.latency_threshold,
    };
    let (source, target) = (
        StoreLocation::Sqlite(from.to_owned()),
        StoreLocation::Postgres(url),
    );
    tracing::info!(from = %source.describe(), to = %target.describe(), "copying the store");
    let report = tokio::task::spawn_blocking(move || -> Result<copy::CopyReport, String> {
        // Opening migrates both to this build's schema; the copies then match column for column.
        for at in [&source, &target] {
            let store =
                Store::open_at(at, opts.clone()).map_err(|e| format!("{}: {e}", at.describe()))?;
            drop(store);
        }
        let (s, t) = (source.connect(), target.connect());
        let (s, t) = (s.map_err(|e| e.to_string())?, t.map_err(|e| e.to_string())?);
        copy::copy_sqlite_to_postgres(&s, &t, replace, |table, n| {
            tracing::debug!(table, rows = n, "copied");
        })
        .map_err(|e| e.to_string())
    })
    .await
    .map_err(CliError::runtime)?
    .map_err(CliError::Runtime)?;
    crate::stdout::print(format_args!("{}", report.text()));
    if report.counts_match() {
        Ok(())
    } else {
        Err(CliError::Runtime(
            "row counts differ between the stores".into(),
        ))
    }
}

/// `probeok proxy --config F [--weights-from URL]`: the routing proxy alone. With a monitor URL
/// it follows that monitor's weights feed and sends its passive outcomes there; without one it
/// serves on the configured weights. Metering and idempotency keys use the configured store.
pub async fn proxy(path: &Path, weights_from: Option<&str>) -> Result<(), CliError> {
    use crate::proxy::{remote, FeedStatus, Proxy, ProxyOptions, WeightsView};

    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    let (config, mut warnings) = load(path)?;
    // This command runs the proxy whatever `proxy.enabled` says.
    let mut as_run = config.clone();
    as_run.proxy.enabled = true;
    let open = refuse_open_proxy(&as_run, &mut warnings);
    warn_all(&warnings);
    open?;
    refuse_missing_secrets(&config)?;
    let location = app::store_location(&config).map_err(CliError::runtime)?;
    tracing::info!(engine = location.engine().as_str(), database = %location.describe(), "opening the store");
    let opts = StoreOptions {
        latency_threshold: config.slo.latency_threshold,
    };
    let store = tokio::task::spawn_blocking(move || Store::open_at(&location, opts))
        .await
        .map_err(CliError::runtime)?
        .map_err(CliError::runtime)?;
    let (weights_tx, weights_rx) =
        tokio::sync::watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (passive_tx, passive_rx) = tokio::sync::mpsc::channel(app::PASSIVE_QUEUE);
    let mut feed = None;
    let mut tasks = Vec::new();
    // Every task is watched: one that panics or ends early stops the proxy, non-zero.
    let sv = crate::supervise::Supervisor::new(crate::supervise::PROXY_TASKS);
    let until = || shutdown.clone();
    match weights_from {
        Some(base) => {
            let status = Arc::new(FeedStatus::new(remote::STALE_AFTER));
            feed = Some(status.clone());
            tasks.push(sv.watch(
                "proxy_feed",
                until(),
                remote::follow(
                    base.to_owned(),
                    weights_tx,
                    status,
                    remote::STALE_AFTER,
                    shutdown.clone(),
                ),
            ));
            let token = config.env.secret(&config.server.ingest_token_env);
            let ingest = remote::ingest(base.to_owned(), token, passive_rx).0;
            tasks.push(sv.watch("proxy_ingest", until(), ingest));
        }
        None => {
            // No monitor: passive outcomes have nowhere to go.
            let mut rx = passive_rx;
            tasks.push(sv.spawn("proxy_ingest", until(), async move {
                let mut gather = crate::gather::Gather::new(crate::gather::PAUSE);
                let mut dropped = Vec::new();
                const TAKE: usize = 512;
                while gather.take(&mut rx, &mut dropped, TAKE).await > 0 {
                    dropped.clear();
                }
            }));
            drop(weights_tx);
        }
    }
    // The fleet's one hourly extra-cost budget and the clients' limits, in the store's ledger.
    let clock: Arc<dyn crate::clock::Clock> = Arc::new(crate::clock::SystemClock);
    let spend = crate::proxy::spend_on(&store, clock.clone(), &config.proxy);
    let budget =
        crate::extra_cost::ExtraCost::new(config.budget.clone(), &config.routes(), clock, None);
    budget.share(spend.clone());
    tasks.push(sv.spawn(
        "budget",
        until(),
        budget.clone().keep_hours(None, shutdown.clone()),
    ));
    let proxy = Proxy::with_options(
        &config,
        weights_rx,
        passive_tx,
        ProxyOptions {
            store: Some(store.clone()),
            spend: Some(spend),
            feed,
            tracer: crate::trace::Tracer::from_env(&config.tracing).map_err(CliError::runtime)?,
            ..ProxyOptions::default()
        },
    )
    .map_err(CliError::runtime)?;
    proxy.set_budget(budget);
    let workers = usize::try_from(config.proxy.workers).unwrap_or(1);
    let listener = crate::proxy::bind(config.proxy.listen, workers)
        .map_err(|e| CliError::Runtime(format!("cannot listen on {}: {e}", config.proxy.listen)))?;
    tracing::info!(addr = %config.proxy.listen, weights_from, workers, "proxy serving");
    if let Some(jobs) = proxy.spawn_jobs(Default::default(), shutdown.clone()) {
        tasks.push(sv.watch("proxy_jobs", until(), jobs));
    }
    let served = sv.spawn(
        "proxy",
        until(),
        crate::proxy::serve(listener, proxy, shutdown.clone()),
    );
    let fatal = sv.fatal();
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = fatal.cancelled() => shutdown.cancel(),
    }
    let served = served.await;
    for t in tasks {
        let _ = tokio::time::timeout(app::DRAIN_TIMEOUT, t).await;
    }
    store.close().await.map_err(CliError::runtime)?;
    if let Some(failure) = sv.failure() {
        return Err(CliError::Runtime(failure.to_string()));
    }
    match served {
        Ok(result) => result.map_err(CliError::runtime),
        Err(e) => Err(CliError::runtime(e)),
    }
}
