//! What the store keeps of the domain's runs, as plain data: regression-set runs
//! ([`drift`]), drills ([`drill`]) and switch records ([`switch`]). The modules that produce
//! them re-export them (`drift::SetRun`, `drill::Drill`, `switch::SwitchRecord`).

pub mod drift;
pub mod drill;
pub mod switch;
