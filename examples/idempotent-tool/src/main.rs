//! A tool that changes the outside world exactly once, whatever crashes.
//!
//! `place_order` places an order in a *ledger* (a folder standing for a business API): it
//! passes the harness's [`ToolContext::idempotency_key`] along as the order's key, so the
//! ledger keeps one order per key, written durably (temporary file, `fsync`, rename)
//! before the tool returns. It implements [`Tool::reconcile`]: after a crash cut a call,
//! the harness's next call of the session asks it first, and the order found under the
//! call's key becomes the call's result; when none is found the model is told
//! `outcome_unknown` — and should it place the same order again, the call carries the
//! same key, so the ledger still holds one order. The contract is in `docs/tools.md`
//! (*Exactly-once tools*).
//!
//! ```sh
//! hame-scripted-server examples/idempotent-tool/script.json -- \
//!   cargo run -q -p example-idempotent-tool -- /tmp/orders-ws /tmp/orders-ledger "Order 2 widgets"
//! ```
//!
//! Arguments: `WORKSPACE LEDGER [MESSAGE]`. `HAME_MODEL` picks the model (default
//! `openai:gpt-4o-mini`). To see a crash in the middle of a call, `PLACE_ORDER_PAUSE` makes
//! the tool wait that many milliseconds `before:MS` placing the order or `after:MS` it
//! (then kill the process, and run it again with another message). Each run of the tool
//! appends `KEY ITEM QUANTITY` to `LEDGER/calls.log`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use hame::prelude::*;
use hame::{CancellationToken, EventSink, HarnessAgent, Message, RuntimeContext};

/// Arguments of `place_order`.
#[derive(Debug, Deserialize, JsonSchema)]
struct OrderArgs {
    /// What to order.
    item: String,
    /// How many (1 to 1000).
    quantity: u32,
}

/// Where the tool waits, for a demonstration of a crash mid-call.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pause {
    None,
    Before(Duration),
    After(Duration),
}

impl Pause {
    fn parse(text: Option<&str>) -> anyhow::Result<Self> {
        let Some(text) = text.filter(|t| !t.is_empty()) else {
            return Ok(Self::None);
        };
        let bad =
            || anyhow::anyhow!("PLACE_ORDER_PAUSE must be before:MS or after:MS, not {text:?}");
        let (at, ms) = text.split_once(':').ok_or_else(bad)?;
        let ms = Duration::from_millis(ms.parse().map_err(|_| bad())?);
        match at {
            "before" => Ok(Self::Before(ms)),
            "after" => Ok(Self::After(ms)),
            _ => Err(bad()),
        }
    }
}

/// Places orders in a ledger folder, one per idempotency key.
#[derive(Debug)]
struct PlaceOrder {
    ledger: PathBuf,
    pause: Pause,
}

impl PlaceOrder {
    /// The order file of a key; `None` for a key that is not `hame-` and hex digits (the
    /// harness makes them, but a file name is built from it).
    fn order_path(&self, key: &str) -> Option<PathBuf> {
        let hex = key.strip_prefix("hame-")?;
        (!hex.is_empty() && hex.len() <= 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| self.ledger.join(format!("{key}.order")))
    }

    fn failed(e: impl std::fmt::Display) -> ToolError {
        ToolError::new(
            "ledger_failed",
            format!("the ledger could not be written: {e}"),
        )
    }
}

/// Writes `bytes` to `path` durably: a temporary file, `fsync`, rename, `fsync` of the
/// folder. A crash leaves either no file or the whole file.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[async_trait]
impl TypedTool for PlaceOrder {
    type Args = OrderArgs;

    fn name(&self) -> &str {
        "place_order"
    }

    fn description(&self) -> String {
        "Place an order for an item. Each call places one order.".into()
    }

    async fn run(&self, args: OrderArgs, ctx: &ToolContext) -> ToolOutput {
        if args.item.trim().is_empty() || args.item.len() > 200 || args.item.contains('\n') {
            return Err(ToolError::invalid_arguments(
                "`item` must be one line of 1 to 200 characters",
            ));
        }
        if !(1..=1000).contains(&args.quantity) {
            return Err(ToolError::invalid_arguments(
                "`quantity` must be between 1 and 1000",
            ));
        }
        let key = ctx.idempotency_key();
        let path = self
            .order_path(&key)
            .ok_or_else(|| ToolError::new("bad_key", "the idempotency key is not hame-HEX"))?;
        std::fs::create_dir_all(&self.ledger).map_err(Self::failed)?;
        let log = format!("{key} {} {}\n", args.item, args.quantity);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.ledger.join("calls.log"))
            .and_then(|mut f| std::io::Write::write_all(&mut f, log.as_bytes()))
            .map_err(Self::failed)?;
        // The ledger knows this key: the same order, not a second one.
        if let Ok(done) = std::fs::read_to_string(&path) {
            return Ok(done);
        }
        if let Pause::Before(d) = self.pause {
            tokio::time::sleep(d).await;
        }
        let outcome = format!(
            "order {} placed: {} x {}",
            &key[5..13],
            args.quantity,
            args.item
        );
        write_durably(&path, outcome.as_bytes()).map_err(Self::failed)?;
        if let Pause::After(d) = self.pause {
            tokio::time::sleep(d).await;
        }
        Ok(outcome)
    }

    /// The order placed under `key`, if the ledger has it.
    async fn reconcile(&self, key: &str, _ctx: &ToolContext) -> Reconciled {
        match self.order_path(key).map(std::fs::read_to_string) {
            Some(Ok(outcome)) => Reconciled::Known(Ok(outcome)),
            _ => Reconciled::Unknown,
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: example-idempotent-tool WORKSPACE LEDGER [MESSAGE]";
    let workspace = PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!(usage))?);
    let ledger = PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!(usage))?);
    let message = args.next().unwrap_or_else(|| "Order 2 widgets.".to_owned());
    let env = |k: &str| std::env::var(k).ok();
    let pause = Pause::parse(env("PLACE_ORDER_PAUSE").as_deref())?;
    std::fs::create_dir_all(&workspace)?;
    let spec = env("HAME_MODEL").unwrap_or_else(|| "openai:gpt-4o-mini".to_owned());
    let agent = HarnessAgent::builder()
        .name("orders")
        .model(hame::model::open(&spec, &env)?)
        .workspace(&workspace)
        .tool(typed(PlaceOrder { ledger, pause }))
        .build()?;
    let (ctx, cancel) = (RuntimeContext::new("orders"), CancellationToken::new());
    let out = agent
        .call_with(Message::user(message), &ctx, &EventSink::none(), &cancel)
        .await?;
    println!("{}", out.reply.text_content());
    Ok(())
}
