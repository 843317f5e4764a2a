//! `[[provider.status_page]]`: a provider's own status page, read by the monitor's leader so
//! that what the provider declares (component states, incidents) is shown beside what
//! probeok measures, and the lead time between the two is kept (see `docs/provider-word.md`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::raw::RawStatusPage;
use super::validate::Checker;
use super::Config;

/// The page's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum StatusPageKind {
    /// Atlassian Statuspage's public v2 JSON (`/api/v2/summary.json`, `/api/v2/incidents.json`).
    #[serde(rename = "statuspage")]
    Statuspage,
    /// An RSS 2.0 or Atom incident feed (incident.io, Instatus, Better Stack, Statuspage's
    /// `history.atom`): incidents only, no component states.
    #[serde(rename = "feed")]
    Feed,
}

impl StatusPageKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StatusPageKind::Statuspage => "statuspage",
            StatusPageKind::Feed => "feed",
        }
    }
}

/// One provider status page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusPageConfig {
    /// The `[[provider]]` it belongs to.
    pub provider: String,
    pub kind: StatusPageKind,
    /// `statuspage`: the page's base URL (`https://status.example.com`); `feed`: the feed's URL.
    pub url: String,
    /// Their component name → our route globs (`provider/region/model`, `*` and `?`).
    pub components: BTreeMap<String, Vec<String>>,
    /// How often the page is read; default 60 s, at least 10 s.
    pub every: Duration,
    /// Raise `provider_declared` when the provider declares trouble on a mapped component
    /// while every route it maps to is NORMAL by our own probes. On by default.
    pub alert: bool,
}

/// The default and smallest poll period: a status page is a shared public resource.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(60);
pub const MIN_EVERY: Duration = Duration::from_secs(10);

pub(super) fn status_pages(
    ck: &mut Checker<'_>,
    provider_index: usize,
    provider: &str,
    raw: Vec<RawStatusPage>,
) -> Vec<StatusPageConfig> {
    raw.into_iter()
        .enumerate()
        .map(|(j, s)| {
            let at = format!("provider[{provider_index}].status_page[{j}]");
            let every =
                super::convert::duration(ck, &format!("{at}.every"), s.every, DEFAULT_EVERY);
            if every < MIN_EVERY {
                ck.fail(
                    format!("{at}.every"),
                    format!(
                        "must be at least {} (a status page is polled, not hammered)",
                        humantime::format_duration(MIN_EVERY)
                    ),
                );
            }
            StatusPageConfig {
                provider: provider.to_owned(),
                kind: s.kind,
                url: s.url.trim_end_matches('/').to_owned(),
                components: s.components,
                every: every.max(MIN_EVERY),
                alert: s.alert.unwrap_or(true),
            }
        })
        .collect()
}

/// URLs, at least one component, every glob matching a route of its own provider.
pub(super) fn check(ck: &mut Checker<'_>, c: &Config) {
    let routes = c.routes();
    for (i, p) in c.providers.iter().enumerate() {
        for (j, s) in p.status_pages.iter().enumerate() {
            let at = format!("provider[{i}].status_page[{j}]");
            ck.url(&format!("{at}.url"), &s.url, true);
            if s.components.is_empty() {
                ck.error(
                    format!("{at}.components"),
                    "must map at least one of the page's component names to route globs",
                );
            }
            for (name, globs) in &s.components {
                if globs.is_empty() {
                    ck.error(
                        format!("{at}.components"),
                        format!("{name:?} maps to no route glob"),
                    );
                }
                for g in globs {
                    let mut own = routes.iter().filter(|r| r.id.split().0 == p.id);
                    if !own.any(|r| crate::glob::glob_match(g, r.id.as_str())) {
                        ck.error(
                            format!("{at}.components"),
                            format!("{name:?}: {g:?} matches no route of provider {:?}", p.id),
                        );
                    }
                }
            }
        }
    }
}
