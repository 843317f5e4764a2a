//! The Anthropic Messages dialect: `POST {base_url}/v1/messages`, streamed as typed SSE events
//! (`message_start`, `content_block_*`, `message_delta`, `message_stop`, `ping`, `error`).
//!
//! End-of-stream rule: only `message_stop` completes a stream. An `error` event is never a
//! success; `stop_reason: "refusal"` is `Refused`. Unknown event types are ignored, as
//! Anthropic's versioning policy asks.

use serde_json::{json, Value};
use sse_parse::Event;

use super::outcome::ProbeError;
use super::upstream::{classify_embedded, error_in};
use super::wire::{as_u32, event_json, Collected, Step, StreamDecoder};

/// The API version we speak; pinned so a server-side default change cannot alter the shapes.
pub(crate) const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The request body. `system` is omitted when empty (the throughput probe sends none).
#[cfg(test)]
pub(crate) fn request_body(
    model: &str,
    system: &str,
    user: &str,
    max_tokens: u32,
    stream: bool,
) -> Value {
    let messages = super::client::ChatMessage::pair(system, user);
    chat_body(model, &messages, max_tokens, 0.0, stream)
}

/// The request body for any conversation: system messages are joined into the top-level
/// `system` field (the Messages API has no system role), the others kept in order.
pub(crate) fn chat_body(
    model: &str,
    messages: &[super::client::ChatMessage],
    max_tokens: u32,
    temperature: f64,
    stream: bool,
) -> Value {
    use super::client::Role;
    let system: Vec<&str> = messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| m.content.as_str())
        .collect();
    let turns: Vec<Value> = messages
        .iter()
        .filter(|m| m.role != Role::System)
        .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
        .collect();
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "messages": turns,
        "temperature": super::wire::json_number(temperature),
        "stream": stream,
    });
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    body
}

fn refused(stop_reason: Option<&str>) -> Option<ProbeError> {
    (stop_reason == Some("refusal")).then(|| ProbeError::Refused {
        message: "stop_reason: refusal".into(),
    })
}

/// Reads a streamed message event by event.
#[derive(Debug, Default)]
pub(crate) struct AnthropicStream {
    c: Collected,
    stop_reason: Option<String>,
    stopped: bool,
}

impl AnthropicStream {
    fn push(&mut self, block: &Value, text_key: &str, thinking_key: &str) {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let added = match kind {
            k if k == text_key => self
                .c
                .push_text(block.get("text").and_then(Value::as_str).unwrap_or("")),
            k if k == thinking_key => self
                .c
                .push_reasoning(block.get("thinking").and_then(Value::as_str).unwrap_or("")),
            _ => false,
        };
        if added {
            self.c.content_events = self.c.content_events.saturating_add(1);
        }
    }
}

fn malformed(what: &str) -> ProbeError {
    ProbeError::Malformed {
        message: format!("{what} without its required fields"),
    }
}

impl StreamDecoder for AnthropicStream {
    fn feed(&mut self, event: &Event) -> Result<Step, ProbeError> {
        let v = event_json(event)?;
        let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "message_start" => {
                let message = v.get("message").ok_or_else(|| malformed(kind))?;
                self.c
                    .set_model(message.get("model").and_then(Value::as_str));
                // message_start's usage.output_tokens is a placeholder (usually 1); the final
                // count comes with message_delta.
            }
            "content_block_start" => {
                let block = v.get("content_block").ok_or_else(|| malformed(kind))?;
                self.push(block, "text", "thinking");
            }
            "content_block_delta" => {
                let delta = v.get("delta").ok_or_else(|| malformed(kind))?;
                self.push(delta, "text_delta", "thinking_delta");
            }
            "message_delta" => {
                let delta = v.get("delta").ok_or_else(|| malformed(kind))?;
                if let Some(r) = delta.get("stop_reason").and_then(Value::as_str) {
                    self.c.length_cut = r == "max_tokens";
                    self.stop_reason = Some(r.to_owned());
                }
                if let Some(n) = as_u32(v.get("usage").and_then(|u| u.get("output_tokens"))) {
                    self.c.usage_output_tokens = Some(n);
                }
            }
            "message_stop" => {
                self.stopped = true;
                return Ok(Step::Done);
            }
            "error" => {
                let e = error_in(&v).ok_or_else(|| malformed("error event"))?;
                return Err(classify_embedded(e));
            }
            "" => {
                return Err(ProbeError::Malformed {
                    message: "event without `type`".into(),
                })
            }
            // ping, content_block_stop, and event types newer than this code.
            _ => {}
        }
        Ok(Step::Continue)
    }

    fn collected(&self) -> &Collected {
        &self.c
    }

    fn finish(&self) -> Result<(), ProbeError> {
        if let Some(e) = refused(self.stop_reason.as_deref()) {
            return Err(e);
        }
        if !self.stopped {
            return Err(ProbeError::Truncated);
        }
        Ok(())
    }

    fn into_collected(self) -> Collected {
        self.c
    }
}

/// Reads a non-streamed message: a `content` array is required.
pub(crate) fn parse_body(body: &[u8]) -> Result<Collected, ProbeError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ProbeError::Malformed {
        message: super::outcome::scrub(&format!("body is not JSON: {e}")),
    })?;
    if let Some(e) = error_in(&v) {
        return Err(classify_embedded(e));
    }
    let Some(content) = v.get("content").and_then(Value::as_array) else {
        return Err(malformed("message body"));
    };
    let mut c = Collected::default();
    c.set_model(v.get("model").and_then(Value::as_str));
    for block in content {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                c.push_text(block.get("text").and_then(Value::as_str).unwrap_or(""));
            }
            Some("thinking") => {
                c.push_reasoning(block.get("thinking").and_then(Value::as_str).unwrap_or(""));
            }
            _ => {}
        }
    }
    c.usage_output_tokens = as_u32(v.get("usage").and_then(|u| u.get("output_tokens")));
    let stop_reason = v.get("stop_reason").and_then(Value::as_str);
    if let Some(e) = refused(stop_reason) {
        return Err(e);
    }
    c.length_cut = stop_reason == Some("max_tokens");
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(data: &Value) -> Event {
        Event {
            event: data["type"].as_str().unwrap_or("message").into(),
            data: data.to_string(),
            ..Event::default()
        }
    }

    fn run(events: &[Value]) -> Result<Collected, ProbeError> {
        let mut d = AnthropicStream::default();
        for e in events {
            if d.feed(&ev(e))? == Step::Done {
                break;
            }
        }
        d.finish().map(|()| d.into_collected())
    }

    fn happy(stop_reason: &str) -> Vec<Value> {
        vec![
            json!({"type":"message_start","message":{"model":"claude-x","usage":{"input_tokens":9,"output_tokens":1}}}),
            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
            json!({"type":"ping"}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"PROBE"}}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"_OK"}}),
            json!({"type":"content_block_stop","index":0}),
            json!({"type":"message_delta","delta":{"stop_reason":stop_reason},"usage":{"output_tokens":5}}),
            json!({"type":"message_stop"}),
        ]
    }

    #[test]
    fn complete_stream() {
        let c = run(&happy("end_turn")).unwrap();
        assert_eq!(c.text, "PROBE_OK");
        assert_eq!(c.model.as_deref(), Some("claude-x"));
        assert_eq!(c.output_tokens(), Some((5, false)));
        assert_eq!(c.content_events, 2);
    }

    #[test]
    fn failures() {
        let mut cut = happy("end_turn");
        cut.pop();
        assert_eq!(run(&cut), Err(ProbeError::Truncated));
        assert!(matches!(
            run(&happy("refusal")),
            Err(ProbeError::Refused { .. })
        ));
        let mut overloaded = happy("end_turn");
        overloaded.insert(
            3,
            json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
        );
        assert_eq!(run(&overloaded).err().and_then(|e| e.status()), Some(529));
        assert!(matches!(
            run(&[json!({"type":"content_block_delta"})]),
            Err(ProbeError::Malformed { .. })
        ));
        assert!(matches!(
            run(&[json!({"no":"type"})]),
            Err(ProbeError::Malformed { .. })
        ));
    }

    #[test]
    fn a_max_tokens_stop_is_remembered() {
        assert!(run(&happy("max_tokens")).unwrap().length_cut);
        assert!(!run(&happy("end_turn")).unwrap().length_cut);
        let body = br#"{"type":"message","content":[{"type":"thinking","thinking":"hmm"}],"stop_reason":"max_tokens"}"#;
        let c = parse_body(body).unwrap();
        assert!(c.length_cut && c.text.is_empty());
    }

    #[test]
    fn body_parsing() {
        let ok = br#"{"type":"message","model":"claude-x","content":[{"type":"text","text":"PROBE_OK"}],"stop_reason":"end_turn","usage":{"input_tokens":9,"output_tokens":4}}"#;
        let c = parse_body(ok).unwrap();
        assert_eq!(
            (c.text.as_str(), c.usage_output_tokens),
            ("PROBE_OK", Some(4))
        );
        let err = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(parse_body(err).err().and_then(|e| e.status()), Some(529));
        assert!(matches!(
            parse_body(br#"{"type":"message"}"#),
            Err(ProbeError::Malformed { .. })
        ));
    }

    #[test]
    fn request_shape() {
        let b = request_body("claude-x", "sys", "hi", 16, true);
        assert_eq!(b["system"], "sys");
        assert_eq!(b["messages"][0]["role"], "user");
        assert!(request_body("claude-x", "", "hi", 16, true)
            .get("system")
            .is_none());
    }
}
