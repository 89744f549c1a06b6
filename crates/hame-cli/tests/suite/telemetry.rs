//! `--otlp-endpoint`: the spans of a call reach an OTLP/HTTP collector (a minimal one on
//! 127.0.0.1 that records what it is sent).

use std::sync::{Arc, Mutex};

use hame_test_support::{ScriptStep, ScriptedServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::common::{run_with, stderr, stdout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Accepts HTTP/1.1 POSTs, answers 200, keeps `(path, body)` of each.
async fn collector() -> std::io::Result<(String, Arc<Mutex<Vec<(String, Vec<u8>)>>>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = got.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let keep = keep.clone();
            tokio::spawn(async move {
                loop {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    let head_end = loop {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let len = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    while buf.len() < head_end + len {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                    if let Ok(mut g) = keep.lock() {
                        g.push((path, buf[head_end..head_end + len].to_vec()));
                    }
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if sock.write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok((url, got))
}

#[tokio::test]
async fn otlp_endpoint_exports_the_spans_of_a_call() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (otlp, got) = collector().await?;
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::tool_call("c1", "list_files", serde_json::json!({})),
        ScriptStep::text("traced"),
    ]);
    let out = run_with(
        dir.path(),
        &server.base_url(),
        &["--otlp-endpoint", &otlp],
        "hi",
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "traced\n");
    let posts = got.lock().map(|g| g.clone()).unwrap_or_default();
    assert!(
        !posts.is_empty(),
        "nothing exported; stderr: {}",
        stderr(&out)
    );
    assert!(
        posts.iter().all(|(p, _)| p == "/v1/traces"),
        "{:?}",
        posts.iter().map(|p| &p.0).collect::<Vec<_>>()
    );
    let all: Vec<u8> = posts.iter().flat_map(|(_, b)| b.clone()).collect();
    let has = |s: &str| all.windows(s.len()).any(|w| w == s.as_bytes());
    for span in [
        "hame.call",
        "hame.step",
        "hame.model",
        "hame.tool",
        "list_files",
    ] {
        assert!(has(span), "{span} was not exported");
    }
    // A URL without a scheme is a usage error.
    let bad = run_with(
        dir.path(),
        &server.base_url(),
        &["--otlp-endpoint", "127.0.0.1:1"],
        "hi",
        &[],
    )
    .await?;
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("OTLP/HTTP URL"), "{}", stderr(&bad));
    Ok(())
}
