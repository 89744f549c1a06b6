//! `cargo xtask ci`: every CI step, in order, each timed.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::deps::{FACADE, Graph};
use crate::disk;
use crate::proc;
use crate::services::{self, ServiceEnv, ServiceOptions};

/// One CI step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Install and start the test services.
    Services,
    /// `cargo fmt --check`.
    Fmt,
    /// `cargo clippy -D warnings` on all targets and features.
    Clippy,
    /// `cargo nextest run` with the `ci` profile.
    Nextest,
    /// The README's runnable shell blocks, run as written (`readme.rs`).
    Readme,
    /// `cargo test --doc`.
    Doctest,
    /// Dependency-direction checks over `cargo metadata`.
    Deps,
    /// `cargo deny check bans licenses sources`.
    Deny,
    /// `cargo check -p hame --no-default-features --features <f>` per facade feature.
    Features,
}

impl Step {
    /// All steps in the order CI runs them.
    pub const ALL: [Step; 9] = [
        Step::Services,
        Step::Fmt,
        Step::Clippy,
        Step::Nextest,
        Step::Readme,
        Step::Doctest,
        Step::Deps,
        Step::Deny,
        Step::Features,
    ];

    /// The name used on the command line and in the log.
    pub fn name(self) -> &'static str {
        match self {
            Step::Services => "services",
            Step::Fmt => "fmt",
            Step::Clippy => "clippy",
            Step::Nextest => "nextest",
            Step::Readme => "readme",
            Step::Doctest => "doctest",
            Step::Deps => "deps",
            Step::Deny => "deny",
            Step::Features => "features",
        }
    }

    fn parse(name: &str) -> Result<Self> {
        Step::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .with_context(|| {
                let names: Vec<&str> = Step::ALL.iter().map(|s| s.name()).collect();
                format!("unknown step `{name}`; steps: {}", names.join(" "))
            })
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What `cargo xtask ci` should run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiOptions {
    /// The steps to run, in CI order.
    pub steps: Vec<Step>,
    /// Stop after the first failing step.
    pub fail_fast: bool,
}

impl CiOptions {
    /// Parses `--only <step>`, `--skip <step>`, `--skip-deny` and `--fail-fast`.
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut only = Vec::new();
        let mut skip = Vec::new();
        let mut fail_fast = false;
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--only" | "--skip" => {
                    let value = args
                        .next()
                        .with_context(|| format!("{arg} needs a step name"))?;
                    let list = if arg == "--only" {
                        &mut only
                    } else {
                        &mut skip
                    };
                    for name in value.split(',') {
                        list.push(Step::parse(name)?);
                    }
                }
                "--skip-deny" => skip.push(Step::Deny),
                "--fail-fast" => fail_fast = true,
                other => bail!("unknown ci option `{other}`"),
            }
        }
        let steps = Step::ALL
            .into_iter()
            .filter(|s| only.is_empty() || only.contains(s))
            .filter(|s| !skip.contains(s))
            .collect();
        Ok(Self { steps, fail_fast })
    }
}

struct Outcome {
    step: Step,
    elapsed: Duration,
    result: Result<()>,
}

/// Runs the selected steps; returns failure if any step failed.
pub fn run(root: &Path, options: &CiOptions) -> Result<ExitCode> {
    let mut ctx = Ctx::new(root)?;
    let total = Instant::now();
    let mut env = None;
    let mut outcomes = Vec::new();
    let count = options.steps.len();
    println!(
        "xtask ci: {count} step(s): {}  (CI={})",
        options
            .steps
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(" "),
        std::env::var("CI").unwrap_or_default()
    );
    // Compiling cargo-deny (or cargo-nextest, when a machine lacks it) takes minutes; start
    // it now so it overlaps the services step, which mostly waits on apt and pip.
    for (step, tool) in [(Step::Nextest, NEXTEST), (Step::Deny, DENY)] {
        if options.steps.contains(&step) {
            ctx.start_background_install(tool)?;
        }
    }
    for (index, step) in options.steps.iter().copied().enumerate() {
        println!(
            "\n==> [{}/{count}] {step}  ({})",
            index + 1,
            disk::report(&ctx.target_dir)
        );
        if step == Step::Features && hame_test_env::ci() {
            // The test executables (gigabytes) are no longer needed; the feature checks
            // need room for their own metadata.
            match disk::prune_test_executables(&ctx.target_dir) {
                Ok(freed) => println!("removed the test executables: {} MiB", freed >> 20),
                Err(e) => println!("could not remove the test executables: {e:#}"),
            }
        }
        let started = Instant::now();
        let result = match step {
            Step::Services => ServiceOptions::from_env(root)
                .and_then(|o| {
                    services::start_all(&ServiceOptions {
                        // Built by the nextest step from its own `hame` (one CLI build).
                        sandbox_image: !options.steps.contains(&Step::Nextest),
                        ..o
                    })
                })
                .map(|e| env = Some(e)),
            other => ctx.run_step(other, env.as_ref()),
        };
        let elapsed = started.elapsed();
        match &result {
            Ok(()) => println!("<== {step}: ok in {}", seconds(elapsed)),
            Err(err) => println!("<== {step}: FAILED in {}: {err:#}", seconds(elapsed)),
        }
        let failed = result.is_err();
        outcomes.push(Outcome {
            step,
            elapsed,
            result,
        });
        if failed && options.fail_fast {
            break;
        }
    }
    println!(
        "\nxtask ci summary (total {}; {}):",
        seconds(total.elapsed()),
        disk::report(&ctx.target_dir)
    );
    for outcome in &outcomes {
        let status = if outcome.result.is_ok() {
            "ok"
        } else {
            "FAILED"
        };
        println!(
            "  {:<9} {:<7} {:>9}",
            outcome.step.name(),
            status,
            seconds(outcome.elapsed)
        );
    }
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.result.is_err())
        .map(|o| o.step.name())
        .collect();
    if failed.is_empty() {
        println!("all steps passed");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("failed steps: {}", failed.join(" "));
        Ok(ExitCode::FAILURE)
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // A step list cut short (--fail-fast) must not leave an orphaned `cargo install`.
        for install in &mut self.background {
            let _ = install.child.kill();
            let _ = install.child.wait();
        }
    }
}

/// cargo-deny's diagnostics without the `warning[duplicate]` blocks, and how many there
/// were. A block starts at a line `warning[...]`, `error[...]`, `note[...]` or
/// `help[...]` and runs to the next one (or to a line that starts a summary, like
/// `bans ok`).
fn summarise_deny(stderr: &str) -> (String, usize) {
    let starts_block = |l: &str| {
        ["warning[", "error[", "note[", "help["]
            .iter()
            .any(|p| l.starts_with(p))
    };
    // A line of a block is indented, a box-drawing line or a numbered source line.
    let ends_block = |l: &str| l.starts_with(|c: char| c.is_ascii_alphabetic());
    let mut kept = String::new();
    let mut duplicates = 0;
    let mut skipping = false;
    for line in stderr.lines() {
        if starts_block(line) {
            skipping = line.starts_with("warning[duplicate]");
            if skipping {
                duplicates += 1;
            }
        } else if skipping && ends_block(line) {
            skipping = false;
        }
        if !skipping {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    (kept, duplicates)
}

/// A cargo subcommand CI installs from crates.io when it is missing.
#[derive(Debug, Clone, Copy)]
struct Tool {
    /// `cargo <sub>`.
    sub: &'static str,
    krate: &'static str,
    /// Version requirement: the major line whose config format we rely on.
    version: &'static str,
}

const DENY: Tool = Tool {
    sub: "deny",
    krate: "cargo-deny",
    version: "^0.20",
};
const NEXTEST: Tool = Tool {
    sub: "nextest",
    krate: "cargo-nextest",
    version: "^0.9",
};

/// A `cargo install` running while other steps proceed.
#[derive(Debug)]
struct BackgroundInstall {
    tool: Tool,
    child: Child,
    log: PathBuf,
}

/// The workspace and the tools CI needs.
struct Ctx {
    root: PathBuf,
    cargo: PathBuf,
    target_dir: PathBuf,
    background: Vec<BackgroundInstall>,
}

impl Ctx {
    fn new(root: &Path) -> Result<Self> {
        let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
        let target_dir = crate::target_dir(root);
        Ok(Self {
            root: root.to_path_buf(),
            cargo,
            target_dir,
            background: Vec::new(),
        })
    }

    /// Where CI installs the tools it needs: `target/xtask/tools` (binaries in its `bin/`),
    /// never `~/.cargo/bin`.
    fn tools_root(&self) -> PathBuf {
        self.target_dir.join("xtask").join("tools")
    }

    /// `PATH` with the tools' `bin/` first, so `cargo deny` finds the one CI installed.
    fn tools_path(&self) -> std::ffi::OsString {
        let mut paths = vec![self.tools_root().join("bin")];
        if let Some(path) = std::env::var_os("PATH") {
            paths.extend(std::env::split_paths(&path));
        }
        std::env::join_paths(paths).unwrap_or_else(|_| std::env::var_os("PATH").unwrap_or_default())
    }

    /// `cargo <args>` in the workspace root, with the service variables set. Under CI
    /// without incremental compilation: a one-shot build gains nothing from it, and its
    /// caches take gigabytes of the machine's disk.
    fn cargo(&self, env: Option<&ServiceEnv>) -> Command {
        let mut cmd = Command::new(&self.cargo);
        cmd.current_dir(&self.root).env("PATH", self.tools_path());
        if hame_test_env::ci() {
            cmd.env("CARGO_INCREMENTAL", "0");
        }
        if let Some(env) = env {
            cmd.envs(env.vars());
        }
        cmd
    }

    fn run_step(&mut self, step: Step, env: Option<&ServiceEnv>) -> Result<()> {
        match step {
            Step::Services => Ok(()),
            Step::Fmt => proc::run(self.cargo(None).args(["fmt", "--all", "--", "--check"])),
            Step::Clippy => proc::run(self.cargo(None).args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--all-features",
                "--",
                "-D",
                "warnings",
            ])),
            Step::Nextest => {
                self.ensure_tool(NEXTEST)?;
                if env.is_some() {
                    // The test build (the command nextest runs, so nextest's own is then a
                    // no-op), then the sandbox image from the `hame` it made.
                    proc::run(self.cargo(env).args([
                        "test",
                        "--no-run",
                        "--workspace",
                        "--all-features",
                    ]))?;
                    services::build_sandbox_image_with(&self.target_dir.join("debug/hame"))?;
                }
                let result = proc::run(self.cargo(env).args([
                    "nextest",
                    "run",
                    "--workspace",
                    "--all-features",
                    "--profile",
                    "ci",
                ]));
                // The keys the tests left (unique agents and prefixes, in the tests' own
                // database) go with them.
                if env.is_some() {
                    let db = crate::services::REDIS_TEST_DB;
                    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 6379));
                    if proc::redis_flushdb(addr, db) {
                        println!("redis: emptied the tests' database {db}");
                    } else {
                        println!("redis: could not empty the tests' database {db}");
                    }
                }
                result
            }
            Step::Readme => {
                // The binaries the blocks run: what the nextest step built (the same
                // command, so a no-op after it).
                proc::run(self.cargo(None).args([
                    "test",
                    "--no-run",
                    "--workspace",
                    "--all-features",
                ]))?;
                crate::readme::run(
                    &self.root,
                    &self.target_dir.join("debug"),
                    &crate::readme::scratch_dir(&self.target_dir),
                )
            }
            Step::Doctest => {
                proc::run(
                    self.cargo(env)
                        .args(["test", "--doc", "--workspace", "--all-features"]),
                )
            }
            Step::Deps => self.check_deps(),
            Step::Deny => {
                proc::run(self.cargo(None).arg("fetch"))?;
                self.ensure_tool(DENY)?;
                let mut cmd = self.cargo(None);
                cmd.args(["deny", "--offline", "check", "bans", "licenses", "sources"]);
                println!("$ {}", proc::display(&cmd));
                let out = cmd
                    .stdin(std::process::Stdio::null())
                    .output()
                    .context("run cargo deny")?;
                print!("{}", String::from_utf8_lossy(&out.stdout));
                // The duplicate-version warnings (hundreds of lines) as one line; every
                // other diagnostic as cargo-deny printed it.
                let (kept, duplicates) = summarise_deny(&String::from_utf8_lossy(&out.stderr));
                eprint!("{kept}");
                if duplicates > 0 {
                    println!(
                        "deny: {duplicates} crate(s) in more than one version (warnings; \
                         `cargo deny check bans` lists them)"
                    );
                }
                if out.status.success() {
                    Ok(())
                } else {
                    bail!("cargo deny failed with {}", out.status)
                }
            }
            Step::Features => self.check_features(),
        }
    }

    fn metadata(&self) -> Result<Graph> {
        let json = proc::capture(self.cargo(None).args([
            "metadata",
            "--format-version",
            "1",
            "--all-features",
        ]))?;
        let value: serde_json::Value =
            serde_json::from_str(&json).context("parse cargo metadata output")?;
        Graph::from_metadata(&value)
    }

    fn check_deps(&self) -> Result<()> {
        let graph = self.metadata()?;
        println!("dependency graph: {}", graph.summary());
        let violations = graph.violations();
        if violations.is_empty() {
            println!("dependency directions: ok");
            return Ok(());
        }
        for violation in &violations {
            println!("  violation: {violation}");
        }
        bail!("{} dependency rule violation(s)", violations.len())
    }

    fn check_features(&self) -> Result<()> {
        let graph = self.metadata()?;
        let Some(plan) = graph.feature_plan(FACADE) else {
            println!("no `{FACADE}` crate in the workspace yet; nothing to check");
            return Ok(());
        };
        if !plan.aggregates.is_empty() {
            println!(
                "not checked alone (aggregates, covered by --all-features): {}",
                plan.aggregates.join(", ")
            );
        }
        let mut sets: Vec<Option<String>> = vec![None];
        sets.extend(plan.check.into_iter().map(Some));
        let mut failed = Vec::new();
        for set in &sets {
            let mut cmd = self.cargo(None);
            cmd.args(["check", "-p", FACADE, "--no-default-features"]);
            if let Some(feature) = set {
                cmd.args(["--features", feature]);
            }
            let started = Instant::now();
            let label = set.as_deref().unwrap_or("(none)");
            match proc::run(&mut cmd) {
                Ok(()) => println!("feature {label}: ok in {}", seconds(started.elapsed())),
                Err(err) => {
                    println!("feature {label}: FAILED: {err:#}");
                    failed.push(label.to_owned());
                }
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            bail!(
                "`{FACADE}` does not build with feature(s): {}",
                failed.join(", ")
            )
        }
    }

    fn has_tool(&self, tool: Tool) -> bool {
        proc::succeeds_quietly(
            Command::new(&self.cargo)
                .args([tool.sub, "--version"])
                .env("PATH", self.tools_path()),
            Duration::from_secs(30),
        )
    }

    fn install_command(&self, tool: Tool) -> Command {
        let mut cmd = Command::new(&self.cargo);
        cmd.args(["install", "--locked", tool.krate, "--version", tool.version])
            // Binaries in target/xtask/tools/bin (found first on the PATH of every cargo
            // command CI runs), never in ~/.cargo/bin.
            .arg("--root")
            .arg(self.tools_root())
            // Inside the one target dir, so a reinstall is incremental.
            .arg("--target-dir")
            .arg(self.tools_root().join("build"));
        cmd
    }

    /// Starts `cargo install` for `tool` in the background when it is missing.
    fn start_background_install(&mut self, tool: Tool) -> Result<()> {
        if self.has_tool(tool) {
            return Ok(());
        }
        let dir = self.target_dir.join("xtask");
        std::fs::create_dir_all(&dir)?;
        let log = dir.join(format!("install-{}.log", tool.krate));
        let file = File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = self.install_command(tool);
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        println!(
            "`cargo {}` is missing; installing it in the background: {} (log: {})",
            tool.sub,
            proc::display(&cmd),
            log.display()
        );
        let child = cmd.spawn().context("start cargo install")?;
        self.background.push(BackgroundInstall { tool, child, log });
        Ok(())
    }

    /// Makes sure `cargo <sub>` works: waits for a background install of it, or installs it
    /// in the foreground.
    fn ensure_tool(&mut self, tool: Tool) -> Result<()> {
        if let Some(index) = self
            .background
            .iter()
            .position(|b| b.tool.krate == tool.krate)
        {
            let mut install = self.background.swap_remove(index);
            println!("waiting for the background install of {}", tool.krate);
            let status = install.child.wait()?;
            if !status.success() {
                let log = std::fs::read_to_string(&install.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                for line in tail.into_iter().rev() {
                    println!("  | {line}");
                }
                bail!("installing {} failed with {status}", tool.krate);
            }
        }
        if self.has_tool(tool) {
            return Ok(());
        }
        println!(
            "`cargo {}` is missing; installing {} {} (takes minutes)",
            tool.sub, tool.krate, tool.version
        );
        proc::run(&mut self.install_command(tool))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn no_options_runs_everything_in_order() -> Result<()> {
        assert_eq!(
            CiOptions::parse(&[])?,
            CiOptions {
                steps: Step::ALL.to_vec(),
                fail_fast: false,
            }
        );
        Ok(())
    }

    #[test]
    fn only_and_skip_select_steps_but_keep_ci_order() -> Result<()> {
        let options = CiOptions::parse(&args(&[
            "--only",
            "deps",
            "--only",
            "fmt,clippy",
            "--skip",
            "clippy",
            "--fail-fast",
        ]))?;
        assert_eq!(
            options,
            CiOptions {
                steps: vec![Step::Fmt, Step::Deps],
                fail_fast: true,
            }
        );
        Ok(())
    }

    #[test]
    fn duplicate_warnings_become_one_count() {
        let stderr = "\
warning[duplicate]: found 2 duplicate entries for crate 'hashbrown'
   ┌─ /w/Cargo.lock:10:1
   │
10 │ hashbrown 0.14.5 registry+https://github.com/rust-lang/crates.io-index
   │ ------------------------------------------------------------------- lock entries

warning[duplicate]: found 2 duplicate entries for crate 'getrandom'
   ┌─ /w/Cargo.lock:5:1

error[rejected]: failed to satisfy license requirements
   ┌─ foo 1.0.0
bans ok, licenses FAILED, sources ok
";
        let (kept, n) = summarise_deny(stderr);
        assert_eq!(n, 2);
        assert_eq!(
            kept,
            "error[rejected]: failed to satisfy license requirements\n   ┌─ foo 1.0.0\nbans ok, licenses FAILED, sources ok\n"
        );
    }

    #[test]
    fn skip_deny_drops_only_deny() -> Result<()> {
        let options = CiOptions::parse(&args(&["--skip-deny"]))?;
        let expected: Vec<Step> = Step::ALL.into_iter().filter(|s| *s != Step::Deny).collect();
        assert_eq!(options.steps, expected);
        Ok(())
    }

    #[test]
    fn bad_options_are_rejected() {
        assert!(CiOptions::parse(&args(&["--only", "lint"])).is_err());
        assert!(CiOptions::parse(&args(&["--only"])).is_err());
        assert!(CiOptions::parse(&args(&["--verbose"])).is_err());
    }

    proptest::proptest! {
        /// Whatever `--only`/`--skip` say, the selection keeps CI order, has no duplicates,
        /// contains no skipped step and only requested steps.
        #[test]
        fn selection_is_an_ordered_subset(
            only in proptest::collection::vec(0..Step::ALL.len(), 0..5),
            skip in proptest::collection::vec(0..Step::ALL.len(), 0..5),
        ) {
            let mut list = Vec::new();
            for i in &only {
                list.extend(["--only".to_owned(), Step::ALL[*i].name().to_owned()]);
            }
            for i in &skip {
                list.extend(["--skip".to_owned(), Step::ALL[*i].name().to_owned()]);
            }
            let steps = CiOptions::parse(&list).map_err(|e| {
                proptest::test_runner::TestCaseError::fail(e.to_string())
            })?.steps;
            let positions: Vec<usize> = steps
                .iter()
                .filter_map(|s| Step::ALL.iter().position(|a| a == s))
                .collect();
            proptest::prop_assert!(positions.windows(2).all(|w| w[0] < w[1]));
            for step in &steps {
                let index = Step::ALL.iter().position(|a| a == step).unwrap_or(usize::MAX);
                proptest::prop_assert!(!skip.contains(&index));
                proptest::prop_assert!(only.is_empty() || only.contains(&index));
            }
            let expected = Step::ALL.len()
                - (0..Step::ALL.len())
                    .filter(|i| skip.contains(i) || !(only.is_empty() || only.contains(i)))
                    .count();
            proptest::prop_assert_eq!(steps.len(), expected);
        }
    }

    #[test]
    fn step_names_round_trip() -> Result<()> {
        for step in Step::ALL {
            assert_eq!(Step::parse(&step.to_string())?, step);
        }
        Ok(())
    }
}
