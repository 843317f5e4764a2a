//! What other tasks keep and the monitor's surfaces read through [`Metrics`]: detection's
//! baseline warm-up, the status pages' board and lead histogram, the `[[sync]]` gateways,
//! the rate-limit headroom.

use prometheus_client::metrics::histogram::Histogram;

use super::Metrics;

impl Metrics {
    /// Detection's baseline warm-up, shown by `/readyz`. The first call wins.
    pub fn attach_warm(&self, warm: crate::health::service::WarmProgress) {
        let _ = self.warm.set(warm);
    }

    /// (baselines warm, routes) while detection's baselines still warm from the history.
    pub fn warming(&self) -> Option<(usize, usize)> {
        self.warm
            .get()
            .map(|w| w.get())
            .filter(|(done, total)| done < total)
    }

    /// The status pages' board, shown by `/api/v1/status` and the pages. The first call wins.
    pub fn attach_declared(&self, board: crate::declared::DeclaredBoard) {
        let _ = self.declared.set(board);
    }

    /// What providers declare, when status pages are configured.
    pub fn declared(&self) -> Option<&crate::declared::DeclaredBoard> {
        self.declared.get()
    }

    /// The lead-time histogram the status pages' task observes into.
    pub fn incident_lead(&self) -> Histogram {
        self.incident_lead.clone()
    }

    /// The `[[sync]]` gateways' board, shown by `/api/v1/status`. The first call wins.
    pub fn attach_sync(&self, board: crate::sync::SyncBoard) {
        let _ = self.sync.set(board);
    }

    /// Every `[[sync]]` gateway's state; empty without one.
    pub fn sync(&self) -> Vec<crate::sync::GatewayStatus> {
        self.sync
            .get()
            .map(|b| b.snapshot().as_ref().clone())
            .unwrap_or_default()
    }

    /// Detection's rate-limit board, for `/metrics` and `/api/v1/status`. The first call wins.
    pub fn attach_headroom(&self, board: crate::health::Headroom) {
        self.headroom.attach(board);
    }

    /// Every route's latest rate-limit readings; empty without detection in this process.
    pub fn headroom(&self) -> crate::web::headroom::Readings {
        self.headroom.readings()
    }
}

/// `probeok_cause_routes`' label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub(super) struct CauseLabels {
    cause: String,
}

impl Metrics {
    /// Routes per shared cause; causes come and go, so only the current ones are exported.
    pub(super) fn set_causes(&self, health: &crate::health::HealthSnapshot) {
        self.cause_routes.clear();
        for cause in health.routes.iter().filter_map(|s| s.cause.clone()) {
            self.cause_routes
                .get_or_create(&CauseLabels { cause })
                .inc();
        }
    }
}
