//! A background subagent's result survives a crash of the parent at every step of its
//! delivery: `hame run` is SIGKILLed at each failpoint between "pushed into the parent's
//! conversation", "log and state durable" and "task marked delivered" (the `failpoints`
//! feature, `HAME_FAILPOINT`), and the next call finds the result exactly once — in the
//! parent's saved state, in its session log and in the model's next request — and the task
//! marked delivered.

use std::fs;
use std::path::Path;
use std::time::Duration;

use hame::state::StateStore as _;
use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{hame, output, run_with, state_dir, stderr, system_of};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Only in the parent's system prompt.
const PARENT: &str = "Available subagents:";
/// Only in the child's system prompt.
const CHILD: &str = "ROLE-REPORTER-5";

/// The failpoints between the steps of a delivery, in the order a call reaches them.
const POINTS: [&str; 5] = [
    "subagent.claimed",
    "subagent.pushed",
    "call.before-save",
    "call.saved",
    "call.delivered",
];

fn workspace(dir: &Path) -> std::io::Result<String> {
    let ws = dir.join("ws");
    fs::create_dir_all(ws.join("subagents"))?;
    fs::write(
        ws.join("subagents/reporter.md"),
        format!(
            "---\ndescription: Reports\ntools: [read_file]\nmax_iterations: 2\n---\nYou are {CHILD}.\n"
        ),
    )?;
    Ok(ws.to_string_lossy().into_owned())
}

/// The messages of the parent's saved state (`hame`/anonymous/`default`).
async fn saved_messages(dir: &Path, ws: &Path) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let store = hame::state::JsonStore::open(state_dir(dir, ws))?;
    let key = hame::state::StateKey::new("hame", None::<String>, "default")?;
    let stored = store.load(&key).await?.ok_or("no saved state")?;
    Ok(stored
        .state
        .messages
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?)
}

/// The lines of the parent's session log (`default`), parsed.
fn log_lines(ws: &Path) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let text = fs::read_to_string(ws.join("agents/hame/sessions/default.log.jsonl"))?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?)
}

/// The parent's task records.
fn records(ws: &Path) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for file in fs::read_dir(ws.join("agents/hame/tasks/default"))? {
        out.push(serde_json::from_str(&fs::read_to_string(file?.path())?)?);
    }
    Ok(out)
}

/// Whether `hame` was built with the `failpoints` feature; else `what` is skipped (a
/// failure under CI, which builds with `--all-features`).
fn failpoints_built(what: &str) -> bool {
    if !cfg!(feature = "failpoints") {
        hame_test_env::skip(format_args!(
            "{what} needs `--features failpoints` (CI runs --all-features)"
        ));
        return false;
    }
    true
}

/// `result` is in exactly one message of the parent's saved state.
async fn assert_once_in_state(dir: &Path, ws: &Path, result: &str, point: &str) -> TestResult {
    let messages = saved_messages(dir, ws).await?;
    let in_state = messages.iter().filter(|m| mentions(m, result)).count();
    assert_eq!(in_state, 1, "{point}: {messages:#?}");
    Ok(())
}

/// The parent's step that spawns the reporter.
fn spawn_step(background: bool) -> ScriptStep {
    ScriptStep::tool_call(
        "c1",
        "agent_spawn",
        json!({"agent_id": "reporter", "task": "report", "background": background}),
    )
    .when_system(PARENT)
}

fn mentions(v: &Value, needle: &str) -> bool {
    v.to_string().contains(needle)
}

/// `hame run <message>` with `HAME_FAILPOINT=<point>`: it must die there by SIGKILL.
async fn killed_run(dir: &Path, base: &str, ws: &str, message: &str, point: &str) -> TestResult {
    use std::os::unix::process::ExitStatusExt as _;
    let state = dir.join("state").to_string_lossy().into_owned();
    let killed = output(hame(
        &["run", "--model", "openai:m", "--workspace", ws, message],
        &[
            ("OPENAI_BASE_URL", base),
            ("HAME_STATE_HOME", &state),
            ("HAME_FAILPOINT", point),
        ],
        dir,
    ))
    .await?;
    assert_eq!(
        killed.status.signal(),
        Some(9),
        "{point}: the call was not killed at its failpoint: {:?} {}",
        killed.status,
        stderr(&killed)
    );
    Ok(())
}

/// How often `needle` is in the parent's last model request.
fn last_parent_mentions(server: &ScriptedServer, needle: &str) -> Result<usize, String> {
    let requests = server.requests();
    let last = requests
        .iter()
        .rev()
        .find(|r| system_of(&r.body).contains(PARENT))
        .ok_or("no parent request")?;
    Ok(last.body.to_string().matches(needle).count())
}

#[tokio::test]
async fn a_subagent_result_is_delivered_exactly_once_whatever_step_a_crash_hits() -> TestResult {
    if !failpoints_built("the delivery kill test") {
        return Ok(());
    }
    for point in POINTS {
        let result = format!("RESULT-{}", point.replace('.', "-"));
        let server = ScriptedServer::start().await?;
        server.push_all([
            // Call 1: a background spawn; the child answers while `hame run` waits for it.
            spawn_step(true),
            ScriptStep::text("started").when_system(PARENT),
            ScriptStep::text(result.clone())
                .when_system(CHILD)
                .with_delay(Duration::from_millis(200)),
            // Call 2 (killed at `point`), then call 3.
            ScriptStep::text("reply of call 2").when_system(PARENT),
            ScriptStep::text("reply of call 3").when_system(PARENT),
        ]);
        let dir = tempfile::tempdir()?;
        let ws_s = workspace(dir.path())?;
        let ws = Path::new(&ws_s);
        let base = server.base_url();
        let args = ["--workspace", ws_s.as_str()];

        let first = run_with(dir.path(), &base, &args, "start", &[]).await?;
        assert_eq!(first.status.code(), Some(0), "{point}: {}", stderr(&first));
        let before = records(ws)?;
        assert_eq!(before.len(), 1, "{point}");
        assert_eq!(before[0]["status"], "completed", "{point}");
        assert!(before[0]["delivered_at"].is_null(), "{point}");

        // Call 2 dies at the failpoint.
        killed_run(dir.path(), &base, &ws_s, "second", point).await?;

        // What the kill left: where the notification is, and the record's marks.
        let logged = log_lines(ws)?
            .iter()
            .filter(|l| mentions(l, &result))
            .count();
        let record = records(ws)?.remove(0);
        let (logged_expected, delivered_expected) = match point {
            // Pushed, not yet written: the notification waits for the step's next message.
            "subagent.claimed" | "subagent.pushed" => (0, false),
            "call.before-save" | "call.saved" => (1, false),
            _ => (1, true),
        };
        assert_eq!(logged, logged_expected, "{point}: log after the kill");
        assert_eq!(
            record["delivered_at"].is_string(),
            delivered_expected,
            "{point}: {record}"
        );
        assert_eq!(
            record["delivery_call"].is_string(),
            !delivered_expected,
            "{point}: {record}"
        );

        // Call 3 runs to the end.
        let third = run_with(dir.path(), &base, &args, "third", &[]).await?;
        assert_eq!(third.status.code(), Some(0), "{point}: {}", stderr(&third));

        // Exactly once in the saved conversation ...
        assert_once_in_state(dir.path(), ws, &result, point).await?;
        // ... in the session log ...
        let log = log_lines(ws)?;
        let in_log: Vec<&Value> = log.iter().filter(|l| mentions(l, &result)).collect();
        assert_eq!(in_log.len(), 1, "{point}: {in_log:#?}");
        assert_eq!(in_log[0]["role"], "user", "{point}");
        assert!(mentions(in_log[0], "system-notification"), "{point}");
        // ... and in what the model saw last.
        assert_eq!(last_parent_mentions(&server, &result)?, 1, "{point}");
        // The task is marked delivered.
        let after = records(ws)?;
        assert!(
            after[0]["delivered_at"].is_string(),
            "{point}: {}",
            after[0]
        );
    }
    Ok(())
}

/// The same for a sync spawn, whose result comes back as the tool result of the call that
/// is killed: once that call's state is saved the result is in it (and its record is marked
/// by the next call, never pushed); killed before, the call's turn is lost with the tool
/// result, and the next call pushes the result instead of losing it.
#[tokio::test]
async fn a_sync_spawn_result_is_never_lost_to_a_crash_before_the_parents_save() -> TestResult {
    if !failpoints_built("the sync-spawn kill test") {
        return Ok(());
    }
    for point in ["call.before-save", "call.saved", "call.delivered"] {
        let result = format!("SYNC-RESULT-{}", point.replace('.', "-"));
        let server = ScriptedServer::start().await?;
        server.push_all([
            spawn_step(false),
            ScriptStep::text(result.clone()).when_system(CHILD),
            ScriptStep::text("reply of call 1").when_system(PARENT),
            ScriptStep::text("reply of call 2").when_system(PARENT),
        ]);
        let dir = tempfile::tempdir()?;
        let ws_s = workspace(dir.path())?;
        let ws = Path::new(&ws_s);
        let base = server.base_url();
        // The child's call, in the same process, passes the call points first: the
        // parent's is their second visit.
        killed_run(dir.path(), &base, &ws_s, "first", &format!("{point}#2")).await?;
        let record = records(ws)?.remove(0);
        assert_eq!(record["status"], "completed", "{point}: {record}");

        let next = run_with(dir.path(), &base, &["--workspace", &ws_s], "next", &[]).await?;
        assert_eq!(next.status.code(), Some(0), "{point}: {}", stderr(&next));
        assert_once_in_state(dir.path(), ws, &result, point).await?;
        assert_eq!(last_parent_mentions(&server, &result)?, 1, "{point}");
        let record = records(ws)?.remove(0);
        assert!(record["delivered_at"].is_string(), "{point}: {record}");
    }
    Ok(())
}
