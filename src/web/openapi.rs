//! `/api/openapi.json`: the OpenAPI 3.0 description of the monitor's HTTP API. Its `paths` are
//! generated from the endpoint table ([`super::table`]), where each operation, written by hand
//! as JSON, sits next to its handler; the schemas are here. [`check`] compares a table with a
//! document, and tests parse the document with a real OpenAPI parser.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::api::MAX_LIMIT;
use super::feed::MAX_WAIT;
use super::ingest::{MAX_BODY, MAX_ITEMS};
use super::table::{table, Entry};

pub(super) fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    })
}

/// A route's kind (its own function: one `json!` cannot nest this deep).
fn route_kind() -> Value {
    json!({"type": "string", "enum": ["chat", "embeddings"], "description": "chat: probed with the PROBE_OK chat prompt; embeddings: probed with POST /embeddings and compared with its reference vector"})
}

pub(super) fn json_response(description: &str, schema: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}
    })
}

/// A route's queueing/throttling split (its own function: one `json!` cannot nest this deep).
/// A route's rate-limit headroom per limit (see `docs/http-api.md`); absent until announced.
fn ratelimit_schema() -> Value {
    let reading = json!({
        "type": "object", "required": ["remaining", "limit", "ratio", "at", "source"],
        "properties": {
            "remaining": {"type": "integer", "minimum": 0},
            "limit": {"type": "integer", "minimum": 1},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1, "description": "remaining / limit, 4 places"},
            "at": {"type": "string", "format": "date-time", "description": "When the answer's headers arrived"},
            "source": {"type": "string", "enum": ["probe", "traffic"]}}
    });
    json!({
        "type": "object",
        "description": "The latest rate-limit headroom the route's answers announced (x-ratelimit-*, anthropic-ratelimit-*), per limit; absent when never announced",
        "properties": {
            "requests": reading.clone(), "tokens": reading.clone(),
            "input_tokens": reading.clone(), "output_tokens": reading},
        "additionalProperties": false
    })
}

/// One window of `observed` (see `docs/http-api.md`).
fn observed_schema() -> Value {
    let pair = || {
        json!({"type": "object", "properties": {
        "p50": {"type": "number", "nullable": true}, "p95": {"type": "number", "nullable": true}}})
    };
    let ratio = || json!({"type": "number", "nullable": true});
    json!({"type": "object", "nullable": true,
        "required": ["requests", "success_ratio", "rate_limited_ratio", "server_error_ratio",
            "refusal_ratio", "ttft_ms", "tpot_ms", "structured", "cost_per_success"],
        "properties": {
            "requests": {"type": "integer", "description": "Attempts sent to the route"},
            "success_ratio": ratio(), "rate_limited_ratio": ratio(), "server_error_ratio": ratio(),
            "refusal_ratio": ratio(),
            "ttft_ms": pair(), "tpot_ms": pair(),
            "structured": {"type": "object", "properties": {
                "checked": {"type": "integer"}, "valid": {"type": "integer"},
                "not_checked": {"type": "integer"}, "validity_ratio": ratio(),
                "errors": {"type": "array", "items": {"type": "string"}}}},
            "cost_per_success": {"type": "number", "nullable": true}}})
}

fn split_schema() -> Value {
    json!({"type": "object", "nullable": true,
        "description": "While WARNING or worse: the first token and tokens/s against their baselines (queueing vs. throttling)",
        "properties": {
            "code": {"type": "string", "nullable": true,
                "enum": ["ttft_above_baseline", "tps_below_baseline", "ttft_and_tps_off_baseline", null]},
            "ttft": {"type": "object", "nullable": true, "properties": {
                "observed_ms": {"type": "number"}, "mean_ms": {"type": "number"}, "stddev_ms": {"type": "number"},
                "threshold_ms": {"type": "number"}, "late": {"type": "boolean"}}},
            "tps": {"type": "object", "nullable": true, "properties": {
                "observed": {"type": "number"}, "mean": {"type": "number"}, "floor": {"type": "number"},
                "low": {"type": "boolean"}}}}})
}

fn percentiles() -> Value {
    json!({
        "type": "object",
        "properties": {
            "p50": {"type": "number", "nullable": true},
            "p95": {"type": "number", "nullable": true},
            "p99": {"type": "number", "nullable": true}
        }
    })
}

fn state_enum() -> Value {
    json!({"type": "string", "enum": ["UNKNOWN", "NORMAL", "WARNING", "DEGRADED", "CRITICAL", "SWITCHED"]})
}

fn tier_enum() -> Value {
    json!({"type": "string", "enum": ["primary", "backup", "fallback"]})
}

fn limit_param() -> Value {
    json!({
        "name": "limit", "in": "query", "required": false,
        "description": format!("How many, newest first (default 50, at most {MAX_LIMIT})."),
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}
    })
}

fn schemas() -> Value {
    let mut all = core_schemas();
    for more in [drift_and_admin_schemas(), heartbeat_and_reload_schemas()] {
        if let (Value::Object(all), Value::Object(more)) = (&mut all, more) {
            all.extend(more);
        }
    }
    if let (Value::Object(all), Value::Object(more)) = (&mut all, super::drills::openapi_schemas())
    {
        all.extend(more);
    }
    all
}

/// `GET /api/v1/drift` and the admin silences.
fn drift_and_admin_schemas() -> Value {
    json!({
        "DriftFinding": {
            "type": "object", "required": ["id", "route", "set", "kind", "severity", "detected_at", "summary", "evidence"],
            "properties": {
                "id": {"type": "string", "description": "route|set|kind, stable while the finding lasts"},
                "route": {"type": "string"}, "set": {"type": "string"},
                "kind": {"type": "string", "enum": ["pass_rate_drop", "length_shift", "model_changed", "validity_drop", "capability_lost", "embedding_changed", "long_prompt_slow"]},
                "severity": {"type": "string", "enum": ["info", "warning", "critical"]},
                "failure_mode": {"type": "string", "nullable": true},
                "detected_at": {"type": "string", "format": "date-time"},
                "summary": {"type": "string"},
                "evidence": {"type": "object", "properties": {
                    "test": {"type": "string"}, "p_value": {"type": "number", "nullable": true},
                    "before": {"$ref": "#/components/schemas/RateSample"},
                    "after": {"$ref": "#/components/schemas/RateSample"},
                    "runs": {"type": "array", "items": {"type": "object"}},
                    "length": {"type": "object", "nullable": true},
                    "model": {"type": "object", "nullable": true},
                    "examples": {"type": "array", "items": {"type": "object", "properties": {
                        "case": {"type": "string"},
                        "failures": {"type": "array", "items": {"type": "object"}},
                        "before": {"type": "string", "nullable": true},
                        "after": {"type": "string", "nullable": true}}}}}}
            }
        },
        "RateSample": {"type": "object", "properties": {
            "runs": {"type": "integer"}, "passed": {"type": "integer"}, "total": {"type": "integer"},
            "rate": {"type": "number", "nullable": true}}},
        "Drift": {
            "type": "object", "required": ["generated_at", "findings", "sets"],
            "properties": {
                "generated_at": {"type": "string", "format": "date-time"},
                "findings": {"type": "array", "items": {"$ref": "#/components/schemas/DriftFinding"}},
                "sets": {"type": "array", "items": {"type": "object", "properties": {
                    "route": {"type": "string"}, "set": {"type": "string"},
                    "runs": {"type": "array", "items": {"type": "object", "properties": {
                        "started_at": {"type": "string", "format": "date-time"},
                        "passed": {"type": "integer"}, "answered": {"type": "integer"}, "errors": {"type": "integer"},
                        "failed": {"type": "array", "items": {"type": "string"}},
                        "model": {"type": "string", "nullable": true}}}}}}}
            }
        },
        "Silence": {
            "type": "object", "required": ["id", "routes", "starts_at", "ends_at"],
            "properties": {
                "id": {"type": "string"},
                "routes": {"type": "array", "items": {"type": "string"}, "description": "Globs over route ids; * silences everything"},
                "starts_at": {"type": "string", "format": "date-time"},
                "ends_at": {"type": "string", "format": "date-time"},
                "comment": {"type": "string"}, "created_by": {"type": "string"},
                "created_at": {"type": "string", "format": "date-time"}
            }
        },
        "NewSilence": {
            "type": "object", "required": ["routes"],
            "properties": {
                "routes": {"type": "array", "items": {"type": "string"}},
                "starts_at": {"type": "string", "format": "date-time"},
                "ends_at": {"type": "string", "format": "date-time", "description": "Either ends_at or duration"},
                "duration": {"type": "string", "example": "2h"},
                "comment": {"type": "string"}, "created_by": {"type": "string"}
            }
        },
        "Silences": {"type": "object", "required": ["silences"],
            "properties": {"silences": {"type": "array", "items": {"$ref": "#/components/schemas/Silence"}}}}
    })
}

/// `/readyz`'s stale jobs and the config reload.
fn heartbeat_and_reload_schemas() -> Value {
    json!({
        "StaleJob": {"type": "object", "required": ["job", "silent_s"], "properties": {
            "job": {"type": "string"},
            "silent_s": {"type": "integer", "description": "Since the later of its last beat and the service's start"},
            "last_beat": {"type": "string", "format": "date-time", "nullable": true}}},
        "EmbeddingReference": {"type": "object", "required": ["route", "reference"], "properties": {
            "route": {"type": "string"},
            "reference": {"type": "string", "enum": ["latest", "next"], "description": "latest: the route's latest good vector is its reference now; next: it had none, its next good vector becomes it"}
        }},
        "Reloaded": {"type": "object", "required": ["reloaded", "applied", "restart_required", "warnings"], "properties": {
            "reloaded": {"type": "boolean"},
            "applied": {"type": "array", "items": {"type": "string"}, "description": "Changed sections now in effect"},
            "restart_required": {"type": "array", "items": {"type": "string"}, "description": "Changed sections a restart applies (the running values stay)"},
            "warnings": {"type": "array", "items": {"type": "string"}}}},
        "InvalidConfig": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object",
            "required": ["code", "message", "diagnostics"], "properties": {
                "code": {"type": "string", "enum": ["invalid_config"]},
                "message": {"type": "string"},
                "diagnostics": {"type": "array", "items": {"type": "object", "properties": {
                    "file": {"type": "string"}, "line": {"type": "integer"}, "col": {"type": "integer"},
                    "key": {"type": "string"}, "message": {"type": "string"},
                    "text": {"type": "string", "description": "file:line:col: key: message"}}}}}}}}
    })
}

fn core_schemas() -> Value {
    let mut schemas = core_schemas_but_ratelimit();
    // Beside the rest: one more key in that one `json!` passes the macro's recursion limit.
    schemas["RouteStatus"]["properties"]["ratelimit"] = ratelimit_schema();
    schemas["RouteStatus"]["properties"]["capabilities"] = capabilities_schema();
    schemas["RouteStatus"]["properties"]["long_prompt"] = long_prompt_schema();
    schemas["RouteStatus"]["properties"]["kind"] = route_kind();
    schemas
}

/// `capabilities` of a route (see `docs/http-api.md`): each declared, probed capability.
fn capabilities_schema() -> Value {
    let probe = json!({
        "type": "object", "required": ["ok", "checked_at", "latency_ms", "success_7d"],
        "properties": {
            "ok": {"type": "boolean", "nullable": true, "description": "The latest probe's result; null before the first"},
            "checked_at": {"type": "string", "format": "date-time", "nullable": true},
            "latency_ms": {"type": "integer", "minimum": 0, "nullable": true},
            "error": {"type": "string", "description": "Why the latest probe failed; absent when it succeeded"},
            "success_7d": {"type": "number", "minimum": 0, "maximum": 1, "nullable": true, "description": "Share of the last 7 days' probes that succeeded; null without one"}}
    });
    json!({
        "type": "object",
        "description": "The declared tools / json_schema capabilities' probes ([capability] every); empty when the route declares neither",
        "properties": {"tools": probe.clone(), "json_schema": probe},
        "additionalProperties": false
    })
}

/// `long_prompt` of a route (see `docs/http-api.md`): the long prompt beside its baseline.
fn long_prompt_schema() -> Value {
    json!({
        "type": "object", "nullable": true,
        "description": "The long prompt ([capability] long_prompt): its latest time to first token beside the route's baseline; null when off or on an embeddings route",
        "required": ["ttft_ms", "baseline_ms", "checked_at", "ok"],
        "properties": {
            "ttft_ms": {"type": "integer", "minimum": 0, "nullable": true, "description": "Time to first token of the latest answer; null before one or when the latest call failed"},
            "baseline_ms": {"type": "integer", "minimum": 0, "nullable": true, "description": "Median TTFT of the last 7 good results; null until 3 exist"},
            "checked_at": {"type": "string", "format": "date-time", "nullable": true},
            "ok": {"type": "boolean", "nullable": true, "description": "The latest answer held the code word; null before the first probe"},
            "note": {"type": "string", "description": "Why the latest result was not good (slow, wrong answer, failed call); absent when it was"}}
    })
}

fn core_schemas_but_ratelimit() -> Value {
    json!({
        "Error": {
            "type": "object", "required": ["error"],
            "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
                "code": {"type": "string"}, "message": {"type": "string"}}}}
        },
        "Percentiles": percentiles(),
        "Reason": {
            "type": "object", "required": ["code", "text"],
            "properties": {"code": {"type": "string", "description": "Stable snake_case code"},
                           "text": {"type": "string"}}
        },
        "RouteStatus": {
            "type": "object",
            "required": ["id", "provider", "region", "model", "serves", "tier", "state", "latency_ms", "ttfb_ms", "tokens_per_second", "uptime", "slo", "probe_cost", "capabilities"],
            "properties": {
                "id": {"type": "string", "description": "provider/region/model"},
                "provider": {"type": "string"}, "region": {"type": "string"}, "model": {"type": "string"},
                "serves": {"type": "string"}, "tier": tier_enum(),
                "state": state_enum(),
                "since": {"type": "string", "format": "date-time", "nullable": true},
                "reason": {"allOf": [{"$ref": "#/components/schemas/Reason"}], "nullable": true},
                "failure_mode": {"type": "string", "enum": ["unavailable", "degraded", "behavior_changed"], "nullable": true},
                "latency_ms": {"$ref": "#/components/schemas/Percentiles"},
                "ttfb_ms": {"$ref": "#/components/schemas/Percentiles"},
                "tokens_per_second": {"$ref": "#/components/schemas/Percentiles"},
                "baseline": {"type": "object", "nullable": true, "properties": {
                    "bucket": {"type": "string"}, "samples": {"type": "integer"},
                    "mean_ms": {"type": "number"}, "stddev_ms": {"type": "number"}, "p95_ms": {"type": "number"}}},
                "uptime": {"type": "object", "properties": {
                    "24h": {"type": "number", "nullable": true}, "7d": {"type": "number", "nullable": true},
                    "30d": {"type": "number", "nullable": true}}},
                "slo": {"type": "object",
                    "required": ["target", "error_budget_remaining", "bad_seconds", "budget_seconds"],
                    "description": "The error budget over 30 days: each bad probe outcome (failed, or slower than [slo] latency_threshold) is one probe interval of bad time",
                    "properties": {
                    "target": {"type": "number"},
                    "error_budget_remaining": {"type": "number", "nullable": true,
                        "description": "1 - bad_seconds / budget_seconds: 1 untouched, 0 spent, negative overspent; null without probe outcomes"},
                    "bad_seconds": {"type": "number", "description": "Bad probe outcomes × the route's probe interval, in the last 30 days"},
                    "budget_seconds": {"type": "number", "description": "(1 - target) × 30 days"}}},
                "probe_cost": {"type": "object", "required": ["tokens_per_month", "cost_per_month", "currency"],
                    "description": "Probe, throughput-probe and confirmation-probe tokens per 30 days (output at max_tokens: an upper bound) and their cost at the route's price",
                    "properties": {
                        "tokens_per_month": {"type": "integer"},
                        "cost_per_month": {"type": "number", "nullable": true, "description": "null without a price"},
                        "currency": {"type": "string", "nullable": true}}},
                "behavior_changed": {"type": "boolean"},
                "split": split_schema(),
                "incident": {"type": "object", "nullable": true, "properties": {
                    "id": {"type": "string"}, "opened_at": {"type": "string", "format": "date-time"}, "peak": state_enum()}},
                "breaker": {"type": "string", "enum": ["closed", "half_open", "open"],
                    "description": "The in-process proxy's circuit breaker of the route; absent without a proxy"},
                "vantages": vantages_schema(),
                "vantage_local": vantage_local_schema(),
                "observed": {"type": "object", "required": ["1h", "24h", "currency"],
                    "description": "What the proxies' real traffic showed of the route over the last hour and 24 h (null: no traffic)",
                    "properties": {
                        "1h": observed_schema(), "24h": observed_schema(),
                        "currency": {"type": "string", "nullable": true}}},
                "declared": declared_schema()
            }
        },
        "Status": {
            "type": "object", "required": ["generated_at", "overall", "role", "routes"],
            "properties": {
                "generated_at": {"type": "string", "format": "date-time"},
                "overall": {"type": "string", "enum": ["operational", "degraded", "outage"]},
                "role": {"type": "string", "enum": ["leader", "follower"],
                    "description": "This monitor's role in its cluster (always `leader` with SQLite)"},
                "routes": {"type": "array", "items": {"$ref": "#/components/schemas/RouteStatus"}},
                "sync": {"type": "array", "description": "`[[sync]]` gateways (new-api / one-api) whose channels the leader keeps in step; never the token",
                    "items": {"type": "object", "required": ["kind", "url", "last_ok", "last_error"], "properties": {
                        "kind": {"type": "string", "enum": ["new-api", "one-api"]},
                        "url": {"type": "string"},
                        "last_ok": {"type": "string", "format": "date-time", "nullable": true},
                        "last_error": {"type": "string", "nullable": true,
                            "description": "The gateway's last refusal while it refuses; null once a call succeeds"}}}},
                "status_pages": status_pages_schema()
            }
        },
        "Outcome": {
            "type": "object",
            "properties": {
                "started_at": {"type": "string", "format": "date-time"},
                "kind": {"type": "string", "enum": ["probe", "throughput", "passive"]},
                "success": {"type": "boolean"}, "verified": {"type": "boolean", "nullable": true},
                "ttfb_ms": {"type": "number", "nullable": true},
                "ttft_ms": {"type": "number", "nullable": true, "description": "First generated token, reasoning included"},
                "first_answer_ms": {"type": "number", "nullable": true, "description": "First answer token (after a reasoning model's reasoning)"},
                "total_ms": {"type": "number"}, "output_tokens": {"type": "integer", "nullable": true},
                "tokens_per_second": {"type": "number", "nullable": true},
                "model_reported": {"type": "string", "nullable": true},
                "max_tokens_exhausted": {"type": "boolean", "description": "max_tokens ran out before any answer token"},
                "http_status": {"type": "integer", "nullable": true},
                "error": {"allOf": [{"$ref": "#/components/schemas/OutcomeError"}], "nullable": true}
            }
        },
        "OutcomeError": {
            "type": "object", "required": ["kind"],
            "properties": {
                "kind": {"type": "string", "enum": ["connect", "timeout_before_first_byte", "stalled", "timeout", "http", "rate_limited", "refused", "malformed", "truncated"]},
                "status": {"type": "integer", "nullable": true},
                "message": {"type": "string", "nullable": true},
                "retry_after_ms": {"type": "integer", "nullable": true}
            }
        },
        "Probes": {
            "type": "object", "required": ["route", "probes"],
            "properties": {"route": {"type": "string"},
                           "probes": {"type": "array", "items": {"$ref": "#/components/schemas/Outcome"}}}
        },
        "Incident": {
            "type": "object", "required": ["id", "route", "opened_at", "peak", "transitions"],
            "properties": {
                "id": {"type": "string"}, "route": {"type": "string"},
                "opened_at": {"type": "string", "format": "date-time"},
                "closed_at": {"type": "string", "format": "date-time", "nullable": true},
                "peak": state_enum(),
                "failure_mode": {"type": "string", "nullable": true},
                "transitions": {"type": "array", "items": {"type": "object", "properties": {
                    "from": state_enum(), "to": state_enum(), "at": {"type": "string", "format": "date-time"},
                    "reason": {"$ref": "#/components/schemas/Reason"},
                    "failure_mode": {"type": "string", "nullable": true},
                    "evidence": {"type": "object", "description": "What the detector decided on: observed outcome, signals, baselines, thresholds, error rate"},
                    "incident_id": {"type": "string", "nullable": true}}}},
                "provider_declared": {"$ref": "#/components/schemas/Lead"},
                "trace_ids": {"type": "array", "maxItems": 20, "items": {"type": "string"},
                    "description": "Admin view only (with the admin token): trace ids of up to 20 proxied requests that failed at the route inside the incident, newest first"}
            }
        },
        "Lead": lead_schema(),
        "LeadSummary": lead_summary_schema(),
        "Incidents": {
            "type": "object", "required": ["incidents"],
            "properties": {"incidents": {"type": "array", "items": {"$ref": "#/components/schemas/Incident"}}}
        },
        "WeightEntry": {
            "type": "object", "required": ["route", "provider", "region", "model", "tier", "weight", "state", "reason"],
            "properties": {
                "route": {"type": "string"}, "provider": {"type": "string"}, "region": {"type": "string"},
                "model": {"type": "string"}, "tier": tier_enum(),
                "weight": {"type": "integer", "minimum": 0, "maximum": 100},
                "state": state_enum(),
                "reason": {"type": "string", "description": "Stable code: healthy, unjudged, standby, success_ratio_low, weight_zero, behavior_changed, or detection's reason code"}
            }
        },
        "Weights": {
            "type": "object", "required": ["version", "generated_at", "models", "serving"],
            "properties": {
                "version": {"type": "integer", "format": "int64", "description": "Grows only when a weight, state, reason code or serving tier changes; equals the ETag"},
                "generated_at": {"type": "string", "format": "date-time"},
                "models": {"type": "object", "additionalProperties": {"type": "array", "items": {"$ref": "#/components/schemas/WeightEntry"}}},
                "serving": {"type": "object", "additionalProperties": {"type": "object", "required": ["all_unhealthy"], "properties": {
                    "tier": {"allOf": [tier_enum()], "nullable": true},
                    "all_unhealthy": {"type": "boolean", "description": "No route is usable: every weight is 0"}}}}
            }
        },
        "IngestItem": {
            "type": "object", "required": ["route", "started_at", "success", "total_ms"],
            "properties": {
                "route": {"type": "string"}, "started_at": {"type": "string", "format": "date-time"},
                "success": {"type": "boolean"}, "total_ms": {"type": "number", "minimum": 0},
                "ttfb_ms": {"type": "number", "minimum": 0}, "ttft_ms": {"type": "number", "minimum": 0},
                "first_answer_ms": {"type": "number", "minimum": 0},
                "output_tokens": {"type": "integer", "minimum": 0}, "tokens_estimated": {"type": "boolean"},
                "vantage": {"type": "string", "description": "An agent's [[vantage]] id; with it, id and kind are read too"},
                "id": {"type": "string", "description": "An agent's unique id for the outcome (a resend is a duplicate)"},
                "kind": {"type": "string", "enum": ["probe", "throughput"], "description": "Agents' items only"},
                "tokens_per_second": {"type": "number", "minimum": 0},
                "model_reported": {"type": "string"}, "http_status": {"type": "integer"},
                "error": {"$ref": "#/components/schemas/OutcomeError"}
            }
        },
        "IngestResult": {
            "type": "object", "required": ["accepted", "rejected"],
            "properties": {
                "accepted": {"type": "integer"},
                "duplicates": {"type": "integer", "description": "Agents' items whose id the monitor already stored"},
                "rejected": {"type": "array", "items": {"type": "object", "properties": {
                    "index": {"type": "integer"},
                    "code": {"type": "string", "description": "unknown_vantage, route_not_assigned, future_timestamp or invalid_item"},
                    "error": {"type": "string"}}}}
            }
        },
        "Health": {"type": "object", "properties": {"status": {"type": "string"},
            "role": {"type": "string", "enum": ["leader", "follower"], "description": "`/readyz`: this monitor's role in its cluster"},
            "problems": {"type": "array", "items": {"type": "string"}},
            "stale_jobs": {"type": "array", "description": "Jobs silent for `[heartbeat] stale_after` (503 only)",
                "items": {"$ref": "#/components/schemas/StaleJob"}},
            "stale_after_s": {"type": "integer"}}}
    })
}

// The operations of the core endpoints, one function each; `super::table` pairs them with
// their handlers.

pub(super) fn healthz() -> Value {
    json!({"summary": "Liveness", "operationId": "healthz",
        "responses": {"200": json_response("Up", "Health")}})
}

pub(super) fn readyz() -> Value {
    json!({"summary": "Readiness: store writable, every job's heartbeat fresh", "operationId": "readyz",
        "responses": {"200": json_response("Ready", "Health"), "503": json_response("Not ready", "Health")}})
}

pub(super) fn metrics() -> Value {
    json!({"summary": "OpenMetrics text", "operationId": "metrics",
        "responses": {"200": {"description": "Metrics",
            "content": {"application/openmetrics-text": {"schema": {"type": "string"}}}}}})
}

pub(super) fn openapi() -> Value {
    json!({"summary": "This document", "operationId": "openapi",
        "responses": {"200": {"description": "OpenAPI 3.0", "content": {"application/json": {"schema": {"type": "object"}}}}}})
}

pub(super) fn status() -> Value {
    let list = |name: &str, what: &str| {
        json!({"name": name, "in": "query", "required": false,
            "description": format!("Only routes whose {what} is one of these (comma-separated)"),
            "schema": {"type": "string"}})
    };
    json!({"summary": "Every route's state, recent latency, uptime and SLO", "operationId": "status",
        "parameters": [
            list("serves", "logical model"),
            list("provider", "provider"),
            list("state", "state (UNKNOWN NORMAL WARNING DEGRADED CRITICAL SWITCHED, any case)")
        ],
        "responses": {"200": json_response("Status", "Status"),
            "400": error_response("Bad filter (bad_query)"),
            "500": error_response("Store failure")}})
}

pub(super) fn route_probes() -> Value {
    json!({
        "summary": "Recent synthetic outcomes of one route, newest first", "operationId": "routeProbes",
        "parameters": [
            {"name": "id", "in": "path", "required": true,
             "description": "Route id provider/region/model; slashes raw or percent-encoded",
             "schema": {"type": "string"}},
            limit_param()
        ],
        "responses": {"200": json_response("Outcomes", "Probes"), "400": error_response("Bad limit"),
                      "404": error_response("Unknown route")}})
}

pub(super) fn incidents() -> Value {
    json!({"summary": "Incidents with transitions, newest first", "operationId": "incidents",
        "parameters": [
            limit_param(),
            {"name": "route", "in": "query", "required": false,
             "description": "Only this route's incidents (provider/region/model)", "schema": {"type": "string"}},
            {"name": "since", "in": "query", "required": false,
             "description": "Only incidents open at or after this time (still open, or closed since)",
             "schema": {"type": "string", "format": "date-time"}}
        ],
        "responses": {"200": json_response("Incidents", "Incidents"), "400": error_response("Bad limit or since"),
                      "404": error_response("Unknown route")}})
}

pub(super) fn incidents_lead() -> Value {
    json!({"summary": "A month of our incidents against the providers' status page declarations", "operationId": "incidentsLead",
        "parameters": [
            {"name": "month", "in": "query", "required": false,
             "description": "YYYY-MM (UTC); this month by default", "schema": {"type": "string"}}
        ],
        "responses": {"200": json_response("The month's lead-time summary", "LeadSummary"),
                      "400": error_response("Bad month")}})
}

pub(super) fn weights() -> Value {
    json!({
        "summary": "Traffic weights per logical model", "operationId": "weights",
        "parameters": [
            {"name": "wait", "in": "query", "required": false,
             "description": format!("With If-None-Match naming the current version: hold the request until a newer version (200) or this long (304); at most {}s.", MAX_WAIT.as_secs()),
             "schema": {"type": "string", "example": "30s"}},
            {"name": "If-None-Match", "in": "header", "required": false, "schema": {"type": "string"}}
        ],
        "responses": {
            "200": {"description": "The current weights",
                    "headers": {"ETag": {"schema": {"type": "string"}, "description": "\"<version>\""}},
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Weights"}}}},
            "304": {"description": "Not modified (no newer version within the wait)"},
            "400": error_response("Bad wait")}})
}

pub(super) fn weights_stream() -> Value {
    json!({
        "summary": "Server-Sent Events: `event: weights`, `id: <version>`, data = the Weights JSON; `: heartbeat` every 15 s",
        "operationId": "weightsStream",
        "parameters": [{"name": "Last-Event-ID", "in": "header", "required": false, "schema": {"type": "string"}}],
        "responses": {"200": {"description": "Event stream",
            "content": {"text/event-stream": {"schema": {"type": "string"}}}}}})
}

pub(super) fn ingest() -> Value {
    json!({
        "summary": "Passive outcomes from proxies and remote agents",
        "operationId": "ingest",
        "security": [{"ingestToken": []}],
        "requestBody": {"required": true, "description": format!("At most {MAX_ITEMS} items and {MAX_BODY} bytes"),
            "content": {"application/json": {"schema": {"type": "array", "maxItems": MAX_ITEMS,
                "items": {"$ref": "#/components/schemas/IngestItem"}}}}},
        "responses": {
            "200": json_response("Accepted and rejected items", "IngestResult"),
            "400": error_response("Not a JSON array"),
            "401": error_response("Missing or wrong token"),
            "404": error_response("Ingest disabled (token variable unset)"),
            "413": error_response("Body or item count too large"),
            "503": error_response("Shutting down")}})
}

/// The responses every admin operation shares besides its own: a missing or wrong token, and
/// the admin endpoints switched off.
pub(super) fn admin_responses(mut own: Value) -> Value {
    own["401"] = error_response("Missing or wrong token");
    own["403"] = error_response("Admin endpoints off (token variable unset)");
    own
}

/// An HTML page (see `super::pages`): not JSON, described so every endpoint is in the document.
pub(super) fn html_page(summary: &str, id: &str, not_found: bool) -> Value {
    let mut responses = json!({
        "200": {"description": "HTML page (no JavaScript; `?lang=zh|en`, else Accept-Language)",
                "content": {"text/html": {"schema": {"type": "string"}}}},
        "500": {"description": "Error page", "content": {"text/html": {"schema": {"type": "string"}}}}
    });
    let mut parameters = vec![json!({"name": "lang", "in": "query", "required": false,
        "schema": {"type": "string", "enum": ["zh", "en"]}})];
    if not_found {
        responses["404"] = json!({"description": "Error page: unknown route", "content": {"text/html": {"schema": {"type": "string"}}}});
        parameters.push(json!({"name": "id", "in": "path", "required": true,
            "description": "Route id provider/region/model; slashes raw or percent-encoded",
            "schema": {"type": "string"}}));
    }
    json!({"summary": summary, "operationId": id, "tags": ["pages"],
        "parameters": parameters, "responses": responses})
}

pub(super) fn stylesheet() -> Value {
    json!({"summary": "The pages' stylesheet",
        "operationId": "stylesheet", "tags": ["pages"],
        "responses": {"200": {"description": "CSS", "content": {"text/css": {"schema": {"type": "string"}}}}}})
}

/// The `paths` object: every entry's operation under its documented path and method.
pub fn paths(entries: &[Entry]) -> Value {
    let mut paths = serde_json::Map::new();
    for e in entries {
        let item = paths
            .entry(e.endpoint.doc_path.to_owned())
            .or_insert_with(|| json!({}));
        item[e.endpoint.method.as_str().to_ascii_lowercase()] = e.doc.clone();
    }
    Value::Object(paths)
}

/// The whole document, for the endpoints of `entries`.
pub fn document_for(entries: &[Entry]) -> Value {
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "probeok monitor API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Status, incidents, the weights feed, passive ingest and metrics of a probeok monitor. Times are RFC 3339 UTC; errors are {\"error\":{\"code\",\"message\"}}."
        },
        "paths": paths(entries),
        "components": {
            "schemas": schemas(),
            "securitySchemes": {
                "ingestToken": {"type": "http", "scheme": "bearer"},
                "adminToken": {"type": "http", "scheme": "bearer",
                    "description": "The admin token (`server.admin_token_env`); admin endpoints answer 403 admin_disabled while it is unset"}
            }
        }
    })
}

/// The document `GET /api/openapi.json` serves: the monitor's own table.
pub fn document() -> Value {
    document_for(&table())
}

/// Where `doc` and `entries` disagree, one line each: an entry whose operation is missing
/// from the document or has no summary, description or responses, and an operation of the
/// document no entry serves. Empty when they match.
pub fn check(entries: &[Entry], doc: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let mut served = std::collections::HashSet::new();
    for e in entries {
        let method = e.endpoint.method.as_str().to_ascii_lowercase();
        let path = e.endpoint.doc_path;
        served.insert((method.clone(), path.to_owned()));
        let op = &doc["paths"][path][&method];
        let described = ["summary", "description"]
            .iter()
            .any(|k| op[k].as_str().is_some_and(|s| !s.trim().is_empty()));
        let answers = op["responses"].as_object().is_some_and(|r| !r.is_empty());
        if !op.is_object() {
            problems.push(format!(
                "{} {path} is not in the OpenAPI document",
                e.endpoint.method
            ));
        } else if !described || !answers {
            problems.push(format!(
                "{} {path} has no summary or no responses in the OpenAPI document",
                e.endpoint.method
            ));
        }
    }
    if let Some(paths) = doc["paths"].as_object() {
        for (path, item) in paths {
            for method in item.as_object().into_iter().flat_map(|o| o.keys()) {
                if !served.contains(&(method.clone(), path.clone())) {
                    problems.push(format!(
                        "{} {path} is documented but not served",
                        method.to_ascii_uppercase()
                    ));
                }
            }
        }
    }
    problems
}

/// `GET /api/openapi.json` (rendered once per process).
pub async fn handler() -> Response {
    static BODY: OnceLock<String> = OnceLock::new();
    let body = BODY.get_or_init(|| document().to_string());
    ([(header::CONTENT_TYPE, "application/json")], body.as_str()).into_response()
}

/// A route's `vantages` (routes `[[vantage]]` agents probe too).
fn vantages_schema() -> Value {
    json!({"type": "object", "description": "Each vantage's view, for routes [[vantage]] agents probe too; absent otherwise",
        "additionalProperties": {"type": "object", "required": ["state", "since", "stale"], "properties": {
            "state": state_enum(), "since": {"type": "string", "format": "date-time"},
            "reason": {"type": "object", "nullable": true, "properties": {"code": {"type": "string"}, "text": {"type": "string"}}},
            "last_seen": {"type": "string", "format": "date-time", "nullable": true},
            "stale": {"type": "boolean"}, "p50_ms": {"type": "number", "nullable": true}}}})
}

/// A route's `vantage_local` finding.
fn vantage_local_schema() -> Value {
    json!({"type": "object", "nullable": true, "description": "Vantages seeing the route fail alone (their network, not the provider)",
        "properties": {"code": {"type": "string"}, "text": {"type": "string"},
            "vantages": {"type": "array", "items": {"type": "string"}}}})
}

fn declared_schema() -> Value {
    json!({"type": "object", "required": ["status", "incident", "since", "url"],
                    "description": "What the provider's own status page declares for the route; absent when no `[[provider.status_page]]` maps it",
                    "properties": {
                        "status": {"type": "string", "description": "The worst state of the page components that map the route (operational, under_maintenance, degraded_performance, partial_outage, major_outage), or `incident` when only an open incident concerns it"},
                        "incident": {"type": "string", "nullable": true, "description": "The newest open declared incident concerning the route"},
                        "since": {"type": "string", "format": "date-time", "nullable": true},
                        "url": {"type": "string", "nullable": true}}})
}

fn status_pages_schema() -> Value {
    json!({"type": "array", "description": "`[[provider.status_page]]` pages the leader reads",
                    "items": {"type": "object", "required": ["provider", "kind", "url", "last_ok", "last_error"], "properties": {
                        "provider": {"type": "string"},
                        "kind": {"type": "string", "enum": ["statuspage", "feed"]},
                        "url": {"type": "string"},
                        "last_ok": {"type": "string", "format": "date-time", "nullable": true},
                        "last_error": {"type": "string", "nullable": true,
                            "description": "Why the last read failed, while it fails (the last known declarations are kept)"}}}})
}

fn lead_schema() -> Value {
    json!({
        "type": "object", "required": ["status"],
        "description": "Present when a provider status page maps the incident's route: how the provider's own declaration compares",
        "properties": {
            "status": {"type": "string", "enum": ["declared", "not_declared", "never_declared"]},
            "lead_seconds": {"type": "integer", "description": "declared: the provider declared this long after we opened the incident (negative: before)"},
            "declared_at": {"type": "string", "format": "date-time"},
            "incident": {"type": "string", "description": "The provider's incident id"},
            "name": {"type": "string"},
            "url": {"type": "string", "nullable": true}
        }
    })
}

fn lead_summary_schema() -> Value {
    json!({
        "type": "object",
        "required": ["month", "incidents", "declared", "never_declared", "not_declared_yet", "provider_first"],
        "properties": {
            "month": {"type": "string", "example": "2026-12"},
            "incidents": {"type": "integer"}, "declared": {"type": "integer"},
            "never_declared": {"type": "integer"}, "not_declared_yet": {"type": "integer"},
            "provider_first": {"type": "integer"},
            "median_lead_seconds": {"type": "integer", "nullable": true},
            "never_declared_share": {"type": "number", "nullable": true},
            "provider_first_share": {"type": "number", "nullable": true}
        }
    })
}
