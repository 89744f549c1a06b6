//! hame as an MCP server (ADR 0029): the served agent as one MCP tool, `ask`, over stdio
//! ([`Gateway::serve_mcp_stdio`]) or streamable HTTP at `/mcp` (with
//! [`GatewayOptions::mcp`](crate::GatewayOptions::mcp)), through the official Rust SDK's
//! server side.
//!
//! The workspace's skills are its prompts (`prompts/list`, `prompts/get`): each skill the
//! caller's model would see, by name and description, its prompt the text `load_skill`
//! gives (the `SKILL.md` body and its resource list).
//!
//! An `ask` is a turn like `POST /v1/sessions/{session}/messages`: the same session gate
//! (turns of one session run one at a time, 429-like refusal past the queue bound), the
//! same harness call, the same redaction of what goes back.

use std::sync::Arc;

use hame::{CallInput, CancellationToken, Message};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, ListPromptsResult, ListToolsResult,
    PaginatedRequestParams, Prompt, PromptMessage, Role, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

use crate::Shared;
use crate::routes::Caller;
use crate::turn::{self, Outcome};

/// The name of the one tool.
pub const ASK_TOOL: &str = "ask";

/// Longest `message` an `ask` accepts, in bytes (the HTTP body limit applies first there).
pub const MAX_ASK_BYTES: usize = 1024 * 1024;

/// The MCP server of one gateway. `user` is the caller when the transport carries none
/// (stdio); over HTTP the request's caller (its bearer token, else `X-Hame-User`) wins.
#[derive(Debug, Clone)]
pub(crate) struct McpServer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) user: Option<String>,
}

fn ask_tool(agent: &str) -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "message": {
                "type": "string",
                "description": "What to ask or tell the agent."
            },
            "session": {
                "type": "string",
                "description": "A session id to continue (letters, digits, `-`, `_`, `.`); omit it to start a new session, whose id the result names."
            }
        },
        "required": ["message"],
        "additionalProperties": false
    });
    let schema = match schema {
        Value::Object(o) => o,
        _ => serde_json::Map::new(),
    };
    let mut annotations = ToolAnnotations::new();
    annotations.title = Some(format!("Ask the hame agent `{agent}`"));
    annotations.read_only_hint = Some(false);
    annotations.open_world_hint = Some(true);
    Tool::new(
        ASK_TOOL,
        format!(
            "Ask the hame agent `{agent}`: it works on its own workspace with its own tools and \
             answers with its final reply. Give `session` to continue a conversation."
        ),
        Arc::new(schema),
    )
    .with_annotations(annotations)
}

/// The arguments of an `ask`, checked: every field known, `message` non-empty text.
fn ask_arguments(
    arguments: Option<&serde_json::Map<String, Value>>,
) -> Result<(String, Option<String>), String> {
    let empty = serde_json::Map::new();
    let args = arguments.unwrap_or(&empty);
    if let Some(other) = args.keys().find(|k| *k != "message" && *k != "session") {
        return Err(format!(
            "unknown argument `{other}`: `ask` takes `message` and an optional `session`"
        ));
    }
    let message = match args.get("message") {
        Some(Value::String(m)) if !m.trim().is_empty() => m.clone(),
        Some(Value::String(_)) | None => {
            return Err("`message` is required: the text to ask the agent".into());
        }
        Some(_) => return Err("`message` must be a string".into()),
    };
    if message.len() > MAX_ASK_BYTES {
        return Err(format!(
            "`message` is {} bytes, over the limit of {MAX_ASK_BYTES}; send less",
            message.len()
        ));
    }
    let session = match args.get("session") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            hame::harness::validate_id("session id", s).map_err(|e| e.to_string())?;
            Some(s.clone())
        }
        Some(_) => return Err("`session` must be a string".into()),
    };
    Ok((message, session))
}

fn error_result(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text.into())])
}

impl McpServer {
    /// The skills and the caller's workspace handle, when skills are on.
    fn skills_of(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<Option<(Arc<hame::skills::Skills>, hame::tools::Workspace)>, ErrorData> {
        let Some(skills) = self.shared.agent.skills().cloned() else {
            return Ok(None);
        };
        let ctx = crate::routes::context(&self.shared, self.caller(context), "mcp-prompts");
        let ws = self
            .shared
            .agent
            .workspace_for(&ctx)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(Some((skills, ws)))
    }

    /// The caller of a request: the HTTP layer's [`Caller`] when there is one, else the
    /// server's user.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Caller>())
            .map(|c| c.user.clone())
            .unwrap_or_else(|| self.user.clone())
    }

    async fn ask(
        &self,
        params: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (message, session) = match ask_arguments(params.arguments.as_ref()) {
            Ok(a) => a,
            Err(e) => return error_result(e),
        };
        let new_session = session.is_none();
        let session = session.unwrap_or_else(|| format!("mcp-{}", uuid::Uuid::new_v4().simple()));
        let user = self.caller(context);
        let cancel = self.shared.cancel.child_token();
        let started = turn::start_cancellable(
            &self.shared,
            user,
            session.clone(),
            CallInput::Message(Message::user(message)),
            cancel.clone(),
        );
        let turn = match started {
            Ok(t) => t,
            Err(e) => return error_result(format!("{}: {}", e.code, e.message)),
        };
        let outcome = wait(turn.outcome, &context.ct, &cancel).await;
        match outcome {
            Some(Outcome::Finished(body)) => {
                let reply = body
                    .get("reply")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let mut content = vec![ContentBlock::text(reply)];
                if new_session {
                    content.push(ContentBlock::text(format!(
                        "(session: {session}; pass it as `session` to continue this conversation)"
                    )));
                }
                let mut result = CallToolResult::success(content);
                result.structured_content = Some(body);
                result
            }
            Some(Outcome::Suspended(body)) => {
                let tools: Vec<&str> = body
                    .get("approvals")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|x| x["tool"].as_str()).collect())
                    .unwrap_or_default();
                let mut result = error_result(format!(
                    "the agent's tool calls ({}) wait for a decision in session `{session}`: \
                     approve or deny them (`hame approve`/`hame deny`, or POST \
                     /v1/sessions/{session}/approvals/ID on `hame serve`), or run the agent with \
                     a permission mode that does not ask",
                    tools.join(", ")
                ));
                result.structured_content = Some(body);
                result
            }
            Some(Outcome::Failed(e)) => error_result(format!("{}: {}", e.code, e.message)),
            None => error_result("the call was cancelled"),
        }
    }
}

/// The turn's outcome; a cancellation of the request cancels the turn (its tools stop)
/// and still waits for its end, so what joined the conversation is saved.
async fn wait(
    outcome: tokio::sync::oneshot::Receiver<Outcome>,
    request: &CancellationToken,
    turn: &CancellationToken,
) -> Option<Outcome> {
    tokio::pin!(outcome);
    tokio::select! {
        o = &mut outcome => return o.ok(),
        _ = request.cancelled() => turn.cancel(),
    }
    let _ = outcome.await;
    None
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .build(),
        )
        .with_server_info(Implementation::new("hame", env!("CARGO_PKG_VERSION")))
        .with_instructions(format!(
            "The hame agent `{}`. Call `ask` with a message; give the `session` a result \
                 names to continue that conversation.",
            self.shared.agent.name()
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![ask_tool(
            self.shared.agent.name(),
        )]))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let Some((skills, ws)) = self.skills_of(&context)? else {
            return Ok(ListPromptsResult::with_all_items(Vec::new()));
        };
        let catalog = skills.catalog(&ws, None).await;
        let prompts = catalog
            .visible()
            .into_iter()
            .map(|s| {
                let description = crate::error::for_callers(json!(s.description));
                Prompt::new(s.name.clone(), description.as_str(), None)
            })
            .collect();
        Ok(ListPromptsResult::with_all_items(prompts))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.arguments.as_ref().is_some_and(|a| !a.is_empty()) {
            return Err(ErrorData::invalid_params(
                "a skill's prompt takes no arguments",
                None,
            ));
        }
        let Some((skills, ws)) = self.skills_of(&context)? else {
            return Err(ErrorData::invalid_params(
                "skills are switched off: this server has no prompts",
                None,
            ));
        };
        let text = skills
            .load(&ws, &request.name, None)
            .await
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
        let text = crate::error::for_callers(json!(text));
        let result = GetPromptResult::new(vec![PromptMessage::new_text(
            Role::User,
            text.as_str().unwrap_or_default(),
        )])
        .with_description(format!("The skill `{}`", request.name));
        Ok(result.into())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == ASK_TOOL).then(|| ask_tool(self.shared.agent.name()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name != ASK_TOOL {
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{}`: this server has `ask`", request.name),
                None,
            ));
        }
        Ok(self.ask(&request, &context).await.into())
    }
}

/// `/mcp`: the streamable HTTP transport of the SDK (sessions in this process), behind
/// the gateway's caller check (bearer token or `X-Hame-User`, as for the other routes).
/// Without tokens the SDK's `Host` check keeps the loopback names only (a DNS-rebinding
/// page cannot reach it); with tokens every host is accepted (the token is the check).
pub(crate) fn router(shared: Arc<Shared>) -> axum::Router {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shared.draining.child_token())
        .with_sse_keep_alive(Some(shared.options.keep_alive))
        .with_max_request_body_bytes(shared.options.body_limit);
    if shared.options.auth.is_some() {
        config = config.disable_allowed_hosts();
    }
    let server = McpServer {
        shared: shared.clone(),
        user: None,
    };
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    axum::Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(shared, with_caller))
}

/// Puts the request's [`Caller`] into its extensions (the tool reads it from there), or
/// answers 401 / 400 as the other routes do; a token limited to agents other than the
/// served one is 404 `agent_not_found`, as on the session routes.
async fn with_caller(
    axum::extract::State(shared): axum::extract::State<Arc<crate::Shared>>,
    caller: Caller,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if !caller.may_use(shared.agent.name()) {
        return crate::error::ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "agent_not_found",
            "this token may not use the agent served at /mcp",
        )
        .into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Option<serde_json::Map<String, Value>> {
        v.as_object().cloned()
    }

    #[test]
    fn ask_arguments_are_checked() {
        assert_eq!(
            ask_arguments(args(json!({"message": "hi"})).as_ref()),
            Ok(("hi".to_owned(), None))
        );
        assert_eq!(
            ask_arguments(args(json!({"message": "hi", "session": "s-1"})).as_ref()),
            Ok(("hi".to_owned(), Some("s-1".to_owned())))
        );
        let err = |v: Value| ask_arguments(args(v).as_ref()).err().unwrap_or_default();
        assert!(err(json!({})).contains("`message` is required"));
        assert!(err(json!({"message": "  "})).contains("`message` is required"));
        assert!(err(json!({"message": 3})).contains("must be a string"));
        assert!(err(json!({"message": "x", "model": "y"})).contains("unknown argument `model`"));
        assert!(err(json!({"message": "x", "session": "../etc"})).contains("session id"));
        assert!(err(json!({"message": "x", "session": 7})).contains("must be a string"));
        let big = "x".repeat(MAX_ASK_BYTES + 1);
        assert!(err(json!({ "message": big })).contains("over the limit"));
        assert!(ask_arguments(None).is_err());
    }
}
