//! What a shadow copy is compared on, and the per-shadow history the report is computed from
//! (pure). Each side of a comparison is what the client got from the real route and what the
//! shadow route answered to the same request: success, latency, TTFT, output length, and —
//! for requests whose `response_format` asks for JSON — whether the content parses.
//! Only figures are kept, never content.

use std::collections::VecDeque;

use chrono::{DateTime, Duration, Utc};
use serde_json::{json, Value};

use crate::proxy::structured::{self, Expect, Validity};

/// Comparisons kept per shadow (the newest; older ones fall out of the last-day figures).
pub const MAX_COMPARISONS: usize = 10_000;
/// Minutes of copied/skipped counts kept (a day).
const MINUTES: usize = 24 * 60;
/// Content read from a side's answer for the validity check, at most.
pub const MAX_CONTENT: usize = 256 * 1024;

/// One side of a comparison.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Side {
    pub success: bool,
    pub latency_ms: f64,
    pub ttft_ms: Option<f64>,
    pub output_tokens: Option<u64>,
    /// The structured-output check: `None` when the request asked for no structure.
    pub valid: Option<bool>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub at: DateTime<Utc>,
    pub primary: Side,
    pub shadow: Side,
}

/// Why a sampled request was not copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Requests with an `Idempotency-Key` are never copied.
    IdempotencyKey,
    /// The copy queue was full.
    QueueFull,
    /// The shadow's hourly cost budget was spent.
    ExtraCost,
    /// The client hung up before its stream ended: nothing to compare with.
    ClientGone,
}

impl Skip {
    pub const ALL: [Skip; 4] = [
        Skip::IdempotencyKey,
        Skip::QueueFull,
        Skip::ExtraCost,
        Skip::ClientGone,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::IdempotencyKey => "idempotency_key",
            Self::QueueFull => "queue_full",
            Self::ExtraCost => "budget",
            Self::ClientGone => "client_gone",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Is the content judged: did the request ask for JSON (`response_format` `json_object` or
/// `json_schema`)? Tool-call arguments are not collected from the copies, so tools alone are not.
pub fn judges_content(expect: &Expect) -> bool {
    matches!(expect, Expect::JsonObject | Expect::JsonSchema(_))
}

/// The structured-output check the route observables use, on one side's content: `None` when
/// the request asked for no JSON or the answer could not be judged.
pub fn validity(expect: &Expect, content: Option<&str>) -> Option<bool> {
    if !judges_content(expect) {
        return None;
    }
    match structured::judge(expect, content.unwrap_or_default(), &[]) {
        Validity::Valid => Some(true),
        Validity::Invalid(_) => Some(false),
        Validity::NotApplicable | Validity::NotChecked(_) => None,
    }
}

/// The first choice's content of a non-streamed answer.
pub fn answer_content(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_owned)
}

/// Adds the content deltas of a forwarded stream chunk's `data:` lines to `into` (up to
/// [`MAX_CONTENT`]).
pub fn add_stream_content(chunk: &[u8], into: &mut String) {
    for data in chunk
        .split(|b| *b == b'\n')
        .filter_map(|line| line.strip_prefix(b"data: "))
    {
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            continue;
        };
        if let Some(s) = v["choices"][0]["delta"]["content"].as_str() {
            if into.len() + s.len() <= MAX_CONTENT {
                into.push_str(s);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Minute {
    at: i64,
    copied: u64,
    skipped: [u64; 4],
}

/// One shadow's last day: its comparisons and, per minute, copies and skips.
#[derive(Debug, Default)]
pub struct History {
    comparisons: VecDeque<Comparison>,
    minutes: VecDeque<Minute>,
}

impl History {
    fn minute(&mut self, now: DateTime<Utc>) -> &mut Minute {
        let at = now.timestamp().div_euclid(60);
        if self.minutes.back().is_none_or(|m| m.at != at) {
            self.minutes.push_back(Minute {
                at,
                ..Minute::default()
            });
            while self.minutes.len() > MINUTES {
                self.minutes.pop_front();
            }
        }
        // Just pushed or matched above.
        let last = self.minutes.len() - 1;
        &mut self.minutes[last]
    }

    pub fn copied(&mut self, now: DateTime<Utc>) {
        self.minute(now).copied += 1;
    }

    pub fn skipped(&mut self, why: Skip, now: DateTime<Utc>) {
        self.minute(now).skipped[why.index()] += 1;
    }

    pub fn compared(&mut self, c: Comparison) {
        let day_ago = c.at - Duration::days(1);
        while self.comparisons.front().is_some_and(|x| x.at < day_ago) {
            self.comparisons.pop_front();
        }
        if self.comparisons.len() >= MAX_COMPARISONS {
            self.comparisons.pop_front();
        }
        self.comparisons.push_back(c);
    }

    /// The figures over `window` back from `now`.
    pub fn report(&self, now: DateTime<Utc>, window: Duration) -> Value {
        let since = now - window;
        let first_minute = since.timestamp().div_euclid(60);
        let mut copied = 0;
        let mut skipped = [0u64; 4];
        for m in self.minutes.iter().filter(|m| m.at >= first_minute) {
            copied += m.copied;
            for (s, n) in skipped.iter_mut().zip(m.skipped) {
                *s += n;
            }
        }
        let cs: Vec<&Comparison> = self.comparisons.iter().filter(|c| c.at >= since).collect();
        let side =
            |f: fn(&Comparison) -> &Side| -> Vec<&Side> { cs.iter().map(|c| f(c)).collect() };
        let (p, s) = (side(|c| &c.primary), side(|c| &c.shadow));
        let both = cs
            .iter()
            .filter(|c| c.primary.success && c.shadow.success)
            .count();
        let either = cs
            .iter()
            .filter(|c| c.primary.success || c.shadow.success)
            .count();
        let ratios: Vec<f64> = cs
            .iter()
            .filter_map(|c| {
                let (a, b) = (c.primary.output_tokens?, c.shadow.output_tokens?);
                (a > 0 && c.primary.success && c.shadow.success).then(|| b as f64 / a as f64)
            })
            .collect();
        json!({
            "copied": copied,
            "compared": cs.len(),
            "skipped": Skip::ALL.iter().map(|k| (k.as_str().to_owned(), json!(skipped[k.index()]))).collect::<serde_json::Map<_, _>>(),
            "success": {
                "both": both,
                "either": either,
                "primary": p.iter().filter(|x| x.success).count(),
                "shadow": s.iter().filter(|x| x.success).count(),
            },
            "success_ratio": {"primary": success_ratio(&p), "shadow": success_ratio(&s)},
            "latency_ms_p50": {
                "primary": median(p.iter().filter(|x| x.success).map(|x| x.latency_ms).collect()),
                "shadow": median(s.iter().filter(|x| x.success).map(|x| x.latency_ms).collect()),
            },
            "ttft_ms_p50": {
                "primary": median(p.iter().filter_map(|x| x.ttft_ms).collect()),
                "shadow": median(s.iter().filter_map(|x| x.ttft_ms).collect()),
            },
            "output_length_ratio": median(ratios),
            "validity": {
                "checked": p.iter().filter(|x| x.valid.is_some()).count(),
                "primary": valid_ratio(&p),
                "shadow": valid_ratio(&s),
            },
        })
    }
}

fn success_ratio(sides: &[&Side]) -> Option<f64> {
    (!sides.is_empty())
        .then(|| sides.iter().filter(|x| x.success).count() as f64 / sides.len() as f64)
}

fn valid_ratio(sides: &[&Side]) -> Option<f64> {
    let checked: Vec<bool> = sides.iter().filter_map(|x| x.valid).collect();
    (!checked.is_empty())
        .then(|| checked.iter().filter(|v| **v).count() as f64 / checked.len() as f64)
}

/// The median (the mean of the middle two for an even count), `None` when empty.
fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(success: bool, latency_ms: f64, tokens: u64, valid: Option<bool>) -> Side {
        Side {
            success,
            latency_ms,
            ttft_ms: Some(latency_ms / 2.0),
            output_tokens: Some(tokens),
            valid,
        }
    }

    #[test]
    fn content_is_judged_only_when_json_was_asked_for() {
        let asks = Expect::of(&serde_json::json!({"response_format": {"type": "json_object"}}));
        assert!(judges_content(&asks));
        let text = Expect::of(&serde_json::json!({"response_format": {"type": "text"}}));
        assert!(!judges_content(&text));
        assert_eq!(validity(&asks, Some(" {\"a\": 1} ")), Some(true));
        assert_eq!(validity(&asks, Some("```json\n{}```")), Some(false));
        assert_eq!(validity(&asks, None), Some(false));
        assert_eq!(validity(&text, Some("anything")), None);
        let schema = Expect::of(
            &serde_json::json!({"response_format": {"type": "json_schema",
            "json_schema": {"schema": {"type": "object", "required": ["a"]}}}}),
        );
        assert_eq!(validity(&schema, Some("{\"a\": 1}")), Some(true));
        assert_eq!(validity(&schema, Some("{\"b\": 1}")), Some(false));
        let mut s = String::new();
        add_stream_content(b"data: {\"choices\":[{\"delta\":{\"content\":\"{\\\"a\\\"\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\":1}\"}}]}\n\ndata: [DONE]\n\n", &mut s);
        assert_eq!(s, "{\"a\":1}");
    }

    #[test]
    fn the_report_counts_windows_and_takes_medians() {
        let now = Utc::now();
        let mut h = History::default();
        h.copied(now - Duration::hours(3));
        h.skipped(Skip::ExtraCost, now - Duration::hours(3));
        for i in 0..3 {
            h.copied(now);
            h.compared(Comparison {
                at: now,
                primary: side(true, 100.0 + f64::from(i), 10, Some(true)),
                shadow: side(i != 2, 300.0, 20, Some(i == 0)),
            });
        }
        h.skipped(Skip::QueueFull, now);
        let hour = h.report(now, Duration::hours(1));
        assert_eq!(hour["copied"], 3);
        assert_eq!(hour["compared"], 3);
        assert_eq!(hour["skipped"]["queue_full"], 1);
        assert_eq!(hour["skipped"]["budget"], 0);
        assert_eq!(hour["success"]["both"], 2);
        assert_eq!(hour["success"]["either"], 3);
        assert_eq!(hour["latency_ms_p50"]["primary"], 101.0);
        assert_eq!(hour["latency_ms_p50"]["shadow"], 300.0);
        assert_eq!(hour["output_length_ratio"], 2.0);
        assert_eq!(hour["validity"]["primary"], 1.0);
        assert_eq!(hour["validity"]["shadow"], 1.0 / 3.0);
        let day = h.report(now, Duration::days(1));
        assert_eq!(day["copied"], 4);
        assert_eq!(day["skipped"]["budget"], 1);
    }

    #[test]
    fn history_is_bounded() {
        let now = Utc::now();
        let mut h = History::default();
        for i in 0..(MAX_COMPARISONS + 5) {
            h.compared(Comparison {
                at: now + Duration::milliseconds(i as i64),
                primary: Side::default(),
                shadow: Side::default(),
            });
        }
        assert_eq!(h.comparisons.len(), MAX_COMPARISONS);
        for m in 0..(MINUTES as i64 + 10) {
            h.copied(now + Duration::minutes(m));
        }
        assert_eq!(h.minutes.len(), MINUTES);
    }
}
