//! Remote subagents over A2A (the Agent2Agent protocol 0.3, JSON-RPC 2.0 over HTTP;
//! `docs/a2a.md`, ADR 0034): a spec with front-matter `a2a: <url>` is run by
//! [`A2aRunner`], which reads the remote agent's card, sends the task (`message/stream`
//! when the card says it streams, else `message/send`), forwards the remote task's status
//! and artifact updates into the child's events (`a2a.status`, `a2a.artifact`) and sends
//! `tasks/cancel` when the child is cancelled. Everything else — the task record, sync and
//! background spawns, the exactly-once push-back — is the manager's, as for a local child.

use async_trait::async_trait;

use crate::runner::{ChildReply, ChildRun, SubagentRunner};

/// The prefix every `a2a_auth_env` variable must have (`A2A_`): a spec is a workspace file
/// the agent itself can write, so it may name only variables meant for remote agents —
/// never the model's key or another secret of the process.
pub const AUTH_ENV_PREFIX: &str = "A2A_";
/// The A2A protocol version this client speaks.
pub const PROTOCOL_VERSION: &str = "0.3.0";
/// Where a remote agent's card is read under a base URL.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";
/// Largest agent card or JSON-RPC answer read, in bytes (4 MiB).
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// Largest reply text kept from a remote task's artifacts and messages, in bytes (1 MiB);
/// the rest is cut with a note.
pub const MAX_REPLY_BYTES: usize = 1024 * 1024;
/// How long connecting to a remote agent may take (10 s).
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often a task that is not finished is read again with `tasks/get` (500 ms).
pub const POLL_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
/// How long `tasks/cancel` may take when the child is cancelled (5 s).
pub const CANCEL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Checks the `a2a` URL of a spec: `http://` or `https://` with a host.
pub fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| format!("`a2a` must be an http:// or https:// URL, not `{url}`"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(format!("`a2a` has no host: `{url}`"));
    }
    Ok(())
}

/// The card URL of an `a2a` URL: the URL itself when it names a `.json` file, else the
/// base URL with [`CARD_PATH`] appended.
pub fn card_url(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    if path.ends_with(".json") {
        url.to_owned()
    } else {
        format!("{}{CARD_PATH}", path.trim_end_matches('/'))
    }
}

/// Runs remote subagents (the runner of every spec with `a2a`).
#[derive(Debug, Clone, Copy, Default)]
pub struct A2aRunner;

#[async_trait]
impl SubagentRunner for A2aRunner {
    async fn run(&self, run: ChildRun) -> Result<ChildReply, String> {
        #[cfg(feature = "a2a")]
        {
            client::run(run).await
        }
        #[cfg(not(feature = "a2a"))]
        {
            let _ = run;
            Err(
                "hame-subagent was built without the `a2a` feature: remote subagents are off"
                    .into(),
            )
        }
    }
}

/// The terminal state of a remote task and what it said.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tracker {
    /// The remote task id, once known.
    pub task_id: Option<String>,
    /// Its last state (`submitted`, `working`, `completed`, …).
    pub state: String,
    /// The text of its artifacts, in order of arrival (by artifact id).
    pub artifacts: Vec<(String, String)>,
    /// The text of its last status message.
    pub status_text: Option<String>,
    /// The text of a direct `Message` answer (no task).
    pub message_text: Option<String>,
}

/// The text of the parts of an A2A message or artifact: text parts as they are, data parts
/// as JSON; file parts are named, not read.
pub fn parts_text(parts: Option<&serde_json::Value>) -> String {
    let Some(parts) = parts.and_then(|p| p.as_array()) else {
        return String::new();
    };
    let mut out = Vec::new();
    for p in parts {
        match p.get("kind").and_then(|k| k.as_str()) {
            Some("text") => out.push(
                p.get("text")
                    .and_then(|t| t.as_str())
                    .unwrap_or_default()
                    .to_owned(),
            ),
            Some("data") => out.push(p.get("data").map(|d| d.to_string()).unwrap_or_default()),
            Some("file") => {
                let name = p
                    .pointer("/file/name")
                    .and_then(|n| n.as_str())
                    .unwrap_or("unnamed");
                out.push(format!("[file part `{name}` not read]"));
            }
            _ => {}
        }
    }
    out.join("\n")
}

/// Whether an A2A task state ends the task for hame: the terminal states and the
/// interrupted ones (`input-required`, `auth-required`), which hame does not answer.
pub fn is_final_state(state: &str) -> bool {
    matches!(
        state,
        "completed"
            | "canceled"
            | "failed"
            | "rejected"
            | "input-required"
            | "auth-required"
            | "unknown"
    )
}

impl Tracker {
    /// Takes in one result of `message/send`, `message/stream`, `tasks/get` or
    /// `tasks/cancel` (a `Task`, a `Message`, a `TaskStatusUpdateEvent` or a
    /// `TaskArtifactUpdateEvent`). Returns what changed, as `(kind, data)` of the event to
    /// forward, if anything.
    pub fn apply(
        &mut self,
        result: &serde_json::Value,
    ) -> Option<(&'static str, serde_json::Value)> {
        use serde_json::json;
        let kind = result.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        match kind {
            "task" => {
                if let Some(id) = result.get("id").and_then(|i| i.as_str()) {
                    self.task_id = Some(id.to_owned());
                }
                if let Some(artifacts) = result.get("artifacts").and_then(|a| a.as_array()) {
                    self.artifacts.clear();
                    for a in artifacts {
                        self.artifact(a, false);
                    }
                }
                self.status(result.get("status"))
            }
            "status-update" => {
                if self.task_id.is_none() {
                    self.task_id = result
                        .get("taskId")
                        .and_then(|i| i.as_str())
                        .map(str::to_owned);
                }
                self.status(result.get("status"))
            }
            "artifact-update" => {
                let artifact = result.get("artifact")?;
                let append = result
                    .get("append")
                    .and_then(|a| a.as_bool())
                    .unwrap_or(false);
                let text = self.artifact(artifact, append);
                Some((
                    "a2a.artifact",
                    json!({"task_id": self.task_id, "artifact_id": artifact.get("artifactId"), "text": text}),
                ))
            }
            "message" => {
                self.message_text = Some(parts_text(result.get("parts")));
                self.state = "completed".into();
                None
            }
            _ => None,
        }
    }

    fn status(
        &mut self,
        status: Option<&serde_json::Value>,
    ) -> Option<(&'static str, serde_json::Value)> {
        let status = status?;
        let state = status
            .get("state")
            .and_then(|s| s.as_str())
            .unwrap_or("unknown");
        let text = status
            .get("message")
            .map(|m| parts_text(m.get("parts")))
            .filter(|t| !t.is_empty());
        let changed = state != self.state || (text.is_some() && text != self.status_text);
        self.state = state.to_owned();
        if text.is_some() {
            self.status_text.clone_from(&text);
        }
        changed.then(|| {
            (
                "a2a.status",
                serde_json::json!({"task_id": self.task_id, "state": state, "message": text}),
            )
        })
    }

    /// Adds an artifact's text (or appends to it); returns the text added.
    fn artifact(&mut self, artifact: &serde_json::Value, append: bool) -> String {
        let id = artifact
            .get("artifactId")
            .and_then(|i| i.as_str())
            .unwrap_or_default()
            .to_owned();
        let text = parts_text(artifact.get("parts"));
        match self.artifacts.iter_mut().find(|(a, _)| *a == id) {
            Some((_, t)) if append => t.push_str(&text),
            Some((_, t)) => t.clone_from(&text),
            None => self.artifacts.push((id, text.clone())),
        }
        text
    }

    /// Whether the task has ended for hame ([`is_final_state`]).
    pub fn is_final(&self) -> bool {
        is_final_state(&self.state)
    }

    /// The child's reply, or why it failed, once the task has ended.
    pub fn outcome(&self) -> Result<String, String> {
        let artifacts: Vec<&str> = self
            .artifacts
            .iter()
            .map(|(_, t)| t.as_str())
            .filter(|t| !t.is_empty())
            .collect();
        let said = self
            .message_text
            .clone()
            .or_else(|| (!artifacts.is_empty()).then(|| artifacts.join("\n\n")))
            .or_else(|| self.status_text.clone())
            .unwrap_or_default();
        let said = cut(said);
        match self.state.as_str() {
            "completed" => Ok(said),
            "canceled" => Err("the remote agent cancelled its task".into()),
            "input-required" | "auth-required" => Err(format!(
                "the remote agent stopped with `{}` (hame does not answer a remote agent's questions): {said}",
                self.state
            )),
            state => Err(format!("the remote agent's task ended `{state}`: {said}")),
        }
    }
}

fn cut(mut text: String) -> String {
    if text.len() > MAX_REPLY_BYTES {
        let mut at = MAX_REPLY_BYTES;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
        text.push_str("\n[cut: the remote reply is over 1 MiB]");
    }
    text
}

#[cfg(feature = "a2a")]
mod client {
    use std::sync::LazyLock;

    use futures::StreamExt;
    use hame_core::AgentEvent;
    use serde_json::{Value, json};

    use super::{CANCEL_TIMEOUT, CONNECT_TIMEOUT, MAX_ANSWER_BYTES, POLL_EVERY, Tracker, card_url};
    use crate::runner::{ChildReply, ChildRun};

    static HTTP: LazyLock<Result<reqwest::Client, String>> = LazyLock::new(|| {
        reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("hame/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))
    });

    /// One remote agent: its JSON-RPC endpoint, whether it streams, the auth header.
    struct Remote {
        http: reqwest::Client,
        endpoint: String,
        streaming: bool,
        auth: Option<reqwest::header::HeaderValue>,
        name: String,
    }

    pub(super) async fn run(run: ChildRun) -> Result<ChildReply, String> {
        let http = HTTP.as_ref().map_err(Clone::clone)?.clone();
        let url = run
            .spec
            .a2a
            .clone()
            .ok_or_else(|| "the spec names no remote agent (`a2a`)".to_owned())?;
        let auth = match &run.spec.a2a_auth_env {
            Some(name) => {
                let value = run.env.get(name).ok_or_else(|| {
                    format!("the environment variable `{name}` (`a2a_auth_env`) is not set")
                })?;
                let mut v = reqwest::header::HeaderValue::from_str(value.trim()).map_err(|_| {
                    format!("the environment variable `{name}` does not hold a valid header value")
                })?;
                v.set_sensitive(true);
                // A remote that echoes it (an error text, a reply) must not carry it into
                // the parent's conversation, log or a tenant's answer: the loop redacts it.
                hame_core::secrets::add_authorization(value.trim());
                Some(v)
            }
            None => None,
        };
        let remote = tokio::select! {
            r = Remote::discover(http, &url, auth) => r?,
            () = run.cancel.cancelled() => return Err("cancelled before the remote agent answered".into()),
        };
        let message = json!({
            "kind": "message",
            "messageId": uuid::Uuid::new_v4().to_string(),
            "role": "user",
            "parts": [{"kind": "text", "text": run.message}],
            "contextId": run.runtime.session_id,
        });
        let params = json!({
            "message": message,
            "configuration": {"blocking": true, "acceptedOutputModes": ["text/plain"]},
        });
        let mut tracker = Tracker::default();
        let sent = if remote.streaming {
            remote.stream(&params, &mut tracker, &run).await
        } else {
            tokio::select! {
                r = remote.call("message/send", &params) => r.map(|result| remote.take(&mut tracker, &result, &run)),
                () = run.cancel.cancelled() => Err(Stop::Cancelled),
            }
        };
        let polled = match sent {
            Ok(()) => remote.poll(&mut tracker, &run).await,
            Err(e) => Err(e),
        };
        match polled {
            Ok(()) => tracker.outcome().map(|text| ChildReply {
                text,
                iterations: 1,
                usage: hame_core::Usage::default(),
            }),
            Err(Stop::Cancelled) => {
                remote.cancel(&tracker).await;
                Err("cancelled; `tasks/cancel` was sent to the remote agent".into())
            }
            Err(Stop::Failed(e)) => Err(e),
        }
    }

    enum Stop {
        Cancelled,
        Failed(String),
    }

    impl From<String> for Stop {
        fn from(e: String) -> Self {
            Stop::Failed(e)
        }
    }

    /// The body of `response`, at most [`MAX_ANSWER_BYTES`].
    async fn read_capped(response: reqwest::Response, what: &str) -> Result<Vec<u8>, String> {
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| format!("reading {what}: {}", e.without_url()))?;
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(format!("{what} is over the {MAX_ANSWER_BYTES}-byte limit"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    fn origin(url: &reqwest::Url) -> String {
        url.origin().ascii_serialization()
    }

    impl Remote {
        /// Reads the card at (or under) `url`.
        async fn discover(
            http: reqwest::Client,
            url: &str,
            auth: Option<reqwest::header::HeaderValue>,
        ) -> Result<Self, String> {
            let card_at = card_url(url);
            let card_url = reqwest::Url::parse(&card_at)
                .map_err(|e| format!("the agent card URL `{card_at}` is not valid: {e}"))?;
            let mut req = http
                .get(card_url.clone())
                .header("accept", "application/json");
            if let Some(a) = &auth {
                req = req.header(reqwest::header::AUTHORIZATION, a.clone());
            }
            let resp = req.send().await.map_err(|e| {
                format!(
                    "cannot read the agent card at {card_at}: {}",
                    e.without_url()
                )
            })?;
            let status = resp.status();
            let body = read_capped(resp, "the agent card").await?;
            if !status.is_success() {
                return Err(format!(
                    "reading the agent card at {card_at} answered HTTP {status}"
                ));
            }
            let card: Value = serde_json::from_slice(&body)
                .map_err(|e| format!("the agent card at {card_at} is not JSON: {e}"))?;
            let endpoint = card
                .get("url")
                .and_then(|u| u.as_str())
                .ok_or_else(|| format!("the agent card at {card_at} has no `url`"))?;
            let endpoint_url = card_url
                .join(endpoint)
                .map_err(|e| format!("the agent card's `url` `{endpoint}` is not valid: {e}"))?;
            if !matches!(endpoint_url.scheme(), "http" | "https") {
                return Err(format!(
                    "the agent card's `url` `{endpoint}` is not http(s)"
                ));
            }
            if auth.is_some() && origin(&endpoint_url) != origin(&card_url) {
                return Err(format!(
                    "the agent card at {card_at} sends requests to another origin ({}); hame sends the `a2a_auth_env` header only to the card's own origin",
                    origin(&endpoint_url)
                ));
            }
            if let Some(t) = card.get("preferredTransport").and_then(|t| t.as_str())
                && !t.eq_ignore_ascii_case("JSONRPC")
            {
                let jsonrpc = card
                    .get("additionalInterfaces")
                    .and_then(|a| a.as_array())
                    .is_some_and(|a| {
                        a.iter()
                            .any(|i| i.get("transport").and_then(|t| t.as_str()) == Some("JSONRPC"))
                    });
                if !jsonrpc {
                    return Err(format!(
                        "the remote agent speaks `{t}`; hame speaks A2A over JSON-RPC only"
                    ));
                }
            }
            Ok(Remote {
                http,
                endpoint: endpoint_url.to_string(),
                streaming: card
                    .pointer("/capabilities/streaming")
                    .and_then(|s| s.as_bool())
                    .unwrap_or(false),
                auth,
                name: card
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or("remote agent")
                    .to_owned(),
            })
        }

        fn post(&self, method: &str, params: &Value, sse: bool) -> reqwest::RequestBuilder {
            let body = json!({
                "jsonrpc": "2.0",
                "id": uuid::Uuid::new_v4().to_string(),
                "method": method,
                "params": params,
            });
            let mut req = self
                .http
                .post(&self.endpoint)
                .header(
                    "accept",
                    if sse {
                        "text/event-stream"
                    } else {
                        "application/json"
                    },
                )
                .json(&body);
            if let Some(a) = &self.auth {
                req = req.header(reqwest::header::AUTHORIZATION, a.clone());
            }
            req
        }

        /// The `result` of a JSON-RPC response, or its error as text.
        fn result(&self, method: &str, answer: Value) -> Result<Value, String> {
            if let Some(err) = answer.get("error") {
                let code = err.get("code").and_then(|c| c.as_i64()).unwrap_or(0);
                let message = err.get("message").and_then(|m| m.as_str()).unwrap_or("");
                return Err(format!(
                    "the remote agent `{}` answered {method} with error {code}: {message}",
                    self.name
                ));
            }
            answer
                .get("result")
                .cloned()
                .ok_or_else(|| format!("the remote agent's answer to {method} has no `result`"))
        }

        /// One JSON-RPC call.
        async fn call(&self, method: &str, params: &Value) -> Result<Value, Stop> {
            let resp =
                self.post(method, params, false).send().await.map_err(|e| {
                    format!("{method} to the remote agent failed: {}", e.without_url())
                })?;
            let status = resp.status();
            let body = read_capped(resp, "the remote agent's answer").await?;
            let answer: Value = serde_json::from_slice(&body).map_err(|_| {
                format!(
                    "the remote agent answered {method} with HTTP {status} and no JSON-RPC response"
                )
            })?;
            Ok(self.result(method, answer)?)
        }

        /// Takes in a result, forwarding what changed into the child's events.
        fn take(&self, tracker: &mut Tracker, result: &Value, run: &ChildRun) {
            if let Some((kind, data)) = tracker.apply(result) {
                run.events.emit(AgentEvent::Custom {
                    kind: kind.into(),
                    data,
                });
            }
        }

        /// `message/stream`: reads the SSE answer until the task ends or the stream does.
        async fn stream(
            &self,
            params: &Value,
            tracker: &mut Tracker,
            run: &ChildRun,
        ) -> Result<(), Stop> {
            let resp = tokio::select! {
                r = self.post("message/stream", params, true).send() => r.map_err(|e| format!("message/stream to the remote agent failed: {}", e.without_url()))?,
                () = run.cancel.cancelled() => return Err(Stop::Cancelled),
            };
            let is_sse = resp
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            if !is_sse {
                let status = resp.status();
                let body = read_capped(resp, "the remote agent's answer").await?;
                let answer: Value = serde_json::from_slice(&body).map_err(|_| {
                    format!("the remote agent answered message/stream with HTTP {status} and no event stream")
                })?;
                let result = self.result("message/stream", answer)?;
                self.take(tracker, &result, run);
                return Ok(());
            }
            use eventsource_stream::Eventsource;
            let mut events = resp.bytes_stream().eventsource();
            let mut read = 0usize;
            loop {
                let next = tokio::select! {
                    n = events.next() => n,
                    () = run.cancel.cancelled() => return Err(Stop::Cancelled),
                };
                let Some(event) = next else { return Ok(()) };
                let event =
                    event.map_err(|e| format!("the remote agent's event stream broke: {e}"))?;
                read += event.data.len();
                if read > 16 * MAX_ANSWER_BYTES {
                    return Err(Stop::Failed(
                        "the remote agent's event stream is over 64 MiB".into(),
                    ));
                }
                if event.data.trim().is_empty() {
                    continue;
                }
                let answer: Value = serde_json::from_str(&event.data)
                    .map_err(|e| format!("an event of the remote agent is not JSON: {e}"))?;
                let result = self.result("message/stream", answer)?;
                self.take(tracker, &result, run);
                if tracker.is_final() || tracker.message_text.is_some() {
                    return Ok(());
                }
            }
        }

        /// Reads the task with `tasks/get` until it ends (a server that does not block, or
        /// a stream that ended early).
        async fn poll(&self, tracker: &mut Tracker, run: &ChildRun) -> Result<(), Stop> {
            while !tracker.is_final() {
                let Some(id) = tracker.task_id.clone() else {
                    return Err(Stop::Failed(
                        "the remote agent ended its answer without a task or a message".into(),
                    ));
                };
                tokio::select! {
                    () = tokio::time::sleep(POLL_EVERY) => {}
                    () = run.cancel.cancelled() => return Err(Stop::Cancelled),
                }
                let params = json!({"id": id});
                let result = tokio::select! {
                    r = self.call("tasks/get", &params) => r?,
                    () = run.cancel.cancelled() => return Err(Stop::Cancelled),
                };
                self.take(tracker, &result, run);
            }
            Ok(())
        }

        /// `tasks/cancel` for the remote task, bounded; failures are logged.
        async fn cancel(&self, tracker: &Tracker) {
            let Some(id) = &tracker.task_id else { return };
            match tokio::time::timeout(
                CANCEL_TIMEOUT,
                self.call("tasks/cancel", &json!({"id": id})),
            )
            .await
            {
                Ok(Ok(_)) => tracing::debug!(task = %id, "remote task cancelled"),
                Ok(Err(Stop::Failed(e))) => {
                    tracing::warn!(task = %id, error = %e, "tasks/cancel failed")
                }
                Ok(Err(Stop::Cancelled)) => {}
                Err(_) => tracing::warn!(task = %id, "tasks/cancel took too long"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn card_urls() {
        assert_eq!(
            card_url("https://h/a2a/x"),
            "https://h/a2a/x/.well-known/agent-card.json"
        );
        assert_eq!(
            card_url("http://h:1/"),
            "http://h:1/.well-known/agent-card.json"
        );
        assert_eq!(
            card_url("http://h/.well-known/agent-card.json"),
            "http://h/.well-known/agent-card.json"
        );
        assert!(check_url("http://h").is_ok());
        assert!(check_url("h/x").is_err());
        assert!(check_url("https:///x").is_err());
    }

    #[test]
    fn a_stream_of_updates_makes_a_reply() {
        let mut t = Tracker::default();
        let ev = t.apply(&json!({"kind": "task", "id": "t1", "contextId": "c", "status": {"state": "submitted"}}));
        assert_eq!(ev.map(|e| e.0), Some("a2a.status"));
        assert!(!t.is_final());
        let ev = t.apply(&json!({"kind": "status-update", "taskId": "t1", "contextId": "c", "status": {"state": "working"}, "final": false}));
        assert_eq!(ev.map(|e| e.1["state"].clone()), Some(json!("working")));
        t.apply(&json!({"kind": "artifact-update", "taskId": "t1", "contextId": "c", "artifact": {"artifactId": "a", "parts": [{"kind": "text", "text": "hel"}]}}));
        t.apply(&json!({"kind": "artifact-update", "taskId": "t1", "contextId": "c", "append": true, "artifact": {"artifactId": "a", "parts": [{"kind": "text", "text": "lo"}]}}));
        t.apply(&json!({"kind": "status-update", "taskId": "t1", "contextId": "c", "status": {"state": "completed"}, "final": true}));
        assert!(t.is_final());
        assert_eq!(t.outcome(), Ok("hello".to_owned()));
        assert_eq!(t.task_id.as_deref(), Some("t1"));
    }

    #[test]
    fn failures_and_messages() {
        let mut t = Tracker::default();
        t.apply(&json!({"kind": "task", "id": "t", "contextId": "c", "status": {"state": "failed", "message": {"kind": "message", "role": "agent", "messageId": "m", "parts": [{"kind": "text", "text": "boom"}]}}}));
        assert_eq!(
            t.outcome(),
            Err("the remote agent's task ended `failed`: boom".to_owned())
        );
        let mut t = Tracker::default();
        t.apply(&json!({"kind": "message", "role": "agent", "messageId": "m", "parts": [{"kind": "text", "text": "hi"}, {"kind": "data", "data": {"a": 1}}]}));
        assert_eq!(t.outcome(), Ok("hi\n{\"a\":1}".to_owned()));
        let mut t = Tracker::default();
        t.apply(
            &json!({"kind": "task", "id": "t", "contextId": "c", "status": {"state": "canceled"}}),
        );
        assert!(t.outcome().is_err_and(|e| e.contains("cancelled")));
    }
}
