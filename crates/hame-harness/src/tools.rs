//! The built-in tools the harness registers.

use std::path::Path;
use std::sync::Arc;

use hame_core::{RuntimeContext, Tool, ToolError};
use hame_fs::{Execute, Filesystem, LocalShell, ShellOptions};
use hame_session::{FsFn, SessionToolOptions};
use hame_tools::{FsToolOptions, ToToolError};

use crate::error::{Error, Result};
use crate::tenancy::Tenancy;

/// Output cap of `read_file` and `execute` when large results are offloaded (memory on).
pub const OFFLOADED_OUTPUT_CAP: usize = 1_000_000;

/// The built-in tools: the file tools over the caller's namespace (`read_file`,
/// `write_file`, `edit_file`, `grep_files`, `glob_files`, `list_files`), `execute` when the
/// mode has a shell (local mode; it runs `sh -c` in the workspace and is not a security
/// boundary), and the session tools (`session_list`, `session_history`).
///
/// With `offloading` (memory on), results over the offload threshold are moved out of the
/// context by the memory layer, so `read_file` and `execute` may return up to
/// [`OFFLOADED_OUTPUT_CAP`] characters; without it they keep the smaller `hame-tools`
/// defaults (100,000), which bound the context on their own.
pub fn builtin_tools(
    tenancy: &Arc<Tenancy>,
    agent: &str,
    shell: bool,
    workspace: &Path,
    offloading: bool,
) -> Result<Vec<Arc<dyn Tool>>> {
    let mut shell_options = ShellOptions::default();
    let mut fs_options = FsToolOptions::default();
    if offloading {
        shell_options.max_output_bytes = OFFLOADED_OUTPUT_CAP;
        fs_options.max_read_chars = OFFLOADED_OUTPUT_CAP;
    }
    let executor: Option<Arc<dyn Execute>> = shell.then(|| {
        Arc::new(LocalShell::new(workspace.to_path_buf(), shell_options)) as Arc<dyn Execute>
    });
    let options = FsToolOptions {
        isolation: Some(tenancy.isolation.clone()),
        executor,
        ..fs_options
    };
    let mut tools = hame_tools::fs_tools(tenancy.store.clone(), options);

    let t = tenancy.clone();
    let provider = FsFn(
        move |ctx: &RuntimeContext| -> std::result::Result<Arc<dyn Filesystem>, ToolError> {
            t.session_fs(ctx).map_err(|e| e.to_tool_error())
        },
    );
    tools.extend(
        hame_session::session_tools(Arc::new(provider), agent, SessionToolOptions::default())
            .map_err(|e| Error::Config(format!("session tools: {e}")))?,
    );
    Ok(tools)
}
