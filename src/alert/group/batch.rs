//! Alerts with a firing state of their own about several routes of one provider, gathered
//! into one message. When a provider fails, every one of its routes burns its error budget,
//! answers 401 or drifts at once: one page per route would bury the one message that matters
//! (and, behind a robot taking 20 a minute, hold it up for hours).
//!
//! Pure. A gathered message ([`Subject::Grouped`]) keeps each route's own firing-state key
//! (`burn:<route>`, `route_fault:<route>`, `drift:<finding>`): each route resolves alone, and an
//! incident tool's trigger closes with its last route ([`crate::alert::announced`]).

use std::collections::BTreeMap;

use crate::alert::burn::BurnAlert;
use crate::alert::render::key_digest;
use crate::alert::{Member, Message, Severity, Status, Subject};
use crate::route::RouteId;

/// The kind of a message that can be gathered (`burn_rate`, `route_fault`, `drift`) and the
/// route it is about.
pub fn batchable(m: &Message) -> Option<(&'static str, &RouteId)> {
    if !m.items.is_empty() {
        return None;
    }
    match &m.subject {
        Subject::BurnRate(b) => Some(("burn_rate", &b.route)),
        Subject::RouteFault { route, .. } => Some(("route_fault", route)),
        Subject::Drift(d) => Some(("drift", &d.route)),
        _ => None,
    }
}

/// Messages of one kind, provider, status and severity → one message naming their routes; a
/// lone message stays as it was. Each out message comes with its pieces' keys and extras, in
/// route order. `pieces` must be [`batchable`]; others are passed through alone.
pub fn batch<T>(pieces: Vec<(Message, String, T)>) -> Vec<(Message, Vec<(String, T)>)> {
    type Bucket<T> = Vec<(Message, String, T)>;
    let mut buckets: BTreeMap<(&'static str, String, bool, Severity), Bucket<T>> = BTreeMap::new();
    let mut out = Vec::new();
    for (m, key, extra) in pieces {
        let Some((kind, route)) = batchable(&m) else {
            out.push((m, vec![(key, extra)]));
            continue;
        };
        let provider = route.split().0.to_owned();
        let resolved = m.status == Status::Resolved;
        let sev = m.severity;
        buckets
            .entry((kind, provider, resolved, sev))
            .or_default()
            .push((m, key, extra));
    }
    for ((kind, provider, _, severity), mut pieces) in buckets {
        if pieces.len() == 1 {
            if let Some((m, key, extra)) = pieces.pop() {
                out.push((m, vec![(key, extra)]));
            }
            continue;
        }
        pieces.sort_by(|a, b| {
            let ra = batchable(&a.0).map(|x| x.1.clone());
            let rb = batchable(&b.0).map(|x| x.1.clone());
            ra.cmp(&rb)
        });
        let status = pieces[0].0.status;
        let at = pieces.iter().map(|p| p.0.at).max().unwrap_or_default();
        let keys: Vec<String> = pieces.iter().map(|p| p.1.clone()).collect();
        let tag = match (status, kind, severity) {
            (Status::Resolved, _, _) => "resolved",
            (_, "burn_rate", Severity::Critical) => "page",
            (_, "burn_rate", _) => "ticket",
            _ => "firing",
        };
        let mut related = Vec::new();
        let mut members = Vec::new();
        let mut extras = Vec::new();
        for (m, key, extra) in pieces {
            related.extend(m.related);
            members.push(Member {
                key: key.clone(),
                subject: m.subject,
            });
            extras.push((key, extra));
        }
        related.sort();
        related.dedup();
        let message = Message {
            // Stable per provider and kind before the `@` (an incident tool's key), unique
            // per set of routes and moment after it (the outbox's).
            key: format!(
                "{kind}:{provider}:{tag}@{}.{}",
                at.timestamp_millis(),
                key_digest(&keys.join("\n"))
            ),
            severity,
            status,
            subject: Subject::Grouped {
                provider,
                kind: kind.to_owned(),
                members,
            },
            at,
            items: Vec::new(),
            related,
            note: None,
            resolves: None,
        };
        out.push((message, extras));
    }
    out
}

/// `m` (a [`Subject::Grouped`]) over the routes `keep` accepts; `None` when none is kept.
pub fn restrict(m: &Message, keep: impl Fn(&RouteId) -> bool) -> Option<Message> {
    let Subject::Grouped {
        provider,
        kind,
        members,
    } = &m.subject
    else {
        return m.routes().into_iter().any(keep).then(|| m.clone());
    };
    let kept: Vec<Member> = members
        .iter()
        .filter(|x| x.route().is_some_and(&keep))
        .cloned()
        .collect();
    if kept.is_empty() {
        return None;
    }
    Some(Message {
        related: m.related.iter().filter(|r| keep(r)).cloned().collect(),
        subject: Subject::Grouped {
            provider: provider.clone(),
            kind: kind.clone(),
            members: kept,
        },
        ..m.clone()
    })
}

/// The burn-rate alert `m` holds for `route`: its own, or its member's in a gathered page.
pub fn burn_of(m: &Message, route: &RouteId) -> Option<BurnAlert> {
    match &m.subject {
        Subject::BurnRate(b) if b.route == *route => Some(b.clone()),
        Subject::Grouped { members, .. } => members.iter().find_map(|x| match &x.subject {
            Subject::BurnRate(b) if b.route == *route => Some(b.clone()),
            _ => None,
        }),
        _ => None,
    }
}

/// The route a gathered message's member `key` is about.
pub fn member_route<'m>(m: &'m Message, key: &str) -> Option<&'m RouteId> {
    match &m.subject {
        Subject::Grouped { members, .. } => members
            .iter()
            .find(|x| x.key == key)
            .and_then(Member::route),
        _ => None,
    }
}

/// The firing-state keys a message opens or closes, as far as the message itself says: its
/// routes' incidents, a gathered message's members, and a keyed alert's key (its message key
/// without the moment and the firing/resolved tag). Empty when it cannot tell.
pub fn state_keys(m: &Message) -> Vec<String> {
    if !m.items.is_empty() {
        return m
            .items
            .iter()
            .filter_map(|i| i.incident_id.as_ref().map(|id| format!("incident:{id}")))
            .collect();
    }
    match &m.subject {
        Subject::Grouped { members, .. } => members.iter().map(|x| x.key.clone()).collect(),
        Subject::BurnRate(b) => vec![format!("burn:{}", b.route)],
        Subject::RouteFault { route, .. } => vec![super::route_fault_key(route)],
        Subject::Heartbeat { job, .. } => vec![format!("heartbeat:{job}")],
        Subject::Egress { .. } => vec!["egress".to_owned()],
        Subject::Drift(_) => {
            // `drift:<finding>:<open|resolved>@<ms>`
            let k = m.key.split('@').next().unwrap_or_default();
            k.rsplit_once(':')
                .map(|(k, _)| vec![k.to_owned()])
                .unwrap_or_default()
        }
        Subject::VantageStale { .. }
        | Subject::SyncFailed { .. }
        | Subject::ProviderDeclared { .. }
        | Subject::RateLimitLow { .. }
        | Subject::ModelWithdrawn { .. } => {
            // `<state key>@<ms>` firing, `<state key>:resolved@<ms>` resolved.
            let k = m.key.split('@').next().unwrap_or_default();
            vec![k.strip_suffix(":resolved").unwrap_or(k).to_owned()]
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::burn::BurnAlert;

    fn burn(route: &str, page: bool, status: Status) -> (Message, String, ()) {
        let route = RouteId::parse(route).unwrap();
        let m = Message {
            key: format!("burn:{route}:x@0"),
            severity: if page {
                Severity::Critical
            } else {
                Severity::Warning
            },
            status,
            subject: Subject::BurnRate(BurnAlert {
                route: route.clone(),
                page,
                slo: 0.999,
                factor: 14.4,
                burn_long: 20.0,
                burn_short: 30.0,
                long_window_s: 3600,
                short_window_s: 300,
                failures: 12,
                total: 60,
            }),
            at: chrono::DateTime::UNIX_EPOCH,
            items: Vec::new(),
            related: vec![route.clone()],
            note: None,
            resolves: None,
        };
        (m, format!("burn:{route}"), ())
    }

    #[test]
    fn one_message_per_provider_kind_and_severity() {
        let mut pieces: Vec<_> = (0..100)
            .map(|i| burn(&format!("qwen/cn/m{i:03}"), true, Status::Firing))
            .collect();
        pieces.push(burn("qwen/cn/t", false, Status::Firing));
        pieces.push(burn("kimi/cn/a", true, Status::Firing));
        pieces.push(burn("qwen/cn/r", true, Status::Resolved));
        let out = batch(pieces);
        assert_eq!(out.len(), 4);
        let big = out.iter().find(|(_, k)| k.len() == 100).unwrap();
        assert_eq!(big.0.related.len(), 100);
        assert_eq!(big.0.severity, Severity::Critical);
        assert!(
            big.0.key.starts_with("burn_rate:qwen:page@"),
            "{}",
            big.0.key
        );
        let m = &big.0;
        assert_eq!(
            member_route(m, "burn:qwen/cn/m007").map(RouteId::as_str),
            Some("qwen/cn/m007")
        );
        assert!(burn_of(m, &RouteId::parse("qwen/cn/m042").unwrap()).is_some());
        assert_eq!(state_keys(m).len(), 100);
        let one = restrict(m, |r| r.as_str().ends_with('1')).unwrap();
        assert_eq!(state_keys(&one).len(), 10);
        assert!(restrict(m, |_| false).is_none());
    }
}
