//! Concurrent `hame run` processes: one session is served one call at a time (the second
//! process waits for the state store's lease), different sessions run side by side.

use std::fs;
use std::path::Path;
use std::time::Duration;

use hame::Role;
use hame::state::StateKey;
use hame_test_support::{RecordedRequest, ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;

use super::common::{last_role, run_with, service, stderr, stdout, unique_agent};
use super::replicas::dialogue;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn workspace(dir: &Path) -> std::io::Result<String> {
    fs::create_dir_all(dir.join("ws"))?;
    fs::write(dir.join("ws/AGENTS.md"), "You are concurrent.\n")?;
    Ok(dir.join("ws").to_string_lossy().into_owned())
}

fn args(ws: &str, agent: &str, session: &str, state: &str) -> Vec<String> {
    [
        "--workspace",
        ws,
        "--agent",
        agent,
        "--user",
        "ada",
        "--session",
        session,
        "--state",
        state,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// Runs `hame run` with `args` and `message` on its own task.
fn spawn_run(
    dir: &Path,
    base: &str,
    args: Vec<String>,
    message: &str,
) -> tokio::task::JoinHandle<std::io::Result<std::process::Output>> {
    let (dir, base, message) = (dir.to_owned(), base.to_owned(), message.to_owned());
    tokio::spawn(async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_with(&dir, &base, &args, &message, &[]).await
    })
}

/// Two processes start at once on one session; the model takes a second per reply, so the
/// second process finds the session leased and waits (default wait 10 s). Both succeed and
/// the saved conversation holds both exchanges, each user message directly followed by its
/// own reply.
async fn same_session_calls_queue(state: &str) -> TestResult {
    let server = ScriptedServer::start().await?;
    server.set_responder(|req: &RecordedRequest| {
        let asked = req.last_user_text().unwrap_or_default();
        ScriptStep::text(format!("re: {asked}")).with_delay(Duration::from_secs(1))
    });
    let base = server.base_url();
    let agent = unique_agent();
    let dir = tempfile::tempdir()?;
    let ws = workspace(dir.path())?;
    let one = spawn_run(dir.path(), &base, args(&ws, &agent, "busy", state), "first");
    let two = spawn_run(
        dir.path(),
        &base,
        args(&ws, &agent, "busy", state),
        "second",
    );
    let (one, two) = (one.await??, two.await??);
    assert_eq!(one.status.code(), Some(0), "{}", stderr(&one));
    assert_eq!(two.status.code(), Some(0), "{}", stderr(&two));
    assert_eq!(stdout(&one), "re: first\n");
    assert_eq!(stdout(&two), "re: second\n");

    // Whoever got the lease second saw the first exchange complete.
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    let first = dialogue(&reqs[0].body);
    assert_eq!(first.len(), 1, "{first:?}");
    let other = if first[0] == "first" {
        "second"
    } else {
        "first"
    };
    assert_eq!(
        dialogue(&reqs[1].body),
        vec![
            first[0].clone(),
            format!("re: {}", first[0]),
            other.to_owned()
        ]
    );

    let store = hame::state::open(state).await?;
    let saved = store
        .load(&StateKey::new(&agent, Some("ada"), "busy")?)
        .await?
        .ok_or("no state saved")?;
    let messages: Vec<(Role, String)> = saved
        .state
        .messages
        .iter()
        .map(|m| (m.role, m.text_content()))
        .collect();
    assert_eq!(
        messages,
        vec![
            (Role::User, first[0].clone()),
            (Role::Assistant, format!("re: {}", first[0])),
            (Role::User, other.to_owned()),
            (Role::Assistant, format!("re: {other}")),
        ]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_session_calls_queue_on_a_json_state_dir() -> TestResult {
    let state = tempfile::tempdir()?;
    same_session_calls_queue(&state.path().to_string_lossy()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_session_calls_queue_on_redis() -> TestResult {
    let Some(url) = service("HAME_TEST_REDIS_URL") else {
        return Ok(());
    };
    same_session_calls_queue(&url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_session_calls_queue_on_postgres() -> TestResult {
    let Some(url) = service("HAME_TEST_POSTGRES_URL") else {
        return Ok(());
    };
    same_session_calls_queue(&url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_session_calls_queue_on_mysql() -> TestResult {
    let Some(url) = service("HAME_TEST_MYSQL_URL") else {
        return Ok(());
    };
    same_session_calls_queue(&url).await
}

/// Two processes on two sessions of one user. Each call makes two model requests: a tool
/// call the model takes 1.5 s to send, then the final text. A process is alive from its
/// first request until after its second, so if both first requests were recorded before
/// either second request, both processes were alive at the same time. Serialised sessions
/// would give the order first, second, first, second.
async fn different_sessions_run_in_parallel(state: &str) -> TestResult {
    let server = ScriptedServer::start().await?;
    server.set_responder(|req: &RecordedRequest| {
        let asked = req.last_user_text().unwrap_or_default();
        if last_role(req) == "user" {
            ScriptStep::tool_call(
                format!("call-{}", asked.replace(' ', "-")),
                "read_file",
                serde_json::json!({"file_path": "AGENTS.md"}),
            )
            .with_delay(Duration::from_millis(1500))
        } else {
            ScriptStep::text(format!("re: {asked}"))
        }
    });
    let base = server.base_url();
    let agent = unique_agent();
    let dir = tempfile::tempdir()?;
    let ws = workspace(dir.path())?;
    let a = spawn_run(
        dir.path(),
        &base,
        args(&ws, &agent, "left", state),
        "to left",
    );
    let b = spawn_run(
        dir.path(),
        &base,
        args(&ws, &agent, "right", state),
        "to right",
    );
    let (a, b) = (a.await??, b.await??);
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    assert_eq!(b.status.code(), Some(0), "{}", stderr(&b));
    assert_eq!(stdout(&a), "re: to left\n");
    assert_eq!(stdout(&b), "re: to right\n");
    let order: Vec<(String, bool)> = server
        .requests()
        .iter()
        .map(|r| {
            (
                r.last_user_text().unwrap_or_default(),
                last_role(r) == "user",
            )
        })
        .collect();
    let firsts: Vec<usize> = (0..order.len()).filter(|i| order[*i].1).collect();
    let seconds: Vec<usize> = (0..order.len()).filter(|i| !order[*i].1).collect();
    assert_eq!((firsts.len(), seconds.len()), (2, 2), "{order:?}");
    assert!(
        firsts.iter().max() < seconds.iter().min(),
        "one session's call waited for the other's: {order:?}"
    );
    // Each session holds its own exchange only.
    let store = hame::state::open(state).await?;
    for (session, text) in [("left", "to left"), ("right", "to right")] {
        let saved = store
            .load(&StateKey::new(&agent, Some("ada"), session)?)
            .await?
            .ok_or("no state saved")?;
        let messages: Vec<(Role, String)> = saved
            .state
            .messages
            .iter()
            .map(|m| (m.role, m.text_content()))
            .collect();
        assert_eq!(
            messages,
            vec![
                (Role::User, text.to_owned()),
                (Role::Assistant, String::new()),
                (Role::Tool, String::new()),
                (Role::Assistant, format!("re: {text}")),
            ]
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_sessions_run_in_parallel_on_a_json_state_dir() -> TestResult {
    let state = tempfile::tempdir()?;
    different_sessions_run_in_parallel(&state.path().to_string_lossy()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_sessions_run_in_parallel_on_redis() -> TestResult {
    let Some(url) = service("HAME_TEST_REDIS_URL") else {
        return Ok(());
    };
    different_sessions_run_in_parallel(&url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_sessions_run_in_parallel_on_postgres() -> TestResult {
    let Some(url) = service("HAME_TEST_POSTGRES_URL") else {
        return Ok(());
    };
    different_sessions_run_in_parallel(&url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_sessions_run_in_parallel_on_mysql() -> TestResult {
    let Some(url) = service("HAME_TEST_MYSQL_URL") else {
        return Ok(());
    };
    different_sessions_run_in_parallel(&url).await
}

/// 40 processes of one user, each on its own session, at once: the local session index
/// lists every one of them (one index file per session, none lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_processes_never_lose_a_session_index_entry() -> TestResult {
    const N: usize = 40;
    let dir = tempfile::tempdir()?;
    let ws = workspace(dir.path())?;
    let state = dir.path().join("state").to_string_lossy().into_owned();
    let server = ScriptedServer::start().await?;
    server.push_all((0..N).map(|i| ScriptStep::text(format!("answer {i}"))));
    let base = server.base_url();
    let agent = unique_agent();
    let runs: Vec<_> = (0..N)
        .map(|i| {
            let mut a = args(&ws, &agent, &format!("s{i}"), &state);
            a.push("--no-memory".into());
            spawn_run(dir.path(), &base, a, &format!("question {i}"))
        })
        .collect();
    for r in runs {
        let out = r.await??;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    // Read the index files themselves (listing sessions would also repair them): one
    // per session, each naming its session.
    let mut found = Vec::new();
    for entry in walk(&dir.path().join("ws"))? {
        if entry
            .parent()
            .is_some_and(|p| p.ends_with("sessions/index"))
        {
            let index: serde_json::Value = serde_json::from_slice(&fs::read(&entry)?)?;
            found.push(index["session"]["id"].as_str().unwrap_or("?").to_owned());
        }
    }
    found.sort();
    let mut expected: Vec<String> = (0..N).map(|i| format!("s{i}")).collect();
    expected.sort();
    assert_eq!(found, expected);
    Ok(())
}

fn walk(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    Ok(out)
}
