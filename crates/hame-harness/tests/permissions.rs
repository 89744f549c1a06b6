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
    assert!(
        matches!(
            &err,
            Some(hame_harness::Error::Call(hame_core::Error::Suspended(_)))
        ),
        "{err:?}"
    );
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
    assert!(
        matches!(
            &err,
            Some(hame_harness::Error::Call(hame_core::Error::Suspended(_)))
        ),
        "{err:?}"
    );

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
