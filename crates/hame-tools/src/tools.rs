//! The file tools the model calls: `read_file`, `write_file`, `edit_file`, `grep_files`,
//! `glob_files`, `list_files` and, with an [`Execute`] capability, `execute`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hame_core::{Tool, ToolContext, ToolError, ToolOutput, TypedTool, typed};
use hame_fs::{
    EditRequest, ExecRequest, Execute, Filesystem, FsPath, GlobRequest, GrepRequest, ReadWindow,
    Version, WriteOptions, codes,
};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::error::ToToolError;
use crate::workspace::{Workspace, WorkspaceExt};

/// `?` for storage results inside a tool: the error becomes a [`ToolError`] with its code.
trait OrToolError<T> {
    fn or_tool(self) -> Result<T, ToolError>;
}

impl<T> OrToolError<T> for hame_fs::Result<T> {
    fn or_tool(self) -> Result<T, ToolError> {
        self.map_err(|e| e.to_tool_error())
    }
}

/// Limits and defaults of the file tools.
#[derive(Debug, Clone)]
pub struct FsToolOptions {
    /// Lines `read_file` returns when no `limit` is given. Default 2000.
    pub read_default_lines: usize,
    /// Longer lines are cut and marked. Default 2000 characters.
    pub max_line_chars: usize,
    /// `read_file` stops adding lines past this many characters. Default 100,000.
    pub max_read_chars: usize,
    /// Matches `grep_files` shows. Default 200.
    pub grep_max_results: usize,
    /// Files `glob_files` shows. Default 500.
    pub glob_max_results: usize,
    /// Entries `list_files` shows. Default 1000.
    pub list_max_entries: usize,
    /// `write_file` refuses to replace a file this session has not read (or that changed
    /// since). Default `true`.
    pub require_read_before_overwrite: bool,
    /// Sessions whose reads are remembered (oldest forgotten first). Default 1024.
    pub max_tracked_sessions: usize,
    /// Paths remembered per session. Default 4096.
    pub max_tracked_paths: usize,
    /// Registers `execute` when set.
    pub executor: Option<Arc<dyn Execute>>,
}

impl Default for FsToolOptions {
    fn default() -> Self {
        FsToolOptions {
            read_default_lines: 2000,
            max_line_chars: 2000,
            max_read_chars: 100_000,
            grep_max_results: 200,
            glob_max_results: 500,
            list_max_entries: 1000,
            require_read_before_overwrite: true,
            max_tracked_sessions: 1024,
            max_tracked_paths: 4096,
            executor: None,
        }
    }
}

#[derive(Debug, Default)]
struct ReadTracker {
    tick: u64,
    sessions: HashMap<String, (u64, HashMap<FsPath, Seen>)>,
}

/// What a session saw of a file it read: its content version, or — when `read_file` read
/// only a window of a large file — its size and modification time.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Version(Version),
    Stamp(u64, Option<chrono::DateTime<chrono::Utc>>),
}

/// Files up to this size are read whole by `read_file` (one read: its version and line
/// count come with it); a larger file is read in ranges only up to the window it returns.
pub const READ_WHOLE_MAX_BYTES: u64 = 256 * 1024;
/// The size of each range a windowed `read_file` reads.
const READ_CHUNK_BYTES: u64 = 256 * 1024;

#[derive(Debug)]
struct Shared {
    /// The files used when a call carries no workspace handle (standalone use); `None`:
    /// such a call is refused.
    fs: Option<Arc<dyn Filesystem>>,
    opts: FsToolOptions,
    reads: Mutex<ReadTracker>,
}

impl Shared {
    /// The caller's files: those of its workspace handle, else the tools' own.
    fn fs(&self, ctx: &ToolContext) -> Result<Arc<dyn Filesystem>, ToolError> {
        match (ctx.extensions.get::<Workspace>(), &self.fs) {
            (Some(ws), _) => Ok(ws.files().clone()),
            (None, Some(fs)) => Ok(fs.clone()),
            (None, None) => ctx.workspace().map(|ws| ws.files().clone()),
        }
    }

    fn session_key(ctx: &ToolContext) -> String {
        format!(
            "{}\u{0}{}",
            ctx.runtime.user_id.as_deref().unwrap_or(""),
            ctx.runtime.session_id
        )
    }

    fn tracker(&self) -> std::sync::MutexGuard<'_, ReadTracker> {
        // Only a cache of versions: a poisoned tracker is still usable.
        self.reads.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, ctx: &ToolContext, path: &FsPath, version: Version) {
        self.record_seen(ctx, path, Seen::Version(version));
    }

    fn record_seen(&self, ctx: &ToolContext, path: &FsPath, version: Seen) {
        let key = Self::session_key(ctx);
        let mut t = self.tracker();
        t.tick += 1;
        let tick = t.tick;
        if !t.sessions.contains_key(&key)
            && t.sessions.len() >= self.opts.max_tracked_sessions
            && let Some(oldest) = t
                .sessions
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(k, _)| k.clone())
        {
            t.sessions.remove(&oldest);
        }
        let entry = t.sessions.entry(key).or_default();
        entry.0 = tick;
        if !entry.1.contains_key(path)
            && entry.1.len() >= self.opts.max_tracked_paths
            && let Some(k) = entry.1.keys().next().cloned()
        {
            entry.1.remove(&k);
        }
        entry.1.insert(path.clone(), version);
    }

    fn read_version(&self, ctx: &ToolContext, path: &FsPath) -> Option<Seen> {
        let t = self.tracker();
        t.sessions
            .get(&Self::session_key(ctx))
            .and_then(|(_, m)| m.get(path).cloned())
    }
}

impl Shared {
    /// The version of `path` before a change, for the call's facts: the version this session
    /// read, else the file's own (`None`: no such file, or it cannot be read).
    async fn version_before(
        &self,
        ctx: &ToolContext,
        fs: &Arc<dyn Filesystem>,
        path: &FsPath,
    ) -> Option<Version> {
        if let Some(Seen::Version(v)) = self.read_version(ctx, path) {
            return Some(v);
        }
        fs.read_bytes(path).await.ok().map(|b| Version::of(&b))
    }
}

/// The facts of a change to one file: its path and its content hash before and after.
fn file_facts(ctx: &ToolContext, path: &FsPath, before: Option<Version>, after: &Version) {
    let facts = ctx.facts();
    facts.set("path", path.as_str().to_owned());
    facts.set("hash_before", before.map(|v| v.as_str().to_owned()));
    facts.set("hash_after", after.as_str().to_owned());
}

fn parse_path(s: &str) -> Result<FsPath, ToolError> {
    FsPath::parse(s).or_tool()
}

fn cut(line: &str, max: usize) -> String {
    match line.char_indices().nth(max) {
        Some((i, _)) => format!("{}… [line truncated]", &line[..i]),
        None => line.to_owned(),
    }
}

/// The file tools over `fs` for calls without a workspace handle (standalone use; a call
/// that carries a handle works on the handle's files). `execute` is included only when
/// `options.executor` is set.
pub fn fs_tools(fs: Arc<dyn Filesystem>, options: FsToolOptions) -> Vec<Arc<dyn Tool>> {
    build(Some(fs), options, false)
}

/// The file tools over the caller's [`Workspace`] handle, the way the harness registers
/// them: every call works on `ctx.workspace()?.files()`, and `execute` (registered when
/// `execute` is true) on its shell; a call without a handle is refused.
pub fn workspace_tools(options: FsToolOptions, execute: bool) -> Vec<Arc<dyn Tool>> {
    build(None, options, execute)
}

fn build(
    fs: Option<Arc<dyn Filesystem>>,
    options: FsToolOptions,
    execute: bool,
) -> Vec<Arc<dyn Tool>> {
    let executor = options.executor.clone();
    let with_execute = execute || executor.is_some();
    let shared = Arc::new(Shared {
        fs,
        opts: options,
        reads: Mutex::new(ReadTracker::default()),
    });
    let mut tools = vec![
        typed(ReadFile(shared.clone())),
        typed(WriteFile(shared.clone())),
        typed(EditFile(shared.clone())),
        typed(GrepFiles(shared.clone())),
        typed(GlobFiles(shared.clone())),
        typed(ListFiles(shared)),
    ];
    if with_execute {
        tools.push(typed(ExecuteTool(executor)));
    }
    tools
}

/// The file tools over a filesystem that can also execute: `execute` runs on `fs` itself.
pub fn fs_tools_with_execute<F: Filesystem + Execute>(
    fs: Arc<F>,
    mut options: FsToolOptions,
) -> Vec<Arc<dyn Tool>> {
    options.executor = Some(fs.clone());
    fs_tools(fs, options)
}

#[derive(Debug)]
struct ReadFile(Arc<Shared>);

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadFileArgs {
    /// Path from the workspace root.
    file_path: String,
    /// First line, 1-based.
    #[serde(default)]
    offset: Option<usize>,
    /// Number of lines.
    #[serde(default)]
    limit: Option<usize>,
}

#[async_trait]
impl TypedTool for ReadFile {
    type Args = ReadFileArgs;
    fn name(&self) -> &str {
        "read_file"
    }
    fn description(&self) -> String {
        format!(
            "Read a text file as numbered lines ({} from `offset` by default; page with offset/limit).",
            self.0.opts.read_default_lines
        )
    }
    async fn run(&self, args: ReadFileArgs, ctx: &ToolContext) -> ToolOutput {
        let fs = self.0.fs(ctx)?;
        let path = parse_path(&args.file_path)?;
        let start = args.offset.unwrap_or(1).max(1);
        let limit = args.limit.unwrap_or(self.0.opts.read_default_lines).max(1);
        // The first range: the whole file when it is small (its version and line count
        // come with it), else the start of the window scan.
        let head = fs
            .read_range(&path, 0, READ_WHOLE_MAX_BYTES + 1)
            .await
            .or_tool()?;
        let w = if head.len() as u64 <= READ_WHOLE_MAX_BYTES {
            let w = hame_fs::generic::text_window(
                &path,
                &head,
                ReadWindow {
                    offset: start - 1,
                    limit: Some(limit),
                },
            )
            .or_tool()?;
            self.0.record(ctx, &path, w.version.clone());
            Window {
                text: w.text,
                lines: w.lines,
                total_lines: Some(w.total_lines),
                size: w.size,
            }
        } else {
            let info = fs.stat(&path).await.or_tool()?;
            // As a whole read would say (its test looks at the start of the file).
            // (A character cut at the end of the range is not an encoding error.)
            let whole = match std::str::from_utf8(&head) {
                Err(e) if e.error_len().is_none() => e.valid_up_to(),
                _ => head.len(),
            };
            if hame_fs::generic::is_binary(&head[..whole]) {
                return Err(hame_fs::Error::Binary {
                    path: path.to_string(),
                    size: info.size,
                })
                .or_tool();
            }
            let w = scan_window(
                fs.as_ref(),
                &path,
                head,
                (start - 1, limit),
                self.0.opts.max_read_chars,
            )
            .await
            .or_tool()?;
            self.0
                .record_seen(ctx, &path, Seen::Stamp(info.size, info.modified));
            Window {
                size: info.size,
                ..w
            }
        };
        if w.total_lines == Some(0) {
            return Ok(format!("{path} is empty."));
        }
        if w.lines == 0 {
            return Ok(match w.total_lines {
                Some(n) => format!("{path} has {n} lines; offset {start} is past the end."),
                None => format!("{path}: offset {start} is past the end."),
            });
        }
        let mut out = String::new();
        let mut shown = 0;
        for (i, line) in w.text.split_inclusive('\n').enumerate() {
            let line = line.trim_end_matches('\n').trim_end_matches('\r');
            let entry = format!(
                "{:>6}\t{}\n",
                start + i,
                cut(line, self.0.opts.max_line_chars)
            );
            if out.len() + entry.len() > self.0.opts.max_read_chars && shown > 0 {
                break;
            }
            out.push_str(&entry);
            shown += 1;
        }
        let last = start + shown - 1;
        match w.total_lines {
            Some(total) if last < total => {
                let _ = write!(
                    out,
                    "[showing lines {start}-{last} of {total}; call read_file with offset={} to continue]",
                    last + 1
                );
            }
            Some(_) => {}
            None => {
                let _ = write!(
                    out,
                    "[showing lines {start}-{last} of a {} byte file; call read_file with offset={} to continue]",
                    w.size,
                    last + 1
                );
            }
        }
        Ok(out)
    }
}

/// The lines a `read_file` returns.
#[derive(Debug)]
struct Window {
    text: String,
    lines: usize,
    /// Known when the read reached the end of the file.
    total_lines: Option<usize>,
    size: u64,
}

/// Reads the lines `[first, first + limit)` of a large file in ranges of
/// [`READ_CHUNK_BYTES`], starting with `head` (its first bytes), and stops once it has
/// them, or more than `max_chars` of them (the tool shows no more), or at the end of the
/// file. A line longer than `max_chars` is kept only up to that many bytes.
async fn scan_window(
    fs: &dyn Filesystem,
    path: &FsPath,
    head: Vec<u8>,
    (first, limit): (usize, usize),
    max_chars: usize,
) -> hame_fs::Result<Window> {
    let mut text: Vec<u8> = Vec::new();
    let mut line = 0usize;
    let mut lines = 0usize;
    let mut pos = head.len() as u64;
    let mut chunk = head;
    let end = first.saturating_add(limit);
    let mut line_bytes = 0usize;
    loop {
        let eof = chunk.is_empty();
        for &b in &chunk {
            if line >= first && line < end && line_bytes < max_chars.saturating_add(4) {
                text.push(b);
            }
            line_bytes += 1;
            if b == b'\n' {
                if line >= first && line < end {
                    lines += 1;
                }
                line += 1;
                line_bytes = 0;
                if line >= end || text.len() > max_chars {
                    return Ok(Window {
                        text: String::from_utf8_lossy(&text).into_owned(),
                        lines,
                        total_lines: None,
                        size: 0,
                    });
                }
            }
        }
        if eof {
            // A last line without a newline counts.
            let total = if line_bytes > 0 { line + 1 } else { line };
            if line_bytes > 0 && line >= first && line < end {
                lines += 1;
            }
            return Ok(Window {
                text: String::from_utf8_lossy(&text).into_owned(),
                lines,
                total_lines: Some(total),
                size: 0,
            });
        }
        chunk = fs.read_range(path, pos, READ_CHUNK_BYTES).await?;
        pos += chunk.len() as u64;
    }
}

#[derive(Debug)]
struct WriteFile(Arc<Shared>);

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteFileArgs {
    /// Path from the workspace root.
    file_path: String,
    /// The whole content.
    content: String,
}

#[async_trait]
impl TypedTool for WriteFile {
    type Args = WriteFileArgs;
    fn name(&self) -> &str {
        "write_file"
    }
    fn description(&self) -> String {
        "Create or overwrite a file (folders are created). Read a file before replacing it; prefer edit_file for changes.".into()
    }
    async fn run(&self, args: WriteFileArgs, ctx: &ToolContext) -> ToolOutput {
        let fs = self.0.fs(ctx)?;
        let path = parse_path(&args.file_path)?;
        let bytes = args.content.into_bytes();
        let len = bytes.len();
        let opts = if !self.0.opts.require_read_before_overwrite {
            WriteOptions::default()
        } else if fs.exists(&path).await.or_tool()? {
            match self.0.read_version(ctx, &path) {
                Some(Seen::Version(v)) => WriteOptions::if_match(v),
                // Read in a window: unchanged since when its size and time are; then the
                // write is compared against the content as it is now.
                Some(Seen::Stamp(size, modified)) => {
                    let now = fs.stat(&path).await.or_tool()?;
                    if now.size != size || now.modified != modified || modified.is_none() {
                        return Err(ToolError::new(
                            codes::CONFLICT,
                            format!("{path} changed since it was read; read it again first"),
                        ));
                    }
                    let current = fs.read_bytes(&path).await.or_tool()?;
                    WriteOptions::if_match(Version::of(&current))
                }
                None => {
                    return Err(ToolError::new(
                        codes::CONFLICT,
                        format!(
                            "{path} already exists and has not been read in this session; read it first, or use edit_file"
                        ),
                    ));
                }
            }
        } else {
            WriteOptions::create_new()
        };
        let before = self.0.version_before(ctx, &fs, &path).await;
        let version = fs.write(&path, bytes, opts).await.or_tool()?;
        file_facts(ctx, &path, before, &version);
        self.0.record(ctx, &path, version);
        Ok(format!("Wrote {len} bytes to {path}."))
    }
}

#[derive(Debug)]
struct EditFile(Arc<Shared>);

/// Arguments of `edit_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct EditFileArgs {
    /// Path from the workspace root.
    file_path: String,
    /// Exact text, without line numbers.
    old_string: String,
    /// The replacement.
    new_string: String,
    /// Replace every occurrence.
    #[serde(default)]
    replace_all: bool,
}

#[async_trait]
impl TypedTool for EditFile {
    type Args = EditFileArgs;
    fn name(&self) -> &str {
        "edit_file"
    }
    fn description(&self) -> String {
        "Replace old_string with new_string in a file; old_string must be unique unless replace_all.".into()
    }
    async fn run(&self, args: EditFileArgs, ctx: &ToolContext) -> ToolOutput {
        let fs = self.0.fs(ctx)?;
        let path = parse_path(&args.file_path)?;
        let before = self.0.version_before(ctx, &fs, &path).await;
        let out = fs
            .edit(
                &path,
                &EditRequest {
                    old: args.old_string,
                    new: args.new_string,
                    replace_all: args.replace_all,
                },
            )
            .await
            .or_tool()?;
        file_facts(ctx, &path, before, &out.version);
        self.0.record(ctx, &path, out.version);
        Ok(format!(
            "Edited {path}: {} replacement{}.",
            out.replacements,
            if out.replacements == 1 { "" } else { "s" }
        ))
    }
}

#[derive(Debug)]
struct GrepFiles(Arc<Shared>);

/// Arguments of `grep_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GrepFilesArgs {
    /// Regex (Rust syntax), or text with literal=true.
    pattern: String,
    /// Folder or file; default the root.
    #[serde(default)]
    path: Option<String>,
    /// Only files matching, e.g. `*.rs`.
    #[serde(default)]
    glob: Option<String>,
    /// The pattern is plain text.
    #[serde(default)]
    literal: bool,
    /// Ignore case.
    #[serde(default)]
    case_insensitive: bool,
}

#[async_trait]
impl TypedTool for GrepFiles {
    type Args = GrepFilesArgs;
    fn name(&self) -> &str {
        "grep_files"
    }
    fn description(&self) -> String {
        format!(
            "Search file contents; returns `path:line:text`, at most {} lines.",
            self.0.opts.grep_max_results
        )
    }
    async fn run(&self, args: GrepFilesArgs, ctx: &ToolContext) -> ToolOutput {
        let fs = self.0.fs(ctx)?;
        let path = parse_path(args.path.as_deref().unwrap_or("/"))?;
        let out = fs
            .grep(&GrepRequest {
                pattern: args.pattern,
                literal: args.literal,
                case_insensitive: args.case_insensitive,
                path,
                glob: args.glob,
                max_matches: self.0.opts.grep_max_results,
            })
            .await
            .or_tool()?;
        if out.matches.is_empty() {
            return Ok("No matches.".into());
        }
        let mut s = String::new();
        for m in &out.matches {
            let _ = writeln!(s, "{}:{}:{}", m.path, m.line, cut(&m.text, 500));
        }
        if out.truncated {
            let _ = write!(
                s,
                "[more results not shown (limit {}); narrow the search with path or glob]",
                self.0.opts.grep_max_results
            );
        }
        Ok(s)
    }
}

#[derive(Debug)]
struct GlobFiles(Arc<Shared>);

/// Arguments of `glob_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GlobFilesArgs {
    /// Glob, e.g. `**/*.rs`.
    pattern: String,
    /// Folder; default the root.
    #[serde(default)]
    path: Option<String>,
}

#[async_trait]
impl TypedTool for GlobFiles {
    type Args = GlobFilesArgs;
    fn name(&self) -> &str {
        "glob_files"
    }
    fn description(&self) -> String {
        format!(
            "Find files by glob; returns sorted paths, at most {}.",
            self.0.opts.glob_max_results
        )
    }
    async fn run(&self, args: GlobFilesArgs, ctx: &ToolContext) -> ToolOutput {
        let fs = self.0.fs(ctx)?;
        let path = parse_path(args.path.as_deref().unwrap_or("/"))?;
        let out = fs
            .glob(&GlobRequest {
                pattern: args.pattern,
                path,
                max_results: self.0.opts.glob_max_results,
            })
            .await
            .or_tool()?;
        if out.files.is_empty() {
            return Ok("No files matched.".into());
        }
        let mut s = String::new();
        for f in &out.files {
            let _ = writeln!(s, "{}", f.path);
        }
        if out.truncated {
            let _ = write!(
                s,
                "[more files not shown (limit {}); use a narrower pattern or path]",
                self.0.opts.glob_max_results
            );
        }
        Ok(s)
    }
}

#[derive(Debug)]
struct ListFiles(Arc<Shared>);

/// Arguments of `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListFilesArgs {
    /// Folder; default the root.
    #[serde(default)]
    path: Option<String>,
}

#[async_trait]
impl TypedTool for ListFiles {
    type Args = ListFilesArgs;
    fn name(&self) -> &str {
        "list_files"
    }
    fn description(&self) -> String {
        "List a folder (folders end with `/`, files show their size).".into()
    }
    async fn run(&self, args: ListFilesArgs, ctx: &ToolContext) -> ToolOutput {
        let fs = self.0.fs(ctx)?;
        let path = parse_path(args.path.as_deref().unwrap_or("/"))?;
        let entries = fs.list(&path).await.or_tool()?;
        if entries.is_empty() {
            return Ok(format!("{path} is empty."));
        }
        let mut s = String::new();
        for e in entries.iter().take(self.0.opts.list_max_entries) {
            if e.is_dir() {
                let _ = writeln!(s, "{}/", e.path);
            } else {
                let _ = writeln!(s, "{} ({} bytes)", e.path, e.size);
            }
        }
        if entries.len() > self.0.opts.list_max_entries {
            let _ = write!(
                s,
                "[{} more entries not shown; use glob_files to narrow]",
                entries.len() - self.0.opts.list_max_entries
            );
        }
        Ok(s)
    }
}

/// Runs on the shell of the caller's handle, else on the tools' own executor.
#[derive(Debug)]
struct ExecuteTool(Option<Arc<dyn Execute>>);

/// Arguments of `execute`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ExecuteArgs {
    /// Run with `sh -c`.
    command: String,
    /// Seconds.
    #[serde(default)]
    timeout_secs: Option<u64>,
}

#[async_trait]
impl TypedTool for ExecuteTool {
    type Args = ExecuteArgs;
    fn name(&self) -> &str {
        "execute"
    }
    fn description(&self) -> String {
        "Run a shell command in the workspace root; returns its output and exit code.".into()
    }
    async fn run(&self, args: ExecuteArgs, ctx: &ToolContext) -> ToolOutput {
        if args.command.trim().is_empty() {
            return Err(ToolError::invalid_arguments("command is empty"));
        }
        let req = ExecRequest {
            command: args.command,
            timeout: args.timeout_secs.map(Duration::from_secs),
        };
        let exec = match (ctx.extensions.get::<Workspace>(), &self.0) {
            (Some(ws), _) => ws.exec().cloned(),
            (None, own) => own.clone(),
        }
        .ok_or_else(|| {
            ToolError::new(
                hame_fs::codes::NOT_SUPPORTED,
                "this workspace has no shell: run commands in a mode with one (local mode, or the sandbox)",
            )
        })?;
        let out = tokio::select! {
            r = exec.execute(req) => r.or_tool()?,
            _ = ctx.cancel.cancelled() => return Err(ToolError::new(hame_core::codes::CANCELLED, "the command was cancelled")),
        };
        let facts = ctx.facts();
        facts.set("exit_code", out.exit_code);
        facts.set("signal", out.signal);
        facts.set("timed_out", out.timed_out);
        facts.set("stdout_truncated", out.stdout_truncated);
        facts.set("stderr_truncated", out.stderr_truncated);
        facts.set("stdout_bytes", out.stdout_bytes);
        facts.set("stderr_bytes", out.stderr_bytes);
        let mut s = if out.output.is_empty() {
            "<no output>".to_owned()
        } else {
            out.output
        };
        if out.timed_out {
            s.push_str("\n[timed out: the command and its process group were killed; the output above is what it printed until then; raise timeout_secs if it needs longer]");
        } else {
            match out.exit_code {
                Some(c) => {
                    let _ = write!(s, "\n[exit code {c}]");
                }
                None => s.push_str("\n[killed by a signal]"),
            }
        }
        Ok(s)
    }
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
