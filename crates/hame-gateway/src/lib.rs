//! The HTTP gateway of hame: what `hame serve` runs.
//!
//! It serves a [`HarnessAgent`] (and, through the OpenAI routes, more:
//! [`Gateway::with_agents`]) — the only engine: state backends, store mode, subagents,
//! approvals and the sandbox work as they do for `hame run` — to many users and sessions:
//!
//! - `POST /v1/sessions/{session}/messages` `{"message"}`: a turn, answered as JSON
//!   `{"reply", "session", "user", "usage", "iterations"}` or, with
//!   `Accept: text/event-stream`, as SSE events `text_delta`, `tool_started`,
//!   `tool_finished`, `approval_needed`, `finished`, `failed`, each with an `id:`;
//! - `GET /v1/sessions/{session}/events?after=ID` (or `Last-Event-ID`): replay from the
//!   session's bounded ring (in Redis with [`GatewayOptions::shared_events`], so any
//!   replica replays any replica's events);
//! - `GET /v1/sessions`, `GET /v1/sessions/{session}/messages`, `…/tasks`,
//!   `POST …/approvals/{id}` `{"decision": "approve"|"deny"}`, `GET /v1/memory`;
//! - `POST /v1/chat/completions`, `POST /v1/responses`, `GET /v1/models` (OpenAI-compatible;
//!   `model` is the agent id; every field honoured or refused with 400 naming it; client
//!   tools, history, system messages, structured output and inline images — `data:` URLs
//!   only, hame never fetches a URL (ADR 0040): `docs/openai-compat.md`);
//! - durable runs ([`GatewayOptions::runs`]): `POST /v1/sessions/{session}/runs`,
//!   `GET /v1/runs/{run_id}`, `POST /v1/runs/{run_id}/cancel`, `GET /v1/runs/{run_id}/events`,
//!   `GET /v1/sessions/{session}/runs`, executed by a [`Worker`] in this or any other
//!   process on the same state store (`docs/replicas.md`);
//! - with [`GatewayOptions::a2a`]: every agent as an A2A 0.3 agent (cards at
//!   `/.well-known/agent-card.json` and `/a2a/{agent}/.well-known/agent-card.json`,
//!   JSON-RPC `message/send`, `message/stream`, `tasks/get`, `tasks/cancel` at `/a2a` and
//!   `/a2a/{agent}`; tasks are runs; `docs/a2a.md`);
//! - `GET /healthz`, `GET /metrics` (Prometheus text), and a web console at `/`.
//!
//! Turns of one (agent, user, session) run one at a time in arrival order behind a gate
//! with a bounded queue (429 + `Retry-After` past it); different sessions run in parallel.
//! With [`Auth`] every request but `/healthz` needs `Authorization: Bearer <token>` and the
//! token decides the user; without it the user comes from an optional `X-Hame-User` header.
//! Every error, on every route, is in OpenAI's shape `{"error": {"message", "type", "param",
//! "code"}}`. Every default and limit is in `docs/gateway.md`.
//!
//! Who should depend on it: a binary that serves an agent over HTTP (the `hame` CLI).
//! Features `redis`, `postgres`, `mysql`: [`SharedEvents`] on that store, the sessions'
//! events shared between replicas (without one, [`SharedEvents::connect`] names the
//! feature to enable).
//!
//! ```no_run
//! # async fn demo(agent: hame::HarnessAgent) -> Result<(), Box<dyn std::error::Error>> {
//! use hame_gateway::{Gateway, GatewayOptions};
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! let gateway = Gateway::new(agent, hame::RuntimeContext::new("default"), GatewayOptions::default());
//! gateway.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use hame::{CancellationToken, HarnessAgent, RuntimeContext};
use tokio_util::task::TaskTracker;

mod a2a;
mod auth;
mod console;
mod error;
mod events;
mod files;
mod gate;
mod http_trace;
mod mcp;
mod metrics;
mod oai_request;
mod openai;
mod openapi;
mod replay;
mod responses;
mod routes;
mod runs;
mod schemas;
mod server;
mod shared_events;
mod turn;
mod worker;

pub use a2a::{CARD_PATH as A2A_CARD_PATH, PROTOCOL_VERSION as A2A_PROTOCOL_VERSION};
pub use auth::{Auth, Grant};
pub use error::{Error, Result};
pub use mcp::{ASK_TOOL, MAX_ASK_BYTES};
pub use shared_events::SharedEvents;
pub use worker::{PURGE_BATCH, PURGE_EVERY, Worker, WorkerOptions, resume_claimed};

/// Settings of a [`Gateway`]; `Default` gives the documented defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GatewayOptions {
    /// Bearer tokens; `None`: no authentication (loopback only, enforced by the CLI).
    pub auth: Option<Auth>,
    /// Turns that may wait behind the running turn of one session (default 16); one more
    /// is answered 429.
    pub queue_bound: usize,
    /// The `Retry-After` of a 429, in seconds (default 1).
    pub retry_after_secs: u64,
    /// Largest request body in bytes (default 1 MiB), but for uploads.
    pub body_limit: usize,
    /// Largest file `PUT /v1/sessions/{session}/files/{path}` takes, in bytes (default
    /// 32 MiB; one more byte is 413). The body is held in memory until it is written.
    pub upload_limit: usize,
    /// How long a request may take until its response starts (default 600 s; a turn
    /// answered as JSON waits for its reply within it; an SSE response starts at once).
    pub request_timeout: Duration,
    /// How long a connection may take to send a request's headers, counted from when the
    /// server waits for them (default 10 s); past it the connection is closed.
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive whole after its headers (default
    /// 30 s); past it the answer is 408 `body_timeout` and the connection is closed.
    pub body_timeout: Duration,
    /// Connections open at once (default 1,024); past it new connections wait to be
    /// accepted until one closes.
    pub max_connections: usize,
    /// Events kept per session for replay (default 1,000).
    pub ring_size: usize,
    /// SSE keep-alive comment interval (default 15 s).
    pub keep_alive: Duration,
    /// After the shutdown signal, how long in-flight turns may take before they are
    /// cancelled (default 30 s).
    pub drain_timeout: Duration,
    /// How long after its turn ended a request's retries are answered from it instead of
    /// starting another turn (default 300 s; see the `Idempotency-Key` and
    /// `x-stainless-retry-count` rules in `docs/gateway.md`).
    pub replay_window: Duration,
    /// Requests remembered for their retries at most (default 10,000; the oldest go first).
    pub replay_entries: usize,
    /// Also serve the agent as an MCP server over streamable HTTP at `/mcp` (ADR 0029;
    /// default false).
    pub mcp: bool,
    /// Also serve every agent as an A2A agent (ADR 0034, `docs/a2a.md`): the cards at
    /// `/.well-known/agent-card.json` and `/a2a/{agent}/.well-known/agent-card.json`, the
    /// JSON-RPC endpoints `/a2a` and `/a2a/{agent}`; tasks are runs of
    /// [`runs`](Self::runs), and the in-process [`worker`](Self::worker) drains every served
    /// agent's (default false).
    pub a2a: bool,
    /// Where events are shared between replicas (Redis, PostgreSQL or MySQL); `None` (the
    /// default): in this process only.
    pub shared_events: Option<SharedEvents>,
    /// The run queue of the `/v1/…/runs` routes; `None` (the default): those routes answer
    /// 501 `runs_unavailable`.
    pub runs: Option<Arc<dyn hame::state::runs::RunQueue>>,
    /// A worker that drains [`runs`](Self::runs) in this process (`hame serve` without
    /// `--no-worker`); `None` (the default): runs wait for a `hame worker`.
    pub worker: Option<WorkerOptions>,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            auth: None,
            queue_bound: 16,
            retry_after_secs: 1,
            body_limit: 1024 * 1024,
            upload_limit: 32 * 1024 * 1024,
            request_timeout: Duration::from_secs(600),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 1024,
            ring_size: 1000,
            keep_alive: Duration::from_secs(15),
            drain_timeout: Duration::from_secs(30),
            replay_window: Duration::from_secs(300),
            replay_entries: 10_000,
            mcp: false,
            a2a: false,
            shared_events: None,
            runs: None,
            worker: None,
        }
    }
}

impl GatewayOptions {
    /// With bearer tokens.
    pub fn with_auth(mut self, auth: Option<Auth>) -> Self {
        self.auth = auth;
        self
    }

    /// With a queue bound per session.
    pub fn with_queue_bound(mut self, n: usize) -> Self {
        self.queue_bound = n;
        self
    }

    /// With a request body limit ([`GatewayOptions::body_limit`]).
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// With an upload limit ([`GatewayOptions::upload_limit`]).
    pub fn with_upload_limit(mut self, bytes: usize) -> Self {
        self.upload_limit = bytes;
        self
    }

    /// With a drain timeout.
    pub fn with_drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }

    /// With a header timeout ([`GatewayOptions::header_timeout`]).
    pub fn with_header_timeout(mut self, d: Duration) -> Self {
        self.header_timeout = d;
        self
    }

    /// With a body timeout ([`GatewayOptions::body_timeout`]).
    pub fn with_body_timeout(mut self, d: Duration) -> Self {
        self.body_timeout = d;
        self
    }

    /// With a connection limit ([`GatewayOptions::max_connections`]).
    pub fn with_max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Also serves MCP at `/mcp` ([`GatewayOptions::mcp`]).
    pub fn with_mcp(mut self, on: bool) -> Self {
        self.mcp = on;
        self
    }

    /// Also serves A2A ([`GatewayOptions::a2a`]).
    pub fn with_a2a(mut self, on: bool) -> Self {
        self.a2a = on;
        self
    }

    /// With a run queue, and a worker draining it in this process unless `worker` is
    /// `None`.
    pub fn with_runs(
        mut self,
        queue: Option<Arc<dyn hame::state::runs::RunQueue>>,
        worker: Option<WorkerOptions>,
    ) -> Self {
        self.runs = queue;
        self.worker = worker;
        self
    }

    /// Shares the sessions' events between replicas through a shared store.
    pub fn with_shared_events(mut self, events: Option<SharedEvents>) -> Self {
        self.shared_events = events;
        self
    }
}

impl Shared {
    /// Every served agent, the default first.
    pub(crate) fn agents(&self) -> impl Iterator<Item = &HarnessAgent> {
        std::iter::once(&self.agent).chain(&self.others)
    }

    /// Publishes an event: in the shared store first when there is one (it gives the id;
    /// if it cannot be reached, the event gets a local id and a warning), then in this
    /// process's ring.
    pub(crate) async fn publish(
        &self,
        key: &str,
        name: &'static str,
        data: String,
        terminal: bool,
    ) -> Arc<events::Event> {
        // What callers read back: without secrets or model endpoints (ADR 0023).
        let data = match hame::secrets::redact_for_callers(&data) {
            std::borrow::Cow::Borrowed(_) => data,
            std::borrow::Cow::Owned(clean) => clean,
        };
        if let Some(shared) = &self.options.shared_events {
            match shared
                .publish(key, name, &data, terminal, self.hub.ring_size())
                .await
            {
                Ok(id) => return self.hub.publish_as(key, Some(id), name, data, terminal),
                Err(e) => {
                    tracing::warn!(error = %e, "shared events: publishing failed; the event is kept in this process only");
                }
            }
        }
        self.hub.publish(key, name, data, terminal)
    }

    /// The session's events after `after` from the shared store; `None` without one (or
    /// when it cannot be reached: the caller replays this process's ring).
    pub(crate) async fn shared_replay(
        &self,
        key: &str,
        after: u64,
    ) -> Option<Vec<Arc<events::Event>>> {
        if let Some(shared) = &self.options.shared_events {
            match shared.replay(key, after).await {
                Ok(events) => return Some(events),
                Err(e) => {
                    tracing::warn!(error = %e, "shared events: replay failed; replaying this process's events")
                }
            }
        }
        None
    }
}

/// What the routes share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The default agent: the session routes' and the one `GET /metrics` names.
    pub(crate) agent: HarnessAgent,
    /// The other agents of the OpenAI routes (`model` picks one), by id.
    pub(crate) others: Vec<HarnessAgent>,
    /// The context every turn starts from (its extras, e.g. plan mode); session and user
    /// are the request's.
    pub(crate) base: RuntimeContext,
    pub(crate) options: GatewayOptions,
    pub(crate) gates: gate::Gates,
    pub(crate) hub: events::Hub,
    /// Requests whose retries are answered from their first attempt.
    pub(crate) replays: replay::Replays,
    pub(crate) metrics: metrics::Metrics,
    /// The turns' tasks, waited for when draining.
    pub(crate) turns: TaskTracker,
    /// Cancelled when the shutdown signal arrives: no new turns, followers end.
    pub(crate) draining: CancellationToken,
    /// Parent of every turn's token: cancelled when the drain times out.
    pub(crate) cancel: CancellationToken,
    /// When the gateway was made (Unix seconds): the `created` of `GET /v1/models`.
    pub(crate) started: i64,
}

/// The HTTP gateway of one agent.
#[derive(Debug, Clone)]
pub struct Gateway {
    shared: Arc<Shared>,
}

impl Gateway {
    /// A gateway serving `agent`; each turn's context is `base` with the request's session
    /// and user.
    pub fn new(agent: HarnessAgent, base: RuntimeContext, options: GatewayOptions) -> Self {
        let shared = Shared {
            agent,
            others: Vec::new(),
            base,
            gates: gate::Gates::new(options.queue_bound),
            hub: events::Hub::new(options.ring_size),
            replays: replay::Replays::new(options.replay_window, options.replay_entries),
            metrics: metrics::Metrics::default(),
            turns: TaskTracker::new(),
            draining: CancellationToken::new(),
            cancel: CancellationToken::new(),
            started: chrono::Utc::now().timestamp(),
            options,
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Serves `others` too: the OpenAI-compatible routes pick an agent by `model`
    /// (`GET /v1/models` lists them all), the routes under `/v1/agents/{agent}/` by their
    /// path; the routes without it serve the default one. Refused when two agents share an
    /// id, when a token of [`GatewayOptions::auth`] is limited to an agent not served, or
    /// once the gateway is shared (cloned or serving).
    pub fn with_agents(mut self, others: Vec<HarnessAgent>) -> Result<Self> {
        let Some(shared) = Arc::get_mut(&mut self.shared) else {
            return Err(Error::Config(
                "agents are added before the gateway is cloned or served".into(),
            ));
        };
        for a in others {
            if a.name() == shared.agent.name() || shared.others.iter().any(|o| o.name() == a.name())
            {
                return Err(Error::Config(format!(
                    "two agents are named `{}`: give each served agent its own id",
                    a.name()
                )));
            }
            shared.others.push(a);
        }
        if let Some(auth) = &shared.options.auth
            && let Some(unknown) = auth
                .agent_ids()
                .find(|id| !shared.agents().any(|a| a.name() == *id))
        {
            return Err(Error::Config(format!(
                "a token of the auth file is limited to the agent `{unknown}`, which this server does not serve"
            )));
        }
        Ok(self)
    }

    /// The routes, with the body-timeout, body-limit, timeout and trace layers (no CORS).
    /// The header timeout and the connection limit are the server's ([`Gateway::serve`]).
    pub fn router(&self) -> Router {
        use tower_http::timeout::TimeoutLayer;
        let o = &self.shared.options;
        let mut app = routes::router(self.shared.clone());
        if o.mcp {
            app = app.merge(mcp::router(self.shared.clone()));
        }
        if o.a2a {
            app = app.merge(a2a::router(self.shared.clone()));
        }
        app.layer(axum::extract::DefaultBodyLimit::disable())
            .layer(axum::middleware::from_fn_with_state(
                o.body_timeout,
                server::read_body_within,
            ))
            .layer(axum::middleware::from_fn_with_state(
                server::BodyLimits {
                    body: o.body_limit,
                    upload: o.upload_limit,
                },
                server::limit_body,
            ))
            .layer(TimeoutLayer::with_status_code(
                StatusCode::REQUEST_TIMEOUT,
                o.request_timeout,
            ))
            .layer(axum::middleware::from_fn(error::json_errors))
            .layer(http_trace::layer())
    }

    /// Serves the agent as an MCP server on this process's stdin and stdout until the
    /// client closes them (ADR 0029): one tool, `ask`, whose turns run as `user`. Turns
    /// still running then are cancelled after [`GatewayOptions::drain_timeout`].
    pub async fn serve_mcp_stdio(self, user: Option<String>) -> Result<()> {
        use rmcp::ServiceExt;
        let server = mcp::McpServer {
            shared: self.shared.clone(),
            user,
        };
        let io = |e: std::io::Error| Error::Io {
            context: "serving MCP on stdio".into(),
            source: e,
        };
        let running = server
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| io(std::io::Error::other(e.to_string())))?;
        let ended = running.waiting().await;
        if let Err(e) = ended {
            tracing::warn!(error = %e, "the MCP stdio session ended with an error");
        }
        let shared = &self.shared;
        shared.draining.cancel();
        shared.turns.close();
        if tokio::time::timeout(shared.options.drain_timeout, shared.turns.wait())
            .await
            .is_err()
        {
            shared.cancel.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), shared.turns.wait()).await;
        }
        Ok(())
    }

    /// Serves on `listener` (HTTP/1.1, with the header timeout and the connection limit of
    /// the options) until `shutdown` completes; then stops accepting, lets in-flight turns
    /// finish (up to [`GatewayOptions::drain_timeout`], then cancels them: what joined
    /// their conversations is saved) and returns.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let shared = self.shared.clone();
        let app = self.router();
        let draining = shared.draining.clone();
        {
            let draining = draining.clone();
            tokio::spawn(async move {
                shutdown.await;
                tracing::info!("shutting down: no new connections, draining turns");
                draining.cancel();
            });
        }
        let limits = server::Limits {
            header_timeout: shared.options.header_timeout,
            max_connections: shared.options.max_connections,
        };
        // Background subagent tasks become runs (workers of any replica run them), also on
        // an API-only replica.
        if let Some(queue) = &shared.options.runs {
            for agent in shared.agents() {
                agent.use_run_queue(queue.clone());
            }
        }
        // A worker per served agent: a run is claimed by its agent's worker.
        let mut workers = Vec::new();
        if let (Some(queue), Some(options)) = (&shared.options.runs, &shared.options.worker) {
            for agent in shared.agents() {
                let w = Worker::new(
                    agent.clone(),
                    shared.base.clone(),
                    queue.clone(),
                    options.clone(),
                );
                let (stop, abort) = (draining.clone(), shared.cancel.clone());
                workers.push(tokio::spawn(async move { w.run(stop, abort).await }));
            }
        }
        let server = {
            let stop = draining.clone();
            async move {
                server::serve(listener, app, limits, stop)
                    .await
                    .map_err(|source| Error::Io {
                        context: "serving HTTP".into(),
                        source,
                    })
            }
        };
        tokio::pin!(server);
        // Until the signal, the server runs alone; after it, for at most the drain time.
        let result = tokio::select! {
            r = &mut server => Some(r),
            _ = draining.cancelled() => None,
        };
        let result = match result {
            Some(r) => r,
            None => {
                let limit = shared.options.drain_timeout;
                shared.turns.close();
                let drained = tokio::time::timeout(limit, async {
                    shared.turns.wait().await;
                    for w in workers {
                        let _ = w.await;
                    }
                    (&mut server).await
                })
                .await;
                match drained {
                    Ok(r) => r,
                    Err(_) => {
                        tracing::warn!(
                            seconds = limit.as_secs(),
                            "turns still running after the drain timeout; cancelling them"
                        );
                        shared.cancel.cancel();
                        let _ =
                            tokio::time::timeout(Duration::from_secs(5), shared.turns.wait()).await;
                        Ok(())
                    }
                }
            }
        };
        for agent in std::iter::once(&shared.agent).chain(&shared.others) {
            if !agent
                .wait_background(hame::harness::memory::DEFAULT_BACKGROUND_WAIT)
                .await
            {
                tracing::warn!(agent = %agent.name(), "background memory work did not finish; the next call redoes it");
            }
        }
        result
    }
}
