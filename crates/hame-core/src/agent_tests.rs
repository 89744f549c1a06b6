use super::*;
use crate::layer::{CallInput, CallNext};
use crate::message::Role;
use crate::suspend::Suspension;
use crate::test_support::{Reply, ScriptedModel};
use crate::tool::{TypedTool, codes, typed};
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

/// A model that asks for `c` once, then answers `text`.
fn one_call(c: ToolCall, text: &str) -> ScriptedModel {
    ScriptedModel::new([Reply::tools(&[c]), Reply::text(text)])
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
impl Layer for Recorder {
    fn name(&self) -> &str {
        self.name
    }
    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> Result<CallOutput> {
        self.note("start");
        let out = next.run(cx, input).await;
        self.note(if out.is_ok() { "end-ok" } else { "end-err" });
        out
    }
    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        mut req: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse> {
        req.system.push_str(self.name);
        self.note("request");
        let out = next.run(cx, req).await;
        self.note("response");
        out
    }
    async fn tool(&self, cx: &ToolCtx<'_>, mut call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        self.note("tool");
        if self.deny == Some(call.name.as_str()) {
            return ToolOutcome::Done(Err(crate::tool::ToolError::new(
                codes::DENIED,
                "not allowed here",
            )));
        }
        if call.name == "add" {
            call.arguments = r#"{"a":100,"b":1}"#.into();
        }
        next.run(cx, call).await
    }
}

#[tokio::test]
async fn layer_order_rewrite_and_short_circuit() -> Result<()> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let model = ScriptedModel::new([
        Reply::tools(&[
            call("1", "add", r#"{"a":1,"b":1}"#),
            call("2", "add2", "{}"),
        ]),
        Reply::text("ok"),
    ]);
    let a = agent(&model)
        .with_config(LoopConfig {
            tools: ToolRunOptions {
                max_concurrency: 1,
                ..ToolRunOptions::default()
            },
            ..LoopConfig::default()
        })
        .with_layer(Arc::new(Recorder {
            name: "A",
            log: log.clone(),
            deny: Some("add2"),
        }))
        .with_layer(Arc::new(Recorder {
            name: "B",
            log: log.clone(),
            deny: None,
        }));
    let mut state = AgentState::default();
    run(&a, &mut state, "go").await?;
    let r = results(&state.messages[2]);
    assert_eq!(r[0], ("101".to_owned(), false, None));
    assert_eq!(r[1].2.as_deref(), Some(codes::DENIED));
    // A is outside B: it edits the request first, B sees A's edit.
    assert_eq!(model.requests()[0].system, "AB");
    let log = log.lock().map(|l| l.clone()).unwrap_or_default();
    assert_eq!(
        log,
        vec![
            "A:start",
            "B:start",
            "A:request",
            "B:request",
            "B:response",
            "A:response",
            "A:tool",
            "B:tool",
            "A:tool",
            "A:request",
            "B:request",
            "B:response",
            "A:response",
            "B:end-ok",
            "A:end-ok"
        ]
    );
    Ok(())
}

/// Drops the oldest message and retries on a context overflow, at most
/// [`DEFAULT_MAX_MODEL_RETRIES`] times: the retry is a loop around `next`.
#[derive(Debug)]
struct DropOldest;

#[async_trait]
impl Layer for DropOldest {
    fn name(&self) -> &str {
        "drop-oldest"
    }
    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        mut req: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse> {
        let mut retries = 0;
        loop {
            match next.run(cx, req.clone()).await {
                Err(Error::Model(e))
                    if e.is_context_overflow()
                        && cx.state.messages.len() > 1
                        && retries < DEFAULT_MAX_MODEL_RETRIES =>
                {
                    cx.state.messages.remove(0);
                    req.messages = cx.state.messages.clone();
                    retries += 1;
                }
                other => return other,
            }
        }
    }
}

#[tokio::test]
async fn a_layer_recovers_from_overflow_with_bound() -> Result<()> {
    let overflow = || {
        Reply::Fail(ModelError::ContextOverflow {
            message: "too long".into(),
        })
    };
    let model = ScriptedModel::new([overflow(), Reply::text("fits now")]);
    let a = agent(&model).with_layer(Arc::new(DropOldest));
    let mut state = AgentState::default();
    state.messages.push(Message::user("old"));
    state.messages.push(Message::assistant("old answer"));
    let out = run(&a, &mut state, "new").await?;
    assert_eq!(out.reply.text_content(), "fits now");
    assert_eq!(model.requests()[1].messages.len(), 2);

    // A model that always overflows: bounded retries, then the error surfaces.
    let model = ScriptedModel::new((0..10).map(|_| overflow()));
    let a = agent(&model).with_layer(Arc::new(DropOldest));
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
    // The failed turn is closed: it ends with a note, so the next call does not replay it
    // as an unanswered question.
    let last = state.messages.last().map(|m| (m.role, m.text_content()));
    assert!(
        matches!(&last, Some((Role::Assistant, t)) if t.starts_with("[This request did not finish")),
        "{last:?}"
    );
    Ok(())
}

/// Suspends every `add` call until it is approved; `{"approve": false}` denies it.
#[derive(Debug)]
struct Approvals;

#[async_trait]
impl Layer for Approvals {
    fn name(&self) -> &str {
        "approvals"
    }
    async fn tool(&self, cx: &ToolCtx<'_>, call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        if call.name != "add" {
            return next.run(cx, call).await;
        }
        match cx.resumed_for(self.name()) {
            None => ToolOutcome::Suspend(
                Suspension::new(self.name(), "adding needs approval")
                    .with_data(serde_json::json!({"rule": "add"})),
            ),
            Some(r) if r.resolution.value["approve"] == true => next.run(cx, call).await,
            Some(_) => ToolOutcome::Done(Err(crate::tool::ToolError::new(
                codes::DENIED,
                "denied by the user",
            ))),
        }
    }
}

fn parts() -> (RuntimeContext, EventSink, CancellationToken, Extensions) {
    (
        RuntimeContext::new("s"),
        EventSink::none(),
        CancellationToken::new(),
        Extensions::new(),
    )
}

fn env<'a>(
    runtime: &'a RuntimeContext,
    events: &'a EventSink,
    cancel: &'a CancellationToken,
    ext: &'a Extensions,
) -> CallEnv<'a> {
    CallEnv {
        runtime,
        events,
        cancel,
        extensions: ext,
    }
}

#[tokio::test]
async fn a_suspended_call_resumes_from_the_saved_state() -> Result<()> {
    let model = ScriptedModel::new([
        Reply::tools(&[
            call("1", "add", r#"{"a":1,"b":2}"#),
            call("2", "nope", "{}"),
        ]),
        Reply::text("three"),
    ]);
    let a = agent(&model).with_layer(Arc::new(Approvals));
    let mut state = AgentState::default();
    let r = run(&a, &mut state, "1+2").await;
    let Err(Error::Suspended(s)) = r else {
        panic!("expected a suspension, got {r:?}");
    };
    assert_eq!(s.calls.len(), 1);
    assert_eq!(s.calls[0].call.name, "add");
    assert_eq!(s.calls[0].suspension.layer, "approvals");
    let id = s.calls[0].suspension.id.clone();
    assert!(id.starts_with("ap-"), "{id}");

    // The state survives a process: serialise, read back, resume elsewhere.
    let bytes = serde_json::to_vec(&state).map_err(|e| Error::other(e.to_string()))?;
    let mut state = AgentState::from_slice(&bytes).map_err(|e| Error::other(e.to_string()))?;
    assert_eq!(state.schema_version, crate::STATE_SCHEMA_VERSION);
    // The unknown tool already has its result; the add waits.
    let pending = state
        .pending
        .clone()
        .ok_or_else(|| Error::other("no pending"))?;
    assert_eq!(
        pending.calls[1]
            .result
            .as_ref()
            .and_then(|r| r.code.clone()),
        Some(codes::UNKNOWN_TOOL.to_owned())
    );

    // A new message does not drop the pending call: the same suspension comes back.
    let again = run(&a, &mut state, "hello?").await;
    assert!(matches!(&again, Err(Error::Suspended(s2)) if s2.calls[0].suspension.id == id));
    assert_eq!(model.requests().len(), 1);

    // An unknown id is refused and changes nothing.
    let (rt, ev, cancel, ext) = parts();
    let bad = a
        .resume(
            &mut state,
            vec![Resolution::new(
                "ap-nope",
                serde_json::json!({"approve": true}),
            )],
            env(&rt, &ev, &cancel, &ext),
        )
        .await;
    assert!(matches!(bad, Err(Error::UnknownResolution(_))), "{bad:?}");
    assert!(state.pending.is_some());

    let out = a
        .resume(
            &mut state,
            vec![Resolution::new(&id, serde_json::json!({"approve": true}))],
            env(&rt, &ev, &cancel, &ext),
        )
        .await?;
    assert_eq!(out.reply.text_content(), "three");
    assert!(state.pending.is_none());
    let r = results(&state.messages[2]);
    assert_eq!(r[0], ("3".to_owned(), false, None));
    assert_eq!(r[1].2.as_deref(), Some(codes::UNKNOWN_TOOL));
    // user, assistant(calls), tool results, final answer: every call has its result.
    assert_eq!(state.messages.len(), 4);
    Ok(())
}

#[tokio::test]
async fn a_denied_resume_gives_the_model_the_denial() -> Result<()> {
    let model = one_call(call("1", "add", r#"{"a":1,"b":2}"#), "ok, I won't");
    let a = agent(&model).with_layer(Arc::new(Approvals));
    let mut state = AgentState::default();
    let Err(Error::Suspended(s)) = run(&a, &mut state, "1+2").await else {
        panic!("expected a suspension");
    };
    let (rt, ev, cancel, ext) = parts();
    let out = a
        .resume(
            &mut state,
            vec![Resolution::new(
                &s.calls[0].suspension.id,
                serde_json::json!({"approve": false}),
            )],
            env(&rt, &ev, &cancel, &ext),
        )
        .await?;
    assert_eq!(out.reply.text_content(), "ok, I won't");
    assert_eq!(
        results(&state.messages[2])[0].2.as_deref(),
        Some(codes::DENIED)
    );
    // The model saw the denial in its second request.
    assert_eq!(model.requests()[1].messages.len(), 3);
    Ok(())
}

#[tokio::test]
async fn tools_and_layers_see_the_call_extensions() -> Result<()> {
    #[derive(Debug)]
    struct Tenant(&'static str);
    #[derive(Debug)]
    struct WhoAmI;
    #[async_trait]
    impl crate::Tool for WhoAmI {
        fn spec(&self) -> crate::ToolSpec {
            crate::ToolSpec {
                name: "whoami".into(),
                description: "tenant".into(),
                parameters: serde_json::json!({"type": "object", "properties": {}}).into(),
            }
        }
        async fn call(&self, _args: serde_json::Value, ctx: &ToolContext) -> crate::ToolOutput {
            Ok(ctx
                .extensions
                .get::<Tenant>()
                .map(|t| t.0.to_owned())
                .unwrap_or_default())
        }
    }
    let model = ScriptedModel::new([
        Reply::tools(&[call("1", "whoami", "{}")]),
        Reply::text("done"),
    ]);
    let mut tools = ToolSet::new();
    tools.register(Arc::new(WhoAmI));
    let a = AgentLoop::new(Arc::new(model.clone())).with_tools(tools);
    let mut ext = Extensions::new();
    ext.insert(Tenant("alice"));
    let (rt, ev, cancel) = (
        RuntimeContext::new("s"),
        EventSink::none(),
        CancellationToken::new(),
    );
    let mut state = AgentState::default();
    a.run_env(
        &mut state,
        CallInput::Message(Message::user("who?")),
        env(&rt, &ev, &cancel, &ext),
    )
    .await?;
    assert_eq!(results(&state.messages[2])[0].0, "alice");
    Ok(())
}

#[tokio::test]
async fn events_are_emitted_in_order() -> Result<()> {
    let model = one_call(call("1", "add", r#"{"a":2,"b":2}"#), "four");
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
            AgentEvent::ModelResponded { .. } => "model",
            AgentEvent::Usage { .. } => "usage",
            AgentEvent::Finished { .. } => "finished",
            _ => "other",
        });
    }
    assert_eq!(
        kinds,
        vec![
            "step",
            "model",
            "tool-start",
            "tool-end",
            "step",
            "text",
            "model",
            "usage",
            "finished"
        ]
    );
    Ok(())
}

#[derive(Debug, Default)]
struct AppendLog(Mutex<Vec<Message>>);

#[async_trait]
impl Layer for AppendLog {
    fn name(&self) -> &str {
        "append-log"
    }
    async fn append(
        &self,
        cx: &mut CallCtx<'_>,
        message: Message,
        next: AppendNext<'_>,
    ) -> Result<()> {
        if let Ok(mut l) = self.0.lock() {
            l.push(message.clone());
        }
        next.run(cx, message).await
    }
}

#[tokio::test]
async fn every_appended_message_is_reported_in_order() -> Result<()> {
    let model = one_call(call("1", "add", r#"{"a":2,"b":3}"#), "five");
    let log = Arc::new(AppendLog::default());
    let a = agent(&model).with_layer(log.clone());
    let mut state = AgentState::default();
    run(&a, &mut state, "2+3").await?;
    let seen = log.0.lock().map(|l| l.clone()).unwrap_or_default();
    assert_eq!(seen, state.messages);
    assert_eq!(seen.len(), 4);
    Ok(())
}

/// A tool whose result carries a registered secret (a `.env` file read, say).
#[derive(Debug)]
struct Leak;

#[derive(Debug, Deserialize, JsonSchema)]
struct NoArgs {}

#[async_trait]
impl TypedTool for Leak {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "leak"
    }
    fn description(&self) -> String {
        "Reads a secret".into()
    }
    async fn run(&self, _args: NoArgs, _ctx: &ToolContext) -> crate::tool::ToolOutput {
        Ok(format!("OPENAI_API_KEY={LOOP_SECRET}"))
    }
}

/// Adds a message of its own after the user's, as the subagent layer does with results.
#[derive(Debug)]
struct Notes;

#[async_trait]
impl Layer for Notes {
    fn name(&self) -> &str {
        "notes"
    }
    async fn append(&self, cx: &mut CallCtx<'_>, m: Message, next: AppendNext<'_>) -> Result<()> {
        let user = m.role == Role::User;
        next.run(cx, m).await?;
        if user {
            next.run(cx, Message::user(format!("note: {LOOP_SECRET}")))
                .await?;
        }
        Ok(())
    }
}

const LOOP_SECRET: &str = "loop-secret-5e4d3c2b1a";
const LOOP_ENDPOINT: &str = "http://loop-endpoint.test:7/v1";

#[tokio::test]
async fn registered_secrets_never_join_the_conversation_nor_the_failure() -> Result<()> {
    crate::secrets::add_secret(LOOP_SECRET);
    crate::secrets::add_endpoint(LOOP_ENDPOINT);
    let model = ScriptedModel::new([
        Reply::tools(&[call("1", "leak", "{}")]),
        Reply::Fail(ModelError::Auth {
            status: 401,
            message: format!("key {LOOP_SECRET} was rejected by {LOOP_ENDPOINT} (401)"),
        }),
    ]);
    let mut tools = ToolSet::new();
    tools.register(typed(Leak));
    let a = AgentLoop::new(Arc::new(model.clone()))
        .with_tools(tools)
        .with_layer(Arc::new(Notes));
    let mut state = AgentState::default();
    let (sink, mut events) = EventSink::channel();
    let r = a
        .run(
            &mut state,
            Message::user(format!("my key is {LOOP_SECRET}")),
            &RuntimeContext::new("s"),
            &sink,
            &CancellationToken::new(),
        )
        .await;
    assert!(matches!(r, Err(Error::Model(ModelError::Auth { .. }))));
    let stored = serde_json::to_string(&state.messages).unwrap_or_default();
    assert!(!stored.contains(LOOP_SECRET), "{stored}");
    assert!(!stored.contains(LOOP_ENDPOINT), "{stored}");
    // What was there is still there, redacted.
    let texts: Vec<String> = state.messages.iter().map(Message::text_content).collect();
    assert_eq!(
        texts,
        vec![
            "my key is [REDACTED]".to_owned(),
            "note: [REDACTED]".to_owned(),
            String::new(),
            String::new(),
            "[This request did not finish: authentication failed (401): key [REDACTED] was \
             rejected by [model endpoint] (401)]"
                .to_owned(),
        ]
    );
    assert_eq!(
        results(&state.messages[3]),
        vec![("OPENAI_API_KEY=[REDACTED]".to_owned(), false, None)]
    );
    for req in model.requests() {
        let sent = serde_json::to_string(&req.messages).unwrap_or_default();
        assert!(!sent.contains(LOOP_SECRET), "{sent}");
    }
    drop(sink);
    let mut failed = Vec::new();
    while let Some(ev) = events.recv().await {
        if let AgentEvent::Failed { message } = ev {
            failed.push(message);
        }
    }
    assert_eq!(
        failed,
        vec![format!(
            "authentication failed (401): key [REDACTED] was rejected by [model endpoint] (401)"
        )]
    );
    Ok(())
}
