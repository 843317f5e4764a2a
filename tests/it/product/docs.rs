//! The documentation stays true to the code: `docs/configuration.md` documents exactly the
//! keys the config accepts (read from the config's own serde structs, so a new key without
//! docs fails here), and every TOML example in it is accepted by the config loader.

use std::collections::BTreeSet;

use probeok::config::{known_keys, Config};

const CONFIGURATION: &str = include_str!("../../../docs/configuration.md");

/// The keys the doc documents: a section heading names its table in backticks
/// (`` ## `[server]` ``, `` ### `[[provider.region]]` ``), and each row of a table whose header
/// starts with `| key |` names one key of that table in backticks (a dotted key such as
/// `price.currency` is a key of an inline table).
fn documented_keys(doc: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut section: Option<String> = None;
    let mut in_key_table = false;
    for line in doc.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            in_key_table = false;
            section = line
                .split('`')
                .nth(1)
                .filter(|s| s.starts_with('['))
                .map(|s| s.trim_matches(|c| c == '[' || c == ']').to_owned());
        } else if line.starts_with("| key |") {
            in_key_table = true;
        } else if !line.starts_with('|') {
            in_key_table = false;
        } else if in_key_table && line.starts_with("| `") {
            let key = line.split('`').nth(1).unwrap_or_default();
            let table = section
                .as_deref()
                .unwrap_or_else(|| panic!("key `{key}` documented outside a section"));
            keys.insert(format!("{table}.{key}"));
        }
    }
    keys
}

/// The ```toml blocks of a markdown text, in order.
fn toml_blocks(doc: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        match current.as_mut() {
            None if line.trim_start().starts_with("```toml") => current = Some(String::new()),
            Some(_) if line.trim_start().starts_with("```") => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

#[test]
fn configuration_doc_documents_exactly_the_accepted_keys() {
    let accepted: BTreeSet<String> = known_keys().unwrap().into_iter().collect();
    let documented = documented_keys(CONFIGURATION);
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/configuration.md is out of step with the config:\n  accepted but not documented: \
         {undocumented:?}\n  documented but not accepted: {unknown:?}"
    );
}

#[test]
fn documented_keys_parser_reads_sections_and_key_tables_only() {
    let doc = "# Config\n\n| key | default |\n| --- | --- |\n\n## `[server]`\n\n\
               | key | default | what |\n| --- | --- | --- |\n| `listen` | x | y |\n\n\
               | other | table |\n| `not_a_key` | z |\n\n### `[[provider.region]]`\n\n\
               | key | default |\n| `base_url` | — |\n";
    let keys: Vec<_> = documented_keys(doc).into_iter().collect();
    assert_eq!(keys, ["provider.region.base_url", "server.listen"]);
}

/// Every example parses and validates. The first example is a whole config; an example
/// without a `[[route]]` of its own is a fragment and is checked appended to that first one.
#[test]
fn every_toml_example_in_configuration_doc_is_accepted() {
    let blocks = toml_blocks(CONFIGURATION);
    assert!(blocks.len() >= 5, "only {} examples found", blocks.len());
    let base = &blocks[0];
    assert!(
        base.contains("[[route]]"),
        "the first example must be a whole config"
    );
    for (i, block) in blocks.iter().enumerate() {
        let src = if block.contains("[[route]]") {
            block.clone()
        } else {
            format!("{base}\n{block}")
        };
        if let Err(e) = Config::parse(&src, &format!("example {}", i + 1)) {
            panic!(
                "example {} of docs/configuration.md is rejected:\n{e}\n---\n{src}",
                i + 1
            );
        }
    }
}

/// The Markdown files a user reads: the README and everything under `docs/`.
fn user_docs() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let name = p.strip_prefix(root).unwrap().display().to_string();
            (name, text)
        })
        .collect()
}

/// The words of `text` that start with `prefix` and go on with path or identifier characters,
/// without the punctuation a sentence puts after them.
fn words_starting(text: &str, prefix: &str, also: &[char]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || also.contains(&c)))
            .unwrap_or(tail.len());
        // A word, not the inside of a longer one (`my_src/x`, `xprobeok_`).
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '/' || c == '.') {
            out.push(tail[..end].trim_end_matches(['.', '/']).to_owned());
        }
        rest = &tail[end.max(prefix.len())..];
    }
    out
}

/// Every file or folder of the repository that the docs name (`src/…`, `tests/…`, `scripts/…`
/// and the like) exists: a doc that names a moved or deleted file sends the reader nowhere.
#[test]
fn every_repository_path_named_in_the_docs_exists() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    for (file, text) in user_docs() {
        for top in [
            "src/",
            "tests/",
            "scripts/",
            "benches/",
            "examples/",
            "migrations/",
            "contrib/",
            "templates/",
            "static/",
            "probes/",
            "integrations/",
        ] {
            for path in words_starting(&text, top, &['/', '.', '-', '*']) {
                // A glob (`tests/cluster_*.rs`) names a family of files; an example or a
                // bench may be named without its `.rs`.
                let exists = path.contains('*')
                    || root.join(&path).exists()
                    || root.join(format!("{path}.rs")).exists();
                if path.len() > top.len() && !exists {
                    missing.push(format!("{file}: {path}"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths named in the docs that do not exist:\n  {}",
        missing.join("\n  ")
    );
}

/// The metric families an exposition declares (`# TYPE name kind`).
fn families(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The metric names the source registers: the string literals given to prometheus-client's
/// `register`, `register_with_unit` and `encode_descriptor` (on the call's line or the two
/// after it) and those of a `…FAMILIES` table, under the `probeok` or `probeok_agent` prefix.
fn registered_names() -> BTreeSet<String> {
    fn walk(dir: &std::path::Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let (mut call_lines, mut in_table) = (0u8, false);
                for line in text.lines() {
                    if ["register(", "register_with_unit(", "encode_descriptor("]
                        .iter()
                        .any(|c| line.contains(c))
                    {
                        call_lines = 3;
                    }
                    in_table |= line.contains("FAMILIES") && line.contains('=');
                    if call_lines > 0 || in_table {
                        let names = line.split('"').skip(1).step_by(2).filter(|l| {
                            !l.is_empty()
                                && l.chars().all(|c| {
                                    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
                                })
                        });
                        for name in names {
                            out.insert(format!("probeok_{name}"));
                            out.insert(format!("probeok_agent_{name}"));
                        }
                    }
                    call_lines = call_lines.saturating_sub(1);
                    in_table &= !line.trim_start().starts_with("];");
                }
            }
        }
    }
    let mut names = BTreeSet::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut names,
    );
    names
}

/// `probeok_…` words of the docs that are not metrics: the LiteLLM integration's Python
/// package, its callback and the deployment key it reads.
const NOT_METRICS: &[&str] = &["probeok_litellm", "probeok_callback", "probeok_route"];

/// Every `probeok_…` metric the docs name is one the service has: exposed by a served
/// monitor's `/metrics` (read over a socket), or registered in the source under that name
/// (families without a sample yet are not in an exposition). A dashboard built from the
/// docs shows data.
#[tokio::test]
async fn every_metric_named_in_the_docs_is_exposed() {
    use crate::common::app::{at, Harness};
    let h = Harness::new(
        &[crate::common::app::Spec::new(
            "qwen",
            "cn-beijing",
            "qwen-max",
        )],
        at("2026-03-04T10:00:00Z"),
    )
    .await;
    let served = h.serve().await;
    let monitor = reqwest::get(served.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut known = families(&monitor);
    assert!(known.contains("probeok_route_state"), "{monitor}");
    known.extend(registered_names());
    let is_known = |name: &str| {
        known.contains(name)
            || ["_total", "_bucket", "_count", "_sum", "_created", "_info"]
                .iter()
                .any(|s| {
                    name.strip_suffix(s)
                        .is_some_and(|base| known.contains(base))
                })
    };
    let mut unknown = BTreeSet::new();
    for (file, text) in user_docs() {
        for name in words_starting(&text, "probeok_", &[]) {
            if name != "probeok_" && !NOT_METRICS.contains(&name.as_str()) && !is_known(&name) {
                unknown.insert(format!("{file}: {name}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics named in the docs that the service does not have:\n  {}",
        unknown.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}

#[test]
fn words_are_read_whole_and_without_trailing_punctuation() {
    let text = "see `src/web/api.rs`, and src/store/. Not my_src/x; probeok_probes_total{route}.";
    assert_eq!(
        words_starting(text, "src/", &['/', '.', '-']),
        ["src/web/api.rs", "src/store"]
    );
    assert_eq!(
        words_starting(text, "probeok_", &[]),
        ["probeok_probes_total"]
    );
}
