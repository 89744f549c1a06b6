//! SIGINT and SIGTERM: the running call is cancelled, what joined the conversation is
//! saved, the session lease is released, and the next call on the session starts at once —
//! on every state backend.
#![cfg(unix)]
#![allow(clippy::print_stderr)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use hame::Role;
use hame::state::StateKey;
use hame_test_support::{ScriptStep, ScriptedServer};

use super::common::{hame, output, service, stdout, unique_agent};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Waits until the scripted server has received `n` requests (20 s at most).
async fn wait_for_requests(server: &ScriptedServer, n: usize, what: &str) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.request_count() < n {
        if Instant::now() > deadline {
            return Err(format!("{what} never reached the model").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// `hame <command>` on the workspace `ws` with JSON state in `state`, memory off.
fn local<'a>(command: &'a str, ws: &'a str, state: &'a str) -> Vec<&'a str> {
    vec![
        command,
        "--model",
        "openai:m",
        "--workspace",
        ws,
        "--state",
        state,
        "--no-memory",
    ]
}

/// Sends `signal` to `pid` with kill(1).
fn send(signal: i32, pid: u32) -> TestResult {
    let killed = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()?;
    assert!(killed.success());
    Ok(())
}

/// Starts `hame run` on a model that takes 30 s to answer, signals it once the request is
/// in, and checks the exit code, the saved turn and how fast the next call runs.
async fn signal_releases_the_session(state: &str, signal: i32, want: i32) -> TestResult {
    let dir = tempfile::tempdir()?;
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("too late").with_delay(Duration::from_secs(30)));
    server.push(ScriptStep::text("second answer"));
    let agent = unique_agent();
    let base = server.base_url();
    let args = [
        "run",
        "--model",
        "openai:m",
        "--agent",
        &agent,
        "--user",
        "ada",
        "--session",
        "sig",
        "--state",
        state,
        "--no-memory",
    ];
    let mut first = hame(
        &[&args[..], &["first question"]].concat(),
        &[("OPENAI_BASE_URL", &base)],
        dir.path(),
    );
    let child = first
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    wait_for_requests(&server, 1, "the first call").await?;
    let sent = Instant::now();
    send(signal, child.id())?;
    let status = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    let exit_after = sent.elapsed();
    assert_eq!(
        status.status.code(),
        Some(want),
        "stderr: {}",
        String::from_utf8_lossy(&status.stderr)
    );

    // The next call on the same session does not wait for a lease to expire.
    let started = Instant::now();
    let next = output(hame(
        &[&args[..], &["second question"]].concat(),
        &[("OPENAI_BASE_URL", &base)],
        dir.path(),
    ))
    .await?;
    let next_took = started.elapsed();
    eprintln!(
        "{state}: signal {signal} -> exit {want} after {exit_after:?}; next call took {next_took:?}"
    );
    assert!(
        next.status.success(),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    assert_eq!(stdout(&next).trim(), "second answer");
    assert!(
        next_took < Duration::from_secs(2),
        "next call took {next_took:?}"
    );

    // The interrupted turn is in the state, closed, so the model saw it as such.
    let store = hame::state::open(state).await?;
    let saved = store
        .load(&StateKey::new(&agent, Some("ada"), "sig")?)
        .await?
        .ok_or("no state")?;
    let turns: Vec<(Role, String)> = saved
        .state
        .messages
        .iter()
        .map(|m| (m.role, m.text_content()))
        .collect();
    assert_eq!(turns.len(), 4, "{turns:?}");
    assert_eq!(turns[0], (Role::User, "first question".to_owned()));
    assert_eq!(turns[1].0, Role::Assistant);
    assert!(turns[1].1.contains("did not finish"), "{turns:?}");
    assert_eq!(turns[3], (Role::Assistant, "second answer".to_owned()));
    Ok(())
}

const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_release_a_json_session() -> TestResult {
    let state = tempfile::tempdir()?;
    let s = state.path().to_string_lossy().into_owned();
    signal_releases_the_session(&s, SIGTERM, 143).await?;
    let state = tempfile::tempdir()?;
    let s = state.path().to_string_lossy().into_owned();
    signal_releases_the_session(&s, SIGINT, 130).await
}

/// [`signal_releases_the_session`] on the shared store named by the service variable `var`.
async fn on_service(var: &str, signal: i32, want: i32) -> TestResult {
    match service(var) {
        Some(url) => signal_releases_the_session(&url, signal, want).await,
        None => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_a_redis_session() -> TestResult {
    on_service("HAME_TEST_REDIS_URL", SIGTERM, 143).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_releases_a_postgres_session() -> TestResult {
    on_service("HAME_TEST_POSTGRES_URL", SIGINT, 130).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_a_mysql_session() -> TestResult {
    on_service("HAME_TEST_MYSQL_URL", SIGTERM, 143).await
}

/// Live (not zombie) processes whose command line is exactly `argv`.
fn live_processes(argv: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .filter(|pid| {
            // Field 3 of /proc/<pid>/stat is the state; `Z` is a zombie nobody reaped.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
                .unwrap_or(false)
        })
        .collect()
}

/// A shell command that would run for an hour dies with hame when hame is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_shell_command_dies_with_hame() -> TestResult {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("ws"))?;
    let ws = dir.path().join("ws").to_string_lossy().into_owned();
    let state = dir.path().join("state").to_string_lossy().into_owned();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let secs = format!("3000.{nanos:09}");
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::tool_call(
        "x1",
        "execute",
        serde_json::json!({"command": format!("sleep {secs}; echo never")}),
    ));
    for signal in [SIGTERM, 9] {
        let base = server.base_url();
        let child = hame(
            &[&local("run", &ws, &state)[..], &["go"]].concat(),
            &[("OPENAI_BASE_URL", &base)],
            dir.path(),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while live_processes(&["sleep", &secs]).is_empty() {
            if Instant::now() > deadline {
                return Err("the shell command never started".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        send(signal, child.id())?;
        let sent = Instant::now();
        let status = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
        if signal == SIGTERM {
            assert_eq!(status.status.code(), Some(143));
        }
        while !live_processes(&["sleep", &secs]).is_empty() {
            assert!(
                sent.elapsed() < Duration::from_secs(2),
                "the command outlived hame (signal {signal})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!(
            "signal {signal}: the shell command was gone {:?} after it",
            sent.elapsed()
        );
        // The next run asks the model again.
        server.push(ScriptStep::tool_call(
            "x2",
            "execute",
            serde_json::json!({"command": format!("sleep {secs}; echo never")}),
        ));
    }
    Ok(())
}

/// In `hame chat`, Ctrl-C cancels the running turn and comes back to the prompt; the next
/// turn works on the same session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_in_chat_cancels_the_turn_and_returns_to_the_prompt() -> TestResult {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("ws"))?;
    let ws = dir.path().join("ws").to_string_lossy().into_owned();
    let state = dir.path().join("state").to_string_lossy().into_owned();
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("too late").with_delay(Duration::from_secs(30)));
    server.push(ScriptStep::text("second answer"));
    let base = server.base_url();
    let mut child = hame(
        &local("chat", &ws, &state),
        &[("OPENAI_BASE_URL", &base)],
        dir.path(),
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    stdin.write_all(b"first question\n")?;
    stdin.flush()?;
    wait_for_requests(&server, 1, "the first turn").await?;
    send(SIGINT, child.id())?;
    // The cancelled turn ends at once; the prompt takes the next line.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stdin.write_all(b"second question\n")?;
    stdin.flush()?;
    wait_for_requests(&server, 2, "the second turn").await?;
    // Let the answer stream out before closing stdin (EOF ends the chat).
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(stdin);
    let mut out = String::new();
    child
        .stdout
        .take()
        .ok_or("no stdout")?
        .read_to_string(&mut out)?;
    let status = tokio::task::spawn_blocking(move || child.wait()).await??;
    assert!(status.success(), "chat exited with {status:?}");
    assert!(out.contains("second answer"), "{out}");
    assert!(!out.contains("too late"), "{out}");
    Ok(())
}
