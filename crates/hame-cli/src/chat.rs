//! `hame chat`: an interactive session.
//!
//! On a terminal, input is read with `rustyline` (line editing, history in
//! `<state home>/chat_history`, ADR 0013); from a pipe, line by line. A trailing `\`
//! continues the message on the next line. Lines starting with `/` are commands, never sent
//! to the model (`/help`). Ctrl-C during a turn cancels the turn (what joined the
//! conversation is saved); at the prompt it clears the line, and a second one on an empty
//! prompt exits; Ctrl-D exits.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use hame::{CallInput, Message, Model, ModelError, ModelInfo, ModelRequest, ModelStream};

use crate::common::Common;
use crate::signals::Signals;

const HELP: &str = "\
commands (never sent to the model):
  /help            this list
  /exit, /quit     leave (Ctrl-D does too)
  /new [ID]        start a new session (default id chat-<unix time>)
  /sessions        the sessions of this agent and user (* = current)
  /usage           the tokens of this session: input (cached), output
  /context         what the next request holds: messages by role, estimated tokens
  /compact         compact the conversation before the next message
  /model [SPEC]    show the model, or switch to SPEC (provider:model) for the next turns
input: a line ending with \\ continues on the next line; Ctrl-C cancels a running turn.";

/// What one read of the terminal gave.
#[derive(Debug)]
pub(crate) enum Input {
    Line(String),
    /// Ctrl-C at the prompt (terminal only).
    Interrupted,
    Eof,
}

/// Reads lines on a blocking thread (the runtime's workers never block on a terminal):
/// with rustyline on a terminal, else from stdin line by line with the prompt on stderr.
pub(crate) struct LineReader {
    prompts: std::sync::mpsc::Sender<String>,
    lines: tokio::sync::mpsc::Receiver<std::io::Result<Input>>,
}

impl LineReader {
    /// Starts the reader; `history` is the history file of the terminal editor.
    pub(crate) fn start(history: Option<PathBuf>) -> Self {
        let (prompts, prompt_rx) = std::sync::mpsc::channel::<String>();
        let (tx, lines) = tokio::sync::mpsc::channel(1);
        std::thread::spawn(move || {
            let editor = if std::io::stdin().is_terminal() {
                editor(history.as_ref())
            } else {
                None
            };
            match editor {
                Some(mut ed) => {
                    while let Ok(prompt) = prompt_rx.recv() {
                        let r = match ed.readline(&prompt) {
                            Ok(line) => {
                                if !line.trim().is_empty() {
                                    let _ = ed.add_history_entry(line.as_str());
                                    if let Some(h) = &history
                                        && let Err(e) = ed.append_history(h)
                                    {
                                        tracing::debug!(error = %e, "chat history not saved");
                                    }
                                }
                                Ok(Input::Line(line))
                            }
                            Err(rustyline::error::ReadlineError::Interrupted) => {
                                Ok(Input::Interrupted)
                            }
                            Err(rustyline::error::ReadlineError::Eof) => Ok(Input::Eof),
                            Err(rustyline::error::ReadlineError::Io(e)) => Err(e),
                            Err(e) => Err(std::io::Error::other(e.to_string())),
                        };
                        let end = matches!(r, Ok(Input::Eof) | Err(_));
                        if tx.blocking_send(r).is_err() || end {
                            return;
                        }
                    }
                }
                None => {
                    use std::io::{BufRead, Write};
                    let stdin = std::io::stdin();
                    while let Ok(prompt) = prompt_rx.recv() {
                        eprint!("{prompt}");
                        let _ = std::io::stderr().flush();
                        let mut line = String::new();
                        let r = match stdin.lock().read_line(&mut line) {
                            Ok(0) => Ok(Input::Eof),
                            Ok(_) => {
                                let trimmed = line.strip_suffix('\n').unwrap_or(&line);
                                let trimmed = trimmed.strip_suffix('\r').unwrap_or(trimmed);
                                Ok(Input::Line(trimmed.to_owned()))
                            }
                            Err(e) => Err(e),
                        };
                        let end = matches!(r, Ok(Input::Eof) | Err(_));
                        if tx.blocking_send(r).is_err() || end {
                            return;
                        }
                    }
                }
            }
        });
        Self { prompts, lines }
    }

    /// One line, read after showing `prompt`.
    pub(crate) async fn read(&mut self, prompt: &str) -> std::io::Result<Input> {
        if self.prompts.send(prompt.to_owned()).is_err() {
            return Ok(Input::Eof);
        }
        match self.lines.recv().await {
            Some(r) => r,
            None => Ok(Input::Eof),
        }
    }
}

fn editor(history: Option<&PathBuf>) -> Option<rustyline::DefaultEditor> {
    let config = rustyline::Config::builder()
        .behavior(rustyline::Behavior::PreferTerm)
        .auto_add_history(false)
        .max_history_size(1000)
        .ok()?
        .build();
    match rustyline::DefaultEditor::with_config(config) {
        Ok(mut ed) => {
            if let Some(h) = history {
                if let Some(dir) = h.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                let _ = ed.load_history(h);
            }
            Some(ed)
        }
        Err(e) => {
            tracing::debug!(error = %e, "no line editor; reading plain lines");
            None
        }
    }
}

/// A model that can be switched between turns (`/model SPEC`).
#[derive(Debug)]
pub(crate) struct SwitchModel(RwLock<Arc<dyn Model>>);

impl SwitchModel {
    pub(crate) fn new(model: Arc<dyn Model>) -> Self {
        Self(RwLock::new(model))
    }

    fn current(&self) -> Arc<dyn Model> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set(&self, model: Arc<dyn Model>) {
        match self.0.write() {
            Ok(mut g) => *g = model,
            Err(p) => *p.into_inner() = model,
        }
    }
}

#[async_trait::async_trait]
impl Model for SwitchModel {
    fn info(&self) -> ModelInfo {
        self.current().info()
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        self.current().stream(request).await
    }
}

/// Bold/dim text on a terminal, plain otherwise.
pub(crate) fn dim(s: &str) -> String {
    if std::io::stderr().is_terminal() {
        format!("\x1b[2m{s}\x1b[0m")
    } else {
        s.to_owned()
    }
}

fn bold(s: &str) -> String {
    if std::io::stderr().is_terminal() {
        format!("\x1b[1m{s}\x1b[0m")
    } else {
        s.to_owned()
    }
}

/// Reads one message: continuation lines while a line ends with `\`. `None`: leave.
async fn read_message(
    reader: &mut LineReader,
    interrupted: &mut bool,
) -> anyhow::Result<Option<String>> {
    let mut text = String::new();
    let mut prompt = "> ";
    loop {
        match reader.read(prompt).await? {
            Input::Eof => {
                // Ctrl-D: leave on a fresh line.
                eprintln!();
                return Ok(None);
            }
            Input::Interrupted => {
                if text.is_empty() && *interrupted {
                    return Ok(None);
                }
                *interrupted = true;
                eprintln!("{}", dim("(Ctrl-C again or Ctrl-D to exit)"));
                text.clear();
                prompt = "> ";
            }
            Input::Line(line) => {
                *interrupted = false;
                match line.strip_suffix('\\') {
                    Some(head) => {
                        text.push_str(head);
                        text.push('\n');
                        prompt = ". ";
                    }
                    None => {
                        text.push_str(&line);
                        return Ok(Some(text));
                    }
                }
            }
        }
    }
}

/// The state home (for the history file): `$HAME_STATE_HOME`, else `~/.hame/state`.
fn history_file() -> Option<PathBuf> {
    let home = crate::common::env(hame::harness::STATE_HOME_ENV)
        .map(PathBuf::from)
        .or_else(|| crate::common::env("HOME").map(|h| PathBuf::from(h).join(".hame/state")))?;
    Some(home.join("chat_history"))
}

/// `hame chat`.
pub(crate) async fn chat(common: Common, pick: crate::resume::SessionPick) -> anyhow::Result<()> {
    let signals = Signals::watch();
    // The environment as it is before the credentials are scrubbed (for `/model`).
    let snapshot: HashMap<String, String> = std::env::vars().collect();
    let history = history_file();
    let config = crate::config::resolve(&common)?;
    let switch: Arc<SwitchModel> = Arc::new(SwitchModel::new(Arc::new(crate::common::NoModel)));
    let hook = {
        let switch = switch.clone();
        move |m: Arc<dyn Model>| -> Arc<dyn Model> {
            switch.set(m);
            switch
        }
    };
    let (agent, mut ctx) = crate::common::build_with(&common, true, Some(Box::new(hook))).await?;
    crate::resume::apply(&pick, &agent, &mut ctx).await?;
    let info = switch.info();
    eprintln!(
        "{} · agent {} · workspace {} · model {}:{} · session {}",
        bold("hame chat"),
        agent.name(),
        agent.workspace().display(),
        info.provider,
        info.model,
        ctx.session_id
    );
    eprintln!(
        "{}",
        dim("/help for commands · a trailing \\ continues the line · Ctrl-D exits")
    );
    let mut reader = LineReader::start(history);
    let mut interrupted = false;
    let mut compact_next = false;
    // The usage of the last model request answered in this chat (what the context held).
    let mut last_request: Option<hame::Usage> = None;
    loop {
        let Some(line) = read_message(&mut reader, &mut interrupted).await? else {
            return crate::run::finish(&agent).await;
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if let Some(cmd) = command_of(text) {
            let (name, arg) = cmd;
            match name {
                "exit" | "quit" => return crate::run::finish(&agent).await,
                "help" => eprintln!("{HELP}"),
                "new" => {
                    let id = match arg {
                        Some(id) => id.to_owned(),
                        None => format!(
                            "chat-{}",
                            std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .map(|d| d.as_secs())
                                .unwrap_or_default()
                        ),
                    };
                    match hame::harness::validate_id("session id", &id) {
                        Ok(()) => {
                            ctx.session_id = id;
                            eprintln!("new session {}", ctx.session_id);
                        }
                        Err(e) => eprintln!("hame: {e}"),
                    }
                }
                "sessions" => match agent.sessions(&ctx).await {
                    Ok(entries) if entries.is_empty() => eprintln!("no sessions yet"),
                    Ok(entries) => {
                        for e in entries {
                            let mark = if e.id == ctx.session_id { "*" } else { " " };
                            eprintln!(
                                "{mark} {}  {}  {} messages  {}",
                                e.id,
                                e.updated.format("%Y-%m-%d %H:%M"),
                                e.message_count,
                                e.title
                            );
                        }
                    }
                    Err(e) => eprintln!("hame: {e}"),
                },
                "usage" => match agent.state(&ctx).await {
                    Ok(state) => eprintln!(
                        "{}",
                        usage_text(&ctx.session_id, &state.unwrap_or_default().usage)
                    ),
                    Err(e) => eprintln!("hame: {e}"),
                },
                "context" => match agent.state(&ctx).await {
                    Ok(state) => eprintln!(
                        "{}",
                        context_text(
                            &ctx.session_id,
                            &state.unwrap_or_default(),
                            &switch.info(),
                            last_request.as_ref()
                        )
                    ),
                    Err(e) => eprintln!("hame: {e}"),
                },
                "compact" => {
                    compact_next = true;
                    eprintln!("the conversation is compacted before the next message");
                }
                "model" => match arg {
                    None => {
                        let i = switch.info();
                        eprintln!("model {}:{}", i.provider, i.model);
                    }
                    Some(spec) => {
                        let lookup = model_lookup(&snapshot, &config, spec);
                        match hame::model::open(spec, &lookup) {
                            Ok(m) => {
                                switch.set(m);
                                eprintln!("model {spec} for the next turns");
                            }
                            Err(e) => eprintln!("hame: {e}"),
                        }
                    }
                },
                other => eprintln!("unknown command /{other}; /help lists the commands"),
            }
            continue;
        }
        let mut turn_ctx = ctx.clone();
        if std::mem::take(&mut compact_next) {
            turn_ctx =
                turn_ctx.with_extra(hame::memory::COMPACT_NOW_EXTRA, serde_json::json!(true));
        }
        // Ctrl-C during a turn cancels the turn and comes back to the prompt.
        let cancel = signals.begin();
        let events = agent.stream_with(CallInput::Message(Message::user(text)), &turn_ctx, cancel);
        let turn = crate::run::show_events(events).await?;
        last_request = turn.last_request.or(last_request);
        crate::approve::inline(&agent, &turn_ctx, &mut reader, turn.suspended, &signals).await?;
        if signals.end().is_some() {
            eprintln!("(turn cancelled; the conversation so far is saved)");
        }
    }
}

/// A number with thousands separators: `12,345`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `/usage`: the session's tokens as summed in its state (every call, every process).
fn usage_text(session: &str, u: &hame::Usage) -> String {
    format!(
        "session {session}: {} input tokens ({} cached), {} output tokens, {} in all \
         (cached: prompt tokens the provider served from its cache, when it reports them)",
        thousands(u.input_tokens),
        thousands(u.cached_input_tokens),
        thousands(u.output_tokens),
        thousands(u.total())
    )
}

/// `/context`: what the next request holds besides the system prompt (rebuilt from the
/// workspace before every step): the conversation by role with its estimated tokens, and
/// the input tokens the provider counted for the last request of this chat.
fn context_text(
    session: &str,
    state: &hame::AgentState,
    model: &hame::ModelInfo,
    last: Option<&hame::Usage>,
) -> String {
    let count = |role: hame::Role| state.messages.iter().filter(|m| m.role == role).count();
    let counter = hame::memory::counter_for_model(&model.model);
    let tokens = hame::memory::tokens::messages_tokens(counter.as_ref(), &state.messages);
    let mut text = format!(
        "session {session}: {} messages ({} user, {} assistant, {} tool results), ~{} tokens \
         estimated, of a {} token window ({}:{})\n\
         system prompt: rebuilt before every step from the workspace (AGENTS.md, knowledge/, \
         skills, MEMORY.md, the todo list, plan mode)",
        state.messages.len(),
        count(hame::Role::User),
        count(hame::Role::Assistant),
        count(hame::Role::Tool),
        thousands(tokens),
        thousands(model.context_window),
        model.provider,
        model.model,
    );
    if let Some(u) = last {
        text.push_str(&format!(
            "\nlast request: {} input tokens ({} cached) as the provider counted them: system prompt, tool schemas and conversation",
            thousands(u.input_tokens),
            thousands(u.cached_input_tokens)
        ));
    }
    if state.pending.is_some() {
        text.push_str("\na tool call waits for a decision (hame approve / hame deny)");
    }
    text
}

/// `/name [arg]` when `text` is a chat command: a slash and letters (a path such as
/// `/etc/hosts …` is a message).
fn command_of(text: &str) -> Option<(&str, Option<&str>)> {
    let rest = text.strip_prefix('/')?;
    let (name, arg) = match rest.split_once(char::is_whitespace) {
        Some((n, a)) => (n, Some(a.trim()).filter(|a| !a.is_empty())),
        None => (rest, None),
    };
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphabetic())).then_some((name, arg))
}

/// The environment lookup for `/model SPEC`: the environment before it was scrubbed, and
/// the configured base URL when it was given for that provider (flag or file).
fn model_lookup(
    snapshot: &HashMap<String, String>,
    config: &crate::config::Effective,
    spec: &str,
) -> impl Fn(&str) -> Option<String> + use<> {
    let snapshot = snapshot.clone();
    let var = spec
        .split(':')
        .next()
        .map(|p| format!("{}_BASE_URL", p.to_ascii_uppercase()));
    let same_provider = var.is_some() && var == config.base_url_var();
    let url = config.base_url.value.clone().filter(|_| same_provider);
    let timeouts = config.model_timeouts();
    move |k: &str| {
        if let Some((_, v)) = timeouts.iter().find(|(t, _)| *t == k) {
            return Some(v.clone());
        }
        if let Some(v) = snapshot.get(k).filter(|v| !v.trim().is_empty()) {
            return Some(v.clone());
        }
        match (&var, &url) {
            (Some(var), Some(url)) if var == k => Some(url.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{command_of, thousands};

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn commands_and_paths() {
        assert_eq!(command_of("/help"), Some(("help", None)));
        assert_eq!(
            command_of("/model  openai:x "),
            Some(("model", Some("openai:x")))
        );
        assert_eq!(command_of("/etc/hosts has what?"), None);
        assert_eq!(command_of("hello"), None);
        assert_eq!(command_of("/"), None);
    }
}
