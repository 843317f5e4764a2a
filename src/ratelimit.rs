//! Rate-limit headroom as the providers announce it on every answer, read from the response
//! headers (pure). An account's limits are shared by every caller of the key, so the
//! remaining share tells how close the next 429 is before it comes.
//!
//! The documented headers (`docs/http-api.md` has the table):
//!
//! - OpenAI-compatible: `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`,
//!   `x-ratelimit-limit-tokens`, `x-ratelimit-remaining-tokens`.
//! - Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining}`.
//!
//! Values are read defensively, since a gateway in between may send anything: only plain
//! decimal integers of at most [`MAX_DIGITS`] digits and at most [`MAX_VALUE`] count (text,
//! signs, fractions and `-1` placeholders are ignored); a limit of 0 is ignored (there is no
//! share of nothing); a `remaining` above its `limit` is clamped to the limit. A limit counts
//! only when both its figures are there.

use serde::{Deserialize, Serialize};

/// Longest figure read; anything longer is not a count.
pub const MAX_DIGITS: usize = 16;
/// Largest count taken as meant (10¹⁵ tokens a minute is no real account).
pub const MAX_VALUE: u64 = 1_000_000_000_000_000;

/// Which limit a figure is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    Requests,
    Tokens,
    InputTokens,
    OutputTokens,
}

impl Limit {
    pub const ALL: [Limit; 4] = [
        Limit::Requests,
        Limit::Tokens,
        Limit::InputTokens,
        Limit::OutputTokens,
    ];

    /// The name in the API, the metric label and the alert: `requests`, `tokens`,
    /// `input_tokens`, `output_tokens`.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Requests => "requests",
            Limit::Tokens => "tokens",
            Limit::InputTokens => "input_tokens",
            Limit::OutputTokens => "output_tokens",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.as_str() == s)
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The OpenAI-compatible header names (`limit`, `remaining`), where that family has one.
    fn openai_headers(self) -> Option<(&'static str, &'static str)> {
        match self {
            Limit::Requests => Some((
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
            )),
            Limit::Tokens => Some(("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens")),
            Limit::InputTokens | Limit::OutputTokens => None,
        }
    }

    /// Anthropic's header names (`limit`, `remaining`).
    fn anthropic_headers(self) -> (&'static str, &'static str) {
        match self {
            Limit::Requests => (
                "anthropic-ratelimit-requests-limit",
                "anthropic-ratelimit-requests-remaining",
            ),
            Limit::Tokens => (
                "anthropic-ratelimit-tokens-limit",
                "anthropic-ratelimit-tokens-remaining",
            ),
            Limit::InputTokens => (
                "anthropic-ratelimit-input-tokens-limit",
                "anthropic-ratelimit-input-tokens-remaining",
            ),
            Limit::OutputTokens => (
                "anthropic-ratelimit-output-tokens-limit",
                "anthropic-ratelimit-output-tokens-remaining",
            ),
        }
    }
}

/// One limit's figures: how much of `limit` is `remaining` in the current window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    pub remaining: u64,
    pub limit: u64,
}

impl Quota {
    /// A quota from two counts: `None` for a limit of 0 or past [`MAX_VALUE`]; `remaining`
    /// clamped to `limit`.
    pub fn new(remaining: u64, limit: u64) -> Option<Self> {
        (limit > 0 && limit <= MAX_VALUE).then(|| Self {
            remaining: remaining.min(limit),
            limit,
        })
    }

    /// The remaining share, 0 to 1.
    pub fn ratio(self) -> f64 {
        self.remaining as f64 / self.limit as f64
    }
}

/// What one answer said of the account's limits; only the limits it named are set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<Quota>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Quota>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<Quota>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<Quota>,
}

impl RateLimits {
    pub fn get(&self, limit: Limit) -> Option<Quota> {
        self.slots()[limit.index()]
    }

    fn slots(&self) -> [Option<Quota>; 4] {
        [
            self.requests,
            self.tokens,
            self.input_tokens,
            self.output_tokens,
        ]
    }

    fn set(&mut self, limit: Limit, q: Option<Quota>) {
        let slot = match limit {
            Limit::Requests => &mut self.requests,
            Limit::Tokens => &mut self.tokens,
            Limit::InputTokens => &mut self.input_tokens,
            Limit::OutputTokens => &mut self.output_tokens,
        };
        *slot = q;
    }

    /// The limits present, in [`Limit::ALL`]'s order.
    pub fn iter(&self) -> impl Iterator<Item = (Limit, Quota)> + '_ {
        Limit::ALL
            .into_iter()
            .filter_map(|l| self.get(l).map(|q| (l, q)))
    }

    pub fn is_empty(&self) -> bool {
        self.slots().iter().all(Option::is_none)
    }

    /// The same figures held to [`Quota::new`]'s rules (for figures that arrive as JSON from
    /// another process); `None` when nothing is left.
    pub fn sanitized(&self) -> Option<Self> {
        let mut out = Self::default();
        for (l, q) in self.iter() {
            out.set(l, Quota::new(q.remaining, q.limit));
        }
        (!out.is_empty()).then_some(out)
    }

    /// Reads both header families through `header` (a case-insensitive lookup of one header's
    /// text); Anthropic's names win where both are sent. `None` when no limit is complete.
    pub fn parse<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Option<Self> {
        let count = |name: &str| header(name).and_then(parse_count);
        let quota = |(limit, remaining): (&str, &str)| Quota::new(count(remaining)?, count(limit)?);
        let mut out = Self::default();
        for l in Limit::ALL {
            let q = quota(l.anthropic_headers()).or_else(|| l.openai_headers().and_then(quota));
            out.set(l, q);
        }
        (!out.is_empty()).then_some(out)
    }

    /// [`RateLimits::parse`] over an HTTP answer's headers.
    pub fn from_headers(headers: &http::HeaderMap) -> Option<Self> {
        Self::parse(|name| headers.get(name).and_then(|v| v.to_str().ok()))
    }
}

/// A plain decimal count (surrounding spaces allowed), bounded; `None` otherwise.
fn parse_count(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() || s.len() > MAX_DIGITS || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u64>().ok().filter(|&n| n <= MAX_VALUE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Option<RateLimits> {
        RateLimits::parse(|name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v))
    }

    #[test]
    fn openai_headers_give_requests_and_tokens() {
        let r = parse(&[
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "12"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-tokens", "149000"),
            ("x-ratelimit-reset-requests", "6m0s"),
        ])
        .unwrap();
        assert_eq!(r.requests, Quota::new(12, 500));
        assert_eq!(r.tokens, Quota::new(149_000, 150_000));
        assert_eq!(r.input_tokens, None);
        assert!((r.requests.unwrap().ratio() - 0.024).abs() < 1e-12);
    }

    #[test]
    fn anthropic_headers_give_all_four_limits() {
        let r = parse(&[
            ("anthropic-ratelimit-requests-limit", "1000"),
            ("anthropic-ratelimit-requests-remaining", "999"),
            ("anthropic-ratelimit-tokens-limit", "96000"),
            ("anthropic-ratelimit-tokens-remaining", "96000"),
            ("anthropic-ratelimit-input-tokens-limit", "80000"),
            ("anthropic-ratelimit-input-tokens-remaining", "4000"),
            ("anthropic-ratelimit-output-tokens-limit", "16000"),
            ("anthropic-ratelimit-output-tokens-remaining", "16000"),
            ("anthropic-ratelimit-requests-reset", "2025-08-21T12:40:59Z"),
        ])
        .unwrap();
        let limits: Vec<_> = r.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            limits,
            ["requests", "tokens", "input_tokens", "output_tokens"]
        );
        assert_eq!(r.input_tokens.unwrap().ratio(), 0.05);
    }

    #[test]
    fn malformed_figures_are_ignored_or_clamped() {
        let ignored = [
            "abc", "-1", "-5", "12.5", "1e3", "", "  ", "+5", "0x10", "１２",
        ];
        for bad in ignored {
            assert_eq!(
                parse(&[
                    ("x-ratelimit-limit-requests", "100"),
                    ("x-ratelimit-remaining-requests", bad),
                ]),
                None,
                "remaining {bad:?}"
            );
            assert_eq!(
                parse(&[
                    ("x-ratelimit-limit-requests", bad),
                    ("x-ratelimit-remaining-requests", "5"),
                ]),
                None,
                "limit {bad:?}"
            );
        }
        // Huge: past u64, past the digit bound, past the value bound.
        for huge in [
            "99999999999999999999999999",
            "18446744073709551616",
            "2000000000000000",
        ] {
            assert_eq!(
                parse(&[
                    ("x-ratelimit-limit-tokens", huge),
                    ("x-ratelimit-remaining-tokens", "1"),
                ]),
                None,
                "{huge}"
            );
        }
        // A limit of 0 has no share; remaining above the limit is clamped.
        assert_eq!(
            parse(&[
                ("x-ratelimit-limit-requests", "0"),
                ("x-ratelimit-remaining-requests", "0"),
            ]),
            None
        );
        let r = parse(&[
            ("x-ratelimit-limit-requests", " 100 "),
            ("x-ratelimit-remaining-requests", "250"),
        ])
        .unwrap();
        assert_eq!(
            r.requests,
            Some(Quota {
                remaining: 100,
                limit: 100
            })
        );
        assert_eq!(r.requests.unwrap().ratio(), 1.0);
        // Half a pair is no figure.
        assert_eq!(parse(&[("x-ratelimit-remaining-requests", "5")]), None);
    }

    #[test]
    fn real_header_maps_are_read_case_insensitively() {
        let mut h = http::HeaderMap::new();
        h.insert("X-RateLimit-Limit-Requests", "10".parse().unwrap());
        h.insert("X-RateLimit-Remaining-Requests", "1".parse().unwrap());
        // Not UTF-8 text: ignored, no panic.
        h.insert(
            "x-ratelimit-limit-tokens",
            http::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        );
        h.insert("x-ratelimit-remaining-tokens", "3".parse().unwrap());
        let r = RateLimits::from_headers(&h).unwrap();
        assert_eq!(r.requests, Quota::new(1, 10));
        assert_eq!(r.tokens, None);
    }

    #[test]
    fn figures_from_another_process_are_held_to_the_same_rules() {
        let json =
            r#"{"requests":{"remaining":900,"limit":500},"tokens":{"remaining":1,"limit":0}}"#;
        let r: RateLimits = serde_json::from_str(json).unwrap();
        let clean = r.sanitized().unwrap();
        assert_eq!(clean.requests, Quota::new(500, 500));
        assert_eq!(clean.tokens, None);
        assert_eq!(
            serde_json::to_string(&clean).unwrap(),
            r#"{"requests":{"remaining":500,"limit":500}}"#
        );
        assert_eq!(RateLimits::default().sanitized(), None);
    }
}
