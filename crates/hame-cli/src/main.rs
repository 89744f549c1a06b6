//! The `hame` command line.
//!
//! Exit codes: 0 success; 1 the call failed (model error, step limit); 2 usage or
//! configuration error (one line on stderr that says what to set); 3 the call waits for a
//! decision (a tool call was suspended, e.g. for approval); 130 / 143 stopped by SIGINT /
//! SIGTERM (the call is cancelled, what joined the conversation is saved, the session lease
//! is released and the shell's processes are killed before exiting).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use clap::{Args, Parser, Subcommand};

mod secrets;
use futures::StreamExt;
use hame::{
    AgentEvent, CallInput, CancellationToken, EventSink, HarnessAgent, Message, Model,
    RuntimeContext,
};

#[derive(Debug, Parser)]
#[command(name = "hame", version, about = "Run a hame agent against a workspace")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One call: prints the final reply on stdout.
    ///
    /// Modes: by default (local mode) the file tools and the `execute` shell work on the
    /// workspace itself, for one trusted user: the shell runs with your rights and can read
    /// every file you can, including other users' `<userId>/` folders (the file tools of a
    /// caller with --user cannot). For tenants you do not trust, use --isolated (each
    /// tenant its namespace on local disk over the read-only workspace, no shell) or
    /// --store (the same in a shared store). Runtime data of local mode:
    /// agents/<agent>/sessions/<session>.log.jsonl, agents/<agent>/sessions/sessions.json,
    /// memory/YYYY-MM-DD.md, MEMORY.md, large_tool_results/ (under <userId>/ with --user).
    Run {
        #[command(flatten)]
        common: Common,
        /// Print one JSON object {"reply", "session", "usage", ...} instead of the text.
        #[arg(long)]
        json: bool,
        /// The message to send.
        message: String,
    },
    /// Interactive chat: streams tokens and shows each tool call with its duration.
    Chat {
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, Args)]
struct Common {
    /// Workspace directory [default: $HAME_WORKSPACE, else ./.hame/workspace]
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// Agent id.
    #[arg(long, default_value = "hame")]
    agent: String,
    /// User id.
    #[arg(long)]
    user: Option<String>,
    /// Session id.
    #[arg(long, default_value = "default")]
    session: String,
    /// Model as provider:model, e.g. openai:gpt-4o-mini or anthropic:claude-sonnet-4-5 [default: $HAME_MODEL]
    #[arg(long)]
    model: Option<String>,
    /// Maximum reasoning steps per call.
    #[arg(long)]
    max_iterations: Option<usize>,
    /// Shared-store mode: tenant files live in this store (redis://..., s3://bucket/prefix)
    /// over the read-only workspace template; no shell tool.
    #[arg(long)]
    store: Option<String>,
    /// Isolated local mode: each tenant sees only its namespace on local disk over the
    /// read-only workspace template; no shell tool. For several untrusted tenants on one
    /// machine.
    #[arg(long, conflicts_with = "store")]
    isolated: bool,
    /// Which runtime data tenants share (isolated and store modes).
    #[arg(long, value_enum, default_value_t = Isolation::User)]
    isolation: Isolation,
    /// Where session state lives: a directory, redis://, postgres://, mysql:// [default: $HAME_STATE, else JSON files under $HAME_STATE_HOME or ~/.hame/state]
    #[arg(long)]
    state: Option<String>,
    /// Switch off memory and context management (compaction, offloading of large tool
    /// results, daily logs and MEMORY.md consolidation, the memory tools).
    #[arg(long)]
    no_memory: bool,
    /// The memory search index: a SQLite file, or postgres://... for an index shared by
    /// replicas [default: <workspace>/agents/<agent>/.memory-index.sqlite]
    #[arg(long)]
    memory_index: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Isolation {
    Session,
    User,
    Agent,
    Global,
}

impl From<Isolation> for hame::fs::Scope {
    fn from(i: Isolation) -> Self {
        match i {
            Isolation::Session => hame::fs::Scope::Session,
            Isolation::User => hame::fs::Scope::User,
            Isolation::Agent => hame::fs::Scope::Agent,
            Isolation::Global => hame::fs::Scope::Global,
        }
    }
}

/// The call stopped with this exit code (a signal, a suspension); its message is printed.
#[derive(Debug)]
struct Stopped(u8, String);

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.1)
    }
}

impl std::error::Error for Stopped {}

/// SIGINT and SIGTERM: the first cancels the running call (the one in `current`, or
/// exits at once with 130 / 143 when nothing runs); a second one exits at once.
#[derive(Debug, Clone, Default)]
struct Signals {
    current: Arc<Mutex<Option<CancellationToken>>>,
    /// 130 or 143 once a signal arrived, else 0.
    code: Arc<AtomicU8>,
}

impl Signals {
    fn watch() -> Self {
        let this = Self::default();
        let me = this.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{SignalKind, signal};
                let (Ok(mut int), Ok(mut term)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) else {
                    tracing::warn!("cannot install signal handlers");
                    return;
                };
                loop {
                    let code = tokio::select! {
                        _ = int.recv() => 130,
                        _ = term.recv() => 143,
                    };
                    me.arrived(code);
                }
            }
            #[cfg(not(unix))]
            {
                while tokio::signal::ctrl_c().await.is_ok() {
                    me.arrived(130);
                }
            }
        });
        this
    }

    fn arrived(&self, code: u8) {
        let running = self.current.lock().ok().and_then(|c| c.clone());
        let first = self.code.swap(code, Ordering::SeqCst) == 0;
        match running {
            Some(token) if first || !token.is_cancelled() => token.cancel(),
            _ => {
                eprintln!();
                std::process::exit(i32::from(code));
            }
        }
    }

    /// A token for the next call, cancelled by the next signal.
    fn begin(&self) -> CancellationToken {
        self.code.store(0, Ordering::SeqCst);
        let token = CancellationToken::new();
        if let Ok(mut c) = self.current.lock() {
            *c = Some(token.clone());
        }
        token
    }

    /// The call ended: a signal now exits at once. Returns the signal's exit code, if one
    /// arrived during the call.
    fn end(&self) -> Option<u8> {
        if let Ok(mut c) = self.current.lock() {
            *c = None;
        }
        match self.code.load(Ordering::SeqCst) {
            0 => None,
            c => Some(c),
        }
    }
}

/// Prints the events a user of `hame run` should see on stderr: workspace files that could
/// not be read, failed compactions, suspended tool calls.
fn warn_on(ev: &AgentEvent) {
    match ev {
        AgentEvent::Custom { kind, data }
            if kind.starts_with("workspace.")
                || kind.ends_with("_failed")
                || kind.ends_with(".failed") =>
        {
            let path = data.get("path").and_then(|p| p.as_str()).unwrap_or("");
            let error = data.get("error").and_then(|p| p.as_str()).unwrap_or("");
            eprintln!("hame: warning: {kind} {path}: {error}");
        }
        _ => {}
    }
}

/// The line `hame run` prints for each suspended tool call: the approval id, the tool and
/// its main argument.
fn suspended_lines(s: &hame::Suspended) -> String {
    s.calls
        .iter()
        .map(|c| {
            let args: serde_json::Value =
                serde_json::from_str(&c.call.arguments).unwrap_or(serde_json::Value::Null);
            let main = [
                "file_path",
                "path",
                "command",
                "subagent_type",
                "id",
                "pattern",
            ]
            .iter()
            .find_map(|k| args.get(*k).and_then(|v| v.as_str()))
            .unwrap_or("");
            format!(
                "approval needed: {} {} {} ({})",
                c.suspension.id, c.call.name, main, c.suspension.reason
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Maps a call's outcome to the exit the user sees: a signal (130/143), a suspension (3).
fn outcome<T>(result: Result<T, hame::harness::Error>, signal: Option<u8>) -> anyhow::Result<T> {
    match result {
        Ok(v) => Ok(v),
        Err(hame::harness::Error::Call(hame::Error::Suspended(s))) => {
            Err(Stopped(3, suspended_lines(&s)).into())
        }
        Err(e) => match signal {
            Some(code) => Err(Stopped(
                code,
                format!(
                    "stopped by {}: {e} (the conversation so far is saved)",
                    if code == 130 { "SIGINT" } else { "SIGTERM" }
                ),
            )
            .into()),
            None => Err(e.into()),
        },
    }
}

/// A usage or configuration error: exit code 2.
#[derive(Debug)]
struct ConfigError(String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

async fn build(common: &Common) -> anyhow::Result<(HarnessAgent, RuntimeContext)> {
    let spec = common.model.clone().or_else(|| env("HAME_MODEL")).ok_or_else(|| {
        ConfigError("no model configured: pass --model provider:model or set HAME_MODEL (e.g. openai:gpt-4o-mini)".into())
    })?;
    let model: Arc<dyn Model> =
        hame::model::open(&spec, &env).map_err(|e| ConfigError(e.to_string()))?;
    let mut builder = HarnessAgent::builder()
        .name(common.agent.clone())
        .model(model);
    if let Some(ws) = &common.workspace {
        builder = builder.workspace(ws.clone());
    }
    if let Some(n) = common.max_iterations {
        builder = builder.max_iterations(n);
    }
    builder = builder.isolation_scope(common.isolation.into());
    let memory = if common.no_memory {
        hame::harness::MemoryOptions::disabled()
    } else {
        let mut options = hame::harness::MemoryOptions::default();
        match common.memory_index.as_deref() {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                let index =
                    hame::memory::PgIndex::connect(url, hame::memory::PgIndexOptions::default())
                        .await
                        .map_err(|e| {
                            ConfigError(format!(
                                "cannot open the memory index {}: {e} (check --memory-index)",
                                hame::state::redact_url(url)
                            ))
                        })?;
                options.index = Some(std::sync::Arc::new(index));
            }
            // Opened now, so a file that is not a hame index is refused before anything
            // runs (exit 2), and never overwritten.
            Some(path) => {
                let index = hame::memory::SqliteIndex::open(path)
                    .await
                    .map_err(|e| ConfigError(format!("{e} (check --memory-index)")))?;
                options.index = Some(std::sync::Arc::new(index));
            }
            None => {}
        }
        options
    };
    builder = builder.memory(memory);
    if let Some(url) = common.state.clone().or_else(|| env("HAME_STATE")) {
        let store = hame::state::open(&url).await.map_err(|e| {
            ConfigError(format!(
                "cannot open state store {}: {e} (check --state / HAME_STATE)",
                hame::state::redact_url(&url)
            ))
        })?;
        builder = builder.state_store(store);
        if !url.contains("://") {
            // A JSON state directory inside the workspace is never shown to the tools.
            builder = builder.hide_path(PathBuf::from(&url));
        }
    }
    if common.isolated {
        builder = builder.filesystem(hame::FilesystemMode::IsolatedLocal);
    }
    if let Some(url) = &common.store {
        let store = hame::fs::remote::open(url, "hame").await.map_err(|e| {
            ConfigError(format!(
                "cannot open shared store {}: {e} (check --store)",
                hame::state::redact_url(url)
            ))
        })?;
        builder = builder.filesystem(hame::FilesystemMode::SharedStore { store });
    }
    let agent = builder.build().map_err(|e| {
        if e.is_config() {
            anyhow::Error::new(ConfigError(e.to_string()))
        } else {
            anyhow::Error::new(e)
        }
    })?;
    let mut ctx = RuntimeContext::new(common.session.clone());
    if let Some(u) = &common.user {
        ctx = ctx.with_user(u.clone());
    }
    hame::harness::validate_id("session id", &ctx.session_id)
        .map_err(|e| ConfigError(e.to_string()))?;
    if let Some(u) = &ctx.user_id {
        hame::harness::validate_id("user id", u).map_err(|e| ConfigError(e.to_string()))?;
    }
    // Every credential has been read: keep them from the shell's commands.
    let sealed = secrets::seal();
    tracing::debug!(
        non_dumpable = sealed.non_dumpable,
        scrubbed = sealed.scrubbed,
        "secrets sealed"
    );
    Ok((agent, ctx))
}

async fn run(common: Common, json: bool, message: String) -> anyhow::Result<()> {
    let signals = Signals::watch();
    let (agent, ctx) = build(&common).await?;
    let (sink, mut rx) = EventSink::channel();
    let printer = tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            warn_on(&ev);
        }
    });
    let cancel = signals.begin();
    let result = agent
        .call_with(Message::user(message), &ctx, &sink, &cancel)
        .await;
    let signal = signals.end();
    drop(sink);
    let _ = printer.await;
    let out = outcome(result, signal)?;
    if json {
        let obj = serde_json::json!({
            "reply": out.reply.text_content(),
            "agent": agent.name(),
            "session": ctx.session_id,
            "user": ctx.user_id,
            "usage": out.usage,
            "iterations": out.iterations,
        });
        println!("{obj}");
    } else {
        println!("{}", out.reply.text_content());
    }
    std::io::stdout().flush()?;
    // The reply is printed and durable; let background memory work (flush,
    // consolidation) finish before the process exits, within a bound. Unfinished work is
    // redone by the session's next call.
    finish(&agent).await
}

/// Lets background memory work finish (bounded) before the process exits.
async fn finish(agent: &HarnessAgent) -> anyhow::Result<()> {
    if !agent
        .wait_background(hame::harness::memory::DEFAULT_BACKGROUND_WAIT)
        .await
    {
        tracing::warn!("background memory work did not finish; the next call redoes it");
    }
    Ok(())
}

/// Reads stdin lines on a blocking thread (the runtime's workers never block on a TTY).
fn stdin_lines() -> tokio::sync::mpsc::Receiver<std::io::Result<String>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        loop {
            let mut line = String::new();
            let r = stdin.lock().read_line(&mut line);
            let eof = matches!(r, Ok(0)) || r.is_err();
            if tx.blocking_send(r.map(|_| line)).is_err() || eof {
                return;
            }
        }
    });
    rx
}

async fn chat(common: Common) -> anyhow::Result<()> {
    let signals = Signals::watch();
    let (agent, ctx) = build(&common).await?;
    let mut lines = stdin_lines();
    loop {
        eprint!("> ");
        // End of input (or a closed reader) ends the chat.
        let line = match lines.recv().await {
            Some(r) => r?,
            None => String::new(),
        };
        if line.is_empty() {
            return finish(&agent).await;
        }
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if text == "/exit" || text == "/quit" {
            return finish(&agent).await;
        }
        // Ctrl-C during a turn cancels the turn and comes back to the prompt; at the
        // prompt it exits.
        let cancel = signals.begin();
        let mut events = agent.stream_with(CallInput::Message(Message::user(text)), &ctx, cancel);
        let mut out = std::io::stdout();
        while let Some(ev) = events.next().await {
            match ev {
                AgentEvent::TextDelta { text } => {
                    print!("{text}");
                    out.flush()?;
                }
                AgentEvent::ToolStarted { name, .. } => eprintln!("\n  ⚙ {name} …"),
                AgentEvent::ToolFinished {
                    name,
                    duration_ms,
                    is_error,
                    code,
                    ..
                } => {
                    let status = if is_error {
                        format!("error {}", code.unwrap_or_default())
                    } else {
                        "ok".into()
                    };
                    eprintln!("  ⚙ {name} {status} ({duration_ms} ms)");
                }
                AgentEvent::Finished { .. } => println!(),
                AgentEvent::Suspended { calls } => {
                    eprintln!("\n{}", suspended_lines(&hame::Suspended { calls }));
                }
                AgentEvent::Failed { message } => eprintln!("\nerror: {message}"),
                other => warn_on(&other),
            }
        }
        if signals.end().is_some() {
            eprintln!("(turn cancelled; the conversation so far is saved)");
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HAME_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hame: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run {
                common,
                json,
                message,
            } => run(common, json, message).await,
            Command::Chat { common } => chat(common).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Stopped>() => {
            let code = e.downcast_ref::<Stopped>().map_or(1, |s| s.0);
            eprintln!("hame: {e}");
            ExitCode::from(code)
        }
        Err(e) if e.is::<ConfigError>() => {
            eprintln!("hame: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("hame: {e:#}");
            ExitCode::from(1)
        }
    }
}
