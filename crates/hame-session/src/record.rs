//! One line of a session log and the parsing of a whole log.

use chrono::{DateTime, SecondsFormat, Utc};
use hame_core::{Message, Role, Usage};
use serde::{Deserialize, Serialize};

/// The version of the log-line format written by this crate (the `v` field).
pub const RECORD_FORMAT_VERSION: u32 = 1;

/// One message of one call, as stored on one line of `<session>.log.jsonl`.
///
/// `role` and `usage` repeat what is inside `message` so that line-oriented tools (`grep`,
/// `jq`) and readers that do not know the message format can use them directly.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LogRecord {
    /// Format version of this line ([`RECORD_FORMAT_VERSION`]).
    #[serde(default = "default_version")]
    pub v: u32,
    /// Sequence number, monotonic per session, starting at 0.
    pub seq: u64,
    /// When the record was appended (RFC 3339, UTC, millisecond precision).
    #[serde(with = "rfc3339_millis")]
    pub time: DateTime<Utc>,
    /// The harness call that produced the message.
    pub call_id: String,
    /// The author of the message.
    pub role: Role,
    /// Token usage of the model request that produced the message (assistant messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The full message: every tool argument and every tool result, never truncated.
    pub message: Message,
}

/// The written form of a [`LogRecord`], borrowing its message: an append encodes its
/// records through it without copying each message (a tool result can be megabytes), and
/// `LogRecord`'s own `Serialize` delegates to it, so the line format is declared once.
#[derive(Debug, Serialize)]
pub(crate) struct LogRecordRef<'a> {
    v: u32,
    seq: u64,
    #[serde(with = "rfc3339_millis")]
    time: DateTime<Utc>,
    call_id: &'a str,
    role: Role,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    message: &'a Message,
}

impl<'a> LogRecordRef<'a> {
    /// The record [`LogRecord::new`] would make, borrowed.
    pub(crate) fn new(
        seq: u64,
        time: DateTime<Utc>,
        call_id: &'a str,
        message: &'a Message,
    ) -> Self {
        LogRecordRef {
            v: RECORD_FORMAT_VERSION,
            seq,
            time,
            call_id,
            role: message.role,
            usage: message.usage,
            message,
        }
    }
}

impl Serialize for LogRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        LogRecordRef {
            v: self.v,
            seq: self.seq,
            time: self.time,
            call_id: &self.call_id,
            role: self.role,
            usage: self.usage,
            message: &self.message,
        }
        .serialize(serializer)
    }
}

fn default_version() -> u32 {
    RECORD_FORMAT_VERSION
}

impl LogRecord {
    /// A record for `message`.
    pub fn new(seq: u64, time: DateTime<Utc>, call_id: &str, message: Message) -> Self {
        LogRecord {
            v: RECORD_FORMAT_VERSION,
            seq,
            time,
            call_id: call_id.to_owned(),
            role: message.role,
            usage: message.usage,
            message,
        }
    }
}

mod rfc3339_millis {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Millis, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        DateTime::parse_from_rfc3339(&s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}

/// Formats a time the way the log and the index do.
pub(crate) fn fmt_time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The records of a log file, with what had to be skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ParsedLog {
    /// Valid records in file order.
    pub records: Vec<LogRecord>,
    /// Complete lines that are not valid records (e.g. a torn line later closed by a newline).
    pub skipped_lines: usize,
    /// Whether the file ends with an unterminated line that is not a valid record (a torn
    /// write); it is ignored.
    pub torn_tail: bool,
}

/// Parses every line of a log. Never fails: invalid lines are counted and skipped.
pub(crate) fn parse_log(data: &[u8]) -> ParsedLog {
    let mut out = ParsedLog::default();
    for (line, terminated) in lines(data) {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<LogRecord>(line) {
            Ok(record) => out.records.push(record),
            Err(_) if !terminated => out.torn_tail = true,
            Err(_) => out.skipped_lines += 1,
        }
    }
    out
}

/// The last valid record of a log, parsing lines from the end (only the tail is decoded).
pub(crate) fn last_record(data: &[u8]) -> Option<LogRecord> {
    let mut end = data.len();
    while end > 0 {
        let start = data[..end]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        let line = &data[start..end];
        if !line.iter().all(u8::is_ascii_whitespace)
            && let Ok(record) = serde_json::from_slice::<LogRecord>(line)
        {
            return Some(record);
        }
        end = start.saturating_sub(1);
    }
    None
}

/// Splits into lines (without the `\n`), telling whether each was terminated.
fn lines(data: &[u8]) -> impl Iterator<Item = (&[u8], bool)> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match rest.iter().position(|b| *b == b'\n') {
            Some(i) => {
                let line = &rest[..i];
                rest = &rest[i + 1..];
                Some((line, true))
            }
            None => {
                let line = rest;
                rest = &[];
                Some((line, false))
            }
        }
    })
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
