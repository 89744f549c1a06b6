//! How the session-log layer flushes: a call with tool steps pays one flush for its log
//! (tool results are appended without one, the next synced append or an explicit sync at the
//! call's end covers them), the call's observations are flushed at the same time as the log
//! (ADR 0043), and the log is always flushed before the call's state is saved.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{AppendNext, CallCtx, Layer, Message, Role, RuntimeContext, ToolCall};
use hame_fs::{AppendOptions, Durability, FsPath, InMemoryFs, Result as FsResult};
use hame_harness::{FilesystemMode, HarnessAgent};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One append to a session log: its size and durability.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LogAppend {
    bytes: usize,
    durability: Durability,
}

/// The shared store, recording the appends to session logs. With a meeting point, it also
/// holds each synced append to a session log or to its observations until the other one has
/// started too (or a timeout), and records whether they met.
#[derive(Debug, Default)]
struct Recording {
    inner: InMemoryFs,
    appends: Mutex<Vec<LogAppend>>,
    meeting: Option<tokio::sync::Barrier>,
    met: Mutex<Vec<(&'static str, bool)>>,
}

impl Recording {
    fn with_meeting() -> Self {
        Self {
            meeting: Some(tokio::sync::Barrier::new(2)),
            ..Self::default()
        }
    }

    fn appends(&self) -> Vec<LogAppend> {
        self.appends.lock().map(|a| a.clone()).unwrap_or_default()
    }

    fn met(&self) -> Vec<(&'static str, bool)> {
        self.met.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Waits at the meeting point (when there is one) for a synced append of `path`.
    async fn meet(&self, path: &FsPath, durability: Durability) {
        let file = if path.as_str().ends_with(".log.jsonl") {
            "log"
        } else if path.as_str().ends_with(".observations.jsonl") {
            "observations"
        } else {
            return;
        };
        let (Some(barrier), Durability::Synced) = (&self.meeting, durability) else {
            return;
        };
        let met = tokio::time::timeout(std::time::Duration::from_secs(2), barrier.wait())
            .await
            .is_ok();
        if let Ok(mut m) = self.met.lock() {
            m.push((file, met));
        }
    }
}

hame_fs::forward_filesystem! {
    impl Filesystem for Recording {
        inner = |s| &s.inner;
        forward = [
            stat, list, read_bytes, write, delete, rename, exists, read_range, edit, grep, glob,
            list_many,
        ];
        async fn append(
            &self,
            path: &FsPath,
            data: Vec<u8>,
            options: AppendOptions,
        ) -> FsResult<()> {
            if path.as_str().ends_with(".log.jsonl")
                && let Ok(mut a) = self.appends.lock()
            {
                a.push(LogAppend {
                    bytes: data.len(),
                    durability: options.durability,
                });
            }
            self.meet(path, options.durability).await;
            self.inner.append(path, data, options).await
        }
    }
}

/// The state that was saved holds as many messages as the session's log.
async fn log_holds_the_saved_state(agent: &HarnessAgent, ctx: &RuntimeContext) -> TestResult {
    let state = agent.state(ctx).await?.ok_or("no state saved")?;
    let log = hame_session::SessionLog::new(agent.workspace_for(ctx)?.records().clone(), "hame")?;
    assert_eq!(log.read("s1", ..).await?.len(), state.messages.len());
    Ok(())
}

fn read_call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "read_file".into(),
        arguments: r#"{"path": "notes.md"}"#.into(),
    }
}

/// Refuses every message that would close the turn (an assistant message without tool
/// calls): a call stopped after a tool result then has nothing more to append.
#[derive(Debug)]
struct RefuseClosingMessages;

#[async_trait]
impl Layer for RefuseClosingMessages {
    fn name(&self) -> &str {
        "refuse-closing"
    }

    async fn append(
        &self,
        cx: &mut CallCtx<'_>,
        message: Message,
        next: AppendNext<'_>,
    ) -> Result<(), hame_core::Error> {
        if message.role == Role::Assistant && !message.has_tool_calls() {
            return Err(hame_core::Error::other("refused"));
        }
        next.run(cx, message).await
    }
}

fn agent(
    dir: &std::path::Path,
    store: Arc<Recording>,
    replies: Vec<Reply>,
    max_iterations: usize,
) -> Result<HarnessAgent, Box<dyn std::error::Error>> {
    builder(dir, store, replies, max_iterations)?
        .build()
        .map_err(Into::into)
}

fn builder(
    dir: &std::path::Path,
    store: Arc<Recording>,
    replies: Vec<Reply>,
    max_iterations: usize,
) -> Result<hame_harness::HarnessAgentBuilder, Box<dyn std::error::Error>> {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws)?;
    std::fs::write(ws.join("notes.md"), "a note\n")?;
    Ok(HarnessAgent::builder()
        .model(Arc::new(ScriptedModel::new(replies)))
        .workspace(ws)
        .filesystem(FilesystemMode::SharedStore { store })
        .allow_local_state_with_shared_filesystem(true)
        .state_store(Arc::new(hame_state::JsonStore::open(dir.join("state"))?))
        .memory(hame_harness::memory::MemoryOptions::disabled())
        .max_iterations(max_iterations))
}

#[tokio::test]
async fn a_call_with_two_tool_steps_flushes_its_log_once_at_the_end() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Recording::default());
    let agent = agent(
        dir.path(),
        store.clone(),
        vec![
            Reply::tools(&[read_call("r1")]),
            Reply::tools(&[read_call("r2")]),
            Reply::text("done"),
        ],
        10,
    )?;
    let ctx = RuntimeContext::new("s1").with_user("ada");
    let out = agent.call(Message::user("read it twice"), &ctx).await?;
    assert_eq!(out.reply.text_content(), "done");
    let appends = store.appends();
    let shape: Vec<(bool, Durability)> = appends
        .iter()
        .map(|a| (a.bytes > 0, a.durability))
        .collect();
    // Step 1 (user, call, result) and step 2 (call, result) unflushed; the reply flushes.
    assert_eq!(
        shape,
        vec![
            (true, Durability::Atomic),
            (true, Durability::Atomic),
            (true, Durability::Synced),
        ],
        "{appends:?}"
    );
    // Every message is in the log, in order.
    let log = hame_session::SessionLog::new(agent.workspace_for(&ctx)?.records().clone(), "hame")?;
    let records = log.read("s1", ..).await?;
    assert_eq!(records.len(), 6, "{records:?}");
    assert_eq!(records[5].message.text_content(), "done");
    Ok(())
}

#[tokio::test]
async fn a_call_that_stops_after_a_tool_result_syncs_its_log_before_the_state_is_saved()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Recording::default());
    // One step allowed: the call ends with the step limit right after the tool ran, and
    // the message closing the failed turn is refused by a layer outside the log's.
    let agent = builder(
        dir.path(),
        store.clone(),
        vec![Reply::tools(&[read_call("r1")]), Reply::text("never")],
        1,
    )?
    .outer_layer(Arc::new(RefuseClosingMessages))
    .build()?;
    let ctx = RuntimeContext::new("s1").with_user("ada");
    let err = agent.call(Message::user("read it"), &ctx).await.err();
    assert!(
        err.as_ref().is_some_and(|e| e.to_string().contains("step")),
        "{err:?}"
    );
    let appends = store.appends();
    // The step's records unflushed, then an empty synced append: the flush.
    assert_eq!(
        appends,
        vec![
            LogAppend {
                bytes: appends.first().map_or(0, |a| a.bytes),
                durability: Durability::Atomic,
            },
            LogAppend {
                bytes: 0,
                durability: Durability::Synced,
            },
        ],
    );
    assert!(appends[0].bytes > 0);
    log_holds_the_saved_state(&agent, &ctx).await
}

#[tokio::test]
async fn a_call_whose_model_fails_after_a_tool_result_ends_with_a_synced_append() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Recording::default());
    // The second step has no scripted reply: the model fails after the tool ran, and the
    // loop records the failure in the conversation.
    let agent = agent(
        dir.path(),
        store.clone(),
        vec![Reply::tools(&[read_call("r1")])],
        10,
    )?;
    let ctx = RuntimeContext::new("s1").with_user("ada");
    assert!(agent.call(Message::user("read it"), &ctx).await.is_err());
    let appends = store.appends();
    assert_eq!(
        appends.iter().map(|a| a.durability).collect::<Vec<_>>(),
        vec![Durability::Atomic, Durability::Synced],
        "{appends:?}"
    );
    log_holds_the_saved_state(&agent, &ctx).await
}

#[tokio::test]
async fn a_call_without_tools_appends_once_synced() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Recording::default());
    let agent = agent(dir.path(), store.clone(), vec![Reply::text("hello")], 10)?;
    let ctx = RuntimeContext::new("s1").with_user("ada");
    agent.call(Message::user("hi"), &ctx).await?;
    let durabilities: Vec<Durability> = store.appends().iter().map(|a| a.durability).collect();
    assert_eq!(durabilities, vec![Durability::Synced]);
    Ok(())
}

#[tokio::test]
async fn the_log_and_the_observations_are_flushed_at_the_same_time() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(Recording::with_meeting());
    let agent = agent(
        dir.path(),
        store.clone(),
        vec![Reply::tools(&[read_call("r1")]), Reply::text("done")],
        10,
    )?;
    let ctx = RuntimeContext::new("s1").with_user("ada");
    let out = agent.call(Message::user("read it"), &ctx).await?;
    assert_eq!(out.reply.text_content(), "done");
    // One synced append each, in flight together (each waited for the other).
    let mut met = store.met();
    met.sort_unstable();
    assert_eq!(met, vec![("log", true), ("observations", true)]);
    // Both are in the files, and the state saved after them matches the log.
    let log = hame_session::SessionLog::new(agent.workspace_for(&ctx)?.records().clone(), "hame")?;
    assert_eq!(log.read_observations("s1").await?.len(), 1);
    log_holds_the_saved_state(&agent, &ctx).await
}
