//! The distributed example end to end: two replica processes on one Redis continue one
//! session, against the scripted model server.

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;

use super::common::{dialogue, service, unique};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replica_processes_continue_one_session_through_redis() -> TestResult {
    let Some(redis) = service("HAME_TEST_REDIS_URL") else {
        return Ok(());
    };
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::text("Nice to meet you, Ada."),
        ScriptStep::text("Your name is Ada."),
    ]);
    let home = tempfile::tempdir()?;
    let agent = unique("dist");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_distributed-replica"));
    cmd.args(["--redis", &redis, "--agent", &agent, "--model", "openai:m"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("TMPDIR", home.path())
        .env("OPENAI_BASE_URL", server.base_url())
        .current_dir(home.path());
    let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].starts_with("replica 1 (pid "), "{stdout}");
    assert!(lines[0].ends_with("): Nice to meet you, Ada."), "{stdout}");
    assert!(lines[1].starts_with("replica 2 (pid "), "{stdout}");
    assert!(lines[1].ends_with("): Your name is Ada."), "{stdout}");
    let pid = |l: &str| {
        l.split("pid ")
            .nth(1)
            .and_then(|r| r.split(')').next())
            .map(str::to_owned)
    };
    assert_ne!(pid(lines[0]), pid(lines[1]), "two processes: {stdout}");

    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(dialogue(&reqs[0].body), vec!["My name is Ada."]);
    assert_eq!(
        dialogue(&reqs[1].body),
        vec![
            "My name is Ada.",
            "Nice to meet you, Ada.",
            "What is my name?"
        ]
    );
    // The replicas' private workspaces were temporary; nothing of the session is on disk.
    let left: Vec<_> = std::fs::read_dir(home.path())?.collect();
    assert!(left.is_empty(), "{left:?}");
    Ok(())
}
