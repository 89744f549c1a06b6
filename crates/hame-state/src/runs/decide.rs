//! Which run to claim next: a plain function over plain data, shared by the local queues
//! and property-tested; the SQL queue states the same rule in its `WHERE` clause.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::{Run, RunStatus};

/// Whether `run` is held by a live claim at `now`.
fn live(run: &Run, now: DateTime<Utc>) -> bool {
    run.status == RunStatus::Running && run.expires.is_some_and(|e| e > now)
}

/// The index of the run of `agent` to claim next at `now`, if any.
///
/// A run is claimable when it is `queued`, or `running` under a claim that lapsed
/// (`expires <= now`), and it is the earliest (`seq`) queued-or-running run of its session,
/// and no run of its session is held by a live claim. Among claimable runs the earliest
/// wins.
pub fn pick(runs: &[Run], agent: &str, now: DateTime<Utc>) -> Option<usize> {
    // Per session: the earliest active run, and whether one is held live.
    let mut first: HashMap<(&str, Option<&str>, &str), (u64, bool)> = HashMap::new();
    for r in runs.iter().filter(|r| !r.status.is_finished()) {
        let entry = first
            .entry((&r.agent, r.user.as_deref(), &r.session))
            .or_insert((u64::MAX, false));
        entry.0 = entry.0.min(r.seq);
        entry.1 |= live(r, now);
    }
    runs.iter()
        .enumerate()
        .filter(|(_, r)| r.agent == agent && !r.status.is_finished() && !live(r, now))
        .filter(|(_, r)| {
            first
                .get(&(r.agent.as_str(), r.user.as_deref(), r.session.as_str()))
                .is_some_and(|&(seq, held)| seq == r.seq && !held)
        })
        .min_by_key(|(_, r)| r.seq)
        .map(|(i, _)| i)
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
                    prop_assert!(!r.status.is_finished());
                    prop_assert!(!live(r, now));
                    for o in &runs {
                        if same(o, r) && o.id != r.id {
                            prop_assert!(!live(o, now));
                            prop_assert!(o.status.is_finished() || o.seq > r.seq);
                        }
                    }
                }
                None => {
                    for r in &runs {
                        let head = !r.status.is_finished()
                            && runs.iter().filter(|o| same(o, r) && !o.status.is_finished()).all(|o| o.seq >= r.seq);
                        let free = runs.iter().filter(|o| same(o, r)).all(|o| !live(o, now));
                        prop_assert!(!(head && free), "run {} was claimable", r.seq);
                    }
                }
            }
        }
    }
}
