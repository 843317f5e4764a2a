//! Maps key paths to positions in the config source and back, through `toml_edit`'s spans.
//!
//! The config structs stay plain serde types; this second, span-keeping view of the same text is
//! what lets every validation error point at the value it is about.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use toml_edit::{Array, ArrayOfTables, ImDocument, InlineTable, Item, Table, Value};

/// The source of a config, kept so diagnostics can be located after loading
/// (e.g. [`super::Config::missing_secrets`]). Empty for a config built in code.
///
/// While a config is loaded and validated it holds the parsed document; the loaded config keeps
/// only the text ([`SourceMap::text_only`]) and parses it again when a position is asked for:
/// the document of a 10,000-route file is about 25 MB against 1 MB of text, and after loading
/// positions are wanted only for the few diagnostics of a start or a reload.
#[derive(Clone, Default)]
pub struct SourceMap {
    source: Source,
}

#[derive(Clone, Default)]
enum Source {
    #[default]
    None,
    Text(Arc<str>),
    Parsed(Arc<ImDocument<String>>),
}

impl fmt::Debug for SourceMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.source {
            Source::None => "SourceMap(none)",
            Source::Text(_) => "SourceMap(text)",
            Source::Parsed(_) => "SourceMap(parsed)",
        })
    }
}

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

impl SourceMap {
    pub(crate) fn new(doc: ImDocument<String>) -> Self {
        Self {
            source: Source::Parsed(Arc::new(doc)),
        }
    }

    /// The same source without its parsed document (see the type's doc).
    pub(crate) fn text_only(&self) -> Self {
        let source = match &self.source {
            Source::Parsed(doc) => Source::Text(Arc::from(doc.raw())),
            other => other.clone(),
        };
        Self { source }
    }

    /// This map with its document parsed: parse once before locating many paths.
    pub(crate) fn parsed(&self) -> std::borrow::Cow<'_, Self> {
        match &self.source {
            Source::Text(text) => std::borrow::Cow::Owned(
                // The text parsed when the config was loaded; if it somehow does not now,
                // positions are unknown rather than wrong.
                ImDocument::parse(text.to_string()).map_or_else(|_| Self::default(), Self::new),
            ),
            _ => std::borrow::Cow::Borrowed(self),
        }
    }

    fn doc(&self) -> Option<&ImDocument<String>> {
        match &self.source {
            Source::Parsed(doc) => Some(doc),
            _ => None,
        }
    }

    /// 1-based (line, column) of the value at `path` (`route[2].timeout`), or, when that key is
    /// absent, of its nearest existing parent (a table's header; the top of the file for the
    /// root). `(0, 0)` when there is no source.
    pub fn locate(&self, path: &str) -> (usize, usize) {
        let map = self.parsed();
        let Some(doc) = map.doc() else {
            return (0, 0);
        };
        let mut node = Node::Table(doc.as_table());
        let mut offset = 0;
        for seg in parse_path(path) {
            let child = match &seg {
                Seg::Key(k) => node.child_key(k),
                Seg::Index(i) => node.child_index(*i),
            };
            let Some(child) = child else { break };
            if let Some(span) = child.span() {
                offset = span.start;
            }
            node = child;
        }
        line_col(doc.raw(), offset)
    }

    /// The key path of the deepest key or value whose span holds `offset` (where serde said an
    /// error is); empty when none does.
    pub(crate) fn path_at(&self, offset: usize) -> String {
        let map = self.parsed();
        let Some(doc) = map.doc() else {
            return String::new();
        };
        find(Node::Table(doc.as_table()), offset)
            .map(|segs| format_path(&segs))
            .unwrap_or_default()
    }

    pub(crate) fn line_col(&self, offset: usize) -> (usize, usize) {
        match &self.source {
            Source::Parsed(doc) => line_col(doc.raw(), offset),
            Source::Text(text) => line_col(text, offset),
            Source::None => (0, 0),
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = floor_char_boundary(src, offset.min(src.len()));
    let before = &src[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn parse_path(path: &str) -> Vec<Seg> {
    let mut segs = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let mut pieces = part.split('[');
        if let Some(name) = pieces.next().filter(|n| !n.is_empty()) {
            segs.push(Seg::Key(name.to_owned()));
        }
        for idx in pieces {
            if let Ok(i) = idx.trim_end_matches(']').parse() {
                segs.push(Seg::Index(i));
            }
        }
    }
    segs
}

fn format_path(segs: &[Seg]) -> String {
    let mut out = String::new();
    for seg in segs {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn contains(span: &Range<usize>, offset: usize) -> bool {
    span.contains(&offset) || (span.is_empty() && span.start == offset)
}

fn find(node: Node<'_>, offset: usize) -> Option<Vec<Seg>> {
    for (seg, key_span, child) in node.children() {
        if key_span.as_ref().is_some_and(|s| contains(s, offset)) {
            return Some(vec![seg]);
        }
        if let Some(mut sub) = find(child, offset) {
            sub.insert(0, seg);
            return Some(sub);
        }
    }
    node.span()
        .filter(|s| contains(s, offset))
        .map(|_| Vec::new())
}

/// A uniform view over the shapes a TOML value takes in `toml_edit`.
#[derive(Clone, Copy)]
enum Node<'a> {
    Table(&'a Table),
    Inline(&'a InlineTable),
    Array(&'a Array),
    Tables(&'a ArrayOfTables),
    Leaf(&'a Value),
}

impl<'a> Node<'a> {
    fn of_item(item: &'a Item) -> Option<Self> {
        match item {
            Item::None => None,
            Item::Table(t) => Some(Node::Table(t)),
            Item::ArrayOfTables(a) => Some(Node::Tables(a)),
            Item::Value(v) => Some(Node::of_value(v)),
        }
    }

    fn of_value(value: &'a Value) -> Self {
        match value {
            Value::InlineTable(t) => Node::Inline(t),
            Value::Array(a) => Node::Array(a),
            v => Node::Leaf(v),
        }
    }

    fn span(&self) -> Option<Range<usize>> {
        match self {
            Node::Table(t) => t.span(),
            Node::Inline(t) => t.span(),
            Node::Array(a) => a.span(),
            Node::Tables(a) => a.span(),
            Node::Leaf(v) => v.span(),
        }
    }

    fn child_key(&self, key: &str) -> Option<Node<'a>> {
        let item = match self {
            Node::Table(t) => t.get(key),
            Node::Inline(t) => t.get_key_value(key).map(|(_, item)| item),
            _ => None,
        }?;
        Node::of_item(item)
    }

    fn child_index(&self, i: usize) -> Option<Node<'a>> {
        match self {
            Node::Array(a) => a.get(i).map(Node::of_value),
            Node::Tables(a) => a.get(i).map(Node::Table),
            _ => None,
        }
    }

    /// (step, span of the key if it is a key, child).
    fn children(&self) -> Vec<(Seg, Option<Range<usize>>, Node<'a>)> {
        let keyed = |key: &'a toml_edit::Key, item: &'a Item| {
            Node::of_item(item).map(|n| (Seg::Key(key.get().to_owned()), key.span(), n))
        };
        match self {
            Node::Table(t) => t
                .iter()
                .filter_map(|(k, _)| t.get_key_value(k))
                .filter_map(|(k, item)| keyed(k, item))
                .collect(),
            Node::Inline(t) => t
                .iter()
                .filter_map(|(k, _)| t.get_key_value(k))
                .filter_map(|(k, item)| keyed(k, item))
                .collect(),
            Node::Array(a) => a
                .iter()
                .enumerate()
                .map(|(i, v)| (Seg::Index(i), None, Node::of_value(v)))
                .collect(),
            Node::Tables(a) => a
                .iter()
                .enumerate()
                .map(|(i, t)| (Seg::Index(i), None, Node::Table(t)))
                .collect(),
            Node::Leaf(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "\
title = 1
[probe]
interval = \"0s\"
[[provider]]
id = \"qwen\"
  [[provider.region]]
  id = \"a\"
  [[provider.region]]
  id = \"b\"
  base_url = \"x\"
[detection]
buckets = [[\"09:00\", \"10:00\"], [\"11:00\", \"é\"]]
price = { input = 1 }
";

    fn map() -> SourceMap {
        SourceMap::new(ImDocument::parse(SRC.to_owned()).unwrap())
    }

    #[test]
    fn locates_values_and_falls_back_to_parents() {
        let m = map();
        assert_eq!(m.locate("probe.interval"), (3, 12));
        assert_eq!(m.locate("probe.timeout"), (2, 1));
        assert_eq!(m.locate("provider[0].region[1].base_url"), (10, 14));
        assert_eq!(m.locate("provider[0].region[1].missing"), (8, 3));
        assert_eq!(m.locate("provider[0].region[5].id"), (6, 3));
        assert_eq!(m.locate("detection.buckets[1]"), (12, 32));
        assert_eq!(m.locate("detection.buckets[1][1]"), (12, 42));
        assert_eq!(m.locate("detection.price.input"), (13, 19));
        assert_eq!(m.locate("route"), (1, 1));
        assert_eq!(SourceMap::default().locate("route"), (0, 0));
    }

    #[test]
    fn the_text_alone_locates_as_the_parsed_document_does() {
        let parsed = map();
        let text = parsed.text_only();
        assert!(text.doc().is_none(), "the document is not kept");
        for path in ["probe.interval", "provider[0].region[1].base_url", "route"] {
            assert_eq!(text.locate(path), parsed.locate(path), "{path}");
        }
        let at = SRC.find("\"é\"").unwrap();
        assert_eq!(text.path_at(at), "detection.buckets[1][1]");
        assert_eq!(text.line_col(at), parsed.line_col(at));
        assert!(text.parsed().doc().is_some());
    }

    #[test]
    fn finds_the_path_at_an_offset() {
        let m = map();
        let at = |needle: &str| m.path_at(SRC.find(needle).unwrap());
        assert_eq!(at("\"0s\""), "probe.interval");
        assert_eq!(at("base_url"), "provider[0].region[1].base_url");
        assert_eq!(at("\"x\""), "provider[0].region[1].base_url");
        assert_eq!(at("\"b\""), "provider[0].region[1].id");
        assert_eq!(at("\"é\""), "detection.buckets[1][1]");
        assert_eq!(at("[[provider.region]]"), "provider[0].region[0]");
        assert_eq!(at("input"), "detection.price.input");
    }

    #[test]
    fn paths_round_trip() {
        let p = "provider[0].region[1].base_url";
        assert_eq!(format_path(&parse_path(p)), p);
        assert_eq!(
            format_path(&parse_path("detection.buckets[1][0]")),
            "detection.buckets[1][0]"
        );
    }
}
