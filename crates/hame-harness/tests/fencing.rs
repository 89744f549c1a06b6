//! A call whose session lease is lost stops writing: no further session-log record, and its
//! state save is refused (fenced), so a stale holder never overwrites its successor.

use std::sync::Arc;

use async_trait::async_trait;
use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{Message, RuntimeContext, Tool, ToolCall, ToolContext, ToolOutput, ToolSpec};
use hame_harness::HarnessAgent;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Plays a replica that paused past its lease: the store has given the lease away.
#[derive(Debug)]
struct LoseTheLease;

#[async_trait]
impl Tool for LoseTheLease {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "pause".into(),
            description: "pauses".into(),
            parameters: serde_json::json!({"type": "object", "properties": {}}).into(),
        }
    }
    async fn call(&self, _args: serde_json::Value, ctx: &ToolContext) -> ToolOutput {
        if let Some(lease) = ctx.extensions.get::<hame_state::Lease>() {
            lease.mark_lost();
        }
        Ok("paused".into())
    }
}

#[tokio::test]
async fn a_lost_lease_stops_every_durable_write() -> TestResult {
    let dir = tempfile::tempdir()?;
    let call = ToolCall {
        id: "p1".into(),
        name: "pause".into(),
        arguments: "{}".into(),
    };
    let agent = HarnessAgent::builder()
        .model(Arc::new(ScriptedModel::new([
            Reply::tools(&[call]),
            Reply::text("too late"),
        ])))
        .workspace(dir.path().join("ws"))
        .state_store(Arc::new(hame_state::JsonStore::open(
            dir.path().join("state"),
        )?))
        .memory(hame_harness::memory::MemoryOptions::disabled())
        .tool(Arc::new(LoseTheLease))
        .build()?;
    let ctx = RuntimeContext::new("s1").with_user("ada");
    let err = agent.call(Message::user("go"), &ctx).await.err();
    let text = err.map(|e| format!("{e} {e:?}")).unwrap_or_default();
    assert!(text.contains("lease"), "{text}");
    // Nothing reached the log once the lease was lost: not the tool result, not the reply,
    // not the step's messages still waiting to be written (they would interleave with the
    // successor's).
    let log = hame_session::SessionLog::new(agent.workspace_for(&ctx)?.records().clone(), "hame")?;
    let records = match log.read("s1", ..).await {
        Ok(r) => r,
        Err(e) if e.code() == hame_session::codes::SESSION_NOT_FOUND => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    assert!(
        records
            .iter()
            .all(|r| r.message.text_content() != "too late"),
        "{records:?}"
    );
    assert!(records.iter().all(|r| r.role != hame_core::Role::Tool));
    // And no state was saved by the stale holder.
    assert!(agent.state(&ctx).await?.is_none());
    Ok(())
}
