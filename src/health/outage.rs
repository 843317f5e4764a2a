//! The incidents of one shared cause are one outage: grouped for the incident history (the
//! `/incidents` page and `/api/v1/incidents`). A cause id names a failure class at an
//! endpoint, so it comes back with the next outage of the same kind: incidents of one cause
//! are one outage only while their spans touch.

use chrono::{DateTime, Utc};

use crate::state::{FailureMode, Incident, State};

/// One outage of a shared cause.
#[derive(Debug, Clone, PartialEq)]
pub struct Outage<'a> {
    pub cause: &'a str,
    pub opened_at: DateTime<Utc>,
    /// `None` while one of its incidents is open.
    pub closed_at: Option<DateTime<Utc>>,
    pub peak: State,
    pub failure_mode: Option<FailureMode>,
    pub incidents: Vec<&'a Incident>,
}

/// The outages of shared causes among `list`, oldest first. Incidents without a cause are
/// left out.
pub fn outages(list: &[Incident]) -> Vec<Outage<'_>> {
    let mut with: Vec<&Incident> = list.iter().filter(|i| i.cause.is_some()).collect();
    with.sort_by_key(|i| i.opened_at);
    let mut out: Vec<Outage<'_>> = Vec::new();
    for i in with {
        let cause = i.cause.as_deref().unwrap_or_default();
        // The latest outage of this cause, if this incident opened before it ended.
        let joins = out
            .iter_mut()
            .rev()
            .find(|o| o.cause == cause)
            .filter(|o| match o.closed_at {
                None => true,
                Some(end) => i.opened_at <= end,
            });
        match joins {
            Some(o) => {
                o.closed_at = match (o.closed_at, i.closed_at) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
                o.peak = o.peak.max(i.peak);
                o.failure_mode = o.failure_mode.or(i.failure_mode);
                o.incidents.push(i);
            }
            None => out.push(Outage {
                cause,
                opened_at: i.opened_at,
                closed_at: i.closed_at,
                peak: i.peak,
                failure_mode: i.failure_mode,
                incidents: vec![i],
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::RouteId;

    fn at(min: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + chrono::Duration::minutes(min)
    }

    fn inc(model: &str, cause: Option<&str>, open: i64, close: Option<i64>) -> Incident {
        let route = RouteId::new("acme", "r0", model);
        Incident {
            id: format!("{route}@{open}"),
            route,
            opened_at: at(open),
            closed_at: close.map(at),
            peak: State::Degraded,
            failure_mode: Some(FailureMode::Unavailable),
            transitions: Vec::new(),
            cause: cause.map(str::to_owned),
        }
    }

    #[test]
    fn a_causes_overlapping_incidents_are_one_outage_and_its_next_outage_another() {
        let c = Some("acme/r0:connection_refused");
        let list = vec![
            inc("a", c, 0, Some(10)),
            inc("b", c, 1, Some(12)),
            inc("c", None, 2, Some(3)),
            inc("a", c, 60, None),
            inc("b", c, 61, Some(70)),
        ];
        let o = outages(&list);
        assert_eq!(o.len(), 2);
        assert_eq!((o[0].opened_at, o[0].closed_at), (at(0), Some(at(12))));
        assert_eq!(o[0].incidents.len(), 2);
        assert_eq!((o[1].opened_at, o[1].closed_at), (at(60), None));
        assert_eq!(o[1].incidents.len(), 2);
    }
}
