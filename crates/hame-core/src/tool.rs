//! Tools: the contract, a typed adapter that derives the JSON Schema, and the [`ToolSet`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use futures::StreamExt;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::context::ToolContext;
use crate::message::{ToolCall, ToolResult};

/// Stable error codes produced by the loop itself. Tools add their own (`file_not_found`, ...).
pub mod codes {
    /// The model named a tool that is not registered (or is filtered out).
    pub const UNKNOWN_TOOL: &str = "unknown_tool";
    /// The arguments were not valid JSON or did not match the schema.
    pub const INVALID_ARGUMENTS: &str = "invalid_arguments";
    /// The tool panicked.
    pub const TOOL_PANICKED: &str = "tool_panicked";
    /// The tool did not finish within its timeout.
    pub const TIMEOUT: &str = "timeout";
    /// A layer or a policy refused the call.
    pub const DENIED: &str = "permission_denied";
    /// The call was cancelled.
    pub const CANCELLED: &str = "cancelled";
    /// Any other failure.
    pub const FAILED: &str = "tool_failed";
}

/// The description of a tool given to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Unique name (`[a-zA-Z0-9_-]{1,64}` is what providers accept).
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object. Shared: every model request of every step
    /// carries the specs, and cloning one must not copy its schema.
    pub parameters: std::sync::Arc<serde_json::Value>,
}

/// An error the model can act on. It becomes a tool result with `is_error = true`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolError {
    /// Stable machine-readable code, see [`codes`].
    pub code: String,
    /// Human-readable explanation for the model.
    pub message: String,
}

impl ToolError {
    /// A new error.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }

    /// An `invalid_arguments` error.
    pub fn invalid_arguments(message: impl Into<String>) -> Self {
        Self::new(codes::INVALID_ARGUMENTS, message)
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ToolError {}

/// What a tool returns: text for the model, or an error the model can act on.
pub type ToolOutput = Result<String, ToolError>;

/// What [`Tool::reconcile`] found out about an earlier call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// The call took effect (or failed) and this is its output, as the call would have
    /// returned it: it becomes the call's result.
    Known(ToolOutput),
    /// Nothing is known about the call (it never reached the system it acts on, or the
    /// tool cannot look calls up): the model is told `outcome_unknown`.
    Unknown,
}

/// Turns a tool output into the result block sent to the model.
pub fn to_tool_result(id: &str, output: ToolOutput) -> ToolResult {
    match output {
        Ok(content) => ToolResult {
            id: id.to_owned(),
            content,
            is_error: false,
            code: None,
        },
        Err(e) => ToolResult {
            id: id.to_owned(),
            content: format!("Error [{}]: {}", e.code, e.message),
            is_error: true,
            code: Some(e.code),
        },
    }
}

/// A tool the model can call.
///
/// Implement [`TypedTool`] instead when the arguments have a Rust type: the schema is then
/// derived and the arguments validated for you.
#[async_trait]
pub trait Tool: Send + Sync + fmt::Debug + 'static {
    /// Name, description and parameter schema.
    fn spec(&self) -> ToolSpec;

    /// Runs the tool. Errors the model can fix are `Err(ToolError)`, never panics.
    async fn call(&self, arguments: serde_json::Value, ctx: &ToolContext) -> ToolOutput;

    /// Whether running the same call twice (same arguments, same
    /// [`ToolContext::idempotency_key`]) has the effect of running it once. Default
    /// `false`.
    ///
    /// The harness runs again, on resumption, an idempotent call that a crash cut (with
    /// the same call id, so the same key); any other such call is reported to the model
    /// as `outcome_unknown` and not run again (`docs/tools.md`, *Exactly-once*).
    fn idempotent(&self) -> bool {
        false
    }

    /// Looks up the outcome of an earlier call by its idempotency key (`key`, also
    /// `ctx.idempotency_key()`; `ctx.call_id` is that call's id). Default: not
    /// implemented ([`Reconciled::Unknown`]).
    ///
    /// # Contract
    /// - Called by the harness on resumption, before anything else, for a call of this
    ///   tool that a crash cut (its intent has no end). It never re-does the call.
    /// - [`Reconciled::Known`] only when the tool's own durable record says what the call
    ///   did; the output becomes the call's result (its observation says `reconciled`).
    /// - [`Reconciled::Unknown`] when no record exists; for a tool that is also
    ///   [`idempotent`](Tool::idempotent) the call is then run again.
    async fn reconcile(&self, key: &str, ctx: &ToolContext) -> Reconciled {
        let _ = (key, ctx);
        Reconciled::Unknown
    }
}

#[async_trait]
impl<T: Tool + ?Sized> Tool for Arc<T> {
    fn spec(&self) -> ToolSpec {
        (**self).spec()
    }
    async fn call(&self, arguments: serde_json::Value, ctx: &ToolContext) -> ToolOutput {
        (**self).call(arguments, ctx).await
    }
    fn idempotent(&self) -> bool {
        (**self).idempotent()
    }
    async fn reconcile(&self, key: &str, ctx: &ToolContext) -> Reconciled {
        (**self).reconcile(key, ctx).await
    }
}

/// A tool with a typed argument struct; wrap it with [`typed`] to get a [`Tool`].
#[async_trait]
pub trait TypedTool: Send + Sync + fmt::Debug + 'static {
    /// The argument type; its JSON Schema is given to the model.
    type Args: DeserializeOwned + JsonSchema + Send;
    /// The tool name.
    fn name(&self) -> &str;
    /// The description for the model.
    fn description(&self) -> String;
    /// Runs the tool with parsed arguments.
    async fn run(&self, args: Self::Args, ctx: &ToolContext) -> ToolOutput;
    /// See [`Tool::idempotent`]. Default `false`.
    fn idempotent(&self) -> bool {
        false
    }
    /// See [`Tool::reconcile`]. Default [`Reconciled::Unknown`].
    async fn reconcile(&self, key: &str, ctx: &ToolContext) -> Reconciled {
        let _ = (key, ctx);
        Reconciled::Unknown
    }
}

/// Adapts a [`TypedTool`] to [`Tool`].
#[derive(Debug)]
pub struct Typed<T>(pub T);

/// Wraps a [`TypedTool`] as an `Arc<dyn Tool>`.
pub fn typed<T: TypedTool>(tool: T) -> Arc<dyn Tool> {
    Arc::new(Typed(tool))
}

/// The JSON Schema of `T` as a tool parameter object (no `$schema`, no `title`).
pub fn schema_for<T: JsonSchema>() -> serde_json::Value {
    let schema = schemars::schema_for!(T);
    let mut value = serde_json::to_value(&schema).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(obj) = value.as_object_mut() {
        obj.remove("$schema");
        obj.remove("title");
        // The struct's doc comment ("Arguments of `x`") is for Rust readers; the model gets
        // the tool description instead.
        obj.remove("description");
        if !obj.contains_key("properties")
            && obj.get("type").and_then(|t| t.as_str()) == Some("object")
        {
            obj.insert("properties".into(), serde_json::json!({}));
        }
    }
    inline_definitions(&mut value);
    compact_schema(&mut value);
    value
}

/// Replaces each `{"$ref": "#/$defs/X"}` of a parameter schema by the definition itself
/// (the referring object's own keys win; the definition's description, a doc comment
/// written for Rust readers, is not copied) and drops `$defs`
/// when nothing refers to it any more. Models read a flat schema more reliably, and it
/// is shorter when a definition is used once. Recursive definitions are left as
/// references.
pub fn inline_definitions(value: &mut serde_json::Value) {
    let Some(defs) = value
        .as_object_mut()
        .and_then(|o| o.remove("$defs"))
        .and_then(|d| match d {
            serde_json::Value::Object(m) => Some(m),
            _ => None,
        })
    else {
        return;
    };
    fn walk(
        v: &mut serde_json::Value,
        defs: &serde_json::Map<String, serde_json::Value>,
        depth: usize,
        unresolved: &mut bool,
    ) {
        match v {
            serde_json::Value::Object(obj) => {
                let target = obj
                    .get("$ref")
                    .and_then(|r| r.as_str())
                    .and_then(|r| r.strip_prefix("#/$defs/"))
                    .map(str::to_owned);
                if let Some(name) = target {
                    match defs.get(&name) {
                        Some(serde_json::Value::Object(def)) if depth < 8 => {
                            obj.remove("$ref");
                            for (k, val) in def {
                                if k != "description" && !obj.contains_key(k) {
                                    obj.insert(k.clone(), val.clone());
                                }
                            }
                        }
                        _ => *unresolved = true,
                    }
                }
                for val in obj.values_mut() {
                    walk(val, defs, depth + 1, unresolved);
                }
            }
            serde_json::Value::Array(items) => {
                for val in items {
                    walk(val, defs, depth + 1, unresolved);
                }
            }
            _ => {}
        }
    }
    let mut unresolved = false;
    walk(value, &defs, 0, &mut unresolved);
    if unresolved && let Some(obj) = value.as_object_mut() {
        obj.insert("$defs".into(), serde_json::Value::Object(defs));
    }
}

/// Strips what costs the model tokens and tells it nothing (every request carries every
/// schema): `format` annotations (`uint64`, ...), `minimum: 0` of unsigned integers,
/// `default: null` and `default: false`, empty descriptions, `additionalProperties: false` (arguments are
/// checked when they are parsed), and the `null` of an optional field's type
/// (`["integer", "null"]` becomes `"integer"`; the field is optional because it is not
/// `required`); a `oneOf` of string constants (a Rust enum) becomes `enum`; line breaks
/// of doc comments inside descriptions become spaces.
pub fn compact_schema(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(obj) => {
            obj.remove("format");
            if obj
                .get("default")
                .is_some_and(|d| d.is_null() || d == &serde_json::Value::Bool(false))
            {
                obj.remove("default");
            }
            if obj.get("description").and_then(|d| d.as_str()) == Some("") {
                obj.remove("description");
            }
            if obj.get("additionalProperties") == Some(&serde_json::Value::Bool(false)) {
                obj.remove("additionalProperties");
            }
            if let Some(serde_json::Value::Array(variants)) = obj.get("oneOf") {
                let consts: Option<Vec<serde_json::Value>> = variants
                    .iter()
                    .map(|v| {
                        let o = v.as_object()?;
                        let c = o.get("const").filter(|c| c.is_string())?;
                        o.keys()
                            .all(|k| matches!(k.as_str(), "const" | "type" | "description"))
                            .then(|| c.clone())
                    })
                    .collect();
                if let Some(consts) = consts.filter(|c| !c.is_empty()) {
                    obj.remove("oneOf");
                    obj.insert("type".into(), "string".into());
                    obj.insert("enum".into(), serde_json::Value::Array(consts));
                }
            }
            if let Some(serde_json::Value::Array(types)) = obj.get("type") {
                let rest: Vec<serde_json::Value> = types
                    .iter()
                    .filter(|t| t.as_str() != Some("null"))
                    .cloned()
                    .collect();
                if rest.len() == 1 && rest.len() < types.len() {
                    obj.insert("type".into(), rest[0].clone());
                }
            }
            if obj.get("type").and_then(|t| t.as_str()) == Some("integer")
                && obj.get("minimum").and_then(serde_json::Value::as_u64) == Some(0)
            {
                obj.remove("minimum");
            }
            if let Some(serde_json::Value::String(d)) = obj.get_mut("description")
                && d.contains('\n')
            {
                *d = d.split_whitespace().collect::<Vec<_>>().join(" ");
            }
            // Only schema positions: a property may be called `format` or `default`.
            for key in ["properties", "$defs", "definitions", "patternProperties"] {
                if let Some(serde_json::Value::Object(map)) = obj.get_mut(key) {
                    map.values_mut().for_each(compact_schema);
                }
            }
            for key in ["items", "additionalProperties", "not", "if", "then", "else"] {
                if let Some(v) = obj.get_mut(key) {
                    compact_schema(v);
                }
            }
            for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
                if let Some(serde_json::Value::Array(items)) = obj.get_mut(key) {
                    items.iter_mut().for_each(compact_schema);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(compact_schema),
        _ => {}
    }
}

#[async_trait]
impl<T: TypedTool> Tool for Typed<T> {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.0.name().to_owned(),
            description: self.0.description(),
            parameters: schema_for::<T::Args>().into(),
        }
    }

    async fn call(&self, arguments: serde_json::Value, ctx: &ToolContext) -> ToolOutput {
        let args: T::Args = serde_json::from_value(arguments).map_err(|e| {
            ToolError::invalid_arguments(format!("arguments do not match the schema: {e}"))
        })?;
        self.0.run(args, ctx).await
    }

    fn idempotent(&self) -> bool {
        self.0.idempotent()
    }

    async fn reconcile(&self, key: &str, ctx: &ToolContext) -> Reconciled {
        self.0.reconcile(key, ctx).await
    }
}

/// Default per-call timeout of the [`ToolSet`].
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(630);

/// Limits applied when the [`ToolSet`] runs calls.
#[derive(Debug, Clone)]
pub struct ToolRunOptions {
    /// How many calls of one step run at once. Default 8.
    pub max_concurrency: usize,
    /// Per-call timeout. Default [`DEFAULT_TOOL_TIMEOUT`] (630 s): above the local shell's
    /// longest command (600 s) plus its kill grace, so a shell command's own timeout (which
    /// kills its process group and returns the partial output) always fires first.
    pub timeout: Duration,
}

impl Default for ToolRunOptions {
    fn default() -> Self {
        Self {
            max_concurrency: 8,
            timeout: DEFAULT_TOOL_TIMEOUT,
        }
    }
}

/// Deferred tools a layer wants offered in the current model request (in the call's
/// [`Extensions`](crate::Extensions) when the agent defers tools): e.g. the subagents layer
/// offers the task tools when subagents are declared. The layer that offers deferred tools
/// takes the wishes once per request, so a wish lasts one request.
#[derive(Debug, Default)]
pub struct ToolOffers(std::sync::Mutex<std::collections::BTreeSet<String>>);

impl ToolOffers {
    /// Asks for these deferred tools in the current request.
    pub fn offer<I, S>(&self, names: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if let Ok(mut set) = self.0.lock() {
            set.extend(names.into_iter().map(Into::into));
        }
    }

    /// The wishes so far, emptied.
    pub fn take(&self) -> std::collections::BTreeSet<String> {
        self.0
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }
}

/// A registry of tools with allow/deny filtering, and *deferred* tools: registered and
/// callable by name, but not offered in model requests (their specs are sent only when a
/// layer asks for them, e.g. after the model looked them up). Deferring the rarely used
/// tools keeps every request small.
///
/// A tool's [`Tool::spec`] is read once, when it is registered: specs are model-visible and
/// kept stable (which also lets provider prompt caches reuse them), and deriving JSON
/// Schemas on every reasoning step would cost more than the rest of the step's bookkeeping.
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<String, (Arc<dyn Tool>, ToolSpec)>,
    allow: Option<Vec<String>>,
    deny: Vec<String>,
    deferred: std::collections::BTreeSet<String>,
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolSet")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("allow", &self.allow)
            .field("deny", &self.deny)
            .field("deferred", &self.deferred)
            .finish()
    }
}

impl ToolSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool; a tool with the same name is replaced.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        let spec = tool.spec();
        self.tools.insert(spec.name.clone(), (tool, spec));
    }

    /// Only tools named here are visible (`None` = all).
    pub fn set_allow(&mut self, allow: Option<Vec<String>>) {
        self.allow = allow;
    }

    /// Tools named here are never visible.
    pub fn set_deny(&mut self, deny: Vec<String>) {
        self.deny = deny;
    }

    /// Tools named here are deferred: callable, but left out of [`ToolSet::specs`] (see
    /// [`ToolSet::deferred_specs`]). Replaces the previous set; names of tools that are
    /// not registered are kept, so the order of registering and deferring does not matter.
    pub fn set_deferred(&mut self, names: impl IntoIterator<Item = String>) {
        self.deferred = names.into_iter().collect();
    }

    /// Offers a deferred tool again in every request.
    pub fn undefer(&mut self, name: &str) {
        self.deferred.remove(name);
    }

    /// Whether a visible tool of this name is deferred.
    pub fn is_deferred(&self, name: &str) -> bool {
        self.deferred.contains(name) && self.tools.contains_key(name) && self.visible(name)
    }

    /// The spec of the visible tool with this name (deferred or not).
    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        if !self.visible(name) {
            return None;
        }
        self.tools.get(name).map(|(_, spec)| spec)
    }

    fn visible(&self, name: &str) -> bool {
        if self.deny.iter().any(|d| d == name) {
            return false;
        }
        match &self.allow {
            Some(allow) => allow.iter().any(|a| a == name),
            None => true,
        }
    }

    /// The visible tool with this name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        if !self.visible(name) {
            return None;
        }
        self.tools.get(name).map(|(tool, _)| tool)
    }

    /// Names of the visible tools (deferred ones included), sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools
            .keys()
            .filter(|n| self.visible(n))
            .cloned()
            .collect()
    }

    /// Specs of the visible tools that are offered (not deferred), sorted by name (a
    /// stable order helps prompt caching).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools
            .iter()
            .filter(|(n, _)| self.visible(n) && !self.deferred.contains(*n))
            .map(|(_, (_, spec))| spec.clone())
            .collect()
    }

    /// Specs of the visible deferred tools, sorted by name.
    pub fn deferred_specs(&self) -> Vec<ToolSpec> {
        self.tools
            .iter()
            .filter(|(n, _)| self.visible(n) && self.deferred.contains(*n))
            .map(|(_, (_, spec))| spec.clone())
            .collect()
    }

    /// Whether no tool is visible.
    pub fn is_empty(&self) -> bool {
        self.names().is_empty()
    }

    /// The error of a call to a tool this set has no visible tool of: `unknown_tool`, with
    /// the first 50 names it has that `offered` keeps (what the caller may call).
    pub fn unknown(&self, name: &str, offered: &dyn Fn(&str) -> bool) -> ToolError {
        let mut names = self.names();
        names.retain(|n| offered(n));
        names.truncate(50);
        ToolError::new(
            codes::UNKNOWN_TOOL,
            format!(
                "no tool named `{name}`; available tools: {}",
                names.join(", ")
            ),
        )
    }

    /// Runs one call: unknown tool, malformed arguments, panic and timeout become error
    /// outputs; nothing here fails the run.
    pub async fn run_one(
        &self,
        call: &ToolCall,
        ctx: &ToolContext,
        timeout: Duration,
    ) -> ToolOutput {
        let Some(tool) = self.get(&call.name) else {
            return Err(self.unknown(&call.name, &|_| true));
        };
        let args = match call.parse_arguments() {
            Ok(v) => v,
            Err(e) => {
                return Err(ToolError::invalid_arguments(format!(
                    "arguments are not valid JSON ({e}); send a JSON object matching the schema"
                )));
            }
        };
        if !args.is_object() {
            return Err(ToolError::invalid_arguments(
                "arguments must be a JSON object",
            ));
        }
        let fut = std::panic::AssertUnwindSafe(tool.call(args, ctx)).catch_unwind();
        tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => Err(ToolError::new(codes::CANCELLED, "the call was cancelled")),
            res = tokio::time::timeout(timeout, fut) => match res {
                Err(_) => {
                    ctx.cancel.cancel();
                    Err(ToolError::new(codes::TIMEOUT, format!("the tool did not finish within {} s", timeout.as_secs_f64())))
                }
                Ok(Err(panic)) => {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".to_owned());
                    tracing::error!(tool = %call.name, panic = %what, "tool panicked");
                    Err(ToolError::new(codes::TOOL_PANICKED, format!("the tool failed unexpectedly: {what}")))
                }
                Ok(Ok(out)) => out,
            }
        }
    }

    /// Runs several calls concurrently (bounded), returning outputs in call order.
    pub async fn run_many<'a>(
        &self,
        calls: impl IntoIterator<Item = (&'a ToolCall, ToolContext)>,
        options: &ToolRunOptions,
    ) -> Vec<ToolOutput> {
        let timeout = options.timeout;
        let runs: Vec<_> = calls
            .into_iter()
            .map(|(call, ctx)| async move { self.run_one(call, &ctx, timeout).await })
            .collect();
        futures::stream::iter(runs)
            .buffered(options.max_concurrency.max(1))
            .collect()
            .await
    }
}

#[cfg(test)]
#[path = "tool_tests.rs"]
mod tests;
