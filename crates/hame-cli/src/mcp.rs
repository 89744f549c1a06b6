//! `hame mcp serve`: the agent `hame run` would build, as an MCP server (one tool, `ask`)
//! on stdio or, with `--listen`, over streamable HTTP at `/mcp` (docs/mcp-server.md).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::common::{Common, build};

#[derive(Debug, Subcommand)]
pub(crate) enum McpCommand {
    /// Serve the agent as an MCP server: one tool, `ask` {message, session?}.
    ///
    /// On stdin/stdout (what an MCP client starts), or with --listen over streamable HTTP
    /// at /mcp (with the routes of `hame serve` beside it). Each `ask` is one turn of the
    /// agent in its session (a new session when none is given; the result names it).
    Serve(McpServeArgs),
}

/// Flags of `hame mcp serve`.
#[derive(Debug, Args)]
pub(crate) struct McpServeArgs {
    #[command(flatten)]
    common: Common,
    /// Serve over streamable HTTP on this address (e.g. 127.0.0.1:8080; port 0: any free
    /// port) instead of stdio; prints `listening on http://ADDR (MCP at
    /// http://ADDR/mcp)` when ready. Without --auth only a loopback address is accepted.
    #[arg(long)]
    listen: Option<String>,
    /// With --listen: bearer tokens, a JSON file {"tokens": {"<token>": {"user":
    /// "<userId>"}}}; each request needs `Authorization: Bearer <token>`, whose user the
    /// turn runs as.
    #[arg(long, value_name = "FILE", requires = "listen")]
    auth: Option<PathBuf>,
    /// Messages that may wait behind the running turn of one session; one more is refused.
    #[arg(long, default_value_t = 16, value_name = "N")]
    max_queue: usize,
    /// When the client goes away (stdio) or on SIGTERM / SIGINT (--listen), how long
    /// running turns may take before they are cancelled.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    drain_timeout: u64,
}

pub(crate) async fn run(command: McpCommand) -> anyhow::Result<()> {
    match command {
        McpCommand::Serve(args) => serve(args).await,
    }
}

async fn serve(args: McpServeArgs) -> anyhow::Result<()> {
    if let Some(listen) = args.listen.clone() {
        let http = crate::serve::Http {
            listen,
            auth: args.auth.clone(),
            max_queue: args.max_queue,
            drain_timeout: args.drain_timeout,
            header_timeout: 10.0,
            body_timeout: 30.0,
            max_connections: 1024,
            max_body: u64::try_from(hame_gateway::GatewayOptions::default().body_limit)
                .unwrap_or(u64::MAX),
            max_upload: 32 * 1024 * 1024,
            mcp: true,
            a2a: false,
            // As `hame serve`: runs accepted on this server are drained here too.
            worker: Some(hame_gateway::WorkerOptions::default()),
            serve_agent: Vec::new(),
            shared_events: crate::serve::EventsAt::Auto,
        };
        return crate::serve::serve_http(&args.common, http).await;
    }
    let (agent, ctx) = build(&args.common).await?;
    crate::skills::check(&agent, &ctx).await?;
    let user = ctx.user_id.clone();
    let options = hame_gateway::GatewayOptions::default()
        .with_queue_bound(args.max_queue)
        .with_drain_timeout(std::time::Duration::from_secs(args.drain_timeout));
    let gateway = hame_gateway::Gateway::new(agent.clone(), ctx, options);
    gateway.serve_mcp_stdio(user).await?;
    crate::run::finish(&agent).await
}
