//! Regression sets: `probes/*.toml`, one set per file, checked like the config — serde with
//! `deny_unknown_fields`, then every value checked, each problem located as
//! `FILE:LINE:COL: key.path: message` (array indices 0-based: `case[2].regex`).
//!
//! ```toml
//! name = "format"                 # [a-z0-9_-]+, unique across the folder
//! description = "…"               # optional
//! every = "1h"                    # how often the set runs on each route it applies to
//! applies_to = ["chat-main", "qwen/*"]   # logical models (`serves`) or route-id globs (`*`, `?`)
//!
//! [params]                        # all optional, defaults shown
//! temperature = 0
//! max_tokens = 256                # 1..=4096: a regression case is short by design
//! timeout = "60s"
//! first_byte_timeout = "20s"
//! stream = true
//!
//! [[case]]
//! name = "yes_no"
//! system = "…"                    # optional; or `messages = [{role, content}, …]` instead of system/user
//! user = "…"
//! one_of = ["yes", "no"]          # validators: exact, contains, regex, json, json_schema,
//!                                 # min_chars, max_chars, one_of — at least one per case
//! example = "no"                  # optional known-good answer, checked against the validators
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;

use super::validate::{one_line, Schema, Validator};
use crate::config::{parse_located, Checker, ConfigErrors, Diagnostic};
use crate::probe::{ChatMessage, ChatRequest, Role};
use crate::route::Route;

/// The product's one glob dialect (`*` any run, `?` one character), kept at this path.
pub use crate::glob::glob_match;

/// Largest `max_tokens` a set may ask for: sets run on every route every `every`; their cost
/// must stay small and predictable.
pub const MAX_SET_TOKENS: u32 = 4096;

/// One loaded, checked regression set.
#[derive(Debug, Clone)]
pub struct RegressionSet {
    pub name: String,
    pub description: Option<String>,
    pub every: Duration,
    /// Logical model names or route-id globs.
    pub applies_to: Vec<String>,
    pub params: Params,
    pub cases: Vec<Case>,
    /// The file it came from, as found in the folder.
    pub file: PathBuf,
}

/// Request parameters for every case of a set.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub temperature: f64,
    pub max_tokens: u32,
    pub timeout: Duration,
    pub first_byte_timeout: Duration,
    pub stream: bool,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            max_tokens: 256,
            timeout: Duration::from_secs(60),
            first_byte_timeout: Duration::from_secs(20),
            stream: true,
        }
    }
}

/// One question and what its answer must look like.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub messages: Vec<ChatMessage>,
    pub validators: Vec<Validator>,
    /// A known-good answer (optional): checked against the validators when the set is loaded,
    /// so a validator that rejects good answers is caught by `check-config`, not in production.
    pub example: Option<String>,
}

impl RegressionSet {
    /// Whether the set runs on `route`: a pattern equal to its logical model, or a glob
    /// matching its id.
    pub fn applies(&self, route: &Route) -> bool {
        self.applies_to
            .iter()
            .any(|p| p == &route.serves || glob_match(p, route.id.as_str()))
    }

    /// The request one case sends.
    pub fn request(&self, case: &Case) -> ChatRequest {
        ChatRequest {
            messages: case.messages.clone(),
            max_tokens: self.params.max_tokens,
            temperature: self.params.temperature,
            stream: self.params.stream,
            timeout: self.params.timeout,
            first_byte_timeout: self.params.first_byte_timeout,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSet {
    name: String,
    description: Option<String>,
    every: String,
    applies_to: Vec<String>,
    #[serde(default)]
    params: RawParams,
    #[serde(rename = "case")]
    cases: Vec<RawCase>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawParams {
    temperature: Option<f64>,
    max_tokens: Option<i64>,
    timeout: Option<String>,
    first_byte_timeout: Option<String>,
    stream: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    system: Option<String>,
    user: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    exact: Option<String>,
    contains: Option<OneOrMany>,
    regex: Option<String>,
    json: Option<bool>,
    json_schema: Option<serde_json::Value>,
    min_chars: Option<i64>,
    max_chars: Option<i64>,
    one_of: Option<Vec<String>>,
    example: Option<String>,
}

/// Parses and checks one set; `label` names the file in diagnostics.
pub fn parse(src: &str, label: &str) -> Result<RegressionSet, ConfigErrors> {
    let (raw, map): (RawSet, _) = parse_located(src, label)?;
    let mut ck = Checker::new(label, &map);
    let set = convert(raw, &mut ck, Path::new(label));
    ck.finish()?;
    Ok(set)
}

/// Reads one file.
pub fn load_file(path: &Path) -> Result<RegressionSet, ConfigErrors> {
    let label = path.display().to_string();
    let src = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![Diagnostic {
            file: label.clone(),
            line: 0,
            col: 0,
            path: String::new(),
            message: format!("cannot read: {e}"),
        }])
    })?;
    parse(&src, &label)
}

/// Every `*.toml` in `dir`, in file-name order; every error of every file (a set with errors is
/// never used), plus duplicate names across files.
pub fn load_dir(dir: &Path) -> Result<Vec<RegressionSet>, ConfigErrors> {
    let label = dir.display().to_string();
    let fail = |message: String| {
        ConfigErrors(vec![Diagnostic {
            file: label.clone(),
            line: 0,
            col: 0,
            path: String::new(),
            message,
        }])
    };
    let entries = std::fs::read_dir(dir)
        .map_err(|e| fail(format!("cannot read the regression sets folder: {e}")))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut sets = Vec::new();
    let mut errors = Vec::new();
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    for file in files {
        match load_file(&file) {
            Ok(set) => {
                if let Some(first) = seen.get(&set.name) {
                    let src = std::fs::read_to_string(&file).unwrap_or_default();
                    let (line, col) = name_position(&src);
                    errors.push(Diagnostic {
                        file: file.display().to_string(),
                        line,
                        col,
                        path: "name".into(),
                        message: format!(
                            "duplicate set name {:?} (first defined in {})",
                            set.name,
                            first.display()
                        ),
                    });
                } else {
                    seen.insert(set.name.clone(), file.clone());
                    sets.push(set);
                }
            }
            Err(e) => errors.extend(e.0),
        }
    }
    if errors.is_empty() {
        Ok(sets)
    } else {
        Err(ConfigErrors(errors))
    }
}

fn name_position(src: &str) -> (usize, usize) {
    match toml_edit::ImDocument::parse(src.to_owned()) {
        Ok(doc) => crate::config::SourceMap::new(doc).locate("name"),
        Err(_) => (0, 0),
    }
}

fn duration(ck: &mut Checker<'_>, path: &str, raw: Option<String>, default: Duration) -> Duration {
    let Some(s) = raw else { return default };
    match humantime::parse_duration(&s) {
        Ok(d) if !d.is_zero() => d,
        Ok(_) => {
            ck.error(path, "must be greater than 0");
            default
        }
        Err(e) => {
            ck.error(
                path,
                format!("invalid duration {s:?}: {e} (write e.g. \"30s\", \"1h\")"),
            );
            default
        }
    }
}

fn is_id(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

fn convert(raw: RawSet, ck: &mut Checker<'_>, file: &Path) -> RegressionSet {
    if !is_id(&raw.name) {
        ck.error(
            "name",
            format!("invalid set name {:?}: use [a-z0-9_-]+", raw.name),
        );
    }
    let every = duration(ck, "every", Some(raw.every), Duration::from_secs(3600));
    if raw.applies_to.is_empty() {
        ck.error(
            "applies_to",
            "no routes: name logical models (serves) or route-id globs such as \"qwen/*\" or \"*\"",
        );
    }
    for (i, p) in raw.applies_to.iter().enumerate() {
        if p.trim().is_empty() {
            ck.error(format!("applies_to[{i}]"), "must not be empty");
        }
    }
    let d = Params::default();
    let rp = raw.params;
    let temperature = rp.temperature.unwrap_or(d.temperature);
    if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
        ck.error(
            "params.temperature",
            format!("must be in [0, 2], got {temperature}"),
        );
    }
    let max_tokens = match rp.max_tokens {
        None => d.max_tokens,
        Some(n) => match u32::try_from(n) {
            Ok(n) if (1..=MAX_SET_TOKENS).contains(&n) => n,
            _ => {
                ck.error(
                    "params.max_tokens",
                    format!("must be in 1..={MAX_SET_TOKENS}, got {n}: regression cases are short by design"),
                );
                d.max_tokens
            }
        },
    };
    let timeout = duration(ck, "params.timeout", rp.timeout, d.timeout);
    let first_byte_timeout = duration(
        ck,
        "params.first_byte_timeout",
        rp.first_byte_timeout,
        d.first_byte_timeout,
    );
    let params = Params {
        temperature,
        max_tokens,
        timeout,
        first_byte_timeout: first_byte_timeout.min(timeout),
        stream: rp.stream.unwrap_or(d.stream),
    };
    if raw.cases.is_empty() {
        ck.error("case", "no cases: add at least one [[case]]");
    }
    let mut names: HashMap<String, usize> = HashMap::new();
    let cases = raw
        .cases
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let p = format!("case[{i}]");
            if c.name.trim().is_empty() {
                ck.error(format!("{p}.name"), "must not be empty");
            } else if let Some(first) = names.get(&c.name) {
                ck.error(
                    format!("{p}.name"),
                    format!("duplicate case name {:?} (first at case[{first}])", c.name),
                );
            } else {
                names.insert(c.name.clone(), i);
            }
            case(ck, &p, c)
        })
        .collect();
    RegressionSet {
        name: raw.name,
        description: raw.description,
        every,
        applies_to: raw.applies_to,
        params,
        cases,
        file: file.to_owned(),
    }
}

fn case(ck: &mut Checker<'_>, p: &str, c: RawCase) -> Case {
    let key = |k: &str| format!("{p}.{k}");
    let messages = match (c.messages, c.system, c.user) {
        (Some(m), None, None) => {
            if !m.iter().any(|m| m.role == Role::User) {
                ck.error(
                    key("messages"),
                    "needs at least one message with role \"user\"",
                );
            }
            m
        }
        (Some(m), _, _) => {
            ck.error(
                key("messages"),
                "give either messages or system/user, not both",
            );
            m
        }
        (None, system, Some(user)) => ChatMessage::pair(system.as_deref().unwrap_or(""), &user),
        (None, _, None) => {
            ck.error(
                p,
                "no question: add user = \"…\" (and optionally system) or messages",
            );
            Vec::new()
        }
    };
    let declared = c.exact.is_some()
        || c.contains.is_some()
        || c.regex.is_some()
        || c.json.is_some()
        || c.json_schema.is_some()
        || c.min_chars.is_some()
        || c.max_chars.is_some()
        || c.one_of.is_some();
    let mut validators = Vec::new();
    if let Some(s) = c.exact {
        validators.push(Validator::Exact(s));
    }
    if let Some(s) = c.contains {
        let list = match s {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        };
        if list.is_empty() || list.iter().any(String::is_empty) {
            ck.error(key("contains"), "needs non-empty strings");
        }
        validators.push(Validator::Contains(list));
    }
    if let Some(re) = c.regex {
        match Regex::new(&re) {
            Ok(re) => validators.push(Validator::Regex(re)),
            Err(e) => ck.error(
                key("regex"),
                format!("invalid regex: {}", one_line(&e.to_string())),
            ),
        }
    }
    match c.json {
        Some(true) => validators.push(Validator::Json),
        Some(false) => ck.error(key("json"), "json = false checks nothing: remove it"),
        None => {}
    }
    if let Some(schema) = c.json_schema {
        match Schema::compile(&schema) {
            Ok(s) => validators.push(Validator::JsonSchema(Box::new(s))),
            Err((at, msg)) => {
                let path = if at.is_empty() {
                    key("json_schema")
                } else {
                    format!("{}.{at}", key("json_schema"))
                };
                ck.error(path, msg);
            }
        }
    }
    let mut chars = |k: &str, v: Option<i64>| -> Option<usize> {
        let v = v?;
        match usize::try_from(v) {
            Ok(n) => Some(n),
            Err(_) => {
                ck.error(key(k), format!("must be 0 or more, got {v}"));
                None
            }
        }
    };
    let min = chars("min_chars", c.min_chars);
    let max = chars("max_chars", c.max_chars);
    if let (Some(a), Some(b)) = (min, max) {
        if a > b {
            ck.error(
                key("min_chars"),
                format!("must not exceed max_chars ({b}), got {a}"),
            );
        }
    }
    validators.extend(min.map(Validator::MinChars));
    validators.extend(max.map(Validator::MaxChars));
    if let Some(options) = c.one_of {
        if options.is_empty() {
            ck.error(key("one_of"), "needs at least one allowed answer");
        }
        validators.push(Validator::OneOf(options));
    }
    if !declared {
        ck.error(
            p,
            "no validators: add at least one of exact, contains, regex, json, json_schema, min_chars, max_chars, one_of",
        );
    }
    if let Some(example) = &c.example {
        for v in &validators {
            if let Err(why) = v.check(example) {
                ck.error(
                    key("example"),
                    format!("the known-good example fails validator {}: {why}", v.name()),
                );
            }
        }
    }
    Case {
        name: c.name,
        messages,
        validators,
        example: c.example,
    }
}
