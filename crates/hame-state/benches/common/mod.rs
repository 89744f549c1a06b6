//! What the state benches share: one tokio runtime, a panic with the store's message, and
//! the messages of a `read_file` step.

use std::sync::LazyLock;

use hame_core::{ContentBlock, Message, Role, ToolCall, ToolResult};
use tokio::runtime::Runtime;

/// The runtime every bench drives the store on.
pub static RT: LazyLock<Runtime> = LazyLock::new(|| match Runtime::new() {
    Ok(rt) => rt,
    Err(e) => panic!("tokio runtime: {e}"),
});

/// The value, or a panic with the store's error (a bench has nobody to return it to).
pub fn ok<T>(r: hame_state::Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// The assistant's `read_file` call `id` of `src/f<n>.rs`.
pub fn read_call(id: &str, n: usize) -> Message {
    Message {
        role: Role::Assistant,
        content: vec![ContentBlock::ToolCall(ToolCall {
            id: id.to_owned(),
            name: "read_file".into(),
            arguments: format!("{{\"path\":\"src/f{n}.rs\"}}"),
        })]
        .into(),
        usage: None,
    }
}

/// The result of the call `id`.
pub fn read_result(id: &str, content: String) -> Message {
    Message::tool_results(vec![ToolResult {
        id: id.to_owned(),
        content,
        is_error: false,
        code: None,
    }])
}
