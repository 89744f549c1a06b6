//! `place_order` SIGKILLed in the middle of a call, against the scripted model: the next
//! run of the session does not call it blindly. `reconcile` finds an order placed before
//! the kill and that becomes the call's result; with no order the model is told
//! `outcome_unknown`, and its new call of the same order carries the same idempotency key,
//! so the ledger holds one order.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hame_test_support::{ScriptStep, ScriptedServer};
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The example's process on a workspace, a ledger and a state home under `dir`.
fn example(dir: &Path, base: &str, message: &str, pause: &str) -> std::io::Result<Child> {
    let home = dir.to_string_lossy().into_owned();
    Command::new(env!("CARGO_BIN_EXE_example-idempotent-tool"))
        .args([
            dir.join("ws").to_string_lossy().as_ref(),
            dir.join("ledger").to_string_lossy().as_ref(),
            message,
        ])
        .env_clear()
        .env("HOME", &home)
        .env("HAME_STATE_HOME", format!("{home}/state"))
        .env("OPENAI_BASE_URL", base)
        .env("HAME_MODEL", "openai:m")
        .env("PLACE_ORDER_PAUSE", pause)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}

/// Runs the example to its end; its stdout.
async fn finish(child: Child) -> Result<String, Box<dyn std::error::Error>> {
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until a file whose name ends with `suffix` is in `dir`, then SIGKILLs `child`.
async fn kill_when(mut child: Child, dir: &Path, suffix: &str) -> TestResult {
    let start = Instant::now();
    while files(dir, suffix).is_empty() {
        if let Some(status) = child.try_wait()? {
            return Err(format!("the example ended before the kill: {status}").into());
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no {suffix} file"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // `Child::kill` is SIGKILL: no destructor, no flush, no end of the intent.
    child.kill()?;
    child.wait()?;
    Ok(())
}

/// Every file under `dir` whose name ends with `suffix`.
fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    hame_test_support::files_where(dir, &|p| p.to_string_lossy().ends_with(suffix))
}

/// The JSON lines of the one file under `dir` ending with `suffix`.
fn lines(dir: &Path, suffix: &str) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let found = files(dir, suffix);
    let [path] = found.as_slice() else {
        return Err(format!("{suffix}: {found:?}").into());
    };
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// The tool results of a model request: `(tool_call_id, content)`.
fn tool_results(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| {
                    (
                        m["tool_call_id"].as_str().unwrap_or_default().to_owned(),
                        m["content"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `KEY ITEM QUANTITY` per run of the tool.
fn calls(dir: &Path) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    Ok(std::fs::read_to_string(dir.join("ledger/calls.log"))?
        .lines()
        .map(str::to_owned)
        .collect())
}

fn order() -> Value {
    json!({"item": "widget", "quantity": 2})
}

#[tokio::test]
async fn a_call_killed_after_the_order_is_reconciled_not_run_again() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::tool_call("c1", "place_order", order()),
        ScriptStep::text("Your order is placed."),
    ]);
    let dir = tempfile::tempdir()?;
    let child = example(
        dir.path(),
        &server.base_url(),
        "Order 2 widgets.",
        "after:60000",
    )?;
    kill_when(child, &dir.path().join("ledger"), ".order").await?;
    let reply = finish(example(
        dir.path(),
        &server.base_url(),
        "Did it go through?",
        "",
    )?)
    .await?;
    assert_eq!(reply, "Your order is placed.\n");
    // The tool ran once; the second run asked the ledger instead.
    let ran = calls(dir.path())?;
    assert_eq!(ran.len(), 1, "{ran:?}");
    let key = ran[0].split(' ').next().unwrap_or_default().to_owned();
    assert_eq!(files(&dir.path().join("ledger"), ".order").len(), 1);
    // The model got the order as the call's result, not `outcome_unknown`.
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    let results = tool_results(&reqs[1].body);
    assert_eq!(
        results,
        [(
            "c1".to_owned(),
            format!("order {} placed: 2 x widget", &key[5..13])
        )]
    );
    // Its observation says it was reconciled and names the intent by call id and key.
    let observations = lines(dir.path(), "orders.observations.jsonl")?;
    let c1: Vec<&Value> = observations
        .iter()
        .filter(|o| o["call_id"] == "c1")
        .collect();
    assert_eq!(c1.len(), 1, "{observations:?}");
    assert_eq!(c1[0]["outcome"], "ok");
    assert_eq!(c1[0]["facts"]["reconciled"], true);
    assert_eq!(c1[0]["idempotency_key"], key.as_str());
    let intents = lines(dir.path(), "orders.intents.jsonl")?;
    assert!(
        intents.contains(&json!({"call_id": "c1", "end": "reconciled"})),
        "{intents:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_call_killed_before_the_order_is_unknown_and_its_retry_keeps_the_key() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::tool_call("c1", "place_order", order()),
        // Told `outcome_unknown`, the model places the same order again.
        ScriptStep::tool_call(
            "c2",
            "place_order",
            json!({"quantity": 2, "item": "widget"}),
        ),
        ScriptStep::text("Placed."),
    ]);
    let dir = tempfile::tempdir()?;
    let child = example(
        dir.path(),
        &server.base_url(),
        "Order 2 widgets.",
        "before:60000",
    )?;
    kill_when(child, &dir.path().join("ledger"), "calls.log").await?;
    assert!(files(&dir.path().join("ledger"), ".order").is_empty());
    let reply = finish(example(dir.path(), &server.base_url(), "Is it done?", "")?).await?;
    assert_eq!(reply, "Placed.\n");
    let reqs = server.requests();
    assert_eq!(reqs.len(), 3);
    // The harness did not call it; the model was told, with the call id and arguments.
    let told = tool_results(&reqs[1].body);
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].0, "c1");
    assert!(told[0].1.starts_with("outcome_unknown"), "{}", told[0].1);
    assert!(told[0].1.contains("NOT run again"), "{}", told[0].1);
    // The model's new call ran with the first call's key: one order in the ledger.
    let ran = calls(dir.path())?;
    assert_eq!(ran.len(), 2, "the first call, then the model's: {ran:?}");
    let key = ran[0].split(' ').next().unwrap_or_default().to_owned();
    assert_eq!(ran[1], ran[0], "the same key: {ran:?}");
    let orders = files(&dir.path().join("ledger"), ".order");
    assert_eq!(orders.len(), 1);
    assert!(orders[0].ends_with(format!("{key}.order")), "{orders:?}");
    let results = tool_results(&reqs[2].body);
    assert_eq!(
        results.last(),
        Some(&(
            "c2".to_owned(),
            format!("order {} placed: 2 x widget", &key[5..13])
        ))
    );
    // The observations: c1 unknown, linked to its intent; c2 placed it.
    let observations = lines(dir.path(), "orders.observations.jsonl")?;
    let of = |id: &str| -> Vec<Value> {
        observations
            .iter()
            .filter(|o| o["call_id"] == id)
            .cloned()
            .collect()
    };
    let c1 = of("c1");
    assert_eq!(c1.len(), 1, "{observations:?}");
    assert_eq!(c1[0]["outcome"], "outcome_unknown");
    assert_eq!(c1[0]["idempotency_key"], key.as_str());
    assert_eq!(of("c2")[0]["outcome"], "ok");
    let intents = lines(dir.path(), "orders.intents.jsonl")?;
    let c2 = intents
        .iter()
        .find(|r| r["call_id"] == "c2" && r.get("key").is_some())
        .ok_or("no intent of c2")?;
    assert_eq!(c2["key"], key.as_str());
    Ok(())
}
