//! Skills and `tools.json` in the CLI: the `--skills-dir` flag, the `tools.json` check
//! before a call, and `hame skills list|promote`.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use hame::harness::HarnessAgentBuilder;
use hame::{HarnessAgent, RuntimeContext};

use crate::ConfigError;
use crate::common::{Common, build_without_model};

/// Flags of the workspace-declared capabilities (flattened into the agent flags).
#[derive(Debug, Args)]
pub(crate) struct CapabilityArgs {
    /// A project/global skills directory (<dir>/<name>/SKILL.md), the lowest skills layer
    /// under the workspace's skills/ and the user's <userId>/skills/.
    #[arg(long, value_name = "DIR", help_heading = "Tools and skills")]
    skills_dir: Option<PathBuf>,
    /// Offer every tool in every request. By default the rarely used built-ins (session
    /// history, memory_get/memory_save, the task tools, plan mode, skills) are offered on
    /// demand: the model loads them with tool_search (docs/tools.md).
    #[arg(long, help_heading = "Tools and skills")]
    all_tools: bool,
}

/// Applies the flags and the `[skills]` section to the builder.
pub(crate) fn configure(
    builder: HarnessAgentBuilder,
    args: &CapabilityArgs,
    config: &crate::config::Effective,
) -> anyhow::Result<HarnessAgentBuilder> {
    let builder = if args.all_tools {
        builder.defer_tools(Vec::<String>::new())
    } else {
        builder
    };
    if args.skills_dir.is_none() && config.skill_repositories.value.is_empty() {
        return Ok(builder);
    }
    let mut options = hame::skills::SkillsOptions::default()
        .with_global_dir(args.skills_dir.clone())
        .with_refresh(std::time::Duration::from_secs(config.skills_refresh.value));
    let bad = |e: hame::skills::Error| {
        ConfigError(format!(
            "{e} (in [[skills.repository]] of {})",
            config.skill_repositories.source
        ))
    };
    for r in &config.skill_repositories.value {
        let repo: std::sync::Arc<dyn hame::skills::SkillRepository> = match (&r.git, &r.sql) {
            (Some(url), _) => std::sync::Arc::new(
                hame::skills::GitRepository::new(
                    url,
                    r.reference.as_deref(),
                    r.path.as_deref(),
                    &cache_dir(),
                )
                .map_err(bad)?,
            ),
            (None, Some(url)) => std::sync::Arc::new(
                hame::skills::SqlRepository::new(url, r.table.as_deref()).map_err(bad)?,
            ),
            (None, None) => continue,
        };
        options = options.with_repository(repo);
    }
    Ok(builder.skills(Some(options)))
}

/// Where Git skill repositories are cloned: `$XDG_CACHE_HOME/hame/skills`, else
/// `~/.cache/hame/skills`.
fn cache_dir() -> PathBuf {
    let base = crate::common::env("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| crate::common::env("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("hame").join("skills")
}

/// Checks the caller's `tools.json` before the call: a broken file is exit 2 with one
/// line naming it, before anything runs.
pub(crate) async fn check(agent: &HarnessAgent, ctx: &RuntimeContext) -> anyhow::Result<()> {
    match agent.tools_config_for(ctx).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_config() => Err(ConfigError(match e {
            hame::harness::Error::Config(m) => m,
            other => other.to_string(),
        })
        .into()),
        Err(e) => Err(e.into()),
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum SkillsCommand {
    /// Lists the skills a caller sees, with their layer and state (active, draft, stale,
    /// archived), and the SKILL.md files skipped for invalid front matter.
    List {
        #[command(flatten)]
        common: Common,
        /// One JSON object {"skills": [{name, description, layer, state, dir, source,
        /// version}], "invalid": [...], "shadowed": [...], "repository_errors": [...]}.
        #[arg(long)]
        json: bool,
    },
    /// Promotes a draft (skills/_drafts/NAME/ → skills/NAME/ of the caller's namespace)
    /// or restores an archived skill.
    Promote {
        #[command(flatten)]
        common: Common,
        /// The skill's name.
        name: String,
    },
}

pub(crate) async fn run(command: SkillsCommand) -> anyhow::Result<()> {
    let (common, list_json, promote) = match command {
        SkillsCommand::List { common, json } => (common, json, None),
        SkillsCommand::Promote { common, name } => (common, false, Some(name)),
    };
    let (agent, ctx) = build_without_model(&common).await?;
    let skills = agent
        .skills()
        .ok_or_else(|| ConfigError("skills are switched off".into()))?;
    let ws = agent
        .workspace_for(&ctx)
        .map_err(|e| ConfigError(e.to_string()))?;
    if let Some(name) = promote {
        let skill = skills.promote(&ws, &name).await.map_err(|e| match e {
            hame::skills::Error::NotFound(m) | hame::skills::Error::Invalid(m) => {
                anyhow::Error::new(ConfigError(m))
            }
            other => anyhow::Error::new(other),
        })?;
        println!(
            "promoted {} ({}, {})",
            skill.name,
            skill.layer.as_str(),
            skill.dir
        );
        return Ok(());
    }
    let catalog = skills.catalog(&ws, None).await;
    if list_json {
        let skills: Vec<_> = catalog
            .skills
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name,
                    "description": s.description,
                    "layer": s.layer.as_str(),
                    "state": s.state.as_str(),
                    "dir": s.dir,
                    "source": s.source,
                    "version": s.version,
                })
            })
            .collect();
        let invalid: Vec<_> = catalog
            .invalid
            .iter()
            .map(|i| serde_json::json!({"path": i.path, "error": i.error}))
            .collect();
        let shadowed: Vec<_> = catalog
            .shadowed
            .iter()
            .map(|s| serde_json::json!({"name": s.name, "used": s.used, "hidden": s.hidden}))
            .collect();
        let failed: Vec<_> = catalog
            .repository_errors
            .iter()
            .map(|e| serde_json::json!({"repository": e.repository, "error": e.error}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"skills": skills, "invalid": invalid, "shadowed": shadowed, "repository_errors": failed})
        );
    } else {
        for s in &catalog.skills {
            println!(
                "{}\t{}\t{}\t{}\t{}\t{}",
                s.name,
                s.layer.as_str(),
                s.state.as_str(),
                s.source,
                s.version.as_deref().unwrap_or("-"),
                s.description
            );
        }
        for i in &catalog.invalid {
            eprintln!("hame: warning: {} skipped: {}", i.path, i.error);
        }
        for e in &catalog.repository_errors {
            eprintln!(
                "hame: warning: skills repository {}: {}",
                e.repository, e.error
            );
        }
        for s in &catalog.shadowed {
            eprintln!(
                "hame: note: skill {} of {} hides the one of {}",
                s.name,
                s.used,
                s.hidden.join(", ")
            );
        }
    }
    Ok(())
}
