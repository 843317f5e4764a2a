//! The budget reservation's cost per request (the hourly extra-cost budget): reserve + settle on a non-primary
//! route, single-threaded and with 2 threads contending on the mutex.

use std::sync::Arc;
use std::time::Instant;

use probeok::clock::SystemClock;
use probeok::config::{Config, ExtraCostConfig, ProviderConfig, RegionConfig, RouteConfig};
use probeok::extra_cost::ExtraCost;
use probeok::route::{Price, RouteId, Tier};

fn main() {
    let mut c = Config::default();
    for (p, tier, price) in [("a", Tier::Primary, 1.0), ("b", Tier::Backup, 3.0)] {
        c.providers.push(ProviderConfig {
            id: p.into(),
            regions: vec![RegionConfig {
                id: "r".into(),
                base_url: "http://127.0.0.1:9/v1".into(),
            }],
            ..ProviderConfig::default()
        });
        c.routes.push(RouteConfig {
            provider: p.into(),
            region: "r".into(),
            model: "m".into(),
            serves: "chat".into(),
            tier,
            weight: 100,
            price: Some(Price {
                input_per_mtok: price,
                output_per_mtok: price,
                currency: "CNY".into(),
            }),
            ..RouteConfig::default()
        });
    }
    let cfg = ExtraCostConfig {
        max_extra_cost_per_hour: f64::MAX / 4.0,
        degrade_at: 0.8,
    };
    let budget = ExtraCost::new(cfg, &c.routes(), Arc::new(SystemClock), None);
    let route = RouteId::new("b", "r", "m");
    let n = 1_000_000u32;
    for threads in [1usize, 2] {
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..n {
                        if let Ok(Some(r)) = budget.reserve(&route, 500, 1000) {
                            r.settle(500, 200);
                        }
                    }
                });
            }
        });
        let per = start.elapsed().as_nanos() as f64 / (f64::from(n) * threads as f64);
        println!("budget reserve+settle, {threads} thread(s): {per:.0} ns per request");
    }
}
