//! Pure measurement helpers: what an answer is worth (verification), how many tokens it had
//! when the API did not say, and the tokens/s figure. No I/O, so every rule is unit-tested.

use super::outcome::MIN_TOKENS_FOR_TPS;

/// The throughput probe asks for the numbers 1..=this, in order (`[probe]
/// throughput_prompt`). A custom `throughput_prompt` must ask for the same sequence, or every
/// throughput answer reads as drift.
pub const THROUGHPUT_COUNT_TO: u32 = 40;

/// Below this span between the first token and the end, a tokens/s figure is a division by
/// (almost) zero: everything arrived in one read, so the rate measures our socket, not the model.
const MIN_TPS_SPAN_MS: f64 = 1.0;

/// The probe answer is right when it equals `expect` after trimming whitespace.
pub fn verify_exact(answer: &str, expect: &str) -> bool {
    answer.trim() == expect.trim()
}

/// The throughput answer is right when it is exactly the numbers 1..=`THROUGHPUT_COUNT_TO` in
/// order. Separators may be any whitespace or commas, and one final full stop is tolerated;
/// any other word ("Sure! 1 2 3…") makes it unverified, which is the drift signal we want.
pub fn verify_count(answer: &str) -> bool {
    let answer = answer.trim();
    let answer = answer.strip_suffix('.').unwrap_or(answer);
    let mut expected = 1u32;
    for piece in answer
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|p| !p.is_empty())
    {
        match piece.parse::<u32>() {
            Ok(n) if n == expected => expected += 1,
            _ => return false,
        }
    }
    expected == THROUGHPUT_COUNT_TO + 1
}

/// A rough token count for text whose usage the API did not report: each maximal run of
/// letters/digits is one piece and each other visible character (punctuation, `_`) is one
/// more. BPE tokenizers split `PROBE_OK` into about 3 tokens and "1 2 3" into 3; this gets
/// both right and stays within a small factor elsewhere, which is all an estimate claims.
pub fn estimate_tokens(text: &str) -> u32 {
    let mut count = 0u32;
    let mut in_word = false;
    for c in text.chars() {
        if c.is_alphanumeric() {
            if !in_word {
                count = count.saturating_add(1);
                in_word = true;
            }
        } else {
            in_word = false;
            if !c.is_whitespace() {
                count = count.saturating_add(1);
            }
        }
    }
    count
}

/// Output tokens per second after the first token: `(tokens - 1) / (total - ttft)`.
///
/// The first token arrives *at* `ttft`, so it was not generated inside the span; counting it
/// would overstate short answers (8 tokens: +14%). `None` below [`MIN_TOKENS_FOR_TPS`] tokens
/// (2–5 tokens over a few ms is noise) or when the span is about zero (non-streaming answers,
/// where `ttft == total`).
pub fn tokens_per_second(tokens: u32, ttft_ms: f64, total_ms: f64) -> Option<f64> {
    if tokens < MIN_TOKENS_FOR_TPS {
        return None;
    }
    let span_ms = total_ms - ttft_ms;
    if !span_ms.is_finite() || span_ms < MIN_TPS_SPAN_MS {
        return None;
    }
    Some(f64::from(tokens - 1) / (span_ms / 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_to(n: u32, sep: &str) -> String {
        (1..=n).map(|i| i.to_string()).collect::<Vec<_>>().join(sep)
    }

    #[test]
    fn exact_answer_is_compared_after_trimming() {
        assert!(verify_exact("  PROBE_OK\n", "PROBE_OK"));
        assert!(!verify_exact("PROBE_OK.", "PROBE_OK"));
        assert!(!verify_exact("probe_ok", "PROBE_OK"));
    }

    #[test]
    fn count_accepts_spaces_commas_newlines_and_a_final_stop() {
        assert!(verify_count(&count_to(40, " ")));
        assert!(verify_count(&count_to(40, ", ")));
        assert!(verify_count(&count_to(40, "\n")));
        assert!(verify_count(&format!(" {}. ", count_to(40, ","))));
    }

    #[test]
    fn count_rejects_gaps_order_extra_words_and_short_answers() {
        assert!(!verify_count(&count_to(39, " ")));
        assert!(!verify_count(&count_to(41, " ")));
        assert!(!verify_count(&format!("Sure! {}", count_to(40, " "))));
        assert!(!verify_count(&count_to(40, " ").replace("7 8", "8 7")));
        assert!(!verify_count(""));
    }

    #[test]
    fn estimate_counts_words_and_punctuation() {
        assert_eq!(estimate_tokens("PROBE_OK"), 3);
        assert_eq!(estimate_tokens(&count_to(40, " ")), 40);
        assert_eq!(estimate_tokens("Hello, world!"), 4);
        assert_eq!(estimate_tokens("  "), 0);
    }

    #[test]
    fn tps_needs_enough_tokens_and_a_real_span() {
        assert_eq!(tokens_per_second(5, 100.0, 1100.0), None);
        assert_eq!(tokens_per_second(40, 100.0, 100.0), None);
        // 40 tokens, one every 20 ms: the last arrives 39 × 20 ms after the first.
        let tps = tokens_per_second(40, 100.0, 880.0).unwrap_or_default();
        assert!((tps - 50.0).abs() < 1e-9, "{tps}");
    }
}
