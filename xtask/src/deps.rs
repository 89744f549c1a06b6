//! Dependency-direction checks over `cargo metadata --format-version 1` JSON.
//!
//! Rules (see `docs/testing.md`):
//! 1. `hame-core` reaches none of [`FORBIDDEN_IN_CORE`] through normal or build edges.
//! 2. Workspace edges point down the layering: core ← leaf crates ← harness ← hame ← hame-gateway ← hame-cli.
//! 3. Library crates never depend (normal/build) on helper crates such as `hame-test-support`.
//! 4. Exactly one `libsqlite3-sys` in the graph (rusqlite's), never sqlx's second copy.
//! 5. The storage crates ([`STANDALONE_STORAGE`]) never reach `hame-core`: storage stands
//!    alone, and the bridge to the agent core is `hame-tools`.

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
/// Storage crates that must not reach [`CORE`] through normal or build edges, directly or
/// transitively: they know files, not agents (`hame-tools` bridges the two).
pub const STANDALONE_STORAGE: [&str; 2] = ["hame-fs", "hame-fs-remote"];
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
    /// Servers built on the facade: `hame-gateway` (HTTP).
    Server = 4,
    /// `hame-cli`.
    Cli = 5,
}

/// The layer of a library crate (one under `crates/`), or `None` for helpers
/// (`hame-test-support`, `hame-bench`, and every member outside `crates/`: xtask, examples, integration
/// tests), which may depend on anything but which no library may depend on.
pub fn layer_of(name: &str) -> Option<Layer> {
    match name {
        "hame-core" => Some(Layer::Core),
        "hame-harness" => Some(Layer::Harness),
        "hame" => Some(Layer::Facade),
        "hame-gateway" => Some(Layer::Server),
        "hame-cli" => Some(Layer::Cli),
        // Helpers: test scaffolding and the peer-benchmark driver (a binary on the facade).
        "hame-test-support" | "hame-bench" => None,
        other if other.starts_with("hame-") => Some(Layer::Leaf),
        _ => None,
    }
}

/// The resolved package graph, reduced to what the checks need.
///
/// `cargo metadata` keeps edges to optional dependencies that are only named by weak
/// features (`dep?/feature`), although cargo never builds them (rust-lang/cargo#10801).
/// Such edges are dropped here by re-deriving which optional dependencies the enabled
/// features really activate.
#[derive(Debug, Default)]
pub struct Graph {
    names: HashMap<String, String>,
    workspace: BTreeSet<String>,
    /// Workspace members outside `crates/` (xtask, examples, integration tests).
    outside_crates: BTreeSet<String>,
    edges: HashMap<String, Vec<Edge>>,
    features: HashMap<String, BTreeMap<String, Vec<String>>>,
}

/// Which features of a crate to check one by one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeaturePlan {
    /// Features checked alone with `--no-default-features --features <f>`, sorted.
    pub check: Vec<String>,
    /// Pure aggregates (every entry is another feature of the crate, like `full`): already
    /// covered by `--all-features` in clippy and tests, so not checked alone.
    pub aggregates: Vec<String>,
}

/// One dependency edge that cargo actually builds.
#[derive(Debug, Clone)]
struct Edge {
    to: String,
    /// A normal or build dependency.
    non_dev: bool,
    /// A dev-dependency (built only for the package's own tests).
    dev: bool,
}

impl Graph {
    /// Reads `cargo metadata --format-version 1` output (with a `resolve` section).
    pub fn from_metadata(meta: &Value) -> Result<Self> {
        let mut graph = Self::default();
        let mut packages = HashMap::new();
        for pkg in array(meta, "packages")? {
            let id = string(pkg, "id")?;
            graph.names.insert(id.clone(), string(pkg, "name")?);
            if let Some(features) = pkg.get("features").and_then(Value::as_object) {
                let table = features
                    .iter()
                    .map(|(name, values)| {
                        let values = values
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect();
                        (name.clone(), values)
                    })
                    .collect();
                graph.features.insert(id.clone(), table);
            }
            let in_crates_dir = pkg
                .get("manifest_path")
                .and_then(Value::as_str)
                .map(std::path::Path::new)
                .and_then(|manifest| manifest.parent()?.parent()?.file_name())
                .is_some_and(|dir| dir == "crates");
            if !in_crates_dir {
                graph.outside_crates.insert(id.clone());
            }
            packages.insert(id, pkg);
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
            let enabled: BTreeSet<&str> = node
                .get("features")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let package = packages.get(&id).copied();
            let activated = package.map(|p| activated_optional(p, &enabled));
            let mut edges = Vec::new();
            for dep in array(node, "deps")? {
                let to = string(dep, "pkg")?;
                let kinds: Vec<Option<&str>> = dep
                    .get("dep_kinds")
                    .and_then(Value::as_array)
                    .map(|kinds| {
                        kinds
                            .iter()
                            .map(|k| k.get("kind").and_then(Value::as_str))
                            .collect()
                    })
                    // Old cargo versions lack dep_kinds: treat the edge as normal (strict).
                    .unwrap_or_else(|| vec![None]);
                let dev = kinds.contains(&Some("dev"));
                let mut non_dev = kinds.iter().any(|k| *k != Some("dev"));
                if non_dev && let (Some(package), Some(activated)) = (package, &activated) {
                    let to_name = graph.names.get(&to).map_or("", String::as_str);
                    non_dev = non_dev_edge_is_built(package, to_name, activated);
                }
                if non_dev || dev {
                    edges.push(Edge { to, non_dev, dev });
                }
            }
            graph.edges.insert(id, edges);
        }
        Ok(graph)
    }

    /// Packages cargo builds for the workspace: normal/build edges from anywhere, dev edges
    /// from workspace members only.
    fn built_packages(&self) -> BTreeSet<&str> {
        let mut seen: BTreeSet<&str> = self.workspace.iter().map(String::as_str).collect();
        let mut queue: VecDeque<&str> = seen.iter().copied().collect();
        while let Some(id) = queue.pop_front() {
            let member = self.workspace.contains(id);
            for edge in self.edges.get(id).into_iter().flatten() {
                if (edge.non_dev || (member && edge.dev)) && seen.insert(edge.to.as_str()) {
                    queue.push_back(edge.to.as_str());
                }
            }
        }
        seen
    }

    fn layer(&self, id: &str) -> Option<Layer> {
        if self.outside_crates.contains(id) {
            return None;
        }
        layer_of(self.name(id))
    }

    fn name<'a>(&'a self, id: &'a str) -> &'a str {
        self.names.get(id).map_or(id, String::as_str)
    }

    fn workspace_id(&self, name: &str) -> Option<&String> {
        self.workspace.iter().find(|id| self.name(id) == name)
    }

    /// The features of a workspace crate to check one by one (`default` excluded);
    /// `None` if the crate is not in the workspace.
    pub fn feature_plan(&self, name: &str) -> Option<FeaturePlan> {
        let id = self.workspace_id(name)?;
        let table = self.features.get(id).cloned().unwrap_or_default();
        let mut plan = FeaturePlan {
            check: Vec::new(),
            aggregates: Vec::new(),
        };
        // BTreeMap iteration is sorted.
        for (feature, values) in &table {
            if feature == "default" {
                continue;
            }
            let aggregate = values.len() > 1 && values.iter().all(|v| table.contains_key(v));
            if aggregate {
                plan.aggregates.push(feature.clone());
            } else {
                plan.check.push(feature.clone());
            }
        }
        Some(plan)
    }

    /// Every rule violation, as sentences; empty means the graph is fine.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.check_core(&mut out);
        self.check_storage(&mut out);
        self.check_layers(&mut out);
        self.check_sqlite(&mut out);
        out
    }

    /// Every package `from` reaches through normal/build edges, each with the path by which
    /// it was first reached (breadth-first, so a shortest one), as crate names
    /// `from -> a -> b`.
    fn reachable<'a>(&'a self, from: &'a str) -> BTreeMap<&'a str, Vec<&'a str>> {
        let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([from]);
        let mut seen = BTreeSet::from([from]);
        while let Some(id) = queue.pop_front() {
            for edge in self.edges.get(id).into_iter().flatten() {
                if edge.non_dev && seen.insert(edge.to.as_str()) {
                    parent.insert(edge.to.as_str(), id);
                    queue.push_back(edge.to.as_str());
                }
            }
        }
        seen.into_iter()
            .map(|id| {
                let mut path = vec![self.name(id)];
                let mut cursor = id;
                while let Some(up) = parent.get(cursor) {
                    path.push(self.name(up));
                    cursor = up;
                }
                path.reverse();
                (id, path)
            })
            .collect()
    }

    fn check_core(&self, out: &mut Vec<String>) {
        let Some(core) = self.workspace_id(CORE) else {
            return;
        };
        for (id, path) in self.reachable(core) {
            let name = self.name(id);
            if FORBIDDEN_IN_CORE.contains(&name) {
                out.push(format!(
                    "{CORE} must not depend on {name}: {}",
                    path.join(" -> ")
                ));
            }
        }
    }

    fn check_storage(&self, out: &mut Vec<String>) {
        for storage in STANDALONE_STORAGE {
            let Some(from) = self.workspace_id(storage) else {
                continue;
            };
            for (id, path) in self.reachable(from) {
                if self.name(id) == CORE && self.workspace.contains(id) {
                    out.push(format!(
                        "{storage} must not depend on {CORE} (storage stands alone; agent glue \
                         goes in hame-tools): {}",
                        path.join(" -> ")
                    ));
                }
            }
        }
    }

    fn check_layers(&self, out: &mut Vec<String>) {
        for from in &self.workspace {
            let from_name = self.name(from);
            let Some(from_layer) = self.layer(from) else {
                continue;
            };
            for edge in self.edges.get(from).into_iter().flatten() {
                let to = &edge.to;
                if !edge.non_dev || !self.workspace.contains(to) {
                    continue;
                }
                let to_name = self.name(to);
                match self.layer(to) {
                    None => out.push(format!(
                        "{from_name} must not depend on helper crate {to_name} \
                         (use [dev-dependencies])"
                    )),
                    Some(to_layer) if to_layer > from_layer => out.push(format!(
                        "{from_name} ({from_layer:?}) must not depend on {to_name} \
                         ({to_layer:?}): edges point down the layering \
                         core <- leaf crates <- harness <- hame <- hame-gateway <- hame-cli"
                    )),
                    Some(_) => {}
                }
            }
        }
    }

    fn count_built(&self, name: &str) -> usize {
        self.built_packages()
            .into_iter()
            .filter(|id| self.name(id) == name)
            .count()
    }

    fn check_sqlite(&self, out: &mut Vec<String>) {
        let count = |name: &str| self.count_built(name);
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
        format!(
            "{} packages built, {} workspace members, {} libsqlite3-sys",
            self.built_packages().len(),
            self.workspace.len(),
            self.count_built("libsqlite3-sys")
        )
    }
}

/// The dependency keys (`rename` or name) of the optional dependencies that `enabled`
/// features switch on. `dep:x`, `x` and `x/feature` activate `x`; `x?/feature` does not.
fn activated_optional(package: &Value, enabled: &BTreeSet<&str>) -> BTreeSet<String> {
    let table = package.get("features").and_then(Value::as_object);
    let mut out = BTreeSet::new();
    for feature in enabled {
        // An enabled feature named like an optional dependency is that dependency's
        // implicit feature (old-style `x = ["dep:x"]` or a plain optional dependency).
        out.insert((*feature).to_owned());
        let values = table
            .and_then(|t| t.get(*feature))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str);
        for value in values {
            if let Some(key) = value.strip_prefix("dep:") {
                out.insert(key.to_owned());
            } else if let Some((key, _)) = value.split_once('/') {
                if !key.ends_with('?') {
                    out.insert(key.to_owned());
                }
            } else {
                out.insert(value.to_owned());
            }
        }
    }
    out
}

/// Whether a normal/build edge from `package` to the package named `to_name` is built:
/// some non-dev declaration of it is either required or an activated optional dependency.
fn non_dev_edge_is_built(package: &Value, to_name: &str, activated: &BTreeSet<String>) -> bool {
    let decls: Vec<&Value> = package
        .get("dependencies")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|d| d.get("name").and_then(Value::as_str) == Some(to_name))
        .filter(|d| d.get("kind").and_then(Value::as_str) != Some("dev"))
        .collect();
    if decls.is_empty() {
        // Nothing to reason with (hand-written or odd metadata): keep the edge, be strict.
        return true;
    }
    decls.iter().any(|d| {
        let optional = d.get("optional").and_then(Value::as_bool).unwrap_or(false);
        let key = d
            .get("rename")
            .and_then(Value::as_str)
            .or_else(|| d.get("name").and_then(Value::as_str))
            .unwrap_or(to_name);
        !optional || activated.contains(key)
    })
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
