//! `tools.json`: the whole document, typed (`allow`, `deny`, `mcpServers`, `permissions`),
//! `${VAR}` substitution after parsing, and the per-user merge. Pure: no I/O here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The file name, at the workspace root (and `<userId>/tools.json` for one user).
pub const TOOLS_JSON: &str = "tools.json";
/// Largest `tools.json` read, in bytes.
pub const MAX_TOOLS_JSON_BYTES: usize = 1024 * 1024;

/// A parsed, validated `tools.json` (every key optional).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolsConfig {
    /// Tool names or globs (`mcp__*`): when set and non-empty, only matching tools are
    /// offered and run.
    pub allow: Option<Vec<String>>,
    /// Tool names or globs never offered nor run (deny wins over allow).
    pub deny: Vec<String>,
    /// MCP servers by name.
    pub mcp_servers: BTreeMap<String, McpServer>,
    /// Permission rules (parsed and validated; enforced by the permissions layer).
    pub permissions: Option<Permissions>,
    /// The values `${VAR}` put where credentials go ([`secret_position`]): registered as
    /// secrets of the process when the file is loaded, so no text carries them
    /// (`hame_core::secrets`, ADR 0023).
    pub secrets: hame_core::secrets::Redactor,
}

/// One `mcpServers` entry, after `${VAR}` substitution.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServer {
    /// How to reach it (`hame_mcp` form; a relative `cwd` resolved against the
    /// workspace directory).
    pub server: hame_mcp::ServerConfig,
    /// Timeouts (`startupTimeout`, `timeout`, in seconds).
    pub options: hame_mcp::ClientOptions,
    /// `idempotent`: which of the server's tools may simply run again (default none).
    pub idempotent: Idempotent,
}

/// An `mcpServers` entry's `idempotent`: `true` (every tool of the server), `false` (none,
/// the default) or a list of the server's own tool names. A call of such a tool writes no
/// intent: a call cut by a crash is not reported `outcome_unknown`, the model simply asks
/// for it again (docs/tools.md, *Exactly-once tools*).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Idempotent {
    /// No tool (the default).
    #[default]
    None,
    /// Every tool of the server.
    All,
    /// These tools (the server's names, not the `mcp__` ones).
    Tools(Vec<String>),
}

impl Idempotent {
    /// Whether the server's tool `name` is declared idempotent.
    pub fn covers(&self, name: &str) -> bool {
        match self {
            Self::None => false,
            Self::All => true,
            Self::Tools(names) => names.iter().any(|n| n == name),
        }
    }

    fn parse(v: Option<serde_json::Value>) -> Result<Self, String> {
        let bad = "`idempotent` must be true, false or a list of the server's tool names";
        match v {
            None | Some(serde_json::Value::Bool(false)) => Ok(Self::None),
            Some(serde_json::Value::Bool(true)) => Ok(Self::All),
            Some(serde_json::Value::Array(items)) => items
                .into_iter()
                .map(|i| match i {
                    serde_json::Value::String(s) if !s.trim().is_empty() => Ok(s),
                    _ => Err(bad.to_owned()),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Self::Tools),
            Some(_) => Err(bad.to_owned()),
        }
    }
}

/// The `permissions` section: `{"allow": [rule], "ask": [rule], "deny": [rule],
/// "default": "allow"|"ask"|"deny"}`, rule = `tool_name` or `tool_name(glob)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Permissions {
    /// Rules that allow.
    #[serde(default)]
    pub allow: Vec<PermissionRule>,
    /// Rules that ask a human.
    #[serde(default)]
    pub ask: Vec<PermissionRule>,
    /// Rules that deny.
    #[serde(default)]
    pub deny: Vec<PermissionRule>,
    /// What applies when no rule matches (default `allow`).
    #[serde(default)]
    pub default: Option<PermissionDefault>,
}

/// The outcome when no permission rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PermissionDefault {
    /// Run.
    Allow,
    /// Ask a human.
    Ask,
    /// Refuse.
    Deny,
}

/// `tool_name` or `tool_name(glob)`: the glob is matched against the call's main argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionRule {
    /// The tool name (or a glob of names).
    pub tool: String,
    /// The glob of the main argument, if any.
    pub argument: Option<String>,
}

impl<'de> Deserialize<'de> for PermissionRule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PermissionRule::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl PermissionRule {
    /// Parses `name` or `name(glob)`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (tool, argument) = match s.split_once('(') {
            Some((tool, rest)) => {
                let arg = rest
                    .strip_suffix(')')
                    .ok_or_else(|| format!("permission rule `{s}` has no closing `)`"))?;
                check_glob(arg)?;
                (tool.trim(), Some(arg.to_owned()))
            }
            None => (s, None),
        };
        if tool.is_empty() {
            return Err(format!("permission rule `{s}` names no tool"));
        }
        check_glob(tool)?;
        Ok(Self {
            tool: tool.to_owned(),
            argument,
        })
    }
}

fn check_glob(pattern: &str) -> Result<(), String> {
    globset::Glob::new(pattern)
        .map(|_| ())
        .map_err(|e| format!("`{pattern}` is not a valid glob: {e}"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDoc {
    #[serde(default)]
    allow: Option<Vec<String>>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default, rename = "mcpServers")]
    mcp_servers: BTreeMap<String, RawServer>,
    #[serde(default)]
    permissions: Option<Permissions>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(default)]
    transport: Option<String>,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default, rename = "startupTimeout")]
    startup_timeout: Option<f64>,
    #[serde(default)]
    idempotent: Option<serde_json::Value>,
}

/// Parses one `tools.json` (`file` names it in errors): JSON first, then `${VAR}` in every
/// string value replaced from `env` (so a value can never inject JSON), then the typed
/// document. Unknown keys (top level, in a server, in `permissions`) are errors; so are a
/// missing variable, a bad glob, a server without a transport. The error is one line
/// naming `file`.
pub fn parse(
    file: &str,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
    workspace: &Path,
) -> Result<ToolsConfig, String> {
    let mut value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("{file}: not valid JSON: {e}"))?;
    if !value.is_object() {
        return Err(format!("{file}: the document must be a JSON object"));
    }
    let mut secrets = hame_core::secrets::Redactor::new();
    substitute_at(&mut value, env, "", &mut |var, at, text| {
        if var.is_empty() {
            // A whole `url` with a variable in it: its password and secret query values.
            secrets.add_url(text);
        } else if secret_position(var, at) {
            secrets.add_secret(text);
        }
    })
    .map_err(|e| format!("{file}: {e}"))?;
    let raw: RawDoc = serde_json::from_value(value).map_err(|e| format!("{file}: {e}"))?;
    for pattern in raw.allow.iter().flatten().chain(&raw.deny) {
        check_glob(pattern).map_err(|e| format!("{file}: {e}"))?;
    }
    let mut servers = BTreeMap::new();
    for (name, s) in raw.mcp_servers {
        let server =
            server(&name, s, workspace).map_err(|e| format!("{file}: mcpServers.{name}: {e}"))?;
        servers.insert(name, server);
    }
    Ok(ToolsConfig {
        allow: raw.allow,
        deny: raw.deny,
        mcp_servers: servers,
        permissions: raw.permissions,
        secrets,
    })
}

/// Whether the value of `${var}` substituted at `at` (`mcpServers.web.headers.Authorization`)
/// is a secret: the variable's name looks secret (`hame_core::secrets::is_secret_name`), or
/// it goes into a server's `headers` (where credentials go: `Authorization`, `X-Api-Key`),
/// or into an `env` entry whose name looks secret. Other values (a port, a path) are not:
/// cutting them out of every text would shred it.
pub fn secret_position(var: &str, at: &str) -> bool {
    use hame_core::secrets::is_secret_name;
    if is_secret_name(var) {
        return true;
    }
    let mut parts = at.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("mcpServers"), Some(_), Some("headers"), Some(_)) => true,
        (Some("mcpServers"), Some(_), Some("env"), Some(name)) => is_secret_name(name),
        _ => false,
    }
}

fn seconds(v: Option<f64>, default: Duration, key: &str) -> Result<Duration, String> {
    match v {
        None => Ok(default),
        Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err(format!(
            "`{key}` must be between 0 and 86400 seconds, not {s}"
        )),
    }
}

fn server(name: &str, s: RawServer, workspace: &Path) -> Result<McpServer, String> {
    hame_mcp::names::check_server_name(name)?;
    let options = hame_mcp::ClientOptions {
        startup_timeout: seconds(
            s.startup_timeout,
            hame_mcp::DEFAULT_STARTUP_TIMEOUT,
            "startupTimeout",
        )?,
        call_timeout: seconds(s.timeout, hame_mcp::DEFAULT_CALL_TIMEOUT, "timeout")?,
    };
    let idempotent = Idempotent::parse(s.idempotent)?;
    let transport = match s.transport.as_deref() {
        Some(t) => t.to_owned(),
        None if s.command.is_some() => "stdio".into(),
        None if s.url.is_some() => "http".into(),
        None => {
            return Err("no `transport` (\"stdio\" with `command`, or \"http\" with `url`)".into());
        }
    };
    let transport = match transport.as_str() {
        "stdio" => {
            if s.url.is_some() || !s.headers.is_empty() {
                return Err("`url` and `headers` belong to the http transport".into());
            }
            let command = s
                .command
                .filter(|c| !c.trim().is_empty())
                .ok_or("the stdio transport needs `command`")?;
            let cwd = match s.cwd {
                Some(c) => {
                    let p = PathBuf::from(c);
                    if p.is_absolute() {
                        p
                    } else {
                        workspace.join(p)
                    }
                }
                None => workspace.to_path_buf(),
            };
            hame_mcp::Transport::Stdio {
                command,
                args: s.args,
                env: s.env,
                cwd: Some(cwd),
            }
        }
        "http" | "streamableHttp" | "streamable-http" | "streamable_http" => {
            if s.command.is_some() || !s.args.is_empty() || !s.env.is_empty() || s.cwd.is_some() {
                return Err(
                    "`command`, `args`, `env` and `cwd` belong to the stdio transport".into(),
                );
            }
            let url = s.url.ok_or("the http transport needs `url`")?;
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "`url` must start with http:// or https://, not `{url}`"
                ));
            }
            hame_mcp::Transport::Http {
                url,
                headers: s.headers,
            }
        }
        other => {
            return Err(format!(
                "unknown transport `{other}` (use \"stdio\" or \"http\")"
            ));
        }
    };
    Ok(McpServer {
        server: hame_mcp::ServerConfig {
            name: name.to_owned(),
            transport,
        },
        options,
        idempotent,
    })
}

/// Replaces `${VAR}` in every string value (not in keys) from `env`; `$${` is a literal
/// `${`. A missing variable is an error naming it and the key that uses it.
pub fn substitute(
    value: &mut serde_json::Value,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    substitute_at(value, env, "", &mut |_, _, _| {})
}

/// What [`substitute_at`] reports for each string it substituted into: the variable, the
/// key path (`mcpServers.web.url`) and the variable's value (`var`, `at`, `value`), once
/// per variable; for a `url`, also the whole string with an empty `var`.
type Seen<'a> = dyn FnMut(&str, &str, &str) + 'a;

fn substitute_at(
    value: &mut serde_json::Value,
    env: &dyn Fn(&str) -> Option<String>,
    at: &str,
    seen: &mut Seen<'_>,
) -> Result<(), String> {
    match value {
        serde_json::Value::String(s) => {
            let mut used = Vec::new();
            let whole = substitute_str(s, &mut |k| {
                let v = env(k);
                if let Some(v) = &v {
                    used.push((k.to_owned(), v.clone()));
                }
                v
            });
            *s = whole.map_err(|e| {
                if at.is_empty() {
                    e
                } else {
                    format!("{at}: {e}")
                }
            })?;
            for (var, v) in &used {
                seen(var, at, v);
            }
            if at.ends_with(".url") && !used.is_empty() {
                seen("", at, s);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, v) in a.iter_mut().enumerate() {
                substitute_at(v, env, &format!("{at}[{i}]"), seen)?;
            }
        }
        serde_json::Value::Object(o) => {
            for (k, v) in o.iter_mut() {
                let key = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                substitute_at(v, env, &key, seen)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn substitute_str(s: &str, env: &mut dyn FnMut(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix("${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('{') {
            let end = tail
                .find('}')
                .ok_or_else(|| format!("`${{` without a closing `}}` in \"{s}\""))?;
            let name = &tail[..end];
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("`${{{name}}}` is not a variable name"));
            }
            let v = env(name).ok_or_else(|| {
                format!("environment variable {name} is not set (used as ${{{name}}})")
            })?;
            out.push_str(&v);
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The per-user merge: `user` (`<userId>/tools.json`) over `shared`: `allow` replaced
/// when the user's file has it, `deny` is the union (a user file cannot lift a shared
/// deny), `mcpServers` merged by name (the user's entry wins), `permissions` rules
/// concatenated (the user's `default` wins when set).
pub fn merge(shared: ToolsConfig, user: ToolsConfig) -> ToolsConfig {
    let mut out = shared;
    if user.allow.is_some() {
        out.allow = user.allow;
    }
    for d in user.deny {
        if !out.deny.contains(&d) {
            out.deny.push(d);
        }
    }
    out.mcp_servers.extend(user.mcp_servers);
    out.secrets.extend(&user.secrets);
    out.permissions = match (out.permissions, user.permissions) {
        (None, u) => u,
        (s, None) => s,
        (Some(mut s), Some(u)) => {
            s.allow.extend(u.allow);
            s.ask.extend(u.ask);
            s.deny.extend(u.deny);
            if u.default.is_some() {
                s.default = u.default;
            }
            Some(s)
        }
    };
    out
}

/// Compiled `allow` / `deny` globs: which tools a call may see and run.
#[derive(Debug, Clone)]
pub struct ToolFilter {
    allow: Option<globset::GlobSet>,
    deny: globset::GlobSet,
}

impl ToolFilter {
    /// Compiles the filter of `config` (globs were checked by [`parse`]).
    pub fn new(config: &ToolsConfig) -> Result<Self, String> {
        let set = |patterns: &[String]| -> Result<globset::GlobSet, String> {
            let mut b = globset::GlobSetBuilder::new();
            for p in patterns {
                b.add(globset::Glob::new(p).map_err(|e| format!("`{p}`: {e}"))?);
            }
            b.build().map_err(|e| e.to_string())
        };
        let allow = match &config.allow {
            Some(a) if !a.is_empty() => Some(set(a)?),
            _ => None,
        };
        Ok(Self {
            allow,
            deny: set(&config.deny)?,
        })
    }

    /// Whether tool `name` is offered and may run: not denied, and allowed when an
    /// allow list is set.
    pub fn permits(&self, name: &str) -> bool {
        !self.deny.is_match(name) && self.allow.as_ref().is_none_or(|a| a.is_match(name))
    }
}

#[cfg(test)]
#[path = "tools_config_tests.rs"]
mod tests;
