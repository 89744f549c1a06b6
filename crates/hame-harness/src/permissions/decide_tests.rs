#![allow(clippy::expect_used)]

use super::*;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

fn rules(allow: &[&str], ask: &[&str], deny: &[&str]) -> Permissions {
    let p = |v: &[&str]| {
        v.iter()
            .map(|r| PermissionRule::parse(r).expect("a valid rule"))
            .collect()
    };
    Permissions {
        allow: p(allow),
        ask: p(ask),
        deny: p(deny),
        default: None,
    }
}

fn q<'a>(tool: &'a str, argument: Option<&'a str>) -> Question<'a> {
    Question {
        tool,
        argument,
        effect: effect_of(tool, None),
        plan_mode: false,
        mode: Mode::Default,
    }
}

#[test]
fn deny_beats_ask_beats_allow_beats_default() {
    let r = rules(&["execute"], &["execute(rm *)"], &["execute(rm -rf *)"]);
    let d = |cmd| decide(&q("execute", Some(cmd)), &r, &[]);
    assert_eq!(d("rm -rf /").outcome, Outcome::Deny);
    assert_eq!(d("rm -rf /").rule, "deny execute(rm -rf *)");
    assert_eq!(d("rm a.txt").outcome, Outcome::Ask);
    assert_eq!(d("ls").outcome, Outcome::Allow);
    assert_eq!(d("ls").rule, "allow execute");
    let none = rules(&[], &[], &[]);
    assert_eq!(
        decide(&q("read_file", None), &none, &[]).rule,
        "default allow"
    );
}

#[test]
fn globs_match_paths_with_or_without_a_leading_slash() {
    let r = rules(&[], &[], &["write_file(secret/*)", "edit_file(/etc/**)"]);
    for (tool, path) in [
        ("write_file", "secret/a.txt"),
        ("write_file", "/secret/a.txt"),
        ("write_file", "./secret/a.txt"),
        ("edit_file", "etc/passwd"),
        ("edit_file", "/etc/x/y"),
    ] {
        assert_eq!(
            decide(&q(tool, Some(path)), &r, &[]).outcome,
            Outcome::Deny,
            "{tool} {path}"
        );
    }
    assert_eq!(
        decide(&q("write_file", Some("notes.md")), &r, &[]).outcome,
        Outcome::Allow
    );
    // A rule with a glob never matches a call without a main argument.
    assert_eq!(
        decide(&q("write_file", None), &r, &[]).outcome,
        Outcome::Allow
    );
}

#[test]
fn plan_mode_denies_every_mutating_tool_and_asks_for_plan_exit() {
    let none = rules(&["*"], &[], &[]);
    let plan = |tool: &'static str, ro: Option<bool>| {
        decide(
            &Question {
                tool,
                argument: None,
                effect: effect_of(tool, ro),
                plan_mode: true,
                mode: Mode::Default,
            },
            &none,
            &[],
        )
    };
    for t in [
        "write_file",
        "edit_file",
        "execute",
        "memory_save",
        "propose_skill",
        "task_cancel",
        "my_custom_tool",
    ] {
        assert_eq!(
            plan(t, None),
            Verdict::new(Outcome::Deny, "plan mode"),
            "{t}"
        );
    }
    assert_eq!(plan("mcp__s__delete", Some(false)).outcome, Outcome::Deny);
    assert_eq!(plan("mcp__s__get", Some(true)).outcome, Outcome::Allow);
    for t in [
        "read_file",
        "grep_files",
        "plan_write",
        "todo_write",
        "agent_spawn",
        "task_output",
    ] {
        assert_eq!(plan(t, None).outcome, Outcome::Allow, "{t}");
    }
    assert_eq!(plan("plan_exit", None).outcome, Outcome::Ask);
}

#[test]
fn modes_are_presets_under_the_rules() {
    let none = rules(&[], &[], &[]);
    let with = |tool, mode| {
        decide(
            &Question {
                mode,
                ..q(tool, None)
            },
            &none,
            &[],
        )
        .outcome
    };
    assert_eq!(with("write_file", Mode::AcceptEdits), Outcome::Allow);
    assert_eq!(with("execute", Mode::AcceptEdits), Outcome::Ask);
    assert_eq!(with("write_file", Mode::ReadOnly), Outcome::Deny);
    assert_eq!(with("read_file", Mode::ReadOnly), Outcome::Allow);
    assert_eq!(with("execute", Mode::Bypass), Outcome::Allow);
    // Ask: everything that changes something asks, reads and coordination do not.
    for tool in [
        "write_file",
        "edit_file",
        "execute",
        "memory_save",
        "my_own_tool",
    ] {
        assert_eq!(with(tool, Mode::Ask), Outcome::Ask, "{tool}");
    }
    for tool in [
        "read_file",
        "grep_files",
        "list_files",
        "todo_write",
        "plan_write",
    ] {
        assert_eq!(with(tool, Mode::Ask), Outcome::Allow, "{tool}");
    }
    assert_eq!(Mode::parse("ask"), Some(Mode::Ask));
    // Bypass does not lift a deny rule.
    let deny = rules(&[], &[], &["execute"]);
    assert_eq!(
        decide(
            &Question {
                mode: Mode::Bypass,
                ..q("execute", None)
            },
            &deny,
            &[]
        )
        .outcome,
        Outcome::Deny
    );
    assert_eq!(Mode::parse("plan"), Some(Mode::ReadOnly));
    assert_eq!(Mode::parse("nope"), None);
}

#[test]
fn session_always_allow_comes_after_ask_rules() {
    let r = Permissions {
        default: Some(crate::tools_config::PermissionDefault::Ask),
        ..rules(&[], &["execute(rm *)"], &[])
    };
    let always = vec![PermissionRule::parse("execute").expect("rule")];
    assert_eq!(
        decide(&q("execute", Some("ls")), &r, &always).outcome,
        Outcome::Allow
    );
    assert_eq!(
        decide(&q("execute", Some("rm x")), &r, &always).outcome,
        Outcome::Ask
    );
    assert_eq!(
        decide(&q("read_file", None), &r, &always).rule,
        "default ask"
    );
}

/// The table names every tool the harness registers by default (a new built-in must be
/// classified), and classifies the list of mutating tools as mutating.
#[test]
fn the_effect_table_covers_the_builtins() {
    let mut names: Vec<String> = crate::tools::builtin_tools("a", true, true)
        .expect("builtins")
        .iter()
        .map(|t| t.spec().name)
        .collect();
    names.extend(
        crate::permissions::plan_tools()
            .iter()
            .map(|t| t.spec().name),
    );
    names.extend(
        [
            "memory_search",
            "memory_get",
            "memory_save",
            "session_search",
            "load_skill",
            "propose_skill",
        ]
        .map(String::from),
    );
    names.extend(
        hame_subagent::SUBAGENT_TOOLS
            .iter()
            .map(|s| (*s).to_owned()),
    );
    for n in &names {
        assert!(
            BUILTIN_EFFECTS.iter().any(|(t, _)| t == n),
            "{n} is not in BUILTIN_EFFECTS"
        );
    }
    let mutating: Vec<&str> = BUILTIN_EFFECTS
        .iter()
        .filter(|(_, e)| is_mutating(*e))
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(
        mutating,
        [
            "write_file",
            "edit_file",
            "delete_file",
            "move_file",
            "execute",
            "memory_save",
            "propose_skill",
            "task_cancel"
        ]
    );
}

#[test]
fn main_argument_is_the_path_the_command_or_the_spec() {
    let m = |v: serde_json::Value| main_argument(&v);
    assert_eq!(
        m(serde_json::json!({"file_path": "a.txt", "content": "x"})),
        Some("a.txt".into())
    );
    assert_eq!(m(serde_json::json!({"command": "ls"})), Some("ls".into()));
    assert_eq!(
        m(serde_json::json!({"agent_id": "reviewer", "task": "t"})),
        Some("reviewer".into())
    );
    assert_eq!(m(serde_json::json!({"content": "x"})), None);
}

proptest! {
    /// A matching deny rule always wins, whatever else matches and whatever the mode.
    #[test]
    fn deny_always_wins(
        tool in "[a-z_]{1,12}",
        arg in proptest::option::of("[a-z /.*-]{0,20}"),
        in_ask in any::<bool>(),
        in_allow in any::<bool>(),
        plan in any::<bool>(),
        mode in prop_oneof![Just(Mode::Default), Just(Mode::AcceptEdits), Just(Mode::ReadOnly), Just(Mode::Bypass), Just(Mode::Ask)],
    ) {
        let mut r = rules(&[], &[], &[]);
        r.deny.push(PermissionRule { tool: tool.clone(), argument: None });
        if in_ask { r.ask.push(PermissionRule { tool: tool.clone(), argument: None }); }
        if in_allow { r.allow.push(PermissionRule { tool: tool.clone(), argument: None }); }
        let question = Question { tool: &tool, argument: arg.as_deref(), effect: effect_of(&tool, None), plan_mode: plan, mode };
        prop_assert_eq!(decide(&question, &r, &[]).outcome, Outcome::Deny);
    }

    /// Without plan mode and deny rules, an ask rule that matches always asks.
    #[test]
    fn ask_beats_allow_and_default(
        tool in "[a-z_]{1,12}",
        arg in "[a-z ]{0,12}",
        mode in prop_oneof![Just(Mode::Default), Just(Mode::AcceptEdits), Just(Mode::Bypass), Just(Mode::Ask)],
    ) {
        let mut r = rules(&[], &[], &[]);
        r.ask.push(PermissionRule { tool: tool.clone(), argument: Some("*".into()) });
        r.allow.push(PermissionRule { tool: tool.clone(), argument: None });
        let question = Question { tool: &tool, argument: Some(&arg), effect: effect_of(&tool, None), plan_mode: false, mode };
        prop_assert_eq!(decide(&question, &r, &[]).outcome, Outcome::Ask);
    }

    /// Plan mode never lets a mutating tool run.
    #[test]
    fn plan_mode_is_fail_closed(tool in "[a-z_]{1,16}", allow_all in any::<bool>()) {
        let r = if allow_all { rules(&["*"], &[], &[]) } else { rules(&[], &[], &[]) };
        let effect = effect_of(&tool, None);
        let question = Question { tool: &tool, argument: None, effect, plan_mode: true, mode: Mode::Bypass };
        let out = decide(&question, &r, &[]).outcome;
        if is_mutating(effect) { prop_assert_eq!(out, Outcome::Deny); }
    }
}

/// Compiled patterns are remembered per thread, up to `MEMO_PATTERNS`; more patterns than
/// that (the memo starts over) still decide correctly, and an invalid glob never matches.
#[test]
fn many_distinct_patterns_decide_like_few() {
    let n = MEMO_PATTERNS + 100;
    let deny: Vec<String> = (0..n).map(|i| format!("write_file(dir{i}/*)")).collect();
    let deny: Vec<&str> = deny.iter().map(String::as_str).collect();
    let r = rules(&[], &[], &deny);
    for round in 0..2 {
        for i in [0, 1, MEMO_PATTERNS - 1, MEMO_PATTERNS, n - 1] {
            let path = format!("dir{i}/a.txt");
            let v = decide(&q("write_file", Some(&path)), &r, &[]);
            assert_eq!(v.outcome, Outcome::Deny, "{path} (round {round})");
            assert_eq!(v.rule, format!("deny write_file(dir{i}/*)"));
        }
        let v = decide(&q("write_file", Some("elsewhere/a.txt")), &r, &[]);
        assert_eq!(v.outcome, Outcome::Allow, "round {round}");
    }
    assert!(!glob_match("[", "["), "an invalid glob matches nothing");
    assert!(!glob_match("[", "["), "remembered as invalid");
}
