//! Property tests of the config parser: arbitrary TOML-ish input and mutations of the example
//! config never panic, and every diagnostic has the documented shape
//! (`file:line:col: key.path: message` when it is located; see docs/configuration.md).

use std::sync::OnceLock;

use probeok::config::{known_keys, Config, Diagnostic};
use probeok::secret::Env;
use proptest::prelude::*;

/// Cases per property: bounded so the suite's time does not depend on the environment.
const CASES: u32 = 256;
const LABEL: &str = "props.toml";

fn example() -> &'static str {
    static EXAMPLE: OnceLock<String> = OnceLock::new();
    EXAMPLE.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/probeok.example.toml");
        std::fs::read_to_string(path).expect("the example config")
    })
}

fn keys() -> &'static [String] {
    static KEYS: OnceLock<Vec<String>> = OnceLock::new();
    KEYS.get_or_init(|| known_keys().expect("known keys"))
}

/// Checks one diagnostic's shape against the source it was found in.
fn check_shape(d: &Diagnostic, src: &str) -> Result<(), TestCaseError> {
    let text = d.to_string();
    prop_assert_eq!(&d.file, LABEL, "{}", text);
    prop_assert!(!d.message.is_empty(), "an empty message: {}", text);
    prop_assert!(
        !d.message.contains('\n'),
        "a message spans lines: {:?}",
        text
    );
    let prefix = if d.line > 0 {
        prop_assert!(d.col > 0, "a line without a column: {}", text);
        // A position past the end is at most the line after the last one (end of input).
        let lines = src.lines().count().max(1);
        prop_assert!(
            d.line <= lines + 1,
            "line {} of {}: {}",
            d.line,
            lines,
            text
        );
        format!("{LABEL}:{}:{}: ", d.line, d.col)
    } else {
        prop_assert_eq!(d.col, 0, "a column without a line: {}", text);
        format!("{LABEL}: ")
    };
    let expected = if d.path.is_empty() {
        format!("{prefix}{}", d.message)
    } else {
        prop_assert!(!d.path.contains(": "), "path {:?}", d.path);
        format!("{prefix}{}: {}", d.path, d.message)
    };
    prop_assert_eq!(text, expected);
    Ok(())
}

/// Parses `src` and holds the shape of everything it reports. A config that parses is also
/// resolved and checked for missing secrets, the next steps `serve` takes.
fn parse_and_check(src: &str) -> Result<(), TestCaseError> {
    match Config::parse(src, LABEL) {
        Ok(loaded) => {
            for d in &loaded.warnings {
                check_shape(d, src)?;
            }
            let mut config = loaded.config;
            config.env = Env::given();
            let _ = config.routes();
            for d in config.missing_secrets() {
                check_shape(&d, src)?;
            }
            prop_assert!(config.validate().is_ok(), "a parsed config validates again");
        }
        Err(errors) => {
            prop_assert!(!errors.0.is_empty(), "an error without a diagnostic");
            for d in &errors.0 {
                check_shape(d, src)?;
            }
        }
    }
    Ok(())
}

/// A TOML value, mostly of the kinds the config takes (durations, sizes, times, names),
/// sometimes nonsense.
fn value() -> impl Strategy<Value = String> {
    let scalar = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        Just("nan".to_owned()),
        Just("-inf".to_owned()),
        any::<bool>().prop_map(|b| b.to_string()),
        (any::<u64>(), "(ns|ms|s|m|h|d|w|y|KiB|MiB|GB|%|x)?")
            .prop_map(|(n, u)| format!("\"{n}{u}\"")),
        "\"[0-9]{1,2}:[0-9]{1,2}(-[0-9]{1,2}:[0-9]{1,2})?\"",
        "\"[a-z0-9/_.:*?-]{0,20}\"",
        "\"\\PC{0,16}\"",
        "'\\PC{0,16}'",
        "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z",
    ];
    scalar.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            prop::collection::vec(("[a-z_]{1,12}", inner), 0..3).prop_map(|kv| {
                let body: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k} = {v}")).collect();
                format!("{{ {} }}", body.join(", "))
            }),
        ]
    })
}

/// One line of a TOML-ish document: a known key under its table (as a table or an array of
/// tables), an unknown key, a header, or any text.
fn line() -> impl Strategy<Value = String> {
    let n = keys().len();
    prop_oneof![
        4 => (0..n, any::<bool>(), value()).prop_map(|(i, array, v)| {
            let key = &keys()[i];
            match key.rsplit_once('.') {
                Some((table, leaf)) if array => format!("[[{table}]]\n{leaf} = {v}"),
                Some((table, leaf)) => format!("[{table}]\n{leaf} = {v}"),
                None => format!("{key} = {v}"),
            }
        }),
        1 => ("[a-z_.\"]{1,20}", value()).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => "\\[{1,2}[a-z_.]{0,16}\\]{0,2}",
        1 => "\\PC{0,40}",
    ]
}

/// How the example config is broken.
#[derive(Debug, Clone)]
enum Mutation {
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    /// The value of the n-th `key = value` line, replaced.
    ReplaceValue(usize, String),
    InsertLine(usize, String),
    /// Cut at a character index.
    Truncate(usize),
    /// A character replaced by another.
    Replace(usize, char),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => any::<usize>().prop_map(Mutation::DeleteLine),
        1 => any::<usize>().prop_map(Mutation::DuplicateLine),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        4 => (any::<usize>(), value()).prop_map(|(n, v)| Mutation::ReplaceValue(n, v)),
        2 => (any::<usize>(), line()).prop_map(|(n, l)| Mutation::InsertLine(n, l)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), any::<char>()).prop_map(|(n, c)| Mutation::Replace(n, c)),
    ]
}

fn apply(src: &str, m: &Mutation) -> String {
    let mut lines: Vec<String> = src.lines().map(str::to_owned).collect();
    let len = lines.len().max(1);
    match m {
        Mutation::DeleteLine(n) => {
            if !lines.is_empty() {
                lines.remove(n % len);
            }
        }
        Mutation::DuplicateLine(n) => {
            if let Some(l) = lines.get(n % len).cloned() {
                lines.insert(n % len, l);
            }
        }
        Mutation::SwapLines(a, b) => {
            if !lines.is_empty() {
                lines.swap(a % len, b % len);
            }
        }
        Mutation::ReplaceValue(n, v) => {
            let assignments: Vec<usize> = (0..lines.len())
                .filter(|&i| !lines[i].trim_start().starts_with('#') && lines[i].contains(" = "))
                .collect();
            if !assignments.is_empty() {
                let at = assignments[n % assignments.len()];
                let key = lines[at].split(" = ").next().unwrap_or_default().to_owned();
                lines[at] = format!("{key} = {v}");
            }
        }
        Mutation::InsertLine(n, l) => lines.insert(n % (lines.len() + 1), l.clone()),
        Mutation::Truncate(n) => {
            let text = lines.join("\n");
            return text.chars().take(n % (text.chars().count() + 1)).collect();
        }
        Mutation::Replace(n, c) => {
            let mut chars: Vec<char> = lines.join("\n").chars().collect();
            if !chars.is_empty() {
                let at = n % chars.len();
                chars[at] = *c;
            }
            return chars.into_iter().collect();
        }
    }
    lines.join("\n")
}

#[test]
fn the_example_config_parses_cleanly() {
    // The mutations start from a config that is valid as it stands.
    let loaded = Config::parse(example(), LABEL).expect("the example parses");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
}

#[test]
fn the_shape_check_catches_a_bad_diagnostic() {
    let good = Diagnostic {
        file: LABEL.into(),
        line: 2,
        col: 3,
        path: "server.listen".into(),
        message: "bad".into(),
    };
    assert!(check_shape(&good, "a\nb\n").is_ok());
    let past_the_end = Diagnostic {
        line: 9,
        ..good.clone()
    };
    assert!(check_shape(&past_the_end, "a\nb\n").is_err());
    let no_column = Diagnostic { col: 0, ..good };
    assert!(check_shape(&no_column, "a\nb\n").is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn arbitrary_text_never_panics(src in "\\PC{0,200}") {
        parse_and_check(&src)?;
    }

    #[test]
    fn toml_like_documents_never_panic_and_errors_are_located(
        lines in prop::collection::vec(line(), 0..12)
    ) {
        parse_and_check(&lines.join("\n"))?;
    }

    #[test]
    fn a_mutated_example_never_panics_and_errors_are_located(
        mutations in prop::collection::vec(mutation(), 1..4)
    ) {
        let src = mutations.iter().fold(example().to_owned(), |s, m| apply(&s, m));
        parse_and_check(&src)?;
    }
}

#[test]
fn a_control_character_in_a_comment_is_named() {
    // The TOML parser reports this one without a message of its own.
    let e = Config::parse("# a comment\n#\0 here\n", LABEL).unwrap_err();
    assert_eq!(e.to_string(), "props.toml:2:2: unexpected character '\\0'");
}
