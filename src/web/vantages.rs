//! The vantages of `/api/v1/status`: with `[[vantage]]`s configured, each route agents probe
//! too gains `vantages: {"<id>": {state, since, reason, last_seen, stale, p50_ms}}` and, while
//! some vantage fails alone, `vantage_local: {code, text, vantages}`. Without vantages the
//! document is untouched (a single box answers exactly as before).

use serde_json::{json, Value};

use crate::clock::rfc3339;
use crate::health::{FindingKind, HealthSnapshot, VantageView};

/// Adds the vantages of `view` (and the `vantage_local` findings of `health`) to a status
/// document's routes.
pub fn annotate(doc: &mut Value, view: &VantageView, health: &HealthSnapshot) {
    let Some(routes) = doc.get_mut("routes").and_then(Value::as_array_mut) else {
        return;
    };
    for r in routes {
        let Some(id) = r
            .get("id")
            .and_then(Value::as_str)
            .and_then(crate::route::RouteId::parse)
        else {
            continue;
        };
        let Some(vantages) = view.route(&id) else {
            continue;
        };
        let mut m = serde_json::Map::new();
        for (v, s) in vantages {
            m.insert(
                v.clone(),
                json!({
                    "state": s.state,
                    "since": rfc3339(s.since),
                    "reason": s.reason.as_ref().map(|x| json!({"code": x.code, "text": x.text})),
                    "last_seen": s.last_seen.map(rfc3339),
                    "stale": s.stale,
                    "p50_ms": s.p50_ms.map(|x| (x * 10.0).round() / 10.0),
                }),
            );
        }
        r["vantages"] = Value::Object(m);
        let local = health
            .findings
            .iter()
            .find(|f| f.kind == FindingKind::VantageLocal && f.routes.contains(&id));
        r["vantage_local"] = match local {
            Some(f) => json!({"code": f.code, "text": f.text, "vantages": f.providers}),
            None => Value::Null,
        };
    }
}
