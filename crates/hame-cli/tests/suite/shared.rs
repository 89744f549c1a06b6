//! Shared-store mode: two processes ("replicas") on one Redis.

use std::fs;
use std::path::Path;
use std::process::Output;

use hame_test_support::{ScriptStep, ScriptToolCall, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{
    last_tool_result, run_with, service, stderr, system_of, tool_names, unique_agent,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Two replicas' directories, each with an empty workspace `ws`.
fn replicas() -> std::io::Result<[tempfile::TempDir; 2]> {
    let dirs = [tempfile::tempdir()?, tempfile::tempdir()?];
    for d in &dirs {
        fs::create_dir_all(d.path().join("ws"))?;
    }
    Ok(dirs)
}

/// `hame run` in the replica `dir` (workspace `dir/ws`) as user alice in session s1 of
/// `agent` on the shared store `store`, then `more` (its state, ...); it must exit 0.
async fn run_replica(
    dir: &Path,
    base: &str,
    (agent, store): (&str, &str),
    more: &[&str],
    message: &str,
) -> Result<Output, Box<dyn std::error::Error>> {
    let ws = dir.join("ws").to_string_lossy().into_owned();
    let mut args = vec!["--workspace", &ws, "--agent", agent, "--user", "alice"];
    args.extend(["--session", "s1", "--store", store]);
    args.extend_from_slice(more);
    let out = run_with(dir, base, &args, message, &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    Ok(out)
}

#[tokio::test]
async fn replicas_share_files_sessions_and_overrides_through_redis() -> TestResult {
    let Some(redis) = service("HAME_TEST_REDIS_URL") else {
        return Ok(());
    };
    let server = ScriptedServer::start().await?;
    let base = server.base_url();
    let agent = unique_agent();
    // Two replicas: two processes, two separate local directories holding the same template.
    let [one, two] = replicas()?;
    for d in [&one, &two] {
        fs::write(d.path().join("ws/AGENTS.md"), "template persona")?;
    }
    let state = ["--state", redis.as_str()];

    // Replica one writes a note and a persona override for alice.
    // (write_file refuses to replace a file the session has not read: read AGENTS.md first.)
    server.push_all([
        ScriptStep::tool_calls(vec![
            ScriptToolCall::new(
                "w1",
                "write_file",
                &json!({"file_path": "notes.md", "content": "shared-note-7"}),
            ),
            ScriptToolCall::new("r0", "read_file", &json!({"file_path": "AGENTS.md"})),
        ]),
        ScriptStep::tool_call(
            "w2",
            "write_file",
            json!({"file_path": "AGENTS.md", "content": "alice override persona"}),
        ),
        ScriptStep::text("stored"),
    ]);
    let shared = (agent.as_str(), redis.as_str());
    run_replica(one.path(), &base, shared, &state, "remember").await?;
    // Nothing of alice's landed on replica one's disk: it is all in Redis.
    assert!(!one.path().join("ws/agents").exists());

    // Replica two continues the session, sees the note and the override.
    server.push_all([
        ScriptStep::tool_call("r1", "read_file", json!({"file_path": "notes.md"})),
        ScriptStep::text("found it"),
    ]);
    run_replica(two.path(), &base, shared, &state, "what did I store?").await?;
    let reqs = server.requests();
    assert!(
        !last_tool_result(&reqs[2].body).starts_with("Error"),
        "{}",
        last_tool_result(&reqs[2].body)
    );
    let first_of_two = &reqs[3].body;
    let system = system_of(first_of_two);
    assert!(system.contains("alice override persona"), "{system}");
    let history = serde_json::to_string(&first_of_two["messages"])?;
    assert!(
        history.contains("remember"),
        "the session did not continue: {history}"
    );
    assert!(last_tool_result(&reqs[4].body).contains("shared-note-7"));
    // Shared-store mode has no shell tool.
    let tools = tool_names(first_of_two);
    assert!(!tools.contains(&"execute".to_owned()), "{tools:?}");
    assert!(tools.contains(&"read_file".to_owned()), "{tools:?}");
    Ok(())
}

#[tokio::test]
async fn shared_store_with_local_state_is_refused() -> TestResult {
    let Some(redis) = service("HAME_TEST_REDIS_URL") else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    fs::create_dir_all(dir.path().join("ws"))?;
    let ws = dir.path().join("ws").to_string_lossy().into_owned();
    let out = run_with(
        dir.path(),
        "http://127.0.0.1:9/v1",
        &["--workspace", &ws, "--store", &redis],
        "hi",
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("shared state store"),
        "{}",
        stderr(&out)
    );
    Ok(())
}

#[tokio::test]
async fn replicas_share_a_postgres_memory_index() -> TestResult {
    let (Some(redis), Some(pg)) = (
        service("HAME_TEST_REDIS_URL"),
        service("HAME_TEST_POSTGRES_URL"),
    ) else {
        return Ok(());
    };
    let server = ScriptedServer::start().await?;
    let base = server.base_url();
    let agent = unique_agent();
    let [one, two] = replicas()?;
    let shared = (agent.as_str(), redis.as_str());
    let on_pg = ["--state", pg.as_str(), "--memory-index", pg.as_str()];
    server.push_all([
        ScriptStep::tool_call(
            "m1",
            "memory_save",
            json!({"fact": "The staging database is called heron-7."}),
        ),
        ScriptStep::text("saved"),
    ]);
    run_replica(one.path(), &base, shared, &on_pg, "remember the staging db").await?;

    server.push_all([
        ScriptStep::tool_call("m2", "memory_search", json!({"query": "heron"})),
        ScriptStep::text("found"),
    ]);
    run_replica(two.path(), &base, shared, &on_pg, "what is the staging db?").await?;
    let reqs = server.requests();
    let found = last_tool_result(&reqs[reqs.len() - 1].body);
    assert!(found.contains("staging database is called"), "{found}");
    assert!(found.contains("memory/"), "{found}");
    Ok(())
}
