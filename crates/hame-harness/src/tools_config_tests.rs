#![allow(clippy::unwrap_used)]
use super::*;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

fn env(k: &str) -> Option<String> {
    match k {
        "TOKEN" => Some("s3cr\"et".into()),
        "PORT" => Some("8123".into()),
        _ => None,
    }
}

fn p(text: &str) -> Result<ToolsConfig, String> {
    parse("tools.json", text, &env, Path::new("/ws"))
}

#[test]
fn whole_document_parses() {
    let c = p(r#"{
        "allow": ["read_file", "mcp__*"],
        "deny": ["write_file"],
        "mcpServers": {
            "local": {"transport": "stdio", "command": "python3", "args": ["s.py"], "env": {"K": "${TOKEN}"}, "cwd": "tools"},
            "web": {"transport": "http", "url": "http://127.0.0.1:${PORT}/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}, "timeout": 5}
        },
        "permissions": {"allow": ["read_file"], "ask": ["execute(rm *)"], "deny": ["write_file(/etc/**)"], "default": "ask"}
    }"#)
    .unwrap();
    assert_eq!(
        c.allow,
        Some(vec!["read_file".to_string(), "mcp__*".to_string()])
    );
    assert_eq!(
        c.mcp_servers["local"].server.transport,
        hame_mcp::Transport::Stdio {
            command: "python3".into(),
            args: vec!["s.py".into()],
            env: [("K".to_string(), "s3cr\"et".to_string())].into(),
            cwd: Some(PathBuf::from("/ws/tools")),
        }
    );
    assert_eq!(
        c.mcp_servers["web"].server.transport,
        hame_mcp::Transport::Http {
            url: "http://127.0.0.1:8123/mcp".into(),
            headers: [("Authorization".to_string(), "Bearer s3cr\"et".to_string())].into(),
        }
    );
    assert_eq!(
        c.mcp_servers["web"].options.call_timeout,
        Duration::from_secs(5)
    );
    let perms = c.permissions.unwrap();
    assert_eq!(perms.default, Some(PermissionDefault::Ask));
    assert_eq!(
        perms.ask,
        vec![PermissionRule {
            tool: "execute".into(),
            argument: Some("rm *".into())
        }]
    );
}

#[test]
fn errors_name_the_file_and_the_problem() {
    for (text, needle) in [
        ("{not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        (r#"{"alow": []}"#, "unknown field `alow`"),
        (
            r#"{"mcpServers": {"x": {"command": "c", "comand": "d"}}}"#,
            "unknown field `comand`",
        ),
        (
            r#"{"mcpServers": {"x": {"command": "${NOPE}"}}}"#,
            "NOPE is not set",
        ),
        (r#"{"mcpServers": {"x": {}}}"#, "no `transport`"),
        (
            r#"{"mcpServers": {"x": {"transport": "sse", "url": "http://a"}}}"#,
            "unknown transport",
        ),
        (
            r#"{"mcpServers": {"x": {"transport": "http", "url": "ftp://a"}}}"#,
            "must start with http",
        ),
        (r#"{"deny": ["a[b"]}"#, "not a valid glob"),
        (
            r#"{"permissions": {"default": "maybe"}}"#,
            "unknown variant",
        ),
        (r#"{"permissions": {"deny": ["execute(rm"]}}"#, "no closing"),
    ] {
        let e = p(text).unwrap_err();
        assert!(e.starts_with("tools.json: "), "{e}");
        assert!(e.contains(needle), "{text}: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

#[test]
fn substitution_happens_after_parsing() {
    // The value holds a quote: it stays inside its string, it cannot add keys.
    let c =
        p(r#"{"mcpServers": {"x": {"command": "c", "args": ["${TOKEN}", "$${TOKEN}", "a$b"]}}}"#)
            .unwrap();
    let hame_mcp::Transport::Stdio { args, .. } = &c.mcp_servers["x"].server.transport else {
        panic!("stdio");
    };
    assert_eq!(
        args,
        &vec!["s3cr\"et".to_string(), "${TOKEN}".into(), "a$b".into()]
    );
}

#[test]
fn user_file_merges_over_shared() {
    let shared = p(r#"{"allow": ["a"], "deny": ["x"], "mcpServers": {"s": {"command": "one"}, "t": {"command": "two"}}}"#).unwrap();
    let user = p(r#"{"deny": ["y"], "mcpServers": {"s": {"command": "three"}}}"#).unwrap();
    let m = merge(shared, user);
    assert_eq!(m.allow, Some(vec!["a".to_string()]));
    assert_eq!(m.deny, vec!["x".to_string(), "y".into()]);
    let cmd = |n: &str| match &m.mcp_servers[n].server.transport {
        hame_mcp::Transport::Stdio { command, .. } => command.clone(),
        _ => String::new(),
    };
    assert_eq!((cmd("s"), cmd("t")), ("three".into(), "two".into()));
}

#[test]
fn filter_deny_wins_and_allow_keeps_only_matches() {
    let c = p(r#"{"allow": ["read_*", "mcp__*"], "deny": ["mcp__web__*"]}"#).unwrap();
    let f = ToolFilter::new(&c).unwrap();
    assert!(f.permits("read_file"));
    assert!(f.permits("mcp__local__echo"));
    assert!(!f.permits("mcp__web__fetch"));
    assert!(!f.permits("write_file"));
    let open = ToolFilter::new(&p(r#"{"allow": []}"#).unwrap()).unwrap();
    assert!(open.permits("anything"));
}

proptest! {
    #[test]
    fn deny_always_wins(name in "[a-z_]{1,12}") {
        let c = ToolsConfig { allow: Some(vec!["*".into()]), deny: vec![name.clone()], ..ToolsConfig::default() };
        prop_assert!(!ToolFilter::new(&c).unwrap().permits(&name));
    }

    #[test]
    fn substituted_values_never_change_the_structure(v in "[ -~]{0,40}") {
        let envf = |k: &str| (k == "V").then(|| v.clone());
        let c = parse("tools.json", r#"{"mcpServers": {"x": {"command": "${V}x"}}}"#, &envf, Path::new("/ws")).unwrap();
        prop_assert_eq!(c.mcp_servers.len(), 1);
        let hame_mcp::Transport::Stdio { command, .. } = &c.mcp_servers["x"].server.transport else { panic!("stdio") };
        prop_assert_eq!(command, &format!("{v}x"));
    }
}

/// The values `${VAR}` puts where credentials go are the file's secrets; a port or a path
/// is not (ADR 0023).
#[test]
fn substituted_credentials_are_secrets_and_nothing_else_is() {
    let vars = |k: &str| -> Option<String> {
        match k {
            "MCP_TOKEN" => Some("tok-1a2b3c4d5e".into()),
            "HEADER_VALUE" => Some("hdr-9f8e7d6c5b".into()),
            "PLAIN" => Some("plain-value-in-env".into()),
            "APP_KEY" => Some("appkey-0011223344".into()),
            "URL_SIG" => Some("urlsig-5566778899".into()),
            "HOME_DIR" => Some("/home/alice/project".into()),
            "PORT" => Some("8123".into()),
            _ => None,
        }
    };
    let c = parse(
        "tools.json",
        r#"{"mcpServers": {
            "local": {"command": "${HOME_DIR}/server", "args": ["--token", "${MCP_TOKEN}"],
                      "env": {"SERVICE_API_KEY": "${APP_KEY}", "LOG_PATH": "${PLAIN}"}},
            "web": {"url": "http://127.0.0.1:${PORT}/mcp?sig=${URL_SIG}",
                    "headers": {"X-Custom": "${HEADER_VALUE}"}}
        }}"#,
        &vars,
        Path::new("/ws"),
    )
    .unwrap();
    let text = "tok-1a2b3c4d5e hdr-9f8e7d6c5b appkey-0011223344 urlsig-5566778899 \
                plain-value-in-env /home/alice/project 8123";
    assert_eq!(
        c.secrets.redact(text),
        "[REDACTED] [REDACTED] [REDACTED] [REDACTED] plain-value-in-env /home/alice/project 8123"
    );
    assert!(secret_position("GITHUB_TOKEN", "allow[0]"));
    assert!(secret_position("X", "mcpServers.a.headers.Authorization"));
    assert!(!secret_position("X", "mcpServers.a.env.LOG_LEVEL"));
    assert!(!secret_position("X", "mcpServers.a.command"));
}

#[test]
fn a_server_declares_which_of_its_tools_are_idempotent() {
    let c = p(r#"{"mcpServers": {
        "all": {"command": "s", "idempotent": true},
        "some": {"command": "s", "idempotent": ["lookup", "put_by_key"]},
        "none": {"command": "s"},
        "off": {"command": "s", "idempotent": false}
    }}"#)
    .unwrap();
    assert_eq!(c.mcp_servers["all"].idempotent, Idempotent::All);
    assert!(c.mcp_servers["all"].idempotent.covers("anything"));
    assert!(c.mcp_servers["some"].idempotent.covers("put_by_key"));
    assert!(!c.mcp_servers["some"].idempotent.covers("pay"));
    assert_eq!(c.mcp_servers["none"].idempotent, Idempotent::None);
    assert_eq!(c.mcp_servers["off"].idempotent, Idempotent::None);
    for bad in [r#""yes""#, "[1]", r#"[""]"#, "{}"] {
        let e = p(&format!(
            r#"{{"mcpServers": {{"x": {{"command": "s", "idempotent": {bad}}}}}}}"#
        ))
        .unwrap_err();
        assert_eq!(
            e,
            "tools.json: mcpServers.x: `idempotent` must be true, false or a list of the server's tool names",
            "{bad}"
        );
    }
}
