//! The file tools and the shell through `hame run` in local mode.

use std::fs;

use hame_test_support::ScriptStep;
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{Scratch, last_tool_result, stdout, system_of};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn write_then_read_a_file_through_the_tools() -> TestResult {
    let s = Scratch::scripted([
        ScriptStep::tool_call(
            "c1",
            "write_file",
            json!({"file_path": "notes/todo.md", "content": "- buy milk\n"}),
        ),
        ScriptStep::tool_call("c2", "read_file", json!({"file_path": "notes/todo.md"})),
        ScriptStep::text("Your list has milk."),
    ])
    .await?;
    let ws = &s.ws;
    let out = s.run_ws(&["--user", "alice"], "todo?").await?;
    assert_eq!(stdout(&out), "Your list has milk.\n");
    let reqs = s.server.requests();
    assert_eq!(reqs.len(), 3);
    assert!(
        last_tool_result(&reqs[2].body).contains("buy milk"),
        "{}",
        last_tool_result(&reqs[2].body)
    );
    // Local mode: the file landed in the workspace itself, where the shell sees it.
    assert_eq!(
        fs::read_to_string(ws.join("notes/todo.md"))?,
        "- buy milk\n"
    );
    // Every message of the call is in the never-compacted session log, at the reference
    // layout under alice's folder.
    let log = fs::read_to_string(ws.join("alice/agents/hame/sessions/default.log.jsonl"))?;
    assert_eq!(log.lines().count(), 6, "{log}");
    // The session index is updated once at the end of the call.
    let index: serde_json::Value = serde_json::from_str(&fs::read_to_string(
        ws.join("alice/agents/hame/sessions/index/default.json"),
    )?)?;
    let text = index.to_string();
    assert!(text.contains("\"message_count\":6"), "{text}");
    assert!(text.contains("todo?"), "{text}");
    Ok(())
}

#[tokio::test]
async fn hostile_paths_are_refused_with_codes() -> TestResult {
    let s = Scratch::scripted([
        ScriptStep::tool_calls(vec![
            hame_test_support::ScriptToolCall::new(
                "a",
                "read_file",
                &json!({"file_path": "../../etc/passwd"}),
            ),
            hame_test_support::ScriptToolCall::new(
                "b",
                "read_file",
                &json!({"file_path": "/etc/passwd"}),
            ),
            hame_test_support::ScriptToolCall::new(
                "c",
                "write_file",
                &json!({"file_path": "../escape.txt", "content": "x"}),
            ),
        ]),
        ScriptStep::text("done"),
    ])
    .await?;
    s.run_ws(&[], "go").await?;
    assert_eq!(s.server.requests().len(), 2);
    let results = s.results();
    assert_eq!(results.len(), 3);
    for r in &results {
        assert!(r.starts_with("Error ["), "{r}");
        assert!(!r.contains("root:"), "leaked /etc/passwd: {r}");
    }
    assert!(!s.path().join("escape.txt").exists());
    Ok(())
}

#[tokio::test]
async fn live_edit_of_agents_md_reaches_the_next_step() -> TestResult {
    let s = Scratch::scripted([
        ScriptStep::tool_call(
            "c1",
            "execute",
            json!({"command": "printf 'You are Version Two.' > AGENTS.md"}),
        ),
        ScriptStep::text("edited"),
    ])
    .await?;
    s.write("AGENTS.md", "You are Version One.")?;
    s.run_ws(&[], "edit yourself").await?;
    let reqs = s.server.requests();
    assert_eq!(reqs.len(), 2);
    assert!(system_of(&reqs[0].body).contains("You are Version One."));
    let second = system_of(&reqs[1].body);
    assert!(second.contains("You are Version Two."), "{second}");
    assert!(!second.contains("Version One"), "{second}");
    Ok(())
}
