//! Structured-output validity: does an answer to a request that asked for JSON
//! (`response_format` `json_object` or `json_schema`) or offered tools hold what was asked?
//!
//! [`check`] is pure apart from the compiled-schema cache: the content must parse as JSON, a
//! `json_schema` answer must validate against the request's own schema (the `jsonschema`
//! crate, no remote `$ref`s), and every tool call's `arguments` must parse as JSON. Errors name
//! what failed and where (a serde position, a JSON pointer and the schema keyword), never the
//! answer's text, so they can be kept as evidence.
//!
//! Bounds: a schema over [`MAX_SCHEMA_BYTES`] (serialised) is not compiled ("not checked");
//! compiled schemas are cached by the SHA-256 of their serialisation, at most
//! [`MAX_CACHED_SCHEMAS`] (the oldest goes first), so a client sending a new schema with every
//! request costs one compile each, never unbounded memory.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Schemas larger than this (serialised) are not compiled.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Compiled schemas kept, at most.
pub const MAX_CACHED_SCHEMAS: usize = 256;
/// Error texts are cut to this many characters.
const MAX_ERROR_CHARS: usize = 200;

/// What the request asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// Nothing structured: the answer is not judged.
    Nothing,
    /// `response_format: {"type": "json_object"}`.
    JsonObject,
    /// `response_format: {"type": "json_schema", "json_schema": {"schema": …}}`.
    JsonSchema(Arc<Value>),
    /// Only tools were offered: tool-call arguments must parse.
    Tools,
}

impl Expect {
    /// What `request` (an OpenAI chat completion body) asks of its answer.
    pub fn of(request: &Value) -> Self {
        let rf = &request["response_format"];
        match rf["type"].as_str() {
            Some("json_object") => return Self::JsonObject,
            Some("json_schema") => {
                let schema = &rf["json_schema"]["schema"];
                return Self::JsonSchema(Arc::new(schema.clone()));
            }
            _ => {}
        }
        let tools = request["tools"].as_array().is_some_and(|t| !t.is_empty())
            || request["functions"]
                .as_array()
                .is_some_and(|t| !t.is_empty());
        if tools {
            Self::Tools
        } else {
            Self::Nothing
        }
    }

    pub fn is_nothing(&self) -> bool {
        matches!(self, Self::Nothing)
    }
}

/// The verdict on one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Validity {
    /// The request asked for nothing structured (or the answer had nothing to judge).
    NotApplicable,
    Valid,
    /// What failed, without the answer's text.
    Invalid(String),
    /// The answer could not be judged (over a bound, an unusable schema).
    NotChecked(&'static str),
}

/// Judges one answer: `answer_content` is the message content (empty when there was none),
/// `tool_args` every tool call's `arguments` string.
#[cfg(test)]
pub fn check(request: &Value, answer_content: &str, tool_args: &[&str]) -> Validity {
    judge(&Expect::of(request), answer_content, tool_args)
}

/// [`check`] with the request's expectation already read.
pub fn judge(expect: &Expect, content: &str, tool_args: &[&str]) -> Validity {
    if expect.is_nothing() {
        return Validity::NotApplicable;
    }
    for (i, args) in tool_args.iter().enumerate() {
        if let Err(e) = serde_json::from_str::<Value>(args) {
            return Validity::Invalid(cut(&format!("tool call {i}: arguments are not JSON: {e}")));
        }
    }
    // A tool call answers instead of the content: the content is judged only when present.
    if content.trim().is_empty() {
        return if tool_args.is_empty() {
            match expect {
                Expect::Tools => Validity::NotApplicable,
                _ => Validity::Invalid("empty content where JSON was asked for".into()),
            }
        } else {
            Validity::Valid
        };
    }
    let schema = match expect {
        Expect::Nothing => return Validity::NotApplicable,
        Expect::Tools => return Validity::Valid,
        Expect::JsonObject => None,
        Expect::JsonSchema(s) => Some(s),
    };
    let value: Value = match serde_json::from_str(content) {
        Ok(v) => v,
        Err(e) => return Validity::Invalid(cut(&format!("content is not JSON: {e}"))),
    };
    let Some(schema) = schema else {
        return if value.is_object() {
            Validity::Valid
        } else {
            Validity::Invalid("content is JSON but not an object".into())
        };
    };
    let validator = match compiled(schema) {
        Ok(v) => v,
        Err(why) => return Validity::NotChecked(why),
    };
    let first = validator.iter_errors(&value).next().map(|e| {
        let at = e.instance_path().as_str();
        let at = if at.is_empty() { "/" } else { at };
        cut(&format!(
            "content does not match the schema at {at} (keyword {})",
            e.kind().keyword()
        ))
    });
    first.map_or(Validity::Valid, Validity::Invalid)
}

fn cut(s: &str) -> String {
    s.chars().take(MAX_ERROR_CHARS).collect()
}

/// The compiled schemas, by digest, oldest first for eviction.
#[derive(Default)]
struct Cache {
    map: HashMap<[u8; 32], Arc<jsonschema::Validator>>,
    order: VecDeque<[u8; 32]>,
}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

/// The compiled schema (cached), or why it cannot be used.
fn compiled(schema: &Value) -> Result<Arc<jsonschema::Validator>, &'static str> {
    let text = serde_json::to_vec(schema).map_err(|_| "schema_unusable")?;
    if text.len() > MAX_SCHEMA_BYTES {
        return Err("schema_too_large");
    }
    let digest: [u8; 32] = Sha256::digest(&text).into();
    if let Some(v) = cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .map
        .get(&digest)
    {
        return Ok(v.clone());
    }
    // Compiled outside the lock: a slow schema holds up no other answer's check.
    let v = Arc::new(jsonschema::validator_for(schema).map_err(|_| "schema_unusable")?);
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    if !c.map.contains_key(&digest) {
        while c.map.len() >= MAX_CACHED_SCHEMAS {
            match c.order.pop_front() {
                Some(old) => {
                    c.map.remove(&old);
                }
                None => break,
            }
        }
        c.map.insert(digest, v.clone());
        c.order.push_back(digest);
    }
    Ok(v)
}

/// Compiled schemas held now (for tests of the bound).
#[cfg(test)]
pub fn cached_schemas() -> usize {
    cache().lock().unwrap_or_else(|e| e.into_inner()).map.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema_request() -> Value {
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"]
        }}}})
    }

    #[test]
    fn json_object_answers_must_parse_as_objects() {
        let r = json!({"response_format": {"type": "json_object"}});
        assert_eq!(check(&r, r#"{"a": 1}"#, &[]), Validity::Valid);
        let Validity::Invalid(e) = check(&r, r#"{"a": 1"#, &[]) else {
            panic!("truncated JSON must be invalid")
        };
        assert!(e.starts_with("content is not JSON"), "{e}");
        assert!(!e.contains("\"a\""), "no answer text in the error: {e}");
        assert!(matches!(check(&r, "[1]", &[]), Validity::Invalid(_)));
        assert!(matches!(check(&r, "  ", &[]), Validity::Invalid(_)));
    }

    #[test]
    fn json_schema_answers_must_match_the_schema() {
        let r = schema_request();
        assert_eq!(
            check(&r, r#"{"name": "Ann", "age": 3}"#, &[]),
            Validity::Valid
        );
        let Validity::Invalid(e) = check(&r, r#"{"name": "Ann", "age": "three"}"#, &[]) else {
            panic!("a schema violation must be invalid")
        };
        assert_eq!(
            e,
            "content does not match the schema at /age (keyword type)"
        );
        assert!(!e.contains("three"));
        let Validity::Invalid(e) = check(&r, r#"{"name": "Ann"}"#, &[]) else {
            panic!("a missing property must be invalid")
        };
        assert!(e.contains("required"), "{e}");
    }

    #[test]
    fn tool_arguments_must_parse() {
        let r = json!({"tools": [{"type": "function", "function": {"name": "f"}}]});
        assert_eq!(check(&r, "", &[r#"{"x": 1}"#]), Validity::Valid);
        assert_eq!(check(&r, "plain words", &[]), Validity::Valid);
        assert_eq!(check(&r, "", &[]), Validity::NotApplicable);
        let Validity::Invalid(e) = check(&r, "", &[r#"{"x": 1}"#, r#"{"x":"#]) else {
            panic!("broken arguments must be invalid")
        };
        assert!(e.starts_with("tool call 1: arguments are not JSON"), "{e}");
        assert_eq!(check(&json!({}), "{", &[]), Validity::NotApplicable);
    }

    #[test]
    fn schemas_are_bounded_and_cached() {
        let big = "x".repeat(MAX_SCHEMA_BYTES);
        let r = json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {
            "description": big
        }}}});
        assert_eq!(
            check(&r, "{}", &[]),
            Validity::NotChecked("schema_too_large")
        );
        let bad = json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {
            "type": 12
        }}}});
        assert_eq!(
            check(&bad, "{}", &[]),
            Validity::NotChecked("schema_unusable")
        );
        for i in 0..(MAX_CACHED_SCHEMAS + 5) {
            let r = json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {
                "type": "object", "title": format!("s{i}")
            }}}});
            assert_eq!(check(&r, "{}", &[]), Validity::Valid);
        }
        assert!(cached_schemas() <= MAX_CACHED_SCHEMAS);
    }
}
