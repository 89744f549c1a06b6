//! Dependency-direction checks over `cargo metadata --format-version 1` JSON.
//!
//! Rules (see `docs/testing.md`):
//! 1. `hame-core` reaches none of [`FORBIDDEN_IN_CORE`] through normal or build edges.
//! 2. Workspace edges point down the layering: core ← leaf crates ← harness ← hame ← hame-cli.
//! 3. Library crates never depend (normal/build) on helper crates such as `hame-test-support`.
//! 4. Exactly one `libsqlite3-sys` in the graph (rusqlite's), never sqlx's second copy.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use anyhow::{Context, Result};
use serde_json::Value;

/// Crates `hame-core` must never reach, directly or transitively.
pub const FORBIDDEN_IN_CORE: [&str; 7] = [
    "reqwest",
    "sqlx",
    "rusqlite",
    "redis",
    "bollard",
    "object_store",
    "axum",
];

/// The crate at the bottom of the layering.
pub const CORE: &str = "hame-core";
/// The facade whose features are checked one by one.
pub const FACADE: &str = "hame";

/// Where a workspace crate sits in the layering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Layer {
    /// `hame-core`.
    Core = 0,
    /// Capability crates: model, fs, state, memory, sandbox, skills, subagent, ...
    Leaf = 1,
    /// `hame-harness`.
    Harness = 2,
    /// `hame`, the facade.
    Facade = 3,
    /// `hame-cli`.
    Cli = 4,
}

/// The layer of a workspace crate, or `None` for helpers (test support, xtask, examples),
/// which may depend on anything but which no library may depend on.
pub fn layer_of(name: &str) -> Option<Layer> {
    match name {
        "hame-core" => Some(Layer::Core),
        "hame-harness" => Some(Layer::Harness),
        "hame" => Some(Layer::Facade),
        "hame-cli" => Some(Layer::Cli),
        "hame-test-support" => None,
        other if other.starts_with("hame-") => Some(Layer::Leaf),
        _ => None,
    }
}

/// The resolved package graph, reduced to what the checks need.
#[derive(Debug, Default)]
pub struct Graph {
    names: HashMap<String, String>,
    workspace: BTreeSet<String>,
    /// package id -> (dependency id, edge is normal or build)
    edges: HashMap<String, Vec<(String, bool)>>,
    features: HashMap<String, Vec<String>>,
}

impl Graph {
    /// Reads `cargo metadata --format-version 1` output (with a `resolve` section).
    pub fn from_metadata(meta: &Value) -> Result<Self> {
        let mut graph = Self::default();
        for pkg in array(meta, "packages")? {
            let id = string(pkg, "id")?;
            graph.names.insert(id.clone(), string(pkg, "name")?);
            if let Some(features) = pkg.get("features").and_then(Value::as_object) {
                graph
                    .features
                    .insert(id, features.keys().cloned().collect());
            }
        }
        for id in array(meta, "workspace_members")? {
            let id = id
                .as_str()
                .context("workspace_members holds a non-string")?;
            graph.workspace.insert(id.to_owned());
        }
        let resolve = meta
            .get("resolve")
            .filter(|r| !r.is_null())
            .context("cargo metadata output has no `resolve` (was --no-deps used?)")?;
        for node in array(resolve, "nodes")? {
            let id = string(node, "id")?;
            let mut deps = Vec::new();
            for dep in array(node, "deps")? {
                let pkg = string(dep, "pkg")?;
                let kinds = dep.get("dep_kinds").and_then(Value::as_array);
                // Old cargo versions lack dep_kinds: treat the edge as normal (strict).
                let non_dev = kinds.is_none_or(|kinds| {
                    kinds
                        .iter()
                        .any(|k| k.get("kind").and_then(Value::as_str) != Some("dev"))
                });
                deps.push((pkg, non_dev));
            }
            graph.edges.insert(id, deps);
        }
        Ok(graph)
    }

    fn name<'a>(&'a self, id: &'a str) -> &'a str {
        self.names.get(id).map_or(id, String::as_str)
    }

    fn workspace_id(&self, name: &str) -> Option<&String> {
        self.workspace.iter().find(|id| self.name(id) == name)
    }

    /// The features of a workspace crate, `default` excluded, sorted; `None` if the crate
    /// is not in the workspace.
    pub fn workspace_features(&self, name: &str) -> Option<Vec<String>> {
        let id = self.workspace_id(name)?;
        let mut features: Vec<String> = self
            .features
            .get(id)
            .into_iter()
            .flatten()
            .filter(|f| *f != "default")
            .cloned()
            .collect();
        features.sort();
        Some(features)
    }

    /// Every rule violation, as sentences; empty means the graph is fine.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.check_core(&mut out);
        self.check_layers(&mut out);
        self.check_sqlite(&mut out);
        out
    }

    fn check_core(&self, out: &mut Vec<String>) {
        let Some(core) = self.workspace_id(CORE) else {
            return;
        };
        // Breadth-first over normal/build edges, remembering how each package was reached.
        let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([core.as_str()]);
        let mut seen = BTreeSet::from([core.as_str()]);
        while let Some(id) = queue.pop_front() {
            for (dep, non_dev) in self.edges.get(id).into_iter().flatten() {
                if *non_dev && seen.insert(dep.as_str()) {
                    parent.insert(dep.as_str(), id);
                    queue.push_back(dep.as_str());
                }
            }
        }
        for id in &seen {
            let name = self.name(id);
            if FORBIDDEN_IN_CORE.contains(&name) {
                let mut path = vec![name];
                let mut cursor = *id;
                while let Some(up) = parent.get(cursor) {
                    path.push(self.name(up));
                    cursor = up;
                }
                path.reverse();
                out.push(format!(
                    "{CORE} must not depend on {name}: {}",
                    path.join(" -> ")
                ));
            }
        }
    }

    fn check_layers(&self, out: &mut Vec<String>) {
        for from in &self.workspace {
            let from_name = self.name(from);
            let Some(from_layer) = layer_of(from_name) else {
                continue;
            };
            for (to, non_dev) in self.edges.get(from).into_iter().flatten() {
                if !*non_dev || !self.workspace.contains(to) {
                    continue;
                }
                let to_name = self.name(to);
                match layer_of(to_name) {
                    None => out.push(format!(
                        "{from_name} must not depend on helper crate {to_name} \
                         (use [dev-dependencies])"
                    )),
                    Some(to_layer) if to_layer > from_layer => out.push(format!(
                        "{from_name} ({from_layer:?}) must not depend on {to_name} \
                         ({to_layer:?}): edges point down the layering \
                         core <- leaf crates <- harness <- hame <- hame-cli"
                    )),
                    Some(_) => {}
                }
            }
        }
    }

    fn check_sqlite(&self, out: &mut Vec<String>) {
        let count = |name: &str| self.names.values().filter(|n| *n == name).count();
        let sqlite = count("libsqlite3-sys");
        if sqlite > 1 {
            out.push(format!(
                "{sqlite} copies of libsqlite3-sys in the graph; only rusqlite may link SQLite \
                 (do not enable sqlx's `sqlite` feature)"
            ));
        } else if sqlite == 0 && count("rusqlite") > 0 {
            out.push("rusqlite is in the graph but libsqlite3-sys is not".to_owned());
        }
        if count("sqlx-sqlite") > 0 {
            out.push("sqlx-sqlite is in the graph; SQLite goes through rusqlite only".to_owned());
        }
    }

    /// A one-line summary for the CI log.
    pub fn summary(&self) -> String {
        let sqlite = self
            .names
            .values()
            .filter(|n| *n == "libsqlite3-sys")
            .count();
        format!(
            "{} packages, {} workspace members, {} libsqlite3-sys",
            self.names.len(),
            self.workspace.len(),
            sqlite
        )
    }
}

fn array<'a>(value: &'a Value, key: &str) -> Result<&'a Vec<Value>> {
    value
        .get(key)
        .and_then(Value::as_array)
        .with_context(|| format!("cargo metadata: `{key}` is not an array"))
}

fn string(value: &Value, key: &str) -> Result<String> {
    value
        .get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .with_context(|| format!("cargo metadata: `{key}` is not a string"))
}

#[cfg(test)]
#[path = "deps_tests.rs"]
mod tests;
