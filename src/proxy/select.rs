//! Choosing the candidates for one request: pure, over the routes, the weights view, which
//! routes are resting after a 429, and an injected RNG.
//!
//! Order of decisions (constraints first, preferences second):
//! 1. the logical model's `openai` routes (none → `model_not_found`);
//! 2. only those that can do what the request cannot do without — streaming, tools,
//!    `response_format` json_schema, image inputs (`vision`), a context window that holds the
//!    estimated prompt plus the requested output, the residency tag the request demands;
//! 3. routes resting until their `Retry-After` are left out;
//! 4. a weighted random order among the routes with a traffic share, then the remaining usable
//!    routes by tier (primary, backup, fallback), state and configured weight;
//! 5. last, the routes judged CRITICAL or switched away, least bad first: tried only when every
//!    other one failed within this request. The verdict can be behind the upstream (a route
//!    that came back while the monitor restarted), and the alternative is a certain error.
//!
//! When every weight of the model is 0 (`all_unhealthy`), every remaining route is tried, least
//! bad first, and the answer says `x-probeok-mode: degraded`.

use std::sync::Arc;

use rand::Rng;
use serde_json::Value;

use super::weights::WeightsView;
use crate::route::{Capability, ProviderKind, Route, RouteId, Tier};

/// What a request needs from a route.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    pub stream: bool,
    pub tools: bool,
    pub json_schema: bool,
    pub vision: bool,
    /// Estimated prompt tokens plus the requested output (`max_tokens` /
    /// `max_completion_tokens`), compared with `context_window`.
    pub context_tokens: u32,
    /// `x-probeok-residency`: only routes with this tag.
    pub residency: Option<String>,
}

impl Needs {
    /// Reads the needs off a chat completion request body.
    pub fn from_request(body: &Value, residency: Option<&str>) -> Self {
        let messages = body.get("messages").and_then(Value::as_array);
        let vision = messages.is_some_and(|ms| {
            ms.iter().any(|m| {
                m.get("content")
                    .and_then(Value::as_array)
                    .is_some_and(|parts| parts.iter().any(is_image_part))
            })
        });
        let non_empty = |k: &str| match body.get(k) {
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Null) | None => false,
            Some(_) => true,
        };
        let output = ["max_completion_tokens", "max_tokens"]
            .iter()
            .find_map(|k| body.get(*k).and_then(Value::as_u64))
            .unwrap_or(0);
        let prompt = estimate_prompt_tokens(body);
        Self {
            stream: body.get("stream").and_then(Value::as_bool) == Some(true),
            tools: non_empty("tools") || non_empty("functions"),
            json_schema: body
                .get("response_format")
                .and_then(|f| f.get("type"))
                .and_then(Value::as_str)
                == Some("json_schema"),
            vision,
            context_tokens: u32::try_from(prompt.saturating_add(output)).unwrap_or(u32::MAX),
            residency: residency
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        }
    }

    /// What `route` lacks of these needs (empty: it can serve the request).
    pub fn missing(&self, route: &Route) -> Vec<&'static str> {
        let has = |c: Capability| route.capabilities.contains(&c);
        let mut out = Vec::new();
        if self.stream && !has(Capability::Stream) {
            out.push("stream");
        }
        if self.tools && !has(Capability::Tools) {
            out.push("tools");
        }
        if self.json_schema && !has(Capability::JsonSchema) {
            out.push("json_schema");
        }
        if self.vision && !has(Capability::Vision) {
            out.push("vision");
        }
        if route
            .context_window
            .is_some_and(|cw| self.context_tokens > cw)
        {
            out.push("context_window");
        }
        if let Some(tag) = &self.residency {
            if route.residency.as_deref() != Some(tag.as_str()) {
                out.push("residency");
            }
        }
        out
    }
}

fn is_image_part(part: &Value) -> bool {
    matches!(
        part.get("type").and_then(Value::as_str),
        Some("image_url" | "input_image" | "image")
    )
}

/// A deliberately simple prompt-size estimate: CJK characters count one token each, other
/// characters a quarter (about four characters per token in English text), plus a few tokens
/// per message and 85 per image part. Tool definitions count by their JSON text.
pub fn estimate_prompt_tokens(body: &Value) -> u64 {
    fn text_units(s: &str) -> (u64, u64) {
        s.chars().fold((0, 0), |(cjk, other), c| {
            if is_cjk(c) {
                (cjk + 1, other)
            } else {
                (cjk, other + 1)
            }
        })
    }
    let (mut cjk, mut other, mut fixed) = (0u64, 0u64, 0u64);
    let mut add = |s: &str| {
        let (c, o) = text_units(s);
        cjk += c;
        other += o;
    };
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        fixed += 4;
        match m.get("content") {
            Some(Value::String(s)) => add(s),
            Some(Value::Array(parts)) => {
                for p in parts {
                    if is_image_part(p) {
                        fixed += 85;
                    } else if let Some(t) = p.get("text").and_then(Value::as_str) {
                        add(t);
                    }
                }
            }
            _ => {}
        }
        if let Some(calls) = m.get("tool_calls") {
            add(&calls.to_string());
        }
    }
    if let Some(tools) = body.get("tools") {
        add(&tools.to_string());
    }
    // An embeddings request's texts.
    match body.get("input") {
        Some(Value::String(s)) => add(s),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).for_each(&mut add),
        _ => {}
    }
    cjk + other.div_ceil(4) + fixed
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x2E80..=0x9FFF | 0xAC00..=0xD7AF | 0xF900..=0xFAFF | 0xFF00..=0xFFEF | 0x20000..=0x2FFFF)
}

/// The ordered candidates for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub candidates: Vec<Arc<Route>>,
    /// Every weight of the model is 0: least bad first, `x-probeok-mode: degraded`.
    pub degraded: bool,
    /// Capable routes left out because they rest after a 429.
    pub resting: Vec<RouteId>,
}

/// Why no candidate could be chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// No `openai` route serves this logical model.
    UnknownModel,
    /// Routes exist, but none can serve this request; what the routes lacked, deduplicated.
    NoCapableRoute { missing: Vec<&'static str> },
    /// Every capable route rests after a 429.
    AllResting,
}

/// The logical models the proxy serves (those with at least one `openai` route), sorted.
pub fn logical_models(routes: &[Arc<Route>]) -> Vec<String> {
    let mut out: Vec<String> = routes
        .iter()
        .filter(|r| r.kind == ProviderKind::Openai)
        .map(|r| r.serves.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Chooses and orders the candidates (see the module docs).
pub fn plan(
    serves: &str,
    needs: &Needs,
    routes: &[Arc<Route>],
    view: &WeightsView,
    is_resting: impl Fn(&RouteId) -> bool,
    rng: &mut impl Rng,
) -> Result<Plan, Rejection> {
    let served: Vec<&Arc<Route>> = routes
        .iter()
        .filter(|r| r.kind == ProviderKind::Openai && r.serves == serves)
        .collect();
    if served.is_empty() {
        return Err(Rejection::UnknownModel);
    }
    let mut lacking: Vec<&'static str> = Vec::new();
    let capable: Vec<&Arc<Route>> = served
        .into_iter()
        .filter(|r| {
            let missing = needs.missing(r);
            for m in &missing {
                if !lacking.contains(m) {
                    lacking.push(m);
                }
            }
            missing.is_empty()
        })
        .collect();
    if capable.is_empty() {
        return Err(Rejection::NoCapableRoute { missing: lacking });
    }
    let (awake, resting): (Vec<&Arc<Route>>, Vec<&Arc<Route>>) =
        capable.into_iter().partition(|r| !is_resting(&r.id));
    let resting: Vec<RouteId> = resting.into_iter().map(|r| r.id.clone()).collect();
    if awake.is_empty() {
        return Err(Rejection::AllResting);
    }

    let model = view.models.get(serves);
    // (route, weight, usable, badness); a route the feed does not list yet counts with its
    // configured weight if it is a primary, as in `WeightsView::from_config`.
    let scored: Vec<(&Arc<Route>, u32, bool, u8)> = awake
        .iter()
        .map(
            |r| match model.and_then(|m| m.routes.iter().find(|w| w.route == r.id)) {
                Some(w) => (*r, u32::from(w.weight), w.usable(), w.badness()),
                None if model.is_none() => {
                    let w = if r.tier == Tier::Primary { r.weight } else { 0 };
                    (*r, u32::from(w), true, 1)
                }
                None => (*r, 0, true, 1),
            },
        )
        .collect();
    let flagged = model.is_some_and(|m| m.all_unhealthy);
    let any_share = scored.iter().any(|(_, w, usable, _)| *w > 0 && *usable);
    let any_usable = scored.iter().any(|(_, _, usable, _)| *usable);
    let degraded = flagged || (!any_share && !any_usable);

    let mut candidates: Vec<Arc<Route>> = Vec::with_capacity(scored.len());
    if degraded {
        let mut all = scored;
        all.sort_by_key(|(r, _, _, bad)| (*bad, r.tier, std::cmp::Reverse(r.weight)));
        candidates.extend(all.into_iter().map(|(r, ..)| r.clone()));
    } else {
        let (usable, mut last): (Vec<_>, Vec<_>) =
            scored.into_iter().partition(|(_, _, usable, _)| *usable);
        let (mut share, rest): (Vec<_>, Vec<_>) =
            usable.into_iter().partition(|(_, w, _, _)| *w > 0);
        // Weighted random order without replacement.
        while !share.is_empty() {
            let total: u32 = share.iter().map(|(_, w, _, _)| *w).sum();
            let mut pick = rng.gen_range(0..total);
            let idx = share
                .iter()
                .position(|(_, w, _, _)| {
                    if pick < *w {
                        true
                    } else {
                        pick -= *w;
                        false
                    }
                })
                .unwrap_or(0);
            candidates.push(share.remove(idx).0.clone());
        }
        let mut rest = rest;
        rest.sort_by_key(|(r, _, _, bad)| (r.tier, *bad, std::cmp::Reverse(r.weight)));
        candidates.extend(rest.into_iter().map(|(r, ..)| r.clone()));
        last.sort_by_key(|(r, _, _, bad)| (*bad, r.tier, std::cmp::Reverse(r.weight)));
        candidates.extend(last.into_iter().map(|(r, ..)| r.clone()));
    }
    Ok(Plan {
        candidates,
        degraded,
        resting,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::weights::{ModelWeights, RouteWeight};
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use serde_json::json;

    fn route(id: &str, serves: &str, tier: Tier, weight: u8, caps: &[Capability]) -> Arc<Route> {
        let config = crate::config::Config::default();
        let rc = crate::config::RouteConfig::default();
        Arc::new(Route {
            id: RouteId::new(id, "r", id),
            provider: id.into(),
            region: "r".into(),
            model: id.into(),
            kind: ProviderKind::Openai,
            base_url: "http://127.0.0.1:1".into(),
            api_key_env: None,
            serves: serves.into(),
            tier,
            weight,
            price: None,
            capabilities: caps.to_vec(),
            context_window: None,
            embedding: None,
            residency: None,
            slo: 0.999,
            probe: config.probe_settings(&rc),
        })
    }

    fn ids(p: &Plan) -> Vec<&str> {
        p.candidates.iter().map(|r| r.provider.as_str()).collect()
    }

    fn rng() -> StdRng {
        StdRng::seed_from_u64(7)
    }

    #[test]
    fn needs_are_read_from_the_request() {
        let body = json!({"model":"m","stream":true,"tools":[{"type":"function"}],
            "response_format":{"type":"json_schema","json_schema":{}},
            "max_tokens": 100,
            "messages":[{"role":"user","content":[{"type":"text","text":"看图"},{"type":"image_url","image_url":{"url":"x"}}]}]});
        let n = Needs::from_request(&body, Some("cn"));
        assert!(n.stream && n.tools && n.json_schema && n.vision);
        assert_eq!(n.residency.as_deref(), Some("cn"));
        assert!(n.context_tokens >= 100 + 85 + 2, "{n:?}");
        let plain =
            Needs::from_request(&json!({"messages":[{"role":"user","content":"hi"}]}), None);
        assert_eq!(
            plain,
            Needs {
                context_tokens: 5,
                ..Needs::default()
            }
        );
    }

    #[test]
    fn cjk_counts_one_token_per_character() {
        let zh = json!({"messages":[{"role":"user","content":"你好世界你好世界"}]});
        let en = json!({"messages":[{"role":"user","content":"abcdefgh"}]});
        assert_eq!(estimate_prompt_tokens(&zh), 8 + 4);
        assert_eq!(estimate_prompt_tokens(&en), 2 + 4);
    }

    #[test]
    fn unknown_model_and_capability_filtering() {
        let routes = vec![
            route("a", "chat", Tier::Primary, 50, &[Capability::Stream]),
            route(
                "b",
                "chat",
                Tier::Backup,
                50,
                &[Capability::Stream, Capability::Tools],
            ),
        ];
        let view =
            WeightsView::from_config(&routes.iter().map(|r| (**r).clone()).collect::<Vec<_>>());
        let none = |_: &RouteId| false;
        assert_eq!(
            plan("nope", &Needs::default(), &routes, &view, none, &mut rng()),
            Err(Rejection::UnknownModel)
        );
        let tools = Needs {
            tools: true,
            ..Needs::default()
        };
        let p = plan("chat", &tools, &routes, &view, none, &mut rng()).unwrap();
        assert_eq!(ids(&p), vec!["b"]);
        let vision = Needs {
            vision: true,
            ..Needs::default()
        };
        assert_eq!(
            plan("chat", &vision, &routes, &view, none, &mut rng()),
            Err(Rejection::NoCapableRoute {
                missing: vec!["vision"]
            })
        );
        let mut small = (*routes[0]).clone();
        small.context_window = Some(10);
        let routes2 = vec![Arc::new(small), routes[1].clone()];
        let big = Needs {
            context_tokens: 11,
            ..Needs::default()
        };
        let p = plan("chat", &big, &routes2, &view, none, &mut rng()).unwrap();
        assert_eq!(ids(&p), vec!["b"]);
    }

    #[test]
    fn weighted_share_then_tiers_and_resting_left_out() {
        let routes = vec![
            route("fb", "chat", Tier::Fallback, 100, &[Capability::Stream]),
            route("p1", "chat", Tier::Primary, 90, &[Capability::Stream]),
            route("p2", "chat", Tier::Primary, 10, &[Capability::Stream]),
            route("bk", "chat", Tier::Backup, 100, &[Capability::Stream]),
        ];
        let view =
            WeightsView::from_config(&routes.iter().map(|r| (**r).clone()).collect::<Vec<_>>());
        let mut first_p1 = 0;
        let mut r = rng();
        for _ in 0..1000 {
            let p = plan("chat", &Needs::default(), &routes, &view, |_| false, &mut r).unwrap();
            assert!(!p.degraded);
            assert_eq!(&ids(&p)[2..], &["bk", "fb"]);
            if ids(&p)[0] == "p1" {
                first_p1 += 1;
            }
        }
        assert!((850..950).contains(&first_p1), "{first_p1}");
        let p = plan(
            "chat",
            &Needs::default(),
            &routes,
            &view,
            |id| id.as_str().starts_with("p1/"),
            &mut rng(),
        )
        .unwrap();
        assert_eq!(ids(&p), vec!["p2", "bk", "fb"]);
        assert_eq!(p.resting, vec![routes[1].id.clone()]);
        assert_eq!(
            plan(
                "chat",
                &Needs::default(),
                &routes,
                &view,
                |_| true,
                &mut rng()
            ),
            Err(Rejection::AllResting)
        );
    }

    #[test]
    fn all_unhealthy_tries_the_least_bad_and_is_degraded() {
        let routes = vec![
            route("p1", "chat", Tier::Primary, 50, &[Capability::Stream]),
            route("p2", "chat", Tier::Primary, 50, &[Capability::Stream]),
        ];
        let w = |r: &Arc<Route>, state: &str| RouteWeight {
            route: r.id.clone(),
            provider: r.provider.clone(),
            region: r.region.clone(),
            model: r.model.clone(),
            tier: r.tier,
            weight: 0,
            state: state.into(),
            reason: Value::Null,
        };
        let mut view = WeightsView::default();
        view.models.insert(
            "chat".into(),
            ModelWeights {
                routes: vec![w(&routes[0], "CRITICAL"), w(&routes[1], "DEGRADED")],
                all_unhealthy: true,
            },
        );
        let p = plan(
            "chat",
            &Needs::default(),
            &routes,
            &view,
            |_| false,
            &mut rng(),
        )
        .unwrap();
        assert!(p.degraded);
        assert_eq!(ids(&p), vec!["p2", "p1"]);
    }

    /// A route judged CRITICAL is no candidate while others carry the traffic, but it is
    /// the last resort before an error: the share route first, then the backup, then it.
    #[test]
    fn critical_routes_come_last_not_never() {
        let routes = vec![
            route("p1", "chat", Tier::Primary, 50, &[Capability::Stream]),
            route("p2", "chat", Tier::Primary, 50, &[Capability::Stream]),
            route("bk", "chat", Tier::Backup, 100, &[Capability::Stream]),
        ];
        let w = |r: &Arc<Route>, weight: u8, state: &str| RouteWeight {
            route: r.id.clone(),
            provider: r.provider.clone(),
            region: r.region.clone(),
            model: r.model.clone(),
            tier: r.tier,
            weight,
            state: state.into(),
            reason: Value::Null,
        };
        let mut view = WeightsView::default();
        view.models.insert(
            "chat".into(),
            ModelWeights {
                routes: vec![
                    w(&routes[0], 0, "CRITICAL"),
                    w(&routes[1], 100, "DEGRADED"),
                    w(&routes[2], 0, "NORMAL"),
                ],
                all_unhealthy: false,
            },
        );
        let p = plan(
            "chat",
            &Needs::default(),
            &routes,
            &view,
            |_| false,
            &mut rng(),
        )
        .unwrap();
        assert!(!p.degraded);
        assert_eq!(ids(&p), vec!["p2", "bk", "p1"]);
    }

    #[test]
    fn only_openai_routes() {
        let mut a = (*route("a", "chat", Tier::Primary, 50, &[Capability::Stream])).clone();
        a.kind = ProviderKind::Anthropic;
        let routes = vec![Arc::new(a)];
        assert_eq!(logical_models(&routes), Vec::<String>::new());
        assert_eq!(
            plan(
                "chat",
                &Needs::default(),
                &routes,
                &WeightsView::default(),
                |_| false,
                &mut rng()
            ),
            Err(Rejection::UnknownModel)
        );
    }
}
