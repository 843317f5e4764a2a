//! The capability probes' requests and the checks of their answers, in each provider's
//! documented wire format (pure).
//!
//! - `tools`: one function `probe_echo(token: string)`, forced (OpenAI `tool_choice:
//!   {"type": "function", "function": {"name": "probe_echo"}}`, Anthropic `tool_choice:
//!   {"type": "tool", "name": "probe_echo"}`). The answer must call it with arguments equal to
//!   `{"token": "PROBE_OK"}` — OpenAI's `choices[0].message.tool_calls[0].function.arguments`
//!   is a JSON *string*, Anthropic's `tool_use` block carries `input` as an object.
//! - `json_schema`: OpenAI `response_format: {"type": "json_schema", "json_schema": {"name":
//!   "probe", "strict": true, "schema": …}}`, the answer's `message.content` parsed and
//!   validated against [`schema`]. The Messages API has no `response_format`: Anthropic's
//!   documented way to get JSON of a schema is a forced tool whose `input_schema` is the
//!   schema, so the `tool_use` block's `input` is validated instead.
//!
//! Both are sent without streaming: what is tested is the structure of the answer, and the
//! chat probe already measures the stream.

use serde_json::{json, Value};

use super::Probed;
use crate::route::ProviderKind;

/// The function the `tools` probe forces.
pub const TOOL: &str = "probe_echo";
/// The tool Anthropic's `json_schema` probe forces (its `input_schema` is [`schema`]).
pub const SCHEMA_TOOL: &str = "probe";
/// The token every answer must carry.
pub const TOKEN: &str = "PROBE_OK";
/// Enough for either answer; a model that needs more is not answering the probe.
pub const MAX_TOKENS: u32 = 64;

/// The fixed two-field object both `json_schema` probes ask for.
pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "token": {"type": "string"},
            "n": {"type": "integer"}
        },
        "required": ["token", "n"],
        "additionalProperties": false
    })
}

fn echo_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {"token": {"type": "string", "description": "The token to echo."}},
        "required": ["token"],
        "additionalProperties": false
    })
}

fn prompt(cap: Probed) -> &'static str {
    match cap {
        Probed::Tools => "Call the probe_echo function with token PROBE_OK.",
        Probed::JsonSchema => "Answer with a JSON object whose token is PROBE_OK and n is 1.",
    }
}

/// The texts a probe of `cap` sends, for the cost table: the prompt and the tool or schema
/// definition (the model reads both as input).
pub fn input_texts(cap: Probed) -> [String; 2] {
    let body = request_body(ProviderKind::Openai, cap, "");
    let definition = match cap {
        Probed::Tools => body["tools"].to_string(),
        Probed::JsonSchema => body["response_format"].to_string(),
    };
    [prompt(cap).to_owned(), definition]
}

/// The request body of `cap`'s probe for a route of `kind` serving `model`.
pub fn request_body(kind: ProviderKind, cap: Probed, model: &str) -> Value {
    let user = json!([{"role": "user", "content": prompt(cap)}]);
    match (kind, cap) {
        (ProviderKind::Openai, Probed::Tools) => json!({
            "model": model,
            "messages": user,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": false,
            "tools": [{
                "type": "function",
                "function": {
                    "name": TOOL,
                    "description": "Echoes a token back.",
                    "parameters": echo_parameters()
                }
            }],
            "tool_choice": {"type": "function", "function": {"name": TOOL}}
        }),
        (ProviderKind::Openai, Probed::JsonSchema) => json!({
            "model": model,
            "messages": user,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": false,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "probe", "strict": true, "schema": schema()}
            }
        }),
        (ProviderKind::Anthropic, cap) => {
            let (name, description, input_schema) = match cap {
                Probed::Tools => (TOOL, "Echoes a token back.", echo_parameters()),
                Probed::JsonSchema => (SCHEMA_TOOL, "Records the answer.", schema()),
            };
            json!({
                "model": model,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "messages": user,
                "tools": [{"name": name, "description": description, "input_schema": input_schema}],
                "tool_choice": {"type": "tool", "name": name}
            })
        }
    }
}

/// Why an answer does not show the capability; short, with no answer text beyond a cut
/// excerpt of what failed to parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("answer is not JSON")]
    NotJson,
    #[error("no tool call in the answer")]
    NoToolCall,
    #[error("called {0:?}, not {TOOL}")]
    WrongTool(String),
    #[error("tool call arguments are not JSON: {0}")]
    ArgumentsNotJson(String),
    #[error("tool call arguments are {0}, not {{\"token\":\"PROBE_OK\"}}")]
    WrongArguments(String),
    #[error("no content in the answer")]
    NoContent,
    #[error("content is not JSON: {0}")]
    ContentNotJson(String),
    #[error("content does not match the schema: {0}")]
    SchemaMismatch(String),
    #[error("token is {0}, not PROBE_OK")]
    WrongToken(String),
}

const EXCERPT: usize = 60;

fn excerpt(s: &str) -> String {
    let mut out: String = s.chars().take(EXCERPT).collect();
    if s.chars().count() > EXCERPT {
        out.push('…');
    }
    out
}

/// Checks a 200 answer's body for `cap`.
pub fn check(kind: ProviderKind, cap: Probed, body: &[u8]) -> Result<(), AnswerError> {
    let v: Value = serde_json::from_slice(body).map_err(|_| AnswerError::NotJson)?;
    match (kind, cap) {
        (ProviderKind::Openai, Probed::Tools) => {
            let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
            let name = call["name"].as_str().ok_or(AnswerError::NoToolCall)?;
            if name != TOOL {
                return Err(AnswerError::WrongTool(excerpt(name)));
            }
            let args = call["arguments"].as_str().ok_or(AnswerError::NoToolCall)?;
            let args: Value = serde_json::from_str(args)
                .map_err(|_| AnswerError::ArgumentsNotJson(excerpt(args)))?;
            echo(&args)
        }
        (ProviderKind::Openai, Probed::JsonSchema) => {
            let content = v["choices"][0]["message"]["content"]
                .as_str()
                .ok_or(AnswerError::NoContent)?;
            let doc: Value = serde_json::from_str(content)
                .map_err(|_| AnswerError::ContentNotJson(excerpt(content)))?;
            conforms(&doc)
        }
        (ProviderKind::Anthropic, cap) => {
            let want = match cap {
                Probed::Tools => TOOL,
                Probed::JsonSchema => SCHEMA_TOOL,
            };
            let block = v["content"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|b| b["type"] == "tool_use")
                .ok_or(AnswerError::NoToolCall)?;
            let name = block["name"].as_str().unwrap_or("");
            if name != want {
                return Err(AnswerError::WrongTool(excerpt(name)));
            }
            let input = block.get("input").ok_or(AnswerError::NoToolCall)?;
            match cap {
                Probed::Tools => echo(input),
                Probed::JsonSchema => conforms(input),
            }
        }
    }
}

fn echo(args: &Value) -> Result<(), AnswerError> {
    if *args == json!({"token": TOKEN}) {
        Ok(())
    } else {
        Err(AnswerError::WrongArguments(excerpt(&args.to_string())))
    }
}

fn conforms(doc: &Value) -> Result<(), AnswerError> {
    // The schema is fixed and valid: building its validator cannot fail.
    let valid = jsonschema::validator_for(&schema())
        .map(|v| v.is_valid(doc))
        .unwrap_or(false);
    if !valid {
        return Err(AnswerError::SchemaMismatch(excerpt(&doc.to_string())));
    }
    match doc["token"].as_str() {
        Some(TOKEN) => Ok(()),
        other => Err(AnswerError::WrongToken(excerpt(other.unwrap_or("")))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn openai_tool(args: &str) -> Vec<u8> {
        json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "probe_echo", "arguments": args}}]}}]})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn openai_tool_calls_are_parsed_from_their_argument_string() {
        let k = ProviderKind::Openai;
        assert_eq!(
            check(k, Probed::Tools, &openai_tool(r#"{"token":"PROBE_OK"}"#)),
            Ok(())
        );
        assert!(matches!(
            check(k, Probed::Tools, &openai_tool(r#"{"token": PROBE"#)),
            Err(AnswerError::ArgumentsNotJson(_))
        ));
        assert!(matches!(
            check(k, Probed::Tools, &openai_tool(r#"{"token":"nope"}"#)),
            Err(AnswerError::WrongArguments(_))
        ));
    }

    #[test]
    fn json_schema_answers_are_validated_and_carry_the_token() {
        let k = ProviderKind::Openai;
        let content = |c: &str| {
            json!({"choices": [{"message": {"role": "assistant", "content": c}}]})
                .to_string()
                .into_bytes()
        };
        let ok = content(r#"{"token":"PROBE_OK","n":1}"#);
        assert_eq!(check(k, Probed::JsonSchema, &ok), Ok(()));
        let missing = content(r#"{"token":"PROBE_OK"}"#);
        assert!(matches!(
            check(k, Probed::JsonSchema, &missing),
            Err(AnswerError::SchemaMismatch(_))
        ));
        let extra = content(r#"{"token":"PROBE_OK","n":1,"x":2}"#);
        assert!(check(k, Probed::JsonSchema, &extra).is_err());
    }

    #[test]
    fn anthropic_answers_are_read_from_the_tool_use_block() {
        let a = ProviderKind::Anthropic;
        let msg = |name: &str, input: Value| {
            json!({"type": "message", "role": "assistant", "stop_reason": "tool_use",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": name, "input": input}]})
            .to_string()
            .into_bytes()
        };
        assert_eq!(
            check(
                a,
                Probed::Tools,
                &msg("probe_echo", json!({"token": "PROBE_OK"}))
            ),
            Ok(())
        );
        assert_eq!(
            check(
                a,
                Probed::JsonSchema,
                &msg("probe", json!({"token": "PROBE_OK", "n": 3}))
            ),
            Ok(())
        );
        assert!(check(
            a,
            Probed::JsonSchema,
            &msg("probe", json!({"token": "PROBE_OK", "n": "3"}))
        )
        .is_err());
        let body = request_body(a, Probed::JsonSchema, "claude");
        assert_eq!(
            body["tool_choice"],
            json!({"type": "tool", "name": "probe"})
        );
        assert_eq!(body["tools"][0]["input_schema"], schema());
    }
}
