//! The web console of `hame serve` in headless Chromium, driven over the DevTools protocol
//! (`console_driver.py`, Python `websockets` in a venv under the target directory): a
//! message and its reply scrolled into view, a reload that keeps the session, a stop button
//! that cancels a long `execute`, a bad session id as a sentence, long ids that wrap.
//! Screenshots are kept under `<target>/tmp/console-shots/`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::serve::{Serve, ask_before_write_file, client, texts, ws_log};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Debian's `chromium`, or `None` (loud SKIPPED; under CI a failure).
fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser"] {
        for dir in std::env::var("PATH").unwrap_or_default().split(':') {
            let p = Path::new(dir).join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    hame_test_env::skip("chromium is not installed; `cargo xtask services` installs it");
    None
}

/// A Python with `websockets` (the DevTools client of the driver).
fn websockets_python() -> Option<PathBuf> {
    super::common::python_venv("cdp-venv", "websockets>=13,<18", "websockets.sync.client")
}

/// A headless Chromium with the DevTools protocol on a free port; killed when dropped.
struct Browser {
    child: Child,
    port: u16,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    fn start(chromium: &Path, profile: &Path) -> Result<Self, Box<dyn std::error::Error>> {
        let mut child = std::process::Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--window-size=1200,700",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .env("HOME", profile)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let mut seen = Vec::new();
        let port = loop {
            let Some(line) = lines.next() else {
                let _ = child.kill();
                return Err(format!("chromium exited: {}", seen.join("\n")).into());
            };
            let line = line?;
            if let Some(url) = line.split("DevTools listening on ").nth(1) {
                let port = url
                    .trim_start_matches("ws://")
                    .split(['/', ':'])
                    .nth(1)
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| format!("no port in {line}"))?;
                break port;
            }
            seen.push(line);
        };
        // Keep reading stderr so that Chromium never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(Self { child, port })
    }
}

#[tokio::test]
async fn serve_console_in_headless_chromium() -> TestResult {
    let Some(chromium) = chromium() else {
        return Ok(());
    };
    let Some(py) = websockets_python() else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    let long_id = format!("a-very-long-session-id-{}", "x".repeat(90));
    let mut reply: String = (1..=60)
        .map(|i| format!("line {i} of a long answer\n"))
        .collect();
    reply.push_str("Console reply from the agent.");
    model.push_all([
        ScriptStep::text("noted"),
        ScriptStep::text(reply),
        ScriptStep::tool_call("c1", "execute", json!({"command": "sleep 30"})),
        ScriptStep::tool_call(
            "c2",
            "write_file",
            json!({"file_path": "/out.txt", "content": "approved"}),
        ),
        ScriptStep::text("written"),
    ]);
    let ws = ask_before_write_file(dir.path())?;
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    // The long-id session exists before the page lists it.
    let r = client()
        .post(serve.at(&format!("/v1/sessions/{long_id}/messages")))
        .json(&json!({"message": "hi"}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-shots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots)?;
    let browser = Browser::start(&chromium, &dir.path().join("chromium"))?;
    let script = dir.path().join("console_driver.py");
    std::fs::write(&script, include_str!("console_driver.py"))?;
    let (port, base, shots_arg, id) = (
        browser.port.to_string(),
        serve.at(""),
        shots.clone(),
        long_id.clone(),
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(py)
            .arg(script)
            .args([port, base])
            .arg(shots_arg)
            .arg(id)
            .output()
    })
    .await??;
    drop(browser);
    if !out.status.success() {
        let state = |path: &str| {
            let url = serve.at(path);
            async move {
                match client().get(url).send().await {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(e) => e.to_string(),
                }
            }
        };
        panic!(
            "the driver failed: {}\nruns: {}\nlog: {}\nserve: {}",
            String::from_utf8_lossy(&out.stderr),
            state("/v1/sessions/web/runs").await,
            state("/v1/sessions/web/messages").await,
            serve.stderr()
        );
    }
    let got: Value = serde_json::from_slice(&out.stdout)?;
    // The reply is shown and scrolled into view (the log overflows, so it had to scroll).
    let r = &got["reply"];
    assert!(r["overflow"].as_f64().unwrap_or(0.0) > 0.0, "{got}");
    assert!(r["scrollTop"].as_f64().unwrap_or(0.0) > 0.0, "{got}");
    assert_eq!(r["lastVisible"], true, "{got}");
    assert!(
        r["lastText"]
            .as_str()
            .unwrap_or("")
            .ends_with("Console reply from the agent.")
    );
    assert_eq!(r["hash"], "#/s/web");
    // A reload keeps the session; nothing was sent twice.
    assert_eq!(
        got["reload"],
        json!({"hash": "#/s/web", "current": "web", "sent": ["hello console"]})
    );
    // Busy with a stop button; stop cancelled the 30 s command within seconds.
    assert_eq!(got["busy"]["stopVisible"], true, "{got}");
    assert_eq!(got["busy"]["stopEnabled"], true, "{got}");
    assert_eq!(got["busy"]["sendDisabled"], true, "{got}");
    assert_eq!(got["stopped"]["note"], true, "{got}");
    assert_eq!(got["stopped"]["toolShown"], true, "{got}");
    assert_eq!(got["stopped"]["sendEnabled"], true, "{got}");
    let secs = got["stopped"]["seconds"].as_f64().unwrap_or(99.0);
    assert!(secs < 10.0, "stopping took {secs} s");
    eprintln!("console: stop to idle in {secs} s");
    let runs: Value = client()
        .get(serve.at("/v1/sessions/web/runs"))
        .send()
        .await?
        .json()
        .await?;
    let statuses: Vec<&str> = runs["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["status"].as_str())
        .collect();
    // The run that waited for the page's approval went on with the decision: completed.
    assert_eq!(
        statuses,
        vec!["completed", "cancelled", "completed"],
        "{runs}"
    );
    assert_eq!(
        runs["runs"][0]["approvals"][0]["decision"],
        json!({"approve": true}),
        "{runs}"
    );
    assert_eq!(model.remaining(), 0);
    assert_eq!(
        texts(&ws_log(dir.path(), None, "web"))
            .iter()
            .filter(|t| t.starts_with("user:"))
            .count(),
        3
    );
    // Approved in the page: the file is written and the reply shown.
    assert_eq!(got["approval"]["note"], true, "{got}");
    assert!(
        got["approval"]["listed"]
            .as_str()
            .unwrap_or("")
            .contains("write_file"),
        "{got}"
    );
    assert!(
        got["approved"].as_str().unwrap_or("").ends_with("written"),
        "{got}"
    );
    assert_eq!(std::fs::read_to_string(ws.join("out.txt"))?, "approved");
    // A bad id: the API's message as a sentence, no JSON.
    let bad = got["bad_id"].as_str().unwrap_or("");
    assert!(bad.starts_with("Cannot open session “bad id?”: "), "{bad}");
    assert!(!bad.contains('{') && !bad.contains("\"error\""), "{bad}");
    // A long id wraps: nothing overflows sideways, the entry takes several lines.
    assert_eq!(got["long_id"]["asideOverflow"], 0, "{got}");
    assert_eq!(got["long_id"]["mainOverflow"], 0, "{got}");
    assert!(
        got["long_id"]["liLines"].as_f64().unwrap_or(0.0) >= 2.0,
        "{got}"
    );
    assert_eq!(got["long_id"]["current"], true);
    assert_eq!(got["sidebar_hash"], "#/s/web");
    for name in [
        "1-reply",
        "2-reloaded",
        "3-busy",
        "4-stopped",
        "5-bad-id",
        "6-long-id",
        "7-approval",
        "8-approved",
    ] {
        let png = std::fs::read(shots.join(format!("{name}.png")))?;
        assert!(png.starts_with(b"\x89PNG"), "{name}.png is not a PNG");
    }
    Ok(())
}
