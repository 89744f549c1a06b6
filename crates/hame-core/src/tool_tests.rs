use super::*;
use crate::context::RuntimeContext;
use pretty_assertions::assert_eq;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug, Deserialize, JsonSchema)]
struct EchoArgs {
    /// Text to echo.
    text: String,
}

#[derive(Debug)]
struct Echo;

#[async_trait]
impl TypedTool for Echo {
    type Args = EchoArgs;
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> String {
        "Echoes text".into()
    }
    async fn run(&self, args: EchoArgs, _ctx: &ToolContext) -> ToolOutput {
        Ok(args.text)
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
struct NoArgs {}

#[derive(Debug)]
struct Panics;

#[async_trait]
impl TypedTool for Panics {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "panics"
    }
    fn description(&self) -> String {
        "Always panics".into()
    }
    #[allow(clippy::panic)]
    async fn run(&self, _args: NoArgs, _ctx: &ToolContext) -> ToolOutput {
        panic!("boom")
    }
}

#[derive(Debug)]
struct Sleeps(Arc<AtomicUsize>);

/// Waits until three calls are inside it at once: only a concurrent runner lets it finish.
#[derive(Debug)]
struct Rendezvous(Arc<tokio::sync::Barrier>);

#[async_trait]
impl TypedTool for Rendezvous {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "rendezvous"
    }
    fn description(&self) -> String {
        "Waits for two peers".into()
    }
    async fn run(&self, _args: NoArgs, _ctx: &ToolContext) -> ToolOutput {
        self.0.wait().await;
        Ok("met".into())
    }
}

#[async_trait]
impl TypedTool for Sleeps {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "sleeps"
    }
    fn description(&self) -> String {
        "Sleeps 200 ms".into()
    }
    async fn run(&self, _args: NoArgs, _ctx: &ToolContext) -> ToolOutput {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok("slept".into())
    }
}

fn ctx() -> ToolContext {
    ToolContext::new(RuntimeContext::new("s"), "c")
}

fn call(name: &str, args: &str) -> ToolCall {
    ToolCall {
        id: "c".into(),
        name: name.into(),
        arguments: args.into(),
    }
}

fn set() -> ToolSet {
    let mut s = ToolSet::new();
    s.register(typed(Echo));
    s.register(typed(Panics));
    s.register(typed(Sleeps(Arc::new(AtomicUsize::new(0)))));
    s
}

#[test]
fn schema_is_derived() {
    let spec = typed(Echo).spec();
    assert_eq!(spec.name, "echo");
    assert_eq!(spec.parameters["type"], "object");
    assert_eq!(spec.parameters["properties"]["text"]["type"], "string");
    assert_eq!(spec.parameters["required"], serde_json::json!(["text"]));
    assert!(spec.parameters.get("$schema").is_none());
}

#[tokio::test]
async fn errors_become_values() {
    let s = set();
    let t = Duration::from_secs(5);
    assert_eq!(
        s.run_one(&call("echo", r#"{"text":"hi"}"#), &ctx(), t)
            .await,
        Ok("hi".into())
    );
    let unknown = s.run_one(&call("nope", "{}"), &ctx(), t).await;
    assert_eq!(
        unknown.map_err(|e| e.code),
        Err(codes::UNKNOWN_TOOL.to_owned())
    );
    let bad = s.run_one(&call("echo", "{not json"), &ctx(), t).await;
    assert_eq!(
        bad.map_err(|e| e.code),
        Err(codes::INVALID_ARGUMENTS.to_owned())
    );
    let wrong = s.run_one(&call("echo", r#"{"txt":1}"#), &ctx(), t).await;
    assert_eq!(
        wrong.map_err(|e| e.code),
        Err(codes::INVALID_ARGUMENTS.to_owned())
    );
    let array = s.run_one(&call("echo", "[1]"), &ctx(), t).await;
    assert_eq!(
        array.map_err(|e| e.code),
        Err(codes::INVALID_ARGUMENTS.to_owned())
    );
    let panicked = s.run_one(&call("panics", "{}"), &ctx(), t).await;
    assert_eq!(
        panicked.map_err(|e| e.code),
        Err(codes::TOOL_PANICKED.to_owned())
    );
    let slow = s
        .run_one(&call("sleeps", "{}"), &ctx(), Duration::from_millis(20))
        .await;
    assert_eq!(slow.map_err(|e| e.code), Err(codes::TIMEOUT.to_owned()));
}

#[test]
fn allow_and_deny_filter() {
    let mut s = set();
    s.set_allow(Some(vec!["echo".into(), "sleeps".into()]));
    s.set_deny(vec!["sleeps".into()]);
    assert_eq!(s.names(), vec!["echo".to_owned()]);
    assert!(s.get("panics").is_none());
    assert_eq!(s.specs().len(), 1);
}

#[tokio::test]
async fn a_deferred_tool_is_callable_but_not_offered() {
    let mut s = set();
    s.set_deferred(["echo".to_owned(), "not_registered".to_owned()]);
    let offered: Vec<String> = s.specs().into_iter().map(|t| t.name).collect();
    assert!(!offered.contains(&"echo".to_owned()), "{offered:?}");
    assert_eq!(
        s.deferred_specs()
            .into_iter()
            .map(|t| t.name)
            .collect::<Vec<_>>(),
        vec!["echo".to_owned()]
    );
    assert!(s.is_deferred("echo") && !s.is_deferred("not_registered"));
    assert!(s.names().contains(&"echo".to_owned()), "still listed");
    let out = s
        .run_one(
            &call("echo", r#"{"text":"hi"}"#),
            &ctx(),
            Duration::from_secs(5),
        )
        .await;
    assert!(out.is_ok(), "{out:?}");
    // Allow/deny still win over deferral.
    s.set_deny(vec!["echo".into()]);
    assert!(s.deferred_specs().is_empty() && s.spec("echo").is_none());
    s.set_deny(Vec::new());
    s.undefer("echo");
    assert!(s.specs().iter().any(|t| t.name == "echo"));
}

#[tokio::test]
async fn runs_concurrently_in_order() {
    let mut s = ToolSet::new();
    s.register(typed(Rendezvous(Arc::new(tokio::sync::Barrier::new(3)))));
    s.register(typed(Echo));
    let calls = [
        call("rendezvous", "{}"),
        call("echo", r#"{"text":"z"}"#),
        call("rendezvous", "{}"),
        call("rendezvous", "{}"),
    ];
    let out = s
        .run_many(calls.iter().map(|c| (c, ctx())), &ToolRunOptions::default())
        .await;
    assert_eq!(
        out,
        vec![
            Ok("met".into()),
            Ok("z".into()),
            Ok("met".into()),
            Ok("met".into())
        ]
    );
}

#[test]
fn nested_enums_are_inlined_and_collapsed() {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[serde(rename_all = "snake_case")]
    #[allow(dead_code)]
    /// A status.
    enum Status {
        /// Not yet.
        Pending,
        /// Done.
        Done,
    }
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        /// What.
        content: String,
        /// Its status.
        status: Status,
        /// Urgent.
        #[serde(default)]
        urgent: bool,
    }
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Args {
        /// The items.
        items: Vec<Item>,
    }
    let v = crate::tool::schema_for::<Args>();
    assert_eq!(
        v,
        serde_json::json!({
            "type": "object",
            "properties": {"items": {
                "description": "The items.",
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "content": {"description": "What.", "type": "string"},
                        "status": {"description": "Its status.", "type": "string", "enum": ["pending", "done"]},
                        "urgent": {"description": "Urgent.", "type": "boolean"}
                    },
                    "required": ["content", "status"]
                }
            }},
            "required": ["items"]
        }),
        "{v:#}"
    );
}

#[test]
fn compact_schema_strips_noise_but_never_a_property() {
    let mut v = serde_json::json!({
        "type": "object",
        "properties": {
            "format": {"type": "string", "description": "Output\n    format."},
            "default": {"type": ["integer", "null"], "format": "uint64", "minimum": 0, "default": null},
            "items": {"type": "array", "items": {"type": "integer", "format": "int32", "minimum": 1}},
            "kind": {"anyOf": [{"type": "string", "format": "x"}, {"type": "null"}]}
        },
        "required": ["format"]
    });
    compact_schema(&mut v);
    assert_eq!(
        v,
        serde_json::json!({
            "type": "object",
            "properties": {
                "format": {"type": "string", "description": "Output format."},
                "default": {"type": "integer"},
                "items": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                "kind": {"anyOf": [{"type": "string"}, {"type": "null"}]}
            },
            "required": ["format"]
        })
    );
}
