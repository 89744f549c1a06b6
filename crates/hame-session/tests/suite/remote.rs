//! The session log on the shared store: Redis through `hame-fs-remote` (native `APPEND`,
//! Lua compare-and-set), as replicas use it.

use std::sync::Arc;

use hame_core::Message;
use hame_fs::Filesystem;
use hame_session::{Error, IndexUpdate};
use pretty_assertions::assert_eq;

use super::helpers::{TestResult, log_at};

/// The Redis URL, or `None` after a loud skip (a failure under CI).
fn redis_url() -> Option<String> {
    hame_test_env::service("HAME_TEST_REDIS_URL", "Redis session-log")
}

async fn redis_fs() -> Result<Option<Arc<dyn Filesystem>>, hame_fs::Error> {
    let Some(url) = redis_url() else {
        return Ok(None);
    };
    let namespace = format!("hame-session-{}", uuid::Uuid::new_v4().simple());
    Ok(Some(hame_fs_remote::open(&url, &namespace).await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_share_one_log_and_index_on_redis() -> TestResult {
    let Some(fs) = redis_fs().await? else {
        return Ok(());
    };
    // Sixteen replicas (own SessionLog, own Redis connection) taking turns under a lease.
    let lease = Arc::new(tokio::sync::Mutex::new(()));
    let mut tasks = Vec::new();
    for w in 0..16 {
        let log = log_at(fs.clone(), w);
        let lease = lease.clone();
        tasks.push(tokio::spawn(async move {
            for c in 0..3 {
                let _held = lease.lock().await;
                let messages = [
                    Message::user(format!("w{w}-c{c}")),
                    Message::assistant("ok"),
                ];
                log.append_messages("shared", &format!("w{w}-c{c}"), &messages)
                    .await?;
            }
            // And each replica its own session, racing on the index without any lease.
            log.append_messages(&format!("own-{w}"), "c", &[Message::user("mine")])
                .await?;
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let log = log_at(fs.clone(), 0);
    let records = log.read("shared", ..).await?;
    assert_eq!(
        records.iter().map(|r| r.seq).collect::<Vec<_>>(),
        (0..96).collect::<Vec<u64>>()
    );
    let sessions = log.list_sessions().await?;
    assert_eq!(sessions.len(), 17);
    let shared = sessions
        .iter()
        .find(|s| s.id == "shared")
        .map(|s| s.message_count);
    assert_eq!(shared, Some(96));

    // A torn tail on Redis is skipped and the next append starts on a fresh line.
    let path = log.log_path("shared")?;
    fs.append(
        &path,
        br#"{"v":1,"seq":96,"ti"#.to_vec(),
        hame_fs::AppendOptions::default(),
    )
    .await?;
    assert_eq!(
        log.append_messages("shared", "after", &[Message::user("x")])
            .await?,
        96..97
    );
    let page = log.read_page("shared", 95, 10).await?;
    assert_eq!((page.records.len(), page.skipped_lines), (2, 1));
    log.update_index("shared", &IndexUpdate::new().with_title("Renamed"))
        .await?;
    assert_eq!(
        log.session("shared").await?.map(|e| e.title),
        Some("Renamed".into())
    );
    Ok(())
}

/// An index entry that lags its log is listed with the log's count and time on Redis too
/// (`suite::index`): the modification times there are the store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_entry_behind_its_log_is_refreshed_on_redis() -> TestResult {
    let Some(fs) = redis_fs().await? else {
        return Ok(());
    };
    super::index::entry_behind_its_log(fs).await
}
