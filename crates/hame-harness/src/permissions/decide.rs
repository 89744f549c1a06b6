//! The permission decision as a plain function over plain data: which rule applies to one
//! tool call (deny > ask > allow > the mode's default), and the table of built-in tools by
//! effect. No I/O here (`decide_tests.rs` has the unit and property tests).

use std::sync::Arc;

use hame_fs::{FsPath, NameCase};
use hame_tools::memo::ParseMemo;
use serde::{Deserialize, Serialize};

use crate::tools_config::{PermissionDefault, PermissionRule, Permissions};

/// What a call's decision is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The call runs.
    Allow,
    /// A human decides (the call is suspended).
    Ask,
    /// The call does not run; the model gets an error result.
    Deny,
}

/// A permission mode: a preset of what applies when no rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The rules, then their `default` (`allow` when unset).
    #[default]
    Default,
    /// File edits are allowed, the shell asks; the rules still apply first.
    AcceptEdits,
    /// Plan mode's set: every tool that changes something is denied.
    ReadOnly,
    /// Everything not denied by a rule is allowed (each such call is logged as a warning).
    Bypass,
    /// Every tool that changes something (edits, the shell, memory, skills, unknown and
    /// MCP tools not annotated read-only) asks; the rules still apply first; reads and
    /// coordination follow the rules' `default`. What `hame init` writes.
    Ask,
}

impl Mode {
    /// Parses `default`, `accept-edits`, `read-only` (alias `plan`), `bypass`, `ask`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "default" => Some(Mode::Default),
            "accept-edits" | "acceptEdits" => Some(Mode::AcceptEdits),
            "read-only" | "plan" => Some(Mode::ReadOnly),
            "bypass" => Some(Mode::Bypass),
            "ask" => Some(Mode::Ask),
            _ => None,
        }
    }
}

/// What a tool does, for plan mode and the modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Reads only.
    ReadOnly,
    /// Changes files of the workspace.
    Edit,
    /// Runs shell commands.
    Shell,
    /// Changes something else (memory, skills, tasks; MCP tools not annotated read-only;
    /// tools hame does not know).
    Mutate,
    /// Plan, todo and subagent coordination: allowed in plan mode (subagents inherit it).
    Coordinate,
}

/// Every built-in tool of the harness with its effect: the one table plan mode and the
/// modes use. A tool that is not here (added by the application, or an MCP tool without
/// `readOnlyHint`) counts as [`Effect::Mutate`]: fail closed.
pub const BUILTIN_EFFECTS: &[(&str, Effect)] = &[
    ("read_file", Effect::ReadOnly),
    ("grep_files", Effect::ReadOnly),
    ("glob_files", Effect::ReadOnly),
    ("list_files", Effect::ReadOnly),
    ("session_list", Effect::ReadOnly),
    ("session_history", Effect::ReadOnly),
    ("session_search", Effect::ReadOnly),
    ("memory_search", Effect::ReadOnly),
    ("memory_get", Effect::ReadOnly),
    ("load_skill", Effect::ReadOnly),
    // Loads the schemas of tools offered on demand; runs nothing.
    ("tool_search", Effect::ReadOnly),
    ("write_file", Effect::Edit),
    ("edit_file", Effect::Edit),
    ("delete_file", Effect::Edit),
    ("move_file", Effect::Edit),
    ("execute", Effect::Shell),
    ("memory_save", Effect::Mutate),
    ("propose_skill", Effect::Mutate),
    ("task_cancel", Effect::Mutate),
    ("plan_enter", Effect::Coordinate),
    ("plan_write", Effect::Coordinate),
    ("plan_exit", Effect::Coordinate),
    ("todo_write", Effect::Coordinate),
    ("agent_spawn", Effect::Coordinate),
    ("agent_send", Effect::Coordinate),
    ("agent_list", Effect::Coordinate),
    ("task_output", Effect::Coordinate),
    ("task_list", Effect::Coordinate),
];

/// The effect of tool `name`; `mcp_read_only` is the `readOnlyHint` of an MCP tool (when
/// the call is one).
pub fn effect_of(name: &str, mcp_read_only: Option<bool>) -> Effect {
    if let Some(ro) = mcp_read_only {
        return if ro { Effect::ReadOnly } else { Effect::Mutate };
    }
    BUILTIN_EFFECTS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(Effect::Mutate, |(_, e)| *e)
}

/// Whether a tool with this effect changes something (denied in plan mode).
pub fn is_mutating(effect: Effect) -> bool {
    matches!(effect, Effect::Edit | Effect::Shell | Effect::Mutate)
}

/// The argument keys that name a call's main argument, in order: the path for file tools,
/// the command for `execute`, the spec id for `agent_spawn`, the task for `agent_send`.
pub const MAIN_ARGUMENT_KEYS: &[&str] = &["file_path", "path", "command", "agent_id", "task_id"];

/// The keys of [`MAIN_ARGUMENT_KEYS`] that hold a path of the caller's files.
pub const PATH_ARGUMENT_KEYS: &[&str] = &["file_path", "path"];

/// The tools that take their path through [`FsPath::parse`](hame_fs::FsPath::parse) (the
/// file tools of `hame-tools`, and the names the effect table reserves): a path the
/// filesystem refuses is refused for them before any rule is looked at.
pub const WORKSPACE_FILE_TOOLS: &[&str] = &[
    "read_file",
    "write_file",
    "edit_file",
    "grep_files",
    "glob_files",
    "list_files",
    "delete_file",
    "move_file",
];

/// The main argument of a call as given (what a person reads; [`call_argument`] is what
/// the rules compare).
pub fn main_argument(arguments: &serde_json::Value) -> Option<String> {
    MAIN_ARGUMENT_KEYS
        .iter()
        .find_map(|k| arguments.get(*k).and_then(|v| v.as_str()))
        .map(str::to_owned)
}

/// A call's main argument as the rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Argument {
    /// What is recorded, shown and remembered by "always": for a path, the path the tool
    /// touches (`FsPath` form, no leading `/`); else the text as given.
    pub shown: String,
    /// What rule globs are matched against: [`FsPath::match_key`](hame_fs::FsPath::match_key)
    /// of the path, else the text.
    pub key: String,
    /// Whether it is a path (rule globs are then normalised by [`hame_fs::pattern_key`]).
    pub path: bool,
}

impl Argument {
    /// A text argument (a command, a spec id), compared as given.
    pub fn text(s: &str) -> Self {
        Self {
            shown: s.to_owned(),
            key: s.to_owned(),
            path: false,
        }
    }

    /// A path argument: the path the filesystem takes for `raw`, or why it refuses it.
    pub fn path(raw: &str, case: NameCase) -> Result<Self, String> {
        let p = FsPath::parse(raw).map_err(|e| e.to_string())?;
        Ok(Self {
            shown: p.as_str().to_owned(),
            key: p.match_key(case),
            path: true,
        })
    }
}

/// The main argument of a call of `tool`, the way the tool will use it: under a
/// [`PATH_ARGUMENT_KEYS`] key, the path [`FsPath::parse`](hame_fs::FsPath::parse) gives
/// (the one function the file tools take their path from), so every spelling of one file
/// (`a//b`, `./a/b`, `a/b/`, other Unicode forms, other cases where the backend folds case)
/// meets the same rules. `Err` (the filesystem's reason) for a path a
/// [`WORKSPACE_FILE_TOOLS`] tool would refuse (`a/../b`, NUL, `\`): such a call is refused
/// before any rule, so no rule can allow what the tool would not touch. A path another tool
/// (MCP, the application's) takes that `FsPath` refuses is compared as given.
pub fn call_argument(
    tool: &str,
    arguments: &serde_json::Value,
    case: NameCase,
) -> Result<Option<Argument>, String> {
    let Some((key, raw)) = MAIN_ARGUMENT_KEYS
        .iter()
        .find_map(|k| arguments.get(*k).and_then(|v| v.as_str()).map(|v| (*k, v)))
    else {
        return Ok(None);
    };
    if !PATH_ARGUMENT_KEYS.contains(&key) {
        return Ok(Some(Argument::text(raw)));
    }
    match Argument::path(raw, case) {
        Ok(a) => Ok(Some(a)),
        Err(e) if WORKSPACE_FILE_TOOLS.contains(&tool) => Err(e),
        Err(_) => Ok(Some(Argument::text(raw))),
    }
}

/// One decision and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The outcome.
    pub outcome: Outcome,
    /// What decided it: `deny execute(rm *)`, `plan mode`, `default allow`, ...
    pub rule: String,
}

impl Verdict {
    fn new(outcome: Outcome, rule: impl Into<String>) -> Self {
        Self {
            outcome,
            rule: rule.into(),
        }
    }
}

/// Everything the decision looks at for one call.
#[derive(Debug, Clone)]
pub struct Question<'a> {
    /// The tool name.
    pub tool: &'a str,
    /// Its main argument, if any ([`call_argument`]).
    pub argument: Option<Argument>,
    /// What the tool does.
    pub effect: Effect,
    /// Whether the session is in plan mode.
    pub plan_mode: bool,
    /// The permission mode.
    pub mode: Mode,
    /// Whether the caller's files fold case (path globs then compare lower-cased).
    pub case: NameCase,
}

/// Whether `rule` matches `tool` with `argument`. A rule with a glob never matches a call
/// without a main argument. A path argument is compared in its
/// [`match_key`](hame_fs::FsPath::match_key) form against the glob in its
/// [`pattern_key`](hame_fs::pattern_key) form, so `write_file(secret/*)`,
/// `write_file(/secret/*)` and `write_file(./secret//*)` match `secret/a.txt` however the
/// call spells it. Other arguments are compared as given and without a leading `/` or `./`.
pub fn rule_matches(
    rule: &PermissionRule,
    tool: &str,
    argument: Option<&Argument>,
    case: NameCase,
) -> bool {
    if !glob_match(&rule.tool, tool) {
        return false;
    }
    let Some(pattern) = &rule.argument else {
        return true;
    };
    let Some(arg) = argument else {
        return false;
    };
    if arg.path {
        return glob_match(&hame_fs::pattern_key(pattern, case), &arg.key);
    }
    let bare_pattern = strip_root(pattern);
    [arg.key.as_str(), strip_root(&arg.key)]
        .iter()
        .any(|a| glob_match(pattern, a) || glob_match(bare_pattern, a))
}

/// Whether a session's "always allow" answer `rule` is for this very call: the same tool,
/// and the same argument (a remembered answer without one only for calls without one).
fn always_matches(
    rule: &PermissionRule,
    tool: &str,
    argument: Option<&Argument>,
    case: NameCase,
) -> bool {
    match (&rule.argument, argument) {
        (None, None) => glob_match(&rule.tool, tool),
        (Some(_), Some(_)) => rule_matches(rule, tool, argument, case),
        _ => false,
    }
}

/// The "always allow" rule that remembers a human's answer for this call (its argument
/// escaped, so it matches this argument only).
pub fn always_rule(tool: &str, argument: Option<&Argument>) -> String {
    match argument {
        Some(a) => format!("{tool}({})", globset::escape(&a.shown)),
        None => tool.to_owned(),
    }
}

fn strip_root(s: &str) -> &str {
    let mut s = s;
    loop {
        if let Some(r) = s.strip_prefix("./") {
            s = r;
        } else if let Some(r) = s.strip_prefix('/') {
            s = r;
        } else {
            return s;
        }
    }
}

/// Patterns [`glob_match`] keeps compiled; past this many the memo starts over.
const MEMO_PATTERNS: usize = 512;

/// `glob_match`'s compiled patterns (`None`: not a valid glob). Compiling a glob builds a
/// regex (~10 µs each; a call checked against a dozen rules paid ~160 µs, measured in
/// release); the rules are re-read every step, but their patterns rarely change.
static COMPILED: std::sync::LazyLock<ParseMemo<Option<Arc<globset::GlobMatcher>>>> =
    std::sync::LazyLock::new(|| ParseMemo::new(MEMO_PATTERNS, 4096));

fn glob_match(pattern: &str, text: &str) -> bool {
    COMPILED
        .get_or_parse(&[pattern], || {
            globset::Glob::new(pattern)
                .ok()
                .map(|g| Arc::new(g.compile_matcher()))
        })
        .is_some_and(|m| m.is_match(text))
}

/// Renders a rule as written (`tool` or `tool(glob)`).
pub fn rule_text(rule: &PermissionRule) -> String {
    match &rule.argument {
        Some(a) => format!("{}({a})", rule.tool),
        None => rule.tool.clone(),
    }
}

/// The decision for one call: plan mode first (a mutating tool is denied), then `deny`
/// rules, then the session's "always allow" answers (a human said yes to this very call
/// for the rest of the session: it does not ask again, whatever rule asked), `ask` rules,
/// `allow` rules, then the mode's default. `plan_exit` always asks while in plan mode (a
/// human approves the plan).
pub fn decide(q: &Question<'_>, rules: &Permissions, session_allow: &[PermissionRule]) -> Verdict {
    let argument = q.argument.as_ref();
    let first = |list: &[PermissionRule]| {
        list.iter()
            .find(|r| rule_matches(r, q.tool, argument, q.case))
            .map(rule_text)
    };
    if q.plan_mode && is_mutating(q.effect) {
        return Verdict::new(Outcome::Deny, "plan mode");
    }
    if let Some(r) = first(&rules.deny) {
        return Verdict::new(Outcome::Deny, format!("deny {r}"));
    }
    if q.plan_mode && q.tool == "plan_exit" {
        return Verdict::new(Outcome::Ask, "plan_exit");
    }
    if let Some(r) = session_allow
        .iter()
        .find(|r| always_matches(r, q.tool, argument, q.case))
    {
        return Verdict::new(Outcome::Allow, format!("always allow {}", rule_text(r)));
    }
    if let Some(r) = first(&rules.ask) {
        return Verdict::new(Outcome::Ask, format!("ask {r}"));
    }
    if let Some(r) = first(&rules.allow) {
        return Verdict::new(Outcome::Allow, format!("allow {r}"));
    }
    match q.mode {
        Mode::ReadOnly if is_mutating(q.effect) => Verdict::new(Outcome::Deny, "mode read-only"),
        Mode::AcceptEdits if q.effect == Effect::Edit => {
            Verdict::new(Outcome::Allow, "mode accept-edits")
        }
        Mode::AcceptEdits if q.effect == Effect::Shell => {
            Verdict::new(Outcome::Ask, "mode accept-edits")
        }
        Mode::Bypass => Verdict::new(Outcome::Allow, "mode bypass"),
        Mode::Ask if is_mutating(q.effect) => Verdict::new(Outcome::Ask, "mode ask"),
        _ => match rules.default.unwrap_or(PermissionDefault::Allow) {
            PermissionDefault::Allow => Verdict::new(Outcome::Allow, "default allow"),
            PermissionDefault::Ask => Verdict::new(Outcome::Ask, "default ask"),
            PermissionDefault::Deny => Verdict::new(Outcome::Deny, "default deny"),
        },
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
