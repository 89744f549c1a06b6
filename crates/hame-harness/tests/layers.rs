//! The layer stack: where the built-ins sit, and what a user layer sees from inside or
//! outside them.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{
    AppendNext, CallCtx, Layer, Message, ModelNext, ModelRequest, ModelResponse, Role,
    RuntimeContext, Tool, ToolCall, ToolContext, ToolOutput, ToolSpec,
};
use hame_harness::HarnessAgent;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Records the system prompt of each request and the tool results it sees joining.
#[derive(Debug, Default)]
struct Probe {
    name: &'static str,
    systems: Mutex<Vec<String>>,
    results: Mutex<Vec<usize>>,
}

#[async_trait]
impl Layer for Probe {
    fn name(&self) -> &str {
        self.name
    }
    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        request: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse, hame_core::Error> {
        if let Ok(mut s) = self.systems.lock() {
            s.push(request.system.clone());
        }
        next.run(cx, request).await
    }
    async fn append(
        &self,
        cx: &mut CallCtx<'_>,
        message: Message,
        next: AppendNext<'_>,
    ) -> Result<(), hame_core::Error> {
        if message.role == Role::Tool
            && let Ok(mut r) = self.results.lock()
        {
            r.extend(message.tool_results_iter().map(|t| t.content.len()));
        }
        next.run(cx, message).await
    }
}

/// Returns 300,000 characters.
#[derive(Debug)]
struct Big;

#[async_trait]
impl Tool for Big {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "big".into(),
            description: "a large result".into(),
            parameters: serde_json::json!({"type": "object", "properties": {}}).into(),
        }
    }
    async fn call(&self, _args: serde_json::Value, _ctx: &ToolContext) -> ToolOutput {
        Ok("x".repeat(300_000))
    }
}

fn names(agent: &HarnessAgent) -> Vec<String> {
    agent
        .agent_loop()
        .layers()
        .iter()
        .map(|l| l.name().to_owned())
        .collect()
}

#[test]
fn built_ins_sit_between_outer_and_inner_user_layers() -> TestResult {
    let dir = tempfile::tempdir()?;
    let build = |memory: bool| -> Result<HarnessAgent, Box<dyn std::error::Error>> {
        let mut b = HarnessAgent::builder()
            .model(Arc::new(ScriptedModel::new([])))
            .workspace(dir.path().join("ws"))
            .state_store(Arc::new(hame_state::InMemoryStore::new()))
            .layer(Arc::new(Probe {
                name: "inner-1",
                ..Probe::default()
            }))
            .outer_layer(Arc::new(Probe {
                name: "outer-1",
                ..Probe::default()
            }))
            .layer(Arc::new(Probe {
                name: "inner-2",
                ..Probe::default()
            }));
        if !memory {
            b = b.memory(hame_harness::memory::MemoryOptions::disabled());
        }
        Ok(b.build()?)
    };
    let with_memory = names(&build(true)?);
    assert_eq!(
        with_memory,
        [
            "outer-1",
            "workspace-snapshot",
            "subagents",
            "caller-history",
            "intents",
            "session-log",
            "verify",
            "observations",
            "workspace-context",
            "compaction",
            "offload",
            "task",
            "caller",
            "inner-1",
            "inner-2",
            "permissions",
            "intent-records",
            "catalog",
            "tools-config",
            "budget",
            "context-manifest"
        ]
    );
    // Without memory: the same order, less the two memory layers.
    let without: Vec<String> = with_memory
        .into_iter()
        .filter(|n| n != "compaction" && n != "offload")
        .collect();
    assert_eq!(names(&build(false)?), without);
    Ok(())
}

#[tokio::test]
async fn inner_layers_see_the_final_prompt_and_the_offloaded_result() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    std::fs::write(ws.join("AGENTS.md"), "You are Hamish.")?;
    let outer = Arc::new(Probe {
        name: "outer",
        ..Probe::default()
    });
    let inner = Arc::new(Probe {
        name: "inner",
        ..Probe::default()
    });
    let call = ToolCall {
        id: "b1".into(),
        name: "big".into(),
        arguments: "{}".into(),
    };
    let agent = HarnessAgent::builder()
        .model(Arc::new(ScriptedModel::new([
            Reply::tools(&[call]),
            Reply::text("done"),
        ])))
        .workspace(&ws)
        .system_prompt("BASE")
        .state_store(Arc::new(hame_state::InMemoryStore::new()))
        .tool(Arc::new(Big))
        .outer_layer(outer.clone())
        .layer(inner.clone())
        .build()?;
    let ctx = RuntimeContext::new("s1").with_user("alice");
    agent.call(Message::user("go"), &ctx).await?;

    // Outside the workspace-context layer the prompt is the builder's; inside it is the
    // rebuilt one with the persona.
    let outer_systems = outer.systems.lock().map(|s| s.clone()).unwrap_or_default();
    let inner_systems = inner.systems.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(outer_systems, ["BASE", "BASE"]);
    assert_eq!(inner_systems.len(), 2);
    assert!(
        inner_systems
            .iter()
            .all(|s| s.starts_with("BASE") && s.contains("You are Hamish."))
    );

    // Outside the offload layer the result is whole (that is what the session log
    // records); inside it, and in the state, it is the preview.
    let outer_results = outer.results.lock().map(|r| r.clone()).unwrap_or_default();
    let inner_results = inner.results.lock().map(|r| r.clone()).unwrap_or_default();
    assert_eq!(outer_results, [300_000]);
    assert_eq!(inner_results.len(), 1);
    assert!(inner_results[0] < 10_000, "{inner_results:?}");
    let state = agent.state(&ctx).await?.ok_or("no state")?;
    let in_state = state.messages[2]
        .tool_results_iter()
        .next()
        .map(|r| r.content.len());
    assert_eq!(in_state, Some(inner_results[0]));
    let log = hame_session::SessionLog::new(agent.workspace_for(&ctx)?.records().clone(), "hame")?;
    let logged: Vec<usize> = log
        .read("s1", ..)
        .await?
        .iter()
        .flat_map(|r| {
            r.message
                .tool_results_iter()
                .map(|t| t.content.len())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(logged, [300_000]);
    Ok(())
}

#[tokio::test]
async fn allow_and_deny_reach_the_tool_set() -> TestResult {
    let dir = tempfile::tempdir()?;
    let agent = HarnessAgent::builder()
        .model(Arc::new(ScriptedModel::new([])))
        .workspace(dir.path().join("ws"))
        .state_store(Arc::new(hame_state::InMemoryStore::new()))
        .allow_tools(["read_file", "execute", "list_files"])
        .deny_tools(["execute"])
        .build()?;
    assert_eq!(
        agent.agent_loop().tools().names(),
        ["list_files", "read_file"]
    );
    Ok(())
}

/// In one process the session index is written by a session's first call only; later
/// calls leave the file alone and the listing still counts every record, with the time of
/// the last one.
#[tokio::test]
async fn later_calls_leave_the_index_file_and_the_listing_follows_the_log() -> TestResult {
    let dir = tempfile::tempdir()?;
    let agent = HarnessAgent::builder()
        .model(Arc::new(ScriptedModel::new([
            Reply::text("one"),
            Reply::text("two"),
            Reply::text("three"),
        ])))
        .workspace(dir.path().join("ws"))
        .state_store(Arc::new(hame_state::InMemoryStore::new()))
        .memory(hame_harness::memory::MemoryOptions::disabled())
        .build()?;
    let ctx = RuntimeContext::new("s1").with_user("ada");
    agent.call(Message::user("first question"), &ctx).await?;
    let records = agent.workspace_for(&ctx)?.records().clone();
    let index = hame_fs::FsPath::parse("agents/hame/sessions/index/s1.json")?;
    let written = records.read_bytes(&index).await?;
    agent.call(Message::user("second"), &ctx).await?;
    agent.call(Message::user("third"), &ctx).await?;
    assert_eq!(records.read_bytes(&index).await?, written);
    let log = hame_session::SessionLog::new(records, "hame")?;
    let last = log
        .read("s1", ..)
        .await?
        .last()
        .map(|r| r.time)
        .ok_or("empty log")?;
    let listed = log.list_sessions().await?;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].title, "first question");
    assert_eq!(listed[0].message_count, 6);
    assert_eq!(listed[0].updated, last);
    assert_eq!(log.session("s1").await?, Some(listed[0].clone()));
    Ok(())
}

/// Issue #34: compaction's summary request does not go through the layer stack, and its
/// spend is still counted: the session's spend record holds every request the model got,
/// the summary included.
#[tokio::test]
async fn a_compaction_summary_counts_in_the_sessions_spend() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut memory = hame_harness::memory::MemoryOptions::default();
    memory.compaction.max_messages = 4;
    memory.compaction.keep_recent_messages = 2;
    // No flush after calls (it runs outside a call, in the background).
    memory.flush_policy.after_call = false;
    // Every reply: a text answer of 10 input and 5 output tokens (the summary as well).
    let model = ScriptedModel::new((0..12).map(|i| Reply::text(&format!("answer {i}"))));
    let agent = HarnessAgent::builder()
        .model(Arc::new(model.clone()))
        .workspace(dir.path().join("ws"))
        .state_store(Arc::new(hame_state::InMemoryStore::new()))
        .memory(memory)
        .build()?;
    let ctx = RuntimeContext::new("s1");
    for i in 0..4 {
        agent.call(Message::user(format!("turn {i}")), &ctx).await?;
    }
    let requests = model.requests();
    let summaries = requests.iter().filter(|r| r.tools.is_empty()).count();
    assert!(
        summaries >= 1,
        "a compaction ran: {} requests",
        requests.len()
    );
    let state = agent.state(&ctx).await?.ok_or("saved")?;
    let spent = hame_harness::cost::SpendRecord::of(&state).total();
    assert_eq!(spent.requests, requests.len() as u64);
    assert_eq!(spent.usage.input_tokens, 10 * requests.len() as u64);
    Ok(())
}
