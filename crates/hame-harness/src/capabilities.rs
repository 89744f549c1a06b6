//! Workspace-declared capabilities: skills and `tools.json` (with MCP servers), as the
//! builder wires them.

use std::path::Path;
use std::sync::Arc;

use hame_core::Tool;
use hame_mcp::McpPool;
use hame_skills::{Skills, SkillsOptions};

use crate::agent::EnvLookup;
use crate::error::{Error, Result};
use crate::tools_layer::ToolsConfigLayer;

/// What the builder was told.
#[derive(Debug)]
pub(crate) struct Capabilities {
    pub(crate) skills: Option<SkillsOptions>,
    pub(crate) tools_config: bool,
    pub(crate) mcp_pool: Option<Arc<McpPool>>,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            skills: Some(SkillsOptions::default()),
            tools_config: true,
            mcp_pool: None,
        }
    }
}

/// What the agent holds.
#[derive(Debug)]
pub(crate) struct Built {
    pub(crate) skills: Option<Arc<Skills>>,
    pub(crate) tools_layer: Option<Arc<ToolsConfigLayer>>,
}

impl Capabilities {
    /// `sandbox_host`: in sandbox mode, the host template `tools.json` is read from.
    pub(crate) fn build(
        self,
        env: EnvLookup,
        workspace: &Path,
        sandbox_host: Option<Arc<dyn hame_fs::Filesystem>>,
    ) -> Result<Built> {
        let skills = match self.skills {
            Some(options) => Some(Arc::new(
                Skills::new(options).map_err(|e| Error::Config(e.to_string()))?,
            )),
            None => None,
        };
        let tools_layer = self.tools_config.then(|| {
            let layer = ToolsConfigLayer::new(
                env,
                workspace.to_path_buf(),
                self.mcp_pool.unwrap_or_default(),
            );
            Arc::new(match sandbox_host {
                Some(host) => layer.with_sandbox_host(host),
                None => layer,
            })
        });
        Ok(Built {
            skills,
            tools_layer,
        })
    }
}

impl Built {
    /// The tools of the capabilities (`load_skill`, `propose_skill`).
    pub(crate) fn tools(&self) -> Vec<Arc<dyn Tool>> {
        match &self.skills {
            Some(s) => hame_skills::skill_tools(s.clone()),
            None => Vec::new(),
        }
    }
}
