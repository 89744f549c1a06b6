//! Tool calls cut by a crash, settled at the session's next call (docs/tools.md,
//! *Exactly-once tools*): a tool that reconciles gets its recorded outcome as the result, an
//! idempotent tool runs again with the same call id and key, any other is reported
//! `outcome_unknown`; each gets an observation linked to its intent. The crash is the
//! intents file a killed process leaves (intents without an end); the SIGKILL itself is
//! tested in `examples/idempotent-tool/tests/crash.rs`.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{
    ContentBlock, Message, Reconciled, RuntimeContext, Tool, ToolContext, ToolOutput, ToolSpec,
};
use hame_fs::{AppendOptions, FsPath};
use hame_harness::HarnessAgent;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A tool that records each run (`call_id`, key) and each reconcile (key).
#[derive(Debug)]
struct Probe {
    name: &'static str,
    idempotent: bool,
    /// What `reconcile` answers.
    known: Option<&'static str>,
    runs: Mutex<Vec<(String, String)>>,
    lookups: Mutex<Vec<String>>,
}

impl Probe {
    fn new(name: &'static str, idempotent: bool, known: Option<&'static str>) -> Arc<Self> {
        Arc::new(Self {
            name,
            idempotent,
            known,
            runs: Mutex::default(),
            lookups: Mutex::default(),
        })
    }

    fn runs(&self) -> Vec<(String, String)> {
        self.runs.lock().map(|r| r.clone()).unwrap_or_default()
    }

    fn lookups(&self) -> Vec<String> {
        self.lookups.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

#[async_trait]
impl Tool for Probe {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.into(),
            description: "probe".into(),
            parameters: Arc::new(json!({"type": "object", "properties": {}})),
        }
    }

    async fn call(&self, _arguments: Value, ctx: &ToolContext) -> ToolOutput {
        if let Ok(mut r) = self.runs.lock() {
            r.push((ctx.call_id.clone(), ctx.idempotency_key()));
        }
        ctx.facts().set("ran", true);
        Ok(format!("{} ran", self.name))
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }

    async fn reconcile(&self, key: &str, _ctx: &ToolContext) -> Reconciled {
        if let Ok(mut l) = self.lookups.lock() {
            l.push(key.to_owned());
        }
        match self.known {
            Some("!panic") => panic!("a broken reconcile"),
            Some(text) => Reconciled::Known(Ok(text.to_owned())),
            None => Reconciled::Unknown,
        }
    }
}

/// The key the harness gives call `id` of session `s1` of user `ada`.
fn key_of(id: &str) -> String {
    ToolContext::new(RuntimeContext::new("s1").with_user("ada"), id).idempotency_key()
}

fn intent(id: &str, tool: &str) -> String {
    format!(
        "{}\n",
        json!({"call_id": id, "tool": tool, "args": "{}", "key": key_of(id)})
    )
}

#[tokio::test]
async fn cut_calls_are_reconciled_rerun_or_unknown_with_observations() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    let ledger = Probe::new("ledger", false, Some("order 7 placed"));
    let stamp = Probe::new("stamp", true, None);
    let pay = Probe::new("pay", false, None);
    let boom = Probe::new("boom", true, Some("!panic"));
    let model = Arc::new(ScriptedModel::new([Reply::text("settled")]));
    let agent = HarnessAgent::builder()
        .model(model.clone())
        .workspace(&ws)
        .state_store(Arc::new(hame_state::JsonStore::open(
            dir.path().join("state"),
        )?))
        .memory(hame_harness::memory::MemoryOptions::disabled())
        .tool(ledger.clone())
        .tool(stamp.clone())
        .tool(pay.clone())
        .tool(boom.clone())
        .build()?;
    let ctx = RuntimeContext::new("s1").with_user("ada");
    // What a process killed during three calls leaves: intents without an end (and a
    // finished one, which stays finished).
    let records = agent.workspace_for(&ctx)?.records().clone();
    let path = FsPath::parse("agents/hame/sessions/s1.intents.jsonl")?;
    let text = [
        intent("c0", "pay"),
        format!("{}\n", json!({"call_id": "c0", "end": "done"})),
        intent("c1", "ledger"),
        intent("c2", "stamp"),
        intent("c3", "pay"),
        intent("c4", "boom"),
    ]
    .concat();
    records
        .append(&path, text.into_bytes(), AppendOptions::default())
        .await?;
    let out = agent.call(Message::user("go on"), &ctx).await?;
    assert_eq!(out.reply.text_content(), "settled");
    // Asked first; the idempotent one ran again with its own call id and key; nothing
    // else ran.
    assert_eq!(ledger.lookups(), [key_of("c1")]);
    assert!(ledger.runs().is_empty());
    assert_eq!(stamp.lookups(), [key_of("c2")]);
    assert_eq!(stamp.runs(), [("c2".to_owned(), key_of("c2"))]);
    assert_eq!(pay.lookups(), [key_of("c3")]);
    assert!(pay.runs().is_empty(), "pay is not run again");
    // A reconcile that panics leaves the call unknown, even for an idempotent tool.
    assert!(boom.runs().is_empty());
    // The model's request: the user message, the three calls, their results.
    let reqs = model.requests();
    let last = reqs.first().ok_or("no request")?.messages.clone();
    let results: Vec<(String, String, Option<String>)> = last
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            ContentBlock::ToolResult(r) => Some((r.id.clone(), r.content.clone(), r.code.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 4, "{results:?}");
    assert_eq!(results[3].2.as_deref(), Some("outcome_unknown"));
    assert_eq!(results[0], ("c1".into(), "order 7 placed".into(), None));
    assert_eq!(results[1], ("c2".into(), "stamp ran".into(), None));
    assert_eq!(results[2].0, "c3");
    assert_eq!(results[2].2.as_deref(), Some("outcome_unknown"));
    // Observations, linked to the intents by call id and key.
    let obs = records
        .read_bytes(&FsPath::parse(
            "agents/hame/sessions/s1.observations.jsonl",
        )?)
        .await?;
    let obs: Vec<Value> = String::from_utf8(obs)?
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let of = |id: &str| {
        obs.iter()
            .find(|o| o["call_id"] == id)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(of("c1")["outcome"], "ok");
    assert_eq!(of("c1")["facts"], json!({"reconciled": true}));
    assert_eq!(of("c1")["idempotency_key"], key_of("c1").as_str());
    assert_eq!(of("c2")["outcome"], "ok");
    assert_eq!(of("c2")["facts"], json!({"ran": true, "rerun": true}));
    assert_eq!(of("c3")["outcome"], "outcome_unknown");
    assert_eq!(of("c3")["code"], "outcome_unknown");
    assert_eq!(of("c3")["idempotency_key"], key_of("c3").as_str());
    assert_eq!(of("c0"), Value::Null, "a finished call is left alone");
    // The intents are settled: the next call finds nothing to do.
    let text = String::from_utf8(records.read_bytes(&path).await?)?;
    for end in [
        json!({"call_id": "c1", "end": "reconciled"}),
        json!({"call_id": "c2", "end": "done"}),
        json!({"call_id": "c3", "end": "outcome_unknown"}),
        json!({"call_id": "c4", "end": "outcome_unknown"}),
    ] {
        assert!(text.contains(&end.to_string()), "{end} in {text}");
    }
    Ok(())
}
