//! `hame serve`: the agent `hame run` would build, served over HTTP by `hame-gateway`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::ConfigError;
use crate::common::{Common, build_resolved};

/// Flags of `hame serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    common: Common,
    /// Address to listen on, e.g. 127.0.0.1:8080 (port 0: any free port). Without --auth
    /// only a loopback address is accepted.
    #[arg(long)]
    listen: String,
    /// Bearer tokens: a JSON file {"tokens": {"<token>": {"user": "<userId>", "agents":
    /// ["<agentId>"]}}} (`agents` optional: the agents the token may use, else all). Then
    /// every request but /healthz needs `Authorization: Bearer <token>` and the token
    /// decides the user; without it the user is the `X-Hame-User` header (else --user).
    #[arg(long, value_name = "FILE")]
    auth: Option<PathBuf>,
    /// Messages that may wait behind the running turn of one session; one more is
    /// answered 429 with Retry-After.
    #[arg(long, default_value_t = 16, value_name = "N")]
    max_queue: usize,
    /// After SIGTERM / SIGINT, how long in-flight turns may take before they are cancelled.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    drain_timeout: u64,
    /// How long a connection may take to send a request's headers (counted from when the
    /// server waits for them, so idle keep-alive connections too); past it the connection
    /// is closed.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS", value_parser = seconds)]
    header_timeout: f64,
    /// How long a request's body may take to arrive whole after its headers; past it the
    /// answer is 408 and the connection is closed.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS", value_parser = seconds)]
    body_timeout: f64,
    /// Connections open at once; past it new connections wait to be accepted until one
    /// closes (keep it under `ulimit -n`).
    #[arg(long, default_value_t = 1024, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Largest request body, in bytes, of every route but uploads; one more is answered
    /// 413. An image sent inline (base64) takes 4/3 of its size: raise this to send
    /// images larger than about 750 KiB through the OpenAI routes (each at most 5 MiB).
    #[arg(long, default_value_t = 1024 * 1024, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    max_body: u64,
    /// Largest file PUT /v1/sessions/{session}/files/{path} takes, in bytes; one more is
    /// answered 413 (the body is held in memory until written).
    #[arg(long, default_value_t = 32 * 1024 * 1024, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    max_upload: u64,
    /// Accept runs (POST /v1/sessions/{session}/runs) but leave them to `hame worker`
    /// processes instead of executing them here.
    #[arg(long, help_heading = "Runs")]
    no_worker: bool,
    #[command(flatten)]
    worker: crate::runs::WorkerArgs,
    /// Another agent served by this process (repeatable; also `[agents.NAME]` in
    /// hame.toml): its id and its own workspace (with that workspace's hame.toml); the
    /// OpenAI routes' `model` picks it, its routes are /v1/agents/NAME/…, the other flags
    /// are shared. The /v1/sessions/… routes serve the --agent one.
    #[arg(long = "serve-agent", value_name = "NAME=DIR", value_parser = named_dir)]
    serve_agent: Vec<(String, PathBuf)>,
    /// Also publish every served agent as an A2A agent (docs/a2a.md): the card at
    /// /.well-known/agent-card.json (each agent's at /a2a/NAME/.well-known/agent-card.json),
    /// JSON-RPC at /a2a (and /a2a/NAME); each task is a run of the run queue.
    #[arg(long)]
    a2a: bool,
    /// Where replicas share the sessions' events, so that `GET …/events?after=ID` on any
    /// replica replays a turn another one ran: `auto` (the state or the store when it is
    /// Redis, else this process only), `state` (the state store: Redis, PostgreSQL or
    /// MySQL; one database write per event), `off` (this process only), or a redis://,
    /// postgres:// or mysql:// URL.
    #[arg(long, default_value = "auto", value_name = "WHERE", value_parser = events_at, env = "HAME_SHARED_EVENTS")]
    shared_events: EventsAt,
}

/// Where the sessions' events are shared between replicas (`--shared-events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EventsAt {
    /// The state or the store when it is Redis, else this process only.
    Auto,
    /// The state store (Redis, PostgreSQL, MySQL).
    State,
    /// This process only.
    Off,
    /// This store.
    Url(String),
}

/// `--shared-events`: `auto`, `state`, `off` or a URL of a store that can hold events.
fn events_at(s: &str) -> Result<EventsAt, String> {
    match s.trim() {
        "auto" => Ok(EventsAt::Auto),
        "state" => Ok(EventsAt::State),
        "off" => Ok(EventsAt::Off),
        url if shares_events(url, true) => Ok(EventsAt::Url(url.to_owned())),
        other => Err(format!(
            "`{}` is not auto, state, off or a redis://, postgres:// or mysql:// URL",
            hame::state::redact_url(other)
        )),
    }
}

/// `NAME=DIR` of `--serve-agent`.
fn named_dir(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, dir)) if !name.trim().is_empty() && !dir.trim().is_empty() => {
            Ok((name.trim().to_owned(), PathBuf::from(dir.trim())))
        }
        _ => Err(format!(
            "`{s}` is not NAME=DIR (an agent id and its workspace)"
        )),
    }
}

/// A timeout in seconds: a number above 0 and at most a day.
fn seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of seconds between 0 and 86400"
        )),
    }
}

pub(crate) async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let http = Http {
        listen: args.listen,
        auth: args.auth,
        max_queue: args.max_queue,
        drain_timeout: args.drain_timeout,
        header_timeout: args.header_timeout,
        body_timeout: args.body_timeout,
        max_connections: args.max_connections,
        max_body: args.max_body,
        max_upload: args.max_upload,
        mcp: false,
        a2a: args.a2a,
        worker: (!args.no_worker).then(|| args.worker.options()),
        serve_agent: args.serve_agent,
        shared_events: args.shared_events,
    };
    serve_http(&args.common, http).await
}

/// What `hame serve` listens with (`hame mcp serve --listen` too).
pub(crate) struct Http {
    pub(crate) listen: String,
    pub(crate) auth: Option<PathBuf>,
    pub(crate) max_queue: usize,
    pub(crate) drain_timeout: u64,
    pub(crate) header_timeout: f64,
    pub(crate) body_timeout: f64,
    pub(crate) max_connections: u32,
    /// Largest request body in bytes but uploads (`--max-body`).
    pub(crate) max_body: u64,
    /// Largest upload in bytes (`--max-upload`).
    pub(crate) max_upload: u64,
    /// Also serve MCP at `/mcp`.
    pub(crate) mcp: bool,
    /// Also serve A2A (`--a2a`).
    pub(crate) a2a: bool,
    /// Drain the run queue in this process with these settings (`None`: leave the runs to
    /// `hame worker` processes).
    pub(crate) worker: Option<hame_gateway::WorkerOptions>,
    /// Other agents served by this process (`--serve-agent NAME=DIR`).
    pub(crate) serve_agent: Vec<(String, PathBuf)>,
    /// Where the sessions' events are shared (`--shared-events`).
    pub(crate) shared_events: EventsAt,
}

/// Builds the agent of `common` and serves it over HTTP until SIGTERM / SIGINT.
pub(crate) async fn serve_http(common: &Common, args: Http) -> anyhow::Result<()> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(args.listen.as_str())
        .await
        .map_err(|e| {
            ConfigError(format!(
                "cannot use --listen {}: {e} (give HOST:PORT, e.g. 127.0.0.1:8080)",
                args.listen
            ))
        })?
        .collect();
    let Some(addr) = addrs.first().copied() else {
        return Err(ConfigError(format!("--listen {} resolves to no address", args.listen)).into());
    };
    let auth = match &args.auth {
        Some(path) => {
            Some(hame_gateway::Auth::from_file(path).map_err(|e| ConfigError(e.to_string()))?)
        }
        None => None,
    };
    if auth.is_none() && !addrs.iter().all(|a| a.ip().is_loopback()) {
        return Err(ConfigError(format!(
            "refusing to listen on {addr} without --auth: a non-loopback address needs bearer tokens (--auth FILE with {{\"tokens\": {{\"<token>\": {{\"user\": \"<userId>\"}}}}}}), or listen on 127.0.0.1"
        ))
        .into());
    }
    if auth.is_some() && common.is_local_mode() {
        eprintln!(
            "hame: warning: local mode: every caller's tools (the shell included) work on the workspace with your rights; for tenants you do not trust use --isolated or --store"
        );
    }
    // Replicas: where the sessions' events are shared (`--shared-events`).
    let config = crate::config::resolve(common)?;
    let state = config.state.value.as_deref();
    let shared = match &args.shared_events {
        EventsAt::Off => None,
        EventsAt::Url(url) => Some(url.clone()),
        EventsAt::State => match state {
            Some(url) if shares_events(url, true) => Some(url.to_owned()),
            _ => {
                return Err(ConfigError(
                    "--shared-events state needs a Redis, PostgreSQL or MySQL state store (--state redis://…, postgres://… or mysql://…)".to_owned(),
                )
                .into());
            }
        },
        // Redis: one cheap round trip per event, so replicas on Redis share them unasked.
        EventsAt::Auto => [state, config.store.value.as_deref()]
            .into_iter()
            .flatten()
            .find(|u| shares_events(u, false))
            .map(str::to_owned),
    };
    let shared_events = match shared {
        Some(url) => Some(
            hame_gateway::SharedEvents::connect(&url, "")
                .await
                .map_err(|e| ConfigError(e.to_string()))?,
        ),
        None => None,
    };
    let (agent, ctx) = build_resolved(common, &config).await?;
    let runs = Some(crate::runs::queue(&agent, &config).await?);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ConfigError(format!("cannot listen on {addr}: {e} (check --listen)")))?;
    let local = listener.local_addr()?;
    let options = hame_gateway::GatewayOptions::default()
        .with_auth(auth)
        .with_queue_bound(args.max_queue)
        .with_drain_timeout(Duration::from_secs(args.drain_timeout))
        .with_header_timeout(Duration::from_secs_f64(args.header_timeout))
        .with_body_timeout(Duration::from_secs_f64(args.body_timeout))
        .with_max_connections(usize::try_from(args.max_connections).unwrap_or(usize::MAX))
        .with_body_limit(usize::try_from(args.max_body).unwrap_or(usize::MAX))
        .with_upload_limit(usize::try_from(args.max_upload).unwrap_or(usize::MAX))
        .with_shared_events(shared_events)
        .with_mcp(args.mcp)
        .with_a2a(args.a2a)
        .with_runs(
            runs,
            args.worker
                .map(|w| w.with_keep_finished(config.keep_finished.value)),
        );
    // More agents: the workspace file's `[agents.NAME]`, then `--serve-agent NAME=DIR`.
    let mut others = Vec::new();
    for (name, section) in &config.agents {
        others.push(crate::common::build_named(common, name, section.apply(common.flags())).await?);
    }
    for (name, dir) in &args.serve_agent {
        let mut flags = common.flags();
        flags.workspace = Some(dir.clone());
        others.push(crate::common::build_named(common, name, flags).await?);
    }
    let gateway = hame_gateway::Gateway::new(agent.clone(), ctx, options)
        .with_agents(others)
        .map_err(|e| ConfigError(e.to_string()))?;
    if args.mcp {
        println!("listening on http://{local} (MCP at http://{local}/mcp)");
    } else {
        println!("listening on http://{local}");
    }
    if args.a2a {
        eprintln!(
            "hame: A2A card at http://{local}{} (JSON-RPC at http://{local}/a2a)",
            hame_gateway::A2A_CARD_PATH
        );
    }
    std::io::stdout().flush()?;
    gateway.serve(listener, shutdown_signal()).await?;
    crate::run::finish(&agent).await
}

/// The first SIGTERM or SIGINT starts the drain; a second one exits at once.
pub(crate) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let Some(mut signals) = crate::signals::Unix::install() else {
            return std::future::pending().await;
        };
        let Some(code) = signals.next().await else {
            return std::future::pending().await;
        };
        eprintln!("hame: draining in-flight turns (a second signal exits at once)");
        tokio::spawn(async move {
            if signals.next().await.is_some() {
                crate::sandbox::shutdown_blocking();
                std::process::exit(i32::from(code));
            }
        });
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Whether `url` can hold the events replicas share: Redis, and for a state store
/// (`sql`) PostgreSQL and MySQL / MariaDB too.
fn shares_events(url: &str, sql: bool) -> bool {
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    match scheme.as_str() {
        "redis" | "rediss" => true,
        "postgres" | "postgresql" | "mysql" | "mariadb" => sql,
        _ => false,
    }
}
