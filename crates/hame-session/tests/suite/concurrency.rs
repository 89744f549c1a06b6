//! Many writers on one log.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hame_core::Message;
use hame_fs::{Filesystem, InMemoryFs, LocalFs};
use hame_session::{Error, SessionLog};
use pretty_assertions::assert_eq;

use super::helpers::{TestResult, log_at};

const WRITERS: usize = 16;
const CALLS: usize = 5;
const PER_CALL: usize = 3;

fn call_messages(writer: usize, call: usize) -> Vec<Message> {
    (0..PER_CALL)
        .map(|k| Message::user(format!("w{writer}-c{call}-m{k}")))
        .collect()
}

/// Every record present exactly once, seqs unique and gap-free, each call's records
/// contiguous and in order.
async fn assert_complete(log: &SessionLog) -> TestResult {
    let records = log.read("s1", ..).await?;
    assert_eq!(records.len(), WRITERS * CALLS * PER_CALL);
    let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (0..records.len() as u64).collect::<Vec<_>>());
    let texts: BTreeSet<String> = records.iter().map(|r| r.message.text_content()).collect();
    assert_eq!(texts.len(), records.len(), "a record appears twice");
    let mut by_call: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for r in &records {
        by_call.entry(r.call_id.as_str()).or_default().push(r.seq);
    }
    for (call, seqs) in by_call {
        assert_eq!(seqs.len(), PER_CALL, "{call}");
        assert_eq!(
            seqs[PER_CALL - 1] - seqs[0],
            PER_CALL as u64 - 1,
            "{call} interleaved"
        );
    }
    Ok(())
}

async fn sixteen_appenders_one_log(fs: Arc<dyn Filesystem>) -> TestResult {
    let log = log_at(fs, 0);
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut ranges = Vec::new();
            for c in 0..CALLS {
                ranges.push(
                    log.append_messages("s1", &format!("w{w}-c{c}"), &call_messages(w, c))
                        .await?,
                );
            }
            Ok::<_, Error>(ranges)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    all.sort_by_key(|r| r.start);
    let starts: Vec<u64> = all.iter().map(|r| r.start).collect();
    assert_eq!(
        starts,
        (0..(WRITERS * CALLS) as u64)
            .map(|i| i * PER_CALL as u64)
            .collect::<Vec<_>>()
    );
    assert_complete(&log).await?;
    assert_eq!(
        log.session("s1").await?.map(|e| e.message_count),
        Some((WRITERS * CALLS * PER_CALL) as u64)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_appenders_in_memory() -> TestResult {
    sixteen_appenders_one_log(Arc::new(InMemoryFs::new())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_appenders_on_local_disk() -> TestResult {
    let dir = tempfile::tempdir()?;
    sixteen_appenders_one_log(Arc::new(LocalFs::new(dir.path())?)).await
}

/// Sixteen replicas (separate `SessionLog`s) that take turns, as the harness's per-session
/// call lease makes them: each notices the others' appends and never reuses a number.
async fn sixteen_replicas_with_a_lease(fs: Arc<dyn Filesystem>) -> TestResult {
    let lease = Arc::new(tokio::sync::Mutex::new(()));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let log = log_at(fs.clone(), 0);
        let lease = lease.clone();
        tasks.push(tokio::spawn(async move {
            for c in 0..CALLS {
                let _held = lease.lock().await;
                log.append_messages("s1", &format!("w{w}-c{c}"), &call_messages(w, c))
                    .await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    assert_complete(&log_at(fs, 0)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_replicas_in_memory() -> TestResult {
    sixteen_replicas_with_a_lease(Arc::new(InMemoryFs::new())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_replicas_on_local_disk() -> TestResult {
    let dir = tempfile::tempdir()?;
    sixteen_replicas_with_a_lease(Arc::new(LocalFs::new(dir.path())?)).await
}

/// Without the lease, racing replicas may reuse numbers, but no record is lost or torn and
/// paging still visits every record exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_replicas_without_lease_lose_nothing() -> TestResult {
    let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let log = log_at(fs.clone(), 0);
        tasks.push(tokio::spawn(async move {
            for c in 0..CALLS {
                log.append_messages("s1", &format!("w{w}-c{c}"), &call_messages(w, c))
                    .await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let log = log_at(fs, 0);
    let mut seen = Vec::new();
    let mut from = 0;
    loop {
        let page = log.read_page("s1", from, 7).await?;
        assert_eq!(page.skipped_lines, 0);
        seen.extend(page.records.iter().map(|r| r.message.text_content()));
        match page.next_seq {
            Some(next) => {
                assert!(next > from);
                from = next;
            }
            None => break,
        }
    }
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(
        (seen.len(), unique.len()),
        (WRITERS * CALLS * PER_CALL, WRITERS * CALLS * PER_CALL)
    );
    Ok(())
}
