//! Helpers to run the `hame` binary with a clean, explicit environment.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

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

/// A child process, killed (and reaped) when dropped.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// SIGKILL and reap, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::ops::Deref for KillOnDrop {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// Starts `hame <command> --model openai:m --no-memory --workspace <dir>/ws <args>` as the
/// service tests run it: an empty environment but PATH, HOME = `dir`, the model at `model`,
/// state under `dir/state`, then `env`; stdout piped, stderr to `stderr`. The process
/// (killed when dropped) and the first line it printed.
pub fn start_hame(
    dir: &Path,
    model: &str,
    command: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
    stderr: Stdio,
) -> Result<(KillOnDrop, String), Box<dyn std::error::Error>> {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws)?;
    let mut child = KillOnDrop(
        Command::new(bin())
            .args(command)
            .args(["--model", "openai:m", "--no-memory", "--workspace"])
            .arg(&ws)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", dir)
            .env("OPENAI_BASE_URL", model)
            .env("HAME_STATE_HOME", dir.join("state"))
            .envs(env.iter().copied())
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?,
    );
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    Ok((child, line))
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

/// Runs `hame run --model openai:m <args...> <message>` against `base` with state under
/// `dir/state`, returning the output.
pub async fn run_with(
    dir: &Path,
    base: &str,
    args: &[&str],
    message: &str,
    extra_env: &[(&str, &str)],
) -> std::io::Result<Output> {
    let state = dir.join("state");
    let state = state.to_string_lossy().into_owned();
    let mut all: Vec<&str> = vec!["run", "--model", "openai:m"];
    all.extend_from_slice(args);
    all.push(message);
    let mut env: Vec<(&str, &str)> = vec![("OPENAI_BASE_URL", base), ("HAME_STATE_HOME", &state)];
    env.extend_from_slice(extra_env);
    output(hame(&all, &env, dir)).await
}

/// [`run_with`] without extra variables that must exit 0 (else the error carries stderr).
pub async fn run_ok(
    dir: &Path,
    base: &str,
    args: &[&str],
    message: &str,
) -> Result<Output, Box<dyn std::error::Error>> {
    let out = run_with(dir, base, args, message, &[]).await?;
    if out.status.code() != Some(0) {
        return Err(format!("hame run exited {:?}: {}", out.status, stderr(&out)).into());
    }
    Ok(out)
}

/// Runs `hame chat --model openai:m --workspace <ws>` against `base` (state under
/// `dir/state`), typing `input` on its standard input; it must exit 0.
pub async fn chat_ok(
    dir: &Path,
    base: &str,
    ws: &str,
    input: &'static [u8],
) -> Result<Output, Box<dyn std::error::Error>> {
    use std::io::Write;
    let state = dir.join("state").to_string_lossy().into_owned();
    let env = [
        ("OPENAI_BASE_URL", base),
        ("HAME_STATE_HOME", state.as_str()),
    ];
    let mut cmd = hame(
        &["chat", "--model", "openai:m", "--workspace", ws],
        &env,
        dir,
    );
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::task::spawn_blocking(move || -> std::io::Result<Output> {
        let mut child = cmd.spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input)?;
        }
        child.wait_with_output()
    })
    .await??;
    if out.status.code() != Some(0) {
        return Err(format!("hame chat exited {:?}: {}", out.status, stderr(&out)).into());
    }
    Ok(out)
}

/// The system prompt of a recorded OpenAI-style request.
pub fn system_of(body: &serde_json::Value) -> String {
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The text of the last tool message of a recorded OpenAI-style request.
pub fn last_tool_result(body: &serde_json::Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "tool"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The URL of a test service from `var`, or `None` (with a loud SKIPPED line) when it is
/// not configured. Under CI a missing service is a failure.
pub fn service(var: &str) -> Option<String> {
    hame_test_env::service(var, "CLI")
}

/// A unique agent id, so parallel tests never share keys in a shared store.
pub fn unique_agent() -> String {
    format!("t{}", std::process::id()) + &format!("-{}", rand_suffix())
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{nanos}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Where the default JSON state of workspace `ws` lives when `HAME_STATE_HOME` is
/// `dir/state` (keyed by the workspace identity).
pub fn state_dir(dir: &Path, ws: &Path) -> std::path::PathBuf {
    dir.join("state")
        .join(hame::harness::workspace_identity(ws))
}

/// The role of the last message of a recorded OpenAI-style request.
pub fn last_role(req: &hame_test_support::RecordedRequest) -> String {
    req.body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["role"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The tool results of the last recorded request, in order.
pub fn tool_results(server: &hame_test_support::ScriptedServer) -> Vec<String> {
    let reqs = server.requests();
    let Some(last) = reqs.last() else {
        return Vec::new();
    };
    texts_of_role(&last.body, "tool")
}

/// The text contents of the messages with `role` of a recorded OpenAI-style request.
pub fn texts_of_role(body: &serde_json::Value, role: &str) -> Vec<String> {
    body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == role)
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `hame run` (as [`run_with`]) against a new scripted server that answers with
/// `steps`; returns the output and the server (its recorded requests).
pub async fn run_script(
    dir: &Path,
    args: &[&str],
    message: &str,
    steps: Vec<hame_test_support::ScriptStep>,
    extra_env: &[(&str, &str)],
) -> Result<(Output, hame_test_support::ScriptedServer), Box<dyn std::error::Error>> {
    let server = hame_test_support::ScriptedServer::start().await?;
    server.push_all(steps);
    let out = run_with(dir, &server.base_url(), args, message, extra_env).await?;
    Ok((out, server))
}

/// The names of the tools offered in a recorded OpenAI-style request, sorted.
pub fn tool_names(body: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = body["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The `hame: warning:` lines of a run's stderr.
pub fn warnings(o: &Output) -> Vec<String> {
    stderr(o)
        .lines()
        .filter(|l| l.starts_with("hame: warning:"))
        .map(str::to_owned)
        .collect()
}

/// The first request of one `hame run` with `args` (the model answers "ok").
async fn first_request(
    dir: &Path,
    args: &[&str],
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let steps = vec![hame_test_support::ScriptStep::text("ok")];
    let (out, server) = run_script(dir, args, "hi", steps, &[]).await?;
    if out.status.code() != Some(0) {
        return Err(format!("hame run failed: {}", stderr(&out)).into());
    }
    let reqs = server.requests();
    Ok(reqs.first().map(|r| r.body.clone()).unwrap_or_default())
}

/// The system prompt of one `hame run` with `args`.
pub async fn prompt_of(dir: &Path, args: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
    Ok(system_of(&first_request(dir, args).await?))
}

/// The tools offered in one `hame run` with `args`, sorted.
pub async fn tools_offered(
    dir: &Path,
    args: &[&str],
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    Ok(tool_names(&first_request(dir, args).await?))
}

/// A Python that imports `module`: a venv `<target tmp>/<name>` created once (under a
/// lock) with `python3 -m venv` and `pip install <requirement>` (several requirements
/// separated by spaces). `None` (with a loud
/// SKIPPED line) when that is impossible; under CI a failure.
pub fn python_venv(name: &str, requirement: &str, module: &str) -> Option<std::path::PathBuf> {
    let root = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let venv = root.join(name);
    let python = venv.join("bin/python");
    let ok = |py: &std::path::Path| {
        std::process::Command::new(py)
            .args(["-c", &format!("import {module}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    let setup = || -> Result<(), String> {
        std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
        let lock =
            std::fs::File::create(root.join(format!("{name}.lock"))).map_err(|e| e.to_string())?;
        lock.lock().map_err(|e| e.to_string())?;
        if ok(&python) {
            return Ok(());
        }
        let run = |cmd: &mut std::process::Command| -> Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)))
            }
        };
        run(std::process::Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv))?;
        run(std::process::Command::new(venv.join("bin/pip"))
            .args([
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-cache-dir",
            ])
            .args(requirement.split_whitespace()))?;
        if ok(&python) {
            Ok(())
        } else {
            Err(format!("{module} does not import after pip install"))
        }
    };
    if ok(&python) {
        return Some(python);
    }
    match setup() {
        Ok(()) => Some(python),
        Err(e) => {
            hame_test_env::skip(format_args!("cannot set up {requirement} ({e})"));
            None
        }
    }
}

/// Runs `hame chat` with `input` on its stdin (a pipe).
pub async fn chat(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    input: &str,
) -> std::io::Result<std::process::Output> {
    use std::io::Write;
    use std::process::Stdio;
    let mut all = vec!["chat"];
    all.extend_from_slice(args);
    let mut cmd = hame(&all, env, dir);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let input = input.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input.as_bytes())?;
        }
        child.wait_with_output()
    })
    .await
    .map_err(std::io::Error::other)?
}

/// `cmd` (program, arguments, environment, directory) run by `script` on a new
/// pseudo-terminal, with stdin from `stdin_file`: stdout and stderr are a terminal, stdin
/// is not. What the terminal showed is the output's stdout. `None` when `script` (util-linux)
/// is missing.
pub fn on_a_terminal(cmd: &Command, stdin_file: &Path) -> Option<Command> {
    let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', "'\\''"));
    let mut line = quote(cmd.get_program());
    for a in cmd.get_args() {
        line.push(' ');
        line.push_str(&quote(a));
    }
    line.push_str(" < ");
    line.push_str(&quote(stdin_file.as_os_str()));
    let script = ["/usr/bin/script", "/bin/script"]
        .into_iter()
        .find(|p| Path::new(p).is_file())?;
    let mut term = Command::new(script);
    term.args(["-q", "-e", "-c", &line, "/dev/null"])
        .env_clear()
        .env("TERM", "xterm")
        .stdin(Stdio::null());
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            term.env(k, v);
        }
    }
    if let Some(d) = cmd.get_current_dir() {
        term.current_dir(d);
    }
    Some(term)
}

/// One CLI test's scratch set-up: a temporary directory, a workspace `ws` in it and a
/// started scripted model server. Its runs are `hame run --model openai:m` against that
/// server, with state under `<dir>/state` (as [`run_with`]).
pub struct Scratch {
    /// The temporary directory (removed on drop): the runs' cwd and HOME.
    pub dir: tempfile::TempDir,
    /// The workspace, `<dir>/ws`.
    pub ws: std::path::PathBuf,
    /// The workspace as a string, for `--workspace`.
    pub ws_s: String,
    /// The scripted model server.
    pub server: hame_test_support::ScriptedServer,
}

impl Scratch {
    /// A new scratch with an empty workspace and a server with no script yet.
    pub async fn new() -> Result<Self, Box<dyn std::error::Error>> {
        let server = hame_test_support::ScriptedServer::start().await?;
        let dir = tempfile::tempdir()?;
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws)?;
        let ws_s = ws.to_string_lossy().into_owned();
        Ok(Self {
            dir,
            ws,
            ws_s,
            server,
        })
    }

    /// [`Scratch::new`] with the model answering `steps`.
    pub async fn scripted(
        steps: impl IntoIterator<Item = hame_test_support::ScriptStep>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let s = Self::new().await?;
        s.server.push_all(steps);
        Ok(s)
    }

    /// The temporary directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `content` to `rel` in the workspace, creating its folders.
    pub fn write(&self, rel: &str, content: &str) -> std::io::Result<()> {
        let path = self.ws.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, content)
    }

    /// `--workspace <ws>` followed by `extra`.
    pub fn ws_args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec!["--workspace", self.ws_s.as_str()];
        all.extend_from_slice(extra);
        all
    }

    /// `hame run <args> <message>` with `env` added (as [`run_with`]).
    pub async fn run(
        &self,
        args: &[&str],
        message: &str,
        env: &[(&str, &str)],
    ) -> std::io::Result<Output> {
        run_with(self.path(), &self.server.base_url(), args, message, env).await
    }

    /// [`Scratch::run`] that must exit `code` (else the error carries stderr).
    pub async fn run_code(
        &self,
        code: i32,
        args: &[&str],
        message: &str,
        env: &[(&str, &str)],
    ) -> Result<Output, Box<dyn std::error::Error>> {
        let out = self.run(args, message, env).await?;
        if out.status.code() != Some(code) {
            return Err(format!(
                "hame run exited {:?}, not {code}: {}",
                out.status,
                stderr(&out)
            )
            .into());
        }
        Ok(out)
    }

    /// `hame run --workspace <ws> <args> <message>` that must exit 0.
    pub async fn run_ws(
        &self,
        args: &[&str],
        message: &str,
    ) -> Result<Output, Box<dyn std::error::Error>> {
        self.run_code(0, &self.ws_args(args), message, &[]).await
    }

    /// `hame <args>` (any subcommand) with the scratch's model and state variables.
    pub async fn hame(&self, args: &[&str]) -> std::io::Result<Output> {
        self.hame_env(args, &[]).await
    }

    /// [`Scratch::hame`] with `extra` variables added.
    pub async fn hame_env(&self, args: &[&str], extra: &[(&str, &str)]) -> std::io::Result<Output> {
        let (base, state) = (self.server.base_url(), self.state());
        let mut env = vec![
            ("OPENAI_BASE_URL", base.as_str()),
            ("HAME_STATE_HOME", state.as_str()),
        ];
        env.extend_from_slice(extra);
        output(hame(args, &env, self.path())).await
    }

    /// `hame chat <args>` with the scratch's model and state variables, typing `input` on
    /// its standard input (a pipe), as [`chat`].
    pub async fn chat(&self, args: &[&str], input: &str) -> std::io::Result<Output> {
        let (base, state) = (self.server.base_url(), self.state());
        let env = [
            ("OPENAI_BASE_URL", base.as_str()),
            ("HAME_STATE_HOME", state.as_str()),
        ];
        chat(self.path(), args, &env, input).await
    }

    /// `hame sessions <what> default <extra> --workspace <ws>`: about the workspace's
    /// default session.
    pub async fn session(&self, what: &str, extra: &[&str]) -> std::io::Result<Output> {
        let mut args = vec!["sessions", what, "default"];
        args.extend_from_slice(extra);
        args.extend(["--workspace", self.ws_s.as_str()]);
        self.hame(&args).await
    }

    /// [`Scratch::session`] with `--json` added, that must exit 0: its JSON.
    pub async fn session_json(
        &self,
        what: &str,
        extra: &[&str],
    ) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        let mut all = extra.to_vec();
        all.push("--json");
        let out = self.session(what, &all).await?;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        Ok(serde_json::from_str(&stdout(&out))?)
    }

    /// The state home of the runs, `<dir>/state`.
    pub fn state(&self) -> String {
        self.path().join("state").to_string_lossy().into_owned()
    }

    /// The tool results of the last recorded request, in order.
    pub fn results(&self) -> Vec<String> {
        tool_results(&self.server)
    }
}

/// Every file under `root` whose bytes contain `needle`.
pub fn files_containing(root: &Path, needle: &str) -> Vec<std::path::PathBuf> {
    hame_test_support::files_where(root, &|path| {
        std::fs::read(path).is_ok_and(|b| String::from_utf8_lossy(&b).contains(needle))
    })
}

/// One test per backend, each running `$body` with that backend's `--state`: `json` is a
/// fresh directory (JSON state), a string names the test service's variable (a loud skip
/// when it is unset, a failure under CI). The test attribute is `#[tokio::test]` unless one
/// is given first. Callers have `TestResult` and `service` in scope.
macro_rules! backend_tests {
    (#[$attr:meta] $body:ident { $($test:ident: $backend:tt),+ $(,)? }) => {
        $(
            #[$attr]
            async fn $test() -> TestResult {
                backend_tests!(@run $body, $backend)
            }
        )+
    };
    (@run $body:ident, json) => {{
        let shared = tempfile::tempdir()?;
        $body(&shared.path().to_string_lossy()).await
    }};
    (@run $body:ident, $var:literal) => {{
        let Some(url) = service($var) else {
            return Ok(());
        };
        $body(&url).await
    }};
    ($body:ident { $($rest:tt)* }) => {
        backend_tests!(#[tokio::test] $body { $($rest)* });
    };
}
pub(crate) use backend_tests;
