//! Deferred tools (ADR 0014): the rarely used built-ins are registered and callable, but a
//! request offers them only once the session needs them — after the model looked them up
//! with [`SEARCH_TOOL`], after it used a tool of the same group (a spawn offers the task
//! tools), while plan mode is on (the plan tools), or when the prompt lists skills
//! (`load_skill`), or when another layer asks for them ([`ToolOffers`]: the subagents layer
//! offers the task tools when subagents are declared). What a session loaded is kept in its state (extension [`STATE_KEY`]),
//! so the offered set, and with it the prompt-cache prefix, stays stable across calls.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hame_core::{
    CallCtx, CallInput, CallNext, CallOutput, Layer, ModelNext, ModelRequest, ModelResponse, Tool,
    ToolCall, ToolContext, ToolCtx, ToolNext, ToolOffers, ToolOutcome, ToolOutput, ToolSpec,
    TypedTool, codes, typed,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The name of the look-up tool.
pub const SEARCH_TOOL: &str = "tool_search";
/// The state extension that holds the names of the deferred tools a session loaded.
pub const STATE_KEY: &str = "tools";

/// The built-ins deferred by default: registered and callable, offered on demand.
pub const DEFAULT_DEFERRED_TOOLS: &[&str] = &[
    "agent_list",
    "agent_send",
    "load_skill",
    "memory_get",
    "memory_save",
    "plan_enter",
    "plan_exit",
    "plan_write",
    "propose_skill",
    "requirement_propose",
    "session_history",
    "session_list",
    "session_search",
    "task_cancel",
    "task_list",
    "task_output",
];

/// Groups of tools that are loaded together: using (or looking up) one member offers the
/// deferred others. The label is what `tool_search`'s description says of the group.
const GROUPS: &[(&str, &[&str])] = &[
    ("memory", &["memory_search", "memory_get", "memory_save"]),
    (
        "sessions",
        &["session_list", "session_history", "session_search"],
    ),
    (
        "subagent tasks",
        &[
            "agent_spawn",
            "agent_list",
            "agent_send",
            "task_output",
            "task_list",
            "task_cancel",
        ],
    ),
    ("plan mode", &["plan_enter", "plan_write", "plan_exit"]),
    ("skills", &["load_skill", "propose_skill"]),
    ("task requirements", &["requirement_propose"]),
];

/// The plan tools, offered while plan mode is on.
const PLAN_GROUP: &[&str] = &["plan_enter", "plan_write", "plan_exit"];
/// What the prompt contains when it lists skills (see `hame-skills`).
const SKILLS_MARK: &str = "<available_skills>";

/// A session's loaded deferred tools (the [`STATE_KEY`] extension).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Loaded {
    #[serde(default)]
    loaded: BTreeSet<String>,
}

/// The deferred tools of an agent, shared by its layer and its `tool_search`.
#[derive(Debug)]
pub(crate) struct Catalog {
    /// Specs of the deferred tools, sorted by name.
    specs: Vec<ToolSpec>,
    /// How deep subagents may nest (a child at the limit never gets the subagent tools).
    max_depth: usize,
}

impl Catalog {
    /// The catalog of `specs` (the loop's deferred specs); `None` when nothing is deferred.
    pub(crate) fn new(specs: Vec<ToolSpec>, max_depth: usize) -> Option<Arc<Self>> {
        (!specs.is_empty()).then(|| Arc::new(Self { specs, max_depth }))
    }

    /// Specs of the deferred tools, sorted by name.
    pub(crate) fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    fn is_deferred(&self, name: &str) -> bool {
        self.specs.iter().any(|s| s.name == name)
    }

    /// The deferred members of the groups `name` belongs to (itself when it is deferred).
    fn group_of(&self, name: &str) -> Vec<String> {
        let mut out: Vec<String> = GROUPS
            .iter()
            .filter(|(_, members)| members.contains(&name))
            .flat_map(|(_, members)| members.iter().copied())
            .filter(|m| self.is_deferred(m))
            .map(str::to_owned)
            .collect();
        if self.is_deferred(name) && !out.iter().any(|m| m == name) {
            out.push(name.to_owned());
        }
        out
    }

    /// Whether the caller may run `name` (a subagent's allowlist, the nesting limit).
    pub(crate) fn permitted(&self, runtime: &hame_core::RuntimeContext, name: &str) -> bool {
        if hame_subagent::SUBAGENT_TOOLS.contains(&name)
            && hame_subagent::depth_of(runtime) >= self.max_depth
        {
            return false;
        }
        hame_subagent::tool_allowlist(runtime).is_none_or(|allow| allow.iter().any(|a| a == name))
    }

    /// The deferred tools a `tool_search` query names: a word (3 characters or more) equal
    /// to or inside a tool's name (a plural `s` dropped), in a group's topic, or (4
    /// characters or more) in a tool's description.
    fn matching(&self, query: &str) -> BTreeSet<&str> {
        let mut found = BTreeSet::new();
        let words = query
            .split(|c: char| c.is_whitespace() || c == ',')
            .map(str::to_lowercase)
            .filter(|w| w.chars().count() >= 3);
        for w in words {
            let singular = w.trim_end_matches('s');
            for spec in &self.specs {
                if spec.name == w
                    || (!singular.is_empty() && spec.name.contains(singular))
                    || (w.chars().count() >= 4 && spec.description.to_lowercase().contains(&w))
                {
                    found.insert(spec.name.as_str());
                }
            }
            for (label, members) in GROUPS {
                if !singular.is_empty() && label.contains(singular) {
                    for m in members.iter().copied() {
                        if let Some(spec) = self.specs.iter().find(|s| s.name == m) {
                            found.insert(spec.name.as_str());
                        }
                    }
                }
            }
        }
        found
    }

    /// `tool_search`'s description: what can be loaded, by group.
    fn description(&self) -> String {
        let mut parts = Vec::new();
        let mut listed = BTreeSet::new();
        for (label, members) in GROUPS {
            let names: Vec<&str> = members
                .iter()
                .copied()
                .filter(|m| self.is_deferred(m))
                .collect();
            if names.is_empty() {
                continue;
            }
            listed.extend(names.iter().copied());
            parts.push(format!("{label}: {}", names.join(" ")));
        }
        let others: Vec<&str> = self
            .specs
            .iter()
            .map(|s| s.name.as_str())
            .filter(|n| !listed.contains(n))
            .collect();
        if !others.is_empty() {
            parts.push(others.join(" "));
        }
        format!(
            "Load tools by name or topic; they are offered from your next step. {}.",
            parts.join("; ")
        )
    }
}

/// The loaded set of the running call (in its extensions), written back when it ends.
#[derive(Debug, Default)]
struct LoadedCell(Mutex<BTreeSet<String>>);

impl LoadedCell {
    fn get(&self) -> BTreeSet<String> {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }
    fn add<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        if let Ok(mut s) = self.0.lock() {
            s.extend(names.into_iter().map(str::to_owned));
        }
    }
}

/// The `catalog` layer. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct CatalogLayer {
    catalog: Arc<Catalog>,
}

impl CatalogLayer {
    pub(crate) fn new(catalog: Arc<Catalog>) -> Self {
        Self { catalog }
    }
}

#[async_trait]
impl Layer for CatalogLayer {
    fn name(&self) -> &str {
        "catalog"
    }

    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> hame_core::Result<CallOutput> {
        let before: Loaded = cx.state.extension(STATE_KEY).unwrap_or_default();
        let cell = Arc::new(LoadedCell(Mutex::new(before.loaded.clone())));
        let mut extensions = cx.extensions.clone();
        extensions.insert_arc(cell.clone());
        extensions.insert_arc(Arc::new(ToolOffers::default()));
        let out = next.run_with(cx, &extensions, input).await;
        let after = Loaded { loaded: cell.get() };
        if after != before
            && let Err(e) = cx.state.set_extension(STATE_KEY, &after)
        {
            tracing::warn!(error = %e, "saving the loaded tools failed");
        }
        out
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        mut request: ModelRequest,
        next: ModelNext<'_>,
    ) -> hame_core::Result<ModelResponse> {
        let mut offer = cx
            .extensions
            .get::<LoadedCell>()
            .map(|c| c.get())
            .unwrap_or_default();
        if let Some(offers) = cx.extensions.get::<ToolOffers>() {
            offer.extend(offers.take());
        }
        if cx
            .extensions
            .get::<crate::permissions::PermissionCell>()
            .is_some_and(|c| c.plan_mode())
        {
            offer.extend(PLAN_GROUP.iter().map(|s| (*s).to_owned()));
        }
        if request.system.contains(SKILLS_MARK) {
            offer.insert("load_skill".to_owned());
        }
        for spec in &self.catalog.specs {
            if offer.contains(&spec.name)
                && self.catalog.permitted(cx.runtime, &spec.name)
                && !request.tools.iter().any(|t| t.name == spec.name)
            {
                request.tools.push(spec.clone());
            }
        }
        next.run(cx, request).await
    }

    async fn tool(&self, cx: &ToolCtx<'_>, call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        let name = call.name.clone();
        let out = next.run(cx, call).await;
        // A tool the caller could run (not "no tool named ...") loads its group.
        let ran = !matches!(&out, ToolOutcome::Done(Err(e)) if e.code == codes::UNKNOWN_TOOL);
        if ran
            && name != SEARCH_TOOL
            && let Some(cell) = cx.tool.extensions.get::<LoadedCell>()
        {
            let group: Vec<String> = self
                .catalog
                .group_of(&name)
                .into_iter()
                .filter(|m| self.catalog.permitted(&cx.tool.runtime, m))
                .collect();
            cell.add(group.iter().map(String::as_str));
        }
        out
    }
}

/// `tool_search`: looks deferred tools up and loads them.
pub(crate) fn search_tool(catalog: Arc<Catalog>) -> Arc<dyn Tool> {
    let description = catalog.description();
    typed(ToolSearch {
        catalog,
        description,
    })
}

#[derive(Debug)]
struct ToolSearch {
    catalog: Arc<Catalog>,
    description: String,
}

/// Arguments of `tool_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    /// Names or topics, e.g. `sessions`.
    query: String,
}

/// Longest query, in characters.
const MAX_QUERY_CHARS: usize = 500;

#[async_trait]
impl TypedTool for ToolSearch {
    type Args = SearchArgs;
    fn name(&self) -> &str {
        SEARCH_TOOL
    }
    fn description(&self) -> String {
        self.description.clone()
    }
    async fn run(&self, args: SearchArgs, ctx: &ToolContext) -> ToolOutput {
        if args.query.chars().count() > MAX_QUERY_CHARS {
            return Err(hame_core::ToolError::invalid_arguments(format!(
                "query is longer than {MAX_QUERY_CHARS} characters"
            )));
        }
        let permitted = |n: &str| self.catalog.permitted(&ctx.runtime, n);
        let found = self.catalog.matching(&args.query);
        // A match brings its group (the tools that work together).
        let groups: Vec<String> = found
            .iter()
            .flat_map(|n| self.catalog.group_of(n))
            .collect();
        let mut found: BTreeSet<&str> = groups.iter().map(String::as_str).collect();
        found.retain(|n| permitted(n));
        if found.is_empty() {
            let names: Vec<&str> = self
                .catalog
                .specs
                .iter()
                .map(|s| s.name.as_str())
                .filter(|n| permitted(n))
                .collect();
            return Ok(format!(
                "No tool matches `{}`. Tools you can load: {}.",
                args.query,
                names.join(", ")
            ));
        }
        if let Some(cell) = ctx.extensions.get::<LoadedCell>() {
            cell.add(found.iter().copied());
        }
        let mut out = String::from("Loaded (offered from your next step):\n");
        for spec in &self.catalog.specs {
            if found.contains(spec.name.as_str()) {
                out.push_str(&format!("- {}: {}\n", spec.name, spec.description));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: format!("does {name}"),
            parameters: serde_json::json!({"type": "object", "properties": {}}).into(),
        }
    }

    #[test]
    fn groups_load_together_and_only_deferred_members() {
        let Some(c) = Catalog::new(vec![spec("task_output"), spec("task_list")], 1) else {
            panic!("a catalog");
        };
        assert_eq!(c.group_of("agent_spawn"), vec!["task_output", "task_list"]);
        assert!(c.group_of("read_file").is_empty());
        assert!(Catalog::new(Vec::new(), 1).is_none());
        let d = c.description();
        assert!(d.contains("subagent tasks: task_output task_list"), "{d}");
    }

    #[test]
    fn queries_match_names_topics_and_descriptions_but_not_short_words() {
        let Some(c) = Catalog::new(
            vec![
                spec("session_list"),
                spec("session_history"),
                spec("task_output"),
            ],
            1,
        ) else {
            panic!("a catalog");
        };
        let names = |q: &str| c.matching(q).into_iter().collect::<Vec<_>>();
        assert_eq!(names("sessions"), ["session_history", "session_list"]);
        assert_eq!(names("task_output"), ["task_output"]);
        assert_eq!(names("subagent"), ["task_output"], "the group's topic");
        assert_eq!(
            names("does"),
            ["session_history", "session_list", "task_output"]
        );
        assert!(names("a s to of").is_empty(), "short words match nothing");
        assert!(names("").is_empty());
    }

    #[test]
    fn every_default_deferred_tool_is_in_a_group() {
        for name in DEFAULT_DEFERRED_TOOLS {
            assert!(
                GROUPS.iter().any(|(_, m)| m.contains(name)),
                "{name} has no group"
            );
        }
    }
}
