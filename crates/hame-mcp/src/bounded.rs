//! The size limit of one message from a stdio server, enforced in front of the SDK.
//!
//! rmcp's line transport drops a line longer than its limit (16 MiB) and logs it: the
//! request that line answered never completes, and its caller waits for its whole timeout.
//! [`BoundedLines`] sits between the server's stdout and rmcp's transport instead. Lines up
//! to [`MAX_MESSAGE_BYTES`] pass unchanged. A longer one is cut there (rmcp then ignores an
//! unparsable line) and the rest of it is skipped while its first and last
//! [`EDGE_BYTES`] are kept; at its end, when it names the id of a response (not a request
//! or notification of the server), an error response for that id takes its place, so the
//! pending request fails at once with [`too_large_message`]'s text.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// The largest message (one line, without its newline) a stdio MCP server may send: 16 MiB,
/// the limit of the SDK's line transport and of its HTTP client's SSE events.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Bytes kept from each end of an oversized message to find its id.
pub(crate) const EDGE_BYTES: usize = 4096;

/// The `data.hame` marker of the error response that replaces an oversized message.
pub(crate) const TOO_LARGE_MARK: &str = "message_too_large";

/// JSON-RPC "internal error".
const INTERNAL_ERROR: i64 = -32603;

/// What replaces an oversized response, for the model and the log.
pub(crate) fn too_large_message(bytes: u64) -> String {
    format!(
        "the MCP server's result is {bytes} bytes, over the 16 MiB limit of one message \
         ({MAX_MESSAGE_BYTES} bytes); ask the tool for less (a narrower query, one page)"
    )
}

/// Where the reader is in the current line.
#[derive(Debug)]
enum Line {
    /// Passing bytes through: `len` of this line so far, its first bytes in `head`.
    Passing { len: usize, head: Vec<u8> },
    /// Skipping the rest of a line over the limit: `len` so far, its first and (up to now)
    /// last bytes.
    Skipping {
        len: u64,
        head: Vec<u8>,
        tail: VecDeque<u8>,
    },
}

/// An [`AsyncRead`] over a server's stdout that keeps every line within `limit` bytes (see
/// the module docs).
#[derive(Debug)]
pub(crate) struct BoundedLines<R> {
    inner: R,
    limit: usize,
    line: Line,
    /// Bytes ready to hand out before reading more.
    out: VecDeque<u8>,
    scratch: Vec<u8>,
    eof: bool,
}

impl<R> BoundedLines<R> {
    pub(crate) fn new(inner: R, limit: usize) -> Self {
        Self {
            inner,
            limit,
            line: Line::Passing {
                len: 0,
                head: Vec::new(),
            },
            out: VecDeque::new(),
            scratch: vec![0; 64 << 10],
            eof: false,
        }
    }

    /// Takes `chunk` (bytes read from the server) into `out`.
    fn take(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            let newline = chunk.iter().position(|b| *b == b'\n');
            let (segment, ends, rest) = match newline {
                Some(at) => (&chunk[..at], true, &chunk[at + 1..]),
                None => (chunk, false, &chunk[chunk.len()..]),
            };
            chunk = rest;
            match &mut self.line {
                Line::Passing { len, head } => {
                    keep_head(head, segment);
                    if *len + segment.len() <= self.limit {
                        *len += segment.len();
                        self.out.extend(segment);
                        if ends {
                            self.out.push_back(b'\n');
                            self.line = Line::Passing {
                                len: 0,
                                head: Vec::new(),
                            };
                        }
                        continue;
                    }
                    // Over the limit: what fits goes on, ended by a newline (an unparsable
                    // line, which the SDK ignores); the rest is counted, not kept.
                    let fits = self.limit - *len;
                    self.out.extend(&segment[..fits]);
                    self.out.push_back(b'\n');
                    let mut tail = VecDeque::new();
                    keep_tail(&mut tail, segment);
                    self.line = Line::Skipping {
                        len: (*len + segment.len()) as u64,
                        head: std::mem::take(head),
                        tail,
                    };
                }
                Line::Skipping { len, head, tail } => {
                    *len += segment.len() as u64;
                    keep_head(head, segment);
                    keep_tail(tail, segment);
                }
            }
            if ends {
                self.finish_oversized();
            }
        }
    }

    /// The oversized line ended (or the stream did): an error response for its id takes its
    /// place when it names one.
    fn finish_oversized(&mut self) {
        let line = std::mem::replace(
            &mut self.line,
            Line::Passing {
                len: 0,
                head: Vec::new(),
            },
        );
        let Line::Skipping { len, head, tail } = line else {
            return;
        };
        let tail: Vec<u8> = tail.into_iter().collect();
        let Some(id) = response_id(&head, &tail) else {
            tracing::warn!(
                bytes = len,
                limit = self.limit,
                "an MCP server sent a message over the size limit that answers no request; dropped"
            );
            return;
        };
        // The caller gets the error (and the model its text): no warning of its own.
        tracing::info!(bytes = len, limit = self.limit, %id, "an MCP server's result is over the size limit; the request fails");
        let error = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": INTERNAL_ERROR,
                "message": too_large_message(len),
                "data": {"hame": TOO_LARGE_MARK, "bytes": len, "limit": self.limit},
            },
        });
        if let Ok(bytes) = serde_json::to_vec(&error) {
            self.out.extend(bytes);
            self.out.push_back(b'\n');
        }
    }
}

fn keep_head(head: &mut Vec<u8>, segment: &[u8]) {
    let room = EDGE_BYTES.saturating_sub(head.len());
    head.extend_from_slice(&segment[..segment.len().min(room)]);
}

fn keep_tail(tail: &mut VecDeque<u8>, segment: &[u8]) {
    let from = segment.len().saturating_sub(EDGE_BYTES);
    tail.extend(&segment[from..]);
    while tail.len() > EDGE_BYTES {
        tail.pop_front();
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for BoundedLines<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                let (a, b) = this.out.as_slices();
                let from_a = n.min(a.len());
                buf.put_slice(&a[..from_a]);
                buf.put_slice(&b[..n - from_a]);
                this.out.drain(..n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {
                    let n = read.filled().len();
                    if n == 0 {
                        this.eof = true;
                        this.finish_oversized();
                    } else {
                        let chunk = this.scratch[..n].to_vec();
                        this.take(&chunk);
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// The id of a JSON-RPC response from the first and last bytes of its text: a top-level
/// `"id"` in `head` (servers that write it first: the Python SDK, rmcp) or among the last
/// scalar members of `tail` (`{"result":…,"jsonrpc":"2.0","id":3}`, the TypeScript SDK).
/// `None` when it names none, or is a request or notification (it has a `method`).
pub(crate) fn response_id(head: &[u8], tail: &[u8]) -> Option<serde_json::Value> {
    let front = leading_members(head);
    let back = trailing_members(tail);
    if front.iter().chain(&back).any(|(k, _)| k == "method") {
        return None;
    }
    front
        .into_iter()
        .chain(back)
        .find(|(k, v)| k == "id" && (v.is_number() || v.is_string()))
        .map(|(_, v)| v)
}

/// The top-level members of a JSON object read from its start, as far as they are whole
/// scalars (reading stops at the first member whose value is an object or array).
fn leading_members(text: &[u8]) -> Vec<(String, serde_json::Value)> {
    let mut members = Vec::new();
    let mut at = skip_ws(text, 0);
    if text.get(at) != Some(&b'{') {
        return members;
    }
    at += 1;
    loop {
        at = skip_ws(text, at);
        let Some(key_end) = string_end(text, at) else {
            return members;
        };
        let Ok(key) = serde_json::from_slice::<String>(&text[at..key_end]) else {
            return members;
        };
        at = skip_ws(text, key_end);
        if text.get(at) != Some(&b':') {
            return members;
        }
        at = skip_ws(text, at + 1);
        let Some(value_end) = scalar_end(text, at) else {
            return members;
        };
        let Ok(value) = serde_json::from_slice(&text[at..value_end]) else {
            return members;
        };
        members.push((key, value));
        at = skip_ws(text, value_end);
        if text.get(at) != Some(&b',') {
            return members;
        }
        at += 1;
    }
}

/// The top-level members of a JSON object read backwards from its end, as far as they are
/// whole scalars.
fn trailing_members(text: &[u8]) -> Vec<(String, serde_json::Value)> {
    let mut members = Vec::new();
    let mut end = skip_ws_back(text, text.len());
    if end == 0 || text[end - 1] != b'}' {
        return members;
    }
    end -= 1;
    for _ in 0..8 {
        end = skip_ws_back(text, end);
        let Some(value_start) = scalar_start_back(text, end) else {
            return members;
        };
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(&text[value_start..end]) else {
            return members;
        };
        let colon = skip_ws_back(text, value_start);
        if colon == 0 || text[colon - 1] != b':' {
            return members;
        }
        let key_end = skip_ws_back(text, colon - 1);
        let Some(key_start) = string_start_back(text, key_end) else {
            return members;
        };
        let Ok(key) = serde_json::from_slice::<String>(&text[key_start..key_end]) else {
            return members;
        };
        members.push((key, value));
        let before = skip_ws_back(text, key_start);
        if before == 0 || text[before - 1] != b',' {
            return members;
        }
        end = before - 1;
    }
    members
}

fn skip_ws(text: &[u8], mut at: usize) -> usize {
    while text.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

fn skip_ws_back(text: &[u8], mut end: usize) -> usize {
    while end > 0 && text[end - 1].is_ascii_whitespace() {
        end -= 1;
    }
    end
}

/// The end (exclusive) of the JSON string starting at `at`.
fn string_end(text: &[u8], at: usize) -> Option<usize> {
    if text.get(at) != Some(&b'"') {
        return None;
    }
    let mut i = at + 1;
    while let Some(b) = text.get(i) {
        match b {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The start of the JSON string ending (exclusive) at `end`.
fn string_start_back(text: &[u8], end: usize) -> Option<usize> {
    if end < 2 || text[end - 1] != b'"' {
        return None;
    }
    let mut i = end - 1;
    while i > 0 {
        i -= 1;
        if text[i] == b'"' {
            let backslashes = text[..i].iter().rev().take_while(|b| **b == b'\\').count();
            if backslashes % 2 == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// The end (exclusive) of the scalar (string, number, `true`, `false`, `null`) at `at`.
fn scalar_end(text: &[u8], at: usize) -> Option<usize> {
    match text.get(at)? {
        b'"' => string_end(text, at),
        b'{' | b'[' => None,
        _ => {
            let len = text[at..]
                .iter()
                .take_while(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace())
                .count();
            (len > 0 && at + len < text.len()).then_some(at + len)
        }
    }
}

/// The start of the scalar ending (exclusive) at `end`.
fn scalar_start_back(text: &[u8], end: usize) -> Option<usize> {
    match text.get(end.checked_sub(1)?)? {
        b'"' => string_start_back(text, end),
        b'}' | b']' => None,
        _ => {
            let len = text[..end]
                .iter()
                .rev()
                .take_while(|b| !matches!(b, b',' | b':' | b'{' | b'[') && !b.is_ascii_whitespace())
                .count();
            (len > 0 && len < end).then_some(end - len)
        }
    }
}

#[cfg(test)]
#[path = "bounded_tests.rs"]
mod tests;
