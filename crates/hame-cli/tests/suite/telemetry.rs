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
        "invoke_agent hame",
        "hame.step",
        "chat m",
        "execute_tool list_files",
        "gen_ai.operation.name",
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

/// A span as the collector received it: name, kind, trace and span ids (hex), parent id,
/// status code and its string or integer attributes.
#[derive(Debug, Clone)]
struct Got {
    name: String,
    kind: i32,
    trace: String,
    id: String,
    parent: String,
    status: i32,
    attrs: std::collections::BTreeMap<String, String>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Decodes the OTLP/protobuf bodies the collector kept.
fn spans(posts: &[(String, Vec<u8>)]) -> Result<Vec<Got>, Box<dyn std::error::Error>> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    use prost::Message;
    let mut out = Vec::new();
    for (_, body) in posts {
        let req = ExportTraceServiceRequest::decode(body.as_slice())?;
        for s in req
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
        {
            let attrs = s
                .attributes
                .iter()
                .filter_map(|kv| {
                    let v = match kv.value.as_ref()?.value.as_ref()? {
                        V::StringValue(s) => s.clone(),
                        V::IntValue(i) => i.to_string(),
                        V::BoolValue(b) => b.to_string(),
                        other => format!("{other:?}"),
                    };
                    Some((kv.key.clone(), v))
                })
                .collect();
            out.push(Got {
                name: s.name.clone(),
                kind: s.kind,
                trace: hex(&s.trace_id),
                id: hex(&s.span_id),
                parent: hex(&s.parent_span_id),
                status: s.status.as_ref().map_or(0, |st| st.code),
                attrs,
            });
        }
    }
    Ok(out)
}

#[tokio::test]
async fn serve_exports_genai_spans_in_the_callers_trace_and_sends_traceparent_on() -> TestResult {
    use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
    use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
    use pretty_assertions::assert_eq;
    let dir = tempfile::tempdir()?;
    let (otlp, got) = collector().await?;
    let model = ScriptedServer::start().await?;
    model.push_all([
        ScriptStep::tool_call("c1", "list_files", serde_json::json!({})),
        ScriptStep::tool_call("c2", "made_up_tool", serde_json::json!({})),
        ScriptStep::text("traced").with_usage(12, 3),
        ScriptStep::error(400, "bad request from the provider"),
    ]);
    let serve =
        super::serve::Serve::start(dir.path(), &model.base_url(), &["--otlp-endpoint", &otlp])?;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller = "00f067aa0ba902b7";
    let http = reqwest::Client::new();
    let r = http
        .post(serve.at("/v1/sessions/t1/messages"))
        .header("traceparent", format!("00-{trace}-{caller}-01"))
        .json(&serde_json::json!({"message": "hi"}))
        .send()
        .await?;
    assert_eq!(r.status(), 200, "{}", serve.stderr());
    let body: serde_json::Value = r.json().await?;
    assert_eq!(body["reply"], "traced");
    // A second turn, without a traceparent: a trace of its own; its model request fails.
    let failed = http
        .post(serve.at("/v1/sessions/t2/messages"))
        .json(&serde_json::json!({"message": "again"}))
        .send()
        .await?;
    assert!(!failed.status().is_success());
    // A malformed traceparent is ignored (a trace of its own), not an error.
    let junk = "00-zz-not-a-trace-01";
    let r = http
        .get(serve.at("/healthz"))
        .header("traceparent", junk)
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    // "Not sampled" does not hide a request: its span is exported, in the caller's trace.
    let unsampled = "0af7651916cd43dd8448eb211c80319c";
    let r = http
        .get(serve.at("/v1/sessions"))
        .header("traceparent", format!("00-{unsampled}-b7ad6b7169203331-00"))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let metrics = http.get(serve.at("/metrics")).send().await?.text().await?;
    assert!(
        metrics.contains(r#"hame_tool_calls_total{agent="hame",tool="other",outcome="error"} 1"#),
        "{metrics}"
    );
    assert!(!metrics.contains("made_up_tool"), "{metrics}");
    // The model server got the caller's trace id, with a span of hame's as the parent.
    let sent: Vec<String> = model
        .requests()
        .iter()
        .map(|r| r.header("traceparent").unwrap_or("").to_owned())
        .collect();
    assert_eq!(sent.len(), 4);
    for t in &sent[..3] {
        assert!(t.starts_with(&format!("00-{trace}-")), "{sent:?}");
        assert!(!t.contains(caller), "{sent:?}");
    }
    assert!(
        sent[3].len() == 55 && !sent[3].contains(trace),
        "the second turn is its own trace: {sent:?}"
    );
    assert_eq!(serve.stop().await?, Some(0));
    let posts = got.lock().map(|g| g.clone()).unwrap_or_default();
    let all = spans(&posts)?;
    let named = |n: &str| {
        all.iter()
            .filter(|s| s.name == n)
            .cloned()
            .collect::<Vec<_>>()
    };
    let one = |n: &str| -> Result<Got, String> {
        match named(n).as_slice() {
            [s] => Ok(s.clone()),
            other => Err(format!(
                "{} spans named {n:?}: {:?}",
                other.len(),
                all.iter().map(|s| &s.name).collect::<Vec<_>>()
            )),
        }
    };
    // The SERVER span continues the caller's trace under the caller's span.
    let servers = named("POST /v1/sessions/{session}/messages");
    assert_eq!(servers.len(), 2, "{all:?}");
    let first = servers
        .iter()
        .find(|s| s.trace == trace)
        .ok_or("no SERVER span in the caller's trace")?;
    assert_eq!(first.kind, SpanKind::Server as i32);
    assert_eq!(first.parent, caller);
    assert_eq!(first.attrs["http.request.method"], "POST");
    assert_eq!(first.attrs["http.route"], "/v1/sessions/{session}/messages");
    assert_eq!(first.attrs["http.response.status_code"], "200");
    let health = one("GET /healthz")?;
    assert_eq!(health.kind, SpanKind::Server as i32);
    assert_eq!(health.parent, "");
    assert!(
        health.trace.len() == 32 && health.trace != trace,
        "{health:?}"
    );
    let listed = one("GET /v1/sessions")?;
    assert_eq!(listed.trace, unsampled);
    assert_eq!(listed.parent, "b7ad6b7169203331");
    // invoke_agent: one per turn, INTERNAL, the failed one an error.
    let agents = named("invoke_agent hame");
    assert_eq!(agents.len(), 2);
    let ok_agent = agents
        .iter()
        .find(|s| s.trace == trace)
        .ok_or("no invoke_agent span in the caller's trace")?;
    assert_eq!(ok_agent.kind, SpanKind::Internal as i32);
    assert_eq!(ok_agent.attrs["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(ok_agent.attrs["gen_ai.agent.name"], "hame");
    assert_eq!(ok_agent.attrs["gen_ai.conversation.id"], "t1");
    assert_ne!(ok_agent.status, StatusCode::Error as i32);
    let bad_agent = agents
        .iter()
        .find(|s| s.trace != trace)
        .ok_or("no second invoke_agent span")?;
    assert_eq!(bad_agent.status, StatusCode::Error as i32);
    // chat: CLIENT spans; the model server's traceparent names them as parents.
    let chats = named("chat m");
    assert_eq!(
        chats.len(),
        4,
        "{:?}",
        all.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    for c in &chats {
        assert_eq!(c.kind, SpanKind::Client as i32);
        assert_eq!(c.attrs["gen_ai.operation.name"], "chat");
        assert_eq!(c.attrs["gen_ai.request.model"], "m");
        assert_eq!(c.attrs["gen_ai.provider.name"], "openai");
        assert_eq!(c.attrs["gen_ai.system"], "openai");
    }
    for t in &sent {
        let parent = t.split('-').nth(2).unwrap_or("");
        assert!(
            chats.iter().any(|c| c.id == parent && t.contains(&c.trace)),
            "{t} names no chat span"
        );
    }
    let last = chats
        .iter()
        .find(|c| {
            c.attrs
                .get("gen_ai.response.finish_reasons")
                .map(String::as_str)
                == Some("stop")
        })
        .ok_or("no chat span that finished with stop")?;
    assert_eq!(last.trace, trace);
    assert_eq!(last.attrs["gen_ai.usage.input_tokens"], "12");
    assert_eq!(last.attrs["gen_ai.usage.output_tokens"], "3");
    assert_eq!(last.attrs["gen_ai.response.model"], "m");
    assert!(last.attrs["gen_ai.response.id"].starts_with("chatcmpl-"));
    let failed_chat = chats
        .iter()
        .find(|c| c.trace != trace)
        .ok_or("no chat span of the second turn")?;
    assert_eq!(failed_chat.status, StatusCode::Error as i32);
    assert!(
        failed_chat.attrs.contains_key("error.type"),
        "{failed_chat:?}"
    );
    // execute_tool: INTERNAL; the invented tool's is an error.
    let tool = one("execute_tool list_files")?;
    assert_eq!(tool.kind, SpanKind::Internal as i32);
    assert_eq!(tool.trace, trace);
    assert_eq!(tool.attrs["gen_ai.operation.name"], "execute_tool");
    assert_eq!(tool.attrs["gen_ai.tool.name"], "list_files");
    assert_eq!(tool.attrs["gen_ai.tool.call.id"], "c1");
    assert_ne!(tool.status, StatusCode::Error as i32);
    let invented = one("execute_tool made_up_tool")?;
    assert_eq!(invented.status, StatusCode::Error as i32);
    assert_eq!(invented.attrs["error.type"], "unknown_tool");
    // Every span of the first turn is in the caller's trace.
    assert!(
        all.iter()
            .filter(|s| s.attrs.get("gen_ai.conversation.id").map(String::as_str) == Some("t1"))
            .all(|s| s.trace == trace)
    );
    Ok(())
}

#[tokio::test]
async fn an_mcp_tool_call_carries_the_execute_tool_span_as_its_trace_parent() -> TestResult {
    let Some(py) = super::mcp::python() else {
        return Ok(());
    };
    let http = super::mcp::http_server(&py)?;
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    std::fs::write(
        ws.join("tools.json"),
        serde_json::json!({"mcpServers": {"web": {
            "transport": "http",
            "url": format!("http://127.0.0.1:{}/mcp", http.1),
        }}})
        .to_string(),
    )?;
    let (otlp, got) = collector().await?;
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::tool_call("c1", "mcp__web__trace", serde_json::json!({})),
        ScriptStep::text("done"),
    ]);
    let ws_s = ws.to_string_lossy().into_owned();
    let out = run_with(
        dir.path(),
        &server.base_url(),
        &["--workspace", &ws_s, "--otlp-endpoint", &otlp],
        "trace it",
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let results = super::common::tool_results(&server);
    let posts = got.lock().map(|g| g.clone()).unwrap_or_default();
    let all = spans(&posts)?;
    let tool = all
        .iter()
        .find(|s| s.name == "execute_tool mcp__web__trace")
        .ok_or("no execute_tool span")?;
    // In `_meta` (every transport) and, over HTTP, as the header.
    let parent = format!("00-{}-{}-01", tool.trace, tool.id);
    assert_eq!(results, [format!("traceparent={parent} header={parent}")]);
    Ok(())
}

/// A durable run (`POST …/runs`, executed later by a worker) continues the submitting
/// request's trace: the trace context is stored with the run, and the worker's spans and
/// its model request are in the caller's trace.
#[tokio::test]
async fn a_durable_run_continues_the_submitting_requests_trace() -> TestResult {
    use pretty_assertions::assert_eq;
    let dir = tempfile::tempdir()?;
    let (otlp, got) = collector().await?;
    let model = ScriptedServer::start().await?;
    model.push_all([ScriptStep::text("run done")]);
    let serve =
        super::serve::Serve::start(dir.path(), &model.base_url(), &["--otlp-endpoint", &otlp])?;
    let trace = "5bf92f3577b34da6a3ce929d0e0e4737";
    let http = reqwest::Client::new();
    let r = http
        .post(serve.at("/v1/sessions/r1/runs"))
        .header("traceparent", format!("00-{trace}-10f067aa0ba902b7-01"))
        .json(&serde_json::json!({"message": "later"}))
        .send()
        .await?;
    assert_eq!(r.status(), 202, "{}", serve.stderr());
    let run: serde_json::Value = r.json().await?;
    let id = run["run_id"].as_str().ok_or("no run id")?.to_owned();
    let started = std::time::Instant::now();
    let status = loop {
        let run: serde_json::Value = http
            .get(serve.at(&format!("/v1/runs/{id}")))
            .send()
            .await?
            .json()
            .await?;
        let status = run["status"].as_str().unwrap_or_default().to_owned();
        if status == "completed" || started.elapsed() > std::time::Duration::from_secs(30) {
            break status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(status, "completed");
    let sent: Vec<String> = model
        .requests()
        .iter()
        .map(|r| r.header("traceparent").unwrap_or("").to_owned())
        .collect();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].starts_with(&format!("00-{trace}-")), "{sent:?}");
    assert_eq!(serve.stop().await?, Some(0));
    let posts = got.lock().map(|g| g.clone()).unwrap_or_default();
    let all = spans(&posts)?;
    let in_trace: Vec<&str> = all
        .iter()
        .filter(|s| s.trace == trace)
        .map(|s| s.name.as_str())
        .collect();
    for name in ["POST /v1/sessions/{session}/runs", "hame.run", "chat m"] {
        assert!(in_trace.contains(&name), "{name} not in {in_trace:?}");
    }
    assert!(
        in_trace.iter().any(|n| n.starts_with("invoke_agent")),
        "{in_trace:?}"
    );
    Ok(())
}

/// Issue #33: each `chat` span carries its request's context manifest in compact form
/// (`hame.context.manifest`, at most 4 KiB): the same sections, hashes and counts, in the
/// same order, as the manifest `hame sessions context` reads from the session.
#[tokio::test]
async fn the_chat_span_carries_the_requests_context_manifest() -> TestResult {
    use pretty_assertions::assert_eq;
    let (otlp, got) = collector().await?;
    let s = super::common::Scratch::scripted([
        ScriptStep::tool_call("c1", "list_files", serde_json::json!({})),
        ScriptStep::text("traced"),
    ])
    .await?;
    s.write(
        "AGENTS.md",
        "# Persona\nThe fact: the vault code is 4711.\n",
    )?;
    s.run_code(0, &s.ws_args(&["--otlp-endpoint", &otlp]), "hi", &[])
        .await?;
    let manifests = s.session_json("context", &[]).await?;
    let manifests = manifests.as_array().ok_or("not a list of manifests")?;
    assert_eq!(manifests.len(), 2, "{manifests:?}");
    let mut expected: Vec<String> = manifests
        .iter()
        .map(|m| {
            let sections = m["sections"].as_array().cloned().unwrap_or_default();
            let mut text = format!("sections={} counted={}", sections.len(), m["counted"]);
            for x in &sections {
                text.push_str(&format!(
                    "\n{} {} {} {}",
                    x["counted"],
                    x["transform"].as_str().unwrap_or("?"),
                    x["hash"].as_str().unwrap_or("?"),
                    x["source"].as_str().unwrap_or("?")
                ));
            }
            text
        })
        .collect();
    let posts = got.lock().map(|g| g.clone()).unwrap_or_default();
    let mut on_spans: Vec<String> = spans(&posts)?
        .into_iter()
        .filter(|x| x.name == "chat m")
        .map(|x| {
            x.attrs
                .get("hame.context.manifest")
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert!(
        on_spans.iter().all(|m| m.len() <= 4096),
        "a manifest over the bound"
    );
    assert!(
        expected
            .iter()
            .any(|m| m.contains("verbatim") && m.contains("system:agents_md")),
        "{expected:?}"
    );
    expected.sort();
    on_spans.sort();
    assert_eq!(on_spans, expected);
    Ok(())
}
