//! The context manifest (issue #33, `docs/context-manifest.md`): for every model request,
//! each section of what the model saw — the parts of the system prompt, each kept range of
//! messages, the compaction summary, each tool schema — with its source id, content hash,
//! tokens and the transform applied (`verbatim | truncated | summarised | offloaded |
//! omitted`, with why). No copy of the text.
//!
//! [`manifest_of`] is a plain function over the request; the `context-manifest` layer
//! (innermost: it sees the request as sent) emits it as an event, appends it to
//! `<session>.context.jsonl` after the response (with the provider's prompt tokens) and
//! puts its [`compact`] form (at most [`MAX_SPAN_MANIFEST`] bytes) in the
//! `hame.context.manifest` attribute of the request's `hame.model` span.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hame_core::{
    CallCtx, CallInput, CallNext, CallOutput, ContentBlock, Layer, Message, ModelNext,
    ModelRequest, ModelResponse, Role,
};
use hame_fs::AppendOptions;
use hame_memory::TokenCounter;
use hame_session::CONTEXT_SUFFIX;
use hame_tools::Workspace;
use serde::{Deserialize, Serialize};
use sha2::Digest;

/// Event kind (`AgentEvent::Custom`) of a manifest.
pub const MANIFEST_EVENT: &str = "context_manifest";

/// What was done to a section's source on its way into the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transform {
    /// As the source has it.
    Verbatim,
    /// Cut to a budget.
    Truncated,
    /// Replaced by a summary (compaction).
    Summarised,
    /// Moved to a file; the request has a pointer.
    Offloaded,
    /// Left out.
    Omitted,
}

/// One section of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Section {
    /// The source: `system:builder`, `system:workspace`, `system:agents_md`,
    /// `system:knowledge`, `system:context:<path>`, `system:available_skills`,
    /// `system:memory_md`, `system:session`, `system:task`, `system:todo_list`, …;
    /// `messages:<from>..<to>` (indices of the request's messages, end exclusive),
    /// `summary:<from>..<to>` (the log's sequence numbers it replaced), `tool:<name>`.
    pub source: String,
    /// First 16 hex digits of the SHA-256 of the section's text.
    pub hash: String,
    /// Tokens: the counter's, scaled so that the sections add up to the provider's prompt
    /// tokens when the provider reported them (see [`Section::counted`]).
    pub tokens: u64,
    /// Tokens as the agent's counter counts the section.
    pub counted: u64,
    /// The transform.
    pub transform: Transform,
    /// Why, when not `verbatim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The manifest of one model request (one line of `<session>.context.jsonl`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The call (`hame.call_id`).
    pub call_id: String,
    /// The step of the call (1-based).
    pub step: usize,
    /// When the request was sent.
    pub at: DateTime<Utc>,
    /// The sections, in request order (system prompt, messages, tools).
    pub sections: Vec<Section>,
    /// Sum of the sections' tokens.
    pub tokens: u64,
    /// Sum of the sections' counted tokens (the agent's counter).
    pub counted: u64,
    /// The prompt tokens the provider reported for the request, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_prompt_tokens: Option<u64>,
}

fn short_hash(text: &[u8]) -> String {
    sha2::Sha256::digest(text)
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Most texts a [`SectionMemo`] keeps (4096); it starts again empty when full.
pub const SECTION_MEMO: usize = 4096;

/// The hash and count of texts measured before, keyed by their length and a fast 64-bit
/// hash: a step's request repeats the previous one's system prompt, tool schemas and
/// messages, so each is hashed (SHA-256) and counted once, not once per step (the count is
/// the expensive part with tiktoken). One per `context-manifest` layer.
///
/// Messages are also recognised without serialising them: a step's request holds the
/// same shared blocks as the previous step's (hame-core's `Blocks::share_handle`), so
/// a message seen before is looked up by its blocks' identity, role and usage; a tool
/// schema likewise by its shared `parameters`, name and description.
#[derive(Debug, Default)]
pub struct SectionMemo {
    texts: std::sync::Mutex<std::collections::HashMap<(usize, u64), (String, u64)>>,
    messages: ByIdentity<Vec<hame_core::ContentBlock>, (hame_core::Role, Option<hame_core::Usage>)>,
    tools: ByIdentity<serde_json::Value, (String, String)>,
}

/// Results kept by the identity of a shared value (its `Arc`'s address, held by a weak
/// handle so the address cannot be reused while the entry lives) and the rest of what the
/// measured JSON holds (`K`, compared by equality).
#[derive(Debug)]
struct ByIdentity<T, K>(std::sync::Mutex<std::collections::HashMap<usize, Kept<T, K>>>);

/// An entry of [`ByIdentity`]: the value's weak handle, the rest of the key, the result.
type Kept<T, K> = (std::sync::Weak<T>, K, (String, u64));

impl<T, K> Default for ByIdentity<T, K> {
    fn default() -> Self {
        Self(std::sync::Mutex::default())
    }
}

impl<T, K: PartialEq> ByIdentity<T, K> {
    /// The result kept for `handle` and `rest`, or `measure()`'s, then kept.
    fn get_or(
        &self,
        handle: std::sync::Weak<T>,
        rest: K,
        measure: impl FnOnce() -> (String, u64),
    ) -> (String, u64) {
        let key = handle.as_ptr() as usize;
        let lock = || {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some((h, k, v)) = lock().get(&key)
            && h.ptr_eq(&handle)
            && h.strong_count() > 0
            && *k == rest
        {
            return v.clone();
        }
        let measured = measure();
        let mut memo = lock();
        if memo.len() >= SECTION_MEMO {
            memo.clear();
        }
        memo.insert(key, (handle, rest, measured.clone()));
        measured
    }
}

impl SectionMemo {
    /// The hash and count of `msg`'s JSON ([`measured_json`]: an image as its hash and
    /// fixed estimate), measured once per shared message.
    fn measure_message(&self, msg: &Message, counter: &dyn TokenCounter) -> (String, u64) {
        self.messages
            .get_or(msg.content.share_handle(), (msg.role, msg.usage), || {
                let (json, images) = measured_json(msg);
                let (hash, counted) = self.measure(&json, counter);
                (hash, counted + images)
            })
    }

    /// The hash and count of a tool schema's JSON, measured once per shared schema (the
    /// specs of every step share their `parameters`).
    fn measure_tool(
        &self,
        spec: &hame_core::ToolSpec,
        counter: &dyn TokenCounter,
    ) -> (String, u64) {
        let rest = (spec.name.clone(), spec.description.clone());
        self.tools
            .get_or(std::sync::Arc::downgrade(&spec.parameters), rest, || {
                let json = serde_json::to_string(spec).unwrap_or_default();
                self.measure(&json, counter)
            })
    }

    fn measure(&self, text: &str, counter: &dyn TokenCounter) -> (String, u64) {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        let key = (text.len(), h.finish());
        let lock = || {
            self.texts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some(v) = lock().get(&key) {
            return v.clone();
        }
        let v = (short_hash(text.as_bytes()), counter.count(text));
        let mut memo = lock();
        if memo.len() >= SECTION_MEMO {
            memo.clear();
        }
        memo.insert(key, v.clone());
        v
    }
}

/// What a section needs besides its text: the counter and the memo.
struct Measure<'a> {
    counter: &'a dyn TokenCounter,
    memo: &'a SectionMemo,
}

impl Measure<'_> {
    fn section(
        &self,
        source: String,
        text: &str,
        transform: Transform,
        why: Option<String>,
    ) -> Section {
        let (hash, counted) = self.memo.measure(text, self.counter);
        Section {
            source,
            hash,
            tokens: counted,
            counted,
            transform,
            why,
        }
    }
}

/// The name of a top-level part of the system prompt that starts at `line`: a tag block
/// (`<agents_md>`, `<context path="x">`) or a `# Heading`.
fn part_start(line: &str) -> Option<(String, Option<String>)> {
    if let Some(rest) = line.strip_prefix('<') {
        let rest = rest.strip_suffix('>')?;
        let (tag, attrs) = rest.split_once(' ').unwrap_or((rest, ""));
        if tag.is_empty() || !tag.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            return None;
        }
        let path = attrs
            .strip_prefix("path=\"")
            .and_then(|p| p.strip_suffix('"'))
            .map(|p| format!(":{p}"))
            .unwrap_or_default();
        return Some((format!("{tag}{path}"), Some(format!("</{tag}>"))));
    }
    let heading = line.strip_prefix("# ")?;
    let slug: String = heading
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    (!slug.is_empty()).then_some((slug, None))
}

/// The system prompt cut into its parts (name, text), in order. Text before the first part
/// is `builder` (the builder's prompt); a tag block runs to its closing tag (headings inside
/// it, e.g. AGENTS.md's own, stay in it).
pub fn system_parts(system: &str) -> Vec<(String, &str)> {
    let mut parts = Vec::new();
    let mut name = "builder".to_owned();
    let mut start = 0;
    let mut pos = 0;
    let mut closing: Option<String> = None;
    for line in system.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        match &closing {
            Some(end) => {
                if bare == end {
                    closing = None;
                }
            }
            None => {
                if let Some((next, end)) = part_start(bare) {
                    if pos > start && !system[start..pos].trim().is_empty() {
                        parts.push((name.clone(), &system[start..pos]));
                    }
                    name = next;
                    start = pos;
                    closing = end;
                }
            }
        }
        pos += line.len();
    }
    if start < system.len() && !system[start..].trim().is_empty() {
        parts.push((name, &system[start..]));
    }
    parts
}

/// How a message entered the request: a compaction summary, an offloaded tool result, or
/// verbatim.
fn message_kind(m: &Message) -> (Transform, Option<String>) {
    if let Some(span) = hame_memory::compaction::summary_span(m) {
        return (
            Transform::Summarised,
            Some(format!(
                "compaction replaced log records #{}..#{} with this summary",
                span.from, span.to
            )),
        );
    }
    if m.role == Role::Tool
        && m.tool_results_iter().any(|r| {
            r.content
                .contains(hame_memory::offload::DEFAULT_OFFLOAD_DIR)
                && r.content.contains("saved to")
        })
    {
        return (
            Transform::Offloaded,
            Some(
                "a large tool result was saved to a file; the request has its head and the path"
                    .into(),
            ),
        );
    }
    (Transform::Verbatim, None)
}

/// The JSON a message is measured by, and the tokens its images add: an image's data
/// stands as the SHA-256 of its base64 (which still tells two images apart), counted at
/// [`TOKENS_PER_IMAGE`](hame_memory::tokens::TOKENS_PER_IMAGE) — base64 counted as text
/// would make a 1 MiB image some 700,000 tokens, and take the counter a second.
fn measured_json(msg: &Message) -> (String, u64) {
    let mut images = 0;
    let json = if msg.images().next().is_none() {
        serde_json::to_string(msg)
    } else {
        let mut m = msg.clone();
        for block in &mut m.content {
            if let ContentBlock::Image(i) = block {
                i.data = format!("sha256:{}", short_hash(i.data.as_bytes()));
                images += hame_memory::tokens::TOKENS_PER_IMAGE;
            }
        }
        serde_json::to_string(&m)
    };
    (json.unwrap_or_default(), images)
}

/// The manifest's sections of `request`, counted with `counter`. Messages are counted as
/// their JSON (what a provider is sent is close to it); consecutive verbatim messages make
/// one range, whose count is the sum of its messages' and whose hash is the SHA-256 of its
/// messages' hashes.
pub fn manifest_of(request: &ModelRequest, counter: &dyn TokenCounter) -> Vec<Section> {
    manifest_with(request, counter, &SectionMemo::default())
}

/// [`manifest_of`] with a memo of the texts measured for earlier requests.
pub fn manifest_with(
    request: &ModelRequest,
    counter: &dyn TokenCounter,
    memo: &SectionMemo,
) -> Vec<Section> {
    let m = Measure { counter, memo };
    let mut out = Vec::new();
    for (name, text) in system_parts(&request.system) {
        let (transform, why) =
            if name == "memory_md" && text.contains("were left out to fit the budget") {
                (
                    Transform::Truncated,
                    Some("MEMORY.md cut to its token budget, newest lines kept".to_owned()),
                )
            } else {
                (Transform::Verbatim, None)
            };
        out.push(m.section(format!("system:{name}"), text, transform, why));
    }
    // A range of verbatim messages: where it starts, its messages' hashes, its count.
    let mut run: Option<(usize, String, u64)> = None;
    let flush = |run: &mut Option<(usize, String, u64)>, end: usize, out: &mut Vec<Section>| {
        if let Some((from, hashes, counted)) = run.take() {
            out.push(Section {
                source: format!("messages:{from}..{end}"),
                hash: short_hash(hashes.as_bytes()),
                tokens: counted,
                counted,
                transform: Transform::Verbatim,
                why: None,
            });
        }
    };
    for (i, msg) in request.messages.iter().enumerate() {
        match message_kind(msg) {
            (Transform::Verbatim, _) => {
                let (hash, counted) = memo.measure_message(msg, counter);
                match &mut run {
                    Some((_, hashes, sum)) => {
                        hashes.push_str(&hash);
                        *sum += counted;
                    }
                    None => run = Some((i, hash, counted)),
                }
            }
            (transform, why) => {
                flush(&mut run, i, &mut out);
                let source = match hame_memory::compaction::summary_span(msg) {
                    Some(span) => format!("summary:{}..{}", span.from, span.to),
                    None => format!("messages:{i}..{}", i + 1),
                };
                let (json, images) = measured_json(msg);
                let mut section = m.section(source, &json, transform, why);
                section.tokens += images;
                section.counted += images;
                out.push(section);
            }
        }
    }
    flush(&mut run, request.messages.len(), &mut out);
    for spec in &request.tools {
        let (hash, counted) = memo.measure_tool(spec, counter);
        out.push(Section {
            source: format!("tool:{}", spec.name),
            hash,
            tokens: counted,
            counted,
            transform: Transform::Verbatim,
            why: None,
        });
    }
    out
}

/// Spreads the provider's `total` over the sections in proportion to their counted tokens
/// (largest remainder, so they add up to `total` exactly): the provider's count is the
/// truth for the whole request, the counter's is the best guess of the shares.
pub fn attribute(sections: &mut [Section], total: u64) {
    let counted: u64 = sections.iter().map(|s| s.counted).sum();
    if counted == 0 || sections.is_empty() {
        return;
    }
    let mut rest: Vec<(usize, u128)> = Vec::with_capacity(sections.len());
    let mut given = 0u64;
    for (i, s) in sections.iter_mut().enumerate() {
        let exact = u128::from(s.counted) * u128::from(total);
        let share = exact / u128::from(counted);
        s.tokens = u64::try_from(share).unwrap_or(u64::MAX);
        given = given.saturating_add(s.tokens);
        rest.push((i, exact % u128::from(counted)));
    }
    rest.sort_by_key(|r| std::cmp::Reverse(r.1));
    for (i, _) in rest
        .iter()
        .take(usize::try_from(total.saturating_sub(given)).unwrap_or(0))
    {
        sections[*i].tokens += 1;
    }
}

/// Largest compact manifest put on a model request's span (`hame.context.manifest`), in
/// bytes (4 KiB): a request with many tool schemas or message ranges keeps its first
/// sections and says how many were left out.
pub const MAX_SPAN_MANIFEST: usize = 4096;

fn transform_name(t: Transform) -> &'static str {
    match t {
        Transform::Verbatim => "verbatim",
        Transform::Truncated => "truncated",
        Transform::Summarised => "summarised",
        Transform::Offloaded => "offloaded",
        Transform::Omitted => "omitted",
    }
}

/// The compact form of a request's sections, at most `max` bytes: a first line
/// `sections=N counted=T`, then one line per section `counted transform hash source`, in
/// request order; when the next line would not fit, a last line `+K more sections`.
pub fn compact(sections: &[Section], max: usize) -> String {
    use std::fmt::Write as _;
    let counted: u64 = sections.iter().map(|s| s.counted).sum();
    let mut out = format!("sections={} counted={counted}", sections.len());
    // Room kept for the last line.
    let tail = " \n+99999 more sections".len();
    for (i, s) in sections.iter().enumerate() {
        let line = format!(
            "\n{} {} {} {}",
            s.counted,
            transform_name(s.transform),
            s.hash,
            s.source
        );
        let last = i + 1 == sections.len();
        if out.len() + line.len() + if last { 0 } else { tail } > max {
            let _ = write!(out, "\n+{} more sections", sections.len() - i);
            break;
        }
        out.push_str(&line);
    }
    if out.len() > max {
        let mut end = max;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

/// The `context-manifest` layer. See the [module docs](self).
#[derive(Debug)]
pub struct ManifestLayer {
    recorder: Arc<crate::recorder::SessionRecorder>,
    counter: Arc<dyn TokenCounter>,
    memo: SectionMemo,
}

impl ManifestLayer {
    pub(crate) fn new(
        recorder: Arc<crate::recorder::SessionRecorder>,
        counter: Arc<dyn TokenCounter>,
    ) -> Self {
        Self {
            recorder,
            counter,
            memo: SectionMemo::default(),
        }
    }
}

/// The manifests of the running call, written in one append when it ends.
#[derive(Debug, Default)]
struct Pending(std::sync::Mutex<Vec<Manifest>>);

#[async_trait]
impl Layer for ManifestLayer {
    fn name(&self) -> &str {
        "context-manifest"
    }

    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> Result<CallOutput, hame_core::Error> {
        let pending: Arc<Pending> = Arc::default();
        let mut extensions = cx.extensions.clone();
        extensions.insert_arc(pending.clone());
        extensions.insert_arc(Arc::new(hame_core::telemetry::ManifestAttribute::default()));
        let out = next.run_with(cx, &extensions, input).await;
        let manifests = std::mem::take(
            &mut *pending
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if !manifests.is_empty()
            && let Some(ws) = cx.extensions.get::<Workspace>()
        {
            let written = match self.recorder.log_for(cx.runtime, ws) {
                Ok(log) => log
                    // Whole lines, not flushed: a diagnostic record, not the conversation's;
                    // a process crash loses nothing, a machine crash can lose the manifests
                    // of the calls since the file was last flushed (docs/context-manifest.md).
                    // A flush per call was most of the records' cost on disk (issue #33).
                    .append_side(
                        &cx.runtime.session_id,
                        CONTEXT_SUFFIX,
                        &manifests,
                        AppendOptions::atomic(),
                    )
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = written {
                tracing::warn!(error = %e, "the context manifests of the call could not be written");
            }
        }
        out
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        request: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse, hame_core::Error> {
        let mut sections = manifest_with(&request, self.counter.as_ref(), &self.memo);
        let counted: u64 = sections.iter().map(|s| s.counted).sum();
        let at = Utc::now();
        // The compact form only when a subscriber records the model span.
        if let Some(a) = cx
            .extensions
            .get::<hame_core::telemetry::ManifestAttribute>()
            .filter(|_| tracing::enabled!(target: "hame_core::agent", tracing::Level::INFO))
        {
            a.set(compact(&sections, MAX_SPAN_MANIFEST));
        }
        let response = next.run(cx, request).await?;
        let provider = response.usage.map(|u| u.input_tokens).filter(|t| *t > 0);
        if let Some(p) = provider {
            attribute(&mut sections, p);
        }
        let tokens = sections.iter().map(|s| s.tokens).sum();
        let manifest = Manifest {
            call_id: cx.runtime.call_id().unwrap_or("unknown").to_owned(),
            step: cx.iteration,
            at,
            sections,
            tokens,
            counted,
            provider_prompt_tokens: provider,
        };
        tracing::debug!(
            sections = manifest.sections.len(),
            tokens,
            "context manifest"
        );
        if cx.events.is_active() {
            cx.events.emit(hame_core::AgentEvent::Custom {
                kind: MANIFEST_EVENT.into(),
                data: serde_json::to_value(&manifest).unwrap_or_default(),
            });
        }
        if let Some(p) = cx.extensions.get::<Pending>() {
            p.0.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(manifest);
        }
        Ok(response)
    }
}

impl crate::HarnessAgent {
    /// The context manifests of the caller's session `session_id`, one per model request,
    /// oldest first.
    pub async fn session_manifests(
        &self,
        ctx: &hame_core::RuntimeContext,
        session_id: &str,
    ) -> crate::Result<Vec<Manifest>> {
        crate::validate_id("session id", session_id)?;
        let ws = self.workspace_for(ctx)?;
        hame_session::SessionLog::new(ws.records().clone(), self.name())
            .map_err(|e| crate::Error::storage("cannot open the session log", e))?
            .read_side(session_id, CONTEXT_SUFFIX)
            .await
            .map_err(|e| crate::Error::storage("cannot read the context manifests", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sections(n: usize) -> Vec<Section> {
        (0..n)
            .map(|i| Section {
                source: format!("tool:some_tool_with_a_long_name_{i}"),
                hash: "0123456789abcdef".into(),
                tokens: 40,
                counted: 40,
                transform: if i == 1 {
                    Transform::Summarised
                } else {
                    Transform::Verbatim
                },
                why: None,
            })
            .collect()
    }

    /// An image counts its fixed estimate, not its base64 as text; two images of the same
    /// size still hash apart.
    #[test]
    fn an_image_counts_its_estimate_and_hashes_its_bytes() {
        let request = |data: &str| ModelRequest {
            system: String::new(),
            messages: vec![Message {
                role: Role::User,
                content: vec![ContentBlock::Image(hame_core::ImageBlock {
                    media_type: "image/png".into(),
                    data: data.repeat(100_000),
                })]
                .into(),
                usage: None,
            }],
            tools: Vec::new(),
            params: hame_core::ModelParams::default(),
            cache_key: None,
        };
        let counter = hame_memory::EstimateCounter;
        let a = manifest_of(&request("iVBORw0KGgo="), &counter);
        let b = manifest_of(&request("iVBORw0KGgA="), &counter);
        assert_eq!(a.len(), 1);
        assert!(
            a[0].counted > hame_memory::tokens::TOKENS_PER_IMAGE
                && a[0].counted < hame_memory::tokens::TOKENS_PER_IMAGE + 100,
            "{}",
            a[0].counted
        );
        assert_eq!(a[0].counted, b[0].counted);
        assert_ne!(a[0].hash, b[0].hash);
    }

    #[test]
    fn the_memo_knows_a_shared_message_and_not_a_changed_one() {
        let counter = hame_memory::EstimateCounter;
        let memo = SectionMemo::default();
        let a = Message::user("the same words");
        let first = memo.measure_message(&a, &counter);
        let json = serde_json::to_string(&a).unwrap_or_default();
        assert_eq!(first, (short_hash(json.as_bytes()), counter.count(&json)));
        // A clone shares the blocks: the memo's answer, without serialising.
        assert_eq!(memo.measure_message(&a.clone(), &counter), first);
        // Changed blocks are a new allocation, measured afresh.
        let mut b = a.clone();
        b.content.push(hame_core::ContentBlock::Text {
            text: "more".into(),
        });
        let json_b = serde_json::to_string(&b).unwrap_or_default();
        assert_eq!(
            memo.measure_message(&b, &counter),
            (short_hash(json_b.as_bytes()), counter.count(&json_b))
        );
        // The same blocks with another usage serialise differently: measured afresh.
        let mut c = a.clone();
        c.usage = Some(hame_core::Usage::default());
        let json_c = serde_json::to_string(&c).unwrap_or_default();
        assert_eq!(
            memo.measure_message(&c, &counter).0,
            short_hash(json_c.as_bytes())
        );
    }

    #[test]
    fn a_tool_schema_is_measured_once_per_shared_schema() {
        let counter = hame_memory::EstimateCounter;
        let memo = SectionMemo::default();
        let spec = hame_core::ToolSpec {
            name: "t".into(),
            description: "does".into(),
            parameters: Arc::new(serde_json::json!({"type": "object"})),
        };
        let json = serde_json::to_string(&spec).unwrap_or_default();
        let want = (short_hash(json.as_bytes()), counter.count(&json));
        assert_eq!(memo.measure_tool(&spec, &counter), want);
        assert_eq!(memo.measure_tool(&spec.clone(), &counter), want);
        // Another description over the same schema is another text.
        let mut other = spec.clone();
        other.description = "does more".into();
        let json = serde_json::to_string(&other).unwrap_or_default();
        assert_eq!(
            memo.measure_tool(&other, &counter).0,
            short_hash(json.as_bytes())
        );
    }

    #[test]
    fn the_compact_form_has_a_line_per_section() {
        assert_eq!(
            compact(&sections(2), MAX_SPAN_MANIFEST),
            "sections=2 counted=80\n40 verbatim 0123456789abcdef tool:some_tool_with_a_long_name_0\n40 summarised 0123456789abcdef tool:some_tool_with_a_long_name_1"
        );
        assert_eq!(compact(&[], MAX_SPAN_MANIFEST), "sections=0 counted=0");
    }

    #[test]
    fn the_compact_form_stays_within_its_bound_and_says_what_it_left_out() {
        for n in [60, 61, 62, 63, 64, 65, 500, 100_000] {
            let text = compact(&sections(n), MAX_SPAN_MANIFEST);
            assert!(text.len() <= MAX_SPAN_MANIFEST, "{n}: {}", text.len());
            let lines: Vec<&str> = text.lines().collect();
            match lines.last().and_then(|l| l.strip_prefix('+')) {
                Some(rest) => {
                    assert_eq!(rest, format!("{} more sections", n - (lines.len() - 2)));
                }
                None => assert_eq!(lines.len() - 1, n, "all kept"),
            }
            // 60 lines of ~64 bytes fit in 4 KiB, 100 do not; in between, the bound
            // decides (the match above checks either outcome).
            if n <= 60 {
                assert!(!text.ends_with("more sections"), "{n}: all fit");
            }
            if n >= 100 {
                assert!(text.ends_with("more sections"), "{n}: cut");
            }
        }
        // A tiny bound still holds.
        assert!(compact(&sections(10), 10).len() <= 10);
    }
}
