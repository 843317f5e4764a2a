//! Shared causes: routes whose probes fail the same way against the same endpoint are judged
//! together, so a provider-wide outage is judged as fast as one route's and costs a handful of
//! confirmation probes, whatever the number of routes.
//!
//! - A route's latest probe failed with a [`Class`] (connection refused, DNS, TLS, no first
//!   byte, 401/403, 404, 429, 5xx) against its endpoint (provider, region, base URL and key):
//!   it is a member of that endpoint × class's group. Its next probe that succeeds, or fails
//!   otherwise, takes it out; so does silence for two of its intervals. A group is never wider
//!   than its class and endpoint, and a route whose own probe succeeded is never in one.
//! - Confirmation probes are spent on a few members ([`CONFIRMERS`], spread across logical
//!   models); the others ask for none, so a group of 10,000 costs what a group of 3 does.
//! - Once [`CONFIRMED_BY`] members are DEGRADED or worse on their own evidence, the group is
//!   confirmed: every member below DEGRADED is judged DEGRADED on the group's evidence, and
//!   so is every route that joins while it stays confirmed. Recovery is each route's own:
//!   nothing here heals a route.
//!
//! Pure: the shell ([`super::service`]) reports probe results and states, and applies what
//! this returns.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::detector::{Detector, Obs};
use super::route_health::RouteHealth;
use super::{Reason, State, Threshold, Transition};
use crate::probe::outcome::{OutcomeKind, ProbeError, ProbeOutcome};
use crate::route::Route;

/// Members whose confirmation probes are sent, at most, per group.
pub const CONFIRMERS: usize = 3;
/// Members DEGRADED on their own evidence that confirm a group.
pub const CONFIRMED_BY: usize = 2;

/// How a probe failed, as far as routes can share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    ConnectionRefused,
    Dns,
    Tls,
    /// Any other connect failure (reset, unreachable).
    Connect,
    NoFirstByte,
    /// 401 or 403: the key.
    Auth(u16),
    /// 404: the model name.
    NotFound,
    RateLimited,
    /// A 5xx status.
    Server(u16),
}

impl Class {
    /// The class of a probe's failure; `None` for a success, a passive outcome, a failure that
    /// is the request's own, and failures no other route would share the same way (stalls,
    /// timeouts mid-answer, malformed bodies: those differ by model).
    pub fn of(o: &ProbeOutcome) -> Option<Class> {
        if o.kind == OutcomeKind::Passive || o.success || o.attributed_to.is_some() {
            return None;
        }
        Some(match o.error.as_ref()? {
            ProbeError::Connect { message } => {
                let m = message.to_ascii_lowercase();
                if m.contains("refused") {
                    Class::ConnectionRefused
                } else if m.contains("dns") || m.contains("lookup") || m.contains("resolve") {
                    Class::Dns
                } else if ["tls", "ssl", "certificate", "handshake"]
                    .iter()
                    .any(|w| m.contains(w))
                {
                    Class::Tls
                } else {
                    Class::Connect
                }
            }
            ProbeError::TimeoutBeforeFirstByte => Class::NoFirstByte,
            ProbeError::RateLimited { .. } => Class::RateLimited,
            ProbeError::Http { status, .. } => match *status {
                401 | 403 => Class::Auth(*status),
                404 => Class::NotFound,
                s @ 500..=599 => Class::Server(s),
                _ => return None,
            },
            _ => return None,
        })
    }

    /// A stable snake_case code (cause ids, metrics labels).
    pub fn code(self) -> String {
        match self {
            Class::ConnectionRefused => "connection_refused".into(),
            Class::Dns => "dns".into(),
            Class::Tls => "tls".into(),
            Class::Connect => "connect".into(),
            Class::NoFirstByte => "no_first_byte".into(),
            Class::Auth(s) => format!("http_{s}"),
            Class::NotFound => "model_not_found".into(),
            Class::RateLimited => "rate_limited".into(),
            Class::Server(s) => format!("http_{s}"),
        }
    }

    /// What happened, in English (the reason's text starts with it).
    pub fn text(self) -> String {
        match self {
            Class::ConnectionRefused => "connection refused".into(),
            Class::Dns => "DNS failure".into(),
            Class::Tls => "TLS failure".into(),
            Class::Connect => "connect failure".into(),
            Class::NoFirstByte => "no response byte in time".into(),
            Class::Auth(s) => format!("HTTP {s} (key refused)"),
            Class::NotFound => "HTTP 404 (model not found)".into(),
            Class::RateLimited => "HTTP 429 (rate limited)".into(),
            Class::Server(s) => format!("HTTP {s}"),
        }
    }
}

/// Where a route's requests go: routes sharing one fail together.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Endpoint {
    provider: String,
    region: String,
    base_url: String,
    key: Option<String>,
}

/// What the shell needs to judge a route on its group's evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The cause id: `provider/region:class` (plus `:N` when routes of one region differ by
    /// base URL or key).
    pub id: String,
    pub class: Class,
    /// The endpoint's host, as the reason names it.
    pub host: String,
    /// Routes in the group now.
    pub routes: usize,
    /// Members DEGRADED or worse on their own evidence.
    pub confirmed_on: usize,
}

impl Verdict {
    /// The reason's sentence: "connection refused at api.example.com for 9,997 routes,
    /// confirmed on 5".
    pub fn text(&self) -> String {
        format!(
            "{} at {} for {} routes, confirmed on {}",
            self.class.text(),
            self.host,
            thousands(self.routes),
            self.confirmed_on
        )
    }
}

fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One route as the groups see it.
#[derive(Debug, Clone)]
struct Seat {
    endpoint: u32,
    model: u32,
    /// Silence this long takes a member out (two probe intervals).
    window: chrono::Duration,
    member: Option<Member>,
    /// Judged DEGRADED on a group's evidence and not yet out of the incident.
    escalated: bool,
}

#[derive(Debug, Clone, Copy)]
struct Member {
    class: Class,
    last: DateTime<Utc>,
    /// DEGRADED or worse on its own evidence.
    own: bool,
}

#[derive(Debug, Default)]
struct Group {
    members: HashSet<usize>,
    /// Members that were told to send their confirmation probes.
    confirmers: Vec<usize>,
    /// Members per logical model.
    models: HashMap<u32, usize>,
    own: usize,
    /// `own` reached [`CONFIRMED_BY`] (and has not dropped below since).
    confirmed: bool,
}

type Key = (u32, Class);

/// What a probe result changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Routes to judge DEGRADED on their group's evidence (the shell checks each is below
    /// DEGRADED and not suppressed).
    pub judge: Vec<usize>,
    /// Routes whose shown cause changed (a group reached or left two members).
    pub shown: Vec<usize>,
}

/// Every route's group membership; see the module docs.
#[derive(Debug)]
pub struct Causes {
    seats: Vec<Seat>,
    /// Per endpoint: its id prefix and host.
    endpoints: Vec<(String, String)>,
    groups: HashMap<Key, Group>,
}

impl Causes {
    /// Seats for `routes`, indexed as the shell indexes them.
    pub fn new(routes: &[Route]) -> Self {
        let mut endpoints: Vec<Endpoint> = Vec::new();
        let mut index: HashMap<Endpoint, u32> = HashMap::new();
        let mut models: HashMap<&str, u32> = HashMap::new();
        let mut seats = Vec::with_capacity(routes.len());
        for r in routes {
            let e = Endpoint {
                provider: r.provider.clone(),
                region: r.region.clone(),
                base_url: r.base_url.clone(),
                key: r.api_key_env.clone(),
            };
            let n = index.len() as u32;
            let endpoint = *index.entry(e.clone()).or_insert_with(|| {
                endpoints.push(e);
                n
            });
            let m = models.len() as u32;
            let model = *models.entry(r.serves.as_str()).or_insert(m);
            let window = chrono::Duration::from_std(2 * r.probe.interval)
                .unwrap_or(chrono::Duration::minutes(1));
            seats.push(Seat {
                endpoint,
                model,
                window,
                member: None,
                escalated: false,
            });
        }
        // Ids: `provider/region`, numbered only where one region has several endpoints.
        let mut per_region: HashMap<(&str, &str), u32> = HashMap::new();
        for e in &endpoints {
            *per_region.entry((&e.provider, &e.region)).or_default() += 1;
        }
        let mut seen: HashMap<(&str, &str), u32> = HashMap::new();
        let named = endpoints
            .iter()
            .map(|e| {
                let k = (e.provider.as_str(), e.region.as_str());
                let n = seen.entry(k).or_default();
                *n += 1;
                let id = if per_region[&k] > 1 {
                    format!("{}/{}#{n}", e.provider, e.region)
                } else {
                    format!("{}/{}", e.provider, e.region)
                };
                (id, host(&e.base_url))
            })
            .collect();
        Causes {
            seats,
            endpoints: named,
            groups: HashMap::new(),
        }
    }

    /// Route `i`'s probe ended with `class` (`None`: it succeeded, or failed in a way no
    /// group shares) at `now`; `own` says whether the route is DEGRADED or worse on its own
    /// evidence after it.
    pub fn observe(
        &mut self,
        i: usize,
        class: Option<Class>,
        own: bool,
        now: DateTime<Utc>,
    ) -> Changes {
        let mut changes = Changes::default();
        let Some(seat) = self.seats.get(i) else {
            return changes;
        };
        let endpoint = seat.endpoint;
        let same = seat.member.is_some_and(|m| Some(m.class) == class);
        if !same {
            self.leave(i, &mut changes);
        }
        let Some(class) = class else {
            return changes;
        };
        let key = (endpoint, class);
        let model = self.seats[i].model;
        let group = self.groups.entry(key).or_default();
        let seat = &mut self.seats[i];
        match &mut seat.member {
            Some(m) => {
                m.last = now;
                if m.own != own {
                    m.own = own;
                    if own {
                        group.own += 1;
                    } else {
                        group.own -= 1;
                        group.confirmed &= group.own >= CONFIRMED_BY;
                    }
                }
            }
            None => {
                seat.member = Some(Member {
                    class,
                    last: now,
                    own,
                });
                group.members.insert(i);
                *group.models.entry(model).or_default() += 1;
                group.own += usize::from(own);
                match group.members.len() {
                    // The group is now shown on its first member too.
                    2 => changes.shown.extend(group.members.iter().copied()),
                    n if n > 2 => changes.shown.push(i),
                    _ => {}
                }
            }
        }
        let was = group.confirmed;
        group.confirmed = group.own >= CONFIRMED_BY;
        let seats = &self.seats;
        let pending = |j: &usize| {
            let s = &seats[*j];
            !s.escalated && !s.member.is_some_and(|m| m.own)
        };
        if group.confirmed && !was {
            // Just confirmed: every member not yet judged.
            changes
                .judge
                .extend(group.members.iter().copied().filter(pending));
        } else if group.confirmed && pending(&i) {
            changes.judge.push(i);
        }
        changes
    }

    /// Whether route `i` (just observed) should send the confirmation probe its detector asks
    /// for: yes outside a group, and for a group's few confirmers.
    pub fn wants_confirmation(&mut self, i: usize) -> bool {
        let Some(seat) = self.seats.get(i) else {
            return true;
        };
        let Some(m) = seat.member else {
            return true;
        };
        let model = seat.model;
        let Some(group) = self.groups.get_mut(&(seat.endpoint, m.class)) else {
            return true;
        };
        if group.confirmers.contains(&i) {
            return true;
        }
        if group.confirmers.len() >= CONFIRMERS {
            return false;
        }
        let seats = &self.seats;
        let covered = group
            .confirmers
            .iter()
            .any(|&c| seats.get(c).is_some_and(|s| s.model == model));
        // One per logical model first; a second of a model only when every model has one.
        if covered && group.confirmers.len() < group.models.len() {
            return false;
        }
        group.confirmers.push(i);
        true
    }

    /// Route `i` was judged DEGRADED on its group's evidence.
    pub fn escalated(&mut self, i: usize) {
        if let Some(s) = self.seats.get_mut(i) {
            s.escalated = true;
        }
    }

    /// Whether route `i`'s incident state came from a group.
    pub fn is_escalated(&self, i: usize) -> bool {
        self.seats.get(i).is_some_and(|s| s.escalated)
    }

    /// Route `i` left its incident (recovered): a later one is its own again.
    pub fn recovered(&mut self, i: usize) {
        if let Some(s) = self.seats.get_mut(i) {
            s.escalated = false;
        }
    }

    /// Takes out members silent for longer than their window; returns routes whose shown
    /// cause changed.
    pub fn expire(&mut self, now: DateTime<Utc>) -> Vec<usize> {
        let stale: Vec<usize> = self
            .seats
            .iter()
            .enumerate()
            .filter(|(_, s)| s.member.is_some_and(|m| now - m.last > s.window))
            .map(|(i, _)| i)
            .collect();
        let mut changes = Changes::default();
        for i in stale {
            self.leave(i, &mut changes);
        }
        changes.shown
    }

    /// The cause id route `i` is shown with: its group's while the group has two members or
    /// more.
    pub fn cause_of(&self, i: usize) -> Option<String> {
        let s = self.seats.get(i)?;
        let m = s.member?;
        let g = self.groups.get(&(s.endpoint, m.class))?;
        (g.members.len() >= 2).then(|| self.id(s.endpoint, m.class))
    }

    /// The group evidence to judge route `i` by, while its group is confirmed.
    pub fn verdict(&self, i: usize) -> Option<Verdict> {
        let s = self.seats.get(i)?;
        let m = s.member?;
        let g = self.groups.get(&(s.endpoint, m.class))?;
        (g.own >= CONFIRMED_BY).then(|| Verdict {
            id: self.id(s.endpoint, m.class),
            class: m.class,
            host: self.endpoints[s.endpoint as usize].1.clone(),
            routes: g.members.len(),
            confirmed_on: g.own,
        })
    }

    /// Groups of two routes or more, with their sizes (the metric).
    pub fn sizes(&self) -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = self
            .groups
            .iter()
            .filter(|(_, g)| g.members.len() >= 2)
            .map(|(&(e, c), g)| (self.id(e, c), g.members.len()))
            .collect();
        v.sort();
        v
    }

    fn id(&self, endpoint: u32, class: Class) -> String {
        format!("{}:{}", self.endpoints[endpoint as usize].0, class.code())
    }

    fn leave(&mut self, i: usize, changes: &mut Changes) {
        let Some(seat) = self.seats.get_mut(i) else {
            return;
        };
        let Some(m) = seat.member.take() else {
            return;
        };
        let key = (seat.endpoint, m.class);
        let model = seat.model;
        let Some(group) = self.groups.get_mut(&key) else {
            return;
        };
        group.members.remove(&i);
        group.confirmers.retain(|&c| c != i);
        group.own -= usize::from(m.own);
        group.confirmed &= group.own >= CONFIRMED_BY;
        if let Some(n) = group.models.get_mut(&model) {
            *n -= 1;
            if *n == 0 {
                group.models.remove(&model);
            }
        }
        match group.members.len() {
            0 => {
                self.groups.remove(&key);
            }
            // The last member alone is no shared cause any more.
            1 => changes.shown.extend(group.members.iter().copied()),
            _ => {}
        }
        changes.shown.push(i);
    }
}

impl Detector {
    /// Judges route `h` DEGRADED on its group's evidence ([`Verdict`]); `None` when it is
    /// already DEGRADED or worse. Its incident, failure mode and the time rules after it are
    /// the same as for a route that got there alone.
    pub fn judge_by_cause(
        &self,
        h: &mut RouteHealth,
        v: &Verdict,
        now: DateTime<Utc>,
    ) -> Option<Transition> {
        if h.state().is_incident() {
            return None;
        }
        let rate = self.rate(h, now);
        let thresholds = vec![
            Threshold {
                name: "cause_routes".into(),
                observed: v.routes as f64,
                limit: 2.0,
            },
            Threshold {
                name: "cause_confirmed_on".into(),
                observed: v.confirmed_on as f64,
                limit: CONFIRMED_BY as f64,
            },
        ];
        let ev = self.evidence(h, &Obs::default(), &rate, thresholds);
        let reason = Reason::new("shared_cause", v.text());
        let t = self.transition(h, State::Degraded, reason, ev, now);
        note_cause(h, &v.id);
        Some(t)
    }
}

/// Marks route `h`'s open incident as part of cause `id` (a route that confirmed the cause on
/// its own evidence is part of the same outage); `true` when that changed it.
pub fn note_cause(h: &mut RouteHealth, id: &str) -> bool {
    match h.incident.as_mut() {
        Some(i) if i.cause.is_none() => {
            i.cause = Some(id.to_owned());
            true
        }
        _ => false,
    }
}

/// "connection refused at api.example.com for 9,997 routes, confirmed on 5" in parts.
pub fn parts(detail: &str) -> Option<(&str, &str, &str, &str)> {
    let (class, rest) = detail.split_once(" at ")?;
    let (host, rest) = rest.split_once(" for ")?;
    let (routes, on) = rest.split_once(" routes, confirmed on ")?;
    Some((class, host, routes, on))
}

/// A shared cause's failure class in Chinese (the English one when it has no translation).
pub fn class_zh(class: &str) -> String {
    match class {
        "connection refused" => "连接被拒绝".into(),
        "DNS failure" => "域名解析失败".into(),
        "TLS failure" => "TLS 握手失败".into(),
        "connect failure" => "连接失败".into(),
        "no response byte in time" => "在首字节超时内没有响应".into(),
        "HTTP 404 (model not found)" => "返回 HTTP 404（模型不存在）".into(),
        "HTTP 429 (rate limited)" => "返回 HTTP 429（被限流）".into(),
        c if c.ends_with(" (key refused)") => {
            format!("返回 {}（密钥被拒）", c.trim_end_matches(" (key refused)"))
        }
        c => format!("返回 {c}"),
    }
}

/// The host (and port) of a base URL, without scheme, credentials, path or query.
fn host(base_url: &str) -> String {
    let rest = base_url.split("://").nth(1).unwrap_or(base_url);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    authority.rsplit('@').next().unwrap_or(authority).to_owned()
}

#[cfg(test)]
mod tests;
