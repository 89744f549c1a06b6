use super::*;
use crate::message::{Message, Role, ToolCall, ToolResult};
use pretty_assertions::assert_eq;
use proptest::prelude::*;

#[test]
fn secrets_are_replaced_as_written_and_percent_encoded() {
    let mut r = Redactor::new();
    assert!(r.add_secret("sk-abc/def+ghi=="));
    assert!(!r.add_secret("sk-abc/def+ghi=="), "added twice");
    assert_eq!(
        r.redact("key sk-abc/def+ghi== or sk-abc%2Fdef%2Bghi%3D%3D"),
        "key [REDACTED] or [REDACTED]"
    );
    assert!(matches!(r.redact("nothing here"), Cow::Borrowed(_)));
}

#[test]
fn short_values_and_words_are_not_secrets() {
    let mut r = Redactor::new();
    assert!(!r.add_secret("8080"));
    assert!(!r.add_secret("  short  "));
    assert!(!r.add_secret("scripted"), "a word");
    assert!(
        !r.add_secret("passwordpassword"[..15].trim()),
        "a 15-letter word"
    );
    assert!(r.is_empty());
    assert_eq!(
        r.redact("port 8080, the scripted model"),
        "port 8080, the scripted model"
    );
    assert!(r.add_secret("hunter22"), "8 bytes with a digit");
    assert!(
        r.add_secret("correcthorsebatterystaple"),
        "16 letters or more"
    );
}

#[test]
fn a_longer_secret_is_replaced_whole() {
    let mut r = Redactor::new();
    r.add_secret("token-12345678");
    r.add_secret("Bearer token-12345678");
    assert_eq!(
        r.redact("sent Bearer token-12345678, then token-12345678"),
        "sent [REDACTED], then [REDACTED]"
    );
}

#[test]
fn authorization_values_hide_the_credential_alone_too() {
    let mut r = Redactor::new();
    r.add_authorization("Bearer tok-abcdef123");
    assert_eq!(
        r.redact("Authorization: Bearer tok-abcdef123; key tok-abcdef123"),
        "Authorization: [REDACTED]; key [REDACTED]"
    );
}

#[test]
fn url_credentials_hide_the_password_and_its_basic_auth_form() {
    let mut r = Redactor::new();
    assert!(r.add_url("http://hame:pw%407d3e9a1c@proxy:8080/v1?api_key=qk-99887766&x=1"));
    // base64("hame:pw@7d3e9a1c")
    let basic = "aGFtZTpwd0A3ZDNlOWExYw==";
    assert_eq!(
        r.redact(&format!(
            "pw@7d3e9a1c pw%407d3e9a1c Basic {basic} qk-99887766 x=1"
        )),
        "[REDACTED] [REDACTED] Basic [REDACTED] [REDACTED] x=1"
    );
    assert!(!Redactor::new().add_url("http://127.0.0.1:8080/v1?x=1"));
}

#[test]
fn endpoints_are_hidden_from_callers_only() {
    let mut r = Redactor::new();
    r.add_secret("sk-live-00112233");
    r.add_endpoint("http://127.0.0.1:9999/v1/");
    let text = "sk-live-00112233 was rejected by http://127.0.0.1:9999/v1 (401)";
    assert_eq!(
        r.redact(text),
        "[REDACTED] was rejected by http://127.0.0.1:9999/v1 (401)"
    );
    assert_eq!(
        r.redact_for_callers(text),
        "[REDACTED] was rejected by [model endpoint] (401)"
    );
}

#[test]
fn messages_are_redacted_in_every_text_but_not_in_ids() {
    let mut r = Redactor::new();
    r.add_secret("sk-live-00112233");
    let mut m = Message::assistant("the key is sk-live-00112233");
    m.content.push(ContentBlock::ToolCall(ToolCall {
        id: "sk-live-00112233".into(),
        name: "write".into(),
        arguments: r#"{"text":"sk-live-00112233"}"#.into(),
    }));
    let m = r.redact_message(m);
    assert_eq!(m.text_content(), "the key is [REDACTED]");
    let call = m.tool_calls().next().cloned();
    assert_eq!(
        call.map(|c| (c.id, c.arguments)),
        Some((
            "sk-live-00112233".to_owned(),
            r#"{"text":"[REDACTED]"}"#.to_owned()
        ))
    );
    let results = Message::tool_results(vec![ToolResult {
        id: "c1".into(),
        content: "env: sk-live-00112233".into(),
        is_error: false,
        code: None,
    }]);
    let results = r.redact_message(results);
    assert_eq!(
        results
            .tool_results_iter()
            .next()
            .map(|t| t.content.clone()),
        Some("env: [REDACTED]".to_owned())
    );
    assert_eq!(results.role, Role::Tool);
}

/// Image data is left alone: a registered secret spelled inside the base64 is a chance
/// match, and rewriting it would corrupt the image; the text beside it is still redacted.
#[test]
fn image_data_is_left_alone() {
    let mut r = Redactor::new();
    assert!(r.add_secret("sk-live-00112233"));
    let image = crate::message::ImageBlock {
        media_type: "image/png".into(),
        data: "iVBORw0KGgosk-live-00112233".into(),
    };
    let m = r.redact_message(Message::user_with_images(
        "key sk-live-00112233",
        vec![image.clone()],
    ));
    assert_eq!(m.text_content(), "key [REDACTED]");
    assert_eq!(m.images().collect::<Vec<_>>(), vec![&image]);
}

#[test]
fn an_unchanged_message_keeps_its_shared_blocks() {
    let mut r = Redactor::new();
    r.add_secret("sk-live-00112233");
    let m = Message::user("nothing secret");
    let before = m.content.clone();
    let after = r.redact_message(m);
    assert!(std::ptr::eq(&before[..], &after.content[..]));
}

#[test]
fn names_and_urls() {
    for name in [
        "OPENAI_API_KEY",
        "github_token",
        "PGPASSWORD",
        "AWS_REGION",
        "X_SECRET",
    ] {
        assert!(is_secret_name(name), "{name}");
    }
    for name in ["PATH", "HOME", "HAME_MODEL", "PORT"] {
        assert!(!is_secret_name(name), "{name}");
    }
    assert!(is_secret_param("sig") && is_secret_param("X-Auth") && !is_secret_param("x"));
    assert_eq!(
        redact_url("postgres://app:s3cret@db:5432/x"),
        "postgres://app:***@db:5432/x"
    );
    assert_eq!(url_password("redis://:hunter2@h/0"), Some("hunter2"));
    assert_eq!(url_password("redis://h/0"), None);
    assert_eq!(url_password("http://h:80/a@b"), None);
}

#[test]
fn base64_matches_the_standard_alphabet() {
    for (plain, want) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("hame:pw-7d3e9a1c5b2f", "aGFtZTpwdy03ZDNlOWExYzViMmY="),
    ] {
        assert_eq!(base64(plain.as_bytes()), want, "{plain}");
    }
}

#[test]
fn the_process_registry_redacts_what_was_registered() {
    let secret = "proc-registry-secret-6b1f";
    assert!(redact(secret) == secret);
    assert!(add_secret(secret));
    assert!(!add_secret(secret));
    assert_eq!(redact(&format!("x {secret} y")), "x [REDACTED] y");
    assert!(add_endpoint("http://registry.test:1/v1"));
    assert_eq!(
        redact_for_callers("via http://registry.test:1/v1/chat"),
        "via [model endpoint]/chat"
    );
}

proptest! {
    /// Whatever surrounds a secret, it does not survive redaction, and text without any
    /// secret is returned unchanged.
    #[test]
    fn no_secret_survives(
        secret in "[0-9][A-Za-z0-9_./+=-]{7,40}",
        before in "[ -~]{0,40}",
        after in "[ -~]{0,40}",
    ) {
        let mut r = Redactor::new();
        r.add_secret(&secret);
        let text = format!("{before}{secret}{after}");
        let out = r.redact(&text);
        prop_assert!(!out.contains(secret.as_str()), "{out}");
        prop_assert!(out.contains(REDACTED));
    }

    #[test]
    fn text_without_secrets_is_untouched(text in "[ -~]{0,200}") {
        let mut r = Redactor::new();
        r.add_secret("\u{1}never-in-printable-text");
        prop_assert_eq!(r.redact(&text), Cow::Borrowed(text.as_str()));
    }
}
