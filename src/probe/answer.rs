//! A non-streamed OpenAI-compatible answer read straight into the few fields anything reads
//! from it: its model, fingerprint, token counts, and the first choice's message.
//!
//! The proxy reads every answer it forwards, and building a JSON tree of each one (a map per
//! object, a string per key, all of it dropped again) cost more than the rest of the reading.
//! An answer this shape does not take (an `error` member, a content that is not a string, a
//! repeated key, no `choices[0].message` object, …) is read through the tree instead, so the
//! two readings never disagree: the tree is the reference, this is only the quick way to it.

use std::borrow::Cow;
use std::marker::PhantomData;

use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Number, Value};

use super::openai::{body_json, read_body};
use super::outcome::ProbeError;
use super::wire::Collected;

/// `usage.{prompt_tokens, completion_tokens}` as the answer reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub prompt: Option<u64>,
    pub completion: Option<u64>,
}

impl Tokens {
    /// The counts in an answer's (or one stream chunk's) JSON tree.
    pub(crate) fn of(v: &Value) -> Self {
        let u = &v["usage"];
        Self {
            prompt: u["prompt_tokens"].as_u64(),
            completion: u["completion_tokens"].as_u64(),
        }
    }
}

/// Reads a non-streamed answer: what it said (or why it is not an answer) and its token counts.
pub(crate) fn read_answer(body: &[u8]) -> (Result<Collected, ProbeError>, Tokens) {
    if let Ok(Obj(answer)) = serde_json::from_slice::<Obj<Answer>>(body) {
        if let Some(read) = answer.read() {
            return read;
        }
    }
    read_tree(body)
}

/// The reference reading, through the answer's JSON tree.
fn read_tree(body: &[u8]) -> (Result<Collected, ProbeError>, Tokens) {
    match body_json(body) {
        Ok(v) => (read_body(&v), Tokens::of(&v)),
        Err(e) => (Err(e), Tokens::default()),
    }
}

/// The members read from an answer; any other member is skipped without being kept.
#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    system_fingerprint: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<Obj<Usage>>,
    /// Present at all (and not `null`): the tree reads what kind of error it declares.
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(borrow, default)]
    choices: Option<First<Obj<Choice<'a>>>>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<Number>,
    #[serde(default)]
    completion_tokens: Option<Number>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow)]
    message: Obj<Message<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
}

impl Answer<'_> {
    /// What [`read_body`] makes of the same answer, or `None` when the tree must decide.
    fn read(self) -> Option<(Result<Collected, ProbeError>, Tokens)> {
        if self.error.is_some() {
            return None;
        }
        let Obj(choice) = self.choices?.0?;
        let Obj(message) = choice.message;
        let (prompt, completion) = match &self.usage {
            Some(Obj(u)) => (
                u.prompt_tokens.as_ref().and_then(Number::as_u64),
                u.completion_tokens.as_ref().and_then(Number::as_u64),
            ),
            None => (None, None),
        };
        let tokens = Tokens { prompt, completion };
        let mut c = Collected::default();
        c.set_model(self.model.as_deref());
        c.system_fingerprint = self.system_fingerprint.map(Cow::into_owned);
        c.usage_output_tokens = completion.and_then(|n| u32::try_from(n).ok());
        c.push_text(message.content.as_deref().unwrap_or(""));
        c.push_reasoning(message.reasoning_content.as_deref().unwrap_or(""));
        let finish = choice.finish_reason.as_deref();
        let refusal = message.refusal.as_deref().unwrap_or("");
        if let Some(e) = super::openai::refusal(finish, refusal) {
            return Some((Err(e), tokens));
        }
        c.length_cut = finish == Some("length");
        Some((Ok(c), tokens))
    }
}

/// A JSON object only: serde would also take a struct written as an array of its fields in
/// order, which the tree reading does not.
struct Obj<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjVisitor<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(ObjVisitor(PhantomData)).map(Obj)
    }
}

/// An array's first element (`None` when it is empty); the rest are skipped.
struct First<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for First<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FirstVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for FirstVisitor<T> {
            type Value = First<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<First<T>, A::Error> {
                let first = seq.next_element()?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(First(first))
            }
        }
        d.deserialize_seq(FirstVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Answers of every shape either reading might meet; each must read the same both ways.
    const SHAPES: &[&str] = &[
        r#"{"id":"c","model":"m1","system_fingerprint":"fp","choices":[{"index":0,"message":{"role":"assistant","content":"PROBE_OK"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#,
        r#"{"choices":[{"message":{"content":"a\"b\u00e9\n"},"finish_reason":"length"}]}"#,
        r#"{"choices":[{"message":{"content":null,"reasoning_content":"think"}}]}"#,
        r#"{"choices":[{"message":{"content":[{"type":"text","text":"x"}]}}]}"#,
        r#"{"choices":[{"message":{"content":"","refusal":"no"},"finish_reason":"stop"}]}"#,
        r#"{"choices":[{"message":{"content":"x"},"finish_reason":"content_filter"}]}"#,
        r#"{"choices":[{"message":{"content":"x"},"finish_reason":5}]}"#,
        r#"{"choices":[{"message":"x"}]}"#,
        r#"{"choices":[["x","stop"]]}"#,
        r#"{"choices":[{"message":["hi"]}]}"#,
        r#"{"choices":[]}"#,
        r#"{"choices":{"0":{"message":{}}}}"#,
        r#"{"choices":null}"#,
        r#"[null,null,{"prompt_tokens":1},null,[{"message":{"content":"x"}}]]"#,
        r#"{"choices":[{"message":{"content":"x"}}],"error":null}"#,
        r#"{"choices":[{"message":{"content":"x"}}],"error":{"message":"overloaded","code":529}}"#,
        r#"{"choices":[{"message":{"content":"x"}}],"error":"quota"}"#,
        r#"{"choices":[{"message":{"content":"x"}}],"error":0}"#,
        r#"{"message":"bad","code":"invalid_api_key"}"#,
        r#"{"choices":[{"message":{"content":"a"}}],"choices":[{"message":{"content":"b"}}]}"#,
        r#"{"model":"a","model":"b","choices":[{"message":{}}]}"#,
        r#"{"model":7,"choices":[{"message":{}}]}"#,
        r#"{"model":"","choices":[{"message":{}}]}"#,
        r#"{"choices":[{"message":{}}],"usage":{"prompt_tokens":"12","completion_tokens":3}}"#,
        r#"{"choices":[{"message":{}}],"usage":{"prompt_tokens":1.5,"completion_tokens":-3}}"#,
        r#"{"choices":[{"message":{}}],"usage":{"completion_tokens":99999999999}}"#,
        r#"{"choices":[{"message":{}}],"usage":null}"#,
        r#"{"choices":[{"message":{}}],"usage":[1,2]}"#,
        r#"{"choices":[{"message":{"content":"\ud800"}}]}"#,
        r#"{"choices":[{"message":{"content":"x"}}]"#,
        r#"not json"#,
        r#""#,
    ];

    #[test]
    fn every_shape_reads_as_the_tree_reads_it() {
        for body in SHAPES {
            assert_eq!(
                read_answer(body.as_bytes()),
                read_tree(body.as_bytes()),
                "{body}"
            );
        }
    }

    #[test]
    fn a_plain_answer_takes_the_quick_way() {
        let Ok(Obj(answer)) = serde_json::from_slice::<Obj<Answer>>(SHAPES[0].as_bytes()) else {
            panic!("the plain answer did not parse");
        };
        let (c, tokens) = answer.read().expect("read without the tree");
        let c = c.unwrap();
        assert_eq!(
            (c.text.as_str(), c.model.as_deref()),
            ("PROBE_OK", Some("m1"))
        );
        assert_eq!(tokens.prompt, Some(12));
        assert_eq!(c.usage_output_tokens, Some(3));
    }

    /// Members drawn from a pool of values of every JSON kind, repeats allowed.
    fn member() -> impl Strategy<Value = String> {
        let key = prop::sample::select(vec![
            "model",
            "system_fingerprint",
            "usage",
            "error",
            "choices",
            "message",
            "code",
            "content",
            "id",
        ]);
        let scalar = prop::sample::select(vec![
            "null",
            "true",
            "0",
            "7",
            "-1",
            "2.5",
            "1e30",
            "\"\"",
            "\"s\"",
            "\"stop\"",
            "\"length\"",
            "\"content_filter\"",
            "\"a\\u00e9\"",
        ])
        .prop_map(str::to_owned);
        let value = scalar.prop_recursive(3, 24, 4, |inner| {
            let field = prop::sample::select(vec![
                "message",
                "content",
                "reasoning_content",
                "refusal",
                "finish_reason",
                "prompt_tokens",
                "completion_tokens",
                "code",
            ]);
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec((field, inner), 0..4).prop_map(|m| {
                    let m: Vec<String> = m.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", m.join(","))
                }),
            ]
        });
        (key, value).prop_map(|(k, v)| format!("\"{k}\":{v}"))
    }

    /// A `choices` member whose first choice has a message: the shape the quick way takes,
    /// with values of every kind in its fields.
    fn choices() -> impl Strategy<Value = String> {
        let text = prop::sample::select(vec![
            "null",
            "\"\"",
            "\" \"",
            "\"PROBE_OK\"",
            "\"no\"",
            "\"stop\"",
            "\"length\"",
            "\"content_filter\"",
            "\"a\\\"b\"",
            "3",
            "[]",
            "{}",
        ]);
        let field = prop::sample::select(vec!["content", "reasoning_content", "refusal", "role"]);
        let message = prop::collection::vec((field, text.clone()), 0..4).prop_map(|m| {
            let m: Vec<String> = m.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", m.join(","))
        });
        (message, prop::option::of(text), 1..3usize).prop_map(|(message, finish, n)| {
            let finish = finish.map_or(String::new(), |f| format!(",\"finish_reason\":{f}"));
            let choice = format!("{{\"index\":0,\"message\":{message}{finish}}}");
            format!("\"choices\":[{}]", vec![choice; n].join(","))
        })
    }

    /// Top-level members beside the choices: model, fingerprint, usage of any kind.
    fn meta() -> impl Strategy<Value = String> {
        let count =
            prop::sample::select(vec!["null", "0", "12", "4294967296", "-1", "1.5", "\"3\""]);
        let usage = (count.clone(), count).prop_map(|(p, c)| {
            format!("\"usage\":{{\"prompt_tokens\":{p},\"completion_tokens\":{c}}}")
        });
        let name = prop::sample::select(vec!["null", "\"\"", "\"m1\"", "7"]);
        prop_oneof![
            usage,
            name.clone().prop_map(|v| format!("\"model\":{v}")),
            name.prop_map(|v| format!("\"system_fingerprint\":{v}")),
            member(),
        ]
    }

    proptest! {
        #[test]
        fn any_answer_reads_as_the_tree_reads_it(members in prop::collection::vec(member(), 0..6)) {
            let body = format!("{{{}}}", members.join(","));
            prop_assert_eq!(read_answer(body.as_bytes()), read_tree(body.as_bytes()), "{}", body);
        }

        #[test]
        fn answers_with_a_message_read_as_the_tree_reads_them(
            choices in choices(),
            mut members in prop::collection::vec(meta(), 0..5),
            at in any::<prop::sample::Index>(),
        ) {
            members.insert(at.index(members.len() + 1), choices);
            let body = format!("{{{}}}", members.join(","));
            prop_assert_eq!(read_answer(body.as_bytes()), read_tree(body.as_bytes()), "{}", body);
        }
    }
}
