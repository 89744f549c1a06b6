#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{
    Message, Model, Role, RuntimeContext, ToolCall, ToolContext, ToolOutput, TypedTool, typed,
};
use hame_fs::{Filesystem, FsPath, Scope};
use hame_memory::ConsolidationOutcome;
use hame_state::{JsonStore, StateStore};
use pretty_assertions::assert_eq;
use schemars::JsonSchema;
use serde::Deserialize;

use super::background::{consolidate, consolidation_key, unflushed};
use super::*;
use crate::HarnessAgent;
use crate::tenancy::Tenancy;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Debug, Deserialize, JsonSchema)]
struct NoArgs {}

/// A tool that returns 300 KB.
#[derive(Debug)]
struct Dump;

#[async_trait]
impl TypedTool for Dump {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "dump"
    }
    fn description(&self) -> String {
        "dumps a lot".into()
    }
    async fn run(&self, _args: NoArgs, _ctx: &ToolContext) -> ToolOutput {
        Ok((0..3_000)
            .map(|i| format!("{i:06} {}\n", "y".repeat(92)))
            .collect())
    }
}

fn call(id: &str, name: &str, args: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.into(),
    }
}

/// An agent with the `dump` tool and `options`, its workspace `dir/ws` and its JSON state
/// under `dir/state`.
fn agent_in(
    dir: &Path,
    model: &ScriptedModel,
    options: MemoryOptions,
) -> crate::Result<HarnessAgent> {
    HarnessAgent::builder()
        .model(Arc::new(model.clone()))
        .workspace(dir.join("ws"))
        .state_store(Arc::new(JsonStore::open(dir.join("state")).unwrap()))
        .tool(typed(Dump))
        .memory(options)
        .build()
}

/// Memory with the after-call flush on or off, at `min_new_messages` unflushed messages.
fn flush_options(after_call: bool, min_new_messages: usize) -> MemoryOptions {
    MemoryOptions {
        flush_policy: FlushPolicy {
            after_call,
            min_new_messages,
        },
        ..MemoryOptions::default()
    }
}

fn last_tool_text(m: &Message) -> String {
    m.tool_results_iter()
        .map(|r| r.content.clone())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn large_results_are_offloaded_after_the_log_has_recorded_them() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedModel::new([
        Reply::tools(&[call("c1", "dump", "{}")]),
        Reply::text("seen it"),
    ]);
    let a = agent_in(dir.path(), &model, MemoryOptions::default())?;
    let ctx = RuntimeContext::new("s1").with_user("alice");
    a.call(Message::user("dump it"), &ctx).await?;

    // The model saw a preview.
    let requests = model.requests();
    let seen = last_tool_text(requests[1].messages.last().unwrap());
    assert!(seen.contains("too large for the context"), "{seen}");
    assert!(seen.len() < 6_000);
    // The file holds the whole result, in alice's home (`<workspace>/alice/`), and the
    // preview names it as alice's file tools see it.
    assert!(seen.contains("/alice/large_tool_results/c1-"), "{seen}");
    let fs = a.workspace_for(&ctx)?.home().clone();
    let listed = fs.list(&FsPath::parse("large_tool_results")?).await?;
    assert_eq!(listed.len(), 1);
    let file = listed[0].path.as_str().to_owned();
    assert!(file.starts_with("large_tool_results/c1-"), "{file}");
    let saved = fs.read_bytes(&FsPath::parse(&file)?).await?;
    assert_eq!(saved.len(), 300_000);
    // The state keeps the preview; the never-compacted log keeps the full result.
    let state = a.state(&ctx).await?.unwrap();
    let in_state = state
        .messages
        .iter()
        .find(|m| m.role == Role::Tool)
        .unwrap();
    assert!(last_tool_text(in_state).contains(&format!("/{file}")));
    let log = hame_session::SessionLog::new(a.workspace_for(&ctx)?.records().clone(), "hame")?;
    let records = log.read("s1", ..).await?;
    let logged = records
        .iter()
        .find(|r| r.role == Role::Tool)
        .map(|r| last_tool_text(&r.message))
        .unwrap();
    assert_eq!(logged.as_bytes(), &saved[..]);
    Ok(())
}

#[tokio::test]
async fn a_flush_missed_by_a_dead_process_is_redone_by_the_next_call() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ctx = RuntimeContext::new("s1").with_user("bob");
    // First process: two calls, and it died before flushing (no after-call flush).
    let first = ScriptedModel::new([Reply::text("noted"), Reply::text("sure")]);
    let a = agent_in(dir.path(), &first, flush_options(false, 4))?;
    a.call(Message::user("remember: bob likes tea"), &ctx)
        .await?;
    a.call(Message::user("and something else"), &ctx).await?;
    assert_eq!(unflushed(&a.state(&ctx).await?.unwrap()), 4);

    // Next process: its first call's flush covers the earlier messages too.
    let second = ScriptedModel::new([
        Reply::text("hello again"),
        Reply::text("- Bob likes tea"),
        Reply::text("# Memory\n\n- Bob likes tea\n"),
    ]);
    let options = flush_options(true, 4);
    let b = agent_in(dir.path(), &second, options)?;
    let out = b.call(Message::user("hi"), &ctx).await?;
    assert_eq!(out.reply.text_content(), "hello again");
    assert!(b.wait_background(Duration::from_secs(10)).await);
    let requests = second.requests();
    assert_eq!(requests.len(), 3, "call, flush, consolidation");
    let flush_prompt = requests[1].messages[0].text_content();
    assert!(
        flush_prompt.contains("#0 user: remember: bob likes tea"),
        "{flush_prompt}"
    );
    assert!(
        flush_prompt.contains("#5 assistant: hello again"),
        "{flush_prompt}"
    );
    let state = b.state(&ctx).await?.unwrap();
    assert_eq!(unflushed(&state), 0);
    let fs = b.workspace_for(&ctx)?.home().clone();
    let memory = fs.read_bytes(&FsPath::parse("MEMORY.md")?).await?;
    assert_eq!(String::from_utf8(memory)?, "# Memory\n\n- Bob likes tea\n");
    let today = hame_memory::daily::daily_log_path(chrono::Utc::now().date_naive());
    let log = String::from_utf8(fs.read_bytes(&FsPath::parse(&today)?).await?)?;
    assert!(
        log.contains("session s1 · messages #0..#5\n- Bob likes tea\n"),
        "{log}"
    );

    // Below the threshold nothing more is flushed.
    second.push(Reply::text("bye"));
    b.call(Message::user("bye"), &ctx).await?;
    assert!(b.wait_background(Duration::from_secs(10)).await);
    assert_eq!(second.requests().len(), 4);
    Ok(())
}

/// Calls that end while a flush of their session waits for the lease start no other one:
/// the waiting one loads the state under the lease and flushes their messages too.
#[tokio::test]
async fn one_after_call_flush_per_session_is_in_flight() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ctx = RuntimeContext::new("s1").with_user("bob");
    let model = ScriptedModel::new([Reply::text("noted"), Reply::text("sure")]);
    let a = agent_in(dir.path(), &model, flush_options(false, 2))?;
    a.call(Message::user("remember: bob likes tea"), &ctx)
        .await?;
    a.call(Message::user("and coffee"), &ctx).await?;
    let b = agent_in(dir.path(), &model, flush_options(true, 2))?;
    let layer = b.inner.memory.clone().ok_or("no memory layer")?;
    let store = b.inner.state_store.clone();
    let key = b.key(&ctx)?;
    let workspace = b.workspace_for(&ctx)?;
    // The session's next call holds the lease.
    let held = store
        .acquire(&key, hame_state::LeaseOptions::default())
        .await?;
    let mut wait = hame_state::LeaseOptions::default();
    wait.wait = Duration::from_secs(30);
    for unflushed in [4, 6, 8] {
        background::spawn_after_call(
            &layer,
            store.clone(),
            key.clone(),
            workspace.clone(),
            wait,
            unflushed,
        );
    }
    assert_eq!(layer.running(), 1, "one flush waits for the lease");
    model.push(Reply::text("- Bob likes tea and coffee"));
    model.push(Reply::text("# Memory\n\n- Bob likes tea and coffee\n"));
    held.release().await?;
    assert!(b.wait_background(Duration::from_secs(10)).await);
    assert_eq!(unflushed(&b.state(&ctx).await?.ok_or("no state")?), 0);
    // Its claim is gone with it: the next call's flush starts again.
    background::spawn_after_call(&layer, store, key, workspace, wait, 4);
    assert!(b.wait_background(Duration::from_secs(10)).await);
    Ok(())
}

#[tokio::test]
async fn memory_save_dedupes_and_search_finds_chinese_and_sessions() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedModel::new([
        Reply::tools(&[call("a", "memory_save", r#"{"fact":"用户喜欢喝乌龙茶"}"#)]),
        Reply::tools(&[call("b", "memory_save", r#"{"fact":"用户喜欢喝乌龙茶。"}"#)]),
        Reply::tools(&[call("c", "memory_search", r#"{"query":"乌龙茶"}"#)]),
        Reply::tools(&[call("d", "memory_get", r#"{"path":"/MEMORY.md"}"#)]),
        Reply::tools(&[call("e", "session_search", r#"{"query":"oolong"}"#)]),
        Reply::text("done"),
    ]);
    let a = agent_in(dir.path(), &model, MemoryOptions::default())?;
    let ctx = RuntimeContext::new("s1").with_user("carol");
    a.call(Message::user("I drink oolong, remember it"), &ctx)
        .await?;
    let results: Vec<String> = model
        .requests()
        .iter()
        .skip(1)
        .map(|r| last_tool_text(r.messages.last().unwrap()))
        .collect();
    assert!(results[0].starts_with("Saved to memory/"), "{}", results[0]);
    assert_eq!(results[1], "Already in memory: 用户喜欢喝乌龙茶。");
    assert!(results[2].contains("1 hits"), "{}", results[2]);
    assert!(results[2].contains("乌龙茶"), "{}", results[2]);
    assert!(results[2].contains(".md:3:"), "{}", results[2]);
    assert!(
        results[3].contains("MEMORY.md does not exist yet"),
        "{}",
        results[3]
    );
    assert!(results[4].contains("session s1 · #0:"), "{}", results[4]);
    assert!(results[4].contains("**oolong**"), "{}", results[4]);
    // Another user sees nothing of it.
    let other = RuntimeContext::new("s1").with_user("dave");
    let layer = layer_for(&a, dir.path())?;
    let (index, tenant) = layer.sync_memory(&a.workspace_for(&other)?).await?;
    assert!(
        index
            .search(&tenant, "乌龙茶", &Default::default())
            .await?
            .is_empty()
    );
    Ok(())
}

fn layer_for(a: &HarnessAgent, _dir: &Path) -> Result<MemoryLayer, Box<dyn std::error::Error>> {
    let model: Arc<dyn Model> = a.agent_loop().model().clone();
    let counter = hame_memory::counter_for_model("gpt-4o");
    Ok(MemoryLayer::new(
        MemoryOptions::default(),
        Scope::User,
        "hame",
        model,
        counter,
        a.workspace(),
    ))
}

#[tokio::test]
async fn one_replica_at_a_time_consolidates_a_tenant() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    let local: Arc<dyn Filesystem> = Arc::new(hame_fs::LocalFs::new(&ws)?);
    let tenancy = Arc::new(Tenancy::new(
        local.clone(),
        local,
        "hame",
        Scope::User,
        hame_tools::WorkspaceMode::IsolatedLocal,
        None,
    ));
    let model = ScriptedModel::new([Reply::text("# Memory\n\n- Erin uses Vim\n")]);
    let layer = MemoryLayer::new(
        MemoryOptions::default(),
        Scope::User,
        "hame",
        Arc::new(model.clone()),
        hame_memory::counter_for_model("gpt-4o"),
        &ws,
    );
    let store = JsonStore::open(dir.path().join("state"))?;
    let ctx = tenancy.workspace(&RuntimeContext::new("s9").with_user("erin"))?;
    let files = layer.files(&ctx);
    hame_memory::MemoryFiles::append(&files, "memory/2026-01-02.md", "- Erin uses Vim\n").await?;

    let key = consolidation_key(&layer, &ctx)?;
    assert_eq!(key.session(), MEMORY_LEASE_SESSION);
    assert_eq!(key.user(), Some("erin"));
    let held = store
        .try_acquire(&key, Duration::from_secs(30))
        .await?
        .unwrap();
    assert_eq!(
        consolidate(&layer, &store, &ctx).await?,
        ConsolidationOutcome::Throttled
    );
    assert!(model.requests().is_empty());
    held.release().await?;
    assert!(matches!(
        consolidate(&layer, &store, &ctx).await?,
        ConsolidationOutcome::Updated { .. }
    ));
    // Throttled now (at most every 30 minutes).
    hame_memory::MemoryFiles::append(&files, "memory/2026-01-02.md", "- more\n").await?;
    assert_eq!(
        consolidate(&layer, &store, &ctx).await?,
        ConsolidationOutcome::Throttled
    );
    // Other scopes use a hashed reserved id, never a user's session.
    let agent_layer = MemoryLayer::new(
        MemoryOptions::default(),
        Scope::Agent,
        "hame",
        Arc::new(model),
        hame_memory::counter_for_model("gpt-4o"),
        &ws,
    );
    let k = consolidation_key(&agent_layer, &ctx)?;
    assert!(k.session().starts_with("_memory-"), "{}", k.session());
    assert_eq!(k.user(), None);
    Ok(())
}
