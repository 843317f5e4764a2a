//! The OpenAI-compatible dialect: `POST {base_url}/chat/completions`, streamed as SSE `data:`
//! chunks ending with `data: [DONE]`, or one JSON body.
//!
//! End-of-stream rule: a stream is complete when some choice carried a `finish_reason` AND
//! either `[DONE]` arrived or the usage chunk (which `stream_options.include_usage` makes the
//! last chunk before `[DONE]`) arrived before the body ended. Some compatible providers drop
//! `[DONE]`; the usage chunk still proves the provider finished. Without a `finish_reason` a
//! stream is always `Truncated`.

use eventsource_stream::Event;
use serde_json::{json, Value};

use super::outcome::{scrub, ProbeError};
use super::upstream::{classify_embedded, error_in, DECLARED_ERROR_STATUS};
use super::wire::{as_u32, event_json, Collected, Step, StreamDecoder};

/// The request body. `system` is omitted when empty (the throughput probe sends none: the
/// probe's "Reply with exactly: PROBE_OK" would contradict "count from 1 to 40").
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

/// The request body for any conversation (regression sets), messages in order.
pub(crate) fn chat_body(
    model: &str,
    messages: &[super::client::ChatMessage],
    max_tokens: u32,
    temperature: f64,
    stream: bool,
) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
        .collect();
    let mut body = json!({
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": super::wire::json_number(temperature),
        "stream": stream,
    });
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// A refusal (`finish_reason: content_filter`, or OpenAI's `refusal` text) as the error.
pub(super) fn refusal(finish_reason: Option<&str>, refusal_text: &str) -> Option<ProbeError> {
    if !refusal_text.trim().is_empty() {
        return Some(ProbeError::Refused {
            message: scrub(refusal_text),
        });
    }
    (finish_reason == Some("content_filter")).then(|| ProbeError::Refused {
        message: "finish_reason: content_filter".into(),
    })
}

fn record_meta(c: &mut Collected, v: &Value) {
    c.set_model(v.get("model").and_then(Value::as_str));
    if let Some(fp) = v.get("system_fingerprint").and_then(Value::as_str) {
        c.system_fingerprint = Some(fp.to_owned());
    }
    if let Some(n) = as_u32(v.get("usage").and_then(|u| u.get("completion_tokens"))) {
        c.usage_output_tokens = Some(n);
    }
}

/// Reads a streamed answer chunk by chunk.
#[derive(Debug, Default)]
pub(crate) struct OpenAiStream {
    c: Collected,
    finish_reason: Option<String>,
    refusal: String,
    usage_seen: bool,
    done: bool,
}

impl StreamDecoder for OpenAiStream {
    fn feed(&mut self, event: &Event) -> Result<Step, ProbeError> {
        if event.data.trim() == "[DONE]" {
            self.done = true;
            return Ok(Step::Done);
        }
        let v = event_json(event)?;
        if let Some(e) = error_in(&v) {
            return Err(classify_embedded(e));
        }
        if event.event == "error" {
            // An `error` event is the provider declaring a failure, even in a shape we do
            // not recognise.
            return Err(ProbeError::Http {
                status: DECLARED_ERROR_STATUS,
                message: scrub(&format!("error event: {}", event.data)),
            });
        }
        let Some(choices) = v.get("choices").and_then(Value::as_array) else {
            return Err(ProbeError::Malformed {
                message: "stream chunk without `choices`".into(),
            });
        };
        record_meta(&mut self.c, &v);
        if v.get("usage").is_some_and(Value::is_object) {
            self.usage_seen = true;
        }
        for choice in choices {
            if let Some(delta) = choice.get("delta") {
                let text = delta.get("content").and_then(Value::as_str).unwrap_or("");
                let reasoning = ["reasoning_content", "reasoning"]
                    .iter()
                    .find_map(|k| delta.get(*k).and_then(Value::as_str))
                    .unwrap_or("");
                let a = self.c.push_text(text);
                let b = self.c.push_reasoning(reasoning);
                if a || b {
                    self.c.content_events = self.c.content_events.saturating_add(1);
                }
                if let Some(r) = delta.get("refusal").and_then(Value::as_str) {
                    self.refusal.push_str(r);
                }
                for call in delta["tool_calls"].as_array().into_iter().flatten() {
                    let index = call["index"].as_u64().unwrap_or(0);
                    let args = call["function"]["arguments"].as_str().unwrap_or("");
                    self.c
                        .push_tool_args(usize::try_from(index).unwrap_or(usize::MAX), args);
                }
            }
            if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
                self.c.length_cut = f == "length";
                self.finish_reason = Some(f.to_owned());
            }
        }
        Ok(Step::Continue)
    }

    fn collected(&self) -> &Collected {
        &self.c
    }

    fn finish(&self) -> Result<(), ProbeError> {
        let Some(finish) = self.finish_reason.as_deref() else {
            return Err(ProbeError::Truncated);
        };
        // Gateways (OpenRouter among them) end a failed stream with `finish_reason: "error"`.
        if finish == "error" {
            return Err(ProbeError::Http {
                status: DECLARED_ERROR_STATUS,
                message: "finish_reason: error".into(),
            });
        }
        if let Some(e) = refusal(Some(finish), &self.refusal) {
            return Err(e);
        }
        if !self.done && !self.usage_seen {
            return Err(ProbeError::Truncated);
        }
        Ok(())
    }

    fn into_collected(self) -> Collected {
        self.c
    }
}

/// Reads a non-streamed answer: `choices[0].message` is required.
pub(crate) fn parse_body(body: &[u8]) -> Result<Collected, ProbeError> {
    super::answer::read_answer(body).0
}

/// A non-streamed answer's JSON tree.
pub(crate) fn body_json(body: &[u8]) -> Result<Value, ProbeError> {
    serde_json::from_slice(body).map_err(|e| ProbeError::Malformed {
        message: scrub(&format!("body is not JSON: {e}")),
    })
}

/// [`parse_body`] over the answer's JSON tree: the reference reading.
pub(crate) fn read_body(v: &Value) -> Result<Collected, ProbeError> {
    if let Some(e) = error_in(v) {
        return Err(classify_embedded(e));
    }
    let Some(choice) = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
    else {
        return Err(ProbeError::Malformed {
            message: "body without `choices[0]`".into(),
        });
    };
    let Some(message) = choice.get("message").filter(|m| m.is_object()) else {
        return Err(ProbeError::Malformed {
            message: "body without `choices[0].message`".into(),
        });
    };
    let mut c = Collected::default();
    record_meta(&mut c, v);
    c.push_text(message.get("content").and_then(Value::as_str).unwrap_or(""));
    c.push_reasoning(
        message
            .get("reasoning_content")
            .and_then(Value::as_str)
            .unwrap_or(""),
    );
    let refusal_text = message.get("refusal").and_then(Value::as_str).unwrap_or("");
    let finish_reason = choice.get("finish_reason").and_then(Value::as_str);
    if let Some(e) = refusal(finish_reason, refusal_text) {
        return Err(e);
    }
    c.length_cut = finish_reason == Some("length");
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(data: &str) -> Event {
        Event {
            event: "message".into(),
            data: data.into(),
            ..Event::default()
        }
    }

    fn run(events: &[&str]) -> Result<Collected, ProbeError> {
        let mut d = OpenAiStream::default();
        for e in events {
            if d.feed(&ev(e))? == Step::Done {
                break;
            }
        }
        d.finish().map(|()| d.into_collected())
    }

    const HELLO: &str = r#"{"model":"m1","system_fingerprint":"fp","choices":[{"index":0,"delta":{"content":"PROBE_OK"}}]}"#;
    const STOP: &str = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
    const USAGE: &str = r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#;

    #[test]
    fn streamed_tool_call_arguments_are_assembled() {
        let call = |i: u32, args: &str| {
            serde_json::json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "function": {"arguments": args}}]}}]})
            .to_string()
        };
        let (a, b, c) = (call(0, "{\"x\":"), call(1, "{}"), call(0, " 1}"));
        let done = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#;
        let got = run(&[&a, &b, &c, done, "[DONE]"]).unwrap();
        assert_eq!(got.tool_args, ["{\"x\": 1}", "{}"]);
        assert!(!got.text_cut);
    }

    #[test]
    fn complete_stream_with_usage() {
        let c = run(&[HELLO, STOP, USAGE, "[DONE]"]).unwrap();
        assert_eq!(c.text, "PROBE_OK");
        assert_eq!(c.output_tokens(), Some((3, false)));
        assert_eq!(c.model.as_deref(), Some("m1"));
        assert_eq!(c.system_fingerprint.as_deref(), Some("fp"));
    }

    #[test]
    fn end_rules() {
        // finish + [DONE], no usage: complete, tokens estimated.
        let c = run(&[HELLO, STOP, "[DONE]"]).unwrap();
        assert_eq!(c.output_tokens(), Some((3, true)));
        // finish + usage, body ended without [DONE]: complete (lenient).
        assert!(run(&[HELLO, STOP, USAGE]).is_ok());
        // finish only, no usage and no [DONE]: truncated.
        assert_eq!(run(&[HELLO, STOP]), Err(ProbeError::Truncated));
        // no finish_reason, even with [DONE]: truncated.
        assert_eq!(run(&[HELLO, "[DONE]"]), Err(ProbeError::Truncated));
    }

    #[test]
    fn failures_inside_the_stream() {
        let filter = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}"#;
        assert!(matches!(
            run(&[filter, "[DONE]"]),
            Err(ProbeError::Refused { .. })
        ));
        assert!(matches!(
            run(&[HELLO, "{oops"]),
            Err(ProbeError::Malformed { .. })
        ));
        assert!(matches!(
            run(&[r#"{"id":"x"}"#]),
            Err(ProbeError::Malformed { .. })
        ));
        assert_eq!(
            run(&[HELLO, r#"{"error":{"message":"upstream died","code":502}}"#])
                .err()
                .and_then(|e| e.status()),
            Some(502)
        );
    }

    #[test]
    fn reasoning_counts_as_generated_but_not_as_answer() {
        let r = r#"{"choices":[{"index":0,"delta":{"reasoning_content":"thinking"}}]}"#;
        let c = run(&[r, HELLO, STOP, "[DONE]"]).unwrap();
        assert_eq!(c.text, "PROBE_OK");
        assert_eq!(c.content_events, 2);
    }

    #[test]
    fn a_length_finish_is_remembered() {
        let r = r#"{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}"#;
        let length = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#;
        let c = run(&[r, length, "[DONE]"]).unwrap();
        assert!(c.length_cut);
        assert!(c.text.is_empty());
        assert!(!run(&[HELLO, STOP, "[DONE]"]).unwrap().length_cut);
        let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"","reasoning_content":"hmm"},"finish_reason":"length"}]}"#;
        assert!(parse_body(body).unwrap().length_cut);
    }

    #[test]
    fn body_parsing() {
        let ok = br#"{"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"PROBE_OK"},"finish_reason":"stop"}],"usage":{"completion_tokens":4}}"#;
        let c = parse_body(ok).unwrap();
        assert_eq!(
            (c.text.as_str(), c.usage_output_tokens),
            ("PROBE_OK", Some(4))
        );
        assert!(matches!(
            parse_body(b"{\"choices\":[]}"),
            Err(ProbeError::Malformed { .. })
        ));
        assert!(matches!(
            parse_body(b"not json"),
            Err(ProbeError::Malformed { .. })
        ));
        let filtered = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":null},"finish_reason":"content_filter"}]}"#;
        assert!(matches!(
            parse_body(filtered),
            Err(ProbeError::Refused { .. })
        ));
    }

    #[test]
    fn request_shape() {
        let b = request_body("qwen-max", "sys", "hi", 16, true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["messages"][0]["role"], "system");
        let b = request_body("qwen-max", "", "count", 128, false);
        assert_eq!(b["messages"].as_array().map(Vec::len), Some(1));
        assert!(b.get("stream_options").is_none());
    }
}
