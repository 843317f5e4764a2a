//! The one glob dialect of the product, used wherever a config or an API names routes by
//! pattern: `[[maintenance]]` windows and silences, regression sets' `applies_to`.
//!
//! - `*` matches any run of characters, empty included, and crosses `/`: `qwen/*` covers every
//!   region and model of `qwen`, `*/cn-*/*` every route in a `cn-` region.
//! - `?` matches exactly one character (never `/`-aware either: `qwen/cn/?` matches
//!   `qwen/cn/x`, not `qwen/cn/xy`).
//! - Every other character matches itself, case-sensitively. There is no escape and no
//!   character class: route ids never contain `*` or `?`.
//!
//! The whole text must match (`qwen` does not match `qwen/a/b`).

/// Whether `text` matches `pattern` (see the module docs).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative wildcard matching with one backtrack point (the last `*`): linear in
    // practice, and no recursion for a hostile pattern to exhaust.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] != '*' && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_matches_any_run_across_slashes() {
        assert!(glob_match("*", "x/y/z"));
        assert!(glob_match("*", ""));
        assert!(glob_match("qwen/*", "qwen/cn-beijing/qwen-max"));
        assert!(glob_match("qwen/*", "qwen/cn/qwen-max"));
        assert!(!glob_match("qwen/*", "deepseek/cn/qwen"));
        assert!(!glob_match("qwen/*", "deepseek/cn/x"));
        assert!(glob_match("*/cn-*/*", "qwen/cn-beijing/qwen-max"));
        assert!(glob_match("*/cn/*", "qwen/cn/qwen-max"));
        assert!(glob_match(
            "deepseek/*/deepseek-ai/*",
            "deepseek/x/deepseek-ai/DeepSeek-V3"
        ));
        assert!(glob_match("a*c", "abbbc"));
        assert!(glob_match("a*c", "ac"));
        assert!(!glob_match("a*c", "abbbd"));
        assert!(glob_match("a**c", "abc"));
    }

    #[test]
    fn question_mark_matches_exactly_one_character() {
        assert!(glob_match(
            "qwen/cn-beijing/qwen-ma?",
            "qwen/cn-beijing/qwen-max"
        ));
        assert!(glob_match("qwen/cn/?", "qwen/cn/x"));
        assert!(!glob_match("qwen/cn/?", "qwen/cn/xy"));
        assert!(!glob_match("qwen/cn/?", "qwen/cn/"));
        assert!(glob_match("a?c", "a/c"));
        assert!(glob_match("?*", "x"));
        assert!(!glob_match("?*", ""));
        // One character, not one byte.
        assert!(glob_match("区?", "区域"));
    }

    #[test]
    fn everything_else_is_literal_and_whole() {
        assert!(glob_match("exact/id/m", "exact/id/m"));
        assert!(!glob_match("exact/id", "exact/id/m"));
        assert!(!glob_match("qwen", "qwen/a/b"));
        assert!(!glob_match("Qwen/*", "qwen/a/b"));
        assert!(!glob_match("", "a"));
        assert!(glob_match("", ""));
    }
}
