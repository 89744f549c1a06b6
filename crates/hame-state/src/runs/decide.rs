//! Which run to claim next: a plain function over plain data, shared by the local queues
//! and property-tested; the SQL queue states the same rule in its `WHERE` clause.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use serde_json::Value;

use super::{Decided, Decision, Run, RunStatus};

/// Whether `run` is held by a live claim at `now`.
fn live(run: &Run, now: DateTime<Utc>) -> bool {
    run.status == RunStatus::Running && run.expires.is_some_and(|e| e > now)
}

/// Whether `run` keeps the rest of its session waiting at `now`: a live claim, or a
/// decision it waits for.
fn holding(run: &Run, now: DateTime<Utc>) -> bool {
    live(run, now) || run.status == RunStatus::WaitingApproval
}

/// Whether a worker may take `run` at `now`: queued, or running under a lapsed claim.
fn takeable(run: &Run, now: DateTime<Utc>) -> bool {
    run.status == RunStatus::Queued || (run.status == RunStatus::Running && !live(run, now))
}

/// The index of the run of `agent` to claim next at `now`, if any.
///
/// A run is claimable when it is `queued`, or `running` under a claim that lapsed
/// (`expires <= now`), and it is the earliest (`seq`) run of its session that holds the
/// session (queued, running or `waiting_approval`), and no run of its session is held by a
/// live claim or waits for a decision. Among claimable runs the earliest wins.
pub fn pick(runs: &[Run], agent: &str, now: DateTime<Utc>) -> Option<usize> {
    // Per session: the earliest run holding it, and whether one is held live or waits.
    let mut first: HashMap<(&str, Option<&str>, &str), (u64, bool)> = HashMap::new();
    for r in runs.iter().filter(|r| r.status.holds_session()) {
        let entry = first
            .entry((&r.agent, r.user.as_deref(), &r.session))
            .or_insert((u64::MAX, false));
        entry.0 = entry.0.min(r.seq);
        entry.1 |= holding(r, now);
    }
    runs.iter()
        .enumerate()
        .filter(|(_, r)| r.agent == agent && takeable(r, now))
        .filter(|(_, r)| {
            first
                .get(&(r.agent.as_str(), r.user.as_deref(), r.session.as_str()))
                .is_some_and(|&(seq, held)| seq == r.seq && !held)
        })
        .min_by_key(|(_, r)| r.seq)
        .map(|(i, _)| i)
}

/// The decided approvals of a run's `approvals` (entries with a `decision`), in order.
pub(crate) fn decisions(approvals: Option<&Value>) -> Vec<(String, Value)> {
    approvals
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| {
            let id = a.get("id")?.as_str()?;
            let decision = a.get("decision").filter(|d| !d.is_null())?;
            Some((id.to_owned(), decision.clone()))
        })
        .collect()
}

/// What `decision` does to a session whose head run (the earliest holding it) is `head`:
/// the run and its approvals with the decision, to write and claim; or, when nothing
/// changes, the answer ([`Decided::NoneWaiting`], [`Decided::Busy`],
/// [`Decided::UnknownApproval`]). Every backend decides through it.
pub(crate) fn decide_on(
    head: Option<Run>,
    decision: &Decision,
) -> std::result::Result<(Run, Value), Box<Decided>> {
    let Some(run) = head else {
        return Err(Box::new(Decided::NoneWaiting));
    };
    if run.status != RunStatus::WaitingApproval {
        return Err(Box::new(Decided::Busy(run)));
    }
    match record_decision(run.approvals.as_ref(), &decision.approval, &decision.value) {
        Some(approvals) => Ok((run, approvals)),
        None => Err(Box::new(Decided::UnknownApproval(run))),
    }
}

/// The approvals of a waiting run with `decision` recorded on the undecided approval
/// `approval`; `None` when it has no such approval (unknown, or decided already).
pub(crate) fn record_decision(
    approvals: Option<&Value>,
    approval: &str,
    decision: &Value,
) -> Option<Value> {
    let mut list = approvals?.as_array()?.clone();
    let entry = list.iter_mut().find(|a| {
        a.get("id").and_then(Value::as_str) == Some(approval)
            && a.get("decision").is_none_or(Value::is_null)
    })?;
    entry
        .as_object_mut()?
        .insert("decision".into(), decision.clone());
    Some(Value::Array(list))
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;
    use proptest::prelude::*;

    use super::*;
    use crate::StateKey;
    use crate::runs::NewRun;

    fn run(session: &str, seq: u64, status: RunStatus, expires_in: i64, now: DateTime<Utc>) -> Run {
        // Test ids are valid: `s0`…`s9`.
        let key = StateKey::new("a", Some("u"), session).unwrap_or_else(|e| panic!("{e}"));
        let new = NewRun::message(key, "m", None).unwrap_or_else(|e| panic!("{e}"));
        let mut r = Run::new(&new, now);
        r.seq = seq;
        r.status = status;
        r.expires = (status == RunStatus::Running).then(|| now + TimeDelta::seconds(expires_in));
        r
    }

    #[test]
    fn one_at_a_time_per_session_in_order() {
        let now = Utc::now();
        let runs = vec![
            run("s1", 1, RunStatus::Completed, 0, now),
            run("s1", 2, RunStatus::Running, 10, now),
            run("s1", 3, RunStatus::Queued, 0, now),
            run("s2", 5, RunStatus::Queued, 0, now),
            run("s2", 4, RunStatus::Queued, 0, now),
        ];
        assert_eq!(pick(&runs, "a", now), Some(4));
        // The live claim of s1 lapses: it is reclaimed before its successor.
        let later = now + TimeDelta::seconds(11);
        let runs = vec![runs[1].clone(), runs[2].clone()];
        assert_eq!(pick(&runs, "a", later), Some(0));
        assert_eq!(pick(&[], "a", now), None);
    }

    #[test]
    fn a_run_waiting_for_a_decision_holds_its_session() {
        let now = Utc::now();
        let runs = vec![
            run("s1", 1, RunStatus::WaitingApproval, 0, now),
            run("s1", 2, RunStatus::Queued, 0, now),
            run("s2", 3, RunStatus::Queued, 0, now),
        ];
        assert_eq!(pick(&runs, "a", now), Some(2));
        assert_eq!(pick(&runs[..2], "a", now), None);
        // Decided and claimed again, then ended: the next run of s1 is free.
        let mut done = runs[0].clone();
        done.status = RunStatus::Completed;
        assert_eq!(pick(&[done, runs[1].clone()], "a", now), Some(1));
    }

    #[test]
    fn decisions_are_recorded_once_per_approval() {
        let approvals = serde_json::json!([{"id": "a1", "tool": "execute"}, {"id": "a2"}]);
        let yes = serde_json::json!({"approve": true});
        let one = record_decision(Some(&approvals), "a2", &yes);
        assert_eq!(
            one,
            Some(
                serde_json::json!([{"id": "a1", "tool": "execute"}, {"id": "a2", "decision": {"approve": true}}])
            )
        );
        assert_eq!(
            decisions(one.as_ref()),
            vec![("a2".to_owned(), yes.clone())]
        );
        assert_eq!(
            record_decision(one.as_ref(), "a2", &yes),
            None,
            "decided already"
        );
        assert_eq!(
            record_decision(Some(&approvals), "a3", &yes),
            None,
            "unknown"
        );
        assert_eq!(record_decision(None, "a1", &yes), None, "no approvals");
        assert_eq!(decisions(Some(&approvals)), vec![]);
    }

    proptest! {
        /// Never a run behind an earlier active run of its session, never one of a session
        /// with a live claim, never a finished one; and something whenever a session has
        /// nothing live and something active.
        #[test]
        fn picks_only_the_head_of_a_free_session(
            spec in proptest::collection::vec((0u8..3, 0u8..7, -5i64..5), 0..12)
        ) {
            let now = Utc::now();
            let statuses = RunStatus::ALL;
            let runs: Vec<Run> = spec.iter().enumerate().map(|(i, (s, st, exp))| {
                run(&format!("s{s}"), i as u64, statuses[usize::from(*st)], *exp, now)
            }).collect();
            let got = pick(&runs, "a", now);
            let same = |a: &Run, b: &Run| a.session == b.session;
            match got {
                Some(i) => {
                    let r = &runs[i];
                    prop_assert!(takeable(r, now));
                    for o in &runs {
                        if same(o, r) && o.id != r.id {
                            prop_assert!(!holding(o, now));
                            prop_assert!(!o.status.holds_session() || o.seq > r.seq);
                        }
                    }
                }
                None => {
                    for r in &runs {
                        let head = takeable(r, now)
                            && runs.iter().filter(|o| same(o, r) && o.status.holds_session()).all(|o| o.seq >= r.seq);
                        let free = runs.iter().filter(|o| same(o, r)).all(|o| !holding(o, now));
                        prop_assert!(!(head && free), "run {} was claimable", r.seq);
                    }
                }
            }
        }
    }
}
