//! The label sets of `/metrics`' families. Values come only from the config, never from
//! request input, so the series count is bounded by the config.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RouteLabels {
    pub(super) provider: Arc<str>,
    pub(super) region: Arc<str>,
    pub(super) model: Arc<str>,
}

/// A probe family's labels: the route's and the vantage that measured it. Vantages come
/// from the config (`[server] vantage`, `[[vantage]]`), so the series stay bounded.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ProbeLabels {
    pub(super) provider: Arc<str>,
    pub(super) region: Arc<str>,
    pub(super) model: Arc<str>,
    pub(super) vantage: Arc<str>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ProbeResultLabels {
    pub(super) provider: Arc<str>,
    pub(super) region: Arc<str>,
    pub(super) model: Arc<str>,
    pub(super) vantage: Arc<str>,
    pub(super) result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct WeightLabels {
    pub(super) serves: Arc<str>,
    pub(super) provider: Arc<str>,
    pub(super) region: Arc<str>,
    pub(super) model: Arc<str>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct IngestLabels {
    pub(super) result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AlertLabels {
    pub(super) channel: String,
    pub(super) result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TaskLabels {
    pub(super) task: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReloadLabels {
    pub(super) result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BuildLabels {
    pub(super) version: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ProviderLabels {
    pub(super) provider: Arc<str>,
    pub(super) vantage: Arc<str>,
}
