//! The long prompt (pure): numbered filler lines of plain prose until the product's own token
//! estimate ([`crate::probe::measure::estimate_tokens`], the one the cost table uses) reaches
//! the configured size, then the one fact the answer must retrieve, at the very END — the
//! model has to read (prefill) the whole context before it can answer.
//!
//! Deterministic: the same `tokens` gives the same text on every probe and every monitor, so
//! TTFTs are comparable over time and prompt caching is the provider's to do or not.

use crate::probe::measure::estimate_tokens;

/// The code word the answer must contain.
pub const CODE_WORD: &str = "PROBE_OK-7341";
/// Enough for the code word and a little politeness; the probe measures prefill, not output.
pub const MAX_TOKENS: u32 = 16;

/// The closing instruction, after the filler.
pub fn question() -> String {
    format!("The code word is {CODE_WORD}. Reply with the code word only.")
}

/// Filler sentences, cycled; each line is numbered so no two lines are the same.
const FILLER: [&str; 4] = [
    "The river passes the old mill while the baker opens the shop at dawn.",
    "A clerk counts crates of apples and writes each total in a green ledger.",
    "Rain taps on the station roof as the last train leaves for the coast.",
    "Two gardeners trim the hedges and argue about the best time to plant beans.",
];

/// The whole user message: filler of about `tokens` tokens (by our estimate) ending with
/// [`question`].
pub fn text(tokens: u32) -> String {
    let tail = question();
    let target = u64::from(tokens).saturating_sub(u64::from(estimate_tokens(&tail)));
    let mut out = String::with_capacity(usize::try_from(tokens).unwrap_or(0) * 5);
    let mut have = 0u64;
    let mut i = 0usize;
    while have < target {
        let line = format!("{}. {}\n", i + 1, FILLER[i % FILLER.len()]);
        have += u64::from(estimate_tokens(&line));
        out.push_str(&line);
        i += 1;
    }
    out.push_str(&tail);
    out
}

/// Our token estimate of [`text`]`(tokens)`, for the cost table. Remembered for the last size
/// asked (the config has one): the status API costs every route, and building a 200,000-token
/// prompt per route per answer would be most of its work.
pub fn estimated_tokens(tokens: u32) -> u32 {
    static LAST: std::sync::Mutex<Option<(u32, u32)>> = std::sync::Mutex::new(None);
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match *last {
        Some((t, n)) if t == tokens => n,
        _ => {
            let n = estimate_tokens(&text(tokens));
            *last = Some((tokens, n));
            n
        }
    }
}

/// Whether an answer retrieved the fact.
pub fn answered(text: &str) -> bool {
    text.contains(CODE_WORD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_is_about_the_size_asked_and_ends_with_the_question() {
        for tokens in [1_000, 8_000, 32_000] {
            let t = text(tokens);
            let n = estimate_tokens(&t);
            assert!(n >= tokens && n < tokens + 40, "{tokens}: {n}");
            assert!(t.ends_with(&question()));
            assert_eq!(t, text(tokens), "deterministic");
            assert_eq!(estimated_tokens(tokens), n);
        }
        assert!(answered("PROBE_OK-7341"));
        assert!(!answered("PROBE_OK"));
    }
}
