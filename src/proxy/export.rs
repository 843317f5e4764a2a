//! The proxy's families on the monitor's `/metrics`, read at scrape time from a
//! [`ProxyStats`] handle (a `prometheus-client` collector: nothing is copied between scrapes):
//!
//! - `probeok_proxy_breaker_state{route}`: 0 closed, 1 half-open, 2 open;
//! - `probeok_proxy_in_flight{route}`, `probeok_proxy_provider_in_flight{provider}`: requests
//!   in flight now (a stream until it ends);
//! - `probeok_proxy_requests_total{serves,route,outcome}`;
//! - `probeok_proxy_failovers_total{reason}`;
//! - `probeok_contract_uses_total{feature,contract}`: degradation contract answers;
//! - `probeok_client_spend{client}`: what each client with a spend limit spent this period;
//! - `probeok_proxy_dropped_total{what}`: metering records (`meter`) and passive outcomes
//!   (`passive`) dropped.
//!
//! Label sets are bounded by the config (routes) and by [`super::meter::MAX_LABEL_SETS`].
//! Before a proxy is attached (or without one) no proxy family is written.

use std::sync::{Arc, OnceLock, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use super::{BreakerSnapshot, BreakerState, CountersSnapshot, Inner, Proxy};

/// A read-only view of a running proxy, for the monitor's `/metrics` and `/api/v1/status`. It
/// holds the proxy weakly: it never keeps the proxy (nor its metering queue) alive, and reads
/// as empty once the proxy is gone.
#[derive(Clone)]
pub struct ProxyStats {
    inner: Weak<Inner>,
}

impl std::fmt::Debug for ProxyStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyStats")
            .field("alive", &(self.inner.strong_count() > 0))
            .finish()
    }
}

impl ProxyStats {
    fn proxy(&self) -> Option<Proxy> {
        self.inner.upgrade().map(Proxy::from_inner)
    }

    /// Every route's breaker (empty once the proxy is gone).
    pub fn breakers(&self) -> Vec<BreakerSnapshot> {
        self.proxy().map(|p| p.breakers()).unwrap_or_default()
    }

    /// Per `[[shadow]]`, the comparison over the last hour and day (empty once the proxy is
    /// gone).
    pub fn shadow_report(&self) -> Vec<serde_json::Value> {
        self.proxy().map(|p| p.shadow_report()).unwrap_or_default()
    }

    /// Spent this period per client with a limit (empty once the proxy is gone).
    pub fn client_spend(&self) -> Vec<(String, f64)> {
        self.proxy().map(|p| p.client_spend()).unwrap_or_default()
    }

    /// Requests in flight per route (empty once the proxy is gone).
    pub fn in_flight(&self) -> Vec<(crate::route::RouteId, u32)> {
        self.proxy().map(|p| p.in_flight()).unwrap_or_default()
    }

    /// Requests in flight per provider (empty once the proxy is gone).
    pub fn provider_in_flight(&self) -> Vec<(String, u32)> {
        self.proxy()
            .map(|p| p.provider_in_flight())
            .unwrap_or_default()
    }

    /// The proxy's counters (empty once the proxy is gone).
    pub fn counters(&self) -> CountersSnapshot {
        self.proxy().map(|p| p.counters()).unwrap_or_default()
    }
}

impl Proxy {
    /// A weak, read-only handle on this proxy's breakers and counters.
    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            inner: Arc::downgrade(&self.inner),
        }
    }
}

/// The `probeok_proxy_breaker_state` value of a breaker's state.
pub fn breaker_value(state: BreakerState) -> i64 {
    match state {
        BreakerState::Closed => 0,
        BreakerState::HalfOpen => 1,
        BreakerState::Open => 2,
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    serves: String,
    route: String,
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContractLabels {
    feature: String,
    contract: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientLabels {
    client: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DroppedLabels {
    what: &'static str,
}

/// Where the monitor's registry finds the proxy, once one runs in-process.
#[derive(Debug, Clone, Default)]
pub struct ProxySlot(Arc<OnceLock<ProxyStats>>);

impl ProxySlot {
    /// Attaches the proxy; a second call is ignored (there is one proxy per process).
    pub fn attach(&self, stats: ProxyStats) {
        let _ = self.0.set(stats);
    }

    pub fn get(&self) -> Option<&ProxyStats> {
        self.0.get()
    }
}

impl Collector for ProxySlot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(stats) = self.get() else {
            return Ok(());
        };
        let breakers = stats.breakers();
        let counters = stats.counters();

        let mut family = encoder.encode_descriptor(
            "proxy_breaker_state",
            "Circuit breaker of the route in the proxy: 0 closed, 1 half-open, 2 open",
            None,
            MetricType::Gauge,
        )?;
        for b in &breakers {
            let labels = RouteLabels {
                route: b.route.as_str().to_owned(),
            };
            ConstGauge::new(breaker_value(b.state)).encode(family.encode_family(&labels)?)?;
        }

        let mut family = encoder.encode_descriptor(
            "proxy_in_flight",
            "Requests the proxy has in flight to the route now (a stream until it ends)",
            None,
            MetricType::Gauge,
        )?;
        for (route, n) in stats.in_flight() {
            let labels = RouteLabels {
                route: route.as_str().to_owned(),
            };
            ConstGauge::new(i64::from(n)).encode(family.encode_family(&labels)?)?;
        }

        let mut family = encoder.encode_descriptor(
            "proxy_provider_in_flight",
            "Requests the proxy has in flight to all of the provider's routes together now",
            None,
            MetricType::Gauge,
        )?;
        for (provider, n) in stats.provider_in_flight() {
            ConstGauge::new(i64::from(n))
                .encode(family.encode_family(&ProviderLabels { provider })?)?;
        }

        let mut family = encoder.encode_descriptor(
            "proxy_requests",
            "Requests the proxy answered, by logical model, answering route and outcome",
            None,
            MetricType::Counter,
        )?;
        for r in &counters.requests {
            let labels = RequestLabels {
                serves: r.serves.clone(),
                route: r.route.clone(),
                outcome: r.outcome.clone(),
            };
            ConstCounter::new(r.value).encode(family.encode_family(&labels)?)?;
        }

        let mut family = encoder.encode_descriptor(
            "proxy_failovers",
            "Times the proxy moved a request off a route, by reason",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in &counters.failovers {
            let labels = ReasonLabels {
                reason: reason.clone(),
            };
            ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
        }

        let mut family = encoder.encode_descriptor(
            "contract_uses",
            "Requests a degradation contract answered, by the contract's feature and behaviour",
            None,
            MetricType::Counter,
        )?;
        for ((feature, contract), n) in &counters.contract_uses {
            let labels = ContractLabels {
                feature: feature.clone(),
                contract: contract.clone(),
            };
            ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
        }

        let mut family = encoder.encode_descriptor(
            "proxy_dropped",
            "Metering records (meter) and passive outcomes (passive) the proxy dropped",
            None,
            MetricType::Counter,
        )?;
        for (what, n) in [
            ("meter", counters.meter_dropped),
            ("passive", counters.passive_dropped),
            ("observed", counters.observed_dropped),
        ] {
            ConstCounter::new(n).encode(family.encode_family(&DroppedLabels { what })?)?;
        }

        let spend = stats.client_spend();
        if !spend.is_empty() {
            let mut family = encoder.encode_descriptor(
                "client_spend",
                "Spent by the proxy client in its current limit period, in the routes' price currency (the shared ledger as this process last read it)",
                None,
                MetricType::Gauge,
            )?;
            for (client, spent) in spend {
                ConstGauge::new(spent).encode(family.encode_family(&ClientLabels { client })?)?;
            }
        }
        Ok(())
    }
}
