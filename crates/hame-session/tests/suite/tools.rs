//! The model-facing tools: their schemas and the text they show (insta snapshots).

use std::sync::Arc;

use hame_core::{Extensions, Message, RuntimeContext, Tool, ToolContext, ToolError};
use hame_fs::{Filesystem, InMemoryFs};
use hame_session::{SessionToolOptions, session_tools};
use hame_tools::{Identity, Workspace, WorkspaceMode};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::helpers::{TestResult, exchange, log_at};

fn ctx(session: &str) -> ToolContext {
    ToolContext::new(RuntimeContext::new(session), "tc-1")
}

/// The caller's workspace handle with `fs` as its records.
fn workspace(fs: Arc<dyn Filesystem>, user: Option<&str>, session: &str) -> Extensions {
    let mut ext = Extensions::new();
    ext.insert(Workspace::new(
        Identity::new("main", user, session),
        WorkspaceMode::SharedStore,
        fs.clone(),
        fs,
    ));
    ext
}

/// A session tool whose calls carry a workspace handle over `fs`, as in the harness.
#[derive(Debug)]
struct Bound(Arc<dyn Tool>, Arc<dyn Filesystem>);

#[async_trait::async_trait]
impl Tool for Bound {
    fn spec(&self) -> hame_core::ToolSpec {
        self.0.spec()
    }
    async fn call(&self, args: serde_json::Value, ctx: &ToolContext) -> hame_core::ToolOutput {
        let ext = workspace(
            self.1.clone(),
            ctx.runtime.user_id.as_deref(),
            &ctx.runtime.session_id,
        );
        self.0.call(args, &ctx.clone().with_extensions(ext)).await
    }
}

fn tools(fs: Arc<dyn Filesystem>) -> (Arc<dyn Tool>, Arc<dyn Tool>) {
    let mut tools = session_tools("main", SessionToolOptions::default())
        .unwrap()
        .into_iter()
        .map(|t| Arc::new(Bound(t, fs.clone())) as Arc<dyn Tool>);
    (tools.next().unwrap(), tools.next().unwrap())
}

/// Three sessions: `old` (6 records with a tool call), `mid`, `new` (current).
async fn seeded() -> Result<Arc<dyn Filesystem>, Box<dyn std::error::Error + Send + Sync>> {
    let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    log_at(fs.clone(), 0)
        .append_messages(
            "old",
            "call-1",
            &exchange(
                "What is in notes.md?",
                r#"{"path":"notes.md"}"#,
                "# Notes\n- buy milk",
            ),
        )
        .await?;
    log_at(fs.clone(), 60)
        .append_messages(
            "old",
            "call-2",
            &[
                Message::user("Thanks!"),
                Message::assistant("You're welcome."),
            ],
        )
        .await?;
    log_at(fs.clone(), 120)
        .append_messages("mid", "call-3", &[Message::user("Plan the release")])
        .await?;
    log_at(fs.clone(), 180)
        .append_messages("new", "call-4", &[Message::user("Where were we?")])
        .await?;
    Ok(fs)
}

#[test]
fn tool_specs() {
    let (list, history) = tools(Arc::new(InMemoryFs::new()));
    insta::assert_json_snapshot!("session_list_spec", list.spec());
    insta::assert_json_snapshot!("session_history_spec", history.spec());
}

#[tokio::test]
async fn list_newest_first_marks_the_current_session() -> TestResult {
    let (list, _) = tools(seeded().await?);
    insta::assert_snapshot!("list_all", list.call(json!({}), &ctx("new")).await?);
    insta::assert_snapshot!(
        "list_capped",
        list.call(json!({"limit": 2}), &ctx("new")).await?
    );
    Ok(())
}

#[tokio::test]
async fn list_without_sessions() -> TestResult {
    let (list, _) = tools(Arc::new(InMemoryFs::new()));
    assert_eq!(
        list.call(json!({}), &ctx("s1")).await?,
        "No sessions have been recorded yet."
    );
    Ok(())
}

#[tokio::test]
async fn history_pages_through_a_session() -> TestResult {
    let (_, history) = tools(seeded().await?);
    let first = history
        .call(json!({"session_id": "old", "limit": 4}), &ctx("new"))
        .await?;
    insta::assert_snapshot!("history_page_1", first);
    let second = history
        .call(
            json!({"session_id": "old", "from_seq": 4, "limit": 4}),
            &ctx("new"),
        )
        .await?;
    insta::assert_snapshot!("history_page_2", second);
    let past_end = history
        .call(json!({"session_id": "old", "from_seq": 10}), &ctx("new"))
        .await?;
    insta::assert_snapshot!("history_past_end", past_end);
    Ok(())
}

#[tokio::test]
async fn history_defaults_to_the_current_session() -> TestResult {
    let (_, history) = tools(seeded().await?);
    insta::assert_snapshot!(
        "history_current",
        history.call(json!({}), &ctx("new")).await?
    );
    assert_eq!(
        history.call(json!({}), &ctx("fresh")).await?,
        "Session fresh (the current session) has no recorded messages yet."
    );
    Ok(())
}

#[tokio::test]
async fn history_cuts_long_records_and_says_how_to_see_more() -> TestResult {
    let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    let long = (0..400)
        .map(|i| format!("line {i:03}\n"))
        .collect::<String>();
    log_at(fs.clone(), 0)
        .append_messages(
            "s1",
            "call-1",
            &[Message::user("dump it"), Message::assistant(&long)],
        )
        .await?;
    let (_, history) = tools(fs);
    let out = history.call(json!({"max_chars": 150}), &ctx("s1")).await?;
    insta::assert_snapshot!("history_cut", out);
    let wide = history
        .call(
            json!({"from_seq": 1, "limit": 1, "max_chars": 20000}),
            &ctx("s1"),
        )
        .await?;
    assert!(wide.contains("line 399"), "{wide}");
    assert!(!wide.contains("record cut"), "{wide}");
    Ok(())
}

#[tokio::test]
async fn history_refuses_hostile_and_unknown_sessions() -> TestResult {
    let (_, history) = tools(seeded().await?);
    for bad in ["../other", "a/b", "..", ".index", "x".repeat(200).as_str()] {
        let err = history
            .call(json!({"session_id": bad}), &ctx("new"))
            .await
            .unwrap_err();
        assert_eq!(err.code, "invalid_session_id", "{bad:?}: {err}");
    }
    let err = history
        .call(json!({"session_id": "missing"}), &ctx("new"))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ToolError::new(
            "session_not_found",
            "there is no session \"missing\"; call session_list to see the sessions"
        )
    );
    let err = history
        .call(json!({"session_id": 5}), &ctx("new"))
        .await
        .unwrap_err();
    assert_eq!(err.code, "invalid_arguments");
    Ok(())
}

#[tokio::test]
async fn one_tool_instance_serves_many_tenants() -> TestResult {
    let alice: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    let bob: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    log_at(alice.clone(), 0)
        .append_messages("a1", "c", &[Message::user("alice's secret")])
        .await?;
    log_at(bob.clone(), 0)
        .append_messages("b1", "c", &[Message::user("bob's question")])
        .await?;
    let mut tools = session_tools("main", SessionToolOptions::default())?;
    let history = tools.pop().unwrap();
    let list = tools.pop().unwrap();
    // Each call carries its own tenant's handle; the tool instances are shared.
    let as_user = |user: &str| {
        let fs = if user == "alice" {
            alice.clone()
        } else {
            bob.clone()
        };
        let mut c = ctx("s").with_extensions(workspace(fs, Some(user), "s"));
        c.runtime = c.runtime.with_user(user);
        c
    };
    let out = list.call(json!({}), &as_user("alice")).await?;
    assert!(out.contains("a1") && !out.contains("b1"), "{out}");
    let err = history
        .call(json!({"session_id": "a1"}), &as_user("bob"))
        .await
        .unwrap_err();
    assert_eq!(err.code, "session_not_found");
    // A call without a tenant's handle reaches no tenant's logs.
    let err = list.call(json!({}), &ctx("s")).await.unwrap_err();
    assert_eq!(err.code, "tool_failed");
    assert!(err.message.contains("workspace"), "{}", err.message);
    Ok(())
}
