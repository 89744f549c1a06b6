//! `open(url)` dispatch and JSON-store specifics.

use pretty_assertions::assert_eq;

use crate::{Error, Result, StateKey, open};

#[tokio::test]
async fn memory_url_opens_unshared_store() -> Result<()> {
    let store = open("memory://").await?;
    assert!(!store.is_shared());
    let key = StateKey::new("a", None::<String>, "s")?;
    assert_eq!(store.save(&key, &Default::default(), None).await?, 1);
    Ok(())
}

#[tokio::test]
async fn unknown_scheme_is_config_error() {
    let err = open("ftp://host/x").await.err();
    assert!(matches!(err, Some(Error::Config(m)) if m.contains("ftp")));
}

#[cfg(not(feature = "redis"))]
#[tokio::test]
async fn disabled_feature_is_named() {
    let err = open("redis://127.0.0.1/").await.err();
    assert!(
        matches!(
            &err,
            Some(Error::FeatureDisabled {
                feature: "redis",
                ..
            })
        ),
        "{err:?}"
    );
    assert!(err.is_some_and(|e| e.to_string().contains("`redis` feature")));
}

#[cfg(not(feature = "postgres"))]
#[tokio::test]
async fn disabled_postgres_is_named() {
    let err = open("postgresql://x@127.0.0.1/db").await.err();
    assert!(matches!(
        err,
        Some(Error::FeatureDisabled {
            feature: "postgres",
            ..
        })
    ));
}

#[cfg(not(feature = "mysql"))]
#[tokio::test]
async fn disabled_mysql_is_named() {
    let err = open("mariadb://x@127.0.0.1/db").await.err();
    assert!(matches!(
        err,
        Some(Error::FeatureDisabled {
            feature: "mysql",
            ..
        })
    ));
}

#[cfg(feature = "json")]
mod json {
    use std::fs;

    use pretty_assertions::assert_eq;

    use super::*;
    use crate::StateStore;
    use crate::tests::json_conf::TempJson;

    fn tmp() -> Result<tempfile::TempDir> {
        tempfile::tempdir().map_err(|e| Error::io("tempdir", e))
    }

    #[tokio::test]
    async fn path_and_file_url_open_json() -> Result<()> {
        let dir = tmp()?;
        let a = open(&dir.path().join("a").to_string_lossy()).await?;
        let b = open(&format!("file://{}", dir.path().join("b").display())).await?;
        assert!(!a.is_shared() && !b.is_shared());
        let key = StateKey::new("agent", Some("u"), "s")?;
        b.save(&key, &Default::default(), None).await?;
        assert!(dir.path().join("b/agent/users/u/s.json").is_file());
        assert!(a.load(&key).await?.is_none());
        Ok(())
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn files_are_private_to_their_owner() -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let t = TempJson::new()?;
        let key = StateKey::new("agent", Some("ada"), "s1")?;
        let lease = t.acquire(&key, crate::LeaseOptions::default()).await?;
        t.save_fenced(&key, &Default::default(), None, &lease)
            .await?;
        let mode = |p: &std::path::Path| -> Result<u32> {
            Ok(fs::metadata(p)
                .map_err(|e| Error::io(p, e))?
                .permissions()
                .mode()
                & 0o777)
        };
        let dir = t.store.root().join("agent/users/ada");
        assert_eq!(mode(&dir)?, 0o700);
        assert_eq!(mode(&t.store.root().join("agent"))?, 0o700);
        for name in ["s1.json", "s1.lease"] {
            assert_eq!(mode(&dir.join(name))?, 0o600, "{name}");
        }
        lease.release().await?;
        Ok(())
    }

    #[tokio::test]
    async fn layout_and_envelope() -> Result<()> {
        let t = TempJson::new()?;
        let anon = StateKey::new("agent", None::<String>, "s1")?;
        t.save(&anon, &Default::default(), None).await?;
        let path = t.store.root().join("agent/anonymous/s1.json");
        let doc: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).map_err(|e| Error::io(&path, e))?)
                .map_err(Error::Serialize)?;
        assert_eq!(doc["format"], "hame-state/1");
        assert_eq!(doc["version"], 1);
        assert_eq!(doc["agent"], "agent");
        assert_eq!(doc["user"], serde_json::Value::Null);
        assert_eq!(doc["session"], "s1");
        assert_eq!(
            doc["state"]["schema_version"],
            hame_core::STATE_SCHEMA_VERSION
        );
        // No temp files are left behind.
        let names: Vec<String> = fs::read_dir(path.parent().unwrap_or(&path))
            .map_err(|e| Error::io(&path, e))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
        Ok(())
    }

    #[tokio::test]
    async fn leftover_temp_files_and_foreign_names_are_ignored() -> Result<()> {
        let t = TempJson::new()?;
        let key = StateKey::new("agent", Some("u"), "s1")?;
        t.save(&key, &Default::default(), None).await?;
        let dir = t.store.root().join("agent/users/u");
        for junk in [
            ".s1.deadbeef.tmp",
            "notes.txt",
            "bad name.json",
            ".hidden.json",
        ] {
            fs::write(dir.join(junk), b"{").map_err(|e| Error::io(&dir, e))?;
        }
        let names: Vec<String> = t
            .list_sessions("agent", Some("u"))
            .await?
            .into_iter()
            .map(|s| s.session)
            .collect();
        assert_eq!(names, vec!["s1".to_owned()]);
        assert_eq!(t.load(&key).await?.map(|s| s.version), Some(1));
        Ok(())
    }

    #[tokio::test]
    async fn a_file_copied_to_another_key_is_refused() -> Result<()> {
        let t = TempJson::new()?;
        let alice = StateKey::new("agent", Some("alice"), "s1")?;
        let bob = StateKey::new("agent", Some("bob"), "s1")?;
        t.save(&alice, &Default::default(), None).await?;
        let root = t.store.root();
        fs::create_dir_all(root.join("agent/users/bob")).map_err(|e| Error::io(root, e))?;
        fs::copy(
            root.join("agent/users/alice/s1.json"),
            root.join("agent/users/bob/s1.json"),
        )
        .map_err(|e| Error::io(root, e))?;
        assert!(matches!(t.load(&bob).await, Err(Error::Config(_))));
        Ok(())
    }

    #[tokio::test]
    async fn corrupt_document_is_format_error() -> Result<()> {
        let t = TempJson::new()?;
        let key = StateKey::new("agent", None::<String>, "s1")?;
        t.save(&key, &Default::default(), None).await?;
        let path = t.store.root().join("agent/anonymous/s1.json");
        fs::write(&path, b"{\"version\": 1, \"sta").map_err(|e| Error::io(&path, e))?;
        assert!(matches!(t.load(&key).await, Err(Error::Format { .. })));
        assert!(matches!(
            t.save(&key, &Default::default(), Some(1)).await,
            Err(Error::Format { .. })
        ));
        Ok(())
    }
}
