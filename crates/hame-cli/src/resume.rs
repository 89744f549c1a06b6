//! `--continue` and `--resume [ID]` of `hame run` and `hame chat`: which session a command
//! works on, picked among the caller's sessions of the workspace (agent and user of the
//! command, most recently updated first, as `hame sessions` lists them).

use std::io::IsTerminal;

use clap::Args;
use hame::{HarnessAgent, RuntimeContext};

use crate::ConfigError;

/// How many sessions `--resume` without an ID offers.
const PICK_LIMIT: usize = 20;

/// The session-picking flags.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct SessionPick {
    /// Continue the most recently updated session of this workspace (this agent and user)
    /// instead of --session
    #[arg(
        long = "continue",
        short = 'c',
        conflicts_with_all = ["resume", "session"]
    )]
    continue_latest: bool,
    /// Resume session ID; without ID, list the recent sessions and pick one (on a terminal)
    #[arg(
        long,
        short = 'r',
        value_name = "ID",
        num_args = 0..=1,
        default_missing_value = "",
        conflicts_with = "session"
    )]
    resume: Option<String>,
}

/// Sets `ctx.session_id` from the flags (no flag: `--session` as given). Prints on stderr
/// which session is continued.
pub(crate) async fn apply(
    pick: &SessionPick,
    agent: &HarnessAgent,
    ctx: &mut RuntimeContext,
) -> anyhow::Result<()> {
    if !pick.continue_latest && pick.resume.is_none() {
        return Ok(());
    }
    let sessions = agent.sessions(ctx).await?;
    let whose = match &ctx.user_id {
        Some(u) => format!("agent {}, user {u}", agent.name()),
        None => format!("agent {}", agent.name()),
    };
    let none = |what: &str, hint: &str| -> anyhow::Error {
        ConfigError(format!(
            "no session {what} in workspace {} ({whose}){hint}",
            agent.workspace().display()
        ))
        .into()
    };
    let chosen = match pick.resume.as_deref() {
        None => match sessions.first() {
            Some(s) => s.id.clone(),
            None => return Err(none("to continue", "; start one without --continue")),
        },
        Some("") => {
            if sessions.is_empty() {
                return Err(none("to resume", ""));
            }
            if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
                return Err(ConfigError(
                    "--resume without an ID lists the sessions to pick from on a terminal; \
                     pass --resume ID (`hame sessions` lists them) or --continue for the latest"
                        .into(),
                )
                .into());
            }
            let shown: Vec<String> = sessions
                .iter()
                .take(PICK_LIMIT)
                .map(|s| {
                    format!(
                        "{}  {}  {} messages  {}",
                        s.id,
                        s.updated.format("%Y-%m-%d %H:%M"),
                        s.message_count,
                        s.title
                    )
                })
                .collect();
            let index = tokio::task::spawn_blocking(move || ask(&shown)).await??;
            sessions[index].id.clone()
        }
        Some(id) => match sessions.iter().find(|s| s.id == id) {
            Some(s) => s.id.clone(),
            None => return Err(none(&format!("{id:?}"), "; `hame sessions` lists them")),
        },
    };
    if let Some(s) = sessions.iter().find(|s| s.id == chosen) {
        eprintln!(
            "hame: continuing session {} ({} messages, last {})",
            s.id,
            s.message_count,
            s.updated.format("%Y-%m-%d %H:%M")
        );
    }
    ctx.session_id = chosen;
    Ok(())
}

/// Lists `choices` on stderr, numbered from 1, and reads a number from stdin (empty: 1).
fn ask(choices: &[String]) -> anyhow::Result<usize> {
    use std::io::{BufRead, Write};
    for (i, c) in choices.iter().enumerate() {
        eprintln!("{:>3}  {c}", i + 1);
    }
    let stdin = std::io::stdin();
    loop {
        eprint!("session number [1]: ");
        std::io::stderr().flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            return Err(ConfigError("no session picked".into()).into());
        }
        let line = line.trim();
        if line.is_empty() {
            return Ok(0);
        }
        match line.parse::<usize>() {
            Ok(n) if (1..=choices.len()).contains(&n) => return Ok(n - 1),
            _ => eprintln!("a number from 1 to {}", choices.len()),
        }
    }
}
