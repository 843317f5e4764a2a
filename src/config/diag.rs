//! Located diagnostics: what `check-config` prints and what `serve` refuses to start with.

use std::fmt;

/// One located finding in a config file.
///
/// Displays as `FILE:LINE:COL: key.path: message` (1-based line and column). `line == 0` means
/// "no position" (an I/O error, or a config built in code): then it is `FILE: key.path: message`.
/// An empty `path` is left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file label, as the user named the file.
    pub file: String,
    /// 1-based; 0 when there is no position.
    pub line: usize,
    /// 1-based, in characters; 0 when there is no position.
    pub col: usize,
    /// Dotted key path with 0-based array indices: `route[2].provider`,
    /// `provider[0].region[1].base_url`, `detection.buckets[1]`. Empty when unknown.
    pub path: String,
    /// Never contains a secret value: only the names of the variables holding them.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.col)?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every error found in a config; a config with any of them is never used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", lines(.0))]
pub struct ConfigErrors(pub Vec<Diagnostic>);

fn lines(diags: &[Diagnostic]) -> String {
    diags
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diag(line: usize, path: &str) -> Diagnostic {
        Diagnostic {
            file: "p.toml".into(),
            line,
            col: 3,
            path: path.into(),
            message: "bad".into(),
        }
    }

    #[test]
    fn display_forms() {
        assert_eq!(
            diag(2, "probe.interval").to_string(),
            "p.toml:2:3: probe.interval: bad"
        );
        assert_eq!(diag(2, "").to_string(), "p.toml:2:3: bad");
        assert_eq!(diag(0, "route[0]").to_string(), "p.toml: route[0]: bad");
        assert_eq!(
            ConfigErrors(vec![diag(1, "a"), diag(2, "b")]).to_string(),
            "p.toml:1:3: a: bad\np.toml:2:3: b: bad"
        );
    }
}
