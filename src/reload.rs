//! Hot reload of the config file (SIGHUP in `probeok serve`, and the admin endpoint
//! `POST /api/v1/admin/reload`).
//!
//! The new file passes the same checks `serve` does at start ([`load_checked`]: parse and
//! validate, regression sets, secrets, alert channels) or it is refused and the running config
//! stays — every diagnostic logged and returned. A good one is split by section ([`plan`]):
//! the sections consumers follow live are copied onto the running config and published on the
//! live-config `watch` channel ([`LiveConfig`]); the others stay as they are and are reported
//! as `restart_required`. So what the live channel carries is always exactly what is in
//! effect.
//!
//! Live: `[server] title`, `public_url`, `admin_token_env`; `[alerting]`, `[[alert.*]]`
//! (channels rebuilt), `[[maintenance]]`, `[[contract]]` (the proxy reads them per request),
//! `[heartbeat]`, `[drill]`. Everything else (listeners, storage, probing, detection, routes,
//! drift, proxy, switch, budget, vantages and the quorum, the ingest token variable) is wired into running tasks at
//! start: a restart applies it.
//!
//! Reloads are serialised; `probeok_config_reloads_total{result}` and
//! `probeok_config_last_reload_success_timestamp_seconds` count them (the start counts as the
//! first success, as in Prometheus).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::config::{Config, Diagnostic, OpenProxy};
use crate::secret::Env;

/// Where reloads are counted (the `/metrics` families): the service's start counts as the
/// first success.
pub trait ReloadObserver: Send + Sync {
    /// The latest reload's outcome at `at` (also called once at start).
    fn observe_reload(&self, ok: bool, at: DateTime<Utc>);
    /// One more reload with this outcome.
    fn count_reload(&self, ok: bool);
}

/// The config in effect, following reloads, and (for the admin endpoint) the way to reload
/// it. Cheap to clone; [`LiveConfig::current`] is a snapshot to read within one request or
/// cycle.
#[derive(Clone)]
pub struct LiveConfig {
    rx: watch::Receiver<Arc<Config>>,
    reloader: Option<Arc<Reloader>>,
}

impl std::fmt::Debug for LiveConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveConfig")
            .field("source", &self.rx.borrow().source)
            .field("reloadable", &self.reloader.is_some())
            .finish()
    }
}

impl LiveConfig {
    /// Follows `rx`; cannot reload by itself.
    pub fn new(rx: watch::Receiver<Arc<Config>>) -> Self {
        Self { rx, reloader: None }
    }

    /// A config that never changes (tests, one-shot commands).
    pub fn fixed(config: Arc<Config>) -> Self {
        Self::new(watch::channel(config).1)
    }

    pub fn current(&self) -> Arc<Config> {
        self.rx.borrow().clone()
    }

    /// The channel itself, to wait for changes (`ProxyOptions.live`, the alert engine).
    pub fn receiver(&self) -> watch::Receiver<Arc<Config>> {
        self.rx.clone()
    }

    /// Re-reads the config file; [`ReloadError::NoConfigFile`] when there is none.
    pub async fn reload(&self) -> Result<Report, ReloadError> {
        match &self.reloader {
            Some(r) => r.reload().await,
            None => Err(ReloadError::NoConfigFile),
        }
    }
}

impl From<Arc<Config>> for LiveConfig {
    fn from(c: Arc<Config>) -> Self {
        Self::fixed(c)
    }
}

impl From<Config> for LiveConfig {
    fn from(c: Config) -> Self {
        Self::fixed(Arc::new(c))
    }
}

/// A start check that belongs to a layer above this one, run on every new file: building
/// every alert channel (`crate::alert::channels`), so a bad SMTP URL and the like is refused
/// now rather than alerting into the void. `Err` carries the message.
pub type ChannelCheck = Arc<dyn Fn(&Config) -> Result<(), String> + Send + Sync>;

/// Reads `path` and runs `serve`'s start checks, `channels` last, with the variables the
/// config names read from `env`. `Ok` carries the warnings; `Err` every problem found.
pub fn load_checked(
    path: &Path,
    env: &Env,
    channels: &dyn Fn(&Config) -> Result<(), String>,
) -> Result<(Config, Vec<Diagnostic>), Vec<Diagnostic>> {
    let loaded = Config::load(path).map_err(|e| e.0)?;
    let mut config = loaded.config;
    config.env = env.clone();
    let dir = config.drift_sets_dir();
    if dir.exists() || config.drift.explicit {
        crate::drift::load_dir(&dir).map_err(|e| e.0)?;
    }
    let missing = config.missing_secrets();
    if !missing.is_empty() {
        return Err(missing);
    }
    if let Err(message) = channels(&config) {
        return Err(vec![Diagnostic {
            file: config.source.display().to_string(),
            line: 0,
            col: 0,
            path: "alert".into(),
            message,
        }]);
    }
    let mut warnings = loaded.warnings;
    match config.open_proxy_now() {
        Some(OpenProxy::Refused(d)) => return Err(vec![d]),
        Some(OpenProxy::Allowed(d)) => warnings.push(d),
        None => {}
    }
    Ok((config, warnings))
}

/// What a reload does with a new config, section by section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Changed sections applied now.
    pub applied: Vec<&'static str>,
    /// Changed sections that only a restart applies (the running values stay).
    pub restart_required: Vec<&'static str>,
}

/// Splits the differences between `old` and `new` (pure) and returns the config to publish:
/// `old` with `new`'s live sections.
pub fn plan(old: &Config, new: &Config) -> (Config, Plan) {
    let mut next = old.clone();
    let mut p = Plan::default();
    macro_rules! live {
        ($name:literal, $($field:tt)+) => {
            if old.$($field)+ != new.$($field)+ {
                next.$($field)+ = new.$($field)+.clone();
                p.applied.push($name);
            }
        };
    }
    macro_rules! restart {
        ($name:literal, $($field:tt)+) => {
            if old.$($field)+ != new.$($field)+ {
                p.restart_required.push($name);
            }
        };
    }
    live!("server.title", server.title);
    live!("server.public_url", server.public_url);
    live!("server.admin_token_env", server.admin_token_env);
    restart!("server.listen", server.listen);
    restart!("server.ingest_token_env", server.ingest_token_env);
    restart!("storage", storage);
    restart!("probe", probe);
    restart!("detection", detection);
    restart!("egress", egress);
    restart!("provider", providers);
    restart!("route", routes);
    restart!("slo", slo);
    live!("alerting", alerting);
    live!("alert", alert);
    live!("maintenance", maintenance);
    restart!("drift", drift);
    restart!("proxy", proxy);
    restart!("switch", switch);
    restart!("budget", budget);
    live!("contract", contracts);
    live!("heartbeat", heartbeat);
    live!("drill", drill);
    // The board of vantages is built at start: who probes what, the quorum, an agent's bound.
    restart!("server.vantage", server.vantage);
    restart!("vantage", vantages);
    restart!("quorum", quorum);
    restart!("agent", agent);
    // The proxy's shadows (queue, worker, histories) are built with the proxy.
    restart!("shadow", shadows);
    // Envoy's endpoints are the routes' (restart-only) addresses; the agent's listener is bound at start.
    restart!("envoy", envoy);
    restart!("haproxy", haproxy);
    // The subscription form and its sender are built at start.
    restart!("subscriptions", subscriptions);
    // The sync task is started with the leader's term, its gateways and channels with it.
    restart!("sync", sync);
    // The catalog task is started with the leader's term, its provider regions (the routes)
    // and the routes' retirement dates with it.
    restart!("catalog", catalog);
    // The capability probes' task is started with the leader's term, its cadence with it.
    restart!("capability", capability);
    // Later diagnostics point into the file as it is now.
    next.source_map = new.source_map.clone();
    (next, p)
}

/// The answer to a successful reload.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub reloaded: bool,
    pub applied: Vec<&'static str>,
    pub restart_required: Vec<&'static str>,
    pub warnings: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The service runs the built-in demo: there is no file to re-read.
    #[error("no config file: the service runs the built-in demo")]
    NoConfigFile,
    /// The new config was refused; the running one stays.
    #[error("the new config is invalid ({} problem(s)); the running config is kept", .0.len())]
    Invalid(Vec<Diagnostic>),
    #[error("internal: {0}")]
    Internal(String),
}

/// Re-reads the config file and publishes what applies live.
pub struct Reloader {
    file: Option<PathBuf>,
    tx: watch::Sender<Arc<Config>>,
    /// Serialises reloads (a SIGHUP racing an API call).
    lock: tokio::sync::Mutex<()>,
    channels: ChannelCheck,
    metrics: Option<Arc<dyn ReloadObserver>>,
    clock: Arc<dyn Clock>,
}

impl Reloader {
    /// `file`: the config file the service started with (`None` for the built-in demo).
    pub fn new(
        file: Option<PathBuf>,
        tx: watch::Sender<Arc<Config>>,
        channels: ChannelCheck,
        metrics: Option<Arc<dyn ReloadObserver>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        if let Some(m) = &metrics {
            m.observe_reload(true, clock.now());
        }
        Self {
            file,
            tx,
            channels,
            lock: tokio::sync::Mutex::new(()),
            metrics,
            clock,
        }
    }

    /// The live config that can also reload (`AppState.config`).
    pub fn live(self: &Arc<Self>) -> LiveConfig {
        LiveConfig {
            rx: self.tx.subscribe(),
            reloader: Some(self.clone()),
        }
    }

    /// Re-reads the file; logs the outcome (every diagnostic of a refused config).
    pub async fn reload(&self) -> Result<Report, ReloadError> {
        let _one = self.lock.lock().await;
        let Some(file) = self.file.clone() else {
            tracing::warn!("config reload asked, but the service runs the built-in demo (no file)");
            return Err(ReloadError::NoConfigFile);
        };
        let channels = self.channels.clone();
        // A new file changes what the variables are named, never where they are read.
        let env = self.tx.borrow().env.clone();
        let checked = tokio::task::spawn_blocking(move || load_checked(&file, &env, &*channels))
            .await
            .map_err(|e| ReloadError::Internal(e.to_string()));
        let result = match checked {
            Ok(Ok((new, warnings))) => self.apply(&new, warnings),
            Ok(Err(diags)) => Err(ReloadError::Invalid(diags)),
            Err(e) => Err(e),
        };
        let ok = result.is_ok();
        if let Some(m) = &self.metrics {
            m.observe_reload(ok, self.clock.now());
            m.count_reload(ok);
        }
        match &result {
            Ok(r) => tracing::info!(
                applied = ?r.applied,
                restart_required = ?r.restart_required,
                warnings = ?r.warnings,
                "config reloaded"
            ),
            Err(ReloadError::Invalid(diags)) => {
                for d in diags {
                    tracing::error!(diagnostic = %d, "config reload refused");
                }
                tracing::error!(
                    problems = diags.len(),
                    "config reload refused; the running config is kept"
                );
            }
            Err(e) => {
                tracing::error!(error = %e, "config reload failed; the running config is kept")
            }
        }
        result
    }

    fn apply(&self, new: &Config, warnings: Vec<Diagnostic>) -> Result<Report, ReloadError> {
        let old = self.tx.borrow().clone();
        let (next, plan) = plan(&old, new);
        // The live sections must fit what keeps running: a contract's fallback model must be
        // served by the running routes, not only by routes a restart would bring.
        if let Err(e) = next.validate() {
            let mut diags = e.0;
            for d in &mut diags {
                d.message
                    .push_str(" (against the running routes: changes to [[route]] need a restart)");
            }
            return Err(ReloadError::Invalid(diags));
        }
        if !plan.applied.is_empty() {
            self.tx.send_replace(Arc::new(next));
        }
        let mut warnings: Vec<String> = warnings.iter().map(ToString::to_string).collect();
        if !plan.restart_required.is_empty() {
            warnings.push(format!(
                "changed but not applied until a restart: {}",
                plan.restart_required.join(", ")
            ));
        }
        Ok(Report {
            reloaded: true,
            applied: plan.applied,
            restart_required: plan.restart_required,
            warnings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_sections_are_applied_and_the_rest_kept_for_a_restart() {
        let old = Config::default();
        let mut new = Config::default();
        new.server.title = "Ours".into();
        new.server.listen = "127.0.0.1:1".parse().unwrap();
        new.heartbeat.stale_after = std::time::Duration::from_secs(600);
        new.storage.retention_days += 1;
        let (next, p) = plan(&old, &new);
        assert_eq!(p.applied, vec!["server.title", "heartbeat"]);
        assert_eq!(p.restart_required, vec!["server.listen", "storage"]);
        assert_eq!(next.server.title, "Ours");
        assert_eq!(next.heartbeat.stale_after.as_secs(), 600);
        assert_eq!(next.server.listen, old.server.listen);
        assert_eq!(next.storage, old.storage);
    }

    #[test]
    fn an_unchanged_config_plans_nothing() {
        let (_, p) = plan(&Config::default(), &Config::default());
        assert_eq!(p, Plan::default());
    }
}
