//! The `tools-config` layer: `tools.json` per call (allow/deny over every tool, MCP
//! servers' tools offered and dispatched).

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use hame_core::{
    AgentEvent, CallCtx, EventSink, Layer, ModelNext, ModelRequest, ModelResponse, ToolCall,
    ToolCtx, ToolError, ToolNext, ToolOutcome, ToolSpec, codes,
};
use hame_fs::FsPath;
use hame_mcp::{McpPool, McpTool};
use hame_tools::memo::ParseMemo;
use hame_tools::{Workspace, WorkspaceMode};

use crate::agent::EnvLookup;
use crate::tools_config::{
    MAX_TOOLS_JSON_BYTES, TOOLS_JSON, ToolFilter, ToolsConfig, merge, parse,
};

/// Event kind of an MCP server that could not be started (printed by `hame run`).
pub const MCP_FAILED_EVENT: &str = "mcp.server_failed";
/// Event kind of an MCP tool offered under a name other than `mcp__<server>__<tool>`
/// (a hash suffix was added; printed by `hame run`, once per tool and process).
pub const MCP_RENAMED_EVENT: &str = "mcp.tool_renamed";
/// Event kind of an MCP tool left out because another took its name (printed by `hame
/// run`, once per tool and process).
pub const MCP_DROPPED_EVENT: &str = "mcp.tool_dropped";

/// Name notes remembered to warn once each; past this many the set starts over.
const MAX_NOTED: usize = 4096;

/// Reads `tools.json` for each call as the caller sees it, filters the tools offered and
/// run by `allow`/`deny`, and offers and runs the tools of its MCP servers as
/// `mcp__<server>__<tool>` (ADR 0006). It sits innermost, below every other layer, so
/// the permission and audit layers above see MCP calls like any other.
#[derive(Debug)]
pub struct ToolsConfigLayer {
    env: EnvLookup,
    workspace: PathBuf,
    pool: Arc<McpPool>,
    /// The agent's deferred tools: an explicit `allow` list offers those it names.
    deferred: std::sync::OnceLock<Arc<crate::catalog::Catalog>>,
    /// Sandbox mode: the host's template, where `tools.json` is read instead of the
    /// caller's files (the sandbox's `/workspace`, which the agent's commands can write).
    host: Option<Arc<dyn hame_fs::Filesystem>>,
    /// Parsed files and compiled filters, by content (see [`Memo`]).
    memo: Memo,
    /// Renamed and dropped MCP tools already reported ([`hame_mcp::names::NameNote::key`]).
    noted: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The configuration of each running step, by (call id, step): `tools.json` is read
    /// once per step, by the model request, and its tool calls and the permission layer
    /// use that reading (issue #34: one read per step, an edit shows at the next step).
    steps: std::sync::Mutex<std::collections::HashMap<(String, usize), Arc<ToolsConfig>>>,
}

/// Steps whose configuration [`ToolsConfigLayer`] keeps at most; past this it starts over.
const STEP_ENTRIES: usize = 1_024;

/// Entries a [`Memo`] keeps of each kind; past this many it starts over.
const MEMO_ENTRIES: usize = 32;

/// Texts longer than this are parsed every time (the memo holds at most
/// `MEMO_ENTRIES` x this much text).
const MEMO_MAX_TEXT: usize = 64 * 1024;

/// What `tools.json` parses to, by its name and text, and the filters its `allow`/`deny`
/// lists compile to. The file is still read once per step (`load_step`; an edit applies
/// at the next one); only parsing and compiling an unchanged text again is saved (~10 µs
/// each, measured in release). A text with `${VAR}` is parsed every time (the variables'
/// values may change), and so is a text over [`MEMO_MAX_TEXT`].
#[derive(Debug)]
struct Memo {
    parsed: ParseMemo<Result<ToolsConfig, String>>,
    filters: ParseMemo<Result<Arc<ToolFilter>, String>>,
}

impl Default for Memo {
    fn default() -> Self {
        Self {
            parsed: ParseMemo::new(MEMO_ENTRIES, MEMO_MAX_TEXT),
            filters: ParseMemo::new(MEMO_ENTRIES, MEMO_MAX_TEXT),
        }
    }
}

impl ToolsConfigLayer {
    /// A layer; `env` resolves `${VAR}`, `workspace` is the directory relative `cwd`s of
    /// stdio servers start from, `pool` holds the connections.
    pub fn new(env: EnvLookup, workspace: PathBuf, pool: Arc<McpPool>) -> Self {
        Self {
            env,
            workspace,
            pool,
            deferred: std::sync::OnceLock::new(),
            host: None,
            memo: Memo::default(),
            noted: Default::default(),
            steps: std::sync::Mutex::default(),
        }
    }

    /// [`parse`], remembered by text ([`Memo`]).
    fn parse(&self, name: &str, text: &str) -> Result<ToolsConfig, String> {
        let env = |k: &str| self.env.get(k);
        let parse = || parse(name, text, &env, &self.workspace);
        if text.contains("${") {
            return parse();
        }
        self.memo.parsed.get_or_parse(&[name, text], parse)
    }

    /// [`ToolFilter::new`], remembered by `allow`/`deny`.
    fn filter(&self, config: &ToolsConfig) -> Result<Arc<ToolFilter>, String> {
        let allow = config.allow.as_deref().unwrap_or_default();
        // The count keeps `allow` and `deny` apart; `None` and `[]` filter alike.
        let count = allow.len().to_string();
        let mut key: Vec<&str> = vec![&count];
        key.extend(allow.iter().chain(&config.deny).map(String::as_str));
        self.memo
            .filters
            .get_or_parse(&key, || ToolFilter::new(config).map(Arc::new))
    }

    /// Why a call of `name` is refused whatever the permission rules say: `tools.json`'s
    /// allow/deny (or a broken list), a subagent's tool allowlist. The permission layer asks
    /// this before it would ask a human about the call, and this layer before it runs it.
    pub(crate) fn refusal(
        &self,
        config: &ToolsConfig,
        runtime: &hame_core::RuntimeContext,
        name: &str,
    ) -> Option<ToolError> {
        let filter = match self.filter(config) {
            Ok(f) => f,
            Err(e) => return Some(ToolError::new(codes::FAILED, e)),
        };
        if !filter.permits(name) {
            return Some(ToolError::new(
                codes::DENIED,
                format!("`{name}` is not allowed by tools.json (allow/deny)"),
            ));
        }
        let allow = hame_subagent::tool_allowlist(runtime)?;
        (!allow.iter().any(|a| a == name)).then(|| {
            ToolError::new(
                codes::UNKNOWN_TOOL,
                format!(
                    "`{name}` is not among this subagent's tools ({})",
                    allow.join(", ")
                ),
            )
        })
    }

    /// The agent's deferred tools (set once, when the agent is built).
    pub(crate) fn set_deferred(&self, catalog: Arc<crate::catalog::Catalog>) {
        let _ = self.deferred.set(catalog);
    }

    /// Sandbox mode: read `tools.json` from the host's `template` (as the caller sees it,
    /// its `<userId>/tools.json` merged over), never from the sandbox, whose copy the
    /// agent's commands can rewrite to lift a deny or start a host command (a stdio MCP
    /// server) — ADR 0006.
    pub fn with_sandbox_host(mut self, template: Arc<dyn hame_fs::Filesystem>) -> Self {
        self.host = Some(template);
        self
    }

    /// The caller's `tools.json`: `tools.json` of its files (in the isolated modes its
    /// namespace over the template), with `<userId>/tools.json` of the template merged
    /// over it ([`merge`]). No file is an empty configuration; a broken file is an error
    /// line naming it.
    ///
    /// The secrets its `${VAR}`s put where credentials go are registered in the process's
    /// redaction registry (`hame_core::secrets`) before anything uses them.
    pub async fn load(&self, ws: &Workspace) -> Result<ToolsConfig, String> {
        self.load_from(ws, None).await
    }

    /// [`load`](Self::load) with the sandbox host read through `host` (the step's
    /// snapshot view of it) instead of the template itself.
    async fn load_from(
        &self,
        ws: &Workspace,
        host: Option<&Arc<dyn hame_fs::Filesystem>>,
    ) -> Result<ToolsConfig, String> {
        let config = self.read_config(ws, host).await?;
        hame_core::secrets::add_all(&config.secrets);
        Ok(config)
    }

    /// [`load`](Self::load) once per step of a call, from the step's snapshot (the
    /// caller's view `ws` and, in sandbox mode, the snapshot's view of the host template):
    /// the first caller of a step reads the file, the others of that step get its
    /// reading. Without a call id (outside a call) it reads.
    pub(crate) async fn load_step(
        &self,
        ws: &Workspace,
        extensions: &hame_core::Extensions,
        call: Option<&str>,
        step: usize,
    ) -> Result<Arc<ToolsConfig>, String> {
        let snapshot = extensions
            .get::<Arc<hame_tools::snapshot::StepSnapshot>>()
            .and_then(|s| s.get(step));
        let host = snapshot.as_ref().and_then(|s| s.host());
        let Some(call) = call else {
            return self.load_from(ws, host).await.map(Arc::new);
        };
        let key = (call.to_owned(), step);
        if let Some(c) = self.steps.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(c);
        }
        let config = Arc::new(self.load_from(ws, host).await?);
        if let Ok(mut m) = self.steps.lock() {
            // This call's earlier steps are over.
            m.retain(|(c, s), _| c != call || *s >= step);
            if m.len() >= STEP_ENTRIES {
                m.clear();
            }
            m.insert(key, config.clone());
        }
        Ok(config)
    }

    async fn read_config(
        &self,
        ws: &Workspace,
        host_view: Option<&Arc<dyn hame_fs::Filesystem>>,
    ) -> Result<ToolsConfig, String> {
        let files = match (&self.host, ws.mode()) {
            (Some(host), WorkspaceMode::Sandbox) => host_view.unwrap_or(host),
            _ => ws.files(),
        };
        let shared = match read(files.as_ref(), TOOLS_JSON).await? {
            Some(text) => self.parse(TOOLS_JSON, &text)?,
            None => ToolsConfig::default(),
        };
        let (Some(o), Some(user)) = (ws.overrides(), ws.identity().user.as_deref()) else {
            return Ok(shared);
        };
        match read(o.as_ref(), TOOLS_JSON).await? {
            Some(text) => {
                let name = format!("{user}/{TOOLS_JSON}");
                Ok(merge(shared, self.parse(&name, &text)?))
            }
            None => Ok(shared),
        }
    }

    /// The MCP tools `config` offers (servers started as needed; each failed start is
    /// reported on `events` as [`MCP_FAILED_EVENT`] and its tools are left out), one per
    /// name ([`hame_mcp::names::dedupe`]: a tool offered under a changed name is reported
    /// once as [`MCP_RENAMED_EVENT`], one left out as [`MCP_DROPPED_EVENT`]). Each tool
    /// keeps its `readOnlyHint`.
    pub async fn mcp_tools(&self, config: &ToolsConfig, events: &EventSink) -> Vec<McpTool> {
        let lists = futures::future::join_all(config.mcp_servers.values().map(|s| async move {
            match self.pool.get(&s.server, &s.options).await {
                Ok(client) => client.tools().await.map_err(|e| (e, true)),
                Err(e) => Err(e),
            }
        }))
        .await;
        let mut out = Vec::new();
        for (name, listed) in config.mcp_servers.keys().zip(lists) {
            match listed {
                Ok(tools) => out.extend(tools),
                Err((e, fresh)) => {
                    if fresh {
                        let error = hame_core::secrets::redact(&e.to_string()).into_owned();
                        tracing::warn!(server = %name, %error, "MCP server unavailable");
                        events.emit(AgentEvent::Custom {
                            kind: MCP_FAILED_EVENT.into(),
                            data: serde_json::json!({
                                "path": format!("mcpServers.{name}"),
                                "error": format!("{error}; running without its tools"),
                            }),
                        });
                    }
                }
            }
        }
        let (out, notes) = hame_mcp::names::dedupe(out);
        for note in notes {
            self.note(&note, events);
        }
        out
    }

    /// Reports `note` once per process (log and event).
    fn note(&self, note: &hame_mcp::names::NameNote, events: &EventSink) {
        use hame_mcp::names::NameNote;
        {
            let Ok(mut noted) = self.noted.lock() else {
                return;
            };
            if noted.len() >= MAX_NOTED {
                noted.clear();
            }
            if !noted.insert(note.key()) {
                return;
            }
        }
        let kind = match note {
            NameNote::Renamed { .. } => MCP_RENAMED_EVENT,
            _ => MCP_DROPPED_EVENT,
        };
        let message = note.to_string();
        tracing::warn!(server = %note.server(), tool = %note.tool(), "{message}");
        events.emit(AgentEvent::Custom {
            kind: kind.into(),
            data: serde_json::json!({
                "path": format!("mcpServers.{}", note.server()),
                "error": message,
            }),
        });
    }
}

async fn read(fs: &dyn hame_fs::Filesystem, path: &str) -> Result<Option<String>, String> {
    let p = FsPath::parse(path).map_err(|e| format!("{path}: {e}"))?;
    match fs.read_bytes(&p).await {
        Ok(b) if b.len() > MAX_TOOLS_JSON_BYTES => {
            Err(format!("{path}: larger than {MAX_TOOLS_JSON_BYTES} bytes"))
        }
        Ok(b) => String::from_utf8(b)
            .map(Some)
            .map_err(|_| format!("{path}: not valid UTF-8")),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(format!("{path}: cannot be read: {e}")),
    }
}

/// Why the layer failed a call: `tools.json` is broken (a configuration error).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ToolsConfigError(pub String);

#[async_trait]
impl Layer for ToolsConfigLayer {
    fn name(&self) -> &str {
        "tools-config"
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        mut request: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse, hame_core::Error> {
        let Some(ws) = hame_tools::snapshot::config_view(cx.extensions, cx.iteration) else {
            return next.run(cx, request).await;
        };
        let config = self
            .load_step(&ws, cx.extensions, cx.runtime.call_id(), cx.iteration)
            .await
            .map_err(|e| hame_core::Error::layer(self.name(), ToolsConfigError(e)))?;
        let filter = self
            .filter(&config)
            .map_err(|e| hame_core::Error::layer(self.name(), ToolsConfigError(e)))?;
        let mcp = self.mcp_tools(&config, cx.events).await;
        for tool in mcp {
            if request.tools.iter().any(|t| t.name == tool.qualified) {
                continue;
            }
            request.tools.push(ToolSpec {
                name: tool.qualified,
                description: tool.description,
                parameters: tool.input_schema.into(),
            });
        }
        // An explicit allow list is the offered set: the deferred tools it names are
        // offered too.
        if config.allow.as_ref().is_some_and(|a| !a.is_empty())
            && let Some(catalog) = self.deferred.get()
        {
            for spec in catalog.specs() {
                if catalog.permitted(cx.runtime, &spec.name)
                    && !request.tools.iter().any(|t| t.name == spec.name)
                {
                    request.tools.push(spec.clone());
                }
            }
        }
        request.tools.retain(|t| filter.permits(&t.name));
        // A subagent's spec allowlist covers the tools offered here (MCP) as well.
        if let Some(allow) = hame_subagent::tool_allowlist(cx.runtime) {
            request.tools.retain(|t| allow.iter().any(|a| a == &t.name));
        }
        next.run(cx, request).await
    }

    async fn tool(&self, cx: &ToolCtx<'_>, call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        let Some(ws) = hame_tools::snapshot::config_view(&cx.tool.extensions, cx.iteration) else {
            return next.run(cx, call).await;
        };
        let done = |r: Result<String, ToolError>| ToolOutcome::Done(r);
        let config = match self
            .load_step(
                &ws,
                &cx.tool.extensions,
                cx.tool.runtime.call_id(),
                cx.iteration,
            )
            .await
        {
            Ok(c) => c,
            Err(e) => return done(Err(ToolError::new(codes::FAILED, e))),
        };
        if let Some(e) = self.refusal(&config, &cx.tool.runtime, &call.name) {
            return done(Err(e));
        }
        if !call.name.starts_with("mcp__") {
            return next.run(cx, call).await;
        }
        let tools = self.mcp_tools(&config, cx.events).await;
        let Some(tool) = tools.iter().find(|t| t.qualified == call.name) else {
            return next.run(cx, call).await;
        };
        let args: serde_json::Value =
            match serde_json::from_str(if call.arguments.trim().is_empty() {
                "{}"
            } else {
                &call.arguments
            }) {
                Ok(v) => v,
                Err(e) => {
                    return done(Err(ToolError::invalid_arguments(format!(
                        "arguments are not valid JSON: {e}"
                    ))));
                }
            };
        let Some(server) = config.mcp_servers.get(&tool.server) else {
            return next.run(cx, call).await;
        };
        let client = match self.pool.get(&server.server, &server.options).await {
            Ok(c) => c,
            Err((e, _)) => return done(Err(ToolError::new(codes::FAILED, e.to_string()))),
        };
        let result = tokio::select! {
            r = client.call(&tool.name, args) => r,
            _ = cx.tool.cancel.cancelled() => {
                return done(Err(ToolError::new(codes::CANCELLED, "the call was cancelled")));
            }
        };
        // The observation's facts (ADR 0035): which server and tool, and the server's flag.
        let facts = cx.tool.facts();
        facts.set("server", tool.server.clone());
        facts.set("mcp_tool", tool.name.clone());
        if let Ok(r) = &result {
            facts.set("is_error", r.is_error);
        }
        match result {
            Ok(r) if r.is_error => done(Err(ToolError::new(codes::FAILED, r.text))),
            Ok(r) => done(Ok(r.text)),
            Err(hame_mcp::Error::Timeout { .. }) => done(Err(ToolError::new(
                codes::TIMEOUT,
                format!("MCP server `{}` did not answer in time", tool.server),
            ))),
            Err(e) => done(Err(ToolError::new(codes::FAILED, e.to_string()))),
        }
    }
}
