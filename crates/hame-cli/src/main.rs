//! The `hame` command line.
//!
//! Exit codes: 0 success; 1 the call failed (model error, step limit); 2 usage or
//! configuration error (one line on stderr that says what to set); 3 the call waits for a
//! decision (a tool call was suspended, e.g. for approval); 130 / 143 stopped by SIGINT /
//! SIGTERM (the call is cancelled, what joined the conversation is saved, the session lease
//! is released and the shell's processes are killed before exiting).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod approve;
mod common;
mod run;
mod sandbox;
mod secrets;
mod serve;
mod signals;
mod skills;
mod tasks;

use common::Common;

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
    /// Approve a tool call that waits for a decision (`hame run` exited 3): runs it, finishes
    /// the call and prints the reply like `hame run`. Same flags as `run`.
    Approve {
        #[command(flatten)]
        args: approve::DecideArgs,
    },
    /// Deny a tool call that waits for a decision: the model gets a denied result and the
    /// call finishes (the reply is printed like `hame run`). Same flags as `run`.
    Deny {
        #[command(flatten)]
        args: approve::DecideArgs,
        /// Why, for the model.
        #[arg(long)]
        reason: Option<String>,
    },
    /// The Docker sandbox: `hame sandbox image` builds its default image offline.
    Sandbox {
        #[command(subcommand)]
        command: sandbox::SandboxCommand,
    },
    /// Skills of the workspace: list them, promote drafts.
    Skills {
        #[command(subcommand)]
        command: skills::SkillsCommand,
    },
    /// Serve the agent over HTTP: sessions as JSON and SSE, an OpenAI-compatible
    /// `/v1/chat/completions`, `/metrics` and a web console at `/` (docs/gateway.md).
    /// Prints `listening on http://ADDR` when ready; SIGTERM drains in-flight turns and
    /// exits 0. Without --auth only a loopback address is accepted.
    Serve {
        #[command(flatten)]
        args: serve::ServeArgs,
    },
    /// The subagent task records of a session (`agents/<agent>/tasks/`), oldest first.
    /// Records left running by a process that is gone are marked failed (interrupted).
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HAME_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, never in a file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
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
        let result = match cli.command {
            Command::Run {
                common,
                json,
                message,
            } => run::run(common, json, message).await,
            Command::Chat { common } => run::chat(common).await,
            Command::Approve { args } => approve::decide(args, true, None).await,
            Command::Deny { args, reason } => approve::decide(args, false, reason).await,
            Command::Sandbox { command } => sandbox::command(command).await,
            Command::Skills { command } => skills::run(command).await,
            Command::Tasks { common, json } => tasks::tasks(common, json).await,
            Command::Serve { args } => serve::serve(args).await,
        };
        // Nothing hame started outlives it.
        sandbox::shutdown().await;
        result
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
