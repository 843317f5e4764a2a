//! The fleet several benches measure the pages and the API on: 20 providers of 5 regions,
//! `routes` routes in logical models of 10 (3 primaries, 4 backups, 3 fallbacks), every
//! upstream a closed port (nothing here probes).

use probeok::config::Config;

/// The fleet's config, its store at `db`, route `i` weighted `weight(i)`.
pub fn config(db: &std::path::Path, routes: usize, weight: impl Fn(usize) -> usize) -> Config {
    let mut src = format!("[storage]\npath = \"{}\"\n", db.display());
    for p in 0..20 {
        src += &format!("[[provider]]\nid = \"p{p}\"\nkind = \"openai\"\n");
        for r in 0..5 {
            src += &format!(
                "  [[provider.region]]\n  id = \"r{r}\"\n  base_url = \"http://127.0.0.1:9/v1\"\n"
            );
        }
    }
    for i in 0..routes {
        let tier = match i % 10 {
            0..=2 => "primary",
            3..=6 => "backup",
            _ => "fallback",
        };
        src += &format!(
            "[[route]]\nprovider = \"p{}\"\nregion = \"r{}\"\nmodel = \"org/model-{i}\"\nserves = \"m{}\"\ntier = \"{tier}\"\nweight = {}\n",
            i % 20,
            (i / 20) % 5,
            i / 10,
            weight(i),
        );
    }
    Config::parse(&src, "bench.toml")
        .expect("bench config")
        .config
}
