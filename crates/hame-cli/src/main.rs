//! The `hame` command line.
//!
//! Exit codes: 0 success; 1 the call failed (model error, step limit); 2 usage or
//! configuration error (one line on stderr that says what to set); 3 the call waits for a
//! decision (a tool call was suspended, e.g. for approval); 130 / 143 stopped by SIGINT /
//! SIGTERM (the call is cancelled, what joined the conversation is saved, the session lease
//! is released and the shell's processes are killed before exiting).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// mimalloc (without transparent huge pages) instead of the C library's allocator: less CPU
/// per turn (ADR 0044).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod approve;
mod chat;
mod common;
mod config;
mod init;
mod inspect;
mod mcp;
mod replay;
mod resume;
mod run;
mod runs;
mod sandbox;
mod secrets;
mod serve;
mod signals;
mod skills;
mod status;
mod tasks;
mod telemetry;
mod usage;

use common::Common;

#[derive(Debug, Parser)]
#[command(name = "hame", version, about = "Run a hame agent against a workspace")]
struct Cli {
    /// Send OpenTelemetry traces (GenAI conventions: invoke_agent, chat and execute_tool
    /// spans; `hame serve`'s HTTP requests, continuing an incoming traceparent) to this
    /// OTLP/HTTP collector, e.g. http://127.0.0.1:4318 (`/v1/traces` is added to a base
    /// URL) [default: $HAME_OTLP_ENDPOINT; none]
    #[arg(
        long,
        global = true,
        env = "HAME_OTLP_ENDPOINT",
        value_name = "URL",
        help_heading = "Telemetry"
    )]
    otlp_endpoint: Option<String>,
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
    /// agents/<agent>/sessions/<session>.log.jsonl, agents/<agent>/sessions/index/<session>.json,
    /// memory/YYYY-MM-DD.md, MEMORY.md, large_tool_results/ (under <userId>/ with --user).
    Run {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        pick: resume::SessionPick,
        /// Print one JSON object {"reply", "session", "usage", ...} instead of the text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        verify: run::VerifyArgs,
        /// An image to send with the message (PNG, JPEG, GIF or WebP, at most 5 MiB;
        /// repeatable, at most 20): the model gets it inline (docs/openai-compat.md, Images).
        #[arg(long = "image", value_name = "FILE")]
        images: Vec<std::path::PathBuf>,
        /// The message to send.
        message: String,
    },
    /// Interactive chat: streams tokens, shows each tool call and its arguments.
    ///
    /// Line editing and history on a terminal; a trailing \ continues the message; /help
    /// lists the commands (/exit, /new, /sessions, /usage, /context, /compact, /model);
    /// Ctrl-C cancels the running turn, Ctrl-D exits. On a terminal, a spinner shows how
    /// long the model has been thinking.
    Chat {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        pick: resume::SessionPick,
    },
    /// Approve a tool call that waits for a decision (after `hame run` exited 3).
    ///
    /// Runs it, finishes the call and prints the reply like `hame run`. Same flags as `run`.
    Approve {
        #[command(flatten)]
        args: approve::DecideArgs,
    },
    /// Deny a tool call that waits for a decision.
    ///
    /// The model gets a denied result and the call finishes (the reply is printed like
    /// `hame run`). Same flags as `run`.
    Deny {
        #[command(flatten)]
        args: approve::DecideArgs,
        /// Why, for the model.
        #[arg(long)]
        reason: Option<String>,
    },
    /// The Docker sandbox: build its default image, sweep its snapshot store.
    ///
    /// `hame sandbox image` builds its default image offline, `hame sandbox gc` sweeps its
    /// snapshot store.
    Sandbox {
        #[command(subcommand)]
        command: sandbox::SandboxCommand,
    },
    /// Skills of the workspace: list them, promote drafts.
    Skills {
        #[command(subcommand)]
        command: skills::SkillsCommand,
    },
    /// Create a starter workspace (existing files are kept, never overwritten).
    ///
    /// AGENTS.md, knowledge/KNOWLEDGE.md, an example skill, an example subagent spec and a
    /// commented hame.toml. Existing files are kept (named on stderr), never overwritten.
    Init {
        #[command(flatten)]
        args: init::InitArgs,
    },
    /// The effective configuration and where each value comes from.
    ///
    /// Sources: flag, environment, the workspace's hame.toml, the user's
    /// ~/.config/hame/config.toml, default; passwords in URLs and API keys are redacted.
    Config {
        #[command(flatten)]
        args: config::ConfigArgs,
    },
    /// The caller's sessions: `list` (default), `show ID` (the full log), `search QUERY`.
    Sessions {
        #[command(flatten)]
        args: inspect::SessionsArgs,
    },
    /// A session's requirements: `confirm S ID` makes a model's candidate binding.
    ///
    /// A requirement the model proposed (`requirement_propose`) is a candidate until it is
    /// confirmed; confirmed, it is in every later request's task section, and the check it
    /// names is required for every later run of the session (docs/evidence.md).
    Requirements {
        #[command(subcommand)]
        command: inspect::RequirementsCommand,
    },
    /// What the caller's sessions spent, by session and model (tokens, cache, USD).
    ///
    /// Read from the spend saved with each session's state (docs/cost.md); --user picks
    /// the user, --since the first UTC day counted.
    Usage {
        #[command(flatten)]
        args: usage::UsageArgs,
    },
    /// The caller's memory: `show` (default: MEMORY.md and the daily logs), `search QUERY`.
    Memory {
        #[command(flatten)]
        args: inspect::MemoryArgs,
    },
    /// Re-run a recorded session against its logged model answers; report the first difference.
    ///
    /// The same tools run again in the workspace; exit 0 when identical, 1 at a divergence.
    /// Memory is off during a replay.
    Replay {
        #[command(flatten)]
        args: replay::ReplayArgs,
    },
    /// Serve the agent over HTTP: sessions, /v1/chat/completions, /metrics, a web console.
    ///
    /// Sessions as JSON and SSE, an OpenAI-compatible `/v1/chat/completions`, `/metrics`
    /// and a web console at `/` (docs/gateway.md). Prints `listening on http://ADDR` when
    /// ready; SIGTERM drains in-flight turns and exits 0. Without --auth only a loopback
    /// address is accepted.
    Serve {
        #[command(flatten)]
        args: serve::ServeArgs,
    },
    /// Serve the agent to MCP clients: `hame mcp serve` (stdio, or --listen for HTTP).
    ///
    /// One tool, `ask` {message, session?}, runs a turn of the agent (docs/mcp-server.md).
    Mcp {
        #[command(subcommand)]
        command: mcp::McpCommand,
    },
    /// Drain the run queue: execute runs that `hame serve` replicas accepted.
    ///
    /// Same flags as `hame serve` for the workspace, model, --state, --store and sandbox;
    /// runs of the agent are claimed from the queue in the state store, heartbeated, and
    /// taken over by another worker when this one dies (docs/runs.md). SIGTERM drains.
    Worker {
        #[command(flatten)]
        args: runs::WorkerCommand,
    },
    /// Runs in the state store: `list [SESSION]`, `show ID`, `cancel ID` (no server needed).
    Runs {
        #[command(subcommand)]
        command: runs::RunsCommand,
    },
    /// The subagent task records of a session, oldest first.
    ///
    /// From `agents/<agent>/tasks/`. Records left running by a process that is gone are
    /// marked failed (interrupted).
    Tasks {
        #[command(flatten)]
        common: Common,
        /// Print one JSON array of the records.
        #[arg(long)]
        json: bool,
    },
}

/// The call stopped with this exit code (a signal, a suspension); its message is printed.
#[derive(Debug)]
pub(crate) struct Stopped(pub(crate) u8, pub(crate) String);

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.1)
    }
}

impl std::error::Error for Stopped {}

/// A usage or configuration error: exit code 2.
#[derive(Debug)]
pub(crate) struct ConfigError(pub(crate) String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The commands of `hame --help`, by group, in the order shown.
const COMMAND_GROUPS: &[(&str, &[&str])] = &[
    ("Run an agent", &["run", "chat", "serve", "worker", "mcp"]),
    (
        "Inspect",
        &[
            "sessions", "usage", "memory", "tasks", "runs", "replay", "config",
        ],
    ),
    ("Workspace", &["init", "skills"]),
    ("Admin", &["approve", "deny", "requirements", "sandbox"]),
];

/// The command line with `hame --help` listing the commands by group, each with the first
/// line of its help.
fn command() -> clap::Command {
    let cmd = Cli::command();
    let mut groups = String::new();
    for (group, names) in COMMAND_GROUPS {
        groups.push_str(group);
        groups.push_str(":\n");
        for name in *names {
            let about = cmd
                .find_subcommand(name)
                .and_then(|c| c.get_about())
                .map(ToString::to_string)
                .unwrap_or_default();
            groups.push_str(&format!("  {name:<9} {about}\n"));
        }
        groups.push('\n');
    }
    groups.push_str("  help      Print this message or the help of the given command\n\n");
    let template = format!(
        "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{groups}Options:\n{{options}}{{after-help}}"
    );
    cmd.help_template(template)
}

fn main() -> ExitCode {
    let cli = match Cli::from_arg_matches(&command().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // Before anything can fail or print: the values that must never be shown, and the
    // environment as it is before a seal blanks them (common::env reads this copy).
    common::keep_start_env();
    secrets::register();
    let telemetry = match telemetry::init(cli.otlp_endpoint.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("hame: {e}");
            return ExitCode::from(2);
        }
    };
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
        let result = match cli.command {
            Command::Run {
                common,
                pick,
                json,
                verify,
                images,
                message,
            } => run::run(common, pick, json, verify, &images, message).await,
            Command::Chat { common, pick } => chat::chat(common, pick).await,
            Command::Approve { args } => approve::decide(args, true, None).await,
            Command::Deny { args, reason } => approve::decide(args, false, reason).await,
            Command::Sandbox { command } => sandbox::command(command).await,
            Command::Skills { command } => skills::run(command).await,
            Command::Tasks { common, json } => tasks::tasks(common, json).await,
            Command::Init { args } => init::init(args),
            Command::Sessions { args } => inspect::sessions(args).await,
            Command::Requirements { command } => inspect::requirements(command).await,
            Command::Memory { args } => inspect::memory(args).await,
            Command::Usage { args } => usage::usage(args).await,
            Command::Replay { args } => replay::replay(args).await,
            Command::Config { args } => config::show(args),
            Command::Serve { args } => serve::serve(args).await,
            Command::Mcp { command } => mcp::run(command).await,
            Command::Worker { args } => runs::worker(args).await,
            Command::Runs { command } => runs::runs(command).await,
        };
        // Nothing hame started outlives it.
        sandbox::shutdown().await;
        result
    });
    status::clear();
    drop(runtime);
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Stopped>() => {
            let code = e.downcast_ref::<Stopped>().map_or(1, |s| s.0);
            say(&e.to_string());
            ExitCode::from(code)
        }
        Err(e) if e.is::<ConfigError>() => {
            say(&e.to_string());
            ExitCode::from(2)
        }
        Err(e) => {
            say(&one_line(&e));
            ExitCode::from(1)
        }
    }
}

/// Prints `hame: <text>` on stderr, without the process's secrets (`hame::secrets`; the
/// operator may see the provider's URL).
fn say(text: &str) {
    eprintln!("hame: {}", hame::secrets::redact(text));
}

/// An error as one line: its chain, without the parts an earlier part already says
/// ("connection refused" after "… (connection refused); check …"); below a model error
/// (which says what to check) only the root cause, not the HTTP client's layers.
fn one_line(e: &anyhow::Error) -> String {
    let mut text = String::new();
    let chain: Vec<&(dyn std::error::Error + 'static)> = e.chain().collect();
    let is_model = |p: &&(dyn std::error::Error + 'static)| {
        p.downcast_ref::<hame::ModelError>().is_some()
            || matches!(p.downcast_ref::<hame::Error>(), Some(hame::Error::Model(_)))
            || matches!(
                p.downcast_ref::<hame::harness::Error>(),
                Some(hame::harness::Error::Call(hame::Error::Model(_)))
            )
    };
    let cut = chain.iter().position(is_model).map(|i| i + 1);
    let parts: Vec<&(dyn std::error::Error + 'static)> = match cut {
        Some(i) if i < chain.len() => {
            let mut v = chain[..i].to_vec();
            v.extend(chain.last().copied());
            v
        }
        _ => chain,
    };
    for part in parts {
        let p = part.to_string();
        let bare = p
            .split(" (os error")
            .next()
            .unwrap_or(&p)
            .trim()
            .to_ascii_lowercase();
        if bare.is_empty() || text.to_ascii_lowercase().contains(&bare) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&p);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{COMMAND_GROUPS, command};

    /// Every command is in exactly one group of `hame --help`.
    #[test]
    fn every_command_has_one_group() {
        let cmd = command();
        let mut names: Vec<&str> = cmd
            .get_subcommands()
            .map(clap::Command::get_name)
            .filter(|n| *n != "help")
            .collect();
        names.sort_unstable();
        let mut grouped: Vec<&str> = COMMAND_GROUPS
            .iter()
            .flat_map(|(_, n)| n.iter().copied())
            .collect();
        grouped.sort_unstable();
        assert_eq!(names, grouped);
    }
}
