//! Model-visible text: the built-in tool names, descriptions and schemas. Reviewed like code.

use std::sync::Arc;

use hame_core::test_support::ScriptedModel;
use hame_harness::HarnessAgent;

fn agent(memory: bool) -> Result<(HarnessAgent, tempfile::TempDir), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut builder = HarnessAgent::builder()
        .model(Arc::new(ScriptedModel::new([])))
        .workspace(dir.path().join("ws"))
        .state_store(Arc::new(hame_state::InMemoryStore::new()));
    if !memory {
        builder = builder.memory(hame_harness::memory::MemoryOptions::disabled());
    }
    Ok((builder.build()?, dir))
}

#[test]
fn builtin_tool_specs() -> Result<(), Box<dyn std::error::Error>> {
    let (agent, _dir) = agent(true)?;
    let specs = agent.agent_loop().tools().specs();
    insta::assert_json_snapshot!("builtin_tool_specs", specs);
    Ok(())
}

#[test]
fn memory_off_registers_no_memory_tools() -> Result<(), Box<dyn std::error::Error>> {
    let (agent, _dir) = agent(false)?;
    let names = agent.agent_loop().tools().names();
    assert_eq!(
        names,
        vec![
            "agent_list",
            "agent_send",
            "agent_spawn",
            "edit_file",
            "execute",
            "glob_files",
            "grep_files",
            "list_files",
            "load_skill",
            "plan_enter",
            "plan_exit",
            "plan_write",
            "propose_skill",
            "read_file",
            "session_history",
            "session_list",
            "task_cancel",
            "task_list",
            "task_output",
            "todo_write",
            "write_file"
        ]
    );
    Ok(())
}

/// The token cost of the default tool set (what every request carries), counted with the
/// `gpt-4o` tokenizer over the compact JSON the clients send. A regression guard: the
/// figure is in `docs/benchmarks.md`.
#[test]
#[allow(clippy::print_stdout)] // the figure is the point of this test
fn default_tool_set_token_budget() -> Result<(), Box<dyn std::error::Error>> {
    let (agent, _dir) = agent(true)?;
    let specs = agent.agent_loop().tools().specs();
    let counter = hame_memory::counter_for_model("gpt-4o");
    let tokens = hame_memory::tokens::request_tokens(counter.as_ref(), "", &[], &specs);
    let json = serde_json::to_string(&specs)?;
    println!(
        "default tools: {} tools, {} bytes of JSON, {tokens} tokens",
        specs.len(),
        json.len()
    );
    assert!(
        tokens <= 2_900,
        "{tokens} tokens: the default tool set grew"
    );
    Ok(())
}

/// Prompt-cache friendliness: the system prompt and the tools are byte-identical across the
/// steps of a call and across calls while no workspace file changes, and change when one
/// does.
#[tokio::test]
async fn the_prefix_is_byte_identical_until_a_workspace_file_changes()
-> Result<(), Box<dyn std::error::Error>> {
    use hame_core::test_support::Reply;
    use hame_core::{Message, RuntimeContext, ToolCall};
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    std::fs::write(ws.join("AGENTS.md"), "# Persona\nBe terse.\n")?;
    let call = ToolCall {
        id: "c1".into(),
        name: "read_file".into(),
        arguments: r#"{"file_path":"AGENTS.md"}"#.into(),
    };
    let model = ScriptedModel::new([
        Reply::tools(std::slice::from_ref(&call)),
        Reply::text("one"),
        Reply::text("two"),
        Reply::text("three"),
    ]);
    let agent = HarnessAgent::builder()
        .model(Arc::new(model.clone()))
        .workspace(&ws)
        .state_store(Arc::new(hame_state::InMemoryStore::new()))
        .build()?;
    let ctx = RuntimeContext::new("s1");
    agent.call(Message::user("hi"), &ctx).await?;
    agent.call(Message::user("again"), &ctx).await?;
    std::fs::write(ws.join("AGENTS.md"), "# Persona\nBe verbose.\n")?;
    agent.call(Message::user("and now"), &ctx).await?;
    let prefix = |r: &hame_core::ModelRequest| -> Result<String, serde_json::Error> {
        Ok(format!(
            "{}\n{}",
            r.system,
            serde_json::to_string(&r.tools)?
        ))
    };
    let requests: Vec<_> = model
        .requests()
        .into_iter()
        .filter(|r| !r.tools.is_empty())
        .collect();
    assert_eq!(requests.len(), 4, "two steps, then one per call");
    let p: Vec<String> = requests.iter().map(prefix).collect::<Result<_, _>>()?;
    assert_eq!(p[0], p[1], "steps of one call");
    assert_eq!(p[1], p[2], "calls while nothing changed");
    assert_ne!(p[2], p[3], "AGENTS.md changed");
    assert!(p[3].contains("Be verbose."));
    // The hash logged per request (`RUST_LOG=hame_core=debug`) follows the prefix.
    let h: Vec<String> = requests.iter().map(hame_core::prefix_hash).collect();
    assert_eq!((h[0] == h[2], h[2] == h[3]), (true, false));
    Ok(())
}
