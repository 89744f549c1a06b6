//! One skill: its `SKILL.md` front matter, and the decisions about names, layers and
//! states (plain functions, no I/O).

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

/// Longest skill name.
pub const MAX_NAME_LEN: usize = 64;
/// Longest description kept in the prompt (longer ones are cut with `…`).
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
/// Days without use after which an agent-created skill is stale.
pub const STALE_AFTER_DAYS: i64 = 30;
/// Days without use after which an agent-created skill is archived (never deleted).
pub const ARCHIVE_AFTER_DAYS: i64 = 90;

/// Where a skill comes from, lowest first: a higher layer wins over a lower one with the
/// same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SkillLayer {
    /// A skill repository ([`crate::SkillRepository`]: Git, SQL), the lowest layer; among
    /// repositories the one declared first wins a name.
    Repository,
    /// The project/global skills directory (`--skills-dir`).
    Global,
    /// The workspace's `skills/` (in the isolated modes: the tenant's namespace over the
    /// template).
    Workspace,
    /// The caller's `<userId>/skills/`.
    User,
}

impl SkillLayer {
    /// Its name in listings.
    pub fn as_str(self) -> &'static str {
        match self {
            SkillLayer::Repository => "repository",
            SkillLayer::Global => "global",
            SkillLayer::Workspace => "workspace",
            SkillLayer::User => "user",
        }
    }
}

/// The life-cycle state of a skill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SkillState {
    /// Listed to the model.
    Active,
    /// Proposed by the agent, waiting for `hame skills promote`; not listed.
    Draft,
    /// Agent-created and unused for [`STALE_AFTER_DAYS`]; still listed.
    Stale,
    /// Agent-created and unused for [`ARCHIVE_AFTER_DAYS`]; not listed, not loadable,
    /// kept on disk (promote it again to restore it).
    Archived,
}

impl SkillState {
    /// Its name in listings.
    pub fn as_str(self) -> &'static str {
        match self {
            SkillState::Active => "active",
            SkillState::Draft => "draft",
            SkillState::Stale => "stale",
            SkillState::Archived => "archived",
        }
    }

    /// Whether the model sees the skill (in the prompt and through `load_skill`).
    pub fn is_visible(self) -> bool {
        matches!(self, SkillState::Active | SkillState::Stale)
    }
}

/// The YAML front matter of a `SKILL.md`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontMatter {
    /// The name (default: the directory name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the skill is for and when to use it (required).
    pub description: String,
}

/// A parsed `SKILL.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillDoc {
    /// The skill's name.
    pub name: String,
    /// Its description (one line, trimmed).
    pub description: String,
    /// The instructions (the text after the front matter).
    pub body: String,
}

/// Whether `name` may name a skill: 1 to [`MAX_NAME_LEN`] characters of
/// `[A-Za-z0-9._-]`, not starting with `.` or `_` (those are hame's: `_drafts`,
/// `.usage.json`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && !name.starts_with('_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Parses a `SKILL.md` of directory `dir_name`: `---` YAML front matter `---`, then the
/// body. The error says what is wrong, for the warning.
pub fn parse_skill(dir_name: &str, text: &str) -> Result<SkillDoc, String> {
    use hame_tools::front_matter::{FrontMatterError, split};
    let (yaml, body) = split(text).map_err(|e| match e {
        FrontMatterError::NoOpening => "no front matter: the file must start with a `---` line",
        FrontMatterError::NoClosing => "the front matter has no closing `---` line",
    })?;
    let fm: FrontMatter = yaml_serde::from_str(yaml).map_err(|e| format!("front matter: {e}"))?;
    let description = fm
        .description
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if description.is_empty() {
        return Err("front matter: `description` is empty".into());
    }
    let name = fm.name.unwrap_or_else(|| dir_name.to_owned());
    if !valid_name(&name) {
        return Err(format!(
            "name `{name}` is not a valid skill name ([A-Za-z0-9._-], at most {MAX_NAME_LEN}, not starting with `.` or `_`)"
        ));
    }
    let description = if description.chars().count() > MAX_DESCRIPTION_CHARS {
        let mut cut: String = description.chars().take(MAX_DESCRIPTION_CHARS).collect();
        cut.push('…');
        cut
    } else {
        description
    };
    Ok(SkillDoc {
        name,
        description,
        body: body.trim_start_matches(['\r', '\n']).to_owned(),
    })
}

/// Writes a `SKILL.md`: the front matter is serialised by `yaml_serde` (never pasted),
/// so a description cannot add keys or end the block.
pub fn render_skill(name: &str, description: &str, body: &str) -> Result<String, String> {
    let fm = FrontMatter {
        name: Some(name.to_owned()),
        description: description.to_owned(),
    };
    let yaml = yaml_serde::to_string(&fm).map_err(|e| e.to_string())?;
    Ok(format!("---\n{}---\n\n{}\n", yaml, body.trim_end()))
}

/// Merges the skills of the layers: for each name the highest layer wins (within one
/// layer, the first in `found`); the result is sorted by name.
pub fn merge<T: Clone>(mut found: Vec<(SkillLayer, String, T)>) -> Vec<(SkillLayer, String, T)> {
    found.sort_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
    found.dedup_by(|later, first| later.1 == first.1);
    found
}

/// What hame remembers of an agent-created skill (`skills/.usage.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// When `propose_skill` wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<DateTime<Utc>>,
    /// When it was last promoted (a draft, or an archived skill restored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted: Option<DateTime<Utc>>,
    /// When `load_skill` last returned it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used: Option<DateTime<Utc>>,
    /// Never made stale or archived.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
}

/// The curator's decision for a promoted skill: `usage` is `None` for a skill a human
/// wrote (always active); an agent-created one is stale after [`STALE_AFTER_DAYS`] and
/// archived after [`ARCHIVE_AFTER_DAYS`] without use (counted from its last use, its
/// promotion or its creation, whichever is latest).
pub fn curate(usage: Option<&Usage>, now: DateTime<Utc>) -> SkillState {
    let Some(u) = usage else {
        return SkillState::Active;
    };
    if u.pinned {
        return SkillState::Active;
    }
    let Some(last) = [u.created, u.promoted, u.last_used]
        .into_iter()
        .flatten()
        .max()
    else {
        return SkillState::Active;
    };
    let idle = now - last;
    if idle >= Duration::days(ARCHIVE_AFTER_DAYS) {
        SkillState::Archived
    } else if idle >= Duration::days(STALE_AFTER_DAYS) {
        SkillState::Stale
    } else {
        SkillState::Active
    }
}

#[cfg(test)]
#[path = "skill_tests.rs"]
mod tests;
