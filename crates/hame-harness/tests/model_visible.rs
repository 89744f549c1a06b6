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
    assert!(tokens <= 99_999, "{tokens} tokens");
    Ok(())
}
