//! `/api/v1/status`'s filters: which routes a status document lists.

use serde::Deserialize;

use crate::route::Route;
use crate::state::State as RouteState;

/// `/api/v1/status`'s query: `?serves=`, `?provider=`, `?state=`, each a comma-separated
/// list of values a route must match one of (all three when given). `overall` still judges
/// every route.
#[derive(Debug, Default, Deserialize)]
pub struct StatusQuery {
    pub serves: Option<String>,
    pub provider: Option<String>,
    pub state: Option<String>,
}

/// Which routes a status document lists; the default lists every route.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatusFilter {
    pub serves: Option<Vec<String>>,
    pub provider: Option<Vec<String>>,
    pub state: Option<Vec<RouteState>>,
}

impl StatusFilter {
    /// Bounds how many values one filter may list.
    pub const MAX_VALUES: usize = 100;

    /// Parses the query; an unknown state name or an empty or overlong list is an error.
    pub fn parse(q: &StatusQuery) -> Result<Self, String> {
        fn list(name: &str, v: &Option<String>) -> Result<Option<Vec<String>>, String> {
            let Some(v) = v else { return Ok(None) };
            let items: Vec<String> = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            if items.is_empty() {
                return Err(format!("?{name}= needs at least one value"));
            }
            if items.len() > StatusFilter::MAX_VALUES {
                return Err(format!(
                    "?{name}= lists {} values; at most {}",
                    items.len(),
                    StatusFilter::MAX_VALUES
                ));
            }
            Ok(Some(items))
        }
        let state = list("state", &q.state)?
            .map(|names| {
                names
                    .iter()
                    .map(|n| {
                        ALL_STATES
                            .into_iter()
                            .find(|s| s.as_str().eq_ignore_ascii_case(n))
                            .ok_or_else(|| {
                                format!(
                                    "unknown state {n:?}; one of UNKNOWN, NORMAL, WARNING, DEGRADED, CRITICAL, SWITCHED"
                                )
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        Ok(Self {
            serves: list("serves", &q.serves)?,
            provider: list("provider", &q.provider)?,
            state,
        })
    }

    pub(super) fn keeps(&self, r: &Route, state: RouteState) -> bool {
        self.serves.as_ref().is_none_or(|v| v.contains(&r.serves))
            && self
                .provider
                .as_ref()
                .is_none_or(|v| v.contains(&r.provider))
            && self.state.as_ref().is_none_or(|v| v.contains(&state))
    }
}

const ALL_STATES: [RouteState; 6] = [
    RouteState::Unknown,
    RouteState::Normal,
    RouteState::Warning,
    RouteState::Degraded,
    RouteState::Critical,
    RouteState::Switched,
];
