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

/// The manifest of one model request: one line of `<session>.context.jsonl`, where it is
/// kept in a compact form (sections equal to the step before's are written as a count;
/// `tokens` are computed again when read) and read back whole by
/// [`HarnessAgent::session_manifests`](crate::HarnessAgent::session_manifests).
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
    hex::encode(&sha2::Sha256::digest(text)[..8])
}

/// Most texts a [`SectionMemo`] keeps (4096); it starts again empty when full.
pub const SECTION_MEMO: usize = 4096;

/// Most system prompts a [`SectionMemo`] keeps whole with their sections (16); the oldest
/// goes first.
pub const SYSTEM_MEMO: usize = 16;

/// A memo's lock: nothing in a memo is left half-updated, so a poisoned one is still
/// consistent.
fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Adds `item` as the newest of `kept`, dropping the oldest beyond `max`.
fn keep_newest<T>(kept: &mut std::collections::VecDeque<T>, item: T, max: usize) {
    if kept.len() >= max {
        kept.pop_front();
    }
    kept.push_back(item);
}

/// The hash and count of texts measured before, keyed by their length and a fast 64-bit
/// hash: a step's request repeats the previous one's system prompt, tool schemas and
/// messages, so each is hashed (SHA-256) and counted once, not once per step (the count is
/// the expensive part with tiktoken). One per `context-manifest` layer.
///
/// Messages are also recognised without serialising them: a step's request holds the
/// same shared blocks as the previous step's (hame-core's `Blocks::share_handle`), so
/// a message seen before is looked up by its blocks' identity, role and usage; a tool
/// schema likewise by its shared `parameters`, name and description. A system prompt equal
/// to one of the last [`SYSTEM_MEMO`] ones gets that one's sections without being cut into
/// parts and hashed again (a comparison of the texts: the prompt is rebuilt as a new string
/// every step, but mostly equal to the last). A range of verbatim messages keeps, per
/// message, its hash state and count so far (the last [`RUN_MEMO`] ranges): the next
/// request's range, the same messages and a few more, adds the new ones only.
#[derive(Debug, Default)]
pub struct SectionMemo {
    texts: std::sync::Mutex<std::collections::HashMap<(usize, u64), (String, u64)>>,
    systems: KeptWhole<String>,
    runs: std::sync::Mutex<std::collections::VecDeque<(usize, Vec<RunStep>)>>,
    tool_lists: KeptWhole<Vec<ToolKey>>,
    messages: ByIdentity<Vec<hame_core::ContentBlock>, (hame_core::Role, Option<hame_core::Usage>)>,
    tools: ByIdentity<serde_json::Value, (String, String)>,
}

/// Most ranges of verbatim messages a [`SectionMemo`] keeps (64, one or two per session
/// in flight); the oldest goes first.
pub const RUN_MEMO: usize = 64;

/// A message of a kept range: its blocks' handle, role and usage (what identifies it, as
/// in [`SectionMemo::measure_message`]), and the range's hash state and count up to it.
#[derive(Debug, Clone)]
struct RunStep {
    handle: std::sync::Weak<Vec<ContentBlock>>,
    role: Role,
    usage: Option<hame_core::Usage>,
    state: sha2::Sha256,
    counted: u64,
}

impl RunStep {
    fn is(&self, m: &Message) -> bool {
        self.role == m.role
            && self.usage == m.usage
            && self.handle.strong_count() > 0
            && self.handle.ptr_eq(&m.content.share_handle())
    }
}

/// Sections kept whole with what they were measured from (a system prompt, a tool list),
/// newest last.
type KeptWhole<K> = std::sync::Mutex<std::collections::VecDeque<(K, Arc<[Section]>)>>;

/// What identifies a tool schema in a kept list: its shared `parameters` (held weakly, so
/// the address is not reused while kept), name and description.
#[derive(Debug)]
struct ToolKey {
    parameters: std::sync::Weak<serde_json::Value>,
    name: String,
    description: String,
}

impl ToolKey {
    fn is(&self, spec: &hame_core::ToolSpec) -> bool {
        self.parameters.strong_count() > 0
            && std::ptr::eq(self.parameters.as_ptr(), Arc::as_ptr(&spec.parameters))
            && self.name == spec.name
            && self.description == spec.description
    }
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

impl<T, K> ByIdentity<T, K> {
    /// The result kept for `handle` and the rest of the key (`same` says whether a kept
    /// one is equal, `rest` makes it), or `measure()`'s, then kept.
    fn get_or(
        &self,
        handle: std::sync::Weak<T>,
        same: impl FnOnce(&K) -> bool,
        rest: impl FnOnce() -> K,
        measure: impl FnOnce() -> (String, u64),
    ) -> (String, u64) {
        let key = handle.as_ptr() as usize;
        let lock = || locked(&self.0);
        if let Some((h, k, v)) = lock().get(&key)
            && h.ptr_eq(&handle)
            && h.strong_count() > 0
            && same(k)
        {
            return v.clone();
        }
        let measured = measure();
        let mut memo = lock();
        if memo.len() >= SECTION_MEMO {
            memo.clear();
        }
        memo.insert(key, (handle, rest(), measured.clone()));
        measured
    }
}

impl SectionMemo {
    /// The hash and count of `msg`'s JSON ([`measured_json`]: an image as its hash and
    /// fixed estimate), measured once per shared message.
    fn measure_message(&self, msg: &Message, counter: &dyn TokenCounter) -> (String, u64) {
        let rest = (msg.role, msg.usage);
        self.messages.get_or(
            msg.content.share_handle(),
            |k| *k == rest,
            || rest,
            || {
                let (json, images) = measured_json(msg);
                let (hash, counted) = self.measure(&json, counter);
                (hash, counted + images)
            },
        )
    }

    /// The hash and count of a tool schema's JSON, measured once per shared schema (the
    /// specs of every step share their `parameters`).
    fn measure_tool(
        &self,
        spec: &hame_core::ToolSpec,
        counter: &dyn TokenCounter,
    ) -> (String, u64) {
        self.tools.get_or(
            std::sync::Arc::downgrade(&spec.parameters),
            |(name, description)| *name == spec.name && *description == spec.description,
            || (spec.name.clone(), spec.description.clone()),
            || {
                let json = serde_json::to_string(spec).unwrap_or_default();
                self.measure(&json, counter)
            },
        )
    }

    /// The sections of the tool schemas `tools`: those of the same list (the same shared
    /// schemas, names and descriptions) seen before, or measured, then kept (at most
    /// [`SYSTEM_MEMO`] lists).
    fn tool_sections(
        &self,
        tools: &[hame_core::ToolSpec],
        counter: &dyn TokenCounter,
    ) -> Arc<[Section]> {
        let lock = || locked(&self.tool_lists);
        if let Some((_, sections)) = lock().iter().rev().find(|(keys, _)| {
            keys.len() == tools.len() && keys.iter().zip(tools).all(|(k, t)| k.is(t))
        }) {
            return sections.clone();
        }
        let sections: Arc<[Section]> = tools
            .iter()
            .map(|spec| {
                let (hash, counted) = self.measure_tool(spec, counter);
                Section {
                    source: format!("tool:{}", spec.name),
                    hash,
                    tokens: counted,
                    counted,
                    transform: Transform::Verbatim,
                    why: None,
                }
            })
            .collect();
        let keys = tools
            .iter()
            .map(|t| ToolKey {
                parameters: Arc::downgrade(&t.parameters),
                name: t.name.clone(),
                description: t.description.clone(),
            })
            .collect();
        keep_newest(&mut lock(), (keys, sections.clone()), SYSTEM_MEMO);
        sections
    }

    /// The known start of the range of verbatim messages that begins at `messages[from]`:
    /// the steps of the range kept from an earlier request, as far as its messages are
    /// still the request's (a step's request repeats the last one's messages and adds
    /// some). Empty when none is known.
    fn run_from(&self, from: usize, messages: &[Message]) -> Vec<RunStep> {
        let mut runs = locked(&self.runs);
        let Some(at) = runs.iter().rposition(|(start, steps)| {
            *start == from
                && steps
                    .first()
                    .zip(messages.get(from))
                    .is_some_and(|(s, m)| s.is(m))
        }) else {
            return Vec::new();
        };
        let Some((_, mut steps)) = runs.remove(at) else {
            return Vec::new();
        };
        drop(runs);
        let known = steps
            .iter()
            .zip(&messages[from..])
            .take_while(|(s, m)| s.is(m))
            .count();
        steps.truncate(known);
        steps
    }

    /// Keeps the range that begins at `from` for the next request.
    fn keep_run(&self, from: usize, steps: Vec<RunStep>) {
        let mut runs = locked(&self.runs);
        keep_newest(&mut runs, (from, steps), RUN_MEMO);
    }

    /// The sections of `system`: those of an equal prompt measured before, or `measure()`'s,
    /// then kept (at most [`SYSTEM_MEMO`] prompts, the oldest dropped first).
    fn system_sections(
        &self,
        system: &str,
        measure: impl FnOnce() -> Arc<[Section]>,
    ) -> Arc<[Section]> {
        let lock = || locked(&self.systems);
        if let Some((_, sections)) = lock()
            .iter()
            .rev()
            .find(|(text, _)| text.len() == system.len() && text == system)
        {
            return sections.clone();
        }
        let sections = measure();
        keep_newest(
            &mut lock(),
            (system.to_owned(), sections.clone()),
            SYSTEM_MEMO,
        );
        sections
    }

    fn measure(&self, text: &str, counter: &dyn TokenCounter) -> (String, u64) {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        let key = (text.len(), h.finish());
        let lock = || locked(&self.texts);
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
    parts_with(request, counter, memo).to_vec()
}

/// A request's sections in three runs: the system prompt's and the tool schemas' (shared
/// with the earlier requests whose prompt or tools were the same: no copy per step) and
/// the messages'.
#[derive(Debug, Clone)]
struct Parts {
    system: Arc<[Section]>,
    messages: Vec<Section>,
    tools: Arc<[Section]>,
}

impl Parts {
    fn iter(&self) -> impl Iterator<Item = &Section> {
        self.system
            .iter()
            .chain(&self.messages)
            .chain(self.tools.iter())
    }

    fn len(&self) -> usize {
        self.system.len() + self.messages.len() + self.tools.len()
    }

    fn get(&self, i: usize) -> Option<&Section> {
        let (s, m) = (self.system.len(), self.messages.len());
        if i < s {
            self.system.get(i)
        } else if i < s + m {
            self.messages.get(i - s)
        } else {
            self.tools.get(i - s - m)
        }
    }

    fn to_vec(&self) -> Vec<Section> {
        self.iter().cloned().collect()
    }
}

/// [`manifest_with`] as [`Parts`].
fn parts_with(request: &ModelRequest, counter: &dyn TokenCounter, memo: &SectionMemo) -> Parts {
    let m = Measure { counter, memo };
    let system = memo.system_sections(&request.system, || {
        system_parts(&request.system)
            .into_iter()
            .map(|(name, text)| {
                let (transform, why) =
                    if name == "memory_md" && text.contains("were left out to fit the budget") {
                        (
                            Transform::Truncated,
                            Some("MEMORY.md cut to its token budget, newest lines kept".to_owned()),
                        )
                    } else {
                        (Transform::Verbatim, None)
                    };
                m.section(format!("system:{name}"), text, transform, why)
            })
            .collect()
    });
    let mut out = Vec::new();
    let messages = &request.messages;
    let mut i = 0;
    while i < messages.len() {
        let msg = &messages[i];
        // A range of verbatim messages starts here: its known start from an earlier
        // request, then each further message measured and added.
        let mut steps = memo.run_from(i, messages);
        let mut end = i + steps.len();
        while let Some(next) = messages.get(end) {
            if message_kind(next).0 != Transform::Verbatim {
                break;
            }
            let (hash, counted) = memo.measure_message(next, counter);
            let (mut state, sum) = steps.last().map_or_else(
                || (sha2::Sha256::new(), 0),
                |s| (s.state.clone(), s.counted),
            );
            state.update(hash.as_bytes());
            steps.push(RunStep {
                handle: next.content.share_handle(),
                role: next.role,
                usage: next.usage,
                state,
                counted: sum + counted,
            });
            end += 1;
        }
        if let Some(last) = steps.last() {
            out.push(Section {
                source: format!("messages:{i}..{end}"),
                hash: hex::encode(&last.state.clone().finalize()[..8]),
                tokens: last.counted,
                counted: last.counted,
                transform: Transform::Verbatim,
                why: None,
            });
            memo.keep_run(i, steps);
            i = end;
            continue;
        }
        let (transform, why) = message_kind(msg);
        let source = match hame_memory::compaction::summary_span(msg) {
            Some(span) => format!("summary:{}..{}", span.from, span.to),
            None => format!("messages:{i}..{}", i + 1),
        };
        let (json, images) = measured_json(msg);
        let mut section = m.section(source, &json, transform, why);
        section.tokens += images;
        section.counted += images;
        out.push(section);
        i += 1;
    }
    Parts {
        system,
        messages: out,
        tools: memo.tool_sections(&request.tools, counter),
    }
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

/// A run of sections a stored line copies from the line before it (same call, the step
/// named by `after`): `{"same": n}` is the next `n` sections, at the same positions there.
#[derive(Debug, Serialize, Deserialize)]
struct Same {
    same: usize,
}

/// A section as a line stores it: no `tokens` (they are the provider's figure shared out
/// by [`attribute`], computed again when read).
#[derive(Debug, Serialize)]
struct SectionOut<'a> {
    source: &'a str,
    hash: &'a str,
    counted: u64,
    transform: Transform,
    #[serde(skip_serializing_if = "Option::is_none")]
    why: &'a Option<String>,
}

/// A stored section: a run copied from the line before, or one written out.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum StoredOut<'a> {
    Same(Same),
    Section(SectionOut<'a>),
}

/// One line of `<session>.context.jsonl` as written: the compact form of a [`Manifest`].
/// The first manifest of a call's append has every section written out; the next ones
/// write the runs of sections equal to the line before's (same positions) as `{"same": n}`
/// and name that line's step in `after`. A step's request mostly repeats the step before
/// (the system prompt, the tool schemas), so a line is a few sections, not some thirty.
#[derive(Debug, Serialize)]
struct LineOut<'a> {
    call_id: &'a str,
    step: usize,
    at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    after: Option<usize>,
    sections: Vec<StoredOut<'a>>,
    counted: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    provider_prompt_tokens: Option<u64>,
}

/// Whether two sections say the same (their shares of the provider's tokens aside).
fn same_section(a: &Section, b: &Section) -> bool {
    a.counted == b.counted
        && a.transform == b.transform
        && a.hash == b.hash
        && a.source == b.source
        && a.why == b.why
}

/// A request's manifest as the layer keeps it until the call ends.
#[derive(Debug, Clone)]
struct Record {
    call_id: String,
    step: usize,
    at: DateTime<Utc>,
    parts: Parts,
    counted: u64,
    provider_prompt_tokens: Option<u64>,
}

impl Record {
    /// The whole manifest, with the provider's tokens shared out.
    fn manifest(&self) -> Manifest {
        let mut sections = self.parts.to_vec();
        if let Some(p) = self.provider_prompt_tokens {
            attribute(&mut sections, p);
        }
        Manifest {
            call_id: self.call_id.clone(),
            step: self.step,
            at: self.at,
            tokens: sections.iter().map(|s| s.tokens).sum(),
            sections,
            counted: self.counted,
            provider_prompt_tokens: self.provider_prompt_tokens,
        }
    }
}

/// The lines of a call's manifests, in order (see [`LineOut`]).
fn lines_out(records: &[Record]) -> Vec<LineOut<'_>> {
    let mut lines = Vec::with_capacity(records.len());
    let mut before: Option<&Record> = None;
    for m in records {
        let prev = before.filter(|b| b.call_id == m.call_id);
        let mut sections = Vec::new();
        for (i, s) in m.parts.iter().enumerate() {
            if prev
                .and_then(|p| p.parts.get(i))
                .is_some_and(|p| same_section(p, s))
            {
                if let Some(StoredOut::Same(run)) = sections.last_mut() {
                    run.same += 1;
                } else {
                    sections.push(StoredOut::Same(Same { same: 1 }));
                }
            } else {
                sections.push(StoredOut::Section(SectionOut {
                    source: &s.source,
                    hash: &s.hash,
                    counted: s.counted,
                    transform: s.transform,
                    why: &s.why,
                }));
            }
        }
        let copies = sections.iter().any(|s| matches!(s, StoredOut::Same(_)));
        lines.push(LineOut {
            call_id: &m.call_id,
            step: m.step,
            at: m.at,
            after: prev.filter(|_| copies).map(|p| p.step),
            sections,
            counted: m.counted,
            provider_prompt_tokens: m.provider_prompt_tokens,
        });
        before = Some(m);
    }
    lines
}

/// A section of a line as read: a copied run or one written out (lines written before the
/// compact form have every section written out, with `tokens`, which are computed again).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StoredIn {
    Same(Same),
    Section(SectionIn),
}

#[derive(Debug, Deserialize)]
struct SectionIn {
    source: String,
    hash: String,
    counted: u64,
    transform: Transform,
    #[serde(default)]
    why: Option<String>,
}

/// A line of `<session>.context.jsonl` as read.
#[derive(Debug, Deserialize)]
struct LineIn {
    call_id: String,
    step: usize,
    at: DateTime<Utc>,
    #[serde(default)]
    after: Option<usize>,
    sections: Vec<StoredIn>,
    counted: u64,
    #[serde(default)]
    provider_prompt_tokens: Option<u64>,
}

/// The manifests of stored lines, in order. A line that copies from a line that is not the
/// one before it (same call, step `after`) cannot be resolved: it is left out, with a warning.
fn manifests_in(lines: Vec<LineIn>) -> Vec<Manifest> {
    let mut out: Vec<Manifest> = Vec::with_capacity(lines.len());
    let mut before: Option<usize> = None;
    for line in lines {
        let prev = before
            .and_then(|i| out.get(i))
            .filter(|p| p.call_id == line.call_id && Some(p.step) == line.after);
        let mut sections: Vec<Section> = Vec::with_capacity(line.sections.len());
        let mut resolved = true;
        for stored in line.sections {
            match stored {
                StoredIn::Section(s) => sections.push(Section {
                    source: s.source,
                    hash: s.hash,
                    tokens: s.counted,
                    counted: s.counted,
                    transform: s.transform,
                    why: s.why,
                }),
                StoredIn::Same(Same { same }) => {
                    let from = sections.len();
                    match prev.and_then(|p| p.sections.get(from..from + same)) {
                        Some(run) => sections.extend(run.iter().cloned()),
                        None => {
                            resolved = false;
                            break;
                        }
                    }
                }
            }
        }
        if !resolved {
            tracing::warn!(call_id = %line.call_id, step = line.step, "skipping a context manifest whose earlier line is missing");
            before = None;
            continue;
        }
        for s in &mut sections {
            s.tokens = s.counted;
        }
        if let Some(p) = line.provider_prompt_tokens {
            attribute(&mut sections, p);
        }
        out.push(Manifest {
            call_id: line.call_id,
            step: line.step,
            at: line.at,
            tokens: sections.iter().map(|s| s.tokens).sum(),
            sections,
            counted: line.counted,
            provider_prompt_tokens: line.provider_prompt_tokens,
        });
        before = Some(out.len() - 1);
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
struct Pending(std::sync::Mutex<Vec<Record>>);

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
        let manifests = std::mem::take(&mut *locked(&pending.0));
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
                        &lines_out(&manifests),
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
        let parts = parts_with(&request, self.counter.as_ref(), &self.memo);
        let counted: u64 = parts.iter().map(|s| s.counted).sum();
        let at = Utc::now();
        // The compact form only when a subscriber records the model span.
        if let Some(a) = cx
            .extensions
            .get::<hame_core::telemetry::ManifestAttribute>()
            .filter(|_| tracing::enabled!(target: "hame_core::agent", tracing::Level::INFO))
        {
            a.set(compact(&parts.to_vec(), MAX_SPAN_MANIFEST));
        }
        let response = next.run(cx, request).await?;
        let provider = response.usage.map(|u| u.input_tokens).filter(|t| *t > 0);
        let record = Record {
            call_id: cx.runtime.call_id().unwrap_or("unknown").to_owned(),
            step: cx.iteration,
            at,
            parts,
            counted,
            provider_prompt_tokens: provider,
        };
        tracing::debug!(sections = record.parts.len(), counted, "context manifest");
        // The whole manifest (a copy of every section) only for a listener.
        if cx.events.is_active() {
            cx.events.emit(hame_core::AgentEvent::Custom {
                kind: MANIFEST_EVENT.into(),
                data: serde_json::to_value(record.manifest()).unwrap_or_default(),
            });
        }
        if let Some(p) = cx.extensions.get::<Pending>() {
            locked(&p.0).push(record);
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
        let lines = hame_session::SessionLog::new(ws.records().clone(), self.name())
            .map_err(|e| crate::Error::storage("cannot open the session log", e))?
            .read_side(session_id, CONTEXT_SUFFIX)
            .await
            .map_err(|e| crate::Error::storage("cannot read the context manifests", e))?;
        Ok(manifests_in(lines))
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

    /// An equal system prompt (a new string each step) gets the sections measured first; a
    /// changed one is cut and measured again.
    #[test]
    fn an_equal_system_prompt_is_measured_once() {
        let counter = hame_memory::EstimateCounter;
        let memo = SectionMemo::default();
        let request = |system: &str| ModelRequest {
            system: system.to_owned(),
            messages: Vec::new(),
            tools: Vec::new(),
            params: hame_core::ModelParams::default(),
            cache_key: None,
        };
        let prompt =
            "You help.\n<agents_md>\n# Persona\nCareful.\n</agents_md>\n# Session\nid s1\n";
        let fresh = manifest_of(&request(prompt), &counter);
        assert_eq!(
            fresh.iter().map(|s| s.source.as_str()).collect::<Vec<_>>(),
            ["system:builder", "system:agents_md", "system:session"]
        );
        // Each request has its own copy of the prompt.
        assert_eq!(manifest_with(&request(prompt), &counter, &memo), fresh);
        assert_eq!(manifest_with(&request(prompt), &counter, &memo), fresh);
        let changed = prompt.replace("id s1", "id s2");
        let sections = manifest_with(&request(&changed), &counter, &memo);
        assert_eq!(sections, manifest_of(&request(&changed), &counter));
        assert_ne!(sections[2].hash, fresh[2].hash);
        assert_eq!(sections[..2], fresh[..2]);
        // More prompts than the memo keeps: still right.
        for i in 0..SYSTEM_MEMO + 2 {
            let p = format!("{prompt}# Extra\n{i}\n");
            assert_eq!(
                manifest_with(&request(&p), &counter, &memo),
                manifest_of(&request(&p), &counter)
            );
        }
        assert_eq!(manifest_with(&request(prompt), &counter, &memo), fresh);
    }

    fn manifest(
        call: &str,
        step: usize,
        sections: Vec<Section>,
        provider: Option<u64>,
    ) -> Manifest {
        let mut sections = sections;
        let counted = sections.iter().map(|s| s.counted).sum();
        if let Some(p) = provider {
            attribute(&mut sections, p);
        }
        Manifest {
            call_id: call.into(),
            step,
            at: Utc::now(),
            tokens: sections.iter().map(|s| s.tokens).sum(),
            sections,
            counted,
            provider_prompt_tokens: provider,
        }
    }

    fn stored(manifests: &[Manifest]) -> Vec<String> {
        let records: Vec<Record> = manifests
            .iter()
            .map(|m| {
                // Split as the layer splits a request: the first two sections as the
                // system prompt's, the last two as the tools'.
                let n = m.sections.len();
                let (system, rest) = m.sections.split_at(2.min(n));
                let (messages, tools) = rest.split_at(rest.len().saturating_sub(2));
                Record {
                    call_id: m.call_id.clone(),
                    step: m.step,
                    at: m.at,
                    parts: Parts {
                        system: system.into(),
                        messages: messages.to_vec(),
                        tools: tools.into(),
                    },
                    counted: m.counted,
                    provider_prompt_tokens: m.provider_prompt_tokens,
                }
            })
            .collect();
        for (r, m) in records.iter().zip(manifests) {
            assert_eq!(&r.manifest(), m);
        }
        lines_out(&records)
            .iter()
            .map(|l| serde_json::to_string(l).unwrap_or_default())
            .collect()
    }

    fn read(lines: &[String]) -> Vec<Manifest> {
        manifests_in(
            lines
                .iter()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect(),
        )
    }

    /// A call's manifests are stored with the sections the step before had written as
    /// counts, and read back whole, with the provider's tokens shared out again.
    #[test]
    fn the_stored_lines_copy_the_step_before_and_read_back_whole() {
        let mut grown = sections(30);
        grown[7].source = "messages:0..5".into();
        grown[7].counted = 90;
        grown[7].tokens = 90;
        let mut summarised = grown.clone();
        summarised.insert(
            6,
            Section {
                source: "summary:0..9".into(),
                hash: "fedcba9876543210".into(),
                tokens: 12,
                counted: 12,
                transform: Transform::Summarised,
                why: Some("compaction".into()),
            },
        );
        let manifests = vec![
            manifest("c1", 1, sections(30), Some(2000)),
            manifest("c1", 2, grown.clone(), Some(2100)),
            manifest("c1", 3, grown, None),
            manifest("c1", 4, summarised, Some(900)),
        ];
        let lines = stored(&manifests);
        assert!(!lines[0].contains("same"), "{}", lines[0]);
        assert!(
            lines[1].contains(r#""after":1"#) && lines[1].contains(r#"{"same":7}"#),
            "{}",
            lines[1]
        );
        // Every section of step 3 is step 2's: one run.
        assert!(
            lines[2].contains(r#""sections":[{"same":30}]"#),
            "{}",
            lines[2]
        );
        let full: usize = stored_len(&manifests);
        let compact: usize = lines.iter().map(String::len).sum();
        assert!(compact * 2 < full, "{compact} vs {full} bytes");
        assert_eq!(read(&lines), manifests);
    }

    fn stored_len(manifests: &[Manifest]) -> usize {
        manifests
            .iter()
            .map(|m| serde_json::to_string(m).unwrap_or_default().len())
            .sum()
    }

    /// Lines written before the compact form (whole manifests) still read; a line whose
    /// earlier line is missing is left out, not filled from another step.
    #[test]
    fn old_lines_read_and_an_unresolvable_line_is_left_out() {
        let old = manifest("c0", 1, sections(3), Some(500));
        let old_line = serde_json::to_string(&old).unwrap_or_default();
        let manifests = vec![
            manifest("c1", 1, sections(3), None),
            manifest("c1", 2, sections(3), None),
            manifest("c1", 3, sections(3), None),
        ];
        let lines = stored(&manifests);
        let mut all = vec![old_line.clone()];
        all.extend(lines.iter().cloned());
        assert_eq!(read(&all), [vec![old.clone()], manifests.clone()].concat());
        // Step 2's line lost: step 3's copies cannot be resolved.
        let gap = vec![old_line, lines[0].clone(), lines[2].clone()];
        assert_eq!(read(&gap), vec![old, manifests[0].clone()]);
    }

    /// A growing conversation is hashed as it grows (each request adds its new messages to
    /// the range the last request had), and gives what a fresh measure gives; a message
    /// changed in the middle, a summary, or a shorter history are measured again.
    #[test]
    fn a_growing_range_adds_its_new_messages_and_matches_a_fresh_measure() {
        let counter = hame_memory::EstimateCounter;
        let memo = SectionMemo::default();
        let request = |messages: &[Message]| ModelRequest {
            system: "You help.".into(),
            messages: messages.to_vec(),
            tools: Vec::new(),
            params: hame_core::ModelParams::default(),
            cache_key: None,
        };
        let mut messages = vec![Message::user("go")];
        for i in 0..6 {
            messages.push(Message::assistant(format!("step {i}")));
            messages.push(Message::user(format!("more {i}")));
            let r = request(&messages);
            assert_eq!(
                manifest_with(&r, &counter, &memo),
                manifest_of(&r, &counter)
            );
        }
        let whole = manifest_of(&request(&messages), &counter);
        assert_eq!(whole[1].source, "messages:0..13");
        // A message changed in place (its blocks are copied on write): not the kept one.
        let mut edited = messages.clone();
        edited[4].content.push(ContentBlock::Text {
            text: "edited".into(),
        });
        let r = request(&edited);
        let sections = manifest_with(&r, &counter, &memo);
        assert_eq!(sections, manifest_of(&r, &counter));
        assert_ne!(sections[1].hash, whole[1].hash);
        // Back to the first history, then a shorter one and one split by a summary.
        let r = request(&messages);
        assert_eq!(manifest_with(&r, &counter, &memo), whole);
        let r = request(&messages[..5]);
        assert_eq!(
            manifest_with(&r, &counter, &memo),
            manifest_of(&r, &counter)
        );
        let mut split = messages.clone();
        split[6] = hame_memory::compaction::summary_message(
            hame_memory::compaction::SeqSpan { from: 0, to: 9 },
            "facts",
        );
        let r = request(&split);
        let sections = manifest_with(&r, &counter, &memo);
        assert_eq!(sections, manifest_of(&r, &counter));
        assert_eq!(
            sections
                .iter()
                .map(|s| s.source.as_str())
                .collect::<Vec<_>>(),
            [
                "system:builder",
                "messages:0..6",
                "summary:0..9",
                "messages:7..13"
            ]
        );
    }

    /// A request's tool list, the same shared schemas as an earlier one's, shares that
    /// one's sections; another description or schema is measured again.
    #[test]
    fn a_tool_list_is_kept_whole_and_a_changed_one_measured_again() {
        let counter = hame_memory::EstimateCounter;
        let memo = SectionMemo::default();
        let spec = |name: &str| hame_core::ToolSpec {
            name: name.into(),
            description: format!("does {name}"),
            parameters: Arc::new(serde_json::json!({"type": "object"})),
        };
        let tools = vec![spec("a"), spec("b")];
        let first = memo.tool_sections(&tools, &counter);
        let again = memo.tool_sections(&tools.clone(), &counter);
        assert!(Arc::ptr_eq(&first, &again), "the kept list");
        let fresh = |t: &[hame_core::ToolSpec]| {
            let r = ModelRequest {
                system: String::new(),
                messages: Vec::new(),
                tools: t.to_vec(),
                params: hame_core::ModelParams::default(),
                cache_key: None,
            };
            manifest_of(&r, &counter)
        };
        assert_eq!(first.to_vec(), fresh(&tools));
        let mut other = tools.clone();
        other[1].description = "does more".into();
        let changed = memo.tool_sections(&other, &counter);
        assert!(!Arc::ptr_eq(&first, &changed));
        assert_eq!(changed.to_vec(), fresh(&other));
        assert_ne!(changed[1].hash, first[1].hash);
        // A new schema with equal JSON is another allocation: measured again, same result.
        let rebuilt = vec![spec("a"), spec("b")];
        let again = memo.tool_sections(&rebuilt, &counter);
        assert!(!Arc::ptr_eq(&first, &again));
        assert_eq!(again.to_vec(), first.to_vec());
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
