//! Subagents through `hame run` / `hame tasks` against the scripted server; parent and child
//! are told apart by their system prompts (`ScriptStep::when_system`).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use hame_test_support::{RecordedRequest, ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{Scratch, hame, service, stderr, stdout, system_of, unique_agent};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Only in the parent's system prompt (the subagents section of an agent that may spawn).
const PARENT: &str = "Available subagents:";
/// Only in the reviewer's system prompt (its spec body).
const CHILD: &str = "ROLE-REVIEWER-7";

fn spec(ws: &Path, id: &str, front: &str, body: &str) -> std::io::Result<()> {
    fs::create_dir_all(ws.join("subagents"))?;
    fs::write(
        ws.join("subagents").join(format!("{id}.md")),
        format!("---\n{front}\n---\n{body}\n"),
    )
}

/// A scratch whose workspace holds the reviewer's spec, the model answering `steps`.
async fn scratch(
    steps: impl IntoIterator<Item = ScriptStep>,
) -> Result<Scratch, Box<dyn std::error::Error>> {
    let s = Scratch::scripted(steps).await?;
    spec(
        &s.ws,
        "reviewer",
        "description: Reviews files\ntools: [read_file, list_files]\nmax_iterations: 3",
        &format!("You are {CHILD}. Review what you are given."),
    )?;
    Ok(s)
}

fn tool_names(req: &RecordedRequest) -> Vec<String> {
    super::common::tool_names(&req.body)
}

/// The parent's step that spawns `agent_id`.
fn spawn_step(agent_id: &str, task: &str, background: bool) -> ScriptStep {
    ScriptStep::tool_call(
        "c1",
        "agent_spawn",
        json!({"agent_id": agent_id, "task": task, "background": background}),
    )
    .when_system(PARENT)
}

/// The parent's answer `text`.
fn parent_says(text: &str) -> ScriptStep {
    ScriptStep::text(text).when_system(PARENT)
}

/// The reviewer's answer `text`, after `delay`.
fn child_says(text: &str, delay: Duration) -> ScriptStep {
    ScriptStep::text(text).when_system(CHILD).with_delay(delay)
}

/// The `error` of a task record.
fn error_of(record: &Value) -> String {
    record["error"].as_str().unwrap_or_default().to_owned()
}

fn requests_of(server: &ScriptedServer, marker: &str) -> Vec<RecordedRequest> {
    server
        .requests()
        .into_iter()
        .filter(|r| system_of(&r.body).contains(marker))
        .collect()
}

/// The text of the last tool message of a request.
fn last_tool(req: &RecordedRequest) -> String {
    super::common::last_tool_result(&req.body)
}

/// The first `task-<12 hex>` in a text.
fn task_id_in(text: &str) -> Option<String> {
    let at = text.find("task-")?;
    let id: String = text[at..].chars().take(17).collect();
    hame::subagent::task::is_task_id(&id).then_some(id)
}

/// Answers the parent by the last tool result of its request: `end(id)` once that names
/// task `id` with `finished` (a `status: ...`), `next(id)` while it names the task otherwise.
fn follow_the_task(
    server: &ScriptedServer,
    finished: &'static str,
    end: fn(&str) -> ScriptStep,
    next: fn(&str) -> ScriptStep,
) {
    server.set_responder(move |req: &RecordedRequest| {
        let last = last_tool(req);
        match task_id_in(&last) {
            Some(id) if last.contains(finished) => end(&id),
            Some(id) => next(&id),
            None => ScriptStep::text("no task id"),
        }
    });
}

/// Every task record of agent `hame` in a local workspace (`agents/hame/tasks/<session>/`).
fn all_records(ws: &Path) -> std::io::Result<Vec<Value>> {
    let mut out = Vec::new();
    for session in fs::read_dir(ws.join("agents/hame/tasks"))? {
        for file in fs::read_dir(session?.path())? {
            let text = fs::read_to_string(file?.path())?;
            if let Ok(v) = serde_json::from_str(&text) {
                out.push(v);
            }
        }
    }
    Ok(out)
}

/// `hame tasks --json <args>` in the scratch; it must exit 0.
async fn tasks_json(s: &Scratch, args: &[&str]) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let mut all = vec!["tasks", "--json"];
    all.extend_from_slice(args);
    let out = s.hame(&all).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Vec<Value> = serde_json::from_str(&stdout(&out))?;
    Ok(v)
}

/// The first task record of the scratch's workspace (`hame tasks --json --workspace ws`).
async fn first_task(s: &Scratch) -> Result<Value, Box<dyn std::error::Error>> {
    let tasks = tasks_json(s, &s.ws_args(&[])).await?;
    Ok(tasks.into_iter().next().ok_or("no task in the workspace")?)
}

/// The first task of the scratch's workspace ended `status`, its error containing `cause`.
async fn assert_ended(s: &Scratch, status: &str, cause: &str) -> TestResult {
    let task = first_task(s).await?;
    assert_eq!(task["status"], status);
    assert!(error_of(&task).contains(cause), "{task}");
    Ok(())
}

#[tokio::test]
async fn sync_spawn_from_a_workspace_spec_with_its_tool_allowlist() -> TestResult {
    let s = scratch([
        spawn_step("reviewer", "review notes.txt", false),
        ScriptStep::text("REVIEW: notes look fine").when_system(CHILD),
        parent_says("The reviewer says it is fine."),
    ])
    .await?;
    s.write("subagents/broken.md", "---\ndescription: [unclosed\n---\n")?;
    let out = s.run_ws(&[], "review").await?;
    assert_eq!(stdout(&out), "The reviewer says it is fine.\n");
    // The broken spec: one warning line naming it; the others work.
    let warnings: Vec<_> = stderr(&out)
        .lines()
        .filter(|l| l.contains("subagents/broken.md"))
        .map(str::to_owned)
        .collect();
    assert_eq!(warnings.len(), 1, "{}", stderr(&out));
    assert!(warnings[0].starts_with("hame: warning:"), "{}", warnings[0]);

    let parent = requests_of(&s.server, PARENT);
    assert_eq!(parent.len(), 2);
    let names = tool_names(&parent[0]);
    for t in hame::subagent::SUBAGENT_TOOLS {
        assert!(names.contains(&t.to_owned()), "{t} missing from {names:?}");
    }
    let prompt = system_of(&parent[0].body);
    assert!(prompt.contains("- reviewer: Reviews files"), "{prompt}");
    assert!(prompt.contains("- general-purpose:"), "{prompt}");
    assert!(!prompt.contains("broken"), "{prompt}");
    // The child: its spec body as the prompt, the allowlist over the parent's tools, no
    // subagent tools (a leaf at the default depth 1).
    let child = requests_of(&s.server, CHILD);
    assert_eq!(child.len(), 1);
    assert_eq!(tool_names(&child[0]), vec!["list_files", "read_file"]);
    assert_eq!(
        child[0].last_user_text().as_deref(),
        Some("review notes.txt")
    );
    assert!(
        last_tool(&parent[1]).contains("REVIEW: notes look fine"),
        "{}",
        last_tool(&parent[1])
    );
    assert!(last_tool(&parent[1]).contains("status: completed"));

    // The durable record, and the child's own log next to the parent's.
    let tasks = tasks_json(&s, &s.ws_args(&[])).await?;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["agent_id"], "reviewer");
    assert_eq!(tasks[0]["status"], "completed");
    let id = tasks[0]["task_id"].as_str().unwrap_or_default().to_owned();
    let record: Value = serde_json::from_str(&fs::read_to_string(
        s.ws.join(format!("agents/hame/tasks/default/{id}.json")),
    )?)?;
    assert_eq!(record["status"], "completed");
    let child_session = record["child_session"].as_str().unwrap_or_default();
    assert!(
        child_session.starts_with("default@reviewer-"),
        "{child_session}"
    );
    let log =
        fs::read_to_string(s.ws.join(format!("agents/hame/sessions/{child_session}.log.jsonl")))?;
    assert!(log.contains("REVIEW: notes look fine"), "{log}");
    Ok(())
}

#[tokio::test]
async fn background_spawn_then_task_output() -> TestResult {
    let s = scratch([
        spawn_step("reviewer", "slow review", true),
        child_says("BACKGROUND RESULT", Duration::from_millis(400)),
    ])
    .await?;
    follow_the_task(
        &s.server,
        "status: completed",
        |id| ScriptStep::text(format!("got {id}")),
        |id| {
            ScriptStep::tool_call(
                "c2",
                "task_output",
                json!({"task_id": id, "wait_seconds": 20}),
            )
        },
    );
    let out = s.run_ws(&[], "go").await?;
    let parent = requests_of(&s.server, PARENT);
    let started = last_tool(&parent[1]);
    assert!(
        started.contains("status: pending") || started.contains("status: running"),
        "{started}"
    );
    let id = task_id_in(&started).ok_or("no task id in the spawn result")?;
    let output = last_tool(&parent[2]);
    assert!(output.contains("status: completed"), "{output}");
    assert!(output.contains("BACKGROUND RESULT"), "{output}");
    assert_eq!(stdout(&out), format!("got {id}\n"));
    // Read with task_output: never pushed on top.
    for r in &parent {
        assert!(
            !r.body.to_string().contains("system-notification"),
            "pushed although read"
        );
    }
    let task = first_task(&s).await?;
    assert_eq!(task["status"], "completed");
    assert!(task["delivered_at"].is_string());
    Ok(())
}

#[tokio::test]
async fn a_failed_child_is_failed_never_completed() -> TestResult {
    let s = scratch([
        spawn_step("reviewer", "t", false),
        ScriptStep::unauthorized().when_system(CHILD),
        parent_says("the reviewer failed"),
    ])
    .await?;
    s.run_ws(&[], "go").await?;
    let parent = requests_of(&s.server, PARENT);
    let result = &parent[1].body["messages"]
        .as_array()
        .and_then(|m| m.last().cloned())
        .unwrap_or_default();
    let text = result["content"].as_str().unwrap_or_default();
    assert!(text.contains("subagent_failed"), "{text}");
    assert!(text.contains("failed") && text.contains("401"), "{text}");
    assert_ended(&s, "failed", "401").await
}

#[tokio::test]
async fn a_child_past_its_step_limit_is_failed() -> TestResult {
    let looper = |id| ScriptStep::tool_call(id, "list_files", json!({"path": "."}));
    let s = scratch([
        spawn_step("looper", "t", false),
        looper("l1").when_system("LOOPER-3"),
        looper("l2").when_system("LOOPER-3"),
        parent_says("ok"),
    ])
    .await?;
    spec(
        &s.ws,
        "looper",
        "description: Loops\nmax_iterations: 2",
        "You are LOOPER-3.",
    )?;
    s.run_ws(&[], "go").await?;
    assert_ended(&s, "failed", "step limit").await
}

#[tokio::test]
async fn task_cancel_stops_a_slow_child_quickly() -> TestResult {
    // The child's model request hangs for a minute unless abandoned.
    let s = scratch([
        spawn_step("reviewer", "slow", true),
        child_says("too late", Duration::from_secs(60)),
    ])
    .await?;
    follow_the_task(
        &s.server,
        "status: cancelled",
        |_| ScriptStep::text("cancelled it"),
        |id| ScriptStep::tool_call("c2", "task_cancel", json!({"task_id": id})),
    );
    let started = Instant::now();
    let out = s.run_ws(&[], "go").await?;
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "cancelled it\n");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_ended(&s, "cancelled", "task_cancel").await
}

/// `hame run` waited for the one background task it started.
fn assert_waited(out: &std::process::Output) {
    assert!(
        stderr(out).contains("waiting for 1 background task(s)"),
        "{}",
        stderr(out)
    );
}

#[tokio::test]
async fn a_background_result_is_pushed_exactly_once_across_calls() -> TestResult {
    let s = scratch([
        spawn_step("reviewer", "bg", true),
        parent_says("started it"),
        child_says("PUSHED RESULT 42", Duration::from_millis(300)),
        // Call 2 and call 3 of the parent.
        parent_says("seen"),
        parent_says("again"),
    ])
    .await?;
    let out = s.run_ws(&[], "start").await?;
    assert_eq!(stdout(&out), "started it\n");
    assert_waited(&out);
    let task = first_task(&s).await?;
    assert_eq!(task["status"], "completed");
    assert!(task["delivered_at"].is_null());

    for msg in ["next", "third"] {
        s.run_ws(&[], msg).await?;
    }
    let parent = requests_of(&s.server, PARENT);
    assert_eq!(parent.len(), 4);
    let count = |r: &RecordedRequest| r.body.to_string().matches("PUSHED RESULT 42").count();
    // Call 2 got it once, before its first step; call 3 has it once, in the history.
    assert_eq!(count(&parent[2]), 1);
    assert_eq!(count(&parent[3]), 1);
    assert!(parent[2].body.to_string().contains("system-notification"));
    assert!(first_task(&s).await?["delivered_at"].is_string());
    Ok(())
}

/// A background spawn whose child never answers, the parent saying "started", then `more`.
async fn a_hanging_child(
    more: impl IntoIterator<Item = ScriptStep>,
) -> Result<Scratch, Box<dyn std::error::Error>> {
    let s = scratch([
        spawn_step("reviewer", "bg", true),
        parent_says("started"),
        child_says("never", Duration::from_secs(60)),
    ])
    .await?;
    s.server.push_all(more);
    Ok(s)
}

#[tokio::test]
async fn task_wait_bound_records_the_task_failed() -> TestResult {
    let s = a_hanging_child([]).await?;
    let started = Instant::now();
    let out = s.run_ws(&["--task-wait", "1"], "start").await?;
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_waited(&out);
    assert_ended(&s, "failed", "interrupted").await
}

#[tokio::test]
async fn sigkill_of_the_parent_leaves_no_record_running() -> TestResult {
    let s = a_hanging_child([parent_says("after the crash")]).await?;
    let (base, state) = (s.server.base_url(), s.state());
    let mut child = hame(
        &[
            "run",
            "--model",
            "openai:m",
            "--workspace",
            &s.ws_s,
            "start",
        ],
        &[("OPENAI_BASE_URL", &base), ("HAME_STATE_HOME", &state)],
        s.path(),
    )
    .stdout(std::process::Stdio::piped())
    .spawn()?;
    // Wait until the child's request is in flight (the task runs), then SIGKILL.
    let deadline = Instant::now() + Duration::from_secs(20);
    while requests_of(&s.server, CHILD).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !requests_of(&s.server, CHILD).is_empty(),
        "the child never ran"
    );
    child.kill()?;
    child.wait()?;
    let on_disk = all_records(&s.ws)?;
    assert_eq!(on_disk.len(), 1);
    assert_eq!(on_disk[0]["status"], "running");
    // The next call of the session marks it failed (interrupted) and tells the parent.
    s.run_ws(&[], "status?").await?;
    assert_ended(&s, "failed", "interrupted").await?;
    let parent = requests_of(&s.server, PARENT);
    let last = parent
        .last()
        .map(|r| r.body.to_string())
        .unwrap_or_default();
    assert!(
        last.contains("system-notification") && last.contains("interrupted"),
        "{last}"
    );
    Ok(())
}

#[tokio::test]
async fn a_users_spec_shadows_the_shared_one_for_that_user_only() -> TestResult {
    let s = scratch([]).await?;
    s.write(
        "alice/subagents/reviewer.md",
        "---\ndescription: Alice's reviewer\n---\nYou are ALICE-REVIEWER-9.\n",
    )?;
    for (user, marker) in [("alice", "ALICE-REVIEWER-9"), ("bob", CHILD)] {
        s.server.push_all([
            spawn_step("reviewer", "t", false),
            ScriptStep::text(format!("child of {user}")).when_system(marker),
            parent_says("done"),
        ]);
        s.run_ws(&["--user", user], "go").await?;
        assert_eq!(s.server.remaining(), 0, "{user}: a step was not used");
    }
    let alice_parent = requests_of(&s.server, "Alice's reviewer");
    assert_eq!(alice_parent.len(), 2, "alice's parent lists her reviewer");
    // Bob never sees alice's override.
    for r in requests_of(&s.server, PARENT) {
        let p = system_of(&r.body);
        if !p.contains("Alice's reviewer") {
            assert!(p.contains("- reviewer: Reviews files"), "{p}");
        }
    }
    assert!(
        requests_of(&s.server, "ALICE-REVIEWER-9")
            .iter()
            .all(|r| !system_of(&r.body).contains(CHILD))
    );
    Ok(())
}

#[tokio::test]
async fn depth_one_children_are_leaves_and_depth_two_nests_once() -> TestResult {
    let lead_says = |text| ScriptStep::text(text).when_system("LEAD-5");
    // Depth 1 (default): the child gets no subagent tools.
    let mut s = scratch([
        spawn_step("lead", "t", false),
        lead_says("lead done"),
        parent_says("ok"),
    ])
    .await?;
    spec(&s.ws, "lead", "description: Delegates", "You are LEAD-5.")?;
    s.run_ws(&[], "go").await?;
    let lead = requests_of(&s.server, "LEAD-5");
    assert!(!tool_names(&lead[0]).contains(&"agent_spawn".to_owned()));

    // Depth 2: the lead may spawn the reviewer; the reviewer (depth 2) is a leaf.
    s.server = ScriptedServer::start().await?;
    s.server.push_all([
        spawn_step("lead", "t", false),
        ScriptStep::tool_call(
            "c2",
            "agent_spawn",
            json!({"agent_id": "reviewer", "task": "sub"}),
        )
        .when_system("LEAD-5"),
        ScriptStep::text("grandchild done").when_system(CHILD),
        lead_says("lead done"),
        parent_says("ok"),
    ]);
    s.run_ws(&["--subagent-depth", "2", "--session", "deep"], "go")
        .await?;
    let lead = requests_of(&s.server, "LEAD-5");
    assert!(tool_names(&lead[0]).contains(&"agent_spawn".to_owned()));
    assert!(
        last_tool(&lead[1]).contains("grandchild done"),
        "{}",
        last_tool(&lead[1])
    );
    let grandchild = requests_of(&s.server, CHILD);
    assert!(!tool_names(&grandchild[0]).contains(&"agent_spawn".to_owned()));
    // The grandchild's record lives with the lead's session.
    let all = all_records(&s.ws)?;
    assert!(all.iter().all(|r| {
        s.ws.join(format!(
            "agents/hame/tasks/{}/{}.json",
            r["parent_session"].as_str().unwrap_or_default(),
            r["task_id"].as_str().unwrap_or_default()
        ))
        .is_file()
    }));
    let grand: Vec<_> = all.iter().filter(|r| r["depth"] == 2).collect();
    assert_eq!(grand.len(), 1);
    assert!(
        grand[0]["parent_session"]
            .as_str()
            .unwrap_or_default()
            .starts_with("deep@lead-")
    );
    assert_eq!(grand[0]["status"], "completed");
    Ok(())
}

#[tokio::test]
async fn no_general_subagent_removes_the_builtin() -> TestResult {
    let s = scratch([
        ScriptStep::tool_call("c1", "agent_list", json!({})).when_system(PARENT),
        parent_says("listed"),
    ])
    .await?;
    s.run_ws(&["--no-general-subagent"], "list").await?;
    let reqs = requests_of(&s.server, PARENT);
    let listed = last_tool(&reqs[1]);
    assert!(listed.contains("- reviewer: Reviews files"), "{listed}");
    assert!(!listed.contains("general-purpose"), "{listed}");
    assert!(!system_of(&reqs[0].body).contains("general-purpose"));
    Ok(())
}

#[tokio::test]
async fn shared_store_mode_on_redis_keeps_task_records_in_the_store() -> TestResult {
    let Some(redis) = service("HAME_TEST_REDIS_URL") else {
        return Ok(());
    };
    let s = scratch([
        spawn_step("reviewer", "t", false),
        ScriptStep::text("STORE CHILD").when_system(CHILD),
        parent_says("done"),
    ])
    .await?;
    let agent = unique_agent();
    let view = |user| {
        let store = ["--store", &redis, "--state", &redis, "--agent", &agent];
        s.ws_args(&store)
            .into_iter()
            .chain(["--user", user])
            .collect::<Vec<_>>()
    };
    s.run_code(0, &view("u1"), "go", &[]).await?;
    assert!(last_tool(&requests_of(&s.server, PARENT)[1]).contains("STORE CHILD"));
    // Nothing on local disk: the record is in the shared store.
    assert!(!s.ws.join("agents").exists());
    let tasks = tasks_json(&s, &view("u1")).await?;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["status"], "completed");
    assert_eq!(tasks[0]["user"], "u1");
    // Another user's view has no tasks.
    assert!(tasks_json(&s, &view("u2")).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn chat_shows_child_progress_indented_and_saves_before_the_next_prompt() -> TestResult {
    let s = scratch([
        spawn_step("reviewer", "review", false),
        ScriptStep::tool_call("r1", "list_files", json!({"path": "."})).when_system(CHILD),
        ScriptStep::text("REVIEW OK").when_system(CHILD),
        parent_says("parent done"),
    ])
    .await?;
    let args = ["--workspace", s.ws_s.as_str(), "--model", "openai:m"];
    let out = s.chat(&args, "review please\n").await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "parent done\n");
    let err = stderr(&out);
    assert!(err.contains("    ↳ reviewer task-"), "{err}");
    assert!(err.contains("⚙ list_files ok ("), "{err}");
    assert!(err.contains(" completed"), "{err}");
    // End of input right after the reply: the turn is saved and nothing is cut off.
    assert!(!err.contains("WARN"), "{err}");
    assert_eq!(first_task(&s).await?["status"], "completed");
    Ok(())
}
