//! What probing costs, before it is spent (pure): tokens per month and their price, per route,
//! from the route's probe settings — the `PROBE_OK` probe on its interval, the throughput probe
//! on `throughput_every`, confirmation probes at an assumed rate of abnormal outcomes, each
//! declared `tools` / `json_schema` capability at `[capability] every` (`crate::capability`)
//! — and regression sets on their schedule. `check-config` prints it; the status API carries it.
//!
//! Input tokens are the [`super::measure::estimate_tokens`] count of each message plus
//! [`MESSAGE_OVERHEAD`]; output tokens are counted at `max_tokens`, the most a call may use, so
//! the figure is an upper bound (a healthy `PROBE_OK` answer is about 3 tokens).

use std::time::Duration;

use serde::Serialize;

use super::measure::estimate_tokens;
use crate::route::{Price, ProbeSettings, Route};

/// A month, for these figures: 30 days.
pub const MONTH: Duration = Duration::from_secs(30 * 24 * 3600);

/// Confirmation probes assumed per regular probe: on a healthy but jittery day about 3% of a
/// route's probes come out abnormal and call for one more.
pub const CONFIRM_RATE: f64 = 0.03;

/// Tokens a chat template adds around each message (role markers, separators).
pub const MESSAGE_OVERHEAD: u64 = 4;

/// The tokens of one call: its messages' estimate and its `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTokens {
    pub input: u64,
    pub output: u64,
}

impl CallTokens {
    /// A call with these message texts (empty ones are not sent) and `max_tokens`.
    pub fn of<'a>(messages: impl IntoIterator<Item = &'a str>, max_tokens: u32) -> Self {
        let input = messages
            .into_iter()
            .filter(|m| !m.is_empty())
            .map(|m| u64::from(estimate_tokens(m)) + MESSAGE_OVERHEAD)
            .sum();
        Self {
            input,
            output: u64::from(max_tokens),
        }
    }
}

/// A month of one kind of call.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Monthly {
    pub calls: f64,
    pub input_tokens: f64,
    pub output_tokens: f64,
}

impl Monthly {
    /// `calls` calls of `tokens` each.
    pub fn of(calls: f64, tokens: CallTokens) -> Self {
        Self {
            calls,
            input_tokens: calls * tokens.input as f64,
            output_tokens: calls * tokens.output as f64,
        }
    }

    pub fn tokens(&self) -> f64 {
        self.input_tokens + self.output_tokens
    }

    /// At `price` (per million tokens); `None` without a price.
    pub fn cost(&self, price: Option<&Price>) -> Option<f64> {
        price.map(|p| {
            (self.input_tokens * p.input_per_mtok + self.output_tokens * p.output_per_mtok) / 1e6
        })
    }

    fn plus(self, o: Monthly) -> Monthly {
        Monthly {
            calls: self.calls + o.calls,
            input_tokens: self.input_tokens + o.input_tokens,
            output_tokens: self.output_tokens + o.output_tokens,
        }
    }
}

/// How many times something every `every` runs in a month (never: zero).
pub fn per_month(every: Duration) -> f64 {
    if every.is_zero() {
        0.0
    } else {
        MONTH.as_secs_f64() / every.as_secs_f64()
    }
}

/// One route's probing for a month.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ProbeCost {
    pub probes: Monthly,
    pub throughput: Monthly,
    /// Confirmation probes at [`CONFIRM_RATE`] (counted at the `PROBE_OK` probe's tokens).
    pub confirmations: Monthly,
    /// The declared capabilities' probes at `[capability] every` (the quick re-probe after a
    /// failure is not counted: a healthy route has none).
    pub capabilities: Monthly,
    /// The long prompt at `[capability] long_prompt.every` (its quick re-probes not counted).
    pub long_prompt: Monthly,
}

impl ProbeCost {
    pub fn total(&self) -> Monthly {
        self.probes
            .plus(self.throughput)
            .plus(self.confirmations)
            .plus(self.capabilities)
            .plus(self.long_prompt)
    }
}

/// A month of one capability probe every `every`.
pub fn capability_cost(cap: crate::capability::Probed, every: Duration) -> Monthly {
    let texts = crate::capability::wire::input_texts(cap);
    let tokens = CallTokens::of(
        texts.iter().map(String::as_str),
        crate::capability::wire::MAX_TOKENS,
    );
    Monthly::of(per_month(every), tokens)
}

/// A month of the long prompt (`[capability] long_prompt`) every `every`: its `tokens` by our
/// estimate as input, the few output tokens it allows.
pub fn long_prompt_cost(lp: &crate::config::LongPromptConfig) -> Monthly {
    use crate::capability::long_prompt::prompt;
    let tokens = CallTokens {
        input: u64::from(prompt::estimated_tokens(lp.tokens)) + MESSAGE_OVERHEAD,
        output: u64::from(prompt::MAX_TOKENS),
    };
    Monthly::of(per_month(lp.every), tokens)
}

/// The month of probing `route`: [`probe_cost`] of its settings, its declared capabilities at
/// `[capability] every` and the long prompt when `[capability] long_prompt` is set.
pub fn route_cost(route: &Route, capability: &crate::config::CapabilityConfig) -> ProbeCost {
    // An embeddings route: its embeddings probe, no chat capabilities to probe.
    if route.embedding.is_some() {
        return embed_cost(&route.probe);
    }
    let mut c = probe_cost(&route.probe);
    c.capabilities = crate::capability::probed(route)
        .into_iter()
        .fold(Monthly::default(), |m, cap| {
            m.plus(capability_cost(cap, capability.every))
        });
    c.long_prompt = capability
        .long_prompt
        .as_ref()
        .map(long_prompt_cost)
        .unwrap_or_default();
    c
}

/// The month of probing `s` describes.
pub fn probe_cost(s: &ProbeSettings) -> ProbeCost {
    let probe = CallTokens::of([s.system.as_str(), s.user.as_str()], s.max_tokens);
    let throughput = CallTokens::of([s.throughput_prompt.as_str()], s.throughput_max_tokens);
    let probes = per_month(s.interval);
    let confirmations = if s.confirm_after.is_some() {
        probes * CONFIRM_RATE
    } else {
        0.0
    };
    ProbeCost {
        probes: Monthly::of(probes, probe),
        throughput: Monthly::of(per_month(s.throughput_every), throughput),
        confirmations: Monthly::of(confirmations, probe),
        capabilities: Monthly::default(),
        long_prompt: Monthly::default(),
    }
}

/// Tokens one embeddings probe sends: [`super::embed::EMBED_TEXT`] by our estimate (an
/// embeddings call has no chat template and no output tokens).
pub fn embed_tokens() -> CallTokens {
    CallTokens {
        input: u64::from(estimate_tokens(super::embed::EMBED_TEXT)),
        output: 0,
    }
}

/// The month of probing an embeddings route with settings `s`: the embeddings probe on its
/// interval, confirmations at [`CONFIRM_RATE`], no throughput probe.
pub fn embed_cost(s: &ProbeSettings) -> ProbeCost {
    let call = embed_tokens();
    let probes = per_month(s.interval);
    let confirmations = if s.confirm_after.is_some() {
        probes * CONFIRM_RATE
    } else {
        0.0
    };
    ProbeCost {
        probes: Monthly::of(probes, call),
        throughput: Monthly::default(),
        confirmations: Monthly::of(confirmations, call),
        capabilities: Monthly::default(),
        long_prompt: Monthly::default(),
    }
}

/// A month of one regression set on one route: every case on each run.
pub fn set_cost(every: Duration, cases: &[CallTokens]) -> Monthly {
    let runs = per_month(every);
    cases
        .iter()
        .fold(Monthly::default(), |m, c| m.plus(Monthly::of(runs, *c)))
}

/// The status API's `probe_cost` of a route.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeCostView {
    pub tokens_per_month: u64,
    /// `null` when the route has no `price`.
    pub cost_per_month: Option<f64>,
    pub currency: Option<String>,
}

impl ProbeCostView {
    pub fn new(s: &ProbeSettings, price: Option<&Price>) -> Self {
        Self::of(&probe_cost(s), price)
    }

    /// The route's, its declared capabilities' probes included.
    pub fn of_route(route: &Route, capability: &crate::config::CapabilityConfig) -> Self {
        Self::of(&route_cost(route, capability), route.price.as_ref())
    }

    fn of(c: &ProbeCost, price: Option<&Price>) -> Self {
        let m = c.total();
        Self {
            tokens_per_month: m.tokens().round() as u64,
            cost_per_month: m.cost(price).map(|c| (c * 10_000.0).round() / 10_000.0),
            currency: price.map(|p| p.currency.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ProbeSettings {
        let c = crate::config::ProbeConfig::default();
        ProbeSettings {
            interval: Duration::from_secs(30),
            first_byte_timeout: c.first_byte_timeout,
            stall_timeout: c.stall_timeout,
            timeout: c.timeout,
            jitter: c.jitter,
            stream: true,
            max_tokens: 16,
            throughput_every: Duration::from_secs(300),
            throughput_prompt: c.throughput_prompt,
            throughput_max_tokens: 128,
            system: "Reply with exactly: PROBE_OK".into(),
            user: "health check".into(),
            expect: "PROBE_OK".into(),
            confirm_after: Some(Duration::from_secs(5)),
        }
    }

    /// By hand, for the default probe at 30 s and ¥2 / ¥8 per million input / output tokens:
    /// - probe: "Reply with exactly: PROBE_OK" = Reply, with, exactly, `:`, PROBE, `_`, OK =
    ///   7 tokens, "health check" = 2; + 4 per message → 17 in, 16 out = 33 per probe;
    ///   2,592,000 s / 30 s = 86,400 probes → 1,468,800 in + 1,382,400 out.
    /// - confirmations: 3% of 86,400 = 2,592 probes → 44,064 in + 41,472 out.
    /// - throughput: "Count from 1 to 40, separated by single spaces. Reply with the numbers
    ///   only." = 17 + 4 = 21 in, 128 out; 2,592,000 / 300 = 8,640 → 181,440 in + 1,105,920
    ///   out.
    /// - total: 1,694,304 in + 2,529,792 out = 4,224,096 tokens;
    ///   1.694304 × 2 + 2.529792 × 8 = 3.388608 + 20.238336 = ¥23.626944.
    #[test]
    fn the_default_probe_at_30s_matches_the_hand_computation() {
        let s = settings();
        let c = probe_cost(&s);
        assert_eq!(c.probes.calls, 86_400.0);
        assert_eq!(c.probes.input_tokens, 1_468_800.0);
        assert_eq!(c.probes.output_tokens, 1_382_400.0);
        assert!((c.confirmations.calls - 2_592.0).abs() < 1e-6);
        assert_eq!(c.throughput.calls, 8_640.0);
        assert_eq!(c.throughput.input_tokens, 181_440.0);
        assert_eq!(c.throughput.output_tokens, 1_105_920.0);
        let t = c.total();
        assert!((t.tokens() - 4_224_096.0).abs() < 1e-3, "{}", t.tokens());
        let price = Price {
            input_per_mtok: 2.0,
            output_per_mtok: 8.0,
            currency: "CNY".into(),
        };
        let cost = t.cost(Some(&price)).unwrap();
        assert!((cost - 23.626944).abs() < 1e-6, "{cost}");
        let v = ProbeCostView::new(&s, Some(&price));
        assert_eq!(v.tokens_per_month, 4_224_096);
        assert_eq!(v.cost_per_month, Some(23.6269));
        assert_eq!(v.currency.as_deref(), Some("CNY"));
        assert_eq!(ProbeCostView::new(&s, None).cost_per_month, None);
    }

    /// The embeddings probe's text, "probeok embedding reference text", is estimated at 4
    /// tokens (4 words); at the default 30 s interval that is 86,400 calls and 2,592
    /// confirmations a month: 88,992 × 4 = 355,968 input tokens, no output.
    #[test]
    fn an_embeddings_route_costs_its_text_per_call() {
        assert_eq!(
            embed_tokens(),
            CallTokens {
                input: 4,
                output: 0
            }
        );
        let c = embed_cost(&settings());
        assert_eq!(c.probes.calls, 86_400.0);
        assert_eq!(c.throughput, Monthly::default());
        assert!((c.total().input_tokens - 355_968.0).abs() < 1e-3);
        assert_eq!(c.total().output_tokens, 0.0);
    }

    /// A chat route declaring only `stream`.
    fn chat_route(price: Option<Price>) -> Route {
        use crate::route::{Capability, ProviderKind, RouteId, Tier};
        Route {
            id: RouteId::new("openai", "us", "gpt-4o"),
            provider: "openai".into(),
            region: "us".into(),
            model: "gpt-4o".into(),
            kind: ProviderKind::Openai,
            base_url: "http://127.0.0.1:1".into(),
            api_key_env: None,
            serves: "chat".into(),
            tier: Tier::Primary,
            weight: 100,
            price,
            capabilities: vec![Capability::Stream],
            context_window: None,
            residency: None,
            slo: 0.999,
            probe: settings(),
            embedding: None,
        }
    }

    /// A route declaring `tools` and `json_schema`, probed at the default `[capability] every`
    /// (15 min): 2,592,000 s / 900 s = 2,880 probes of each a month, each counted at the
    /// prompt and the tool or schema definition in and `max_tokens` (64) out.
    #[test]
    fn declared_capabilities_are_probed_at_their_cadence() {
        use crate::capability::{wire, Probed};
        use crate::route::Capability;
        let price = Price {
            input_per_mtok: 2.0,
            output_per_mtok: 8.0,
            currency: "CNY".into(),
        };
        let mut route = chat_route(Some(price.clone()));
        let every = crate::config::CapabilityConfig::default();
        assert_eq!(every.every, Duration::from_secs(900));
        // Chat only: nothing added.
        assert_eq!(route_cost(&route, &every), probe_cost(&route.probe));

        route.capabilities = vec![
            Capability::Stream,
            Capability::Tools,
            Capability::JsonSchema,
        ];
        let c = route_cost(&route, &every);
        let tokens = |cap| {
            let t = wire::input_texts(cap);
            CallTokens::of(t.iter().map(String::as_str), wire::MAX_TOKENS)
        };
        let (tools, schema) = (tokens(Probed::Tools), tokens(Probed::JsonSchema));
        assert_eq!((tools.input, tools.output), (TOOLS_IN, 64));
        assert_eq!((schema.input, schema.output), (SCHEMA_IN, 64));
        assert_eq!(c.capabilities.calls, 2.0 * 2_880.0);
        assert_eq!(
            c.capabilities.input_tokens,
            2_880.0 * (TOOLS_IN + SCHEMA_IN) as f64
        );
        assert_eq!(c.capabilities.output_tokens, 2.0 * 2_880.0 * 64.0);
        let added = c.capabilities.cost(Some(&price)).unwrap();
        let by_hand = (2_880.0 * (TOOLS_IN + SCHEMA_IN) as f64 * 2.0 + 5_760.0 * 64.0 * 8.0) / 1e6;
        assert!((added - by_hand).abs() < 1e-9, "{added} vs {by_hand}");
        assert!((added - ADDED_CNY).abs() < 1e-6, "{added}");
        // The total, the status API's view and check-config's table carry it.
        let v = ProbeCostView::of_route(&route, &every);
        let without = ProbeCostView::new(&route.probe, Some(&price));
        assert_eq!(
            v.tokens_per_month - without.tokens_per_month,
            c.capabilities.tokens().round() as u64
        );
        // At a longer cadence, proportionally less.
        let hourly = route_cost(
            &route,
            &crate::config::CapabilityConfig {
                every: Duration::from_secs(3600),
                long_prompt: None,
            },
        );
        assert_eq!(hourly.capabilities.calls, 2.0 * 720.0);
    }

    /// Tokens of the tools probe's prompt and `probe_echo` definition (121), and of the
    /// json_schema probe's prompt and `response_format` (125), as [`CallTokens::of`] estimates
    /// them. A month: 2,880 × (121 + 125) = 708,480 in + 5,760 × 64 = 368,640 out =
    /// 1,077,120 tokens; at ¥2 / ¥8 per million, 1.41696 + 2.94912 = ¥4.36608.
    const TOOLS_IN: u64 = 121;
    const SCHEMA_IN: u64 = 125;
    const ADDED_CNY: f64 = 4.36608;

    /// `long_prompt = { tokens = 8000, every = "24h" }`: 30 probes a month of the long prompt
    /// ([`LONG_IN`] tokens in) and 16 out.
    #[test]
    fn the_long_prompt_daily_at_8000_tokens() {
        let lp = crate::config::LongPromptConfig {
            tokens: 8_000,
            every: Duration::from_secs(24 * 3600),
        };
        let m = long_prompt_cost(&lp);
        assert_eq!(m.calls, 30.0);
        assert_eq!(m.input_tokens, 30.0 * LONG_IN as f64);
        assert_eq!(m.output_tokens, 30.0 * 16.0);
        let price = Price {
            input_per_mtok: 2.0,
            output_per_mtok: 8.0,
            currency: "CNY".into(),
        };
        let cny = m.cost(Some(&price)).unwrap();
        assert!((cny - LONG_CNY).abs() < 1e-9, "{cny}");
        // Off (the key absent): nothing.
        let mut route = chat_route(None);
        let off = route_cost(&route, &crate::config::CapabilityConfig::default());
        assert_eq!(off.long_prompt, Monthly::default());
        let on = route_cost(
            &route,
            &crate::config::CapabilityConfig {
                long_prompt: Some(lp),
                ..Default::default()
            },
        );
        assert_eq!(on.long_prompt, m);
        assert_eq!(on.total().tokens(), off.total().tokens() + m.tokens());
        // Embeddings routes get no long prompt.
        route.embedding = Some(1536);
        let e = route_cost(
            &route,
            &crate::config::CapabilityConfig {
                long_prompt: Some(lp),
                ..Default::default()
            },
        );
        assert_eq!(e.long_prompt, Monthly::default());
    }

    /// 8,007 estimated tokens of prompt + 4 for the message; a month: 30 × 8,011 = 240,330
    /// in + 30 × 16 = 480 out = 240,810 tokens; at ¥2 / ¥8 per million, 0.48066 + 0.00384 =
    /// ¥0.4845.
    const LONG_IN: u64 = 8_011;
    const LONG_CNY: f64 = 0.4845;

    #[test]
    fn off_means_none() {
        let mut s = settings();
        s.confirm_after = None;
        s.throughput_every = Duration::ZERO;
        let c = probe_cost(&s);
        assert_eq!(c.confirmations.calls, 0.0);
        assert_eq!(c.throughput, Monthly::default());
        let m = set_cost(
            Duration::from_secs(24 * 3600),
            &[CallTokens {
                input: 10,
                output: 90,
            }; 2],
        );
        assert_eq!(m.calls, 60.0);
        assert_eq!(m.tokens(), 6_000.0);
    }
}
