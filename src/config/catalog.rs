//! `[catalog]` and `route.retires`: how often the leader reads each provider region's model
//! list, and the dates providers announced a routed model retires (see `crate::catalog`).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::NaiveDate;

use super::raw::{RawCatalog, RawRoute};
use super::validate::Checker;
use crate::route::RouteId;

/// The shortest `[catalog] every`: a model list changes over days; reading it more often only
/// spends the provider's rate limit.
pub const MIN_EVERY: Duration = Duration::from_secs(60);
/// The longest: two answers without a model are needed before it is called withdrawn, so
/// longer than a day would warn after the 404s began.
pub const MAX_EVERY: Duration = Duration::from_secs(24 * 3600);

/// `[catalog]` with the routes' `retires` dates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogConfig {
    /// How often each provider region's model list is read.
    pub every: Duration,
    /// `route.retires`: the day a route's model goes away, as its provider announced it.
    pub retires: BTreeMap<RouteId, NaiveDate>,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        Self {
            every: Duration::from_secs(3600),
            retires: BTreeMap::new(),
        }
    }
}

/// `[catalog]` and every route's `retires`, located errors for a bad duration or date.
pub(super) fn catalog(ck: &mut Checker<'_>, raw: RawCatalog, routes: &[RawRoute]) -> CatalogConfig {
    let d = CatalogConfig::default();
    let every = super::convert::duration(ck, "catalog.every", raw.every, d.every);
    if !(MIN_EVERY..=MAX_EVERY).contains(&every) {
        ck.fail(
            "catalog.every",
            format!(
                "must be between 1m and 24h, got {}",
                humantime::format_duration(every)
            ),
        );
    }
    let mut retires = BTreeMap::new();
    for (i, r) in routes.iter().enumerate() {
        let Some(s) = &r.retires else { continue };
        match parse_date(s) {
            Some(date) => {
                retires.insert(RouteId::new(&r.provider, &r.region, &r.model), date);
            }
            None => ck.fail(
                format!("route[{i}].retires"),
                format!("invalid date {s:?}: write the day as YYYY-MM-DD, e.g. \"2026-06-30\""),
            ),
        }
    }
    CatalogConfig { every, retires }
}

/// Exactly `YYYY-MM-DD` (chrono alone would also take `2026-6-3`).
fn parse_date(s: &str) -> Option<NaiveDate> {
    let b = s.as_bytes();
    let shaped = b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
    if !shaped {
        return None;
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d").ok()
}

#[cfg(test)]
mod tests {
    use super::parse_date;

    #[test]
    fn dates_are_whole_iso_days() {
        assert_eq!(
            parse_date("2026-06-30"),
            chrono::NaiveDate::from_ymd_opt(2026, 6, 30)
        );
        for bad in [
            "2026-6-30",
            "2026-02-30",
            "30/06/2026",
            "2026-06-30T00:00",
            "",
        ] {
            assert_eq!(parse_date(bad), None, "{bad}");
        }
    }
}
