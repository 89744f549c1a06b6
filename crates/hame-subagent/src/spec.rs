//! Subagent declarations: what a subagent is (its prompt, tools, limits) and where the
//! declarations come from (built-in, code, workspace files, per-user overrides).

use std::collections::BTreeMap;
use std::sync::Arc;

use hame_fs::{Filesystem, FsPath};
use hame_tools::Workspace;
use hame_tools::memo::ParseMemo;
use serde::{Deserialize, Serialize};

use crate::runner::SubagentRunner;

/// Id of the built-in subagent that mirrors the parent (switch it off with
/// [`SubagentOptions::general_purpose`](crate::SubagentOptions::general_purpose)).
pub const GENERAL_PURPOSE: &str = "general-purpose";
/// The workspace folder of subagent specs (`subagents/<id>.md`).
pub const SPEC_DIR: &str = "subagents";
/// Largest spec file read, in bytes; a bigger one is skipped with a warning.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;
/// Most spec files read from one folder.
pub const MAX_SPECS: usize = 200;

/// Which files a child works on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecWorkspace {
    /// The parent's workspace (the default).
    #[default]
    Shared,
    /// Its own folder `subagents/<id>/workspace/` of the parent's home: it cannot see or
    /// change the parent's files.
    Isolated,
}

/// Which sandbox a child's file tools and shell use in sandbox mode (front-matter key
/// `sandbox`); outside sandbox mode it changes nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecSandbox {
    /// The parent's sandbox (the default): the child sees and changes the parent's
    /// `/workspace`, within the parent's call.
    #[default]
    Shared,
    /// A sandbox of its own, keyed by the child's session: a container and snapshots of
    /// its own, with the host's assets projected; it never sees the parent's files.
    Own,
}

/// Where a declaration came from (shown by `agent_list` and `hame tasks`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SpecSource {
    /// The built-in general-purpose subagent.
    Builtin,
    /// Declared in code (`builder.subagent(...)`).
    Code,
    /// A workspace file (`subagents/<id>.md`, or `<userId>/subagents/<id>.md`).
    File {
        /// The file, as the model sees it.
        path: String,
    },
}

/// A subagent declaration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentSpec {
    /// The id the model spawns it by (the file name of a workspace spec).
    pub id: String,
    /// What it is for, shown to the model (required).
    pub description: String,
    /// Its system prompt (the body of a workspace spec).
    pub prompt: String,
    /// `provider:model`; `None` = the parent's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Allowlist over the parent's tools; `None` = all of them (never the subagent tools
    /// of a leaf).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Step limit of one run; `None` = the parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<usize>,
    /// Wall-clock limit of one run in seconds; `None` = the default
    /// ([`SubagentOptions::default_timeout`](crate::SubagentOptions::default_timeout)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// Which files it works on.
    #[serde(default)]
    pub workspace: SpecWorkspace,
    /// In sandbox mode: the parent's sandbox or its own.
    #[serde(default)]
    pub sandbox: SpecSandbox,
    /// A remote agent that runs this subagent over A2A (front-matter `a2a`): the URL of its
    /// agent card, or the base URL the card is read under (`/.well-known/agent-card.json`
    /// appended); `docs/a2a.md`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a: Option<String>,
    /// The environment variable holding the `Authorization` header value sent to the
    /// remote agent (front-matter `a2a_auth_env`); the value is never logged, stored or
    /// shown to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a_auth_env: Option<String>,
    /// Where it came from.
    pub source: SpecSource,
}

impl SubagentSpec {
    /// A declaration made in code.
    pub fn new(
        id: impl Into<String>,
        description: impl Into<String>,
        prompt: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            description: description.into(),
            prompt: prompt.into(),
            model: None,
            tools: None,
            max_iterations: None,
            timeout_seconds: None,
            workspace: SpecWorkspace::Shared,
            sandbox: SpecSandbox::Shared,
            a2a: None,
            a2a_auth_env: None,
            source: SpecSource::Code,
        }
    }

    /// Makes it a remote subagent: `url` is the remote agent's card (or the base URL
    /// its card is read under), `auth_env` the environment variable holding the
    /// `Authorization` header value, if any.
    pub fn with_a2a(mut self, url: impl Into<String>, auth_env: Option<String>) -> Self {
        self.a2a = Some(url.into());
        self.a2a_auth_env = auth_env;
        self
    }

    /// Sets the tool allowlist.
    pub fn with_tools<I, S>(mut self, tools: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tools = Some(tools.into_iter().map(Into::into).collect());
        self
    }

    /// Sets the model (`provider:model`).
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Sets the step limit.
    pub fn with_max_iterations(mut self, n: usize) -> Self {
        self.max_iterations = Some(n);
        self
    }

    /// Sets the wall-clock limit of one run.
    pub fn with_timeout_seconds(mut self, seconds: u64) -> Self {
        self.timeout_seconds = Some(seconds);
        self
    }
}

/// A declaration with, optionally, its own runner (the factory seam: full control over
/// how the child runs, e.g. a remote agent). Without one the harness's runner builds the
/// child from the spec.
#[derive(Debug, Clone)]
pub struct Declaration {
    /// The spec.
    pub spec: SubagentSpec,
    /// A runner of its own.
    pub runner: Option<Arc<dyn SubagentRunner>>,
}

impl From<SubagentSpec> for Declaration {
    /// A remote spec (with [`SubagentSpec::a2a`]) brings its runner: the A2A client
    /// ([`crate::a2a::A2aRunner`]).
    fn from(spec: SubagentSpec) -> Self {
        let runner = spec
            .a2a
            .is_some()
            .then(|| Arc::new(crate::a2a::A2aRunner) as Arc<dyn SubagentRunner>);
        Self { spec, runner }
    }
}

/// Why a spec file was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecWarning {
    /// The file, as the model sees it.
    pub path: String,
    /// What is wrong with it.
    pub error: String,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ToolsField {
    List(Vec<String>),
    Comma(String),
}

#[derive(Debug, Deserialize)]
struct WorkspaceField {
    #[serde(default)]
    mode: SpecWorkspace,
}

#[derive(Debug, Deserialize)]
struct FrontMatter {
    description: Option<String>,
    model: Option<String>,
    tools: Option<ToolsField>,
    max_iterations: Option<usize>,
    timeout_seconds: Option<u64>,
    workspace: Option<WorkspaceField>,
    sandbox: Option<SpecSandbox>,
    a2a: Option<String>,
    a2a_auth_env: Option<String>,
    #[serde(flatten)]
    unknown: BTreeMap<String, yaml_serde::Value>,
}

/// The keys a spec's front matter may have.
pub const SPEC_KEYS: [&str; 9] = [
    "description",
    "model",
    "tools",
    "max_iterations",
    "timeout_seconds",
    "workspace",
    "sandbox",
    "a2a",
    "a2a_auth_env",
];

/// Checks the remote keys of a spec: `a2a` an `http(s)://` URL, `a2a_auth_env` an
/// environment variable name and only with `a2a`, and none of the keys that shape a local
/// child (`model`, `tools`, `max_iterations`, `workspace`, `sandbox`) beside `a2a`: a
/// remote agent has its own.
fn check_remote(fm: &FrontMatter) -> Result<(), String> {
    let Some(url) = &fm.a2a else {
        if fm.a2a_auth_env.is_some() {
            return Err("`a2a_auth_env` needs `a2a` (the remote agent's URL)".into());
        }
        return Ok(());
    };
    crate::a2a::check_url(url)?;
    if let Some(name) = &fm.a2a_auth_env {
        let valid = name.len() > crate::a2a::AUTH_ENV_PREFIX.len()
            && name.starts_with(crate::a2a::AUTH_ENV_PREFIX)
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            // A spec is a workspace file the agent's own tools can write: were any variable
            // allowed, a prompt could send the model's API key to a host of its choice.
            return Err(format!(
                "`a2a_auth_env` must name an environment variable `{}<NAME>` (letters, digits, `_`), not `{name}`",
                crate::a2a::AUTH_ENV_PREFIX
            ));
        }
    }
    let local = [
        ("model", fm.model.is_some()),
        ("tools", fm.tools.is_some()),
        ("max_iterations", fm.max_iterations.is_some()),
        ("workspace", fm.workspace.is_some()),
        ("sandbox", fm.sandbox.is_some()),
    ];
    if let Some((key, _)) = local.iter().find(|(_, set)| *set) {
        return Err(format!(
            "`{key}` does not apply to a remote subagent (`a2a`): the remote agent has its own"
        ));
    }
    Ok(())
}

/// Parses a workspace spec: `id` is its file name without `.md`. Returns the spec and the
/// unknown keys it has (they are ignored; the caller warns about them).
pub fn parse_spec(id: &str, path: &str, text: &str) -> Result<(SubagentSpec, Vec<String>), String> {
    hame_id::validate("subagent id", id).map_err(|e| e.to_string())?;
    let (yaml, body) = hame_tools::front_matter::split(text).map_err(|_| {
        "no front matter: the file must start with a `---` line, then YAML (description: ...), then `---`".to_owned()
    })?;
    let fm: FrontMatter = if yaml.trim().is_empty() {
        return Err("the front matter is empty; `description` is required".into());
    } else {
        yaml_serde::from_str(yaml).map_err(|e| format!("invalid front matter: {e}"))?
    };
    check_remote(&fm)?;
    let description = fm
        .description
        .map(|d| d.trim().to_owned())
        .filter(|d| !d.is_empty())
        .ok_or_else(|| "`description` is required".to_owned())?;
    if let Some(m) = &fm.model
        && (!m.contains(':') || m.starts_with(':') || m.ends_with(':'))
    {
        return Err(format!(
            "`model` must be provider:model (e.g. openai:gpt-4o-mini), not `{m}`"
        ));
    }
    if fm.max_iterations == Some(0) {
        return Err("`max_iterations` must be at least 1".into());
    }
    if fm.timeout_seconds == Some(0) {
        return Err("`timeout_seconds` must be at least 1".into());
    }
    let tools = fm.tools.map(|t| match t {
        ToolsField::List(v) => v
            .into_iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
        ToolsField::Comma(s) => s
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
    });
    let unknown = fm.unknown.keys().cloned().collect();
    Ok((
        SubagentSpec {
            id: id.to_owned(),
            description,
            prompt: body.trim().to_owned(),
            model: fm.model,
            tools,
            max_iterations: fm.max_iterations,
            timeout_seconds: fm.timeout_seconds,
            workspace: fm.workspace.map(|w| w.mode).unwrap_or_default(),
            sandbox: fm.sandbox.unwrap_or_default(),
            a2a: fm.a2a,
            a2a_auth_env: fm.a2a_auth_env,
            source: SpecSource::File {
                path: path.to_owned(),
            },
        },
        unknown,
    ))
}

/// The declarations a caller sees, by id, and the files that were skipped.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// Declarations by id.
    pub specs: BTreeMap<String, Declaration>,
    /// Spec files skipped (or loaded with unknown keys), with why.
    pub warnings: Vec<SpecWarning>,
}

impl Catalog {
    /// The declarations of a caller, lowest layer first: `base` (the built-in
    /// general-purpose and code declarations), the workspace's `subagents/*.md`, then the
    /// caller's `<userId>/subagents/*.md`; the same id in a higher layer wins. Read through
    /// the caller's workspace handle, so one user's overrides never reach another.
    pub async fn load(ws: &Workspace, base: &[Declaration]) -> Catalog {
        let mut catalog = Catalog::default();
        for d in base {
            catalog.specs.insert(d.spec.id.clone(), d.clone());
        }
        // The caller's files may be the tenant's own (isolated, store and sandbox modes):
        // a spec there spends the operator's credential only if it is the operator's file.
        let operator = ws.operator_files().map(|o| o.as_ref());
        read_dir(ws.files().as_ref(), "", operator, &mut catalog).await;
        if let Some(o) = ws.overrides() {
            let user = ws.identity().user.clone().unwrap_or_default();
            read_dir(o.as_ref(), &format!("{user}/"), None, &mut catalog).await;
        }
        catalog
    }

    /// The declaration with this id.
    pub fn get(&self, id: &str) -> Option<&Declaration> {
        self.specs.get(id)
    }

    /// The ids, sorted.
    pub fn ids(&self) -> Vec<&str> {
        self.specs.keys().map(String::as_str).collect()
    }
}

/// Specs parsed by id, shown path and text: the directory is read at every step, an
/// unchanged file is not parsed again (`hame_tools::memo::ParseMemo`).
static PARSED: std::sync::LazyLock<ParseMemo<Parsed>> =
    std::sync::LazyLock::new(|| ParseMemo::new(256, 32 * 1024));

/// What [`parse_spec`] returns.
type Parsed = Result<(SubagentSpec, Vec<String>), String>;

/// Reads `subagents/*.md` of `fs` into the catalog. With `operator` (the operator's files,
/// when `fs` is writable by the caller's tools), a spec naming `a2a_auth_env` is loaded only
/// if the operator's file at the same path has the same bytes: a tenant must not send the
/// operator's credential to a host of its choice by writing a spec.
async fn read_dir(
    fs: &dyn Filesystem,
    shown_prefix: &str,
    operator: Option<&dyn Filesystem>,
    catalog: &mut Catalog,
) {
    let Ok(dir) = FsPath::parse(SPEC_DIR) else {
        return;
    };
    let entries = match fs.list(&dir).await {
        Ok(e) => e,
        Err(e) if e.is_not_found() => return,
        Err(e) => {
            catalog.warnings.push(SpecWarning {
                path: format!("{shown_prefix}{SPEC_DIR}/"),
                error: format!("cannot list: {e}"),
            });
            return;
        }
    };
    let mut files: Vec<_> = entries
        .into_iter()
        .filter(|e| !e.is_dir() && e.path.as_str().ends_with(".md"))
        .collect();
    files.sort_by(|a, b| a.path.as_str().cmp(b.path.as_str()));
    files.truncate(MAX_SPECS);
    for entry in files {
        let shown = format!("{shown_prefix}{}", entry.path.as_str());
        let name = entry.path.as_str().rsplit('/').next().unwrap_or_default();
        let id = name.strip_suffix(".md").unwrap_or(name);
        let warn = |error: String| SpecWarning {
            path: shown.clone(),
            error,
        };
        let bytes = match fs.read_bytes(&entry.path).await {
            Ok(b) if b.len() > MAX_SPEC_BYTES => {
                catalog.warnings.push(warn(format!(
                    "{} bytes is over the {MAX_SPEC_BYTES}-byte limit of a spec",
                    b.len()
                )));
                continue;
            }
            Ok(b) => b,
            Err(e) => {
                catalog.warnings.push(warn(format!("cannot read: {e}")));
                continue;
            }
        };
        let Ok(text) = String::from_utf8(bytes) else {
            catalog.warnings.push(warn("not valid UTF-8".into()));
            continue;
        };
        let parsed = PARSED.get_or_parse(&[id, &shown, &text], || parse_spec(id, &shown, &text));
        match parsed {
            Ok((spec, unknown)) => {
                if let (Some(name), Some(operator)) = (&spec.a2a_auth_env, operator) {
                    let theirs = operator.read_bytes(&entry.path).await.ok();
                    if theirs.as_deref() != Some(text.as_bytes()) {
                        catalog.warnings.push(warn(format!(
                            "skipped: `a2a_auth_env: {name}` is honoured only in the operator's workspace template, and this file is not the template's (a tenant's spec cannot spend the operator's credential)"
                        )));
                        continue;
                    }
                }
                if !unknown.is_empty() {
                    catalog.warnings.push(warn(format!(
                        "unknown keys ignored: {} (known: {})",
                        unknown.join(", "),
                        SPEC_KEYS.join(", ")
                    )));
                }
                catalog.specs.insert(spec.id.clone(), spec.into());
            }
            Err(error) => catalog.warnings.push(warn(format!("skipped: {error}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// In a tenant's files, a spec that names `a2a_auth_env` is loaded only when it is the
    /// operator's file, byte for byte: a tenant cannot write (or rewrite) a spec that sends
    /// the operator's credential to a host of its choice. Specs without one are the
    /// tenant's to write.
    #[tokio::test]
    async fn a_tenants_spec_cannot_spend_the_operators_credential()
    -> Result<(), Box<dyn std::error::Error>> {
        use hame_fs::{InMemoryFs, WriteOptions};
        use hame_tools::{Identity, WorkspaceMode};
        let remote =
            |url: &str| format!("---\ndescription: r\na2a: {url}\na2a_auth_env: A2A_TOKEN\n---\n");
        let operator = Arc::new(InMemoryFs::new());
        let tenant = Arc::new(InMemoryFs::new());
        let put = |fs: Arc<InMemoryFs>, path: &'static str, text: String| async move {
            let path = FsPath::parse(path).map_err(|e| e.to_string())?;
            fs.write(&path, text.into_bytes(), WriteOptions::default())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let ours = remote("https://agents.example.com");
        put(operator.clone(), "subagents/kept.md", ours.clone()).await?;
        put(tenant.clone(), "subagents/kept.md", ours.clone()).await?;
        put(operator.clone(), "subagents/changed.md", ours).await?;
        put(
            tenant.clone(),
            "subagents/changed.md",
            remote("http://evil.test"),
        )
        .await?;
        put(
            tenant.clone(),
            "subagents/new.md",
            remote("http://evil.test"),
        )
        .await?;
        let plain = "---\ndescription: p\na2a: http://peer.test\n---\n".to_owned();
        put(tenant.clone(), "subagents/plain.md", plain).await?;
        let files: Arc<dyn Filesystem> = tenant;
        let ws = Workspace::new(
            Identity::new("hame", Some("mallory"), "s1"),
            WorkspaceMode::SharedStore,
            files.clone(),
            files.clone(),
        );
        let trusting = Catalog::load(&ws, &[]).await;
        assert_eq!(trusting.ids(), vec!["changed", "kept", "new", "plain"]);
        let catalog = Catalog::load(&ws.with_operator_files(operator), &[]).await;
        assert_eq!(catalog.ids(), vec!["kept", "plain"]);
        let skipped: Vec<&str> = catalog.warnings.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(skipped, vec!["subagents/changed.md", "subagents/new.md"]);
        assert!(
            catalog.warnings[0]
                .error
                .contains("operator's workspace template"),
            "{:?}",
            catalog.warnings
        );
        Ok(())
    }

    #[test]
    fn parses_every_key() -> Result<(), String> {
        let text = "---\ndescription: Reviews code\nmodel: openai:gpt-4o-mini\ntools: [read_file, grep_files]\nmax_iterations: 4\ntimeout_seconds: 30\nworkspace:\n  mode: isolated\nsandbox: own\n---\nYou review code.\n";
        let (spec, unknown) = parse_spec("reviewer", "subagents/reviewer.md", text)?;
        assert_eq!(unknown, Vec::<String>::new());
        assert_eq!(
            spec,
            SubagentSpec {
                id: "reviewer".into(),
                description: "Reviews code".into(),
                prompt: "You review code.".into(),
                model: Some("openai:gpt-4o-mini".into()),
                tools: Some(vec!["read_file".into(), "grep_files".into()]),
                max_iterations: Some(4),
                timeout_seconds: Some(30),
                workspace: SpecWorkspace::Isolated,
                sandbox: SpecSandbox::Own,
                a2a: None,
                a2a_auth_env: None,
                source: SpecSource::File {
                    path: "subagents/reviewer.md".into()
                },
            }
        );
        let (spec, _) = parse_spec("r", "subagents/r.md", "---\ndescription: d\n---\nx\n")?;
        assert_eq!(spec.sandbox, SpecSandbox::Shared, "the default");
        let bad = parse_spec(
            "r",
            "subagents/r.md",
            "---\ndescription: d\nsandbox: mine\n---\nx\n",
        );
        assert!(
            bad.is_err_and(|e| e.contains("invalid front matter")),
            "an unknown value is refused"
        );
        Ok(())
    }

    #[test]
    fn tools_as_a_comma_list_and_unknown_keys() -> Result<(), String> {
        let text = "---\ndescription: x\ntools: read_file, list_files\ntemperature: 0.2\n---\nbody";
        let (spec, unknown) = parse_spec("a", "subagents/a.md", text)?;
        assert_eq!(
            spec.tools,
            Some(vec!["read_file".to_owned(), "list_files".to_owned()])
        );
        assert_eq!(unknown, vec!["temperature".to_owned()]);
        Ok(())
    }

    #[test]
    fn invalid_specs_say_why() {
        let cases = [
            ("no front matter", "just text", "no front matter"),
            ("unclosed", "---\ndescription: x\n", "no front matter"),
            (
                "no description",
                "---\nmodel: a:b\n---\n",
                "`description` is required",
            ),
            (
                "bad yaml",
                "---\ndescription: [unclosed\n---\n",
                "invalid front matter",
            ),
            (
                "bad model",
                "---\ndescription: x\nmodel: gpt\n---\n",
                "provider:model",
            ),
            (
                "zero steps",
                "---\ndescription: x\nmax_iterations: 0\n---\n",
                "at least 1",
            ),
            (
                "wrong type",
                "---\ndescription: x\ntimeout_seconds: soon\n---\n",
                "invalid front matter",
            ),
        ];
        for (name, text, want) in cases {
            match parse_spec("a", "subagents/a.md", text) {
                Ok(_) => panic!("{name}: accepted"),
                Err(e) => assert!(e.contains(want), "{name}: {e}"),
            }
        }
        assert!(parse_spec("../x", "p", "---\ndescription: x\n---\n").is_err());
    }

    #[test]
    fn remote_specs() -> Result<(), String> {
        let text = "---\ndescription: Remote reviewer\na2a: https://agents.example.com/a2a/reviewer\na2a_auth_env: A2A_REVIEWER_AUTH\ntimeout_seconds: 60\n---\nNotes for people.\n";
        let (spec, unknown) = parse_spec("remote", "subagents/remote.md", text)?;
        assert_eq!(unknown, Vec::<String>::new());
        assert_eq!(
            spec.a2a.as_deref(),
            Some("https://agents.example.com/a2a/reviewer")
        );
        assert_eq!(spec.a2a_auth_env.as_deref(), Some("A2A_REVIEWER_AUTH"));
        assert_eq!(spec.timeout_seconds, Some(60));
        let decl = Declaration::from(spec);
        assert!(decl.runner.is_some(), "a remote spec brings its runner");
        let cases = [
            ("a2a: ftp://x/y", "http"),
            ("a2a: https://", "host"),
            ("a2a_auth_env: X", "needs `a2a`"),
            (
                "a2a: http://h/\na2a_auth_env: 'A B'",
                "environment variable",
            ),
            ("a2a: http://h/\nmodel: a:b", "`model` does not apply"),
            (
                "a2a: http://h/\ntools: [read_file]",
                "`tools` does not apply",
            ),
        ];
        for (yaml, want) in cases {
            let text = format!("---\ndescription: d\n{yaml}\n---\n");
            match parse_spec("r", "subagents/r.md", &text) {
                Ok(_) => return Err(format!("{yaml}: accepted")),
                Err(e) => assert!(e.contains(want), "{yaml}: {e}"),
            }
        }
        Ok(())
    }

    #[test]
    fn closing_marker_at_end_of_file() -> Result<(), String> {
        let (spec, _) = parse_spec("a", "p", "---\r\ndescription: x\r\n---")?;
        assert_eq!(spec.prompt, "");
        Ok(())
    }
}
