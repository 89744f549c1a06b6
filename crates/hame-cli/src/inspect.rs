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
    /// One line per tool call of the session: when, tool, outcome, duration and the tool's
    /// facts (JSON: the observation records of `<session>.observations.jsonl`).
    Observations {
        #[command(flatten)]
        args: InspectArgs,
        /// The session id.
        id: String,
    },
    /// The session's task state: goal, progress (the todo list), requirements (candidate
    /// or confirmed) and evidence (JSON: `{goal, todos, requirements, evidence}`).
    Task {
        #[command(flatten)]
        args: InspectArgs,
        /// The session id.
        id: String,
    },
    /// What the model saw in each request of the session: every section (system prompt
    /// parts, message ranges, the compaction summary, tool schemas) with its hash, tokens
    /// and transform (JSON: the manifests of `<session>.context.jsonl`).
    Context {
        #[command(flatten)]
        args: InspectArgs,
        /// Only the Nth model request of the session (1-based, in order).
        #[arg(long)]
        step: Option<usize>,
        /// The session id.
        id: String,
    },
    /// The current evidence of each check of the session (`stale` when a covered file
    /// changed since; JSON: the evidence records).
    Evidence {
        #[command(flatten)]
        args: InspectArgs,
        /// The session id.
        id: String,
    },
}

/// `hame requirements`.
#[derive(Debug, Subcommand)]
pub(crate) enum RequirementsCommand {
    /// Confirm requirement ID of session S (prints it; exit 2 when there is none).
    Confirm {
        #[command(flatten)]
        common: Common,
        /// The session id.
        #[arg(value_name = "S")]
        session_id: String,
        /// The requirement id (`rq-1`).
        id: String,
    },
}

/// `hame requirements`.
pub(crate) async fn requirements(command: RequirementsCommand) -> anyhow::Result<()> {
    match command {
        RequirementsCommand::Confirm {
            common,
            session_id: session,
            id,
        } => {
            let (agent, mut ctx) = build_without_model(&common).await?;
            hame::harness::validate_id("session id", &session)
                .map_err(|e| ConfigError(e.to_string()))?;
            ctx.session_id = session;
            let r = agent
                .confirm_requirement(&ctx, &id)
                .await
                .map_err(config_err)?;
            println!("{} confirmed: {}", r.id, r.text);
            Ok(())
        }
    }
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

/// Prints what a listing command found: with `--json` (`json`) the list as `to_json`
/// writes it; else `empty` on stderr when there is nothing; else the list as `text`
/// writes it.
fn print_list<T>(
    items: &[T],
    json: bool,
    to_json: impl FnOnce(&[T]) -> serde_json::Result<String>,
    empty: &str,
    text: impl FnOnce(&[T]),
) -> anyhow::Result<()> {
    if json {
        println!("{}", to_json(items)?);
    } else if items.is_empty() {
        eprintln!("{empty}");
    } else {
        text(items);
    }
    Ok(())
}

/// A search hit as `hame sessions search` and `hame memory search` print it.
trait Hit {
    /// The hit with `--json`.
    fn object(&self) -> serde_json::Value;
    /// The hit's line.
    fn line(&self) -> String;
}

impl Hit for hame::harness::SessionHit {
    fn object(&self) -> serde_json::Value {
        serde_json::json!({"session": self.session, "seq": self.seq, "snippet": self.snippet, "score": self.score})
    }
    fn line(&self) -> String {
        let seq = self.seq.map_or_else(|| "?".to_owned(), |s| s.to_string());
        format!("{} #{seq}: {}", self.session, self.snippet)
    }
}

impl Hit for hame::memory::Hit {
    fn object(&self) -> serde_json::Value {
        serde_json::json!({"path": self.path, "line": self.line, "snippet": self.snippet, "score": self.score})
    }
    fn line(&self) -> String {
        format!("{}:{}: {}", self.path, self.line, self.snippet)
    }
}

/// Prints search hits: with `--json` one JSON array on one line, else a line a hit
/// (`empty` on stderr when there is none).
fn print_hits<H: Hit>(hits: &[H], json: bool, empty: &str) -> anyhow::Result<()> {
    print_list(
        hits,
        json,
        |hits| json_array(hits, H::object),
        empty,
        |hits| {
            for h in hits {
                println!("{}", h.line());
            }
        },
    )
}

/// `items` as one JSON array of `item`s, on one line.
fn json_array<T>(
    items: &[T],
    item: impl FnMut(&T) -> serde_json::Value,
) -> serde_json::Result<String> {
    Ok(serde_json::Value::Array(items.iter().map(item).collect()).to_string())
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
        Some(SessionsCommand::Observations { args, id }) => {
            let (agent, ctx) = build_without_model(&args.common).await?;
            let observations = agent
                .session_observations(&ctx, &id)
                .await
                .map_err(config_err)?;
            print_list(
                &observations,
                args.json,
                serde_json::to_string_pretty,
                &format!("no observations in session {id}"),
                |observations| {
                    for o in observations {
                        let facts = serde_json::Value::Object(o.facts.clone());
                        println!(
                            "{} {} {} #{} {} {}ms {}{}",
                            o.started.format("%Y-%m-%d %H:%M:%S"),
                            o.id,
                            o.tool,
                            o.attempt,
                            o.outcome.as_str(),
                            o.duration_ms,
                            o.code
                                .as_deref()
                                .map(|c| format!("[{c}] "))
                                .unwrap_or_default(),
                            if o.facts.is_empty() {
                                String::new()
                            } else {
                                facts.to_string()
                            }
                        );
                    }
                },
            )
        }
        Some(SessionsCommand::Task { args, id }) => {
            let (agent, mut ctx) = build_without_model(&args.common).await?;
            hame::harness::validate_id("session id", &id)
                .map_err(|e| ConfigError(e.to_string()))?;
            ctx.session_id = id.clone();
            let state = agent.state(&ctx).await.map_err(config_err)?;
            let task = state
                .as_ref()
                .map(hame::harness::task::TaskState::of)
                .unwrap_or_default();
            let todos = state
                .as_ref()
                .and_then(|s| s.extensions.get(hame::harness::permissions::STATE_KEY))
                .and_then(|p| p.get("todos"))
                .cloned()
                .unwrap_or_else(|| serde_json::json!([]));
            let evidence = agent
                .session_evidence(&ctx, &id)
                .await
                .map_err(config_err)?;
            if args.json {
                let obj = serde_json::json!({
                    "session": id,
                    "goal": task.goal,
                    "todos": todos,
                    "requirements": task.requirements,
                    "evidence": evidence,
                });
                println!("{}", serde_json::to_string_pretty(&obj)?);
            } else {
                println!("goal: {}", task.goal.as_deref().unwrap_or("(none)"));
                let items = todos.as_array().cloned().unwrap_or_default();
                let done = items.iter().filter(|t| t["status"] == "completed").count();
                println!("progress: {done} of {} todo items completed", items.len());
                for t in &items {
                    println!(
                        "  [{}] {}",
                        t["status"].as_str().unwrap_or("?"),
                        t["content"].as_str().unwrap_or_default()
                    );
                }
                println!("requirements:");
                for r in &task.requirements {
                    let status = match r.status {
                        hame::harness::task::RequirementStatus::Candidate => "candidate",
                        hame::harness::task::RequirementStatus::Confirmed => "confirmed",
                    };
                    println!(
                        "  {} {status}: {}{}",
                        r.id,
                        r.text,
                        r.check
                            .as_deref()
                            .map(|c| format!(" (check {c})"))
                            .unwrap_or_default()
                    );
                }
                println!("evidence:");
                for line in crate::run::evidence_lines(&evidence).lines() {
                    println!("  {line}");
                }
            }
            Ok(())
        }
        Some(SessionsCommand::Context { args, step, id }) => {
            let (agent, ctx) = build_without_model(&args.common).await?;
            let manifests = agent
                .session_manifests(&ctx, &id)
                .await
                .map_err(config_err)?;
            let picked: Vec<(usize, &hame::harness::manifest::Manifest)> = manifests
                .iter()
                .enumerate()
                .map(|(i, m)| (i + 1, m))
                .filter(|(n, _)| step.is_none_or(|s| s == *n))
                .collect();
            if let Some(s) = step
                && picked.is_empty()
            {
                return Err(ConfigError(format!(
                    "session {id} has {} model requests; --step {s} is not one of them",
                    manifests.len()
                ))
                .into());
            }
            if args.json {
                let v: Vec<serde_json::Value> = picked
                    .iter()
                    .map(|(n, m)| {
                        let mut v = serde_json::to_value(m).unwrap_or_default();
                        v["request"] = serde_json::json!(n);
                        v
                    })
                    .collect();
                let out = if step.is_some() {
                    v.into_iter().next().unwrap_or_default()
                } else {
                    serde_json::Value::Array(v)
                };
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                for (n, m) in picked {
                    println!(
                        "request {n} (step {} of call {}): {} tokens{}",
                        m.step,
                        m.call_id,
                        m.tokens,
                        m.provider_prompt_tokens
                            .map(|p| format!(", provider {p}"))
                            .unwrap_or_default()
                    );
                    for s in &m.sections {
                        println!(
                            "  {:>7}  {:<10}  {}  {}{}",
                            s.tokens,
                            serde_json::to_value(s.transform)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_owned))
                                .unwrap_or_default(),
                            s.hash,
                            s.source,
                            s.why
                                .as_deref()
                                .map(|w| format!(" ({w})"))
                                .unwrap_or_default()
                        );
                    }
                }
            }
            Ok(())
        }
        Some(SessionsCommand::Evidence { args, id }) => {
            let (agent, ctx) = build_without_model(&args.common).await?;
            let evidence = agent
                .session_evidence(&ctx, &id)
                .await
                .map_err(config_err)?;
            print_list(
                &evidence,
                args.json,
                serde_json::to_string_pretty,
                &format!("no evidence in session {id}"),
                |e| print!("{}", crate::run::evidence_lines(e)),
            )
        }
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
            search(args, &query, limit, Index::Sessions).await
        }
    }
}

/// The index `hame sessions search` and `hame memory search` look in.
enum Index {
    Sessions,
    Memory,
}

/// The hits of `query` in `index` (at most `limit`), or one line saying there are none.
async fn search(args: InspectArgs, query: &str, limit: usize, index: Index) -> anyhow::Result<()> {
    let (agent, ctx) = build_without_model(&args.common).await?;
    match index {
        Index::Sessions => {
            let hits = agent.search_sessions(&ctx, query, limit).await;
            let empty = format!("hame: no session record matches {query:?}");
            print_hits(&hits.map_err(config_err)?, args.json, &empty)
        }
        Index::Memory => {
            let hits = agent.search_memory(&ctx, query, limit).await;
            let empty = format!("hame: nothing in memory matches {query:?}");
            print_hits(&hits.map_err(config_err)?, args.json, &empty)
        }
    }
}

async fn list(args: InspectArgs) -> anyhow::Result<()> {
    let (agent, ctx) = build_without_model(&args.common).await?;
    let entries = agent.sessions(&ctx).await.map_err(config_err)?;
    print_list(
        &entries,
        args.json,
        serde_json::to_string,
        &format!("hame: no sessions yet (agent {})", agent.name()),
        |entries| {
            for e in entries {
                println!(
                    "{}\t{}\t{} messages\t{}",
                    e.id,
                    e.updated.format("%Y-%m-%d %H:%M"),
                    e.message_count,
                    e.title
                );
            }
        },
    )
}

/// `hame memory`.
pub(crate) async fn memory(args: MemoryArgs) -> anyhow::Result<()> {
    match args.command {
        None => show_memory(args.show).await,
        Some(MemoryCommand::Show { args }) => show_memory(args).await,
        Some(MemoryCommand::Search { args, limit, query }) => {
            search(args, &query, limit, Index::Memory).await
        }
    }
}

async fn show_memory(args: InspectArgs) -> anyhow::Result<()> {
    let (agent, ctx) = build_without_model(&args.common).await?;
    let files = agent.memory_files(&ctx).await.map_err(config_err)?;
    print_list(
        &files,
        args.json,
        |files| json_array(files, |(p, c)| serde_json::json!({"path": p, "content": c})),
        "hame: no memory yet (MEMORY.md and memory/*.md are written as sessions go on)",
        |files| {
            for (path, content) in files {
                println!("== {path} ==");
                print!("{content}");
                if !content.ends_with('\n') {
                    println!();
                }
            }
        },
    )
}
