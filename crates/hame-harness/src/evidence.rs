//! Action observations, verifiers bound to versions and the completion gate (issue #33,
//! ADR 0035, `docs/evidence.md`).
//!
//! * [`ObservationLayer`] writes one [`Observation`] per finished tool call to
//!   `agents/<agent>/sessions/<session>.observations.jsonl` in the caller's records (a
//!   runtime root: the file tools cannot write it), with the facts the tool reported
//!   through [`ToolContext::facts`](hame_core::ToolContext::facts). An `execute` call whose
//!   command is a declared check's command also records that check's [`Evidence`].
//! * A [`Verifier`] is a declared check (a command and its expected exit code, a JSON file
//!   and its schema, a file that must exist). Its evidence carries the **version** of what
//!   it checked: a SHA-256 over the paths and content hashes of the files it covers. The
//!   evidence is `stale` when that version is no longer the files' version.
//! * [`VerifyLayer`] is the gate: when a call names required checks
//!   ([`require_checks`]) and the model gives its final answer, the checks whose evidence
//!   is missing or stale run where the tools run (the caller's shell: host or sandbox);
//!   a failure gives the model one more step with the failing evidence, up to the call's
//!   attempts, and the call's [`CallOutput::verification`] says `verified` or `unverified`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use hame_core::{
    CallCtx, CallInput, CallNext, CallOutput, CheckOutcome, Evidence, Layer, Message, Observation,
    ObservationOutcome, RuntimeContext, ToolCall, ToolCtx, ToolNext, ToolOutcome, Verification,
    VerificationStatus,
};
use hame_fs::{AppendOptions, ExecRequest, Filesystem, FsPath, GlobRequest, Version};
use hame_session::{EVIDENCE_SUFFIX, OBSERVATIONS_SUFFIX, SessionLog};
use hame_tools::Workspace;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::recorder::SessionRecorder;

/// Key in [`RuntimeContext::extras`] naming the call's required checks (a list of names).
pub const VERIFY_EXTRA: &str = "hame.verify";
/// Key in [`RuntimeContext::extras`] holding the call's verify attempts (a number).
pub const VERIFY_ATTEMPTS_EXTRA: &str = "hame.verify_attempts";
/// Default number of check rounds of the gate (`--verify-attempts`): the checks run, and
/// after a failure the model gets `attempts - 1` more steps.
pub const DEFAULT_VERIFY_ATTEMPTS: u32 = 2;
/// Most check rounds a call may ask for.
pub const MAX_VERIFY_ATTEMPTS: u32 = 10;
/// Default timeout of a command check.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(600);
/// Most files a check's version covers; beyond it the version says so (`+truncated`).
pub const MAX_COVERED_FILES: usize = 20_000;
/// What the default coverage leaves out besides hame's runtime folders (which the
/// caller's file view never lists).
pub const DEFAULT_EXCLUDES: &[&str] = &[".git/**", "target/**", "node_modules/**"];
/// Characters of a failing check's output kept in its evidence (the tail).
pub const DETAIL_CHARS: usize = 2000;

/// What a declared check checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A shell command; passes when it exits with `exit_code`.
    Command {
        /// `sh -c` command line.
        command: String,
        /// The expected exit code (default 0).
        exit_code: i32,
    },
    /// A JSON file that must match a JSON Schema (both workspace paths).
    JsonSchema {
        /// The schema file.
        schema: String,
        /// The JSON file.
        path: String,
    },
    /// A file that must exist.
    FileExists {
        /// The path.
        path: String,
    },
}

/// A declared check: `[[verify]]` in `hame.toml`, or [`HarnessAgentBuilder::verifier`](crate::HarnessAgentBuilder::verifier).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verifier {
    /// Its name (`tests`): what `--verify` and the evidence name.
    pub name: String,
    /// What it checks.
    pub check: Check,
    /// Globs of the workspace files its result depends on; a leading `!` excludes.
    /// Empty: the whole workspace view without [`DEFAULT_EXCLUDES`].
    pub covers: Vec<String>,
    /// Timeout of a command check. Default [`DEFAULT_CHECK_TIMEOUT`].
    pub timeout: Duration,
}

impl Verifier {
    /// A command check expecting exit code 0.
    pub fn command(name: impl Into<String>, command: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            check: Check::Command {
                command: command.into(),
                exit_code: 0,
            },
            covers: Vec::new(),
            timeout: DEFAULT_CHECK_TIMEOUT,
        }
    }

    /// A JSON Schema check of `path` against `schema`.
    pub fn json_schema(
        name: impl Into<String>,
        schema: impl Into<String>,
        path: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            check: Check::JsonSchema {
                schema: schema.into(),
                path: path.into(),
            },
            covers: Vec::new(),
            timeout: DEFAULT_CHECK_TIMEOUT,
        }
    }

    /// A check that `path` exists.
    pub fn file_exists(name: impl Into<String>, path: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            check: Check::FileExists { path: path.into() },
            covers: Vec::new(),
            timeout: DEFAULT_CHECK_TIMEOUT,
        }
    }

    /// Sets the covered globs.
    pub fn covers<I, S>(mut self, globs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.covers = globs.into_iter().map(Into::into).collect();
        self
    }

    /// The covered globs of this check for the caller of `ws`, as recorded in its evidence:
    /// the declared ones, or by default everything but [`DEFAULT_EXCLUDES`] and hame's own
    /// files in the caller's home (`memory/`, `MEMORY.md`, `large_tool_results/`; the
    /// runtime roots such as `agents/` are never listed by the caller's view).
    pub fn coverage(&self, ws: &Workspace) -> Vec<String> {
        if !self.covers.is_empty() {
            return self.covers.clone();
        }
        let home = ws.home_in_files();
        let h = if home.is_root() {
            String::new()
        } else {
            format!("{home}/")
        };
        let mut v = vec!["**".to_owned()];
        v.extend(DEFAULT_EXCLUDES.iter().map(|e| format!("!{e}")));
        for own in [
            format!("{}/**", hame_memory::daily::MEMORY_DIR),
            hame_memory::daily::MEMORY_FILE.to_owned(),
            format!("{}/**", hame_memory::offload::DEFAULT_OFFLOAD_DIR),
        ] {
            v.push(format!("!{h}{own}"));
        }
        v
    }
}

/// `[[verify]]` as written in `hame.toml` (and accepted over the API):
/// `name`, then one of `command` (+ `expect = { exit_code = 0 }`), `json_schema` + `path`,
/// or `file_exists`; optional `covers` (globs) and `timeout_secs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifierSpec {
    /// The check's name.
    pub name: String,
    /// A shell command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// What the command must do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<Expect>,
    /// A JSON Schema file (with `path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<String>,
    /// The JSON file the schema checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A file that must exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_exists: Option<String>,
    /// Covered globs (`!` excludes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covers: Vec<String>,
    /// Timeout of a command, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
}

/// The expectation of a command check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The exit code (default 0).
    #[serde(default)]
    pub exit_code: i32,
}

impl TryFrom<VerifierSpec> for Verifier {
    type Error = crate::Error;

    fn try_from(spec: VerifierSpec) -> crate::Result<Self> {
        let bad = |m: String| crate::Error::Config(format!("[[verify]] {:?}: {m}", spec.name));
        if spec.name.is_empty()
            || !spec
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(bad(
                "a name is letters, digits, `-` and `_` (what --verify names)".into(),
            ));
        }
        let check = match (
            &spec.command,
            &spec.json_schema,
            &spec.path,
            &spec.file_exists,
        ) {
            (Some(command), None, None, None) if !command.trim().is_empty() => Check::Command {
                command: command.clone(),
                exit_code: spec.expect.as_ref().map_or(0, |e| e.exit_code),
            },
            (None, Some(schema), Some(path), None) if spec.expect.is_none() => Check::JsonSchema {
                schema: schema.clone(),
                path: path.clone(),
            },
            (None, None, None, Some(path)) if spec.expect.is_none() => {
                Check::FileExists { path: path.clone() }
            }
            _ => {
                return Err(bad(
                    "give exactly one of `command` (with an optional `expect`), `json_schema` with `path`, or `file_exists`".into(),
                ));
            }
        };
        for glob in &spec.covers {
            globset::Glob::new(glob.trim_start_matches('!'))
                .map_err(|e| bad(format!("covers {glob:?}: {e}")))?;
        }
        Ok(Verifier {
            name: spec.name.clone(),
            check,
            covers: spec.covers.clone(),
            timeout: spec
                .timeout_secs
                .map_or(DEFAULT_CHECK_TIMEOUT, Duration::from_secs),
        })
    }
}

/// The declared checks of an agent.
#[derive(Debug, Clone, Default)]
pub struct Verifiers {
    by_name: BTreeMap<String, Arc<Verifier>>,
}

impl Verifiers {
    /// Adds (or replaces) a check.
    pub fn add(&mut self, v: Verifier) {
        self.by_name.insert(v.name.clone(), Arc::new(v));
    }

    /// A check by name.
    pub fn get(&self, name: &str) -> Option<&Arc<Verifier>> {
        self.by_name.get(name)
    }

    /// The names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.by_name.keys().cloned().collect()
    }

    /// Whether none is declared.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The command checks whose command is `command` (trimmed).
    fn for_command(&self, command: &str) -> Vec<Arc<Verifier>> {
        let command = command.trim();
        self.by_name
            .values()
            .filter(
                |v| matches!(&v.check, Check::Command { command: c, .. } if c.trim() == command),
            )
            .cloned()
            .collect()
    }
}

/// Names the required checks of a call and its check rounds (`None`:
/// [`DEFAULT_VERIFY_ATTEMPTS`]) in its runtime context.
pub fn require_checks(
    ctx: RuntimeContext,
    names: &[String],
    attempts: Option<u32>,
) -> RuntimeContext {
    let mut ctx = ctx.with_extra(VERIFY_EXTRA, serde_json::json!(names));
    if let Some(a) = attempts {
        ctx = ctx.with_extra(VERIFY_ATTEMPTS_EXTRA, serde_json::json!(a));
    }
    ctx
}

/// The call's required checks (named by the caller, and those of the session's confirmed
/// requirements) and its rounds.
fn required(runtime: &RuntimeContext, state: &hame_core::AgentState) -> Option<(Vec<String>, u32)> {
    let mut names: Vec<String> = runtime
        .extras
        .get(VERIFY_EXTRA)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    for c in crate::task::TaskState::of(state).required_checks() {
        if !names.contains(&c) {
            names.push(c);
        }
    }
    if names.is_empty() {
        return None;
    }
    let attempts = runtime
        .extras
        .get(VERIFY_ATTEMPTS_EXTRA)
        .and_then(serde_json::Value::as_u64)
        .and_then(|a| u32::try_from(a).ok())
        .unwrap_or(DEFAULT_VERIFY_ATTEMPTS)
        .clamp(1, MAX_VERIFY_ATTEMPTS);
    Some((names, attempts))
}

/// A new id: `prefix` and 16 hex digits.
pub(crate) fn new_id(prefix: &str) -> String {
    let u = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &u[..16])
}

/// Hex SHA-256 of a call's arguments as JSON with sorted keys (the raw text when it is not
/// JSON).
pub fn args_hash(arguments: &str) -> String {
    let canonical = serde_json::from_str::<serde_json::Value>(arguments)
        .ok()
        .and_then(|v| serde_json::to_vec(&v).ok())
        .unwrap_or_else(|| arguments.as_bytes().to_vec());
    hex_digest(&canonical)
}

fn hex_digest(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The version of the files `covers` selects in `fs` (globs; a leading `!` excludes): a
/// hex SHA-256 over each file's path and content hash, sorted by path, and how many files
/// it covers. At most [`MAX_COVERED_FILES`] files are read; beyond them the version ends
/// with `+truncated` (and is then always stale, honestly).
pub async fn files_version(
    fs: &dyn Filesystem,
    covers: &[String],
) -> Result<(String, usize), hame_fs::Error> {
    let mut include = Vec::new();
    let mut exclude = globset::GlobSetBuilder::new();
    for g in covers {
        match g.strip_prefix('!') {
            Some(e) => {
                if let Ok(glob) = globset::Glob::new(e) {
                    exclude.add(glob);
                }
            }
            None => include.push(g.clone()),
        }
    }
    let exclude = exclude
        .build()
        .unwrap_or_else(|_| globset::GlobSet::empty());
    let mut paths = BTreeSet::new();
    let mut truncated = false;
    for pattern in include {
        let mut req = GlobRequest::new(pattern);
        req.max_results = MAX_COVERED_FILES;
        let out = fs.glob(&req).await?;
        truncated |= out.truncated;
        for f in out.files {
            if f.kind == hame_fs::FileKind::File && !exclude.is_match(f.path.as_str()) {
                paths.insert(f.path);
            }
        }
    }
    let mut hasher = sha2::Sha256::new();
    let mut count = 0;
    for path in paths.iter().take(MAX_COVERED_FILES) {
        let bytes = match fs.read_bytes(path).await {
            Ok(b) => b,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        hasher.update(path.as_str().as_bytes());
        hasher.update([0]);
        hasher.update(Version::of(&bytes).as_str().as_bytes());
        hasher.update([b'\n']);
        count += 1;
    }
    let digest = hex::encode(hasher.finalize());
    let version = if truncated || paths.len() > MAX_COVERED_FILES {
        format!("{digest}+truncated")
    } else {
        digest
    };
    Ok((version, count))
}

/// What one check's run produced.
struct CheckRun {
    outcome: CheckOutcome,
    exit_code: Option<i32>,
    detail: String,
    facts: serde_json::Map<String, serde_json::Value>,
}

fn tail(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_owned();
    }
    let cut: String = text.chars().skip(n - max).collect();
    format!("…{cut}")
}

/// Runs `v`'s check in the caller's workspace (its shell for a command).
async fn run_check(v: &Verifier, ws: &Workspace) -> CheckRun {
    let mut facts = serde_json::Map::new();
    facts.insert("check".into(), v.name.clone().into());
    match &v.check {
        Check::Command { command, exit_code } => {
            let Some(exec) = ws.exec() else {
                return CheckRun {
                    outcome: CheckOutcome::Error,
                    exit_code: None,
                    detail: "this workspace has no shell to run the check in (local mode or the sandbox has one)".into(),
                    facts,
                };
            };
            let req = ExecRequest {
                command: command.clone(),
                timeout: Some(v.timeout),
            };
            match exec.execute(req).await {
                Ok(out) => {
                    facts.insert("exit_code".into(), out.exit_code.into());
                    facts.insert("signal".into(), out.signal.into());
                    facts.insert("timed_out".into(), out.timed_out.into());
                    facts.insert("stdout_truncated".into(), out.stdout_truncated.into());
                    facts.insert("stderr_truncated".into(), out.stderr_truncated.into());
                    facts.insert("stdout_bytes".into(), out.stdout_bytes.into());
                    facts.insert("stderr_bytes".into(), out.stderr_bytes.into());
                    let passed = !out.timed_out && out.exit_code == Some(*exit_code);
                    let outcome = if out.timed_out {
                        CheckOutcome::Error
                    } else if passed {
                        CheckOutcome::Passed
                    } else {
                        CheckOutcome::Failed
                    };
                    let detail = if passed {
                        String::new()
                    } else {
                        let why = match (out.timed_out, out.exit_code) {
                            (true, _) => format!("timed out after {}s", v.timeout.as_secs()),
                            (false, Some(c)) => format!("exit code {c}, expected {exit_code}"),
                            (false, None) => "killed by a signal".to_owned(),
                        };
                        format!("`{command}`: {why}\n{}", tail(&out.output, DETAIL_CHARS))
                    };
                    CheckRun {
                        outcome,
                        exit_code: out.exit_code,
                        detail,
                        facts,
                    }
                }
                Err(e) => CheckRun {
                    outcome: CheckOutcome::Error,
                    exit_code: None,
                    detail: format!("`{command}` could not run: {e}"),
                    facts,
                },
            }
        }
        Check::FileExists { path } => {
            let files = ws.files();
            let exists = match FsPath::parse(path) {
                Ok(p) => files.exists(&p).await.unwrap_or(false),
                Err(_) => false,
            };
            facts.insert("path".into(), path.clone().into());
            CheckRun {
                outcome: if exists {
                    CheckOutcome::Passed
                } else {
                    CheckOutcome::Failed
                },
                exit_code: None,
                detail: if exists {
                    String::new()
                } else {
                    format!("{path} does not exist")
                },
                facts,
            }
        }
        Check::JsonSchema { schema, path } => {
            facts.insert("path".into(), path.clone().into());
            let files = ws.files();
            let read = |p: String| async move {
                let fp = FsPath::parse(&p).map_err(|e| format!("{p}: {e}"))?;
                let bytes = files
                    .read_bytes(&fp)
                    .await
                    .map_err(|e| format!("{p}: {e}"))?;
                serde_json::from_slice::<serde_json::Value>(&bytes)
                    .map_err(|e| format!("{p} is not JSON: {e}"))
            };
            let schema_value = match read(schema.clone()).await {
                Ok(s) => s,
                Err(e) => {
                    return CheckRun {
                        outcome: CheckOutcome::Error,
                        exit_code: None,
                        detail: format!("the schema cannot be read: {e}"),
                        facts,
                    };
                }
            };
            if let Err(e) = crate::caller_schema::check_schema(&schema_value) {
                return CheckRun {
                    outcome: CheckOutcome::Error,
                    exit_code: None,
                    detail: format!("{schema}: {e}"),
                    facts,
                };
            }
            match read(path.clone()).await {
                Err(e) => CheckRun {
                    outcome: CheckOutcome::Failed,
                    exit_code: None,
                    detail: e,
                    facts,
                },
                Ok(value) => match crate::caller_schema::validate(&schema_value, &value) {
                    Ok(()) => CheckRun {
                        outcome: CheckOutcome::Passed,
                        exit_code: None,
                        detail: String::new(),
                        facts,
                    },
                    Err(errors) => CheckRun {
                        outcome: CheckOutcome::Failed,
                        exit_code: None,
                        detail: errors
                            .iter()
                            .map(|e| format!("{path}: {e}"))
                            .collect::<Vec<_>>()
                            .join("\n"),
                        facts,
                    },
                },
            }
        }
    }
}

/// Reads and writes observations and evidence through the caller's session log.
#[derive(Debug, Clone)]
pub(crate) struct EvidenceStore {
    recorder: Arc<SessionRecorder>,
    verifiers: Arc<Verifiers>,
}

impl EvidenceStore {
    pub(crate) fn new(recorder: Arc<SessionRecorder>, verifiers: Arc<Verifiers>) -> Self {
        Self {
            recorder,
            verifiers,
        }
    }

    pub(crate) fn verifier_names(&self) -> Vec<String> {
        self.verifiers.names()
    }

    fn log(
        &self,
        runtime: &RuntimeContext,
        ws: &Workspace,
    ) -> Result<Arc<SessionLog>, hame_core::Error> {
        self.recorder.log_for(runtime, ws)
    }

    pub(crate) async fn write_observation(
        &self,
        runtime: &RuntimeContext,
        ws: &Workspace,
        obs: &Observation,
    ) -> Result<(), hame_core::Error> {
        self.log(runtime, ws)?
            .append_observations(
                &runtime.session_id,
                std::slice::from_ref(obs),
                AppendOptions::atomic(),
            )
            .await
            .map_err(|e| hame_core::Error::layer("observations", e))
    }

    async fn write_evidence(
        &self,
        runtime: &RuntimeContext,
        ws: &Workspace,
        ev: &Evidence,
    ) -> Result<(), hame_core::Error> {
        let log = self.log(runtime, ws)?;
        log.append_side(
            &runtime.session_id,
            EVIDENCE_SUFFIX,
            std::slice::from_ref(ev),
            AppendOptions::default(),
        )
        .await
        .map_err(|e| hame_core::Error::layer("verify", e))?;
        // The observation it names is made durable with it.
        log.sync_side(&runtime.session_id, OBSERVATIONS_SUFFIX)
            .await
            .map_err(|e| hame_core::Error::layer("verify", e))
    }

    /// Runs `v` now: writes its observation and its evidence.
    async fn check(
        &self,
        runtime: &RuntimeContext,
        ws: &Workspace,
        v: &Verifier,
        step: usize,
    ) -> Result<Evidence, hame_core::Error> {
        let started = Utc::now();
        let clock = Instant::now();
        let run = run_check(v, ws).await;
        let coverage = v.coverage(ws);
        let (version, files) = files_version(ws.files().as_ref(), &coverage)
            .await
            .map_err(|e| hame_core::Error::layer("verify", e))?;
        let duration_ms = u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX);
        let obs = Observation {
            id: new_id("ob"),
            call_id: format!("verify-{}", v.name),
            attempt: 1,
            tool: "verify".into(),
            args_hash: args_hash(&serde_json::json!({ "check": v.name }).to_string()),
            step,
            started,
            ended: Utc::now(),
            duration_ms,
            outcome: match run.outcome {
                CheckOutcome::Passed | CheckOutcome::Failed => ObservationOutcome::Ok,
                CheckOutcome::Error => ObservationOutcome::Error,
            },
            code: None,
            idempotency_key: None,
            facts: run.facts,
        };
        self.write_observation(runtime, ws, &obs).await?;
        let ev = Evidence {
            id: new_id("ev"),
            check: v.name.clone(),
            outcome: run.outcome,
            exit_code: run.exit_code,
            observation_id: obs.id,
            version,
            files,
            covers: coverage,
            at: Utc::now(),
            duration_ms,
            detail: run.detail,
            stale: false,
        };
        self.write_evidence(runtime, ws, &ev).await?;
        Ok(ev)
    }

    /// The newest evidence of each check of the session as recorded (`stale` not
    /// computed: no file is read but the evidence file).
    pub(crate) async fn recorded(
        &self,
        runtime: &RuntimeContext,
        ws: &Workspace,
    ) -> Result<Vec<Evidence>, hame_core::Error> {
        let log = self.log(runtime, ws)?;
        let all: Vec<Evidence> = log
            .read_side(&runtime.session_id, EVIDENCE_SUFFIX)
            .await
            .map_err(|e| hame_core::Error::layer("verify", e))?;
        let mut newest: BTreeMap<String, Evidence> = BTreeMap::new();
        for ev in all {
            newest.insert(ev.check.clone(), ev);
        }
        Ok(newest.into_values().collect())
    }

    /// The newest evidence of each check of the session, with `stale` computed against the
    /// files as they are now.
    pub(crate) async fn current(
        &self,
        runtime: &RuntimeContext,
        ws: &Workspace,
    ) -> Result<Vec<Evidence>, hame_core::Error> {
        let newest = self.recorded(runtime, ws).await?;
        let mut versions: BTreeMap<Vec<String>, String> = BTreeMap::new();
        let mut out = Vec::with_capacity(newest.len());
        for mut ev in newest {
            let now = match versions.get(&ev.covers) {
                Some(v) => v.clone(),
                None => {
                    let (v, _) = files_version(ws.files().as_ref(), &ev.covers)
                        .await
                        .map_err(|e| hame_core::Error::layer("verify", e))?;
                    versions.insert(ev.covers.clone(), v.clone());
                    v
                }
            };
            ev.stale = now != ev.version || ev.version.ends_with("+truncated");
            out.push(ev);
        }
        Ok(out)
    }
}

/// Writes one observation per finished tool call; an `execute` call running a declared
/// check's command records that check's evidence too.
#[derive(Debug)]
pub struct ObservationLayer {
    store: EvidenceStore,
}

impl ObservationLayer {
    pub(crate) fn new(store: EvidenceStore) -> Self {
        Self { store }
    }
}

/// The observations of the running call, written in one append when it ends (so a step
/// costs no store operation for them; ADR 0035).
#[derive(Debug, Default)]
struct Pending(std::sync::Mutex<Vec<Observation>>);

impl Pending {
    fn push(&self, o: Observation) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(o);
    }

    fn take(&self) -> Vec<Observation> {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

#[async_trait]
impl Layer for ObservationLayer {
    fn name(&self) -> &str {
        "observations"
    }

    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> Result<CallOutput, hame_core::Error> {
        let (out, pending) = next.run_collecting::<Pending>(cx, input).await;
        let observations = pending.take();
        if observations.is_empty() {
            return out;
        }
        // One synced append per call, before the state is saved (like the session log): made
        // by the session-log layer at the end of the call, at the same time as the log's
        // (ADR 0043); by this layer outside one.
        let Err(observations) = SessionRecorder::defer_observations(cx, observations) else {
            return out;
        };
        if let Some(ws) = cx.extensions.get::<Workspace>() {
            let written = match self.store.log(cx.runtime, ws) {
                Ok(log) => log
                    .append_observations(
                        &cx.runtime.session_id,
                        &observations,
                        AppendOptions::default(),
                    )
                    .await
                    .map_err(|e| hame_core::Error::layer("observations", e)),
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                tracing::warn!(error = %e, "the observations of the call could not be written");
            }
        }
        out
    }

    async fn tool(&self, cx: &ToolCtx<'_>, call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        let started = Utc::now();
        let clock = Instant::now();
        let outcome = next.run(cx, call.clone()).await;
        let ToolOutcome::Done(out) = &outcome else {
            return outcome;
        };
        let Some(ws) = cx.tool.extensions.get::<Workspace>() else {
            return outcome;
        };
        let code = out.as_ref().err().map(|e| e.code.clone());
        let obs = Observation {
            id: new_id("ob"),
            call_id: call.id.clone(),
            attempt: if cx.resume.is_some() { 2 } else { 1 },
            tool: call.name.clone(),
            args_hash: args_hash(&call.arguments),
            step: cx.iteration,
            started,
            ended: Utc::now(),
            duration_ms: u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX),
            outcome: ObservationOutcome::of(code.as_deref()),
            code,
            idempotency_key: None,
            facts: cx.tool.facts().snapshot(),
        };
        if call.name == "execute" && !self.store.verifiers.is_empty() {
            self.evidence_from_execute(cx, ws, &call, &obs).await;
        }
        match cx.tool.extensions.get::<Pending>() {
            Some(p) => p.push(obs),
            // Outside this layer's call (not done by the harness): written at once.
            None => {
                if let Err(e) = self
                    .store
                    .write_observation(&cx.tool.runtime, ws, &obs)
                    .await
                {
                    tracing::warn!(error = %e, tool = %call.name, "the observation of a tool call could not be written");
                }
            }
        }
        outcome
    }
}

impl ObservationLayer {
    /// The model ran a declared check's command itself: its observation is the check's
    /// evidence.
    async fn evidence_from_execute(
        &self,
        cx: &ToolCtx<'_>,
        ws: &Workspace,
        call: &ToolCall,
        obs: &Observation,
    ) {
        let Some(command) = serde_json::from_str::<serde_json::Value>(&call.arguments)
            .ok()
            .and_then(|a| a.get("command").and_then(|c| c.as_str()).map(str::to_owned))
        else {
            return;
        };
        for v in self.store.verifiers.for_command(&command) {
            let Check::Command { exit_code, .. } = &v.check else {
                continue;
            };
            let got = obs
                .facts
                .get("exit_code")
                .and_then(serde_json::Value::as_i64)
                .and_then(|c| i32::try_from(c).ok());
            let timed_out = obs.facts.get("timed_out") == Some(&serde_json::Value::Bool(true));
            let outcome = match (obs.outcome, got) {
                (ObservationOutcome::Ok, Some(c)) if c == *exit_code && !timed_out => {
                    CheckOutcome::Passed
                }
                (ObservationOutcome::Ok, _) => CheckOutcome::Failed,
                _ => CheckOutcome::Error,
            };
            let coverage = v.coverage(ws);
            let (version, files) = match files_version(ws.files().as_ref(), &coverage).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, check = %v.name, "the version of a check's files could not be computed");
                    continue;
                }
            };
            let ev = Evidence {
                id: new_id("ev"),
                check: v.name.clone(),
                outcome,
                exit_code: got,
                observation_id: obs.id.clone(),
                version,
                files,
                covers: coverage,
                at: Utc::now(),
                duration_ms: obs.duration_ms,
                detail: match outcome {
                    CheckOutcome::Passed => String::new(),
                    _ => format!(
                        "`{command}` (run by the model, call {}): exit code {got:?}, expected {exit_code}",
                        call.id
                    ),
                },
                stale: false,
            };
            if let Err(e) = self.store.write_evidence(&cx.tool.runtime, ws, &ev).await {
                tracing::warn!(error = %e, check = %v.name, "evidence could not be written");
            }
        }
    }
}

/// The completion gate: see the [module docs](self).
#[derive(Debug)]
pub struct VerifyLayer {
    store: EvidenceStore,
}

impl VerifyLayer {
    pub(crate) fn new(store: EvidenceStore) -> Self {
        Self { store }
    }

    /// The current evidence of each of `names`, running the checks whose evidence is
    /// missing or stale.
    async fn settle(
        &self,
        cx: &CallCtx<'_>,
        ws: &Workspace,
        names: &[String],
    ) -> Result<Vec<Evidence>, hame_core::Error> {
        // The observations of the steps so far go before the checks' own, in the order of
        // the calls: written now (synced, as the observations layer wrote them before ADR
        // 0043) instead of at the end of the call.
        let earlier = SessionRecorder::take_observations(cx);
        if !earlier.is_empty() {
            let written = self
                .store
                .log(cx.runtime, ws)?
                .append_observations(&cx.runtime.session_id, &earlier, AppendOptions::default())
                .await;
            if let Err(e) = written {
                tracing::warn!(error = %e, "the observations of the call could not be written");
            }
        }
        let current = self.store.current(cx.runtime, ws).await?;
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let Some(v) = self.store.verifiers.get(name) else {
                return Err(hame_core::Error::layer(
                    "verify",
                    format!(
                        "no check is named {name:?} (declared: {})",
                        self.store.verifiers.names().join(", ")
                    ),
                ));
            };
            let fresh = current
                .iter()
                .find(|e| &e.check == name && !e.stale && e.covers == v.coverage(ws));
            match fresh {
                Some(e) => out.push(e.clone()),
                None => out.push(self.store.check(cx.runtime, ws, v, cx.iteration).await?),
            }
        }
        Ok(out)
    }
}

/// The message that gives the model its extra step.
fn failing_message(failing: &[&Evidence], left: u32) -> String {
    let mut s = String::from(
        "[hame verify] Your answer is not accepted yet: the run's required checks failed on the files as you left them.\n",
    );
    for e in failing {
        s.push_str(&format!(
            "- check `{}`: {} (evidence {}, version {})\n{}\n",
            e.check,
            match e.outcome {
                CheckOutcome::Passed => "passed",
                CheckOutcome::Failed => "failed",
                CheckOutcome::Error => "could not run",
            },
            e.id,
            &e.version[..e.version.len().min(12)],
            e.detail
        ));
    }
    s.push_str(&format!(
        "Fix the cause, then answer again. The checks run again after your answer ({left} more attempt{} after this one).",
        if left == 1 { "" } else { "s" }
    ));
    s
}

#[async_trait]
impl Layer for VerifyLayer {
    fn name(&self) -> &str {
        "verify"
    }

    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> Result<CallOutput, hame_core::Error> {
        let Some((names, attempts)) = required(cx.runtime, cx.state) else {
            return next.run(cx, input).await;
        };
        let mut out = next.run(cx, input).await?;
        let Some(ws) = cx.extensions.get::<Workspace>().cloned() else {
            return Err(hame_core::Error::layer(
                "verify",
                "the call has no workspace handle",
            ));
        };
        let mut round = 1;
        loop {
            let evidence = self.settle(cx, &ws, &names).await?;
            let failing: Vec<&Evidence> = evidence
                .iter()
                .filter(|e| e.outcome != CheckOutcome::Passed)
                .collect();
            let status = if failing.is_empty() {
                Some(VerificationStatus::Verified)
            } else if round >= attempts {
                Some(VerificationStatus::Unverified)
            } else {
                None
            };
            if let Some(status) = status {
                cx.events.emit(hame_core::AgentEvent::Custom {
                    kind: "verification".into(),
                    data: serde_json::json!({
                        "status": status,
                        "evidence": evidence.iter().map(|e| &e.id).collect::<Vec<_>>(),
                    }),
                });
                out.verification = Some(Verification {
                    status,
                    evidence,
                    extra_steps: round - 1,
                });
                return Ok(out);
            }
            let text = failing_message(&failing, attempts - round - 1);
            round += 1;
            let usage = out.usage;
            let iterations = out.iterations;
            out = next
                .run(cx, CallInput::Message(Message::user(text)))
                .await?;
            out.usage.add(&usage);
            out.iterations += iterations;
        }
    }
}
