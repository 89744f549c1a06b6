#![allow(clippy::unwrap_used)]
use super::*;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

#[derive(Debug, Clone, PartialEq)]
struct T(String, String, String);

impl T {
    fn new(server: &str, tool: &str) -> Self {
        T(server.into(), tool.into(), qualified_name(server, tool))
    }
}

impl Named for T {
    fn server(&self) -> &str {
        &self.0
    }
    fn tool(&self) -> &str {
        &self.1
    }
    fn qualified(&self) -> &str {
        &self.2
    }
}

#[test]
fn names_that_fit_are_kept_as_they_are() {
    assert_eq!(qualified_name("files", "read"), "mcp__files__read");
    assert_eq!(qualified_name("rc", "dot_name"), "mcp__rc__dot_name");
    assert_eq!(qualified_name("a-b", "c-d_e"), "mcp__a-b__c-d_e");
    let exactly = "x".repeat(64 - "mcp__s__".len());
    assert_eq!(qualified_name("s", &exactly), format!("mcp__s__{exactly}"));
}

#[test]
fn the_issue_cases_give_two_distinct_tools() {
    let dot = qualified_name("rc", "dot.name");
    let under = qualified_name("rc", "dot_name");
    assert_eq!(under, "mcp__rc__dot_name");
    assert!(dot.starts_with("mcp__rc__dot_name_"), "{dot}");
    assert_ne!(dot, under);
    // Stable: the same everywhere and in every version (a log or rule may name it).
    assert_eq!(dot, "mcp__rc__dot_name_356a1416");

    let long = "x".repeat(70);
    let a = qualified_name("rc", &format!("{long}a"));
    let b = qualified_name("rc", &format!("{long}b"));
    assert_ne!(a, b);
    assert_eq!(a.len(), 64);
    assert_eq!(b.len(), 64);
    assert_eq!(a[..55], b[..55]);
}

#[test]
fn ambiguous_server_names_are_refused_with_a_suggestion() {
    for ok in ["rc", "a_b", "my-server", "x1"] {
        assert_eq!(check_server_name(ok), Ok(()), "{ok}");
    }
    let e = check_server_name("a__b").unwrap_err();
    assert_eq!(
        e,
        "server name `a__b` is ambiguous in tool names `mcp__<server>__<tool>`: rename it \
         without `__` and without `_` at either end (for example `a_b`)"
    );
    assert!(check_server_name("_a").unwrap_err().contains("`a`"));
    assert!(check_server_name("a_").is_err());
    assert!(
        check_server_name("a.b")
            .unwrap_err()
            .contains("only letters")
    );
    assert!(check_server_name("").is_err());
    assert!(check_server_name("__").unwrap_err().contains("`server`"));
}

#[test]
fn dedupe_keeps_the_unchanged_name_and_reports_the_rest_once_each() {
    let dot = T::new("rc", "dot.name");
    // A tool whose real name is the hashed form of another's.
    let impostor = T(
        "rc".into(),
        dot.2["mcp__rc__".len()..].to_owned(),
        dot.2.clone(),
    );
    let plain = T::new("rc", "dot_name");
    let (kept, notes) = dedupe(vec![dot.clone(), plain.clone(), impostor.clone()]);
    assert_eq!(kept, vec![plain.clone(), impostor.clone()]);
    assert_eq!(
        notes,
        vec![NameNote::Dropped {
            server: "rc".into(),
            tool: "dot.name".into(),
            qualified: dot.2.clone(),
            kept_server: "rc".into(),
            kept_tool: impostor.1.clone(),
        }]
    );
    assert!(notes[0].to_string().contains("rename one of them"));

    let (kept, notes) = dedupe(vec![dot.clone(), plain.clone(), plain.clone()]);
    assert_eq!(kept, vec![dot.clone(), plain.clone()]);
    assert_eq!(
        notes,
        vec![
            NameNote::Renamed {
                server: "rc".into(),
                tool: "dot.name".into(),
                qualified: dot.2.clone(),
            },
            NameNote::Dropped {
                server: "rc".into(),
                tool: "dot_name".into(),
                qualified: "mcp__rc__dot_name".into(),
                kept_server: "rc".into(),
                kept_tool: "dot_name".into(),
            }
        ]
    );
    assert_ne!(notes[0].key(), notes[1].key());
}

fn server_name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9-]{1,6}(_[A-Za-z0-9-]{1,4}){0,2}"
}

proptest! {
    #[test]
    fn every_name_is_valid_and_fits(server in server_name(), tool in "\\PC{0,90}") {
        prop_assert!(check_server_name(&server).is_ok());
        let q = qualified_name(&server, &tool);
        prop_assert!(q.chars().count() <= MAX_NAME_CHARS, "{}", q);
        prop_assert!(q.chars().all(allowed), "{}", q);
        prop_assert!(q.starts_with("mcp__"));
    }

    /// Distinct (server, tool) pairs give distinct names (the hash is 32 bits: a
    /// collision in a few hundred cases would be a defect, not bad luck).
    #[test]
    fn distinct_pairs_give_distinct_names(
        s1 in server_name(), s2 in server_name(),
        t1 in "[a-z._ ]{0,8}", t2 in "[a-z._ ]{0,8}",
        pad in 0usize..70,
    ) {
        let t1 = format!("{}{t1}", "p".repeat(pad));
        let t2 = format!("{}{t2}", "p".repeat(pad));
        prop_assume!((s1.as_str(), t1.as_str()) != (s2.as_str(), t2.as_str()));
        prop_assert_ne!(qualified_name(&s1, &t1), qualified_name(&s2, &t2));
    }

    #[test]
    fn dedupe_leaves_no_two_tools_with_one_name(
        tools in proptest::collection::vec((server_name(), "[a-z._]{0,4}"), 0..12)
    ) {
        let list: Vec<T> = tools.iter().map(|(s, t)| T::new(s, t)).collect();
        let n = list.len();
        let (kept, notes) = dedupe(list);
        let names: HashSet<&str> = kept.iter().map(|t| t.qualified()).collect();
        prop_assert_eq!(names.len(), kept.len());
        let dropped = notes.iter().filter(|n| matches!(n, NameNote::Dropped { .. })).count();
        prop_assert_eq!(kept.len() + dropped, n);
    }
}
