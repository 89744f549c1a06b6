//! The end-of-call write of the permission state: appended decisions, or the whole state.

#![allow(clippy::expect_used)]

use super::*;
use hame_core::AgentState;
use pretty_assertions::assert_eq;

fn decision(i: usize) -> Decision {
    Decision {
        time: format!("2026-12-02T00:00:{:02}.000Z", i % 60),
        tool: "read_file".into(),
        argument: Some(format!("/f{i}")),
        rule: "default allow".into(),
        outcome: Outcome::Allow,
        by: "policy".into(),
        approval: None,
    }
}

fn cell(session: SessionPermissions, changed: bool) -> PermissionCell {
    PermissionCell {
        state: Mutex::new(session),
        inherited: Inherited::default(),
        recorded: AtomicUsize::new(0),
        changed: AtomicBool::new(changed),
    }
}

fn record(cell: &PermissionCell, i: usize) {
    cell.record(decision(i));
}

fn stored(state: &AgentState) -> SessionPermissions {
    state.extension(STATE_KEY).expect("a permission state")
}

#[test]
fn recorded_decisions_are_appended_and_the_oldest_dropped() {
    let before = SessionPermissions {
        always_allow: vec!["grep_files".into()],
        decisions: (0..199).map(decision).collect(),
        ..SessionPermissions::default()
    };
    let mut state = AgentState::default();
    state.set_extension(STATE_KEY, &before).expect("encodes");
    let c = cell(before.clone(), false);
    for i in 199..203 {
        record(&c, i);
    }
    c.store(&mut state).expect("stored");
    let expected = SessionPermissions {
        decisions: (3..203).map(decision).collect(),
        ..before
    };
    assert_eq!(stored(&state), expected);
    // The same value a whole write would give.
    assert_eq!(
        state.extensions[STATE_KEY],
        serde_json::to_value(&expected).expect("encodes")
    );
    // The cell reads the same list.
    assert_eq!(c.snapshot(), expected);
}

#[test]
fn any_other_change_writes_the_whole_state() {
    let before = SessionPermissions {
        decisions: (0..5).map(decision).collect(),
        ..SessionPermissions::default()
    };
    let mut state = AgentState::default();
    state.set_extension(STATE_KEY, &before).expect("encodes");
    let c = cell(before, false);
    record(&c, 5);
    c.update(|s| s.always_allow.push("write_file(out/*)".into()));
    c.store(&mut state).expect("stored");
    let after = stored(&state);
    assert_eq!(after.always_allow, vec!["write_file(out/*)".to_owned()]);
    assert_eq!(after.decisions, (0..6).map(decision).collect::<Vec<_>>());
}

#[test]
fn a_call_without_decisions_or_changes_leaves_the_state_alone() {
    let mut state = AgentState::default();
    cell(SessionPermissions::default(), false)
        .store(&mut state)
        .expect("stored");
    assert!(state.extensions.is_empty());
    // The first decision of a session creates the whole extension.
    let c = cell(SessionPermissions::default(), false);
    record(&c, 0);
    c.store(&mut state).expect("stored");
    assert_eq!(stored(&state).decisions, vec![decision(0)]);
}

#[test]
fn a_cell_marked_changed_replaces_an_unreadable_value_whole() {
    let mut state = AgentState::default();
    state.extensions.insert(
        STATE_KEY.into(),
        serde_json::json!({"plan_mode": "yes", "decisions": []}),
    );
    // What the layer's `call` makes of it: a default state, marked changed.
    let c = cell(SessionPermissions::default(), true);
    record(&c, 0);
    c.store(&mut state).expect("stored");
    let after = stored(&state);
    assert!(!after.plan_mode);
    assert_eq!(after.decisions, vec![decision(0)]);
}
