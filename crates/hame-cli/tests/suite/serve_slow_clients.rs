//! Slow clients cannot hold `hame serve` (issue #30, item 11): a connection that does not
//! finish its headers within `--header-timeout`, or its body within `--body-timeout`, is
//! closed; past `--max-connections` new connections wait to be accepted; normal requests
//! keep working throughout.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;

use super::serve::{Serve, client};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `host:port` of a served URL.
fn addr(serve: &Serve) -> String {
    serve.at("").trim_start_matches("http://").to_owned()
}

/// Reads until the server closes the connection (or `limit` passes): what it sent, and
/// when it closed (`None`: still open at the limit).
fn read_until_closed(mut s: TcpStream, limit: Duration) -> (String, Option<Instant>) {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (String::from_utf8_lossy(&got).into_owned(), None);
        }
        let _ = s.set_read_timeout(Some(left));
        match s.read(&mut buf) {
            Ok(0) => {
                return (
                    String::from_utf8_lossy(&got).into_owned(),
                    Some(Instant::now()),
                );
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => {
                return (
                    String::from_utf8_lossy(&got).into_owned(),
                    Some(Instant::now()),
                );
            }
        }
    }
}

/// `hame serve <args>` against a model that answers every request "ok"; the temporary
/// directory and the model server live as long as the returned values.
async fn serve_ok(
    args: &[&str],
) -> Result<(tempfile::TempDir, ScriptedServer, Serve), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.set_responder(|_: &hame_test_support::RecordedRequest| ScriptStep::text("ok"));
    let serve = Serve::start(dir.path(), &model.base_url(), args)?;
    Ok((dir, model, serve))
}

#[tokio::test]
async fn slow_headers_and_slow_bodies_are_cut_off_and_others_are_served() -> TestResult {
    let (_dir, _model, serve) = serve_ok(&["--header-timeout", "1", "--body-timeout", "1"]).await?;
    let target = addr(&serve);
    let started = Instant::now();
    // 200 connections that never finish their headers, and one that sends nothing.
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(&target)?;
        s.write_all(b"POST /v1/sessions/s/messages HTTP/1.1\r\nHost: x\r\nX-Slow: ")?;
        slow.push(s);
    }
    slow.push(TcpStream::connect(&target)?);
    // Headers complete, the body never.
    let mut body = TcpStream::connect(&target)?;
    body.write_all(
        b"POST /v1/sessions/s/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"message\":",
    )?;
    // Meanwhile a normal request is answered.
    let r = client()
        .post(serve.at("/v1/sessions/n/messages"))
        .json(&serde_json::json!({"message": "hi"}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let closed = tokio::task::spawn_blocking(move || {
        slow.into_iter()
            .map(|s| read_until_closed(s, Duration::from_secs(10)))
            .collect::<Vec<_>>()
    })
    .await?;
    let open = closed.iter().filter(|(_, at)| at.is_none()).count();
    assert_eq!(open, 0, "slow connections still open after 10 s");
    let last = closed
        .iter()
        .filter_map(|(_, at)| *at)
        .max()
        .map(|at| at.duration_since(started))
        .unwrap_or_default();
    assert!(
        last < Duration::from_secs(6),
        "the slowest close took {last:?}"
    );
    let (answer, at) =
        tokio::task::spawn_blocking(move || read_until_closed(body, Duration::from_secs(10)))
            .await?;
    assert!(at.is_some(), "the slow body's connection is still open");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    // And normal requests still work after.
    let r = client()
        .post(serve.at("/v1/sessions/n/messages"))
        .json(&serde_json::json!({"message": "again"}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    Ok(())
}

#[tokio::test]
async fn past_the_connection_limit_new_connections_wait_for_a_free_slot() -> TestResult {
    let (_dir, _model, serve) =
        serve_ok(&["--header-timeout", "2", "--max-connections", "4"]).await?;
    let target = addr(&serve);
    // Four idle connections take every slot until the header timeout closes them.
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(&target))
        .collect::<Result<_, _>>()?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let r = client().get(serve.at("/healthz")).send().await?;
    let waited = started.elapsed();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await?, "ok\n");
    assert!(
        waited >= Duration::from_millis(1200),
        "answered after {waited:?}: the fifth connection did not wait"
    );
    assert!(waited < Duration::from_secs(8), "waited {waited:?}");
    drop(idle);
    // With free slots, requests are answered at once.
    let started = Instant::now();
    let r = client().get(serve.at("/healthz")).send().await?;
    assert_eq!(r.status(), 200);
    assert!(started.elapsed() < Duration::from_secs(1));
    Ok(())
}
