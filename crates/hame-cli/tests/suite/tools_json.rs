//! `tools.json` through `hame run`: allow/deny with globs over every tool, a broken file
//! is exit 2 before anything runs.

use std::fs;

use hame_test_support::ScriptStep;
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{
    Scratch, hame, output, prompt_of, run_script, run_with, stderr, stdout, tool_names,
    tool_results, tools_offered,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn allow_and_deny_with_globs_filter_what_the_model_sees_and_runs() -> TestResult {
    let s = Scratch::new().await?;
    let (dir, ws) = (&s.dir, &s.ws);
    fs::write(
        ws.join("tools.json"),
        json!({"allow": ["read_*", "list_files", "write_*", "*_skill"], "deny": ["write_*", "propose_*"]}).to_string(),
    )?;
    fs::write(ws.join("a.txt"), "A")?;
    let ws_s = &s.ws_s;
    let server = &s.server;
    server.push_all([
        ScriptStep::tool_call(
            "c1",
            "write_file",
            json!({"file_path": "b.txt", "content": "B"}),
        ),
        ScriptStep::tool_call("c2", "execute", json!({"command": "touch c.txt"})),
        ScriptStep::tool_call("c3", "read_file", json!({"file_path": "a.txt"})),
        ScriptStep::text("ok"),
    ]);
    s.run_ws(&[], "go").await?;
    let reqs = server.requests();
    assert_eq!(
        tool_names(&reqs[0].body),
        ["list_files", "load_skill", "read_file"]
    );
    let results = tool_results(server);
    assert!(
        results[0].contains("permission_denied")
            && results[0].contains("not allowed by tools.json"),
        "{}",
        results[0]
    );
    assert!(
        results[1].contains("not allowed by tools.json"),
        "{}",
        results[1]
    );
    assert!(results[2].contains('A'), "{}", results[2]);
    assert!(!ws.join("b.txt").exists() && !ws.join("c.txt").exists());

    // Re-read every call: an edited tools.json applies to the next run.
    fs::write(
        ws.join("tools.json"),
        json!({"deny": ["execute"]}).to_string(),
    )?;
    let names = tools_offered(dir.path(), &["--workspace", ws_s]).await?;
    assert!(
        names.contains(&"write_file".to_string()) && !names.contains(&"execute".to_string()),
        "{names:?}"
    );
    Ok(())
}

#[tokio::test]
async fn per_user_tools_json_merges_over_the_shared_one() -> TestResult {
    let s = Scratch::new().await?;
    let (dir, ws) = (&s.dir, &s.ws);
    fs::create_dir_all(ws.join("alice"))?;
    fs::write(
        ws.join("tools.json"),
        json!({"deny": ["execute"]}).to_string(),
    )?;
    fs::write(
        ws.join("alice/tools.json"),
        json!({"allow": ["read_file", "execute", "list_files"], "deny": ["list_*"]}).to_string(),
    )?;
    let ws_s = &s.ws_s;
    // alice's allow replaces the shared one; the denies add up (her file cannot lift one).
    let alice = tools_offered(dir.path(), &["--workspace", ws_s, "--user", "alice"]).await?;
    assert_eq!(alice, ["read_file"]);
    let bob = tools_offered(dir.path(), &["--workspace", ws_s, "--user", "bob"]).await?;
    assert!(
        bob.contains(&"list_files".to_string()) && !bob.contains(&"execute".to_string()),
        "{bob:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_broken_tools_json_is_exit_2_with_one_line_naming_it() -> TestResult {
    let cases: [(&str, &str, &str); 6] = [
        ("tools.json", "{\"allow\": [", "tools.json: not valid JSON"),
        (
            "tools.json",
            r#"{"allow": [], "mcp": {}}"#,
            "tools.json: unknown field `mcp`",
        ),
        (
            "tools.json",
            r#"{"mcpServers": {"s": {"command": "${HAME_TEST_UNSET_VAR}"}}}"#,
            "HAME_TEST_UNSET_VAR is not set",
        ),
        (
            "tools.json",
            r#"{"permissions": {"default": "sometimes"}}"#,
            "tools.json: unknown variant `sometimes`",
        ),
        (
            "tools.json",
            r#"{"mcpServers": {"a__b": {"command": "true"}}}"#,
            "tools.json: mcpServers.a__b: server name `a__b` is ambiguous in tool names `mcp__<server>__<tool>`: rename it without `__` and without `_` at either end (for example `a_b`)",
        ),
        (
            "alice/tools.json",
            r#"{"deny": "execute"}"#,
            "alice/tools.json: invalid type",
        ),
    ];
    for (file, text, needle) in cases {
        let s = Scratch::new().await?;
        let (dir, ws) = (&s.dir, &s.ws);
        fs::create_dir_all(ws.join("alice"))?;
        fs::write(ws.join(file), text)?;
        fs::write(ws.join("notes.md"), "keep me")?;
        let ws_s = &s.ws_s;
        let server = &s.server;
        server.push(ScriptStep::text("should not be asked"));
        let out = run_with(
            dir.path(),
            &server.base_url(),
            &["--workspace", ws_s, "--user", "alice"],
            "go",
            &[],
        )
        .await?;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{file} {text}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("hame: ") && err.contains(needle),
            "{needle}: {err}"
        );
        assert_eq!(stdout(&out), "");
        assert_eq!(server.request_count(), 0, "nothing runs");
        assert_eq!(
            fs::read_to_string(ws.join(file))?,
            text,
            "the file is untouched"
        );
        assert_eq!(fs::read_to_string(ws.join("notes.md"))?, "keep me");
    }
    Ok(())
}

#[tokio::test]
async fn isolated_tenants_cannot_write_their_tools_json_but_keep_their_skills() -> TestResult {
    let s = Scratch::new().await?;
    let (dir, ws) = (&s.dir, &s.ws);
    fs::write(
        ws.join("tools.json"),
        json!({"deny": ["list_files"]}).to_string(),
    )?;
    let ws_s = &s.ws_s;
    let args = [
        "--workspace",
        ws_s.as_str(),
        "--isolated",
        "--user",
        "alice",
    ];
    let (out, server) = run_script(
        dir.path(),
        &args,
        "go",
        vec![
            ScriptStep::tool_call("c0", "read_file", json!({"file_path": "tools.json"})),
            ScriptStep::tool_call(
                "c1",
                "write_file",
                json!({"file_path": "tools.json", "content": "{}"}),
            ),
            ScriptStep::tool_call(
                "c2",
                "propose_skill",
                json!({"name": "mine", "description": "Alice's own.", "body": "MINE"}),
            ),
            ScriptStep::text("ok"),
        ],
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let results = tool_results(&server);
    assert!(results[0].contains("list_files"), "{}", results[0]);
    // Refused as the operator's configuration, not as runtime data (session logs).
    assert!(
        results[1].contains("permission_denied")
            && results[1].contains("tools.json is the operator's configuration")
            && !results[1].contains("session"),
        "{}",
        results[1]
    );
    assert!(results[2].contains("Draft saved"), "{}", results[2]);
    // The deny still holds for her next call.
    assert!(
        !tools_offered(dir.path(), &args)
            .await?
            .contains(&"list_files".to_string())
    );
    // Her draft lives in her namespace; promoted, it is listed to her only.
    let state = dir.path().join("state").to_string_lossy().into_owned();
    let promote = output(hame(
        &[
            "skills",
            "promote",
            "mine",
            "--workspace",
            ws_s,
            "--isolated",
            "--user",
            "alice",
        ],
        &[("HAME_STATE_HOME", &state)],
        dir.path(),
    ))
    .await?;
    assert_eq!(promote.status.code(), Some(0), "{}", stderr(&promote));
    assert!(
        !ws.join("skills/mine").exists(),
        "not in the shared template"
    );
    let alice = prompt_of(dir.path(), &args).await?;
    assert!(alice.contains("- mine: Alice's own.\n"), "{alice}");
    let bob = prompt_of(
        dir.path(),
        &["--workspace", ws_s, "--isolated", "--user", "bob"],
    )
    .await?;
    assert!(!bob.contains("mine"), "{bob}");
    Ok(())
}
