//! A tool call suspended in one process is resumed in another: the pending step travels
//! with the saved state, nothing else.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use async_trait::async_trait;
use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{
    CancellationToken, EventSink, Layer, Message, Resolution, RuntimeContext, Suspension, ToolCall,
    ToolCtx, ToolNext, ToolOutcome,
};
use hame_harness::HarnessAgent;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Asks before every `write_file`; `{"approve": true}` lets it run.
#[derive(Debug)]
struct AskBeforeWrite;

#[async_trait]
impl Layer for AskBeforeWrite {
    fn name(&self) -> &str {
        "ask-before-write"
    }
    async fn tool(&self, cx: &ToolCtx<'_>, call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        if call.name != "write_file" {
            return next.run(cx, call).await;
        }
        match cx.resumed_for(self.name()) {
            Some(r) if r.resolution.value["approve"] == true => next.run(cx, call).await,
            Some(_) => ToolOutcome::Done(Err(hame_core::ToolError::new(
                hame_core::codes::DENIED,
                "the user said no",
            ))),
            None => ToolOutcome::Suspend(Suspension::new(self.name(), "writing needs approval")),
        }
    }
}

fn agent(dir: &Path, replies: Vec<Reply>) -> Result<HarnessAgent, Box<dyn std::error::Error>> {
    Ok(HarnessAgent::builder()
        .model(Arc::new(ScriptedModel::new(replies)))
        .workspace(dir.join("ws"))
        .state_store(Arc::new(hame_state::JsonStore::open(dir.join("state"))?))
        .memory(hame_harness::memory::MemoryOptions::disabled())
        .layer(Arc::new(AskBeforeWrite))
        .build()?)
}

fn ctx() -> RuntimeContext {
    RuntimeContext::new("s1").with_user("alice")
}

const CHILD_DIR: &str = "HAME_TEST_SUSPEND_DIR";

/// The first process (the test binary started again by the test, with [`CHILD_DIR`] set).
async fn child_suspends_a_write(dir: PathBuf) -> TestResult {
    let call = ToolCall {
        id: "w1".into(),
        name: "write_file".into(),
        arguments: r#"{"file_path": "out/hello.txt", "content": "hi"}"#.into(),
    };
    let a = agent(&dir, vec![Reply::tools(&[call])])?;
    let err = a.call(Message::user("write hello"), &ctx()).await.err();
    let Some(hame_harness::Error::Call(hame_core::Error::Suspended(s))) = err else {
        return Err(format!("expected a suspension, got {err:?}").into());
    };
    std::fs::write(dir.join("id"), &s.calls[0].suspension.id)?;
    Ok(())
}

#[tokio::test]
async fn suspend_in_one_process_resume_in_another() -> TestResult {
    if let Some(dir) = std::env::var_os(CHILD_DIR) {
        return child_suspends_a_write(PathBuf::from(dir)).await;
    }
    let dir = tempfile::tempdir()?;
    let out = Command::new(std::env::current_exe()?)
        .args([
            "suspend_in_one_process_resume_in_another",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_DIR, dir.path())
        .output()?;
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let id = std::fs::read_to_string(dir.path().join("id"))?;
    assert!(id.starts_with("ap-"), "{id}");

    // This process never saw the call: everything comes from the saved state.
    let a = agent(dir.path(), vec![Reply::text("written")])?;
    let pending = a.pending(&ctx()).await?.ok_or("nothing pending")?;
    assert_eq!(pending.calls[0].suspension.id, id);
    assert_eq!(pending.calls[0].call.name, "write_file");
    // The file was not written while suspended.
    let files = a.filesystem_for(&ctx())?;
    let path = hame_fs::FsPath::parse("out/hello.txt")?;
    assert!(files.read_bytes(&path).await.is_err());

    let reply = a
        .resume(
            vec![Resolution::new(&id, serde_json::json!({"approve": true}))],
            &ctx(),
            &EventSink::none(),
            &CancellationToken::new(),
        )
        .await?;
    assert_eq!(reply.reply.text_content(), "written");
    assert_eq!(files.read_bytes(&path).await?, b"hi");
    let state = a.state(&ctx()).await?.ok_or("no state")?;
    assert!(state.pending.is_none());
    // user, assistant(write_file), tool result, final answer.
    assert_eq!(state.messages.len(), 4);
    let result = state.messages[2]
        .tool_results_iter()
        .next()
        .ok_or("no result")?;
    assert!(!result.is_error, "{}", result.content);

    // The session log has the whole exchange, each message once, in order.
    let log = hame_session::SessionLog::new(a.workspace_for(&ctx())?.records().clone(), "hame")?;
    let records = log.read("s1", ..).await?;
    let roles: Vec<_> = records.iter().map(|r| r.role).collect();
    use hame_core::Role::*;
    assert_eq!(roles, vec![User, Assistant, Tool, Assistant]);
    Ok(())
}
