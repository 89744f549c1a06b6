use proptest::prelude::*;

use super::*;

#[test]
fn namespaces_are_checked() {
    for good in [
        "a",
        "tenant-1",
        "user_2.session",
        &"x".repeat(MAX_NAMESPACE_BYTES),
    ] {
        assert!(validate_namespace(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        ".hidden",
        "a/b",
        "a b",
        "{a}",
        "é",
        &"x".repeat(MAX_NAMESPACE_BYTES + 1),
    ] {
        let err = validate_namespace(bad).err().map(|e| e.code());
        assert_eq!(err, Some(hame_fs::codes::INVALID_ARGUMENTS), "{bad:?}");
    }
}

#[tokio::test]
async fn unknown_scheme_is_an_invalid_argument() {
    let err = open("ftp://host/x", "t").await.err().map(|e| e.code());
    assert_eq!(err, Some(hame_fs::codes::INVALID_ARGUMENTS));
}

#[tokio::test]
async fn a_bad_namespace_is_refused_before_connecting() {
    let err = open("redis://127.0.0.1:1", "a/b")
        .await
        .err()
        .map(|e| e.code());
    assert_eq!(err, Some(hame_fs::codes::INVALID_ARGUMENTS));
}

#[cfg(not(feature = "redis"))]
#[tokio::test]
async fn redis_without_its_feature_names_the_feature() {
    let err = open("redis://127.0.0.1", "t").await.err();
    let (code, msg) = err.map(|e| (e.code(), e.to_string())).unwrap_or_default();
    assert_eq!(code, hame_fs::codes::NOT_SUPPORTED);
    assert!(msg.contains("`redis` feature"), "{msg}");
}

#[cfg(not(feature = "object-store"))]
#[tokio::test]
async fn object_store_without_its_feature_names_the_feature() {
    let err = open("s3://bucket/prefix", "t").await.err();
    let (code, msg) = err.map(|e| (e.code(), e.to_string())).unwrap_or_default();
    assert_eq!(code, hame_fs::codes::NOT_SUPPORTED);
    assert!(msg.contains("`object-store` feature"), "{msg}");
}

#[cfg(not(feature = "object-store-gcp"))]
#[tokio::test]
async fn gcs_without_its_feature_names_the_feature() {
    let err = open("gs://bucket", "t").await.err();
    let msg = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("`object-store-gcp` feature"), "{msg}");
}

proptest! {
    /// Two different valid namespaces never give key prefixes where one is a prefix of the
    /// other, in either key layout.
    #[test]
    fn namespace_prefixes_are_disjoint(a in "[A-Za-z0-9_-][A-Za-z0-9._-]{0,20}", b in "[A-Za-z0-9_-][A-Za-z0-9._-]{0,20}") {
        prop_assume!(a != b);
        prop_assume!(!a.contains("..") && !b.contains(".."));
        prop_assert!(validate_namespace(&a).is_ok());
        prop_assert!(validate_namespace(&b).is_ok());
        let redis = |n: &str| format!("hame:{{{n}}}:");
        let object = |n: &str| format!("root/{n}/");
        prop_assert!(!redis(&a).starts_with(&redis(&b)) && !redis(&b).starts_with(&redis(&a)));
        prop_assert!(!object(&a).starts_with(&object(&b)) && !object(&b).starts_with(&object(&a)));
    }
}
