//! The built-in tools the harness registers.

use std::path::Path;
use std::sync::Arc;

use hame_core::{RuntimeContext, Tool, ToolError};
use hame_fs::Filesystem;
use hame_session::{FsFn, SessionToolOptions};

use crate::error::{Error, Result};
use crate::tenancy::Tenancy;

/// The built-in tools: the session tools, and later the file tools and the shell.
pub fn builtin_tools(
    tenancy: &Arc<Tenancy>,
    agent: &str,
    _shell: bool,
    _workspace: &Path,
) -> Result<Vec<Arc<dyn Tool>>> {
    let t = tenancy.clone();
    let provider = FsFn(
        move |ctx: &RuntimeContext| -> std::result::Result<Arc<dyn Filesystem>, ToolError> {
            t.session_fs(ctx)
                .map_err(|e| ToolError::new(e.code(), e.to_string()))
        },
    );
    hame_session::session_tools(Arc::new(provider), agent, SessionToolOptions::default())
        .map_err(|e| Error::Config(format!("session tools: {e}")))
}
