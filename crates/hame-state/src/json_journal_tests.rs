//! The JSON store's journal: appending saves, full rewrites, crashes and other writers.

use std::fs;
use std::path::PathBuf;

use hame_core::{AgentState, Message};
use pretty_assertions::assert_eq;

use crate::{JsonStore, Result, StateKey, StateStore};

type TestResult = std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn key() -> Result<StateKey> {
    StateKey::new("agent", Some("alice"), "s1")
}

fn paths(root: &std::path::Path) -> (PathBuf, PathBuf) {
    let dir = root.join("agent/users/alice");
    (dir.join("s1.json"), dir.join("s1.journal"))
}

/// A state of `n` turns, each a user message and a 4 KiB reply.
fn turns(n: usize) -> AgentState {
    let mut s = AgentState::default();
    for i in 0..n {
        s.messages.push(Message::user(format!("question {i}")));
        s.messages
            .push(Message::assistant(format!("{i}:{}", "x".repeat(4096))));
    }
    s.extensions
        .insert("memory".into(), serde_json::json!({ "turns": n }));
    s
}

/// A store that has seen nothing (another process, or this one after a restart).
async fn cold_load(root: &std::path::Path) -> Result<Option<crate::Stored>> {
    JsonStore::open(root)?.load(&key()?).await
}

/// A store in `dir` whose session has a base (3 turns) and one journal line (the 4th):
/// the store, the key and the version saved last.
async fn base_and_one_line(dir: &std::path::Path) -> Result<(JsonStore, StateKey, u64)> {
    let store = JsonStore::open(dir)?;
    let key = key()?;
    let v = store.save(&key, &turns(3), None).await?;
    let v = store.save(&key, &turns(4), Some(v)).await?;
    Ok((store, key, v))
}

#[tokio::test]
async fn appending_saves_write_the_new_messages_only() -> TestResult {
    let dir = tempfile::tempdir()?;
    // Plain lines: their size is the messages' JSON (packed ones: the next test).
    let store = JsonStore::open(dir.path())?.with_packed_journal(false);
    let key = key()?;
    let (doc, journal) = paths(dir.path());
    let mut v = store.save(&key, &turns(20), None).await?;
    let base = fs::read(&doc)?;
    assert!(!journal.exists());
    let mut journal_len = 0;
    for n in 21..=40 {
        v = store.save(&key, &turns(n), Some(v)).await?;
        let len = fs::metadata(&journal)?.len();
        // One turn (~4.2 KiB of messages plus the small fields), not the conversation.
        let added = len - journal_len;
        assert!((4_096..6_000).contains(&added), "turn {n}: {added} bytes");
        journal_len = len;
    }
    assert_eq!(v, 21);
    assert_eq!(
        fs::read(&doc)?,
        base,
        "the document itself is not rewritten"
    );
    // The same state whether it comes from the cache or from the files.
    let warm = store.load(&key).await?.ok_or("no state")?;
    let cold = cold_load(dir.path()).await?.ok_or("no state")?;
    assert_eq!((warm.version, &warm.state), (21, &turns(40)));
    assert_eq!((cold.version, &cold.state), (21, &turns(40)));
    Ok(())
}

/// Text that zstd cannot shrink by much: printable characters from a linear congruential
/// generator.
fn noise(len: usize, seed: u64) -> String {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from(b' ' + u8::try_from((x >> 33) % 95).unwrap_or(0))
        })
        .collect()
}

#[tokio::test]
async fn packed_lines_hold_a_turn_in_a_fraction_of_its_bytes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = JsonStore::open(dir.path())?;
    let key = key()?;
    let (_, journal) = paths(dir.path());
    let mut v = store.save(&key, &turns(20), None).await?;
    let mut journal_len = 0;
    for n in 21..=40 {
        v = store.save(&key, &turns(n), Some(v)).await?;
        let len = fs::metadata(&journal)?.len();
        // A plain line of this turn is over 4,096 bytes (the test above).
        let added = len - journal_len;
        assert!(added < 700, "turn {n}: {added} bytes");
        journal_len = len;
    }
    let text = fs::read_to_string(&journal)?;
    assert_eq!(text.lines().count(), 20);
    assert!(text.lines().all(|l| l.contains(r#""packed":""#)));
    assert!(!text.contains("xxxx"), "no message is written plain");
    // Warm, cold, and cold through a store that writes plain lines: the same state.
    let warm = store.load(&key).await?.ok_or("no state")?;
    let cold = cold_load(dir.path()).await?.ok_or("no state")?;
    let plain = JsonStore::open(dir.path())?.with_packed_journal(false);
    let plain_cold = plain.load(&key).await?.ok_or("no state")?;
    for loaded in [&warm, &cold, &plain_cold] {
        assert_eq!((loaded.version, &loaded.state), (21, &turns(40)));
    }
    // A plain line after the packed ones, then a packed store reads both kinds.
    let v = plain.save(&key, &turns(41), Some(v)).await?;
    let last = fs::read_to_string(&journal)?;
    assert!(last.lines().last().is_some_and(|l| !l.contains("packed")));
    let cold = cold_load(dir.path()).await?.ok_or("no state")?;
    assert_eq!((cold.version, cold.state), (v, turns(41)));
    Ok(())
}

#[tokio::test]
async fn small_or_incompressible_messages_stay_plain() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = JsonStore::open(dir.path())?;
    let key = key()?;
    let (_, journal) = paths(dir.path());
    let mut state = turns(2);
    let mut v = store.save(&key, &state, None).await?;
    // Under the packing threshold: "hi" and its answer.
    state.messages.push(Message::user("hi"));
    state.messages.push(Message::assistant("hello"));
    v = store.save(&key, &state, Some(v)).await?;
    // Large, but packing would not save a tenth (zstd, then base64's 4/3).
    state.messages.push(Message::assistant(noise(8_000, 7)));
    v = store.save(&key, &state, Some(v)).await?;
    let text = fs::read_to_string(&journal)?;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].contains(r#""messages":[{"role":"user""#),
        "{}",
        lines[0]
    );
    assert!(!lines[1].contains("packed"));
    assert!(lines[1].len() > 8_000);
    let cold = cold_load(dir.path()).await?.ok_or("no state")?;
    assert_eq!((cold.version, cold.state), (v, state));
    Ok(())
}

#[tokio::test]
async fn a_packed_line_that_does_not_unpack_fails_the_load() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (_, journal) = paths(dir.path());
    base_and_one_line(dir.path()).await?;
    // A whole line (it parses) whose packed field is base64 but not a zstd frame: not a
    // torn line to skip, a corrupt one (skipping it would silently lose its turn).
    let text = fs::read_to_string(&journal)?;
    let at = text.find(r#""packed":""#).ok_or("not packed")? + 10;
    let mut bytes = text.into_bytes();
    bytes[at..at + 8].copy_from_slice(b"AAAAAAAA");
    fs::write(&journal, &bytes)?;
    let err = cold_load(dir.path())
        .await
        .err()
        .ok_or("a corrupt line loaded")?;
    let msg = err.to_string();
    assert!(msg.contains("s1.journal"), "{msg}");
    assert!(msg.contains("packed messages"), "{msg}");
    Ok(())
}

#[tokio::test]
async fn a_save_that_changes_old_messages_rewrites_the_document() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = JsonStore::open(dir.path())?;
    let key = key()?;
    let (doc, journal) = paths(dir.path());
    let v = store.save(&key, &turns(10), None).await?;
    let v = store.save(&key, &turns(11), Some(v)).await?;
    assert!(journal.exists());
    // Compaction: the old messages are replaced by a summary.
    let mut compacted = turns(11);
    compacted.messages.drain(..18);
    compacted
        .messages
        .insert(0, Message::user("summary of turns 0-8"));
    let v = store.save(&key, &compacted, Some(v)).await?;
    assert!(!journal.exists(), "a full rewrite starts a new journal");
    assert!(fs::metadata(&doc)?.len() < 20_000);
    let mut next = compacted.clone();
    next.messages.push(Message::user("and then"));
    let v = store.save(&key, &next, Some(v)).await?;
    assert!(journal.exists());
    let cold = cold_load(dir.path()).await?.ok_or("no state")?;
    assert_eq!((cold.version, cold.state), (v, next));
    Ok(())
}

#[tokio::test]
async fn a_torn_journal_line_is_ignored_and_never_appended_to() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (doc, journal) = paths(dir.path());
    let (_, key, v) = base_and_one_line(dir.path()).await?;
    // A crash mid-append of version 3.
    let mut bytes = fs::read(&journal)?;
    let whole = bytes.len();
    bytes.extend_from_slice(br#"{"gen_id":"x","version":3,"upd"#);
    fs::write(&journal, &bytes)?;
    let store = JsonStore::open(dir.path())?;
    let loaded = store.load(&key).await?.ok_or("no state")?;
    assert_eq!((loaded.version, &loaded.state), (v, &turns(4)));
    // The next save does not glue a line onto the torn one: it rewrites the document.
    let before = fs::read(&doc)?;
    let v = store.save(&key, &turns(5), Some(v)).await?;
    assert_ne!(fs::read(&doc)?, before);
    assert!(!journal.exists() || fs::metadata(&journal)?.len() < whole as u64);
    let cold = cold_load(dir.path()).await?.ok_or("no state")?;
    assert_eq!((cold.version, cold.state), (v, turns(5)));
    Ok(())
}

#[tokio::test]
async fn a_journal_of_an_earlier_document_never_applies() -> TestResult {
    let dir = tempfile::tempdir()?;
    let key = key()?;
    let (_, journal) = paths(dir.path());
    let store = JsonStore::open(dir.path())?;
    let v = store.save(&key, &turns(2), None).await?;
    let v = store.save(&key, &turns(3), Some(v)).await?;
    let old = fs::read(&journal)?;
    // A full rewrite, then a crash before the old journal was removed.
    let mut other = turns(1);
    other.messages = vec![Message::user("another"), Message::assistant("conversation")];
    let v = store.save(&key, &other, Some(v)).await?;
    fs::write(&journal, &old)?;
    let cold = cold_load(dir.path()).await?.ok_or("no state")?;
    assert_eq!((cold.version, &cold.state), (v, &other));
    // Delete, then a new first version: the old journal still does not apply.
    assert!(store.delete(&key).await?);
    assert!(!journal.exists());
    fs::write(&journal, &old)?;
    store.save(&key, &turns(1), None).await?;
    fs::write(&journal, &old)?;
    let cold = cold_load(dir.path()).await?.ok_or("no state")?;
    assert_eq!((cold.version, cold.state), (1, turns(1)));
    Ok(())
}

#[tokio::test]
async fn another_writer_is_seen_by_the_cache() -> TestResult {
    let dir = tempfile::tempdir()?;
    let key = key()?;
    let (a, b) = (JsonStore::open(dir.path())?, JsonStore::open(dir.path())?);
    let v = a.save(&key, &turns(2), None).await?;
    assert_eq!(b.load(&key).await?.map(|s| s.version), Some(v));
    // b appends; a's cached copy is stale and must not be used.
    let v2 = b.save(&key, &turns(3), Some(v)).await?;
    match a.save(&key, &turns(3), Some(v)).await {
        Err(crate::Error::Conflict { found, .. }) => assert_eq!(found, Some(v2)),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let seen = a.load(&key).await?.ok_or("no state")?;
    assert_eq!((seen.version, &seen.state), (v2, &turns(3)));
    let v3 = a.save(&key, &turns(4), Some(v2)).await?;
    let seen = b.load(&key).await?.ok_or("no state")?;
    assert_eq!((seen.version, seen.state), (v3, turns(4)));
    Ok(())
}

#[tokio::test]
async fn a_document_of_an_earlier_build_loads_and_then_gets_a_journal() -> TestResult {
    let dir = tempfile::tempdir()?;
    let key = key()?;
    let (doc, journal) = paths(dir.path());
    fs::create_dir_all(doc.parent().ok_or("no parent")?)?;
    // As the store wrote it before journals: no `gen_id`.
    let old = serde_json::json!({
        "format": "hame-state/1", "version": 7, "updated_at": "2026-01-01T00:00:00Z",
        "agent": "agent", "user": "alice", "session": "s1", "state": turns(2),
    });
    fs::write(&doc, serde_json::to_vec(&old)?)?;
    let store = JsonStore::open(dir.path())?;
    let loaded = store.load(&key).await?.ok_or("no state")?;
    assert_eq!((loaded.version, &loaded.state), (7, &turns(2)));
    let v = store.save(&key, &turns(3), Some(7)).await?;
    assert!(
        !journal.exists(),
        "the first save rewrites it with a generation"
    );
    let v = store.save(&key, &turns(4), Some(v)).await?;
    assert!(journal.exists());
    let cold = cold_load(dir.path()).await?.ok_or("no state")?;
    assert_eq!((cold.version, cold.state), (v, turns(4)));
    Ok(())
}

#[tokio::test]
async fn listing_sees_appending_saves() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = JsonStore::open(dir.path())?;
    let (k1, k2) = (
        StateKey::new("agent", Some("alice"), "s1")?,
        StateKey::new("agent", Some("alice"), "s2")?,
    );
    let v1 = store.save(&k1, &turns(1), None).await?;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    store.save(&k2, &turns(1), None).await?;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    // Only s1's journal changes.
    store.save(&k1, &turns(2), Some(v1)).await?;
    let listed: Vec<String> = store
        .list_sessions("agent", Some("alice"))
        .await?
        .into_iter()
        .map(|s| s.session)
        .collect();
    assert_eq!(listed, ["s1", "s2"]);
    Ok(())
}

/// Tool-result clearing replaces an old message: the line holds that message, not the
/// conversation; a sliding window of recent entries in an extension (the permission
/// decisions) costs the entries that changed.
#[tokio::test]
async fn replaced_messages_and_sliding_windows_are_small_lines() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = JsonStore::open(dir.path())?;
    let key = key()?;
    let (doc, journal) = paths(dir.path());
    let window = |from: usize| {
        serde_json::json!({
            "decisions": (from..from + 200)
                .map(|i| serde_json::json!({"tool": "read_file", "argument": format!("/f{i}"), "n": i}))
                .collect::<Vec<_>>(),
            "plan_mode": false,
        })
    };
    let mut state = turns(30);
    state.extensions.insert("permissions".into(), window(0));
    let mut v = store.save(&key, &state, None).await?;
    let base = fs::read(&doc)?;
    for step in 1..=5 {
        state.messages[2 * step + 1] = Message::assistant(format!("[cleared {step}]"));
        state.extensions.insert("permissions".into(), window(step));
        let before = file_len(&journal);
        v = store.save(&key, &state, Some(v)).await?;
        let added = file_len(&journal) - before;
        assert!(added < 1_000, "step {step}: {added} bytes");
    }
    assert_eq!(fs::read(&doc)?, base);
    let cold = cold_load(dir.path()).await?.ok_or("no state")?;
    assert_eq!((cold.version, cold.state), (v, state));
    Ok(())
}

fn file_len(path: &std::path::Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

mod patches {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use serde_json::Value;

    use crate::json_journal::{apply_map, diff_map};

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (0u8..4).prop_map(Value::from),
            "[ab]{0,2}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[abc]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn map() -> impl Strategy<Value = BTreeMap<String, Value>> {
        proptest::collection::btree_map("[xyz]", value(), 0..4)
    }

    proptest! {
        /// Applying the patch from any `old` to any `new` gives `new`.
        #[test]
        fn a_patch_turns_old_into_new(old in map(), new in map()) {
            let patch = diff_map(&old, &new);
            prop_assert_eq!(patch.is_empty(), old == new);
            let mut target = old.clone();
            prop_assert!(apply_map(&mut target, patch));
            prop_assert_eq!(target, new);
        }

        /// A window that slides (drop from the front, push at the back) patches as such.
        #[test]
        fn a_sliding_window_patches_its_ends(items in proptest::collection::vec(value(), 1..30), drop in 0usize..5, push in 0usize..5) {
            let drop = drop.min(items.len());
            let extra: Vec<Value> = (0..push).map(|i| Value::from(format!("new{i}"))).collect();
            let old = BTreeMap::from([("w".to_owned(), Value::Array(items.clone()))]);
            let mut next = items[drop..].to_vec();
            next.extend(extra);
            let new = BTreeMap::from([("w".to_owned(), Value::Array(next))]);
            let patch = diff_map(&old, &new);
            let mut target = old.clone();
            prop_assert!(apply_map(&mut target, patch.clone()));
            prop_assert_eq!(&target, &new);
            if old != new {
                let text = serde_json::to_string(&patch).unwrap_or_default();
                prop_assert!(text.len() < 40 + 16 * push, "{}", text);
            }
        }
    }
}

mod sequences {
    use hame_core::{AgentState, Message};
    use proptest::prelude::*;

    use crate::{JsonStore, StateKey, StateStore};

    /// Short texts from a small alphabet, so that equal messages recur (a repeated "ok");
    /// one in five is long enough for its line to be packed.
    fn message() -> impl Strategy<Value = Message> {
        (0u8..3, 0u8..6, proptest::bool::weighted(0.2)).prop_map(|(role, text, long)| {
            let text = if long {
                format!("{text}").repeat(1_500)
            } else {
                format!("{text}")
            };
            match role {
                0 => Message::user(format!("u{text}")),
                1 => Message::assistant(format!("a{text}")),
                _ => Message::system(format!("s{text}")),
            }
        })
    }

    fn messages(max: usize) -> impl Strategy<Value = Vec<Message>> {
        proptest::collection::vec(message(), 0..max)
    }

    /// What a save can do to the conversation: append, compact a span, replace one
    /// message, truncate, or replace everything.
    #[derive(Debug, Clone)]
    enum Op {
        Append(Vec<Message>),
        Compact {
            from: usize,
            len: usize,
            summary: Vec<Message>,
            then: Vec<Message>,
        },
        Replace(usize, Message),
        Truncate(usize),
        Wholesale(Vec<Message>),
        /// Pushes onto the `list` extension and keeps its last `keep` entries.
        Push(u8, usize),
        /// Sets a field of the `obj` extension.
        Field(u8, u8),
        /// Removes an extension.
        Remove(bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => messages(6).prop_map(Op::Append),
            3 => (0usize..20, 0usize..20, messages(3), messages(4))
                .prop_map(|(from, len, summary, then)| Op::Compact { from, len, summary, then }),
            1 => (0usize..30, message()).prop_map(|(i, m)| Op::Replace(i, m)),
            1 => (0usize..30).prop_map(Op::Truncate),
            1 => messages(8).prop_map(Op::Wholesale),
            3 => (0u8..10, 1usize..6).prop_map(|(v, keep)| Op::Push(v, keep)),
            2 => (0u8..4, 0u8..10).prop_map(|(k, v)| Op::Field(k, v)),
            1 => proptest::bool::ANY.prop_map(Op::Remove),
        ]
    }

    fn apply(state: &mut AgentState, op: &Op) {
        let messages = &mut state.messages;
        match op {
            Op::Append(m) => messages.extend(m.iter().cloned()),
            Op::Compact {
                from,
                len,
                summary,
                then,
            } => {
                let from = (*from).min(messages.len());
                let end = (from + len).min(messages.len());
                messages.splice(from..end, summary.iter().cloned());
                messages.extend(then.iter().cloned());
            }
            Op::Replace(i, m) => {
                if let Some(slot) = messages.get_mut(*i) {
                    *slot = m.clone();
                }
            }
            Op::Truncate(n) => messages.truncate(*n),
            Op::Wholesale(m) => *messages = m.clone(),
            Op::Push(v, keep) => {
                let list = state
                    .extensions
                    .entry("list".into())
                    .or_insert_with(|| serde_json::json!([]));
                if let Some(a) = list.as_array_mut() {
                    a.push(serde_json::json!({ "v": v }));
                    let over = a.len().saturating_sub(*keep);
                    a.drain(..over);
                }
            }
            Op::Field(k, v) => {
                let obj = state
                    .extensions
                    .entry("obj".into())
                    .or_insert_with(|| serde_json::json!({}));
                if let Some(o) = obj.as_object_mut() {
                    o.insert(format!("k{k}"), serde_json::json!(v));
                }
            }
            Op::Remove(list) => {
                state.extensions.remove(if *list { "list" } else { "obj" });
            }
        }
    }

    proptest! {
        /// Any sequence of saves loads back as the last state: warm from the same store
        /// and cold from a new one, whichever lines or rewrites the saves became.
        #[test]
        fn any_sequence_of_saves_loads_back(
            start in messages(20),
            ops in proptest::collection::vec(op(), 1..8),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let out: Result<(), String> = rt.block_on(async {
                let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
                let key = StateKey::new("agent", Some("alice"), "s1").map_err(|e| e.to_string())?;
                let store = JsonStore::open(dir.path()).map_err(|e| e.to_string())?;
                let mut state = AgentState { messages: start, ..AgentState::default() };
                let mut v = store.save(&key, &state, None).await.map_err(|e| e.to_string())?;
                for op in &ops {
                    apply(&mut state, op);
                    v = store.save(&key, &state, Some(v)).await.map_err(|e| e.to_string())?;
                    let warm = store.load(&key).await.map_err(|e| e.to_string())?.ok_or("gone")?;
                    if (warm.version, &warm.state) != (v, &state) {
                        return Err(format!("warm load after {op:?} differs"));
                    }
                }
                let cold = JsonStore::open(dir.path()).map_err(|e| e.to_string())?
                    .load(&key).await.map_err(|e| e.to_string())?.ok_or("gone")?;
                if (cold.version, &cold.state) != (v, &state) {
                    return Err("cold load differs".into());
                }
                Ok(())
            });
            out.map_err(TestCaseError::fail)?;
        }
    }
}

/// The in-memory copies are bounded by count and by the size of their files; the least
/// recently used go first.
#[test]
fn the_cache_drops_the_least_recently_used_past_its_byte_budget() {
    use std::sync::Arc;

    use crate::json_journal::{Doc, DocCache, FileId, MAX_CACHED_BYTES};

    let doc = |len: u64| Doc {
        state: Arc::new(AgentState::default()),
        version: 1,
        gen_id: None,
        base: FileId {
            ino: 1,
            len,
            mtime_ns: 0,
        },
        journal: None,
        clean_tail: true,
    };
    let third = MAX_CACHED_BYTES / 3 + 1;
    let mut cache = DocCache::default();
    cache.put("a".into(), doc(third));
    cache.put("b".into(), doc(third));
    assert!(cache.get(std::path::Path::new("a")).is_some());
    // a was used after b: b goes.
    cache.put("c".into(), doc(third));
    let held = |cache: &mut DocCache, p: &str| cache.get(std::path::Path::new(p)).is_some();
    assert_eq!(
        (
            held(&mut cache, "a"),
            held(&mut cache, "b"),
            held(&mut cache, "c")
        ),
        (true, false, true)
    );
    // A state larger than the whole budget is not kept at all.
    cache.put("huge".into(), doc(MAX_CACHED_BYTES + 1));
    assert!(!held(&mut cache, "huge"));
    assert!(held(&mut cache, "a"));
}
