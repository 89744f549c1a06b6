#![allow(clippy::unwrap_used)]
use super::*;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

#[test]
fn front_matter_with_and_without_name() {
    let doc = parse_skill(
        "dir",
        "---\ndescription: Reviews code.\n---\n\n# Steps\n1. read\n",
    )
    .unwrap();
    assert_eq!(
        doc,
        SkillDoc {
            name: "dir".into(),
            description: "Reviews code.".into(),
            body: "# Steps\n1. read\n".into()
        }
    );
    let named = parse_skill(
        "dir",
        "---\nname: other\ndescription: >\n  two\n  lines\n---\nbody",
    )
    .unwrap();
    assert_eq!(
        (named.name.as_str(), named.description.as_str()),
        ("other", "two lines")
    );
}

#[test]
fn invalid_front_matter_says_why() {
    for (text, why) in [
        ("no front matter", "no front matter"),
        ("---\ndescription: x\n", "no closing"),
        ("---\nname: x\n---\nbody", "description"),
        ("---\ndescription: [unclosed\n---\n", "front matter"),
        ("---\ndescription: \"\"\n---\n", "empty"),
        (
            "---\nname: ../x\ndescription: d\n---\n",
            "not a valid skill name",
        ),
    ] {
        let e = parse_skill("d", text).unwrap_err();
        assert!(e.contains(why), "{text:?}: {e}");
    }
}

#[test]
fn rendered_skill_parses_back_and_cannot_inject_keys() {
    let text = render_skill("s", "desc\n---\nname: evil", "Body").unwrap();
    let doc = parse_skill("s", &text).unwrap();
    assert_eq!(doc.name, "s");
    assert_eq!(doc.description, "desc --- name: evil");
    assert_eq!(doc.body, "Body\n");
}

#[test]
fn higher_layer_wins_unique_names_stack() {
    let merged = merge(vec![
        (SkillLayer::Workspace, "a".to_string(), 1),
        (SkillLayer::User, "a".to_string(), 2),
        (SkillLayer::Global, "a".to_string(), 3),
        (SkillLayer::Global, "b".to_string(), 4),
    ]);
    assert_eq!(
        merged,
        vec![
            (SkillLayer::User, "a".to_string(), 2),
            (SkillLayer::Global, "b".to_string(), 4)
        ]
    );
}

#[test]
fn curator_ages_agent_skills_only() {
    let now = Utc::now();
    let used = |days| Usage {
        last_used: Some(now - Duration::days(days)),
        ..Usage::default()
    };
    assert_eq!(curate(None, now), SkillState::Active);
    assert_eq!(curate(Some(&used(29)), now), SkillState::Active);
    assert_eq!(curate(Some(&used(30)), now), SkillState::Stale);
    assert_eq!(curate(Some(&used(90)), now), SkillState::Archived);
    let pinned = Usage {
        pinned: true,
        ..used(400)
    };
    assert_eq!(curate(Some(&pinned), now), SkillState::Active);
    // A promotion after the last use counts as activity.
    let restored = Usage {
        promoted: Some(now),
        ..used(200)
    };
    assert_eq!(curate(Some(&restored), now), SkillState::Active);
}

proptest! {
    #[test]
    fn any_description_round_trips(desc in "[^\u{0}]{1,200}", body in "[^\u{0}]{0,200}") {
        prop_assume!(!desc.split_whitespace().collect::<Vec<_>>().is_empty());
        let text = render_skill("n", &desc, &body).unwrap();
        let doc = parse_skill("n", &text).unwrap();
        prop_assert_eq!(doc.name, "n");
        let expected: String = desc.split_whitespace().collect::<Vec<_>>().join(" ");
        prop_assert_eq!(doc.description.trim_end_matches('…').len() <= expected.len(), true);
    }

    #[test]
    fn curator_is_monotonic(a in 0i64..400, b in 0i64..400) {
        let now = Utc::now();
        let s = |d| curate(Some(&Usage { last_used: Some(now - Duration::days(d)), ..Usage::default() }), now);
        let rank = |st: SkillState| match st { SkillState::Active => 0, SkillState::Stale => 1, _ => 2 };
        if a <= b { prop_assert!(rank(s(a)) <= rank(s(b))); }
    }
}
