#![allow(clippy::expect_used)]

use super::*;
use pretty_assertions::assert_eq;
use proptest::prelude::*;
use unicode_normalization::UnicodeNormalization;

/// Names the spelling property builds paths from.
const SEGMENTS: &[&str] = &["a", "b.env", "Config", "caf\u{e9}", "x y", "prod.yaml"];
/// Rule globs over those names, spelled several ways.
const PATTERNS: &[&str] = &[
    "a/*",
    "*.env",
    "**/Config/**",
    "caf\u{e9}/*",
    "/a/b.env",
    "./Config//*",
    "x y",
    "**",
    "config/prod.yaml",
    "a/b.env/",
];

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

/// The argument as the layer makes it: a path for the file tools, else text.
fn arg(tool: &str, a: &str) -> Argument {
    call_argument(
        tool,
        &serde_json::json!({ if WORKSPACE_FILE_TOOLS.contains(&tool) { "file_path" } else { "command" }: a }),
        NameCase::Sensitive,
    )
    .expect("a valid path")
    .expect("an argument")
}

fn q<'a>(tool: &'a str, argument: Option<&str>) -> Question<'a> {
    Question {
        tool,
        argument: argument.map(|a| arg(tool, a)),
        effect: effect_of(tool, None),
        plan_mode: false,
        mode: Mode::Default,
        case: NameCase::Sensitive,
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
                case: NameCase::Sensitive,
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

/// A human's "always" to a call that an `ask` rule stopped sticks for that very call (any
/// spelling of its path) for the rest of the session; other calls still ask; a deny rule
/// still wins.
#[test]
fn an_always_answer_sticks_for_the_identical_call_even_under_an_ask_rule() {
    let r = Permissions {
        default: Some(crate::tools_config::PermissionDefault::Ask),
        ..rules(&[], &["write_file(out/*)", "execute(rm *)"], &[])
    };
    let remembered = |tool: &str, a: &str| {
        PermissionRule::parse(&always_rule(tool, Some(&arg(tool, a)))).expect("rule")
    };
    let always = vec![
        remembered("write_file", "/out/./a*.txt"),
        remembered("execute", "rm x"),
    ];
    for spelling in ["out/a*.txt", "out//a*.txt", "./out/a*.txt/", "/out/a*.txt"] {
        let v = decide(&q("write_file", Some(spelling)), &r, &always);
        assert_eq!(v.outcome, Outcome::Allow, "{spelling}");
        assert_eq!(v.rule, "always allow write_file(out/a[*].txt)");
    }
    // The escaped argument is that call only: not a glob over others.
    assert_eq!(
        decide(&q("write_file", Some("out/ab.txt")), &r, &always).outcome,
        Outcome::Ask
    );
    assert_eq!(
        decide(&q("execute", Some("rm x")), &r, &always).outcome,
        Outcome::Allow
    );
    assert_eq!(
        decide(&q("execute", Some("rm y")), &r, &always).outcome,
        Outcome::Ask
    );
    // An answer to a call without an argument is for calls without one.
    let bare = vec![PermissionRule::parse("execute").expect("rule")];
    assert_eq!(
        decide(&q("execute", Some("rm x")), &r, &bare).outcome,
        Outcome::Ask
    );
    assert_eq!(
        decide(&q("execute", None), &r, &bare).outcome,
        Outcome::Allow
    );
    assert_eq!(
        decide(&q("read_file", None), &r, &always).rule,
        "default ask"
    );
    // A deny rule beats a remembered answer.
    let deny = Permissions {
        deny: rules(&[], &[], &["write_file(out/a*)"]).deny,
        ..r.clone()
    };
    assert_eq!(
        decide(&q("write_file", Some("out/a*.txt")), &deny, &always).outcome,
        Outcome::Deny
    );
}

/// The spellings: every one the file tools accept meets the rules of the file it
/// touches; `..` is refused for the file tools before any rule (the tool refuses it too).
#[test]
fn hostile_spellings_meet_the_rules_of_the_file_they_touch() {
    let r = rules(
        &[],
        &["write_file(out/**)"],
        &["edit_file(config/prod.yaml)", "write_file(*.env)"],
    );
    for (tool, path, outcome) in [
        ("edit_file", "config//prod.yaml", Outcome::Deny),
        ("edit_file", "config/./prod.yaml", Outcome::Deny),
        ("edit_file", "config/prod.yaml/", Outcome::Deny),
        ("edit_file", "/./config/prod.yaml", Outcome::Deny),
        ("write_file", "a.env/", Outcome::Deny),
        ("write_file", "dir//a.env", Outcome::Deny),
        ("write_file", "out//x.txt", Outcome::Ask),
        ("write_file", "./out/./x.txt/", Outcome::Ask),
        ("write_file", "config/prod.yaml.bak", Outcome::Allow),
    ] {
        assert_eq!(
            decide(&q(tool, Some(path)), &r, &[]).outcome,
            outcome,
            "{tool} {path}"
        );
    }
    for bad in ["config/../config/prod.yaml", "a\\b", "x/\u{0}"] {
        let refused = call_argument(
            "edit_file",
            &serde_json::json!({"file_path": bad}),
            NameCase::Sensitive,
        );
        assert!(refused.is_err(), "{bad}");
        assert!(
            hame_fs::FsPath::parse(bad).is_err(),
            "the tool refuses {bad} too"
        );
    }
    // Another tool's `path` that FsPath refuses is compared as given.
    assert_eq!(
        call_argument(
            "mcp__s__get",
            &serde_json::json!({"path": "../x"}),
            NameCase::Sensitive
        ),
        Ok(Some(Argument::text("../x")))
    );
}

#[test]
fn unicode_forms_and_folded_case_meet_the_same_rules() {
    let r = rules(
        &[],
        &[],
        &["write_file(caf\u{e9}/*)", "read_file(Secret/**)"],
    );
    let nfd = "cafe\u{301}/a.txt";
    assert_eq!(
        decide(&q("write_file", Some(nfd)), &r, &[]).outcome,
        Outcome::Deny
    );
    let folded = |tool: &'static str, a: &str| Question {
        argument: Some(
            call_argument(
                tool,
                &serde_json::json!({"file_path": a}),
                NameCase::Insensitive,
            )
            .expect("valid")
            .expect("some"),
        ),
        case: NameCase::Insensitive,
        ..q(tool, None)
    };
    assert_eq!(
        decide(&folded("read_file", "SECRET/k"), &r, &[]).outcome,
        Outcome::Deny
    );
    assert_eq!(
        decide(&folded("read_file", "secret/k"), &r, &[]).outcome,
        Outcome::Deny
    );
    // A backend that does not fold case: `SECRET/k` is another file.
    assert_eq!(
        decide(&q("read_file", Some("SECRET/k")), &r, &[]).outcome,
        Outcome::Allow
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
        let question = Question { tool: &tool, argument: arg.as_deref().map(Argument::text), effect: effect_of(&tool, None), plan_mode: plan, mode, case: NameCase::Sensitive };
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
        let question = Question { tool: &tool, argument: Some(Argument::text(&arg)), effect: effect_of(&tool, None), plan_mode: false, mode, case: NameCase::Sensitive };
        prop_assert_eq!(decide(&question, &r, &[]).outcome, Outcome::Ask);
    }

    /// Every spelling the file tools accept for a path (`//`, `/./`, a leading `/` or
    /// `./`, a trailing `/`, NFD for NFC, other cases on a backend that folds case) gets
    /// the decision its canonical form gets, under any deny/ask/allow rules over those
    /// names, and the tool touches the canonical path.
    #[test]
    fn every_spelling_gets_the_decision_of_its_canonical_form(
        segs in proptest::collection::vec(proptest::sample::select(SEGMENTS.to_vec()), 1..4),
        seps in proptest::collection::vec(0usize..3, 4),
        lead in 0usize..4,
        trail in 0usize..3,
        nfd in any::<bool>(),
        flips in proptest::collection::vec(any::<bool>(), 4),
        folds in any::<bool>(),
        picks in proptest::collection::vec((0usize..PATTERNS.len(), 0usize..3), 0..6),
        tool in proptest::sample::select(vec!["write_file", "edit_file", "read_file", "list_files"]),
        plan in any::<bool>(),
    ) {
        let case = if folds { NameCase::Insensitive } else { NameCase::Sensitive };
        let canonical = segs.join("/");
        let mut spelled = ["", "/", "./", "//"][lead].to_owned();
        for (i, seg) in segs.iter().enumerate() {
            if i > 0 {
                spelled.push_str(["/", "//", "/./"][seps[i]]);
            }
            let mut seg = if nfd { seg.nfd().collect::<String>() } else { (*seg).to_owned() };
            if folds && flips[i] {
                seg = seg.chars().map(|c| if c.is_ascii_lowercase() { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() }).collect();
            }
            spelled.push_str(&seg);
        }
        spelled.push_str(["", "/", "/."][trail]);
        let mut r = rules(&[], &[], &[]);
        for (i, list) in &picks {
            let rule = PermissionRule::parse(&format!("{tool}({})", PATTERNS[*i])).expect("rule");
            [&mut r.deny, &mut r.ask, &mut r.allow][*list].push(rule);
        }
        let question = |raw: &str| Question {
            argument: call_argument(tool, &serde_json::json!({"file_path": raw}), case).expect("accepted"),
            case,
            plan_mode: plan,
            ..q(tool, None)
        };
        prop_assert_eq!(
            decide(&question(&spelled), &r, &[]),
            decide(&question(&canonical), &r, &[]),
            "{:?} vs {:?}", spelled, canonical
        );
        // The tool's path is the canonical one (up to the forms the backend takes as one).
        let touched = hame_fs::FsPath::parse(&spelled).expect("accepted");
        prop_assert_eq!(touched.match_key(case), hame_fs::FsPath::parse(&canonical).expect("ok").match_key(case));
        // A `..` spelling is refused by the rules' function and by the tool alike.
        let dotted = format!("{}/../{canonical}", segs[0]);
        let refused = call_argument(tool, &serde_json::json!({"file_path": dotted}), case);
        prop_assert!(refused.is_err());
        prop_assert!(hame_fs::FsPath::parse(&dotted).is_err());
    }

    /// Plan mode never lets a mutating tool run.
    #[test]
    fn plan_mode_is_fail_closed(tool in "[a-z_]{1,16}", allow_all in any::<bool>()) {
        let r = if allow_all { rules(&["*"], &[], &[]) } else { rules(&[], &[], &[]) };
        let effect = effect_of(&tool, None);
        let question = Question { tool: &tool, argument: None, effect, plan_mode: true, mode: Mode::Bypass, case: NameCase::Sensitive };
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
