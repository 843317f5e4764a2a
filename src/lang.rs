//! The languages messages and pages are written in (`lang = "zh" | "en"` in the config).

use serde::{Deserialize, Serialize};

/// The language a channel's messages are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lang {
    Zh,
    En,
}

impl Lang {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "zh" => Some(Self::Zh),
            "en" => Some(Self::En),
            _ => None,
        }
    }
}
