//! One connection to an MCP server.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::sync::Mutex;

use crate::bounded::TOO_LARGE_MARK;
use crate::names::{Named, qualified_name};
use crate::result::{CallResult, render_result};
use crate::stdio::StdioTransport;
use crate::{DEFAULT_CALL_TIMEOUT, DEFAULT_STARTUP_TIMEOUT, Error, Result};

/// A server to connect to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerConfig {
    /// Its name (the `<server>` of `mcp__<server>__<tool>`).
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
}

/// How a server is reached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Transport {
    /// A child process speaking JSON-RPC on its stdin/stdout. It inherits hame's
    /// environment plus `env`, runs in its own process group and is killed when the
    /// connection is dropped; its stderr goes to the log (`tracing`, target
    /// `hame_mcp::stderr`).
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Extra environment variables.
        env: BTreeMap<String, String>,
        /// Its working directory (default: hame's).
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP endpoint (feature `http`).
    Http {
        /// The endpoint URL.
        url: String,
        /// Headers sent with every request (`Authorization: Bearer …` included).
        headers: BTreeMap<String, String>,
    },
}

/// Timeouts of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientOptions {
    /// How long `initialize` (and the first tool list) may take. Default
    /// [`DEFAULT_STARTUP_TIMEOUT`].
    pub startup_timeout: Duration,
    /// How long one `tools/call` may take. Default [`DEFAULT_CALL_TIMEOUT`].
    pub call_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }
}

/// A tool of a server.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// The server's name.
    pub server: String,
    /// The tool's name on the server.
    pub name: String,
    /// The name it is offered under: `mcp__<server>__<tool>`, with a hash suffix when
    /// that had to change ([`qualified_name`]).
    pub qualified: String,
    /// The server's description.
    pub description: String,
    /// The server's input schema (a JSON Schema object).
    pub input_schema: serde_json::Value,
    /// The server's `readOnlyHint` annotation (false when absent): plan mode may run
    /// read-only tools.
    pub read_only: bool,
}

impl Named for McpTool {
    fn server(&self) -> &str {
        &self.server
    }
    fn tool(&self) -> &str {
        &self.name
    }
    fn qualified(&self) -> &str {
        &self.qualified
    }
}

#[derive(Debug, Clone)]
struct Handler {
    stale: Arc<AtomicBool>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.stale.store(true, Ordering::SeqCst);
    }
}

/// One connection to an MCP server. Dropping it ends the connection (and kills a stdio
/// child).
pub struct McpClient {
    name: String,
    options: ClientOptions,
    service: RunningService<RoleClient, Handler>,
    stale: Arc<AtomicBool>,
    tools: Mutex<Option<Vec<McpTool>>>,
    /// Reached over streamable HTTP.
    http: bool,
}

impl std::fmt::Debug for McpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpClient")
            .field("name", &self.name)
            .field("options", &self.options)
            .finish()
    }
}

impl McpClient {
    /// Starts or reaches the server and completes `initialize` within
    /// [`ClientOptions::startup_timeout`].
    pub async fn connect(server: &ServerConfig, options: &ClientOptions) -> Result<Self> {
        let name = server.name.clone();
        let stale = Arc::new(AtomicBool::new(false));
        let handler = Handler {
            stale: stale.clone(),
        };
        let start = |message: String| Error::Start {
            server: name.clone(),
            message,
        };
        let serve = async {
            match &server.transport {
                Transport::Stdio {
                    command,
                    args,
                    env,
                    cwd,
                } => {
                    let transport = StdioTransport::spawn(&name, command, args, env, cwd.as_ref())
                        .map_err(|e| start(format!("cannot run `{command}`: {e}")))?;
                    handler
                        .serve(transport)
                        .await
                        .map_err(|e| start(format!("initialize failed: {e}")))
                }
                Transport::Http { url, headers } => http(&name, url, headers, handler).await,
            }
        };
        let service = tokio::time::timeout(options.startup_timeout, serve)
            .await
            .map_err(|_| {
                start(format!(
                    "no answer to initialize within {} s",
                    options.startup_timeout.as_secs_f64()
                ))
            })??;
        Ok(Self {
            name,
            options: *options,
            service,
            stale,
            tools: Mutex::new(None),
            http: matches!(server.transport, Transport::Http { .. }),
        })
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's tools: listed once per connection, and again after the server said
    /// its list changed. Their [`McpTool::qualified`] names are distinct unless the server
    /// lists a tool twice or a tool's real name is another's hashed form: pass the tools of
    /// every server through [`crate::names::dedupe`] before offering them.
    pub async fn tools(&self) -> Result<Vec<McpTool>> {
        let mut cached = self.tools.lock().await;
        if let Some(tools) = cached.as_ref()
            && !self.stale.load(Ordering::SeqCst)
        {
            return Ok(tools.clone());
        }
        self.stale.store(false, Ordering::SeqCst);
        let listed = tokio::time::timeout(
            self.options.startup_timeout,
            self.service.peer().list_all_tools(),
        )
        .await
        .map_err(|_| self.timeout("tools/list", self.options.startup_timeout))?
        .map_err(|e| self.failed("tools/list", e))?;
        let tools: Vec<McpTool> = listed
            .iter()
            .filter_map(|t| serde_json::to_value(t).ok())
            .map(|v| self.tool_of(&v))
            .collect();
        *cached = Some(tools.clone());
        Ok(tools)
    }

    fn tool_of(&self, v: &serde_json::Value) -> McpTool {
        let name = v
            .get("name")
            .and_then(|n| n.as_str())
            .unwrap_or_default()
            .to_owned();
        McpTool {
            server: self.name.clone(),
            qualified: qualified_name(&self.name, &name),
            description: v
                .get("description")
                .and_then(|d| d.as_str())
                .unwrap_or_default()
                .to_owned(),
            input_schema: v
                .get("inputSchema")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({"type": "object"})),
            read_only: v
                .pointer("/annotations/readOnlyHint")
                .and_then(|r| r.as_bool())
                .unwrap_or(false),
            name,
        }
    }

    /// Calls tool `tool` (its name on the server) within [`ClientOptions::call_timeout`].
    pub async fn call(&self, tool: &str, arguments: serde_json::Value) -> Result<CallResult> {
        let mut params = CallToolRequestParams::new(tool.to_owned());
        match arguments {
            serde_json::Value::Object(map) => params = params.with_arguments(map),
            serde_json::Value::Null => {}
            other => {
                return Err(self.request(format!("arguments must be a JSON object, not {other}")));
            }
        }
        params.meta = trace_meta();
        let result = tokio::time::timeout(
            self.options.call_timeout,
            self.service.peer().call_tool(params),
        )
        .await
        .map_err(|_| self.timeout(&format!("tools/call {tool}"), self.options.call_timeout))?
        .map_err(|e| self.failed(&format!("tools/call {tool}"), e))?;
        let value = serde_json::to_value(&result)
            .map_err(|e| self.request(format!("unreadable result: {e}")))?;
        Ok(render_result(&value))
    }

    /// Whether the connection has ended (the child exited, the stream closed).
    pub fn is_closed(&self) -> bool {
        self.service.is_transport_closed()
    }

    /// Ends the connection (a stdio child is killed).
    pub async fn shutdown(self) {
        if let Err(e) = self.service.cancel().await {
            tracing::debug!(server = %self.name, error = %e, "closing the MCP connection");
        }
    }

    fn timeout(&self, what: &str, after: Duration) -> Error {
        Error::Timeout {
            server: self.name.clone(),
            what: what.to_owned(),
            secs: after.as_secs(),
        }
    }

    /// The error of a request the SDK failed: [`Error::TooLarge`] for the error response
    /// that replaced an oversized message (see `bounded`), else [`Error::Request`].
    fn failed(&self, what: &str, e: rmcp::ServiceError) -> Error {
        if let rmcp::ServiceError::McpError(data) = &e
            && let Some(extra) = &data.data
            && extra.get("hame").and_then(|m| m.as_str()) == Some(TOO_LARGE_MARK)
        {
            return Error::TooLarge {
                server: self.name.clone(),
                what: what.to_owned(),
                bytes: extra.get("bytes").and_then(|b| b.as_u64()).unwrap_or(0),
            };
        }
        if self.http && matches!(e, rmcp::ServiceError::TransportClosed) {
            // The SDK's HTTP client closes the connection on an answer over its limits
            // (16 MiB per SSE event or body) without saying so to the request.
            return self.request(format!(
                "{what} failed: the connection closed before the result arrived (the SDK \
                 closes it on a result over the 16 MiB limit of one message, among other \
                 causes; its log line says which)"
            ));
        }
        self.request(format!("{what} failed: {e}"))
    }

    fn request(&self, message: String) -> Error {
        Error::Request {
            server: self.name.clone(),
            message,
        }
    }
}

/// The current span's W3C trace context (`traceparent`, `tracestate`) as a request's
/// `_meta` (MCP SEP-414), through the global propagator; `None` without one (the default)
/// or outside a traced span.
fn trace_meta() -> Option<rmcp::model::RequestMetaObject> {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = tracing::Span::current().context();
    let mut carrier = std::collections::HashMap::<String, String>::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    if carrier.is_empty() {
        return None;
    }
    let mut meta = rmcp::model::RequestMetaObject::new();
    for (k, v) in carrier {
        meta.0.0.insert(k, serde_json::Value::String(v));
    }
    Some(meta)
}

#[cfg(feature = "http")]
async fn http(
    name: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
    handler: Handler,
) -> Result<RunningService<RoleClient, Handler>> {
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let start = |message: String| Error::Start {
        server: name.to_owned(),
        message,
    };
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    let mut custom = std::collections::HashMap::new();
    for (k, v) in headers {
        if k.eq_ignore_ascii_case("authorization") {
            let token = v
                .strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
                .unwrap_or(v);
            config = config.auth_header(token.to_owned());
            continue;
        }
        let name = http::HeaderName::from_bytes(k.as_bytes())
            .map_err(|e| start(format!("header `{k}`: {e}")))?;
        let value =
            http::HeaderValue::from_str(v).map_err(|e| start(format!("header `{k}`: {e}")))?;
        custom.insert(name, value);
    }
    let transport = StreamableHttpClientTransport::with_client(
        traced::TracedClient::new().map_err(|e| start(format!("its HTTP client: {e}")))?,
        config.custom_headers(custom),
    );
    handler
        .serve(transport)
        .await
        .map_err(|e| start(format!("initialize failed at {url}: {e}")))
}

/// The SDK's reqwest client with the W3C trace context of each `tools/call` (its `_meta`,
/// [`trace_meta`]) also sent as the `traceparent` / `tracestate` HTTP headers, which HTTP
/// servers, proxies and their tracing middleware read. The SDK sends from its transport
/// task, outside the tool's span, so the context is taken from the message itself.
#[cfg(feature = "http")]
mod traced {
    use std::collections::HashMap;
    use std::sync::Arc;

    use futures::stream::BoxStream;
    use http::{HeaderName, HeaderValue};
    use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage};
    use rmcp::transport::streamable_http_client::{
        SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        StreamableHttpResponseLimits,
    };
    use sse_stream::Sse;

    /// Redirects followed per request (the SDK's own client follows as many).
    const MAX_REDIRECTS: usize = 10;

    /// See the [module docs](self).
    #[derive(Debug, Clone)]
    pub(super) struct TracedClient(reqwest::Client);

    impl TracedClient {
        /// The client the SDK builds for itself: no idle pooling (a 40 ms delayed-ACK stall
        /// otherwise), only same-origin 307/308 redirects (a 301–303 would drop the body, a
        /// cross-origin one would hand the session and headers to another host).
        pub(super) fn new() -> Result<Self, reqwest::Error> {
            let policy = reqwest::redirect::Policy::custom(|attempt| {
                let same_origin = attempt.previous().first().is_some_and(|first| {
                    first.scheme() == attempt.url().scheme()
                        && first.host_str() == attempt.url().host_str()
                        && first.port_or_known_default() == attempt.url().port_or_known_default()
                });
                let keeps_body = matches!(attempt.status().as_u16(), 307 | 308);
                if same_origin && keeps_body && attempt.previous().len() <= MAX_REDIRECTS {
                    attempt.follow()
                } else {
                    attempt.stop()
                }
            });
            reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .redirect(policy)
                .build()
                .map(Self)
        }
    }

    /// Copies the trace context of a `tools/call`'s `_meta` into `headers`.
    pub(super) fn trace_headers(
        message: &ClientJsonRpcMessage,
        headers: &mut HashMap<HeaderName, HeaderValue>,
    ) {
        let JsonRpcMessage::Request(request) = message else {
            return;
        };
        let ClientRequest::CallToolRequest(call) = &request.request else {
            return;
        };
        let Some(meta) = &call.params.meta else {
            return;
        };
        for key in ["traceparent", "tracestate"] {
            if let Some(value) = meta.0.0.get(key).and_then(serde_json::Value::as_str)
                && let Ok(value) = HeaderValue::from_str(value)
            {
                headers.insert(HeaderName::from_static(key), value);
            }
        }
    }

    impl StreamableHttpClient for TracedClient {
        type Error = reqwest::Error;

        async fn post_message(
            &self,
            uri: Arc<str>,
            message: ClientJsonRpcMessage,
            session_id: Option<Arc<str>>,
            auth_header: Option<String>,
            mut custom_headers: HashMap<HeaderName, HeaderValue>,
        ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
            trace_headers(&message, &mut custom_headers);
            self.0
                .post_message(uri, message, session_id, auth_header, custom_headers)
                .await
        }

        async fn post_message_with_max_sse_event_size(
            &self,
            uri: Arc<str>,
            message: ClientJsonRpcMessage,
            session_id: Option<Arc<str>>,
            auth_header: Option<String>,
            mut custom_headers: HashMap<HeaderName, HeaderValue>,
            max_sse_event_size: usize,
        ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
            trace_headers(&message, &mut custom_headers);
            self.0
                .post_message_with_max_sse_event_size(
                    uri,
                    message,
                    session_id,
                    auth_header,
                    custom_headers,
                    max_sse_event_size,
                )
                .await
        }

        async fn post_message_with_response_limits(
            &self,
            uri: Arc<str>,
            message: ClientJsonRpcMessage,
            session_id: Option<Arc<str>>,
            auth_header: Option<String>,
            mut custom_headers: HashMap<HeaderName, HeaderValue>,
            limits: StreamableHttpResponseLimits,
        ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
            trace_headers(&message, &mut custom_headers);
            self.0
                .post_message_with_response_limits(
                    uri,
                    message,
                    session_id,
                    auth_header,
                    custom_headers,
                    limits,
                )
                .await
        }

        async fn delete_session(
            &self,
            uri: Arc<str>,
            session_id: Arc<str>,
            auth_header: Option<String>,
            custom_headers: HashMap<HeaderName, HeaderValue>,
        ) -> Result<(), StreamableHttpError<Self::Error>> {
            self.0
                .delete_session(uri, session_id, auth_header, custom_headers)
                .await
        }

        async fn get_stream(
            &self,
            uri: Arc<str>,
            session_id: Option<Arc<str>>,
            last_event_id: Option<String>,
            auth_header: Option<String>,
            custom_headers: HashMap<HeaderName, HeaderValue>,
        ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>>
        {
            self.0
                .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
                .await
        }

        async fn get_stream_with_max_sse_event_size(
            &self,
            uri: Arc<str>,
            session_id: Option<Arc<str>>,
            last_event_id: Option<String>,
            auth_header: Option<String>,
            custom_headers: HashMap<HeaderName, HeaderValue>,
            max_sse_event_size: usize,
        ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>>
        {
            self.0
                .get_stream_with_max_sse_event_size(
                    uri,
                    session_id,
                    last_event_id,
                    auth_header,
                    custom_headers,
                    max_sse_event_size,
                )
                .await
        }
    }
}

#[cfg(not(feature = "http"))]
async fn http(
    name: &str,
    _url: &str,
    _headers: &BTreeMap<String, String>,
    _handler: Handler,
) -> Result<RunningService<RoleClient, Handler>> {
    Err(Error::Unsupported {
        server: name.to_owned(),
        message: "this build has no streamable HTTP transport (enable the `mcp-http` feature of `hame`, or `http` of `hame-mcp`)".into(),
    })
}
