//! The sandbox flags of `run`/`chat` (`--sandbox docker[:IMAGE]`, `--sandbox-network`,
//! `--sandbox-snapshots`, `--sandbox-ttl`, `--sandbox-keep`, `--sandbox-keep-snapshots`),
//! the `hame sandbox image` and `hame sandbox gc` commands, and the removal of every
//! container when hame exits.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::{Args, Subcommand};
use hame::sandbox::{DEFAULT_IMAGE, DockerOptions, DockerSandboxes, Sandboxes};

use crate::ConfigError;
use crate::common::env;

/// Flags flattened into the agent flags.
#[derive(Debug, Args)]
pub(crate) struct SandboxArgs {
    /// Run the file tools and `execute` in a locked-down container per isolation scope, on
    /// /workspace: `docker` (default image, built offline when missing) or `docker:IMAGE`.
    /// No network, memory/CPU/pids limits, read-only root, no capabilities, no host mount
    /// or environment; nothing is written into the host workspace (see docs/sandbox.md).
    #[arg(long, value_name = "docker[:IMAGE]", help_heading = "Sandbox")]
    sandbox: Option<String>,
    /// Give the sandbox a network (default: none).
    #[arg(long, requires = "sandbox", help_heading = "Sandbox")]
    sandbox_network: bool,
    /// Where sandbox snapshots live: a directory, s3://bucket/prefix or redis://...
    /// [default: <state home>/sandbox-snapshots]
    #[arg(
        long,
        requires = "sandbox",
        value_name = "DIR|s3://...|redis://...",
        help_heading = "Sandbox"
    )]
    sandbox_snapshots: Option<String>,
    /// How long an idle sandbox container is kept warm: 300, 30s, 5m, 1h [default: 5m]
    #[arg(
        long,
        requires = "sandbox",
        value_name = "DURATION",
        help_heading = "Sandbox"
    )]
    sandbox_ttl: Option<String>,
    /// Leave idle sandbox containers running when hame exits, for the next hame process
    /// to reuse within --sandbox-ttl; each removes itself once idle past it (default:
    /// every container is removed on exit).
    #[arg(long, requires = "sandbox", help_heading = "Sandbox")]
    sandbox_keep: bool,
    /// Snapshots kept per sandbox scope (at least 1); blobs no kept snapshot references are
    /// deleted by a sweep of the snapshot store after a call [default: 3]
    #[arg(long, requires = "sandbox", value_name = "N")]
    sandbox_keep_snapshots: Option<usize>,
}

/// `hame sandbox ...`
#[derive(Debug, Subcommand)]
pub(crate) enum SandboxCommand {
    /// (Re)builds the default sandbox image offline from Debian's busybox-static
    /// (/bin/busybox or $HAME_SANDBOX_BUSYBOX); no registry is contacted.
    Image,
    /// Sweeps the snapshot store now: deletes the blobs that no scope's kept snapshots
    /// reference (safe while other hame processes run).
    Gc {
        /// The snapshot store: a directory, s3://bucket/prefix or redis://...
        /// [default: <state home>/sandbox-snapshots]
        #[arg(long, value_name = "DIR|s3://...|redis://...")]
        sandbox_snapshots: Option<String>,
    },
}

/// The sandboxes of this process, removed when it exits.
static ACTIVE: Mutex<Option<DockerSandboxes>> = Mutex::new(None);

fn state_home() -> PathBuf {
    env(hame::harness::STATE_HOME_ENV)
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".hame").join("state")))
        .unwrap_or_else(|| PathBuf::from(".hame/state"))
}

fn config(e: impl std::fmt::Display) -> anyhow::Error {
    ConfigError(e.to_string()).into()
}

async fn connect(
    options: DockerOptions,
    snapshots: Option<&str>,
) -> anyhow::Result<DockerSandboxes> {
    let store: Arc<dyn hame::fs::Filesystem> = match snapshots {
        Some(url) if url.contains("://") => hame::fs::remote::open(url, "hame-sandbox")
            .await
            .map_err(|e| {
                config(format!(
                    "cannot open the sandbox snapshot store {}: {e} (check --sandbox-snapshots)",
                    hame::state::redact_url(url)
                ))
            })?,
        other => {
            let dir = other
                .map(PathBuf::from)
                .unwrap_or_else(|| state_home().join("sandbox-snapshots"));
            std::fs::create_dir_all(&dir).map_err(|e| {
                config(format!(
                    "cannot create {}: {e} (check --sandbox-snapshots)",
                    dir.display()
                ))
            })?;
            Arc::new(hame::fs::LocalFs::new(&dir).map_err(|e| {
                config(format!(
                    "cannot open {}: {e} (check --sandbox-snapshots)",
                    dir.display()
                ))
            })?)
        }
    };
    DockerSandboxes::connect(options, store)
        .await
        .map_err(config)
}

fn options(args: &SandboxArgs, spec: &str) -> anyhow::Result<DockerOptions> {
    let mut options = DockerOptions {
        busybox: env("HAME_SANDBOX_BUSYBOX").map(PathBuf::from),
        network: args.sandbox_network,
        keep_on_exit: args.sandbox_keep,
        ..DockerOptions::default()
    };
    match spec.split_once(':') {
        None if spec == "docker" => {}
        Some(("docker", image)) if !image.trim().is_empty() => options.image = image.to_owned(),
        _ => {
            return Err(config(format!(
                "unknown sandbox {spec:?}: use --sandbox docker or --sandbox docker:IMAGE"
            )));
        }
    }
    if let Some(keep) = args.sandbox_keep_snapshots {
        if keep == 0 {
            return Err(config(
                "invalid --sandbox-keep-snapshots 0: a scope keeps at least its last snapshot",
            ));
        }
        options.keep_snapshots = keep;
    }
    if let Some(ttl) = &args.sandbox_ttl {
        options.idle_ttl = hame::sandbox::plan::parse_duration(ttl).ok_or_else(|| {
            config(format!(
                "invalid --sandbox-ttl {ttl:?}: use seconds (300) or 30s, 5m, 1h"
            ))
        })?;
    }
    Ok(options)
}

/// Puts the builder in sandbox mode when `--sandbox` is given: connects to the engine
/// (exit 2 with one line when it is down), builds the default image when missing.
pub(crate) async fn apply(
    args: &SandboxArgs,
    builder: hame::harness::HarnessAgentBuilder,
) -> anyhow::Result<hame::harness::HarnessAgentBuilder> {
    let Some(spec) = &args.sandbox else {
        return Ok(builder);
    };
    let options = options(args, spec)?;
    let sandboxes = connect(options, args.sandbox_snapshots.as_deref()).await?;
    sandboxes.ensure_image().await.map_err(config)?;
    if let Ok(mut active) = ACTIVE.lock() {
        *active = Some(sandboxes.clone());
    }
    Ok(builder.filesystem(hame::FilesystemMode::Sandbox {
        sandboxes: Arc::new(sandboxes),
    }))
}

/// `hame sandbox image`.
pub(crate) async fn command(cmd: SandboxCommand) -> anyhow::Result<()> {
    match cmd {
        SandboxCommand::Image => {
            let options = DockerOptions {
                busybox: env("HAME_SANDBOX_BUSYBOX").map(PathBuf::from),
                ..DockerOptions::default()
            };
            let sandboxes = connect(options, None).await?;
            let image = sandboxes.build_image().await.map_err(config)?;
            println!("{image}");
            debug_assert_eq!(image, DEFAULT_IMAGE);
            Ok(())
        }
        SandboxCommand::Gc { sandbox_snapshots } => {
            let options = DockerOptions {
                gc_interval: None,
                ..DockerOptions::default()
            };
            let sandboxes = connect(options, sandbox_snapshots.as_deref()).await?;
            let r = sandboxes.collect_garbage().await?;
            println!(
                "{} snapshots read, {} blobs referenced of {}, {} deleted ({} bytes), {} put back, in {} ms",
                r.manifests,
                r.referenced,
                r.blobs,
                r.deleted,
                r.bytes_deleted,
                r.restored,
                r.elapsed.as_millis()
            );
            Ok(())
        }
    }
}

/// Removes every container this process started (the end of a command, a signal); with
/// `--sandbox-keep` idle ones are left for the next process.
pub(crate) async fn shutdown() {
    let active = ACTIVE.lock().ok().and_then(|mut a| a.take());
    if let Some(sandboxes) = active {
        sandboxes.shutdown().await;
    }
}

/// [`shutdown`] from a place that is about to `exit` (a second signal): on its own thread
/// and runtime, for at most 10 s.
pub(crate) fn shutdown_blocking() {
    let active = ACTIVE.lock().ok().and_then(|mut a| a.take());
    let Some(sandboxes) = active else { return };
    let done = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(async {
                let _ =
                    tokio::time::timeout(std::time::Duration::from_secs(10), sandboxes.shutdown())
                        .await;
            });
        }
    });
    let _ = done.join();
}
