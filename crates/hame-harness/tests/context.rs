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

/// A tool that touches no file.
#[derive(Debug)]
struct Noop;

#[async_trait::async_trait]
impl hame_core::Tool for Noop {
    fn spec(&self) -> hame_core::ToolSpec {
        hame_core::ToolSpec {
            name: "noop".into(),
            description: "does nothing".into(),
            parameters: serde_json::json!({"type": "object", "properties": {}}).into(),
        }
    }
    async fn call(
        &self,
        _args: serde_json::Value,
        _ctx: &hame_core::ToolContext,
    ) -> hame_core::ToolOutput {
        Ok("ok".into())
    }
}

/// Sets the modification time of every file below `dir` to `age` ago.
fn backdate(dir: &std::path::Path, age: std::time::Duration) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            backdate(&path, age)?;
        } else {
            std::fs::File::options()
                .write(true)
                .open(&path)?
                .set_modified(std::time::SystemTime::now() - age)?;
        }
    }
    Ok(())
}

/// A workspace with 20 skills, 10 subagent specs, a knowledge folder of 5 files and a
/// `tools.json`, unchanged for a minute (a snapshot reads a file modified within the last
/// `RACY_WINDOW` again at the next step).
fn populated_workspace(ws: &Path) -> std::io::Result<()> {
    workspace_with(ws, 20, 10)
}

/// [`populated_workspace`] with `skills` skills and `specs` subagent specs (no `skills/`
/// or `subagents/` folder when 0).
fn workspace_with(ws: &Path, skills: usize, specs: usize) -> std::io::Result<()> {
    std::fs::create_dir_all(ws.join("knowledge/faq"))?;
    std::fs::write(ws.join("AGENTS.md"), "You are careful.\n")?;
    std::fs::write(ws.join("knowledge/KNOWLEDGE.md"), "Catalogue.\n")?;
    for i in 0..5 {
        std::fs::write(ws.join(format!("knowledge/faq/q{i}.md")), "answer")?;
    }
    for i in 0..skills {
        std::fs::create_dir_all(ws.join(format!("skills/skill-{i}")))?;
        std::fs::write(
            ws.join(format!("skills/skill-{i}/SKILL.md")),
            format!(
                "---\ndescription: Skill number {i}. Use when asked for {i}.\n---\n# Skill {i}\nSteps.\n"
            ),
        )?;
    }
    for i in 0..specs {
        std::fs::create_dir_all(ws.join("subagents"))?;
        std::fs::write(
            ws.join(format!("subagents/agent-{i}.md")),
            format!("---\ndescription: Reviewer number {i}\nmax_iterations: 4\n---\nYou review.\n"),
        )?;
    }
    std::fs::write(
        ws.join("tools.json"),
        r#"{"permissions": {"allow": ["noop", "read_file", "load_skill", "agent_spawn"], "deny": ["execute"]}}"#,
    )?;
    backdate(ws, std::time::Duration::from_secs(60))
}

/// An agent over the template `ws` in store mode on `store` (counted), with `Noop`.
fn store_agent(
    ws: &Path,
    store: &hame_fs::CountingFs,
    model: ScriptedModel,
) -> Result<HarnessAgent, hame_harness::Error> {
    HarnessAgent::builder()
        .model(Arc::new(model))
        .workspace(ws)
        .tool(Arc::new(Noop))
        .filesystem(hame_harness::FilesystemMode::SharedStore {
            store: Arc::new(store.clone()),
        })
        .state_store(Arc::new(hame_state::InMemoryStore::new()))
        .allow_local_state_with_shared_filesystem(true)
        .memory(hame_harness::memory::MemoryOptions::disabled())
        .build()
}

/// What the store did in a call of `agent` (after a first call that warms what a session
/// does once: its index, its folders), per kind of operation.
async fn counted_call(
    agent: &HarnessAgent,
    store: &hame_fs::CountingFs,
    session: &str,
) -> Result<(hame_core::CallOutput, hame_fs::FsCounts), Box<dyn std::error::Error>> {
    agent
        .call(
            Message::user("warm"),
            &RuntimeContext::new("warm").with_user("ada"),
        )
        .await?;
    store.reset();
    let ctx = RuntimeContext::new(session).with_user("ada");
    let out = agent.call(Message::user("go"), &ctx).await?;
    Ok((out, store.counts()))
}

/// A scripted tool call.
fn tool_call(id: &str, name: &str, args: serde_json::Value) -> hame_core::ToolCall {
    hame_core::ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.to_string(),
    }
}

/// Issue #34's measure: operations on the shared store per step (each one a Redis or S3
/// round trip in store mode), nothing changing between steps, a tool that touches no file:
/// at most 4 whatever the number of skills and specs — with 20 skills, 10 subagent specs,
/// a knowledge folder and a `tools.json` in the workspace, and with no skill and no spec.
/// Counted by a `CountingFs` around the store, as the difference between a call of 11
/// steps and a call of 1 step (so what a call does once — state, lease, log flush —
/// cancels out).
#[tokio::test]
async fn store_operations_per_unchanged_step() -> TestResult {
    for (skills, specs) in [(20, 10), (0, 0)] {
        store_operations_per_step_with(skills, specs).await?;
    }
    Ok(())
}

#[allow(clippy::print_stderr)]
async fn store_operations_per_step_with(skills: usize, specs: usize) -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    workspace_with(&ws, skills, specs)?;
    let store = hame_fs::CountingFs::new(Arc::new(hame_fs::InMemoryFs::new()));
    let ops = |steps: usize, session: &'static str| {
        let ws = ws.clone();
        let store = store.clone();
        async move {
            let mut replies = vec![Reply::text("warm")];
            replies.extend((0..steps.saturating_sub(1)).map(|i| {
                Reply::tools(&[tool_call(&format!("c{i}"), "noop", serde_json::json!({}))])
            }));
            replies.push(Reply::text("done"));
            let agent = store_agent(&ws, &store, ScriptedModel::new(replies))?;
            let (out, counts) = counted_call(&agent, &store, session).await?;
            assert_eq!(out.iterations, steps);
            Ok::<_, Box<dyn std::error::Error>>(counts)
        }
    };
    let one = ops(1, "s1").await?;
    let eleven = ops(11, "s11").await?;
    let per_step = (eleven.total() as f64 - one.total() as f64) / 10.0;
    let mut by_op: Vec<String> = eleven
        .ops
        .iter()
        .map(|(k, v)| format!("{k}={:.1}", (*v as f64 - one.of(k) as f64) / 10.0))
        .collect();
    by_op.sort();
    eprintln!(
        "{skills} skills, {specs} specs: store operations per unchanged step: {per_step:.1} ({}); a 1-step call: {}",
        by_op.join(", "),
        one.total()
    );
    let of = |k: &str| (eleven.of(k) as f64 - one.of(k) as f64) / 10.0;
    assert_eq!(
        of("read_bytes") + of("exists"),
        0.0,
        "nothing read: {by_op:?}"
    );
    // The workspace costs its snapshot's probe only: one `list_many` of the tenant's
    // root and of everything below knowledge/, skills/ and subagents/ (ADR 0042).
    assert_eq!(of("list_many"), 1.0, "{by_op:?}");
    assert_eq!(of("list") + of("glob"), 0.0, "{by_op:?}");
    // The session log checks its tail once per call, not per step (under the session's
    // lease, `TailCheck::TrustWhileLeased`).
    assert_eq!(of("stat"), 0.0, "{by_op:?}");
    // Appends per step: the log's one, and the tool call's intent (issue #31), which
    // carries the `done` of the step before; + 0.1 the `done` of the call's last tool call
    // (written at the end of the call) and + 0.1 the call's observations (ADR 0035), which
    // the 1-step call (no tool call) makes neither of: per call, not per step.
    assert!(of("append") <= 2.2 + 1e-9, "{by_op:?}");
    // Issue #34's figure.
    assert!(
        per_step <= 4.0 + 1e-9,
        "{per_step} store operations per step: {by_op:?}"
    );
    Ok(())
}

/// Issue #34: `load_skill` and `agent_spawn` read the step's snapshot, not the store: a
/// call that loads a skill and names a subagent reads nothing from the store beyond what
/// a call of as many steps of a tool that touches no file reads (a new session's first
/// step reads what its namespace lacks: the same in both).
#[tokio::test]
async fn load_skill_and_agent_spawn_read_the_snapshot() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    populated_workspace(&ws)?;
    let reads = |calls: [hame_core::ToolCall; 2]| {
        let ws = ws.clone();
        async move {
            let store = hame_fs::CountingFs::new(Arc::new(hame_fs::InMemoryFs::new()));
            let [a, b] = calls;
            let model = ScriptedModel::new([
                Reply::text("warm"),
                Reply::tools(&[a]),
                Reply::tools(&[b]),
                Reply::text("done"),
            ]);
            let agent = store_agent(&ws, &store, model.clone())?;
            let (_, counts) = counted_call(&agent, &store, "s1").await?;
            let results: Vec<String> = model
                .requests()
                .iter()
                .flat_map(|r| r.messages.iter())
                .flat_map(|m| m.tool_results_iter())
                .map(|r| r.content.clone())
                .collect();
            Ok::<_, Box<dyn std::error::Error>>((counts.of("read_bytes"), results))
        }
    };
    let noop = || tool_call("c", "noop", serde_json::json!({}));
    let (baseline, _) = reads([noop(), noop()]).await?;
    let (read, results) = reads([
        tool_call("c0", "load_skill", serde_json::json!({"name": "skill-7"})),
        tool_call(
            "c1",
            "agent_spawn",
            serde_json::json!({"agent_id": "no-such-agent", "task": "review"}),
        ),
    ])
    .await?;
    // The skill's instructions, and the spawn's refusal listing the snapshot's specs.
    assert!(
        results.iter().any(|r| r.contains("# Skill 7")),
        "{results:?}"
    );
    assert!(
        results
            .iter()
            .any(|r| r.contains("no-such-agent") && r.contains("agent-9")),
        "{results:?}"
    );
    assert_eq!(read, baseline, "load_skill or agent_spawn read the store");
    Ok(())
}

/// `tools.json` is read once per step, and an edit made by a tool shows at the next step
/// of the same call: the next request no longer offers the denied tool, and a call of it
/// is refused.
#[tokio::test]
async fn a_tools_json_edit_applies_at_the_next_step() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    let call = tool_call;
    let model = ScriptedModel::new([
        Reply::tools(&[call("c0", "noop", serde_json::json!({}))]),
        Reply::tools(&[call(
            "c1",
            "write_file",
            serde_json::json!({"file_path": "tools.json",
                               "content": "{\"deny\": [\"noop\"]}"}),
        )]),
        Reply::tools(&[call("c2", "noop", serde_json::json!({}))]),
        Reply::text("done"),
    ]);
    let agent = HarnessAgent::builder()
        .model(Arc::new(model.clone()))
        .workspace(&ws)
        .tool(Arc::new(Noop))
        .state_store(Arc::new(hame_state::InMemoryStore::new()))
        .memory(hame_harness::memory::MemoryOptions::disabled())
        .build()?;
    let events = turn(&agent, Message::user("go"), &RuntimeContext::new("s1")).await;
    let results: Vec<(String, bool)> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolFinished { name, is_error, .. } => Some((name.clone(), *is_error)),
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        vec![
            ("noop".to_owned(), false),
            ("write_file".to_owned(), false),
            ("noop".to_owned(), true),
        ],
        "{events:?}"
    );
    let offered = |i: usize| model.requests()[i].tools.iter().any(|t| t.name == "noop");
    assert!(offered(0) && offered(1) && !offered(2) && !offered(3));
    Ok(())
}

/// Issue #34: the prompt comes from one snapshot per step, and an edit a tool makes shows
/// at the next step — `AGENTS.md` overridden in the tenant's store namespace and a new
/// skill — while the unchanged template files are not read again.
#[tokio::test]
async fn an_edit_shows_at_the_next_step_through_the_snapshot() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("skills/old"))?;
    std::fs::write(ws.join("AGENTS.md"), "You are careful.\n")?;
    std::fs::write(
        ws.join("skills/old/SKILL.md"),
        "---\ndescription: The old skill.\n---\nSteps.\n",
    )?;
    backdate(&ws, std::time::Duration::from_secs(60))?;
    let call = tool_call;
    let model = ScriptedModel::new([
        Reply::tools(&[call(
            "c0",
            "read_file",
            serde_json::json!({"file_path": "AGENTS.md"}),
        )]),
        Reply::tools(&[
            call(
                "c1",
                "write_file",
                serde_json::json!({"file_path": "AGENTS.md", "content": "You are bold.\n"}),
            ),
            call(
                "c2",
                "write_file",
                serde_json::json!({"file_path": "skills/fresh/SKILL.md",
                                   "content": "---\ndescription: The fresh skill.\n---\nGo.\n"}),
            ),
        ]),
        Reply::tools(&[call("c3", "noop", serde_json::json!({}))]),
        Reply::text("done"),
    ]);
    let store = hame_fs::CountingFs::new(Arc::new(hame_fs::InMemoryFs::new()));
    let agent = store_agent(&ws, &store, model.clone())?;
    let events = turn(
        &agent,
        Message::user("go"),
        &RuntimeContext::new("s1").with_user("ada"),
    )
    .await;
    let failed: Vec<_> = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::ToolFinished { is_error: true, .. }))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    let system = |i: usize| model.requests()[i].system.clone();
    for i in 0..2 {
        assert!(system(i).contains("You are careful."), "{}", system(i));
        assert!(!system(i).contains("fresh"), "{}", system(i));
    }
    for i in 2..4 {
        assert!(system(i).contains("You are bold."), "{}", system(i));
        assert!(!system(i).contains("You are careful."), "{}", system(i));
        assert!(system(i).contains("The fresh skill."), "{}", system(i));
        assert!(system(i).contains("The old skill."), "{}", system(i));
    }
    Ok(())
}
