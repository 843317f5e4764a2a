//! The readable report of `probeok regress`: per route, per set, passed and failed cases with
//! the failing validator and a bounded excerpt of the answer.

use super::validate::excerpt;
use super::SetRun;

/// Excerpts in the report are this many characters at most.
pub const EXCERPT_CHARS: usize = 120;

/// The text report of `runs` (grouped by route in the order given).
pub fn text(runs: &[SetRun]) -> String {
    let mut out = String::new();
    let mut current: Option<&str> = None;
    for run in runs {
        if current != Some(run.route.as_str()) {
            if current.is_some() {
                out.push('\n');
            }
            out.push_str(&format!("route {}\n", run.route));
            current = Some(run.route.as_str());
        }
        let model = run.model().unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "  set {}: {}/{} passed{} (model {model})\n",
            run.set,
            run.passed(),
            run.cases.len(),
            match run.errors() {
                0 => String::new(),
                n => format!(", {n} call(s) failed"),
            }
        ));
        for c in &run.cases {
            match c.passed {
                Some(true) => {
                    out.push_str(&format!("    ok    {} ({:.0} ms)\n", c.case, c.latency_ms))
                }
                Some(false) => {
                    out.push_str(&format!("    FAIL  {}\n", c.case));
                    for f in &c.failures {
                        out.push_str(&format!("          {}: {}\n", f.validator, f.message));
                    }
                    out.push_str(&format!(
                        "          answer: {:?}\n",
                        excerpt(&c.output, EXCERPT_CHARS)
                    ));
                }
                None => out.push_str(&format!(
                    "    ERROR {}: {}\n",
                    c.case,
                    excerpt(c.error.as_deref().unwrap_or("call failed"), EXCERPT_CHARS)
                )),
            }
        }
    }
    out
}

/// One JSON object per run (`--json`): the [`SetRun`] itself.
pub fn json_lines(runs: &[SetRun]) -> String {
    runs.iter()
        .filter_map(|r| serde_json::to_string(r).ok())
        .map(|l| l + "\n")
        .collect()
}
