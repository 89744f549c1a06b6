//! The example against the scripted model server: the model calls the custom tool, the
//! tool's result goes back to it, the reply is printed.

use hame_test_support::{ScriptStep, ScriptedServer};

#[tokio::test]
async fn the_custom_tool_runs_and_its_result_reaches_the_model()
-> Result<(), Box<dyn std::error::Error>> {
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::tool_call(
            "c1",
            "convert_temperature",
            serde_json::json!({"value": 100, "from": "F"}),
        ),
        ScriptStep::tool_call(
            "c2",
            "convert_temperature",
            serde_json::json!({"value": 1, "from": "K"}),
        ),
        ScriptStep::text("100 F is 37.8 C."),
    ]);
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    let home = dir.path().to_string_lossy().into_owned();
    let base = server.base_url();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_example-custom-tool"))
            .args([ws.to_string_lossy().as_ref(), "What is 100 F in Celsius?"])
            .env_clear()
            .env("HOME", &home)
            .env("HAME_STATE_HOME", format!("{home}/state"))
            .env("OPENAI_BASE_URL", base)
            .env("HAME_MODEL", "openai:m")
            .output()
    })
    .await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "100 F is 37.8 C.\n");
    let reqs = server.requests();
    assert_eq!(reqs.len(), 3);
    // The schema came from the derive, doc comments included.
    let tools = reqs[0].body["tools"].to_string();
    assert!(tools.contains("convert_temperature"), "{tools}");
    assert!(
        tools.contains("Its unit: \\\"C\\\" or \\\"F\\\"."),
        "{tools}"
    );
    let results: Vec<String> = reqs[2].body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(results[0], "100 F = 37.8 C");
    // An error the model can fix comes back as the tool's result, with its code.
    assert!(results[1].contains("unknown unit \"K\""), "{}", results[1]);
    assert!(results[1].contains("invalid_arguments"), "{}", results[1]);
    Ok(())
}
