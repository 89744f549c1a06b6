#![allow(clippy::unwrap_used)]

use std::pin::Pin;
use std::task::{Context, Poll};

use pretty_assertions::assert_eq;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

use super::*;

/// Hands out its bytes `step` at a time, as a pipe does.
struct Chunked {
    bytes: Vec<u8>,
    at: usize,
    step: usize,
}

impl AsyncRead for Chunked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self
            .step
            .min(self.bytes.len() - self.at)
            .min(buf.remaining());
        let from = self.at;
        buf.put_slice(&self.bytes[from..from + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

async fn through(input: &str, limit: usize, step: usize) -> Vec<String> {
    let mut reader = BoundedLines::new(
        Chunked {
            bytes: input.as_bytes().to_vec(),
            at: 0,
            step,
        },
        limit,
    );
    let mut out = String::new();
    reader.read_to_string(&mut out).await.unwrap();
    out.split_inclusive('\n').map(str::to_owned).collect()
}

#[test]
fn ids_are_found_at_either_end_of_a_response() {
    let python = br#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"xxxx"#;
    assert_eq!(response_id(python, b"xxxx\"}]}}"), Some(json!(3)));
    let typescript = br#"xx"}]},"jsonrpc":"2.0","id":"req-\"7\""}"#;
    assert_eq!(
        response_id(br#"{"result":{"content":[{"#, typescript),
        Some(json!("req-\"7\""))
    );
    let spaced = b"xx\" } ] } , \"id\" : 12 ,\n \"jsonrpc\" : \"2.0\" }\n";
    assert_eq!(response_id(b"{ \"result\": {", spaced), Some(json!(12)));
    // Requests and notifications of the server answer nothing.
    assert_eq!(
        response_id(
            br#"{"jsonrpc":"2.0","id":4,"method":"sampling/createMessage","params":{"#,
            b"}}"
        ),
        None
    );
    assert_eq!(
        response_id(br#"{"method":"notifications/message","params":{"#, b"\"}}"),
        None
    );
    // Nothing to go by.
    assert_eq!(response_id(b"{\"result\":{", b"\"}}"), None);
    assert_eq!(response_id(b"not json", b"at all"), None);
    assert_eq!(response_id(b"", b""), None);
    assert_eq!(response_id(br#"{"id":null,"error":{"#, b"}}"), None);
}

#[tokio::test]
async fn lines_within_the_limit_pass_unchanged_whatever_the_chunks() {
    let input = "{\"a\":1}\n\n0123456789\n{\"b\":2}\npartial";
    for step in [1, 3, 7, 1000] {
        assert_eq!(
            through(input, 10, step).await.concat(),
            input,
            "chunks of {step}"
        );
    }
}

#[tokio::test]
async fn an_oversized_response_becomes_an_error_for_its_id() {
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{{\"text\":\"{}\"}}}}",
        "y".repeat(200)
    );
    let input = format!("{{\"ok\":1}}\n{big}\n{{\"ok\":2}}\n");
    for step in [1, 5, 64, 100_000] {
        let lines = through(&input, 64, step).await;
        assert_eq!(lines.len(), 4, "chunks of {step}: {lines:?}");
        assert_eq!(lines[0], "{\"ok\":1}\n");
        // The first 64 bytes, cut: not JSON, so the SDK ignores the line.
        assert_eq!(lines[1], format!("{}\n", &big[..64]));
        let error: serde_json::Value = serde_json::from_str(&lines[2]).unwrap();
        assert_eq!(
            error,
            json!({
                "jsonrpc": "2.0",
                "id": 9,
                "error": {
                    "code": -32603,
                    "message": too_large_message(big.len() as u64),
                    "data": {"hame": "message_too_large", "bytes": big.len(), "limit": 64},
                },
            }),
            "chunks of {step}"
        );
        assert_eq!(lines[3], "{\"ok\":2}\n");
    }
}

#[tokio::test]
async fn an_oversized_request_of_the_server_is_only_dropped() {
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\",\"params\":\"{}\"}}",
        "z".repeat(100)
    );
    let lines = through(&format!("{big}\n{{\"ok\":1}}\n"), 32, 7).await;
    assert_eq!(
        lines,
        vec![format!("{}\n", &big[..32]), "{\"ok\":1}\n".to_owned()]
    );
}

#[tokio::test]
async fn an_oversized_line_cut_by_the_end_of_the_stream_still_fails_its_request() {
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"result\":\"{}",
        "q".repeat(50)
    );
    let lines = through(&big, 20, 3).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    let error: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(error["id"], json!("a"));
    assert_eq!(error["error"]["data"]["bytes"], json!(big.len()));
}

#[test]
fn the_message_names_the_size_and_the_limit() {
    assert_eq!(
        too_large_message(17_825_792),
        "the MCP server's result is 17825792 bytes, over the 16 MiB limit of one message \
         (16777216 bytes); ask the tool for less (a narrower query, one page)"
    );
}
