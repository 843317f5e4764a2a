//! The probe client: one fixed tiny prompt, streamed, measured honestly.

pub mod client;
pub mod outcome;

pub use outcome::{OutcomeKind, ProbeError, ProbeOutcome};
