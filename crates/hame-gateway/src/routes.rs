//! The routes of the session API, `/healthz`, `/metrics` and the caller's identity.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequestParts, Path, Query, RawPathParams, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use futures::stream::BoxStream;
use hame::{CallInput, HarnessAgent, Message, Resolution, RuntimeContext};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Shared;
use crate::error::{ApiError, for_callers};
use crate::events::Event;
use crate::turn::{self, Outcome, Turn};

pub(crate) type AppState = Arc<Shared>;

/// Every path of [`router`] (the OpenAPI document must list exactly these).
#[cfg(test)]
pub(crate) const ROUTES: &[&str] = &[
    "/healthz",
    "/metrics",
    "/",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/models",
    "/v1/models/{id}",
    "/openapi.json",
];

/// The paths of [`agent_routes`]: served under `/v1` for the default agent and under
/// [`AGENT_PREFIX`] for each served agent (the OpenAPI document lists both).
pub(crate) const AGENT_ROUTES: &[&str] = &[
    "/sessions",
    "/sessions/{session}/messages",
    "/sessions/{session}/events",
    "/sessions/{session}/tasks",
    "/sessions/{session}/observations",
    "/sessions/{session}/evidence",
    "/sessions/{session}/task",
    "/sessions/{session}/requirements/{id}/confirm",
    "/sessions/{session}/approvals",
    "/sessions/{session}/approvals/{id}",
    "/sessions/{session}/files",
    "/sessions/{session}/files/{path}",
    "/memory",
    "/sessions/{session}/runs",
    "/runs/{run_id}",
    "/runs/{run_id}/cancel",
    "/runs/{run_id}/events",
];

/// Where the default agent's routes are ([`agent_routes`] under it).
pub(crate) const DEFAULT_PREFIX: &str = "/v1";
/// Where an agent's routes are ([`agent_routes`] under it).
pub(crate) const AGENT_PREFIX: &str = "/v1/agents/{agent}";

pub(crate) fn router(shared: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(crate::openapi::openapi_json))
        .route("/metrics", get(metrics))
        .route("/", get(crate::console::page))
        .route("/v1/chat/completions", post(crate::openai::completions))
        .route("/v1/responses", post(crate::responses::create))
        .route("/v1/models", get(crate::openai::list_models))
        .route("/v1/models/{id}", get(crate::openai::get_model))
        // One set of routes for every agent: the handlers take the agent from the path
        // ([`Served`]); without `{agent}` it is the default one.
        .nest(DEFAULT_PREFIX, agent_routes())
        .nest(AGENT_PREFIX, agent_routes())
        .fallback(|| async { ApiError::not_found("no such route") })
        .with_state(shared)
}

/// The routes of one agent's sessions, runs, files and memory.
fn agent_routes() -> Router<AppState> {
    Router::new()
        .route("/sessions", get(list_sessions))
        .route(
            "/sessions/{session}/messages",
            post(post_message).get(get_messages),
        )
        .route("/sessions/{session}/events", get(get_events))
        .route("/sessions/{session}/tasks", get(get_tasks))
        .route("/sessions/{session}/observations", get(get_observations))
        .route("/sessions/{session}/evidence", get(get_evidence))
        .route("/sessions/{session}/task", get(get_task))
        .route(
            "/sessions/{session}/requirements/{id}/confirm",
            post(confirm_requirement),
        )
        .route("/sessions/{session}/approvals", get(get_approvals))
        .route("/sessions/{session}/approvals/{id}", post(post_approval))
        .route("/sessions/{session}/files", get(crate::files::list))
        .route(
            crate::files::FILE_ROUTE,
            get(crate::files::download).put(crate::files::upload),
        )
        .route(
            "/sessions/{session}/runs",
            post(crate::runs::submit).get(crate::runs::list),
        )
        .route("/runs/{run_id}", get(crate::runs::get))
        .route("/runs/{run_id}/cancel", post(crate::runs::cancel))
        .route("/runs/{run_id}/events", get(crate::runs::events))
        .route("/memory", get(get_memory))
}

/// The caller: its user id (the token's with auth, else `X-Hame-User` or the default), and
/// the agents its token may use.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) user: Option<String>,
    /// The agent ids the token is limited to (`None`: every served agent).
    pub(crate) agents: Option<Vec<String>>,
}

impl Caller {
    fn anyone(user: Option<String>) -> Self {
        Self { user, agents: None }
    }

    /// Whether the caller may use the agent `name`.
    pub(crate) fn may_use(&self, name: &str) -> bool {
        self.agents
            .as_ref()
            .is_none_or(|a| a.iter().any(|n| n == name))
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        shared: &AppState,
    ) -> Result<Self, Self::Rejection> {
        match &shared.options.auth {
            Some(auth) => {
                let bearer = parts
                    .headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| {
                        v.strip_prefix("Bearer ")
                            .or_else(|| v.strip_prefix("bearer "))
                    })
                    .map(|t| t.trim().to_owned());
                // The console page itself cannot send a header: `/?token=`.
                let token = bearer.or_else(|| {
                    (parts.uri.path() == "/")
                        .then(|| query_param(parts.uri.query().unwrap_or(""), "token"))
                        .flatten()
                });
                match token.as_deref().and_then(|t| auth.grant_of(t)) {
                    Some(grant) => Ok(Caller {
                        user: Some(grant.user.clone()),
                        agents: grant.agents.clone(),
                    }),
                    None => {
                        shared.metrics.refused("unauthorized");
                        Err(ApiError::unauthorized())
                    }
                }
            }
            None => match parts.headers.get("x-hame-user") {
                Some(v) => {
                    let user = v
                        .to_str()
                        .map_err(|_| ApiError::bad_request("X-Hame-User is not text"))?
                        .trim()
                        .to_owned();
                    if user.is_empty() {
                        return Ok(Caller::anyone(shared.base.user_id.clone()));
                    }
                    hame::harness::validate_id("user id", &user).map_err(|e| {
                        ApiError::new(StatusCode::BAD_REQUEST, "invalid_id", e.to_string())
                    })?;
                    Ok(Caller::anyone(Some(user)))
                }
                None => Ok(Caller::anyone(shared.base.user_id.clone())),
            },
        }
    }
}

/// The caller and the agent a request is for: the path's `{agent}` (under
/// `/v1/agents/{agent}/…`), else the default agent. An agent that is not served, or that
/// the caller's token may not use, is 404 `agent_not_found` (a limited token cannot tell
/// the agents it may not use from ones that do not exist).
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub(crate) user: Option<String>,
    pub(crate) agent: HarnessAgent,
}

impl FromRequestParts<AppState> for Served {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        shared: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, shared).await?;
        let params = RawPathParams::from_request_parts(parts, shared)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        let named = params.iter().find(|(k, _)| *k == "agent").map(|(_, v)| v);
        let agent = match named {
            None => Some(&shared.agent).filter(|a| caller.may_use(a.name())),
            Some(name) => shared
                .agents()
                .find(|a| a.name() == name && caller.may_use(name)),
        };
        match agent {
            Some(a) => Ok(Served {
                user: caller.user,
                agent: a.clone(),
            }),
            None => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "agent_not_found",
                match named {
                    Some(n) => format!(
                        "no agent `{}` here (GET /v1/models lists the agents you may use)",
                        n.chars().take(64).collect::<String>()
                    ),
                    None => "this token may not use the default agent: use /v1/agents/{agent}/… (GET /v1/models lists the agents you may use)".to_owned(),
                },
            )),
        }
    }
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.to_owned())
    })
}

/// The context of `user` on `session` (the base's extras kept).
pub(crate) fn context(shared: &Shared, user: Option<String>, session: &str) -> RuntimeContext {
    let mut ctx = shared.base.clone();
    ctx.session_id = session.to_owned();
    ctx.user_id = user;
    ctx
}

/// The caller's context on the path's session (its id checked), and the path's agent
/// ([`Served`]): what the routes of one session start from.
pub(crate) struct InSession {
    pub(crate) agent: HarnessAgent,
    pub(crate) ctx: RuntimeContext,
}

impl FromRequestParts<AppState> for InSession {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        shared: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Served { user, agent } = Served::from_request_parts(parts, shared).await?;
        let Path(SessionPath { session }) = Path::<SessionPath>::from_request_parts(parts, shared)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        valid_session(&session)?;
        Ok(InSession {
            ctx: context(shared, user, &session),
            agent,
        })
    }
}

/// The `{session}` of a path (under `/v1/agents/{agent}` too).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct SessionPath {
    /// The session id: `[A-Za-z0-9._@-]{1,128}`.
    pub(crate) session: String,
}

/// The `{session}` and `{id}` of an approval's path.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct ApprovalPath {
    /// The session id: `[A-Za-z0-9._@-]{1,128}`.
    session: String,
    /// The approval id.
    id: String,
}

pub(crate) fn valid_session(session: &str) -> Result<(), ApiError> {
    hame::harness::validate_id("session id", session)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_id", e.to_string()))
}

#[utoipa::path(get, path = "/healthz", tag = "server",
    responses((status = 200, description = "`ok`", content_type = "text/plain", body = String)))]
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

#[utoipa::path(get, path = "/metrics", tag = "server",
    responses((status = 200, description = "Prometheus text (docs/gateway.md)", content_type = "text/plain", body = String),))]
pub(crate) async fn metrics(State(shared): State<AppState>, _caller: Caller) -> Response {
    let gauges = crate::metrics::Gauges {
        queue_depth: shared.gates.waiting(),
        sessions: shared.hub.len().max(shared.gates.len()),
        in_flight: shared.turns.len(),
    };
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        shared.metrics.render(shared.agent.name(), &gauges),
    )
        .into_response()
}

/// Whether the client asked for SSE.
pub(crate) fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

#[derive(Debug, Deserialize)]
struct MessageBody {
    message: String,
    /// The caller's own limits for this turn; they only tighten the server's
    /// (`docs/cost.md`).
    #[serde(default)]
    budget: Option<serde_json::Value>,
    /// Required checks of this turn (names of the server's `[[verify]]`), docs/evidence.md.
    #[serde(default)]
    verify: Option<Vec<String>>,
    /// Check rounds of the gate (1..=10, default 2).
    #[serde(default)]
    verify_attempts: Option<u32>,
    /// The session's goal (its task state).
    #[serde(default)]
    goal: Option<String>,
}

/// The required checks of a turn or a run (`verify`, `verify_attempts` of its body),
/// checked: every name declared by the agent's `[[verify]]`, the rounds 1 to 10 (default
/// 2). `None`: no checks asked for.
pub(crate) fn checked_verify(
    agent: &hame::HarnessAgent,
    verify: Option<Vec<String>>,
    attempts: Option<u32>,
) -> Result<Option<(Vec<String>, u32)>, ApiError> {
    let Some(names) = verify.filter(|n| !n.is_empty()) else {
        if attempts.is_some() {
            return Err(ApiError::bad_request(
                "`verify_attempts` needs `verify` (the checks to run)",
            ));
        }
        return Ok(None);
    };
    let declared = agent.verifier_names();
    if let Some(unknown) = names.iter().find(|n| !declared.contains(n)) {
        let unknown: String = unknown.chars().take(64).collect();
        return Err(ApiError::bad_request(format!(
            "`verify`: no check is named {unknown:?} (declared: {})",
            declared.join(", ")
        )));
    }
    let attempts = attempts.unwrap_or(hame::harness::evidence::DEFAULT_VERIFY_ATTEMPTS);
    if !(1..=hame::harness::evidence::MAX_VERIFY_ATTEMPTS).contains(&attempts) {
        return Err(ApiError::bad_request(
            "`verify_attempts`: a number from 1 to 10",
        ));
    }
    Ok(Some((names, attempts)))
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("bad JSON body: {e}")))
}

#[utoipa::path(post, path = "/v1/sessions/{session}/messages", tag = "sessions",
    params(SessionPath),
    request_body(content = crate::schemas::MessageRequest, description = "A turn"),
    responses(
        (status = 200, description = "The reply; with `Accept: text/event-stream` SSE events `text_delta`, `tool_started`, `tool_finished`, `approval_needed`, `finished`, `failed` (each `data:` is the event's [`SessionEvent`] variant)", content(
            (crate::schemas::TurnReply = "application/json"),
            (crate::schemas::SessionEvent = "text/event-stream"))),
        (status = 202, description = "Tool calls wait for a decision", body = crate::schemas::TurnSuspended),))]
pub(crate) async fn post_message(
    State(shared): State<AppState>,
    Served { user, agent }: Served,
    Path(SessionPath { session }): Path<SessionPath>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    valid_session(&session)?;
    let key = shared.replays.key_of(
        &headers,
        user.as_deref(),
        &format!("{}/messages/{session}", agent.name()),
        &body,
    )?;
    let body: MessageBody = parse(&body)?;
    if body.message.trim().is_empty() {
        return Err(ApiError::bad_request("`message` is empty"));
    }
    let mut extras = turn::Extras::new();
    if let Some(v) = body.budget {
        // Checked here, so a bad one is a 400 naming the field and no turn runs.
        hame::harness::cost::Budgets::default()
            .for_call(&[(hame::harness::cost::BUDGET_EXTRA.to_owned(), v.clone())].into())
            .map_err(|e| {
                ApiError::bad_request(format!(
                    "`budget`: {e} (e.g. {{\"run\": {{\"usd\": 0.5}}, \"user_day\": {{\"tokens\": 200000}}}})"
                ))
            })?;
        extras.insert(hame::harness::cost::BUDGET_EXTRA.to_owned(), v);
    }
    if let Some((names, attempts)) = checked_verify(&agent, body.verify, body.verify_attempts)? {
        extras.insert(
            hame::harness::evidence::VERIFY_EXTRA.to_owned(),
            json!(names),
        );
        extras.insert(
            hame::harness::evidence::VERIFY_ATTEMPTS_EXTRA.to_owned(),
            json!(attempts),
        );
    }
    if let Some(goal) = body.goal {
        if goal.trim().is_empty() {
            return Err(ApiError::bad_request("`goal` is empty"));
        }
        extras.insert(hame::harness::task::GOAL_EXTRA.to_owned(), json!(goal));
    }
    // A run of the queue when the server has one: visible in `GET …/runs`, and taken over
    // by a worker if this process dies mid-turn (docs/replicas.md).
    let as_run = match &shared.options.runs {
        Some(_) => {
            let key = hame::state::StateKey::new(agent.name(), user.as_deref(), &session)
                .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_id", e.to_string()))?;
            let values = extras.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            Some(turn::AsRun::Submit(
                hame::state::runs::NewRun::message(key, body.message.clone(), None)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?
                    .with_extras(values),
            ))
        }
        None => None,
    };
    let turn = turn::start_once_with(
        &shared,
        &agent,
        user,
        session,
        CallInput::Message(Message::user(body.message)),
        key,
        turn::With {
            as_run,
            extras,
            ..turn::With::default()
        },
    )?;
    Ok(answer(&shared, turn, wants_sse(&headers)).await)
}

/// A turn's answer: SSE of its events, or its outcome as JSON.
async fn answer(shared: &Shared, turn: Turn, sse: bool) -> Response {
    if sse {
        let stream = futures::stream::unfold(turn.events, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        })
        .map(|ev| Ok::<_, Infallible>(sse_event(&ev)));
        return Sse::new(stream)
            .keep_alive(KeepAlive::new().interval(shared.options.keep_alive))
            .into_response();
    }
    let Turn { outcome, .. } = turn;
    match outcome.await {
        Ok(Outcome::Finished(body)) => Json(body).into_response(),
        Ok(Outcome::Suspended(body)) => (StatusCode::ACCEPTED, Json(body)).into_response(),
        Ok(Outcome::Failed(e)) => e.into_response(),
        Err(_) => ApiError::internal("the turn ended without an outcome").into_response(),
    }
}

pub(crate) fn sse_event(ev: &Event) -> SseEvent {
    SseEvent::default()
        .id(ev.id.to_string())
        .event(ev.name)
        .data(ev.data.as_str())
}

#[utoipa::path(get, path = "/v1/sessions/{session}/messages", tag = "sessions",
    params(SessionPath),
    responses((status = 200, description = "The session log", body = crate::schemas::SessionLog),))]
pub(crate) async fn get_messages(
    InSession { agent, ctx }: InSession,
) -> Result<Json<Value>, ApiError> {
    let session = ctx.session_id.clone();
    let log = session_log(&agent, &ctx)?;
    match log.read_page(&session, 0, usize::MAX).await {
        Ok(page) => Ok(Json(for_callers(json!({
            "session": session,
            "user": ctx.user_id,
            "messages": page.records,
        })))),
        Err(hame::session::Error::SessionNotFound { .. }) => {
            Err(ApiError::not_found(format!("no session {session}")))
        }
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

fn session_log(
    agent: &HarnessAgent,
    ctx: &RuntimeContext,
) -> Result<hame::session::SessionLog, ApiError> {
    let ws = agent.workspace_for(ctx)?;
    hame::session::SessionLog::new(ws.records().clone(), agent.name())
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// A view of one session as the routes answer it: `{"session": session, <name>: value}`
/// ([`for_callers`]).
fn session_view(session: &str, name: &str, value: impl serde::Serialize) -> Json<Value> {
    Json(for_callers(json!({"session": session, name: value})))
}

#[utoipa::path(get, path = "/v1/sessions", tag = "sessions",
    responses((status = 200, description = "The caller's sessions, newest first", body = crate::schemas::SessionList),))]
pub(crate) async fn list_sessions(
    State(shared): State<AppState>,
    Served { user, agent }: Served,
) -> Result<Json<Value>, ApiError> {
    let ctx = context(&shared, user, &shared.base.session_id);
    let log = session_log(&agent, &ctx)?;
    let sessions = log
        .list_sessions()
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(for_callers(
        json!({"user": ctx.user_id, "sessions": sessions}),
    )))
}

#[utoipa::path(get, path = "/v1/sessions/{session}/tasks", tag = "sessions",
    params(SessionPath),
    responses((status = 200, description = "The session's background tasks", body = crate::schemas::TaskList),))]
pub(crate) async fn get_tasks(
    InSession { agent, ctx }: InSession,
) -> Result<Json<Value>, ApiError> {
    let tasks = agent.tasks(&ctx).await?;
    Ok(session_view(&ctx.session_id, "tasks", tasks))
}

#[utoipa::path(get, path = "/v1/sessions/{session}/observations", tag = "sessions",
    params(("session" = String, Path, description = "The session id: `[A-Za-z0-9._@-]{1,128}`")),
    responses((status = 200, description = "`{session, observations}`: one record per tool call and check run, oldest first (docs/evidence.md)", body = serde_json::Value),))]
pub(crate) async fn get_observations(
    InSession { agent, ctx }: InSession,
) -> Result<Json<Value>, ApiError> {
    let observations = agent.session_observations(&ctx, &ctx.session_id).await?;
    Ok(session_view(&ctx.session_id, "observations", observations))
}

#[utoipa::path(get, path = "/v1/sessions/{session}/evidence", tag = "sessions",
    params(("session" = String, Path, description = "The session id: `[A-Za-z0-9._@-]{1,128}`")),
    responses((status = 200, description = "`{session, evidence}`: the newest evidence of each check, `stale` when a covered file changed since (docs/evidence.md)", body = serde_json::Value),))]
pub(crate) async fn get_evidence(
    InSession { agent, ctx }: InSession,
) -> Result<Json<Value>, ApiError> {
    let evidence = agent.session_evidence(&ctx, &ctx.session_id).await?;
    Ok(session_view(&ctx.session_id, "evidence", evidence))
}

#[utoipa::path(get, path = "/v1/sessions/{session}/task", tag = "sessions",
    params(("session" = String, Path, description = "The session id: `[A-Za-z0-9._@-]{1,128}`")),
    responses((status = 200, description = "`{session, goal, requirements, evidence}`: the task state (docs/evidence.md)", body = serde_json::Value),))]
pub(crate) async fn get_task(InSession { agent, ctx }: InSession) -> Result<Json<Value>, ApiError> {
    let session = ctx.session_id.clone();
    let task = agent.task_state(&ctx).await?;
    let evidence = agent.session_evidence(&ctx, &session).await?;
    Ok(Json(for_callers(json!({
        "session": session,
        "goal": task.goal,
        "requirements": task.requirements,
        "evidence": evidence,
    }))))
}

#[utoipa::path(post, path = "/v1/sessions/{session}/requirements/{id}/confirm", tag = "sessions",
    params(("session" = String, Path, description = "The session id: `[A-Za-z0-9._@-]{1,128}`"),
           ("id" = String, Path, description = "The requirement id (`rq-1`)")),
    responses((status = 200, description = "`{session, requirement}`: the confirmed requirement", body = serde_json::Value),))]
pub(crate) async fn confirm_requirement(
    State(shared): State<AppState>,
    Served { user, agent }: Served,
    Path(ApprovalPath { session, id }): Path<ApprovalPath>,
) -> Result<Json<Value>, ApiError> {
    valid_session(&session)?;
    let ctx = context(&shared, user, &session);
    let requirement = agent
        .confirm_requirement(&ctx, &id)
        .await
        .map_err(|e| match e {
            // No such session or requirement.
            hame::harness::Error::Config(m) => ApiError::not_found(m),
            e => ApiError::from_harness(&e),
        })?;
    Ok(session_view(&session, "requirement", requirement))
}

#[utoipa::path(get, path = "/v1/sessions/{session}/approvals", tag = "sessions",
    params(SessionPath),
    responses((status = 200, description = "The calls waiting for a decision", body = crate::schemas::ApprovalList),))]
pub(crate) async fn get_approvals(
    InSession { agent, ctx }: InSession,
) -> Result<Json<Value>, ApiError> {
    let pending = agent
        .pending(&ctx)
        .await?
        .map(|s| s.calls)
        .unwrap_or_default();
    let approvals: Vec<Value> = pending.iter().map(crate::turn::approval).collect();
    Ok(session_view(&ctx.session_id, "approvals", approvals))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    decision: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    always: Option<bool>,
}

#[utoipa::path(post, path = "/v1/sessions/{session}/approvals/{id}", tag = "sessions",
    params(ApprovalPath),
    request_body(content = crate::schemas::DecisionRequest, description = "The decision"),
    responses((status = 200, description = "Answered like a message (JSON, or SSE with `Accept: text/event-stream`)", content(
            (crate::schemas::TurnReply = "application/json"),
            (crate::schemas::SessionEvent = "text/event-stream"))),
        (status = 202, description = "More calls wait for a decision", body = crate::schemas::TurnSuspended),))]
pub(crate) async fn post_approval(
    State(shared): State<AppState>,
    Served { user, agent }: Served,
    Path(ApprovalPath { session, id }): Path<ApprovalPath>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    valid_session(&session)?;
    let body: DecisionBody = parse(&body)?;
    // Every field is honoured or refused: `reason` goes with a denial, `always` with an
    // approval.
    let value = match (body.decision.as_str(), body.reason) {
        ("approve", Some(_)) => {
            return Err(ApiError::bad_request(
                "`reason` goes with \"deny\" (the model reads it); an approval takes `always` only",
            ));
        }
        ("deny", _) if body.always.is_some() => {
            return Err(ApiError::bad_request(
                "`always` goes with \"approve\" (allow this call from now on)",
            ));
        }
        ("approve", None) if body.always == Some(true) => {
            json!({"approve": true, "always": true})
        }
        ("approve", None) => json!({"approve": true}),
        ("deny", Some(r)) => json!({"approve": false, "reason": r}),
        ("deny", None) => json!({"approve": false}),
        (other, _) => {
            return Err(ApiError::bad_request(format!(
                "`decision` must be \"approve\" or \"deny\", not {:?}",
                other.chars().take(40).collect::<String>()
            )));
        }
    };
    let ctx = context(&shared, user.clone(), &session);
    let pending = agent.pending(&ctx).await?;
    let known = pending
        .as_ref()
        .is_some_and(|p| p.calls.iter().any(|c| c.suspension.id == id));
    if !known {
        return Err(turn::no_such_approval(&id, &session));
    }
    // With a run queue, the decision resumes the session's waiting run: recorded on it and
    // claimed by this request in one step, so the resumed turn is that run's next leg
    // (docs/replicas.md, *Approvals*).
    let as_run = match &shared.options.runs {
        Some(_) => {
            let key = hame::state::StateKey::new(agent.name(), user.as_deref(), &session)
                .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_id", e.to_string()))?;
            Some(turn::AsRun::Decide(
                key,
                hame::state::runs::Decision::new(id.clone(), value.clone()),
            ))
        }
        None => None,
    };
    let turn = turn::start_once_with(
        &shared,
        &agent,
        user,
        session,
        CallInput::Resume(vec![Resolution::new(id, value)]),
        // A decision runs once by itself: a repeated one finds nothing pending (404).
        None,
        turn::With {
            as_run,
            ..turn::With::default()
        },
    )?;
    Ok(answer(&shared, turn, wants_sse(&headers)).await)
}

#[derive(Debug, Deserialize)]
pub(crate) struct EventsQuery {
    after: Option<u64>,
    #[serde(default)]
    follow: bool,
}

/// Replays the session's events after `after` (or `Last-Event-ID`); then, while a turn
/// runs, its live events until it ends (`follow=true`: until the client or the server
/// goes away).
#[utoipa::path(get, path = "/v1/sessions/{session}/events", tag = "sessions",
    params(SessionPath,
        ("after" = Option<u64>, Query, description = "Replay the events after this id (else `Last-Event-ID`, else all in the ring)"),
        ("follow" = Option<bool>, Query, description = "Keep following until the client or the server goes away")),
    responses((status = 200, description = "SSE: the session's events with ids (the names of POST messages, and `subagent`)", content_type = "text/event-stream", body = crate::schemas::SessionEvent),))]
pub(crate) async fn get_events(
    State(shared): State<AppState>,
    Served { user, agent }: Served,
    Path(SessionPath { session }): Path<SessionPath>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    valid_session(&session)?;
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let after = q.after.or(last).unwrap_or(0);
    let key = turn::key(agent.name(), user.as_deref(), &session);
    let (local, active, rx) = shared.hub.replay(&key, after, true);
    let follow = q.follow;
    // Replicas: the shared store has every replica's events; a turn that runs elsewhere
    // (its last event is not a turn's end) is followed by polling the store.
    let from_store = shared.shared_replay(&key, after).await;
    let shared_mode = from_store.is_some();
    let past = from_store.unwrap_or(local);
    let last_id = past.last().map_or(after, |e| e.id);
    let elsewhere = shared_mode && !active && past.last().is_some_and(|e| !e.terminal);
    // A replay that ends on a turn's end, with no turn running, is complete.
    let stream: BoxStream<'static, Arc<Event>> = futures::stream::iter(past).boxed();
    let live: BoxStream<'static, Arc<Event>> = match rx {
        _ if shared_mode && !active && (follow || elsewhere) => {
            poll_store(shared.clone(), key.clone(), last_id, follow)
        }
        Some(rx) if follow || active => {
            let shared2 = shared.clone();
            futures::stream::unfold((rx, last_id, false), move |(mut rx, mut last_id, done)| {
                let shared2 = shared2.clone();
                let key = key.clone();
                async move {
                    if done {
                        return None;
                    }
                    loop {
                        let got = tokio::select! {
                            r = rx.recv() => r,
                            _ = shared2.draining.cancelled() => return None,
                        };
                        match got {
                            Ok(ev) if ev.id <= last_id => continue,
                            Ok(ev) => {
                                let end = ev.terminal && !follow;
                                return Some((vec![ev.clone()], (rx, ev.id, end)));
                            }
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                                // Fell behind: what was missed is still in the ring.
                                let (missed, _, _) = shared2.hub.replay(&key, last_id, false);
                                if let Some(l) = missed.last() {
                                    last_id = l.id;
                                }
                                let end = !follow && missed.iter().any(|e| e.terminal);
                                return Some((missed, (rx, last_id, end)));
                            }
                            Err(_) => return None,
                        }
                    }
                }
            })
            .flat_map(futures::stream::iter)
            .boxed()
        }
        _ => futures::stream::empty().boxed(),
    };
    let all = stream
        .chain(live)
        .map(|ev| Ok::<_, Infallible>(sse_event(&ev)));
    Ok(Sse::new(all)
        .keep_alive(KeepAlive::new().interval(shared.options.keep_alive))
        .into_response())
}

/// How often a follower polls the shared store for a turn that runs on another replica.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// A follower of a turn elsewhere gives up after this long without a new event (a replica
/// that died mid-turn never sends the turn's end); with `follow=true` it polls until the
/// client goes away.
const POLL_IDLE_LIMIT: Duration = Duration::from_secs(60);

/// Later events of the session from the shared store, until a turn's end (unless `follow`).
fn poll_store(
    shared: AppState,
    key: String,
    after: u64,
    follow: bool,
) -> BoxStream<'static, Arc<Event>> {
    futures::stream::unfold(
        (after, false, tokio::time::Instant::now()),
        move |(mut last_id, done, mut seen)| {
            let shared = shared.clone();
            let key = key.clone();
            async move {
                if done {
                    return None;
                }
                loop {
                    tokio::select! {
                        () = tokio::time::sleep(POLL_INTERVAL) => {}
                        () = shared.draining.cancelled() => return None,
                    }
                    let got = shared
                        .shared_replay(&key, last_id)
                        .await
                        .unwrap_or_default();
                    if got.is_empty() {
                        if !follow && seen.elapsed() > POLL_IDLE_LIMIT {
                            return None;
                        }
                        continue;
                    }
                    seen = tokio::time::Instant::now();
                    if let Some(l) = got.last() {
                        last_id = l.id;
                    }
                    let end = !follow && got.iter().any(|e| e.terminal);
                    return Some((got, (last_id, end, seen)));
                }
            }
        },
    )
    .flat_map(futures::stream::iter)
    .boxed()
}

/// The caller's memory files, read-only: `MEMORY.md` and `memory/*.md` of its home.
#[utoipa::path(get, path = "/v1/memory", tag = "sessions",
    responses((status = 200, description = "The caller's memory files (read-only)", body = crate::schemas::MemoryFiles),))]
pub(crate) async fn get_memory(
    State(shared): State<AppState>,
    Served { user, agent }: Served,
) -> Result<Json<Value>, ApiError> {
    use hame::fs::{FileKind, FsPath};
    let ctx = context(&shared, user, &shared.base.session_id);
    let ws = agent.workspace_for(&ctx)?;
    let home = ws.home().clone();
    let mut files = Vec::new();
    let mut paths = Vec::new();
    if let Ok(p) = FsPath::parse("/MEMORY.md") {
        paths.push(p);
    }
    if let Ok(dir) = FsPath::parse("/memory")
        && let Ok(list) = home.list(&dir).await
    {
        let mut list: Vec<_> = list
            .into_iter()
            .filter(|f| matches!(f.kind, FileKind::File))
            .map(|f| f.path)
            .collect();
        list.sort_by_key(|p| p.to_string());
        paths.extend(list);
    }
    for p in paths {
        match home.read_bytes(&p).await {
            Ok(data) => files.push(json!({
                "path": p.to_string(),
                "content": String::from_utf8_lossy(&data),
            })),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(ApiError::internal(e.to_string())),
        }
    }
    Ok(Json(for_callers(
        json!({"user": ctx.user_id, "files": files}),
    )))
}
