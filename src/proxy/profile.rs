//! Route profiles (`request = {system_prefix, set, drop}` on a `[[route]]`), applied to a proxy
//! request on its way to that route only (probes build their own requests and never pass here).
//! Pure: the answer says `x-probeok-profile: <route id>` when [`apply`] changed the request.

use serde_json::{json, Value};

use crate::config::RequestProfile;
use crate::route::ProviderKind;

/// Between the prefix and the system text the client sent.
const SEPARATOR: &str = "\n\n";

/// `body` as `profile` shapes it for a route of `kind`, or `None` when nothing changed.
pub fn apply(profile: &RequestProfile, kind: ProviderKind, body: &Value) -> Option<Value> {
    let mut out = body.clone();
    let obj = out.as_object_mut()?;
    for k in &profile.drop {
        obj.remove(k);
    }
    for (k, v) in &profile.set {
        obj.insert(k.clone(), v.clone());
    }
    if let Some(prefix) = &profile.system_prefix {
        match kind {
            ProviderKind::Anthropic => prefix_anthropic(obj, prefix),
            ProviderKind::Openai => prefix_openai(obj, prefix),
        }
    }
    (out != *body).then_some(out)
}

/// Prepends to the first `system` (or `developer`) message, else adds a system message first.
fn prefix_openai(obj: &mut serde_json::Map<String, Value>, prefix: &str) {
    let Some(messages) = obj.get_mut("messages").and_then(Value::as_array_mut) else {
        return;
    };
    let first_system = messages
        .iter_mut()
        .find(|m| matches!(m["role"].as_str(), Some("system" | "developer")));
    match first_system {
        Some(m) => prefix_content(&mut m["content"], prefix),
        None => messages.insert(0, json!({"role": "system", "content": prefix})),
    }
}

/// Anthropic's top-level `system` (a string or text blocks).
fn prefix_anthropic(obj: &mut serde_json::Map<String, Value>, prefix: &str) {
    match obj.get_mut("system") {
        Some(system) if !system.is_null() => prefix_content(system, prefix),
        _ => {
            obj.insert("system".to_owned(), Value::String(prefix.to_owned()));
        }
    }
}

/// A string gets the prefix in front; an array of parts gets a text part first.
fn prefix_content(content: &mut Value, prefix: &str) {
    match content {
        Value::String(s) if s.is_empty() => *s = prefix.to_owned(),
        Value::String(s) => *s = format!("{prefix}{SEPARATOR}{s}"),
        Value::Array(parts) => parts.insert(0, json!({"type": "text", "text": prefix})),
        other => *other = Value::String(prefix.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(prefix: Option<&str>, set: Value, drop: &[&str]) -> RequestProfile {
        RequestProfile {
            system_prefix: prefix.map(str::to_owned),
            set: set.as_object().cloned().unwrap_or_default(),
            drop: drop.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn prefixes_the_system_message_sets_and_drops() {
        let p = profile(
            Some("Be brief."),
            json!({"temperature": 0.3}),
            &["logprobs"],
        );
        let body = json!({"model": "m", "logprobs": true, "temperature": 1,
            "messages": [{"role": "system", "content": "You help."}, {"role": "user", "content": "hi"}]});
        let out = apply(&p, ProviderKind::Openai, &body).unwrap();
        assert_eq!(out["messages"][0]["content"], "Be brief.\n\nYou help.");
        assert_eq!(out["messages"][1]["content"], "hi");
        assert_eq!(out["temperature"], 0.3);
        assert!(out.get("logprobs").is_none());
        assert_eq!(out["model"], "m");
    }

    #[test]
    fn adds_a_system_message_when_there_is_none() {
        let p = profile(Some("Be brief."), json!({}), &[]);
        let body = json!({"messages": [{"role": "user", "content": "hi"}]});
        let out = apply(&p, ProviderKind::Openai, &body).unwrap();
        assert_eq!(
            out["messages"][0],
            json!({"role": "system", "content": "Be brief."})
        );
        assert_eq!(out["messages"].as_array().unwrap().len(), 2);
        let parts =
            json!({"messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]}]});
        let out = apply(&p, ProviderKind::Openai, &parts).unwrap();
        assert_eq!(out["messages"][0]["content"][0]["text"], "Be brief.");
    }

    #[test]
    fn anthropic_routes_get_it_in_system() {
        let p = profile(Some("Be brief."), json!({}), &[]);
        let out = apply(&p, ProviderKind::Anthropic, &json!({"messages": []})).unwrap();
        assert_eq!(out["system"], "Be brief.");
        let out = apply(&p, ProviderKind::Anthropic, &json!({"system": "S"})).unwrap();
        assert_eq!(out["system"], "Be brief.\n\nS");
    }

    #[test]
    fn an_unchanged_request_is_none() {
        let p = profile(None, json!({"temperature": 0.3}), &["logprobs"]);
        assert_eq!(
            apply(&p, ProviderKind::Openai, &json!({"temperature": 0.3})),
            None
        );
    }
}
