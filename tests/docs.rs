//! The documentation stays true to the code: `docs/configuration.md` documents exactly the
//! keys the config accepts (read from the config's own serde structs, so a new key without
//! docs fails here), and every TOML example in it is accepted by the config loader.

use std::collections::BTreeSet;

use probeok::config::{known_keys, Config};

const CONFIGURATION: &str = include_str!("../docs/configuration.md");

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
