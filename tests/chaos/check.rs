//! The invariants, as pure functions over what the run recorded: the once-a-second samples
//! of the monitors, the webhook deliveries, the proxies' answers. Each returns what broke,
//! so the report can print it and the test can fail on it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

/// What the sampler saw at one instant.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Seconds since the run started.
    pub at: f64,
    /// Each monitor's `/readyz` role, `None` while it did not answer.
    pub roles: Vec<Option<String>>,
    /// Some monitor answered `GET /api/v1/weights` with 200.
    pub feed_ok: bool,
    /// The spend-limited client: (spent, reserved, limit), when a proxy answered.
    pub team: Option<(f64, f64, f64)>,
    /// The database was cut off at this instant, or less than `lease + 5 s` ago: nobody can
    /// hold the lease then, so having no leader is expected.
    pub db_excused: bool,
}

#[derive(Debug, Default, PartialEq)]
pub struct Leadership {
    /// Samples where two monitors said `leader`.
    pub two_leaders: Vec<f64>,
    /// The longest stretch without a leader outside database outages, in seconds.
    pub longest_none: f64,
    /// When that stretch began (seconds since the start).
    pub longest_none_from: f64,
    /// The longest stretch without a leader, database outages included.
    pub longest_none_any: f64,
}

/// Longest run of consecutive samples (by time) matching `bad`, measured from its first
/// bad sample to the first good one after it (or the last sample): (its length, its start).
fn longest_run(samples: &[Sample], bad: impl Fn(&Sample) -> bool) -> (f64, f64) {
    let mut best = (0.0f64, 0.0f64);
    let mut start: Option<f64> = None;
    let close = |from: f64, to: f64, best: &mut (f64, f64)| {
        if to - from > best.0 {
            *best = (to - from, from);
        }
    };
    for s in samples {
        match (bad(s), start) {
            (true, None) => start = Some(s.at),
            (false, Some(t)) => {
                close(t, s.at, &mut best);
                start = None;
            }
            _ => {}
        }
    }
    if let (Some(t), Some(last)) = (start, samples.last()) {
        close(t, last.at, &mut best);
    }
    best
}

fn longest(samples: &[Sample], bad: impl Fn(&Sample) -> bool) -> f64 {
    longest_run(samples, bad).0
}

fn leaders(s: &Sample) -> usize {
    s.roles
        .iter()
        .filter(|r| r.as_deref() == Some("leader"))
        .count()
}

pub fn leadership(samples: &[Sample]) -> Leadership {
    let (longest_none, longest_none_from) =
        longest_run(samples, |s| leaders(s) == 0 && !s.db_excused);
    Leadership {
        longest_none,
        longest_none_from,
        two_leaders: samples
            .iter()
            .filter(|s| leaders(s) > 1)
            .map(|s| s.at)
            .collect(),
        longest_none_any: longest(samples, |s| leaders(s) == 0),
    }
}

/// The longest stretch in which no monitor answered the weights feed.
pub fn feed_gap(samples: &[Sample]) -> f64 {
    longest(samples, |s| !s.feed_ok)
}

/// Samples where the client's spend (settled, and settled plus booked) exceeded its limit.
pub fn overspent(samples: &[Sample]) -> Vec<(f64, f64, f64)> {
    samples
        .iter()
        .filter_map(|s| {
            s.team
                .map(|(spent, reserved, limit)| (s.at, spent, reserved, limit))
        })
        .filter(|(_, spent, reserved, limit)| spent + reserved > limit + 1e-9)
        .map(|(at, spent, reserved, _)| (at, spent, reserved))
        .collect()
}

/// One webhook delivery: its `x-probeok-delivery` key and its body.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub key: String,
    pub body: Value,
}

/// Delivery keys received more than once.
pub fn delivered_twice(deliveries: &[Delivery]) -> Vec<(String, usize)> {
    let mut n: BTreeMap<&str, usize> = BTreeMap::new();
    for d in deliveries {
        *n.entry(&d.key).or_default() += 1;
    }
    n.into_iter()
        .filter(|(_, c)| *c > 1)
        .map(|(k, c)| (k.to_owned(), c))
        .collect()
}

/// Routes that a channel was told are in trouble and never told have recovered, although
/// the monitor says they are `NORMAL` at the end: an incident left open on the channel.
/// A route's story on the channel is the `to` of the last state item naming it.
pub fn left_open(deliveries: &[Delivery], normal_at_end: &BTreeSet<String>) -> Vec<String> {
    let mut last: HashMap<String, String> = HashMap::new();
    for d in deliveries {
        for item in d.body["routes"].as_array().into_iter().flatten() {
            let (Some(route), Some(to)) = (item["route"].as_str(), item["to"].as_str()) else {
                continue;
            };
            last.insert(route.to_owned(), to.to_owned());
        }
    }
    let mut open: Vec<String> = last
        .into_iter()
        .filter(|(route, to)| {
            normal_at_end.contains(route) && matches!(to.as_str(), "DEGRADED" | "CRITICAL")
        })
        .map(|(route, _)| route)
        .collect();
    open.sort();
    open
}

/// Lines of the logs that report a panic, with the log's name.
pub fn panics<'a>(logs: impl IntoIterator<Item = (&'a str, String)>) -> Vec<String> {
    logs.into_iter()
        .flat_map(|(name, text)| {
            text.lines()
                .filter(|l| l.contains("panicked"))
                .map(|l| format!("{name}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample(at: f64, roles: [Option<&str>; 2], feed_ok: bool) -> Sample {
        Sample {
            at,
            roles: roles.iter().map(|r| r.map(str::to_owned)).collect(),
            feed_ok,
            ..Sample::default()
        }
    }

    #[test]
    fn leadership_finds_two_leaders_and_the_longest_gap() {
        let s = vec![
            sample(0.0, [Some("leader"), Some("follower")], true),
            sample(1.0, [None, Some("follower")], false),
            sample(2.0, [None, Some("follower")], false),
            sample(3.0, [None, Some("follower")], true),
            sample(4.0, [None, Some("leader")], true),
            sample(5.0, [Some("leader"), Some("leader")], true),
        ];
        let l = leadership(&s);
        assert_eq!(l.two_leaders, vec![5.0]);
        assert_eq!(l.longest_none, 3.0);
        assert_eq!(feed_gap(&s), 2.0);
    }

    #[test]
    fn a_database_outage_excuses_having_no_leader() {
        let mut s = vec![
            sample(0.0, [None, None], true),
            sample(9.0, [None, None], true),
            sample(10.0, [Some("leader"), None], true),
        ];
        s[0].db_excused = true;
        s[1].db_excused = true;
        let l = leadership(&s);
        assert_eq!(l.longest_none, 0.0);
        assert_eq!(l.longest_none_any, 10.0);
    }

    #[test]
    fn spend_over_the_limit_is_found() {
        let a = Sample {
            team: Some((0.004, 0.005, 0.01)),
            ..Default::default()
        };
        let b = Sample {
            at: 1.0,
            team: Some((0.008, 0.003, 0.01)),
            ..Default::default()
        };
        assert_eq!(overspent(&[a, b]), vec![(1.0, 0.008, 0.003)]);
    }

    #[test]
    fn a_message_twice_and_an_incident_left_open_are_found() {
        let d = |key: &str, route: &str, to: &str| Delivery {
            key: key.into(),
            body: json!({"routes": [{"route": route, "to": to}]}),
        };
        let deliveries = vec![
            d("a", "sim/r1/x", "DEGRADED"),
            d("b", "sim/r2/y", "CRITICAL"),
            d("b", "sim/r2/y", "CRITICAL"),
            d("c", "sim/r1/x", "NORMAL"),
        ];
        assert_eq!(delivered_twice(&deliveries), vec![("b".to_owned(), 2)]);
        let normal: BTreeSet<String> = ["sim/r1/x", "sim/r2/y"].map(String::from).into();
        assert_eq!(left_open(&deliveries, &normal), vec!["sim/r2/y".to_owned()]);
    }

    #[test]
    fn panics_are_read_from_the_logs() {
        let logs = vec![
            ("ma", "ok\nthread 'x' panicked at src/a.rs:1:1\n".to_owned()),
            ("mb", "fine\n".to_owned()),
        ];
        assert_eq!(panics(logs).len(), 1);
    }
}
