//! A custom layer and a custom tool.
//!
//! - `AuditLayer` wraps every tool call: it times it and appends one JSON line per call to
//!   `audit/tools.jsonl` **in the caller's own files** (reached through the workspace
//!   handle, so each tenant's audit stays in its namespace).
//! - `word_count` is a tool that reads a file of the caller's workspace through the same
//!   handle (`ctx.workspace()?.files()`), never through a path of its own.
//!
//! Offline (a scripted in-process model that calls `word_count` once, then answers):
//!
//! ```sh
//! cargo run -p example-custom-layer -- ./ws
//! ```
//!
//! With a real model: `HAME_MODEL=openai:gpt-4o-mini OPENAI_API_KEY=... cargo run -p
//! example-custom-layer -- ./ws "How many words are in AGENTS.md?"`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::sync::Arc;
use std::time::Instant;

use hame::fs::{AppendOptions, FsPath};
use hame::test_support::{Reply, ScriptedModel};
use hame::{
    HarnessAgent, Layer, Message, RuntimeContext, ToolCall, ToolContext, ToolCtx, ToolError,
    ToolNext, ToolOutcome, ToolOutput, TypedTool, WorkspaceExt, async_trait, typed,
};
// `schemars` in scope is all the schema derive needs (`use hame::prelude::*` brings it too).
use hame::schemars::{self, JsonSchema};
use serde::Deserialize;

/// Appends `{"tool", "ms", "ok"}` per tool call to `audit/tools.jsonl` in the caller's files.
#[derive(Debug)]
struct AuditLayer;

#[async_trait]
impl Layer for AuditLayer {
    fn name(&self) -> &str {
        "audit"
    }

    async fn tool(&self, cx: &ToolCtx<'_>, call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        let name = call.name.clone();
        let started = Instant::now();
        let outcome = next.run(cx, call).await;
        let ok = matches!(&outcome, ToolOutcome::Done(Ok(_)));
        let line = serde_json::json!({
            "tool": name,
            "ms": started.elapsed().as_millis() as u64,
            "ok": ok,
        });
        if let Ok(ws) = cx.tool.workspace()
            && let Ok(path) = FsPath::parse("audit/tools.jsonl")
        {
            let bytes = format!("{line}\n").into_bytes();
            if let Err(e) = ws
                .files()
                .append(&path, bytes, AppendOptions::default())
                .await
            {
                eprintln!("audit line not written: {e}");
            }
        }
        outcome
    }
}

/// Arguments of `word_count`.
#[derive(Debug, Deserialize, JsonSchema)]
struct WordCountArgs {
    /// A workspace file, e.g. `AGENTS.md`.
    path: String,
}

/// Counts the words of a file in the caller's workspace.
#[derive(Debug)]
struct WordCount;

#[async_trait]
impl TypedTool for WordCount {
    type Args = WordCountArgs;

    fn name(&self) -> &str {
        "word_count"
    }

    fn description(&self) -> String {
        "Count the words of a file in your workspace.".into()
    }

    async fn run(&self, args: WordCountArgs, ctx: &ToolContext) -> ToolOutput {
        let files = ctx.workspace()?.files();
        let path =
            FsPath::parse(&args.path).map_err(|e| ToolError::invalid_arguments(e.to_string()))?;
        let bytes = files
            .read_bytes(&path)
            .await
            .map_err(|e| ToolError::new("file_not_found", e.to_string()))?;
        let words = String::from_utf8_lossy(&bytes).split_whitespace().count();
        Ok(format!("{} has {words} words", args.path))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let workspace = args.next().unwrap_or_else(|| "./ws".to_owned());
    let question = args
        .next()
        .unwrap_or_else(|| "How many words are in AGENTS.md?".to_owned());
    std::fs::create_dir_all(&workspace)?;
    let persona = std::path::Path::new(&workspace).join("AGENTS.md");
    if !persona.exists() {
        std::fs::write(&persona, "You are a terse assistant who counts words.\n")?;
    }

    let env = |k: &str| std::env::var(k).ok();
    let model = match env("HAME_MODEL") {
        Some(spec) => hame::model::open(&spec, &env)?,
        None => Arc::new(ScriptedModel::new([
            Reply::tools(&[ToolCall {
                id: "wc1".into(),
                name: "word_count".into(),
                arguments: r#"{"path": "AGENTS.md"}"#.into(),
            }]),
            Reply::text("AGENTS.md has 8 words."),
        ])),
    };
    let state = std::path::Path::new(&workspace).join(".state");
    let agent = HarnessAgent::builder()
        .name("counter")
        .model(model)
        .workspace(&workspace)
        .state_store(Arc::new(hame::state::JsonStore::open(&state)?))
        .tool(typed(WordCount))
        .layer(Arc::new(AuditLayer))
        .build()?;

    let ctx = RuntimeContext::new("example").with_user("me");
    let out = agent.call(Message::user(question), &ctx).await?;
    println!("{}", out.reply.text_content());

    // The audit line landed in this caller's files.
    let audit = agent
        .filesystem_for(&ctx)?
        .read_bytes(&FsPath::parse("audit/tools.jsonl")?)
        .await?;
    print!("audit: {}", String::from_utf8_lossy(&audit));
    Ok(())
}
