//! What a transition was decided on, and the incidents transitions belong to. The records
//! themselves are base types (the store persists them); detection names them from here.

pub use crate::evidence::{ErrorRateEvidence, Evidence, Observed, Threshold};
pub use crate::state::{Incident, Transition};
