//! The runtime with a runner that needs no model: the concurrency bound, time limits,
//! cancellation, and delivery through the layer exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use hame_core::{Extensions, RuntimeContext, Tool, ToolContext, Usage};
use hame_subagent::{
    ChildReply, ChildRun, ParentCall, SubagentOptions, SubagentRunner, SubagentSpec, Subagents,
    TaskStatus,
};
use hame_tools::{Identity, Workspace, WorkspaceMode};
use pretty_assertions::assert_eq;
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Answers after `delay`, counting how many run at once; a cancelled run ends at once.
#[derive(Debug, Default)]
struct Slow {
    delay: Duration,
    now: AtomicUsize,
    peak: AtomicUsize,
    fail: bool,
}

#[async_trait]
impl SubagentRunner for Slow {
    async fn run(&self, run: ChildRun) -> Result<ChildReply, String> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(n, Ordering::SeqCst);
        let out = tokio::select! {
            _ = tokio::time::sleep(self.delay) => Ok(()),
            _ = run.cancel.cancelled() => Err("it was cancelled".to_owned()),
        };
        self.now.fetch_sub(1, Ordering::SeqCst);
        out?;
        if self.fail {
            return Err("model error: authentication failed (401)".into());
        }
        Ok(ChildReply {
            text: format!("did {}", run.message),
            iterations: 1,
            usage: Usage::default(),
        })
    }
}

fn setup(
    runner: Arc<Slow>,
    options: SubagentOptions,
) -> (Arc<Subagents>, ToolContext, Vec<Arc<dyn Tool>>) {
    let subagents = Arc::new(Subagents::new(
        "hame",
        options,
        vec![SubagentSpec::new("worker", "Works", "You work.").into()],
    ));
    subagents.set_runner(runner);
    let fs: Arc<dyn hame_fs::Filesystem> = Arc::new(hame_fs::InMemoryFs::new());
    let ws = Workspace::new(
        Identity::new("hame", Some("u1"), "s1"),
        WorkspaceMode::IsolatedLocal,
        fs.clone(),
        fs,
    );
    let mut ext = Extensions::new();
    ext.insert(ws);
    ext.insert(ParentCall::default());
    let ctx = ToolContext::new(RuntimeContext::new("s1").with_user("u1"), "c").with_extensions(ext);
    let tools = hame_subagent::subagent_tools(&subagents);
    (subagents, ctx, tools)
}

fn tool<'a>(tools: &'a [Arc<dyn Tool>], name: &str) -> &'a Arc<dyn Tool> {
    tools
        .iter()
        .find(|t| t.spec().name == name)
        .unwrap_or_else(|| panic!("no tool {name}"))
}

/// Calls tool `name` of `tools` with `args` in `ctx`.
async fn call(
    tools: &[Arc<dyn Tool>],
    name: &str,
    args: serde_json::Value,
    ctx: &ToolContext,
) -> hame_core::ToolOutput {
    tool(tools, name).call(args, ctx).await
}

/// `agent_spawn` of `worker` with `task`, waiting for it.
async fn spawn(tools: &[Arc<dyn Tool>], task: &str, ctx: &ToolContext) -> hame_core::ToolOutput {
    let args = json!({"agent_id": "worker", "task": task});
    call(tools, "agent_spawn", args, ctx).await
}

/// [`setup`] with a runner that answers at once and the default options.
fn setup_default() -> (Arc<Subagents>, ToolContext, Vec<Arc<dyn Tool>>) {
    setup(Arc::new(Slow::default()), SubagentOptions::default())
}

/// `agent_spawn` of `worker` with task `t` in the background.
async fn spawn_in_background(tools: &[Arc<dyn Tool>], ctx: &ToolContext) -> hame_core::ToolOutput {
    let args = json!({"agent_id": "worker", "task": "t", "background": true});
    call(tools, "agent_spawn", args, ctx).await
}

/// A runner that answers after `delay`.
fn slow(delay: Duration) -> Arc<Slow> {
    Arc::new(Slow {
        delay,
        ..Slow::default()
    })
}

/// The workspace of `ctx`.
fn ws_of(ctx: &ToolContext) -> Result<Workspace, &'static str> {
    ctx.extensions.get::<Workspace>().cloned().ok_or("ws")
}

fn task_id(text: &str) -> String {
    let at = text.find("task-").unwrap_or(0);
    text[at..at + 17].to_owned()
}

#[tokio::test]
async fn a_hundred_background_children_run_under_the_bound_and_leave_nothing() -> TestResult {
    let runner = slow(Duration::from_millis(20));
    let options = SubagentOptions {
        max_concurrency: 4,
        ..SubagentOptions::default()
    };
    let (subagents, ctx, tools) = setup(runner.clone(), options);
    let spawn = tool(&tools, "agent_spawn");
    let calls = (0..100).map(|i| {
        spawn.call(
            json!({"agent_id": "worker", "task": format!("job {i}"), "background": true}),
            &ctx,
        )
    });
    for out in futures::future::join_all(calls).await {
        let out = out?;
        assert!(
            out.contains("status: pending") || out.contains("status: running"),
            "{out}"
        );
    }
    assert_eq!(subagents.wait_idle(Duration::from_secs(30)).await, 0);
    assert!(
        runner.peak.load(Ordering::SeqCst) <= 4,
        "peak {}",
        runner.peak.load(Ordering::SeqCst)
    );
    let ws = ws_of(&ctx)?;
    let records = subagents.sweep(&ws).await?;
    assert_eq!(records.len(), 100);
    assert!(records.iter().all(|r| r.status == TaskStatus::Completed));
    // Delivered results free their entries.
    let finished = subagents.take_finished(&ws);
    assert_eq!(finished.len(), 100);
    assert_eq!(subagents.running(), 0);
    assert!(subagents.take_finished(&ws).is_empty());
    Ok(())
}

#[tokio::test]
async fn a_child_past_its_time_limit_is_failed() -> TestResult {
    let (_, ctx, _) = setup_default();
    let subagents = Arc::new(Subagents::new(
        "hame",
        SubagentOptions::default(),
        vec![
            SubagentSpec::new("worker", "Works", "You work.")
                .with_timeout_seconds(1)
                .into(),
        ],
    ));
    subagents.set_runner(slow(Duration::from_secs(30)));
    let spawn = hame_subagent::subagent_tools(&subagents).remove(0);
    let started = std::time::Instant::now();
    let out = spawn
        .call(json!({"agent_id": "worker", "task": "forever"}), &ctx)
        .await;
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = out
        .err()
        .ok_or("a timed-out child must be an error result")?;
    assert_eq!(err.code, "subagent_failed");
    assert!(
        err.message.contains("timed out after 1 s"),
        "{}",
        err.message
    );
    Ok(())
}

#[tokio::test]
async fn a_failing_child_is_an_error_result_and_a_failed_record() -> TestResult {
    let runner = Arc::new(Slow {
        fail: true,
        ..Slow::default()
    });
    let (subagents, ctx, tools) = setup(runner, SubagentOptions::default());
    let err = spawn(&tools, "t", &ctx)
        .await
        .err()
        .ok_or("expected an error")?;
    assert!(
        err.message.contains("failed: model error"),
        "{}",
        err.message
    );
    let ws = ws_of(&ctx)?;
    let records = subagents.sweep(&ws).await?;
    assert_eq!(records[0].status, TaskStatus::Failed);
    Ok(())
}

#[tokio::test]
async fn cancel_stops_a_running_child_and_its_record_says_so() -> TestResult {
    let runner = slow(Duration::from_secs(30));
    let (_subagents, ctx, tools) = setup(runner, SubagentOptions::default());
    let out = spawn_in_background(&tools, &ctx).await?;
    let id = task_id(&out);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let out = call(&tools, "task_cancel", json!({"task_id": id}), &ctx).await?;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(out.contains("status: cancelled"), "{out}");
    // A second cancel is refused; task_output reports the outcome.
    assert!(
        call(&tools, "task_cancel", json!({"task_id": id}), &ctx)
            .await
            .is_err()
    );
    let out = call(&tools, "task_output", json!({"task_id": id}), &ctx).await?;
    assert!(
        out.contains("status: cancelled") && out.contains("task_cancel"),
        "{out}"
    );
    Ok(())
}

#[tokio::test]
async fn a_sync_spawn_past_its_wait_keeps_running_in_the_background() -> TestResult {
    let runner = slow(Duration::from_millis(1500));
    let (_subagents, ctx, tools) = setup(runner, SubagentOptions::default());
    let out = tool(&tools, "agent_spawn")
        .call(
            json!({"agent_id": "worker", "task": "t", "timeout_seconds": 1}),
            &ctx,
        )
        .await?;
    assert!(out.contains("keeps running as background task"), "{out}");
    let id = task_id(&out);
    let out = call(
        &tools,
        "task_output",
        json!({"task_id": id, "wait_seconds": 10}),
        &ctx,
    )
    .await?;
    assert!(
        out.contains("status: completed") && out.contains("did t"),
        "{out}"
    );
    Ok(())
}

#[tokio::test]
async fn hostile_ids_are_refused() -> TestResult {
    let (_subagents, ctx, tools) = setup_default();
    for id in ["../../etc/passwd", "task-../x", "task-zzzzzzzzzzzz"] {
        let err = call(&tools, "task_output", json!({"task_id": id}), &ctx)
            .await
            .err()
            .ok_or("accepted")?;
        assert_eq!(err.code, "unknown_task", "{id}");
    }
    let err = call(
        &tools,
        "agent_spawn",
        json!({"agent_id": "../x", "task": "t"}),
        &ctx,
    )
    .await
    .err()
    .ok_or("accepted")?;
    assert_eq!(err.code, "unknown_subagent");
    assert!(err.message.contains("available: worker"), "{}", err.message);
    Ok(())
}

#[tokio::test]
async fn another_sessions_task_is_not_visible() -> TestResult {
    let (subagents, ctx, tools) = setup_default();
    let out = spawn(&tools, "t", &ctx).await?;
    let id = task_id(&out);
    let ws = ws_of(&ctx)?;
    let mut other_ext = Extensions::new();
    other_ext.insert(ws.for_session("s2"));
    let other =
        ToolContext::new(RuntimeContext::new("s2").with_user("u1"), "c").with_extensions(other_ext);
    let err = call(&tools, "task_output", json!({"task_id": id}), &other)
        .await
        .err()
        .ok_or("another session read the task")?;
    assert_eq!(err.code, "unknown_task");
    assert_eq!(
        call(&tools, "task_list", json!({}), &other).await?,
        "no tasks in this session"
    );
    let _ = subagents;
    Ok(())
}

#[tokio::test]
async fn depth_is_enforced_at_every_level() -> TestResult {
    let (_s, ctx, tools) = setup_default();
    let mut deep = ctx.clone();
    deep.runtime = deep
        .runtime
        .with_extra(hame_subagent::DEPTH_EXTRA, json!(1));
    let err = spawn(&tools, "t", &deep)
        .await
        .err()
        .ok_or("a leaf spawned")?;
    assert_eq!(err.code, "depth_exceeded");
    Ok(())
}

#[tokio::test]
async fn agent_send_continues_the_same_child_session() -> TestResult {
    let (subagents, ctx, tools) = setup_default();
    let out = spawn(&tools, "first", &ctx).await?;
    assert!(out.contains("did first"), "{out}");
    let id = task_id(&out);
    let out = call(
        &tools,
        "agent_send",
        json!({"task_id": id, "message": "second"}),
        &ctx,
    )
    .await?;
    assert!(out.contains("did second") && out.contains(&id), "{out}");
    let ws = ws_of(&ctx)?;
    let records = subagents.sweep(&ws).await?;
    assert_eq!(records.len(), 1, "one task, continued");
    assert_eq!(records[0].task, "second");
    assert_eq!(records[0].status, TaskStatus::Completed);
    assert!(records[0].child_session.starts_with("s1@worker-"));
    Ok(())
}

#[tokio::test]
async fn agent_send_to_a_running_task_is_refused() -> TestResult {
    let runner = slow(Duration::from_secs(30));
    let (_s, ctx, tools) = setup(runner, SubagentOptions::default());
    let out = spawn_in_background(&tools, &ctx).await?;
    let err = call(
        &tools,
        "agent_send",
        json!({"task_id": task_id(&out), "message": "more"}),
        &ctx,
    )
    .await
    .err()
    .ok_or("sent to a running task")?;
    assert_eq!(err.code, "invalid_state");
    Ok(())
}

#[tokio::test]
async fn a_cancelled_parent_cancels_its_children() -> TestResult {
    let runner = slow(Duration::from_secs(30));
    let (subagents, mut ctx, tools) = setup(runner, SubagentOptions::default());
    let parent = ParentCall::default();
    let mut ext = ctx.extensions.clone();
    ext.insert(parent.clone());
    ctx = ctx.with_extensions(ext);
    let out = spawn_in_background(&tools, &ctx).await?;
    let id = task_id(&out);
    parent.cancel.cancel();
    assert_eq!(subagents.wait_idle(Duration::from_secs(5)).await, 0);
    let out = call(&tools, "task_output", json!({"task_id": id}), &ctx).await?;
    assert!(
        out.contains("status: cancelled") && out.contains("parent call was cancelled"),
        "{out}"
    );
    Ok(())
}

/// A sync spawn's result is handed to the parent call (`ParentCall::deliveries`) and its
/// record marked only when the call confirms it after its save; a confirmation that comes
/// after the task ran again (`agent_send` in the same call) leaves the new run undelivered.
#[tokio::test]
async fn results_are_marked_delivered_only_when_the_parent_call_confirms_them() -> TestResult {
    let (subagents, ctx, tools) = setup_default();
    let ws = ws_of(&ctx)?;
    let parent = ctx
        .extensions
        .get::<ParentCall>()
        .cloned()
        .ok_or("parent")?;
    let out = spawn(&tools, "first", &ctx).await?;
    assert!(out.contains("did first"), "{out}");
    let stored = |records: Vec<hame_subagent::TaskRecord>| {
        records
            .into_iter()
            .map(|r| (r.status, r.delivered_at.is_some()))
            .collect::<Vec<_>>()
    };
    // Returned to the caller, not yet marked: a crash now would leave it to be pushed.
    assert_eq!(parent.deliveries.len(), 1);
    assert_eq!(
        stored(subagents.sweep(&ws).await?),
        [(TaskStatus::Completed, false)]
    );
    assert_eq!(
        subagents
            .confirm_deliveries(&ws, &parent.deliveries, || true)
            .await,
        1
    );
    assert_eq!(
        stored(subagents.sweep(&ws).await?),
        [(TaskStatus::Completed, true)]
    );

    // Read again (task_output), then run again in the background before the call
    // confirms: the confirmation is of the first run and leaves the second undelivered.
    let id = task_id(&out);
    call(&tools, "task_output", json!({"task_id": id}), &ctx).await?;
    tool(&tools, "agent_send")
        .call(
            json!({"task_id": id, "message": "second", "background": true}),
            &ctx,
        )
        .await?;
    assert_eq!(subagents.wait_idle(Duration::from_secs(5)).await, 0);
    assert_eq!(
        subagents
            .confirm_deliveries(&ws, &parent.deliveries, || true)
            .await,
        0
    );
    let records = subagents.sweep(&ws).await?;
    assert_eq!(records[0].result.as_deref(), Some("did second"));
    assert!(records[0].undelivered(), "{:?}", records[0]);
    // A call whose lease is lost marks nothing.
    let out = call(&tools, "task_output", json!({"task_id": id}), &ctx).await?;
    assert!(out.contains("did second"), "{out}");
    assert_eq!(
        subagents
            .confirm_deliveries(&ws, &parent.deliveries, || false)
            .await,
        0
    );
    assert!(subagents.sweep(&ws).await?[0].undelivered());
    Ok(())
}
