//! Token counting: one [`TokenCounter`] trait, exact counts for OpenAI families through
//! tiktoken (feature `tiktoken`) and a calibrated estimate for everything else.
//!
//! The estimate ([`EstimateCounter`]) counts words rather than characters: a word of up to
//! [`WORD_LETTERS_PER_TOKEN`] letters is one token, longer words one more per
//! [`ASCII_CHARS_PER_TOKEN`] letters; digits count per group of three, punctuation at
//! [`TOKENS_PER_ASCII_SYMBOL`], CJK characters at [`TOKENS_PER_CJK_CHAR`] each. It is
//! tuned to read a little high against o200k, because the families it serves (Anthropic,
//! Gemini, Qwen, ...) tokenize less densely than o200k and an undercount risks an overflow.
//! `docs/memory.md` lists its measured error against tiktoken on sample text.

use std::fmt;
use std::sync::Arc;

use hame_core::{ContentBlock, Message, ToolSpec};

use crate::index::is_cjk;

/// Counts the tokens of text for one model family.
pub trait TokenCounter: Send + Sync + fmt::Debug + 'static {
    /// Tokens of `text`.
    fn count(&self, text: &str) -> u64;

    /// A short name for logs (`o200k_base`, `estimate`).
    fn name(&self) -> &str;
}

impl<T: TokenCounter + ?Sized> TokenCounter for Arc<T> {
    fn count(&self, text: &str) -> u64 {
        (**self).count(text)
    }
    fn name(&self) -> &str {
        (**self).name()
    }
}

/// Letters of a word that still count as one token in the estimate (most English words up
/// to this length are a single token in o200k and cl100k).
pub const WORD_LETTERS_PER_TOKEN: u32 = 6;
/// Letters per extra token beyond [`WORD_LETTERS_PER_TOKEN`] in one word.
pub const ASCII_CHARS_PER_TOKEN: f64 = 4.0;
/// Extra tokens per non-ASCII letter inside a word (accents, Cyrillic, Greek split more).
pub const TOKENS_PER_OTHER_LETTER: f64 = 0.15;
/// Tokens per ASCII digit or punctuation character in the estimate (they split more often
/// than letters: numbers are cut into groups of up to three digits, symbols stand alone).
pub const TOKENS_PER_ASCII_SYMBOL: f64 = 0.4;
/// Tokens per CJK character in the estimate (o200k averages 0.7–1.0 for Chinese and
/// Japanese; the estimate errs high).
pub const TOKENS_PER_CJK_CHAR: f64 = 0.8;
/// Tokens per other non-ASCII character that is not a letter (CJK punctuation, emoji,
/// symbols).
pub const TOKENS_PER_OTHER_CHAR: f64 = 0.6;

/// Extra tokens counted per message (role and separators in the chat format).
pub const TOKENS_PER_MESSAGE: u64 = 4;
/// Extra tokens counted per tool call or tool result block (ids, names, JSON framing).
pub const TOKENS_PER_TOOL_BLOCK: u64 = 8;

/// Tokens counted for one image, whatever its size: the most an image costs at Anthropic
/// (about 1,600 tokens for the largest image it takes unscaled, 1.15 megapixels; larger
/// ones are scaled down to that) and above OpenAI's high-detail cost of a 1024x1024 image
/// (765). A fixed count reads high for small images, which errs on the side of compacting
/// early rather than overflowing; decoding the image to measure it is not worth the time.
pub const TOKENS_PER_IMAGE: u64 = 1_600;
/// Extra tokens counted per tool specification.
pub const TOKENS_PER_TOOL_SPEC: u64 = 8;

/// The calibrated estimate for model families without a public tokenizer
/// (Anthropic, Gemini, Qwen, DeepSeek, local models). See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct EstimateCounter;

impl EstimateCounter {
    /// Estimates without allocating: one pass over the characters.
    ///
    /// Letters are counted per word (a run of letters): one token, plus one per
    /// [`ASCII_CHARS_PER_TOKEN`] letters beyond [`WORD_LETTERS_PER_TOKEN`]; digits per
    /// group of three;
    /// punctuation at [`TOKENS_PER_ASCII_SYMBOL`]; single spaces are free, runs of blanks
    /// (indentation) cost one token and line breaks half a token.
    pub fn estimate(text: &str) -> u64 {
        // ASCII text (most of what tools return) is counted byte by byte from a table.
        let units = if text.is_ascii() {
            estimate_ascii_units(text.as_bytes())
        } else {
            estimate_units(text.chars())
        };
        units.div_ceil(UNITS_PER_TOKEN)
    }
}

/// The estimate counts in twentieths of a token: every weight above is a multiple of
/// 1/20, so the sum is exact (and integer additions are cheaper than floating ones).
const UNITS_PER_TOKEN: u64 = 20;

/// `tokens` in [`UNITS_PER_TOKEN`]ths; a compile error if it is not a whole number of them.
const fn units(tokens: f64) -> u64 {
    let u = tokens * UNITS_PER_TOKEN as f64;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = (u + 0.5) as u64;
    assert!(
        (n as f64 - u) < 1e-9 && (u - n as f64) < 1e-9,
        "not a multiple of 1/20"
    );
    n
}

const WORD_UNITS: u64 = units(1.0);
const EXTRA_LETTER_UNITS: u64 = units(1.0 / ASCII_CHARS_PER_TOKEN);
const OTHER_LETTER_UNITS: u64 = units(TOKENS_PER_OTHER_LETTER);
const SYMBOL_UNITS: u64 = units(TOKENS_PER_ASCII_SYMBOL);
const CJK_UNITS: u64 = units(TOKENS_PER_CJK_CHAR);
const OTHER_CHAR_UNITS: u64 = units(TOKENS_PER_OTHER_CHAR);
const NEWLINE_UNITS: u64 = units(0.5);

/// What a character is to the estimate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    /// An ASCII letter.
    Letter,
    /// A letter outside ASCII and CJK (accents, Cyrillic, Greek): part of a word, and
    /// [`TOKENS_PER_OTHER_LETTER`] more.
    OtherLetter,
    /// An ASCII digit.
    Digit,
    /// A space or a tab.
    Blank,
    Newline,
    /// `\r` and form feed: free, and they end a run of blanks.
    OtherSpace,
    /// ASCII punctuation, symbols and control characters.
    Symbol,
    Cjk,
    /// Any other character (emoji, CJK punctuation, other scripts' digits and spaces).
    OtherChar,
}

/// [`Class`] of every ASCII byte.
const ASCII_CLASS: [Class; 128] = {
    let mut t = [Class::Symbol; 128];
    let mut b = 0;
    while b < 128 {
        let c = b as u8;
        t[b] = if c.is_ascii_alphabetic() {
            Class::Letter
        } else if c.is_ascii_digit() {
            Class::Digit
        } else if c == b' ' || c == b'\t' {
            Class::Blank
        } else if c == b'\n' {
            Class::Newline
        } else if c.is_ascii_whitespace() {
            Class::OtherSpace
        } else {
            Class::Symbol
        };
        b += 1;
    }
    t
};

/// [`Class`] of a character.
#[inline(always)]
fn class_of(c: char) -> Class {
    if let Some(&class) = ASCII_CLASS.get(c as usize) {
        class
    } else if is_cjk(c) {
        Class::Cjk
    } else if c.is_alphabetic() {
        Class::OtherLetter
    } else {
        Class::OtherChar
    }
}

/// The estimate's running count, in [`UNITS_PER_TOKEN`]ths of a token, fed one character
/// class at a time.
#[derive(Default)]
struct Tally {
    units: u64,
    /// Letters of the word being read.
    word: u32,
    /// Digits of the number being read.
    digits: u32,
    /// Blanks in a row.
    blanks: u32,
}

impl Tally {
    #[inline(always)]
    fn end_word(&mut self) {
        if self.word > 0 {
            self.units += WORD_UNITS
                + u64::from(self.word.saturating_sub(WORD_LETTERS_PER_TOKEN)) * EXTRA_LETTER_UNITS;
            self.word = 0;
        }
    }

    #[inline(always)]
    fn end_number(&mut self) {
        if self.digits > 0 {
            self.units += WORD_UNITS * u64::from(self.digits.div_ceil(3));
            self.digits = 0;
        }
    }

    #[inline(always)]
    fn push(&mut self, class: Class) {
        match class {
            Class::Letter | Class::OtherLetter => {
                self.end_number();
                self.word += 1;
                self.blanks = 0;
                if class == Class::OtherLetter {
                    self.units += OTHER_LETTER_UNITS;
                }
            }
            Class::Digit => {
                self.end_word();
                self.digits += 1;
                self.blanks = 0;
            }
            Class::Blank => {
                self.end_both();
                self.blanks += 1;
                // A run of blanks (indentation, alignment) is a token of its own.
                if self.blanks == 2 {
                    self.units += WORD_UNITS;
                }
            }
            other => {
                self.end_both();
                self.blanks = 0;
                self.units += match other {
                    Class::Newline => NEWLINE_UNITS,
                    Class::Symbol => SYMBOL_UNITS,
                    Class::Cjk => CJK_UNITS,
                    Class::OtherChar => OTHER_CHAR_UNITS,
                    _ => 0,
                };
            }
        }
    }

    #[inline(always)]
    fn end_both(&mut self) {
        self.end_word();
        self.end_number();
    }

    fn finish(mut self) -> u64 {
        self.end_both();
        self.units
    }
}

/// [`estimate_units`] of ASCII text, one table look-up per byte (the same count:
/// `ascii_estimate_is_the_char_estimate`).
fn estimate_ascii_units(bytes: &[u8]) -> u64 {
    let mut tally = Tally::default();
    for &b in bytes {
        tally.push(
            ASCII_CLASS
                .get(usize::from(b))
                .copied()
                .unwrap_or(Class::OtherChar),
        );
    }
    tally.finish()
}

/// [`EstimateCounter::estimate`] in [`UNITS_PER_TOKEN`]ths of a token.
fn estimate_units(chars: impl Iterator<Item = char>) -> u64 {
    let mut tally = Tally::default();
    for c in chars {
        tally.push(class_of(c));
    }
    tally.finish()
}

impl TokenCounter for EstimateCounter {
    fn count(&self, text: &str) -> u64 {
        Self::estimate(text)
    }
    fn name(&self) -> &str {
        "estimate"
    }
}

/// A tiktoken encoding.
#[cfg(feature = "tiktoken")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Encoding {
    /// GPT-4o, GPT-4.1, GPT-5, o1/o3/o4 and later.
    O200kBase,
    /// GPT-4, GPT-3.5-turbo and the `text-embedding-3` models.
    Cl100kBase,
}

/// Exact counts with a tiktoken encoding (feature `tiktoken`).
#[cfg(feature = "tiktoken")]
#[derive(Clone, Copy)]
pub struct TiktokenCounter {
    encoding: Encoding,
    bpe: &'static tiktoken_rs::CoreBPE,
}

#[cfg(feature = "tiktoken")]
impl fmt::Debug for TiktokenCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TiktokenCounter")
            .field("encoding", &self.encoding)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "tiktoken")]
fn bpe(encoding: Encoding) -> Option<&'static tiktoken_rs::CoreBPE> {
    use std::sync::OnceLock;
    static O200K: OnceLock<Option<tiktoken_rs::CoreBPE>> = OnceLock::new();
    static CL100K: OnceLock<Option<tiktoken_rs::CoreBPE>> = OnceLock::new();
    let cell = match encoding {
        Encoding::O200kBase => &O200K,
        Encoding::Cl100kBase => &CL100K,
    };
    cell.get_or_init(|| {
        let r = match encoding {
            Encoding::O200kBase => tiktoken_rs::o200k_base(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base(),
        };
        r.map_err(|e| tracing::warn!(?encoding, error = %e, "tiktoken encoding unavailable"))
            .ok()
    })
    .as_ref()
}

#[cfg(feature = "tiktoken")]
impl TiktokenCounter {
    /// A counter for this encoding; `None` if the embedded tables cannot be loaded.
    /// The tables are built once per process (~100 ms for o200k) and shared.
    pub fn new(encoding: Encoding) -> Option<Self> {
        bpe(encoding).map(|bpe| Self { encoding, bpe })
    }

    /// The encoding.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }
}

#[cfg(feature = "tiktoken")]
impl TokenCounter for TiktokenCounter {
    fn count(&self, text: &str) -> u64 {
        self.bpe.count_ordinary(text) as u64
    }
    fn name(&self) -> &str {
        match self.encoding {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
        }
    }
}

/// The tiktoken encoding of an OpenAI model name, if it is one.
#[cfg(feature = "tiktoken")]
pub fn encoding_for_model(model: &str) -> Option<Encoding> {
    let m = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    let o200k = [
        "gpt-4o",
        "gpt-4.1",
        "gpt-4.5",
        "gpt-5",
        "o1",
        "o3",
        "o4",
        "chatgpt-4o",
        "gpt-oss",
    ];
    let cl100k = ["gpt-4", "gpt-3.5", "text-embedding-3", "text-embedding-ada"];
    if o200k.iter().any(|p| m.starts_with(p)) {
        Some(Encoding::O200kBase)
    } else if cl100k.iter().any(|p| m.starts_with(p)) {
        Some(Encoding::Cl100kBase)
    } else {
        None
    }
}

/// The best counter for a model: tiktoken for OpenAI families (feature `tiktoken`), the
/// estimate otherwise.
pub fn counter_for_model(model: &str) -> Arc<dyn TokenCounter> {
    #[cfg(feature = "tiktoken")]
    if let Some(c) = encoding_for_model(model).and_then(TiktokenCounter::new) {
        return Arc::new(c);
    }
    let _ = model;
    Arc::new(EstimateCounter)
}

/// Tokens of one message: its text, reasoning, tool calls (name and arguments), tool
/// results and images ([`TOKENS_PER_IMAGE`] each), plus the per-message and per-block
/// framing.
pub fn message_tokens(counter: &dyn TokenCounter, message: &Message) -> u64 {
    let mut n = TOKENS_PER_MESSAGE;
    for block in &message.content {
        n += match block {
            ContentBlock::Text { text } | ContentBlock::Reasoning { text, .. } => {
                counter.count(text)
            }
            ContentBlock::ToolCall(c) => {
                TOKENS_PER_TOOL_BLOCK + counter.count(&c.name) + counter.count(&c.arguments)
            }
            ContentBlock::ToolResult(r) => TOKENS_PER_TOOL_BLOCK + counter.count(&r.content),
            ContentBlock::Image(_) => TOKENS_PER_IMAGE,
        };
    }
    n
}

/// Tokens of a conversation.
pub fn messages_tokens(counter: &dyn TokenCounter, messages: &[Message]) -> u64 {
    messages.iter().map(|m| message_tokens(counter, m)).sum()
}

/// Tokens of a whole request: system prompt, messages and tool specifications (name,
/// description and JSON schema).
pub fn request_tokens(
    counter: &dyn TokenCounter,
    system: &str,
    messages: &[Message],
    tools: &[ToolSpec],
) -> u64 {
    let system = if system.is_empty() {
        0
    } else {
        TOKENS_PER_MESSAGE + counter.count(system)
    };
    let tools: u64 = tools
        .iter()
        .map(|t| {
            TOKENS_PER_TOOL_SPEC
                + counter.count(&t.name)
                + counter.count(&t.description)
                + counter.count(&t.parameters.to_string())
        })
        .sum();
    system + tools + messages_tokens(counter, messages)
}

#[cfg(test)]
#[path = "tokens_tests.rs"]
mod tests;
