//! Repository automation for the hame workspace.
//!
//! `cargo xtask ci` runs exactly what CI runs (`.ci/run` calls it); `cargo xtask services`
//! installs and starts the test services; `cargo xtask env` prints the variables that point
//! the tests at them; `cargo xtask bench-peers` measures hame beside the peer harnesses.
//! See `docs/testing.md` and `docs/benchmarks.md`.

// A command-line tool: printing progress is its job.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod bench;
mod ci;
mod deps;
mod disk;
mod proc;
mod readme;
mod services;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Result, bail};

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  ci          run every CI step (what `bash .ci/run` runs)
  services    install (if missing) and start Redis, PostgreSQL, MariaDB, moto S3 and Docker
  env         print `export` lines that point the tests at the local services
  readme      run the README's runnable blocks against the binaries in target/debug
              (what the ci step `readme` runs after building them)
  bench-peers build hame's benchmark driver (profile dist) and run it beside the peer
              harnesses of ../shared/bench/peers; prints the ratio table
              ([--peers-dir DIR] [--no-setup] [bench.py options, e.g. --quick])
  help        print this text

ci options:
  --only <step>   run only this step (repeatable)
  --skip <step>   skip this step (repeatable)
  --skip-deny     same as --skip deny
  --fail-fast     stop at the first failing step (default: run all, then report)

steps, in order: services fmt clippy nextest readme doctest deps deny features";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<ExitCode> {
    let Some((command, rest)) = args.split_first() else {
        println!("{USAGE}");
        return Ok(ExitCode::FAILURE);
    };
    let root = workspace_root();
    match command.as_str() {
        "ci" => {
            let options = ci::CiOptions::parse(rest)?;
            ci::run(&root, &options)
        }
        "services" => {
            no_extra_args(rest)?;
            let env = services::start_all(&services::ServiceOptions::from_env(&root)?)?;
            println!("services ready; for your shell:");
            for (key, value) in env.vars() {
                println!("export {key}={value}");
            }
            Ok(ExitCode::SUCCESS)
        }
        "readme" => {
            no_extra_args(rest)?;
            let target = target_dir(&root);
            readme::run(&root, &target.join("debug"), &readme::scratch_dir(&target))?;
            println!("every runnable README block passed");
            Ok(ExitCode::SUCCESS)
        }
        "env" => {
            no_extra_args(rest)?;
            for (key, value) in services::TEST_ENV {
                println!("export {key}={value}");
            }
            Ok(ExitCode::SUCCESS)
        }
        "bench-peers" => {
            bench::run(&root, &bench::BenchOptions::parse(rest)?)?;
            Ok(ExitCode::SUCCESS)
        }
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        other => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}

fn no_extra_args(rest: &[String]) -> Result<()> {
    if let Some(arg) = rest.first() {
        bail!("unexpected argument `{arg}`\n\n{USAGE}");
    }
    Ok(())
}

/// The effective target directory of the workspace at `root`, as cargo sees it:
/// `CARGO_TARGET_DIR`, `CARGO_BUILD_TARGET_DIR` or `build.target-dir` of a cargo config
/// (asked of `cargo metadata`, which knows all three), else `CARGO_TARGET_DIR` when cargo
/// cannot be asked, else `<root>/target`.
pub fn target_dir(root: &Path) -> PathBuf {
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
    let asked = proc::capture(std::process::Command::new(cargo).current_dir(root).args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
    ]))
    .ok()
    .and_then(|json| target_dir_of(&json));
    asked.unwrap_or_else(|| {
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
    })
}

/// `target_directory` of `cargo metadata` output.
fn target_dir_of(metadata: &str) -> Option<PathBuf> {
    let value: serde_json::Value = serde_json::from_str(metadata).ok()?;
    value.get("target_directory")?.as_str().map(PathBuf::from)
}

/// The workspace root: the parent of this crate's manifest directory. `cargo run` sets
/// `CARGO_MANIFEST_DIR` at run time too; the compile-time value is the fallback when the
/// binary is started directly.
fn workspace_root() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.clone(), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_target_dir_is_read_from_cargo_metadata() {
        let json = r#"{"packages": [], "target_directory": "/work/tgt-x", "version": 1}"#;
        assert_eq!(target_dir_of(json), Some(PathBuf::from("/work/tgt-x")));
        assert_eq!(target_dir_of("{}"), None);
        assert_eq!(target_dir_of("not json"), None);
    }

    /// What `cargo metadata` says here is what cargo builds into: with `CARGO_TARGET_DIR`
    /// set (as for every helper of this repository) it is that directory.
    #[test]
    fn the_target_dir_follows_cargo() {
        let root = workspace_root();
        let dir = target_dir(&root);
        match std::env::var_os("CARGO_TARGET_DIR") {
            Some(d) => assert_eq!(dir, root.join(PathBuf::from(d))),
            None => assert!(dir.ends_with("target"), "{}", dir.display()),
        }
    }
}
