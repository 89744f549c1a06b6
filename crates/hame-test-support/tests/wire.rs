//! The server's bytes on the wire, read with a plain HTTP client.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use hame_test_support::{RecordedRequest, Script, ScriptStep, ScriptToolCall, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn post(url: &str, body: Value) -> Result<(u16, String, Option<String>), reqwest::Error> {
    let resp = reqwest::Client::new()
        .post(url)
        .header("x-test", "yes")
        .json(&body)
        .send()
        .await?;
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok((status, resp.text().await?, retry_after))
}

fn data_lines(sse: &str) -> Vec<&str> {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect()
}

#[tokio::test]
async fn openai_stream_splits_arguments_and_ends_with_done() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(
        ScriptStep::tool_calls(vec![ScriptToolCall::new(
            "call_1",
            "ls",
            &json!({"path": "src/lib.rs"}),
        )])
        .with_usage(7, 3),
    );
    let url = format!("{}/chat/completions", server.base_url());
    let (status, text, _) = post(
        &url,
        json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "messages": []}),
    )
    .await?;
    assert_eq!(status, 200);
    let lines = data_lines(&text);
    assert_eq!(lines.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = lines[..lines.len() - 1]
        .iter()
        .map(|l| serde_json::from_str(l))
        .collect::<Result<_, _>>()?;
    let arg_pieces: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/delta/tool_calls/0/function/arguments"))
        .filter_map(Value::as_str)
        .filter(|s| !s.is_empty())
        .collect();
    assert!(arg_pieces.len() >= 3, "{arg_pieces:?}");
    assert_eq!(arg_pieces.concat(), r#"{"path":"src/lib.rs"}"#);
    let finish: Vec<&str> = chunks
        .iter()
        .filter_map(|c| {
            c.pointer("/choices/0/finish_reason")
                .and_then(Value::as_str)
        })
        .collect();
    assert_eq!(finish, vec!["tool_calls"]);
    let usage = chunks.last().and_then(|c| c.get("usage")).cloned();
    assert_eq!(
        usage,
        Some(
            json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                    "prompt_tokens_details": {"cached_tokens": 0}})
        )
    );
    let req: &RecordedRequest = &server.requests()[0];
    assert_eq!(req.method, "POST");
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(req.header("X-Test"), Some("yes"));
    assert!(req.is_stream());
    Ok(())
}

#[tokio::test]
async fn anthropic_stream_event_sequence() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::reasoning("think", Some("sig"), "answer"));
    let url = format!("{}/v1/messages", server.url());
    let (status, text, _) =
        post(&url, json!({"model": "c", "stream": true, "messages": []})).await?;
    assert_eq!(status, 200);
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        events,
        vec![
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    assert!(text.contains(r#""type":"signature_delta""#));
    Ok(())
}

#[tokio::test]
async fn whole_bodies_errors_and_exhaustion() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("hi").with_usage(1, 1));
    server.push(ScriptStep::rate_limited(3));
    server.push(ScriptStep::anthropic_context_overflow());
    let (s, body, _) = post(
        &format!("{}/chat/completions", server.base_url()),
        json!({"model": "m"}),
    )
    .await?;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_str(&body)?;
    assert_eq!(v["choices"][0]["message"]["content"], "hi");
    assert_eq!(v["object"], "chat.completion");
    let (s, body, retry_after) = post(&format!("{}/v1/messages", server.url()), json!({})).await?;
    assert_eq!((s, retry_after.as_deref()), (429, Some("3")));
    let v: Value = serde_json::from_str(&body)?;
    assert_eq!(v["error"]["type"], "rate_limit_error");
    let (s, body, _) = post(&format!("{}/v1/messages", server.url()), json!({})).await?;
    assert_eq!(s, 400);
    assert_eq!(
        serde_json::from_str::<Value>(&body)?,
        json!({"type": "error", "error": {"type": "invalid_request_error",
               "message": "prompt is too long: 210000 tokens > 200000 maximum"}})
    );
    let (s, body, _) = post(&format!("{}/v1/messages", server.url()), json!({})).await?;
    assert_eq!(s, 400);
    assert!(body.contains("script exhausted at request 4"), "{body}");
    assert_eq!(server.request_count(), 4);
    Ok(())
}

#[test]
fn scripts_round_trip_through_json() -> TestResult {
    let script = Script {
        steps: vec![
            ScriptStep::text("a").with_usage(1, 2),
            ScriptStep::malformed_tool_call("c", "t"),
            ScriptStep::rate_limited(1),
            ScriptStep::dashscope_context_overflow(),
            ScriptStep::text("slow").with_delay(std::time::Duration::from_millis(5)),
        ],
        fallback: Some(ScriptStep::text("done")),
    };
    let text = serde_json::to_string_pretty(&script)?;
    assert_eq!(Script::from_json(&text)?, script);
    let bare = Script::from_json(r#"[{"kind":"message","text":"x"}]"#)?;
    assert_eq!(bare.steps, vec![ScriptStep::text("x")]);
    Ok(())
}

/// The binary prints its address and serves the script file.
#[tokio::test]
async fn binary_serves_a_script_file() -> TestResult {
    let dir = std::env::temp_dir().join(format!("hame-scripted-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("script.json");
    std::fs::write(
        &path,
        r#"{"steps":[{"kind":"message","text":"from file"}],"fallback":{"kind":"message","text":"again"}}"#,
    )?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_hame-scripted-server"))
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()?;
    let result = async {
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .ok_or_else(|| format!("unexpected first line {line:?}"))?
            .to_owned();
        for want in ["from file", "again", "again"] {
            let (s, body, _) =
                post(&format!("{url}/v1/chat/completions"), json!({"model": "m"})).await?;
            assert_eq!(s, 200);
            let v: Value = serde_json::from_str(&body)?;
            assert_eq!(v["choices"][0]["message"]["content"], want);
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    }
    .await;
    child.kill()?;
    child.wait()?;
    std::fs::remove_dir_all(&dir)?;
    result
}

/// An error step can echo the key the request carried, as providers that refuse a key do.
#[tokio::test]
async fn errors_can_echo_the_key_the_request_carried() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::unauthorized_echoing_key());
    server.push(ScriptStep::error_body(
        401,
        json!({"error": {"message": "bad x-api-key {api_key}"}}),
    ));
    let url = format!("{}/chat/completions", server.base_url());
    let resp = reqwest::Client::new()
        .post(&url)
        .bearer_auth("sk-echo-me-1234")
        .json(&json!({"model": "m"}))
        .send()
        .await?;
    assert_eq!(resp.status(), 401);
    let body: Value = resp.json().await?;
    assert_eq!(
        body["error"]["message"],
        "Incorrect API key provided: sk-echo-me-1234. You sent `Authorization: Bearer sk-echo-me-1234`."
    );
    let resp = reqwest::Client::new()
        .post(&url)
        .header("x-api-key", "ant-key-5678")
        .json(&json!({"model": "m"}))
        .send()
        .await?;
    let body: Value = resp.json().await?;
    assert_eq!(body["error"]["message"], "bad x-api-key ant-key-5678");
    Ok(())
}
