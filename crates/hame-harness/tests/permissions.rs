//! The permissions layer through the library API: builder rules and modes, `pending`,
//! `resume` with a decision, the `permission_decided` events, a refused second decision.

use std::path::Path;
use std::sync::Arc;

use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{
    AgentEvent, CancellationToken, EventSink, Message, Resolution, RuntimeContext, ToolCall,
};
use hame_harness::HarnessAgent;
use hame_harness::permissions::Mode;
use hame_harness::tools_config::{PermissionRule, Permissions};
use pretty_assertions::assert_eq;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn agent(
    dir: &Path,
    replies: Vec<Reply>,
    mode: Mode,
) -> Result<HarnessAgent, Box<dyn std::error::Error>> {
    let rules = Permissions {
        ask: vec![PermissionRule::parse("write_file(out/*)")?],
        ..Permissions::default()
    };
    Ok(HarnessAgent::builder()
        .model(Arc::new(ScriptedModel::new(replies)))
        .workspace(dir.join("ws"))
        .state_store(Arc::new(hame_state::JsonStore::open(dir.join("state"))?))
        .memory(hame_harness::memory::MemoryOptions::disabled())
        .permission_rules(rules)
        .permission_mode(mode)
        .build()?)
}

fn call(id: &str, name: &str, args: serde_json::Value) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.to_string(),
    }
}

fn decisions(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<AgentEvent>,
) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    while let Ok(ev) = events.try_recv() {
        if let AgentEvent::Custom { kind, data } = ev
            && kind == hame_harness::permissions::DECIDED_EVENT
        {
            let s = |k: &str| data[k].as_str().unwrap_or_default().to_owned();
            out.push((s("tool"), s("rule"), s("outcome")));
        }
    }
    // The calls of a step run concurrently: their decisions come in any order.
    out.sort();
    out
}

/// The call suspended (for an approval).
fn assert_suspended(err: &Option<hame_harness::Error>) {
    assert!(
        matches!(
            err,
            Some(hame_harness::Error::Call(hame_core::Error::Suspended(_)))
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_builder_ask_rule_suspends_and_a_denial_finishes_the_call() -> TestResult {
    let dir = tempfile::tempdir()?;
    let replies = vec![
        Reply::tools(&[
            call(
                "w1",
                "write_file",
                serde_json::json!({"file_path": "out/a.txt", "content": "x"}),
            ),
            call(
                "w2",
                "write_file",
                serde_json::json!({"file_path": "b.txt", "content": "y"}),
            ),
        ]),
        Reply::text("fine"),
    ];
    let a = agent(dir.path(), replies, Mode::Default)?;
    let ctx = RuntimeContext::new("s1");
    let (sink, mut rx) = EventSink::channel();
    let err = a
        .call_with(
            Message::user("write"),
            &ctx,
            &sink,
            &CancellationToken::new(),
        )
        .await
        .err();
    assert_suspended(&err);
    assert_eq!(
        decisions(&mut rx),
        vec![
            (
                "write_file".into(),
                "ask write_file(out/*)".into(),
                "ask".into()
            ),
            ("write_file".into(), "default allow".into(), "allow".into()),
        ]
    );
    let pending = a.pending(&ctx).await?.ok_or("nothing pending")?;
    assert_eq!(pending.calls.len(), 1);
    let s = &pending.calls[0].suspension;
    assert_eq!(
        (s.layer.as_str(), s.data["argument"].as_str()),
        ("permissions", Some("out/a.txt"))
    );
    let id = s.id.clone();

    let (sink, mut rx) = EventSink::channel();
    let deny = Resolution::new(
        &id,
        serde_json::json!({"approve": false, "reason": "not now"}),
    );
    let out = a
        .resume(vec![deny.clone()], &ctx, &sink, &CancellationToken::new())
        .await?;
    assert_eq!(out.reply.text_content(), "fine");
    assert_eq!(
        decisions(&mut rx),
        vec![("write_file".into(), "human".into(), "deny".into())]
    );
    let state = a.state(&ctx).await?.ok_or("no state")?;
    let results: Vec<_> = state.messages[2].tool_results_iter().collect();
    assert!(results[0].is_error && results[0].content.contains("denied by the user: not now"));
    assert!(!results[1].is_error, "{}", results[1].content);
    assert!(!dir.path().join("ws/out/a.txt").exists());
    assert!(dir.path().join("ws/b.txt").exists());

    // The same decision again: nothing is pending, nothing changes.
    let again = a
        .resume(
            vec![deny],
            &ctx,
            &EventSink::none(),
            &CancellationToken::new(),
        )
        .await;
    assert!(
        matches!(
            again,
            Err(hame_harness::Error::Call(hame_core::Error::NothingPending))
        ),
        "{again:?}"
    );
    Ok(())
}

#[tokio::test]
async fn accept_edits_asks_for_the_shell_and_read_only_denies_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let shell = || call("e1", "execute", serde_json::json!({"command": "echo hi"}));
    let a = agent(
        dir.path(),
        vec![Reply::tools(&[shell()])],
        Mode::AcceptEdits,
    )?;
    let err = a
        .call(Message::user("run"), &RuntimeContext::new("s1"))
        .await
        .err();
    assert_suspended(&err);

    let dir = tempfile::tempdir()?;
    let a = agent(
        dir.path(),
        vec![Reply::tools(&[shell()]), Reply::text("ok")],
        Mode::ReadOnly,
    )?;
    let ctx = RuntimeContext::new("s2");
    a.call(Message::user("run"), &ctx).await?;
    let state = a.state(&ctx).await?.ok_or("no state")?;
    let r = state.messages[2]
        .tool_results_iter()
        .next()
        .ok_or("no result")?;
    assert!(
        r.is_error && r.content.contains("mode read-only"),
        "{}",
        r.content
    );
    Ok(())
}

/// The tool names a request offered.
fn offered(request: &hame_core::ModelRequest) -> Vec<String> {
    request.tools.iter().map(|t| t.name.clone()).collect()
}

/// `tools.json` is parsed once per text and its rules compiled once per pattern, but read at
/// every step: an edit between two calls of one agent applies to the second, and a file
/// with `${VAR}` follows the variable's current value.
#[tokio::test]
async fn an_edited_tools_json_applies_to_the_next_call_of_the_same_agent() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    let tools_json = ws.join("tools.json");
    let write = |id: &str, path: &str| {
        call(
            id,
            "write_file",
            serde_json::json!({"file_path": path, "content": "x"}),
        )
    };
    let model = Arc::new(ScriptedModel::new(vec![
        Reply::tools(&[write("c1", "a/x.txt")]),
        Reply::text("one"),
        Reply::tools(&[write("c2", "a/x.txt"), write("c3", "b/x.txt")]),
        Reply::text("two"),
        Reply::tools(&[write("c4", "c/x.txt")]),
        Reply::text("three"),
        Reply::tools(&[write("c5", "c/x.txt")]),
        Reply::text("four"),
    ]));
    let denied_dir = Arc::new(std::sync::Mutex::new("c".to_owned()));
    let env_dir = denied_dir.clone();
    let env = hame_harness::EnvLookup(Arc::new(move |k: &str| {
        (k == "DENIED_DIR").then(|| env_dir.lock().map(|d| d.clone()).unwrap_or_default())
    }));
    let a = HarnessAgent::builder()
        .model(model.clone())
        .workspace(ws.clone())
        .state_store(Arc::new(hame_state::JsonStore::open(
            dir.path().join("state"),
        )?))
        .memory(hame_harness::memory::MemoryOptions::disabled())
        .env(env)
        .build()?;
    let ctx = RuntimeContext::new("s1");
    let run = |text: &'static str| {
        let a = a.clone();
        let ctx = ctx.clone();
        async move {
            a.call_with(
                Message::user(text),
                &ctx,
                &EventSink::none(),
                &CancellationToken::new(),
            )
            .await
        }
    };

    std::fs::write(
        &tools_json,
        r#"{"deny": ["glob_files"], "permissions": {"deny": ["write_file(a/*)"]}}"#,
    )?;
    run("first").await?;
    assert!(!ws.join("a/x.txt").exists(), "a/* is denied");
    let requests = model.requests();
    assert!(!offered(&requests[0]).contains(&"glob_files".to_owned()));

    std::fs::write(
        &tools_json,
        r#"{"permissions": {"deny": ["write_file(b/*)"]}}"#,
    )?;
    run("second").await?;
    assert!(
        ws.join("a/x.txt").exists(),
        "the edit lifted the deny of a/*"
    );
    assert!(!ws.join("b/x.txt").exists(), "the edit denies b/*");
    let requests = model.requests();
    assert!(offered(&requests[2]).contains(&"glob_files".to_owned()));

    // The same text, with a variable: its value now, at each call.
    std::fs::write(
        &tools_json,
        r#"{"permissions": {"deny": ["write_file(${DENIED_DIR}/*)"]}}"#,
    )?;
    run("third").await?;
    assert!(!ws.join("c/x.txt").exists(), "DENIED_DIR=c");
    *denied_dir.lock().map_err(|e| e.to_string())? = "d".to_owned();
    run("fourth").await?;
    assert!(ws.join("c/x.txt").exists(), "DENIED_DIR=d now");
    Ok(())
}

/// A call that cannot run is answered so before any rule (issue #34's notes): in ask mode a
/// tool the agent does not have (a misspelt name, an MCP tool no server lists) and one
/// `tools.json` denies are not put to a human, and read-only mode does not call them
/// blocked mutations; a tool the agent has still asks.
#[tokio::test]
async fn a_call_that_cannot_run_is_refused_before_anyone_is_asked() -> TestResult {
    for mode in [Mode::Ask, Mode::ReadOnly] {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("ws"))?;
        std::fs::write(
            dir.path().join("ws/tools.json"),
            r#"{"deny": ["glob_files"]}"#,
        )?;
        let calls = [
            call("u1", "glob", serde_json::json!({"pattern": "**"})),
            call("u2", "glob_files", serde_json::json!({"pattern": "**"})),
            call("u3", "mcp__nowhere__fetch", serde_json::json!({})),
        ];
        let a = agent(
            dir.path(),
            vec![Reply::tools(&calls), Reply::text("done")],
            mode,
        )?;
        let (events, mut rx) = EventSink::channel();
        let ctx = RuntimeContext::new("s1");
        let out = a
            .call_with(
                Message::user("look"),
                &ctx,
                &events,
                &CancellationToken::new(),
            )
            .await?;
        assert_eq!(out.reply.text_content(), "done", "{mode:?}");
        assert!(a.pending(&ctx).await?.is_none(), "{mode:?}");
        assert_eq!(decisions(&mut rx), vec![], "{mode:?}: no rule was asked");
        let state = a.state(&ctx).await?.ok_or("no state")?;
        let results: Vec<(String, Option<String>, String)> = state.messages[2]
            .tool_results_iter()
            .map(|r| (r.id.clone(), r.code.clone(), r.content.clone()))
            .collect();
        assert_eq!(results.len(), 3, "{results:?}");
        let content = |id: &str| {
            results
                .iter()
                .find(|r| r.0 == id)
                .map(|r| r.2.clone())
                .unwrap_or_default()
        };
        let codes: Vec<Option<&str>> = results.iter().map(|r| r.1.as_deref()).collect();
        assert_eq!(
            codes,
            vec![
                Some("unknown_tool"),
                Some("permission_denied"),
                Some("unknown_tool")
            ],
            "{mode:?}"
        );
        // The names it lists are those the caller may run: not the denied `glob_files`.
        assert!(
            content("u1").contains("no tool named `glob`; available tools:")
                && content("u1").contains("read_file")
                && !content("u1").contains("glob_files"),
            "{mode:?}: {}",
            content("u1")
        );
        assert!(
            content("u2").contains("`glob_files` is not allowed by tools.json"),
            "{mode:?}: {}",
            content("u2")
        );
        assert!(
            content("u3").contains("no tool named `mcp__nowhere__fetch`"),
            "{mode:?}: {}",
            content("u3")
        );
    }
    // A tool the agent has still asks in ask mode.
    let dir = tempfile::tempdir()?;
    let a = agent(
        dir.path(),
        vec![Reply::tools(&[call(
            "w1",
            "write_file",
            serde_json::json!({"file_path": "a.txt", "content": "x"}),
        )])],
        Mode::Ask,
    )?;
    let err = a
        .call(Message::user("write"), &RuntimeContext::new("s2"))
        .await
        .err();
    assert_suspended(&err);
    Ok(())
}
