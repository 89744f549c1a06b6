//! `hame sessions [list|show ID|search QUERY]` and `hame memory [show|search QUERY]`:
//! the caller's session logs and memory from the command line (no model needed).

use clap::{Args, Subcommand};

use crate::ConfigError;
use crate::common::{Common, build_without_model};

/// Flags shared by the inspection commands.
#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    #[command(flatten)]
    common: Common,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `hame sessions`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct SessionsArgs {
    #[command(subcommand)]
    command: Option<SessionsCommand>,
    /// Without a subcommand: `list`.
    #[command(flatten)]
    list: InspectArgs,
}

#[derive(Debug, Subcommand)]
enum SessionsCommand {
    /// The caller's sessions, most recently updated first: id, last update, message
    /// count, title (JSON: the session index entries).
    List {
        #[command(flatten)]
        args: InspectArgs,
    },
    /// Every record of one session's never-compacted log: `#seq role: text`, tool calls
    /// and tool results one line each (JSON: the log records).
    Show {
        #[command(flatten)]
        args: InspectArgs,
        /// The session id.
        id: String,
    },
    /// Full-text search over the caller's session logs (like the `session_search` tool).
    Search {
        #[command(flatten)]
        args: InspectArgs,
        /// Most hits.
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Words to find.
        query: String,
    },
}

/// `hame memory`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct MemoryArgs {
    #[command(subcommand)]
    command: Option<MemoryCommand>,
    /// Without a subcommand: `show`.
    #[command(flatten)]
    show: InspectArgs,
}

#[derive(Debug, Subcommand)]
enum MemoryCommand {
    /// The caller's MEMORY.md and daily logs memory/YYYY-MM-DD.md (JSON: [{path, content}]).
    Show {
        #[command(flatten)]
        args: InspectArgs,
    },
    /// Full-text search over the caller's memory files (like the `memory_search` tool).
    Search {
        #[command(flatten)]
        args: InspectArgs,
        /// Most hits.
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Words to find.
        query: String,
    },
}

fn config_err(e: hame::harness::Error) -> anyhow::Error {
    if e.is_config() {
        anyhow::Error::new(ConfigError(e.to_string()))
    } else {
        anyhow::Error::new(e)
    }
}

/// One line of a record: its text, its tool calls, its tool results (clipped).
fn record_line(r: &hame::session::LogRecord) -> String {
    let role = format!("{:?}", r.role).to_ascii_lowercase();
    let mut parts = Vec::new();
    let text = r.message.text_content();
    if !text.trim().is_empty() {
        parts.push(text.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    for c in r.message.tool_calls() {
        parts.push(format!("→ {}({})", c.name, clip(&c.arguments, 200)));
    }
    for t in r.message.tool_results_iter() {
        let body = t.content.split_whitespace().collect::<Vec<_>>().join(" ");
        parts.push(format!("← {}", clip(&body, 200)));
    }
    format!("#{} {role}: {}", r.seq, parts.join(" "))
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

/// `hame sessions`.
pub(crate) async fn sessions(args: SessionsArgs) -> anyhow::Result<()> {
    match args.command {
        None => list(args.list).await,
        Some(SessionsCommand::List { args }) => list(args).await,
        Some(SessionsCommand::Show { args, id }) => {
            let (agent, ctx) = build_without_model(&args.common).await?;
            let records = agent
                .session_records(&ctx, &id)
                .await
                .map_err(config_err)?
                .ok_or_else(|| {
                    ConfigError(format!(
                        "no session {id} (of agent {}{}); `hame sessions` lists them",
                        agent.name(),
                        ctx.user_id
                            .as_deref()
                            .map(|u| format!(", user {u}"))
                            .unwrap_or_default()
                    ))
                })?;
            if args.json {
                println!("{}", serde_json::to_string(&records)?);
            } else {
                for r in &records {
                    println!("{}", record_line(r));
                }
            }
            Ok(())
        }
        Some(SessionsCommand::Search { args, limit, query }) => {
            let (agent, ctx) = build_without_model(&args.common).await?;
            let hits = agent
                .search_sessions(&ctx, &query, limit)
                .await
                .map_err(config_err)?;
            if args.json {
                let v: Vec<_> = hits
                    .iter()
                    .map(|h| {
                        serde_json::json!({"session": h.session, "seq": h.seq, "snippet": h.snippet, "score": h.score})
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(v));
            } else if hits.is_empty() {
                eprintln!("hame: no session record matches {query:?}");
            } else {
                for h in &hits {
                    let seq = h.seq.map_or_else(|| "?".to_owned(), |s| s.to_string());
                    println!("{} #{seq}: {}", h.session, h.snippet);
                }
            }
            Ok(())
        }
    }
}

async fn list(args: InspectArgs) -> anyhow::Result<()> {
    let (agent, ctx) = build_without_model(&args.common).await?;
    let entries = agent.sessions(&ctx).await.map_err(config_err)?;
    if args.json {
        println!("{}", serde_json::to_string(&entries)?);
        return Ok(());
    }
    if entries.is_empty() {
        eprintln!("hame: no sessions yet (agent {})", agent.name());
    }
    for e in &entries {
        println!(
            "{}\t{}\t{} messages\t{}",
            e.id,
            e.updated.format("%Y-%m-%d %H:%M"),
            e.message_count,
            e.title
        );
    }
    Ok(())
}

/// `hame memory`.
pub(crate) async fn memory(args: MemoryArgs) -> anyhow::Result<()> {
    match args.command {
        None => show_memory(args.show).await,
        Some(MemoryCommand::Show { args }) => show_memory(args).await,
        Some(MemoryCommand::Search { args, limit, query }) => {
            let (agent, ctx) = build_without_model(&args.common).await?;
            let hits = agent
                .search_memory(&ctx, &query, limit)
                .await
                .map_err(config_err)?;
            if args.json {
                let v: Vec<_> = hits
                    .iter()
                    .map(|h| serde_json::json!({"path": h.path, "line": h.line, "snippet": h.snippet, "score": h.score}))
                    .collect();
                println!("{}", serde_json::Value::Array(v));
            } else if hits.is_empty() {
                eprintln!("hame: nothing in memory matches {query:?}");
            } else {
                for h in &hits {
                    println!("{}:{}: {}", h.path, h.line, h.snippet);
                }
            }
            Ok(())
        }
    }
}

async fn show_memory(args: InspectArgs) -> anyhow::Result<()> {
    let (agent, ctx) = build_without_model(&args.common).await?;
    let files = agent.memory_files(&ctx).await.map_err(config_err)?;
    if args.json {
        let v: Vec<_> = files
            .iter()
            .map(|(p, c)| serde_json::json!({"path": p, "content": c}))
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return Ok(());
    }
    if files.is_empty() {
        eprintln!("hame: no memory yet (MEMORY.md and memory/*.md are written as sessions go on)");
    }
    for (path, content) in &files {
        println!("== {path} ==");
        print!("{content}");
        if !content.ends_with('\n') {
            println!();
        }
    }
    Ok(())
}
