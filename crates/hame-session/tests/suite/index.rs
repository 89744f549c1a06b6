//! The session index: titles, ordering, compare-and-set, repair.

use std::sync::Arc;

use hame_core::Message;
use hame_fs::{Filesystem, FsPath, InMemoryFs, WriteOptions};
use hame_session::{Error, IndexUpdate, SessionEntry, SessionLog, SessionLogOptions};
use pretty_assertions::assert_eq;

use super::helpers::{TestResult, fixed_clock, log_at, t};

/// A log of agent `main` at `secs` whose writes leave the index alone: a process whose
/// index updates were lost.
fn quiet_log_at(fs: Arc<dyn Filesystem>, secs: i64) -> Result<SessionLog, Error> {
    SessionLog::with_options(
        fs,
        "main",
        SessionLogOptions {
            update_index: false,
            ..fixed_clock(secs)
        },
    )
}

/// The ids of the sessions `log` lists, in its order.
async fn listed_ids(log: &SessionLog) -> Result<Vec<String>, Error> {
    Ok(log
        .list_sessions()
        .await?
        .into_iter()
        .map(|e| e.id)
        .collect())
}

#[tokio::test]
async fn index_tracks_title_times_and_counts_newest_first() -> TestResult {
    let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    let long = format!("  Please   refactor\n the {} module ", "very ".repeat(30));
    log_at(fs.clone(), 0)
        .append_messages("old", "c1", &[Message::system("sys"), Message::user(&long)])
        .await?;
    log_at(fs.clone(), 5)
        .append_messages("new", "c2", &[Message::assistant("no user yet")])
        .await?;
    log_at(fs.clone(), 9)
        .append_messages(
            "old",
            "c3",
            &[Message::user("second question"), Message::assistant("a")],
        )
        .await?;

    let sessions = log_at(fs.clone(), 0).list_sessions().await?;
    let title: String = format!("Please refactor the {}", "very ".repeat(30))
        .chars()
        .take(79)
        .collect();
    assert_eq!(
        sessions,
        vec![
            SessionEntry {
                id: "old".into(),
                title: format!("{}…", title.trim_end()),
                created: t(0),
                updated: t(9),
                message_count: 4,
            },
            SessionEntry {
                id: "new".into(),
                title: String::new(),
                created: t(5),
                updated: t(5),
                message_count: 1,
            },
        ]
    );
    assert!(sessions[0].title.chars().count() <= hame_session::TITLE_MAX_CHARS);
    Ok(())
}

#[tokio::test]
async fn explicit_updates_merge() -> TestResult {
    let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    let log = log_at(fs, 3);
    let entry = log
        .update_index(
            "s1",
            &IndexUpdate::new()
                .with_title("Renamed")
                .with_message_count_at_least(7),
        )
        .await?;
    assert_eq!(
        (entry.title.as_str(), entry.message_count, entry.created),
        ("Renamed", 7, t(3))
    );
    // Counts never go down, titles-if-unset never replace, time only moves forward.
    let entry = log
        .update_index(
            "s1",
            &IndexUpdate::new()
                .with_title_if_unset("ignored")
                .with_message_count_at_least(2)
                .at(t(1)),
        )
        .await?;
    assert_eq!(
        entry,
        SessionEntry {
            id: "s1".into(),
            title: "Renamed".into(),
            created: t(1),
            updated: t(3),
            message_count: 7,
        }
    );
    assert_eq!(log.session("s1").await?, Some(entry));
    assert_eq!(log.session("s2").await?, None);
    Ok(())
}

#[tokio::test]
async fn concurrent_replicas_never_lose_a_session() -> TestResult {
    let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    let mut tasks = Vec::new();
    for i in 0..16 {
        // Each replica is its own SessionLog: only the compare-and-set keeps them honest.
        let log = log_at(fs.clone(), i);
        tasks.push(tokio::spawn(async move {
            for round in 0..3u64 {
                log.update_index(
                    &format!("s{i}"),
                    &IndexUpdate::new().with_message_count_at_least(round + 1),
                )
                .await?;
                log.update_index(
                    "shared",
                    &IndexUpdate::new().with_message_count_at_least(i as u64 * 3 + round),
                )
                .await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let sessions = log_at(fs, 0).list_sessions().await?;
    assert_eq!(sessions.len(), 17);
    for entry in &sessions {
        let expected = if entry.id == "shared" { 47 } else { 3 };
        assert_eq!(entry.message_count, expected, "{}", entry.id);
    }
    Ok(())
}

#[tokio::test]
async fn a_corrupt_index_file_is_left_alone_and_can_be_rebuilt() -> TestResult {
    let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    let log = log_at(fs.clone(), 0);
    log.append_messages(
        "a",
        "c1",
        &[Message::user("first a"), Message::assistant("x")],
    )
    .await?;
    log_at(fs.clone(), 4)
        .append_messages("b", "c2", &[Message::user("first b")])
        .await?;
    let index = FsPath::parse("agents/main/sessions/index/a.json")?;
    assert_eq!(log.index_path("a")?, index);
    fs.write(&index, b"{not json".to_vec(), WriteOptions::default())
        .await?;

    // Appending still logs; the index error says so and carries the range written.
    match log
        .append_messages("a", "c3", &[Message::user("again")])
        .await
    {
        Err(Error::IndexNotUpdated { written, source }) => {
            assert_eq!(written, 2..3);
            assert!(matches!(*source, Error::Corrupt { .. }));
        }
        other => panic!("expected IndexNotUpdated, got {other:?}"),
    }
    assert_eq!(fs.read_bytes(&index).await?, b"{not json");
    let from_logs = vec![
        SessionEntry {
            id: "b".into(),
            title: "first b".into(),
            created: t(4),
            updated: t(4),
            message_count: 1,
        },
        SessionEntry {
            id: "a".into(),
            title: "first a".into(),
            created: t(0),
            updated: t(0),
            message_count: 3,
        },
    ];
    // Listing still works: the session with the unreadable file is listed from its log,
    // and the file is left as it was.
    assert_eq!(log.list_sessions().await?, from_logs);
    assert_eq!(fs.read_bytes(&index).await?, b"{not json");

    let rebuilt = log.rebuild_index().await?;
    assert_eq!(rebuilt, from_logs);
    assert_eq!(log.session("a").await?, Some(from_logs[1].clone()));
    Ok(())
}

/// An update writes only its own session's small file: with many sessions of one user, the
/// cost of a call does not grow with their number, and the others' files stay untouched.
#[tokio::test]
async fn an_update_writes_only_its_sessions_file() -> TestResult {
    let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    let log = log_at(fs.clone(), 0);
    for i in 0..200 {
        log.append_messages(&format!("s{i:03}"), "c1", &[Message::user(format!("q{i}"))])
            .await?;
    }
    let dir = FsPath::parse("agents/main/sessions/index")?;
    let before = fs.read_bytes(&dir.join("s000.json")?).await?;
    log_at(fs.clone(), 50)
        .append_messages("s199", "c2", &[Message::assistant("a")])
        .await?;
    let file = fs.read_bytes(&dir.join("s199.json")?).await?;
    // One entry, not two hundred.
    assert!(file.len() < 300, "{} bytes", file.len());
    assert_eq!(fs.read_bytes(&dir.join("s000.json")?).await?, before);
    assert!(
        !fs.exists(&FsPath::parse("agents/main/sessions/sessions.json")?)
            .await?
    );
    let listed = log.list_sessions().await?;
    assert_eq!(listed.len(), 200);
    assert_eq!(
        (
            listed[0].id.as_str(),
            listed[0].updated,
            listed[0].message_count
        ),
        ("s199", t(50), 2)
    );
    // Then ties on `updated` by id.
    assert_eq!(
        (listed[1].id.as_str(), listed[199].id.as_str()),
        ("s000", "s198")
    );
    Ok(())
}

/// The whole-tenant `sessions.json` of an earlier build is listed, seeds a session's file
/// on its next update (title and creation time carry over) and is never rewritten.
#[tokio::test]
async fn the_old_whole_tenant_index_is_read_and_carried_over() -> TestResult {
    let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    let quiet = quiet_log_at(fs.clone(), 0)?;
    for id in ["old1", "old2"] {
        quiet
            .append_messages(id, "c1", &[Message::user("from the log")])
            .await?;
    }
    let legacy = FsPath::parse("agents/main/sessions/sessions.json")?;
    let old = serde_json::json!({"version": 1, "sessions": {
        "old1": {"id": "old1", "title": "Renamed by the user", "created": "2025-01-02T03:04:05.000Z",
                 "updated": "2025-01-02T03:04:07.000Z", "message_count": 1},
        "old2": {"id": "old2", "title": "Second", "created": "2025-01-02T03:04:05.000Z",
                 "updated": "2025-01-02T03:04:06.000Z", "message_count": 1},
    }});
    let old_bytes = serde_json::to_vec_pretty(&old)?;
    fs.write(&legacy, old_bytes.clone(), WriteOptions::default())
        .await?;

    let log = log_at(fs.clone(), 10);
    let listed: Vec<(String, String)> = log
        .list_sessions()
        .await?
        .into_iter()
        .map(|e| (e.id, e.title))
        .collect();
    assert_eq!(
        listed,
        [
            ("old1".to_owned(), "Renamed by the user".to_owned()),
            ("old2".to_owned(), "Second".to_owned()),
        ]
    );
    log.append_messages("old2", "c2", &[Message::user("another question")])
        .await?;
    assert_eq!(
        log.session("old2").await?,
        Some(SessionEntry {
            id: "old2".into(),
            title: "Second".into(),
            created: t(0),
            updated: t(10),
            message_count: 2,
        })
    );
    let ids = listed_ids(&log).await?;
    assert_eq!(ids, ["old2", "old1"]);
    assert_eq!(fs.read_bytes(&legacy).await?, old_bytes);
    Ok(())
}

#[tokio::test]
async fn logs_missing_from_the_index_are_listed_and_added() -> TestResult {
    let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    // Three processes wrote logs; their index updates were lost (never made).
    let quiet = quiet_log_at(fs.clone(), 100)?;
    for id in ["a", "b", "c"] {
        quiet
            .append_messages(id, "c1", &[Message::user(format!("question {id}"))])
            .await?;
    }
    // One update did land.
    log_at(fs.clone(), 200)
        .append_messages("d", "c1", &[Message::user("question d")])
        .await?;
    let log = log_at(fs.clone(), 300);
    let listed = listed_ids(&log).await?;
    assert_eq!(listed, ["d", "a", "b", "c"]);
    // The index itself now has them, with titles from the logs.
    let entry = log.session("b").await?.ok_or("b not indexed")?;
    assert_eq!(entry.title, "question b");
    assert_eq!(entry.message_count, 1);
    Ok(())
}

/// A writer that leaves the index alone after a session's first call (the harness does, in
/// a long-running process): listing and `session` take the count and the time from the
/// log's last record, while the index file keeps what was written. On a local disk too,
/// where "the log is newer" comes from its modification time, and with a last record
/// larger than the tail that is read first. (Redis: `suite::remote`.)
#[tokio::test]
async fn an_entry_behind_its_log_is_listed_with_the_logs_count_and_time() -> TestResult {
    let dir = tempfile::tempdir()?;
    entry_behind_its_log(Arc::new(InMemoryFs::new())).await?;
    entry_behind_its_log(Arc::new(hame_fs::LocalFs::new(dir.path())?)).await
}

/// The case above on `fs`.
pub(crate) async fn entry_behind_its_log(fs: Arc<dyn Filesystem>) -> TestResult {
    log_at(fs.clone(), 0)
        .append_messages(
            "s",
            "c1",
            &[Message::user("first"), Message::assistant("a")],
        )
        .await?;
    let index_path = FsPath::parse("agents/main/sessions/index/s.json")?;
    let written = fs.read_bytes(&index_path).await?;
    let quiet = quiet_log_at(fs.clone(), 7)?;
    quiet
        .append_messages(
            "s",
            "c2",
            &[Message::user("second"), Message::assistant("b")],
        )
        .await?;
    let big = "x".repeat(100 * 1024);
    quiet
        .append_messages(
            "s",
            "c3",
            &[Message::user("third"), Message::assistant(&big)],
        )
        .await?;
    // The index file is as the first call left it.
    assert_eq!(fs.read_bytes(&index_path).await?, written);
    let expected = SessionEntry {
        id: "s".into(),
        title: "first".into(),
        created: t(0),
        updated: t(7),
        message_count: 6,
    };
    let reader = log_at(fs.clone(), 9);
    assert_eq!(reader.list_sessions().await?, vec![expected.clone()]);
    assert_eq!(reader.session("s").await?, Some(expected));
    Ok(())
}
