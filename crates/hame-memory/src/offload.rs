//! Offloading large tool results: a result over the threshold is written to
//! `large_tool_results/<call_id>-<content hash>.txt` through a [`ResultSink`] and replaced
//! in the context by a head-and-tail preview, its size, the path, and how to page through
//! it with `read_file`.
//!
//! The file name holds the first [`CONTENT_HASH_HEX`] hex digits of the SHA-256 of the
//! result as well as the call id: several servers (vLLM, llama.cpp, Ollama) number calls
//! `call_0`, `call_1`… again in every response, so a name from the call id alone would
//! overwrite an earlier result that an earlier preview still points at. The same result
//! under the same call id is the same file.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use hame_core::{ToolCall, ToolResult};
use sha2::{Digest, Sha256};

use crate::compaction::clip_middle;
use crate::error::Result;
use crate::index::content_hash;

/// Default: results longer than this many characters are offloaded.
pub const DEFAULT_OFFLOAD_THRESHOLD_CHARS: usize = 80_000;
/// Default cap of the threshold relative to the model window: never more than this
/// fraction of `window × 4` characters (about a quarter of the window in tokens).
pub const DEFAULT_WINDOW_FRACTION: f64 = 0.25;
/// Default characters of the preview's head and of its tail.
pub const DEFAULT_PREVIEW_CHARS: usize = 2_000;
/// Default directory of offloaded results (workspace-relative).
pub const DEFAULT_OFFLOAD_DIR: &str = "large_tool_results";
/// Default lines per page suggested to the model.
pub const DEFAULT_PAGE_LINES: usize = 500;
/// Results smaller than this are never offloaded, whatever the window (characters).
pub const MIN_THRESHOLD_CHARS: usize = 4_000;
/// Hex digits of the content's SHA-256 in an offloaded file's name (48 bits).
pub const CONTENT_HASH_HEX: usize = 12;

/// Where offloaded results are written; the harness implements it over the workspace
/// filesystem of the caller's tenant.
#[async_trait]
pub trait ResultSink: Send + Sync + fmt::Debug + 'static {
    /// Writes `content` to the workspace-relative `path`, replacing any previous file.
    async fn write(&self, path: &str, content: &str) -> Result<()>;
}

#[async_trait]
impl<T: ResultSink + ?Sized> ResultSink for Arc<T> {
    async fn write(&self, path: &str, content: &str) -> Result<()> {
        (**self).write(path, content).await
    }
}

/// Settings of an [`Offloader`].
#[derive(Debug, Clone, PartialEq)]
pub struct OffloadPolicy {
    /// Results longer than this many characters are offloaded. Default
    /// [`DEFAULT_OFFLOAD_THRESHOLD_CHARS`].
    pub threshold_chars: usize,
    /// Cap relative to the window (see [`DEFAULT_WINDOW_FRACTION`]); used when the window
    /// is known.
    pub window_fraction: f64,
    /// Characters of the preview's head. Default [`DEFAULT_PREVIEW_CHARS`].
    pub head_chars: usize,
    /// Characters of the preview's tail. Default [`DEFAULT_PREVIEW_CHARS`].
    pub tail_chars: usize,
    /// Directory of offloaded results. Default [`DEFAULT_OFFLOAD_DIR`].
    pub dir: String,
    /// How the model names workspace paths: this is put before the path in the preview.
    /// Default `/` (the `read_file` tool of `hame-fs` takes paths from the workspace root).
    pub model_path_prefix: String,
    /// Lines per page suggested in the preview. Default [`DEFAULT_PAGE_LINES`].
    pub page_lines: usize,
    /// Tools whose results are never offloaded. Default none.
    pub exclude_tools: Vec<String>,
}

impl Default for OffloadPolicy {
    fn default() -> Self {
        Self {
            threshold_chars: DEFAULT_OFFLOAD_THRESHOLD_CHARS,
            window_fraction: DEFAULT_WINDOW_FRACTION,
            head_chars: DEFAULT_PREVIEW_CHARS,
            tail_chars: DEFAULT_PREVIEW_CHARS,
            dir: DEFAULT_OFFLOAD_DIR.to_owned(),
            model_path_prefix: "/".to_owned(),
            page_lines: DEFAULT_PAGE_LINES,
            exclude_tools: Vec::new(),
        }
    }
}

/// Replaces large tool results by previews. The harness runs it as part of its offload
/// layer, after the session log has recorded the full result.
#[derive(Debug, Clone)]
pub struct Offloader {
    policy: OffloadPolicy,
    sink: Arc<dyn ResultSink>,
    context_window: Option<u64>,
}

/// A call id made safe as a file name: `[A-Za-z0-9_-]`, at most 64 characters; when
/// anything had to change, a short hash of the original keeps names distinct.
pub fn file_stem(call_id: &str) -> String {
    let clean: String = call_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if clean == call_id && !clean.is_empty() {
        return clean;
    }
    let hash = hex::encode(&Sha256::digest(call_id.as_bytes())[..4]);
    if clean.is_empty() {
        format!("call-{hash}")
    } else {
        format!("{clean}-{hash}")
    }
}

fn head(text: &str, n: usize) -> &str {
    text.char_indices().nth(n).map_or(text, |(i, _)| &text[..i])
}

fn tail(text: &str, n: usize) -> &str {
    let count = text.chars().count();
    if count <= n {
        return text;
    }
    text.char_indices()
        .nth(count - n)
        .map_or(text, |(i, _)| &text[i..])
}

impl Offloader {
    /// An offloader writing through `sink`.
    pub fn new(policy: OffloadPolicy, sink: Arc<dyn ResultSink>) -> Self {
        Self {
            policy,
            sink,
            context_window: None,
        }
    }

    /// Caps the threshold relative to this context window (tokens).
    pub fn with_context_window(mut self, tokens: u64) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// The effective threshold in characters.
    pub fn threshold(&self) -> usize {
        let mut t = self.policy.threshold_chars;
        if let Some(w) = self.context_window {
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss
            )]
            let cap = (w as f64 * 4.0 * self.policy.window_fraction) as usize;
            t = t.min(cap);
        }
        t.max(MIN_THRESHOLD_CHARS)
    }

    /// The workspace-relative path a call's result `content` is written to:
    /// `<dir>/<file_stem(call_id)>-<first CONTENT_HASH_HEX hex digits of its SHA-256>.txt`,
    /// one path segment below `dir` whatever the call id.
    pub fn path_for(&self, call_id: &str, content: &str) -> String {
        format!(
            "{}/{}-{}.txt",
            self.policy.dir.trim_end_matches('/'),
            file_stem(call_id),
            &content_hash(content)[..CONTENT_HASH_HEX]
        )
    }

    /// The text that replaces a result saved at `path` (pure).
    pub fn preview(&self, path: &str, content: &str) -> String {
        let chars = content.chars().count();
        let lines = content.lines().count();
        let shown = format!("{}{path}", self.policy.model_path_prefix);
        let page = self.policy.page_lines;
        format!(
            "[This tool result was too large for the context: {chars} characters, {lines} lines. \
             The full text was saved to {shown}. Read it in pages with \
             read_file(file_path=\"{shown}\", offset=1, limit={page}), then offset={next} and so on \
             (offset is the 1-based first line), or search it with grep.]\n\
             --- first {h} characters ---\n{}\n--- … ---\n--- last {t} characters ---\n{}",
            head(content, self.policy.head_chars),
            tail(content, self.policy.tail_chars),
            next = page + 1,
            h = self.policy.head_chars.min(chars),
            t = self.policy.tail_chars.min(chars),
        )
    }

    /// Offloads `result` if it is over the threshold: writes it and replaces its content
    /// with the preview. Returns whether it did. When the write fails the result is still
    /// cut to a head and tail (with a note that the full text could not be saved), so one
    /// oversized result can never flood the context.
    pub async fn offload(&self, call: &ToolCall, result: &mut ToolResult) -> bool {
        if self.policy.exclude_tools.iter().any(|t| t == &call.name) {
            return false;
        }
        let threshold = self.threshold();
        if result.content.len() <= threshold || result.content.chars().count() <= threshold {
            return false;
        }
        let path = self.path_for(&result.id, &result.content);
        match self.sink.write(&path, &result.content).await {
            Ok(()) => {
                tracing::debug!(call_id = %result.id, %path, chars = result.content.len(), "tool result offloaded");
                result.content = self.preview(&path, &result.content);
            }
            Err(e) => {
                tracing::warn!(call_id = %result.id, %path, error = %e, "could not save a large tool result; cutting it");
                let keep = self.policy.head_chars + self.policy.tail_chars;
                result.content = format!(
                    "[This tool result was too large for the context ({} characters) and could \
                     not be saved ({e}); only its beginning and end are shown.]\n{}",
                    result.content.chars().count(),
                    clip_middle(&result.content, keep)
                );
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::error::Error;
    use pretty_assertions::assert_eq;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    #[derive(Debug, Default)]
    struct MemSink {
        files: Mutex<BTreeMap<String, String>>,
        fail: bool,
    }

    #[async_trait]
    impl ResultSink for MemSink {
        async fn write(&self, path: &str, content: &str) -> Result<()> {
            if self.fail {
                return Err(Error::files(path, "disk full"));
            }
            self.files
                .lock()
                .unwrap()
                .insert(path.to_owned(), content.to_owned());
            Ok(())
        }
    }

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "shell".into(),
            arguments: "{}".into(),
        }
    }

    fn result(id: &str, content: String) -> ToolResult {
        ToolResult {
            id: id.into(),
            content,
            is_error: false,
            code: None,
        }
    }

    /// The workspace path a preview points at (`read_file(file_path="/<path>", …)`).
    fn pointed_at(preview: &str) -> &str {
        let start = preview.find("file_path=\"/").unwrap() + "file_path=\"/".len();
        let len = preview[start..].find('"').unwrap();
        &preview[start..start + len]
    }

    #[tokio::test]
    async fn large_results_are_saved_and_previewed() {
        let sink = Arc::new(MemSink::default());
        let off = Offloader::new(OffloadPolicy::default(), sink.clone());
        let body: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        let path = format!(
            "large_tool_results/call_1-{}.txt",
            &crate::content_hash(&body)[..CONTENT_HASH_HEX]
        );
        assert_eq!(off.path_for("call_1", &body), path);
        let mut r = result("call_1", body.clone());
        assert!(off.offload(&call("call_1"), &mut r).await);
        assert_eq!(
            *sink.files.lock().unwrap(),
            BTreeMap::from([(path.clone(), body.clone())])
        );
        assert_eq!(pointed_at(&r.content), path);
        assert!(r.content.contains(&format!("saved to /{path}.")));
        assert!(
            r.content
                .contains(&format!("{} characters, 20000 lines", body.len()))
        );
        assert!(r.content.contains(&format!(
            "read_file(file_path=\"/{path}\", offset=1, limit=500)"
        )));
        assert!(r.content.contains("line 0\nline 1\n"));
        assert!(r.content.contains("line 19999\n"));
        assert!(r.content.chars().count() < 5_000);
    }

    #[tokio::test]
    async fn reused_call_ids_never_overwrite_earlier_results() {
        let sink = Arc::new(MemSink::default());
        let off = Offloader::new(OffloadPolicy::default(), sink.clone());
        // vLLM, llama.cpp and Ollama number the calls of every response from `call_0`.
        let first = "first result\n".repeat(10_000);
        let second = "second result\n".repeat(10_000);
        let mut a = result("call_0", first.clone());
        let mut b = result("call_0", second.clone());
        assert!(off.offload(&call("call_0"), &mut a).await);
        assert!(off.offload(&call("call_0"), &mut b).await);
        let files = sink.files.lock().unwrap().clone();
        assert_eq!(files.len(), 2, "{:?}", files.keys());
        assert_ne!(pointed_at(&a.content), pointed_at(&b.content));
        assert_eq!(files.get(pointed_at(&a.content)), Some(&first));
        assert_eq!(files.get(pointed_at(&b.content)), Some(&second));
        assert!(pointed_at(&a.content).starts_with("large_tool_results/call_0-"));
        // The same result under the same id is the same file.
        let mut again = result("call_0", first.clone());
        assert!(off.offload(&call("call_0"), &mut again).await);
        assert_eq!(again.content, a.content);
        assert_eq!(sink.files.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn small_and_excluded_results_stay() {
        let sink = Arc::new(MemSink::default());
        let off = Offloader::new(
            OffloadPolicy {
                exclude_tools: vec!["shell".into()],
                ..OffloadPolicy::default()
            },
            sink.clone(),
        );
        let mut big = result("a", "x".repeat(100_000));
        assert!(!off.offload(&call("a"), &mut big).await);
        let off = Offloader::new(OffloadPolicy::default(), sink.clone());
        let mut small = result("b", "y".repeat(80_000));
        assert!(!off.offload(&call("b"), &mut small).await);
        assert!(sink.files.lock().unwrap().is_empty());
    }

    #[test]
    fn threshold_is_capped_by_the_window() {
        let sink: Arc<dyn ResultSink> = Arc::new(MemSink::default());
        let off = Offloader::new(OffloadPolicy::default(), Arc::clone(&sink));
        assert_eq!(off.threshold(), 80_000);
        assert_eq!(off.clone().with_context_window(200_000).threshold(), 80_000);
        assert_eq!(off.clone().with_context_window(32_000).threshold(), 32_000);
        assert_eq!(
            off.with_context_window(100).threshold(),
            MIN_THRESHOLD_CHARS
        );
    }

    #[tokio::test]
    async fn failed_write_still_cuts_the_result() {
        let off = Offloader::new(
            OffloadPolicy::default(),
            Arc::new(MemSink {
                fail: true,
                ..MemSink::default()
            }),
        );
        let mut r = result("c", "z".repeat(200_000));
        assert!(off.offload(&call("c"), &mut r).await);
        assert!(r.content.contains("could not be saved"));
        assert!(r.content.chars().count() < 5_000);
    }

    #[test]
    fn file_stems_are_safe_and_distinct() {
        assert_eq!(file_stem("call_abc-1"), "call_abc-1");
        let a = file_stem("../etc/passwd");
        assert!(a.starts_with("___etc_passwd-"));
        assert_ne!(file_stem("a/b"), file_stem("a:b"));
        assert!(file_stem("").starts_with("call-"));
        assert!(file_stem(&"x".repeat(300)).len() < 80);
    }

    proptest::proptest! {
        /// Whatever the call id, the result is one file directly in the offload directory,
        /// with a name of `[A-Za-z0-9_-]` and `.txt` (no separator, no `..`, no hidden file).
        #[test]
        fn any_call_id_is_one_safe_path_segment(
            id in "\\PC{0,80}|[./\\\\:\\x00 ]{0,12}",
            content in "\\PC{0,40}",
        ) {
            let off = Offloader::new(OffloadPolicy::default(), Arc::new(MemSink::default()));
            let path = off.path_for(&id, &content);
            let name = path.strip_prefix("large_tool_results/").unwrap();
            let stem = name.strip_suffix(".txt").unwrap();
            proptest::prop_assert!(
                !stem.is_empty() && stem.len() <= 64 + 9 + 1 + CONTENT_HASH_HEX,
                "{path}"
            );
            proptest::prop_assert!(
                stem.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{path}"
            );
            proptest::prop_assert_eq!(path, off.path_for(&id, &content));
        }
    }

    #[test]
    fn preview_of_multibyte_text_cuts_on_characters() {
        let off = Offloader::new(OffloadPolicy::default(), Arc::new(MemSink::default()));
        let text = "咖啡".repeat(5_000);
        let p = off.preview("large_tool_results/x.txt", &text);
        assert!(p.contains("10000 characters"));
    }
}
