//! ARCHITECTURE.md's dependency diagram against the manifests: every edge drawn is a real
//! dependency between the workspace's crates, and every real one is drawn (a test, so CI holds
//! it).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// A dependency: (the crate that depends, the crate it depends on).
pub type Edge = (String, String);

/// The edges of the first ```` ```mermaid ```` block of `markdown`, written `a --> b`, or
/// `a -.-> b` for an optional dependency (one per line; other lines ignored).
pub fn diagram_edges(markdown: &str) -> Result<BTreeSet<Edge>> {
    let start = markdown
        .find("```mermaid")
        .context("no ```mermaid block in the text")?;
    let block = &markdown[start..];
    let block = &block[block.find('\n').context("an empty mermaid block")?..];
    let end = block.find("```").context("an unterminated mermaid block")?;
    let mut edges = BTreeSet::new();
    for line in block[..end].lines() {
        let line = line.trim();
        if let Some((from, to)) = line.split_once("-->").or_else(|| line.split_once("-.->")) {
            let (from, to) = (from.trim(), to.trim());
            if from.is_empty() || to.is_empty() {
                bail!("a malformed edge: {line}");
            }
            edges.insert((from.to_string(), to.to_string()));
        }
    }
    Ok(edges)
}

/// The normal (non-dev, non-build) dependencies between the workspace's library and binary
/// crates under `crates/`, from `cargo metadata`; optional ones included.
pub fn manifest_edges(root: &Path) -> Result<BTreeSet<Edge>> {
    crates_edges(root, None)
}

/// The crate that holds the cross-layer tests: it may dev-depend on any crate.
pub const INTEGRATION_CRATE: &str = "tandem-integration";
/// The test kit: any crate may dev-depend on it, and it depends on no workspace crate.
pub const TESTKIT_CRATE: &str = "tandem-testkit";

/// The dev-dependencies under `crates/` that point upward: on a workspace crate that reaches
/// the crate through normal dependencies (a crate above it; one below or beside it is
/// allowed); the integration crate's are allowed.
pub fn upward_dev_edges(root: &Path) -> Result<BTreeSet<Edge>> {
    let normal = manifest_edges(root)?;
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::from([from]);
        let mut todo = vec![from];
        while let Some(at) = todo.pop() {
            for (_, next) in normal.iter().filter(|(a, _)| a == at) {
                if seen.insert(next.as_str()) {
                    todo.push(next);
                }
            }
        }
        seen.contains(to)
    };
    Ok(crates_edges(root, Some("dev"))?
        .into_iter()
        .filter(|(from, to)| from != INTEGRATION_CRATE && to != TESTKIT_CRATE && reaches(to, from))
        .collect())
}

/// The dependencies of `kind` (`None`: normal; `Some("dev")`, `Some("build")`) between the
/// workspace's crates under `crates/`, from `cargo metadata`.
fn crates_edges(root: &Path, kind: Option<&str>) -> Result<BTreeSet<Edge>> {
    let metadata = crate::cargo_metadata(root, "--no-deps")?;
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata lists no packages")?;
    let crates_dir = root.join("crates");
    let in_crates = |package: &serde_json::Value| {
        package["manifest_path"]
            .as_str()
            .is_some_and(|path| Path::new(path).starts_with(&crates_dir))
    };
    let names: BTreeSet<&str> = packages
        .iter()
        .filter(|p| in_crates(p))
        .filter_map(|p| p["name"].as_str())
        .collect();
    let mut edges = BTreeSet::new();
    for package in packages.iter().filter(|p| in_crates(p)) {
        let from = package["name"]
            .as_str()
            .context("a package without a name")?;
        for dependency in package["dependencies"].as_array().into_iter().flatten() {
            let to = dependency["name"].as_str().unwrap_or_default();
            if dependency["kind"].as_str() == kind && names.contains(to) {
                edges.insert((from.to_string(), to.to_string()));
            }
        }
    }
    Ok(edges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mermaid_edges_only() {
        let text =
            "x --> y\n```mermaid\ngraph TD\n  %% a comment\n  a --> b\n  b-.->c\n```\nc --> d\n";
        let edges: Vec<_> = diagram_edges(text).unwrap().into_iter().collect();
        assert_eq!(edges, [("a".into(), "b".into()), ("b".into(), "c".into())]);
        assert!(diagram_edges("no diagram").is_err());
        assert!(diagram_edges("```mermaid\n --> b\n```").is_err());
    }

    #[test]
    fn architecture_diagram_matches_the_manifests() {
        let root = crate::workspace_root().unwrap();
        let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
        let drawn = diagram_edges(&text).unwrap();
        let real = manifest_edges(&root).unwrap();
        let missing: Vec<_> = real.difference(&drawn).collect();
        let extra: Vec<_> = drawn.difference(&real).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "ARCHITECTURE.md's diagram: dependencies not drawn {missing:?}; edges drawn that no \
             Cargo.toml has {extra:?}"
        );
    }

    #[test]
    fn crates_never_dev_depend_upward() {
        let root = crate::workspace_root().unwrap();
        let upward = upward_dev_edges(&root).unwrap();
        assert!(
            upward.is_empty(),
            "dev-dependencies on crates above their own {upward:?}: move the tests that need \
             them to {INTEGRATION_CRATE}"
        );
        let testkit: Vec<_> = manifest_edges(&root)
            .unwrap()
            .into_iter()
            .filter(|(from, _)| from == TESTKIT_CRATE)
            .collect();
        assert!(testkit.is_empty(), "{TESTKIT_CRATE} depends on {testkit:?}");
    }
}
