//! The OpenAI-compatible wire shapes the simulator speaks: what it reads from a chat
//! completions request, which answer a prompt gets, and the JSON it sends back.

use rand::Rng;
use serde::Deserialize;
use serde_json::{json, Value};

use super::scenario::Version;

/// The parts of a chat completions request the simulator looks at; the rest is ignored,
/// as a lenient provider would.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    #[serde(default)]
    pub messages: Vec<Message>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    #[serde(default)]
    pub role: String,
    /// A string, or an array of `{"type":"text","text":…}` parts.
    #[serde(default)]
    pub content: Value,
}

impl Message {
    pub fn text(&self) -> String {
        match &self.content {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(" "),
            _ => String::new(),
        }
    }
}

impl ChatRequest {
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    pub fn max_tokens(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// Which of the known prompts this is.
    pub fn prompt(&self) -> Prompt {
        let texts: Vec<String> = self.messages.iter().map(Message::text).collect();
        if texts
            .iter()
            .any(|t| t.to_ascii_lowercase().contains("count from 1 to 40"))
        {
            Prompt::Throughput
        } else if self
            .messages
            .iter()
            .zip(&texts)
            .any(|(m, t)| m.role == "system" && t.contains("Reply with exactly: PROBE_OK"))
        {
            Prompt::Probe
        } else {
            Prompt::Other
        }
    }

    /// A rough token count (4 characters a token, plus framing), like real usage figures.
    pub fn prompt_tokens(&self) -> u32 {
        let chars: usize = self.messages.iter().map(|m| m.text().len()).sum();
        (chars / 4 + 4 * self.messages.len()).max(1) as u32
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompt {
    /// `system: "Reply with exactly: PROBE_OK"`.
    Probe,
    /// "Count from 1 to 40 …".
    Throughput,
    Other,
}

/// The answer as the content tokens it is streamed in.
pub fn answer_tokens<R: Rng + ?Sized>(
    prompt: Prompt,
    version: Version,
    model: &str,
    rng: &mut R,
) -> Vec<String> {
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    match (prompt, version) {
        (Prompt::Probe, Version::Current) => match rng.gen_range(0..3) {
            0 => owned(&["PRO", "BE_OK"]),
            1 => owned(&["PROBE", "_OK"]),
            _ => owned(&["PRO", "BE", "_OK"]),
        },
        (Prompt::Probe, Version::Drifted { variant: 0 }) => owned(&["PRO", "BE_OK", "."]),
        (Prompt::Probe, Version::Drifted { .. }) => owned(&["Sure", "!", " PRO", "BE_OK"]),
        (Prompt::Throughput, version) => {
            let mut tokens = match version {
                Version::Current => Vec::new(),
                Version::Drifted { .. } => owned(&["Sure", "!", " Here", " you", " go", ":"]),
            };
            let lead = if tokens.is_empty() { "" } else { " " };
            tokens.push(format!("{lead}1"));
            tokens.extend((2..=40).map(|n| format!(" {n}")));
            tokens
        }
        (Prompt::Other, _) => {
            let text = format!(
                "This is a simulated answer from {model}. The probeok simulator answers its probe \
                 prompts exactly and everything else with this short reply."
            );
            text.split_inclusive(' ').map(str::to_owned).collect()
        }
    }
}

/// The `model` the response reports: a drifted version carries a new snapshot suffix.
pub fn reported_model(model: &str, version: Version) -> String {
    match version {
        Version::Current => model.to_owned(),
        Version::Drifted { .. } => format!("{model}-0915"),
    }
}

pub fn fingerprint(version: Version) -> &'static str {
    match version {
        Version::Current => "fp_sim_3c1a2b",
        Version::Drifted { .. } => "fp_sim_9e7d4f",
    }
}

/// Identity shared by every chunk of one completion.
#[derive(Debug, Clone)]
pub struct Completion {
    pub id: String,
    pub created: i64,
    pub model: String,
    pub fingerprint: &'static str,
    pub include_usage: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub prompt: u32,
    pub completion: u32,
}

impl Usage {
    fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
        })
    }
}

impl Completion {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> String {
        let mut v = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        });
        if self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        format!("data: {v}\n\n")
    }

    /// The first chunk: the assistant role with empty content, as OpenAI sends it.
    pub fn role_chunk(&self) -> String {
        self.chunk(
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
            None,
        )
    }

    pub fn content_chunk(&self, token: &str) -> String {
        self.chunk(
            json!([{"index": 0, "delta": {"content": token}, "logprobs": null, "finish_reason": null}]),
            None,
        )
    }

    pub fn finish_chunk(&self, finish_reason: &str) -> String {
        self.chunk(
            json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_reason}]),
            None,
        )
    }

    /// Only with `stream_options.include_usage`: empty choices and the usage.
    pub fn usage_chunk(&self, usage: Usage) -> String {
        self.chunk(json!([]), Some(usage.json()))
    }

    pub fn done() -> &'static str {
        "data: [DONE]\n\n"
    }

    /// The whole non-streaming answer.
    pub fn full(&self, content: &str, finish_reason: &str, usage: Usage) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": null},
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
            "usage": usage.json(),
        })
    }
}

/// An OpenAI-style error body.
pub fn error_body(message: &str, kind: &str, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// The error a simulated status carries, worded like the real ones.
pub fn status_error(status: u16) -> Value {
    match status {
        500 => error_body(
            "The server had an error while processing your request. Sorry about that!",
            "server_error",
            None,
        ),
        502 => error_body(
            "Bad gateway: upstream connect error or disconnect/reset before headers.",
            "server_error",
            Some("bad_gateway"),
        ),
        503 => error_body(
            "The engine is currently overloaded, please try again later.",
            "server_error",
            Some("service_unavailable"),
        ),
        504 => error_body(
            "Gateway timeout: the upstream did not answer in time.",
            "server_error",
            Some("gateway_timeout"),
        ),
        _ => error_body("Simulated error.", "server_error", None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn req(v: Value) -> ChatRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn recognises_the_probe_and_throughput_prompts() {
        let probe = req(json!({"model": "m", "messages": [
            {"role": "system", "content": "Reply with exactly: PROBE_OK"},
            {"role": "user", "content": "health check"}]}));
        assert_eq!(probe.prompt(), Prompt::Probe);
        let tp = req(
            json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Count from 1 to 40, separated by single spaces."}]}]}),
        );
        assert_eq!(tp.prompt(), Prompt::Throughput);
        let other = req(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(other.prompt(), Prompt::Other);
    }

    #[test]
    fn answers_have_the_expected_shape() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..20 {
            let t = answer_tokens(Prompt::Probe, Version::Current, "m", &mut rng);
            assert!((2..=3).contains(&t.len()));
            assert_eq!(t.concat(), "PROBE_OK");
        }
        let t = answer_tokens(Prompt::Throughput, Version::Current, "m", &mut rng);
        assert_eq!(t.len(), 40);
        let expected: Vec<String> = (1..=40).map(|n| n.to_string()).collect();
        assert_eq!(t.concat(), expected.join(" "));
        let drifted: Vec<String> = (0..2)
            .map(|v| {
                answer_tokens(
                    Prompt::Probe,
                    Version::Drifted { variant: v },
                    "m",
                    &mut rng,
                )
                .concat()
            })
            .collect();
        assert_eq!(drifted, ["PROBE_OK.", "Sure! PROBE_OK"]);
    }
}
