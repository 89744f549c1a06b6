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
            "propose_skill",
            "read_file",
            "session_history",
            "session_list",
            "task_cancel",
            "task_list",
            "task_output",
            "write_file"
        ]
    );
    Ok(())
}
