//! The egress control probe: a plain GET of `[egress] control_url`, a URL that
//! involves no LLM provider, every probe interval. When it fails while routes of two or more
//! providers fail too, the fault is our own network, not theirs ([`super::findings`]).
//!
//! I/O, so not part of the pure core: the health service runs [`run`] and feeds each result
//! into [`super::findings::findings`] as `control_ok`.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// Where and how often to look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlProbe {
    pub url: String,
    /// `[probe] interval`: probed alongside the routes.
    pub every: Duration,
    /// `[probe] first_byte_timeout`: a control URL slower than that counts as failing, like a
    /// route that sent no byte in time.
    pub timeout: Duration,
}

impl ControlProbe {
    /// `None` without a `control_url` (no egress findings then).
    pub fn from_config(config: &Config) -> Option<Self> {
        Some(Self {
            url: config.egress.control_url.clone()?,
            every: config.probe.interval,
            timeout: config.probe.first_byte_timeout,
        })
    }
}

/// One GET: any HTTP answer below 500 means our network reached the outside world (a 404
/// page still proves the path works); a 5xx, a connect error or no answer in time does not.
/// The body is never read.
pub async fn check(client: &reqwest::Client, url: &str, timeout: Duration) -> bool {
    match tokio::time::timeout(timeout, client.get(url).send()).await {
        Ok(Ok(response)) => response.status().as_u16() < 500,
        Ok(Err(_)) | Err(_) => false,
    }
}

/// Probes now and then every `every` until `shutdown` (or until nobody reads `results`),
/// sending each result. Logs when the result flips, not on every probe.
pub async fn run(probe: ControlProbe, results: mpsc::Sender<bool>, shutdown: CancellationToken) {
    let client = match reqwest::Client::builder().build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the egress control client; egress findings are off");
            return;
        }
    };
    let mut every = tokio::time::interval(probe.every.max(Duration::from_millis(10)));
    every.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut last: Option<bool> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        let ok = tokio::select! {
            _ = shutdown.cancelled() => return,
            ok = check(&client, &probe.url, probe.timeout) => ok,
        };
        if last != Some(ok) {
            if ok {
                tracing::info!(url = %probe.url, "egress control URL reachable");
            } else {
                tracing::warn!(url = %probe.url, "egress control URL failing");
            }
            last = Some(ok);
        }
        if results.send(ok).await.is_err() {
            return;
        }
    }
}
