//! Helpers to run the `hame` binary with a clean, explicit environment.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The path of the built `hame` binary.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_hame")
}

/// A command with an empty environment except PATH and the given variables.
pub fn hame(args: &[&str], env: &[(&str, &str)], cwd: &Path) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", cwd)
        .current_dir(cwd)
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs the command on a blocking thread so the scripted server keeps serving.
pub async fn output(mut cmd: Command) -> std::io::Result<Output> {
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .map_err(std::io::Error::other)?
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
