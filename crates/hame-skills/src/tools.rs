//! The tools the model calls: `load_skill` and `propose_skill`.

use std::sync::Arc;

use async_trait::async_trait;
use hame_core::{Tool, ToolContext, ToolError, ToolOutput, TypedTool, codes, typed};
use hame_tools::WorkspaceExt;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::Error;
use crate::catalog::Skills;

/// `load_skill` and `propose_skill` over `skills`.
pub fn skill_tools(skills: Arc<Skills>) -> Vec<Arc<dyn Tool>> {
    vec![
        typed(LoadSkill(skills.clone())),
        typed(ProposeSkill(skills)),
    ]
}

fn to_tool_error(e: Error) -> ToolError {
    let code = match &e {
        Error::NotFound(_) | Error::Invalid(_) => codes::INVALID_ARGUMENTS,
        _ => codes::FAILED,
    };
    ToolError::new(code, e.to_string())
}

#[derive(Debug)]
struct LoadSkill(Arc<Skills>);

/// Arguments of `load_skill`.
#[derive(Debug, Deserialize, JsonSchema)]
struct LoadArgs {
    /// The skill's name, as listed in <available_skills>.
    name: String,
    /// Optional: one file of the skill (relative to its folder, e.g.
    /// `references/guide.md`) instead of its instructions.
    #[serde(default)]
    path: Option<String>,
}

#[async_trait]
impl TypedTool for LoadSkill {
    type Args = LoadArgs;
    fn name(&self) -> &str {
        "load_skill"
    }
    fn description(&self) -> String {
        "Load a skill listed in <available_skills>: returns its instructions and the paths of \
         its resource files. With `path`, returns that file of the skill instead."
            .into()
    }
    async fn run(&self, args: LoadArgs, ctx: &ToolContext) -> ToolOutput {
        // The step's snapshot: the skill the prompt listed, without a store round trip
        // (a resource file the snapshot does not hold is read from the store).
        let ws = ctx.config_workspace()?;
        self.0
            .load(&ws, &args.name, args.path.as_deref())
            .await
            .map_err(to_tool_error)
    }
}

#[derive(Debug)]
struct ProposeSkill(Arc<Skills>);

/// Arguments of `propose_skill`.
#[derive(Debug, Deserialize, JsonSchema)]
struct ProposeArgs {
    /// Short name: letters, digits, `.`, `_`, `-` (at most 64).
    name: String,
    /// One or two sentences: what the skill does and when to use it.
    description: String,
    /// The instructions (Markdown).
    body: String,
}

#[async_trait]
impl TypedTool for ProposeSkill {
    type Args = ProposeArgs;
    fn name(&self) -> &str {
        "propose_skill"
    }
    fn description(&self) -> String {
        "Save a reusable procedure that worked as a draft skill. Drafts are reviewed by a \
         human and are not available until promoted."
            .into()
    }
    async fn run(&self, args: ProposeArgs, ctx: &ToolContext) -> ToolOutput {
        let ws = ctx.workspace()?;
        let path = self
            .0
            .propose(ws, &args.name, &args.description, &args.body)
            .await
            .map_err(to_tool_error)?;
        Ok(format!(
            "Draft saved at {path}. It is not available until a human promotes it \
             (`hame skills promote {}`).",
            args.name
        ))
    }
}
