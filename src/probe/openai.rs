//! The OpenAI-compatible dialect: `POST {base_url}/chat/completions`, streamed as SSE `data:`
//! chunks ending with `data: [DONE]`, or one JSON body.
//!
//! End-of-stream rule: a stream is complete when some choice carried a `finish_reason` AND
//! either `[DONE]` arrived or the usage chunk (which `stream_options.include_usage` makes the
//! last chunk before `[DONE]`) arrived before the body ended. Some compatible providers drop
//! `[DONE]`; the usage chunk still proves the provider finished. Without a `finish_reason` a
//! stream is always `Truncated`.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{json, Value};
use sse_parse::Event;

use super::outcome::{scrub, ProbeError};
use super::upstream::{classify_embedded, error_in, DECLARED_ERROR_STATUS};
use super::wire::{event_json, Collected, Step, StreamDecoder};

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

/// The answer's model, fingerprint and output tokens, from a body or a stream chunk.
fn record_meta(
    c: &mut Collected,
    model: Option<&str>,
    fingerprint: Option<&str>,
    completion_tokens: Option<u64>,
) {
    c.set_model(model);
    if let Some(fp) = fingerprint {
        c.system_fingerprint = Some(fp.to_owned());
    }
    if let Some(n) = completion_tokens.and_then(|n| u32::try_from(n).ok()) {
        c.usage_output_tokens = Some(n);
    }
}

/// An `error` event is the provider declaring a failure, even in a shape we do not recognise.
fn declared_error(event: &Event) -> Result<(), ProbeError> {
    if event.event == "error" {
        return Err(ProbeError::Http {
            status: DECLARED_ERROR_STATUS,
            message: scrub(&format!("error event: {}", event.data)),
        });
    }
    Ok(())
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

/// What a stream chunk's reading uses, borrowed from the event's text (most chunks have no
/// escapes: nothing is copied). A chunk that does not fit this shape exactly (an `error`,
/// `message` or `code` key, a field of another type, a key twice) is read as a
/// [`serde_json::Value`] and brought to this shape by the same lenient rules
/// ([`Chunk::of_value`]), so both ways read a chunk alike; the typed way only saves the
/// parse of every chunk of every stream into a tree of maps.
#[derive(Debug, Default, serde::Deserialize)]
struct Chunk<'a> {
    #[serde(borrow)]
    choices: Option<Vec<Obj<Choice<'a>>>>,
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    system_fingerprint: Option<Cow<'a, str>>,
    usage: Option<Obj<ChunkUsage>>,
    #[serde(default, deserialize_with = "present")]
    error: bool,
    #[serde(default, deserialize_with = "present")]
    message: bool,
    #[serde(default, deserialize_with = "present")]
    code: bool,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ChunkUsage {
    completion_tokens: Option<u64>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct Choice<'a> {
    #[serde(borrow)]
    delta: Option<Obj<Delta<'a>>>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct Delta<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<Obj<ToolCall<'a>>>>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ToolCall<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    function: Option<Obj<Function<'a>>>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct Function<'a> {
    #[serde(borrow)]
    arguments: Option<Cow<'a, str>>,
}

/// `T` from a JSON object only: a derived struct also takes an array, by position, where
/// the tree reading sees no fields.
#[derive(Debug, Default)]
struct Obj<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(ObjectOnly(d)).map(Obj)
    }
}

/// A deserializer that reads a struct from an object and nothing else.
struct ObjectOnly<D>(D);

impl<'de, D: serde::Deserializer<'de>> serde::Deserializer<'de> for ObjectOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(v)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(v)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// A key that is there, whatever its value (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

/// A string where a string belongs, else nothing (the tree reading's rule).
fn text(v: Option<&Value>) -> Option<Cow<'_, str>> {
    v.and_then(Value::as_str).map(Cow::Borrowed)
}

impl<'a> Chunk<'a> {
    /// A chunk read as a tree, by the rules the typed shape stands for: a string where a
    /// string belongs, else nothing; an array where an array belongs, else none.
    fn of_value(v: &'a Value) -> Chunk<'a> {
        Chunk {
            choices: v
                .get("choices")
                .and_then(Value::as_array)
                .map(|cs| cs.iter().map(|c| Obj(Choice::of_value(c))).collect()),
            model: text(v.get("model")),
            system_fingerprint: text(v.get("system_fingerprint")),
            usage: v.get("usage").filter(|u| u.is_object()).map(|u| {
                Obj(ChunkUsage {
                    completion_tokens: u.get("completion_tokens").and_then(Value::as_u64),
                })
            }),
            ..Chunk::default()
        }
    }
}

impl<'a> Choice<'a> {
    fn of_value(c: &'a Value) -> Choice<'a> {
        Choice {
            delta: c.get("delta").map(|d| Obj(Delta::of_value(d))),
            finish_reason: text(c.get("finish_reason")),
        }
    }
}

impl<'a> Delta<'a> {
    /// A missing or odd tool call index is 0.
    fn of_value(d: &'a Value) -> Delta<'a> {
        let call = |call: &'a Value| {
            Obj(ToolCall {
                index: Some(call["index"].as_u64().unwrap_or(0)),
                function: Some(Obj(Function {
                    arguments: text(call["function"].get("arguments")),
                })),
            })
        };
        Delta {
            content: text(d.get("content")),
            reasoning_content: text(d.get("reasoning_content")),
            reasoning: text(d.get("reasoning")),
            refusal: text(d.get("refusal")),
            tool_calls: d["tool_calls"]
                .as_array()
                .map(|calls| calls.iter().map(call).collect()),
        }
    }
}

impl OpenAiStream {
    /// A chunk read (no error in it): its meta and each choice's delta.
    fn apply(&mut self, chunk: Chunk<'_>) -> Result<Step, ProbeError> {
        let Some(choices) = chunk.choices else {
            return Err(ProbeError::Malformed {
                message: "stream chunk without `choices`".into(),
            });
        };
        let completion_tokens = chunk.usage.as_ref().and_then(|u| u.0.completion_tokens);
        record_meta(
            &mut self.c,
            chunk.model.as_deref(),
            chunk.system_fingerprint.as_deref(),
            completion_tokens,
        );
        self.usage_seen |= chunk.usage.is_some();
        for Obj(choice) in choices {
            if let Some(Obj(delta)) = choice.delta {
                let text = delta.content.as_deref().unwrap_or("");
                let reasoning = delta
                    .reasoning_content
                    .as_deref()
                    .or(delta.reasoning.as_deref())
                    .unwrap_or("");
                let a = self.c.push_text(text);
                let b = self.c.push_reasoning(reasoning);
                if a || b {
                    self.c.content_events = self.c.content_events.saturating_add(1);
                }
                if let Some(r) = &delta.refusal {
                    self.refusal.push_str(r);
                }
                for Obj(call) in delta.tool_calls.into_iter().flatten() {
                    let index = call.index.unwrap_or(0);
                    let args = call
                        .function
                        .as_ref()
                        .and_then(|f| f.0.arguments.as_deref())
                        .unwrap_or("");
                    self.c
                        .push_tool_args(usize::try_from(index).unwrap_or(usize::MAX), args);
                }
            }
            if let Some(f) = choice.finish_reason {
                self.c.length_cut = f == "length";
                self.finish_reason = Some(f.into_owned());
            }
        }
        Ok(Step::Continue)
    }

    /// A chunk read as a tree: any JSON, embedded errors recognised.
    fn feed_tree(&mut self, event: &Event) -> Result<Step, ProbeError> {
        let v = event_json(event)?;
        if let Some(e) = error_in(&v) {
            return Err(classify_embedded(e));
        }
        declared_error(event)?;
        self.apply(Chunk::of_value(&v))
    }
}

impl StreamDecoder for OpenAiStream {
    fn feed(&mut self, event: &Event) -> Result<Step, ProbeError> {
        if event.data.trim() == "[DONE]" {
            self.done = true;
            return Ok(Step::Done);
        }
        if let Ok(Obj(chunk)) = serde_json::from_str::<Obj<Chunk>>(&event.data) {
            if !(chunk.error || chunk.message || chunk.code) {
                declared_error(event)?;
                return self.apply(chunk);
            }
        }
        self.feed_tree(event)
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
    record_meta(
        &mut c,
        v.get("model").and_then(Value::as_str),
        v.get("system_fingerprint").and_then(Value::as_str),
        v.get("usage")
            .and_then(|u| u.get("completion_tokens"))
            .and_then(Value::as_u64),
    );
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

    /// Keys of chunks, deltas, tool calls and errors, so random objects hit the read fields.
    const KEYS: &[&str] = &[
        "choices",
        "model",
        "system_fingerprint",
        "usage",
        "error",
        "message",
        "code",
        "content",
        "delta",
        "finish_reason",
        "reasoning_content",
        "reasoning",
        "refusal",
        "tool_calls",
        "index",
        "function",
        "arguments",
        "completion_tokens",
        "id",
    ];

    fn json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (0u64..10).prop_map(Value::from),
            Just(json!(4_294_967_296u64)),
            Just(json!(1.5)),
            "[a-z \\\"\u{e9}]{0,6}".prop_map(Value::from),
            Just(json!("stop")),
            Just(json!("length")),
        ];
        leaf.prop_recursive(4, 48, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                prop::collection::vec((prop::sample::select(KEYS), inner), 0..5).prop_map(|kv| {
                    Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
            ]
        })
    }

    /// Both readings of a chunk, and the decoders after them.
    fn both(data: &str, name: &str) -> (String, String) {
        let event = Event {
            event: name.into(),
            data: data.into(),
            ..Event::default()
        };
        let (mut typed, mut tree) = (OpenAiStream::default(), OpenAiStream::default());
        let a = typed.feed(&event);
        let b = tree.feed_tree(&event);
        (format!("{a:?} {typed:?}"), format!("{b:?} {tree:?}"))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// The typed reading of a chunk decides as the tree reading does, whatever the chunk.
        #[test]
        fn a_chunk_reads_the_same_typed_or_as_a_tree(
            v in json(),
            name in proptest::prelude::prop_oneof![
                proptest::prelude::Just("message"),
                proptest::prelude::Just("error"),
            ],
        ) {
            let data = v.to_string();
            let (typed, tree) = both(&data, name);
            proptest::prop_assert_eq!(typed, tree, "{}", data);
        }
    }

    #[test]
    fn odd_chunks_read_the_same_typed_or_as_a_tree() {
        for data in [
            r#"{"choices":[{"delta":{"content":"a"}}],"model":"m","model":"n"}"#,
            r#"{"choices":[[{"content":"x"},"stop"]]}"#,
            r#"[[{"delta":{"content":"x"}}],"m","fp",null,false,false,false]"#,
            r#"{"choices":[{"delta":[ "x", null, null, null, null ]}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[[3,{"arguments":"{}"}]]}}]}"#,
            r#"{"choices":[{"delta":{"content":"caf\u00e9 \"q\""},"finish_reason":"stop"}],"usage":{"completion_tokens":7}}"#,
            r#"{"message":null,"code":null}"#,
            r#"{"error":null,"choices":[]}"#,
            r#"{"choices":[{"delta":null,"finish_reason":"length"}],"usage":[]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":null,"reasoning":"r"}}]}"#,
            r#"{"choices":[]}  "#,
            r#"{"choices":[]} x"#,
        ] {
            let (typed, tree) = both(data, "message");
            assert_eq!(typed, tree, "{data}");
        }
    }
}
