//! The probe client: one fixed tiny prompt, streamed, measured honestly.
//!
//! - [`client`]: `ProbeClient` — HTTP, timeouts, timing, outcome assembly; `chat` sends any
//!   conversation (regression sets) through the same code.
//! - [`outcome`]: `ProbeOutcome` and the `ProbeError` classification.
//! - [`measure`]: answer verification, token estimate, tokens/s (pure).
//! - `openai`, `anthropic`: request bodies and decoders for each wire dialect (pure).
//! - `sse`: body reading under the stall and deadline clocks; SSE framing.
//! - `upstream`: upstream error bodies and `Retry-After` → classification (pure).

mod anthropic;
pub mod client;
pub mod measure;
mod openai;
pub mod outcome;
mod sse;
mod upstream;
mod wire;

pub use client::{
    probe_json, ChatMessage, ChatOutcome, ChatRequest, ProbeClient, ProbeSetupError, Role,
};
pub use outcome::{OutcomeKind, ProbeError, ProbeOutcome};
