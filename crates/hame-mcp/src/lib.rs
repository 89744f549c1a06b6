//! # hame-mcp
//!
//! The MCP client of hame: it connects to [Model Context Protocol] servers through the
//! official Rust SDK (`rmcp`), lists their tools and calls them. The harness offers those
//! tools to the model as `mcp__<server>__<tool>` (see `docs/tools-and-mcp.md`); depend on
//! this crate directly only to talk to an MCP server outside an agent.
//!
//! - [`McpClient`]: one connection: a stdio child process (its own process group, killed
//!   when the client is dropped, its stderr copied to the `tracing` log) or a streamable
//!   HTTP endpoint. `initialize` must answer within [`ClientOptions::startup_timeout`];
//!   every call has [`ClientOptions::call_timeout`]. The tool list is fetched once per
//!   connection and again after the server sends `notifications/tools/list_changed`.
//! - [`McpPool`]: connections shared by the calls of one process, started lazily (the
//!   first call that needs a server starts it), one per distinct server configuration; a
//!   server that failed to start is retried after [`RETRY_AFTER`].
//! - [`render_result`]: a `tools/call` result as the text the model sees (pure).
//! - [`names`]: the names tools are offered under, `mcp__<server>__<tool>`, one-to-one
//!   (a short stable hash suffix when a name had to change; [`names::dedupe`] for what
//!   is left; [`names::check_server_name`] refuses server names that would be
//!   ambiguous).
//! - One message from a stdio server may be at most [`MAX_MESSAGE_BYTES`] (16 MiB): a
//!   larger answer fails its request at once with [`Error::TooLarge`] instead of being
//!   dropped by the SDK (which left the call waiting for its timeout).
//!
//! | feature | what it adds |
//! |---|---|
//! | `http` | streamable HTTP servers (reqwest with rustls) |
//!
//! Without `http`, connecting to an HTTP server is an [`Error::Unsupported`] naming the
//! feature.
//!
//! ```no_run
//! # async fn demo() -> Result<(), hame_mcp::Error> {
//! use hame_mcp::{ClientOptions, McpClient, ServerConfig, Transport};
//!
//! let server = ServerConfig {
//!     name: "files".into(),
//!     transport: Transport::Stdio {
//!         command: "python3".into(),
//!         args: vec!["server.py".into()],
//!         env: Default::default(),
//!         cwd: None,
//!     },
//! };
//! let client = McpClient::connect(&server, &ClientOptions::default()).await?;
//! for tool in client.tools().await? {
//!     println!("{} (read-only: {})", tool.qualified, tool.read_only);
//! }
//! let out = client.call("echo", serde_json::json!({"text": "hi"})).await?;
//! assert!(!out.is_error);
//! # Ok(()) }
//! ```
//!
//! [Model Context Protocol]: https://modelcontextprotocol.io
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod bounded;
mod client;
pub mod names;
mod pool;
mod result;
mod stdio;

pub use bounded::MAX_MESSAGE_BYTES;
pub use client::{ClientOptions, McpClient, McpTool, ServerConfig, Transport};
pub use names::qualified_name;
pub use pool::{McpPool, RETRY_AFTER};
pub use result::{CallResult, render_result};

/// Default time a server has to answer `initialize`.
pub const DEFAULT_STARTUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Default time one `tools/call` may take.
pub const DEFAULT_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Why talking to an MCP server failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server could not be started or did not complete `initialize`.
    #[error("MCP server `{server}` did not start: {message}")]
    Start {
        /// The server's name.
        server: String,
        /// What went wrong.
        message: String,
    },
    /// A request timed out.
    #[error("MCP server `{server}`: {what} timed out after {secs} s")]
    Timeout {
        /// The server's name.
        server: String,
        /// Which request.
        what: String,
        /// The timeout.
        secs: u64,
    },
    /// The server's answer to a request was larger than [`MAX_MESSAGE_BYTES`] (16 MiB): the
    /// request fails as soon as the answer has passed, instead of waiting for its timeout.
    #[error(
        "MCP server `{server}`: the result of {what} is {bytes} bytes, over the 16 MiB limit of one message ({limit} bytes); ask the tool for less (a narrower query, one page)",
        limit = MAX_MESSAGE_BYTES
    )]
    TooLarge {
        /// The server's name.
        server: String,
        /// Which request (`tools/call <tool>`).
        what: String,
        /// The size of the answer.
        bytes: u64,
    },
    /// The server answered a request with an error, or the connection broke.
    #[error("MCP server `{server}`: {message}")]
    Request {
        /// The server's name.
        server: String,
        /// What went wrong.
        message: String,
    },
    /// This build cannot reach such a server.
    #[error("MCP server `{server}`: {message}")]
    Unsupported {
        /// The server's name.
        server: String,
        /// What is missing.
        message: String,
    },
}

impl Error {
    /// Whether the server never became usable (start failure, `initialize` timeout).
    pub fn is_start(&self) -> bool {
        matches!(self, Error::Start { .. } | Error::Unsupported { .. })
    }
}

/// `Result` with the MCP [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
