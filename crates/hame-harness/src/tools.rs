//! The built-in tools the harness registers.

use std::path::Path;
use std::sync::Arc;

use hame_core::Tool;
use hame_fs::{Execute, LocalShell, ShellOptions};
use hame_session::SessionToolOptions;
use hame_tools::FsToolOptions;

use crate::error::{Error, Result};

/// Output cap of `read_file` and `execute` when large results are offloaded (memory on).
pub const OFFLOADED_OUTPUT_CAP: usize = 1_000_000;

/// The built-in tools: the file tools over the caller's workspace handle (`read_file`,
/// `write_file`, `edit_file`, `grep_files`, `glob_files`, `list_files`), `execute` when the
/// mode has a shell (local mode; it runs `sh -c` in the workspace and is not a security
/// boundary), and the session tools (`session_list`, `session_history`).
///
/// With `offloading` (memory on), results over the offload threshold are moved out of the
/// context by the memory layer, so `read_file` and `execute` may return up to
/// [`OFFLOADED_OUTPUT_CAP`] characters; without it they keep the smaller `hame-tools`
/// defaults (100,000), which bound the context on their own.
pub fn builtin_tools(agent: &str, shell: bool, offloading: bool) -> Result<Vec<Arc<dyn Tool>>> {
    let mut options = FsToolOptions::default();
    if offloading {
        options.max_read_chars = OFFLOADED_OUTPUT_CAP;
    }
    let mut tools = hame_tools::workspace_tools(options, shell);

    tools.extend(
        hame_session::session_tools(agent, SessionToolOptions::default())
            .map_err(|e| Error::Config(format!("session tools: {e}")))?,
    );
    Ok(tools)
}

/// The shell of local mode: `sh -c` in the workspace (not a security boundary). With
/// `offloading` (memory on) its output cap is [`OFFLOADED_OUTPUT_CAP`].
pub fn local_shell(workspace: &Path, offloading: bool) -> Arc<dyn Execute> {
    let mut options = ShellOptions::default();
    if offloading {
        options.max_output_bytes = OFFLOADED_OUTPUT_CAP;
    }
    Arc::new(LocalShell::new(workspace.to_path_buf(), options))
}
