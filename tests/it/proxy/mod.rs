mod bounds;
mod contracts;
mod embeddings;
mod env;
mod extra_cost;
mod failover;
mod inflight;
mod monitor;
mod props;
mod ratelimit;
mod reasoning;
mod request_side;
mod safeguards;
mod shadow;
mod spend;
mod traces;
mod workers;

/// One provider `p` (region `r`, at `up`) with one primary chat route to its model `up`, the
/// proxy on.
fn one_route(up: &crate::common::Server) -> probeok::config::Config {
    use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig};
    let mut config = Config::default();
    config.providers.push(ProviderConfig {
        id: "p".into(),
        regions: vec![RegionConfig {
            id: "r".into(),
            base_url: up.base_url(),
        }],
        ..ProviderConfig::default()
    });
    config.routes.push(RouteConfig {
        provider: "p".into(),
        region: "r".into(),
        model: "up".into(),
        serves: "chat".into(),
        tier: probeok::route::Tier::Primary,
        weight: 100,
        ..RouteConfig::default()
    });
    config.proxy.enabled = true;
    config
}
