//! `hame worker` (drain the run queue) and `hame runs list|show|cancel` (read and cancel
//! runs straight from the state store, no server needed). See docs/runs.md.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use hame::HarnessAgent;
use hame::state::runs::{CancelOutcome, Run, RunQueue};

use crate::ConfigError;
use crate::common::{Common, build_resolved, build_without_model};

/// The worker flags of `hame worker` and `hame serve`.
#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// Runs this process executes at once.
    #[arg(long, default_value_t = 4, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256), help_heading = "Runs")]
    worker_concurrency: u32,
    /// A running run whose worker stops heartbeating (every second) for this long is
    /// taken over by another worker.
    #[arg(long, default_value_t = 15.0, value_name = "SECONDS", value_parser = lapse, help_heading = "Runs")]
    run_lapse: f64,
}

impl WorkerArgs {
    pub(crate) fn options(&self) -> hame_gateway::WorkerOptions {
        hame_gateway::WorkerOptions::default()
            .with_concurrency(usize::try_from(self.worker_concurrency).unwrap_or(4))
            .with_lapse(Duration::from_secs_f64(self.run_lapse))
    }
}

/// A run lapse in seconds: 1 to 3600.
fn lapse(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (1.0..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of seconds between 1 and 3600"
        )),
    }
}

/// The run queue of the agent's state store: the `--state` URL's, else the directory of
/// the default JSON state.
pub(crate) async fn queue(
    agent: &HarnessAgent,
    config: &crate::config::Effective,
) -> anyhow::Result<Arc<dyn RunQueue>> {
    let opened = match (&config.state.value, agent.default_state_root()) {
        (Some(url), _) => hame::state::runs::open_queue(url).await,
        (None, Some(root)) => {
            hame::state::runs::JsonRunQueue::open(root).map(|q| Arc::new(q) as Arc<dyn RunQueue>)
        }
        (None, None) => {
            return Err(ConfigError("no state store to keep runs in: set --state".into()).into());
        }
    };
    opened.map_err(|e| ConfigError(format!("cannot open the run queue: {e}")).into())
}

/// Flags of `hame worker`.
#[derive(Debug, Args)]
pub(crate) struct WorkerCommand {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    worker: WorkerArgs,
    /// After SIGTERM / SIGINT, how long running runs may take before they are stopped
    /// (another worker takes them over after --run-lapse).
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    drain_timeout: u64,
}

/// `hame worker`: drains the run queue until SIGTERM / SIGINT.
pub(crate) async fn worker(args: WorkerCommand) -> anyhow::Result<()> {
    let config = crate::config::resolve(&args.common)?;
    let (agent, ctx) = build_resolved(&args.common, &config).await?;
    let queue = queue(&agent, &config).await?;
    let options = args
        .worker
        .options()
        .with_keep_finished(config.keep_finished.value);
    let name = options.name.clone();
    let worker = hame_gateway::Worker::new(agent.clone(), ctx, queue, options);
    let stop = hame::CancellationToken::new();
    let abort = hame::CancellationToken::new();
    let task = tokio::spawn(worker.run(stop.clone(), abort.clone()));
    println!("worker {name} draining runs of agent {}", agent.name());
    std::io::stdout().flush()?;
    crate::serve::shutdown_signal().await;
    stop.cancel();
    let drain = Duration::from_secs(args.drain_timeout);
    let mut task = task;
    if tokio::time::timeout(drain, &mut task).await.is_err() {
        eprintln!("hame: runs still running after --drain-timeout; stopping them");
        abort.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    crate::run::finish(&agent).await
}

/// `hame runs list|show|cancel`.
#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
    /// The caller's runs, newest first (all sessions, or one).
    List {
        #[command(flatten)]
        common: Common,
        /// Only this session's runs.
        #[arg(value_name = "SESSION")]
        only: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
        /// Print one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// One run: status, reply, error, the checks' evidence.
    Show {
        #[command(flatten)]
        common: Common,
        /// The run id (`run-…`).
        run_id: String,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a run: a queued one at once, a running one at its worker's next heartbeat.
    Cancel {
        #[command(flatten)]
        common: Common,
        /// The run id (`run-…`).
        run_id: String,
    },
}

/// The gate's verdict of a run with required checks.
fn verification(r: &Run) -> Option<hame::Verification> {
    serde_json::from_value(r.verification.clone()?).ok()
}

/// The checks that did not pass, `tests failed, lint error`.
fn failing(v: &hame::Verification) -> String {
    v.evidence
        .iter()
        .filter(|e| e.outcome != hame::CheckOutcome::Passed)
        .map(|e| {
            format!(
                "{} {}",
                e.check,
                serde_json::json!(e.outcome).as_str().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn line(r: &Run) -> String {
    let unverified = (r.status == hame::state::runs::RunStatus::Unverified)
        .then(|| verification(r))
        .flatten()
        .map(|v| format!("checks: {}", failing(&v)));
    let detail = r
        .error
        .as_ref()
        .map(|e| format!("{}: {}", e.code, e.message))
        .or(unverified)
        .or_else(|| r.reply.clone())
        .unwrap_or_default();
    let detail: String = detail
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(80)
        .collect();
    format!(
        "{}  {:<16}  {:<12}  {}  {}",
        r.id,
        r.status.as_str(),
        r.session,
        r.created.format("%Y-%m-%d %H:%M:%S"),
        detail
    )
}

fn shown(r: &Run) -> serde_json::Value {
    let mut v = serde_json::json!({
        "run_id": r.id, "session": r.session, "status": r.status, "attempts": r.attempts,
        "created": r.created, "updated": r.updated,
    });
    if let Some(o) = v.as_object_mut() {
        if let Some(x) = &r.reply {
            o.insert("reply".into(), serde_json::json!(x));
        }
        if let Some(x) = &r.usage {
            o.insert("usage".into(), x.clone());
        }
        if let Some(x) = &r.verification {
            o.insert("verification".into(), x.clone());
        }
        if let Some(x) = &r.error {
            o.insert(
                "error".into(),
                serde_json::json!({"code": x.code, "message": x.message}),
            );
        }
        if let Some(x) = &r.approvals {
            o.insert("approvals".into(), x.clone());
        }
        if let Some(x) = &r.worker {
            o.insert("worker".into(), serde_json::json!(x));
        }
    }
    v
}

/// The queue, the agent name and the user of `common`.
async fn open(common: &Common) -> anyhow::Result<(Arc<dyn RunQueue>, String, Option<String>)> {
    let config = crate::config::resolve(common)?;
    let (agent, ctx) = build_without_model(common).await?;
    let q = queue(&agent, &config).await?;
    Ok((q, agent.name().to_owned(), ctx.user_id))
}

/// The run `id` of this agent and user, else a one-line error.
async fn mine(q: &dyn RunQueue, agent: &str, user: Option<&str>, id: &str) -> anyhow::Result<Run> {
    match q.get(id).await? {
        Some(r) if r.is_owned_by(agent, user) => Ok(r),
        _ => Err(ConfigError(format!(
            "no run {id} for this agent and user (see `hame runs list`)"
        ))
        .into()),
    }
}

/// `hame runs list|show|cancel`.
pub(crate) async fn runs(command: RunsCommand) -> anyhow::Result<()> {
    match command {
        RunsCommand::List {
            common,
            only,
            limit,
            json,
        } => {
            if let Some(s) = &only {
                hame::harness::validate_id("session id", s)
                    .map_err(|e| ConfigError(e.to_string()))?;
            }
            let (q, agent, user) = open(&common).await?;
            let limit = usize::try_from(limit).unwrap_or(50);
            let runs = q
                .list(hame::state::runs::RunFilter::new(
                    &agent,
                    user.as_deref(),
                    only.as_deref(),
                    limit,
                ))
                .await?;
            if json {
                let all: Vec<_> = runs.iter().map(shown).collect();
                println!("{}", serde_json::Value::Array(all));
            } else if runs.is_empty() {
                println!("no runs");
            } else {
                for r in &runs {
                    println!("{}", line(r));
                }
            }
        }
        RunsCommand::Show {
            common,
            run_id,
            json,
        } => {
            let (q, agent, user) = open(&common).await?;
            let r = mine(&*q, &agent, user.as_deref(), &run_id).await?;
            if json {
                println!("{}", shown(&r));
            } else {
                println!("run      {}", r.id);
                println!("session  {}", r.session);
                println!("status   {}", r.status);
                println!("attempts {}", r.attempts);
                println!("created  {}", r.created.to_rfc3339());
                println!("updated  {}", r.updated.to_rfc3339());
                if let Some(e) = &r.error {
                    println!("error    {}: {}", e.code, e.message);
                }
                if let Some(v) = verification(&r) {
                    let head = match v.status {
                        hame::VerificationStatus::Verified => "verified by".to_owned(),
                        hame::VerificationStatus::Unverified => format!(
                            "unverified after {} extra step{}: {}",
                            v.extra_steps,
                            if v.extra_steps == 1 { "" } else { "s" },
                            failing(&v)
                        ),
                    };
                    print!(
                        "checks   {head}\n{}",
                        crate::run::evidence_lines(&v.evidence)
                    );
                }
                if let Some(reply) = &r.reply {
                    println!("\n{reply}");
                }
            }
        }
        RunsCommand::Cancel { common, run_id } => {
            let (q, agent, user) = open(&common).await?;
            let r = mine(&*q, &agent, user.as_deref(), &run_id).await?;
            match q.cancel(&r.id).await? {
                CancelOutcome::Cancelled(r) => println!("{} cancelled", r.id),
                CancelOutcome::Requested(r) => println!(
                    "{} cancel requested (its worker stops it within about a second)",
                    r.id
                ),
                CancelOutcome::Finished(r) => {
                    return Err(ConfigError(format!(
                        "run {} has already ended ({})",
                        r.id, r.status
                    ))
                    .into());
                }
                CancelOutcome::NotFound => {
                    return Err(ConfigError(format!("no run {run_id}")).into());
                }
            }
        }
    }
    Ok(())
}
