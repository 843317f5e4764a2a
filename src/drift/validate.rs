//! Validators: what a regression case's answer must look like. Each is a pure check of the
//! answer text, so every rule is unit-tested without a server.
//!
//! `json_schema` is a small, strict subset of JSON Schema (draft 2020-12 keywords) written
//! here rather than the `jsonschema` crate, which would add some forty dependencies (regex
//! engines, URL resolution, HTTP for remote `$ref`s) for what a regression case needs. The
//! subset: `type`, `properties`, `required`, `additionalProperties`, `items`, `enum`, `const`,
//! `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `minLength`, `maxLength`,
//! `pattern`, `minItems`, `maxItems`, and the annotations `title`, `description`, `$schema`.
//! Any other keyword is rejected when the set is loaded, so no schema is silently half-checked.

use regex::Regex;
use serde_json::{Map, Value};

/// One check of an answer. Text comparisons (`exact`, `one_of`) trim surrounding whitespace,
/// like the `PROBE_OK` probe; `json`/`json_schema` parse the trimmed answer as it is (a Markdown
/// code fence around it is a format change, and so a failure).
#[derive(Debug, Clone)]
pub enum Validator {
    Exact(String),
    /// Every string must appear.
    Contains(Vec<String>),
    /// Matched anywhere; anchor with `^…$` for the whole answer.
    Regex(Regex),
    Json,
    JsonSchema(Box<Schema>),
    MinChars(usize),
    MaxChars(usize),
    OneOf(Vec<String>),
}

impl Validator {
    /// The key that declares it in a set file, also how failures name it.
    pub fn name(&self) -> &'static str {
        match self {
            Validator::Exact(_) => "exact",
            Validator::Contains(_) => "contains",
            Validator::Regex(_) => "regex",
            Validator::Json => "json",
            Validator::JsonSchema(_) => "json_schema",
            Validator::MinChars(_) => "min_chars",
            Validator::MaxChars(_) => "max_chars",
            Validator::OneOf(_) => "one_of",
        }
    }

    /// `Err` with a short reason (bounded: it is stored and shown).
    pub fn check(&self, answer: &str) -> Result<(), String> {
        let trimmed = answer.trim();
        match self {
            Validator::Exact(want) => {
                if trimmed == want.trim() {
                    Ok(())
                } else {
                    Err(format!("expected exactly {:?}", excerpt(want, 60)))
                }
            }
            Validator::Contains(needles) => match needles.iter().find(|n| !answer.contains(*n)) {
                None => Ok(()),
                Some(n) => Err(format!("does not contain {:?}", excerpt(n, 60))),
            },
            Validator::Regex(re) => {
                if re.is_match(answer) {
                    Ok(())
                } else {
                    Err(format!("does not match /{}/", excerpt(re.as_str(), 60)))
                }
            }
            Validator::Json => serde_json::from_str::<Value>(trimmed)
                .map(|_| ())
                .map_err(|e| format!("not JSON: {e}")),
            Validator::JsonSchema(schema) => {
                let v: Value =
                    serde_json::from_str(trimmed).map_err(|e| format!("not JSON: {e}"))?;
                schema.validate(&v)
            }
            Validator::MinChars(n) => {
                let len = trimmed.chars().count();
                if len >= *n {
                    Ok(())
                } else {
                    Err(format!("{len} chars, fewer than {n}"))
                }
            }
            Validator::MaxChars(n) => {
                let len = trimmed.chars().count();
                if len <= *n {
                    Ok(())
                } else {
                    Err(format!("{len} chars, more than {n}"))
                }
            }
            Validator::OneOf(options) => {
                if options.iter().any(|o| o.trim() == trimmed) {
                    Ok(())
                } else {
                    Err(format!("not one of {} allowed answers", options.len()))
                }
            }
        }
    }
}

/// At most `max` characters, `…` marking a cut; newlines shown as `⏎` so an excerpt stays on
/// one report line.
pub fn excerpt(s: &str, max: usize) -> String {
    let flat: String = s
        .trim()
        .chars()
        .map(|c| if c == '\n' { '⏎' } else { c })
        .collect();
    crate::probe::outcome::truncate_chars(&flat, max)
}

/// A compiled schema of the supported subset.
#[derive(Debug, Clone)]
pub struct Schema {
    types: Option<Vec<String>>,
    properties: Vec<(String, Schema)>,
    required: Vec<String>,
    /// `None`: allowed (the default); `Some(None)`: forbidden; `Some(Some(s))`: must match `s`.
    additional: Option<Option<Box<Schema>>>,
    items: Option<Box<Schema>>,
    enumeration: Option<Vec<Value>>,
    constant: Option<Value>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: Option<f64>,
    exclusive_maximum: Option<f64>,
    min_length: Option<usize>,
    max_length: Option<usize>,
    pattern: Option<Regex>,
    min_items: Option<usize>,
    max_items: Option<usize>,
}

const TYPES: &[&str] = &[
    "object", "array", "string", "number", "integer", "boolean", "null",
];

const KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "title",
    "description",
    "$schema",
];

/// Where in a schema a compile error is (a key path below the schema's own, e.g.
/// `properties.total.type`), and what is wrong.
pub type SchemaError = (String, String);

impl Schema {
    /// Compiles a schema; errors name the offending keyword's path within the schema.
    pub fn compile(v: &Value) -> Result<Schema, SchemaError> {
        compile_at(v, "")
    }

    /// `Err` names the first violation and where (`$.items[2].name`).
    pub fn validate(&self, v: &Value) -> Result<(), String> {
        self.check(v, "$")
    }

    fn check(&self, v: &Value, at: &str) -> Result<(), String> {
        if let Some(types) = &self.types {
            if !types.iter().any(|t| type_matches(t, v)) {
                return Err(format!(
                    "{at}: expected {}, got {}",
                    types.join(" or "),
                    type_of(v)
                ));
            }
        }
        if let Some(c) = &self.constant {
            if !json_eq(c, v) {
                return Err(format!("{at}: must equal {c}"));
            }
        }
        if let Some(options) = &self.enumeration {
            if !options.iter().any(|o| json_eq(o, v)) {
                return Err(format!(
                    "{at}: {} is not one of the allowed values",
                    excerpt(&v.to_string(), 40)
                ));
            }
        }
        match v {
            Value::Object(map) => self.check_object(map, at)?,
            Value::Array(items) => {
                if let Some(min) = self.min_items {
                    if items.len() < min {
                        return Err(format!("{at}: {} items, fewer than {min}", items.len()));
                    }
                }
                if let Some(max) = self.max_items {
                    if items.len() > max {
                        return Err(format!("{at}: {} items, more than {max}", items.len()));
                    }
                }
                if let Some(schema) = &self.items {
                    for (i, item) in items.iter().enumerate() {
                        schema.check(item, &format!("{at}[{i}]"))?;
                    }
                }
            }
            Value::String(s) => {
                let len = s.chars().count();
                if self.min_length.is_some_and(|m| len < m)
                    || self.max_length.is_some_and(|m| len > m)
                {
                    return Err(format!("{at}: string length {len} out of bounds"));
                }
                if let Some(re) = &self.pattern {
                    if !re.is_match(s) {
                        return Err(format!("{at}: does not match /{}/", re.as_str()));
                    }
                }
            }
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                let bad = self.minimum.is_some_and(|m| x < m)
                    || self.maximum.is_some_and(|m| x > m)
                    || self.exclusive_minimum.is_some_and(|m| x <= m)
                    || self.exclusive_maximum.is_some_and(|m| x >= m);
                if bad {
                    return Err(format!("{at}: {n} out of bounds"));
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn check_object(&self, map: &Map<String, Value>, at: &str) -> Result<(), String> {
        if let Some(missing) = self.required.iter().find(|k| !map.contains_key(*k)) {
            return Err(format!("{at}: missing required property {missing:?}"));
        }
        for (key, value) in map {
            let path = format!("{at}.{key}");
            match self.properties.iter().find(|(k, _)| k == key) {
                Some((_, schema)) => schema.check(value, &path)?,
                None => match &self.additional {
                    Some(None) => return Err(format!("{at}: unexpected property {key:?}")),
                    Some(Some(schema)) => schema.check(value, &path)?,
                    None => {}
                },
            }
        }
        Ok(())
    }
}

fn join(base: &str, key: &str) -> String {
    if base.is_empty() {
        key.to_owned()
    } else {
        format!("{base}.{key}")
    }
}

fn compile_at(v: &Value, path: &str) -> Result<Schema, SchemaError> {
    let err = |key: &str, msg: String| Err((join(path, key), msg));
    let Value::Object(map) = v else {
        return Err((path.to_owned(), "a schema must be a table".to_owned()));
    };
    let mut s = Schema {
        types: None,
        properties: Vec::new(),
        required: Vec::new(),
        additional: None,
        items: None,
        enumeration: None,
        constant: None,
        minimum: None,
        maximum: None,
        exclusive_minimum: None,
        exclusive_maximum: None,
        min_length: None,
        max_length: None,
        pattern: None,
        min_items: None,
        max_items: None,
    };
    for (key, value) in map {
        let here = join(path, key);
        let number = || {
            value
                .as_f64()
                .ok_or_else(|| (here.clone(), "must be a number".to_owned()))
        };
        let count = || {
            value
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| (here.clone(), "must be a non-negative integer".to_owned()))
        };
        match key.as_str() {
            "type" => {
                let names: Vec<String> = match value {
                    Value::String(t) => vec![t.clone()],
                    Value::Array(ts) => ts
                        .iter()
                        .map(|t| t.as_str().map(str::to_owned))
                        .collect::<Option<_>>()
                        .ok_or_else(|| {
                            (
                                here.clone(),
                                "must be a type name or an array of them".to_owned(),
                            )
                        })?,
                    _ => return err(key, "must be a type name or an array of them".into()),
                };
                if let Some(bad) = names.iter().find(|t| !TYPES.contains(&t.as_str())) {
                    return err(
                        key,
                        format!("unknown type {bad:?} (known: {})", TYPES.join(", ")),
                    );
                }
                s.types = Some(names);
            }
            "properties" => {
                let Value::Object(props) = value else {
                    return err(key, "must be a table of schemas".into());
                };
                for (name, sub) in props {
                    s.properties
                        .push((name.clone(), compile_at(sub, &join(&here, name))?));
                }
            }
            "required" => {
                s.required = value
                    .as_array()
                    .and_then(|a| a.iter().map(|k| k.as_str().map(str::to_owned)).collect())
                    .ok_or_else(|| {
                        (
                            here.clone(),
                            "must be an array of property names".to_owned(),
                        )
                    })?;
            }
            "additionalProperties" => match value {
                Value::Bool(true) => {}
                Value::Bool(false) => s.additional = Some(None),
                sub => s.additional = Some(Some(Box::new(compile_at(sub, &here)?))),
            },
            "items" => s.items = Some(Box::new(compile_at(value, &here)?)),
            "enum" => {
                s.enumeration = Some(
                    value
                        .as_array()
                        .cloned()
                        .ok_or_else(|| (here.clone(), "must be an array".to_owned()))?,
                )
            }
            "const" => s.constant = Some(value.clone()),
            "minimum" => s.minimum = Some(number()?),
            "maximum" => s.maximum = Some(number()?),
            "exclusiveMinimum" => s.exclusive_minimum = Some(number()?),
            "exclusiveMaximum" => s.exclusive_maximum = Some(number()?),
            "minLength" => s.min_length = Some(count()?),
            "maxLength" => s.max_length = Some(count()?),
            "minItems" => s.min_items = Some(count()?),
            "maxItems" => s.max_items = Some(count()?),
            "pattern" => {
                let p = value
                    .as_str()
                    .ok_or_else(|| (here.clone(), "must be a string".to_owned()))?;
                s.pattern =
                    Some(Regex::new(p).map_err(|e| (here.clone(), one_line(&e.to_string())))?);
            }
            "title" | "description" | "$schema" => {}
            other => {
                return err(
                    key,
                    format!(
                        "unsupported JSON Schema keyword `{other}` (supported: {})",
                        KEYWORDS.join(", ")
                    ),
                )
            }
        }
    }
    Ok(s)
}

pub(crate) fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => match v {
            Value::Number(n) => {
                n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|x| x.fract() == 0.0)
            }
            _ => false,
        },
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    }
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
        Value::Null => "null",
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`, as JSON Schema says).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(v: &Validator, answer: &str) -> bool {
        v.check(answer).is_ok()
    }

    #[test]
    fn exact_trims_and_compares() {
        let v = Validator::Exact("Paris".into());
        assert!(ok(&v, " Paris\n"));
        assert!(!ok(&v, "Paris."));
        assert!(!ok(&v, "paris"));
        assert_eq!(v.name(), "exact");
    }

    #[test]
    fn contains_needs_every_needle() {
        let v = Validator::Contains(vec!["alpha".into(), "beta".into()]);
        assert!(ok(&v, "beta then alpha"));
        let e = v.check("alpha only").unwrap_err();
        assert!(e.contains("beta"), "{e}");
    }

    #[test]
    fn regex_matches_anywhere_unless_anchored() {
        let v = Validator::Regex(Regex::new(r"\d{4}-\d{2}-\d{2}").unwrap());
        assert!(ok(&v, "on 2026-01-31."));
        assert!(!ok(&v, "on Jan 31"));
        let anchored = Validator::Regex(Regex::new(r"^\d+$").unwrap());
        assert!(ok(&anchored, "42"));
        assert!(!ok(&anchored, "42 apples"));
    }

    #[test]
    fn json_parses_the_trimmed_answer_and_refuses_fences() {
        assert!(ok(&Validator::Json, " {\"a\": 1}\n"));
        assert!(ok(&Validator::Json, "[1, 2]"));
        assert!(!ok(&Validator::Json, "```json\n{\"a\": 1}\n```"));
        assert!(!ok(&Validator::Json, "Sure! {\"a\": 1}"));
    }

    #[test]
    fn char_bounds_count_characters_not_bytes() {
        assert!(ok(&Validator::MinChars(2), "你好"));
        assert!(!ok(&Validator::MinChars(3), "你好"));
        assert!(ok(&Validator::MaxChars(2), " 你好 "));
        assert!(!ok(&Validator::MaxChars(1), "你好"));
    }

    #[test]
    fn one_of_trims() {
        let v = Validator::OneOf(vec!["yes".into(), "no".into()]);
        assert!(ok(&v, "no\n"));
        assert!(!ok(&v, "No."));
    }

    fn schema(v: Value) -> Schema {
        Schema::compile(&v).unwrap()
    }

    #[test]
    fn schema_checks_types_required_and_extra_properties() {
        let s = schema(json!({
            "type": "object",
            "required": ["name", "age"],
            "additionalProperties": false,
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}
            }
        }));
        assert!(s.validate(&json!({"name": "Li", "age": 30})).is_ok());
        assert!(s.validate(&json!({"name": "Li", "age": 30.0})).is_ok());
        let e = s.validate(&json!({"name": "Li"})).unwrap_err();
        assert!(e.contains("\"age\""), "{e}");
        let e = s.validate(&json!({"name": "Li", "age": "30"})).unwrap_err();
        assert!(e.contains("$.age: expected integer, got string"), "{e}");
        let e = s
            .validate(&json!({"name": "Li", "age": 3, "x": 1}))
            .unwrap_err();
        assert!(e.contains("unexpected property \"x\""), "{e}");
        let e = s
            .validate(&json!({"name": "Li", "age": 3, "tags": ["a", 1]}))
            .unwrap_err();
        assert!(e.contains("$.tags[1]"), "{e}");
        assert!(s.validate(&json!({"name": "", "age": 3})).is_err());
        assert!(s.validate(&json!({"name": "a", "age": 151})).is_err());
        assert!(s.validate(&json!([1])).is_err());
    }

    #[test]
    fn schema_enum_const_pattern_and_bounds() {
        let s = schema(json!({"enum": ["low", "high"]}));
        assert!(s.validate(&json!("low")).is_ok());
        assert!(s.validate(&json!("mid")).is_err());
        let s = schema(json!({"const": 1}));
        assert!(s.validate(&json!(1.0)).is_ok());
        let s = schema(json!({"type": "string", "pattern": "^[A-Z]{3}$"}));
        assert!(s.validate(&json!("CNY")).is_ok());
        assert!(s.validate(&json!("cny")).is_err());
        let s = schema(json!({"exclusiveMinimum": 0, "exclusiveMaximum": 1}));
        assert!(s.validate(&json!(0.5)).is_ok());
        assert!(s.validate(&json!(0)).is_err());
        let s = schema(json!({"additionalProperties": {"type": "number"}}));
        assert!(s.validate(&json!({"a": 1})).is_ok());
        assert!(s.validate(&json!({"a": "1"})).is_err());
        let s = schema(json!({"additionalProperties": true, "type": "object"}));
        assert!(s.validate(&json!({"a": 1})).is_ok());
        assert!(s.validate(&json!(1)).is_err());
    }

    #[test]
    fn schema_compile_errors_name_the_keyword() {
        let e = Schema::compile(&json!({"properties": {"a": {"format": "email"}}})).unwrap_err();
        assert_eq!(e.0, "properties.a.format");
        assert!(
            e.1.contains("unsupported JSON Schema keyword `format`"),
            "{}",
            e.1
        );
        let e = Schema::compile(&json!({"type": "text"})).unwrap_err();
        assert_eq!(e.0, "type");
        let e = Schema::compile(&json!({"pattern": "("})).unwrap_err();
        assert_eq!(e.0, "pattern");
        let e = Schema::compile(&json!({"minLength": -1})).unwrap_err();
        assert_eq!(e.0, "minLength");
    }
}
