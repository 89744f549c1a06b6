//! What a step costs: the prompt cache key of a call, the price table, and budgets that
//! stop spending.
//!
//! - **Prompt caching.** Anthropic needs `cache_control` breakpoints, which the model client
//!   sets (`hame_model::AnthropicConfig::prompt_cache`); OpenAI routes requests with one
//!   `prompt_cache_key` to one cache, and the key comes from [`prompt_cache_key`]: one per
//!   (agent, user, session), a hash that names none of them.
//! - **Spend.** The [`BudgetLayer`] (innermost, always on) records every model request's
//!   tokens and price in the session state (`extensions["budget"]`, a [`SpendRecord`] by
//!   UTC day and model), so spend is saved with the conversation and holds across
//!   processes and replicas. `hame usage` reads it back.
//! - **Budgets.** Before each model request the layer checks what the run (this call), the
//!   session and the user's UTC day have spent against [`Budgets`]; over a limit the call
//!   ends with [`hame_core::Error::BudgetExceeded`] before the request is sent.
//!
//! The decision is a plain function ([`check`]) over plain data. See `docs/cost.md`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use async_trait::async_trait;
use hame_core::{
    AgentState, BudgetExceeded, CallCtx, Layer, ModelNext, ModelRequest, ModelResponse,
    PromptCacheKey, Usage,
};
use hame_state::{StateKey, StateStore};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The key of the spend record in [`AgentState::extensions`].
pub const SPEND_EXTENSION: &str = "budget";

/// The [`RuntimeContext`](hame_core::RuntimeContext) extra holding a caller's own
/// [`Budgets`] (JSON) for one call: it can only tighten the agent's limits
/// ([`Budgets::tighten`]). `hame serve` sets it from a message's `budget` field.
pub const BUDGET_EXTRA: &str = "hame.budget";

/// The prompt cache key of a session: `hame-` and 16 hex digits of the SHA-256 of its
/// agent, user and session ids.
pub fn prompt_cache_key(key: &StateKey) -> PromptCacheKey {
    let mut h = Sha256::new();
    h.update(key.agent().as_bytes());
    h.update([0]);
    // The anonymous tenant and a user named "" cannot meet: ids are never empty.
    h.update(key.user().unwrap_or_default().as_bytes());
    h.update([0]);
    h.update(key.session().as_bytes());
    let digest = h.finalize();
    let mut out = String::from("hame-");
    for b in &digest[..8] {
        let _ = write!(out, "{b:02x}");
    }
    PromptCacheKey(out)
}

/// The price of a model in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Input tokens neither read from nor written to the cache.
    pub input: f64,
    /// Output tokens.
    pub output: f64,
    /// Input tokens read from the cache. Default: `input`.
    #[serde(default)]
    pub cached_input: Option<f64>,
    /// Input tokens written to the cache. Default: `input`.
    #[serde(default)]
    pub cache_write: Option<f64>,
}

impl Price {
    /// A price with cache reads and writes at their own rates.
    pub const fn new(input: f64, output: f64, cached_input: f64, cache_write: f64) -> Self {
        Self {
            input,
            output,
            cached_input: Some(cached_input),
            cache_write: Some(cache_write),
        }
    }

    /// What `usage` costs, in US dollars.
    pub fn cost(&self, u: &Usage) -> f64 {
        let cached = u.cached_input_tokens;
        let written = u.cache_write_input_tokens;
        let fresh = u
            .input_tokens
            .saturating_sub(cached.saturating_add(written));
        let per = |n: u64, rate: f64| n as f64 * rate / 1e6;
        per(fresh, self.input)
            + per(cached, self.cached_input.unwrap_or(self.input))
            + per(written, self.cache_write.unwrap_or(self.input))
            + per(u.output_tokens, self.output)
    }

    /// Whether every rate is a finite number at least 0.
    pub fn is_valid(&self) -> bool {
        [
            Some(self.input),
            Some(self.output),
            self.cached_input,
            self.cache_write,
        ]
        .into_iter()
        .flatten()
        .all(|r| r.is_finite() && r >= 0.0)
    }
}

/// The built-in price table (US dollars per million tokens: input, output, cache read,
/// cache write), by model-name prefix or `provider:` prefix; the longest prefix wins.
/// Published list prices as of 2026-12; override any entry with `[prices."<prefix>"]` in
/// `hame.toml`. Local `ollama:` models cost nothing.
pub const DEFAULT_PRICES: &[(&str, Price)] = &[
    ("claude-opus-4-5", Price::new(5.0, 25.0, 0.5, 6.25)),
    ("claude-opus-4", Price::new(15.0, 75.0, 1.5, 18.75)),
    ("claude-sonnet-4", Price::new(3.0, 15.0, 0.3, 3.75)),
    ("claude-3-7-sonnet", Price::new(3.0, 15.0, 0.3, 3.75)),
    ("claude-haiku-4-5", Price::new(1.0, 5.0, 0.1, 1.25)),
    ("claude-3-5-haiku", Price::new(0.8, 4.0, 0.08, 1.0)),
    ("gpt-5-nano", Price::new(0.05, 0.4, 0.005, 0.05)),
    ("gpt-5-mini", Price::new(0.25, 2.0, 0.025, 0.25)),
    ("gpt-5", Price::new(1.25, 10.0, 0.125, 1.25)),
    ("gpt-4.1-nano", Price::new(0.1, 0.4, 0.025, 0.1)),
    ("gpt-4.1-mini", Price::new(0.4, 1.6, 0.1, 0.4)),
    ("gpt-4.1", Price::new(2.0, 8.0, 0.5, 2.0)),
    ("gpt-4o-mini", Price::new(0.15, 0.6, 0.075, 0.15)),
    ("gpt-4o", Price::new(2.5, 10.0, 1.25, 2.5)),
    ("o4-mini", Price::new(1.1, 4.4, 0.275, 1.1)),
    ("o3", Price::new(2.0, 8.0, 0.5, 2.0)),
    ("ollama:", Price::new(0.0, 0.0, 0.0, 0.0)),
];

/// Prices by model prefix: [`DEFAULT_PRICES`] plus overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct Prices {
    entries: BTreeMap<String, Price>,
}

impl Default for Prices {
    fn default() -> Self {
        Self {
            entries: DEFAULT_PRICES
                .iter()
                .map(|(k, p)| ((*k).to_owned(), *p))
                .collect(),
        }
    }
}

impl Prices {
    /// A table with no entry at all.
    pub fn empty() -> Self {
        Self {
            entries: BTreeMap::new(),
        }
    }

    /// Adds or replaces the price of a prefix (`claude-sonnet-4`, `openai:gpt-4o`,
    /// `dashscope:`).
    pub fn with(mut self, prefix: impl Into<String>, price: Price) -> Self {
        self.entries.insert(prefix.into(), price);
        self
    }

    /// The price of `model` at `provider`: the entry with the longest prefix of
    /// `provider:model` or of `model`.
    pub fn get(&self, provider: &str, model: &str) -> Option<&Price> {
        let full = format!("{provider}:{model}");
        self.entries
            .iter()
            .filter(|(k, _)| full.starts_with(k.as_str()) || model.starts_with(k.as_str()))
            .max_by_key(|(k, _)| k.len())
            .map(|(_, p)| p)
    }
}

/// Limits of one scope; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    /// US dollars.
    pub usd: Option<f64>,
    /// Input plus output tokens.
    pub tokens: Option<u64>,
    /// Input tokens (cached ones included).
    pub input_tokens: Option<u64>,
    /// Output tokens.
    pub output_tokens: Option<u64>,
}

impl Limit {
    /// Whether no limit is set.
    pub fn is_unlimited(&self) -> bool {
        *self == Limit::default()
    }
}

/// Spending limits per run (one call), per session and per user per UTC day. Default: none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budgets {
    /// One call (a message or a resume, with every step it takes).
    #[serde(default)]
    pub run: Limit,
    /// A session over its life.
    #[serde(default)]
    pub session: Limit,
    /// A user (or the anonymous tenant) over one UTC day, all its sessions of this agent.
    #[serde(default)]
    pub user_day: Limit,
}

/// The scopes of a budget, as written in `--budget SCOPE.LIMIT=N`.
pub const BUDGET_SCOPES: [&str; 3] = ["run", "session", "user_day"];
/// The limits of a scope, as written in `--budget SCOPE.LIMIT=N`.
pub const BUDGET_LIMITS: [&str; 4] = ["usd", "tokens", "input_tokens", "output_tokens"];

impl Budgets {
    /// Whether no limit is set in any scope.
    pub fn is_unlimited(&self) -> bool {
        self.run.is_unlimited() && self.session.is_unlimited() && self.user_day.is_unlimited()
    }

    /// Whether a dollar limit is set in any scope.
    pub fn limits_usd(&self) -> bool {
        [self.run, self.session, self.user_day]
            .iter()
            .any(|l| l.usd.is_some())
    }

    /// Sets one limit from `SCOPE.LIMIT=N` (`run.usd=0.50`, `user_day.tokens=2000000`); a
    /// bare number is `run.usd`.
    ///
    /// # Errors
    /// One line naming what is wrong and the accepted spellings.
    pub fn set(&mut self, spec: &str) -> Result<(), String> {
        let (name, value) = match spec.split_once('=') {
            Some((n, v)) => (n.trim(), v.trim()),
            None => ("run.usd", spec.trim()),
        };
        let bad = || {
            format!(
                "budget {spec:?} is not SCOPE.LIMIT=N: SCOPE is one of {}, LIMIT one of {} \
                 (e.g. run.usd=0.50 or session.tokens=200000)",
                BUDGET_SCOPES.join(", "),
                BUDGET_LIMITS.join(", ")
            )
        };
        let (scope, limit) = name.split_once('.').ok_or_else(bad)?;
        let target = match scope {
            "run" => &mut self.run,
            "session" => &mut self.session,
            "user_day" => &mut self.user_day,
            _ => return Err(bad()),
        };
        if limit == "usd" {
            let v: f64 = value.parse().map_err(|_| bad())?;
            if !v.is_finite() || v < 0.0 {
                return Err(format!(
                    "budget {spec:?}: dollars must be a number at least 0"
                ));
            }
            target.usd = Some(v);
            return Ok(());
        }
        let v: u64 = value
            .replace('_', "")
            .parse()
            .map_err(|_| format!("budget {spec:?}: tokens must be a whole number at least 0"))?;
        match limit {
            "tokens" => target.tokens = Some(v),
            "input_tokens" => target.input_tokens = Some(v),
            "output_tokens" => target.output_tokens = Some(v),
            _ => return Err(bad()),
        }
        Ok(())
    }

    /// The stricter of this limit and `other`'s, limit by limit (a limit only one of them
    /// sets is kept): what a caller's own budget can do to the agent's.
    pub fn tighten(mut self, other: &Budgets) -> Budgets {
        fn min<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b < a { b } else { a }),
                (a, b) => a.or(b),
            }
        }
        for (mine, theirs) in [
            (&mut self.run, &other.run),
            (&mut self.session, &other.session),
            (&mut self.user_day, &other.user_day),
        ] {
            mine.usd = min(mine.usd, theirs.usd);
            mine.tokens = min(mine.tokens, theirs.tokens);
            mine.input_tokens = min(mine.input_tokens, theirs.input_tokens);
            mine.output_tokens = min(mine.output_tokens, theirs.output_tokens);
        }
        self
    }

    /// Whether every dollar limit is a number at least 0 (token limits are whole numbers
    /// by their type).
    pub fn is_valid(&self) -> bool {
        [self.run, self.session, self.user_day]
            .iter()
            .filter_map(|l| l.usd)
            .all(|v| v.is_finite() && v >= 0.0)
    }

    /// The budgets of a call: these, tightened by the caller's own in `extras`
    /// ([`BUDGET_EXTRA`]).
    ///
    /// # Errors
    /// One line when the extra is not a valid budget.
    pub fn for_call(
        &self,
        extras: &std::collections::BTreeMap<String, serde_json::Value>,
    ) -> Result<Budgets, String> {
        let Some(v) = extras.get(BUDGET_EXTRA) else {
            return Ok(*self);
        };
        let theirs: Budgets =
            serde_json::from_value(v.clone()).map_err(|e| format!("invalid budget: {e}"))?;
        if !theirs.is_valid() {
            return Err("invalid budget: dollars must be a number at least 0".into());
        }
        Ok(self.tighten(&theirs))
    }

    /// `other`'s limits where it sets one, else this one's.
    pub fn overlay(mut self, other: &Budgets) -> Budgets {
        for (mine, theirs) in [
            (&mut self.run, &other.run),
            (&mut self.session, &other.session),
            (&mut self.user_day, &other.user_day),
        ] {
            mine.usd = theirs.usd.or(mine.usd);
            mine.tokens = theirs.tokens.or(mine.tokens);
            mine.input_tokens = theirs.input_tokens.or(mine.input_tokens);
            mine.output_tokens = theirs.output_tokens.or(mine.output_tokens);
        }
        self
    }
}

/// Tokens, dollars and requests spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spend {
    /// Model requests.
    #[serde(default)]
    pub requests: u64,
    /// Tokens.
    #[serde(flatten)]
    pub usage: Usage,
    /// US dollars (requests to a model without a price count nothing here).
    #[serde(default)]
    pub usd: f64,
    /// Requests to a model the price table does not know.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unpriced: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Spend {
    /// Adds another spend.
    pub fn add(&mut self, other: &Spend) {
        self.requests += other.requests;
        self.usage.add(&other.usage);
        self.usd += other.usd;
        self.unpriced += other.unpriced;
    }
}

/// What a session spent, by UTC day (`YYYY-MM-DD`) and model (`provider:model`); kept in
/// the session state under [`SPEND_EXTENSION`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpendRecord {
    /// Day → model → spend.
    #[serde(default)]
    pub days: BTreeMap<String, BTreeMap<String, Spend>>,
}

impl SpendRecord {
    /// The record of a state (empty when it has none or it cannot be read).
    pub fn of(state: &AgentState) -> Self {
        state
            .extensions
            .get(SPEND_EXTENSION)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }

    /// Writes the record into a state.
    pub fn store(&self, state: &mut AgentState) {
        match serde_json::to_value(self) {
            Ok(v) => {
                state.extensions.insert(SPEND_EXTENSION.to_owned(), v);
            }
            Err(e) => tracing::warn!(error = %e, "recording the spend failed"),
        }
    }

    /// Everything, all days and models.
    pub fn total(&self) -> Spend {
        let mut t = Spend::default();
        self.days
            .values()
            .flat_map(|m| m.values())
            .for_each(|s| t.add(s));
        t
    }

    /// One day, all models.
    pub fn day(&self, day: &str) -> Spend {
        let mut t = Spend::default();
        if let Some(m) = self.days.get(day) {
            m.values().for_each(|s| t.add(s));
        }
        t
    }

    /// Adds one request's spend.
    pub fn add(&mut self, day: &str, model: &str, spend: &Spend) {
        self.days
            .entry(day.to_owned())
            .or_default()
            .entry(model.to_owned())
            .or_default()
            .add(spend);
    }
}

/// Today's UTC day as the record keys it.
pub fn today() -> String {
    day_of(chrono::Utc::now())
}

/// The UTC day of `time` as the record keys it (`YYYY-MM-DD`).
fn day_of(time: chrono::DateTime<chrono::Utc>) -> String {
    time.format("%Y-%m-%d").to_string()
}

/// The first limit that `spent` reached in a scope, if any.
fn reached(scope: &str, limit: &Limit, spent: &Spend) -> Option<BudgetExceeded> {
    let u = &spent.usage;
    let checks = [
        ("usd", limit.usd, spent.usd),
        ("tokens", limit.tokens.map(|t| t as f64), u.total() as f64),
        (
            "input_tokens",
            limit.input_tokens.map(|t| t as f64),
            u.input_tokens as f64,
        ),
        (
            "output_tokens",
            limit.output_tokens.map(|t| t as f64),
            u.output_tokens as f64,
        ),
    ];
    checks.into_iter().find_map(|(name, max, used)| {
        let max = max?;
        (used >= max).then(|| BudgetExceeded {
            scope: scope.to_owned(),
            limit: name.to_owned(),
            max,
            spent: used,
            usage: spent.usage,
            usd: spent.usd,
        })
    })
}

/// Whether another model request may be made: `None`, or the first limit reached (run,
/// then session, then user day). A limit is reached when what was spent is at least the
/// limit, so a limit of 0 allows no request and a run overshoots a limit by at most the
/// one request that crossed it.
pub fn check(
    budgets: &Budgets,
    run: &Spend,
    session: &Spend,
    user_day: &Spend,
) -> Option<BudgetExceeded> {
    reached("run", &budgets.run, run)
        .or_else(|| reached("session", &budgets.session, session))
        .or_else(|| reached("user_day", &budgets.user_day, user_day))
}

/// What a call has spent so far and what the user's other sessions spent today when it
/// began (in the call's extensions).
#[derive(Debug, Default)]
pub(crate) struct CallSpend {
    run: Mutex<Spend>,
    /// The requests made beside the loop's (compaction summaries, the memory flush), by
    /// day and model: saved with the call's state ([`CallSpend::save_side`]).
    side: Mutex<Vec<(String, String, Spend)>>,
    others_today: Spend,
    /// The call's budgets: the agent's, tightened by the caller's own.
    budgets: Budgets,
}

impl CallSpend {
    pub(crate) fn new(others_today: Spend, budgets: Budgets) -> Self {
        Self {
            run: Mutex::new(Spend::default()),
            side: Mutex::new(Vec::new()),
            others_today,
            budgets,
        }
    }

    /// Adds what the side requests of the call spent to `state`'s record (before the
    /// state is saved).
    pub(crate) fn save_side(&self, state: &mut AgentState) {
        let side = match self.side.lock() {
            Ok(mut s) => std::mem::take(&mut *s),
            Err(_) => return,
        };
        if side.is_empty() {
            return;
        }
        let mut record = SpendRecord::of(state);
        for (day, model, spend) in &side {
            record.add(day, model, spend);
        }
        record.store(state);
    }
}

tokio::task_local! {
    /// The spend of the call this task runs (set by the harness around the loop).
    static CALL_SPEND: std::sync::Arc<CallSpend>;
}

/// Runs `fut` (a call's loop) with `spend` as the call whose side requests
/// [`MeteredModel`] counts.
pub(crate) async fn metering<F: std::future::Future>(
    spend: std::sync::Arc<CallSpend>,
    fut: F,
) -> F::Output {
    CALL_SPEND.scope(spend, fut).await
}

/// The model of the requests made beside the loop's — compaction's summaries, the memory
/// flush before compaction, the daily log and `MEMORY.md` consolidation — which do not go
/// through the layer stack: each one's tokens and price are added to the running call's
/// spend (its run budget, and the session's record saved with its state). A request made
/// outside a call (the consolidation that runs after one returned) is priced in the log
/// only (`tracing`, target `hame_harness::cost`).
#[derive(Debug)]
pub struct MeteredModel {
    inner: std::sync::Arc<dyn hame_core::Model>,
    prices: Prices,
}

impl MeteredModel {
    /// Meters `inner` with `prices`.
    pub fn new(inner: std::sync::Arc<dyn hame_core::Model>, prices: Prices) -> Self {
        Self { inner, prices }
    }
}

#[async_trait]
impl hame_core::Model for MeteredModel {
    fn info(&self) -> hame_core::ModelInfo {
        self.inner.info()
    }

    async fn stream(
        &self,
        request: ModelRequest,
    ) -> Result<hame_core::ModelStream, hame_core::ModelError> {
        self.inner.stream(request).await
    }

    async fn complete(
        &self,
        request: ModelRequest,
    ) -> Result<ModelResponse, hame_core::ModelError> {
        let response = self.inner.complete(request).await?;
        let info = self.inner.info();
        let model = format!("{}:{}", info.provider, info.model);
        let price = self.prices.get(&info.provider, &info.model).copied();
        let usage = response.usage.unwrap_or_default();
        let spend = Spend {
            requests: 1,
            usage,
            usd: price.map_or(0.0, |p| p.cost(&usage)),
            unpriced: u64::from(price.is_none()),
        };
        let counted = CALL_SPEND.try_with(|c| {
            if let Ok(mut run) = c.run.lock() {
                run.add(&spend);
            }
            if let Ok(mut side) = c.side.lock() {
                side.push((today(), model.clone(), spend));
            }
        });
        if counted.is_err() {
            tracing::info!(model = %model, usd = spend.usd, input = usage.input_tokens,
                output = usage.output_tokens, "model request outside a call");
        }
        Ok(response)
    }
}

/// A saved session younger than this is always loaded again by a user-day check: its
/// `updated_at` may not yet tell two saves apart (a file's modification time moves in
/// clock ticks of a few milliseconds on some file systems; replicas' clocks differ).
pub const DAY_SPEND_SETTLED: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a user-day check uses what the user's other sessions had saved when it last
/// read them: at most one reading of a user's sessions per second per process, whatever
/// the number of calls.
pub const DAY_SPEND_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// Users whose sessions [`DaySpendCache`] keeps before it starts over.
const DAY_SPEND_USERS: usize = 10_000;

/// What a user's sessions spent on a day, as last read.
#[derive(Debug)]
struct Tally {
    day: String,
    /// When the last reading finished (`None`: none yet).
    read_at: Option<std::time::Instant>,
    /// When the reading in progress began; the others use the last reading meanwhile.
    reading_since: Option<std::time::Instant>,
    /// Session → what it spent on `day`.
    sessions: std::collections::HashMap<String, Entry>,
}

impl Tally {
    fn new(day: &str) -> Self {
        Self {
            day: day.to_owned(),
            read_at: None,
            reading_since: None,
            sessions: std::collections::HashMap::new(),
        }
    }
}

/// One session of a [`Tally`].
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Its `updated_at` when read (`MIN_UTC`: load it at the next reading).
    at: chrono::DateTime<chrono::Utc>,
    spend: Spend,
    /// When this process saved it, if it did since it was read.
    saved_at: Option<std::time::Instant>,
}

/// What users' sessions spent today, as [`others_on`] last read them. A user-day budget
/// counts the user's other sessions at every call; with the cache a process reads them at
/// most once per [`DAY_SPEND_REFRESH`] per user (one call reads, the others meanwhile use
/// the last reading), a reading loads only the sessions saved since the last one (or not
/// settled then, [`DAY_SPEND_SETTLED`]), and what this process saves counts at once
/// ([`saved`](Self::saved)), a reading in progress included.
#[derive(Debug)]
pub(crate) struct DaySpendCache {
    /// (agent, user) → the last reading.
    users: Mutex<std::collections::HashMap<(String, Option<String>), Tally>>,
    settled: std::time::Duration,
    refresh: std::time::Duration,
}

impl Default for DaySpendCache {
    fn default() -> Self {
        Self::new(DAY_SPEND_SETTLED, DAY_SPEND_REFRESH)
    }
}

/// A reading of a user's sessions in progress: one that does not finish (an error, a
/// cancelled call) lets the next call read again.
struct Reading<'a> {
    cache: &'a DaySpendCache,
    user: (String, Option<String>),
    started: std::time::Instant,
    done: bool,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if !self.done
            && let Ok(mut users) = self.cache.users.lock()
            && let Some(t) = users.get_mut(&self.user)
        {
            t.reading_since = None;
        }
    }
}

impl DaySpendCache {
    /// A cache that reuses a session saved at least `settled` ago, and a reading for
    /// `refresh`.
    pub(crate) fn new(settled: std::time::Duration, refresh: std::time::Duration) -> Self {
        Self {
            users: Mutex::default(),
            settled,
            refresh,
        }
    }

    fn user_of(key: &StateKey) -> (String, Option<String>) {
        (key.agent().to_owned(), key.user().map(str::to_owned))
    }

    /// `key`'s user's tally of `day` (a new one when it has none of that day).
    fn tally<'m>(
        users: &'m mut std::collections::HashMap<(String, Option<String>), Tally>,
        user: &(String, Option<String>),
        day: &str,
    ) -> &'m mut Tally {
        if users.len() >= DAY_SPEND_USERS && !users.contains_key(user) {
            users.clear();
        }
        let t = users.entry(user.clone()).or_insert_with(|| Tally::new(day));
        if t.day != day {
            *t = Tally::new(day);
        }
        t
    }

    /// The other sessions' spend from a recent reading, or the reading the caller is to
    /// make (`None` when the cache cannot be used).
    fn recent(&self, key: &StateKey, day: &str) -> Result<Spend, Option<Reading<'_>>> {
        let Ok(mut users) = self.users.lock() else {
            return Err(None);
        };
        let user = Self::user_of(key);
        let t = Self::tally(&mut users, &user, day);
        // A reading in progress for too long (its call stuck) does not hold the others.
        let in_progress = t
            .reading_since
            .is_some_and(|since| since.elapsed() < self.refresh * 10);
        if let Some(read_at) = t.read_at
            && (read_at.elapsed() < self.refresh || in_progress)
        {
            let mut total = Spend::default();
            t.sessions
                .iter()
                .filter(|(s, _)| s.as_str() != key.session())
                .for_each(|(_, e)| total.add(&e.spend));
            return Ok(total);
        }
        let started = std::time::Instant::now();
        t.reading_since = Some(started);
        Err(Some(Reading {
            cache: self,
            user,
            started,
            done: false,
        }))
    }

    /// Records what `key`'s session spent today (`spend` of the day) as this process has
    /// just saved it: the calls of this process count it from now on, without waiting for
    /// the next reading (which loads it again). Nothing is done for a user no call of
    /// this process has read.
    pub(crate) fn saved(&self, key: &StateKey, spend: impl FnOnce(&str) -> Spend) {
        if let Ok(mut users) = self.users.lock()
            && let Some(t) = users.get_mut(&Self::user_of(key))
        {
            let day = today();
            if t.day == day {
                t.sessions.insert(
                    key.session().to_owned(),
                    Entry {
                        at: chrono::DateTime::<chrono::Utc>::MIN_UTC,
                        spend: spend(&day),
                        saved_at: Some(std::time::Instant::now()),
                    },
                );
            }
        }
    }

    /// What a session spent when last read, if it has not been saved since.
    fn unchanged(
        &self,
        key: &StateKey,
        s: &hame_state::SessionSummary,
        day: &str,
    ) -> Option<Spend> {
        let users = self.users.lock().ok()?;
        let t = users.get(&Self::user_of(key))?;
        let e = t.sessions.get(&s.session)?;
        (t.day == day && e.at == s.updated_at).then_some(e.spend)
    }

    /// Records a reading: every session listed, with what it spent (sessions saved less
    /// than `settled` ago are kept with no time, so that they are loaded again), except
    /// those this process saved after the reading began: what it saved is newer.
    fn finish(
        &self,
        mut reading: Reading<'_>,
        day: &str,
        read: Vec<(hame_state::SessionSummary, Spend)>,
    ) {
        reading.done = true;
        let settled =
            chrono::Utc::now() - chrono::Duration::from_std(self.settled).unwrap_or_default();
        let Ok(mut users) = self.users.lock() else {
            return;
        };
        let t = Self::tally(&mut users, &reading.user, day);
        let mut sessions: std::collections::HashMap<String, Entry> = read
            .into_iter()
            .map(|(s, spend)| {
                let at = if s.updated_at <= settled {
                    s.updated_at
                } else {
                    chrono::DateTime::<chrono::Utc>::MIN_UTC
                };
                let entry = Entry {
                    at,
                    spend,
                    saved_at: None,
                };
                (s.session, entry)
            })
            .collect();
        for (session, e) in &t.sessions {
            if e.saved_at.is_some_and(|at| at >= reading.started) {
                sessions.insert(session.clone(), *e);
            }
        }
        t.sessions = sessions;
        t.read_at = Some(std::time::Instant::now());
        t.reading_since = None;
    }
}

/// What the other sessions of `key`'s agent and user spent on `day`, as saved (sessions not
/// saved since `day` began are not read). With a `cache`, as it last read them (see
/// [`DaySpendCache`]).
pub(crate) async fn others_on(
    store: &dyn StateStore,
    key: &StateKey,
    day: &str,
    cache: Option<&DaySpendCache>,
) -> Result<Spend, hame_state::Error> {
    let reading = match cache.map(|c| c.recent(key, day)) {
        Some(Ok(spend)) => return Ok(spend),
        Some(Err(reading)) => reading,
        None => None,
    };
    let mut total = Spend::default();
    let mut read = Vec::new();
    for s in store.list_sessions(key.agent(), key.user()).await? {
        if day_of(s.updated_at).as_str() < day {
            continue;
        }
        let spend = match cache.and_then(|c| c.unchanged(key, &s, day)) {
            Some(spend) => spend,
            // This session's own record is the caller's; it is read for the others.
            None if s.session == key.session() && reading.is_none() => continue,
            None => {
                let other = StateKey::new(key.agent(), key.user(), &s.session)?;
                match store.load(&other).await? {
                    Some(stored) => SpendRecord::of(&stored.state).day(day),
                    None => continue,
                }
            }
        };
        if s.session != key.session() {
            total.add(&spend);
        }
        read.push((s, spend));
    }
    if let (Some(c), Some(reading)) = (cache, reading) {
        c.finish(reading, day, read);
    }
    Ok(total)
}

/// What one session spent on one model (`hame usage`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionSpend {
    /// The session id.
    pub session: String,
    /// `provider:model`.
    pub model: String,
    /// What was spent.
    #[serde(flatten)]
    pub spend: Spend,
}

/// What the sessions of an agent and user (`None`: the anonymous tenant) spent, by session
/// and model, on days from `since` (`YYYY-MM-DD`, UTC; `None`: all), as saved.
pub async fn spend_by_session(
    store: &dyn StateStore,
    agent: &str,
    user: Option<&str>,
    since: Option<&str>,
) -> Result<Vec<SessionSpend>, hame_state::Error> {
    let mut out = Vec::new();
    for s in store.list_sessions(agent, user).await? {
        if since.is_some_and(|d| day_of(s.updated_at).as_str() < d) {
            continue;
        }
        let key = StateKey::new(agent, user, &s.session)?;
        let Some(stored) = store.load(&key).await? else {
            continue;
        };
        let mut by_model: BTreeMap<String, Spend> = BTreeMap::new();
        let record = SpendRecord::of(&stored.state);
        for (day, models) in &record.days {
            if since.is_some_and(|d| day.as_str() < d) {
                continue;
            }
            for (model, spend) in models {
                by_model.entry(model.clone()).or_default().add(spend);
            }
        }
        out.extend(by_model.into_iter().map(|(model, spend)| SessionSpend {
            session: s.session.clone(),
            model,
            spend,
        }));
    }
    Ok(out)
}

/// Records every model request's spend in the session state and refuses a request once a
/// budget is reached (innermost layer: it sees each request as sent, retries included).
#[derive(Debug)]
pub struct BudgetLayer {
    budgets: Budgets,
    prices: Prices,
}

impl BudgetLayer {
    /// A layer with these limits and prices.
    pub fn new(budgets: Budgets, prices: Prices) -> Self {
        Self { budgets, prices }
    }

    /// The limits.
    pub fn budgets(&self) -> &Budgets {
        &self.budgets
    }
}

#[async_trait]
impl Layer for BudgetLayer {
    fn name(&self) -> &str {
        "budget"
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        request: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse, hame_core::Error> {
        let info = next.model_info();
        let model = format!("{}:{}", info.provider, info.model);
        let price = self.prices.get(&info.provider, &info.model).copied();
        let call = cx.extensions.get::<CallSpend>();
        let budgets = call.map_or(&self.budgets, |c| &c.budgets);
        if price.is_none() && budgets.limits_usd() {
            return Err(hame_core::Error::layer(
                "budget",
                format!(
                    "no price for model `{model}` and a dollar budget is set: add \
                     [prices.\"{model}\"] with input and output (USD per million tokens) \
                     to hame.toml"
                ),
            ));
        }
        let day = today();
        if !budgets.is_unlimited() {
            let run = call
                .and_then(|c| c.run.lock().ok().map(|r| *r))
                .unwrap_or_default();
            let record = SpendRecord::of(cx.state);
            let mut user_day = record.day(&day);
            if let Some(c) = call {
                user_day.add(&c.others_today);
            }
            if let Some(over) = check(budgets, &run, &record.total(), &user_day) {
                tracing::info!(scope = %over.scope, limit = %over.limit, spent = over.spent,
                    max = over.max, "budget exceeded; no further model request");
                return Err(hame_core::Error::BudgetExceeded(over));
            }
        }
        let response = next.run(cx, request).await?;
        let usage = response.usage.unwrap_or_default();
        let spend = Spend {
            requests: 1,
            usage,
            usd: price.map_or(0.0, |p| p.cost(&usage)),
            unpriced: u64::from(price.is_none()),
        };
        let mut record = SpendRecord::of(cx.state);
        record.add(&day, &model, &spend);
        record.store(cx.state);
        if let Some(c) = call
            && let Ok(mut run) = c.run.lock()
        {
            run.add(&spend);
        }
        Ok(response)
    }
}

#[cfg(test)]
#[path = "cost_tests.rs"]
mod tests;
