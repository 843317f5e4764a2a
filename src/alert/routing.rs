//! Which channel gets what (pure): `routes` globs per channel and who is @-mentioned.
//!
//! A channel with `routes` gets only messages about matching routes, and a grouped message is
//! regrouped over the routes it owns — it never lists a route of another team. Cross-route
//! alerts (our own egress, a stale heartbeat, the cost budget) and messages about no route go
//! to channels without a filter and to filtered ones that opt in with `"*"`.

use std::borrow::Cow;

use super::{group, Message, Status, Subject};
use crate::config::Mention;
use crate::glob::glob_match;
use crate::route::RouteId;

/// Alerts about the monitor or the whole fleet rather than particular routes.
pub fn is_cross_route(m: &Message) -> bool {
    matches!(
        m.subject,
        Subject::Egress { .. }
            | Subject::Heartbeat { .. }
            | Subject::ExtraCost { .. }
            | Subject::VantageStale { .. }
            | Subject::SyncFailed { .. }
    )
}

/// Whether `route` is one of the channel's (`globs` empty: every route).
pub fn owns(globs: &[String], route: &RouteId) -> bool {
    globs.is_empty() || globs.iter().any(|g| glob_match(g, route.as_str()))
}

/// `m` as a channel with `globs` sees it: unchanged, restricted to its routes (regrouped, with
/// its own key), or `None` when none of it is the channel's. `alert test` reaches every channel.
pub fn for_channel<'a>(m: &'a Message, globs: &[String]) -> Option<Cow<'a, Message>> {
    if globs.is_empty() || m.status == Status::Test {
        return Some(Cow::Borrowed(m));
    }
    let everything = globs.iter().any(|g| g == "*");
    let keep = |r: &RouteId| owns(globs, r);
    if is_cross_route(m) {
        return everything.then_some(Cow::Borrowed(m));
    }
    if !m.items.is_empty() {
        if m.items.iter().all(|i| keep(&i.route)) {
            return Some(Cow::Borrowed(m));
        }
        return group::restrict(m, keep).map(Cow::Owned);
    }
    if m.related.is_empty() {
        return everything.then_some(Cow::Borrowed(m));
    }
    if matches!(m.subject, Subject::Grouped { .. }) {
        if m.related.iter().all(keep) {
            return Some(Cow::Borrowed(m));
        }
        return group::batch::restrict(m, keep).map(Cow::Owned);
    }
    m.related.iter().any(keep).then_some(Cow::Borrowed(m))
}

/// Who to mention on `m`, if anyone: from the mention's severity up, on resolved messages only
/// when asked, never on `alert test`.
pub fn mention_for<'a>(mention: Option<&'a Mention>, m: &Message) -> Option<&'a Mention> {
    let mention = mention?;
    let wanted = match m.status {
        Status::Test => false,
        Status::Resolved => mention.resolved,
        Status::Firing | Status::Reminder => true,
    };
    (wanted && m.severity >= mention.min_severity).then_some(mention)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::{RouteItem, Severity};
    use crate::health::State;

    fn item(model: &str, to: State) -> RouteItem {
        RouteItem {
            route: RouteId::new(model.split('-').next().unwrap_or(model), "cn", model),
            serves: Vec::new(),
            from: State::Normal,
            to,
            at: chrono::DateTime::UNIX_EPOCH,
            reason_code: String::new(),
            reason_text: String::new(),
            failure_mode: None,
            evidence: None,
            incident_id: Some(format!("{model}@0")),
            opened_at: None,
            closed_at: None,
            peak: None,
            shifted: None,
            path: Vec::new(),
            cause: None,
        }
    }

    fn provider(items: Vec<RouteItem>) -> Message {
        Message {
            key: "provider:qwen:firing:x".into(),
            severity: Severity::Critical,
            status: Status::Firing,
            subject: Subject::Provider {
                provider: "qwen".into(),
            },
            at: chrono::DateTime::UNIX_EPOCH,
            items,
            related: Vec::new(),
            note: None,
            resolves: None,
        }
    }

    #[test]
    fn a_group_is_regrouped_over_the_routes_a_channel_owns() {
        let m = provider(vec![
            item("qwen-max", State::Critical),
            item("qwen-plus", State::Critical),
            item("qwen-turbo", State::Degraded),
        ]);
        let all = for_channel(&m, &[]).unwrap();
        assert!(matches!(all, Cow::Borrowed(_)));
        let two = for_channel(&m, &["*-max".into(), "*-plus".into()]).unwrap();
        assert_eq!(two.items.len(), 2);
        assert_ne!(two.key, m.key, "a restricted group has its own key");
        let one = for_channel(&m, &["*turbo".into()]).unwrap();
        assert_eq!(one.subject, Subject::Route);
        assert_eq!(one.severity, Severity::Warning, "its own route's severity");
        assert_eq!(one.items[0].route.as_str(), "qwen/cn/qwen-turbo");
        assert!(for_channel(&m, &["deepseek/*".into()]).is_none());
    }

    #[test]
    fn cross_route_alerts_need_a_star() {
        let mut m = provider(Vec::new());
        m.subject = Subject::Heartbeat {
            job: "scheduler".into(),
            silent_s: 300,
        };
        assert!(for_channel(&m, &[]).is_some());
        assert!(for_channel(&m, &["qwen/*".into()]).is_none());
        assert!(for_channel(&m, &["qwen/*".into(), "*".into()]).is_some());
        m.status = Status::Test;
        assert!(for_channel(&m, &["qwen/*".into()]).is_some());
    }

    #[test]
    fn a_low_rate_limit_goes_to_the_channels_owning_its_route() {
        let mut m = provider(Vec::new());
        let route = RouteId::new("qwen", "cn", "qwen-max");
        m.subject = Subject::RateLimitLow {
            route: route.clone(),
            limit: "tokens".into(),
        };
        m.related = vec![route];
        assert!(!is_cross_route(&m), "one route's, not the fleet's");
        assert!(for_channel(&m, &[]).is_some());
        assert!(for_channel(&m, &["qwen/*".into()]).is_some());
        assert!(for_channel(&m, &["deepseek/*".into()]).is_none());
    }

    #[test]
    fn mentions_from_their_severity_up_and_not_on_resolved() {
        let mention = Mention {
            mobiles: vec!["13800138000".into()],
            ..Mention::default()
        };
        let mut m = provider(Vec::new());
        assert!(mention_for(Some(&mention), &m).is_some());
        m.severity = Severity::Warning;
        assert!(mention_for(Some(&mention), &m).is_none());
        m.severity = Severity::Critical;
        m.status = Status::Resolved;
        assert!(mention_for(Some(&mention), &m).is_none());
        let asked = Mention {
            resolved: true,
            ..mention.clone()
        };
        assert!(mention_for(Some(&asked), &m).is_some());
        m.status = Status::Test;
        assert!(mention_for(Some(&asked), &m).is_none());
        assert!(mention_for(None, &m).is_none());
    }
}
