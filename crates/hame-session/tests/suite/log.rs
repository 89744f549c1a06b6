//! Appending, reading, re-opening, torn lines.

use std::sync::Arc;

use hame_core::{Message, Role};
use hame_fs::{Filesystem, FsPath, InMemoryFs, LocalFs};
use hame_session::{Error, LogRecord, SessionLog};
use pretty_assertions::assert_eq;

use super::helpers::{TestResult, exchange, log_at, t};

fn mem() -> Arc<dyn Filesystem> {
    Arc::new(InMemoryFs::new())
}

#[tokio::test]
async fn appends_get_consecutive_seqs_across_calls_and_reopens() -> TestResult {
    let fs = mem();
    let first = exchange("what is in a.txt?", r#"{"path":"a.txt"}"#, "alpha");
    let log = log_at(fs.clone(), 0);
    assert_eq!(log.append_messages("s1", "c1", &first).await?, 0..4);
    assert_eq!(
        log.append_messages("s1", "c2", &[Message::user("and b?")])
            .await?,
        4..5
    );
    // A new writer (a restart, another replica) recovers the next number from the log.
    let reopened = log_at(fs.clone(), 10);
    assert_eq!(
        reopened
            .append_messages("s1", "c3", &[Message::assistant("b is empty")])
            .await?,
        5..6
    );
    // The first writer notices that the file grew and does not reuse 5.
    assert_eq!(
        log.append_messages("s1", "c4", &[Message::user("thanks")])
            .await?,
        6..7
    );
    // Other sessions count on their own.
    assert_eq!(
        log.append_messages("s2", "c5", &[Message::user("new")])
            .await?,
        0..1
    );

    let records = log_at(fs.clone(), 0).read("s1", ..).await?;
    let mut expected: Vec<LogRecord> = first
        .iter()
        .enumerate()
        .map(|(i, m)| LogRecord::new(i as u64, t(0), "c1", m.clone()))
        .collect();
    expected.push(LogRecord::new(4, t(0), "c2", Message::user("and b?")));
    expected.push(LogRecord::new(
        5,
        t(10),
        "c3",
        Message::assistant("b is empty"),
    ));
    expected.push(LogRecord::new(6, t(0), "c4", Message::user("thanks")));
    assert_eq!(records, expected);
    assert_eq!(records[1].role, Role::Assistant);
    assert_eq!(records[1].usage, first[1].usage);
    Ok(())
}

#[tokio::test]
async fn the_file_is_one_json_object_per_line() -> TestResult {
    let fs = mem();
    let log = log_at(fs.clone(), 0);
    log.append_messages("s1", "c1", &exchange("q", r#"{"path":"x"}"#, "r"))
        .await?;
    let bytes = fs
        .read_bytes(&FsPath::parse("agents/main/sessions/s1.log.jsonl")?)
        .await?;
    let text = String::from_utf8(bytes)?;
    assert!(text.ends_with('\n'));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(
        lines[0],
        r#"{"v":1,"seq":0,"time":"2025-01-02T03:04:05.000Z","call_id":"c1","role":"user","message":{"role":"user","content":[{"type":"text","text":"q"}]}}"#
    );
    for line in lines {
        let _: serde_json::Value = serde_json::from_str(line)?;
    }
    Ok(())
}

#[tokio::test]
async fn tool_io_is_never_truncated() -> TestResult {
    let fs = mem();
    let log = log_at(fs, 0);
    let big_args = format!(r#"{{"content":"{}"}}"#, "x".repeat(200_000));
    let big_result = "line\n".repeat(50_000);
    let messages = exchange("write it", &big_args, &big_result);
    log.append_messages("s1", "c1", &messages).await?;
    let back: Vec<Message> = log
        .read("s1", ..)
        .await?
        .into_iter()
        .map(|r| r.message)
        .collect();
    assert_eq!(back, messages);
    Ok(())
}

#[tokio::test]
async fn read_filters_by_seq_range_and_pages() -> TestResult {
    let log = log_at(mem(), 0);
    for i in 0..10 {
        log.append_messages("s1", &format!("c{i}"), &[Message::user(format!("m{i}"))])
            .await?;
    }
    let seqs = |records: Vec<LogRecord>| records.into_iter().map(|r| r.seq).collect::<Vec<_>>();
    assert_eq!(seqs(log.read("s1", 3..6).await?), vec![3, 4, 5]);
    assert_eq!(seqs(log.read("s1", 8..).await?), vec![8, 9]);
    assert_eq!(seqs(log.read("s1", ..=1).await?), vec![0, 1]);
    assert_eq!(seqs(log.read("s1", 20..).await?), Vec::<u64>::new());

    let page = log.read_page("s1", 4, 4).await?;
    assert_eq!(seqs(page.records), vec![4, 5, 6, 7]);
    assert_eq!(
        (page.next_seq, page.last_seq, page.total_records),
        (Some(8), Some(9), 10)
    );
    let page = log.read_page("s1", 8, 4).await?;
    assert_eq!((page.records.len(), page.next_seq), (2, None));
    Ok(())
}

#[tokio::test]
async fn missing_session_is_not_found() -> TestResult {
    let log = log_at(mem(), 0);
    assert!(matches!(
        log.read("nope", ..).await,
        Err(Error::SessionNotFound { .. })
    ));
    assert!(!log.exists("nope").await?);
    Ok(())
}

#[tokio::test]
async fn empty_append_writes_nothing() -> TestResult {
    let fs = mem();
    let log = log_at(fs.clone(), 0);
    assert_eq!(log.append_messages("s1", "c1", &[]).await?, 0..0);
    assert!(!log.exists("s1").await?);
    log.append_messages("s1", "c1", &[Message::user("a")])
        .await?;
    assert_eq!(log.append_messages("s1", "c2", &[]).await?, 1..1);
    Ok(())
}

#[tokio::test]
async fn sync_flushes_an_existing_log_and_leaves_a_missing_one_missing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let fs: Arc<dyn Filesystem> = Arc::new(LocalFs::new(dir.path())?);
    let log = log_at(fs.clone(), 0);
    log.sync("s1").await?;
    assert!(!log.exists("s1").await?);
    let written = log
        .append_messages_with(
            "s1",
            "c1",
            &[Message::user("a"), Message::assistant("b")],
            hame_fs::AppendOptions::atomic(),
        )
        .await?;
    assert_eq!(written, 0..2);
    log.sync("s1").await?;
    // The flush adds nothing: the next append continues the numbering.
    assert_eq!(
        log.append_messages("s1", "c2", &[Message::user("c")])
            .await?,
        2..3
    );
    assert_eq!(log.read("s1", ..).await?.len(), 3);
    Ok(())
}

#[tokio::test]
async fn the_index_is_written_once_it_has_a_title() -> TestResult {
    let fs = mem();
    let log = log_at(fs.clone(), 0);
    let untitled = hame_session::IndexUpdate::new().with_message_count_at_least(1);
    // No title yet: written, and written again next time.
    let first = log.update_index_once("s1", &untitled).await?;
    assert!(first.is_some_and(|e| e.title.is_empty()));
    let titled = hame_session::IndexUpdate::new()
        .with_message_count_at_least(2)
        .with_title_if_unset("hello");
    let second = log.update_index_once("s1", &titled).await?;
    assert_eq!(
        second.map(|e| (e.title, e.message_count)),
        Some(("hello".into(), 2))
    );
    // Titled: later updates leave the file alone.
    let later = hame_session::IndexUpdate::new().with_message_count_at_least(9);
    assert_eq!(log.update_index_once("s1", &later).await?, None);
    let stored = fs
        .read_bytes(&FsPath::parse("agents/main/sessions/index/s1.json")?)
        .await?;
    assert!(String::from_utf8_lossy(&stored).contains("\"message_count\":2"));
    // Another session is its own.
    assert!(log.update_index_once("s2", &titled).await?.is_some());
    Ok(())
}

/// Appends a torn record (a crash mid-append): partial JSON, no newline.
async fn tear(fs: &dyn Filesystem, session: &str, torn: &[u8]) -> TestResult {
    let path = FsPath::parse(&format!("agents/main/sessions/{session}.log.jsonl"))?;
    fs.append(&path, torn.to_vec(), hame_fs::AppendOptions::default())
        .await?;
    Ok(())
}

async fn torn_last_line_is_skipped_and_next_append_parses(fs: Arc<dyn Filesystem>) -> TestResult {
    let log = log_at(fs.clone(), 0);
    log.append_messages(
        "s1",
        "c1",
        &[Message::user("one"), Message::assistant("two")],
    )
    .await?;
    // Cut inside a multi-byte character too: the torn tail is not even UTF-8.
    let mut torn = br#"{"v":1,"seq":2,"time":"2025-01-02T03:04:05.000Z","call_id":"c2","role":"user","message":{"role":"user","content":[{"type":"text","text":"caf"#.to_vec();
    torn.push(0xC3);
    tear(fs.as_ref(), "s1", &torn).await?;

    let page = log.read_page("s1", 0, 100).await?;
    assert_eq!(page.records.len(), 2);
    assert_eq!(page.skipped_lines, 0, "a torn tail is not a damaged line");

    // The same writer sees the file changed under it; a fresh writer reads the tail.
    for (writer, call) in [(&log, "c3"), (&log_at(fs.clone(), 0), "c4")] {
        writer
            .append_messages("s1", call, &[Message::user(call)])
            .await?;
    }
    let records = log.read("s1", ..).await?;
    let got: Vec<(u64, String)> = records
        .iter()
        .map(|r| (r.seq, r.message.text_content()))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, "one".into()),
            (1, "two".into()),
            (2, "c3".into()),
            (3, "c4".into())
        ]
    );
    // The torn line is now a terminated, damaged line: counted, skipped, never fatal.
    assert_eq!(log.read_page("s1", 0, 100).await?.skipped_lines, 1);
    Ok(())
}

#[tokio::test]
async fn torn_last_line_in_memory() -> TestResult {
    torn_last_line_is_skipped_and_next_append_parses(mem()).await
}

#[tokio::test]
async fn torn_last_line_on_local_disk() -> TestResult {
    let dir = tempfile::tempdir()?;
    torn_last_line_is_skipped_and_next_append_parses(Arc::new(LocalFs::new(dir.path())?)).await
}

#[tokio::test]
async fn an_empty_append_over_a_torn_tail_does_not_forget_the_newline() -> TestResult {
    let fs = mem();
    let log = log_at(fs.clone(), 0);
    log.append_messages("s1", "c1", &[Message::user("one")])
        .await?;
    tear(fs.as_ref(), "s1", br#"{"v":1,"seq":1"#).await?;
    assert_eq!(log.append_messages("s1", "c2", &[]).await?, 1..1);
    assert_eq!(
        log.append_messages("s1", "c3", &[Message::user("two")])
            .await?,
        1..2
    );
    let page = log.read_page("s1", 0, 10).await?;
    let texts: Vec<String> = page
        .records
        .iter()
        .map(|r| r.message.text_content())
        .collect();
    assert_eq!(
        (texts, page.skipped_lines),
        (vec!["one".into(), "two".into()], 1)
    );
    Ok(())
}

#[tokio::test]
async fn a_log_that_is_only_a_torn_line_starts_at_zero() -> TestResult {
    let fs = mem();
    tear(fs.as_ref(), "s1", br#"{"v":1,"seq":0,"ti"#).await?;
    let log = log_at(fs.clone(), 0);
    assert_eq!(
        log.append_messages("s1", "c1", &[Message::user("hi")])
            .await?,
        0..1
    );
    assert_eq!(log.read("s1", ..).await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn hostile_ids_are_rejected_before_touching_storage() -> TestResult {
    let fs = mem();
    let log = log_at(fs.clone(), 0);
    let long = "a".repeat(129);
    for bad in [
        "",
        ".",
        "..",
        "../x",
        "a/b",
        "/abs",
        "a\\b",
        ".hidden",
        "a..b",
        "a\0b",
        "a b",
        "ü",
        "s1\n",
        long.as_str(),
    ] {
        let appended = log.append_messages(bad, "c1", &[Message::user("x")]).await;
        assert!(
            matches!(appended, Err(Error::InvalidId { .. })),
            "{bad:?} accepted: {appended:?}"
        );
        assert!(
            matches!(log.read(bad, ..).await, Err(Error::InvalidId { .. })),
            "{bad:?}"
        );
        assert!(
            matches!(
                log.update_index(bad, &hame_session::IndexUpdate::new())
                    .await,
                Err(Error::InvalidId { .. })
            ),
            "{bad:?}"
        );
        assert!(
            matches!(
                SessionLog::new(fs.clone(), bad),
                Err(Error::InvalidId { .. })
            ),
            "agent {bad:?}"
        );
    }
    assert_eq!(fs.list(&FsPath::root()).await?, vec![]);
    for good in ["s1", "2025-01-02_a.b", "user@example.com", "A-Z_09"] {
        log.append_messages(good, "c1", &[Message::user("x")])
            .await?;
    }
    Ok(())
}

/// Two replicas that raced without the lease wrote the same numbers; reading sorts by
/// number and a page never splits a number, so paging loses nothing.
#[tokio::test]
async fn duplicate_seqs_from_a_replica_race_page_without_loss() -> TestResult {
    let fs = mem();
    let path = FsPath::parse("agents/main/sessions/s1.log.jsonl")?;
    let mut data = Vec::new();
    for (seq, text) in [
        (0, "a0"),
        (1, "a1"),
        (2, "a2"),
        (1, "b1"),
        (2, "b2"),
        (3, "c3"),
    ] {
        serde_json::to_writer(
            &mut data,
            &LogRecord::new(seq, t(0), "c", Message::user(text)),
        )?;
        data.push(b'\n');
    }
    fs.write(&path, data, hame_fs::WriteOptions::default())
        .await?;
    let log = log_at(fs.clone(), 0);
    let mut pages = Vec::new();
    let mut from = 0;
    loop {
        let page = log.read_page("s1", from, 2).await?;
        pages.push(
            page.records
                .iter()
                .map(|r| r.message.text_content())
                .collect::<Vec<_>>(),
        );
        match page.next_seq {
            Some(next) => from = next,
            None => break,
        }
    }
    assert_eq!(
        pages,
        vec![vec!["a0", "a1", "b1"], vec!["a2", "b2"], vec!["c3"]]
    );
    // The next writer continues after the highest number at the end of the file.
    assert_eq!(
        log.append_messages("s1", "c", &[Message::user("d")])
            .await?,
        4..5
    );
    Ok(())
}

/// A writer that did not write the log itself (a restart, another replica) finds the next
/// number from the log's tail: a ranged read of 64 KiB, not the whole log.
#[tokio::test]
async fn a_new_writer_recovers_from_the_logs_tail_not_the_whole_log() -> TestResult {
    let inner = mem();
    let log = log_at(inner.clone(), 0);
    let big = "x".repeat(10_000);
    for i in 0..100 {
        log.append_messages("s1", &format!("c{i}"), &[Message::user(big.as_str())])
            .await?;
    }
    let size = inner.stat(&log.log_path("s1")?).await?.size;
    assert!(size > 1_000_000, "{size}");

    let counting = hame_fs::CountingFs::new(inner.clone());
    let reopened = log_at(Arc::new(counting.clone()), 10);
    assert_eq!(
        reopened
            .append_messages("s1", "next", &[Message::user("after the restart")])
            .await?,
        100..101
    );
    // One ranged read of the log's last 64 KiB, and the session's small index file.
    let counts = counting.counts();
    assert_eq!(counts.of("read_range"), 1, "{counts:?}");
    assert!(counts.bytes_read <= 64 * 1024 + 1024, "{counts:?}");
    Ok(())
}
