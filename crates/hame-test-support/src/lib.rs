//! # hame-test-support
//!
//! A scripted model server for hame's tests: it speaks the OpenAI Chat Completions
//! (`POST /v1/chat/completions`) and Anthropic Messages (`POST /v1/messages`) wire formats
//! over real HTTP on 127.0.0.1, records every request, and answers from a script.
//!
//! Use it as a **dev-dependency only**: the model clients of `hame-model` are tested
//! against it, and so is every end-to-end test of the harness. Nothing here mocks a Rust
//! trait; the bytes on the wire are what a provider sends (SSE framing, tool-call argument
//! deltas split across chunks, usage chunks, provider-shaped error bodies).
//!
//! * A script is a FIFO of [`ScriptStep`]s (serde-serialisable, so a JSON file can hold
//!   one); when it is empty, an optional [`Responder`] answers (a closure
//!   `Fn(&RecordedRequest) -> ScriptStep`), which lets tests drive long sessions.
//! * Requests with `"stream": true` get SSE; others get one JSON body.
//! * A step can delay the headers ([`ScriptStep::with_delay`]) or each chunk
//!   ([`ScriptStep::with_chunk_delay`]), fail with any status, body and headers, and carry
//!   fixed usage figures (otherwise usage is estimated as bytes / 4), and break a stream
//!   part-way ([`ScriptStep::cut_after`], [`ScriptStep::error_after`]).
//! * When no step and no responder is left, the server answers 400
//!   `script exhausted at request N`, so a test that makes too many requests fails loudly.
//!
//! The binary `hame-scripted-server [SCRIPT.json] [PORT]` serves a script file (without
//! one: the looping [`demo_reply`] script) and prints `listening on http://127.0.0.1:PORT`
//! and the `export OPENAI_BASE_URL=…/v1 OPENAI_API_KEY=scripted` line to paste. In a
//! script file, tool-call `arguments` may be a JSON object or its JSON text.
//!
//! | feature | what it adds |
//! |---|---|
//! | (none) | everything |
//!
//! ```
//! use hame_test_support::{ScriptStep, ScriptedServer};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = ScriptedServer::start().await?;
//! server.push(ScriptStep::text("hello"));
//! server.set_responder(|_req: &hame_test_support::RecordedRequest| ScriptStep::text("again"));
//! // point an OpenAI-style client at server.base_url(), an Anthropic client at server.url()
//! assert!(server.base_url().starts_with("http://127.0.0.1:"));
//! assert_eq!(server.requests().len(), 0);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod demo;
mod script;
mod server;
mod wire;

pub use demo::demo_reply;
pub use script::{
    Reply, Script, ScriptReasoning, ScriptStep, ScriptStop, ScriptToolCall, ScriptUsage,
    StreamFault,
};
pub use server::{Error, RecordedRequest, Responder, ScriptedServer};

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every file under `dir` (recursively) for which `keep` is true, in no particular order;
/// unreadable folders are skipped. For tests that look for the files a run left.
pub fn files_where(
    dir: &std::path::Path,
    keep: &dyn Fn(&std::path::Path) -> bool,
) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(files_where(&path, keep));
        } else if keep(&path) {
            out.push(path);
        }
    }
    out
}
