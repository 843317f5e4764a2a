//! Simulated OpenAI-compatible providers with scripted fault scenarios: the built-in demo,
//! `probeok simulate`, drills, and tests that need a real upstream on a real socket.
//!
//! One server (one listener) hosts every simulated provider × region under
//! `/{provider}/{region}/v1`, so `{base_url}/chat/completions` and `{base_url}/models` work
//! as with a real provider. The probe prompt gets exactly `PROBE_OK`, the throughput prompt
//! `1 2 … 40` token by token, anything else a short generic answer.
//!
//! - [`scenario`]: the timelines as a pure function ([`scenario::behaviour`]), unit-tested
//!   without HTTP.
//! - [`history`]: past hours of probing a simulated route as outcomes, without the wire (the
//!   demo's 30 days of history).
//! - `openai`: request parsing and the response JSON.
//! - `server`: axum handlers that act a behaviour out on the wire.
//!
//! Scenario time runs from server start (tokio's clock, so tests can pause it), multiplied by
//! [`SimConfig::time_scale`]. Latencies are never compressed: a 14 s answer takes 14 s.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub mod history;
mod openai;
pub mod scenario;
mod server;

pub use scenario::{Scenario, UnknownScenario};

/// One simulated route and the scenario it suffers. A route that should stay healthy while
/// its neighbours fail (the other model in a partial outage, the other region in a failover)
/// is configured as [`Scenario::Healthy`].
#[derive(Debug, Clone, PartialEq)]
pub struct SimRoute {
    pub provider: String,
    pub region: String,
    pub model: String,
    pub scenario: Scenario,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub routes: Vec<SimRoute>,
    /// Scenario time per wall time: 1 = real time; 30 = a 23-minute incident lasts 46 s.
    /// Non-positive or non-finite values are treated as 1.
    pub time_scale: f64,
    /// Seeds every random draw (latency jitter, which requests fail), so runs reproduce.
    pub seed: u64,
}

impl SimConfig {
    /// What `probeok simulate --scenario X` serves: provider `sim`, regions `r1` and `r2`,
    /// models `sim-large` and `sim-small`, in real time (`time_scale` 1; the caller may
    /// compress it). The scenario is applied where it makes sense and the rest stays healthy:
    ///
    /// | scenario | routes hit |
    /// | --- | --- |
    /// | `latency-spike`, `version-drift` | `sim-large` in both regions (a model-level event) |
    /// | `partial-outage` | `sim-small` in both regions (the light model is the broken one) |
    /// | `region-failover` | both models in `r2` |
    /// | `soft-rate-limit` | every route (an account-level throttle) |
    /// | `stall`, `flapping` | `r1/sim-large` only |
    pub fn standalone(scenario: Scenario) -> SimConfig {
        let mut routes = Vec::new();
        for region in ["r1", "r2"] {
            for model in ["sim-large", "sim-small"] {
                let hit = match scenario {
                    Scenario::Healthy | Scenario::SoftRateLimit => true,
                    Scenario::LatencySpike | Scenario::VersionDrift => model == "sim-large",
                    Scenario::PartialOutage => model == "sim-small",
                    Scenario::RegionFailover => region == "r2",
                    Scenario::Stall | Scenario::Flapping => region == "r1" && model == "sim-large",
                };
                routes.push(SimRoute {
                    provider: "sim".to_owned(),
                    region: region.to_owned(),
                    model: model.to_owned(),
                    scenario: if hit { scenario } else { Scenario::Healthy },
                });
            }
        }
        SimConfig {
            routes,
            time_scale: 1.0,
            seed: 42,
        }
    }
}

/// Serves `config` on `listener` until `shutdown` is cancelled. Hung, stalled and streaming
/// requests watch the token too, so shutdown completes promptly: their clients see the
/// connection cut.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: SimConfig,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_from(listener, config, std::time::Duration::ZERO, shutdown).await
}

/// [`serve`], with the scenarios already `elapsed` into their timelines (scenario time): a
/// drill or a test can start inside an incident instead of waiting for it.
pub async fn serve_from(
    listener: tokio::net::TcpListener,
    config: SimConfig,
    elapsed: std::time::Duration,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let scale = if config.time_scale.is_finite() && config.time_scale > 0.0 {
        config.time_scale
    } else {
        1.0
    };
    let sim = server::Sim::new(config, shutdown.clone()).rewind(elapsed.div_f64(scale));
    server::serve(listener, Arc::new(sim), shutdown).await
}

/// The OpenAI-compatible base URL of one simulated provider region on a server at `addr`:
/// clients POST `{base_url}/chat/completions`.
pub fn base_url(addr: SocketAddr, provider: &str, region: &str) -> String {
    format!("http://{addr}/{provider}/{region}/v1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_hits_one_model_or_one_region() {
        let hit = |s: Scenario| -> Vec<String> {
            SimConfig::standalone(s)
                .routes
                .into_iter()
                .filter(|r| r.scenario != Scenario::Healthy)
                .map(|r| format!("{}/{}", r.region, r.model))
                .collect()
        };
        assert_eq!(
            hit(Scenario::PartialOutage),
            ["r1/sim-small", "r2/sim-small"]
        );
        assert_eq!(
            hit(Scenario::RegionFailover),
            ["r2/sim-large", "r2/sim-small"]
        );
        assert!(hit(Scenario::Healthy).is_empty());
        assert_eq!(SimConfig::standalone(Scenario::Stall).routes.len(), 4);
    }

    #[test]
    fn base_url_is_openai_shaped() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(
            base_url(addr, "sim", "r1"),
            "http://127.0.0.1:8080/sim/r1/v1"
        );
    }
}
