//! Embeddings routes in the config: `kind = "embeddings"` needs `dimensions`, an
//! OpenAI-compatible provider, and a logical model whose routes are all embeddings of one
//! upstream model and one vector length — each refusal located and naming both routes, by
//! `Config::parse` and by `probeok check-config`.

use probeok::config::Config;
use probeok::route::{RouteId, RouteKind};

/// Lines 1–10: an OpenAI-compatible provider with two regions and an Anthropic one.
const PROVIDERS: &str = r#"[[provider]]
id = "acme"
  [[provider.region]]
  id = "r0"
  base_url = "https://api.acme.test/v1"
  [[provider.region]]
  id = "r1"
  base_url = "https://eu.acme.test/v1"
[[provider]]
id = "claude"
kind = "anthropic"
  [[provider.region]]
  id = "us"
  base_url = "https://api.anthropic.com"
"#;

/// An embeddings route (`extra` lines inside it).
fn route(region: &str, model: &str, extra: &str) -> String {
    format!(
        "[[route]]\nprovider = \"acme\"\nregion = \"{region}\"\nmodel = \"{model}\"\nserves = \"embed-v3\"\n{extra}"
    )
}

fn errors(src: &str) -> Vec<String> {
    match Config::parse(src, "e.toml") {
        Ok(_) => vec!["(loaded)".to_owned()],
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

const EMB: &str = "kind = \"embeddings\"\ndimensions = 1024\n";

#[test]
fn an_embeddings_route_loads_with_its_kind_and_dimensions() {
    let src = format!(
        "{PROVIDERS}{}{}",
        route("r0", "text-embedding-v3", EMB),
        route("r1", "text-embedding-v3", EMB)
    );
    let c = Config::parse(&src, "e.toml").unwrap().config;
    assert_eq!(c.routes[0].kind, RouteKind::Embeddings);
    assert_eq!(c.routes[0].dimensions, Some(1024));
    let routes = c.routes();
    assert_eq!(routes[0].embedding, Some(1024));
    assert_eq!(
        c.embedding_routes()
            .get(&RouteId::new("acme", "r1", "text-embedding-v3")),
        Some(&1024)
    );
    assert!(c.embedding_models().contains("embed-v3"));
}

#[test]
fn missing_dimensions_is_a_located_error() {
    let src = format!(
        "{PROVIDERS}{}",
        route("r0", "text-embedding-v3", "kind = \"embeddings\"\n")
    );
    assert_eq!(
        errors(&src),
        vec!["e.toml:20:8: route[0].kind: an embeddings route needs `dimensions`, the vector length its model answers (e.g. dimensions = 1024)"]
    );
}

#[test]
fn embeddings_on_an_anthropic_provider_is_refused() {
    let src = format!(
        "{PROVIDERS}[[route]]\nprovider = \"claude\"\nregion = \"us\"\nmodel = \"voyage-3\"\nserves = \"embed-v3\"\n{EMB}"
    );
    assert_eq!(
        errors(&src),
        vec!["e.toml:20:8: route[0].kind: provider \"claude\" is of kind \"anthropic\", which has no embeddings API: use an OpenAI-compatible provider"]
    );
}

#[test]
fn a_logical_model_mixing_models_dimensions_or_kinds_is_refused_naming_both_routes() {
    let mixed_models = format!(
        "{PROVIDERS}{}{}",
        route("r0", "text-embedding-v3", EMB),
        route("r1", "text-embedding-v4", EMB)
    );
    assert_eq!(
        errors(&mixed_models),
        vec!["e.toml:25:9: route[1].model: logical model \"embed-v3\" mixes embedding models: route[0] (acme/r0/text-embedding-v3) answers \"text-embedding-v3\", this route (acme/r1/text-embedding-v4) answers \"text-embedding-v4\"; vectors of different models are not comparable, so failover among them is refused"]
    );
    let mixed_dimensions = format!(
        "{PROVIDERS}{}{}",
        route("r0", "text-embedding-v3", EMB),
        route(
            "r1",
            "text-embedding-v3",
            "kind = \"embeddings\"\ndimensions = 512\n"
        )
    );
    assert_eq!(
        errors(&mixed_dimensions),
        vec!["e.toml:28:14: route[1].dimensions: logical model \"embed-v3\" mixes dimensions: route[0] (acme/r0/text-embedding-v3) answers 1024, this route (acme/r1/text-embedding-v3) answers 512"]
    );
    let mixed_kinds = format!(
        "{PROVIDERS}{}{}",
        route("r0", "text-embedding-v3", EMB),
        route("r1", "gpt-4o", "")
    );
    let e = errors(&mixed_kinds);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("e.toml:") && e[0].contains("route[1].kind: logical model \"embed-v3\" mixes embeddings and chat routes: route[0] (acme/r0/text-embedding-v3) is embeddings, this route (acme/r1/gpt-4o) is chat"),
        "{e:?}"
    );
    // `dimensions` belongs to embeddings routes only.
    let stray = format!("{PROVIDERS}{}", route("r0", "gpt-4o", "dimensions = 8\n"));
    assert_eq!(
        errors(&stray),
        vec!["e.toml:20:14: route[0].dimensions: only an embeddings route has dimensions: add kind = \"embeddings\" or remove it"]
    );
}

#[test]
fn check_config_refuses_a_mixed_logical_model_with_a_located_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.toml");
    let src = format!(
        "{PROVIDERS}{}{}",
        route("r0", "text-embedding-v3", EMB),
        route("r1", "text-embedding-v4", EMB)
    );
    std::fs::write(&path, src).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_probeok"))
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("route[1].model"))
        .unwrap_or_else(|| panic!("no located error in {stderr}"));
    assert!(
        line.starts_with(&format!("{}:25:9:", path.display())),
        "{line}"
    );
    assert!(
        line.contains("acme/r0/text-embedding-v3") && line.contains("acme/r1/text-embedding-v4"),
        "{line}"
    );
}
