#![allow(clippy::unwrap_used)]

use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::*;

#[test]
fn layout_per_scope() {
    let d = |u: Option<&str>, scope| {
        Namespace::derive("coder", u, "s1", scope)
            .unwrap()
            .path()
            .to_string()
    };
    assert_eq!(
        d(Some("alice"), Scope::User),
        "/agents/coder/users/alice/home"
    );
    assert_eq!(
        d(Some("alice"), Scope::Session),
        "/agents/coder/users/alice/sessions/s1"
    );
    assert_eq!(d(None, Scope::User), "/agents/coder/anonymous/sessions/s1");
    assert_eq!(
        d(None, Scope::Session),
        "/agents/coder/anonymous/sessions/s1"
    );
    assert_eq!(d(Some("alice"), Scope::Agent), "/agents/coder/shared");
    assert_eq!(d(Some("alice"), Scope::Global), "/global");
    let ns = Namespace::derive("coder", Some("a@b.c"), "s1", Scope::User).unwrap();
    assert_eq!(ns.key(':'), "agents:coder:users:a@b.c:home");
}

#[test]
fn bad_ids_are_refused() {
    for bad in [
        "",
        "..",
        ".hidden",
        "a/b",
        "a:b",
        "a\\b",
        "a\0b",
        "ü",
        "a b",
        &"x".repeat(129),
    ] {
        assert!(
            Namespace::derive("agent", Some(bad), "s", Scope::User).is_err(),
            "user {bad:?}"
        );
        assert!(
            Namespace::derive("agent", None, bad, Scope::Session).is_err(),
            "session {bad:?}"
        );
        assert!(
            Namespace::derive(bad, None, "s", Scope::Global).is_err(),
            "agent {bad:?}"
        );
    }
}

fn id() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9._@-]{1,12}",
        "\\PC{0,6}",
        Just("..".to_owned()),
        Just("users".to_owned()),
        Just("anonymous".to_owned())
    ]
}

fn scope() -> impl Strategy<Value = Scope> {
    prop_oneof![
        Just(Scope::Session),
        Just(Scope::User),
        Just(Scope::Agent),
        Just(Scope::Global)
    ]
}

proptest! {
    /// Two different tenants never share a namespace, and neither namespace contains the
    /// other, in any scope that separates them.
    #[test]
    fn tenants_never_overlap(
        a in id(), u1 in prop::option::of(id()), s1 in id(),
        u2 in prop::option::of(id()), s2 in id(), sc in scope(),
    ) {
        let n1 = Namespace::derive(&a, u1.as_deref(), &s1, sc);
        let n2 = Namespace::derive(&a, u2.as_deref(), &s2, sc);
        if let (Ok(n1), Ok(n2)) = (n1, n2) {
            for seg in n1.segments() {
                prop_assert!(!seg.contains('/') && !seg.contains(':') && seg != ".." && !seg.is_empty());
            }
            let same_tenant = match sc {
                Scope::Global | Scope::Agent => true,
                Scope::User => match (&u1, &u2) {
                    (Some(x), Some(y)) => x == y,
                    (None, None) => s1 == s2,
                    _ => false,
                },
                Scope::Session => u1 == u2 && s1 == s2,
            };
            let (p1, p2) = (n1.path(), n2.path());
            if same_tenant {
                prop_assert_eq!(p1, p2);
            } else {
                prop_assert!(!p1.starts_with(&p2) && !p2.starts_with(&p1), "{p1} vs {p2}");
            }
        }
    }
}

#[tokio::test]
async fn isolation_gives_each_caller_its_namespace_over_the_template() -> Result<()> {
    use crate::{FsPath, InMemoryFs, WriteOptions};
    let store: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    let template: Arc<dyn Filesystem> = Arc::new(InMemoryFs::with_files([(
        "AGENTS.md",
        b"rules".as_slice(),
    )])?);
    let iso = Isolation {
        template: Some(template),
        ..Isolation::new("coder")
    };
    let alice = iso.fs_for(&store, Some("alice"), "s1")?;
    let anon = iso.fs_for(&store, None, "s9")?;
    let notes = FsPath::parse("notes.md")?;
    alice
        .write(&notes, b"mine".to_vec(), WriteOptions::default())
        .await?;
    assert_eq!(
        alice.read_bytes(&FsPath::parse("AGENTS.md")?).await?,
        b"rules"
    );
    assert!(
        anon.read_bytes(&notes)
            .await
            .is_err_and(|e| e.is_not_found())
    );
    assert_eq!(
        store
            .read_bytes(&FsPath::parse("agents/coder/users/alice/home/notes.md")?)
            .await?,
        b"mine"
    );
    assert_eq!(
        iso.fs_for(&store, Some("../bob"), "s1")
            .map(|_| ())
            .unwrap_err()
            .code(),
        crate::codes::INVALID_PATH
    );
    Ok(())
}
