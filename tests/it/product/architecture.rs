//! The layers of `src/lib.rs`'s `# Layout`, held by reading `src/`: every `crate::…` path,
//! every `super::` chain that climbs out of its top-level module and every `{…}` group of a
//! `use` is mapped to the top-level module it names, and each file may only name modules of
//! its own layer (where that layer allows it) or of the layers below.
//!
//! A new top-level module fails here until it is given a layer in [`LAYERS`] (and in the
//! tour in `src/lib.rs`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Bottom up; a module may import any module of a lower layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    /// The shared nouns every layer persists or passes.
    Base,
    Config,
    Store,
    /// Probing, detection, drift, weights, switching, the extra-cost budget and spend, drills, heartbeats, reload.
    Domain,
    /// What talks to people and clients: alerts, the monitor's HTTP server, the proxy.
    Surface,
    /// Puts everything together.
    Wiring,
}

/// Every top-level module of the library and its layer.
const LAYERS: &[(&str, Layer)] = &[
    ("route", Layer::Base),
    ("clock", Layer::Base),
    ("secret", Layer::Base),
    ("outcome", Layer::Base),
    ("state", Layer::Base),
    ("evidence", Layer::Base),
    ("severity", Layer::Base),
    ("lang", Layer::Base),
    ("silence", Layer::Base),
    ("records", Layer::Base),
    ("glob", Layer::Base),
    ("listen", Layer::Base),
    ("slo", Layer::Base),
    ("stdout", Layer::Base),
    ("supervise", Layer::Base),
    ("gather", Layer::Base),
    ("lag", Layer::Base),
    ("malloc", Layer::Base),
    ("vantage", Layer::Base),
    ("ratelimit", Layer::Base),
    ("config", Layer::Config),
    ("store", Layer::Store),
    ("probe", Layer::Domain),
    ("agent", Layer::Domain),
    ("scheduler", Layer::Domain),
    ("health", Layer::Domain),
    ("drift", Layer::Domain),
    ("weights", Layer::Domain),
    ("switch", Layer::Domain),
    ("sync", Layer::Domain),
    ("declared", Layer::Domain),
    ("capability", Layer::Domain),
    ("catalog", Layer::Domain),
    ("embed", Layer::Domain),
    ("extra_cost", Layer::Domain),
    ("spend", Layer::Domain),
    ("drill", Layer::Domain),
    ("heartbeat", Layer::Domain),
    ("sim", Layer::Domain),
    ("demo", Layer::Domain),
    ("reload", Layer::Domain),
    ("cluster", Layer::Domain),
    ("trace", Layer::Domain),
    ("alert", Layer::Surface),
    ("web", Layer::Surface),
    ("proxy", Layer::Surface),
    ("haproxy", Layer::Surface),
    ("app", Layer::Wiring),
    ("cli", Layer::Wiring),
];

/// Imports within one layer other than a module's own: base, domain and wiring modules use
/// each other freely; among the surfaces only the monitor's web server uses the others (it
/// mounts the proxy's request log and shows alert and proxy metrics). Config and store are
/// one module each.
fn same_layer_allowed(from: &str, to: &str, layer: Layer) -> bool {
    match layer {
        Layer::Base | Layer::Domain | Layer::Wiring => true,
        Layer::Surface => from == "web" && (to == "alert" || to == "proxy"),
        Layer::Config | Layer::Store => false,
    }
}

/// HTTP handlers that still live in domain or alert modules and reach up into `web` (or
/// `app`) for its state, errors and admin check. They move into `src/web/`; this list must
/// shrink to empty, and an entry no longer needed fails the test.
const PENDING_HANDLER_MOVES: &[(&str, &str)] = &[];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    file: String,
    line: usize,
    /// The top-level module named.
    target: String,
    why: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: `{}`: {}",
            self.file, self.line, self.target, self.why
        )
    }
}

fn layer_of(module: &str) -> Option<Layer> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// The module path of a file under `src/` (`src/store/health.rs` → `store::health`,
/// `src/store/mod.rs` → `store`); empty for `lib.rs`, `None` for the binary's `main.rs`.
fn module_path(rel: &str) -> Option<Vec<String>> {
    let rel = rel.strip_prefix("src/").unwrap_or(rel);
    if rel == "main.rs" || rel.starts_with("bin/") {
        return None;
    }
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = rel.split('/').map(str::to_owned).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    Some(parts)
}

/// The source with comments, strings and char literals blanked out (newlines kept, so line
/// numbers stay right): a path in a doc comment or a message is not an import.
fn code_only(src: &str) -> Vec<char> {
    let c: Vec<char> = src.chars().collect();
    let mut out = c.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in out.iter_mut().take(to.min(c.len())).skip(from) {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            let end = c[i..]
                .iter()
                .position(|&x| x == '\n')
                .map_or(c.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if c[i] == '/' && next == Some('*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < c.len() && depth > 0 {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if c[i] == 'r'
            && (next == Some('"') || next == Some('#'))
            && !c
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // r"…", r#"…"#: ends at a quote followed by as many hashes.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                i += 1;
                continue;
            }
            j += 1;
            while j < c.len() {
                if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            blank(&mut out, i, j);
            i = j;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if c[i] == '\'' {
            // A char literal ('a', '\n', '\u{1F600}'), not a lifetime ('a).
            if next == Some('\\') {
                let end = c[i + 2..]
                    .iter()
                    .position(|&x| x == '\'')
                    .map_or(c.len(), |p| i + 2 + p);
                blank(&mut out, i, end + 1);
                i = end + 1;
            } else if c.get(i + 2) == Some(&'\'') {
                blank(&mut out, i, i + 3);
                i += 3;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Other,
}

fn tokens(code: &[char]) -> Vec<(Tok, usize)> {
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < code.len() {
        let ch = code[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < code.len() && (code[i].is_alphanumeric() || code[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(code[start..i].iter().collect()), line));
        } else if ch == ':' && code.get(i + 1) == Some(&':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((
                match ch {
                    '{' => Tok::Open,
                    '}' => Tok::Close,
                    ',' => Tok::Comma,
                    _ => Tok::Other,
                },
                line,
            ));
            i += 1;
        }
    }
    out
}

/// The top-level modules named by the path that continues at `toks[at]` (right after a
/// `crate::` or after the last `super::` that reached the crate root): one identifier, or the
/// first identifier of each item of a `{…}` group.
fn roots_at(toks: &[(Tok, usize)], at: usize, out: &mut Vec<(String, usize)>) {
    match toks.get(at) {
        Some((Tok::Ident(name), line)) => out.push((name.clone(), *line)),
        Some((Tok::Open, _)) => {
            let (mut depth, mut expect_item) = (0usize, true);
            for (t, line) in &toks[at..] {
                match t {
                    Tok::Open => {
                        depth += 1;
                        expect_item = depth == 1;
                    }
                    Tok::Close => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Tok::Comma if depth == 1 => expect_item = true,
                    Tok::Ident(name) if expect_item && depth == 1 => {
                        out.push((name.clone(), *line));
                        expect_item = false;
                    }
                    _ => expect_item = false,
                }
            }
        }
        _ => {}
    }
}

/// Every top-level module `file` (a path under `src/`) names, with its line.
fn imports(file: &str, text: &str) -> Vec<(String, usize)> {
    let Some(file_mods) = module_path(file) else {
        return Vec::new();
    };
    let toks = tokens(&code_only(text));
    let mut out = Vec::new();
    // Inline `mod name { … }` blocks: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let after_sep = i > 0 && toks[i - 1].0 == Tok::PathSep;
        let before_sep = toks.get(i + 1).map(|t| &t.0) == Some(&Tok::PathSep);
        match &toks[i].0 {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| depth < *d) {
                    inline.pop();
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Open, _))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push((name.clone(), depth + 1));
                }
            }
            Tok::Ident(kw) if kw == "crate" && !after_sep && before_sep => {
                roots_at(&toks, i + 2, &mut out);
            }
            Tok::Ident(kw) if kw == "super" && !after_sep => {
                let mut j = i;
                let mut ups = 0;
                while toks.get(j).map(|t| &t.0) == Some(&Tok::Ident("super".into()))
                    && toks.get(j + 1).map(|t| &t.0) == Some(&Tok::PathSep)
                {
                    ups += 1;
                    j += 2;
                }
                if ups > 0 && ups >= file_mods.len() + inline.len() {
                    roots_at(&toks, j, &mut out);
                }
                i = j.max(i + 1);
                continue;
            }
            Tok::Ident(kw) if kw == "probeok" && !after_sep && before_sep => {
                out.push(("probeok".into(), toks[i].1));
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The rule violations of one file; `file` is its path under the crate (`src/…`).
fn check(file: &str, text: &str) -> Vec<Violation> {
    let Some(mods) = module_path(file) else {
        return Vec::new();
    };
    let Some(from) = mods.first() else {
        return Vec::new(); // lib.rs only declares the modules
    };
    let violation = |line: usize, target: &str, why: String| Violation {
        file: file.to_owned(),
        line,
        target: target.to_owned(),
        why,
    };
    let Some(from_layer) = layer_of(from) else {
        return vec![violation(
            1,
            from,
            "a top-level module without a layer: add it to LAYERS and to the tour in src/lib.rs"
                .into(),
        )];
    };
    let mut out = Vec::new();
    for (target, line) in imports(file, text) {
        if target == "probeok" {
            out.push(violation(
                line,
                &target,
                "the library names itself `crate::`".into(),
            ));
            continue;
        }
        if target == *from || target == "self" {
            continue;
        }
        let Some(to_layer) = layer_of(&target) else {
            continue; // an item of the crate root or a macro, not a module
        };
        let ok = to_layer < from_layer
            || (to_layer == from_layer && same_layer_allowed(from, &target, from_layer));
        if !ok {
            out.push(violation(
                line,
                &target,
                format!(
                    "{from_layer:?} module `{from}` must not import {to_layer:?} module `{target}`"
                ),
            ));
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_layers_hold() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    assert!(files.len() > 50, "read {} files under src/", files.len());
    let mut violations = Vec::new();
    for path in &files {
        let rel = path
            .strip_prefix(root)
            .expect("under the crate")
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(path).expect("readable source");
        violations.extend(check(&rel, &text));
    }
    let used: BTreeSet<(String, String)> = violations
        .iter()
        .map(|v| (v.file.clone(), v.target.clone()))
        .collect();
    let stale: Vec<_> = PENDING_HANDLER_MOVES
        .iter()
        .filter(|(f, t)| !used.contains(&(f.to_string(), t.to_string())))
        .collect();
    let broken: Vec<String> = violations
        .iter()
        .filter(|v| {
            !PENDING_HANDLER_MOVES
                .iter()
                .any(|(f, t)| v.file == *f && v.target == *t)
        })
        .map(ToString::to_string)
        .collect();
    assert!(
        broken.is_empty(),
        "imports across the layers (see the tour in src/lib.rs):\n{}",
        broken.join("\n")
    );
    assert!(
        stale.is_empty(),
        "no longer needed in PENDING_HANDLER_MOVES, remove: {stale:?}"
    );
}

#[test]
fn every_module_declared_in_lib_has_a_layer() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("src/lib.rs");
    let code: String = code_only(&lib).into_iter().collect();
    let declared: Vec<&str> = code
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';').trim())
        .collect();
    assert!(declared.len() > 20, "{declared:?}");
    for m in &declared {
        assert!(layer_of(m).is_some(), "`{m}` has no layer in LAYERS");
    }
    for (m, _) in LAYERS {
        assert!(
            declared.contains(m),
            "`{m}` is in LAYERS but not in src/lib.rs"
        );
    }
}

fn targets(file: &str, text: &str) -> Vec<String> {
    check(file, text).into_iter().map(|v| v.target).collect()
}

#[test]
fn a_store_module_naming_health_is_caught() {
    let text = "use super::{Reader, StoreError};\nuse crate::health::{State, Transition};\n";
    let v = check("src/store/health.rs", text);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].target, "health");
    assert_eq!(v[0].line, 2);
    assert!(v[0].why.contains("Store module `store`"), "{}", v[0]);
    // The same file importing base types only is fine.
    assert!(targets(
        "src/store/health.rs",
        "use crate::state::{State, Transition};"
    )
    .is_empty());
}

#[test]
fn groups_inline_paths_and_super_chains_are_read() {
    // A `{…}` group names every module in it.
    assert_eq!(
        targets(
            "src/config/mod.rs",
            "use crate::{route::Route, alert::{Lang, Severity}, secret};"
        ),
        ["alert"]
    );
    // A path in an expression, not only in `use`.
    assert_eq!(
        targets("src/weights.rs", "let s = crate::web::rfc3339(t);"),
        ["web"]
    );
    // `super::super::` out of `store::health` reaches the crate root.
    assert_eq!(
        targets("src/store/health.rs", "use super::super::drift::SetRun;"),
        ["drift"]
    );
    // Inside an inline `mod tests`, one more `super` is needed to leave.
    assert_eq!(
        targets(
            "src/store/health.rs",
            "mod tests { use super::super::Reader; use super::super::super::switch::Action; }"
        ),
        ["switch"]
    );
    // …and after the inline module closes, the file's own depth applies again.
    assert!(targets(
        "src/store/health.rs",
        "mod tests { fn f() {} }\nuse super::super::route::RouteId;"
    )
    .is_empty());
    // Staying inside the top-level module is never an import.
    assert!(targets("src/store/health.rs", "use super::writer::Command;").is_empty());
}

#[test]
fn comments_strings_and_the_binary_are_not_imports() {
    let text = r##"
        //! See [`crate::web::rfc3339`].
        /* crate::app::run */
        let s = "crate::cli::run";
        let r = r#"crate::proxy "quoted" "#;
        let c = '"'; let l: &'static str = "x";
        use crate::route::RouteId;
    "##;
    assert!(targets("src/store/mod.rs", text).is_empty());
    assert!(targets("src/main.rs", "use probeok::cli; crate::app::x();").is_empty());
}

#[test]
fn the_library_does_not_name_itself() {
    assert_eq!(
        targets("src/health/service.rs", "use probeok::route::RouteId;"),
        ["probeok"]
    );
}

#[test]
fn surfaces_and_wiring_follow_their_own_rules() {
    // The monitor's web server shows the other surfaces; they never reach into it.
    assert!(targets(
        "src/web/metrics.rs",
        "use crate::{alert::AlertMetrics, proxy::ProxyStats};"
    )
    .is_empty());
    assert_eq!(
        targets("src/proxy/mod.rs", "use crate::web::api_error;"),
        ["web"]
    );
    assert_eq!(
        targets("src/proxy/mod.rs", "use crate::alert::Severity;"),
        ["alert"]
    );
    // Domain never reaches the surfaces or the wiring.
    assert_eq!(
        targets("src/drill/client.rs", "use crate::cli::CliError;"),
        ["cli"]
    );
    assert_eq!(
        targets("src/heartbeat.rs", "crate::proxy::jobs::X"),
        ["proxy"]
    );
    // Config sits on base only.
    assert_eq!(
        targets("src/config/mod.rs", "use crate::store::Store;"),
        ["store"]
    );
    // Wiring may use anything.
    assert!(targets("src/app.rs", "use crate::{web, proxy, alert, store, cli};").is_empty());
    // An unknown top-level module must be given a layer.
    assert_eq!(targets("src/newthing.rs", ""), ["newthing"]);
}

/// Lines (1-based) of `text` whose code calls or imports a function that changes the process
/// environment. Comments and strings do not count.
fn environment_writes(text: &str) -> Vec<usize> {
    let code: String = code_only(text).into_iter().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut lines = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let hit = ["set_var", "remove_var"].iter().any(|name| {
            line.match_indices(name).any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let after = line[at + name.len()..].chars().next();
                !before.is_some_and(ident) && !after.is_some_and(ident)
            })
        });
        if hit {
            lines.push(n + 1);
        }
    }
    lines
}

/// Changing the environment of a running process races with every thread that reads it
/// (glibc's `setenv` is not thread-safe, and tests run in parallel threads of one process):
/// code is given its values instead (`probeok::secret::Env`, `Config::env`), and a child
/// process gets them through `Command::env`.
#[test]
fn no_code_changes_the_process_environment() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "read {} files", files.len());
    let mut found = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("readable source");
        for line in environment_writes(&text) {
            let rel = path.strip_prefix(root).expect("under the crate");
            found.push(format!("{}:{line}", rel.display()));
        }
    }
    assert!(
        found.is_empty(),
        "the process environment is changed at (give the code an Env instead):\n{}",
        found.join("\n")
    );
}

#[test]
fn environment_writes_are_found_in_code_only() {
    let src = "fn t() {\n    std::env::set_var(\"A\", \"1\");\n    // std::env::set_var is racy\n    let s = \"remove_var\";\n    use std::env::remove_var;\n    env::remove_var(\"A\");\n    my_set_var_helper();\n    cmd.env(\"A\", \"1\");\n}\n";
    assert_eq!(environment_writes(src), vec![2, 5, 6]);
}
