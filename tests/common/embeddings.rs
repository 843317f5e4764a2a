//! A fake OpenAI-compatible embeddings endpoint: `POST /v1/embeddings` with OpenAI's
//! documented request (`model`, `input` a string or an array of strings, optional
//! `encoding_format`) answered with OpenAI's documented shape
//! (`{"object":"list","data":[{"object":"embedding","index":i,"embedding":[…]}],"model",
//! "usage":{"prompt_tokens","total_tokens"}}`). What it answers is switched by the test: one
//! model's steady vectors, another model's (cosine 0.8 to the first), vectors of the wrong
//! length, or a 503.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::upstream::{fake, json as respond, openai, Reply, Requests, Server};

/// The first model's vector of any text: a unit vector.
pub const MODEL_A: [f32; 8] = [0.6, 0.8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
/// Another model's: `0.8 × A + 0.6 × e3`, cosine 0.8 to [`MODEL_A`].
pub const MODEL_B: [f32; 8] = [0.48, 0.64, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0];
pub const DIMENSIONS: u32 = 8;

/// What the fake answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    ModelA = 0,
    ModelB = 1,
    /// Vectors of 5 values where 8 are configured.
    WrongLength = 2,
    /// 503 with OpenAI's error envelope.
    Unavailable = 3,
}

pub struct EmbedFake {
    pub server: Server,
    pub requests: Requests,
    mode: Arc<AtomicU8>,
}

impl EmbedFake {
    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// The base URL a provider region names (`…/v1`).
    pub fn base_v1(&self) -> String {
        format!("{}/v1", self.server.base_url())
    }

    /// Requests that reached `/v1/embeddings`.
    pub fn calls(&self) -> usize {
        self.requests.all().len()
    }
}

/// The texts of a documented request, or why it is not one.
fn texts(body: &Value) -> Result<Vec<String>, String> {
    if !body["model"].is_string() {
        return Err("'model' is required".into());
    }
    if let Some(f) = body.get("encoding_format") {
        if f != "float" && f != "base64" {
            return Err("'encoding_format' must be float or base64".into());
        }
    }
    match &body["input"] {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or("'input' items must be strings".into())
            })
            .collect(),
        _ => Err("'input' must be a string or a non-empty array of strings".into()),
    }
}

pub async fn embed_fake() -> EmbedFake {
    let mode = Arc::new(AtomicU8::new(Mode::ModelA as u8));
    let m = mode.clone();
    let (server, requests) = fake("/v1/embeddings", move |c| {
        let body: Value = serde_json::from_slice(&c.body).unwrap_or(Value::Null);
        let texts = match texts(&body) {
            Ok(t) => t,
            Err(e) => {
                return Reply::now(respond(
                    StatusCode::BAD_REQUEST,
                    openai::error(&e, "invalid_request_error", None),
                ))
            }
        };
        let vector: Vec<f32> = match m.load(Ordering::SeqCst) {
            0 => MODEL_A.to_vec(),
            1 => MODEL_B.to_vec(),
            2 => MODEL_A[..5].to_vec(),
            _ => {
                return Reply::now(respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    openai::error("The server is overloaded", "server_error", None),
                ))
            }
        };
        let data: Vec<Value> = (0..texts.len())
            .map(|i| json!({"object": "embedding", "index": i, "embedding": vector}))
            .collect();
        let tokens: usize = texts.iter().map(|t| t.split_whitespace().count()).sum();
        Reply::now(respond(
            StatusCode::OK,
            json!({"object": "list", "data": data, "model": body["model"],
                   "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
        ))
    })
    .await;
    EmbedFake {
        server,
        requests,
        mode,
    }
}
