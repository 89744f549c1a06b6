//! The session index: titles, ordering, compare-and-set, repair.

use std::sync::Arc;

use hame_core::Message;
use hame_fs::{Filesystem, FsPath, InMemoryFs, WriteOptions};
use hame_session::{Error, IndexUpdate, SessionEntry, SessionLog, SessionLogOptions};
use pretty_assertions::assert_eq;

use super::helpers::{TestResult, fixed_clock, log_at, t};

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
async fn a_corrupt_index_is_left_alone_and_can_be_rebuilt() -> TestResult {
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
    let index = FsPath::parse("agents/main/sessions/sessions.json")?;
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
    assert!(matches!(
        log.list_sessions().await,
        Err(Error::Corrupt { .. })
    ));

    let rebuilt = log.rebuild_index().await?;
    assert_eq!(
        rebuilt,
        vec![
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
        ]
    );
    Ok(())
}

#[tokio::test]
async fn logs_missing_from_the_index_are_listed_and_added() -> TestResult {
    let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    // Three processes wrote logs; their index updates were lost (never made).
    let quiet = SessionLog::with_options(
        fs.clone(),
        "main",
        SessionLogOptions {
            update_index: false,
            ..fixed_clock(100)
        },
    )?;
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
    let listed: Vec<String> = log
        .list_sessions()
        .await?
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(listed, ["d", "a", "b", "c"]);
    // The index itself now has them, with titles from the logs.
    let entry = log.session("b").await?.ok_or("b not indexed")?;
    assert_eq!(entry.title, "question b");
    assert_eq!(entry.message_count, 1);
    Ok(())
}
