//! A degraded answer says so in the answer itself, not only in its headers: every proxy answer
//! whose `x-probeok-mode` is not `normal` carries a top-level
//! `"probeok": {mode, degraded_reason, degraded_since, route, quality_hint}` object — in a JSON
//! body, or in the first `chat.completion.chunk` of a stream (no event of its own: SDKs would
//! not expect one). A contract's own keys (`feature`, `contract`, `user_message`) stay beside
//! these. `quality_hint` is `reduced` when a `fallback`-tier route or a contract's fallback
//! model answered, else `normal`. Normal answers are left byte for byte as the upstream sent
//! them.

use axum::body::Body;
use axum::http::header;
use axum::response::Response;
use bytes::Bytes;
use chrono::SecondsFormat;
use serde_json::{json, Map, Value};

use super::request::{Mode, RequestCtx};

/// The contract behaviour that serves from another logical model.
pub(super) const FALLBACK_MODEL: &str = "fallback_model";

/// The notice of this request's answer, with the contract's own keys first; `None` for a
/// normal answer.
pub(super) fn block(ctx: &RequestCtx) -> Option<Map<String, Value>> {
    let d = &ctx.d;
    let mode = d.mode();
    if mode == Mode::Normal {
        return None;
    }
    let reason = (d.degraded_reason.map(str::to_owned))
        .or_else(|| d.fallback_reason.clone())
        .or_else(|| ctx.contract.map(|c| format!("contract_{c}")));
    let reduced = d.reduced || ctx.contract == Some(FALLBACK_MODEL);
    let ours = json!({
        "mode": mode.as_str(),
        "degraded_reason": reason,
        "degraded_since": d.degraded_since.map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true)),
        "route": d.route.as_ref().map(|r| r.as_str().to_owned()),
        "quality_hint": if reduced { "reduced" } else { "normal" },
    });
    let mut out = match &ctx.probeok {
        Some(Value::Object(contract)) => contract.clone(),
        _ => Map::new(),
    };
    if let Value::Object(ours) = ours {
        for (k, v) in ours {
            out.entry(k).or_insert(v);
        }
    }
    Some(out)
}

/// `v` (a JSON object) with `block`'s keys added to its `"probeok"` object (created when
/// absent; keys already there are kept).
fn merge(v: &mut Value, block: &Map<String, Value>) -> bool {
    let Some(obj) = v.as_object_mut() else {
        return false;
    };
    let slot = obj
        .entry("probeok")
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    if let Some(p) = slot.as_object_mut() {
        for (k, val) in block {
            p.entry(k.clone()).or_insert_with(|| val.clone());
        }
    }
    true
}

/// A JSON object body with the notice, or `None` (not a JSON object).
pub(super) fn json_body(body: &[u8], block: &Map<String, Value>) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    merge(&mut v, block).then(|| serde_json::to_vec(&v).ok())?
}

/// SSE text whose first event is a `chat.completion.chunk`, with the notice in that event;
/// `None` when the first event is anything else (then nothing is added).
pub(super) fn first_event(sse: &[u8], block: &Map<String, Value>) -> Option<Bytes> {
    let end = sse.windows(2).position(|w| w == b"\n\n")?;
    let event = std::str::from_utf8(&sse[..end]).ok()?;
    let data = event.strip_prefix("data: ")?;
    if data.contains('\n') {
        return None;
    }
    let mut v: Value = serde_json::from_str(data).ok()?;
    let chunk = v.get("object").and_then(Value::as_str) == Some("chat.completion.chunk")
        || v.get("choices").is_some_and(Value::is_array);
    if !chunk || !merge(&mut v, block) {
        return None;
    }
    let mut out = format!("data: {v}").into_bytes();
    out.extend_from_slice(&sse[end..]);
    Some(Bytes::from(out))
}

/// `r` with the notice in its body: a JSON object body, or an in-memory SSE body's first event
/// (a replayed cached stream). Other bodies are left as they are.
pub(super) async fn add(r: Response, block: &Map<String, Value>) -> Response {
    let kind = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let json = kind.starts_with("application/json");
    let sse = kind.starts_with("text/event-stream");
    if !json && !sse {
        return r;
    }
    let (mut parts, body) = r.into_parts();
    // Plain answers are complete bodies in memory already (bounded when read upstream).
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let out = if json {
        json_body(&bytes, block).map(Bytes::from)
    } else {
        first_event(&bytes, block)
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out.unwrap_or(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice() -> Map<String, Value> {
        json!({"mode": "fallback", "quality_hint": "reduced", "route": "a/b/c"})
            .as_object()
            .cloned()
            .unwrap()
    }

    #[test]
    fn json_bodies_get_the_object_and_keep_a_contracts_keys() {
        let out = json_body(
            br#"{"id":"x","probeok":{"mode":"degraded","feature":"f"}}"#,
            &notice(),
        );
        let v: Value = serde_json::from_slice(&out.unwrap()).unwrap();
        assert_eq!(v["probeok"]["mode"], "degraded");
        assert_eq!(v["probeok"]["feature"], "f");
        assert_eq!(v["probeok"]["quality_hint"], "reduced");
        assert_eq!(v["id"], "x");
        assert!(json_body(b"[1]", &notice()).is_none());
        assert!(json_body(b"not json", &notice()).is_none());
    }

    #[test]
    fn only_a_first_completion_chunk_gets_it() {
        let sse = b"data: {\"object\":\"chat.completion.chunk\",\"choices\":[]}\n\ndata: {\"choices\":[]}\n\n";
        let out = first_event(sse, &notice()).unwrap();
        let text = std::str::from_utf8(&out).unwrap();
        let (first, rest) = text.split_once("\n\n").unwrap();
        let v: Value = serde_json::from_str(first.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(v["probeok"]["route"], "a/b/c");
        assert_eq!(rest, "data: {\"choices\":[]}\n\n");
        assert!(first_event(b"data: [DONE]\n\n", &notice()).is_none());
        assert!(first_event(b"data: {\"error\":{}}\n\n", &notice()).is_none());
        assert!(first_event(b"data: {\"choices\":[]}", &notice()).is_none());
    }
}
