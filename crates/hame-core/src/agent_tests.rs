use super::*;
use crate::message::Role;
use crate::test_support::{Reply, ScriptedModel};
use crate::tool::{TypedTool, typed};
use async_trait::async_trait;
use pretty_assertions::assert_eq;
use schemars::JsonSchema;
use serde::Deserialize;
use std::sync::Mutex;

#[derive(Debug, Deserialize, JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

#[derive(Debug)]
struct Add;

#[async_trait]
impl TypedTool for Add {
    type Args = AddArgs;
    fn name(&self) -> &str {
        "add"
    }
    fn description(&self) -> String {
        "Adds two integers".into()
    }
    async fn run(&self, args: AddArgs, _ctx: &ToolContext) -> crate::tool::ToolOutput {
        Ok((args.a + args.b).to_string())
    }
}

fn call(id: &str, name: &str, args: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.into(),
    }
}

fn agent(model: &ScriptedModel) -> AgentLoop {
    let mut tools = ToolSet::new();
    tools.register(typed(Add));
    AgentLoop::new(Arc::new(model.clone())).with_tools(tools)
}

async fn run(agent: &AgentLoop, state: &mut AgentState, text: &str) -> Result<CallOutput> {
    agent
        .run(
            state,
            Message::user(text),
            &RuntimeContext::new("s"),
            &EventSink::none(),
            &CancellationToken::new(),
        )
        .await
}

fn results(msg: &Message) -> Vec<(String, bool, Option<String>)> {
    msg.tool_results_iter()
        .map(|r| (r.content.clone(), r.is_error, r.code.clone()))
        .collect()
}

#[tokio::test]
async fn tool_loop_with_parallel_calls_and_errors() -> Result<()> {
    let model = ScriptedModel::new([
        Reply::tools(&[
            call("1", "add", r#"{"a":1,"b":2}"#),
            call("2", "add", r#"{"a":10,"b":20}"#),
            call("3", "nope", "{}"),
            call("4", "add", r#"{"a":1,"b":"#),
        ]),
        Reply::text("done"),
    ]);
    let agent = agent(&model);
    let mut state = AgentState::default();
    let out = run(&agent, &mut state, "add things").await?;
    assert_eq!(out.reply.text_content(), "done");
    assert_eq!(out.iterations, 2);
    assert_eq!(state.messages.len(), 4);
    assert_eq!(state.messages[2].role, Role::Tool);
    let r = results(&state.messages[2]);
    assert_eq!(r[0], ("3".to_owned(), false, None));
    assert_eq!(r[1], ("30".to_owned(), false, None));
    assert_eq!(r[2].2.as_deref(), Some(codes::UNKNOWN_TOOL));
    assert_eq!(r[3].2.as_deref(), Some(codes::INVALID_ARGUMENTS));
    // The second request carried the results back to the model.
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].messages.len(), 3);
    assert_eq!(reqs[0].tools.len(), 1);
    Ok(())
}

#[tokio::test]
async fn stops_at_max_iterations() {
    let model = ScriptedModel::new(
        (0..5).map(|i| Reply::tools(&[call(&i.to_string(), "add", r#"{"a":1,"b":1}"#)])),
    );
    let agent = agent(&model).with_config(LoopConfig {
        max_iterations: 3,
        ..LoopConfig::default()
    });
    let mut state = AgentState::default();
    let err = run(&agent, &mut state, "loop").await;
    assert!(matches!(err, Err(Error::MaxIterations { limit: 3 })));
    // Every call still has its result: the state stays valid for the next call.
    let calls: usize = state.messages.iter().map(|m| m.tool_calls().count()).sum();
    let res: usize = state
        .messages
        .iter()
        .map(|m| m.tool_results_iter().count())
        .sum();
    assert_eq!((calls, res), (3, 3));
}

#[tokio::test]
async fn cancelled_before_start() {
    let model = ScriptedModel::new([Reply::text("never")]);
    let agent = agent(&model);
    let cancel = CancellationToken::new();
    cancel.cancel();
    let mut state = AgentState::default();
    let r = agent
        .run(
            &mut state,
            Message::user("x"),
            &RuntimeContext::new("s"),
            &EventSink::none(),
            &cancel,
        )
        .await;
    assert!(matches!(r, Err(Error::Cancelled)));
    assert!(model.requests().is_empty());
}

#[derive(Debug)]
struct Recorder {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    deny: Option<&'static str>,
}

impl Recorder {
    fn note(&self, what: &str) {
        if let Ok(mut l) = self.log.lock() {
            l.push(format!("{}:{what}", self.name));
        }
    }
}

#[async_trait]
impl Middleware for Recorder {
    fn name(&self) -> &str {
        self.name
    }
    async fn on_call_start(&self, _cx: &mut CallCtx<'_>, _input: &mut Message) -> Result<()> {
        self.note("start");
        Ok(())
    }
    async fn on_model_request(&self, _cx: &mut CallCtx<'_>, req: &mut ModelRequest) -> Result<()> {
        req.system.push_str(self.name);
        self.note("request");
        Ok(())
    }
    async fn on_tool_call(
        &self,
        _cx: &mut CallCtx<'_>,
        call: &mut ToolCall,
    ) -> Result<ToolDecision> {
        self.note("tool");
        if self.deny == Some(call.name.as_str()) {
            return Ok(ToolDecision::Deny("not allowed here".into()));
        }
        if call.name == "add" {
            call.arguments = r#"{"a":100,"b":1}"#.into();
        }
        Ok(ToolDecision::Allow)
    }
    async fn on_call_end(
        &self,
        _cx: &mut CallCtx<'_>,
        outcome: std::result::Result<&Message, &Error>,
    ) -> Result<()> {
        self.note(if outcome.is_ok() { "end-ok" } else { "end-err" });
        Ok(())
    }
}

#[tokio::test]
async fn middleware_order_rewrite_and_deny() -> Result<()> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let model = ScriptedModel::new([
        Reply::tools(&[
            call("1", "add", r#"{"a":1,"b":1}"#),
            call("2", "add2", "{}"),
        ]),
        Reply::text("ok"),
    ]);
    let a = agent(&model)
        .with_middleware(Arc::new(Recorder {
            name: "A",
            log: log.clone(),
            deny: Some("add2"),
        }))
        .with_middleware(Arc::new(Recorder {
            name: "B",
            log: log.clone(),
            deny: None,
        }));
    let mut state = AgentState::default();
    run(&a, &mut state, "go").await?;
    let r = results(&state.messages[2]);
    assert_eq!(r[0], ("101".to_owned(), false, None));
    assert_eq!(r[1].2.as_deref(), Some(codes::DENIED));
    assert_eq!(model.requests()[0].system, "AB");
    let log = log.lock().map(|l| l.clone()).unwrap_or_default();
    assert_eq!(
        log,
        vec![
            "A:start",
            "B:start",
            "A:request",
            "B:request",
            "A:tool",
            "B:tool",
            "A:tool",
            "A:request",
            "B:request",
            "A:end-ok",
            "B:end-ok"
        ]
    );
    Ok(())
}

#[derive(Debug)]
struct DropOldest;

#[async_trait]
impl Middleware for DropOldest {
    fn name(&self) -> &str {
        "drop-oldest"
    }
    async fn on_model_error(
        &self,
        cx: &mut CallCtx<'_>,
        error: &ModelError,
    ) -> Result<ErrorAction> {
        if error.is_context_overflow() && cx.state.messages.len() > 1 {
            cx.state.messages.remove(0);
            return Ok(ErrorAction::Retry);
        }
        Ok(ErrorAction::Propagate)
    }
}

#[tokio::test]
async fn middleware_recovers_from_overflow_with_bound() -> Result<()> {
    let overflow = || {
        Reply::Fail(ModelError::ContextOverflow {
            message: "too long".into(),
        })
    };
    let model = ScriptedModel::new([overflow(), Reply::text("fits now")]);
    let a = agent(&model).with_middleware(Arc::new(DropOldest));
    let mut state = AgentState::default();
    state.messages.push(Message::user("old"));
    state.messages.push(Message::assistant("old answer"));
    let out = run(&a, &mut state, "new").await?;
    assert_eq!(out.reply.text_content(), "fits now");
    assert_eq!(model.requests()[1].messages.len(), 2);

    // A model that always overflows: bounded retries, then the error surfaces.
    let model = ScriptedModel::new((0..10).map(|_| overflow()));
    let a = agent(&model).with_middleware(Arc::new(DropOldest));
    let mut state = AgentState::default();
    for i in 0..10 {
        state.messages.push(Message::user(format!("m{i}")));
    }
    let r = run(&a, &mut state, "new").await;
    assert!(matches!(
        r,
        Err(Error::Model(ModelError::ContextOverflow { .. }))
    ));
    assert_eq!(model.requests().len(), DEFAULT_MAX_MODEL_RETRIES + 1);
    Ok(())
}

#[tokio::test]
async fn events_are_emitted_in_order() -> Result<()> {
    let model = ScriptedModel::new([
        Reply::tools(&[call("1", "add", r#"{"a":2,"b":2}"#)]),
        Reply::text("four"),
    ]);
    let a = agent(&model);
    let (sink, mut rx) = EventSink::channel();
    let mut state = AgentState::default();
    a.run(
        &mut state,
        Message::user("2+2"),
        &RuntimeContext::new("s"),
        &sink,
        &CancellationToken::new(),
    )
    .await?;
    drop(sink);
    let mut kinds = Vec::new();
    while let Some(ev) = rx.recv().await {
        kinds.push(match ev {
            AgentEvent::StepStarted { .. } => "step",
            AgentEvent::TextDelta { .. } => "text",
            AgentEvent::ToolStarted { .. } => "tool-start",
            AgentEvent::ToolFinished {
                is_error: false, ..
            } => "tool-end",
            AgentEvent::Usage { .. } => "usage",
            AgentEvent::Finished { .. } => "finished",
            _ => "other",
        });
    }
    assert_eq!(
        kinds,
        vec![
            "step",
            "tool-start",
            "tool-end",
            "step",
            "text",
            "usage",
            "finished"
        ]
    );
    Ok(())
}

#[derive(Debug, Default)]
struct AppendLog(Mutex<Vec<Message>>);

#[async_trait]
impl Middleware for AppendLog {
    fn name(&self) -> &str {
        "append-log"
    }
    async fn on_message_appended(&self, _cx: &mut CallCtx<'_>, message: &Message) -> Result<()> {
        if let Ok(mut l) = self.0.lock() {
            l.push(message.clone());
        }
        Ok(())
    }
}

#[tokio::test]
async fn every_appended_message_is_reported_in_order() -> Result<()> {
    let model = ScriptedModel::new([
        Reply::tools(&[call("1", "add", r#"{"a":2,"b":3}"#)]),
        Reply::text("five"),
    ]);
    let log = Arc::new(AppendLog::default());
    let a = agent(&model).with_middleware(log.clone());
    let mut state = AgentState::default();
    run(&a, &mut state, "2+3").await?;
    let seen = log.0.lock().map(|l| l.clone()).unwrap_or_default();
    assert_eq!(seen, state.messages);
    assert_eq!(seen.len(), 4);
    Ok(())
}
