//! # example-distributed
//!
//! Two replicas of one agent continue each other's session through Redis. The program
//! re-executes itself twice (`--replica 1`, then `--replica 2`): two processes, two
//! [`HarnessAgent`] instances, two private workspace directories, nothing shared on local
//! disk. Replica 1 answers turn one; replica 2 picks the session up from Redis and answers
//! turn two. Tenant files live in Redis (shared-store mode,
//! [`FilesystemMode::SharedStore`] over [`hame::fs::remote::open`]) and so does the session
//! state ([`hame::state::open`]) with its lease.
//!
//! The model comes from `--model` or `HAME_MODEL` (default `openai:gpt-4o-mini`) and the
//! provider variables (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`).
//!
//! | feature | what it adds |
//! |---|---|
//! | (none) | everything: OpenAI and Anthropic clients, Redis filesystem and state |
//!
//! ```sh
//! redis-server --daemonize yes
//! HAME_MODEL=openai:gpt-4o-mini OPENAI_API_KEY=sk-... \
//!   cargo run -p example-distributed -- --redis redis://127.0.0.1:6379/
//! ```
//!
//! prints one line per replica:
//!
//! ```text
//! replica 1 (pid 4242): Nice to meet you, Ada.
//! replica 2 (pid 4243): Your name is Ada.
//! ```
//!
//! The pieces are public so the integration tests can drive them:
//!
//! ```no_run
//! # fn demo() -> anyhow::Result<()> {
//! use example_distributed::{Options, coordinate};
//!
//! let turns = coordinate(std::path::Path::new("/path/to/example-distributed"), &Options::new("redis://127.0.0.1:6379/"))?;
//! assert_eq!(turns.len(), 2);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Parser;
use hame::{FilesystemMode, HarnessAgent, Message, RuntimeContext};
use serde_json::json;

/// Default model when neither `--model` nor `HAME_MODEL` is set.
pub const DEFAULT_MODEL: &str = "openai:gpt-4o-mini";

/// The two turns: replica N sends message N.
pub const TURNS: [&str; 2] = ["My name is Ada.", "What is my name?"];

/// Command-line options of the example (also those passed to each replica).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "example-distributed",
    about = "Two replicas continue one session through Redis"
)]
pub struct Options {
    /// Redis URL holding tenant files, session state and leases.
    #[arg(long)]
    pub redis: String,
    /// Agent id (its Redis keys are prefixed with it).
    #[arg(long, default_value = "distributed")]
    pub agent: String,
    /// User id.
    #[arg(long, default_value = "ada")]
    pub user: String,
    /// Session id.
    #[arg(long, default_value = "handover")]
    pub session: String,
    /// Model as provider:model [default: $HAME_MODEL, else openai:gpt-4o-mini].
    #[arg(long)]
    pub model: Option<String>,
    /// Run as this replica (set by the coordinator when it re-executes itself).
    #[arg(long, hide = true)]
    pub replica: Option<usize>,
}

impl Options {
    /// Options with defaults and this Redis URL.
    pub fn new(redis: impl Into<String>) -> Self {
        Self {
            redis: redis.into(),
            agent: "distributed".into(),
            user: "ada".into(),
            session: "handover".into(),
            model: None,
            replica: None,
        }
    }

    fn replica_args(&self, replica: usize) -> Vec<String> {
        let mut args = vec![
            "--redis".to_owned(),
            self.redis.clone(),
            "--agent".to_owned(),
            self.agent.clone(),
            "--user".to_owned(),
            self.user.clone(),
            "--session".to_owned(),
            self.session.clone(),
            "--replica".to_owned(),
            replica.to_string(),
        ];
        if let Some(m) = &self.model {
            args.extend(["--model".to_owned(), m.clone()]);
        }
        args
    }
}

/// What one replica answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// Replica number (1 or 2).
    pub replica: usize,
    /// Process id of the replica.
    pub pid: u32,
    /// The reply text.
    pub reply: String,
}

/// A private workspace for one replica process, holding the template every replica ships.
fn replica_workspace(replica: usize) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "hame-distributed-{}-replica-{replica}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(
        dir.join("AGENTS.md"),
        "You are the distributed example agent. Answer in one short sentence.\n",
    )?;
    Ok(dir)
}

/// Runs turn `replica` in this process: builds an agent on Redis and answers one message.
pub async fn run_replica(options: &Options, replica: usize) -> anyhow::Result<Turn> {
    let message = TURNS
        .get(replica.wrapping_sub(1))
        .with_context(|| format!("replica must be 1 or 2, not {replica}"))?;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let spec = options
        .model
        .clone()
        .or_else(|| env("HAME_MODEL"))
        .unwrap_or_else(|| DEFAULT_MODEL.to_owned());
    let model = hame::model::open(&spec, &env)?;
    let store = hame::fs::remote::open(&options.redis, "hame")
        .await
        .with_context(|| format!("opening the shared store {}", options.redis))?;
    let state = hame::state::open(&options.redis)
        .await
        .with_context(|| format!("opening the state store {}", options.redis))?;
    let workspace = replica_workspace(replica)?;
    let agent = HarnessAgent::builder()
        .name(options.agent.clone())
        .model(model)
        .workspace(&workspace)
        .filesystem(FilesystemMode::SharedStore { store })
        .state_store(state)
        .env(hame::harness::EnvLookup(Arc::new(move |k| env(k))))
        .build()?;
    let ctx = RuntimeContext::new(options.session.clone()).with_user(options.user.clone());
    let out = agent.call(Message::user(*message), &ctx).await;
    // The workspace was only a template; everything the call wrote is in Redis.
    let _ = std::fs::remove_dir_all(&workspace);
    Ok(Turn {
        replica,
        pid: std::process::id(),
        reply: out?.reply.text_content(),
    })
}

/// Runs both turns, each in a new process started from `exe` (this program) with
/// `--replica N`, one after the other, and returns what they answered.
pub fn coordinate(exe: &Path, options: &Options) -> anyhow::Result<Vec<Turn>> {
    let mut turns = Vec::new();
    for replica in 1..=TURNS.len() {
        let out = Command::new(exe)
            .args(options.replica_args(replica))
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("starting replica {replica} ({})", exe.display()))?;
        if !out.status.success() {
            bail!(
                "replica {replica} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let line = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = serde_json::from_str(line.trim())
            .with_context(|| format!("replica {replica} printed {line:?}"))?;
        turns.push(Turn {
            replica,
            pid: v["pid"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok())
                .unwrap_or(0),
            reply: v["reply"].as_str().unwrap_or_default().to_owned(),
        });
    }
    Ok(turns)
}

/// The program: the coordinator without `--replica`, one replica with it. Exit code 0 on
/// success, 1 on failure (one line on stderr).
#[allow(clippy::print_stdout, clippy::print_stderr)] // the example's command-line entry
pub fn main_entry() -> ExitCode {
    let options = Options::parse();
    let result = match options.replica {
        Some(replica) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(run_replica(&options, replica)))
            .map(|turn| {
                println!(
                    "{}",
                    json!({"replica": turn.replica, "pid": turn.pid, "reply": turn.reply})
                );
            }),
        None => std::env::current_exe()
            .map_err(anyhow::Error::from)
            .and_then(|exe| coordinate(&exe, &options))
            .map(|turns| {
                for t in turns {
                    println!("replica {} (pid {}): {}", t.replica, t.pid, t.reply);
                }
            }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("example-distributed: {e:#}");
            ExitCode::from(1)
        }
    }
}
