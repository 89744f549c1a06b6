//! Keeping configured secrets out of every text hame stores, sends to a model or shows to
//! an API caller (ADR 0023).
//!
//! A provider's error can echo the key it refused (`Incorrect API key provided: sk-…`), an
//! MCP server's error can repeat the header it was sent, a tool can read a `.env` file.
//! Such text travels: into the session log, the state, the next model request, an HTTP
//! body. So the values that are secret are *registered* once, where they are configured,
//! and every text is *redacted* where it leaves:
//!
//! - **registered by** the model clients (their key, the `Authorization` value they send,
//!   the password of their base URL, with its basic-auth form), the `${VAR}` substitution
//!   of `tools.json` (values put into `headers`, into `env` entries with secret-looking
//!   names, or read from variables with secret-looking names), and the CLI (the secret
//!   variables of its environment — [`is_secret_name`] — and the passwords of the store
//!   URLs it was given);
//! - **redacted by** the loop, for every message joining a conversation (so the log, the
//!   state and every later model request get the redacted text) and for the note and the
//!   event of a failed call; by the model clients, for the provider's error text as soon as
//!   it is read; by the gateway, for every error body and event it sends; by the CLI, for
//!   the error it prints.
//!
//! A secret value is replaced by [`REDACTED`] wherever it appears, as written and
//! percent-encoded. Values shorter than [`MIN_SECRET_LEN`] bytes, and values of letters only
//! shorter than [`MIN_WORD_SECRET_LEN`] ([`is_secret_value`]), are not registered: they
//! would shred ordinary text (`8080`, `scripted`) and are no secret worth the name.
//!
//! **Endpoints** (the base URLs of the model providers) are no secret for the operator —
//! the CLI names them in its errors — but API callers and the conversation do not see
//! them: [`redact_for_callers`] also replaces them by [`ENDPOINT`].
//!
//! The registry is one per process ([`add_secret`], [`redact`], …): secrets are a property
//! of the process's configuration, text leaves through many crates, and a value registered
//! by one agent of a process is no less secret for another. Registration only adds (a
//! process that sees a value once keeps hiding it); [`Redactor`] is the same set as a plain
//! value, for tests and for callers that want their own.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, LazyLock, RwLock};

use crate::message::{ContentBlock, Message};

/// What a secret value is replaced by.
pub const REDACTED: &str = "[REDACTED]";

/// What an endpoint is replaced by in text shown to API callers ([`redact_for_callers`]).
pub const ENDPOINT: &str = "[model endpoint]";

/// Values shorter than this (in bytes, after trimming) are not registered as secrets.
pub const MIN_SECRET_LEN: usize = 8;

/// Values of ASCII letters only shorter than this are not registered either: they read
/// like words (`scripted`, `password`), and cutting a word out of every text shreds it.
pub const MIN_WORD_SECRET_LEN: usize = 16;

/// Whether `value` (trimmed) is worth hiding: at least [`MIN_SECRET_LEN`] bytes, and at
/// least [`MIN_WORD_SECRET_LEN`] when it is only ASCII letters. Real keys and tokens have
/// digits or punctuation; a value that could be a word is left alone.
pub fn is_secret_value(value: &str) -> bool {
    let v = value.trim();
    v.len() >= MIN_SECRET_LEN
        && (v.len() >= MIN_WORD_SECRET_LEN || !v.bytes().all(|b| b.is_ascii_alphabetic()))
}

/// Name fragments (upper case) of environment variables whose values are secret.
const SECRET_NAME_PARTS: &[&str] = &["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL"];

/// More fragments (upper case) that mark a URL query parameter as secret (`sig=`, `auth=`).
const SECRET_PARAM_PARTS: &[&str] = &["SIG", "AUTH"];

/// Whether a variable named `name` holds a secret: `AWS_*`, or a name containing `KEY`,
/// `TOKEN`, `SECRET`, `PASSWORD`, `PASSWD` or `CREDENTIAL` (any case).
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("AWS_") || SECRET_NAME_PARTS.iter().any(|p| upper.contains(p))
}

/// Whether a URL query parameter named `name` holds a secret: [`is_secret_name`], or a
/// name containing `sig` or `auth`.
pub fn is_secret_param(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    is_secret_name(name) || SECRET_PARAM_PARTS.iter().any(|p| upper.contains(p))
}

/// Where the password of `scheme://user:password@host…` stands in `url` (as written,
/// percent-encoded or not).
fn password_span(url: &str) -> Option<Range<usize>> {
    let start = url.find("://")? + 3;
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let at = authority.rfind('@')?;
    let colon = authority[..at].find(':')?;
    (colon + 1 < at).then(|| start + colon + 1..start + at)
}

/// The user and password of `scheme://user:password@host…`, as written.
fn user_info(url: &str) -> Option<(&str, &str)> {
    let span = password_span(url)?;
    let start = url.find("://")? + 3;
    let user = &url[start..span.start - 1];
    Some((user, &url[span]))
}

/// The password of a URL's `user:password@` part, as written (`None` without one).
pub fn url_password(url: &str) -> Option<&str> {
    password_span(url).map(|span| &url[span])
}

/// `url` with its password (if any) replaced by `***`, fit for logs and messages:
/// `postgres://app:s3cret@db/x` becomes `postgres://app:***@db/x`.
pub fn redact_url(url: &str) -> String {
    match password_span(url) {
        Some(span) => format!("{}***{}", &url[..span.start], &url[span.end..]),
        None => url.to_owned(),
    }
}

/// Decodes `%XX` escapes; anything malformed stays as it is.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `s` with every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`) as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Standard Base64 with padding (what `Authorization: Basic` carries).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A set of secret values and endpoints, and the redaction of text by them. Pure: no I/O,
/// no global state (the process's registry is one of these; see the module docs).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    /// Longest first, so a value that contains another is replaced whole.
    secrets: Vec<String>,
    /// Longest first.
    endpoints: Vec<String>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets.len())
            .field("endpoints", &self.endpoints.len())
            .finish()
    }
}

fn insert_longest_first(list: &mut Vec<String>, value: &str) -> bool {
    if list.iter().any(|v| v == value) {
        return false;
    }
    let at = list
        .iter()
        .position(|v| v.len() < value.len())
        .unwrap_or(list.len());
    list.insert(at, value.to_owned());
    true
}

fn replace_all<'a>(text: Cow<'a, str>, patterns: &[String], with: &str) -> Cow<'a, str> {
    let mut text = text;
    for p in patterns {
        if text.contains(p.as_str()) {
            text = Cow::Owned(text.replace(p.as_str(), with));
        }
    }
    text
}

impl Redactor {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty() && self.endpoints.is_empty()
    }

    /// Registers a secret value, as written and percent-encoded. A value that is not
    /// worth hiding ([`is_secret_value`]: too short, or a short word) is ignored. Returns
    /// whether the set changed.
    pub fn add_secret(&mut self, value: &str) -> bool {
        let value = value.trim();
        if !is_secret_value(value) {
            return false;
        }
        let mut changed = insert_longest_first(&mut self.secrets, value);
        let encoded = percent_encode(value);
        if encoded != value {
            changed |= insert_longest_first(&mut self.secrets, &encoded);
        }
        changed
    }

    /// Registers the value of an `Authorization`-style header: the whole value and the
    /// credential after its scheme (`Bearer <token>`, `Basic <base64>`).
    pub fn add_authorization(&mut self, value: &str) -> bool {
        let mut changed = self.add_secret(value);
        if let Some((_, credential)) = value.trim().split_once(' ') {
            changed |= self.add_secret(credential);
        }
        changed
    }

    /// Registers the credentials of a URL: the password of `user:password@` (as written
    /// and percent-decoded) with its basic-auth form (Base64 of `user:password`), and the
    /// values of query parameters whose names look secret ([`is_secret_param`]).
    pub fn add_url(&mut self, url: &str) -> bool {
        let mut changed = false;
        if let Some((user, password)) = user_info(url) {
            changed |= self.add_secret(password);
            let (user, password) = (percent_decode(user), percent_decode(password));
            changed |= self.add_secret(&password);
            changed |= self.add_secret(&base64(format!("{user}:{password}").as_bytes()));
        }
        let query = url
            .split_once('?')
            .map(|(_, q)| q.split('#').next().unwrap_or_default());
        for pair in query.unwrap_or_default().split('&') {
            if let Some((name, value)) = pair.split_once('=')
                && is_secret_param(&percent_decode(name))
            {
                changed |= self.add_secret(value);
                changed |= self.add_secret(&percent_decode(value));
            }
        }
        changed
    }

    /// Registers an endpoint (a provider's base URL, without credentials): hidden from API
    /// callers ([`Redactor::redact_for_callers`]), not from the operator. A trailing `/` is
    /// ignored; values shorter than [`MIN_SECRET_LEN`] are.
    pub fn add_endpoint(&mut self, url: &str) -> bool {
        let url = url.trim().trim_end_matches('/');
        url.len() >= MIN_SECRET_LEN && insert_longest_first(&mut self.endpoints, url)
    }

    /// `text` with every registered secret replaced by [`REDACTED`]; borrowed when nothing
    /// was found.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        replace_all(Cow::Borrowed(text), &self.secrets, REDACTED)
    }

    /// [`Redactor::redact`], and every registered endpoint replaced by [`ENDPOINT`]: text
    /// fit for an API caller and for the conversation.
    pub fn redact_for_callers<'a>(&self, text: &'a str) -> Cow<'a, str> {
        replace_all(self.redact(text), &self.endpoints, ENDPOINT)
    }

    /// `message` with its texts redacted ([`Redactor::redact`]): text, reasoning, tool-call
    /// arguments and tool results. Signatures and ids are kept. The blocks are copied only
    /// when something is replaced.
    pub fn redact_message(&self, mut message: Message) -> Message {
        if self.secrets.is_empty() {
            return message;
        }
        let dirty: Vec<usize> = message
            .content
            .iter()
            .enumerate()
            .filter(|(_, b)| texts_of(b).iter().any(|t| self.contains_secret(t)))
            .map(|(i, _)| i)
            .collect();
        for i in dirty {
            if let Some(block) = message.content.get_mut(i) {
                for text in texts_of_mut(block) {
                    if let Cow::Owned(clean) = self.redact(text) {
                        *text = clean;
                    }
                }
            }
        }
        message
    }

    /// Adds every secret and endpoint of `other`. Returns whether the set changed.
    pub fn extend(&mut self, other: &Redactor) -> bool {
        let mut changed = false;
        for s in &other.secrets {
            changed |= insert_longest_first(&mut self.secrets, s);
        }
        for e in &other.endpoints {
            changed |= insert_longest_first(&mut self.endpoints, e);
        }
        changed
    }

    /// Whether every secret and endpoint of `other` is in this set.
    pub fn includes(&self, other: &Redactor) -> bool {
        other.secrets.iter().all(|s| self.secrets.contains(s))
            && other.endpoints.iter().all(|e| self.endpoints.contains(e))
    }

    fn contains_secret(&self, text: &str) -> bool {
        self.secrets.iter().any(|s| text.contains(s.as_str()))
    }
}

fn texts_of(block: &ContentBlock) -> Vec<&String> {
    match block {
        ContentBlock::Text { text } | ContentBlock::Reasoning { text, .. } => vec![text],
        ContentBlock::ToolCall(c) => vec![&c.arguments],
        ContentBlock::ToolResult(r) => vec![&r.content],
        // Image data is base64 bytes, not text a secret could be spelled in: scanning it
        // would only find false matches, and rewriting it would corrupt the image.
        ContentBlock::Image(_) => Vec::new(),
    }
}

fn texts_of_mut(block: &mut ContentBlock) -> Vec<&mut String> {
    match block {
        ContentBlock::Text { text } | ContentBlock::Reasoning { text, .. } => vec![text],
        ContentBlock::ToolCall(c) => vec![&mut c.arguments],
        ContentBlock::ToolResult(r) => vec![&mut r.content],
        ContentBlock::Image(_) => Vec::new(),
    }
}

/// The process's registry: a snapshot swapped on every change, so a redaction holds no
/// lock while it scans.
static REGISTRY: LazyLock<RwLock<Arc<Redactor>>> = LazyLock::new(Default::default);

/// The process's registry as it is now.
pub fn registry() -> Arc<Redactor> {
    match REGISTRY.read() {
        Ok(r) => r.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    }
}

fn update(change: impl FnOnce(&mut Redactor) -> bool) -> bool {
    let mut guard = match REGISTRY.write() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    let mut next = (**guard).clone();
    let changed = change(&mut next);
    if changed {
        *guard = Arc::new(next);
    }
    changed
}

/// Registers a secret value in the process's registry ([`Redactor::add_secret`]).
pub fn add_secret(value: &str) -> bool {
    is_secret_value(value) && update(|r| r.add_secret(value))
}

/// Registers an `Authorization`-style value ([`Redactor::add_authorization`]).
pub fn add_authorization(value: &str) -> bool {
    value.trim().len() >= MIN_SECRET_LEN && update(|r| r.add_authorization(value))
}

/// Registers the credentials of a URL ([`Redactor::add_url`]).
pub fn add_url(url: &str) -> bool {
    (url.contains('@') || url.contains('?')) && update(|r| r.add_url(url))
}

/// Registers an endpoint ([`Redactor::add_endpoint`]).
pub fn add_endpoint(url: &str) -> bool {
    update(|r| r.add_endpoint(url))
}

/// Registers every secret and endpoint of `other` (a set built where values were
/// configured, e.g. by the `${VAR}` substitution of `tools.json`).
pub fn add_all(other: &Redactor) -> bool {
    !registry().includes(other) && update(|r| r.extend(other))
}

/// `text` without the process's secrets ([`Redactor::redact`]).
pub fn redact(text: &str) -> Cow<'_, str> {
    registry().redact(text)
}

/// `text` without the process's secrets and endpoints ([`Redactor::redact_for_callers`]).
pub fn redact_for_callers(text: &str) -> Cow<'_, str> {
    registry().redact_for_callers(text)
}

/// `message` without the process's secrets ([`Redactor::redact_message`]).
pub fn redact_message(message: Message) -> Message {
    registry().redact_message(message)
}

#[cfg(test)]
#[path = "secrets_tests.rs"]
mod tests;
