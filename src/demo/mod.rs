//! The built-in demo behind `probeok serve` without a config: simulated providers in-process
//! (3 providers × 2 regions × 2 models), some with scripted faults in motion, and a config of
//! routes pointing at them, so a new user sees a living status page at once — with a past:
//! on first start [`history`] writes 30 days of simulated history into the demo's database.
//! An agent runs in-process as a second vantage ([`start_agent`]), probing the same
//! simulator and pushing to the demo's own ingest over real HTTP, so the page shows a dot per
//! vantage and the route states are their quorum. Its own network path ([`edge`]) loses one
//! region for a while, so the page shows what one place's outage looks like: a
//! `vantage_local` finding, not a provider incident.

pub mod edge;
pub mod history;

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::agent::{AgentError, AgentOptions, RunningAgent};
use crate::config::VantageConfig;
use crate::config::{
    Behaviour, Config, ContractConfig, DetectionConfig, DriftConfig, EgressConfig, ProbeConfig,
    ProviderConfig, ProxyConfig, RegionConfig, RouteConfig, ServerConfig, ShadowConfig, SloConfig,
    StorageConfig,
};
use crate::route::{Capability, Price, ProviderKind, Tier};
use crate::secret::Env;
use crate::sim::{self, Scenario, SimConfig, SimRoute};

/// The demo's database, in the working directory, named so nobody mistakes it for real data.
pub const DEMO_DB: &str = "probeok-demo.db";

/// The in-process agent's vantage; the monitor's own is the default `local`.
pub const DEMO_AGENT: &str = "demo-edge";

/// The in-process agent's outbox, beside [`DEMO_DB`].
pub const DEMO_AGENT_DB: &str = "probeok-demo-agent.db";

/// The variable the demo's ingest token is given under (in the config's own environment,
/// never the process's): made up at each start, shared by the monitor and its agent only.
const DEMO_INGEST_VAR: &str = "PROBEOK_DEMO_INGEST_TOKEN";

/// Scenario timelines run this much faster than real time, so an incident starts and ends
/// within minutes of starting the demo.
pub const DEMO_TIME_SCALE: f64 = 10.0;

/// (provider, [regions], [(model, serves, tier)]).
type DemoProvider = (
    &'static str,
    [&'static str; 2],
    [(&'static str, &'static str, Tier); 2],
);

const PROVIDERS: [DemoProvider; 3] = [
    (
        "qwen",
        ["cn-beijing", "cn-hangzhou"],
        [
            ("qwen-max", "chat-main", Tier::Primary),
            ("qwen-turbo", "chat-lite", Tier::Primary),
        ],
    ),
    (
        "deepseek",
        ["cn-east", "cn-south"],
        [
            ("deepseek-chat", "chat-main", Tier::Backup),
            ("deepseek-ai/DeepSeek-V3-lite", "chat-lite", Tier::Backup),
        ],
    ),
    (
        "openai",
        ["us-east", "eu-west"],
        [
            ("gpt-4o", "chat-main", Tier::Fallback),
            ("gpt-4o-mini", "chat-lite", Tier::Fallback),
        ],
    ),
];

/// Which demo routes misbehave, and how. Everything else is healthy.
pub fn scenario_for(provider: &str, region: &str, model: &str) -> Scenario {
    match (provider, region, model) {
        ("qwen", "cn-beijing", "qwen-max") => Scenario::LatencySpike,
        ("qwen", "cn-hangzhou", "qwen-turbo") => Scenario::PartialOutage,
        ("deepseek", "cn-east", "deepseek-chat") => Scenario::SoftRateLimit,
        ("deepseek", "cn-south", _) => Scenario::VersionDrift,
        ("openai", "us-east", _) => Scenario::RegionFailover,
        _ => Scenario::Healthy,
    }
}

/// The demo's `default` degradation contract.
pub fn demo_contract() -> ContractConfig {
    ContractConfig {
        feature: crate::config::DEFAULT_FEATURE.to_owned(),
        degraded: Some(Behaviour::CachedResponse {
            max_age: Duration::from_secs(300),
        }),
        critical: Some(Behaviour::Reject {
            message: "AI features are temporarily unavailable, please retry later".to_owned(),
        }),
        user_message: Some("Responses may be slower; switched to a backup mode".to_owned()),
        retry_after: Duration::from_secs(60),
    }
}

/// The demo's shadow: `openai/eu-west/gpt-4o-mini` gets copies of `chat-lite` only.
pub fn demo_shadow() -> ShadowConfig {
    ShadowConfig {
        serves: "chat-lite".to_owned(),
        route: "openai/eu-west/gpt-4o-mini".to_owned(),
        ratio: 0.2,
        max_cost_per_hour: 0.5,
    }
}

/// A running demo: its config (routes aimed at the simulator) and the simulator's address.
pub struct Demo {
    pub config: Config,
    pub sim_addr: std::net::SocketAddr,
}

/// Starts the simulator on a free loopback port and builds the demo config around it.
pub async fn start(shutdown: CancellationToken) -> std::io::Result<Demo> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let sim_addr = listener.local_addr()?;
    let mut sim_routes = Vec::new();
    let mut providers = Vec::new();
    let mut routes = Vec::new();
    for (provider, regions, models) in PROVIDERS {
        providers.push(ProviderConfig {
            id: provider.to_owned(),
            kind: ProviderKind::Openai,
            api_key_env: None,
            regions: regions
                .iter()
                .map(|region| RegionConfig {
                    id: (*region).to_owned(),
                    base_url: sim::base_url(sim_addr, provider, region),
                })
                .collect(),
            status_pages: Vec::new(),
            max_in_flight: None,
        });
        for region in regions {
            for (model, serves, tier) in models {
                let scenario = scenario_for(provider, region, model);
                let slow = scenario == Scenario::LatencySpike;
                sim_routes.push(SimRoute {
                    provider: provider.to_owned(),
                    region: region.to_owned(),
                    model: model.to_owned(),
                    scenario,
                });
                routes.push(RouteConfig {
                    provider: provider.to_owned(),
                    region: region.to_owned(),
                    model: model.to_owned(),
                    serves: serves.to_owned(),
                    tier,
                    weight: 50,
                    price: Some(Price {
                        input_per_mtok: 2.0,
                        output_per_mtok: 8.0,
                        currency: "CNY".to_owned(),
                    }),
                    capabilities: vec![Capability::Stream],
                    context_window: Some(32_000),
                    residency: None,
                    // The latency spike answers in up to ~15 s: give it room to be a slow
                    // success instead of a timeout, and never overrun its interval.
                    interval: slow.then_some(Duration::from_secs(20)),
                    timeout: slow.then_some(Duration::from_secs(18)),
                    first_byte_timeout: None,
                    stall_timeout: None,
                    max_tokens: None,
                    slo: None,
                    confirm_after: None,
                    request: None,
                    max_in_flight: None,
                    ..RouteConfig::default()
                });
            }
        }
    }
    let sim_config = SimConfig {
        routes: sim_routes,
        time_scale: DEMO_TIME_SCALE,
        seed: rand::random(),
    };
    tokio::spawn(async move {
        if let Err(e) = sim::serve(listener, sim_config, shutdown).await {
            tracing::error!(error = %e, "demo simulator stopped");
        }
    });
    let config = Config {
        source: PathBuf::from("(built-in demo)"),
        server: ServerConfig {
            title: "probeok demo — simulated providers".to_owned(),
            ingest_token_env: DEMO_INGEST_VAR.to_owned(),
            ..ServerConfig::default()
        },
        env: demo_env(),
        // The in-process agent probes every route too: two vantages, a quorum of both.
        vantages: vec![VantageConfig {
            id: DEMO_AGENT.to_owned(),
            routes: Vec::new(),
            stale_after: VantageConfig::DEFAULT_STALE_AFTER,
        }],
        storage: StorageConfig {
            url_env: None,
            path: PathBuf::from(DEMO_DB),
            // Raw outcomes as long as the simulated history reaches, so the incidents page
            // accounts each of its incidents (and nothing is deleted on the first start).
            retention_days: 31,
            ..StorageConfig::default()
        },
        // Short intervals: at 10× a region failover lasts only 24 s of wall time.
        probe: ProbeConfig {
            interval: Duration::from_secs(5),
            timeout: Duration::from_millis(4500),
            first_byte_timeout: Duration::from_secs(3),
            throughput_every: Duration::from_secs(60),
            ..ProbeConfig::default()
        },
        detection: DetectionConfig::default(),
        egress: EgressConfig::default(),
        providers,
        routes,
        slo: SloConfig::default(),
        // No regression sets: the simulator answers the shipped sets' prompts (`probes/`)
        // generically, so every backup would fail the quality gate and lose its weight.
        drift: DriftConfig::no_sets(),
        // The proxy runs too, so a new user can `curl` it on 127.0.0.1:9401.
        proxy: ProxyConfig {
            enabled: true,
            ..ProxyConfig::default()
        },
        // A degradation contract for every request (no x-probeok-feature needed): the last
        // good answer while a model is DEGRADED, an explicit 503 while it is CRITICAL.
        contracts: vec![demo_contract()],
        // A route in shadow before its canary: a fifth of chat-lite's requests are copied to
        // it and compared on its page and at /api/v1/shadow; it serves no real traffic.
        shadows: vec![demo_shadow()],
        ..Config::default()
    };
    tracing::info!(
        simulator = %sim_addr,
        database = DEMO_DB,
        "no config given: running the built-in demo with simulated providers; open http://{} (proxy: http://{}/v1)",
        config.server.listen,
        config.proxy.listen
    );
    Ok(Demo { config, sim_addr })
}

/// The demo's secrets: its made-up ingest token, and the admin and proxy client keys a user
/// may have exported (read here, never written to the process environment).
fn demo_env() -> Env {
    let token: String = (0..32)
        .map(|_| char::from(b"0123456789abcdef"[rand::random::<usize>() % 16]))
        .collect();
    let mut env = Env::given().with(DEMO_INGEST_VAR, token);
    let defaults = (ServerConfig::default(), ProxyConfig::default());
    for var in [&defaults.0.admin_token_env, &defaults.1.client_keys_env] {
        if let Ok(value) = std::env::var(var) {
            env.set(var.as_str(), value);
        }
    }
    env
}

/// Starts the demo's agent: vantage [`DEMO_AGENT`], probing the demo's routes and pushing
/// to `monitor` (the demo's own listener) with the demo's ingest token; its outbox is
/// `outbox` ([`DEMO_AGENT_DB`] for `probeok serve`). It reaches [`edge::EDGE_REGION`] of the
/// simulator at `sim_addr` through its own path, cut during `outage`.
pub async fn start_agent(
    config: &Config,
    sim_addr: std::net::SocketAddr,
    monitor: std::net::SocketAddr,
    outbox: PathBuf,
    outage: edge::EdgeOutage,
    shutdown: CancellationToken,
) -> Result<RunningAgent, AgentError> {
    let token = config
        .env
        .secret(&config.server.ingest_token_env)
        .ok_or_else(|| AgentError::Invalid("the demo has no ingest token".to_owned()))?;
    let path = edge::start(sim_addr, outage, shutdown.child_token())
        .await
        .map_err(|e| AgentError::Invalid(format!("the demo agent's network: {e}")))?;
    let mut config = config.clone();
    let (provider, region) = edge::EDGE_REGION;
    for p in config.providers.iter_mut().filter(|p| p.id == provider) {
        for r in p.regions.iter_mut().filter(|r| r.id == region) {
            r.base_url = sim::base_url(path, provider, region);
        }
    }
    let opts = AgentOptions {
        vantage: DEMO_AGENT.to_owned(),
        server: format!("http://{monitor}"),
        data: Some(outbox),
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        push: crate::agent::push::PushOptions::default(),
    };
    crate::agent::start(
        config,
        opts,
        token,
        std::sync::Arc::new(crate::clock::SystemClock),
        shutdown,
    )
    .await
}
