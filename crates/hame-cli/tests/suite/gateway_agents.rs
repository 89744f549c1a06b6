//! `hame serve` with several agents (`[agents.NAME]` in hame.toml, `/v1/agents/{agent}/…`,
//! tokens limited to agents) and the file routes of a session (upload, list, download with
//! ranges; other tenants, traversal and links refused), black-box over HTTP.

use std::io::{Read, Write};

use hame_test_support::ScriptStep;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{Scratch, tool_results};
use super::serve::{Serve, client};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A GET sent as written (no client-side URL normalisation, so `..` and `%2e%2e` reach the
/// server as the attacker spelled them): the status and the body.
fn raw_get(
    base: &str,
    path: &str,
    user: &str,
) -> Result<(u16, String), Box<dyn std::error::Error>> {
    let addr = base.strip_prefix("http://").ok_or("not http")?;
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nX-Hame-User: {user}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("no status")?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
    Ok((status, body.unwrap_or_default()))
}

fn ids(body: &Value) -> Vec<String> {
    body["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn agents_of_hame_toml_have_their_own_routes_and_tokens_limited_to_them() -> TestResult {
    let s = Scratch::new().await?;
    let (dir, model) = (&s.dir, &s.server);
    s.write("AGENTS.md", "You are a pirate.\n")?;
    s.write(
        "hame.toml",
        "[agents.poet]\nworkspace = \"../poet-ws\"\nmax_iterations = 5\n",
    )?;
    let poet = dir.path().join("poet-ws");
    std::fs::create_dir_all(&poet)?;
    std::fs::write(poet.join("AGENTS.md"), "You are a poet.\n")?;
    let serve = Serve::start_with_tokens(
        dir.path(),
        &model.base_url(),
        json!({
            "t-all": {"user": "alice"},
            "t-poet": {"user": "bob", "agents": ["poet"]},
        }),
    )?;
    let get = |path: &str, token: &str| client().get(serve.at(path)).bearer_auth(token).send();
    let models: Value = get("/v1/models", "t-all").await?.json().await?;
    assert_eq!(ids(&models), vec!["hame", "poet"]);
    let models: Value = get("/v1/models", "t-poet").await?.json().await?;
    assert_eq!(ids(&models), vec!["poet"]);

    // Each agent answers with its own persona, through its own routes.
    model.push_all([
        ScriptStep::text("A poet answers, in verse.").when_system("You are a poet."),
        ScriptStep::text("Arr, a pirate answers.").when_system("You are a pirate."),
    ]);
    let say = |path: &str, token: &str| {
        client()
            .post(serve.at(path))
            .bearer_auth(token)
            .json(&json!({"message": "hi"}))
            .send()
    };
    let r = say("/v1/agents/poet/sessions/s1/messages", "t-poet").await?;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await?;
    assert_eq!(body["reply"], "A poet answers, in verse.");
    let r = say("/v1/agents/hame/sessions/s1/messages", "t-all").await?;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await?;
    assert_eq!(body["reply"], "Arr, a pirate answers.");
    // The session lists are the agents' own.
    let list: Value = get("/v1/agents/poet/sessions", "t-poet")
        .await?
        .json()
        .await?;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(1), "{list}");
    let r = get("/v1/agents/poet/sessions/s1/messages", "t-poet").await?;
    assert_eq!(r.status(), 200);

    // A token limited to `poet` does not reach `hame`: 404, as for an agent that is not
    // served, on the agent's routes, the default routes and the OpenAI routes.
    for path in [
        "/v1/agents/hame/sessions/s1/messages",
        "/v1/sessions/s1/messages",
        "/v1/agents/sailor/sessions/s1/messages",
    ] {
        let r = say(path, "t-poet").await?;
        assert_eq!(r.status(), 404, "{path}");
        let body: Value = r.json().await?;
        assert_eq!(body["error"]["code"], "agent_not_found", "{path}: {body}");
    }
    let r = get("/v1/agents/hame/sessions", "t-poet").await?;
    assert_eq!(r.status(), 404);
    let r = client()
        .post(serve.at("/v1/chat/completions"))
        .bearer_auth("t-poet")
        .json(&json!({"model": "hame", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await?;
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await?;
    assert_eq!(body["error"]["code"], "model_not_found");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("serves you the agent(s) `poet` ("),
        "a limited token is told only of the agents it may use: {body}"
    );
    // Only the two allowed turns reached the model.
    assert_eq!(model.requests().len(), 2);
    Ok(())
}

#[tokio::test]
async fn a_file_uploaded_by_a_user_is_read_by_their_agent_and_no_one_else() -> TestResult {
    let s = Scratch::new().await?;
    let model = &s.server;
    let serve = Serve::start(
        s.path(),
        &model.base_url(),
        &["--isolated", "--max-upload", "65536"],
    )?;
    let put = |path: &str, user: &str, body: Vec<u8>| {
        client()
            .put(serve.at(path))
            .header("x-hame-user", user)
            .body(body)
            .send()
    };
    let get = |path: &str, user: &str| {
        client()
            .get(serve.at(path))
            .header("x-hame-user", user)
            .send()
    };
    let text = "Quarterly numbers: 42 units.\n";
    let r = put(
        "/v1/sessions/s1/files/inbox/report.txt",
        "alice",
        text.into(),
    )
    .await?;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await?;
    assert_eq!(
        body,
        json!({"session": "s1", "path": "/inbox/report.txt", "size": text.len()})
    );
    let r = put(
        "/v1/sessions/s1/files/inbox/report.txt",
        "alice",
        text.into(),
    )
    .await?;
    assert_eq!(r.status(), 200, "a replaced file");

    // Her agent reads it with its own tool.
    model.push_all([
        ScriptStep::tool_call("c1", "read_file", json!({"file_path": "inbox/report.txt"})),
        ScriptStep::text("42 units."),
    ]);
    let r = client()
        .post(serve.at("/v1/sessions/s1/messages"))
        .header("x-hame-user", "alice")
        .json(&json!({"message": "What does the report say?"}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let results = tool_results(model);
    assert!(
        results
            .iter()
            .any(|r| r.contains("Quarterly numbers: 42 units.")),
        "{results:?}"
    );

    // Listing, download, a range, the agent's route.
    let r = get("/v1/sessions/s1/files?path=inbox", "alice").await?;
    assert_eq!(r.status(), 200);
    let list: Value = r.json().await?;
    assert_eq!(list["entries"][0]["path"], "/inbox/report.txt", "{list}");
    assert_eq!(list["entries"][0]["size"], text.len());
    let r = get(
        "/v1/agents/hame/sessions/s1/files/inbox/report.txt",
        "alice",
    )
    .await?;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(r.text().await?, text);
    let ranged = |range: &'static str| {
        client()
            .get(serve.at("/v1/sessions/s1/files/inbox/report.txt"))
            .header("x-hame-user", "alice")
            .header("range", range)
            .send()
    };
    let r = ranged("bytes=10-16").await?;
    assert_eq!(r.status(), 206);
    assert_eq!(
        r.headers()
            .get("content-range")
            .and_then(|v| v.to_str().ok()),
        Some(format!("bytes 10-16/{}", text.len()).as_str())
    );
    assert_eq!(r.text().await?, "numbers");
    assert_eq!(ranged("bytes=999-").await?.status(), 416);

    // Another user: 404 for the file and an empty folder, however it is named.
    for path in [
        "/v1/sessions/s1/files/inbox/report.txt",
        "/v1/agents/hame/sessions/s1/files/inbox/report.txt",
    ] {
        let r = get(path, "bob").await?;
        assert_eq!(r.status(), 404, "{path}");
        let body: Value = r.json().await?;
        assert_eq!(body["error"]["code"], "file_not_found");
    }
    let r = get("/v1/sessions/s1/files?path=inbox", "bob").await?;
    assert_eq!(r.status(), 404);

    // Hostile spellings, sent as written: refused like the file tools refuse them.
    let base = serve.at("");
    for (path, want) in [
        ("/v1/sessions/s1/files/../../../etc/passwd", 400),
        ("/v1/sessions/s1/files/%2e%2e/%2e%2e/etc/passwd", 400),
        ("/v1/sessions/s1/files/inbox%2F..%2F..%2Fsecret", 400),
        ("/v1/sessions/s1/files/a%00b", 400),
        ("/v1/sessions/s1/files?path=..", 400),
        ("/v1/sessions/s1/files?path=%2e%2e%2f", 400),
        // Absolute: the root of the caller's files, as for the tools.
        ("/v1/sessions/s1/files//etc/passwd", 404),
        ("/v1/sessions/..%2Fs2/files/inbox/report.txt", 400),
    ] {
        let (status, body) = raw_get(&base, path, "alice")?;
        assert_eq!(status, want, "{path}: {body}");
        assert!(!body.contains("root:"), "{path}: {body}");
    }
    let (status, body) = raw_get(
        &base,
        "/v1/sessions/s1/files/..%2Fs1%2Finbox%2Freport.txt",
        "bob",
    )?;
    assert_eq!(status, 400, "{body}");

    // hame's own data is not written through the routes; over the limit is 413.
    let r = put(
        "/v1/sessions/s1/files/agents/hame/sessions/s1.log.jsonl",
        "alice",
        b"{}".to_vec(),
    )
    .await?;
    assert_eq!(r.status(), 403);
    let r = put("/v1/sessions/s1/files/big.bin", "alice", vec![b'x'; 65537]).await?;
    assert_eq!(r.status(), 413);
    let body: Value = r.json().await?;
    assert_eq!(body["error"]["code"], "body_too_large");
    let r = put("/v1/sessions/s1/files/ok.bin", "alice", vec![b'x'; 65536]).await?;
    assert_eq!(r.status(), 201);
    Ok(())
}

#[tokio::test]
async fn file_routes_follow_the_permission_rules_and_no_link_leads_out() -> TestResult {
    let s = Scratch::new().await?;
    let (dir, model, ws) = (&s.dir, &s.server, &s.ws);
    s.write("secret/key.txt", "k")?;
    s.write("open.txt", "hello")?;
    s.write(
        "tools.json",
        &json!({"permissions": {"deny": ["read_file(secret/*)", "write_file(docs/**)"]}})
            .to_string(),
    )?;
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside)?;
    std::fs::write(outside.join("host.txt"), "host secret")?;
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&outside, ws.join("out"))?;
        std::os::unix::fs::symlink(outside.join("host.txt"), ws.join("leak.txt"))?;
    }
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    let get = |path: &str| client().get(serve.at(path)).send();
    let r = get("/v1/sessions/s/files/open.txt").await?;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await?, "hello");
    // The same rule whatever the spelling of the path.
    for path in [
        "/v1/sessions/s/files/secret/key.txt",
        "/v1/sessions/s/files/secret//key.txt",
        "/v1/sessions/s/files/./secret/key.txt",
        "/v1/sessions/s/files/secret%2Fkey.txt",
    ] {
        let (status, body) = raw_get(&serve.at(""), path, "")?;
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("permission_denied"), "{body}");
    }
    let r = client()
        .put(serve.at("/v1/sessions/s/files/docs/a.md"))
        .body("x")
        .send()
        .await?;
    assert_eq!(r.status(), 403);
    assert!(!ws.join("docs/a.md").exists());
    #[cfg(unix)]
    for path in [
        "/v1/sessions/s/files/leak.txt",
        "/v1/sessions/s/files/out/host.txt",
    ] {
        // The workspace refuses a link out as the read_file tool sees it: permission_denied.
        let r = get(path).await?;
        assert_eq!(r.status(), 403, "{path}");
        let body = r.text().await?;
        assert!(
            body.contains("permission_denied") && !body.contains("host secret"),
            "{path}: {body}"
        );
        let r = client()
            .put(serve.at(path))
            .body("overwritten")
            .send()
            .await?;
        assert!(r.status().is_client_error(), "{path}: {}", r.status());
    }
    assert_eq!(
        std::fs::read_to_string(outside.join("host.txt"))?,
        "host secret"
    );
    Ok(())
}

/// The file routes meet the rules a call of the file tools meets in the same session: an
/// `ask` rule (403 `approval_required`: the route cannot wait for a human), the session's
/// "always" answer to such a call (then allowed, for that file only), and plan mode (no
/// writes; reads stay allowed).
#[tokio::test]
async fn file_routes_meet_ask_rules_always_answers_and_plan_mode_as_the_tools_do() -> TestResult {
    let s = Scratch::new().await?;
    let (model, ws) = (&s.server, &s.ws);
    s.write(
        "tools.json",
        &json!({"permissions": {"ask": ["write_file(inbox/**)"]}}).to_string(),
    )?;
    s.write("readme.txt", "read me")?;
    let serve = Serve::start(s.path(), &model.base_url(), &[])?;
    let put = |path: &str, body: &'static str| client().put(serve.at(path)).body(body).send();
    let r = put("/v1/sessions/s/files/inbox/a.txt", "from the route").await?;
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await?;
    assert_eq!(body["error"]["code"], "approval_required", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("ask write_file(inbox/**)") && message.contains("always"),
        "{message}"
    );
    assert!(!ws.join("inbox/a.txt").exists());

    // The agent's own call of write_file asks; the human answers "always".
    model.push_all([
        ScriptStep::tool_call(
            "c1",
            "write_file",
            json!({"file_path": "inbox/a.txt", "content": "from the agent"}),
        ),
        ScriptStep::text("written"),
    ]);
    let r = client()
        .post(serve.at("/v1/sessions/s/messages"))
        .json(&json!({"message": "write it"}))
        .send()
        .await?;
    assert_eq!(r.status(), 202);
    let pending: Value = client()
        .get(serve.at("/v1/sessions/s/approvals"))
        .send()
        .await?
        .json()
        .await?;
    let id = pending["approvals"][0]["id"]
        .as_str()
        .ok_or("no approval")?
        .to_owned();
    let r = client()
        .post(serve.at(&format!("/v1/sessions/s/approvals/{id}")))
        .json(&json!({"decision": "approve", "always": true}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    assert_eq!(
        std::fs::read_to_string(ws.join("inbox/a.txt"))?,
        "from the agent"
    );
    // That answer holds for the route too, in that session, for that file only.
    let r = put("/v1/sessions/s/files/inbox/a.txt", "from the route").await?;
    assert_eq!(r.status(), 200);
    assert_eq!(
        std::fs::read_to_string(ws.join("inbox/a.txt"))?,
        "from the route"
    );
    let r = put("/v1/sessions/s/files/inbox/b.txt", "other file").await?;
    assert_eq!(r.status(), 403);
    let r = put("/v1/sessions/other/files/inbox/a.txt", "other session").await?;
    assert_eq!(r.status(), 403);

    // A session in plan mode: nothing is written through the route either.
    model.push_all([
        ScriptStep::tool_call("p1", "plan_enter", json!({})),
        ScriptStep::text("planning"),
    ]);
    let r = client()
        .post(serve.at("/v1/sessions/p/messages"))
        .json(&json!({"message": "plan first"}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let r = put("/v1/sessions/p/files/notes.txt", "during the plan").await?;
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await?;
    assert_eq!(body["error"]["code"], "plan_mode", "{body}");
    assert!(!ws.join("notes.txt").exists());
    let r = client()
        .get(serve.at("/v1/sessions/p/files/readme.txt"))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await?, "read me");
    let r = put("/v1/sessions/s/files/notes.txt", "no plan here").await?;
    assert_eq!(r.status(), 201);
    Ok(())
}
