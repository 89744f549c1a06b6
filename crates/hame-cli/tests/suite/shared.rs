//! Shared-store mode: two processes ("replicas") on one Redis.

use std::fs;

use hame_test_support::{ScriptStep, ScriptToolCall, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{last_tool_result, run_with, service, stderr, system_of, unique_agent};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn replicas_share_files_sessions_and_overrides_through_redis() -> TestResult {
    let Some(redis) = service("HAME_TEST_REDIS_URL") else {
        return Ok(());
    };
    let server = ScriptedServer::start().await?;
    let base = server.base_url();
    let agent = unique_agent();
    // Two replicas: two processes, two separate local directories holding the same template.
    let one = tempfile::tempdir()?;
    let two = tempfile::tempdir()?;
    for d in [&one, &two] {
        fs::create_dir_all(d.path().join("ws"))?;
        fs::write(d.path().join("ws/AGENTS.md"), "template persona")?;
    }
    let ws1 = one.path().join("ws").to_string_lossy().into_owned();
    let ws2 = two.path().join("ws").to_string_lossy().into_owned();
    let common = |ws: &str| -> Vec<String> {
        [
            "--workspace",
            ws,
            "--agent",
            &agent,
            "--user",
            "alice",
            "--session",
            "s1",
            "--store",
            &redis,
            "--state",
            &redis,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };

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
    let args1 = common(&ws1);
    let args1: Vec<&str> = args1.iter().map(String::as_str).collect();
    let out = run_with(one.path(), &base, &args1, "remember", &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Nothing of alice's landed on replica one's disk: it is all in Redis.
    assert!(!one.path().join("ws/agents").exists());

    // Replica two continues the session, sees the note and the override.
    server.push_all([
        ScriptStep::tool_call("r1", "read_file", json!({"file_path": "notes.md"})),
        ScriptStep::text("found it"),
    ]);
    let args2 = common(&ws2);
    let args2: Vec<&str> = args2.iter().map(String::as_str).collect();
    let out = run_with(two.path(), &base, &args2, "what did I store?", &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
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
    let tools: Vec<String> = first_of_two["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
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
    let one = tempfile::tempdir()?;
    let two = tempfile::tempdir()?;
    for d in [&one, &two] {
        fs::create_dir_all(d.path().join("ws"))?;
    }
    let args = |ws: &std::path::Path| -> Vec<String> {
        let ws = ws.join("ws").to_string_lossy().into_owned();
        [
            "--workspace",
            &ws,
            "--agent",
            &agent,
            "--user",
            "alice",
            "--session",
            "s1",
            "--store",
            &redis,
            "--state",
            &pg,
            "--memory-index",
            &pg,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    server.push_all([
        ScriptStep::tool_call(
            "m1",
            "memory_save",
            json!({"fact": "The staging database is called heron-7."}),
        ),
        ScriptStep::text("saved"),
    ]);
    let a1 = args(one.path());
    let a1: Vec<&str> = a1.iter().map(String::as_str).collect();
    let out = run_with(one.path(), &base, &a1, "remember the staging db", &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    server.push_all([
        ScriptStep::tool_call("m2", "memory_search", json!({"query": "heron"})),
        ScriptStep::text("found"),
    ]);
    let a2 = args(two.path());
    let a2: Vec<&str> = a2.iter().map(String::as_str).collect();
    let out = run_with(two.path(), &base, &a2, "what is the staging db?", &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let reqs = server.requests();
    let found = last_tool_result(&reqs[reqs.len() - 1].body);
    assert!(found.contains("staging database is called"), "{found}");
    assert!(found.contains("memory/"), "{found}");
    Ok(())
}
