//! The configuration files and `hame config`.
//!
//! Each setting comes from the first of: the command-line flag, the environment, the
//! workspace's `hame.toml`, the user's config file, the built-in default (ADR 0013). The
//! user's file is `$HAME_CONFIG` when set, else `$XDG_CONFIG_HOME/hame/config.toml`, else
//! `~/.config/hame/config.toml`. Both files have the same keys; unknown keys are an error
//! (exit 2) naming the file, so a typo is not silently ignored.
//!
//! ```toml
//! model = "openai:gpt-4o-mini"
//! base_url = "http://127.0.0.1:11434/v1"
//! state = "redis://127.0.0.1:6379/0"
//! store = "redis://127.0.0.1:6379/0"
//! isolation = "user"
//! isolated = false
//! permission_mode = "ask"
//! model_timeout = 25
//! model_connect_timeout = 10
//! prompt_cache = "auto"
//! users = ["alice", "bob"]
//! [memory]
//! enabled = true
//! index = "postgres://user@host/db"
//! [limits]
//! max_iterations = 50
//! context_window = 64000
//! subagent_depth = 1
//! task_wait = 600
//! [budget.run]
//! usd = 0.50
//! [budget.user_day]
//! tokens = 2000000
//! [prices."openai:my-finetune"]
//! input = 0.3
//! output = 1.2
//! [[verify]]
//! name = "tests"
//! command = "cargo test -q"
//! expect = { exit_code = 0 }
//! [skills]
//! refresh = 300
//! [[skills.repository]]
//! git = "https://github.com/org/skills.git"
//! ref = "main"
//! path = "skills"
//! [[skills.repository]]
//! sql = "postgres://user@host/db"
//! table = "hame_skills"
//! # hame serve: more agents (workspace file only; docs/gateway.md)
//! [agents.support]
//! workspace = "agents/support"
//! model = "openai:gpt-4o-mini"
//! permission_mode = "ask"
//! max_iterations = 20
//! ```

use std::path::{Path, PathBuf};

use clap::Args;
use serde::Deserialize;

use crate::ConfigError;
use crate::common::{Common, Isolation, PermissionMode, env};

/// The workspace's configuration file.
pub(crate) const WORKSPACE_FILE: &str = "hame.toml";
/// The environment variable naming the user's configuration file.
pub(crate) const CONFIG_ENV: &str = "HAME_CONFIG";

/// Default reasoning steps per call.
pub(crate) const DEFAULT_MAX_ITERATIONS: usize = 50;
/// Default subagent depth.
pub(crate) const DEFAULT_SUBAGENT_DEPTH: usize = 1;
/// Default seconds `hame run` waits for background tasks.
pub(crate) const DEFAULT_TASK_WAIT: u64 = 600;

/// One configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    model: Option<String>,
    base_url: Option<String>,
    state: Option<String>,
    store: Option<String>,
    isolation: Option<Isolation>,
    isolated: Option<bool>,
    permission_mode: Option<PermissionMode>,
    model_timeout: Option<f64>,
    model_connect_timeout: Option<f64>,
    /// User ids whose `<userId>/` folders are theirs before their first call.
    users: Option<Vec<String>>,
    #[serde(default)]
    memory: MemorySection,
    #[serde(default)]
    limits: Limits,
    /// `auto`, `on` or `off` (docs/cost.md).
    prompt_cache: Option<String>,
    budget: Option<hame::harness::cost::Budgets>,
    /// USD per million tokens by model prefix, over the built-in table.
    prices: Option<std::collections::BTreeMap<String, hame::harness::cost::Price>>,
    #[serde(default)]
    skills: SkillsSection,
    /// `[[verify]]`: declared checks (docs/evidence.md).
    verify: Option<Vec<hame::harness::evidence::VerifierSpec>>,
    #[serde(default)]
    runs: RunsSection,
    /// More agents `hame serve` serves (the workspace file's only).
    agents: Option<std::collections::BTreeMap<String, AgentSection>>,
}

/// One `[agents.NAME]` of the workspace's `hame.toml`: another agent `hame serve` serves,
/// with its own workspace (whose `hame.toml` applies to it) and settings that are that
/// agent's flags (over every file, under nothing).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentSection {
    /// Its workspace; a relative path is from the folder of the `hame.toml` naming it.
    pub(crate) workspace: PathBuf,
    pub(crate) model: Option<String>,
    pub(crate) base_url: Option<String>,
    pub(crate) permission_mode: Option<PermissionMode>,
    pub(crate) max_iterations: Option<usize>,
    pub(crate) context_window: Option<u64>,
    pub(crate) model_timeout: Option<f64>,
}

impl AgentSection {
    /// `flags` with this agent's workspace and settings.
    pub(crate) fn apply(&self, mut flags: crate::common::Flags) -> crate::common::Flags {
        flags.workspace = Some(self.workspace.clone());
        if let Some(m) = &self.model {
            flags.model = Some(m.clone());
        }
        if let Some(u) = &self.base_url {
            flags.base_url = Some(u.clone());
        }
        if let Some(p) = self.permission_mode {
            flags.permission_mode = Some(p);
        }
        if let Some(n) = self.max_iterations {
            flags.max_iterations = Some(n);
        }
        if let Some(n) = self.context_window {
            flags.context_window = Some(n);
        }
        if let Some(t) = self.model_timeout {
            flags.model_timeout = Some(t);
        }
        flags
    }
}

/// `[runs]`: durable runs (docs/replicas.md).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunsSection {
    /// How long finished runs are kept: `7d`, `12h`, `30m`, `90s`, or `forever`.
    keep_finished: Option<String>,
}

/// Parses `[runs] keep_finished`: a whole number and a unit (`d`, `h`, `m`, `s`), 1 s to
/// 100 years; `forever` keeps every run (`None`).
pub(crate) fn keep_finished(text: &str) -> Result<Option<std::time::Duration>, String> {
    let text = text.trim();
    if text == "forever" {
        return Ok(None);
    }
    let bad = || {
        format!(
            "`{text}` is not a retention: a whole number and d, h, m or s (at least 1s), or `forever`"
        )
    };
    let (n, unit) = text.split_at(text.len().saturating_sub(1));
    let n: u64 = n.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "d" => n.checked_mul(86_400),
        "h" => n.checked_mul(3_600),
        "m" => n.checked_mul(60),
        "s" => Some(n),
        _ => None,
    }
    .filter(|s| (1..=100 * 365 * 86_400).contains(s))
    .ok_or_else(bad)?;
    Ok(Some(std::time::Duration::from_secs(seconds)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SkillsSection {
    /// Seconds a repository's snapshot is used before it is fetched again.
    refresh: Option<u64>,
    /// The repositories, in precedence order.
    repository: Option<Vec<Repository>>,
}

/// One `[[skills.repository]]`: `git` (with `ref`, `path`) or `sql` (with `table`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Repository {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) git: Option<String>,
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub(crate) reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sql: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) table: Option<String>,
}

/// Default seconds a skill repository's snapshot is used.
pub(crate) const DEFAULT_SKILLS_REFRESH: u64 = 300;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemorySection {
    enabled: Option<bool>,
    index: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limits {
    max_iterations: Option<usize>,
    context_window: Option<u64>,
    subagent_depth: Option<usize>,
    task_wait: Option<u64>,
}

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    Flag(&'static str),
    Env(String),
    File(PathBuf),
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag(name) => write!(f, "flag {name}"),
            Source::Env(name) => write!(f, "env {name}"),
            Source::File(path) => write!(f, "file {}", path.display()),
            Source::Default => f.write_str("default"),
        }
    }
}

/// A value and its source.
#[derive(Debug, Clone)]
pub(crate) struct Setting<T> {
    pub(crate) value: T,
    pub(crate) source: Source,
}

/// The effective configuration of one command.
#[derive(Debug, Clone)]
pub(crate) struct Effective {
    pub(crate) workspace: Setting<PathBuf>,
    pub(crate) model: Setting<Option<String>>,
    pub(crate) base_url: Setting<Option<String>>,
    pub(crate) state: Setting<Option<String>>,
    pub(crate) store: Setting<Option<String>>,
    pub(crate) isolation: Setting<Isolation>,
    pub(crate) isolated: Setting<bool>,
    pub(crate) permission_mode: Setting<PermissionMode>,
    /// Seconds; the model crate's default when unset.
    pub(crate) model_timeout: Setting<Option<f64>>,
    pub(crate) model_connect_timeout: Setting<Option<f64>>,
    pub(crate) memory: Setting<bool>,
    pub(crate) memory_index: Setting<Option<String>>,
    pub(crate) max_iterations: Setting<usize>,
    pub(crate) context_window: Setting<Option<u64>>,
    pub(crate) subagent_depth: Setting<usize>,
    pub(crate) task_wait: Setting<u64>,
    /// Declared user ids (their `<userId>/` folders are private from the start).
    pub(crate) users: Setting<Vec<String>>,
    /// `auto`, `on` or `off`; passed to the model as `HAME_PROMPT_CACHE`.
    pub(crate) prompt_cache: Setting<Option<String>>,
    /// The user file's `[budget]`, under the workspace file's, under `--budget`.
    pub(crate) budgets: hame::harness::cost::Budgets,
    /// `[[verify]]` of the user file, then the workspace file's (a name declared in both:
    /// the workspace's).
    pub(crate) verifiers: Vec<hame::harness::evidence::Verifier>,
    /// The built-in prices, under the user file's, under the workspace file's.
    pub(crate) prices: hame::harness::cost::Prices,
    /// Seconds a skill repository's snapshot is used (`[skills] refresh`).
    pub(crate) skills_refresh: Setting<u64>,
    /// `[[skills.repository]]` of the first file that has any, in order.
    pub(crate) skill_repositories: Setting<Vec<Repository>>,
    /// How long finished runs are kept (`[runs] keep_finished`); `None`: for good.
    pub(crate) keep_finished: Setting<Option<std::time::Duration>>,
    /// The configuration files that exist and were read, highest precedence first.
    pub(crate) files: Vec<PathBuf>,
    /// `[agents.NAME]` of the workspace file, by name (workspaces made absolute).
    pub(crate) agents: Vec<(String, AgentSection)>,
}

impl Effective {
    /// The environment variable of the model provider's base URL (`OPENAI_BASE_URL`).
    pub(crate) fn base_url_var(&self) -> Option<String> {
        let spec = self.model.value.as_deref()?;
        let provider = spec.split(':').next()?;
        Some(format!("{}_BASE_URL", provider.to_ascii_uppercase()))
    }

    /// The environment lookup for opening models: the process environment, with the
    /// configured base URL as the provider's `<PROVIDER>_BASE_URL`.
    pub(crate) fn model_env(&self) -> impl Fn(&str) -> Option<String> + Send + Sync + 'static {
        let var = self.base_url_var();
        let url = self.base_url.value.clone();
        let timeouts = self.model_timeouts();
        move |key: &str| {
            if let Some((_, v)) = timeouts.iter().find(|(k, _)| *k == key) {
                return Some(v.clone());
            }
            match (&var, &url) {
                (Some(v), Some(u)) if v == key => Some(u.clone()),
                _ => env(key),
            }
        }
    }

    /// The model timeouts and prompt caching as the variables `hame::model::open` reads
    /// (those configured).
    pub(crate) fn model_timeouts(&self) -> Vec<(&'static str, String)> {
        let mut vars: Vec<(&'static str, String)> = [
            (hame::model::MODEL_TIMEOUT_ENV, self.model_timeout.value),
            (
                hame::model::MODEL_CONNECT_TIMEOUT_ENV,
                self.model_connect_timeout.value,
            ),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?.to_string())))
        .collect();
        if let Some(v) = &self.prompt_cache.value {
            vars.push((hame::model::PROMPT_CACHE_ENV, v.clone()));
        }
        vars
    }
}

/// The user's configuration file: `$HAME_CONFIG`, else `$XDG_CONFIG_HOME/hame/config.toml`,
/// else `$HOME/.config/hame/config.toml`.
pub(crate) fn user_file() -> Option<PathBuf> {
    if let Some(p) = env(CONFIG_ENV) {
        return Some(PathBuf::from(p));
    }
    if let Some(x) = env("XDG_CONFIG_HOME") {
        return Some(Path::new(&x).join("hame/config.toml"));
    }
    env("HOME").map(|h| Path::new(&h).join(".config/hame/config.toml"))
}

fn read(path: &Path, must_exist: bool) -> anyhow::Result<Option<File>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => return Ok(None),
        Err(e) => {
            return Err(ConfigError(format!(
                "cannot read the config file {}: {e}",
                path.display()
            ))
            .into());
        }
    };
    let file: File = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        ConfigError(format!(
            "invalid config file {}{}: {}",
            path.display(),
            line.map(|l| format!(" line {l}")).unwrap_or_default(),
            e.message().trim_end()
        ))
    })?;
    Ok(Some(file))
}

/// Picks the first value of flag, environment, workspace file, user file, else `default`.
fn pick<T: Clone>(
    flag: (Option<T>, &'static str),
    env_value: Option<(T, String)>,
    files: &[(Option<T>, &Path)],
    default: T,
) -> Setting<T> {
    if let Some(v) = flag.0 {
        return Setting {
            value: v,
            source: Source::Flag(flag.1),
        };
    }
    if let Some((v, name)) = env_value {
        return Setting {
            value: v,
            source: Source::Env(name),
        };
    }
    for (v, path) in files {
        if let Some(v) = v {
            return Setting {
                value: v.clone(),
                source: Source::File(path.to_path_buf()),
            };
        }
    }
    Setting {
        value: default,
        source: Source::Default,
    }
}

/// A string environment variable (blank counts as unset).
fn env_str(name: &str) -> Option<(String, String)> {
    env(name).map(|v| (v, name.to_owned()))
}

/// A parsed environment variable; a value that does not parse is exit 2.
fn env_parsed<T: std::str::FromStr>(name: &str) -> anyhow::Result<Option<(T, String)>>
where
    T::Err: std::fmt::Display,
{
    match env(name) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<T>() {
            Ok(p) => Ok(Some((p, name.to_owned()))),
            Err(e) => Err(ConfigError(format!("{name}={v:?}: {e}")).into()),
        },
    }
}

/// The effective configuration of `common`'s flags.
pub(crate) fn resolve(common: &Common) -> anyhow::Result<Effective> {
    resolve_flags(common.flags())
}

/// The effective configuration of these flags (`hame serve --agent NAME=DIR`: the common
/// flags with another workspace, whose `hame.toml` then applies).
pub(crate) fn resolve_flags(flags: crate::common::Flags) -> anyhow::Result<Effective> {
    let (workspace, ws_source) = match (flags.workspace, env(hame::harness::WORKSPACE_ENV)) {
        (Some(p), _) => (p, Source::Flag("--workspace")),
        (None, Some(v)) => (
            PathBuf::from(v),
            Source::Env(hame::harness::WORKSPACE_ENV.into()),
        ),
        (None, None) => (
            PathBuf::from(hame::harness::DEFAULT_WORKSPACE),
            Source::Default,
        ),
    };
    let ws_path = workspace.join(WORKSPACE_FILE);
    // A workspace that is not a directory is refused later, with its own message.
    let ws_file = if workspace.is_dir() {
        read(&ws_path, false)?
    } else {
        None
    };
    let user_path = user_file();
    // A file named by HAME_CONFIG must exist.
    let user_file = match &user_path {
        Some(p) => read(p, env(CONFIG_ENV).is_some())?,
        None => None,
    };
    let mut files = Vec::new();
    if ws_file.is_some() {
        files.push(ws_path.clone());
    }
    if let (Some(_), Some(p)) = (&user_file, &user_path) {
        files.push(p.clone());
    }
    let empty = File::default();
    let w = ws_file.as_ref().unwrap_or(&empty);
    let u = user_file.as_ref().unwrap_or(&empty);
    let up = user_path.clone().unwrap_or_default();
    let layers = |f: fn(&File) -> Option<String>| -> Vec<(Option<String>, &Path)> {
        vec![(f(w), ws_path.as_path()), (f(u), up.as_path())]
    };
    let model = pick(
        (flags.model.map(Some), "--model"),
        env_str("HAME_MODEL").map(|(v, n)| (Some(v), n)),
        &wrap(layers(|f| f.model.clone())),
        None,
    );
    let state = pick(
        (flags.state.map(Some), "--state"),
        env_str("HAME_STATE").map(|(v, n)| (Some(v), n)),
        &wrap(layers(|f| f.state.clone())),
        None,
    );
    let store = pick(
        (flags.store.map(Some), "--store"),
        env_str("HAME_STORE").map(|(v, n)| (Some(v), n)),
        &wrap(layers(|f| f.store.clone())),
        None,
    );
    let memory_index = pick(
        (flags.memory_index.map(Some), "--memory-index"),
        env_str("HAME_MEMORY_INDEX").map(|(v, n)| (Some(v), n)),
        &wrap(layers(|f| f.memory.index.clone())),
        None,
    );
    // The base URL's variable depends on the provider of the effective model.
    let provider_var = model
        .value
        .as_deref()
        .and_then(|s| s.split(':').next())
        .map(|p| format!("{}_BASE_URL", p.to_ascii_uppercase()));
    let base_url = pick(
        (flags.base_url.map(Some), "--base-url"),
        provider_var
            .as_deref()
            .and_then(env_str)
            .map(|(v, n)| (Some(v), n)),
        &wrap(layers(|f| f.base_url.clone())),
        None,
    );
    let isolation = pick(
        (flags.isolation, "--isolation"),
        env_parsed_enum::<Isolation>("HAME_ISOLATION")?,
        &[
            (w.isolation, ws_path.as_path()),
            (u.isolation, up.as_path()),
        ],
        Isolation::User,
    );
    let isolated = pick(
        (flags.isolated.then_some(true), "--isolated"),
        None,
        &[(w.isolated, ws_path.as_path()), (u.isolated, up.as_path())],
        false,
    );
    let permission_mode = pick(
        (flags.permission_mode, "--permission-mode"),
        env_parsed_enum::<PermissionMode>("HAME_PERMISSION_MODE")?,
        &[
            (w.permission_mode, ws_path.as_path()),
            (u.permission_mode, up.as_path()),
        ],
        PermissionMode::Default,
    );
    // Seconds from the flag, the variable `hame::model::open` reads, or a file.
    let seconds = |flag: (Option<f64>, &'static str), var: &str, key: fn(&File) -> Option<f64>| {
        let files = [
            (key(w).map(Some), ws_path.as_path()),
            (key(u).map(Some), up.as_path()),
        ];
        Ok::<_, anyhow::Error>(pick(
            (flag.0.map(Some), flag.1),
            env_seconds(var)?,
            &files,
            None,
        ))
    };
    let model_timeout = seconds(
        (flags.model_timeout, "--model-timeout"),
        hame::model::MODEL_TIMEOUT_ENV,
        |f| f.model_timeout,
    )?;
    let model_connect_timeout = seconds(
        (flags.model_connect_timeout, "--model-connect-timeout"),
        hame::model::MODEL_CONNECT_TIMEOUT_ENV,
        |f| f.model_connect_timeout,
    )?;
    for (name, setting) in [
        ("model_timeout", &model_timeout),
        ("model_connect_timeout", &model_connect_timeout),
    ] {
        if let Some(v) = setting.value {
            crate::common::seconds(&v.to_string())
                .map_err(|e| ConfigError(format!("{name} {e} (from {})", setting.source)))?;
        }
    }
    let memory = pick(
        (flags.no_memory.then_some(false), "--no-memory"),
        None,
        &[
            (w.memory.enabled, ws_path.as_path()),
            (u.memory.enabled, up.as_path()),
        ],
        true,
    );
    let max_iterations = pick(
        (flags.max_iterations, "--max-iterations"),
        env_parsed::<usize>("HAME_MAX_ITERATIONS")?,
        &[
            (w.limits.max_iterations, ws_path.as_path()),
            (u.limits.max_iterations, up.as_path()),
        ],
        DEFAULT_MAX_ITERATIONS,
    );
    if max_iterations.value == 0 {
        return Err(ConfigError(format!(
            "max_iterations must be at least 1 (from {})",
            max_iterations.source
        ))
        .into());
    }
    let context_window = pick(
        (flags.context_window.map(Some), "--context-window"),
        env_parsed::<u64>("HAME_CONTEXT_WINDOW")?.map(|(v, n)| (Some(v), n)),
        &[
            (w.limits.context_window.map(Some), ws_path.as_path()),
            (u.limits.context_window.map(Some), up.as_path()),
        ],
        None,
    );
    if context_window.value.is_some_and(|w| w < 1_000) {
        return Err(ConfigError(format!(
            "context_window must be at least 1000 tokens (from {})",
            context_window.source
        ))
        .into());
    }
    let subagent_depth = pick(
        (flags.subagent_depth, "--subagent-depth"),
        None,
        &[
            (w.limits.subagent_depth, ws_path.as_path()),
            (u.limits.subagent_depth, up.as_path()),
        ],
        DEFAULT_SUBAGENT_DEPTH,
    );
    let task_wait = pick(
        (flags.task_wait, "--task-wait"),
        None,
        &[
            (w.limits.task_wait, ws_path.as_path()),
            (u.limits.task_wait, up.as_path()),
        ],
        DEFAULT_TASK_WAIT,
    );
    let users = pick(
        (None, "--"),
        None,
        &[
            (w.users.clone(), ws_path.as_path()),
            (u.users.clone(), up.as_path()),
        ],
        Vec::new(),
    );
    let prompt_cache = pick(
        (None, "--"),
        env_str(hame::model::PROMPT_CACHE_ENV).map(|(v, n)| (Some(v), n)),
        &wrap(layers(|f| f.prompt_cache.clone())),
        None,
    );
    if let Some(v) = &prompt_cache.value
        && !matches!(v.trim(), "auto" | "on" | "off")
    {
        return Err(ConfigError(format!(
            "prompt_cache {v:?} (from {}) is not auto, on or off",
            prompt_cache.source
        ))
        .into());
    }
    let mut budgets = hame::harness::cost::Budgets::default();
    for f in [u, w] {
        if let Some(b) = &f.budget {
            budgets = budgets.overlay(b);
        }
    }
    for (file, path) in [(w, ws_path.as_path()), (u, up.as_path())] {
        let limits = file
            .budget
            .iter()
            .flat_map(|b| [b.run, b.session, b.user_day]);
        for l in limits {
            if l.usd.is_some_and(|v| !v.is_finite() || v < 0.0) {
                return Err(ConfigError(format!(
                    "a [budget] usd in {} is not a number at least 0",
                    path.display()
                ))
                .into());
            }
        }
    }
    let mut flag_budgets = hame::harness::cost::Budgets::default();
    for spec in &flags.budget {
        flag_budgets
            .set(spec)
            .map_err(|e| ConfigError(format!("--budget: {e}")))?;
    }
    let budgets = budgets.overlay(&flag_budgets);
    let mut verifiers = Vec::new();
    for (file, path) in [(u, up.as_path()), (w, ws_path.as_path())] {
        for spec in file.verify.iter().flatten() {
            let v = hame::harness::evidence::Verifier::try_from(spec.clone())
                .map_err(|e| ConfigError(format!("{e} (in {})", path.display())))?;
            verifiers.push(v);
        }
    }
    let mut prices = hame::harness::cost::Prices::default();
    for (file, path) in [(u, up.as_path()), (w, ws_path.as_path())] {
        for (prefix, price) in file.prices.iter().flatten() {
            if !price.is_valid() || prefix.trim().is_empty() {
                return Err(ConfigError(format!(
                    "[prices.{prefix:?}] in {} needs rates that are numbers at least 0 \
                     (USD per million tokens)",
                    path.display()
                ))
                .into());
            }
            prices = prices.with(prefix.clone(), *price);
        }
    }
    let skills_refresh = pick(
        (None, "--"),
        None,
        &[
            (w.skills.refresh, ws_path.as_path()),
            (u.skills.refresh, up.as_path()),
        ],
        DEFAULT_SKILLS_REFRESH,
    );
    if skills_refresh.value > 86_400 {
        return Err(ConfigError(format!(
            "skills.refresh must be at most 86400 seconds (from {})",
            skills_refresh.source
        ))
        .into());
    }
    let skill_repositories = pick(
        (None, "--"),
        None,
        &[
            (w.skills.repository.clone(), ws_path.as_path()),
            (u.skills.repository.clone(), up.as_path()),
        ],
        Vec::new(),
    );
    for r in &skill_repositories.value {
        if r.git.is_some() == r.sql.is_some() {
            return Err(ConfigError(format!(
                "each [[skills.repository]] needs exactly one of `git` and `sql` (in {})",
                skill_repositories.source
            ))
            .into());
        }
        if r.git.is_some() && r.table.is_some()
            || r.sql.is_some() && (r.reference.is_some() || r.path.is_some())
        {
            return Err(ConfigError(format!(
                "[[skills.repository]]: `ref` and `path` go with `git`, `table` with `sql` (in {})",
                skill_repositories.source
            ))
            .into());
        }
    }
    let keep_text = pick(
        (None, "--"),
        None,
        &[
            (w.runs.keep_finished.clone(), ws_path.as_path()),
            (u.runs.keep_finished.clone(), up.as_path()),
        ],
        "7d".to_owned(),
    );
    let keep_finished = Setting {
        value: keep_finished(&keep_text.value)
            .map_err(|e| ConfigError(format!("runs.keep_finished ({}): {e}", keep_text.source)))?,
        source: keep_text.source,
    };
    if u.agents.is_some() {
        return Err(ConfigError(format!(
            "[agents.*] in {} is read from a workspace's hame.toml only (the agents a server serves belong to its workspace)",
            up.display()
        ))
        .into());
    }
    let mut agents = Vec::new();
    for (name, section) in w.agents.iter().flatten() {
        hame::harness::validate_id("agent id", name)
            .map_err(|e| ConfigError(format!("[agents.{name}] in {}: {e}", ws_path.display())))?;
        let mut section = section.clone();
        if section.workspace.is_relative() {
            section.workspace = workspace.join(&section.workspace);
        }
        if !section.workspace.is_dir() {
            return Err(ConfigError(format!(
                "[agents.{name}] in {}: the workspace {} is not a folder",
                ws_path.display(),
                section.workspace.display()
            ))
            .into());
        }
        agents.push((name.clone(), section));
    }
    if isolated.value && store.value.is_some() {
        return Err(ConfigError(format!(
            "isolated ({}) and store ({}) exclude each other: pick one mode",
            isolated.source, store.source
        ))
        .into());
    }
    Ok(Effective {
        workspace: Setting {
            value: workspace,
            source: ws_source,
        },
        model,
        base_url,
        state,
        store,
        isolation,
        isolated,
        permission_mode,
        model_timeout,
        model_connect_timeout,
        memory,
        memory_index,
        max_iterations,
        context_window,
        subagent_depth,
        task_wait,
        users,
        prompt_cache,
        budgets,
        verifiers,
        prices,
        skills_refresh,
        skill_repositories,
        keep_finished,
        files,
        agents,
    })
}

fn wrap(v: Vec<(Option<String>, &Path)>) -> Vec<(Option<Option<String>>, &Path)> {
    v.into_iter().map(|(s, p)| (s.map(Some), p)).collect()
}

/// An environment variable holding seconds; a value that is not is exit 2.
fn env_seconds(name: &str) -> anyhow::Result<Option<(Option<f64>, String)>> {
    match env(name) {
        None => Ok(None),
        Some(v) => match crate::common::seconds(&v) {
            Ok(s) => Ok(Some((Some(s), name.to_owned()))),
            Err(e) => Err(ConfigError(format!("{name}={v:?}: {e}")).into()),
        },
    }
}

/// An environment variable holding one value of `T` (a `clap::ValueEnum`); another value is
/// exit 2 naming the variable and the values it takes.
fn env_parsed_enum<T: clap::ValueEnum>(name: &str) -> anyhow::Result<Option<(T, String)>> {
    match env(name) {
        None => Ok(None),
        Some(v) => match T::from_str(v.trim(), true) {
            Ok(value) => Ok(Some((value, name.to_owned()))),
            Err(_) => {
                let names: Vec<String> = T::value_variants()
                    .iter()
                    .filter_map(|x| x.to_possible_value().map(|p| p.get_name().to_owned()))
                    .collect();
                Err(ConfigError(format!("{name}={v:?}: expected {}", names.join(", "))).into())
            }
        },
    }
}

/// Flags of `hame config`.
#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    /// One JSON object: {"files": [...], "settings": {NAME: {"value", "source"}}}.
    #[arg(long)]
    json: bool,
}

/// A URL or secret as it may be shown: passwords of URLs replaced by `***`.
fn shown(v: &Option<String>) -> Option<String> {
    v.as_deref().map(hame::state::redact_url)
}

/// `hame config`: the effective configuration with the source of each value.
pub(crate) fn show(args: ConfigArgs) -> anyhow::Result<()> {
    let e = resolve(&args.common)?;
    let mut rows: Vec<(&str, serde_json::Value, &Source)> = vec![
        (
            "workspace",
            serde_json::json!(e.workspace.value.display().to_string()),
            &e.workspace.source,
        ),
        ("model", serde_json::json!(e.model.value), &e.model.source),
        (
            "base_url",
            serde_json::json!(shown(&e.base_url.value)),
            &e.base_url.source,
        ),
        (
            "state",
            serde_json::json!(shown(&e.state.value)),
            &e.state.source,
        ),
        (
            "store",
            serde_json::json!(shown(&e.store.value)),
            &e.store.source,
        ),
        (
            "isolation",
            serde_json::json!(e.isolation.value.as_str()),
            &e.isolation.source,
        ),
        (
            "isolated",
            serde_json::json!(e.isolated.value),
            &e.isolated.source,
        ),
        (
            "permission_mode",
            serde_json::json!(e.permission_mode.value.as_str()),
            &e.permission_mode.source,
        ),
        (
            "model_timeout",
            serde_json::json!(
                e.model_timeout
                    .value
                    .unwrap_or(hame::model::DEFAULT_FIRST_BYTE_TIMEOUT.as_secs_f64())
            ),
            &e.model_timeout.source,
        ),
        (
            "model_connect_timeout",
            serde_json::json!(
                e.model_connect_timeout
                    .value
                    .unwrap_or(hame::model::DEFAULT_CONNECT_TIMEOUT.as_secs_f64())
            ),
            &e.model_connect_timeout.source,
        ),
        (
            "memory.enabled",
            serde_json::json!(e.memory.value),
            &e.memory.source,
        ),
        (
            "memory.index",
            serde_json::json!(shown(&e.memory_index.value)),
            &e.memory_index.source,
        ),
        ("users", serde_json::json!(e.users.value), &e.users.source),
        (
            "limits.max_iterations",
            serde_json::json!(e.max_iterations.value),
            &e.max_iterations.source,
        ),
        (
            "limits.context_window",
            serde_json::json!(e.context_window.value),
            &e.context_window.source,
        ),
        (
            "limits.subagent_depth",
            serde_json::json!(e.subagent_depth.value),
            &e.subagent_depth.source,
        ),
        (
            "limits.task_wait",
            serde_json::json!(e.task_wait.value),
            &e.task_wait.source,
        ),
        (
            "prompt_cache",
            serde_json::json!(e.prompt_cache.value.as_deref().unwrap_or("auto")),
            &e.prompt_cache.source,
        ),
        (
            "skills.refresh",
            serde_json::json!(e.skills_refresh.value),
            &e.skills_refresh.source,
        ),
        (
            "runs.keep_finished",
            serde_json::json!(
                e.keep_finished
                    .value
                    .map_or_else(|| "forever".to_owned(), |d| format!("{}s", d.as_secs()))
            ),
            &e.keep_finished.source,
        ),
        (
            "skills.repository",
            serde_json::json!(
                e.skill_repositories
                    .value
                    .iter()
                    .map(|r| {
                        let mut r = r.clone();
                        r.git = shown(&r.git);
                        r.sql = shown(&r.sql);
                        r
                    })
                    .collect::<Vec<_>>()
            ),
            &e.skill_repositories.source,
        ),
    ];
    // The API key of the model's provider: whether it is set, never its value.
    let key_source;
    if let Some(var) = e.base_url_var() {
        let key_var = var.replace("_BASE_URL", "_API_KEY");
        let set = env(&key_var).is_some();
        key_source = if set {
            Source::Env(key_var)
        } else {
            Source::Default
        };
        rows.push((
            "api_key",
            if set {
                serde_json::json!("(set, redacted)")
            } else {
                serde_json::Value::Null
            },
            &key_source,
        ));
    }
    if args.json {
        let mut settings = serde_json::Map::new();
        for (name, value, source) in &rows {
            settings.insert(
                (*name).to_owned(),
                serde_json::json!({"value": value, "source": source.to_string()}),
            );
        }
        let files: Vec<String> = e.files.iter().map(|p| p.display().to_string()).collect();
        println!(
            "{}",
            serde_json::json!({"files": files, "settings": settings})
        );
        return Ok(());
    }
    for (name, value, source) in &rows {
        let v = match value {
            serde_json::Value::Null => "(unset)".to_owned(),
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        println!("{name:<22} {v:<40} {source}");
    }
    if e.files.is_empty() {
        println!(
            "# no config file read (looked for {} and {})",
            e.workspace.value.join(WORKSPACE_FILE).display(),
            user_file().map_or_else(
                || "~/.config/hame/config.toml".into(),
                |p| p.display().to_string()
            )
        );
    }
    Ok(())
}
