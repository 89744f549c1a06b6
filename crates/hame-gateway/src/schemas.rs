//! The bodies of the gateway's routes as types: what they serialise and what the OpenAPI
//! document (`crate::openapi`) describes, from one definition.

use serde::Serialize;
use utoipa::ToSchema;

/// `GET /v1/sessions/{session}/files`: a folder's entries.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileList {
    /// The session.
    pub(crate) session: String,
    /// The folder listed (`/` is the root of the caller's files).
    pub(crate) path: String,
    /// Its entries, by path.
    pub(crate) entries: Vec<FileEntry>,
}

/// One entry of a folder.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileEntry {
    /// Its path, from the root of the caller's files.
    pub(crate) path: String,
    /// `file` or `dir`.
    pub(crate) kind: String,
    /// Bytes (0 for a folder).
    pub(crate) size: u64,
    /// When it last changed (RFC 3339), when the storage knows.
    pub(crate) modified: Option<String>,
}

/// `PUT /v1/sessions/{session}/files/{path}`: the file written.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileWritten {
    /// The session.
    pub(crate) session: String,
    /// The file's path, from the root of the caller's files.
    pub(crate) path: String,
    /// Its size in bytes.
    pub(crate) size: u64,
}

/// A JSON object whose keys are the named record's (described in words where it is used).
pub(crate) type Object = serde_json::Map<String, serde_json::Value>;

// ---- the session API ----

/// `POST …/messages`: a turn.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct MessageRequest {
    /// The user's message (not empty).
    message: String,
    /// The caller's own limits for this turn, e.g. `{"run": {"usd": 0.5}, "user_day":
    /// {"tokens": 200000}}`; they only tighten the server's (`docs/cost.md`).
    #[schema(value_type = Option<Object>)]
    budget: Option<Object>,
    /// Checks the reply must pass: names of the server's `[[verify]]` (docs/evidence.md).
    verify: Option<Vec<String>>,
    /// The completion gate's check rounds, 1 to 10 (default 2); needs `verify`.
    verify_attempts: Option<u32>,
    /// The session's goal (its task state).
    goal: Option<String>,
}

/// One piece of evidence: a run of a check, bound to the version of the files it checked.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct Evidence {
    /// `ev-` and 16 hex digits.
    id: String,
    /// The check's name.
    check: String,
    /// `passed`, `failed` or `error`.
    outcome: String,
    /// A command check's exit code.
    exit_code: Option<i64>,
    /// The observation of the check's run.
    observation_id: Option<String>,
    /// SHA-256 over the covered files (path and content hash), after the check ran.
    version: String,
    /// How many files the version covers.
    files: u64,
    /// The globs used (`!` excludes).
    covers: Vec<String>,
    /// When (RFC 3339).
    at: String,
    /// How long the check ran.
    duration_ms: u64,
    /// For a failure: what was expected and the tail of the output.
    detail: Option<String>,
    /// A covered file changed since.
    stale: bool,
}

/// The completion gate's verdict on a turn or a run with required checks.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct Verification {
    /// `verified` or `unverified`.
    status: String,
    /// The current evidence of each required check.
    evidence: Vec<Evidence>,
    /// How many extra steps the gate gave the model.
    extra_steps: u32,
}

/// Tokens a turn used (hame's names).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct Usage {
    /// Prompt tokens.
    input_tokens: u64,
    /// Completion tokens.
    output_tokens: u64,
    /// Prompt tokens served from the provider's cache (part of `input_tokens`; absent: 0).
    cached_input_tokens: Option<u64>,
    /// Prompt tokens written to the provider's cache (part of `input_tokens`; absent: 0).
    cache_write_input_tokens: Option<u64>,
    /// Model requests the run made (a run's usage only; a turn's reply says `iterations`).
    requests: Option<u64>,
}

/// A finished turn (also the `finished` event's data).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct TurnReply {
    /// The final reply.
    reply: String,
    /// The session.
    session: String,
    /// The user (`null`: the anonymous owner of local mode).
    user: Option<String>,
    /// Tokens of the whole turn.
    usage: Usage,
    /// Model requests the turn made.
    iterations: u64,
    /// With required checks: `completed` (they passed) or `unverified`.
    status: Option<String>,
    /// With required checks: the gate's verdict and its evidence.
    verification: Option<Verification>,
}

/// A tool call that waits for a decision (or, with layer `client-tools`, for a client's
/// result).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct Approval {
    /// The id to decide it with (`POST …/approvals/{id}`).
    id: String,
    /// The tool.
    tool: String,
    /// The model's call id.
    call_id: String,
    /// The call's arguments as the model wrote them (JSON text).
    arguments: String,
    /// Why it waits.
    reason: String,
    /// The layer that suspended it (`permissions`, `client-tools`, …; in turn answers).
    layer: Option<String>,
    /// The session (in the `approval_needed` event).
    session: Option<String>,
}

/// A turn whose tool calls wait for decisions (202).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct TurnSuspended {
    /// `approval_needed`.
    status: String,
    /// The session.
    session: String,
    /// The user.
    user: Option<String>,
    /// The waiting calls.
    approvals: Vec<Approval>,
    /// The tokens this request spent before the turn stopped.
    usage: Usage,
}

/// `POST …/approvals/{id}`: a decision.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct DecisionRequest {
    /// `approve` or `deny`.
    #[schema(pattern = "^(approve|deny)$")]
    decision: String,
    /// Why (given to the model with a denial); only with `deny` (400 with `approve`).
    reason: Option<String>,
    /// With `approve`: allow the same call (tool and file) for the rest of the session
    /// without asking, the file routes included (`docs/permissions.md`); only with
    /// `approve` (400 with `deny`). Any other field is 400.
    always: Option<bool>,
}

/// `GET …/messages`: the session's log.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct SessionLog {
    /// The session.
    session: String,
    /// The user.
    user: Option<String>,
    /// Every record of the log (`docs/sessions.md`).
    messages: Vec<Object>,
}

/// One session of a list.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct SessionEntry {
    /// Its id.
    id: String,
    /// Its title (the first user message, cut).
    title: String,
    /// When it started (RFC 3339).
    created: String,
    /// When it last changed (RFC 3339).
    updated: String,
    /// Messages in its log.
    message_count: u64,
}

/// `GET /v1/sessions`: the caller's sessions, newest first.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct SessionList {
    /// The user.
    user: Option<String>,
    /// The sessions.
    sessions: Vec<SessionEntry>,
}

/// `GET …/tasks`: the session's background tasks (records as `hame tasks --json`).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct TaskList {
    /// The session.
    session: String,
    /// The task records.
    tasks: Vec<Object>,
}

/// `GET …/approvals`: the calls waiting for a decision.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ApprovalList {
    /// The session.
    session: String,
    /// The waiting calls.
    approvals: Vec<Approval>,
}

/// One memory file.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct MemoryFile {
    /// Its path in the caller's home (`/MEMORY.md`, `/memory/x.md`).
    path: String,
    /// Its text.
    content: String,
}

/// `GET /v1/memory`: the caller's memory files.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct MemoryFiles {
    /// The user.
    user: Option<String>,
    /// `MEMORY.md` and `memory/*.md`.
    files: Vec<MemoryFile>,
}

// ---- session events (SSE `data:`) ----

/// `text_delta`: a piece of the reply.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct TextDeltaEvent {
    /// The text.
    text: String,
}

/// `tool_started`: a tool call starts.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ToolStartedEvent {
    /// The call id.
    id: String,
    /// The tool.
    name: String,
    /// Its arguments (JSON text).
    arguments: String,
}

/// `tool_finished`: a tool call ended.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ToolFinishedEvent {
    /// The call id.
    id: String,
    /// The tool.
    name: String,
    /// How long it took.
    duration_ms: u64,
    /// Whether it failed.
    is_error: bool,
    /// The error's stable code, when it failed.
    code: Option<String>,
}

/// `failed`: the turn failed.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct FailedEvent {
    /// The error's code (as in an error answer).
    code: String,
    /// What went wrong.
    message: String,
    /// The session.
    session: String,
}

/// The data of a session's SSE events, by event name: `text_delta`, `tool_started`,
/// `tool_finished`, `approval_needed` ([`Approval`]), `finished` ([`TurnReply`]),
/// `failed`, and `subagent` (a subagent's or a layer's event, as the loop emits it).
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum SessionEvent {
    /// `text_delta`.
    TextDelta(TextDeltaEvent),
    /// `tool_started`.
    ToolStarted(ToolStartedEvent),
    /// `tool_finished`.
    ToolFinished(ToolFinishedEvent),
    /// `approval_needed`.
    ApprovalNeeded(Approval),
    /// `finished`.
    Finished(TurnReply),
    /// `failed`.
    Failed(FailedEvent),
    /// `subagent`.
    Subagent(Object),
}

// ---- runs ----

/// `POST …/runs`: a run of one message.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct RunRequest {
    /// The user's message (not empty).
    message: String,
    /// Checks the reply must pass: names of the server's `[[verify]]`; a reply they do not
    /// back ends the run `unverified` (docs/evidence.md).
    verify: Option<Vec<String>>,
    /// The completion gate's check rounds, 1 to 10 (default 2); needs `verify`.
    verify_attempts: Option<u32>,
}

/// `POST …/runs`: the run made (202) or found by its `Idempotency-Key` (200).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct RunCreated {
    /// The run's id.
    run_id: String,
    /// The session.
    session: String,
    /// `queued`, `running`, `waiting_approval`, `completed`, `unverified`, `failed` or
    /// `cancelled`.
    status: String,
}

/// Why a run failed.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct RunError {
    /// A stable code.
    code: String,
    /// What went wrong.
    message: String,
}

/// A run (also the data of its SSE events, named by its status).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct RunView {
    /// The run's id.
    run_id: String,
    /// The session.
    session: String,
    /// `queued`, `running`, `waiting_approval`, `completed`, `unverified`, `failed` or
    /// `cancelled`.
    status: String,
    /// When it was submitted (RFC 3339).
    created: String,
    /// When it last changed (RFC 3339).
    updated: String,
    /// The reply, once completed (or unverified).
    reply: Option<String>,
    /// Tokens, once ended.
    usage: Option<Usage>,
    /// A run with required checks: the gate's verdict; for `unverified`, the failing
    /// evidence.
    verification: Option<Verification>,
    /// Why it failed.
    error: Option<RunError>,
    /// The calls that wait for a decision.
    approvals: Option<Vec<Approval>>,
}

/// `GET …/runs`: the session's runs, newest first.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct RunList {
    /// The session.
    session: String,
    /// The runs.
    runs: Vec<RunView>,
}

// ---- OpenAI-compatible ----

/// A model object: a served agent.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ModelObject {
    /// The agent's id.
    id: String,
    /// `model`.
    object: String,
    /// When the server started (Unix seconds).
    created: i64,
    /// `hame`.
    owned_by: String,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ModelList {
    /// `list`.
    object: String,
    /// The agents the caller may use, the default first.
    data: Vec<ModelObject>,
}

/// A message's content: text, or a list of parts.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum MessageContent {
    /// Text.
    Text(String),
    /// Parts, in order.
    Parts(Vec<ContentPart>),
}

/// A content part. Images are accepted in user messages only, as inline `data:` URLs
/// (`data:image/png|jpeg|gif|webp;base64,…`, at most 5 MiB decoded, at most 20 images per
/// request); hame never fetches a URL (`docs/openai-compat.md`, *Images*).
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum ContentPart {
    /// `{"type": "text", "text"}`.
    Text {
        /// The text.
        text: String,
    },
    /// `{"type": "input_text", "text"}` (Responses).
    InputText {
        /// The text.
        text: String,
    },
    /// `{"type": "output_text", "text"}` (an earlier reply, Responses).
    OutputText {
        /// The text.
        text: String,
    },
    /// `{"type": "image_url", "image_url": URL | {"url", "detail"}}` (chat).
    ImageUrl {
        /// The image.
        image_url: ImageUrl,
    },
    /// `{"type": "input_image", "image_url", "detail"}` (Responses; `file_id` is refused).
    InputImage {
        /// A `data:` URL.
        #[schema(pattern = "^data:")]
        image_url: String,
        /// `auto` only (`low` and `high` are refused).
        detail: Option<String>,
    },
}

/// The image of an `image_url` part: a `data:` URL, or `{"url", "detail"}`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum ImageUrl {
    /// A `data:` URL.
    Url(String),
    /// The URL and the detail level.
    Object {
        /// A `data:` URL.
        #[schema(pattern = "^data:")]
        url: String,
        /// `auto` only (`low` and `high` are refused).
        detail: Option<String>,
    },
}

/// One message of a chat completion request.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    #[schema(pattern = "^(system|developer|user|assistant|tool)$")]
    role: String,
    /// Text, or a list of parts: text, and (in user messages only) inline images.
    content: Option<MessageContent>,
    /// An assistant message's tool calls.
    tool_calls: Option<Vec<Object>>,
    /// A tool message's call id.
    tool_call_id: Option<String>,
    /// An assistant message's refusal.
    refusal: Option<String>,
}

/// `stream_options`.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct StreamOptions {
    /// Send a last chunk with the usage.
    include_usage: Option<bool>,
}

/// `POST /v1/chat/completions`: the fields hame honours (any other is 400
/// `unsupported_parameter` naming it; `docs/openai-compat.md`).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ChatCompletionRequest {
    /// The agent.
    model: String,
    /// The conversation: system/developer messages, the history, the new user message or
    /// the results of client tool calls.
    messages: Vec<ChatMessage>,
    /// Stream `chat.completion.chunk`s.
    stream: Option<bool>,
    /// With `stream`.
    stream_options: Option<StreamOptions>,
    /// Client tools (`{"type": "function", "function": {name, description, parameters,
    /// strict}}`).
    tools: Option<Vec<Object>>,
    /// `auto`, `none`, `required` or a named function.
    #[schema(value_type = Option<Object>)]
    tool_choice: Option<serde_json::Value>,
    /// `true` only.
    parallel_tool_calls: Option<bool>,
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema",
    /// "json_schema": {name, schema, strict}}`.
    response_format: Option<Object>,
    /// 0 to 2.
    temperature: Option<f64>,
    /// Output token limit.
    max_tokens: Option<u64>,
    /// Output token limit.
    max_completion_tokens: Option<u64>,
    /// 1 only.
    n: Option<u64>,
    /// 1 only.
    top_p: Option<f64>,
    /// 0 only.
    frequency_penalty: Option<f64>,
    /// 0 only.
    presence_penalty: Option<f64>,
    /// `false` only.
    logprobs: Option<bool>,
    /// Accepted as the session store is always on.
    store: Option<bool>,
    /// Must equal the caller's user when given.
    user: Option<String>,
}

/// A tool call of a reply (a client tool).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ChatToolCall {
    /// Its id (`hs_…`: it names the session; send it back as the tool message's
    /// `tool_call_id`).
    id: String,
    /// `function`.
    #[serde(rename = "type")]
    kind: String,
    /// The function.
    function: ChatFunctionCall,
    /// Its position (in stream chunks).
    index: Option<u64>,
}

/// The function of a tool call.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ChatFunctionCall {
    /// The client tool's name.
    name: String,
    /// Its arguments (JSON text).
    arguments: String,
}

/// The assistant message of a chat completion.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ChatReplyMessage {
    /// `assistant`.
    role: String,
    /// The reply (`null` with only tool calls).
    content: Option<String>,
    /// Always `null`.
    refusal: Option<String>,
    /// Client tool calls (`finish_reason: "tool_calls"`).
    tool_calls: Option<Vec<ChatToolCall>>,
}

/// A choice of a chat completion.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ChatChoice {
    /// 0.
    index: u64,
    /// The message.
    message: ChatReplyMessage,
    /// `stop` or `tool_calls`.
    finish_reason: String,
    /// Always `null`.
    #[schema(value_type = Option<Object>)]
    logprobs: Option<serde_json::Value>,
}

/// `prompt_tokens_details`.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct PromptTokensDetails {
    /// Prompt tokens served from the provider's cache.
    cached_tokens: u64,
}

/// OpenAI's usage of a chat completion.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ChatUsage {
    /// Prompt tokens of the whole turn.
    prompt_tokens: u64,
    /// Completion tokens of the whole turn.
    completion_tokens: u64,
    /// Their sum.
    total_tokens: u64,
    /// Of the prompt tokens, those read from the cache.
    prompt_tokens_details: PromptTokensDetails,
}

/// `chat.completion`.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ChatCompletion {
    /// `chatcmpl-…`.
    id: String,
    /// `chat.completion`.
    object: String,
    /// Unix seconds.
    created: i64,
    /// The agent.
    model: String,
    /// One choice.
    choices: Vec<ChatChoice>,
    /// Tokens.
    usage: ChatUsage,
}

/// A choice of a chunk.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ChatChunkChoice {
    /// 0.
    index: u64,
    /// What is new: `role`, `content`, `refusal`, `tool_calls`.
    delta: Object,
    /// `stop` or `tool_calls` in the last chunk, else `null`.
    finish_reason: Option<String>,
    /// Always `null`.
    #[schema(value_type = Option<Object>)]
    logprobs: Option<serde_json::Value>,
}

/// `chat.completion.chunk` (the SSE `data:` of a streamed completion; then `[DONE]`; an
/// error inside the stream is an [`ErrorBody`](crate::openapi::ErrorBody)).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ChatCompletionChunk {
    /// The completion's id.
    id: String,
    /// `chat.completion.chunk`.
    object: String,
    /// Unix seconds.
    created: i64,
    /// The agent.
    model: String,
    /// One choice (none in the usage chunk).
    choices: Vec<ChatChunkChoice>,
    /// In the last chunk with `stream_options.include_usage`.
    usage: Option<ChatUsage>,
}

/// The `input` of a Responses request: text (one user message), or items.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum ResponseInput {
    /// One user message.
    Text(String),
    /// Items, in order.
    Items(Vec<InputItem>),
}

/// An input item: a `message` (the default type), a `function_call` or a
/// `function_call_output`.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct InputItem {
    /// `message` (when absent), `function_call` or `function_call_output`.
    #[serde(rename = "type")]
    kind: Option<String>,
    /// A message's role: `user`, `assistant`, `system` or `developer`.
    role: Option<String>,
    /// A message's content: text, or parts (`input_text`, `output_text`, and in user
    /// messages `input_image` with a `data:` URL).
    content: Option<MessageContent>,
    /// A function call's id (and the id a `function_call_output` answers).
    call_id: Option<String>,
    /// A function call's name.
    name: Option<String>,
    /// A function call's arguments (JSON text).
    arguments: Option<String>,
    /// A function call's output.
    output: Option<MessageContent>,
    /// The item's id, as an earlier response gave it.
    id: Option<String>,
    /// The item's status, as an earlier response gave it.
    status: Option<String>,
}

/// `POST /v1/responses`: the fields hame honours (any other is 400 naming it).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ResponseRequest {
    /// The agent.
    model: String,
    /// Text, or items: messages, `function_call` and `function_call_output`.
    input: ResponseInput,
    /// A caller-instructions section for this turn.
    instructions: Option<String>,
    /// Stream the events.
    stream: Option<bool>,
    /// Client function tools.
    tools: Option<Vec<Object>>,
    /// `auto`, `none`, `required` or a named function.
    #[schema(value_type = Option<Object>)]
    tool_choice: Option<serde_json::Value>,
    /// `true` only.
    parallel_tool_calls: Option<bool>,
    /// The response this one continues (its session).
    previous_response_id: Option<String>,
    /// `{"format": {"type": "text"|"json_schema", …}}`.
    text: Option<Object>,
    /// 0 to 2.
    temperature: Option<f64>,
    /// Output token limit.
    max_output_tokens: Option<u64>,
    /// 1 only.
    top_p: Option<f64>,
    /// Empty only.
    include: Option<Vec<String>>,
    /// `disabled` only.
    truncation: Option<String>,
    /// Accepted (the session store is always on).
    store: Option<bool>,
    /// `false` only.
    background: Option<bool>,
    /// Echoed back.
    metadata: Option<Object>,
}

/// `input_tokens_details`.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct InputTokensDetails {
    /// Read from the cache.
    cached_tokens: u64,
}

/// `output_tokens_details`.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct OutputTokensDetails {
    /// 0.
    reasoning_tokens: u64,
}

/// The usage of a response.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ResponseUsage {
    /// Prompt tokens.
    input_tokens: u64,
    /// Of those, cached.
    input_tokens_details: InputTokensDetails,
    /// Output tokens.
    output_tokens: u64,
    /// Of those, reasoning.
    output_tokens_details: OutputTokensDetails,
    /// Their sum.
    total_tokens: u64,
}

/// An output item: a `message` (with `output_text` content) or a `function_call`.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ResponseItem {
    /// `message` or `function_call`.
    #[serde(rename = "type")]
    kind: String,
    /// Its id.
    id: String,
    /// `completed` or `in_progress`.
    status: String,
    /// A message's `assistant`.
    role: Option<String>,
    /// A message's parts `[{"type": "output_text", "text", "annotations", "logprobs"}]`.
    content: Option<Vec<Object>>,
    /// A function call's id (send it back in a `function_call_output`).
    call_id: Option<String>,
    /// A function call's name.
    name: Option<String>,
    /// A function call's arguments (JSON text).
    arguments: Option<String>,
}

/// A `response` object.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ResponseObject {
    /// `resp-…` (it names the session).
    id: String,
    /// `response`.
    object: String,
    /// Unix seconds.
    created_at: i64,
    /// `completed`, `in_progress` or `failed`.
    status: String,
    /// The error of a failed response.
    error: Option<Object>,
    /// Always `null`.
    incomplete_details: Option<Object>,
    /// As requested.
    instructions: Option<String>,
    /// As requested.
    max_output_tokens: Option<u64>,
    /// The agent.
    model: String,
    /// The output items.
    output: Vec<ResponseItem>,
    /// `true`.
    parallel_tool_calls: bool,
    /// As requested.
    previous_response_id: Option<String>,
    /// `null`.
    reasoning: Option<Object>,
    /// `true`.
    store: bool,
    /// As requested.
    temperature: Option<f64>,
    /// As requested (`{"format": …}`).
    text: Object,
    /// As requested.
    #[schema(value_type = Object)]
    tool_choice: serde_json::Value,
    /// As requested.
    tools: Vec<Object>,
    /// `null`.
    top_p: Option<f64>,
    /// `disabled`.
    truncation: String,
    /// `null` until completed.
    usage: Option<ResponseUsage>,
    /// `null`.
    user: Option<String>,
    /// As requested.
    metadata: Option<Object>,
}

/// One streamed event of `POST /v1/responses` (`event:` is its `type`):
/// `response.created`, `response.in_progress`, `response.output_item.added`,
/// `response.content_part.added`, `response.output_text.delta`, `response.output_text.done`,
/// `response.content_part.done`, `response.output_item.done`, `response.completed`,
/// `response.failed`, `error`.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub(crate) struct ResponseStreamEvent {
    /// The event's name.
    #[serde(rename = "type")]
    kind: String,
    /// Its position in the stream.
    sequence_number: u64,
    /// The response (`response.*` of the whole response).
    response: Option<ResponseObject>,
    /// The item (`response.output_item.*`).
    item: Option<ResponseItem>,
    /// The item's position.
    output_index: Option<u64>,
    /// The item's id.
    item_id: Option<String>,
    /// The part's position.
    content_index: Option<u64>,
    /// The part (`response.content_part.*`).
    part: Option<Object>,
    /// A piece of text (`response.output_text.delta`).
    delta: Option<String>,
    /// The whole text (`response.output_text.done`).
    text: Option<String>,
}
