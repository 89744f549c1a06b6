//! `hame init [DIR]`: a starter workspace in one command.
//!
//! Creates `AGENTS.md`, `knowledge/KNOWLEDGE.md`, an example skill
//! (`skills/summarize/SKILL.md`), an example subagent spec (`subagents/reviewer.md`) and a
//! commented `hame.toml`. An existing file is never overwritten: it is kept and named on
//! stderr (`kept … (exists)`); the command still succeeds, so `hame init` on a workspace
//! adds only what is missing. A `DIR` that exists and is not a directory is exit 2.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::ConfigError;

/// Flags of `hame init`.
#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// The workspace directory to create [default: $HAME_WORKSPACE, else ./.hame/workspace]
    dir: Option<PathBuf>,
}

/// The files of a new workspace: (path relative to the workspace, content).
pub(crate) const FILES: &[(&str, &str)] = &[
    ("AGENTS.md", AGENTS_MD),
    ("knowledge/KNOWLEDGE.md", KNOWLEDGE_MD),
    ("skills/summarize/SKILL.md", SKILL_MD),
    ("subagents/reviewer.md", SUBAGENT_MD),
    ("hame.toml", HAME_TOML),
];

const AGENTS_MD: &str = "\
# Persona

You are a helpful, terse assistant working in this workspace. Edit this file to give the
agent its name, its job and its rules: it is read in full before every reasoning step.

- Answer in the user's language.
- Say what you did and what you did not do.
";

const KNOWLEDGE_MD: &str = "\
# Knowledge

Facts the agent should always know (read in full before every step). Put longer reference
material in other files of `knowledge/`: the agent sees their names and reads them when
needed.
";

const SKILL_MD: &str = "\
---
description: Summarises a text or a file in five bullet points. Use when asked for a summary.
---
# Summarize

1. Read the whole text (use read_file for a file).
2. Write at most five bullet points, most important first, one line each.
3. End with one line: what was left out.
";

const SUBAGENT_MD: &str = "\
---
description: Reviews a change or a file for bugs and unclear code
tools: [read_file, grep_files, glob_files, list_files]
max_iterations: 8
---
You review code. Report each problem with its file and line, why it is a problem and a fix.
Report nothing you are not sure of.
";

const HAME_TOML: &str = "\
# hame configuration of this workspace (`hame config` shows the effective values).
# Precedence: command-line flags > environment > this file > ~/.config/hame/config.toml.

# Tools that change something (file edits, the shell, memory_save, MCP tools) ask first:
# `hame chat` asks inline; `hame run` stops with exit 3 and `hame approve` / `hame deny`
# decide. Others: default (tools.json's rules, else allow), accept-edits, plan, read-only,
# bypass (docs/permissions.md; --permission-mode, HAME_PERMISSION_MODE).
permission_mode = \"ask\"

# model = \"openai:gpt-4o-mini\"       # or HAME_MODEL / --model
# base_url = \"http://127.0.0.1:8080/v1\" # the provider's endpoint (OPENAI_BASE_URL, ANTHROPIC_BASE_URL)
# state = \"redis://127.0.0.1:6379/0\"    # session state (HAME_STATE / --state)
# store = \"redis://127.0.0.1:6379/0\"    # shared-store mode (--store)
# isolation = \"user\"                    # session | user | agent | global

# [memory]
# enabled = true
# index = \"postgres://user@127.0.0.1/hame\"

# [limits]
# max_iterations = 50
# subagent_depth = 1
# task_wait = 600
";

/// What `init` did with one file.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Created,
    Kept,
}

/// `hame init`.
pub(crate) fn init(args: InitArgs) -> anyhow::Result<()> {
    let dir = hame::harness::resolve_workspace(args.dir.as_deref(), &crate::common::env);
    if dir.exists() && !dir.is_dir() {
        return Err(ConfigError(format!("{} exists and is not a directory", dir.display())).into());
    }
    let mut created = 0;
    for (rel, content) in FILES {
        match write_new(&dir, rel, content)? {
            Outcome::Created => {
                created += 1;
                println!("created {}", dir.join(rel).display());
            }
            Outcome::Kept => eprintln!("hame: kept {} (exists)", dir.join(rel).display()),
        }
    }
    if created == 0 {
        eprintln!(
            "hame: {} has every starter file already; nothing changed",
            dir.display()
        );
    } else {
        let ws = shell_word(&dir);
        println!(
            "workspace ready; try: hame run --workspace {ws} --model openai:gpt-4o-mini \"hi\""
        );
    }
    Ok(())
}

/// Creates `dir/rel` with `content` unless it exists (never overwritten: `create_new`).
fn write_new(dir: &Path, rel: &str, content: &str) -> anyhow::Result<Outcome> {
    use std::io::Write;
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| ConfigError(format!("cannot create {}: {e}", parent.display())))?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(mut f) => {
            f.write_all(content.as_bytes())
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            Ok(Outcome::Created)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Outcome::Kept),
        Err(e) => Err(ConfigError(format!("cannot create {}: {e}", path.display())).into()),
    }
}

/// The path as one shell word (quoted when it needs to be).
fn shell_word(p: &Path) -> String {
    let s = p.to_string_lossy();
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+:@".contains(c))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
