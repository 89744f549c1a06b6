//! Workspace files in the prompt: a file that is not UTF-8 is not dropped silently, and no
//! file is sent whole past its budget.

use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;
use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{AgentEvent, Message, RuntimeContext};
use hame_harness::{HarnessAgent, MAX_CONTEXT_FILE_BYTES};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// An agent over the workspace `ws` with `model` and an in-memory state store.
fn agent_over(ws: &Path, model: &ScriptedModel) -> Result<HarnessAgent, hame_harness::Error> {
    HarnessAgent::builder()
        .model(Arc::new(model.clone()))
        .workspace(ws)
        .state_store(Arc::new(hame_state::InMemoryStore::new()))
        .build()
}

/// One call of `agent` with `message`, streamed to its end; its events.
async fn turn(agent: &HarnessAgent, message: Message, ctx: &RuntimeContext) -> Vec<AgentEvent> {
    agent.stream(message, ctx).collect().await
}

#[tokio::test]
async fn invalid_utf8_is_kept_and_reported_and_large_files_are_cut() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("knowledge"))?;
    // "café" in Latin-1: one byte that is not UTF-8.
    std::fs::write(ws.join("AGENTS.md"), b"You are Hamish, caf\xe9 owner.\n")?;
    let big = "fact. ".repeat(50_000); // 300 KB
    std::fs::write(ws.join("knowledge/KNOWLEDGE.md"), &big)?;
    let model = ScriptedModel::new([Reply::text("ok")]);
    let agent = agent_over(&ws, &model)?;
    let events: Vec<AgentEvent> =
        turn(&agent, Message::user("hi"), &RuntimeContext::new("s1")).await;
    let system = model
        .requests()
        .first()
        .map(|r| r.system.clone())
        .unwrap_or_default();
    // The persona is there, with the bad byte replaced, not dropped.
    assert!(
        system.contains("You are Hamish, caf\u{fffd} owner."),
        "{system}"
    );
    let warned = events.iter().any(|e| {
        matches!(e, AgentEvent::Custom { kind, data }
            if kind == "workspace.invalid_utf8" && data["path"] == "AGENTS.md")
    });
    assert!(warned, "{events:?}");
    // KNOWLEDGE.md is cut to its budget with a note.
    assert!(
        system.len() < MAX_CONTEXT_FILE_BYTES + 20_000,
        "{} bytes",
        system.len()
    );
    assert!(system.contains("only the first 65536 are shown"), "no note");
    Ok(())
}

/// Skills and subagent specs are parsed once per text (a memo), but read at every step: an
/// edit between two calls of one agent shows in the second call's prompt, and the first
/// text, written back, shows again.
#[tokio::test]
async fn edited_skills_and_subagents_show_in_the_next_call() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("skills/tidy"))?;
    std::fs::create_dir_all(ws.join("subagents"))?;
    let skill = |d: &str| format!("---\ndescription: {d}\n---\n# Tidy\nTidy things.\n");
    let spec = |d: &str| format!("---\ndescription: {d}\n---\nYou review.\n");
    let model = ScriptedModel::new([Reply::text("1"), Reply::text("2"), Reply::text("3")]);
    let agent = agent_over(&ws, &model)?;
    let ctx = RuntimeContext::new("s1");
    let versions = [
        ("Tidies the alpha files", "Reviews alpha changes"),
        ("Tidies the beta files", "Reviews beta changes"),
        ("Tidies the alpha files", "Reviews alpha changes"),
    ];
    for (i, (s, a)) in versions.iter().enumerate() {
        std::fs::write(ws.join("skills/tidy/SKILL.md"), skill(s))?;
        std::fs::write(ws.join("subagents/reviewer.md"), spec(a))?;
        turn(&agent, Message::user(format!("call {i}")), &ctx).await;
        let system = model
            .requests()
            .get(i)
            .map(|r| r.system.clone())
            .unwrap_or_default();
        assert!(system.contains(s), "call {i}: {system}");
        assert!(system.contains(a), "call {i}: {system}");
        let (other_s, other_a) = versions[1 - (i % 2)];
        assert!(!system.contains(other_s), "call {i}: a stale skill");
        assert!(!system.contains(other_a), "call {i}: a stale spec");
    }
    Ok(())
}

/// The knowledge files a system prompt lists.
fn listed(system: &str) -> usize {
    system
        .lines()
        .filter(|l| l.starts_with("- knowledge/"))
        .count()
}

/// A knowledge tree over `MAX_LISTED_FILES` (besides `KNOWLEDGE.md`) is listed up to the
/// limit, and the prompt says there are more; one at the limit is listed whole, without
/// the note.
#[tokio::test]
async fn a_knowledge_tree_over_the_limit_is_cut_with_a_note() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    for d in 0..4 {
        std::fs::create_dir_all(ws.join(format!("knowledge/t{d}")))?;
    }
    // KNOWLEDGE.md goes into the prompt whole: it is not one of the listed files.
    std::fs::write(ws.join("knowledge/KNOWLEDGE.md"), "Facts.")?;
    let total = hame_harness::MAX_LISTED_FILES + 3;
    for i in 0..total {
        std::fs::write(ws.join(format!("knowledge/t{}/n{i:04}.md", i % 4)), "x")?;
    }
    let model = ScriptedModel::new([Reply::text("1"), Reply::text("2")]);
    let agent = agent_over(&ws, &model)?;
    let system = |i: usize| {
        model
            .requests()
            .get(i)
            .map(|r| r.system.clone())
            .unwrap_or_default()
    };
    turn(&agent, Message::user("hi"), &RuntimeContext::new("s1")).await;
    let cut = system(0);
    assert_eq!(listed(&cut), hame_harness::MAX_LISTED_FILES);
    assert!(
        cut.contains(&format!(
            "(only the first {} are listed: list_files or glob_files under knowledge/ finds the others)",
            hame_harness::MAX_LISTED_FILES
        )),
        "{cut}"
    );
    // Down to the limit: every file listed, no note.
    for i in 0..3 {
        std::fs::remove_file(ws.join(format!("knowledge/t{}/n{i:04}.md", i % 4)))?;
    }
    turn(&agent, Message::user("again"), &RuntimeContext::new("s1")).await;
    let whole = system(1);
    assert_eq!(listed(&whole), hame_harness::MAX_LISTED_FILES);
    assert!(
        !whole.contains("only the first"),
        "a note without more files"
    );
    Ok(())
}
