//! `cargo xtask ci --only readme`: the README's runnable shell blocks, run as written.
//!
//! A block is runnable when the line before its opening fence is `<!-- runnable -->` (run
//! in a fresh scratch directory) or `<!-- runnable: repo -->` (run at the repository root,
//! for commands such as `cargo run -p example-custom-tool`). Each block runs with
//! `bash -e -o pipefail` in its own process group (whatever it leaves running is killed
//! when it ends), with the workspace's debug binaries (`hame`, `hame-scripted-server`)
//! first on `PATH`, a scratch `HAME_STATE_HOME` and `XDG_CONFIG_HOME`, stdin from
//! `/dev/null`, and a time limit. The caller's model variables are removed; instead
//! `OPENAI_BASE_URL` and `ANTHROPIC_BASE_URL` point at a `hame-scripted-server` started for
//! the block (its looping demo script), standing in for the real endpoints of blocks
//! written for a real model. A non-zero exit fails the step, with the block's output.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The marker of a block that runs in a scratch directory.
const MARKER: &str = "<!-- runnable -->";
/// The marker of a block that runs at the repository root.
const MARKER_REPO: &str = "<!-- runnable: repo -->";
/// Longest run of one block (a `cargo run` in it may compile an example).
const BLOCK_LIMIT: Duration = Duration::from_secs(15 * 60);
/// Variables of the caller that would point the blocks elsewhere than the scripted server.
const CLEARED_PREFIXES: &[&str] = &["OPENAI_", "ANTHROPIC_", "DASHSCOPE_", "OLLAMA_", "HAME_"];

/// Where a block runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cwd {
    /// A fresh scratch directory.
    Scratch,
    /// The repository root.
    Repo,
}

/// One runnable block of a Markdown file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// 1-based line of the opening fence.
    pub line: usize,
    /// Where it runs.
    pub cwd: Cwd,
    /// The shell text between the fences.
    pub text: String,
}

/// The runnable blocks of `markdown`, in order. A marker not followed by a fenced block
/// (` ```sh `, ` ```bash ` or ` ```shell `) on the next line is an error, and so is a block
/// that never closes: a marker that silently matches nothing would test nothing.
pub fn blocks(markdown: &str) -> Result<Vec<Block>> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let cwd = match lines[i].trim() {
            MARKER => Cwd::Scratch,
            MARKER_REPO => Cwd::Repo,
            _ => {
                i += 1;
                continue;
            }
        };
        let fence = lines.get(i + 1).map(|l| l.trim()).unwrap_or_default();
        if !matches!(fence, "```sh" | "```bash" | "```shell") {
            bail!(
                "line {}: a runnable marker must be followed by a ```sh block (found {fence:?})",
                i + 1
            );
        }
        let start = i + 2;
        let end = (start..lines.len())
            .find(|&j| lines[j].trim() == "```")
            .with_context(|| format!("line {}: the runnable block never closes", i + 2))?;
        let mut text = lines[start..end].join("\n");
        text.push('\n');
        out.push(Block {
            line: i + 2,
            cwd,
            text,
        });
        i = end + 1;
    }
    Ok(out)
}

/// Runs every runnable block of `root/README.md` with the binaries of `bin_dir`.
pub fn run(root: &Path, bin_dir: &Path, scratch_root: &Path) -> Result<()> {
    let readme = root.join("README.md");
    let text = std::fs::read_to_string(&readme)
        .with_context(|| format!("cannot read {}", readme.display()))?;
    let blocks = blocks(&text)?;
    if blocks.is_empty() {
        bail!("README.md has no block marked {MARKER}");
    }
    for name in ["hame", "hame-scripted-server"] {
        if !bin_dir.join(name).is_file() {
            bail!(
                "{} is missing: build the workspace's binaries first",
                bin_dir.join(name).display()
            );
        }
    }
    if scratch_root.exists() {
        std::fs::remove_dir_all(scratch_root)
            .with_context(|| format!("cannot empty {}", scratch_root.display()))?;
    }
    let mut failed = Vec::new();
    for (n, block) in blocks.iter().enumerate() {
        let dir = scratch_root.join(format!("block-{}", n + 1));
        let started = Instant::now();
        match run_block(root, bin_dir, &dir, block) {
            Ok(()) => println!(
                "README.md line {}: ok in {:.1} s",
                block.line,
                started.elapsed().as_secs_f64()
            ),
            Err(e) => {
                println!("README.md line {}: FAILED: {e:#}", block.line);
                failed.push(block.line.to_string());
            }
        }
    }
    if !failed.is_empty() {
        bail!("README.md blocks at lines {} failed", failed.join(", "));
    }
    Ok(())
}

fn run_block(root: &Path, bin_dir: &Path, dir: &Path, block: &Block) -> Result<()> {
    let work = dir.join("work");
    for d in [&work, &dir.join("state"), &dir.join("config")] {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let script = dir.join("block.sh");
    std::fs::write(&script, &block.text)?;
    let log_path = dir.join("output.log");
    let log = std::fs::File::create(&log_path)?;
    let mut paths = vec![bin_dir.to_path_buf()];
    if let Some(path) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&path));
    }
    let mut cmd = Command::new("bash");
    cmd.args(["-e", "-o", "pipefail"])
        .arg(&script)
        .current_dir(match block.cwd {
            Cwd::Scratch => work.as_path(),
            Cwd::Repo => root,
        })
        .env("PATH", std::env::join_paths(paths)?)
        .env("HAME_STATE_HOME", dir.join("state"))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if CLEARED_PREFIXES.iter().any(|p| key.starts_with(p)) && key != "HAME_STATE_HOME" {
            cmd.env_remove(key.as_ref());
        }
    }
    let server = DemoServer::start(&bin_dir.join("hame-scripted-server"), dir)?;
    cmd.env("OPENAI_BASE_URL", format!("{}/v1", server.url))
        .env("ANTHROPIC_BASE_URL", &server.url);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().context("cannot start bash")?;
    let pgid = child.id();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > BLOCK_LIMIT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Whatever the block started in the background goes with it.
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let tail = tail(&output, 40);
    match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => bail!("bash exited with {s}; its output:\n{tail}"),
        None => bail!(
            "still running after {} s (killed); its output:\n{tail}",
            BLOCK_LIMIT.as_secs()
        ),
    }
}

/// The stand-in endpoint of one block; killed when dropped.
struct DemoServer {
    child: std::process::Child,
    url: String,
}

impl DemoServer {
    fn start(program: &Path, dir: &Path) -> Result<Self> {
        let out_path = dir.join("server.out");
        let child = Command::new(program)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path)?)
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let mut server = Self {
            child,
            url: String::new(),
        };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            let text = std::fs::read_to_string(&out_path).unwrap_or_default();
            if let Some(url) = text
                .lines()
                .find_map(|l| l.strip_prefix("listening on "))
                .filter(|_| text.contains("export "))
            {
                server.url = url.trim().to_owned();
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("{} exited with {status}", program.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("{} did not start within 30 s", program.display())
    }
}

impl Drop for DemoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The scratch directory of the step: `target/xtask/readme`.
pub fn scratch_dir(target_dir: &Path) -> PathBuf {
    target_dir.join("xtask").join("readme")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn finds_marked_blocks_only() {
        let md = "# t\n\n```sh\nnot marked\n```\n<!-- runnable -->\n```sh\necho a\necho b\n```\n\ntext\n<!-- runnable: repo -->\n```bash\ncargo run\n```\n";
        assert_eq!(
            blocks(md).unwrap_or_default(),
            vec![
                Block {
                    line: 7,
                    cwd: Cwd::Scratch,
                    text: "echo a\necho b\n".into()
                },
                Block {
                    line: 14,
                    cwd: Cwd::Repo,
                    text: "cargo run\n".into()
                },
            ]
        );
    }

    #[test]
    fn a_marker_without_a_block_is_an_error() {
        for md in [
            "<!-- runnable -->\ntext\n```sh\necho\n```\n",
            "<!-- runnable -->\n```rust\nfn main() {}\n```\n",
            "<!-- runnable -->\n```sh\necho\n",
            "<!-- runnable -->",
        ] {
            assert!(blocks(md).is_err(), "{md}");
        }
    }
}
