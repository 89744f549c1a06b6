//! Deferred tools (ADR 0014): callable by name, offered once the session needs them.

use std::sync::Arc;

use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{Message, ModelRequest, RuntimeContext, ToolCall};
use hame_harness::HarnessAgent;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn call(id: &str, name: &str, args: serde_json::Value) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.to_string(),
    }
}

fn offered(r: &ModelRequest) -> Vec<String> {
    r.tools.iter().map(|t| t.name.clone()).collect()
}

fn build(
    model: &ScriptedModel,
    ws: &std::path::Path,
    store: Arc<hame_state::InMemoryStore>,
) -> Result<HarnessAgent, hame_harness::Error> {
    HarnessAgent::builder()
        .model(Arc::new(model.clone()))
        .workspace(ws)
        .state_store(store)
        .build()
}

#[tokio::test]
async fn tool_search_loads_a_group_for_the_session() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedModel::new([
        Reply::tools(&[call(
            "c1",
            "tool_search",
            serde_json::json!({"query": "sessions"}),
        )]),
        Reply::text("found them"),
        Reply::text("second call"),
    ]);
    let store = Arc::new(hame_state::InMemoryStore::new());
    let agent = build(&model, &dir.path().join("ws"), store.clone())?;
    let ctx = RuntimeContext::new("s1");
    agent.call(Message::user("hi"), &ctx).await?;
    agent.call(Message::user("again"), &ctx).await?;
    let reqs = model.requests();
    assert_eq!(reqs.len(), 3);
    let first = offered(&reqs[0]);
    assert!(first.contains(&"tool_search".to_owned()), "{first:?}");
    assert!(!first.contains(&"session_list".to_owned()), "{first:?}");
    let result = reqs[1]
        .messages
        .iter()
        .rev()
        .find_map(|m| m.tool_results_iter().next().map(|r| r.content.clone()))
        .unwrap_or_default();
    assert!(result.contains("session_search"), "{result}");
    for r in &reqs[1..] {
        let names = offered(r);
        for t in ["session_list", "session_history", "session_search"] {
            assert!(names.contains(&t.to_owned()), "{t} in {names:?}");
        }
        assert!(!names.contains(&"task_output".to_owned()), "{names:?}");
    }
    // The offered order stays stable (prompt caching): the loaded ones follow the rest.
    assert_eq!(offered(&reqs[1]), offered(&reqs[2]));
    // A new process (a new agent on the same state) still offers them.
    let model2 = ScriptedModel::new([Reply::text("third")]);
    let agent2 = build(&model2, &dir.path().join("ws"), store)?;
    agent2.call(Message::user("and again"), &ctx).await?;
    assert!(offered(&model2.requests()[0]).contains(&"session_list".to_owned()));
    // Another session starts from the default set.
    let model3 = ScriptedModel::new([Reply::text("other")]);
    let agent3 = build(
        &model3,
        &dir.path().join("ws"),
        Arc::new(hame_state::InMemoryStore::new()),
    )?;
    agent3
        .call(Message::user("hi"), &RuntimeContext::new("s2"))
        .await?;
    assert!(!offered(&model3.requests()[0]).contains(&"session_list".to_owned()));
    Ok(())
}

#[tokio::test]
async fn a_deferred_tool_called_by_name_runs_and_loads_its_group() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedModel::new([
        Reply::tools(&[call("c1", "session_list", serde_json::json!({}))]),
        Reply::tools(&[call(
            "c2",
            "tool_search",
            serde_json::json!({"query": "no-such-thing"}),
        )]),
        Reply::text("done"),
    ]);
    let agent = build(
        &model,
        &dir.path().join("ws"),
        Arc::new(hame_state::InMemoryStore::new()),
    )?;
    agent
        .call(Message::user("hi"), &RuntimeContext::new("s1"))
        .await?;
    let reqs = model.requests();
    let results: Vec<String> = reqs[2]
        .messages
        .iter()
        .flat_map(|m| {
            m.tool_results_iter()
                .map(|r| r.content.clone())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(
        !results[0].contains("unknown_tool"),
        "it ran: {}",
        results[0]
    );
    assert!(
        results[1].starts_with("No tool matches `no-such-thing`")
            && results[1].contains("task_output"),
        "{}",
        results[1]
    );
    assert!(offered(&reqs[1]).contains(&"session_search".to_owned()));
    Ok(())
}

#[tokio::test]
async fn plan_mode_offers_the_plan_tools_and_a_declared_subagent_the_task_tools() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    let model = ScriptedModel::new([Reply::text("planning"), Reply::text("with a reviewer")]);
    let agent = build(&model, &ws, Arc::new(hame_state::InMemoryStore::new()))?;
    let mut ctx = RuntimeContext::new("s1");
    ctx.extras.insert(
        hame_harness::permissions::PLAN_EXTRA.into(),
        serde_json::Value::Bool(true),
    );
    agent.call(Message::user("plan it"), &ctx).await?;
    std::fs::create_dir_all(ws.join("subagents"))?;
    std::fs::write(
        ws.join("subagents/reviewer.md"),
        "---\ndescription: Reviews files\n---\nYou review.\n",
    )?;
    agent
        .call(Message::user("review"), &RuntimeContext::new("s2"))
        .await?;
    let reqs = model.requests();
    let plan = offered(&reqs[0]);
    for t in ["plan_enter", "plan_write", "plan_exit"] {
        assert!(plan.contains(&t.to_owned()), "{t} in {plan:?}");
    }
    assert!(!plan.contains(&"task_output".to_owned()), "{plan:?}");
    let declared = offered(&reqs[1]);
    for t in hame_subagent::SUBAGENT_TOOLS {
        assert!(declared.contains(&t.to_owned()), "{t} in {declared:?}");
    }
    assert!(!declared.contains(&"plan_write".to_owned()), "{declared:?}");
    Ok(())
}

#[tokio::test]
async fn an_empty_deferred_list_offers_every_tool() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedModel::new([Reply::text("hello")]);
    let agent = HarnessAgent::builder()
        .model(Arc::new(model.clone()))
        .workspace(dir.path().join("ws"))
        .state_store(Arc::new(hame_state::InMemoryStore::new()))
        .defer_tools(Vec::<String>::new())
        .build()?;
    agent
        .call(Message::user("hi"), &RuntimeContext::new("s1"))
        .await?;
    let names = offered(&model.requests()[0]);
    assert!(!names.contains(&"tool_search".to_owned()), "{names:?}");
    for t in hame_harness::catalog::DEFAULT_DEFERRED_TOOLS {
        assert!(names.contains(&(*t).to_owned()), "{t} in {names:?}");
    }
    Ok(())
}
