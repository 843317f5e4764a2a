//! What the protocol decoders (OpenAI-compatible, Anthropic) hand back to the client, and the
//! shape every streaming decoder has. Decoders are pure: they see events and bodies, never
//! sockets or clocks, so the end-of-stream rules are unit-tested without a server.

use sse_parse::Event;

use super::measure::estimate_tokens;
use super::outcome::ProbeError;

/// Text kept while reading, per kind. Far above what a probe asks for (`max_tokens` 16..128);
/// a runaway upstream cannot make us buffer without bound.
const MAX_COLLECTED_BYTES: usize = 64 * 1024;

/// What one answer contained, accumulated across stream events or read from one body.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Collected {
    /// The visible answer (content / text blocks), untrimmed.
    pub text: String,
    /// Reasoning text (`reasoning_content`, Anthropic `thinking`): generated tokens that are
    /// not the answer. Counted for time-to-first-token and the token estimate only.
    pub reasoning: String,
    /// Stream events that carried any generated text (answer or reasoning).
    pub content_events: u32,
    /// `usage.completion_tokens` / `usage.output_tokens` when the API reported it.
    pub usage_output_tokens: Option<u32>,
    pub model: Option<String>,
    pub system_fingerprint: Option<String>,
    /// The provider stopped because `max_tokens` ran out (`finish_reason: "length"`,
    /// `stop_reason: "max_tokens"`).
    pub length_cut: bool,
    /// Some answer text did not fit [`MAX_COLLECTED_BYTES`]: `text` is a prefix.
    pub text_cut: bool,
    /// Tool calls' `arguments`, by call index, as streamed (bounded like the text; a cut
    /// sets `text_cut` too).
    pub tool_args: Vec<String>,
}

/// Tool calls kept per answer.
const MAX_TOOL_CALLS: usize = 16;

impl Collected {
    /// Appends answer text; returns whether anything non-empty arrived.
    pub fn push_text(&mut self, s: &str) -> bool {
        let before = self.text.len();
        let any = push_bounded(&mut self.text, s);
        self.text_cut |= self.text.len() - before < s.len();
        any
    }

    /// Appends a fragment of tool call `index`'s arguments.
    pub fn push_tool_args(&mut self, index: usize, s: &str) {
        if index >= MAX_TOOL_CALLS {
            self.text_cut = true;
            return;
        }
        if self.tool_args.len() <= index {
            self.tool_args.resize(index + 1, String::new());
        }
        let used: usize = self.tool_args.iter().map(String::len).sum();
        if used + s.len() > MAX_COLLECTED_BYTES {
            self.text_cut = true;
            return;
        }
        self.tool_args[index].push_str(s);
    }

    pub fn push_reasoning(&mut self, s: &str) -> bool {
        push_bounded(&mut self.reasoning, s)
    }

    pub fn set_model(&mut self, model: Option<&str>) {
        if self.model.is_none() {
            self.model = model.filter(|m| !m.is_empty()).map(str::to_owned);
        }
    }

    /// `(tokens, estimated)`: the API's usage when given, else our estimate — the larger of
    /// the number of content-bearing stream events (usually one token each) and the text's
    /// piece count (catches providers that batch several tokens per event). `None` when
    /// nothing was generated at all.
    pub fn output_tokens(&self) -> Option<(u32, bool)> {
        if let Some(n) = self.usage_output_tokens {
            return Some((n, false));
        }
        let pieces = estimate_tokens(&self.text).saturating_add(estimate_tokens(&self.reasoning));
        let n = pieces.max(self.content_events);
        (n > 0).then_some((n, true))
    }

    /// Whether any generated text (answer or reasoning) arrived.
    pub fn has_content(&self) -> bool {
        !self.text.is_empty() || !self.reasoning.is_empty()
    }
}

fn push_bounded(buf: &mut String, s: &str) -> bool {
    if s.is_empty() {
        return false;
    }
    let room = MAX_COLLECTED_BYTES.saturating_sub(buf.len());
    if s.len() <= room {
        buf.push_str(s);
    } else {
        let mut cut = room;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        buf.push_str(&s[..cut]);
    }
    true
}

/// Whether the protocol's end marker arrived with this event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Continue,
    /// `[DONE]` or `message_stop`: stop reading, the answer is complete.
    Done,
}

/// One SSE dialect. `feed` sees every event in order; `finish` decides, once no more events
/// will come (end marker, clean end of body, or a cut connection), whether that is a complete
/// answer or a classified failure. What arrived is kept either way (evidence, token counts).
pub(crate) trait StreamDecoder {
    fn feed(&mut self, event: &Event) -> Result<Step, ProbeError>;
    fn collected(&self) -> &Collected;
    fn finish(&self) -> Result<(), ProbeError>;
    fn into_collected(self) -> Collected;
}

/// Parses an event's data as JSON; anything else is `Malformed`, with a bounded look at it.
pub(crate) fn event_json(event: &Event) -> Result<serde_json::Value, ProbeError> {
    serde_json::from_str(&event.data).map_err(|e| ProbeError::Malformed {
        message: super::outcome::scrub(&format!(
            "event is not JSON ({e}): {}",
            super::outcome::truncate_chars(&event.data, 80)
        )),
    })
}

/// A `u32` token count from a JSON number.
pub(crate) fn as_u32(v: Option<&serde_json::Value>) -> Option<u32> {
    v?.as_u64().and_then(|n| u32::try_from(n).ok())
}

/// A number as JSON, integral values without a fraction (`0`, not `0.0`): the bytes a probe
/// sends stay what they always were, and strict gateways that want an integer are satisfied.
pub(crate) fn json_number(v: f64) -> serde_json::Value {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        // Integral and far inside i64's range: the cast is exact.
        serde_json::Value::from(v as i64)
    } else {
        serde_json::Value::from(v)
    }
}
