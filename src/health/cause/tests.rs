use chrono::TimeZone;

use super::*;
use crate::config::Config;

/// Provider `p`: region `a` (models m0..m5, two routes each via two keys) and region `b`.
fn routes(extra: &str) -> Vec<Route> {
    let mut src = String::from(
        "[probe]\ninterval = \"30s\"\n\n[[provider]]\nid = \"p\"\nkind = \"openai\"\n\
         [[provider.region]]\nid = \"a\"\nbase_url = \"https://api.a.example.com/v1\"\n\
         [[provider.region]]\nid = \"b\"\nbase_url = \"https://api.b.example.com/v1\"\n",
    );
    for i in 0..6 {
        src.push_str(&format!(
            "\n[[route]]\nprovider = \"p\"\nregion = \"a\"\nmodel = \"m{i}\"\nserves = \"chat-{i}\"\n"
        ));
    }
    src.push_str(
        "\n[[route]]\nprovider = \"p\"\nregion = \"b\"\nmodel = \"m0\"\nserves = \"chat-0\"\n",
    );
    src.push_str(extra);
    Config::parse(&src, "t.toml").unwrap().config.routes()
}

fn t(s: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap() + chrono::Duration::seconds(s)
}

fn failed(error: ProbeError) -> ProbeOutcome {
    ProbeOutcome {
        route: crate::route::RouteId::new("p", "a", "m0"),
        kind: OutcomeKind::Probe,
        started_at: t(0),
        success: false,
        attributed_to: None,
        verified: None,
        ttfb_ms: None,
        ttft_ms: None,
        first_answer_ms: None,
        total_ms: 3.0,
        output_tokens: None,
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: error.status(),
        error: Some(error),
        answer: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

const REFUSED: Option<Class> = Some(Class::ConnectionRefused);

#[test]
fn failures_are_classed_by_what_routes_can_share() {
    let connect = |m: &str| Class::of(&failed(ProbeError::Connect { message: m.into() }));
    assert_eq!(
        connect("error sending request: client error (Connect): tcp connect error: Connection refused (os error 111)"),
        REFUSED
    );
    assert_eq!(
        connect("dns error: failed to lookup address information"),
        Some(Class::Dns)
    );
    assert_eq!(
        connect("invalid peer certificate: UnknownIssuer"),
        Some(Class::Tls)
    );
    assert_eq!(connect("connection reset by peer"), Some(Class::Connect));
    let http = |s: u16| {
        Class::of(&failed(ProbeError::Http {
            status: s,
            message: String::new(),
        }))
    };
    assert_eq!(http(503), Some(Class::Server(503)));
    assert_eq!(http(401), Some(Class::Auth(401)));
    assert_eq!(http(404), Some(Class::NotFound));
    assert_eq!(http(400), None, "a bad request is the probe's own");
    assert_eq!(Class::of(&failed(ProbeError::Stalled)), None);
    assert_eq!(
        Class::of(&failed(ProbeError::TimeoutBeforeFirstByte)),
        Some(Class::NoFirstByte)
    );
    let mut passive = failed(ProbeError::Stalled);
    passive.kind = OutcomeKind::Passive;
    passive.error = Some(ProbeError::Http {
        status: 503,
        message: String::new(),
    });
    assert_eq!(Class::of(&passive), None, "groups are made of probes");
}

#[test]
fn a_group_is_shown_from_its_second_member_and_named_by_endpoint_and_class() {
    let mut c = Causes::new(&routes(""));
    let first = c.observe(0, REFUSED, false, t(0));
    assert!(first.judge.is_empty());
    assert_eq!(c.cause_of(0), None, "one route failing is no shared cause");
    let second = c.observe(1, REFUSED, false, t(1));
    assert_eq!(second.shown.len(), 2);
    assert_eq!(c.cause_of(0).as_deref(), Some("p/a:connection_refused"));
    assert_eq!(c.cause_of(1), c.cause_of(0));
    // Another region's endpoint, another class: other groups.
    c.observe(6, REFUSED, false, t(1));
    assert_eq!(c.cause_of(6), None);
    c.observe(2, Some(Class::Server(503)), false, t(1));
    assert_eq!(c.cause_of(2), None);
    assert_eq!(c.sizes(), vec![("p/a:connection_refused".to_owned(), 2)]);
}

#[test]
fn confirmations_go_to_a_few_members_across_models() {
    let mut c = Causes::new(&routes(""));
    let mut asked = Vec::new();
    for i in 0..6 {
        c.observe(i, REFUSED, false, t(i as i64));
        if c.wants_confirmation(i) {
            asked.push(i);
        }
    }
    assert_eq!(asked, vec![0, 1, 2], "{CONFIRMERS} confirmers at most");
    // A confirmer keeps confirming; the others never start.
    c.observe(0, REFUSED, false, t(10));
    assert!(c.wants_confirmation(0));
    c.observe(5, REFUSED, false, t(10));
    assert!(!c.wants_confirmation(5));
    // A confirmer that recovers frees its place.
    c.observe(0, None, false, t(11));
    c.observe(5, REFUSED, false, t(12));
    assert!(c.wants_confirmation(5));
}

#[test]
fn two_members_degraded_on_their_own_confirm_the_group_for_the_others() {
    let mut c = Causes::new(&routes(""));
    for i in 0..4 {
        c.observe(i, REFUSED, false, t(0));
    }
    assert!(c.observe(0, REFUSED, true, t(10)).judge.is_empty());
    assert_eq!(
        c.verdict(2),
        None,
        "one member's own evidence is not enough"
    );
    let mut judged = c.observe(1, REFUSED, true, t(10)).judge;
    judged.sort();
    assert_eq!(judged, vec![2, 3]);
    let v = c.verdict(2).unwrap();
    assert_eq!(
        v.text(),
        "connection refused at api.a.example.com for 4 routes, confirmed on 2"
    );
    assert_eq!(v.id, "p/a:connection_refused");
    c.escalated(2);
    c.escalated(3);
    // A repeat failure of a judged member asks for nothing; a newcomer is judged at once.
    assert!(c.observe(2, REFUSED, false, t(20)).judge.is_empty());
    assert_eq!(c.observe(4, REFUSED, false, t(20)).judge, vec![4]);
    // A route that succeeds leaves, whatever its group does.
    c.observe(5, REFUSED, false, t(21));
    c.observe(5, None, false, t(22));
    assert_eq!(c.cause_of(5), None);
    assert_eq!(c.verdict(5), None);
}

#[test]
fn a_group_that_loses_its_confirmation_judges_newcomers_alone_again() {
    let mut c = Causes::new(&routes(""));
    for i in 0..3 {
        c.observe(i, REFUSED, i < 2, t(0));
    }
    assert!(c.verdict(2).is_some());
    c.observe(0, None, false, t(5));
    assert!(c.verdict(2).is_none(), "one own member left");
    assert!(c.observe(3, REFUSED, false, t(6)).judge.is_empty());
    // Confirmed again: everyone pending is judged.
    let mut j = c.observe(4, REFUSED, true, t(7)).judge;
    j.sort();
    assert_eq!(j, vec![2, 3]);
}

#[test]
fn silent_members_expire_after_two_intervals() {
    let mut c = Causes::new(&routes(""));
    c.observe(0, REFUSED, false, t(0));
    c.observe(1, REFUSED, false, t(50));
    assert!(c.expire(t(60)).is_empty());
    let mut shown = c.expire(t(61));
    shown.sort();
    assert_eq!(shown, vec![0, 1], "0 left; 1 is alone now");
    assert_eq!(c.cause_of(1), None);
}

#[test]
fn endpoints_of_one_region_that_differ_by_key_are_numbered() {
    // The config gives one key per provider; routes built otherwise may carry their own.
    let mut rs = routes("");
    let mut other = rs[0].clone();
    other.model = "k".into();
    other.id = crate::route::RouteId::new("p", "a", "k");
    other.api_key_env = Some("OTHER_KEY".into());
    rs.push(other);
    let k = rs.len() - 1;
    let mut c = Causes::new(&rs);
    c.observe(0, REFUSED, false, t(0));
    c.observe(1, REFUSED, false, t(0));
    c.observe(k, REFUSED, false, t(0));
    assert_eq!(c.cause_of(0).as_deref(), Some("p/a#1:connection_refused"));
    assert_eq!(
        c.cause_of(k),
        None,
        "a different key is a different endpoint"
    );
}

#[test]
fn hosts_lose_credentials_paths_and_queries() {
    assert_eq!(
        host("https://user:pw@api.a.example.com/v1?x=1"),
        "api.a.example.com"
    );
    assert_eq!(host("http://127.0.0.1:9/v1"), "127.0.0.1:9");
    assert_eq!(thousands(9997), "9,997");
    assert_eq!(thousands(12), "12");
}
