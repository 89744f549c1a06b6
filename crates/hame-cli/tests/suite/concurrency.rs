//! Concurrent `hame run` processes: one session is served one call at a time (the second
//! process waits for the state store's lease), different sessions run side by side.

use std::fs;
use std::path::Path;
use std::time::Duration;

use hame::Role;
use hame::state::StateKey;
use hame_test_support::{RecordedRequest, Responder, ScriptStep};
use pretty_assertions::assert_eq;

use super::common::{
    Scratch, backend_tests, last_role, run_with, service, stderr, stdout, unique_agent,
};
use super::replicas::dialogue;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A scratch whose workspace's `AGENTS.md` says who it is, and a new agent id.
async fn concurrent_scratch() -> Result<(Scratch, String), Box<dyn std::error::Error>> {
    let s = Scratch::new().await?;
    s.write("AGENTS.md", "You are concurrent.\n")?;
    Ok((s, unique_agent()))
}

/// Two `hame run`s at once (user `ada`, state `state`), each a session and a message,
/// the model answering with `responder`: both must exit 0 and print `re: <message>`.
/// Returns the scratch (its server recorded the requests) and the agent.
async fn two_at_once(
    state: &str,
    responder: impl Responder,
    calls: [(&str, &str); 2],
) -> Result<(Scratch, String), Box<dyn std::error::Error>> {
    let (s, agent) = concurrent_scratch().await?;
    s.server.set_responder(responder);
    let base = s.server.base_url();
    let runs = calls.map(|(session, message)| {
        let a = args(&s.ws_s, &agent, session, state);
        spawn_run(s.path(), &base, a, message)
    });
    for (run, (_, message)) in runs.into_iter().zip(calls) {
        let out = run.await??;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(stdout(&out), format!("re: {message}\n"));
    }
    Ok((s, agent))
}

/// The messages of session `session` of `agent` (user `ada`) saved in `state`.
async fn saved_messages(
    state: &str,
    agent: &str,
    session: &str,
) -> Result<Vec<(Role, String)>, Box<dyn std::error::Error>> {
    let store = hame::state::open(state).await?;
    let saved = store
        .load(&StateKey::new(agent, Some("ada"), session)?)
        .await?
        .ok_or("no state saved")?;
    Ok(saved
        .state
        .messages
        .iter()
        .map(|m| (m.role, m.text_content()))
        .collect())
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
    let responder = |req: &RecordedRequest| {
        let asked = req.last_user_text().unwrap_or_default();
        ScriptStep::text(format!("re: {asked}")).with_delay(Duration::from_secs(1))
    };
    let calls = [("busy", "first"), ("busy", "second")];
    let (s, agent) = two_at_once(state, responder, calls).await?;

    // Whoever got the lease second saw the first exchange complete.
    let reqs = s.server.requests();
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

    assert_eq!(
        saved_messages(state, &agent, "busy").await?,
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

backend_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    same_session_calls_queue {
        same_session_calls_queue_on_redis: "HAME_TEST_REDIS_URL",
        same_session_calls_queue_on_postgres: "HAME_TEST_POSTGRES_URL",
        same_session_calls_queue_on_mysql: "HAME_TEST_MYSQL_URL",
    }
);

/// Two processes on two sessions of one user. Each call makes two model requests: a tool
/// call the model takes 1.5 s to send, then the final text. A process is alive from its
/// first request until after its second, so if both first requests were recorded before
/// either second request, both processes were alive at the same time. Serialised sessions
/// would give the order first, second, first, second.
async fn different_sessions_run_in_parallel(state: &str) -> TestResult {
    let responder = |req: &RecordedRequest| {
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
    };
    let calls = [("left", "to left"), ("right", "to right")];
    let (s, agent) = two_at_once(state, responder, calls).await?;
    let order: Vec<(String, bool)> = s
        .server
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
    for (session, text) in calls {
        assert_eq!(
            saved_messages(state, &agent, session).await?,
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

backend_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    different_sessions_run_in_parallel {
        different_sessions_run_in_parallel_on_redis: "HAME_TEST_REDIS_URL",
        different_sessions_run_in_parallel_on_postgres: "HAME_TEST_POSTGRES_URL",
        different_sessions_run_in_parallel_on_mysql: "HAME_TEST_MYSQL_URL",
    }
);

/// 40 processes of one user, each on its own session, at once: the local session index
/// lists every one of them (one index file per session, none lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_processes_never_lose_a_session_index_entry() -> TestResult {
    const N: usize = 40;
    let (s, agent) = concurrent_scratch().await?;
    let state = s.path().join("state").to_string_lossy().into_owned();
    s.server
        .push_all((0..N).map(|i| ScriptStep::text(format!("answer {i}"))));
    let base = s.server.base_url();
    let runs: Vec<_> = (0..N)
        .map(|i| {
            let mut a = args(&s.ws_s, &agent, &format!("s{i}"), &state);
            a.push("--no-memory".into());
            spawn_run(s.path(), &base, a, &format!("question {i}"))
        })
        .collect();
    for r in runs {
        let out = r.await??;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    // Read the index files themselves (listing sessions would also repair them): one
    // per session, each naming its session.
    let mut found = Vec::new();
    for entry in walk(&s.ws)? {
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
