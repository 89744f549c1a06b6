//! The names under which MCP tools are offered: `mcp__<server>__<tool>`, one-to-one.
//!
//! Providers accept tool names of `[A-Za-z0-9_-]`, at most 64 characters. A name that
//! already fits is offered as it is. A name that had to change (a character replaced by
//! `_`, or cut to fit) gets a short hash of the original server and tool names as a suffix,
//! so `dot.name` and `dot_name` (or two names that differ only after 64 characters) stay
//! two tools. Server names are restricted by [`check_server_name`] so that the `__` after
//! the server is the first one in the name: no two (server, tool) pairs that fit produce
//! the same name. What is left — two hashes that collide, or a tool whose real name is
//! another's hashed form — is found by [`dedupe`], which keeps the first and reports the
//! rest.

use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};

/// The longest name providers accept for a tool.
pub const MAX_NAME_CHARS: usize = 64;

/// Hex digits of the hash suffix of a changed name.
const HASH_HEX: usize = 8;

/// Whether `c` may appear in a tool name as providers accept it.
fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// The name under which tool `tool` of server `server` is offered:
/// `mcp__<server>__<tool>` when that uses only `[A-Za-z0-9_-]` and fits in 64 characters;
/// otherwise that text with every other character replaced by `_`, cut to 55 characters,
/// and `_` plus the first 8 hex digits of SHA-256 of `<server>\0<tool>` appended (64 at
/// most). The hash is stable across versions and machines, so a name in a log, a
/// permission rule or a `tools.json` glob keeps meaning the same tool.
pub fn qualified_name(server: &str, tool: &str) -> String {
    let raw = format!("mcp__{server}__{tool}");
    if raw.chars().count() <= MAX_NAME_CHARS && raw.chars().all(allowed) {
        return raw;
    }
    let mut hasher = Sha256::new();
    hasher.update(server.as_bytes());
    hasher.update([0u8]);
    hasher.update(tool.as_bytes());
    let digest = hasher.finalize();
    let hash: String = digest
        .iter()
        .take(HASH_HEX / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    let keep = MAX_NAME_CHARS - 1 - HASH_HEX;
    let mut out: String = raw
        .chars()
        .map(|c| if allowed(c) { c } else { '_' })
        .take(keep)
        .collect();
    out.push('_');
    out.push_str(&hash);
    out
}

/// Whether [`qualified_name`] changed the tool's name (it is not `mcp__<server>__<tool>`).
pub fn is_renamed(server: &str, tool: &str, qualified: &str) -> bool {
    qualified != format!("mcp__{server}__{tool}")
}

/// Checks a server name of `tools.json`: `[A-Za-z0-9_-]+`, without `__` and without `_` at
/// either end. With those, `mcp__<server>__<tool>` says where the server's name ends
/// (`a_` with tool `_b` and `a` with tool `__b` would both give `mcp__a____b`). The error
/// is one line saying what to do.
pub fn check_server_name(name: &str) -> Result<(), String> {
    if name.is_empty() || !name.chars().all(allowed) {
        return Err("a server name uses only letters, digits, `-` and `_`".into());
    }
    if name.contains("__") || name.starts_with('_') || name.ends_with('_') {
        return Err(format!(
            "server name `{name}` is ambiguous in tool names `mcp__<server>__<tool>`: rename it \
             without `__` and without `_` at either end (for example `{}`)",
            suggest(name)
        ));
    }
    Ok(())
}

fn suggest(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c == '_' && (out.is_empty() || out.ends_with('_')) {
            continue;
        }
        out.push(c);
    }
    let out = out.trim_end_matches('_').to_owned();
    if out.is_empty() { "server".into() } else { out }
}

/// Something the naming did to a tool, worth one warning.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameNote {
    /// The tool is offered under a name other than `mcp__<server>__<tool>`.
    Renamed {
        /// The server.
        server: String,
        /// The tool's name on the server.
        tool: String,
        /// The name it is offered under.
        qualified: String,
    },
    /// The tool is not offered: its name is taken by another tool.
    Dropped {
        /// The server.
        server: String,
        /// The tool's name on the server.
        tool: String,
        /// The name both would have.
        qualified: String,
        /// The server of the tool that keeps the name.
        kept_server: String,
        /// The tool that keeps the name.
        kept_tool: String,
    },
}

impl NameNote {
    /// The server the note is about.
    pub fn server(&self) -> &str {
        match self {
            NameNote::Renamed { server, .. } | NameNote::Dropped { server, .. } => server,
        }
    }

    /// The tool (its name on the server) the note is about.
    pub fn tool(&self) -> &str {
        match self {
            NameNote::Renamed { tool, .. } | NameNote::Dropped { tool, .. } => tool,
        }
    }

    /// A key that is the same for the same note: warn once per key.
    pub fn key(&self) -> String {
        match self {
            NameNote::Renamed {
                server,
                tool,
                qualified,
            } => format!("renamed\0{server}\0{tool}\0{qualified}"),
            NameNote::Dropped {
                server,
                tool,
                qualified,
                ..
            } => format!("dropped\0{server}\0{tool}\0{qualified}"),
        }
    }
}

impl std::fmt::Display for NameNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameNote::Renamed {
                tool, qualified, ..
            } => write!(
                f,
                "tool `{tool}` is offered as `{qualified}` (tool names use only [A-Za-z0-9_-], at most 64 characters; the suffix keeps it apart from similar names)"
            ),
            NameNote::Dropped {
                tool,
                qualified,
                kept_server,
                kept_tool,
                ..
            } => write!(
                f,
                "tool `{tool}` is left out: its name `{qualified}` is taken by tool `{kept_tool}` of server `{kept_server}`; rename one of them on its server"
            ),
        }
    }
}

/// A tool with the name it is offered under, as [`dedupe`] sees it.
pub trait Named {
    /// The server's name.
    fn server(&self) -> &str;
    /// The tool's name on the server.
    fn tool(&self) -> &str;
    /// The name it is offered under.
    fn qualified(&self) -> &str;
}

/// Keeps the first tool of each offered name and reports the rest as
/// [`NameNote::Dropped`], and each tool offered under a changed name as
/// [`NameNote::Renamed`]. A tool whose name was not changed wins over a renamed one with
/// the same offered name, wherever it is in the list.
pub fn dedupe<T: Named>(tools: Vec<T>) -> (Vec<T>, Vec<NameNote>) {
    // Who owns each offered name: the first unchanged tool, else the first renamed one.
    let mut owner: HashMap<String, (String, String)> = HashMap::new();
    for pass_renamed in [false, true] {
        for t in &tools {
            if is_renamed(t.server(), t.tool(), t.qualified()) == pass_renamed {
                owner
                    .entry(t.qualified().to_owned())
                    .or_insert_with(|| (t.server().to_owned(), t.tool().to_owned()));
            }
        }
    }
    let mut notes = Vec::new();
    let mut kept: Vec<T> = Vec::with_capacity(tools.len());
    let mut seen: HashSet<String> = HashSet::new();
    for t in tools {
        let q = t.qualified().to_owned();
        let (ks, kt) = owner.get(&q).cloned().unwrap_or_default();
        if ks == t.server() && kt == t.tool() && seen.insert(q.clone()) {
            if is_renamed(t.server(), t.tool(), &q) {
                notes.push(NameNote::Renamed {
                    server: t.server().to_owned(),
                    tool: t.tool().to_owned(),
                    qualified: q,
                });
            }
            kept.push(t);
        } else {
            notes.push(NameNote::Dropped {
                server: t.server().to_owned(),
                tool: t.tool().to_owned(),
                qualified: q,
                kept_server: ks,
                kept_tool: kt,
            });
        }
    }
    (kept, notes)
}

#[cfg(test)]
#[path = "names_tests.rs"]
mod tests;
