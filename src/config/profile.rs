//! `request = {system_prefix, set, drop}` on a `[[route]]`: the prompt profile the proxy applies
//! to the requests that route serves (never to probes). Parameters the proxy does not know are
//! allowed in `set` and `drop` (providers add their own); the ones it knows are type-checked, and
//! the ones that decide the wire format or the routing (`model`, `stream`, `messages`) are not
//! the profile's to change.

use serde_json::{Map, Value};

use super::raw::RawProfile;
use super::validate::Checker;
use super::Config;

/// The longest `system_prefix` (it travels in every request the route serves).
pub const MAX_SYSTEM_PREFIX: usize = 16 * 1024;
/// At most this many parameters in `set` and in `drop` each.
pub const MAX_PARAMS: usize = 64;

/// A route's request profile.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RequestProfile {
    /// Prepended to the system message (a system message is added when there is none).
    pub system_prefix: Option<String>,
    /// Top-level parameters set (overriding the client's).
    pub set: Map<String, Value>,
    /// Top-level parameters removed.
    pub drop: Vec<String>,
}

/// Parameters a profile may neither set nor drop: they choose the route, the answer's framing
/// and the conversation itself.
const RESERVED: [&str; 3] = ["model", "stream", "messages"];

/// What a known parameter's value must be.
enum Kind {
    Number { min: f64, max: f64 },
    Int { min: i64 },
    Bool,
    Str,
    StrOrStrs,
    Object,
    StrOrObject,
    Array,
}

fn kind(name: &str) -> Option<Kind> {
    Some(match name {
        "temperature" => Kind::Number { min: 0.0, max: 2.0 },
        "top_p" => Kind::Number { min: 0.0, max: 1.0 },
        "presence_penalty" | "frequency_penalty" => Kind::Number {
            min: -2.0,
            max: 2.0,
        },
        "max_tokens" | "max_completion_tokens" | "n" => Kind::Int { min: 1 },
        "top_logprobs" => Kind::Int { min: 0 },
        "seed" => Kind::Int { min: i64::MIN },
        "logprobs" | "parallel_tool_calls" | "store" => Kind::Bool,
        "user" | "reasoning_effort" | "service_tier" => Kind::Str,
        "stop" => Kind::StrOrStrs,
        "response_format" | "logit_bias" | "metadata" | "stream_options" => Kind::Object,
        "tool_choice" => Kind::StrOrObject,
        "tools" => Kind::Array,
        _ => return None,
    })
}

/// Why a known parameter's value is wrong, or `None`.
fn type_error(name: &str, v: &Value) -> Option<String> {
    let k = kind(name)?;
    let ok = match &k {
        Kind::Number { min, max } => v.as_f64().is_some_and(|x| x >= *min && x <= *max),
        Kind::Int { min } => v.as_i64().is_some_and(|x| x >= *min),
        Kind::Bool => v.is_boolean(),
        Kind::Str => v.is_string(),
        Kind::StrOrStrs => {
            v.is_string() || v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
        }
        Kind::Object => v.is_object(),
        Kind::StrOrObject => v.is_string() || v.is_object(),
        Kind::Array => v.is_array(),
    };
    if ok {
        return None;
    }
    Some(match k {
        Kind::Number { min, max } => format!("must be a number from {min} to {max}, got {v}"),
        Kind::Int { min } if min == i64::MIN => format!("must be an integer, got {v}"),
        Kind::Int { min } => format!("must be an integer of at least {min}, got {v}"),
        Kind::Bool => format!("must be true or false, got {v}"),
        Kind::Str => format!("must be a string, got {v}"),
        Kind::StrOrStrs => format!("must be a string or an array of strings, got {v}"),
        Kind::Object => format!("must be a table, got {v}"),
        Kind::StrOrObject => format!("must be a string or a table, got {v}"),
        Kind::Array => format!("must be an array, got {v}"),
    })
}

/// The TOML value as the JSON the request will carry; dates have no JSON form.
fn to_json(v: toml::Value) -> Result<Value, String> {
    Ok(match v {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| format!("{f} has no JSON form"))?,
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => {
            return Err(format!(
                "a date ({d}) is not a request parameter: quote it if a string is meant"
            ))
        }
        toml::Value::Array(a) => {
            Value::Array(a.into_iter().map(to_json).collect::<Result<_, _>>()?)
        }
        toml::Value::Table(t) => Value::Object(
            t.into_iter()
                .map(|(k, v)| Ok((k, to_json(v)?)))
                .collect::<Result<_, String>>()?,
        ),
    })
}

/// Stage one → two: the values as JSON (a value without a JSON form is reported and left out).
pub(super) fn profile(ck: &mut Checker<'_>, at: &str, raw: RawProfile) -> RequestProfile {
    let mut set = Map::new();
    for (k, v) in raw.set.unwrap_or_default() {
        match to_json(v) {
            Ok(v) => {
                set.insert(k, v);
            }
            Err(e) => ck.fail(format!("{at}.set.{k}"), e),
        }
    }
    RequestProfile {
        system_prefix: raw.system_prefix,
        set,
        drop: raw.drop.unwrap_or_default(),
    }
}

/// Every route's profile: reserved and mistyped parameters, a parameter both set and dropped,
/// an empty or oversized prefix.
pub(super) fn check(ck: &mut Checker<'_>, c: &Config) {
    for (i, r) in c.routes.iter().enumerate() {
        let Some(p) = &r.request else { continue };
        let at = format!("route[{i}].request");
        if let Some(prefix) = &p.system_prefix {
            if prefix.trim().is_empty() || prefix.len() > MAX_SYSTEM_PREFIX {
                ck.error(
                    format!("{at}.system_prefix"),
                    format!("must be 1 to {MAX_SYSTEM_PREFIX} bytes of text"),
                );
            }
        }
        if p.set.len() > MAX_PARAMS {
            ck.error(
                format!("{at}.set"),
                format!("at most {MAX_PARAMS} parameters"),
            );
        }
        if p.drop.len() > MAX_PARAMS {
            ck.error(
                format!("{at}.drop"),
                format!("at most {MAX_PARAMS} parameters"),
            );
        }
        for (k, v) in &p.set {
            let path = format!("{at}.set.{k}");
            if RESERVED.contains(&k.as_str()) {
                ck.error(
                    path,
                    format!("`{k}` is the client's to choose: a profile may not set it"),
                );
            } else if let Some(e) = type_error(k, v) {
                ck.error(path, e);
            }
        }
        for (j, k) in p.drop.iter().enumerate() {
            let path = format!("{at}.drop[{j}]");
            if RESERVED.contains(&k.as_str()) {
                ck.error(
                    path,
                    format!("`{k}` is the client's to choose: a profile may not drop it"),
                );
            } else if p.set.contains_key(k) {
                ck.error(
                    path,
                    format!("`{k}` is also in set: keep it in one of them"),
                );
            } else if k.is_empty() {
                ck.error(path, "must not be empty");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn known_parameters_are_type_checked_and_unknown_ones_pass() {
        assert_eq!(type_error("temperature", &json!(0.3)), None);
        assert!(type_error("temperature", &json!("hot")).is_some());
        assert!(type_error("temperature", &json!(3)).is_some());
        assert!(type_error("max_tokens", &json!(-1)).is_some());
        assert!(type_error("max_tokens", &json!(1.5)).is_some());
        assert_eq!(type_error("max_tokens", &json!(64)), None);
        assert_eq!(type_error("stop", &json!(["a", "b"])), None);
        assert!(type_error("stop", &json!([1])).is_some());
        assert_eq!(type_error("x_vendor_knob", &json!("anything")), None);
    }

    #[test]
    fn toml_values_become_json_but_dates_do_not() {
        let t: toml::Table = toml::from_str("a = 1\nb = [0.5, \"x\"]\nc = { d = true }").unwrap();
        let v = to_json(toml::Value::Table(t)).unwrap();
        assert_eq!(v, json!({"a": 1, "b": [0.5, "x"], "c": {"d": true}}));
        let t: toml::Table = toml::from_str("when = 1979-05-27").unwrap();
        assert!(to_json(toml::Value::Table(t)).is_err());
    }
}
