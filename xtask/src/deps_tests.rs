use super::*;
use pretty_assertions::assert_eq;
use serde_json::json;

/// Edge kinds as cargo metadata spells them.
#[derive(Clone, Copy)]
enum Kind {
    Normal,
    Dev,
    Build,
}

fn id(name: &str) -> String {
    format!("{name} 0.1.0")
}

/// Builds `cargo metadata` JSON: `workspace` members, other `packages`, and edges.
fn metadata(workspace: &[&str], packages: &[&str], edges: &[(&str, &str, Kind)]) -> Value {
    let all: Vec<&str> = workspace.iter().chain(packages).copied().collect();
    let packages: Vec<Value> = all
        .iter()
        .map(|name| {
            let features = if *name == "hame" {
                json!({"default": ["redis"], "redis": ["dep:redis", "hame-state/redis"],
                       "postgres": [], "docker": [], "single": ["redis"],
                       "full": ["redis", "postgres", "docker"]})
            } else {
                json!({})
            };
            let manifest = if name.starts_with("hame") {
                format!("/repo/crates/{name}/Cargo.toml")
            } else if *name == "xtask" || name.starts_with("example") {
                format!("/repo/{name}/Cargo.toml")
            } else {
                format!("/registry/{name}-0.1.0/Cargo.toml")
            };
            json!({"id": id(name), "name": name, "features": features,
                   "manifest_path": manifest})
        })
        .collect();
    let nodes: Vec<Value> = all
        .iter()
        .map(|name| {
            let deps: Vec<Value> = edges
                .iter()
                .filter(|(from, _, _)| from == name)
                .map(|(_, to, kind)| {
                    let kind = match kind {
                        Kind::Normal => Value::Null,
                        Kind::Dev => json!("dev"),
                        Kind::Build => json!("build"),
                    };
                    json!({"name": to.replace('-', "_"), "pkg": id(to),
                           "dep_kinds": [{"kind": kind, "target": null}]})
                })
                .collect();
            json!({"id": id(name), "deps": deps, "features": []})
        })
        .collect();
    json!({
        "packages": packages,
        "workspace_members": workspace.iter().map(|n| id(n)).collect::<Vec<_>>(),
        "resolve": {"nodes": nodes, "root": null},
    })
}

const WORKSPACE: [&str; 7] = [
    "hame-core",
    "hame-model",
    "hame-state",
    "hame-harness",
    "hame",
    "hame-cli",
    "hame-test-support",
];

fn healthy_edges() -> Vec<(&'static str, &'static str, Kind)> {
    vec![
        ("hame-core", "serde", Kind::Normal),
        ("hame-core", "tokio", Kind::Normal),
        ("hame-model", "hame-core", Kind::Normal),
        ("hame-model", "reqwest", Kind::Normal),
        ("hame-model", "hame-test-support", Kind::Dev),
        ("hame-state", "hame-core", Kind::Normal),
        ("hame-state", "rusqlite", Kind::Normal),
        ("rusqlite", "libsqlite3-sys", Kind::Normal),
        ("hame-state", "sqlx", Kind::Normal),
        ("hame-harness", "hame-model", Kind::Normal),
        ("hame-harness", "hame-state", Kind::Normal),
        ("hame", "hame-harness", Kind::Normal),
        ("hame-cli", "hame", Kind::Normal),
        ("hame-test-support", "hame-harness", Kind::Normal),
        ("hame-core", "redis", Kind::Dev),
    ]
}

const EXTERNAL: [&str; 7] = [
    "serde",
    "tokio",
    "reqwest",
    "rusqlite",
    "libsqlite3-sys",
    "sqlx",
    "redis",
];

fn graph(edges: &[(&str, &str, Kind)], extra: &[&str]) -> Result<Graph> {
    let packages: Vec<&str> = EXTERNAL.iter().chain(extra).copied().collect();
    Graph::from_metadata(&metadata(&WORKSPACE, &packages, edges))
}

#[test]
fn a_healthy_graph_has_no_violations() -> Result<()> {
    let graph = graph(&healthy_edges(), &[])?;
    assert_eq!(graph.violations(), Vec::<String>::new());
    assert_eq!(
        graph.summary(),
        "14 packages built, 7 workspace members, 1 libsqlite3-sys"
    );
    Ok(())
}

#[test]
fn core_reaching_a_backend_transitively_is_reported_with_its_path() -> Result<()> {
    let mut edges = healthy_edges();
    edges.push(("tokio", "hyper", Kind::Normal));
    edges.push(("hyper", "reqwest", Kind::Build));
    let graph = graph(&edges, &["hyper"])?;
    assert_eq!(
        graph.violations(),
        vec!["hame-core must not depend on reqwest: hame-core -> tokio -> hyper -> reqwest"]
    );
    Ok(())
}

#[test]
fn dev_edges_do_not_count_for_core() -> Result<()> {
    // `hame-core -> redis` is a dev edge in the healthy graph.
    let graph = graph(&healthy_edges(), &[])?;
    assert!(graph.violations().iter().all(|v| !v.contains("redis")));
    Ok(())
}

#[test]
fn upward_edges_are_reported() -> Result<()> {
    let mut edges = healthy_edges();
    edges.push(("hame-model", "hame-harness", Kind::Normal));
    edges.push(("hame-core", "hame-state", Kind::Build));
    let graph = graph(&edges, &[])?;
    let mut got = graph.violations();
    got.sort();
    assert_eq!(
        got,
        vec![
            "hame-core (Core) must not depend on hame-state (Leaf): edges point down the \
             layering core <- leaf crates <- harness <- hame <- hame-gateway <- hame-cli",
            "hame-core must not depend on rusqlite: hame-core -> hame-state -> rusqlite",
            "hame-core must not depend on sqlx: hame-core -> hame-state -> sqlx",
            "hame-model (Leaf) must not depend on hame-harness (Harness): edges point down \
             the layering core <- leaf crates <- harness <- hame <- hame-gateway <- hame-cli",
        ]
    );
    Ok(())
}

#[test]
fn leaf_to_leaf_and_upward_dev_edges_are_allowed() -> Result<()> {
    let mut edges = healthy_edges();
    edges.push(("hame-state", "hame-model", Kind::Normal));
    edges.push(("hame-model", "hame", Kind::Dev));
    assert_eq!(graph(&edges, &[])?.violations(), Vec::<String>::new());
    Ok(())
}

#[test]
fn libraries_must_not_depend_on_test_support() -> Result<()> {
    let mut edges = healthy_edges();
    edges.push(("hame-harness", "hame-test-support", Kind::Normal));
    assert_eq!(
        graph(&edges, &[])?.violations(),
        vec![
            "hame-harness must not depend on helper crate hame-test-support \
             (use [dev-dependencies])"
        ]
    );
    Ok(())
}

#[test]
fn a_second_sqlite_is_reported() -> Result<()> {
    let mut edges = healthy_edges();
    edges.push(("sqlx", "sqlx-sqlite", Kind::Normal));
    edges.push(("sqlx-sqlite", "libsqlite3-sys 0.30", Kind::Normal));
    let meta = {
        let mut packages: Vec<&str> = EXTERNAL.to_vec();
        packages.extend(["sqlx-sqlite", "libsqlite3-sys 0.30"]);
        let mut meta = metadata(&WORKSPACE, &packages, &edges);
        // Give the second copy its real crate name.
        if let Some(pkgs) = meta["packages"].as_array_mut() {
            for pkg in pkgs {
                if pkg["name"] == "libsqlite3-sys 0.30" {
                    pkg["name"] = json!("libsqlite3-sys");
                }
            }
        }
        meta
    };
    let graph = Graph::from_metadata(&meta)?;
    assert_eq!(
        graph.violations(),
        vec![
            "2 copies of libsqlite3-sys in the graph; only rusqlite may link SQLite (do not \
             enable sqlx's `sqlite` feature)",
            "sqlx-sqlite is in the graph; SQLite goes through rusqlite only",
        ]
    );
    Ok(())
}

#[test]
fn no_sqlite_at_all_is_fine_while_nothing_uses_rusqlite() -> Result<()> {
    let meta = metadata(
        &["hame-core"],
        &["serde"],
        &[("hame-core", "serde", Kind::Normal)],
    );
    assert_eq!(
        Graph::from_metadata(&meta)?.violations(),
        Vec::<String>::new()
    );
    Ok(())
}

#[test]
fn facade_features_exclude_default_and_aggregates() -> Result<()> {
    let graph = graph(&healthy_edges(), &[])?;
    assert_eq!(
        graph.feature_plan("hame"),
        Some(FeaturePlan {
            check: vec![
                "docker".to_owned(),
                "postgres".to_owned(),
                "redis".to_owned(),
                "single".to_owned(),
            ],
            aggregates: vec!["full".to_owned()],
        })
    );
    assert_eq!(graph.feature_plan("serde"), None);
    Ok(())
}

#[test]
fn metadata_without_resolve_is_an_error() {
    let meta = json!({"packages": [], "workspace_members": [], "resolve": null});
    assert!(Graph::from_metadata(&meta).is_err());
}

#[test]
fn layers_of_known_and_unknown_crates() {
    assert_eq!(layer_of("hame-core"), Some(Layer::Core));
    assert_eq!(layer_of("hame-sandbox"), Some(Layer::Leaf));
    assert_eq!(layer_of("hame-harness"), Some(Layer::Harness));
    assert_eq!(layer_of("hame"), Some(Layer::Facade));
    assert_eq!(layer_of("hame-gateway"), Some(Layer::Server));
    assert_eq!(layer_of("hame-cli"), Some(Layer::Cli));
    assert_eq!(layer_of("hame-test-support"), None);
    assert_eq!(layer_of("xtask"), None);
}

/// `sqlx` declares `sqlx-sqlite` as optional and names it only through a weak feature
/// (`chrono = ["sqlx-sqlite?/chrono"]`); cargo metadata still lists the edge.
fn weak_dependency_metadata(sqlx_features: &[&str]) -> Value {
    json!({
        "packages": [
            {"id": "hame-state 0.1.0", "name": "hame-state", "features": {},
             "dependencies": [{"name": "sqlx", "rename": null, "optional": false, "kind": null},
                              {"name": "rusqlite", "rename": "sqlite", "optional": true, "kind": null}]},
            {"id": "sqlx 0.9.0", "name": "sqlx", "dependencies": [
                {"name": "sqlx-sqlite", "rename": null, "optional": true, "kind": null}],
             "features": {"chrono": ["sqlx-sqlite?/chrono"], "sqlite": ["dep:sqlx-sqlite"]}},
            {"id": "sqlx-sqlite 0.9.0", "name": "sqlx-sqlite", "features": {}, "dependencies": [
                {"name": "libsqlite3-sys", "rename": null, "optional": false, "kind": null}]},
            {"id": "rusqlite 0.39.0", "name": "rusqlite", "features": {}, "dependencies": []},
            {"id": "libsqlite3-sys 0.37.0", "name": "libsqlite3-sys", "features": {},
             "dependencies": []},
        ],
        "workspace_members": ["hame-state 0.1.0"],
        "resolve": {"root": null, "nodes": [
            {"id": "hame-state 0.1.0", "features": [], "deps": [
                {"pkg": "sqlx 0.9.0", "dep_kinds": [{"kind": null}]},
                {"pkg": "rusqlite 0.39.0", "dep_kinds": [{"kind": null}]}]},
            {"id": "sqlx 0.9.0", "features": sqlx_features, "deps": [
                {"pkg": "sqlx-sqlite 0.9.0", "dep_kinds": [{"kind": null}]}]},
            {"id": "sqlx-sqlite 0.9.0", "features": [], "deps": [
                {"pkg": "libsqlite3-sys 0.37.0", "dep_kinds": [{"kind": null}]}]},
            {"id": "rusqlite 0.39.0", "features": [], "deps": []},
            {"id": "libsqlite3-sys 0.37.0", "features": [], "deps": []},
        ]},
    })
}

#[test]
fn weak_feature_edges_are_not_built() -> Result<()> {
    let graph = Graph::from_metadata(&weak_dependency_metadata(&["chrono"]))?;
    assert_eq!(graph.violations(), Vec::<String>::new());
    assert_eq!(
        graph.summary(),
        "2 packages built, 1 workspace members, 0 libsqlite3-sys"
    );
    Ok(())
}

#[test]
fn strong_feature_edges_are_built() -> Result<()> {
    let graph = Graph::from_metadata(&weak_dependency_metadata(&["chrono", "sqlite"]))?;
    assert_eq!(
        graph.violations(),
        vec!["sqlx-sqlite is in the graph; SQLite goes through rusqlite only"]
    );
    assert_eq!(
        graph.summary(),
        "4 packages built, 1 workspace members, 1 libsqlite3-sys"
    );
    Ok(())
}

#[test]
fn members_outside_crates_are_helpers() -> Result<()> {
    // `integration-tests/` holds a `hame-*` package, but it is not a library layer.
    let mut meta = metadata(
        &["hame-core", "hame-integration-tests", "example-quickstart"],
        &[],
        &[
            ("hame-integration-tests", "example-quickstart", Kind::Normal),
            ("example-quickstart", "hame-core", Kind::Normal),
            ("hame-core", "example-quickstart", Kind::Normal),
        ],
    );
    if let Some(pkgs) = meta["packages"].as_array_mut() {
        for pkg in pkgs {
            if pkg["name"] == "hame-integration-tests" {
                pkg["manifest_path"] = json!("/repo/integration-tests/Cargo.toml");
            }
        }
    }
    assert_eq!(
        Graph::from_metadata(&meta)?.violations(),
        vec![
            "hame-core must not depend on helper crate example-quickstart (use [dev-dependencies])"
        ]
    );
    Ok(())
}

/// A workspace with the storage crates and the bridge `hame-tools`.
fn storage_metadata(extra_edges: &[(&'static str, &'static str, Kind)]) -> Value {
    let mut edges = healthy_edges();
    edges.extend([
        ("hame-id", "serde", Kind::Normal),
        ("hame-fs", "hame-id", Kind::Normal),
        ("hame-fs", "tokio", Kind::Normal),
        ("hame-fs-remote", "hame-fs", Kind::Normal),
        ("hame-fs-remote", "redis", Kind::Normal),
        ("hame-tools", "hame-core", Kind::Normal),
        ("hame-tools", "hame-fs", Kind::Normal),
        ("hame-harness", "hame-tools", Kind::Normal),
    ]);
    edges.extend_from_slice(extra_edges);
    let mut workspace = WORKSPACE.to_vec();
    workspace.extend(["hame-id", "hame-fs", "hame-fs-remote", "hame-tools"]);
    metadata(&workspace, &EXTERNAL, &edges)
}

#[test]
fn storage_crates_that_stand_alone_pass() -> Result<()> {
    let graph = Graph::from_metadata(&storage_metadata(&[]))?;
    assert_eq!(graph.violations(), Vec::<String>::new());
    Ok(())
}

#[test]
fn storage_reaching_core_is_reported_with_its_path() -> Result<()> {
    // Directly (hame-fs-remote) and through another leaf crate (hame-fs -> hame-id).
    let graph = Graph::from_metadata(&storage_metadata(&[
        ("hame-fs-remote", "hame-core", Kind::Build),
        ("hame-id", "hame-core", Kind::Normal),
    ]))?;
    let mut got = graph.violations();
    got.sort();
    assert_eq!(
        got,
        vec![
            "hame-fs must not depend on hame-core (storage stands alone; agent glue goes in \
             hame-tools): hame-fs -> hame-id -> hame-core",
            "hame-fs-remote must not depend on hame-core (storage stands alone; agent glue goes \
             in hame-tools): hame-fs-remote -> hame-core",
        ]
    );
    Ok(())
}

#[test]
fn storage_may_use_core_in_its_tests() -> Result<()> {
    let graph = Graph::from_metadata(&storage_metadata(&[
        ("hame-fs", "hame-core", Kind::Dev),
        ("hame-fs-remote", "hame-tools", Kind::Dev),
    ]))?;
    assert_eq!(graph.violations(), Vec::<String>::new());
    Ok(())
}
