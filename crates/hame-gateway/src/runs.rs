//! The run routes: submit a run to the queue, read it, list a session's runs, cancel one,
//! follow its status changes as SSE (`docs/runs.md`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use hame::state::runs::{CancelOutcome, NewRun, Run, RunQueue, RunStatus};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, for_callers};
use crate::openapi::ErrorBody;
use crate::routes::{AppState, InSession, Served, SessionPath};

/// The `{run_id}` of a path (under `/v1/agents/{agent}` too).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct RunPath {
    /// The run id.
    run_id: String,
}

/// How often a follower of `GET /v1/runs/{id}/events` reads the run (250 ms).
pub(crate) const RUN_POLL: Duration = Duration::from_millis(250);
/// Runs a list returns by default (50) and at most (500).
const LIST_DEFAULT: usize = 50;
const LIST_MAX: usize = 500;

fn queue(shared: &AppState) -> Result<&Arc<dyn RunQueue>, ApiError> {
    shared.options.runs.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "runs_unavailable",
            "this server has no run queue",
        )
    })
}

pub(crate) fn store_error(e: &hame::state::Error) -> ApiError {
    tracing::warn!(error = %e, "run queue failed");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "the run queue cannot be reached; retry later",
    )
}

/// One line naming the failing checks of an `unverified` run: `unverified: the reply's
/// required checks failed: tests (failed, evidence ev-…)`.
pub(crate) fn unverified_line(run: &Run) -> String {
    let failing: Vec<String> = run
        .verification
        .as_ref()
        .and_then(|v| v.get("evidence"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| e.get("outcome").and_then(Value::as_str) != Some("passed"))
        .map(|e| {
            let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
            format!(
                "{} ({}, evidence {})",
                field("check"),
                field("outcome"),
                field("id")
            )
        })
        .collect();
    format!(
        "unverified: the reply's required checks failed: {}",
        failing.join(", ")
    )
}

/// The usage a run records: the turn's tokens and `requests`, the model requests it
/// made, so that a caller waiting on a run another replica executed gets the turn's
/// `iterations` back.
pub(crate) fn run_usage(usage: &Value, iterations: u64) -> Value {
    let mut u = usage.clone();
    if let Some(o) = u.as_object_mut() {
        o.insert("requests".into(), json!(iterations));
    }
    u
}

/// A run as callers see it: `{"run_id", "session", "status", "reply"?, "usage"?,
/// "verification"?, "error"?, "approvals"?, "created", "updated"}`.
pub(crate) fn view(run: &Run) -> Value {
    let mut v = json!({
        "run_id": run.id,
        "session": run.session,
        "status": run.status,
        "created": run.created,
        "updated": run.updated,
    });
    if let Some(o) = v.as_object_mut() {
        if let Some(r) = &run.reply {
            o.insert("reply".into(), json!(r));
        }
        if let Some(u) = &run.usage {
            o.insert("usage".into(), u.clone());
        }
        if let Some(v) = &run.verification {
            o.insert("verification".into(), v.clone());
        }
        if let Some(e) = &run.error {
            o.insert(
                "error".into(),
                json!({"code": e.code, "message": e.message}),
            );
        }
        if let Some(a) = &run.approvals {
            o.insert("approvals".into(), a.clone());
        }
    }
    for_callers(v)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunBody {
    message: String,
    /// Required checks of the run (docs/evidence.md), as in a turn.
    #[serde(default)]
    verify: Option<Vec<String>>,
    /// The gate's check rounds (1..=10, default 2).
    #[serde(default)]
    verify_attempts: Option<u32>,
}

/// `POST /v1/sessions/{session}/runs` `{"message"}` (header `Idempotency-Key` optional):
/// 202 with the new run, 200 with the run an earlier request with the same key made.
#[utoipa::path(post, path = "/v1/sessions/{session}/runs", tag = "runs",
    params(SessionPath, ("Idempotency-Key" = Option<String>, Header, description = "The same key answers with the run it made")),
    request_body(content = crate::schemas::RunRequest, description = "A run of one message (docs/runs.md)"),
    responses((status = 202, description = "The new run", body = crate::schemas::RunCreated),
        (status = 200, description = "The run an earlier request with the same key made", body = crate::schemas::RunCreated),
        (status = 501, description = "The server has no run queue", body = ErrorBody),))]
pub(crate) async fn submit(
    State(shared): State<AppState>,
    InSession { agent, ctx }: InSession,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let q = queue(&shared)?;
    if shared.draining.is_cancelled() {
        return Err(ApiError::draining());
    }
    // Bytes that are not text are checked as what they are not: visible ASCII.
    let idem = headers
        .get("idempotency-key")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let body: RunBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("bad JSON body: {e}")))?;
    if body.message.trim().is_empty() {
        return Err(ApiError::bad_request("`message` is empty"));
    }
    let key = hame::state::StateKey::new(agent.name(), ctx.user_id.as_deref(), &ctx.session_id)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_id", e.to_string()))?;
    let verify = crate::routes::checked_verify(&agent, body.verify, body.verify_attempts)?;
    let mut new = NewRun::message(key, body.message, idem)
        .map_err(|e| ApiError::bad_request(e.to_string()))?
        .with_trace(crate::http_trace::current_carrier());
    if let Some((names, attempts)) = verify {
        new = new.with_verify(names, Some(attempts));
    }
    let s = q.submit(new).await.map_err(|e| store_error(&e))?;
    let status = if s.created {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    let body = json!({"run_id": s.run.id, "session": s.run.session, "status": s.run.status});
    Ok((status, Json(body)).into_response())
}

/// The run `id` of the caller, or 404 (another user's run is 404 too).
async fn owned(
    shared: &AppState,
    agent: &hame::HarnessAgent,
    user: Option<&str>,
    id: &str,
) -> Result<Run, ApiError> {
    let q = queue(shared)?;
    match q.get(id).await.map_err(|e| store_error(&e))? {
        Some(run) if run.is_owned_by(agent.name(), user) => Ok(run),
        _ => Err(ApiError::not_found("no such run")),
    }
}

/// `GET /v1/runs/{id}`.
#[utoipa::path(get, path = "/v1/runs/{run_id}", tag = "runs", params(RunPath),
    responses((status = 200, description = "The run", body = crate::schemas::RunView),
        (status = 501, description = "The server has no run queue", body = ErrorBody),))]
pub(crate) async fn get(
    State(shared): State<AppState>,
    Served { user, agent }: Served,
    Path(RunPath { run_id: id }): Path<RunPath>,
) -> Result<Response, ApiError> {
    let run = owned(&shared, &agent, user.as_deref(), &id).await?;
    Ok(Json(view(&run)).into_response())
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    limit: Option<usize>,
}

/// `GET /v1/sessions/{session}/runs?limit=N`: newest first.
#[utoipa::path(get, path = "/v1/sessions/{session}/runs", tag = "runs",
    params(SessionPath, ("limit" = Option<usize>, Query, description = "At most this many runs (default 50, at most 500)")),
    responses((status = 200, description = "The session's runs, newest first", body = crate::schemas::RunList),
        (status = 501, description = "The server has no run queue", body = ErrorBody),))]
pub(crate) async fn list(
    State(shared): State<AppState>,
    InSession { agent, ctx }: InSession,
    Query(lq): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let q = queue(&shared)?;
    let limit = lq.limit.unwrap_or(LIST_DEFAULT);
    if limit == 0 || limit > LIST_MAX {
        return Err(ApiError::bad_request(format!("limit is 1 to {LIST_MAX}")));
    }
    let runs = q
        .list(hame::state::runs::RunFilter::new(
            agent.name(),
            ctx.user_id.as_deref(),
            Some(&ctx.session_id),
            limit,
        ))
        .await
        .map_err(|e| store_error(&e))?;
    let runs: Vec<Value> = runs.iter().map(view).collect();
    Ok(Json(json!({"session": ctx.session_id, "runs": runs})).into_response())
}

/// `POST /v1/runs/{id}/cancel`: 202 (cancelled, or asked of the worker that runs it);
/// 409 for a run that has ended.
#[utoipa::path(post, path = "/v1/runs/{run_id}/cancel", tag = "runs", params(RunPath),
    responses((status = 202, description = "Cancelled, or asked of the worker that runs it", body = crate::schemas::RunView),
        (status = 501, description = "The server has no run queue", body = ErrorBody),))]
pub(crate) async fn cancel(
    State(shared): State<AppState>,
    Served { user, agent }: Served,
    Path(RunPath { run_id: id }): Path<RunPath>,
) -> Result<Response, ApiError> {
    let run = owned(&shared, &agent, user.as_deref(), &id).await?;
    let q = queue(&shared)?;
    match q.cancel(&run.id).await.map_err(|e| store_error(&e))? {
        CancelOutcome::Cancelled(r) | CancelOutcome::Requested(r) => {
            Ok((StatusCode::ACCEPTED, Json(view(&r))).into_response())
        }
        CancelOutcome::Finished(r) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "run_finished",
            format!("run {} has already ended ({})", r.id, r.status),
        )),
        CancelOutcome::NotFound => Err(ApiError::not_found("no such run")),
    }
}

/// The event id of a run's status, growing along its life across claims (takeovers and the
/// legs a decision resumes, which add one attempt each): `queued` 1 (never claimed),
/// `running` 3·attempts − 1, `waiting_approval` 3·attempts, an end 3·attempts + 1 (at
/// least 2: a queued run cancelled).
fn status_id(run: &Run) -> u64 {
    let three = run.attempts.saturating_mul(3);
    match run.status {
        RunStatus::Queued => 1,
        RunStatus::Running => three.saturating_sub(1).max(2),
        RunStatus::WaitingApproval => three.max(3),
        _ => three.saturating_add(1).max(2),
    }
}

/// `GET /v1/runs/{id}/events`: SSE of the run's status changes (`queued`, `running`, then
/// `waiting_approval` or its end: `completed`, `unverified`, `failed` or `cancelled`), each
/// with the run as data and an id that grows across claims ([`status_id`]); read from the
/// store, so any replica serves it and `Last-Event-ID` replays from there (also across a
/// decision's legs). The stream ends after the run's end or at `waiting_approval`.
#[utoipa::path(get, path = "/v1/runs/{run_id}/events", tag = "runs", params(RunPath),
    responses((status = 200, description = "SSE of the run's status changes (`queued`, `running`, then its end), with ids", content_type = "text/event-stream", body = crate::schemas::RunView),
        (status = 501, description = "The server has no run queue", body = ErrorBody),))]
pub(crate) async fn events(
    State(shared): State<AppState>,
    Served { user, agent }: Served,
    Path(RunPath { run_id: id }): Path<RunPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let first = owned(&shared, &agent, user.as_deref(), &id).await?;
    let q = queue(&shared)?.clone();
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let stop = shared.draining.clone();
    let stream = futures::stream::unfold(
        (first.id.clone(), Some(first), after, false),
        move |(id, next, sent, done)| {
            let (q, stop) = (q.clone(), stop.clone());
            async move {
                if done {
                    return None;
                }
                let mut run = next;
                loop {
                    if let Some(r) = &run {
                        let n = status_id(r);
                        if n > sent {
                            let ev = SseEvent::default()
                                .event(r.status.as_str())
                                .id(n.to_string())
                                .data(view(r).to_string());
                            return Some((ev, (id, None, n, r.status.is_finished())));
                        }
                        if r.status.is_finished() {
                            return None;
                        }
                    }
                    tokio::select! {
                        () = tokio::time::sleep(RUN_POLL) => {}
                        () = stop.cancelled() => return None,
                    }
                    run = match q.get(&id).await {
                        Ok(Some(r)) => Some(r),
                        Ok(None) => return None,
                        Err(e) => {
                            tracing::warn!(error = %e, "run events: reading the run failed");
                            run
                        }
                    };
                }
            }
        },
    )
    .map(Ok::<_, Infallible>);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(shared.options.keep_alive))
        .into_response())
}
